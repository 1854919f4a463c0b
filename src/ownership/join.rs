//! Joining the line in etcd: the enqueue Txn, retried on the next endpoints, with what to
//! do with a key this session already has, and the cleanup of a join whose outcome is
//! unknown (its Txn may be applied late: removed by lease, then the line swept).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use super::{Kind, Place};
use crate::client::follow::Follow;
use crate::client::removal;
use crate::line::queue;
use crate::line::wait;
use crate::support::backoff::Backoff;
use crate::support::error::{Error, Result};
use crate::support::sim::{Mutation, mutation};
use crate::transport::Rpc;

/// Joins the line: one Txn, plus what to do with a key this session already has.
pub(super) async fn join(
    rpc: &Rpc,
    (line, twin): (&Arc<Place>, Option<&Arc<Place>>),
    kind: Kind,
    value: &[u8],
    lease: i64,
    patient: bool,
) -> Result<queue::Enqueued> {
    let enqueued = enqueue_once_or_sweep(rpc, line, twin, value, lease, patient).await?;
    if !enqueued.existed {
        return Ok(enqueued);
    }
    // We own the local turn (and the twin's), so no guard of this process uses the key: it
    // came with a resumed lease, or from a release or cleanup that never reached etcd.
    match kind {
        Kind::Lock(_) => {
            // A fresh create revision for every acquisition: fencing tokens strictly grow.
            if enqueued.rev != 0 {
                super::leftover::remove_found(rpc, &line.key, enqueued.rev, patient).await?;
            }
            if let (Some(twin), Some(rev)) = (twin, enqueued.twin_existed) {
                super::leftover::remove_found(rpc, &twin.key, rev, patient).await?;
            }
            enqueue_once_or_sweep(rpc, line, twin, value, lease, patient).await
        }
        Kind::Lead if enqueued.value == value => Ok(enqueued),
        Kind::Lead => {
            // Go's re-campaign: keep the place, proclaim the new value. Sent again only
            // when every member refused it unapplied (an election): a put that may have
            // applied would fail its own compare when sent again.
            let mut backoff = Backoff::quick();
            let put = loop {
                let put = queue::put_if_unchanged(
                    rpc,
                    &line.key,
                    enqueued.rev,
                    enqueued.value_rev,
                    value,
                    lease,
                )
                .await;
                match put {
                    Err(e) if patient && e.is_refused_unhandled() => backoff.sleep().await,
                    other => break other,
                }
            };
            match put? {
                Some(value_rev) => Ok(queue::Enqueued {
                    value_rev,
                    value: value.to_vec(),
                    ..enqueued
                }),
                None => Err(Error::NotLeader),
            }
        }
    }
}

/// The enqueue Txn, retried on the next endpoints after a transient failure. When
/// `patient`, a refusal of every member ("no leader": an election) and a transport failure
/// on every endpoint (a member restarting, a connection it broke) are retried after a quick
/// backoff for as long as they last (the caller's wait bounds it); `try_*` gives up after
/// one attempt per endpoint. A failed attempt
/// may still be applied later by the member that had it (etcd has no idempotency keys),
/// re-creating our key after it is gone: if any attempt was ambiguous, the line is swept
/// for that from the successful answer on.
async fn enqueue_once_or_sweep(
    rpc: &Rpc,
    line: &Arc<Place>,
    twin: Option<&Arc<Place>>,
    value: &[u8],
    lease: i64,
    patient: bool,
) -> Result<queue::Enqueued> {
    let mut ambiguous = false;
    let mut attempts = rpc.endpoints().len();
    let mut backoff = Backoff::quick();
    loop {
        let whole_line = wait::front_is_watched(line.session.client().watches(), line.ours(0));
        let twin_key = twin.map(|t| t.key.as_slice());
        // After a long line, our lease's keys are read apart in the Txn (the line's read
        // may not reach them); else they are found in the line's read, or read after it.
        let apart = line.line_was_long.load(Ordering::Relaxed);
        let joined = queue::enqueue(
            rpc,
            line.ours(0),
            value,
            (lease, apart),
            whole_line,
            twin_key,
        )
        .await;
        if let Ok(enqueued) = &joined {
            line.line_was_long.store(enqueued.long, Ordering::Relaxed);
        }
        match joined {
            Err(e) if patient && e.is_refused_unhandled() => {
                tracing::debug!(error = %e, "enqueue refused by every member; retrying");
                backoff.sleep().await;
            }
            Err(e) if e.is_transient() && attempts > 1 => {
                attempts -= 1;
                ambiguous = true;
            }
            // A blocking wait with time left rides out a transport failure (a member
            // restarting, a connection it broke): the enqueue is exactly-once (its Txn puts
            // only an absent key, and a late copy is swept), so it tries again after a
            // pause, for as long as the caller's limit, token and session allow.
            Err(e) if patient && e.is_transient() => {
                tracing::debug!(error = %e, "enqueue failed on every endpoint; retrying");
                ambiguous = true;
                backoff.sleep().await;
            }
            Ok(enqueued) => {
                if ambiguous {
                    // A late copy puts both keys of a downgradable write: each line is
                    // swept for its own.
                    for line in std::iter::once(line).chain(twin) {
                        sweep(line, enqueued.rev + 1);
                    }
                }
                return Ok(enqueued);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Has the client's follow task sweep `line` from revision `from` (see `client/follow.rs`).
fn sweep(line: &Place, from: i64) {
    line.session.client().follower().follow(Follow::Sweep {
        key: line.key.clone(),
        from,
        local_turn: line.local_turn.clone(),
        session: line.session.lease().clone(),
    });
}

/// After an ambiguous enqueue: remove the key of our lease under the name if there is one
/// (by its revision, read first: `removal::remove_if_leased`), owning the local turn, then
/// have the client's follow task sweep the line for the same attempt applied late by a
/// member that held it (see `client/follow.rs`). The receiver hears
/// when etcd has answered the removal (or the session ended); the caller waits for it
/// within a bound, the removal goes on regardless.
pub(super) fn clean_up_ambiguous(
    line: &Arc<Place>,
    local_turn: OwnedMutexGuard<()>,
) -> tokio::sync::oneshot::Receiver<()> {
    let (done, removed) = tokio::sync::oneshot::channel();
    let rpc = line.session.client().rpc().clone();
    let session = line.session.lease().clone();
    let key = line.key.clone();
    let line = line.clone();
    let local_turn = (!mutation(Mutation::CleanupWithoutTurn)).then_some(local_turn);
    line.session.client().clone().spawn(async move {
        let removed = loop {
            let attempt = if mutation(Mutation::CleanupByLease) {
                removal::remove_by_lease(&rpc, &key, session.id()).await
            } else {
                removal::remove_if_leased(&rpc, &key, session.id()).await
            };
            match attempt {
                Err(e) if e.is_transient() && session.loss_reason().is_none() => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other,
            }
        };
        if let Ok(revision) = removed {
            sweep(&line, revision + 1);
        }
        drop(local_turn);
        let _ = done.send(());
    });
    removed
}
