//! Guards follow their key: one watch stream per client, multiplexing one watcher per live
//! guard (and per line being swept), run by one task on the client's runtime. No thread
//! and no stream per guard.
//!
//! * **Guard**: watch the guard's key for deletes from the revision after its creation, so
//!   nothing between acquisition and watcher creation is missed. A delete by anyone (our
//!   own cleanup, `etcdctl del`, a lease revoked elsewhere) ends the hold: `is_held()`
//!   turns false and `lost()` fires. Watchers from a past revision are served by etcd's
//!   100 ms sync loop, well within the one-second promise.
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
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::error::Result;
use crate::ownership::Hold;
use crate::pb::etcdserverpb as pb;
use crate::pb::mvccpb;
use crate::queue::{self, Owned};
use crate::rpc::Rpc;
use crate::session::SessionShared;
use crate::watch::{WatchStream, watch_request};

/// What to follow.
pub(crate) enum Follow {
    /// End `hold` when `key` (created at `rev`) is deleted.
    Guard {
        key: Vec<u8>,
        rev: i64,
        hold: Weak<Hold>,
    },
    /// Delete any key of `session`'s lease that appears at `key` while `turn` is free,
    /// watching from `from`, until the session ends.
    Sweep {
        key: Vec<u8>,
        from: i64,
        turn: Arc<tokio::sync::Mutex<()>>,
        session: Arc<SessionShared>,
    },
}

impl Follow {
    fn key(&self) -> &[u8] {
        match self {
            Follow::Guard { key, .. } | Follow::Sweep { key, .. } => key,
        }
    }

    /// Whether there is still something to follow.
    fn is_live(&self) -> bool {
        match self {
            Follow::Guard { hold, .. } => hold.upgrade().is_some_and(|h| !h.is_ended()),
            Follow::Sweep { session, .. } => session.loss_reason().is_none(),
        }
    }

