//! The client's one watch stream. Every watcher of a client — lock waiters, guards following
//! their keys, sweeps, election observers — is multiplexed on one bidirectional gRPC watch
//! stream, run by one task on the client's runtime (`hub.rs`), and added or cancelled by
//! watch id.
//!
//! * **Shared watchers.** Subscribers asking for the same range with the same filter share
//!   one etcd watcher (`watcher.rs`; all waiters of a name on this client share one
//!   "deletes under the name" watcher, however many there are). A watcher lives while it
//!   has subscribers or [`Pin`]s, so a lock that has had to wait keeps its watcher for the
//!   next wait.
//! * **What a subscriber is told.** First [`Delivery::From`]: every event after revision
//!   `after` will follow, complete and in revision order (etcd guarantees order per watcher,
//!   including its catch-up and slow-watcher paths). A subscriber that joins a running
//!   watcher also gets the watcher's recent history, so what it knew at an older revision
//!   can usually be carried forward without a read. Another `From` later means events were
//!   lost (the watcher had to start again: its history was compacted, or the server went
//!   back in time): re-read.
//! * **Waiters.** A subscriber may instead hand the task a condition on the events
//!   (`waiting.rs`): the task judges each batch as it arrives and wakes the waiter only
//!   with the verdict. What the condition means is not the hub's business (the waiting
//!   line's crossing-off is in `line/crossing.rs`).
//! * **Failover.** The stream follows the client's current endpoint (a frozen member sends
//!   nothing). After a break, every watcher is re-created from the revision after the last
//!   one it covers (its last event, or a later progress notification), so subscribers see
//!   no gap and no duplicate; if etcd compacted that revision meanwhile, the watcher starts
//!   again from now and its subscribers read.
//!
//! Watch ids are ours (etcd 3.4+ accepts client-chosen ids), so a `created` answer or a
//! late event for a cancelled watcher is never confused with another watcher's. etcd's gRPC
//! proxy numbers a stream's watchers itself; the stream translates its numbers to ours
//! (`transport/watch_ids.rs`), so the hub sees only its own ids either way.

mod hub;
pub(crate) mod waiting;
mod watcher;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::support::error::Error;
use crate::support::kv::prefix_end;
use crate::transport::Rpc;
use crate::transport::watch::{Event, Only, Watch};

/// What to watch: a key or a range, and which events.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
            // Keeps a quiet watcher's resume revision ahead of compaction.
            progress_notify: true,
        }
    }
}

/// Events of one watch response, shared by every subscriber of the watcher.
pub(crate) type Batch = Arc<Vec<Event>>;

/// What a subscriber receives.
#[derive(Debug, Clone)]
pub(crate) enum Delivery {
    /// Every event after revision `after` follows, in order. `fresh`: the watcher was just
    /// created "from now", so etcd may have registered it as unsynced (a write raced its
    /// creation), and its first events may then wait for etcd's 100 ms sync loop.
    From { after: i64, fresh: bool },
    /// The next events.
    Events(Batch),
    /// etcd refused the watcher for good (permission denied, for example).
    Failed(Error),
}

/// The client's handle on its watch task: cheap to clone, the task starts on first use.
#[derive(Clone)]
pub(crate) struct Watches {
    commands: UnboundedSender<Command>,
    next_subscriber: Arc<AtomicU64>,
    /// How many waiters ([`Watches::wait_for`]) each spec has now, counted on the caller's
    /// side (see [`Watches::has_waiters_under`]).
    waiters: Counts,
}

type Counts = Arc<StdMutex<HashMap<Spec, usize>>>;

fn lock(counts: &Counts) -> std::sync::MutexGuard<'_, HashMap<Spec, usize>> {
    counts.lock().unwrap_or_else(|e| e.into_inner())
}

enum Command {
    Subscribe {
        spec: Spec,
        id: u64,
        known: i64,
        /// A new watcher starts right after `known`, not from etcd's "now".
        from_known: bool,
        receiver: Box<dyn Receiver>,
    },
    /// Replaces a subscriber's receiver (a waiter's new condition), replaying the history
    /// after `known` to the new one.
    Replace {
        spec: Spec,
        id: u64,
        known: i64,
        receiver: Box<dyn Receiver>,
    },
    Unsubscribe {
        spec: Spec,
        id: u64,
    },
    /// With `Some(known)`, a watcher created for it starts right after `known`.
    Pin(Spec, Option<i64>),
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
}

/// Where the watch task puts one subscriber's deliveries: a [`Sink`] (every event), or a
/// waiter's [`Condition`](waiting::Condition) (only its verdict, see `waiting.rs`). Each
/// returns whether the subscriber still listens.
trait Receiver: Send {
    /// Where the watcher stands ([`Delivery::From`]), or that it failed.
    fn tell(&mut self, delivery: Delivery) -> bool;
    /// The next events.
    fn events(&mut self, batch: &Batch) -> bool;
}

impl Receiver for Sink {
    fn tell(&mut self, delivery: Delivery) -> bool {
        self.sender.send((self.tag, delivery)).is_ok()
    }

    fn events(&mut self, batch: &Batch) -> bool {
        self.tell(Delivery::Events(batch.clone()))
    }
}

