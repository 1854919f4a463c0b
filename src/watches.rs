//! The client's one watch stream. Every watcher of a client — lock waiters, guards following
//! their keys, sweeps, election observers — is multiplexed on one bidirectional gRPC watch
//! stream, run by one task on the client's runtime, and added or cancelled by watch id.
//!
//! * **Shared watchers.** Subscribers asking for the same range with the same filter share
//!   one etcd watcher (all waiters of a name on this client share one "deletes under the
//!   name" watcher, however many there are). A watcher lives while it has subscribers or
//!   [`Pin`]s, so a lock that has had to wait keeps its watcher for the next wait.
//! * **What a subscriber is told.** First [`Delivery::From`]: every event after revision
//!   `after` will follow, complete and in revision order (etcd guarantees order per watcher,
//!   including its catch-up and slow-watcher paths). A subscriber that joins a running
//!   watcher also gets the watcher's recent history, so what it knew at an older revision
//!   can usually be carried forward without a read. Another `From` later means events were
//!   lost (the watcher had to start again after its history was compacted): re-read.
//! * **Failover.** The stream follows the client's current endpoint (a frozen member sends
//!   nothing). After a break, every watcher is re-created from the revision after the last
//!   event it delivered, so subscribers see no gap and no duplicate.
//!
//! Watch ids are ours (etcd 3.4+ accepts client-chosen ids), so a `created` answer or a
//! late event for a cancelled watcher is never confused with another watcher's.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::kv::prefix_end;
use crate::mode::Sorted;
use crate::transport::Rpc;
use crate::transport::watch::{
    Event, EventKind, Only, Watch, WatchResponse, WatchStream, cancel_error,
};

/// What to watch: a key or a range, and which events.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Spec {
    key: Vec<u8>,
    range_end: Vec<u8>,
    only: Only,
}

impl Spec {
    /// Every key under `prefix`.
    pub(crate) fn prefix(prefix: &[u8], only: Only) -> Spec {
        Spec {
            key: prefix.to_vec(),
            range_end: prefix_end(prefix),
            only,
        }
    }

    /// One key.
    pub(crate) fn key(key: &[u8], only: Only) -> Spec {
        Spec {
            key: key.to_vec(),
            range_end: Vec::new(),
            only,
        }
    }

    fn create(&self, id: i64, start_revision: i64) -> Watch {
        Watch {
            key: self.key.clone(),
            range_end: self.range_end.clone(),
            start_revision,
            only: self.only,
            id,
        }
    }
}

/// Events of one watch response, shared by every subscriber of the watcher.
pub(crate) type Batch = Arc<Vec<Event>>;

/// What a waiter waits for: every key in `keys` deleted (the keys ahead of `own` in a line,
/// exact at revision `known`), with no delete of `own` before. The watch task crosses the
/// keys off itself and wakes the waiter only with the outcome, so a handoff wakes the one
/// waiter it concerns, not every waiter of the name on the client.
#[derive(Debug, Clone)]
pub(crate) struct Awaited {
    pub(crate) own: Vec<u8>,
    /// The keys ahead, sorted by what they mean to `own`: cleared once none that blocks
    /// and fewer permits than there are remain.
    pub(crate) keys: Sorted,
    /// Passed back in [`Delivery::Cleared`]: whether `keys` were all the keys ahead.
    pub(crate) complete: bool,
    pub(crate) known: i64,
}

impl Awaited {
    /// Applies one batch; the outcome, once there is one.
    fn apply(&mut self, batch: &[Event]) -> Option<Delivery> {
        let mut through = self.known;
        let mut own_deleted = false;
        for event in batch.iter().filter(|e| e.kv.mod_revision > self.known) {
            through = through.max(event.kv.mod_revision);
            if event.kind != EventKind::Delete {
                continue;
            }
            if event.kv.key == self.own {
                own_deleted = true;
            } else {
                self.keys.remove(&event.kv.key);
            }
        }
        self.known = through;
        // A batch can span revisions (etcd's catch-up): all of it counts before deciding.
        if own_deleted {
            Some(Delivery::OwnDeleted)
        } else if self.keys.is_clear() {
            Some(Delivery::Cleared {
                at: through,
                complete: self.complete,
            })
        } else {
            None
        }
    }
}

