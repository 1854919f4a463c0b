//! Command-line options of the driver.
//!
//! Unknown arguments (the `--bench` cargo passes, `cargo bench` filters, anything else) are
//! ignored rather than rejected: `cargo bench` runs this target with arguments meant for
//! other benches.

use std::ffi::OsString;
use std::time::Duration;

use clap::{CommandFactory, Parser};

use crate::Res;

/// etcd-sync side of scripts/bench-compare: measures etcd-sync against a running etcd and
/// prints `RESULT rust <figure> key=value ...` lines (latencies in microseconds).
#[derive(Debug, Parser)]
#[command(name = "compare", args_override_self = true)]
struct Cli {
    /// etcd endpoints, comma separated (required)
    #[arg(long, env = "ETCD_ENDPOINTS", value_name = "URL[,URL]")]
    endpoints: Option<String>,

    /// Uncontended lock+unlock and floor iterations
    #[arg(long, default_value_t = 1000)]
    n: usize,

    /// Threads in the contended run, each with its own client (at least 2)
    #[arg(long, default_value_t = 8)]
    contenders: usize,

    /// Acquisitions in the contended run, and measured acquisitions per contender-count row
    #[arg(long, default_value_t = 2000)]
    total: usize,

    /// Contender counts of the rows (issue 28), comma separated; each contender has its own
    /// client and session. The largest also sizes the semaphore row (8 permits) and the
    /// read-write lock row (readers behind one writer). Empty: no rows
    #[arg(long, default_value = "8,64,256,1024", value_name = "N,N,..")]
    rows: String,

    /// Time bound of a row's warm-up, and again of its measured window, in seconds
    #[arg(long, default_value_t = 20)]
    row_secs: u64,

    /// The rows' contenders each on a runtime thread of their own, as separate processes
    /// would be. Default: they share the process's runtime thread (`shared_runtime`), as
    /// the Go and etcd-client drivers' contenders share their runtime
    #[arg(long)]
    own_runtimes: bool,

    /// Election campaign+resign iterations
    #[arg(long, default_value_t = 500)]
    campaigns: usize,

    /// Queue lengths for the scaling run, comma separated
    #[arg(long, default_value = "2,16,256", value_name = "A,B,..")]
    waiters: String,

    /// Measured handoffs per queue length
    #[arg(long, default_value_t = 200)]
    handoffs: usize,

    /// How long a holder keeps the lock in the scaling run, in milliseconds
    #[arg(long, default_value_t = 5)]
    hold_ms: u64,

    /// Sessions (and held locks) for the thread and memory figures (at least 2)
    #[arg(long, default_value_t = 1000)]
    sessions: usize,

    /// Rounds of the handoff floor (release Txn → a raw watcher's delete event)
    #[arg(long, default_value_t = 500)]
    floor_n: usize,

    /// Locks one client holds at once (distinct names) for the held-locks figures
    #[arg(long, default_value_t = 10_000)]
    held: usize,

    /// Sessions those locks are spread over (round robin; the latency probes use the first)
    #[arg(long, default_value_t = 1)]
    held_sessions: usize,

    /// Workers of the STM rows (issue 30), each with its own client (at least 1)
    #[arg(long, default_value_t = 4)]
    stm_workers: usize,

    /// Measured window of each STM row, in seconds
    #[arg(long, default_value_t = 3)]
    stm_secs: u64,

    /// Run only some phases, comma separated: uncontended, election, cost, floor (the
    /// handoff floor; also run before contended and scaling), contended, scaling, diagnose
    /// (a shorter contended run while sampling etcd's unsynced-watcher gauge), resources
    /// (threads and memory with many sessions, then with --held locks held, each measured in
    /// a fresh child process), held (only the second of those), shared (a semaphore of 4
    /// and a read-write lock with 90 % reads beside a mutex, 16 contenders each), herd (256
    /// waiters on a semaphore and behind a write lock: who a release admits, its reads and
    /// the watch events etcd delivers), rows (the contender-count rows of --rows with the
    /// semaphore and read-write lock rows; contended runs them too), stm (transactions per
    /// second with no conflict and with every worker on one key), multi (lock + unlock of a
    /// multi-lock of 2 and 4 names beside a single mutex, uncontended), revoke (a release
    /// request: the call, and until the holder hears it, beside a mutex), barriers (a latch's,
    /// a barrier's and a mutex handoff's wake, double-barrier rounds of 2 and 4, beside
    /// lock + unlock of a mutex; --handoffs rounds), downgrade (a downgradable write, its
    /// downgrade and the read's release, beside a mutex and a plain write), permits (one and
    /// three permits of a semaphore of 4 at once, beside a mutex)
    #[arg(long, value_name = "PHASE[,PHASE]")]
    only: Option<String>,

