//! `etcd-sync`: the command-line tool of the etcd-sync crate.
//!
//! `etcd-sync lock NAME [-- CMD...]` and `etcd-sync elect NAME PROPOSAL [-- CMD...]` take a
//! lock or leadership that `etcdctl lock` / `etcdctl elect` share (same keys, same order),
//! and either hold it until SIGINT/SIGTERM/SIGHUP or run CMD while holding it. Unlike
//! etcdctl, when the lock or leadership is lost while CMD runs, CMD is stopped (SIGTERM to
//! its process group, SIGKILL after `--kill-grace`), as `consul lock` does.
//! `etcd-sync elect --listen NAME` prints every leadership change.
//!
//! The library is blocking; the tool is plain threads. A blocking acquire runs on a worker
//! thread while the main thread polls for signals; a signal while waiting closes the
//! session (revoking its lease removes our queued key) and the waiting call returns.
//! Exit codes are listed in [`EXIT_CODES`].

#[path = "etcd-sync/child.rs"]
mod child;
#[path = "etcd-sync/signals.rs"]
mod signals;
#[path = "etcd-sync/text.rs"]
mod text;

use std::ffi::OsString;
use std::io::{self, Write};
use std::thread;
use std::time::{Duration, Instant};

use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Parser, Subcommand};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use etcd_sync::{Client, ClientBuilder, Error, Leadership, LossReason, MutexGuard, Session};

/// A process exit code.
type Exit = i32;

const EXIT_OK: Exit = 0;
const EXIT_ERROR: Exit = 1;
const EXIT_LOST: Exit = 3;
const EXIT_TIMEOUT: Exit = 4;
const EXIT_CANNOT_EXECUTE: Exit = 126;
const EXIT_NOT_FOUND: Exit = 127;
/// Added to a signal number: CMD was killed by it, or it interrupted a wait.
const EXIT_SIGNAL_BASE: Exit = 128;

/// The exit codes, as shown by `--help` (and in README.md).
const EXIT_CODES: &str = "\
Exit codes:
  0       Done: released/resigned after SIGINT, SIGTERM or SIGHUP; `elect --listen` stopped
  N       With CMD: CMD's own exit code, passed through
  1       Runtime error: cannot connect, etcd error, release failed, ...
  2       Bad arguments
  3       Lock or leadership lost (CMD, if any, was terminated)
  4       --timeout expired before the lock or leadership was acquired
  126     CMD could not be executed
  127     CMD was not found
  128+N   CMD was killed by signal N (e.g. 137 = SIGKILL), or signal N interrupted the
          wait for the lock or leadership (130 = SIGINT, 143 = SIGTERM); no key is left
With CMD, codes 1-4 can also be CMD's own: etcd-sync reports its own failures on stderr.";

/// How often the main thread looks at signals, CMD and the loss signal.
const TICK: Duration = Duration::from_millis(25);

/// How long to try revoking the lease after a loss before exiting anyway (etcd may be
/// unreachable; the lease then expires on its own).
const LOST_CLEANUP: Duration = Duration::from_secs(1);

/// Distributed lock and leader election on etcd v3, interoperating with `etcdctl lock` and
/// `etcdctl elect`; CMD is stopped when the lock or leadership is lost.
#[derive(Debug, Parser)]
#[command(name = "etcd-sync", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(flatten)]
    global: GlobalOpts,
    #[command(subcommand)]
    command: Command,
}

