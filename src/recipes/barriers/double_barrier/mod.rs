//! A double barrier: `count` participants enter together and leave together (ZooKeeper's
//! double-barrier recipe, Curator's `DistributedDoubleBarrier`, etcd's Go
//! `recipe.DoubleBarrier`, without its races). Each participant is a key under its
//! session's lease, so a participant whose session dies is counted out.
//!
//! # Key layout (under `<name>/`)
//!
//! * `<name>/<lease hex>`: a participant, one per session, bound to its lease. Its value is
//!   the count it expects (`3`) while it waits to enter, and the count and the *round* it
//!   entered with once it has (`3 1742`: a revision, its stamp). The younger of two
//!   participants that expect different counts refuses to wait; the older one does not
//!   count it.
//! * `<name>/ready`: the round that filled, in decimal, bound to the lease of the
//!   participant that saw it fill.
//!
//! A **round** is named by the create revision of its `count`-th oldest participant: when
//! `count` participant keys exist at once and nobody has said a round filled, the
//! `count` oldest of them make one (a newer one waits for the next). The first of them to
//! see it creates the ready key and stamps its own key, in one Txn (only if there is no
//! ready key); each of the others, seeing the ready key or any stamp, stamps its own key
//! and returns from `enter`. A participant whose key is older than a round someone named is
//! in it; a newer one waits until nobody of that round is left. Leaving removes one's key
//! and waits until no participant key as old as the round is left (create revisions only
//! grow, so the newcomers of the next round never hold anyone up); the ready key is removed
//! once its round has left, by a leaver or by the next participant to find it.
//!
//! Why stamps as well as the ready key: the ready key goes with its writer's lease, and a
//! stamp keeps the round known to a participant that had not yet seen it. Why the ready key
//! as well as stamps: it makes the first decision one Txn that others cannot race. Nothing
//! is left once every participant has left or its session ended.

mod participant;
mod round;
mod steps;

use std::sync::Mutex as StdMutex;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use crate::line::queue::refuse_trailing_slash;
use crate::ownership::{self, Wait};
use crate::recipes::barriers::double_barrier::participant::Participant;
use crate::recipes::barriers::gone::checked_key;
use crate::session::Session;
use crate::support::cancel::WaitOptions;
use crate::support::error::operation::Operation;
use crate::support::error::try_lock::TryLockError;
use crate::support::error::{Error, Result};
use crate::support::kv::text;

/// `count` participants [`enter`](DoubleBarrier::enter) together and
/// [`leave`](DoubleBarrier::leave) together, each through its own [`Session`].
///
/// `enter` returns once `count` participants, this one included, were in the barrier at
/// the same time; `leave` returns once every participant it entered with has left. A
/// participant whose session ends (closed, expired, revoked) is counted out at once: its
/// key goes with its lease, so the others are not held up by it, neither while entering
/// (the round fills without it) nor while leaving. A participant that comes when a round
/// has filled waits for the next one, after everyone of that round has left.
///
/// Keys (under `<name>/`, see the guide `docs/barriers.md`): `<name>/<lease hex>` per
/// participant, bound to its lease, and `<name>/ready`, bound to the lease of the
/// participant that saw the round fill. Waits follow the keys on the client's one watch
/// stream (no polling), and ride out compaction and failover as every wait of this crate
/// does. Every participant must give the same `count`: one that finds an older participant
/// expecting another count refuses with [`Error::InvalidArgument`] (and removes its key);
/// the older one goes on without counting it. Any other key under `<name>/` (data,
/// or Go's `recipe.DoubleBarrier`, whose keys are `<name>/waiters/...` and an empty
/// `<name>/ready`) makes `enter` and `leave` fail with [`Error::InvalidArgument`] naming
/// it, rather than wait on what they cannot read.
///
/// One participant per session and name: a second `DoubleBarrier` of the same session and
/// name waits in `enter` until the first has left. Dropping a `DoubleBarrier` that entered
/// and did not leave removes its key in the background (the others then count it out).
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let session = client.session()?;
/// let barrier = session.double_barrier("reindex/round", 3)?;
/// barrier.enter()?; // returns once 3 participants are in
/// // ... the work all 3 do together ...
/// barrier.leave()?; // returns once all 3 have left (or are gone)
/// # Ok(()) }
/// ```
pub struct DoubleBarrier {
    me: Participant,
    entered: StdMutex<Option<Entered>>,
}

