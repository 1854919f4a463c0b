//! The simulated cluster's watchers, served as etcd 3.4's `watchable_store` and
//! `v3rpc/watch.go` serve them: a watcher created at a revision not after the store's is
//! *unsynced* and catches up on a loop that runs every 100 ms (one answer with every event
//! since its start, its header the store's revision then); a synced one gets each
//! revision's events as they are applied. A watcher whose start is compacted gets an
//! answer with `compact_revision` and `canceled`, on that loop. Each stream's answers go
//! out in the order they are made, its "created" answers before any event of the watcher.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use super::store::{Change, Store};
use crate::transport::generated::etcdserverpb as pb;
use crate::transport::generated::mvccpb;

/// How often unsynced watchers catch up (etcd's `syncWatchersLoop`).
pub(crate) const SYNC_INTERVAL: Duration = Duration::from_millis(100);

/// One answer on a watch stream (a header without the member's fields yet).
pub(crate) type Answer = pb::WatchResponse;

#[derive(Debug)]
struct Watcher {
    key: Vec<u8>,
    /// etcd's encoding after the server's rewrite: `None` one key, `Some([])` every key
    /// from `key` on, else the end.
    end: Option<Vec<u8>>,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    /// The first revision this watcher has not been sent yet.
    next: i64,
    synced: bool,
    /// Asked for timed progress notifications: `Some(due)`, where `due` says no events
    /// went out since the last tick (etcd's `progress` map in `v3rpc/watch.go`).
    progress: Option<bool>,
}

impl Watcher {
    fn covers(&self, key: &[u8]) -> bool {
        match &self.end {
            None => key == self.key,
            Some(end) if end.is_empty() => key >= self.key.as_slice(),
            Some(end) => key >= self.key.as_slice() && key < end.as_slice(),
        }
    }

    /// Events went out: the next progress notification is elided.
    fn sent_events(&mut self) {
        if let Some(due) = &mut self.progress {
            *due = false;
        }
    }

    /// The events of `changes` this watcher reports, as it reports them.
    fn select(&self, changes: &[Change]) -> Vec<mvccpb::Event> {
        changes
            .iter()
            .filter(|c| c.rev >= self.next)
            .filter(|c| c.event.kv.as_ref().is_some_and(|kv| self.covers(&kv.key)))
            .filter(|c| {
                let put = c.event.r#type == mvccpb::event::EventType::Put as i32;
                !(put && self.no_put || !put && self.no_delete)
            })
            .map(|c| {
                let mut event = c.event.clone();
                if !self.prev_kv {
                    event.prev_kv = None;
                }
                event
            })
            .collect()
    }
}

#[derive(Debug)]
struct Stream {
    out: UnboundedSender<Answer>,
    watchers: BTreeMap<i64, Watcher>,
    /// The next id etcd would choose on this stream.
    next_id: i64,
}

/// Every watch stream of every member (all members serve the same store).
#[derive(Debug, Default)]
pub(crate) struct Watchers {
    streams: BTreeMap<u64, Stream>,
    next_stream: u64,
    /// Compaction answers sent (watchers whose start was compacted).
    pub(crate) compacted: u64,
    /// Progress notifications sent.
    pub(crate) progress_sent: u64,
}

fn answer(revision: i64, watch_id: i64) -> Answer {
    pb::WatchResponse {
        header: Some(pb::ResponseHeader {
            revision,
            ..Default::default()
        }),
        watch_id,
        ..Default::default()
    }
}

impl Watchers {
    /// A new stream whose answers go to `out`; its id.
    pub(crate) fn open(&mut self, out: UnboundedSender<Answer>) -> u64 {
        let id = self.next_stream;
        self.next_stream += 1;
        self.streams.insert(
            id,
            Stream {
                out,
                watchers: BTreeMap::new(),
                next_id: 0,
            },
        );
        id
    }

    pub(crate) fn close(&mut self, stream: u64) {
        self.streams.remove(&stream);
    }

    /// How many watchers are registered, and how many of them are unsynced.
    pub(crate) fn count(&self) -> (usize, usize) {
        let all = self.streams.values().flat_map(|s| s.watchers.values());
        all.fold((0, 0), |(n, unsynced), w| {
            (n + 1, unsynced + usize::from(!w.synced))
        })
    }