/// Options for every subcommand: where etcd is and how to talk to it. They may be given
/// before or after the subcommand. `Debug` is written by hand: it never shows a password.
#[derive(Args)]
#[command(next_help_heading = "Global options")]
struct GlobalOpts {
    /// etcd endpoints, comma separated
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_ENDPOINTS",
        hide_env_values = true,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379",
        value_name = "URLS"
    )]
    endpoints: Vec<String>,

    /// Session (lease) TTL in seconds: how long etcd keeps our key after etcd-sync stops
    /// renewing it, and about how soon a lost lock is noticed
    #[arg(long, global = true, default_value_t = 10, value_parser = parse_ttl, value_name = "SECONDS")]
    ttl: u64,

    /// Time limit for connecting to etcd (e.g. 3s, 500ms)
    #[arg(long, global = true, default_value = "3s", value_parser = text::parse_duration, value_name = "DURATION")]
    dial_timeout: Duration,

    /// Time limit for each etcd request (grant, release, revoke, ...)
    #[arg(long, global = true, default_value = "5s", value_parser = text::parse_duration, value_name = "DURATION")]
    command_timeout: Duration,

    /// CA certificate (PEM) that signed etcd's certificate; turns on TLS (https)
    #[arg(long, global = true, env = "ETCD_SYNC_CACERT", value_name = "FILE")]
    cacert: Option<std::path::PathBuf>,

    /// Client certificate (PEM) for etcd's --client-cert-auth; needs --key and --cacert
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_CERT",
        value_name = "FILE",
        requires = "key"
    )]
    cert: Option<std::path::PathBuf>,

    /// Private key (PEM) of the client certificate
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_KEY",
        value_name = "FILE",
        requires = "cert"
    )]
    key: Option<std::path::PathBuf>,

    /// etcd user, as NAME or NAME:PASSWORD (etcd auth)
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_USER",
        hide_env_values = true,
        value_name = "USER"
    )]
    user: Option<String>,

    /// Password for --user (prefer the ETCD_SYNC_PASSWORD environment variable)
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    password: Option<String>,
}

