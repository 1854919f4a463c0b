//! The one path from "I want this name" to a guard: take the local turn, join the line in
//! etcd, wait until every key ahead is gone, and clean up on every failure while still
//! owning the local turn.

use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::thread::ThreadId;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use super::hold::{HoldState, spawn_removal};
use super::join::{clean_up_ambiguous, join};
use super::{Held, Hold, Kind, Place, Wait};
use super::{deadlock, delay, handover, proof};
use crate::client::follow::{Follow, Followed};
use crate::client::lease::LeaseState;
use crate::client::removal::Owned;
use crate::line::handed::Handed;
use crate::line::queue::{self, Position};
use crate::line::wait::{self, Granted};
use crate::support::error::Error;
use crate::support::error::operation::Operation;
use crate::support::error::try_lock::TryLockError;
use crate::support::kv::text;
use crate::support::signal::Signal;
use crate::support::sim::{Mutation, mutation};
use crate::transport::Rpc;
use crate::transport::watches::Pin;

/// Takes the line's local turn, ending early on session loss, the deadline or a cancel.
pub(super) async fn take_local_turn(
    line: &Place,
    session: &LeaseState,
    wait: &Wait,
    operation: Operation,
) -> std::result::Result<OwnedMutexGuard<()>, TryLockError> {
    let local_turn = line.local_turn.clone();
    if wait.is_never() {
        return local_turn
            .try_lock_owned()
            .map_err(|_| TryLockError::WouldBlock);
    }
    if wait.tries_once() {
        // A zero or very short limit: one try, as `try_*` makes.
        return local_turn
            .try_lock_owned()
            .map_err(|_| wait.timeout_error(operation).into());
    }
    // Free (the common case): taken at once, with nothing to bound, but the wait's token
    // and the session checked as the bounded path would before anything is sent.
    let local_turn = match local_turn.try_lock_owned() {
        Ok(taken) => {
            wait.check()?;
            session.check()?;
            return Ok(taken);
        }
        Err(_) => line.local_turn.clone(),
    };
    let taken = wait.bound_alive(operation, session, async {
        Ok(local_turn.lock_owned().await)
    });
    Ok(taken.await?)
}

/// What every acquisition checks before it sends anything: a blocking call is allowed
/// here, the wait is not over, the session lives, and this thread does not hold the line's
/// local turn already (waiting for it would never end). The session's lease state on
/// success.
pub(super) fn may_start(
    line: &Place,
    wait: &Wait,
) -> std::result::Result<Arc<LeaseState>, TryLockError> {
    crate::client::runtime::ensure_blocking_allowed()?;
    wait.check()?;
    let session = line.session.lease().clone();
    session.check()?;
    if line.held_by_this_thread() {
        return Err(if wait.is_never() {
            TryLockError::WouldBlock
        } else {
            Error::WouldDeadlock(text(&line.name).into_owned()).into()
        });
    }
    Ok(session)
}

/// Acquires `line` for `kind`, storing `value` under the key: the one path every recipe
/// uses. On every error our key is removed (or its removal is running, local turn in hand).
pub(crate) fn acquire(
    line: &Arc<Place>,
    kind: Kind,
    value: &[u8],
    wait: Wait,
) -> std::result::Result<Held, TryLockError> {
    let started = crate::support::telemetry::Stopwatch::start();
    let session = may_start(line, &wait)?;
    let client = line.session.client().clone();
    let rpc = client.rpc().clone();
    let thread = std::thread::current().id();
    client.block_on(async {
        let local_turn = take_local_turn(line, &session, &wait, kind.operation()).await?;
        // 1. Join the line in etcd.
        let (enqueued, local_turn) =
            join_within(&rpc, line, None, kind, value, &wait, &session, local_turn).await?;
        // 2. Wait for our turn in etcd, unless asked not to.
        let (enqueued, local_turn, granted) =
            wait_in_line(&rpc, line, kind, &wait, &session, enqueued, local_turn).await?;
        // 3. The hold, made here on the worker: handing the guard to the follow task from
        // the caller's thread woke the worker again after every acquire (issue 49).
        let ours = (enqueued, local_turn, granted);
        Ok(hold_from(line, kind, ours, (started, thread)))
    })
}

