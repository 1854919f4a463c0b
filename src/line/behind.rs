//! The back of a long line.
//!
//! A waiter near its turn (at most [`FRONT`] keys ahead of it must still go) shares the
//! name's one prefix watcher on its client and takes its turn on the delete event, with no
//! read ([`wait_turn`](crate::line::wait::wait_turn)). A waiter further back would be woken
//! by every release of the name for nothing, and with one waiter per process etcd would
//! send every release to every process: N events per handoff, N² to drain a line. So a
//! waiter further back watches one key ahead of it instead, its *lookout*: the key whose
//! delete brings it within [`FRONT`] of its turn when the line drains in order (Go's and
//! ZooKeeper's shape, but [`FRONT`] places early, so that it is at the front, watching,
//! before its turn comes). When the lookout goes, it joins the front (one read), or picks
//! the next lookout if keys left out of order. Its own key is watched too, so that a wait
//! whose key is deleted ends at once, as at the front.
//!
//! The lookout is only a wake-up: nobody takes a turn on its event. A waiter holds only by
//! the front's proof (the last key ahead deleted, on a watcher that covers everything since
//! an exact read) or by a read, so this file changes no proof of ownership.

use std::collections::HashMap;

use tokio::sync::mpsc::unbounded_channel;

use crate::client::lease::LeaseState;
use crate::line::mode::Sorted;
use crate::support::error::{Error, Result};
use crate::support::kv::Range;
use crate::transport::Rpc;
use crate::transport::watch::{EventKind, Only};
use crate::transport::watches::{Delivery, Sink, Spec, Watches};

/// How many keys ahead may still have to go for a waiter to wait at the front, on the
/// shared prefix watcher. A release then reaches at most this many waiting processes (plus
/// the one whose lookout it was, and the holder), whatever the length of the line; and a
/// waiter joins the front this many handoffs before its turn, so that its read is done
/// before the turn comes. Chosen by measurement (BENCHMARKS.md, "Handoff cost and the
/// length of the line"): with 2 or 4, lines of 8 processes lost half their throughput to
/// lookout watchers that etcd registered unsynced (up to 100 ms late) shortly before their
/// key went; with 8, a line of up to 9 keys waits exactly as before.
pub(crate) const FRONT: usize = 8;

/// The front's width in force: [`FRONT`]; with the `testing` feature, the value of the
/// environment variable `ETCD_SYNC_FRONT` if it is set, read once (the randomized checker
/// sets it in some worker processes, so that its short lines also wait at the back, under
/// every fault it injects).
pub(crate) fn front() -> usize {
    #[cfg(feature = "testing")]
    {
        static OVERRIDE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *OVERRIDE.get_or_init(|| {
            std::env::var("ETCD_SYNC_FRONT")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(FRONT)
        })
    }
    #[cfg(not(feature = "testing"))]
    FRONT
}

/// How many keys ahead must still go before `keys` let a waiter hold: every key that blocks,
/// and the permits beyond the free ones.
pub(crate) fn distance(keys: &Sorted) -> usize {
    keys.blocking.len() + (keys.counted.len() + 1).saturating_sub(keys.room)
}

/// The lookout of a waiter behind `keys`, given the create revision of each of them: the
/// key whose delete, when the keys go oldest first, brings the waiter within [`FRONT`] of its
/// turn. `None` when the waiter is that close already (it waits at the front).
pub(crate) fn lookout(keys: &Sorted, created: &HashMap<Vec<u8>, i64>) -> Option<(Vec<u8>, i64)> {
    lookout_within(front(), keys, created)
}

/// [`lookout`] for a front `front` keys wide.
fn lookout_within(
    front: usize,
    keys: &Sorted,
    created: &HashMap<Vec<u8>, i64>,
) -> Option<(Vec<u8>, i64)> {
    // A permit's turn comes when enough of the permits ahead go, whichever they are:
    // holders release in any order, so no one key's delete can tell a permit it is near.
    // Permits wait at the front (issue 28 leaves the semaphore's herd for a later step).
    if !keys.counted.is_empty() || distance(keys) <= front {
        return None;
    }
    let mut order: Vec<(&Vec<u8>, i64)> = keys
        .keys()
        .map(|key| (key, created.get(key).copied().unwrap_or(i64::MAX)))
        .collect();
    order.sort_by_key(|&(key, rev)| (rev, key.clone()));
    let mut blocking = keys.blocking.len();
    let mut counted = keys.counted.len();
    for (key, rev) in order {
        if keys.blocking.contains(key) {
            blocking -= 1;
        } else {
            counted -= 1;
        }
        if blocking + (counted + 1).saturating_sub(keys.room) <= front {
            return Some((key.clone(), rev));
        }
    }
    None
}

/// Why a wait at the back ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The lookout was deleted: read the line again (the caller does, on the front's watcher).
    LookoutGone,
    /// Our own key was deleted.
    OwnDeleted,
}