/// What a subscriber receives.
#[derive(Debug, Clone)]
pub(crate) enum Delivery {
    /// Every event after revision `after` follows, in order. `fresh`: the watcher was just
    /// created "from now", so etcd may have registered it as unsynced (a write raced its
    /// creation), and its first events may then wait for etcd's 100 ms sync loop.
    From { after: i64, fresh: bool },
    /// The next events (not sent to a subscriber that awaits keys gone).
    Events(Batch),
    /// For a subscriber that awaits keys gone ([`Awaited`]): the last of them was deleted,
    /// with every event through revision `at` applied and no delete of its own key.
    Cleared { at: i64, complete: bool },
    /// For a subscriber that awaits keys gone: its own key was deleted first.
    OwnDeleted,
    /// etcd refused the watcher for good (permission denied, for example).
    Failed(Error),
}

/// The client's handle on its watch task: cheap to clone, the task starts on first use.
#[derive(Clone)]
pub(crate) struct Watches {
    commands: UnboundedSender<Command>,
    next_subscriber: Arc<AtomicU64>,
}

enum Command {
    Subscribe {
        spec: Spec,
        id: u64,
        known: i64,
        awaited: Option<Awaited>,
        sink: Sink,
    },
    Await {
        spec: Spec,
        id: u64,
        awaited: Awaited,
    },
    Unsubscribe {
        spec: Spec,
        id: u64,
    },
    Pin(Spec),
    Unpin(Spec),
}

/// Where a subscriber's deliveries go: tagged, so that one task can receive the deliveries
/// of many subscriptions on one channel (see [`Watches::subscribe_to`]).
#[derive(Clone)]
pub(crate) struct Sink {
    tag: u64,
    sender: UnboundedSender<(u64, Delivery)>,
}

impl Sink {
    pub(crate) fn new(tag: u64, sender: UnboundedSender<(u64, Delivery)>) -> Sink {
        Sink { tag, sender }
    }

    fn send(&self, delivery: Delivery) -> bool {
        self.sender.send((self.tag, delivery)).is_ok()
    }
}

impl Watches {
    /// Starts the task on the runtime of `handle`.
    pub(crate) fn start(handle: &tokio::runtime::Handle, rpc: Rpc) -> Watches {
        let (commands, receiver) = unbounded_channel();
        drop(handle.spawn(run(rpc, receiver)));
        Watches {
            commands,
            next_subscriber: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Subscribes to `spec` on its own channel; `known` is the revision through which the
    /// subscriber knows the state already (0: nothing), so that only newer history is
    /// replayed to it.
    pub(crate) fn subscribe(&self, spec: Spec, known: i64) -> Subscription {
        let (sender, receiver) = unbounded_channel();
        let handle = self.subscribe_with(spec, known, None, Sink::new(0, sender));
        Subscription { handle, receiver }
    }

    /// Subscribes to `spec` (deletes under a name) to learn when the `awaited` keys are
    /// gone: the subscriber gets [`Delivery::From`] as usual, then only the outcome
    /// ([`Delivery::Cleared`] or [`Delivery::OwnDeleted`]), never the events themselves.
    pub(crate) fn await_gone(&self, spec: Spec, awaited: Awaited) -> Subscription {
        let (sender, receiver) = unbounded_channel();
        let known = awaited.known;
        let handle = self.subscribe_with(spec, known, Some(awaited), Sink::new(0, sender));
        Subscription { handle, receiver }
    }

    /// Subscribes to `spec`, delivering into `sink`; the subscription lasts as long as the
    /// returned handle.
    pub(crate) fn subscribe_to(&self, spec: Spec, known: i64, sink: Sink) -> Subscribed {
        self.subscribe_with(spec, known, None, sink)
    }

    fn subscribe_with(
        &self,
        spec: Spec,
        known: i64,
        awaited: Option<Awaited>,
        sink: Sink,
    ) -> Subscribed {
        let id = self.next_subscriber.fetch_add(1, Ordering::Relaxed);
        // Fails only when the runtime shuts down; the subscriber then sees `Closed`.
        let _ = self.commands.send(Command::Subscribe {
            spec: spec.clone(),
            id,
            known,
            awaited,
            sink,
        });
        Subscribed {
            spec,
            id,
            commands: self.commands.clone(),
        }
    }

    /// Keeps the watcher of `spec` (and its history) alive while the pin lives, even with no
    /// subscriber: the next subscriber then needs no create and usually no read.
    pub(crate) fn pin(&self, spec: Spec) -> Pin {
        let _ = self.commands.send(Command::Pin(spec.clone()));
        Pin {
            spec,
            commands: self.commands.clone(),
        }
    }
}

/// A live subscription (see [`Watches::subscribe_to`]); dropping it unsubscribes.
pub(crate) struct Subscribed {
    spec: Spec,
    id: u64,
    commands: UnboundedSender<Command>,
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Unsubscribe {
            spec: self.spec.clone(),
            id: self.id,
        });
    }
}

