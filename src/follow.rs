//! Guards follow their key: one watch stream per client, multiplexing one watcher per live
//! guard (and per line being swept), run by one task on the client's runtime. No thread
//! and no stream per guard.
//!
//! * **Guard**: once a guard has been held for 200 ms (most holds are shorter and cost etcd
//!   nothing), watch its key for deletes from *now*. If etcd's "now" at creation is later
//!   than the revision at which the caller last saw the key, one read of the key closes
//!   the gap. A delete by anyone (our own cleanup, `etcdctl del`, a lease revoked
//!   elsewhere) ends the hold: `is_held()` turns false and `lost()` fires, well within a
//!   second.
//! * **Sweep**: after an ambiguous enqueue, watch our key for puts. A put there while the
//!   line's turn is free is the old attempt applied late by a member that held it (etcd
//!   has no idempotency keys): take the turn and delete it, so it cannot block the line
//!   for the rest of the session.
//!
//! The stream follows the client's current endpoint (a frozen member sends nothing), and
//! after a break every watcher is re-created from the revision after the last one it saw;
//! if that was compacted, one read of the key decides instead.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::backoff::Backoff;
use crate::error::Result;
use crate::kv::Range;
use crate::kv::text;
use crate::lease::LeaseState;
use crate::queue::{self, Owned};
use crate::transport::Rpc;
use crate::transport::watch::{Event, EventKind, Only, Watch, WatchStream};

/// A guard as the follow task sees it (the ownership core implements it): the task only
/// needs to end it, and to know when it ended by itself.
pub(crate) trait Followed: Send + Sync {
    /// The key is gone, or was re-created with another revision: end the guard.
    fn lose_key(&self);
    fn is_ended(&self) -> bool;
}

/// What to follow.
pub(crate) enum Follow {
    /// End `hold` when `key` (created at `rev`, known to exist at `alive_at`) is deleted.
    Guard {
        key: Vec<u8>,
        rev: i64,
        alive_at: i64,
        hold: Weak<dyn Followed>,
    },
    /// Delete any key of `session`'s lease that appears at `key` after revision `from - 1`
    /// while `turn` is free, until the session ends.
    Sweep {
        key: Vec<u8>,
        from: i64,
        turn: Arc<tokio::sync::Mutex<()>>,
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

    fn create(&self, from: i64) -> Watch {
        match self {
            // Deletes only: a put with our create revision is a proclamation.
            Follow::Guard { key, .. } => Watch::key(key, from, Only::Deletes),
            Follow::Sweep { key, .. } => Watch::key(key, from, Only::Puts),
        }
    }
}

/// The client's handle on the follow task: cheap to clone, started on first use.
#[derive(Clone)]
pub(crate) struct Follower {
    commands: UnboundedSender<Follow>,
}

impl Follower {
    /// Starts the task on the current runtime (call from inside it, or with a handle).
    pub(crate) fn start(handle: &tokio::runtime::Handle, rpc: Rpc) -> Follower {
        let (commands, receiver) = unbounded_channel();
        drop(handle.spawn(run(rpc, receiver)));
        Follower { commands }
    }

    pub(crate) fn follow(&self, what: Follow) {
        // Fails only once the runtime is shutting down: nothing is left to follow then.
        let _ = self.commands.send(what);
    }
}

struct Entry {
    what: Follow,
    /// Where a re-created watcher starts: the revision after the last one seen.
    from: i64,
}

/// How often the task prunes ended guards and checks that its stream is on the endpoint
/// the client uses.
const TICK: Duration = Duration::from_millis(250);

/// How long a guard is held before its key gets a watcher. Most holds are shorter and
/// then cost etcd nothing; a deletion in the meantime is found by the read that closes the
/// gap when the watcher is created, so it is still reported well within a second.
const DEFER: Duration = Duration::from_millis(200);

/// Commands waiting for their time, oldest first.
#[derive(Default)]
struct Deferred(VecDeque<(Instant, Follow)>);

impl Deferred {
    fn push(&mut self, what: Follow) {
        let due = match what {
            Follow::Guard { .. } => Instant::now() + DEFER,
            Follow::Sweep { .. } => Instant::now(),
        };
        self.0.push_back((due, what));
    }

    /// When the next one is due (far away when there is none).
    fn next_due(&self) -> Instant {
        self.0.front().map_or_else(
            || Instant::now() + Duration::from_secs(3600),
            |(due, _)| *due,
        )
    }

