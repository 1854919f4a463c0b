//! `etcd-sync barrier hold|release|wait NAME`: the library's `Barrier` (the key NAME, no
//! lease, as etcd's Go `recipe.Barrier`) for operators and scripts. No session is taken:
//! a held barrier stays up after `hold` exits, until `release` (or `etcdctl del NAME`).

use std::io::{self, Write};

use etcd_sync::{Barrier, CancelToken, Client, WaitOptions};

use crate::args::{BarrierArgs, BarrierCommand};
use crate::exit::{EXIT_ERROR, EXIT_OK, EXIT_SIGNAL_BASE, EXIT_TIMEOUT, Exit, fail};
use crate::report::{self, Reporter};
use crate::wait::{Waited, interruptible, interruptible_with};

/// Runs one barrier subcommand.
/// Unless `quiet`, a wait reports who raised the barrier while it goes on.
pub fn barrier(client: &Client, args: &BarrierArgs, quiet: bool) -> Exit {
    let barrier = match client.barrier(args.command.name()) {
        Ok(barrier) => barrier,
        Err(e) => return fail(&e),
    };
    match &args.command {
        BarrierCommand::Hold { name } => {
            let said = |raised| match raised {
                true => format!("{name}: held"),
                false => format!("{name}: already held"),
            };
            once(barrier, Barrier::hold, said)
        }
        BarrierCommand::Release { name } => {
            let said = |released| match released {
                true => format!("{name}: released"),
                false => format!("{name}: not held"),
            };
            once(barrier, Barrier::release, said)
        }
        BarrierCommand::Wait { name, timeout } => {
            let reporter = Reporter::start(quiet, report::barrier_waiter(client, name));
            wait(barrier, name, *timeout, reporter)
        }
    }
}

/// Runs `call` (one or two requests) interruptibly and prints what `said` makes of its
/// answer.
fn once(
    barrier: Barrier,
    call: fn(&Barrier) -> etcd_sync::Result<bool>,
    said: impl FnOnce(bool) -> String,
) -> Exit {
    match interruptible(move || call(&barrier)) {
        Ok(Waited::Done(Ok(answer))) => print_line(&said(answer)),
        Ok(Waited::Done(Err(e))) => fail(&e),
        Ok(Waited::Signal(signo)) => EXIT_SIGNAL_BASE + signo,
        Err(code) => code,
    }
}

/// Waits until the barrier is released: exit 0 (printing `NAME: released`), 4 after
/// `--timeout`, 128+n on a signal. `reporter` is stopped as soon as the wait ends.
fn wait(
    barrier: Barrier,
    name: &str,
    timeout: Option<std::time::Duration>,
    reporter: Option<Reporter>,
) -> Exit {
    let token = CancelToken::new();
    let mut options = WaitOptions::new().cancel_token(&token);
    if let Some(timeout) = timeout {
        options = options.timeout(timeout);
    }
    let waited = interruptible_with(Some(&token), move || barrier.wait_with(options));
    drop(reporter);
    match waited {
        Ok(Waited::Done(Ok(()))) => print_line(&format!("{name}: released")),
        Ok(Waited::Done(Err(e))) if e.is_wait_timeout() && timeout.is_some() => {
            let after = timeout.unwrap_or_default();
            eprintln!("etcd-sync: {name:?} still held after {after:?} (--timeout)");
            EXIT_TIMEOUT
        }
        Ok(Waited::Done(Err(e))) => fail(&e),
        Ok(Waited::Signal(signo)) => EXIT_SIGNAL_BASE + signo,
        Err(code) => code,
    }
}

fn print_line(line: &str) -> Exit {
    let mut out = io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => EXIT_OK,
        // Whoever read our output is gone; what was asked is done all the same.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => EXIT_OK,
        Err(e) => {
            eprintln!("etcd-sync: cannot write to stdout: {e}");
            EXIT_ERROR
        }
    }
}