/// A subscription with its own channel.
pub(crate) struct Subscription {
    handle: Subscribed,
    receiver: UnboundedReceiver<(u64, Delivery)>,
}

impl Subscription {
    /// Replaces what this subscription awaits (after the subscriber read the line again).
    pub(crate) fn await_again(&self, awaited: Awaited) {
        let _ = self.handle.commands.send(Command::Await {
            spec: self.handle.spec.clone(),
            id: self.handle.id,
            awaited,
        });
    }

    /// The next delivery; `Failed(Closed)` once the client's runtime is gone.
    pub(crate) async fn next(&mut self) -> Delivery {
        match self.receiver.recv().await {
            Some((_, delivery)) => delivery,
            None => Delivery::Failed(Error::Closed),
        }
    }
}

/// Keeps a watcher alive (see [`Watches::pin`]).
pub(crate) struct Pin {
    spec: Spec,
    commands: UnboundedSender<Command>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Unpin(self.spec.clone()));
    }
}

/// How many events a watcher keeps for subscribers that join late.
const HISTORY_EVENTS: usize = 1024;

/// How long after its creation a watcher may still be unsynced. etcd 3.4 turns
/// `start_revision = 0` into "the store revision + 1" read just before registering the
/// watcher, so a write landing in between makes it *unsynced*, and its events then wait
/// for etcd's 100 ms sync loop. After one loop (plus slack) it is synced, or its events
/// were delivered.
pub(crate) const UNSYNCED_WINDOW: Duration = Duration::from_millis(120);

/// How often the task checks that its stream runs on the endpoint the client uses.
const STALE_CHECK: Duration = crate::transport::watch::STALE_CHECK;

/// One subscriber of a watcher.
struct Subscriber {
    sink: Sink,
    /// What it awaits, if it awaits keys gone (until the outcome is sent).
    awaited: Option<Awaited>,
}

impl Subscriber {
    /// Delivers a batch: the events, or the outcome of what it awaits once there is one.
    fn deliver(&mut self, batch: &Batch) -> bool {
        match &mut self.awaited {
            None => self.sink.send(Delivery::Events(batch.clone())),
            Some(awaited) => match awaited.apply(batch) {
                Some(outcome) => {
                    self.awaited = None;
                    self.sink.send(outcome)
                }
                None => true,
            },
        }
    }
}

/// One etcd watcher and its subscribers.
#[derive(Default)]
struct Watcher {
    subscribers: HashMap<u64, Subscriber>,
    pins: usize,
    /// Its id on the current stream, once the create was sent there.
    id: Option<i64>,
    /// Whether etcd confirmed it on the current stream.
    created: bool,
    /// Every event after this revision has been, or will be, delivered; `None` before the
    /// first creation (the watcher then starts from etcd's "now").
    through: Option<i64>,
    /// When it last started from etcd's "now" (see [`Delivery::From`]'s `fresh`).
    started_at: Option<Instant>,
    /// Recent events, all of those after `history_from`.
    history: VecDeque<Batch>,
    history_events: usize,
    history_from: i64,
}

impl Watcher {
    fn is_wanted(&self) -> bool {
        !self.subscribers.is_empty() || self.pins > 0
    }

    /// The create request for the current stream: continue after `through`, or from now.
    fn create(&self, spec: &Spec, id: i64) -> Watch {
        spec.create(id, self.through.map_or(0, |through| through + 1))
    }

    /// Tells one subscriber where the watcher stands and replays the history it lacks: the
    /// batches after `known`, if the history reaches back that far (if not, the subscriber
    /// reads, and everything in the history is older than its read).
    fn welcome(&self, subscriber: &mut Subscriber, known: i64) {
        subscriber.sink.send(Delivery::From {
            after: self.history_from,
            fresh: self
                .started_at
                .is_some_and(|at| at.elapsed() < UNSYNCED_WINDOW),
        });
        self.replay(subscriber, known);
    }

