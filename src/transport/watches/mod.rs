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
//! * **Failover.** The stream follows the client's current endpoint (a frozen member sends
//!   nothing). After a break, every watcher is re-created from the revision after the last
//!   one it covers (its last event, or a later progress notification), so subscribers see
//!   no gap and no duplicate; if etcd compacted that revision meanwhile, the watcher starts
//!   again from now and its subscribers read.
//!
//! Watch ids are ours (etcd 3.4+ accepts client-chosen ids), so a `created` answer or a
//! late event for a cancelled watcher is never confused with another watcher's.

mod hub;
mod watcher;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::line::mode::Sorted;
use crate::support::error::Error;
use crate::support::kv::prefix_end;
use crate::transport::Rpc;
use crate::transport::watch::{Event, EventKind, Only, Watch};

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
            // Keeps a quiet watcher's resume revision ahead of compaction.
            progress_notify: true,
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
        drop(handle.spawn(hub::run(rpc, receiver)));
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

/// How long after its creation a watcher may still be unsynced. etcd 3.4 turns
/// `start_revision = 0` into "the store revision + 1" read just before registering the
/// watcher, so a write landing in between makes it *unsynced*, and its events then wait
/// for etcd's 100 ms sync loop. After one loop (plus slack) it is synced, or its events
/// were delivered.
pub(crate) const UNSYNCED_WINDOW: Duration = Duration::from_millis(120);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::line::mode::Mode;
    use crate::support::kv::KeyValue;

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
