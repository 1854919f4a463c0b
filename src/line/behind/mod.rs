//! The back of a long line.
//!
//! A waiter near its turn (at most [`FRONT`] keys ahead of it must still go) shares the
//! name's one prefix watcher on its client and takes its turn on the delete event, with no
//! read ([`wait_turn`](crate::line::wait::wait_turn)). A waiter further back would be woken
//! by every release of the name for nothing, and with one waiter per process etcd would
//! send every release to every process: N events per handoff, N² to drain a line. So a
//! waiter further back watches one key ahead of it instead, its *lookout*: the key whose
//! delete leaves [`LOOKOUT_LEAVES`] keys ahead of it when the line drains in order (Go's
//! and ZooKeeper's shape, but that many places early, so that it is at the front,
//! watching, before its turn comes). When the lookout goes, it joins the front (one read),
//! or picks the next lookout if keys left out of order. Its own key is watched too, so that
//! a wait whose key is deleted ends at once, as at the front.
//!
//! The lookout is only a wake-up: nobody takes a turn on its event. A waiter holds only by
//! the front's proof (the last key ahead deleted, on a watcher that covers everything since
//! an exact read) or by a read, so this file changes no proof of ownership.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::unbounded_channel;

use crate::client::lease::LeaseState;
use crate::line::mode::Sorted;
use crate::support::error::{Error, Result};
use crate::support::kv::{Range, Txn, TxnOp, TxnOpResponse};
use crate::support::sim::{Mark, Mutation, mark, mutation};
use crate::support::tuning::LineTuning;
use crate::transport::watch::{EventKind, Only};
use crate::transport::watches::{Delivery, Sink, Spec, UNSYNCED_WINDOW, Watches};
use crate::transport::{Retry, Rpc};

/// How many keys ahead may still have to go for a waiter to wait at the front, on the
/// shared prefix watcher, however long the line. A line of up to `FRONT + 1` keys waits
/// there whole: each release then reaches every waiting process of it, and each takes its
/// turn on the event, with no read and no watcher of its own to set up. Chosen by
/// measurement (docs/design/back-of-the-line.md; BENCHMARKS.md, "What was tried and not
/// kept"): waiters at the back of a line of 8 processes lost three quarters of its
/// throughput (1,400 → 360 acquisitions/s), because etcd registers some new watchers
/// *unsynced*, and a lookout's delete then arrives up to 100 ms late, when the whole line
/// may have waited for it. With 8, lines of 12 and 16 processes still handed off at 690 and
/// 730-770 acquisitions/s on etcd 3.4.23 (1,030-1,125 and 1,070-1,085 on 3.7.2); with 16,
/// at 1,205-1,265 and 900-1,165 (1,265-1,310 and 1,130-1,175), etcd spending less CPU per
/// acquisition on 16 events than on a lookout's and a join's watch requests and read.
pub(crate) const FRONT: usize = 16;

/// How many keys ahead are left when a waiter at the back sees its lookout go, if the line
/// drains in order: it then joins the front with that many handoffs to spare. With 2, a
/// release reaches 4 processes whatever the length of the line (the 2 at the front, the
/// waiter whose lookout it was, and the holder), and lines of 64 and 256 processes handed
/// off 20 % and 30 % faster than with 8 (BENCHMARKS.md at `fe26d71`, "Second step").
pub(crate) const LOOKOUT_LEAVES: usize = 2;

/// How far a lookout may be (keys to go, itself included) for its waiter to read it now and
/// then while etcd may still be syncing its watcher ([`UNSYNCED_WINDOW`]). A farther one is
/// read only once, if its watcher started after the revision the waiter read it at, and not
/// at once: see [`gap_read_after`].
const POLL_NEAR: usize = 32;

/// When a lookout further than [`POLL_NEAR`] whose watcher started after what the waiter
/// knew is read, if its delete has not come by then: [`GAP_READ_PER_KEY`] for each key to
/// go, at most [`GAP_READ_MAX`]. Its delete in that gap (before the watcher started) would
/// be out of order (a waiter ahead giving up) and is rare; in order, the lookout goes after
/// `away` handoffs, and its event then makes the read needless: at 64 processes (60 keys
/// away, 1.2 ms a handoff) the read was one of the two per acquisition. A delete in the gap
/// is found by the read, and costs the line at most that wait.
fn gap_read_after(away: usize) -> Duration {
    GAP_READ_PER_KEY
        .saturating_mul(u32::try_from(away).unwrap_or(u32::MAX))
        .min(GAP_READ_MAX)
}