    /// Replays the history after `known` to one subscriber, if it reaches back that far.
    fn replay(&self, subscriber: &mut Subscriber, known: i64) {
        if known < self.history_from {
            return;
        }
        let newer = self
            .history
            .iter()
            .filter(|batch| batch.iter().any(|event| event.kv.mod_revision > known));
        for batch in newer {
            subscriber.deliver(batch);
        }
    }

    /// Starts over from etcd's "now" at `revision`: history is gone, subscribers re-read.
    fn start_fresh(&mut self, revision: i64) {
        tracing::debug!(
            after = revision,
            subscribers = self.subscribers.len(),
            "watcher started"
        );
        self.through = Some(revision);
        self.started_at = Some(Instant::now());
        self.history.clear();
        self.history_events = 0;
        self.history_from = revision;
        self.broadcast(&Delivery::From {
            after: revision,
            fresh: true,
        });
    }

    fn record(&mut self, events: Vec<Event>) {
        let last = events.iter().map(|e| e.kv.mod_revision).max();
        let Some(last) = last else {
            return;
        };
        self.through = Some(self.through.map_or(last, |t| t.max(last)));
        let batch: Batch = Arc::new(events);
        self.history_events += batch.len();
        self.history.push_back(batch.clone());
        while self.history_events > HISTORY_EVENTS
            && let Some(old) = self.history.pop_front()
        {
            self.history_events -= old.len();
            if let Some(rev) = old.iter().map(|e| e.kv.mod_revision).max() {
                self.history_from = self.history_from.max(rev);
            }
        }
        self.subscribers
            .retain(|_, subscriber| subscriber.deliver(&batch));
    }

    fn broadcast(&mut self, delivery: &Delivery) {
        self.subscribers
            .retain(|_, subscriber| subscriber.sink.send(delivery.clone()));
    }
}

/// The task's state, kept across streams.
#[derive(Default)]
struct Hub {
    watchers: HashMap<Spec, Watcher>,
    /// Watch id → spec, for the current stream.
    by_id: HashMap<i64, Spec>,
    next_id: i64,
}

/// Why a stream ended.
enum Ended {
    /// Every handle is gone: the client was dropped.
    Commands,
    /// It went stale (the client moved to another endpoint) or etcd cancelled a watcher:
    /// open a new one.
    Reopen,
}

async fn run(rpc: Rpc, mut commands: UnboundedReceiver<Command>) {
    let mut hub = Hub::default();
    let mut backoff = Backoff::quick();
    loop {
        hub.prune();
        if hub.watchers.is_empty() {
            // A stream needs a first watcher (etcd answers headers with the first
            // response), so an idle client keeps none.
            match commands.recv().await {
                Some(command) => hub.apply(command, None),
                None => return,
            }
            continue;
        }
        match hub.serve(&rpc, &mut commands).await {
            Ok(Ended::Commands) => return,
            Ok(Ended::Reopen) => backoff.reset(),
            Err(e) => {
                tracing::debug!(error = %e, "watch stream failed; reopening");
                // Commands keep arriving while we wait.
                let pause = backoff.next_pause();
                let until = tokio::time::Instant::now() + pause;
                loop {
                    tokio::select! {
                        command = commands.recv() => match command {
                            Some(command) => hub.apply(command, None),
                            None => return,
                        },
                        _ = tokio::time::sleep_until(until) => break,
                    }
                }
            }
        }
        hub.stream_closed();
    }
}

impl Hub {
    fn next_watch_id(&mut self) -> i64 {
        // Never 0: etcd reads 0 as "choose an id".
        self.next_id += 1;
        self.next_id
    }

    /// Drops watchers nobody wants (their etcd watcher went with the stream, or is
    /// cancelled by `apply`).
    fn prune(&mut self) {
        self.watchers.retain(|_, watcher| watcher.is_wanted());
    }

    fn stream_closed(&mut self) {
        self.by_id.clear();
        for watcher in self.watchers.values_mut() {
            watcher.id = None;
            watcher.created = false;
        }
    }

