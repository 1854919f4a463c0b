//! The ownership core every recipe (Mutex, Election, and the ones to come) is built on:
//! one path from "I want this name" to a guard, and back.
//!
//! * A [`Line`] is one session's place under one name: the etcd key `<name>/<lease hex>`
//!   and the **local turn** in front of it, a process-local gate (the turn in etcd is the
//!   line's, [`wait_turn`](crate::line::wait::wait_turn)). Every recipe of that session
//!   and name queues on the same local turn, so two live guards over one key cannot exist.
//! * [`acquire`] takes the local turn, joins the line in etcd (one Txn), waits until
//!   every key ahead is gone ([`wait::wait_turn`](crate::line::wait::wait_turn)) and, on any failure, cleans up while still owning
//!   the local turn.
//! * A [`Hold`] is one acquisition: the create revision (fencing token), the local turn,
//!   and a signal that fires when the hold ends for any reason (release, session loss, a
//!   re-campaign that superseded it). [`Held`] is the guard-side handle on it.
//!
//! Cleanup rules (the safety argument is in docs/design/exactly-once.md):
//! * by create revision whenever the revision is known: it can only delete that one key;
//! * by lease only after an ambiguous enqueue, and only while the local turn is owned. Then
//!   no guard or waiter of this process uses the key, so any key of our lease under the
//!   name is a leftover of that attempt, never the key of a live or later guard;
//! * the local turn passes to the next local acquirer only after etcd answered the cleanup
//!   or release, so a successor never finds (and adopts) a key that is about to be deleted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::{Duration, Instant};

use crate::line::mode::Mode;
use crate::line::queue::{self, Ours};
use crate::session::Session;
use crate::support::cancel::{CancelToken, WaitOptions};
use crate::support::error::operation::Operation;
use crate::support::error::try_lock::TryLockError;
use crate::support::error::{Error, Result};
use crate::support::kv::text;
use crate::transport::watch::Only;
use crate::transport::watches::{Pin, Spec, Watches};

mod acquire;
mod delay;
mod hold;
mod leftover;
mod many;
mod proof;
mod requests;
mod twin;

pub(crate) use acquire::acquire;
pub use delay::MAX_LOCK_DELAY;
pub(crate) use delay::checked as checked_lock_delay;
pub(crate) use hold::{Held, Hold, Released, guarded_txn_all, proclaim, release_together};
pub(crate) use many::{all_still_ours, lock_free_prefix, wait_queued};
pub(crate) use requests::Stop as RequestsStop;
pub(crate) use twin::acquire_twin;

/// One acquisition of `line` for a lock guard, traced under `operation`.
pub(crate) fn lock(
    line: &Arc<Line>,
    operation: Operation,
    wait: Wait,
) -> std::result::Result<Held, TryLockError> {
    let span = tracing::debug_span!("acquire", %operation, key = %text(line.key()));
    let _entered = span.enter();
    let identity = line.session().identity().as_bytes(); // the value `status` shows
    let held = acquire(line, Kind::Lock(operation), identity, wait)?;
    tracing::debug!(fencing_token = held.rev(), "acquired");
    Ok(held)
}

/// A blocking wait's result: it never reports `WouldBlock`.
pub(crate) fn blocking<G>(result: std::result::Result<G, TryLockError>) -> Result<G> {
    result.map_err(|e| match e {
        TryLockError::Error(e) => e,
        TryLockError::WouldBlock => Error::LockLost,
    })
}

/// What a hold is for: decides what to do with a key this session already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A lock (a mutex, a read or write lock, a permit), by the name of its wait in
    /// errors: an existing key of ours is replaced, so fencing tokens strictly increase.
    Lock(Operation),
    /// Leadership: an existing key of ours is adopted with its place (Go's re-campaign
    /// after a restart with a resumed lease), and its value proclaimed.
    Lead,
}

/// How long an acquire may wait for its turn, and what may cancel it.
#[derive(Debug, Clone)]
pub(crate) struct Wait {
    limit: Limit,
    cancel: Option<CancelToken>,
    /// Lock-delay after a holder whose lease ended (see `delay.rs`); zero: none.
    delay: Duration,
}