/// A participant that entered: its key's create revision, its round, and the local turn.
struct Entered {
    created: i64,
    round: i64,
    local_turn: OwnedMutexGuard<()>,
}

impl std::fmt::Debug for DoubleBarrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DoubleBarrier")
            .field("key", &text(&self.me.key))
            .field("count", &self.me.count)
            .field("entered", &self.is_entered())
            .finish()
    }
}

impl Session {
    /// A double barrier named `name` for `count` participants, this session being one of
    /// them. No request is sent until [`enter`](DoubleBarrier::enter).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `name` is empty, ends with `/` or is longer than 4096
    /// bytes, or `count` is zero.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let barrier = session.double_barrier("load-test/start", 10)?;
    /// assert!(session.double_barrier("x", 0).is_err()); // InvalidArgument
    /// # let _ = barrier;
    /// # Ok(()) }
    /// ```
    pub fn double_barrier(&self, name: impl AsRef<[u8]>, count: usize) -> Result<DoubleBarrier> {
        let name = checked_key(name.as_ref(), "double barrier")?;
        // Its keys are `<name>/<lease>` and `<name>/ready`, as a line's.
        refuse_trailing_slash(&name)?;
        if count == 0 {
            return Err(Error::InvalidArgument(
                "a double barrier needs at least 1 participant".into(),
            ));
        }
        // A count beyond u64 (on a 128-bit platform) could never fill anyway.
        let count = u64::try_from(count).unwrap_or(u64::MAX);
        Ok(DoubleBarrier {
            me: Participant::new(self, name, count),
            entered: StdMutex::new(None),
        })
    }
}