    /// Applies a command; `stream` is the live stream, if one runs.
    fn apply(&mut self, command: Command, stream: Option<&WatchStream>) {
        match command {
            Command::Subscribe {
                spec,
                id,
                known,
                awaited,
                sink,
            } => {
                let watcher = self.watchers.entry(spec.clone()).or_default();
                let mut subscriber = Subscriber { sink, awaited };
                // A watcher that started once covers everything after `through`, also
                // between streams (it is re-created from there); one that has not started
                // yet tells its subscribers where it starts when etcd confirms it.
                if watcher.through.is_some() {
                    watcher.welcome(&mut subscriber, known);
                }
                watcher.subscribers.insert(id, subscriber);
                self.ensure_created(&spec, stream);
            }
            Command::Await { spec, id, awaited } => {
                let Some(watcher) = self.watchers.get_mut(&spec) else {
                    return;
                };
                let Some(mut subscriber) = watcher.subscribers.remove(&id) else {
                    return;
                };
                let known = awaited.known;
                subscriber.awaited = Some(awaited);
                if watcher.through.is_some() {
                    if known < watcher.history_from {
                        // Too old for the history: the subscriber reads again.
                        subscriber.sink.send(Delivery::From {
                            after: watcher.history_from,
                            fresh: false,
                        });
                    } else {
                        watcher.replay(&mut subscriber, known);
                    }
                }
                watcher.subscribers.insert(id, subscriber);
            }
            Command::Unsubscribe { spec, id } => {
                if let Some(watcher) = self.watchers.get_mut(&spec) {
                    watcher.subscribers.remove(&id);
                }
                self.cancel_if_unwanted(&spec, stream);
            }
            Command::Pin(spec) => {
                self.watchers.entry(spec.clone()).or_default().pins += 1;
                self.ensure_created(&spec, stream);
            }
            Command::Unpin(spec) => {
                if let Some(watcher) = self.watchers.get_mut(&spec) {
                    watcher.pins = watcher.pins.saturating_sub(1);
                }
                self.cancel_if_unwanted(&spec, stream);
            }
        }
    }

    /// Sends the create request for `spec` on the live stream, if it has none there yet.
    fn ensure_created(&mut self, spec: &Spec, stream: Option<&WatchStream>) {
        let Some(stream) = stream else {
            return; // the next stream creates it
        };
        let id = self.next_watch_id();
        let Some(watcher) = self.watchers.get_mut(spec) else {
            return;
        };
        if watcher.id.is_some() {
            return;
        }
        // A failed send means the stream is closing; the next one creates the watcher.
        if stream.send_create(&watcher.create(spec, id)).is_ok() {
            watcher.id = Some(id);
            self.by_id.insert(id, spec.clone());
        }
    }

    fn cancel_if_unwanted(&mut self, spec: &Spec, stream: Option<&WatchStream>) {
        let Some(watcher) = self.watchers.get(spec) else {
            return;
        };
        if watcher.is_wanted() {
            return;
        }
        if let (Some(id), Some(stream)) = (watcher.id, stream) {
            // etcd handles requests in order: this cancel follows the create even if the
            // create is not answered yet. Late answers for the id are ignored.
            let _ = stream.send_cancel(id);
            self.by_id.remove(&id);
        }
        self.watchers.remove(spec);
    }

