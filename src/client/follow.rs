//! Guards follow their key: one task per client subscribes, on the client's one watch
//! stream (`transport/watches/`), for every live guard and every line being swept. No thread and
//! no stream per guard.
//!
//! * **Guard**: subscribe to the deletes under its name (the watcher its waiters share),
//!   from the revision that proved the acquire's ownership: at once for a guard that waited
//!   (its name's watcher is pinned and running), after 200 ms for an uncontended one (most
//!   holds are shorter and then cost etcd nothing). If the watcher starts after the proof
//!   revision, one read of the key closes the gap. A delete by anyone (our own cleanup,
//!   `etcdctl del`, a lease revoked elsewhere) ends the hold: `is_held()` turns false and
//!   `lost()` fires, well within a second.
//! * **Sweep**: after an ambiguous enqueue, watch our key for puts. A put there while the
//!   line's local turn is free is the old attempt applied late by a member that held it
//!   (etcd has no idempotency keys): take the local turn and delete it, so it cannot block
//!   the line for the rest of the session.
//!
//! Failover, re-creation after a break and compaction are the watch stream's business: a
//! subscription reports every event after the revision it names, or says where it starts
//! again, and then one read of the key decides. The task itself never waits for etcd: the
//! reads run beside it, so a read that waits for a leader does not hold up the events of
//! every other guard of the client.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::client::lease::LeaseState;
use crate::client::removal::{self, Owned};
use crate::support::error::Result;
use crate::support::kv::{KeyValue, Range, text};
use crate::transport::Rpc;
use crate::transport::kv::Read;
use crate::transport::watch::{Event, EventKind, Only};
use crate::transport::watches::{Delivery, Pin, Sink, Spec, Subscribed, Watches};

/// A guard as the follow task sees it (the ownership core implements it): the task only
/// needs to end it, and to know when it ended by itself.
pub(crate) trait Followed: Send + Sync {
    /// The key is gone, or was re-created with another revision: end the guard.
    fn lose_key(&self);
    fn is_ended(&self) -> bool;
}

/// What to follow.
pub(crate) enum Follow {
    /// End `hold` when `key` (under `prefix`, created at `rev`, known to exist at
    /// `alive_at`) is deleted. `at_once`: subscribe now, not after [`DEFER`] (the guard
    /// waited, so its name's watcher runs already). `own`: follow on the watcher of the
    /// key alone, which its line keeps running (it waited at the back), not the name's.
    Guard {
        prefix: Vec<u8>,
        own: bool,
        key: Vec<u8>,
        rev: i64,
        alive_at: i64,
        at_once: bool,
        hold: Weak<dyn Followed>,
        /// The name's watcher, pinned by the wait that proved the turn so that it keeps
        /// running until this follow subscribed to it (then dropped): the follow joins it
        /// from `alive_at` with no new watcher and no read.
        keep: Option<Pin>,
    },
    /// Delete any key of `session`'s lease that appears at `key` after revision `from - 1`
    /// while `local_turn` is free, until the session ends.
    Sweep {
        key: Vec<u8>,
        from: i64,
        local_turn: Arc<tokio::sync::Mutex<()>>,
        session: Arc<LeaseState>,
    },
}

impl Follow {
    fn key(&self) -> &[u8] {
        match self {
            Follow::Guard { key, .. } | Follow::Sweep { key, .. } => key,
        }
    }

    /// The revision through which the caller knew the state (nothing to watch before it).
    fn known_through(&self) -> i64 {
        match self {
            Follow::Guard { alive_at, .. } => *alive_at,
            Follow::Sweep { from, .. } => from - 1,
        }
    }

    /// Whether `self` and `other` sweep the same line: one sweep per line is enough, since
    /// it watches until the session ends.
    fn same_sweep(&self, other: &Follow) -> bool {
        match (self, other) {
            (
                Follow::Sweep { key, session, .. },
                Follow::Sweep {
                    key: other_key,
                    session: other_session,
                    ..
                },
            ) => key == other_key && Arc::ptr_eq(session, other_session),
            _ => false,
        }
    }

    /// Whether there is still something to follow.
    fn is_live(&self) -> bool {
        match self {
            Follow::Guard { hold, .. } => hold.upgrade().is_some_and(|h| !h.is_ended()),
            Follow::Sweep { session, .. } => session.loss_reason().is_none(),
        }
    }

    fn spec(&self) -> Spec {
        match self {
            // Deletes only: a put with our create revision is a proclamation.
            Follow::Guard { own: true, key, .. } => Spec::key(key, Only::Deletes),
            Follow::Guard { prefix, .. } => Spec::prefix(prefix, Only::Deletes),
            Follow::Sweep { key, .. } => Spec::key(key, Only::Puts),
        }
    }
}