impl DoubleBarrier {
    /// The barrier's name.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert_eq!(session.double_barrier("b", 2)?.name(), b"b");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &[u8] {
        &self.me.name
    }

    /// How many participants enter together.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert_eq!(session.double_barrier("b", 2)?.count(), 2);
    /// # Ok(()) }
    /// ```
    pub fn count(&self) -> usize {
        usize::try_from(self.me.count).unwrap_or(usize::MAX)
    }

    /// The session this participant's key is bound to.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let barrier = session.double_barrier("b", 2)?;
    /// assert_eq!(barrier.session().lease_id(), session.lease_id());
    /// # Ok(()) }
    /// ```
    pub fn session(&self) -> &Session {
        &self.me.session
    }

    /// Whether this participant has entered and not left yet.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let barrier = session.double_barrier("solo", 1)?;
    /// barrier.enter()?; // a barrier of 1 fills at once
    /// assert!(barrier.is_entered());
    /// barrier.leave()?;
    /// assert!(!barrier.is_entered());
    /// # Ok(()) }
    /// ```
    pub fn is_entered(&self) -> bool {
        self.entered_state().is_some()
    }

    /// Blocks until `count` participants, this one included, are in the barrier at once.
    ///
    /// # Errors
    ///
    /// * [`Error::SessionLost`]: the session was lost before or while waiting; its key went
    ///   with it.
    /// * [`Error::LockLost`]: our participant key was deleted by someone else while we
    ///   waited.
    /// * [`Error::InvalidArgument`]: this participant has entered already (leave first), an
    ///   older participant expects another count, or a key under `<name>/` was not written
    ///   by a double barrier (the message names the key); our key is removed.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd could not be reached to join
    ///   (tried on every endpoint); once in, the wait retries its reads until etcd answers.
    /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused a request.
    ///   [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// On every error our key is removed: no key is left behind.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let barrier = session.double_barrier("game/round-1", 4)?;
    /// barrier.enter()?;
    /// println!("all 4 players are here");
    /// # Ok(()) }
    /// ```
    pub fn enter(&self) -> Result<()> {
        ownership::blocking(self.enter_within(Wait::forever()))
    }

    /// Like [`enter`](DoubleBarrier::enter), but gives up after `timeout`, leaving no key
    /// behind.
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] with [`Operation::Enter`] and `after: timeout`
    ///   ([`is_wait_timeout`](Error::is_wait_timeout)): the round did not fill in time.
    /// * Otherwise as [`enter`](DoubleBarrier::enter).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.double_barrier("b", 3)?.enter_timeout(Duration::from_secs(30)) {
    ///     Ok(()) => println!("all in"),
    ///     Err(e) if e.is_wait_timeout() => println!("not enough participants in 30 s"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn enter_timeout(&self, timeout: Duration) -> Result<()> {
        ownership::blocking(self.enter_within(Wait::from_timeout(timeout)))
    }

    /// Like [`enter`](DoubleBarrier::enter), with a time limit and/or a
    /// [`CancelToken`](crate::CancelToken) (see [`WaitOptions`]).
    ///
    /// # Errors
    ///
    /// * [`Error::Cancelled`]: the token was cancelled before or during the wait; no key is
    ///   left behind.
    /// * [`Error::Timeout`] with [`Operation::Enter`]: the limit passed first.
    /// * Otherwise as [`enter`](DoubleBarrier::enter).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let token = etcd_sync::CancelToken::new();
    /// match session.double_barrier("b", 3)?.enter_with(&token) {
    ///     Ok(()) => println!("all in"),
    ///     Err(e) if e.is_cancelled() => println!("shutting down"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn enter_with(&self, options: impl Into<WaitOptions>) -> Result<()> {
        ownership::blocking(self.enter_within(Wait::from_options(options.into())))
    }

    /// Enters only if that fills the round now (the others are in already); otherwise
    /// removes our key and returns [`TryLockError::WouldBlock`].
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] when the round does not fill with us (or another
    /// participant of this session and name is in); [`TryLockError::Error`] with the errors
    /// of [`enter`](DoubleBarrier::enter).
    ///
    /// ```no_run
    /// use etcd_sync::TryLockError;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.double_barrier("b", 2)?.try_enter() {
    ///     Ok(()) => println!("we were the last one"),
    ///     Err(TryLockError::WouldBlock) => println!("not everyone is here yet"),
    ///     Err(TryLockError::Error(e)) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_enter(&self) -> std::result::Result<(), TryLockError> {
        self.enter_within(Wait::never())
    }

    /// Blocks until every participant this one entered with has left (or its session
    /// ended). Our key is removed first, so the others are not held up by us even if this
    /// wait is cut short.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: this participant has not entered (or left already), or
    ///   a key under `<name>/` was not written by a double barrier.
    /// * [`Error::SessionLost`]: the session was lost (our key went with it). Unreachable
    ///   members and a leader election are not errors: the removal of our key and the
    ///   reads are retried until etcd answers, or until the session ends.
    /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused a request.
    ///   [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let barrier = session.double_barrier("b", 1)?;
    /// barrier.enter()?;
    /// barrier.leave()?;
    /// # Ok(()) }
    /// ```
    pub fn leave(&self) -> Result<()> {
        self.leave_within(Wait::forever())
    }

    /// Like [`leave`](DoubleBarrier::leave), but gives up waiting for the others after
    /// `timeout`. If our key could not be removed in time, we are still in (call `leave`
    /// again); otherwise we are out, and only the others' leaving was not seen.
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] with [`Operation::Leave`] and `after: timeout`
    ///   ([`is_wait_timeout`](Error::is_wait_timeout)).
    /// * Otherwise as [`leave`](DoubleBarrier::leave).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// # let barrier = session.double_barrier("b", 1)?;
    /// # barrier.enter()?;
    /// match barrier.leave_timeout(Duration::from_secs(30)) {
    ///     Ok(()) => println!("everyone left"),
    ///     Err(e) if e.is_wait_timeout() => println!("we left; some others had not"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn leave_timeout(&self, timeout: Duration) -> Result<()> {
        self.leave_within(Wait::from_timeout(timeout))
    }

    /// Like [`leave`](DoubleBarrier::leave), with a time limit and/or a
    /// [`CancelToken`](crate::CancelToken) (see [`WaitOptions`]).
    ///
    /// # Errors
    ///
    /// * [`Error::Cancelled`]: the token was cancelled before or during the wait (as for a
    ///   timeout, we are out once our key is removed).
    /// * [`Error::Timeout`] with [`Operation::Leave`]: the limit passed first.
    /// * Otherwise as [`leave`](DoubleBarrier::leave).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// # let barrier = session.double_barrier("b", 1)?;
    /// # barrier.enter()?;
    /// let token = etcd_sync::CancelToken::new();
    /// barrier.leave_with(&token)?;
    /// # Ok(()) }
    /// ```
    pub fn leave_with(&self, options: impl Into<WaitOptions>) -> Result<()> {
        self.leave_within(Wait::from_options(options.into()))
    }

    fn entered_state(&self) -> std::sync::MutexGuard<'_, Option<Entered>> {
        self.entered.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn enter_within(&self, wait: Wait) -> std::result::Result<(), TryLockError> {
        wait.check()?;
        if self.is_entered() {
            return Err(Error::InvalidArgument(format!(
                "already entered double barrier {:?}: leave first",
                text(&self.me.name)
            ))
            .into());
        }
        let session = self.me.session.lease();
        session.check()?;
        let client = self.me.session.client();
        let entered = self.me.with_place(|place| {
            client.block_on(async {
                // A zero or very short limit tries once, as `try_enter` does, and then
                // gives up with `Timeout`.
                let once = wait.tries_once();
                let busy = || match once {
                    true => TryLockError::from(wait.timeout_error(Operation::Enter)),
                    false => TryLockError::WouldBlock,
                };
                let local_turn = match wait.is_never() || once {
                    true => self
                        .me
                        .local_turn
                        .clone()
                        .try_lock_owned()
                        .map_err(|_| busy())?,
                    false => {
                        let local_turn =
                            async { Ok(self.me.local_turn.clone().lock_owned().await) };
                        wait.bound_alive(Operation::Enter, session, local_turn)
                            .await?
                    }
                };
                let patient = !wait.is_never() && !once;
                // The first attempt gets one request timeout however short the limit.
                let first = wait.first_attempt(place.rpc.request_timeout());
                let joining =
                    first.bound_alive(Operation::Enter, session, steps::join(place, patient));
                let joined = match joining.await {
                    Ok(joined) => joined,
                    // Cut short by the limit or the token: the Txn may be on its way.
                    Err(e) if e.is_cancelled() || e.is_wait_timeout() => {
                        let removed = self.me.remove_unknown_in_background(local_turn);
                        let _ = tokio::time::timeout(settle(place), removed).await;
                        return Err(e.into());
                    }
                    // `join` cleaned up after its own failure; a lost session takes the key.
                    Err(e) => return Err(session.judge(e).into()),
                };
                let created = joined.created;
                let settling = steps::settle(place, created, (joined.kvs, joined.at), patient);
                let settled = match once {
                    true => first.bound_alive(Operation::Enter, session, settling).await,
                    false => wait.bound_alive(Operation::Enter, session, settling).await,
                };
                if let Ok(Some(round)) = settled {
                    return Ok(Entered {
                        created,
                        round,
                        local_turn,
                    });
                }
                // Not in: our key goes, local turn in hand (in the background if etcd is
                // slow).
                let removed = self.me.remove_in_background(created, local_turn, false);
                let _ = tokio::time::timeout(settle(place), removed).await;
                match settled {
                    Err(e) => Err(session.judge(e).into()),
                    Ok(_) => Err(busy()),
                }
            })
        })?;
        tracing::debug!(key = %text(&self.me.key), round = entered.round, "entered");
        *self.entered_state() = Some(entered);
        Ok(())
    }

    fn leave_within(&self, wait: Wait) -> Result<()> {
        wait.check()?;
        let Some(entered) = self.entered_state().take() else {
            return Err(Error::InvalidArgument(format!(
                "not in double barrier {:?}: enter first",
                text(&self.me.name)
            )));
        };
        let session = self.me.session.lease();
        let client = self.me.session.client();
        let (created, round) = (entered.created, entered.round);
        let removed = self.me.with_place(|place| {
            let removing = steps::remove_own(place, created);
            client.block_on(wait.bound_alive(Operation::Leave, session, removing))
        });
        match removed {
            Ok(()) => drop(entered.local_turn),
            // Still in: `leave` may be called again.
            Err(e) if !e.is_session_lost() => {
                *self.entered_state() = Some(entered);
                return Err(e);
            }
            Err(e) => return Err(e),
        }
        self.me.with_place(|place| {
            let leaving = steps::wait_for_round_to_leave(place, round);
            client.block_on(wait.bound_alive(Operation::Leave, session, leaving))
        })?;
        tracing::debug!(key = %text(&self.me.key), round, "left");
        Ok(())
    }
}

/// How long a failed enter waits for etcd to answer the removal of its key before it
/// returns (the removal goes on in the background): a quarter of a request timeout, as for
/// a failed lock. An etcd that answers at all answers in milliseconds.
fn settle(place: &steps::Place<'_>) -> Duration {
    place.rpc.request_timeout() / 4
}

impl Drop for DoubleBarrier {
    fn drop(&mut self) {
        if let Some(entered) = self.entered_state().take() {
            // Never blocks: the others count us out once etcd has the delete.
            drop(
                self.me
                    .remove_in_background(entered.created, entered.local_turn, true),
            );
        }
    }
}
