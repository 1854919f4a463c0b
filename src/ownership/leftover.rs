//! Keys of our own lease in another mode, ahead of ours, that nothing in this process uses:
//! leftovers of an earlier life of the lease (a process that resumed it after a restart,
//! and finds the write key of an enqueue that etcd applied after the old process gave up
//! on it). A reader of that session would wait behind its own stale writer key, and so
//! would everyone else, for as long as the resumed session lives.
//!
//! Such a key is ours to remove only while no guard, waiter or cleanup of this process
//! uses it: we take its line's local turn (never wait for it) and find no live hold, and
//! then remove it by the create revision we read (`removal::remove_if_leased`). The waiter
//! that found it crosses it off when its delete arrives, like any key ahead.
//!
//! A key of our lease on our own place (found by the enqueue: `join`) is removed at once,
//! as [`remove_found`] does, before we join again with a fresh create revision.

use std::sync::Arc;
use std::time::Duration;

use super::Place;
use crate::client::removal::{self, Owned};
use crate::line::mode::Mode;
use crate::support::backoff::Backoff;
use crate::support::error::Result;
use crate::transport::Rpc;

/// Removes, in the background, every key of `keys` (ahead of `line`'s own, or of our
/// lease wherever it is: `Enqueued::leased`) that has our lease in another mode and no
/// user in this process.
pub(super) fn remove_unused<'k>(line: &Arc<Place>, keys: impl IntoIterator<Item = &'k Vec<u8>>) {
    let lease = line.session.lease_id();
    let mut seen = std::collections::BTreeSet::new();
    for key in keys {
        if !seen.insert(key) {
            continue;
        }
        let Some(mode) = Mode::of_key(&line.prefix, key) else {
            continue;
        };
        if mode == line.mode || Mode::lease_of(&line.prefix, key) != Some(lease) {
            continue;
        }
        let Ok(other) = Place::of(&line.session, &line.name, mode) else {
            continue;
        };
        // Busy (a waiter, a guard, a release or cleanup running): it is in use.
        let Ok(local_turn) = other.local_turn.clone().try_lock_owned() else {
            continue;
        };
        if other.live_hold().is_some() {
            continue;
        }
        tracing::info!(key = %crate::support::kv::text(key), "removing a leftover key of our lease");
        let rpc = line.session.client().rpc().clone();
        let session = line.session.lease().clone();
        let key = key.clone();
        line.session.client().spawn(async move {
            loop {
                match removal::remove_if_leased(&rpc, &key, lease).await {
                    Err(e) if e.is_transient() && session.loss_reason().is_none() => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    _ => break,
                }
            }
            drop(local_turn);
            drop(other);
        });
    }
}

/// Removes a key of ours that a join found (by its create revision, so sending it again
/// is safe). A blocking wait rides out an election and transport failures here as the
/// enqueue does (its caller's limit, token and session bound it); `try_*` fails at once.
pub(super) async fn remove_found(rpc: &Rpc, key: &[u8], rev: i64, patient: bool) -> Result<bool> {
    let mut backoff = Backoff::quick();
    loop {
        match removal::remove(rpc, key, Owned::Revision(rev)).await {
            Err(e) if patient && (e.is_refused_unhandled() || e.is_transient()) => {
                tracing::debug!(error = %e, "removal of a key found at join failed; retrying");
                backoff.sleep().await;
            }
            other => return other,
        }
    }
}
