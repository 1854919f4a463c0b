//! Several free names joined in one Txn (a multi-lock's fast path): every line's local
//! turn, taken without waiting in bytewise order, then `queue::enqueue_many`, then the
//! holds of the bytewise prefix of names that were free, and our key queued at the first
//! busy one. Every other key is removed, local turn in hand, exactly as the one-name path
//! removes its key; the caller takes the rest name by name (docs/design/multi-lock.md).

use std::sync::Arc;

use tokio::sync::OwnedMutexGuard;

use super::acquire::{hold_from, settle_by};
use super::hold::spawn_removal;
use super::join::clean_up_ambiguous;
use super::{Held, Kind, Place, Wait};
use crate::client::removal::Owned;
use crate::line::queue::{self, Enqueued, Joining, Position};
use crate::line::wait::{self, Granted};
use crate::support::error::Error;
use crate::support::error::operation::Operation;
use crate::support::error::try_lock::TryLockError;
use crate::support::kv::{Compare, CompareOp, Txn};
use crate::support::telemetry::Stopwatch;
use crate::transport::Retry;

/// Takes every name of `members` (sorted bytewise by name, no duplicates) that is free, in
/// one Txn: the holds of the longest prefix of them that the Txn found free, in order, and
/// (when a name is busy) our key queued at that name by the same Txn, for [`wait_queued`].
/// The caller takes the names after those one by one, through the one-name path, which
/// also takes the whole set when this path leaves it (nothing held, nothing queued): a
/// turn busy here, a name this thread holds, a key of ours that existed, a Txn without an
/// answer (cleaned up first).
///
/// Every key this path created and does not return is removed before it returns (or at
/// most one request timeout later, in the background, local turn in hand): by revision when
/// the Txn answered, by lease with a sweep of the line when it did not. A `try_*` wait that
/// finds a name busy keeps nothing (`WouldBlock`).
pub(crate) fn lock_free_prefix(
    members: &[(Arc<Place>, Operation)],
    wait: &Wait,
) -> std::result::Result<(Vec<Held>, Option<Queued>), TryLockError> {
    let started = Stopwatch::start();
    let none = || Ok((Vec::new(), None));
    let Some((first, _)) = members.first() else {
        return none();
    };
    // One name: the one-name path sends one Txn too.
    if members.len() < 2 || members.len() > queue::MAX_LINES {
        return none();
    }
    crate::client::runtime::ensure_blocking_allowed()?;
    wait.check()?;
    let session = first.session.lease().clone();
    session.check()?;
    // A name this thread holds is the one-name path's error (`WouldDeadlock`), and a turn
    // owned by anyone else (a local waiter, a release still running) is a wait in line.
    if members.iter().any(|(line, _)| line.held_by_this_thread()) {
        return none();
    }
    let mut local_turns = Vec::with_capacity(members.len());
    for (line, _) in members {
        match line.local_turn.clone().try_lock_owned() {
            Ok(local_turn) => local_turns.push(local_turn),
            Err(_) => return none(),
        }
    }
    let client = first.session.client().clone();
    let operation = members[0].1;
    let (owned, queued) = client.block_on(join_all(members, local_turns, wait, operation))?;
    let held = (owned.into_iter().zip(members))
        .map(|((enqueued, local_turn), (line, op))| {
            let alive_at = enqueued.seen_at;
            hold_from(
                line,
                Kind::Lock(*op),
                (enqueued, local_turn, Granted::read_at(alive_at)),
                (started, std::thread::current().id()),
            )
        })
        .collect::<Vec<_>>();
    let queued = queued.map(|joined| {
        let (line, op) = &members[held.len()];
        Queued {
            line: line.clone(),
            kind: Kind::Lock(*op),
            joined: Some(joined),
        }
    });
    Ok((held, queued))
}

/// The first busy line of a one-Txn join: our key, queued there by the Txn (its position
/// read by the same Txn, as the one-name enqueue reads it), local turn in hand. Waited on
/// with [`wait_queued`]; dropped unwaited, its key is removed by revision, local turn in
/// hand.
pub(crate) struct Queued {
    line: Arc<Place>,
    kind: Kind,
    joined: Option<Joined>,
}