    /// The due ones that still have something to follow.
    fn take_due(&mut self) -> Vec<Follow> {
        let now = Instant::now();
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

async fn run(rpc: Rpc, mut commands: UnboundedReceiver<Follow>) {
    let mut entries: HashMap<u64, Entry> = HashMap::new();
    let mut deferred = Deferred::default();
    let mut next_local = 0u64;
    let mut backoff = Backoff::quick();
    loop {
        entries.retain(|_, entry| entry.what.is_live());
        if entries.is_empty() {
            // A stream needs a first watcher (etcd answers headers with the first
            // response), so an idle client keeps none.
            tokio::select! {
                command = commands.recv() => match command {
                    Some(what) => accept(&entries, &mut deferred, what),
                    None => return, // the client is gone
                },
                _ = tokio::time::sleep_until(deferred.next_due().into()) => {
                    for what in deferred.take_due() {
                        let entry = Entry { from: what.known_through() + 1, what };
                        entries.insert(next_local, entry);
                        next_local += 1;
                    }
                }
            }
            continue;
        }
        let stream = Stream {
            entries: &mut entries,
            deferred: &mut deferred,
            next_local: &mut next_local,
        };
        match stream.follow(&rpc, &mut commands).await {
            Ok(Closed::Commands) => return,
            Ok(Closed::Stream) => backoff.reset(),
            Err(e) => {
                tracing::debug!(error = %e, "follow stream failed; reopening");
                backoff.sleep().await;
            }
        }
    }
}

/// Queues `what` unless an equal sweep already runs or waits.
fn accept(entries: &HashMap<u64, Entry>, deferred: &mut Deferred, what: Follow) {
    let duplicate = entries
        .values()
        .any(|e| e.what.is_live() && e.what.same_sweep(&what))
        || deferred
            .0
            .iter()
            .any(|(_, queued)| queued.same_sweep(&what));
    if !duplicate {
        deferred.push(what);
    }
}

/// The task's state while a stream runs.
struct Stream<'a> {
    entries: &'a mut HashMap<u64, Entry>,
    deferred: &'a mut Deferred,
    next_local: &'a mut u64,
}

enum Closed {
    /// The stream went stale, or a watcher must start elsewhere: open again.
    Stream,
    /// The client is gone.
    Commands,
}

impl Stream<'_> {
    /// Runs one stream until it breaks or goes stale. Watchers for new entries start from
    /// *now* (synced: cheap for etcd); the gap between what the caller knew and etcd's
    /// "now" at creation is closed by one read, only when a write happened in it.
    async fn follow(self, rpc: &Rpc, commands: &mut UnboundedReceiver<Follow>) -> Result<Closed> {
        let Stream {
            entries,
            deferred,
            next_local,
        } = self;
        let order: Vec<u64> = entries.keys().copied().collect();
        let creates = order
            .iter()
            .map(|local| {
                let entry = &entries[local];
                entry.what.create(entry.from)
            })
            .collect();
        let (mut watch, created, _) = WatchStream::open_tolerant(rpc, creates).await?;
        let mut by_id: HashMap<i64, u64> = HashMap::new();
        let mut refused = Vec::new();
        for (local, id) in order.into_iter().zip(created.ids) {
            match id {
                Some(id) => {
                    by_id.insert(id, local);
                }
                None => refused.push(local),
            }
        }
        // Watchers whose start was compacted away: one read decides for them.
        let mut reopen = false;
        for local in refused {
            if let Some(mut entry) = entries.remove(&local)
                && let Some(revision) = settle_by_reading(rpc, &entry.what).await?
            {
                entry.from = revision + 1;
                entries.insert(local, entry);
                reopen = true;
            }
        }
        if reopen {
            return Ok(Closed::Stream);
        }
        // New entries waiting for their `created` answer (etcd answers creates in order).
        let mut pending: VecDeque<u64> = VecDeque::new();
        let mut tick = tokio::time::interval(TICK);
        loop {
            let response = tokio::select! {
                command = commands.recv() => {
                    let Some(what) = command else { return Ok(Closed::Commands) };
                    accept(entries, deferred, what);
                    continue;
                }
                _ = tokio::time::sleep_until(deferred.next_due().into()) => {
                    for what in deferred.take_due() {
                        watch.send_create(&what.create(0))?;
                        let local = *next_local;
                        *next_local += 1;
                        entries.insert(local, Entry { from: what.known_through() + 1, what });
                        pending.push_back(local);
                    }
                    continue;
                }
                response = watch.next() => response?,
                _ = tick.tick() => {
                    if watch.is_stale(rpc) {
                        return Ok(Closed::Stream);
                    }
                    let ended: Vec<(i64, u64)> = by_id
                        .iter()
                        .filter(|(_, local)| !entries[*local].what.is_live())
                        .map(|(id, local)| (*id, *local))
                        .collect();
                    for (id, local) in ended {
                        watch.send_cancel(id)?;
                        by_id.remove(&id);
                        entries.remove(&local);
                    }
                    continue;
                }
            };
            let revision = response.revision;
            if response.created {
                let Some(local) = pending.pop_front() else {
                    continue;
                };
                let Some(entry) = entries.get_mut(&local) else {
                    continue;
                };
                if response.canceled {
                    return Ok(Closed::Stream); // re-open: it starts from its revision then
                }
                by_id.insert(response.watch_id, local);
                let known_through = entry.what.known_through();
                entry.from = revision + 1;
                if revision > known_through && entry.what.is_live() {
                    // Something was written between what the caller saw and etcd's "now"
                    // for this watcher: read the key once instead of watching the gap.
                    settle_by_reading(rpc, &entry.what).await?;
                }
                continue;
            }
            let Some(local) = by_id.get(&response.watch_id).copied() else {
                continue;
            };
            if response.canceled {
                // Compacted or refused under us: re-open; the read-or-watch logic decides.
                return Ok(Closed::Stream);
            }
            if let Some(entry) = entries.get_mut(&local) {
                for event in &response.events {
                    handle_event(rpc, &entry.what, event);
                }
                entry.from = entry.from.max(revision + 1);
            }
        }
    }
}

fn handle_event(rpc: &Rpc, what: &Follow, event: &Event) {
    let kv = &event.kv;
    let is_delete = event.kind == EventKind::Delete;
    match what {
        Follow::Guard { rev, hold, .. } => {
            if is_delete
                && kv.mod_revision > *rev
                && let Some(hold) = hold.upgrade()
            {
                tracing::warn!(key = %text(&kv.key), fencing_token = rev, "our key was deleted: the guard is lost");
                hold.lose_key();
            }
        }
        Follow::Sweep {
            key, turn, session, ..
        } => {
            if !is_delete && kv.lease == session.id() {
                spawn_sweep(rpc.clone(), key.clone(), turn.clone(), session.clone());
            }
        }
    }
}

/// Takes the line's turn (so no guard or waiter of ours uses the key) and deletes whatever
/// key of our lease is there: the late-applied attempt.
fn spawn_sweep(
    rpc: Rpc,
    key: Vec<u8>,
    turn: Arc<tokio::sync::Mutex<()>>,
    session: Arc<LeaseState>,
) {
    drop(tokio::spawn(async move {
        let _turn = turn.lock_owned().await;
        if session.loss_reason().is_some() {
            return;
        }
        if let Ok(true) = queue::remove(&rpc, &key, Owned::Lease(session.id())).await {
            tracing::warn!(key = %text(&key), "removed a late-applied enqueue");
        }
    }));
}

/// Reads the key once, for a watcher that cannot cover a stretch of history (compacted,
/// or created after writes we did not see): a guard whose key is gone (or re-created) is
/// lost; a swept line with a key of ours gets swept. Returns the read revision, or `None`
/// when there is nothing left to follow.
async fn settle_by_reading(rpc: &Rpc, what: &Follow) -> Result<Option<i64>> {
    let read = rpc.read(&Range::key(what.key())).await?;
    let revision = read.revision;
    let current = read.kvs.into_iter().next();
    match what {
        Follow::Guard { rev, hold, .. } => {
            if current.as_ref().map(|kv| kv.create_revision) != Some(*rev) {
                if let Some(hold) = hold.upgrade() {
                    hold.lose_key();
                }
                return Ok(None);
            }
        }
        Follow::Sweep {
            key, turn, session, ..
        } => {
            if current.is_some_and(|kv| kv.lease == session.id()) {
                spawn_sweep(rpc.clone(), key.clone(), turn.clone(), session.clone());
            }
        }
    }
    Ok(Some(revision))
}
