//! Acquiring and holding a lock or leadership, and giving it up: released, or abandoned
//! after a loss. Holding with CMD is [`crate::command`]'s, which uses the giving up here;
//! `main` picks one of the two, so this module does not depend on `command`.

use std::io::{self, Write};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use etcd_sync::{
    CancelToken, Error, GuardKind, LeaderKind, Leadership, ReleaseRequest, Session, WaitOptions,
};

use crate::args::HoldOpts;

use crate::exit::{EXIT_ERROR, EXIT_LOST, EXIT_OK, EXIT_SIGNAL_BASE, EXIT_TIMEOUT, Exit, fail};
use crate::lock::LockGuard;
use crate::report::{self, Reporter};
use crate::signals;
use crate::wait::{TICK, Waited, interruptible_with};

/// A held lock or leadership.
pub enum Held {
    /// A lock, read lock or permit (`etcd-sync lock`, whatever the mode).
    Lock(Box<dyn LockGuard>),
    /// The leadership, the value we campaigned with, and whom to hand it to instead of
    /// resigning (`--hand-over-to`, `--hand-over-next`).
    Leadership(Leadership, String, Option<Successor>),
}

/// Whom `elect` hands leadership to where it would resign.
#[derive(Debug, Clone)]
pub enum Successor {
    /// The waiting candidate with this value or key (`--hand-over-to`).
    Named(String),
    /// The first candidate in line (`--hand-over-next`).
    Next,
}

impl Held {
    /// "lock", "read lock", "permit" or "leadership", for messages.
    pub fn what(&self) -> &'static str {
        match self {
            Held::Lock(guard) => guard.what(),
            Held::Leadership(..) => LeaderKind::WHAT,
        }
    }

    fn key(&self) -> String {
        match self {
            Held::Lock(guard) => guard.key(),
            Held::Leadership(leadership, ..) => leadership.key_str().into_owned(),
        }
    }

    pub fn lost(&self) -> Receiver<()> {
        match self {
            Held::Lock(guard) => guard.lost(),
            Held::Leadership(leadership, ..) => leadership.lost(),
        }
    }

    /// Requests to let go (`etcd-sync revoke`), if `--release-on-request` listens for them.
    pub fn release_requests(&self, opts: &HoldOpts) -> Receiver<ReleaseRequest> {
        if !opts.release_on_request {
            return crossbeam_channel::never();
        }
        match self {
            Held::Lock(guard) => guard.release_requested(),
            Held::Leadership(leadership, ..) => leadership.release_requested(),
        }
    }

    /// CMD's environment: the key and its create revision (the fencing token).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Held::Lock(guard) => vec![
                ("ETCD_LOCK_KEY", self.key()),
                ("ETCD_LOCK_REV", guard.fencing_token().to_string()),
            ],
            Held::Leadership(leadership, ..) => vec![
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
            Held::Leadership(_, value, _) => format!("{}\n{value}\n", self.key()),
        }
    }

    /// Unlocks, releases the permit, or resigns (deleting the key only if it is still ours);
    /// with `--hand-over-to` or `--hand-over-next`, hands leadership over first, and
    /// resigns if that fails.
    fn release(self) -> etcd_sync::Result<()> {
        match self {
            Held::Lock(guard) => guard.release(),
            Held::Leadership(leadership, _, Some(to)) => hand_over(leadership, &to),
            Held::Leadership(mut leadership, _, None) => leadership.resign(),
        }
    }
}

/// `--hand-over-to`, `--hand-over-next`: hands `leadership` to the successor `to`;
/// resigns if it still leads after a failed attempt.
fn hand_over(mut leadership: Leadership, to: &Successor) -> etcd_sync::Result<()> {
    let handed = match to {
        Successor::Named(to) => leadership.hand_over(to),
        Successor::Next => leadership.hand_over_next(),
    };
    match handed {
        Ok(next) => {
            eprintln!(
                "etcd-sync: leadership handed over to {} ({})",
                next.value_str(),
                next.key_str()
            );
            Ok(())
        }
        Err(e) if leadership.is_leader() => {
            eprintln!("etcd-sync: {e}; resigning");
            leadership.resign()
        }
        Err(e) => Err(e),
    }
}