/// Waits until `enqueued` (our key, just joined, `local_turn` in hand) owns, unless `wait`
/// is a `try_*`: the key, the local turn and the proof. On any error the key is removed by
/// its revision, local turn in hand (the caller hears of the error once etcd answered, or
/// within one request timeout).
pub(super) async fn wait_in_line(
    rpc: &Rpc,
    line: &Arc<Place>,
    kind: Kind,
    wait: &Wait,
    session: &LeaseState,
    enqueued: queue::Enqueued,
    local_turn: OwnedMutexGuard<()>,
) -> std::result::Result<(queue::Enqueued, OwnedMutexGuard<()>, Granted), TryLockError> {
    if matches!(enqueued.position, Position::Owner) {
        super::leftover::remove_unused(line, &enqueued.leased);
        let granted = Granted::read_at(enqueued.seen_at);
        return Ok((enqueued, local_turn, granted));
    }
    // Boxed: the state of a wait is kilobytes that every uncontended acquire would carry,
    // and copy, if it were inline (`scripts/callgrind`).
    Box::pin(wait_behind(
        rpc, line, kind, wait, session, enqueued, local_turn,
    ))
    .await
}

/// [`wait_in_line`] for a key that does not own yet (or owns: then at once).
async fn wait_behind(
    rpc: &Rpc,
    line: &Arc<Place>,
    kind: Kind,
    wait: &Wait,
    session: &LeaseState,
    enqueued: queue::Enqueued,
    local_turn: OwnedMutexGuard<()>,
) -> std::result::Result<(queue::Enqueued, OwnedMutexGuard<()>, Granted), TryLockError> {
    // Leftovers of our lease: those ahead, and those the Txn found wherever they are.
    let ahead = match &enqueued.position {
        Position::Behind(ahead) => Some(ahead.keys()),
        _ => None,
    };
    super::leftover::remove_unused(line, ahead.into_iter().flatten().chain(&enqueued.leased));
    let answered = std::sync::atomic::AtomicBool::new(false);
    let waited = match &enqueued.position {
        Position::Owner => Ok(Granted::read_at(enqueued.seen_at)),
        // Only a busy line is `WouldBlock`: a refusal is an error.
        Position::Behind(_) if wait.is_never() => Err(TryLockError::WouldBlock),
        position => {
            let watches = line.session.client().watches();
            let far = wait::starts_far(watches, line.ours(enqueued.rev), position);
            // With a lock-delay, the leases ahead are read while we wait: a lease proven
            // alive when our turn came did not expire (delay.rs).
            let readings = delay::Readings::default();
            // Only a lock-delay asks when each key ahead went.
            let departures = match position {
                Position::Behind(ahead) if !wait.delay.is_zero() => {
                    crate::line::crossing::Departures::of_keys(ahead.keys())
                }
                _ => crate::line::crossing::Departures::default(),
            };
            let reading = match position {
                Position::Behind(ahead) if !wait.delay.is_zero() => {
                    let leases = delay::leases_ahead(&line.prefix, ahead);
                    let reading =
                        delay::keep_reading(rpc, leases, readings.clone(), departures.clone());
                    Some(Box::pin(reading))
                }
                _ => None,
            };
            let our_turn = wait::wait_turn(
                rpc,
                line.watches_for(far, enqueued.seen_at),
                session,
                line.ours(enqueued.rev),
                (position.clone(), enqueued.seen_at),
                reading.is_some().then_some(&departures),
            );
            // With deadlock detection on, a cycle this wait is chosen to end ends it
            // (deadlock.rs), and its key is removed below as a timed-out wait's is.
            let deadlock = deadlock::watch_if_on(rpc, line, enqueued.rev);
            let mut deadlock = deadlock.map(Box::pin);
            // A candidate answers hand-over requests while it waits (handover.rs).
            let answering = (kind == Kind::Lead).then(|| {
                let watches = line.session.client().watches();
                let at = (enqueued.rev, enqueued.seen_at);
                Box::pin(handover::answer(rpc, watches, line, at, &answered))
            });
            // Boxed: one future the size of the wait inline more overflowed a debug
            // build's thread stack (the simulation's tests).
            let our_turn = Box::pin(async {
                let Some(answering) = answering else {
                    return our_turn.await;
                };
                tokio::select! {
                    biased;
                    granted = our_turn => granted,
                    never = answering => match never {},
                }
            });
            let turn_came = wait.bound(kind.operation(), async {
                let our_turn = async {
                    let Some(reading) = reading else {
                        return our_turn.await;
                    };
                    tokio::select! {
                        biased;
                        granted = our_turn => granted,
                        never = reading => match never {},
                    }
                };
                let Some(deadlock) = deadlock.as_mut() else {
                    return our_turn.await;
                };
                tokio::select! {
                    biased;
                    granted = our_turn => granted,
                    e = deadlock => Err(e),
                }
            });
            let turn_came = turn_came.await;
            let turn_at = crate::support::clock::now();
            match (turn_came, position) {
                // Our turn came after others held: a lock-delay may apply. It is a
                // step after the proof, so it ends when our key goes (rule 4).
                (Ok(granted), Position::Behind(ahead)) if !wait.delay.is_zero() => {
                    let seen_at = granted.at;
                    let op = kind.operation();
                    let delay = wait.delay;
                    let held_off = delay::hold_off(
                        rpc,
                        session,
                        wait,
                        op,
                        (&line.prefix, ahead),
                        delay,
                        delay::Seen {
                            readings: &readings,
                            departures: &departures,
                            turn_at,
                        },
                    );
                    let watches = line.session.client().watches();
                    let ours = line.ours(enqueued.rev);
                    if mutation(Mutation::DelayIgnoresDeletion) {
                        let unwatched = Box::pin(wait.bound_alive(op, session, held_off));
                        return match unwatched.await {
                            Ok(()) => Ok((enqueued, local_turn, granted)),
                            Err(e) => Err(TryLockError::from(e)),
                        };
                    }
                    let kept = proof::while_ours(rpc, watches, session, ours, seen_at, held_off);
                    // Boxed: a rare path, kept out of every acquire's future (in a
                    // debug build it overflowed a 2 MiB thread stack inline).
                    Box::pin(wait.bound_alive(op, session, kept))
                        .await
                        .map(|()| granted)
                }
                (result, _) => result,
            }
            .map_err(TryLockError::from)
        }
    };
    let answered = answered.load(std::sync::atomic::Ordering::SeqCst);
    let waited = match waited {
        // Our key went after we answered a hand-over: the leader's key may be ours now.
        Err(TryLockError::Error(Error::LockLost)) if answered => {
            match handover::adopted(rpc, line, enqueued.rev).await {
                Ok(Some(granted)) => Ok(granted),
                Ok(None) => Err(Error::LockLost.into()),
                Err(e) => Err(e.into()),
            }
        }
        waited => waited,
    };
    match waited {
        Ok(granted) => Ok((enqueued, local_turn, granted)),
        Err(e) if answered => {
            // Our key, and a leadership handed over to it meanwhile, if any.
            let pending = handover::remove_after_answer(line, enqueued.rev, local_turn);
            let _ = tokio::time::timeout(rpc.request_timeout(), pending).await;
            Err(e)
        }
        Err(e) => {
            // Known revision: this deletes nothing but the key this attempt created.
            let pending = spawn_removal(line, Owned::Revision(enqueued.rev), Some(local_turn));
            // Bounded: the caller gets its error within one request timeout.
            if mutation(Mutation::CancelReturnsEarly) {
                drop(pending);
                return Err(e);
            }
            let _ = tokio::time::timeout(rpc.request_timeout(), pending).await;
            Err(e)
        }
    }
}