    /// Runs one stream until it breaks, goes stale, or the client is dropped.
    async fn serve(
        &mut self,
        rpc: &Rpc,
        commands: &mut UnboundedReceiver<Command>,
    ) -> Result<Ended> {
        let specs: Vec<Spec> = self.watchers.keys().cloned().collect();
        let mut creates = Vec::with_capacity(specs.len());
        for spec in &specs {
            let id = self.next_watch_id();
            if let Some(watcher) = self.watchers.get_mut(spec) {
                creates.push(watcher.create(spec, id));
                watcher.id = Some(id);
            }
            self.by_id.insert(id, spec.clone());
        }
        let (mut stream, created, _) = WatchStream::open_tolerant(rpc, creates).await?;
        for answer in created.answers {
            self.on_created(answer, &stream);
        }
        let mut stale_check = tokio::time::interval(STALE_CHECK);
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(command) => self.apply(command, Some(&stream)),
                    None => return Ok(Ended::Commands),
                },
                response = stream.next() => {
                    let response = response?;
                    if response.created {
                        if response.canceled && rpc.can_reauthenticate(&cancel_error(&response)) {
                            // The token expired: the next stream opens with a fresh one.
                            return Err(cancel_error(&response));
                        }
                        self.on_created(response, &stream);
                    } else if response.canceled {
                        if self.by_id.contains_key(&response.watch_id) {
                            // etcd dropped a watcher of ours (compaction under a slow
                            // watcher, an expired token): a new stream sorts it out.
                            return Ok(Ended::Reopen);
                        }
                    } else {
                        self.on_events(response);
                    }
                }
                _ = stale_check.tick() => {
                    if stream.is_stale(rpc) {
                        return Ok(Ended::Reopen);
                    }
                }
            }
        }
    }

    /// etcd's answer to a create request.
    fn on_created(&mut self, answer: WatchResponse, stream: &WatchStream) {
        let Some(spec) = self.by_id.get(&answer.watch_id).cloned() else {
            return; // cancelled meanwhile
        };
        let Some(watcher) = self.watchers.get_mut(&spec) else {
            return;
        };
        if answer.canceled {
            self.by_id.remove(&answer.watch_id);
            watcher.id = None;
            if answer.compact_revision > 0 && watcher.through.is_some() {
                // Its history is compacted away: start again from now.
                watcher.through = None;
                self.ensure_created(&spec, Some(stream));
                return;
            }
            let error = cancel_error(&answer);
            tracing::debug!(error = %error, "etcd refused a watcher");
            watcher.broadcast(&Delivery::Failed(error));
            watcher.subscribers.clear();
            watcher.pins = 0;
            self.watchers.remove(&spec);
            return;
        }
        watcher.created = true;
        match watcher.through {
            // Re-created after a break: it continues where the last stream stopped.
            Some(_) => {}
            None => watcher.start_fresh(answer.revision),
        }
    }

    fn on_events(&mut self, response: WatchResponse) {
        let Some(spec) = self.by_id.get(&response.watch_id) else {
            return;
        };
        if let Some(watcher) = self.watchers.get_mut(spec) {
            watcher.record(response.events);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KeyValue;
    use crate::mode::Mode;

    fn delete(key: &[u8], rev: i64) -> Event {
        Event {
            kind: EventKind::Delete,
            kv: KeyValue {
                key: key.to_vec(),
                mod_revision: rev,
                ..Default::default()
            },
        }
    }

    fn awaiting(keys: &[&[u8]], known: i64) -> Awaited {
        let keys = Mode::Exclusive
            .sort(b"l/", keys.iter().map(|k| k.to_vec()))
            .unwrap_or_else(|d| panic!("{d:?}"));
        Awaited {
            own: b"l/own".to_vec(),
            keys,
            complete: true,
            known,
        }
    }

    #[test]
    fn a_permit_is_cleared_when_fewer_than_n_older_permits_remain() {
        let keys = Mode::Permits(2)
            .sort(
                b"l/",
                ["l/1.permits-2", "l/2.permits-2", "l/3.shared"]
                    .iter()
                    .map(|k| k.as_bytes().to_vec()),
            )
            .unwrap_or_else(|d| panic!("{d:?}"));
        let mut a = Awaited {
            own: b"l/4.permits-2".to_vec(),
            keys,
            complete: true,
            known: 10,
        };
        // The reader ahead blocks; one permit may remain.
        assert!(a.apply(&[delete(b"l/1.permits-2", 11)]).is_none());
        assert!(matches!(
            a.apply(&[delete(b"l/3.shared", 12)]),
            Some(Delivery::Cleared { at: 12, .. })
        ));
    }

    #[test]
    fn cleared_only_when_every_key_ahead_is_gone() {
        let mut a = awaiting(&[b"l/a", b"l/b"], 10);
        // Old news (at or before what was known) changes nothing.
        assert!(a.apply(&[delete(b"l/a", 9), delete(b"l/b", 10)]).is_none());
        // A key that is not ahead (a newer waiter) changes nothing either.
        assert!(a.apply(&[delete(b"l/newer", 11)]).is_none());
        assert!(a.apply(&[delete(b"l/b", 12)]).is_none());
        match a.apply(&[delete(b"l/a", 14)]) {
            Some(Delivery::Cleared {
                at: 14,
                complete: true,
            }) => {}
            other => panic!("expected Cleared at 14, got {other:?}"),
        }
    }

    #[test]
    fn own_delete_in_the_same_batch_wins() {
        // One batch can span revisions: the own key's delete after the last key ahead
        // must not be read as a clear turn.
        let mut a = awaiting(&[b"l/a"], 10);
        assert!(matches!(
            a.apply(&[delete(b"l/a", 11), delete(b"l/own", 12)]),
            Some(Delivery::OwnDeleted)
        ));
        let mut a = awaiting(&[b"l/a"], 10);
        assert!(matches!(
            a.apply(&[delete(b"l/own", 11)]),
            Some(Delivery::OwnDeleted)
        ));
    }
}
