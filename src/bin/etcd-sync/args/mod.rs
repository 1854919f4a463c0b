//! The command line: subcommands, their arguments, and the global connection options.

use std::ffi::OsString;
use std::time::Duration;

use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Parser, Subcommand};

use crate::exit::{EXIT_CODES, SEE_EXIT_CODES};
use crate::text;

/// Distributed lock and leader election on etcd v3, interoperating with `etcdctl lock` and
/// `etcdctl elect`; CMD is stopped when the lock or leadership is lost.
#[derive(Debug, Parser)]
#[command(name = "etcd-sync", version, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalOpts,
    #[command(subcommand)]
    pub command: Command,
}

mod global;
pub use global::GlobalOpts;

// Checked here (with the library's own limits) so that a bad N is refused before
// connecting, like every other argument.
use etcd_sync::MAX_PERMITS;

fn parse_permits(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_PERMITS).contains(&n) => Ok(n),
        Ok(_) => Err(format!("a semaphore has 1 to {MAX_PERMITS} permits")),
        Err(_) => Err(format!(
            "{text:?} is not a whole number of permits (1 to {MAX_PERMITS})"
        )),
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Acquire a lock (shared with `etcdctl lock NAME`), or with -n N one of N permits, or
    /// with --shared a read lock; hold it until a signal, or run CMD while holding it
    #[command(after_help = SEE_EXIT_CODES, long_about = LOCK_ABOUT)]
    Lock(LockArgs),
    /// Campaign for leadership (shared with `etcdctl elect NAME`); lead until a signal, or
    /// run CMD while leading. With --listen, print every leadership change instead
    #[command(after_help = SEE_EXIT_CODES, long_about = ELECT_ABOUT)]
    Elect(ElectArgs),
    /// Show who holds the lock, semaphore, read-write lock or election NAME and who waits,
    /// in line order; takes no lease
    #[command(after_help = SEE_EXIT_CODES, long_about = STATUS_ABOUT)]
    Status(StatusArgs),
    /// Hold, release or wait for the barrier NAME (the key NAME, as etcd's Go
    /// recipe.Barrier); takes no lease
    #[command(after_help = SEE_EXIT_CODES, long_about = BARRIER_ABOUT)]
    Barrier(BarrierArgs),
    /// Ask whoever holds the lock, semaphore, read-write lock or election NAME to let go;
    /// takes no lease
    #[command(after_help = SEE_EXIT_CODES, long_about = REVOKE_ABOUT)]
    Revoke(RevokeArgs),
    /// Show who holds and who waits for which names under PREFIX, by session, and the
    /// cycles among the waits (deadlocks), refreshed every second; takes no lease
    #[command(after_help = SEE_EXIT_CODES, long_about = TOP_ABOUT)]
    Top(TopArgs),
}

const TOP_ABOUT: &str = "\
A live view of every lock, semaphore, read-write lock and election under PREFIX (all of \
etcd without one), from one read of the keys under PREFIX and one lease lookup per session, \
redrawn every second until `q` or Ctrl-C (exit 0). First the cycles: sessions that each \
wait for a name the next one holds (a deadlock across processes), `no cycles` if none; \
then each name: its holders and waiters in line order, each with its lease in hex, its \
identity, how many keys are ahead of a waiter, how long top has seen it wait (`12s+`: it \
was waiting when top started; etcd keeps no time with a key), its lease's TTL left and \
granted, and STUCK for a waiter that can never be served (behind a cycle, or a key \
without a lease).

With --json, the graph once, as one object: {\"prefix\":..,\"revision\":..,\"names\":[..], \
\"sessions\":[..],\"cycles\":[..]}; each name as in `status --json`; each session as \
{\"lease\":\"<hex>\" or null (keys without a lease),\"identity\":..,\"ttl\":<seconds left>,\
\"granted_ttl\":..,\"holds\":[{\"name\":..,\"key\":..,\"position\":<keys ahead>}],\
\"waits\":[{..,\"blocked_by\":[<holders' leases>]}],\"stuck\":<bool>}; each cycle as \
its steps, [{\"lease\":..,\"identity\":..,\"waits_for\":<name>,\"held_by\":<lease>}].";

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Print the graph once as one JSON object and exit
    #[arg(long)]
    pub json: bool,

    /// Show the names under this prefix (e.g. `jobs/`); all of etcd if left out
    #[arg(default_value = "")]
    pub prefix: String,
}

const REVOKE_ABOUT: &str = "\
Asks every current holder of NAME to let go, and prints one line per holder asked: \
`NAME: asked KEY (IDENTITY)`, or `NAME: not held` (exit 0 either way). Nothing is forced: \
a holder of this crate hears the request on its guard (`etcd-sync lock \
--release-on-request` releases, stopping CMD first) and decides; `etcdctl lock` never \
looks. The request is the key NAME.revoke/<rest of the holder's key>, bound to the \
holder's lease, so `etcdctl lock NAME` does not count it. To force a release, delete the \
holder's key (`etcdctl del KEY`).";