/// The tail every join shares (one name, or several in one Txn): `enqueued` owns as
/// `granted` proves, `local_turn` in hand. Makes the hold that owns the local turn and has
/// the client's follow task follow the key from the proof revision.
pub(super) fn hold_from(
    line: &Arc<Place>,
    kind: Kind,
    (enqueued, local_turn, granted): (queue::Enqueued, OwnedMutexGuard<()>, Granted),
    (started, thread): (crate::support::telemetry::Stopwatch, ThreadId),
) -> Held {
    let enqueued = &enqueued;
    let Granted {
        at: alive_at,
        keep,
        handed,
    } = granted;
    // A guard that waited follows from its proof revision at once: the name's watcher is
    // pinned and running (no request), and a delete since the proof ends it as soon as the
    // event arrives, not after the deferral.
    let at_once = matches!(enqueued.position, Position::Behind(_));
    let hold = new_hold(
        line,
        (kind, enqueued, handed.as_ref()),
        (local_turn, thread),
        (alive_at, at_once),
        keep,
    );
    tracing::debug!(
        key = %text(hold.key()),
        fencing_token = hold.token,
        ?kind,
        existed = enqueued.existed,
        proof_revision = alive_at,
        "acquired"
    );
    crate::support::telemetry::acquired(&line.name, kind.operation(), started);
    Held::new(hold)
}