impl std::fmt::Debug for GlobalOpts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // --user may be NAME:PASSWORD: show only the name.
        let user = self
            .user
            .as_deref()
            .map(|u| u.split_once(':').map_or(u, |(name, _)| name));
        f.debug_struct("GlobalOpts")
            .field("endpoints", &self.endpoints)
            .field("ttl", &self.ttl)
            .field("dial_timeout", &self.dial_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("cacert", &self.cacert)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("user", &user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl GlobalOpts {
    /// The client configuration these options describe. Connection options added later
    /// (TLS, authentication) go here.
    fn client_builder(&self) -> etcd_sync::Result<ClientBuilder> {
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty());
        let mut builder = Client::builder()
            .endpoints(endpoints)
            .connect_timeout(self.dial_timeout)
            .request_timeout(self.command_timeout);
        match (&self.cacert, &self.cert, &self.key) {
            (Some(ca), cert, key) => {
                let client = cert.as_ref().zip(key.as_ref());
                builder = builder.tls(etcd_sync::TlsConfig::from_files(ca, client)?);
            }
            (None, Some(_), _) | (None, _, Some(_)) => {
                return Err(etcd_sync::Error::InvalidArgument(
                    "--cert/--key need --cacert (the CA that signed etcd's certificate)".into(),
                ));
            }
            (None, None, None) => {}
        }
        if let Some(user) = &self.user {
            let (name, password) = match (user.split_once(':'), &self.password) {
                (Some((name, password)), _) => (name.to_string(), password.to_string()),
                (None, Some(password)) => (user.clone(), password.clone()),
                (None, None) => {
                    return Err(etcd_sync::Error::InvalidArgument(
                        "--user needs a password: NAME:PASSWORD, --password or ETCD_SYNC_PASSWORD"
                            .into(),
                    ));
                }
            };
            builder = builder.user(name, password);
        }
        Ok(builder)
    }

    fn session_ttl(&self) -> Duration {
        Duration::from_secs(self.ttl)
    }
}

fn parse_ttl(text: &str) -> Result<u64, String> {
    let ttl: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number of seconds"))?;
    let max = etcd_sync::MAX_TTL.as_secs();
    if ttl == 0 || ttl > max {
        return Err(format!("must be between 1 and {max} seconds"));
    }
    Ok(ttl)
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Acquire a lock (shared with `etcdctl lock NAME`); hold it until a signal, or run CMD
    /// while holding it
    #[command(after_help = EXIT_CODES, long_about = LOCK_ABOUT)]
    Lock(LockArgs),
    /// Campaign for leadership (shared with `etcdctl elect NAME`); lead until a signal, or
    /// run CMD while leading. With --listen, print every leadership change instead
    #[command(after_help = EXIT_CODES, long_about = ELECT_ABOUT)]
    Elect(ElectArgs),
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
is released.";

const ELECT_ABOUT: &str = "\
Campaign for leadership of the election NAME with the value PROPOSAL: the key \
NAME/<lease id in hex>, in etcd's concurrency.Election format, so etcd-sync and \
`etcdctl elect NAME` candidates share one line.

Without CMD: print the key and the value (two lines) once elected, lead until SIGINT, \
SIGTERM or SIGHUP, resign and exit 0. If leadership is lost, exit 3.

With CMD (after `--`): run CMD while leading, with ETCD_ELECT_KEY and ETCD_ELECT_REV (the \
key's create revision) in its environment; on loss or signals, as for `etcd-sync lock`.

With --listen (-l): print the current leader, then one line per change, until SIGINT, \
SIGTERM or SIGHUP: `leader <key> <value>` or `no-leader`; with --json one object per line: \
{\"event\":\"elected\"|\"proclaimed\",\"key\":..,\"value\":..,\"revision\":<create \
revision>,\"mod_revision\":..,\"lease\":\"<hex>\"} or {\"event\":\"none\"}.";

#[derive(Debug, Args)]
struct LockArgs {
    /// The lock's name
    #[arg(value_parser = NonEmptyStringValueParser::new())]
    name: String,

    #[command(flatten)]
    hold: HoldOpts,
}

#[derive(Debug, Args)]
struct ElectArgs {
    /// Observe the election instead of campaigning
    #[arg(short, long, conflicts_with_all = ["proposal", "timeout", "kill_grace", "command"])]
    listen: bool,

    /// With --listen: print one JSON object per line
    // `requires` alone is not enough: clap drops a requirement that conflicts with an
    // argument given (`elect --json NAME PROPOSAL` would campaign).
    #[arg(long, requires = "listen", conflicts_with_all = ["proposal", "timeout", "kill_grace", "command"])]
    json: bool,

    /// The election's name
    #[arg(value_parser = NonEmptyStringValueParser::new())]
    name: String,

    /// The value to campaign with (the leader's value while we lead); required unless --listen
    #[arg(required_unless_present = "listen")]
    proposal: Option<String>,

    #[command(flatten)]
    hold: HoldOpts,
}

/// Waiting, and running CMD while holding: shared by `lock` and `elect`.
#[derive(Debug, Args)]
struct HoldOpts {
    /// Give up waiting after DURATION (exit 4, no key left behind)
    #[arg(long, value_parser = text::parse_duration, value_name = "DURATION")]
    timeout: Option<Duration>,

    /// How long CMD has to exit after SIGTERM (on loss) or a forwarded signal before its
    /// process group gets SIGKILL
    #[arg(long, default_value = "5s", value_parser = text::parse_duration, value_name = "DURATION")]
    kill_grace: Duration,

    /// Command to run while holding the lock or leadership, and its arguments
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

fn main() {
    let cli = Cli::parse();
    let code = match signals::install() {
        Ok(()) => run(&cli),
        Err(e) => {
            eprintln!("etcd-sync: cannot install signal handlers: {e}");
            EXIT_ERROR
        }
    };
    let _ = io::stdout().flush();
    // Exit without joining the client's threads: a loss path may have left a bounded
    // cleanup request running against an unreachable etcd.
    std::process::exit(code);
}

fn run(cli: &Cli) -> Exit {
    let session = match connect(&cli.global) {
        Ok(session) => session,
        Err(code) => return code,
    };
    let code = match &cli.command {
        Command::Lock(args) => lock(&session, args),
        Command::Elect(args) if args.listen => listen(&session, args),
        Command::Elect(args) => elect(&session, args),
    };
    finish(&session);
    code
}

/// Connects and starts the session, interruptibly.
fn connect(global: &GlobalOpts) -> Result<Session, Exit> {
    let builder = global.client_builder().map_err(|e| fail(&e))?;
    let ttl = global.session_ttl();
    match interruptible(move || builder.connect()?.session_builder().ttl(ttl).start())? {
        Waited::Done(Ok(session)) => Ok(session),
        Waited::Done(Err(e)) => Err(fail(&e)),
        Waited::Signal(signo) => Err(EXIT_SIGNAL_BASE + signo),
    }
}

/// Revokes the session's lease at the end, unless that already happened. After a loss,
/// etcd may be unreachable: try for at most [`LOST_CLEANUP`].
fn finish(session: &Session) {
    match session.loss_reason() {
        None => {
            let _ = session.close();
        }
        Some(LossReason::Closed) => {}
        Some(_) => {
            let session = session.clone();
            let _ = bounded(LOST_CLEANUP, move || session.close());
        }
    }
}

fn lock(session: &Session, args: &LockArgs) -> Exit {
    let mutex = match session.mutex(&args.name) {
        Ok(mutex) => mutex,
        Err(e) => return fail(&e),
    };
    let timeout = args.hold.timeout;
    let acquired = acquire(session, &args.name, timeout, move || {
        match timeout {
            Some(timeout) => mutex.lock_timeout(timeout),
            None => mutex.lock(),
        }
        .map(Held::Lock)
    });
    match acquired {
        Ok(held) => hold(session, held, &args.hold),
        Err(code) => code,
    }
}

fn elect(session: &Session, args: &ElectArgs) -> Exit {
    let election = match session.election(&args.name) {
        Ok(election) => election,
        Err(e) => return fail(&e),
    };
    let proposal = args.proposal.clone().unwrap_or_default();
    let timeout = args.hold.timeout;
    let acquired = acquire(session, &args.name, timeout, move || {
        match timeout {
            Some(timeout) => election.campaign_timeout(&proposal, timeout),
            None => election.campaign(&proposal),
        }
        .map(|leadership| Held::Leadership(leadership, proposal))
    });
    match acquired {
        Ok(held) => hold(session, held, &args.hold),
        Err(code) => code,
    }
}

fn listen(session: &Session, args: &ElectArgs) -> Exit {
    let observer = match session.election(&args.name).and_then(|e| e.observe()) {
        Ok(observer) => observer,
        Err(e) => return fail(&e),
    };
    loop {
        if signals::take().is_some() {
            return EXIT_OK;
        }
        let event = match observer.recv_timeout(TICK) {
            Ok(Some(event)) => event,
            Ok(None) => continue,
            Err(e) => return fail(&e),
        };
        let line = if args.json {
            text::event_json(&event)
        } else {
            text::event_line(&event)
        };
        let mut out = io::stdout().lock();
        if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
            if e.kind() == io::ErrorKind::BrokenPipe {
                return EXIT_OK; // whoever read our output is done
            }
            eprintln!("etcd-sync: cannot write to stdout: {e}");
            return EXIT_ERROR;
        }
    }
}

/// A held lock or leadership.
enum Held {
    Lock(MutexGuard),
    /// The leadership and the value we campaigned with.
    Leadership(Leadership, String),
}

impl Held {
    fn what(&self) -> &'static str {
        match self {
            Held::Lock(_) => "lock",
            Held::Leadership(..) => "leadership",
        }
    }

    fn key(&self) -> String {
        match self {
            Held::Lock(guard) => guard.key_str().into_owned(),
            Held::Leadership(leadership, _) => {
                String::from_utf8_lossy(leadership.key()).into_owned()
            }
        }
    }

    fn lost(&self) -> Receiver<()> {
        match self {
            Held::Lock(guard) => guard.lost(),
            Held::Leadership(leadership, _) => leadership.lost(),
        }
    }

    /// CMD's environment: the key and its create revision (the fencing token).
    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Held::Lock(guard) => vec![
                ("ETCD_LOCK_KEY", self.key()),
                ("ETCD_LOCK_REV", guard.fencing_token().to_string()),
            ],
            Held::Leadership(leadership, _) => vec![
                ("ETCD_ELECT_KEY", self.key()),
                ("ETCD_ELECT_REV", leadership.fencing_token().to_string()),
            ],
        }
    }

    /// What is printed once acquired without CMD: the key (lock), or the key and the
    /// value on two lines (elect), as etcdctl does.
    fn announcement(&self) -> String {
        match self {
            Held::Lock(_) => format!("{}\n", self.key()),
            Held::Leadership(_, value) => format!("{}\n{value}\n", self.key()),
        }
    }

    /// Unlocks or resigns (deleting the key only if it is still ours).
    fn release(self) -> etcd_sync::Result<()> {
        match self {
            Held::Lock(guard) => guard.unlock(),
            Held::Leadership(mut leadership, _) => leadership.resign(),
        }
    }
}

/// Runs the blocking acquire `f` on a worker thread so that signals are seen meanwhile.
/// On a signal the session is closed: revoking its lease deletes our queued key, and the
/// waiting call returns with an error.
fn acquire(
    session: &Session,
    name: &str,
    timeout: Option<Duration>,
    f: impl FnOnce() -> etcd_sync::Result<Held> + Send + 'static,
) -> Result<Held, Exit> {
    match interruptible(f)? {
        Waited::Done(Ok(held)) => Ok(held),
        Waited::Done(Err(Error::Timeout {
            operation: "lock" | "campaign",
            after,
        })) if timeout.is_some() => {
            eprintln!("etcd-sync: gave up waiting for {name:?} after {after:?} (--timeout)");
            Err(EXIT_TIMEOUT)
        }
        Waited::Done(Err(e)) => Err(fail(&e)),
        Waited::Signal(signo) => {
            if let Err(e) = session.close() {
                eprintln!(
                    "etcd-sync: {} while waiting; could not revoke the session: {e} (our key \
                     expires with the lease within --ttl)",
                    signals::name(signo)
                );
            }
            Err(EXIT_SIGNAL_BASE + signo)
        }
    }
}

fn hold(session: &Session, held: Held, opts: &HoldOpts) -> Exit {
    if opts.command.is_empty() {
        hold_until_signal(session, held)
    } else {
        run_command(session, held, opts)
    }
}

/// Prints the key and holds until a signal (release, exit 0) or a loss (exit 3).
fn hold_until_signal(session: &Session, held: Held) -> Exit {
    {
        // If nobody reads our output any more, keep holding all the same.
        let mut out = io::stdout().lock();
        let _ = out
            .write_all(held.announcement().as_bytes())
            .and_then(|()| out.flush());
    }
    let lost = held.lost();
    loop {
        if signals::take().is_some() {
            return release(session, held, EXIT_OK);
        }
        if let Err(RecvTimeoutError::Disconnected) = lost.recv_timeout(TICK) {
            eprintln!("etcd-sync: {} lost: {}", held.what(), loss_reason(session));
            return abandon(held);
        }
    }
}

/// Runs CMD while holding; stops it on loss (exit 3) and forwards signals to it; releases
/// afterwards and passes its exit code through.
fn run_command(session: &Session, held: Held, opts: &HoldOpts) -> Exit {
    let program = opts
        .command
        .first()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut child = match child::Child::spawn(&opts.command, &held.env()) {
        Ok(child) => child,
        Err(e) => {
            eprintln!("etcd-sync: cannot run {program:?}: {e}");
            let code = if e.kind() == io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXECUTE
            };
            return release(session, held, code);
        }
    };
    let lost = held.lost();
    let mut is_lost = false;
    // Set once we started stopping CMD (loss or signal): when its group gets SIGKILL.
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let code = loop {
        let status = match child.poll() {
            Ok(status) => status,
            Err(e) => {
                // Cannot happen for our own child; stop it rather than hold blindly.
                eprintln!("etcd-sync: cannot wait for {program:?}: {e}");
                child.signal_group(libc::SIGKILL);
                break EXIT_ERROR;
            }
        };
        if let Some(code) = status {
            // After CMD exits on its own, what it left in its group is not our business;
            // once we are stopping it, we stop its whole group.
            if kill_at.is_none() || killed || !child.group_alive() {
                break code;
            }
        }
        if let Some(signo) = signals::take() {
            child.signal_group(signo);
            kill_at.get_or_insert_with(|| Instant::now() + opts.kill_grace);
        }
        if !is_lost && lost.try_recv() == Err(crossbeam_channel::TryRecvError::Disconnected) {
            is_lost = true;
            eprintln!(
                "etcd-sync: {} lost: {}; stopping {program:?} (SIGTERM, SIGKILL after {:?})",
                held.what(),
                loss_reason(session),
                opts.kill_grace
            );
            child.signal_group(libc::SIGTERM);
            let deadline = Instant::now() + opts.kill_grace;
            kill_at = Some(kill_at.map_or(deadline, |at| at.min(deadline)));
        }
        if !killed && kill_at.is_some_and(|at| Instant::now() >= at) {
            child.signal_group(libc::SIGKILL);
            killed = true;
        }
        if is_lost {
            thread::sleep(TICK);
        } else {
            // Sleeps one tick, or wakes at once when the lock is lost.
            let _ = lost.recv_timeout(TICK);
        }
    };
    child.restore_terminal();
    if is_lost {
        return abandon(held);
    }
    release(session, held, code)
}