/// Runs the blocking acquire `f` on a worker thread so that signals are seen meanwhile.
/// `f` gets the wait's options: `timeout` and a token that a signal cancels, so the wait
/// removes its queued key and returns; the session is then closed. Unless `quiet`, what
/// the wait waits for is reported on stderr while it goes on ([`crate::report`]).
pub fn acquire(
    session: &Session,
    name: &str,
    timeout: Option<Duration>,
    quiet: bool,
    f: impl FnOnce(WaitOptions) -> etcd_sync::Result<Held> + Send + 'static,
) -> Result<Held, Exit> {
    let token = CancelToken::new();
    let mut options = WaitOptions::new().cancel_token(&token);
    if let Some(timeout) = timeout {
        options = options.timeout(timeout);
    }
    let reporter = Reporter::start(quiet, report::line_waiter(session, name));
    let waited = interruptible_with(Some(&token), move || f(options));
    drop(reporter);
    match waited? {
        Waited::Done(Ok(held)) => Ok(held),
        Waited::Done(Err(e)) if e.is_wait_timeout() && timeout.is_some() => {
            let after = timeout.unwrap_or_default();
            let after = if after.is_zero() {
                "0s".to_string()
            } else {
                format!("{after:?}")
            };
            eprintln!("etcd-sync: gave up waiting for {name:?} after {after} (--timeout)");
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

/// Prints the key and holds until a signal or, with `--release-on-request`, a request to
/// let go (release, exit 0), or a loss (exit 3).
pub fn hold_until_signal(session: &Session, held: Held, opts: &HoldOpts) -> Exit {
    {
        // If nobody reads our output any more, keep holding all the same.
        let mut out = io::stdout().lock();
        let _ = out
            .write_all(held.announcement().as_bytes())
            .and_then(|()| out.flush());
    }
    let lost = held.lost();
    let requests = held.release_requests(opts);
    loop {
        if signals::take().is_some() {
            return release(session, held, EXIT_OK);
        }
        if let Ok(request) = requests.try_recv() {
            eprintln!("etcd-sync: {}; releasing", asked(held.what(), &request));
            return release(session, held, EXIT_OK);
        }
        if let Err(RecvTimeoutError::Disconnected) = lost.recv_timeout(TICK) {
            eprintln!("etcd-sync: {} lost: {}", held.what(), loss_reason(session));
            return abandon(held);
        }
    }
}

/// "release of the lock requested by WHO (REASON)", for messages.
pub fn asked(what: &str, request: &ReleaseRequest) -> String {
    match &request.reason {
        Some(reason) => format!(
            "release of the {what} requested by {} ({reason})",
            request.requester
        ),
        None => format!("release of the {what} requested by {}", request.requester),
    }
}

/// Releases, then revokes the session (which deletes the key in any case). `code` is the
/// exit code if all goes well; a release that failed outright turns a 0 into 1.
pub fn release(session: &Session, held: Held, code: Exit) -> Exit {
    let what = held.what();
    let released = held.release();
    // A session lost earlier has nothing left to revoke: that is not a failure here.
    let closed = match session.close() {
        Err(Error::SessionLost(_)) => Ok(()),
        other => other,
    };
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
/// with the lease); [`crate::finish`] tries a bounded revoke.
pub fn abandon(held: Held) -> Exit {
    // Dropping the guard would send a release bounded only by --command-timeout.
    std::mem::forget(held);
    EXIT_LOST
}

/// Why a hold ended without our release. A guard's `lost()` fires for a lost session or a
/// deleted key; `loss_reason` checks the lease deadline itself, so a session that is not
/// lost means the key went (deleted by someone, or etcd dropped it with the lease first).
pub fn loss_reason(session: &Session) -> String {
    session
        .loss_reason()
        .map_or_else(|| "its key was deleted".into(), |reason| reason.to_string())
}