#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// Why, for the holder to read (at most 1024 bytes)
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,

    /// The lock's, semaphore's or election's name
    #[arg(value_parser = NonEmptyStringValueParser::new())]
    pub name: String,
}

const BARRIER_ABOUT: &str = "\
A barrier holds everyone who waits for it until it is released: the key NAME (no lease, \
etcd's Go recipe.Barrier layout), whose value is the \"<hostname>:<pid>\" of who raised it. \
It stays up after `hold` exits, until `release` or `etcdctl del NAME`.

`hold NAME` raises it and prints `NAME: held` (`NAME: already held` if it was up; exit 0 \
either way). `release NAME` removes it and prints `NAME: released` (`NAME: not held` if it \
was not up; exit 0). `wait NAME` returns at once if it is not up, else when it is \
released, and prints `NAME: released`; with --timeout it gives up after DURATION (exit 4), \
and a signal ends the wait (exit 128+n).";

#[derive(Debug, Args)]
pub struct BarrierArgs {
    #[command(subcommand)]
    pub command: BarrierCommand,
}

#[derive(Debug, Subcommand)]
pub enum BarrierCommand {
    /// Raise the barrier: waits block until it is released
    Hold {
        /// The barrier's name (its key)
        #[arg(value_parser = NonEmptyStringValueParser::new())]
        name: String,
    },
    /// Release the barrier: every wait returns
    Release {
        /// The barrier's name (its key)
        #[arg(value_parser = NonEmptyStringValueParser::new())]
        name: String,
    },
    /// Wait until the barrier is released (at once if it is not up)
    Wait {
        /// Give up after DURATION (exit 4)
        #[arg(long, value_parser = text::parse_duration, value_name = "DURATION")]
        timeout: Option<Duration>,

        /// The barrier's name (its key)
        #[arg(value_parser = NonEmptyStringValueParser::new())]
        name: String,
    },
}

impl BarrierCommand {
    /// The barrier's name, whatever the subcommand.
    pub fn name(&self) -> &str {
        match self {
            BarrierCommand::Hold { name }
            | BarrierCommand::Release { name }
            | BarrierCommand::Wait { name, .. } => name,
        }
    }
}

const LOCK_ABOUT: &str = "\
Acquire the lock NAME: the key NAME/<lease id in hex>, in etcd's concurrency.Mutex format, \
so etcd-sync and `etcdctl lock NAME` exclude each other. Waiters are served in order.

Without CMD: print the key once acquired, hold the lock until SIGINT, SIGTERM or SIGHUP, \
release it and exit 0. If the lock is lost (etcd unreachable for about --ttl), exit 3.

With CMD (after `--`): run CMD while holding the lock, with ETCD_LOCK_KEY (the key) and \
ETCD_LOCK_REV (its create revision: the fencing token) in its environment, release \
afterwards and exit with CMD's code. CMD runs in its own process group. If the lock is \
lost, CMD's group gets SIGTERM, then SIGKILL after --kill-grace, and etcd-sync exits 3. A \
signal to etcd-sync is passed on to CMD's group (SIGKILL after --kill-grace), then the lock \
is released.

With -n N (--permits N): take one of N permits of the counting semaphore NAME instead (key \
NAME/<lease id in hex>.permits-N): up to N holders at once. Every holder of NAME must use \
the same N (a different N is refused: exit 2).

With --shared: take the read side of the read-write lock NAME (key NAME/<lease id in \
hex>.shared): --shared holders share it.

A plain `lock` and `etcdctl lock NAME` exclude every permit and --shared holder. Output, \
environment, exit codes, --timeout, signals and the kill on loss are the same in every \
mode.";

const ELECT_ABOUT: &str = "\
Campaign for leadership of the election NAME with the value PROPOSAL: the key \
NAME/<lease id in hex>, in etcd's concurrency.Election format, so etcd-sync and \
`etcdctl elect NAME` candidates share one line.

Without CMD: print the key and the value (two lines) once elected, lead until SIGINT, \
SIGTERM or SIGHUP, resign and exit 0. If leadership is lost, exit 3.