/// Waits until `lookout` (created at revision `lookout_rev`) is deleted after revision
/// `known` (when it surely still existed),
/// or our `own` key is, or the session is lost. Both watches are single keys, so this
/// waiter hears of no other release of the name.
///
/// A watcher that starts after `known` (a new one starts from etcd's "now"; one restarted
/// after compaction too) does not cover the revisions in between: one read of the lookout
/// key tells whether it went meanwhile. A read at or after the watcher's start that still
/// finds it, with the create revision it had, leaves nothing uncovered.
pub(crate) async fn wait_for_lookout(
    rpc: &Rpc,
    watches: &Watches,
    session: &LeaseState,
    own: &[u8],
    (lookout, lookout_rev): (&[u8], i64),
    known: i64,
) -> Result<Woken> {
    const LOOKOUT: u64 = 0;
    const OWN: u64 = 1;
    let (sender, mut deliveries) = unbounded_channel();
    let _lookout = watches.subscribe_to(
        Spec::key(lookout, Only::Deletes),
        known,
        Sink::new(LOOKOUT, sender.clone()),
    );
    let _own = watches.subscribe_to(Spec::key(own, Only::Deletes), known, Sink::new(OWN, sender));
    loop {
        session.check()?;
        let (tag, delivery) = tokio::select! {
            delivery = deliveries.recv() => delivery.ok_or(Error::Closed)?,
            reason = session.wait_lost() => return Err(Error::SessionLost(reason)),
        };
        match delivery {
            Delivery::Events(batch) => {
                let deleted = batch
                    .iter()
                    .any(|e| e.kind == EventKind::Delete && e.kv.mod_revision > known);
                match (deleted, tag) {
                    (true, OWN) => return Ok(Woken::OwnDeleted),
                    (true, _) => return Ok(Woken::LookoutGone),
                    (false, _) => {}
                }
            }
            Delivery::From { after, .. } if after > known && tag == LOOKOUT => {
                // Deletes in (known, after] are not on this watcher: read the key once.
                let range = Range::key(lookout);
                let read = session.retry_while_alive(|| rpc.read(&range)).await?;
                // A key of that name created anew (its session queued again) is another
                // key: the lookout went.
                if read.kvs.first().map(|kv| kv.create_revision) != Some(lookout_rev) {
                    return Ok(Woken::LookoutGone);
                }
            }
            // Our own key's watcher starting late leaves a gap we do not read for: a delete
            // of our key there is found by the next read of the line, as at the front.
            Delivery::From { .. } => {}
            Delivery::Failed(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::line::mode::Mode;

    /// The keys ahead, oldest first, created at revisions 10, 11, ...
    fn sorted(mode: Mode, keys: &[String]) -> (Sorted, HashMap<Vec<u8>, i64>) {
        let created = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.as_bytes().to_vec(), i as i64 + 10))
            .collect();
        let keys = keys.iter().map(|k| k.as_bytes().to_vec());
        (mode.sort(b"p/", keys).expect("one semaphore size"), created)
    }

    /// `n` key names under `p/`, in creation order, with `suffix`.
    fn names(n: usize, suffix: &str) -> Vec<String> {
        (0..n).map(|i| format!("p/{i:03x}{suffix}")).collect()
    }

    #[test]
    fn a_waiter_close_to_its_turn_has_no_lookout() {
        let (keys, created) = sorted(Mode::Exclusive, &names(FRONT, ""));
        assert_eq!(distance(&keys), FRONT);
        assert_eq!(lookout_within(FRONT, &keys, &created), None);
    }

    #[test]
    fn an_exclusive_waiter_watches_the_key_whose_delete_brings_it_to_the_front() {
        // FRONT + 3 keys ahead: once the three oldest are gone, FRONT remain.
        let line = names(FRONT + 3, "");
        let (keys, created) = sorted(Mode::Exclusive, &line);
        assert_eq!(distance(&keys), FRONT + 3);
        assert_eq!(
            lookout_within(FRONT, &keys, &created),
            Some((line[2].clone().into_bytes(), 12))
        );
    }

    #[test]
    fn a_permit_waits_at_the_front_however_far_it_is() {
        // A semaphore of 2 with FRONT + 4 older permits: FRONT + 3 must go before we hold,
        // but any of them may, so no lookout could tell (a lookout on the oldest once
        // waited forever while a younger permit was released: tests/semaphore.rs with
        // ETCD_SYNC_FRONT=0).
        let line = names(FRONT + 4, ".permits-2");
        let (keys, created) = sorted(Mode::Permits(2), &line);
        assert_eq!(distance(&keys), FRONT + 3);
        assert_eq!(lookout_within(FRONT, &keys, &created), None);
        assert_eq!(lookout_within(0, &keys, &created), None);
    }

    #[test]
    fn with_no_front_every_waiter_watches_the_last_key_that_blocks_it() {
        let line = names(3, "");
        let (keys, created) = sorted(Mode::Exclusive, &line);
        assert_eq!(
            lookout_within(0, &keys, &created),
            Some((line[2].clone().into_bytes(), 12))
        );
    }

    #[test]
    fn a_reader_ignores_the_readers_ahead_of_it() {
        // Writers and readers alternate: only the FRONT + 3 writers count.
        let line: Vec<String> = (0..2 * (FRONT + 3))
            .map(|i| format!("p/{i:03x}{}", if i % 2 == 1 { ".shared" } else { "" }))
            .collect();
        let (keys, created) = sorted(Mode::Shared, &line);
        assert_eq!(distance(&keys), FRONT + 3);
        // The third writer is the fifth key.
        assert_eq!(
            lookout_within(FRONT, &keys, &created),
            Some((line[4].clone().into_bytes(), 14))
        );
    }
}