/// The client's handle on the follow task: cheap to clone, started on first use.
#[derive(Clone)]
pub(crate) struct Follower {
    commands: UnboundedSender<Follow>,
}

impl Follower {
    /// Starts the task on the runtime of `handle`.
    pub(crate) fn start(handle: &tokio::runtime::Handle, rpc: Rpc, watches: Watches) -> Follower {
        let (commands, receiver) = unbounded_channel();
        drop(handle.spawn(run(rpc, watches, receiver)));
        Follower { commands }
    }

    pub(crate) fn follow(&self, what: Follow) {
        // Fails only once the runtime is shutting down: nothing is left to follow then.
        let _ = self.commands.send(what);
    }
}

/// One thing followed, with its subscription.
struct Entry {
    what: Follow,
    /// Everything up to this revision is settled: events at or before it are old news.
    known: i64,
    /// A gap before the subscription's start that a read must still close. Read off the
    /// task, while events keep coming; a failed read (no leader, a learner, every member
    /// down) is tried again every [`TICK`] until one answers. Giving up on it once lost a
    /// deletion in the gap, and the guard said "held" until its release (found by the
    /// simulation, issue 29).
    unread: bool,
    /// How many gaps opened: a read closes the gaps opened before it started.
    gaps: u64,
    /// A read of the key is on its way.
    reading: bool,
    /// The last read failed: the next one waits for the next tick.
    failed: bool,
    _subscribed: Subscribed,
}

impl Entry {
    /// Whether a read of its gap is to start now (not one that failed: that waits for
    /// the next tick).
    fn wants_read(&self) -> bool {
        self.unread && !self.reading && !self.failed
    }
}

/// The answer to a read of an entry's key: its tag, its gaps when the read started, and
/// what the read found.
type ReadDone = (u64, u64, Result<Read>);

/// How many reads of followed keys may be on their way at once (after a failover with
/// compaction every guard of the client reads its gap).
const READS_IN_FLIGHT: usize = 8;

/// How often the task drops ended guards (and so their subscriptions), while it follows
/// anything: a client that follows nothing has no timer to wake it.
const TICK: Duration = Duration::from_millis(250);

/// How long a guard is held before it subscribes. Most holds are shorter and then cost
/// etcd nothing; a deletion in the meantime is found by the read that closes the gap when
/// the subscription starts after it, so it is still reported well within a second.
const DEFER: Duration = Duration::from_millis(200);

/// Commands waiting for their time, oldest first.
#[derive(Default)]
struct Deferred(VecDeque<(Instant, Follow)>);

impl Deferred {
    /// Queues a guard that subscribes after [`DEFER`] (every one waits as long, so the queue
    /// stays in order of due time).
    fn push(&mut self, what: Follow) {
        self.0
            .push_back((crate::support::clock::now() + DEFER, what));
    }

    /// When the next one is due (far away when there is none).
    fn next_due(&self) -> Instant {
        self.0.front().map_or_else(
            || crate::support::clock::now() + Duration::from_secs(3600),
            |(due, _)| *due,
        )
    }

    /// The due ones that still have something to follow.
    fn take_due(&mut self) -> Vec<Follow> {
        let now = crate::support::clock::now();
        let mut due = Vec::new();
        while let Some((at, _)) = self.0.front()
            && *at <= now
        {
            if let Some((_, what)) = self.0.pop_front()
                && what.is_live()
            {
                due.push(what);
            }
        }
        due
    }
}