/// Less time than one request takes on a fast network: a wait with less than this left
/// tries once (see [`Wait::tries_once`]).
const ONE_TRY: Duration = Duration::from_millis(10);

/// The time limit of a [`Wait`].
#[derive(Debug, Clone, Copy)]
enum Limit {
    Forever,
    /// Until the instant; the duration is the caller's timeout, for the error.
    Until(Instant, Duration),
    /// Only if free now (`try_lock`).
    Never,
}

impl Kind {
    /// The operation's name in errors.
    fn operation(self) -> Operation {
        match self {
            Kind::Lock(operation) => operation,
            Kind::Lead => Operation::Campaign,
        }
    }
}

impl Wait {
    /// No limit, no token.
    pub(crate) fn forever() -> Wait {
        Wait {
            limit: Limit::Forever,
            cancel: None,
            delay: Duration::ZERO,
        }
    }

    /// Only if free now.
    pub(crate) fn never() -> Wait {
        Wait {
            limit: Limit::Never,
            cancel: None,
            delay: Duration::ZERO,
        }
    }

    /// Until `now + timeout`, or no limit when that instant is not representable.
    pub(crate) fn from_timeout(timeout: Duration) -> Wait {
        Wait {
            limit: Self::limit(Some(timeout)),
            cancel: None,
            delay: Duration::ZERO,
        }
    }

    /// What a `*_with(options)` call asked for.
    pub(crate) fn from_options(options: WaitOptions) -> Wait {
        Wait {
            limit: Self::limit(options.timeout_value()),
            cancel: options.cancel_token_value().cloned(),
            delay: Duration::ZERO,
        }
    }

    /// The cancel token the caller gave, if any.
    pub(crate) fn cancel_token(&self) -> Option<&CancelToken> {
        self.cancel.as_ref()
    }

    /// With `cancel` as its token instead.
    pub(crate) fn with_cancel(mut self, cancel: CancelToken) -> Wait {
        self.cancel = Some(cancel);
        self
    }

    /// With a lock-delay (already checked against its maximum).
    pub(crate) fn with_delay(mut self, delay: Duration) -> Wait {
        self.delay = delay;
        self
    }

    fn limit(timeout: Option<Duration>) -> Limit {
        match timeout.and_then(|t| Some((crate::support::clock::now().checked_add(t)?, t))) {
            Some((deadline, timeout)) => Limit::Until(deadline, timeout),
            None => Limit::Forever,
        }
    }

    /// The wait for a first attempt that takes `request` at most: a limit with less than
    /// [`ONE_TRY`] left (zero, a microsecond) becomes `now + request`, so that the attempt
    /// runs to its end and a free name is taken, as `try_*` takes it (and as parking_lot's
    /// `try_lock_for` and std's `recv_timeout` try once); any longer limit is kept, so a
    /// wait ends within it also on a frozen etcd (rule 5).
    pub(crate) fn first_attempt(&self, request: Duration) -> Wait {
        let limit = match self.limit {
            Limit::Until(_, after) if self.tries_once() => {
                let until = crate::support::clock::now().checked_add(request);
                until.map_or(Limit::Forever, |until| Limit::Until(until, after))
            }
            other => other,
        };
        Wait {
            limit,
            cancel: self.cancel.clone(),
            delay: self.delay,
        }
    }

    /// Whether the limit is too short to wait at all (less than [`ONE_TRY`] left): such a
    /// wait makes one attempt, as `try_*` does, and then gives up with `Timeout`.
    pub(crate) fn tries_once(&self) -> bool {
        matches!(self.limit, Limit::Until(deadline, _)
            if deadline.saturating_duration_since(crate::support::clock::now()) < ONE_TRY)
    }

    /// The timeout error of this wait, for `operation` (a limit that passed).
    pub(crate) fn timeout_error(&self, operation: Operation) -> Error {
        match self.limit {
            Limit::Until(_, after) => Error::wait_timeout(operation, after),
            Limit::Forever | Limit::Never => Error::Cancelled,
        }
    }

    /// Whether this is a `try_*`: no waiting at all.
    pub(crate) fn is_never(&self) -> bool {
        matches!(self.limit, Limit::Never)
    }