/// See [`gap_read_after`]: twice the slowest handoff measured, with room. It was 4 ms, twice
/// 0.6-1.9 ms; on a slower day (session 20) the 48-process test of `tests/handoff.rs`
/// (a debug build, 48 clients and etcd on 2 cores) moved about a key per 4 ms, and 3 to 132
/// of its 240 gap reads fired before the lookout's delete came (up to 1.88 reads per
/// acquisition, bound 1.5); with 8 ms, none in 4 runs (1.23-1.33).
const GAP_READ_PER_KEY: Duration = Duration::from_millis(8);

/// See [`gap_read_after`]: the longest a line may stall for a lookout deleted in the gap.
const GAP_READ_MAX: Duration = Duration::from_millis(250);

/// How far a lookout must be (keys to go) for its watcher to start right after the revision
/// at which the waiter read it, with no read (`Watches::subscribe_from`): etcd serves such a
/// watcher unsynced at first and may deliver its events up to 100 ms late, but 200 handoffs
/// take longer than that (at 0.6 ms each, faster than any line measured).
const FAR_START: usize = 200;

/// Read interval inside [`UNSYNCED_WINDOW`], at the front (where a late delete may be our
/// turn).
pub(crate) const UNSYNCED_POLL: Duration = Duration::from_millis(15);

/// Read interval of a near lookout inside [`UNSYNCED_WINDOW`]: a late lookout delete costs
/// the line only what is left of this interval after [`LOOKOUT_LEAVES`] handoffs.
const LOOKOUT_POLL: Duration = Duration::from_millis(30);

/// The widths in force for one client: the constants above, unless its builder was given
/// test tuning (`ClientBuilder::line_tuning`, `support/tuning.rs`): the randomized checker
/// and the simulation narrow the front in some processes, so that their short lines also
/// wait at the back, under every fault they inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Widths {
    /// [`FRONT`]: how many keys ahead a waiter at the front may have.
    pub(crate) front: usize,
    /// [`LOOKOUT_LEAVES`], at most [`front`](Self::front).
    pub(crate) leaves: usize,
    /// [`FAR_START`].
    far_start: usize,
    /// [`POLL_NEAR`].
    poll_near: usize,
}

impl Widths {
    /// The library's own widths.
    #[cfg(test)]
    pub(crate) const DEFAULT: Widths = Widths::tuned(LineTuning {
        front: None,
        far_start: None,
        poll_near: None,
    });

    /// The widths of the client behind `rpc`.
    pub(crate) fn of(rpc: &Rpc) -> Widths {
        Widths::tuned(rpc.line_tuning())
    }

    const fn tuned(tuning: LineTuning) -> Widths {
        let front = match tuning.front {
            Some(front) => front,
            None => FRONT,
        };
        Widths {
            front,
            leaves: if front < LOOKOUT_LEAVES {
                front
            } else {
                LOOKOUT_LEAVES
            },
            far_start: match tuning.far_start {
                Some(far) => far,
                None => FAR_START,
            },
            poll_near: match tuning.poll_near {
                Some(near) => near,
                None => POLL_NEAR,
            },
        }
    }
}

/// How many keys ahead must still go before `keys` let a waiter hold: every key that blocks,
/// and the permits beyond the free ones. With weighted permits (`acquire_many`), which
/// permits go first is not known here: the weight in excess counts, at most one per key (so
/// it is exact when every permit weighs 1, and never less than the keys that must go).
pub(crate) fn distance(keys: &Sorted) -> usize {
    let excess = (keys.weight() + 1).saturating_sub(keys.room);
    keys.blocking.len() + excess.min(keys.counted.len())
}

/// The keys a waiter far from its turn watches (see the module's documentation): one of
/// them must go before its turn comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lookout {
    /// Each with its create revision: a key of that name created anew is another key.
    pub(crate) keys: Vec<(Vec<u8>, i64)>,
    /// How many keys must go, oldest first, for the first of them to go: itself and those
    /// before it (for permits: how far the waiter is from its turn).
    pub(crate) away: usize,
}

/// The lookout of a waiter behind `keys`, given the create revision of each of them; `None`
/// when the waiter is close enough to wait at the front.
pub(crate) fn lookout(
    widths: Widths,
    keys: &Sorted,
    created: &HashMap<Vec<u8>, i64>,
) -> Option<Lookout> {
    lookout_within((widths.front, widths.leaves), keys, created)
}

