//! Keeping the proof of ownership true until the guard exists (RELIABILITY.md, rule 3).
//!
//! A wait proves ownership at one revision: the last key ahead was deleted there, or a read
//! showed our key first. Any step between that proof and returning a guard (a lock-delay
//! of seconds, the lease lookups before it) runs under [`while_ours`], which watches our
//! key from the proof revision on and ends the step with `LockLost` (or `SessionLost`, if
//! the lease went with it) the moment the key is deleted. Without it, a waiter whose key
//! was deleted during its lock-delay returned a guard that said "held" beside the guard of
//! whoever took the free name meanwhile (issue 25).
//!
//! When the step ends, one read of the key confirms the proof once more: the watcher can
//! be down just then (a broken stream, a resume from compacted history), and its news of
//! a deletion late (found by the simulation, issue 29).
//!
//! The guard's follow subscription then starts from that same proof revision (see
//! `acquire.rs`), so a deletion between the end of the step and the guard's creation ends
//! the guard as soon as its event arrives.

use std::future::Future;

use crate::client::lease::LeaseState;
use crate::line::queue::{self, Ours};
use crate::support::error::Result;
use crate::support::kv::{Range, text};
use crate::transport::Rpc;
use crate::transport::watch::{EventKind, Only};
use crate::transport::watches::{Delivery, Spec, Watches};

/// Runs `step` while our key (`ours`, known to exist at `proven_at`) stays: `step`'s
/// result, or the error for a vanished key ([`queue::key_gone_error`]) as soon as a delete
/// of it after `proven_at` is seen. Deletes under the name come from the name's watcher
/// (the one the wait used, so usually running with the history needed: no request). If
/// that watcher cannot cover everything after `proven_at`, one read of the key does.
pub(super) async fn while_ours<T>(
    rpc: &Rpc,
    watches: &Watches,
    session: &LeaseState,
    ours: Ours<'_>,
    proven_at: i64,
    step: impl Future<Output = Result<T>>,
) -> Result<T> {
    let mut deletes = watches.subscribe(Spec::prefix(ours.prefix, Only::Deletes), proven_at);
    let mut known = proven_at;
    let mut step = std::pin::pin!(step);
    loop {
        tokio::select! {
            // A delete already delivered wins over a step that ends at the same moment.
            biased;
            delivery = deletes.next() => match delivery {
                Delivery::From { after, .. } if after > known => {
                    // Deletes in (known, after] are not on this watcher: read the key.
                    match still_ours(rpc, session, ours).await? {
                        Some(at) => known = known.max(at),
                        None => return Err(queue::key_gone_error(rpc, session).await),
                    }
                }
                Delivery::Events(batch) => {
                    let gone = batch.iter().any(|event| {
                        event.kind == EventKind::Delete
                            && event.kv.key == ours.key
                            && event.kv.mod_revision > known
                    });
                    if gone {
                        tracing::debug!(key = %text(ours.key), "our key was deleted after the proof");
                        return Err(queue::key_gone_error(rpc, session).await);
                    }
                }
                Delivery::Failed(e) => return Err(e),
                Delivery::From { .. } => {}
            },
            result = &mut step => {
                let value = result?;
                // The watcher may have been down when the step ended (a broken stream,
                // compaction: its deletes not delivered yet). One read says whether the
                // proof still holds now; the step was long (a lock-delay), the read is not.
                return match still_ours(rpc, session, ours).await? {
                    Some(_) => Ok(value),
                    None => Err(queue::key_gone_error(rpc, session).await),
                };
            }
        }
    }
}

/// One read of our key: the read's revision if it still has our create revision.
async fn still_ours(rpc: &Rpc, session: &LeaseState, ours: Ours<'_>) -> Result<Option<i64>> {
    let range = Range::key(ours.key);
    let read = session.retry_while_alive(|| rpc.read(&range)).await?;
    let ours_now = read
        .kvs
        .first()
        .is_some_and(|kv| kv.create_revision == ours.rev);
    Ok(ours_now.then_some(read.revision))
}