    /// A create request on `stream`: registers the watcher and answers "created" (or
    /// "created and canceled" with etcd's reason). `unsynced_now`: register a watcher from
    /// "now" as unsynced, as etcd does when a write lands between its reading the revision
    /// and registering the watcher.
    pub(crate) fn create(
        &mut self,
        stream: u64,
        req: &pb::WatchCreateRequest,
        store: &Store,
        unsynced_now: bool,
    ) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        let now = store.revision();
        let key = if req.key.is_empty() {
            vec![0]
        } else {
            req.key.clone()
        };
        let end = match req.range_end.as_slice() {
            [] => None,
            [0] => Some(Vec::new()),
            end => Some(end.to_vec()),
        };
        let refuse = |s: &Stream, reason: &str| {
            let mut a = answer(now, -1);
            a.created = true;
            a.canceled = true;
            a.cancel_reason = reason.to_string();
            let _ = s.out.send(a);
        };
        if end
            .as_ref()
            .is_some_and(|end| !end.is_empty() && key >= *end)
        {
            return refuse(s, "mvcc: watcher range is empty");
        }
        let id = if req.watch_id != 0 {
            if s.watchers.contains_key(&req.watch_id) {
                return refuse(s, "mvcc: duplicate watch ID provided on the WatchStream");
            }
            req.watch_id
        } else {
            while s.watchers.contains_key(&s.next_id) {
                s.next_id += 1;
            }
            s.next_id
        };
        let start = if req.start_revision == 0 {
            now + 1
        } else {
            req.start_revision
        };
        let synced = start > now && !(req.start_revision == 0 && unsynced_now);
        use pb::watch_create_request::FilterType;
        let has = |f: FilterType| req.filters.contains(&(f as i32));
        s.watchers.insert(
            id,
            Watcher {
                key,
                end,
                no_put: has(FilterType::Noput),
                no_delete: has(FilterType::Nodelete),
                prev_kv: req.prev_kv,
                next: if synced { start } else { start.min(now + 1) },
                synced,
                progress: req.progress_notify.then_some(true),
            },
        );
        let mut a = answer(now, id);
        a.created = true;
        let _ = s.out.send(a);
    }

    /// A cancel request: answered only if the watcher exists.
    pub(crate) fn cancel(&mut self, stream: u64, id: i64, store: &Store) {
        if let Some(s) = self.streams.get_mut(&stream)
            && s.watchers.remove(&id).is_some()
        {
            let mut a = answer(store.revision(), id);
            a.canceled = true;
            let _ = s.out.send(a);
        }
    }

    /// Sends one revision's changes to the synced watchers that cover them.
    pub(crate) fn notify(&mut self, changes: &[Change], revision: i64) {
        if changes.is_empty() {
            return;
        }
        for s in self.streams.values_mut() {
            for (id, w) in s.watchers.iter_mut().filter(|(_, w)| w.synced) {
                let events = w.select(changes);
                w.next = revision + 1;
                if !events.is_empty() {
                    w.sent_events();
                    let mut a = answer(revision, *id);
                    a.events = events;
                    let _ = s.out.send(a);
                }
            }
        }
    }

    /// One round of the catch-up loop: every unsynced watcher gets what it missed (or its
    /// compaction answer) and is synced from now on.
    pub(crate) fn sync(&mut self, store: &Store) {
        let now = store.revision();
        for s in self.streams.values_mut() {
            let mut compacted = Vec::new();
            for (id, w) in s.watchers.iter_mut().filter(|(_, w)| !w.synced) {
                let end = match &w.end {
                    None => Vec::new(),
                    Some(end) if end.is_empty() => vec![0],
                    Some(end) => end.clone(),
                };
                match store.changes_since(w.next, &w.key, &end) {
                    Err(compact) => {
                        // etcd's compaction answer carries no revision in its header.
                        let mut a = answer(0, *id);
                        a.compact_revision = compact;
                        a.canceled = true;
                        let _ = s.out.send(a);
                        compacted.push(*id);
                        self.compacted += 1;
                    }
                    Ok(changes) => {
                        let events = w.select(&changes);
                        w.next = now + 1;
                        w.synced = true;
                        if !events.is_empty() {
                            w.sent_events();
                            let mut a = answer(now, *id);
                            a.events = events;
                            let _ = s.out.send(a);
                        }
                    }
                }
            }
            for id in compacted {
                s.watchers.remove(&id);
            }
        }
    }

    /// One tick of etcd's progress notifications: each synced watcher that asked for them
    /// and got no events since the last tick gets an answer with no events, its header the
    /// store's revision (etcd 3.4's `sendLoop` and `progressIfSync`).
    pub(crate) fn progress(&mut self, store: &Store) {
        let now = store.revision();
        for s in self.streams.values_mut() {
            for (id, w) in &mut s.watchers {
                if let Some(due) = &mut w.progress {
                    if *due && w.synced {
                        let _ = s.out.send(answer(now, *id));
                        self.progress_sent += 1;
                    }
                    *due = true;
                }
            }
        }
    }
}