    /// Abort the whole run (exit 3) after this many seconds
    #[arg(long, default_value_t = 2400)]
    timeout_secs: u64,

    /// Key prefix for everything this run creates (default: compare/rust/<pid>)
    #[arg(long)]
    prefix: Option<String>,
}

/// The options, with defaults filled in and minimums applied.
#[derive(Debug, Clone)]
pub struct Args {
    pub endpoints: Vec<String>,
    pub n: usize,
    pub contenders: usize,
    pub total: usize,
    pub campaigns: usize,
    pub waiters: Vec<usize>,
    pub rows: Vec<usize>,
    pub row_time: Duration,
    pub own_runtimes: bool,
    pub handoffs: usize,
    pub hold: Duration,
    pub sessions: usize,
    pub floor_n: usize,
    pub held: usize,
    pub held_sessions: usize,
    pub stm_workers: usize,
    pub stm_time: Duration,
    pub only: Option<Vec<String>>,
    pub timeout: Duration,
    pub prefix: String,
}

impl Args {
    /// Parses this process's arguments. `--help` prints the options and exits.
    pub fn parse() -> Res<Args> {
        let cli = match Cli::try_parse_from(known_args(std::env::args_os().skip(1))) {
            Ok(cli) => cli,
            // --help: clap prints it to stdout and exits 0.
            Err(e) if !e.use_stderr() => e.exit(),
            // One line, like the driver's other messages: clap's first line without its
            // "error: " (the rest is a hint to try --help).
            Err(e) => {
                let text = e.to_string();
                let first = text.lines().next().unwrap_or_default();
                return Err(first.trim_start_matches("error: ").into());
            }
        };
        let waiters = split_list(&cli.waiters)
            .iter()
            .map(|v| {
                v.parse::<usize>()
                    .map_err(|e| format!("--waiters {v:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let rows = split_list(&cli.rows)
            .iter()
            .map(|v| match v.parse::<usize>() {
                Ok(n) if n >= 2 => Ok(n),
                Ok(n) => Err(format!("--rows: {n} contenders (at least 2)")),
                Err(e) => Err(format!("--rows {v:?}: {e}")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Args {
            endpoints: cli.endpoints.as_deref().map(split_list).unwrap_or_default(),
            n: cli.n.max(1),
            contenders: cli.contenders.max(2),
            total: cli.total.max(1),
            campaigns: cli.campaigns.max(1),
            waiters,
            rows,
            row_time: Duration::from_secs(cli.row_secs.max(1)),
            own_runtimes: cli.own_runtimes,
            handoffs: cli.handoffs.max(1),
            hold: Duration::from_millis(cli.hold_ms),
            sessions: cli.sessions.max(2),
            floor_n: cli.floor_n.max(1),
            held: cli.held.max(1),
            held_sessions: cli.held_sessions.clamp(1, cli.held.max(1)),
            stm_workers: cli.stm_workers.max(1),
            stm_time: Duration::from_secs(cli.stm_secs.max(1)),
            only: cli.only.as_deref().map(split_list),
            timeout: Duration::from_secs(cli.timeout_secs),
            prefix: cli
                .prefix
                .unwrap_or_else(|| format!("compare/rust/{}", std::process::id())),
        })
    }

    /// Whether `phase` is to run (`--only` not given, or naming it).
    pub fn wants(&self, phase: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|p| p == phase))
    }
}

/// The program name followed by the arguments [`Cli`] defines (long names, and `-h`), with
/// their values; every other argument is dropped. A value is attached as `--flag=value`, so that a value that
/// starts with `-` is still taken as the value.
fn known_args(raw: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut command = Cli::command();
    // Adds the generated `--help`, so that it is known too.
    command.build();
    let known: Vec<(String, bool)> = command
        .get_arguments()
        .flat_map(|a| {
            let takes_value = a.get_action().takes_values();
            let long = a.get_long().map(|l| format!("--{l}"));
            let short = a.get_short().map(|s| format!("-{s}"));
            long.into_iter()
                .chain(short)
                .map(move |name| (name, takes_value))
        })
        .collect();
    let mut out = vec![OsString::from("compare")];
    let mut raw = raw.map(|a| a.to_string_lossy().into_owned());
    while let Some(arg) = raw.next() {
        let flag = match arg.split_once('=') {
            Some((flag, _)) if flag.starts_with("--") => flag,
            _ => arg.as_str(),
        };
        let Some(&(_, takes_value)) = known.iter().find(|(name, _)| name == flag) else {
            continue;
        };
        if !takes_value || flag.len() < arg.len() {
            out.push(arg.into());
        } else if let Some(value) = raw.next() {
            out.push(format!("{arg}={value}").into());
        } else {
            out.push(arg.into()); // clap reports the missing value
        }
    }
    out
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}