async fn run(rpc: Rpc, watches: Watches, mut commands: UnboundedReceiver<Follow>) {
    let mut entries: BTreeMap<u64, Entry> = BTreeMap::new();
    let mut deferred = Deferred::default();
    let mut next_tag = 0u64;
    let (delivered, mut deliveries) = unbounded_channel();
    let (read_done, mut reads) = unbounded_channel::<ReadDone>();
    let mut in_flight = 0usize;
    let mut prune = tokio::time::interval(TICK);
    // Not polled while nothing is followed; the ticks missed meanwhile are skipped.
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // Nothing here awaits etcd: a read waiting for a leader must not hold up the events
    // of every other guard (a delete is news within a second, rule 2).
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                Some(what) => {
                    if let Some(now) = accept(&entries, &mut deferred, what) {
                        next_tag += 1;
                        let sink = Sink::new(next_tag, delivered.clone());
                        entries.insert(next_tag, subscribe(&watches, now, sink));
                    }
                }
                None => return, // the client is gone
            },
            _ = tokio::time::sleep_until(deferred.next_due().into()) => {
                for what in deferred.take_due() {
                    next_tag += 1;
                    let sink = Sink::new(next_tag, delivered.clone());
                    entries.insert(next_tag, subscribe(&watches, what, sink));
                }
            }
            delivery = deliveries.recv() => {
                let Some((tag, delivery)) = delivery else { return };
                let Some(entry) = entries.get_mut(&tag) else { continue };
                if !deliver(&rpc, entry, delivery) {
                    entries.remove(&tag);
                } else if entry.wants_read() {
                    start_reads(&rpc, &read_done, &mut entries, &mut in_flight, false);
                }
            }
            done = reads.recv() => {
                let Some((tag, gaps, read)) = done else { return };
                let was_full = in_flight >= READS_IN_FLIGHT;
                in_flight = in_flight.saturating_sub(1);
                if let Some(entry) = entries.get_mut(&tag)
                    && !settle(&rpc, entry, gaps, read)
                {
                    entries.remove(&tag);
                }
                if was_full || entries.get(&tag).is_some_and(Entry::wants_read) {
                    start_reads(&rpc, &read_done, &mut entries, &mut in_flight, false);
                }
            }
            _ = prune.tick(), if !entries.is_empty() => {
                entries.retain(|_, entry| entry.what.is_live());
                start_reads(&rpc, &read_done, &mut entries, &mut in_flight, true);
            }
        }
    }
}

/// Starts reads of the keys whose gap is still unread (see [`Entry::unread`]), oldest
/// first, up to [`READS_IN_FLIGHT`]. A gap whose read failed waits for the next tick
/// (`retry`): the cluster could not answer a moment ago.
fn start_reads(
    rpc: &Rpc,
    done: &UnboundedSender<ReadDone>,
    entries: &mut BTreeMap<u64, Entry>,
    in_flight: &mut usize,
    retry: bool,
) {
    for (tag, entry) in entries.iter_mut() {
        if *in_flight >= READS_IN_FLIGHT {
            return;
        }
        if !(entry.wants_read() || retry && entry.unread && !entry.reading) {
            continue;
        }
        entry.reading = true;
        *in_flight += 1;
        let (rpc, done, tag, gaps) = (rpc.clone(), done.clone(), *tag, entry.gaps);
        let key = entry.what.key().to_vec();
        drop(tokio::spawn(async move {
            let read = rpc.read(&Range::key(&key)).await;
            let _ = done.send((tag, gaps, read));
        }));
    }
}

/// Subscribes for `what`, from the revision through which it is known.
fn subscribe(watches: &Watches, mut what: Follow, sink: Sink) -> Entry {
    let known = what.known_through();
    let keep = match &mut what {
        Follow::Guard { keep, .. } => keep.take(),
        Follow::Sweep { .. } => None,
    };
    let subscribed = watches.subscribe_to(what.spec(), known, sink);
    // Unpinned only now: the hub takes commands in order, so the watcher never stopped.
    drop(keep);
    Entry {
        known,
        what,
        unread: false,
        gaps: 0,
        reading: false,
        failed: false,
        _subscribed: subscribed,
    }
}

/// Drops `what` if an equal sweep already runs; queues a guard that is to wait [`DEFER`];
/// returns what is to be subscribed now (a sweep, a guard that waited for its turn).
fn accept(entries: &BTreeMap<u64, Entry>, deferred: &mut Deferred, what: Follow) -> Option<Follow> {
    match what {
        Follow::Guard { at_once: false, .. } => {
            deferred.push(what);
            None
        }
        Follow::Guard { at_once: true, .. } => Some(what),
        // Only sweeps can be duplicates; guards (the many) are taken without a scan.
        Follow::Sweep { .. } => {
            let duplicate = entries
                .values()
                .any(|e| e.what.same_sweep(&what) && e.what.is_live());
            (!duplicate).then_some(what)
        }
    }
}

/// Handles one delivery; false when there is nothing left to follow.
fn deliver(rpc: &Rpc, entry: &mut Entry, delivery: Delivery) -> bool {
    match delivery {
        Delivery::From { after, .. } => {
            if after > entry.known {
                // The subscription starts after what the caller knew: one read of the key
                // closes the gap. Every event that comes counts meanwhile (`known` stays:
                // after a watcher etcd may have registered unsynced, the event at `after`
                // may still come).
                entry.unread = true;
                entry.gaps += 1;
            }
            true
        }
        Delivery::Events(batch) => {
            let known = entry.known;
            for event in batch.iter().filter(|e| e.kv.mod_revision > known) {
                if event.kv.key == entry.what.key() && !handle_event(rpc, &entry.what, event) {
                    return false;
                }
            }
            true
        }
        Delivery::Failed(e) => {
            tracing::warn!(key = %text(entry.what.key()), error = %e, "etcd refused to watch a followed key");
            false
        }
    }
}

