//! `etcd-sync`: the command-line tool of the etcd-sync crate.
//!
//! `etcd-sync lock NAME [-- CMD...]` and `etcd-sync elect NAME PROPOSAL [-- CMD...]` take a
//! lock or leadership that `etcdctl lock` / `etcdctl elect` share (same keys, same order),
//! and either hold it until SIGINT/SIGTERM/SIGHUP or run CMD while holding it. Unlike
//! etcdctl, when the lock or leadership is lost while CMD runs, CMD is stopped (SIGTERM to
//! its process group, SIGKILL after `--kill-grace`), as `consul lock` does.
//! `etcd-sync lock -n N NAME` takes one of N permits of a semaphore and `lock --shared NAME`
//! the read side of a read-write lock instead; both are held the same way.
//! `etcd-sync elect --listen NAME` prints every leadership change and `etcd-sync status
//! NAME` who holds and who waits; neither takes a lease. `etcd-sync barrier hold|release|wait
//! NAME` raises, removes or waits for a barrier (no lease either). `etcd-sync revoke NAME`
//! asks the holders of NAME to let go; `lock`/`elect --release-on-request` give up when
//! asked. `etcd-sync top [PREFIX]` shows who holds and who waits for what under PREFIX,
//! and the cycles among the waits, live (no lease either).
//!
//! The library is blocking; the tool is plain threads. A blocking acquire runs on a worker
//! thread while the main thread polls for signals; a signal while waiting closes the
//! session (revoking its lease removes our queued key) and the waiting call returns.
//! Exit codes are listed in [`exit::EXIT_CODES`].
//!
//! Modules: [`args`] (the command line), [`environ`] (ETCD_SYNC_* then ETCDCTL_*
//! variables), [`logging`] (-v, --log-level, RUST_LOG), [`report`] (what a wait waits
//! for, on stderr), [`exit`] (exit codes), [`wait`] (blocking calls on
//! worker threads while signals are watched), [`lock`] (what `lock` takes: lock, read lock
//! or permit), [`hold`] (acquire, hold, release or abandon),
//! [`command`] (CMD while holding), [`child`] (CMD's process group), [`signals`], [`text`]
//! (durations in, leadership events out, as text or JSON), [`status`] (who holds what),
//! [`barrier`] (hold, release, wait), [`revoke`] (ask the holders to let go), [`top`]
//! (the live view of a wait graph) and [`graph_view`] (its screen and JSON).

mod args;
mod barrier;
mod child;
mod command;
mod environ;
mod exit;
mod graph_view;
mod hold;
mod lock;
mod logging;
mod report;
mod revoke;
mod signals;
mod status;
mod text;
mod top;
mod wait;

use std::io::{self, Write};
use std::time::Duration;

use etcd_sync::{Client, LossReason, Session};

use args::{Cli, Command, ElectArgs, GlobalOpts, HoldOpts, LockArgs};
use exit::{EXIT_ERROR, EXIT_OK, EXIT_SIGNAL_BASE, Exit, fail};
use hold::{Held, acquire, hold_until_signal};
use lock::Lock;
use wait::{TICK, Waited, bounded, interruptible};

/// How long to try revoking the lease after a loss before exiting anyway (etcd may be
/// unreachable; the lease then expires on its own).
const LOST_CLEANUP: Duration = Duration::from_secs(1);

fn main() {
    let cli = environ::parse();
    logging::init(cli.global.log_level.as_deref(), cli.global.verbose);
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
    let global = &cli.global;
    match &cli.command {
        Command::Lock(args) => with_session(global, |session| lock(session, args, global.quiet)),
        // Watching and reading need no lease: none is granted.
        Command::Elect(args) if args.listen => with_client(global, |client| listen(client, args)),
        Command::Elect(args) => with_session(global, |session| elect(session, args, global.quiet)),
        Command::Status(args) => with_client(global, |client| status::status(client, args)),
        Command::Barrier(args) => with_client(global, |client| {
            barrier::barrier(client, args, global.quiet)
        }),
        Command::Revoke(args) => with_client(global, |client| revoke::revoke(client, args)),
        Command::Top(args) => with_client(global, |client| top::top(client, args)),
    }
}