With --hand-over-to CANDIDATE: where it would resign (a signal, a request with \
--release-on-request, CMD's end), hand leadership to the waiting etcd-sync candidate \
CANDIDATE (its value, or its key as `etcd-sync status` shows it) instead: it leads next, \
with no moment without a leader, and every other candidate keeps its place. If that fails \
(no such candidate waits, or it did not take it within the request timeout), resign as \
usual; either way the exit code is as without it. With --hand-over-next, the same to \
whoever waits first in line, as the hand-over finds it: nobody is passed over.

With CMD (after `--`): run CMD while leading, with ETCD_ELECT_KEY and ETCD_ELECT_REV (the \
key's create revision) in its environment; on loss or signals, as for `etcd-sync lock`.

With --listen (-l): print the current leader, then one line per change, until SIGINT, \
SIGTERM or SIGHUP: `leader <key> <value>` or `no-leader`; with --json one object per line: \
{\"event\":\"elected\"|\"proclaimed\",\"key\":..,\"value\":..,\"revision\":<create \
revision>,\"mod_revision\":..,\"lease\":\"<hex>\"} or {\"event\":\"no-leader\"}.";

const STATUS_ABOUT: &str = "\
Show who holds NAME and who waits for it, in line order, from one read of the keys under \
NAME/ (no session, no lease, no key written). The holders are decided as the waiters decide: \
the oldest key holds, --shared holders in a row hold together, the first N permits of -n N \
hold.

One line per key: `holder` or `waiter`, the key, the holder's identity (\"<hostname>:<pid>\" \
of the etcd-sync or library process that took it; an election candidate's value; \
`(none: etcdctl or Go)` for `etcdctl lock`, which stores no value), its lease in hex, its \
fencing token (create revision), the TTL its lease has left, and `shared`, `permits N` or \
`not a lock key` when the key is not an exclusive one. The first line says `NAME: held by \
H, W waiting` or `NAME: free`.

With --json, one object: {\"name\":..,\"holders\":[..],\"waiters\":[..]}, each key as \
{\"key\":..,\"identity\":<string or null>,\"lease\":\"<hex>\" or null,\"revision\":<create \
revision>,\"ttl\":<seconds left or null>,\"mode\":\"exclusive\"|\"shared\"|\"permits\"|\"other\"} \
(with \"permits\":N for permits, and \"takes\":k for a key of k permits); \"holders\":[] when nobody holds NAME.

Exits 0 whether or not NAME is held, 1 if etcd could not be read.";

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print one JSON object instead of lines
    #[arg(long)]
    pub json: bool,

    /// The lock's, semaphore's or election's name
    #[arg(value_parser = NonEmptyStringValueParser::new())]
    pub name: String,
}

#[derive(Debug, Args)]
pub struct LockArgs {
    /// Take one of N permits of a counting semaphore (N holders at once, 1 to 1024) instead
    /// of the exclusive lock
    #[arg(
        short = 'n',
        long = "permits",
        value_name = "N",
        value_parser = parse_permits,
        conflicts_with = "shared"
    )]
    pub permits: Option<u32>,

    /// Take the read side of a read-write lock (shared with other --shared holders) instead
    /// of the exclusive lock
    #[arg(long)]
    pub shared: bool,

    /// The lock's name
    #[arg(value_parser = NonEmptyStringValueParser::new())]
    pub name: String,

    #[command(flatten)]
    pub hold: HoldOpts,
}

#[derive(Debug, Args)]
pub struct ElectArgs {
    /// Observe the election instead of campaigning
    #[arg(short, long, conflicts_with_all = ["proposal", "timeout", "kill_grace", "command"])]
    pub listen: bool,

    /// With --listen: print one JSON object per line
    // `requires` alone is not enough: clap drops a requirement that conflicts with an
    // argument given (`elect --json NAME PROPOSAL` would campaign).
    #[arg(long, requires = "listen", conflicts_with_all = ["proposal", "timeout", "kill_grace", "command"])]
    pub json: bool,

    /// The election's name
    #[arg(value_parser = NonEmptyStringValueParser::new())]
    pub name: String,

    /// The value to campaign with (the leader's value while we lead); required unless --listen
    #[arg(required_unless_present = "listen")]
    pub proposal: Option<String>,

    /// Where we would resign, hand leadership to this waiting candidate (its value or its
    /// key) instead; resign if that fails
    #[arg(long, value_name = "CANDIDATE", conflicts_with = "listen")]
    pub hand_over_to: Option<String>,

    /// Where we would resign, hand leadership to the first candidate waiting in line
    /// instead (nobody is passed over); resign if that fails
    #[arg(long, conflicts_with_all = ["listen", "hand_over_to"])]
    pub hand_over_next: bool,

    #[command(flatten)]
    pub hold: HoldOpts,
}

/// Waiting, and running CMD while holding: shared by `lock` and `elect`.
#[derive(Debug, Args)]
pub struct HoldOpts {
    /// Give up waiting after DURATION (exit 4, no key left behind)
    #[arg(long, value_parser = text::parse_duration, value_name = "DURATION")]
    pub timeout: Option<Duration>,

    /// How long CMD has to exit after SIGTERM (on loss) or a forwarded signal before its
    /// process group gets SIGKILL
    #[arg(long, default_value = "5s", value_parser = text::parse_duration, value_name = "DURATION")]
    pub kill_grace: Duration,

    /// Give up the lock or leadership when someone asks (`etcd-sync revoke NAME`): stop
    /// CMD as on a signal (SIGTERM, SIGKILL after --kill-grace), then release and exit
    /// with CMD's code; without CMD, release and exit 0
    #[arg(long)]
    pub release_on_request: bool,

    /// Command to run while holding the lock or leadership, and its arguments
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn permits_bounds() {
        assert_eq!(parse_permits("1"), Ok(1));
        assert_eq!(parse_permits("1024"), Ok(1024));
        for bad in ["0", "1025", "-1", "abc", "", "2.5"] {
            assert!(parse_permits(bad).is_err(), "{bad:?} accepted");
        }
    }
}