/// Releases, then revokes the session (which deletes the key in any case). `code` is the
/// exit code if all goes well; a release that failed outright turns a 0 into 1.
fn release(session: &Session, held: Held, code: Exit) -> Exit {
    let what = held.what();
    let released = held.release();
    let closed = session.close();
    match (released, closed) {
        (_, Ok(())) => code,
        (Ok(()), Err(e)) => {
            eprintln!(
                "etcd-sync: {what} released, but revoking the session failed: {e} (it expires \
                 within --ttl)"
            );
            code
        }
        (Err(e), Err(_)) => {
            eprintln!(
                "etcd-sync: could not release the {what}: {e} (etcd deletes the key when the \
                 lease expires, within --ttl)"
            );
            if code == EXIT_OK { EXIT_ERROR } else { code }
        }
    }
}

/// After a loss: do not release (etcd may be unreachable, and the key is gone or goes
/// with the lease); [`finish`] tries a bounded revoke.
fn abandon(held: Held) -> Exit {
    // Dropping the guard would send a release bounded only by --command-timeout.
    std::mem::forget(held);
    EXIT_LOST
}

fn loss_reason(session: &Session) -> String {
    session
        .loss_reason()
        .map_or_else(|| "unknown reason".into(), |reason| reason.to_string())
}