    fn create(&self, from: i64) -> pb::WatchCreateRequest {
        match self {
            // Deletes only: a put with our create revision is a proclamation.
            Follow::Guard { key, .. } => watch_request(key, None, from, true),
            Follow::Sweep { key, .. } => {
                let mut create = watch_request(key, None, from, false);
                create.filters = vec![pb::watch_create_request::FilterType::Nodelete as i32];
                create
            }
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

async fn run(rpc: Rpc, mut commands: UnboundedReceiver<Follow>) {
    let mut entries: Vec<Entry> = Vec::new();
    let mut retry_delay = Duration::from_millis(20);
    loop {
        entries.retain(|entry| entry.what.is_live());
        if entries.is_empty() {
            match commands.recv().await {
                Some(what) => entries.push(entry(what)),
                None => return, // the client is gone
            }
            continue;
        }
        match follow_on_stream(&rpc, &mut entries, &mut commands).await {
            Ok(Closed::Commands) => return,
            Ok(Closed::Stream) => retry_delay = Duration::from_millis(20),
            Err(e) => {
                tracing::debug!(error = %e, "follow stream failed; reopening");
                tokio::time::sleep(retry_delay).await;
                retry_delay = (retry_delay * 2).min(Duration::from_secs(1));
            }
        }
    }
}

fn entry(what: Follow) -> Entry {
    let from = match &what {
        Follow::Guard { rev, .. } => rev + 1,
        Follow::Sweep { from, .. } => *from,
    };
    Entry { what, from }
}

enum Closed {
    /// The stream went stale or empty: open again.
    Stream,
    /// The client is gone.
    Commands,
}

/// Runs one stream until it breaks, goes stale, or has nothing left to follow.
async fn follow_on_stream(
    rpc: &Rpc,
    entries: &mut Vec<Entry>,
    commands: &mut UnboundedReceiver<Follow>,
) -> Result<Closed> {
    let creates = entries.iter().map(|e| e.what.create(e.from)).collect();
    let (mut watch, created, _) = WatchStream::open_tolerant(rpc, creates).await?;
    // watch id → index in `entries`; cancelled watchers are refused creations.
    let mut by_id: HashMap<i64, usize> = HashMap::new();
    let mut refused = Vec::new();
    for (index, id) in created.ids.iter().enumerate() {
        match id {
            Some(id) => {
                by_id.insert(*id, index);
            }
            None => refused.push(index),
        }
    }
    // Watchers whose start was compacted away: one read decides for them.
    for index in refused.into_iter().rev() {
        let entry = entries.remove(index);
        by_id = reindex(by_id, index);
        if let Some(entry) = settle_by_reading(rpc, entry).await? {
            entries.push(entry);
            return Ok(Closed::Stream); // re-open with it from the read revision
        }
    }
    let mut pending: VecDeque<Entry> = VecDeque::new();
    loop {
        let response = tokio::select! {
            command = commands.recv() => {
                let Some(what) = command else { return Ok(Closed::Commands) };
                let new = entry(what);
                watch.send_create(new.what.create(new.from))?;
                pending.push_back(new);
                continue;
            }
            response = watch.next() => response?,
            _ = tokio::time::sleep(TICK) => {
                if watch.is_stale(rpc) {
                    entries.extend(pending);
                    return Ok(Closed::Stream);
                }
                for (id, index) in &by_id {
                    if !entries[*index].what.is_live() {
                        watch.send_cancel(*id)?;
                    }
                }
                if entries.iter().all(|e| !e.what.is_live()) && pending.is_empty() {
                    return Ok(Closed::Stream);
                }
                continue;
            }
        };
        if response.created {
            let Some(new) = pending.pop_front() else {
                continue;
            };
            if response.canceled {
                if let Some(kept) = settle_by_reading(rpc, new).await? {
                    entries.push(kept);
                    return Ok(Closed::Stream);
                }
                continue;
            }
            by_id.insert(response.watch_id, entries.len());
            entries.push(new);
            continue;
        }
        let Some(&index) = by_id.get(&response.watch_id) else {
            continue;
        };
        if response.canceled {
            // Compacted or refused under us: re-open; the read-or-watch logic decides.
            entries.extend(pending);
            return Ok(Closed::Stream);
        }
        let revision = response.header.as_ref().map_or(0, |h| h.revision);
        let entry = &mut entries[index];
        for event in &response.events {
            handle_event(rpc, &entry.what, event);
        }
        entry.from = entry.from.max(revision + 1);
    }
}

/// `by_id` after removing entry `removed` (later indexes shift down by one).
fn reindex(by_id: HashMap<i64, usize>, removed: usize) -> HashMap<i64, usize> {
    by_id
        .into_iter()
        .filter(|(_, index)| *index != removed)
        .map(|(id, index)| (id, if index > removed { index - 1 } else { index }))
        .collect()
}

fn handle_event(rpc: &Rpc, what: &Follow, event: &mvccpb::Event) {
    let Some(kv) = &event.kv else { return };
    let is_delete = event.r#type == mvccpb::event::EventType::Delete as i32;
    match what {
        Follow::Guard { rev, hold, .. } => {
            if is_delete
                && kv.mod_revision > *rev
                && let Some(hold) = hold.upgrade()
            {
                tracing::warn!(key = %String::from_utf8_lossy(&kv.key), fencing_token = rev, "our key was deleted: the guard is lost");
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
    session: Arc<SessionShared>,
) {
    drop(tokio::spawn(async move {
        let _turn = turn.lock_owned().await;
        if session.loss_reason().is_some() {
            return;
        }
        if let Ok(true) = queue::remove(&rpc, &key, Owned::Lease(session.id())).await {
            tracing::warn!(key = %String::from_utf8_lossy(&key), "removed a late-applied enqueue");
        }
    }));
}

/// For a watcher whose start revision is compacted: read the key once. A guard whose key
/// is gone (or re-created) is lost; otherwise the entry goes on from the read revision.
async fn settle_by_reading(rpc: &Rpc, mut entry: Entry) -> Result<Option<Entry>> {
    let resp = rpc
        .range(pb::RangeRequest {
            key: entry.what.key().to_vec(),
            ..Default::default()
        })
        .await?;
    let revision = resp.header.map_or(0, |h| h.revision);
    let current = resp.kvs.into_iter().next();
    match &entry.what {
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
    entry.from = revision + 1;
    Ok(Some(entry))
}