    /// `Err(Cancelled)` if the wait's token is already cancelled.
    pub(crate) fn check(&self) -> Result<()> {
        self.cancel.as_ref().map_or(Ok(()), CancelToken::check)
    }

    /// [`bound`](Wait::bound), also ended by the loss of `session`: every step of a wait
    /// ends at once when its session dies (rule 4).
    pub(crate) async fn bound_alive<T>(
        &self,
        operation: Operation,
        session: &crate::client::lease::LeaseState,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        self.bound(operation, async {
            tokio::select! {
                result = fut => result,
                reason = session.wait_lost() => Err(Error::SessionLost(reason)),
            }
        })
        .await
    }

    /// Runs `fut` until it ends, the deadline passes (a wait timeout named `operation`)
    /// or the token is cancelled, whichever comes first.
    pub(crate) async fn bound<T>(
        &self,
        operation: Operation,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let cancelled = async {
            match &self.cancel {
                Some(token) => token.wait().await,
                None => std::future::pending().await,
            }
        };
        let expired = async {
            match self.limit {
                Limit::Until(deadline, _) => tokio::time::sleep_until(deadline.into()).await,
                Limit::Forever | Limit::Never => std::future::pending().await,
            }
        };
        tokio::select! {
            // Checked first: a wait that is both done and cancelled reports the result.
            biased;
            result = fut => result,
            () = cancelled => Err(Error::Cancelled),
            () = expired => Err(match self.limit {
                Limit::Until(_, after) => Error::wait_timeout(operation, after),
                Limit::Forever | Limit::Never => Error::Cancelled,
            }),
        }
    }
}

/// One session's place under one name, shared by every recipe of that session and name.
pub(crate) struct Line {
    session: Session,
    name: Vec<u8>,
    prefix: Vec<u8>,
    /// How the key shares the name; it is part of the key (see `line/mode.rs`).
    mode: Mode,
    key: Vec<u8>,
    /// The local turn: owned by whoever uses the key (waiter, guard, cleanup).
    local_turn: Arc<tokio::sync::Mutex<()>>,
    /// The hold that owns the local turn now, if any.
    current: StdMutex<Weak<Hold>>,
    /// Keeps the client's watcher of deletes under the name once this line has waited at
    /// the front, so the next wait finds it running, with its history: no create and no
    /// read. Dropped when a wait starts at the back of a long line, so that a client whose
    /// waiters are all far back hears of no release (issue 28).
    deletes_pinned: StdMutex<Option<Pin>>,
    /// Keeps the client's watcher of deletes of this line's own key once a wait started at
    /// the back (where a waiter watches its own key beside its lookout), so the next wait
    /// there finds it running: no create and no cancel per turn. The key is the same for
    /// every turn of the session; a release of ours costs it one event.
    own_pinned: StdMutex<Option<Pin>>,
    /// etcd refused a release's delete of the key's release request (a role that covers
    /// `<name>/` only): releases delete the key alone from then on (`requests.rs`).
    requests_denied: Arc<std::sync::atomic::AtomicBool>,
}

/// The lines of every session of this process, by session, name and mode. It lives here, not in
/// the session, so the session module does not depend on the ownership core.
static LINES: StdMutex<Lines> = StdMutex::new(Lines {
    slots: BTreeMap::new(),
    prune_at: 0,
});

/// The table of [`LINES`]. Dead slots are pruned when the table has doubled since the last
/// prune, so creating a line costs O(log n) amortized however many lines the process has.
struct Lines {
    slots: BTreeMap<(u64, Vec<u8>, Mode), Slot>,
    prune_at: usize,
}

/// One session's line under one name, and its local turn. The local turn is kept apart from
/// the line: a release or cleanup still running in the background holds the local turn
/// after the last Mutex, Election and guard of the name are gone, and a line created again
/// must queue behind it.
struct Slot {
    line: Weak<Line>,
    local_turn: Weak<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Line")
            .field("key", &crate::support::kv::text(&self.key))
            .finish_non_exhaustive()
    }
}