/// Prints a library error and returns the runtime-error exit code.
fn fail(e: &Error) -> Exit {
    match e {
        // The library's message names its own API; say it in this tool's flags.
        Error::ClientCertificateRejected { endpoint, detail } => eprintln!(
            "etcd-sync: etcd at {endpoint} requires a TLS client certificate signed by its CA \
             and refused ours (none was given, or it is not trusted); pass --cert FILE \
             --key FILE [{detail}]"
        ),
        _ => eprintln!("etcd-sync: {e}"),
    }
    EXIT_ERROR
}

enum Waited<T> {
    Done(T),
    Signal(libc::c_int),
}

/// Runs `f` on a worker thread; returns its result, or the first signal that arrives
/// first (the worker is then left to finish or die with the process).
fn interruptible<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<Waited<T>, Exit> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let spawned = thread::Builder::new()
        .name("etcd-sync-worker".into())
        .spawn(move || {
            let _ = tx.send(f());
        });
    if let Err(e) = spawned {
        eprintln!("etcd-sync: cannot start a thread: {e}");
        return Err(EXIT_ERROR);
    }
    loop {
        if let Some(signo) = signals::take() {
            return Ok(Waited::Signal(signo));
        }
        match rx.recv_timeout(TICK) {
            Ok(value) => return Ok(Waited::Done(value)),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                eprintln!("etcd-sync: internal error: the worker thread panicked");
                return Err(EXIT_ERROR);
            }
        }
    }
}

/// Runs `f` on a thread and waits at most `limit` for it; `None` if it did not finish.
fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    thread::Builder::new()
        .name("etcd-sync-cleanup".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
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
    fn ttl_bounds() {
        assert_eq!(parse_ttl("10"), Ok(10));
        assert!(parse_ttl("0").is_err());
        assert!(parse_ttl("1.5").is_err());
        assert!(parse_ttl("99999999999").is_err());
    }
}