/// A key the Txn put, with its line's local turn.
type Joined = (Enqueued, OwnedMutexGuard<()>);

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some((enqueued, local_turn)) = self.joined.take() {
            drop(spawn_removal(
                &self.line,
                Owned::Revision(enqueued.rev),
                Some(local_turn),
            ));
        }
    }
}

/// Waits for `queued`'s turn within `wait` (the one-name path's wait, lock-delay
/// included), then holds it as that path does. On any error the key is removed by its
/// revision, local turn in hand.
pub(crate) fn wait_queued(queued: Queued, wait: &Wait) -> std::result::Result<Held, TryLockError> {
    let started = Stopwatch::start();
    let (line, kind) = (queued.line.clone(), queued.kind);
    let session = line.session.lease().clone();
    let client = line.session.client().clone();
    let rpc = client.rpc().clone();
    let (enqueued, local_turn, granted) = client.block_on(async {
        // Taken only here: a future dropped unrun leaves the removal to `Drop`.
        let mut queued = queued;
        let Some((enqueued, local_turn)) = queued.joined.take() else {
            return Err(Error::LockLost.into());
        };
        super::acquire::wait_in_line(&rpc, &line, kind, wait, &session, enqueued, local_turn).await
    })?;
    let ours = (enqueued, local_turn, granted);
    Ok(hold_from(
        &line,
        kind,
        ours,
        (started, std::thread::current().id()),
    ))
}

/// The Txn, bounded by `wait`, and what follows from its answer: the owned prefix and the
/// first busy line, with their local turns; every other key removed (local turn in hand).
async fn join_all(
    members: &[(Arc<Place>, Operation)],
    local_turns: Vec<OwnedMutexGuard<()>>,
    wait: &Wait,
    operation: Operation,
) -> std::result::Result<(Vec<Joined>, Option<Joined>), TryLockError> {
    let line0 = &members[0].0;
    let rpc = line0.session.client().rpc().clone();
    let session = line0.session.lease().clone();
    let lease = line0.session.lease_id();
    let value = line0.session().identity().as_bytes().to_vec();
    let watches = line0.session.client().watches();
    let joining: Vec<Joining<'_>> = members
        .iter()
        .map(|(line, _)| Joining {
            ours: line.ours(0),
            whole_line: wait::front_is_watched(watches, line.ours(0)),
        })
        .collect();
    let begun = tokio::time::Instant::now();
    let mut sent = std::pin::pin!(queue::enqueue_many(&rpc, &joining, &value, lease));
    let answer = async { Ok((&mut sent).await) };
    // The first attempt gets one request timeout however short the limit (as the one-name
    // join: a zero limit tries once).
    let join_wait = wait.first_attempt(rpc.request_timeout());
    let (error, cut_short) = match join_wait.bound_alive(operation, &session, answer).await {
        Ok(Ok(Some(enqueued))) => return settle(members, enqueued, local_turns, wait).await,
        // A key of ours existed: nothing was written.
        Ok(Ok(None)) => return Ok((Vec::new(), None)),
        // The Txn's own failure: it may have applied (or apply later).
        Ok(Err(e)) => (e, false),
        Err(e) => {
            let lost = matches!(e, Error::SessionLost(_));
            (e, !lost)
        }
    };
    let settle_by = settle_by(begun, rpc.request_timeout());
    // Cut short by the limit or the token: let the Txn finish, its answer tells what to
    // remove (as `join_within` does for one name).
    let finished = if cut_short {
        tokio::select! {
            finished = tokio::time::timeout_at(settle_by, &mut sent) => finished.ok(),
            _ = session.wait_lost() => None,
        }
    } else {
        None
    };
    match finished {
        Some(Ok(Some(enqueued))) => {
            // Known revisions: this deletes nothing but the keys the Txn created.
            let pending: Vec<_> = (members.iter().zip(enqueued).zip(local_turns))
                .map(|(((line, _), e), local_turn)| {
                    spawn_removal(line, Owned::Revision(e.rev), Some(local_turn))
                })
                .collect();
            for removed in pending {
                let _ = tokio::time::timeout_at(settle_by, removed).await;
            }
        }
        // The failure branch wrote nothing.
        Some(Ok(None)) => drop(local_turns),
        _ => {
            // Unknown outcome: every line is cleaned up as one name's ambiguous join is
            // (by lease, local turn in hand, then swept for a late copy of the Txn).
            let pending: Vec<_> = (members.iter().zip(local_turns))
                .map(|((line, _), local_turn)| clean_up_ambiguous(line, local_turn))
                .collect();
            for removed in pending {
                let _ = tokio::time::timeout_at(settle_by, removed).await;
            }
        }
    }
    if cut_short {
        return Err(session.judge(error).into());
    }
    // The one-name path takes it from here (each line's local turn passes to it once its
    // cleanup is answered): it retries on the next members, rides out elections, and
    // reports a lasting error as one name does.
    tracing::debug!(error = %error, "one-Txn join failed; joining name by name");
    Ok((Vec::new(), None))
}

