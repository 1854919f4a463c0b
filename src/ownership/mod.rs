//! The ownership core every recipe (Mutex, Election, and the ones to come) is built on:
//! one path from "I want this name" to a guard, and back.
//!
//! * A [`Place`] is one session's place in the line of one name (`place.rs`): the etcd key
//!   `<name>/<lease hex>` and the **local turn** in front of it, a process-local gate (the
//!   turn in etcd is the line's, [`wait_turn`](crate::line::wait::wait_turn)). Every recipe
//!   of that session and name queues on the same local turn, so two live guards over one
//!   key cannot exist.
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::cancel::{CancelToken, WaitOptions};
use crate::support::error::operation::Operation;
use crate::support::error::try_lock::TryLockError;
use crate::support::error::{Error, Result};
use crate::support::kv::text;

mod acquire;
mod deadlock;
mod delay;
pub(crate) mod handover;
mod hold;
mod join;
mod leftover;
mod many;
mod place;
mod proof;
mod requests;
mod twin;

pub(crate) use acquire::acquire;
pub use delay::MAX_LOCK_DELAY;
pub(crate) use delay::checked as checked_lock_delay;
pub(crate) use handover::hand_over;
pub(crate) use hold::{Held, Hold, Released, guarded_txn_all, proclaim, release_together};
pub(crate) use many::{all_still_ours, lock_free_prefix, wait_queued};
pub(crate) use place::Place;
pub(crate) use requests::Stop as RequestsStop;
pub(crate) use twin::acquire_twin;

/// One acquisition of `line` for a lock guard, traced under `operation`.
pub(crate) fn lock(
    line: &Arc<Place>,
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
                // `fut` first: one that ends at its first poll (a free local turn) costs
                // no subscription to the session's loss and no timer.
                biased;
                // A step that ended as the session was lost reports the loss, as the
                // session's branch would have (the loss ends every wait at once).
                result = fut => result.and_then(|out| session.check().map(|()| out)),
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

#[cfg(test)]
mod tests;