/// A hold of `line` for `enqueued`'s key, `local_turn` in hand: made the line's current
/// hold, and followed by the client's follow task from `alive_at` (a revision at which the
/// key was known to exist; `at_once`: subscribe now, not after the deferral; `keep`: the
/// name's watcher, kept running until the follow subscribed to it).
/// `handed`: the leader's key handed over to this wait, held instead of the line's own.
/// The fencing token is the create revision of the key the acquisition joined with (for
/// a hand-over, its own key's, not the adopted one's: docs/design/handover.md).
pub(super) fn new_hold(
    line: &Arc<Place>,
    (kind, enqueued, handed): (Kind, &queue::Enqueued, Option<&Handed>),
    (local_turn, thread): (OwnedMutexGuard<()>, ThreadId),
    (alive_at, at_once): (i64, bool),
    keep: Option<Pin>,
) -> Arc<Hold> {
    let (handed_key, rev, value_rev) = match handed {
        Some(handed) => (Some(handed.key.clone()), handed.rev, handed.value_rev),
        None => (None, enqueued.rev, enqueued.value_rev),
    };
    // A leadership handed over keeps the old leader's key and create revision: its token
    // is the create revision of the key it waited with, which is above the old leader's
    // (it was behind it) and below every key that joined after it.
    let token = enqueued.rev;
    let hold = Arc::new(Hold {
        line: line.clone(),
        handed_key,
        rev,
        token,
        kind,
        acquired: crate::support::telemetry::Stopwatch::start(),
        state: StdMutex::new(HoldState {
            generation: 0,
            thread,
            signal: Arc::new(Signal::new()),
            local_turn: Some(local_turn),
            ended: false,
            handing_over: false,
            value_rev,
        }),
        proclaiming: tokio::sync::Mutex::new(()),
        requests: StdMutex::new(None),
    });
    *line.current.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&hold);
    // A line that waited at the back keeps its own key's watcher: the guard follows there,
    // so the name's watcher can go, and the holder hears neither of its own release twice
    // nor of every delete behind it.
    let own = line.watches_own_key() && handed.is_none();
    line.session.client().follower().follow(Follow::Guard {
        prefix: line.prefix.clone(),
        own,
        key: hold.key().to_vec(),
        rev,
        alive_at,
        at_once,
        hold: Arc::downgrade(&hold) as Weak<dyn Followed>,
        // Dropped by the follow task once it subscribed: the name's watcher stays up to
        // then for whoever follows on it (a downgradable write's twin, just before).
        keep,
    });
    hold
}