/// Runs `f` with a session, and revokes its lease afterwards.
fn with_session(global: &GlobalOpts, f: impl FnOnce(&Session) -> Exit) -> Exit {
    let session = match connect(global) {
        Ok(session) => session,
        Err(code) => return code,
    };
    let code = f(&session);
    finish(&session);
    code
}

/// Runs `f` with a client only.
fn with_client(global: &GlobalOpts, f: impl FnOnce(&Client) -> Exit) -> Exit {
    let builder = match global.client_builder() {
        Ok(builder) => builder,
        Err(e) => return fail(&e),
    };
    match interruptible(move || builder.connect()) {
        Ok(Waited::Done(Ok(client))) => f(&client),
        Ok(Waited::Done(Err(e))) => fail(&e),
        Ok(Waited::Signal(signo)) => EXIT_SIGNAL_BASE + signo,
        Err(code) => code,
    }
}

/// Connects and starts the session, interruptibly.
fn connect(global: &GlobalOpts) -> Result<Session, Exit> {
    let builder = global.client_builder().map_err(|e| fail(&e))?;
    let ttl = global.session_ttl();
    let identity = global.identity().map(str::to_string);
    let start = move || {
        let mut session = builder.connect()?.session_builder().ttl(ttl);
        if let Some(identity) = identity {
            session = session.identity(identity);
        }
        session.start()
    };
    match interruptible(start)? {
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

fn lock(session: &Session, args: &LockArgs, quiet: bool) -> Exit {
    let lock = match Lock::new(session, args) {
        Ok(lock) => lock,
        Err(e) => return fail(&e),
    };
    let timeout = args.hold.timeout;
    let acquired = acquire(session, &args.name, timeout, quiet, move |options| {
        lock.acquire(options).map(Held::Lock)
    });
    match acquired {
        Ok(held) => hold(session, held, &args.hold),
        Err(code) => code,
    }
}

fn elect(session: &Session, args: &ElectArgs, quiet: bool) -> Exit {
    let election = match session.election(&args.name) {
        Ok(election) => election,
        Err(e) => return fail(&e),
    };
    let proposal = args.proposal.clone().unwrap_or_default();
    let timeout = args.hold.timeout;
    let successor = match (&args.hand_over_to, args.hand_over_next) {
        (Some(to), _) => Some(hold::Successor::Named(to.clone())),
        (None, true) => Some(hold::Successor::Next),
        (None, false) => None,
    };
    let acquired = acquire(session, &args.name, timeout, quiet, move |options| {
        election
            .campaign_with(&proposal, options)
            .map(|leadership| Held::Leadership(leadership, proposal, successor))
    });
    match acquired {
        Ok(held) => hold(session, held, &args.hold),
        Err(code) => code,
    }
}

/// Holds until a signal or a loss, or runs CMD while holding.
fn hold(session: &Session, held: Held, opts: &HoldOpts) -> Exit {
    if opts.command.is_empty() {
        hold_until_signal(session, held, opts)
    } else {
        command::run_command(session, held, opts)
    }
}

fn listen(client: &Client, args: &ElectArgs) -> Exit {
    let observer = match client.observe(&args.name) {
        Ok(observer) => observer,
        Err(e) => return fail(&e),
    };
    loop {
        if signals::take().is_some() {
            return EXIT_OK;
        }
        let event = match observer.recv_timeout(TICK) {
            Ok(event) => event,
            Err(e) if e.is_wait_timeout() => continue, // a tick: look at the signals again
            Err(e) => return fail(&e),
        };
        let line = if args.json {
            match text::event_json(&event) {
                Ok(line) => line,
                Err(e) => {
                    eprintln!("etcd-sync: cannot write the event as JSON: {e}");
                    return EXIT_ERROR;
                }
            }
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