/// Handles the answer to a read of the entry's key; false when there is nothing left to
/// follow.
fn settle(rpc: &Rpc, entry: &mut Entry, gaps: u64, read: Result<Read>) -> bool {
    entry.reading = false;
    let read = match read {
        Ok(read) => read,
        Err(e) => {
            // The gap is read again at the next tick.
            tracing::warn!(key = %text(entry.what.key()), error = %e, "could not read a followed key; reading again");
            entry.failed = true;
            return true;
        }
    };
    entry.failed = false;
    tracing::debug!(key = %text(entry.what.key()), at = read.revision, "followed key read");
    if !decide(rpc, &entry.what, read.kvs.into_iter().next()) {
        return false;
    }
    entry.known = entry.known.max(read.revision);
    // A read that started before a later gap opened does not close that one.
    if gaps == entry.gaps {
        entry.unread = false;
    }
    true
}

/// Handles an event on the followed key; false when the guard ended.
fn handle_event(rpc: &Rpc, what: &Follow, event: &Event) -> bool {
    let kv = &event.kv;
    let is_delete = event.kind == EventKind::Delete;
    match what {
        Follow::Guard { rev, hold, .. } => {
            if is_delete && kv.mod_revision > *rev {
                if let Some(hold) = hold.upgrade()
                    && !hold.is_ended()
                {
                    tracing::warn!(key = %text(&kv.key), fencing_token = rev, "our key was deleted: the guard is lost");
                    hold.lose_key();
                }
                return false;
            }
        }
        Follow::Sweep {
            key,
            local_turn,
            session,
            ..
        } => {
            if !is_delete && kv.lease == session.id() {
                let late = (key.clone(), kv.create_revision);
                spawn_sweep(rpc.clone(), late, local_turn.clone(), session.clone());
            }
        }
    }
    true
}

/// Takes the line's local turn (so no guard or waiter of ours uses the key) and deletes the
/// late-applied attempt: the key of our lease with the create revision it was seen with
/// (a copy of this delete applied late can then never take a newer key of ours). The local
/// turn is held until a removal is answered: an unanswered one may still apply, and a
/// campaign of ours that took the local turn meanwhile would adopt the key it is about to
/// delete (found by the simulation, issue 29).
fn spawn_sweep(
    rpc: Rpc,
    (key, created): (Vec<u8>, i64),
    local_turn: Arc<tokio::sync::Mutex<()>>,
    session: Arc<LeaseState>,
) {
    drop(tokio::spawn(async move {
        let _turn = local_turn.lock_owned().await;
        loop {
            if session.loss_reason().is_some() {
                return;
            }
            // Still on our lease: a key of ours handed over to a successor keeps its
            // create revision, and is the successor's.
            let owned = Owned::Leased(created, session.id());
            match removal::remove(&rpc, &key, owned).await {
                Ok(removed) => {
                    if removed {
                        tracing::warn!(key = %text(&key), "removed a late-applied enqueue");
                    }
                    return;
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!(key = %text(&key), error = %e, "sweep not answered; retrying");
                    tokio::time::sleep(SWEEP_RETRY).await;
                }
                Err(_) => return,
            }
        }
    }));
}

/// The pause between attempts of a sweep's removal.
const SWEEP_RETRY: Duration = Duration::from_millis(100);

/// Decides on what a read of the key found, for a watcher that cannot cover a stretch of
/// history (compacted, or created after writes we did not see): a guard whose key is gone
/// (or re-created) is lost; a swept line with a key of ours gets swept. False when there
/// is nothing left to follow.
fn decide(rpc: &Rpc, what: &Follow, current: Option<KeyValue>) -> bool {
    match what {
        Follow::Guard { rev, hold, .. } => {
            if current.as_ref().map(|kv| kv.create_revision) != Some(*rev) {
                if let Some(hold) = hold.upgrade() {
                    hold.lose_key();
                }
                return false;
            }
        }
        Follow::Sweep {
            key,
            local_turn,
            session,
            ..
        } => {
            if let Some(kv) = current.filter(|kv| kv.lease == session.id()) {
                let late = (key.clone(), kv.create_revision);
                spawn_sweep(rpc.clone(), late, local_turn.clone(), session.clone());
            }
        }
    }
    true
}