/// Joins the line within `wait`: our key, and the local turn back. On any error our key is
/// removed, local turn in hand, and the caller hears of the error once etcd answered the
/// removal, or at [`settle_by`] (the removal goes on in the background).
///
/// A join cut short by the wait's limit or token is let finish first, within that same
/// bound: its Txn may already be on its way, and etcd may apply it after a removal sent
/// now, re-creating the key behind the caller's back (a sweep would delete it, but only
/// later: a process that exits on `Cancelled` would leave it blocking the name). Finished,
/// it tells our revision, and the key is removed by it. Only a join whose outcome stays
/// unknown (no answer, a lost session) is cleaned up by lease.
///
/// `twin`: the reader line whose key a downgradable write puts beside its own (its local
/// turn is the caller's, who removes that key after any failure: `twin.rs`).
#[allow(clippy::too_many_arguments)]
pub(super) async fn join_within(
    rpc: &Rpc,
    line: &Arc<Place>,
    twin: Option<&Arc<Place>>,
    kind: Kind,
    value: &[u8],
    wait: &Wait,
    session: &LeaseState,
    local_turn: OwnedMutexGuard<()>,
) -> std::result::Result<(queue::Enqueued, OwnedMutexGuard<()>), TryLockError> {
    // A blocking wait rides out a leader election here too; `try_*` gives up after one
    // attempt per endpoint.
    let patient = !wait.is_never();
    let lease = line.session.lease_id();
    let started = tokio::time::Instant::now();
    let mut joining = std::pin::pin!(join(rpc, (line, twin), kind, value, lease, patient));
    let joined = async { Ok((&mut joining).await) };
    // The first attempt gets one request timeout however short the limit: a zero limit
    // tries once (a free name is taken), and then gives up.
    let join_wait = wait.first_attempt(rpc.request_timeout());
    let (error, cut_short) = match join_wait
        .bound_alive(kind.operation(), session, joined)
        .await
    {
        Ok(Ok(enqueued)) => return Ok((enqueued, local_turn)),
        // The join's own failure: its Txn may have applied (or apply later).
        Ok(Err(e)) => (e, false),
        // The limit or token ended it (the join is unfinished); a lost session takes the
        // key with its lease.
        Err(e) => {
            let lost = matches!(e, Error::SessionLost(_));
            (e, !lost)
        }
    };
    let settle_by = settle_by(started, rpc.request_timeout());
    let finished = if cut_short {
        tokio::select! {
            finished = tokio::time::timeout_at(settle_by, &mut joining) => finished.ok(),
            // The lease takes the key with it: nothing to wait for.
            _ = session.wait_lost() => None,
        }
    } else {
        None
    };
    match finished {
        Some(Ok(enqueued)) => {
            // Known revision: this deletes nothing but the key this attempt created.
            let owned = Owned::Revision(enqueued.rev);
            let removed = spawn_removal(line, owned, Some(local_turn));
            let _ = tokio::time::timeout_at(settle_by, removed).await;
        }
        _ => {
            // The Txn may have applied (or apply later): remove by lease, local turn in
            // hand.
            let removed = clean_up_ambiguous(line, local_turn);
            let _ = tokio::time::timeout_at(settle_by, removed).await;
        }
    }
    // A lease revoked elsewhere shows here first: say the session is lost.
    Err(session.judge(error).into())
}

/// How long a failed join waits for its in-flight Txn and its key's removal: a quarter of
/// a request timeout from the failure, and never past one request timeout from the join's
/// start. An etcd that answers at all answers these in milliseconds; a frozen one would not
/// answer before the join's own request timed out, and then the removal by lease and the
/// sweep go on in the background. So a join cut short on a frozen etcd (`lock_timeout`,
/// `try_lock`) still returns within about one request timeout, as before.
pub(super) fn settle_by(
    started: tokio::time::Instant,
    request_timeout: Duration,
) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    (now + request_timeout / 4).min(started + request_timeout)
}
