//! Waiting on the main thread while watching for signals: blocking calls run on worker
//! threads.

use std::thread;
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use etcd_sync::CancelToken;

use crate::exit::{EXIT_ERROR, Exit};
use crate::signals;

/// How often the main thread looks at signals, CMD and the loss signal.
pub const TICK: Duration = Duration::from_millis(25);

/// How a wait on the main thread ended: the call returned, or a signal came first.
pub enum Waited<T> {
    Done(T),
    Signal(libc::c_int),
}

/// How long a cancelled wait may take to return (it removes its queued key first).
pub const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// Runs `f` on a worker thread; returns its result, or the first signal that arrives
/// first (the worker is then left to finish or die with the process).
pub fn interruptible<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<Waited<T>, Exit> {
    interruptible_with(None, f)
}

/// Like [`interruptible`]; on a signal, `cancel` is cancelled and the worker gets up to
/// [`CANCEL_GRACE`] to return (a cancelled wait removes its key before it returns).
pub fn interruptible_with<T: Send + 'static>(
    cancel: Option<&CancelToken>,
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
            if let Some(token) = cancel {
                token.cancel();
                let _ = rx.recv_timeout(CANCEL_GRACE);
            }
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
pub fn bounded<T: Send + 'static>(
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