/// [`lookout`] for a front `front` keys wide, and lookouts that leave `leaves` keys ahead.
fn lookout_within(
    (front, leaves): (usize, usize),
    keys: &Sorted,
    created: &HashMap<Vec<u8>, i64>,
) -> Option<Lookout> {
    let distance = distance(keys);
    if distance <= front {
        return None;
    }
    let mut order: Vec<(&Vec<u8>, i64)> = keys
        .keys()
        .map(|key| (key, created.get(key).copied().unwrap_or(i64::MAX)))
        .collect();
    order.sort_by_key(|&(key, rev)| (rev, key.clone()));
    if !keys.counted.is_empty() {
        return permit_lookout(keys, &order, distance);
    }
    for (away, (key, rev)) in order.iter().enumerate() {
        if keys.blocking.len() - (away + 1) <= leaves {
            return Some(Lookout {
                keys: vec![((*key).clone(), *rev)],
                away: away + 1,
            });
        }
    }
    None
}

/// The lookout of a permit `distance` from its turn, behind the permits `order` (oldest
/// first). A permit holds once the permits ahead weigh less than `room` (fewer than `room`
/// of them when each is one permit), and holders release in any order, so no one key's
/// delete must come before its turn. But the newest permits ahead whose weights add up to
/// `room` together do: while they all exist, they alone weigh `room`. So it watches those
/// (at most `room` keys): the first of them goes once it was admitted or gave up, which
/// leaves the waiter closer to its turn, and it reads its place then. A permit behind keys
/// of another mode (a Go mutex on the same name) waits at the front.
fn permit_lookout(keys: &Sorted, order: &[(&Vec<u8>, i64)], distance: usize) -> Option<Lookout> {
    if !keys.blocking.is_empty() || keys.weight() < keys.room {
        return None;
    }
    let mut weight = 0;
    let mut newest = Vec::new();
    for &(key, rev) in order.iter().rev() {
        if weight >= keys.room {
            break;
        }
        weight += keys.counted.get(key).copied().unwrap_or(1) as usize;
        newest.push((key.clone(), rev));
    }
    newest.reverse();
    Some(Lookout {
        keys: newest,
        away: distance,
    })
}

/// Whether `key` still exists with create revision `created` (one single-key read, retried
/// while the session lives).
pub(crate) async fn still_there(
    rpc: &Rpc,
    session: &LeaseState,
    key: &[u8],
    created: i64,
) -> Result<bool> {
    let range = Range::key(key);
    let read = session.retry_while_alive(|| rpc.read(&range)).await?;
    Ok(read
        .kvs
        .first()
        .is_some_and(|kv| kv.create_revision == created))
}

/// Why a wait at the back ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The lookout was deleted: read the line again (the caller does, on the front's watcher).
    LookoutGone,
    /// Our own key was deleted.
    OwnDeleted,
}

/// Whether every one of `keys` still exists with its create revision: one read for all of
/// them (a Txn of single-key ranges, with no compare), retried while the session lives.
async fn all_there(rpc: &Rpc, session: &LeaseState, keys: &[(Vec<u8>, i64)]) -> Result<bool> {
    let txn = Txn::new().and_then(keys.iter().map(|(key, _)| TxnOp::range(Range::key(key))));
    let read = session
        .retry_while_alive(|| rpc.txn(&txn, Retry::Safe))
        .await?;
    let found: Vec<Option<i64>> = read
        .responses
        .iter()
        .map(|op| match op {
            TxnOpResponse::Get(kvs) => kvs.first().map(|kv| kv.create_revision),
            _ => None,
        })
        .collect();
    Ok(found.len() == keys.len()
        && keys
            .iter()
            .zip(found)
            .all(|((_, created), found)| found == Some(*created)))
}