/// After the Txn put every key: keeps the longest prefix of owned lines and the first
/// busy line (its key queued there), with their local turns, and removes the key of every
/// line after it (by revision, local turn in hand), waiting for etcd's answers within one
/// request timeout. A set that kept a later name's key while it waits for an earlier one
/// could deadlock with a taker that holds the earlier name and queues for the later one. A
/// `try_*` wait keeps nothing when a name is busy (`WouldBlock`).
async fn settle(
    members: &[(Arc<Place>, Operation)],
    enqueued: Vec<Enqueued>,
    local_turns: Vec<OwnedMutexGuard<()>>,
    wait: &Wait,
) -> std::result::Result<(Vec<Joined>, Option<Joined>), TryLockError> {
    let free = enqueued
        .iter()
        .take_while(|e| matches!(e.position, Position::Owner))
        .count();
    let busy = free < members.len();
    let keep = match (busy, wait.is_never()) {
        (true, true) => 0,
        (true, false) => free + 1,
        (false, _) => free,
    };
    let mut kept = Vec::with_capacity(keep);
    let mut pending = Vec::new();
    for (i, (e, local_turn)) in enqueued.into_iter().zip(local_turns).enumerate() {
        if i < keep {
            kept.push((e, local_turn));
        } else {
            let line = &members[i].0;
            pending.push(spawn_removal(
                line,
                Owned::Revision(e.rev),
                Some(local_turn),
            ));
        }
    }
    if let Some((line, _)) = members.first()
        && !pending.is_empty()
    {
        let timeout = line.session.client().rpc().request_timeout();
        let until = tokio::time::Instant::now() + timeout;
        for removed in pending {
            let _ = tokio::time::timeout_at(until, removed).await;
        }
    }
    if busy && wait.is_never() {
        return Err(TryLockError::WouldBlock);
    }
    let queued = if busy { kept.pop() } else { None };
    Ok((kept, queued))
}

/// Whether every key of `held` still has its create revision, in one linearizable Txn:
/// the proof a multi-lock needs before it returns when it took its names at different
/// revisions. Each name was owned at its own proof revision (no older key under it), and a
/// key that still exists with its create revision now is still the oldest (create
/// revisions only grow): so all are held at once at this Txn's revision. The follow task's
/// signal alone could not say so: an operator's delete of an early key just before the last
/// name was taken may not have reached it yet (found by the randomized checker). Bounded by
/// `wait` and the session; `Ok(false)` when a key is gone.
pub(crate) fn all_still_ours(held: &[Held], wait: &Wait) -> crate::support::error::Result<bool> {
    let Some(first) = held.first() else {
        return Ok(true);
    };
    let line = &first.hold().line;
    let client = line.session.client().clone();
    let rpc = client.rpc().clone();
    let session = line.session.lease().clone();
    let compares: Vec<Compare> = held
        .iter()
        .map(|h| Compare::create_revision(h.key(), CompareOp::Equal, h.rev()))
        .collect();
    let txn = Txn::new().when(compares);
    // A read: sending it twice changes nothing. The answer gets one request timeout
    // however short the limit, as a first attempt does.
    let bound = wait.first_attempt(rpc.request_timeout());
    client.block_on(bound.bound_alive(Operation::Lock, &session, async {
        Ok(rpc.txn(&txn, Retry::Safe).await?.succeeded)
    }))
}