impl Watches {
    /// Starts the task on the runtime of `handle`.
    pub(crate) fn start(handle: &tokio::runtime::Handle, rpc: Rpc) -> Watches {
        let (commands, receiver) = unbounded_channel();
        drop(handle.spawn(hub::run(rpc, receiver)));
        Watches {
            commands,
            next_subscriber: Arc::new(AtomicU64::new(1)),
            waiters: Counts::default(),
        }
    }

    /// Subscribes to `spec` on its own channel; `known` is the revision through which the
    /// subscriber knows the state already (0: nothing), so that only newer history is
    /// replayed to it.
    pub(crate) fn subscribe(&self, spec: Spec, known: i64) -> Subscription {
        let (sender, receiver) = unbounded_channel();
        let handle = self.subscribe_with(spec, known, Box::new(Sink::new(0, sender)), None, false);
        Subscription {
            _handle: handle,
            receiver,
        }
    }

    /// Subscribes to `spec`, delivering into `sink`; the subscription lasts as long as the
    /// returned handle.
    pub(crate) fn subscribe_to(&self, spec: Spec, known: i64, sink: Sink) -> Subscribed {
        self.subscribe_with(spec, known, Box::new(sink), None, false)
    }

    /// [`subscribe_to`](Self::subscribe_to), but a watcher created for it starts right
    /// after `known` (a revision the subscriber read), so that it covers everything since,
    /// with no read. On a member without etcd #18089's fix it starts *at* `known` (see
    /// `watcher.rs`), which etcd serves *unsynced* at first: its events arrive up to 100 ms
    /// late, for a subscriber that can wait that long; with the fix, right after. A watcher that exists already
    /// serves the subscriber as usual (it is told to read if the watcher started later).
    pub(crate) fn subscribe_from(&self, spec: Spec, known: i64, sink: Sink) -> Subscribed {
        self.subscribe_with(spec, known, Box::new(sink), None, known > 0)
    }

    /// `waiter`: the counts to count this subscription in (waiters only); `from_known`: see
    /// [`subscribe_from`](Self::subscribe_from).
    fn subscribe_with(
        &self,
        spec: Spec,
        known: i64,
        receiver: Box<dyn Receiver>,
        waiter: Option<&Counts>,
        from_known: bool,
    ) -> Subscribed {
        let id = self.next_subscriber.fetch_add(1, Ordering::Relaxed);
        if let Some(counts) = waiter {
            *lock(counts).entry(spec.clone()).or_default() += 1;
        }
        // Fails only when the runtime shuts down; the subscriber then sees `Closed`.
        let _ = self.commands.send(Command::Subscribe {
            spec: spec.clone(),
            id,
            known,
            from_known,
            receiver,
        });
        Subscribed {
            spec,
            id,
            commands: self.commands.clone(),
            waiter: waiter.cloned(),
        }
    }

    /// Whether the deletes under `prefix` have a waiter now (a guard's follow and a pin do
    /// not count: they end soon, or hear of nothing a waiter would not): then one more
    /// waiter costs etcd nothing, since the client receives the events anyway for as long
    /// as it waits. Nothing is allocated when the client has no waiter at all (every
    /// uncontended acquire asks).
    pub(crate) fn has_waiters_under(&self, prefix: &[u8]) -> bool {
        let waiters = lock(&self.waiters);
        !waiters.is_empty() && waiters.contains_key(&Spec::prefix(prefix, Only::Deletes))
    }

    /// Keeps the watcher of `spec` (and its history) alive while the pin lives, even with no
    /// subscriber: the next subscriber then needs no create and usually no read.
    pub(crate) fn pin(&self, spec: Spec) -> Pin {
        self.pin_from(spec, None)
    }

    /// [`pin`](Self::pin); a watcher created for it starts right after `known`, as for
    /// [`subscribe_from`](Self::subscribe_from) (with `None`, from etcd's "now").
    pub(crate) fn pin_from(&self, spec: Spec, known: Option<i64>) -> Pin {
        let _ = self.commands.send(Command::Pin(spec.clone(), known));
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
    /// The waiter counts this subscription is counted in, if it is a waiter's.
    waiter: Option<Counts>,
}

impl Subscribed {
    /// Whether this is the only waiter on its spec now.
    pub(crate) fn is_alone(&self) -> bool {
        self.waiter
            .as_ref()
            .is_some_and(|counts| lock(counts).get(&self.spec) == Some(&1))
    }
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        if let Some(counts) = &self.waiter {
            let mut counts = lock(counts);
            if let Some(count) = counts.get_mut(&self.spec) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(&self.spec);
                }
            }
        }
        let _ = self.commands.send(Command::Unsubscribe {
            spec: self.spec.clone(),
            id: self.id,
        });
    }
}

/// A subscription with its own channel.
pub(crate) struct Subscription {
    /// Held for its drop, which unsubscribes.
    _handle: Subscribed,
    receiver: UnboundedReceiver<(u64, Delivery)>,
}

impl Subscription {
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

/// How long after its creation a watcher may still be unsynced. etcd 3.4 turns
/// `start_revision = 0` into "the store revision + 1" read just before registering the
/// watcher, so a write landing in between makes it *unsynced*, and its events then wait
/// for etcd's 100 ms sync loop. After one loop (plus slack) it is synced, or its events
/// were delivered.
pub(crate) const UNSYNCED_WINDOW: Duration = Duration::from_millis(120);