impl Line {
    /// The session's line under `name` in `mode`, shared by every recipe of that session,
    /// name and mode (so a Mutex, an Election and an RwLock writer of one name on one
    /// session take turns on one key).
    pub(crate) fn of(session: &Session, name: &[u8], mode: Mode) -> Result<Arc<Line>> {
        let id = (session.lease().serial(), name.to_vec(), mode);
        let mut lines = LINES.lock().unwrap_or_else(|e| e.into_inner());
        let local_turn = match lines.slots.get(&id) {
            Some(slot) => match slot.line.upgrade() {
                Some(line) => return Ok(line),
                None => slot.local_turn.upgrade(),
            },
            None => None,
        };
        let local_turn = local_turn.unwrap_or_default();
        let line = Arc::new(Line::new(session.clone(), name, mode, local_turn.clone())?);
        if lines.slots.len() >= lines.prune_at {
            lines.slots.retain(|_, slot| {
                slot.line.strong_count() > 0 || slot.local_turn.strong_count() > 0
            });
            lines.prune_at = (lines.slots.len() * 2).max(64);
        }
        lines.slots.insert(
            id,
            Slot {
                line: Arc::downgrade(&line),
                local_turn: Arc::downgrade(&local_turn),
            },
        );
        Ok(line)
    }

    fn new(
        session: Session,
        name: &[u8],
        mode: Mode,
        local_turn: Arc<tokio::sync::Mutex<()>>,
    ) -> Result<Line> {
        let prefix = queue::key_prefix(name)?;
        let key = queue::own_key(&prefix, session.lease_id(), mode);
        Ok(Line {
            session,
            name: name.to_vec(),
            prefix,
            mode,
            key,
            local_turn,
            current: StdMutex::new(Weak::new()),
            deletes_pinned: StdMutex::new(None),
            own_pinned: StdMutex::new(None),
            requests_denied: Arc::default(),
        })
    }

    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    pub(crate) fn name(&self) -> &[u8] {
        &self.name
    }

    pub(crate) fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    /// Our key in the line, created at revision `rev`.
    pub(crate) fn ours(&self, rev: i64) -> Ours<'_> {
        Ours {
            prefix: &self.prefix,
            key: &self.key,
            mode: self.mode,
            rev,
        }
    }

    /// Whether the calling thread owns a live hold on this session's line of this name in
    /// any mode: a wait now could wait on that hold's key (a writer behind this thread's
    /// own read, or the other way round), which would never end.
    pub(crate) fn held_by_this_thread(&self) -> bool {
        let serial = self.session.lease().serial();
        let lines: Vec<Arc<Line>> = {
            let lines = LINES.lock().unwrap_or_else(|e| e.into_inner());
            lines
                .slots
                .range((serial, self.name.clone(), Mode::Exclusive)..)
                .take_while(|((s, name, _), _)| *s == serial && *name == self.name)
                .filter_map(|(_, slot)| slot.line.upgrade())
                .collect()
        };
        let me = std::thread::current().id();
        lines.iter().any(|line| {
            line.live_hold()
                .is_some_and(|hold| hold.state().thread == me)
        })
    }

    /// The client's watches, for a wait that starts `far` back in the line or at its
    /// front: at the front, the watcher of deletes under the name is pinned for the life of
    /// this line (waiters subscribe to it); far back, it is unpinned, and the watcher of
    /// the line's own key is pinned instead, for the life of the line.
    pub(crate) fn watches_for(&self, far: bool) -> &Watches {
        let watches = self.session.client().watches();
        let mut pinned = self
            .deletes_pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match (far, pinned.is_some()) {
            (true, true) => *pinned = None,
            (false, false) => {
                *pinned = Some(watches.pin(Spec::prefix(&self.prefix, Only::Deletes)));
            }
            _ => {}
        }
        if far {
            let mut own = self.own_pinned.lock().unwrap_or_else(|e| e.into_inner());
            if own.is_none() {
                *own = Some(watches.pin(Spec::key(&self.key, Only::Deletes)));
            }
        }
        watches
    }

    /// Whether this line keeps its own key's watcher running (it waited at the back).
    pub(crate) fn watches_own_key(&self) -> bool {
        self.own_pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// The hold that owns this line's local turn, if it has not ended.
    pub(crate) fn live_hold(&self) -> Option<Arc<Hold>> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.upgrade().filter(|hold| !hold.is_ended())
    }
}

#[cfg(test)]
mod tests;