/// Waits until a key of `lookout` is deleted after revision `known` (when they surely still
/// existed), or our `own` key (created at `own_rev`) is, or the session is lost. Every
/// watch is a single key, so this waiter hears of no other release of the name. A far
/// lookout's watcher and our key's start right after `known` (unless one runs already):
/// they cover everything. Otherwise a watcher that starts after `known` (a new one starts
/// from etcd's "now"; one restarted after compaction too) does not cover the revisions in
/// between: one read of its key tells whether it went meanwhile, made only if its delete
/// has not come within [`gap_read_after`]. A read at or after the watcher's start that
/// still finds it, with the create revision it had, leaves nothing uncovered. And a new
/// watcher may be unsynced for a while (etcd delivers its events up to 100 ms late): a near
/// lookout of one key is read now and then until that window has passed.
pub(crate) async fn wait_for_lookout(
    rpc: &Rpc,
    watches: &Watches,
    session: &LeaseState,
    (own, own_rev): (&[u8], i64),
    lookout: &Lookout,
    known: i64,
) -> Result<Woken> {
    const OWN: u64 = u64::MAX;
    let widths = Widths::of(rpc);
    mark(Mark::BackWait);
    let (sender, mut deliveries) = unbounded_channel();
    let far = lookout.away >= widths.far_start;
    let _watching: Vec<_> = lookout
        .keys
        .iter()
        .zip(0u64..)
        .map(|((key, _), tag)| {
            let (spec, sink) = (
                Spec::key(key, Only::Deletes),
                Sink::new(tag, sender.clone()),
            );
            if far {
                watches.subscribe_from(spec, known, sink)
            } else {
                watches.subscribe_to(spec, known, sink)
            }
        })
        .collect();
    let _own = watches.subscribe_from(Spec::key(own, Only::Deletes), known, Sink::new(OWN, sender));
    let near = lookout.keys.len() == 1 && lookout.away <= widths.poll_near;
    let mut poll_until: Option<Instant> = None;
    // When the gap before the watchers' start is to be read, if no delete came first.
    let mut gap_read: Option<Instant> = None;
    // Likewise for our own key's watcher.
    let mut own_read: Option<Instant> = None;
    // Several lookouts (a permit's): their watchers start one by one, and once all have,
    // one read covers what each missed before its start.
    let mut starting = lookout.keys.len();
    let mut latest_start = known;
    loop {
        session.check()?;
        let poll = poll_until.filter(|until| crate::support::clock::now() < *until);
        let gap_due = gap_read.unwrap_or_else(crate::support::clock::now);
        let own_due = own_read.unwrap_or_else(crate::support::clock::now);
        let (tag, delivery) = tokio::select! {
            delivery = deliveries.recv() => delivery.ok_or(Error::Closed)?,
            reason = session.wait_lost() => return Err(Error::SessionLost(reason)),
            _ = tokio::time::sleep(LOOKOUT_POLL), if poll.is_some() => {
                for (key, created) in &lookout.keys {
                        if !still_there(rpc, session, key, *created).await? {
                        return Ok(Woken::LookoutGone);
                    }
                }
                continue;
            }
            _ = tokio::time::sleep_until(gap_due.into()), if gap_read.is_some() => {
                // A read at or after every watcher's start that still finds the keys, with
                // the create revisions they had, leaves nothing uncovered.
                gap_read = None;
                mark(Mark::GapRead);
                let there = match lookout.keys.as_slice() {
                    [(key, created)] => still_there(rpc, session, key, *created).await?,
                    keys => all_there(rpc, session, keys).await?,
                };
                if !there {
                    return Ok(Woken::LookoutGone);
                }
                continue;
            }
            _ = tokio::time::sleep_until(own_due.into()), if own_read.is_some() => {
                own_read = None;
                if !still_there(rpc, session, own, own_rev).await? {
                    return Ok(Woken::OwnDeleted);
                }
                continue;
            }
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
            Delivery::From { after, fresh } if tag != OWN => {
                if fresh && near {
                    // The first of these reads, one interval from now, also covers the
                    // revisions before the watcher started.
                    poll_until = Some(crate::support::clock::now() + UNSYNCED_WINDOW);
                    continue;
                }
                // Deletes in (known, after] are not on this watcher: read the keys once (a
                // key of that name created anew, its session queuing again, is another
                // key: the lookout went), when the last watcher has started, and not at
                // once: their deletes, in order, usually come first and make the read
                // needless ([`gap_read_after`]). A watcher that starts again later (after
                // compaction) has them read again.
                latest_start = latest_start.max(after);
                starting = starting.saturating_sub(1);
                if starting == 0 && latest_start > known && !mutation(Mutation::LookoutGapUnread) {
                    let due = crate::support::clock::now() + gap_read_after(lookout.away);
                    gap_read = Some(gap_read.map_or(due, |pending| pending.min(due)));
                }
            }
            // Our own key's watcher started late (the proxy lost events, or history was
            // compacted while the stream was down): read for a delete of our key in the gap.
            // (A read of the line finds it only once a key ahead goes, and that may stay:
            // a long hold, or the leader's key a hand-over gave to us.)
            Delivery::From { after, .. } if after > known => {
                let due = crate::support::clock::now() + gap_read_after(lookout.away);
                own_read = Some(own_read.map_or(due, |pending| pending.min(due)));
            }
            Delivery::From { .. } => {}
            Delivery::Failed(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
