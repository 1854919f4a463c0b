//! Waiters on the watch stream: a subscriber that hands the watch task a [`Condition`] on
//! the events, and is woken only with its verdict. The task applies the condition to each
//! batch as it arrives, so a handoff wakes the one waiter it concerns, not every waiter of
//! the name on the client. What the condition means is the waiter's business (the waiting
//! line's is in `line/crossing.rs`); the task only feeds it events in revision order.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tokio::sync::mpsc::{
    UnboundedReceiver, UnboundedSender, WeakUnboundedSender, unbounded_channel,
};

use super::{Batch, Command, Delivery, Receiver, Spec, Subscribed, Watches};
use crate::support::error::Error;
use crate::transport::watch::Event;

/// What a waiter waits for, judged by the watch task on every batch of its watcher.
pub(crate) trait Condition: Send + 'static {
    /// What the waiter is told once the condition is decided.
    type Verdict: Send + 'static;

    /// Applies the events of one watch response, in revision order (one response can span
    /// revisions, and a replay from history can repeat events at or before the revision the
    /// waiter knows: the condition tells those apart itself). Returns the verdict once there
    /// is one; after that, the condition is asked nothing more.
    fn apply(&mut self, batch: &[Event]) -> Option<Self::Verdict>;
}

/// What a waiter receives.
#[derive(Debug)]
pub(crate) enum Wake<V> {
    /// As [`Delivery::From`]: every event after `after` is judged, in order; a `From` after
    /// `after` the waiter knows means events were lost: re-read, and wait again.
    From { after: i64, fresh: bool },
    /// Its condition's verdict (once per condition).
    Verdict(V),
    /// As [`Delivery::Failed`].
    Failed(Error),
}

/// The task's side of a waiter: its condition until decided, its channel, and the newest
/// revision of an event its watcher delivered.
struct Judged<C: Condition> {
    condition: Option<C>,
    /// The revision through which the condition knows the state (the waiter's read).
    known: i64,
    sender: UnboundedSender<Wake<C::Verdict>>,
    seen: Arc<AtomicI64>,
}

impl<C: Condition> Receiver for Judged<C> {
    fn tell(&mut self, delivery: Delivery) -> bool {
        let wake = match delivery {
            Delivery::From { after, fresh } => {
                // The watcher starts after what the condition knows: the events in between
                // are not on it, and a condition judged on what follows would decide on a
                // state that never was (a double barrier's round that counts a participant
                // gone in the gap, and fills). It is judged no more; the waiter reads and
                // gives a new one (`wait_again`).
                if after > self.known {
                    self.condition = None;
                }
                Wake::From { after, fresh }
            }
            Delivery::Failed(e) => Wake::Failed(e),
            Delivery::Events(_) => return !self.sender.is_closed(),
        };
        self.sender.send(wake).is_ok()
    }

    fn events(&mut self, batch: &Batch) -> bool {
        if let Some(newest) = batch.iter().map(|event| event.kv.mod_revision).max() {
            self.seen.fetch_max(newest, Ordering::Relaxed);
        }
        let Some(condition) = &mut self.condition else {
            // Decided: later events are nothing to the waiter.
            return !self.sender.is_closed();
        };
        match condition.apply(batch) {
            Some(verdict) => {
                self.condition = None;
                self.sender.send(Wake::Verdict(verdict)).is_ok()
            }
            None => true,
        }
    }
}

impl Watches {
    /// Subscribes to `spec` to wait until `condition` is decided: the waiter gets
    /// [`Wake::From`] as any subscriber gets [`Delivery::From`], then only the verdict, never
    /// the events themselves. `known` is the revision through which the waiter knows the
    /// state already: only newer history is replayed to its condition.
    pub(crate) fn wait_for<C: Condition>(
        &self,
        spec: Spec,
        known: i64,
        condition: C,
    ) -> Waiting<C> {
        self.wait_with(spec, known, condition, false)
    }

    /// [`wait_for`](Self::wait_for), but a watcher created for it starts right after
    /// `known` (as for [`subscribe_from`](Watches::subscribe_from)), so the condition is
    /// judged on every event since, also those before the watcher existed: for a waiter to
    /// whom a state that came and went matters (a barrier released and raised again). On
    /// a member without etcd #18089's fix it starts at `known`, which etcd serves unsynced
    /// at first (its first events may come up to 100 ms late); with the fix, right after
    /// it, which is synced if nothing was written since. An existing watcher serves it as
    /// usual (with its history; a read if that does not reach back to `known`).
    pub(crate) fn wait_for_from<C: Condition>(
        &self,
        spec: Spec,
        known: i64,
        condition: C,
    ) -> Waiting<C> {
        self.wait_with(spec, known, condition, known > 0)
    }

    fn wait_with<C: Condition>(
        &self,
        spec: Spec,
        known: i64,
        condition: C,
        from_known: bool,
    ) -> Waiting<C> {
        let (sender, receiver) = unbounded_channel();
        let weak = sender.downgrade();
        let seen = Arc::new(AtomicI64::new(0));
        let judged = Judged {
            condition: Some(condition),
            known,
            sender,
            seen: seen.clone(),
        };
        let handle = self.subscribe_with(
            spec,
            known,
            Box::new(judged),
            Some(&self.waiters),
            from_known,
        );
        Waiting {
            handle,
            sender: weak,
            receiver,
            seen,
        }
    }
}

/// A waiter's subscription (see [`Watches::wait_for`]); dropping it unsubscribes.
pub(crate) struct Waiting<C: Condition> {
    handle: Subscribed,
    /// Weak, so that the channel closes when the task is gone (`next` then fails).
    sender: WeakUnboundedSender<Wake<C::Verdict>>,
    receiver: UnboundedReceiver<Wake<C::Verdict>>,
    seen: Arc<AtomicI64>,
}

impl<C: Condition> Waiting<C> {
    /// Whether this is the only subscription to its spec now.
    pub(crate) fn is_alone(&self) -> bool {
        self.handle.is_alone()
    }

    /// The newest revision of an event the watcher has delivered to this waiter (0 before
    /// the first). etcd sends a watcher's events in revision order, and a watcher it
    /// registered *unsynced* gets none until its sync loop catches it up: once this is at or
    /// past a revision, the watcher has delivered every event up to it.
    pub(crate) fn seen_through(&self) -> i64 {
        self.seen.load(Ordering::Relaxed)
    }

    /// Replaces what this waiter waits for (after it read the state again, at revision
    /// `known`): the new condition is judged on the history after `known`, or the waiter is
    /// told to read again if the history does not reach back that far.
    pub(crate) fn wait_again(&self, known: i64, condition: C) {
        let Some(sender) = self.sender.upgrade() else {
            return; // the task is gone: `next` says so
        };
        let judged = Judged {
            condition: Some(condition),
            known,
            sender,
            seen: self.seen.clone(),
        };
        let _ = self.handle.commands.send(Command::Replace {
            spec: self.handle.spec.clone(),
            id: self.handle.id,
            known,
            receiver: Box::new(judged),
        });
    }

    /// The next wake-up; `Failed(Closed)` once the client's runtime is gone.
    pub(crate) async fn next(&mut self) -> Wake<C::Verdict> {
        match self.receiver.recv().await {
            Some(wake) => wake,
            None => Wake::Failed(Error::Closed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::kv::KeyValue;
    use crate::transport::watch::EventKind;

    /// Decided at the first event at or after `at`.
    struct Reaches(i64);

    impl Condition for Reaches {
        type Verdict = i64;

        fn apply(&mut self, batch: &[Event]) -> Option<i64> {
            batch
                .iter()
                .map(|e| e.kv.mod_revision)
                .find(|rev| *rev >= self.0)
        }
    }

    fn batch(revs: &[i64]) -> Batch {
        let events = revs.iter().map(|&rev| Event {
            kind: EventKind::Delete,
            kv: KeyValue {
                key: b"k".to_vec(),
                mod_revision: rev,
                ..Default::default()
            },
        });
        Arc::new(events.collect())
    }

    #[test]
    fn a_waiter_is_told_where_the_watcher_stands_and_its_verdict_once() {
        let (sender, mut receiver) = unbounded_channel();
        let seen = Arc::new(AtomicI64::new(0));
        let mut judged = Judged {
            condition: Some(Reaches(12)),
            known: 10,
            sender,
            seen: seen.clone(),
        };
        assert!(judged.tell(Delivery::From {
            after: 10,
            fresh: false
        }));
        assert!(judged.events(&batch(&[11])));
        assert!(judged.events(&batch(&[12, 13])));
        assert!(judged.events(&batch(&[14])));
        assert!(matches!(
            receiver.try_recv(),
            Ok(Wake::From {
                after: 10,
                fresh: false
            })
        ));
        assert!(matches!(receiver.try_recv(), Ok(Wake::Verdict(12))));
        // Every event counts for how far the watcher has delivered, also after the verdict.
        assert_eq!(seen.load(Ordering::Relaxed), 14);
        // Events are never passed on, nor anything after the verdict.
        assert!(receiver.try_recv().is_err());
        // A waiter that is gone stops listening once decided.
        drop(receiver);
        assert!(!judged.events(&batch(&[15])));
    }

    #[test]
    fn a_watcher_that_starts_after_what_the_waiter_knows_decides_nothing_until_it_reads() {
        let (sender, mut receiver) = unbounded_channel();
        let mut judged = Judged {
            condition: Some(Reaches(12)),
            known: 10,
            sender,
            seen: Arc::new(AtomicI64::new(0)),
        };
        // Events in (10, 11] are not on the watcher: what follows is not judged.
        assert!(judged.tell(Delivery::From {
            after: 11,
            fresh: true
        }));
        assert!(judged.events(&batch(&[12])));
        assert!(matches!(
            receiver.try_recv(),
            Ok(Wake::From {
                after: 11,
                fresh: true
            })
        ));
        assert!(receiver.try_recv().is_err(), "no verdict on a gap");
        // A watcher that starts at what it knows (a fresh one, here) keeps judging.
        let (sender, mut receiver) = unbounded_channel();
        let mut judged = Judged {
            condition: Some(Reaches(12)),
            known: 11,
            sender,
            seen: Arc::new(AtomicI64::new(0)),
        };
        assert!(judged.tell(Delivery::From {
            after: 11,
            fresh: true
        }));
        assert!(judged.events(&batch(&[12])));
        assert!(matches!(receiver.try_recv(), Ok(Wake::From { .. })));
        assert!(matches!(receiver.try_recv(), Ok(Wake::Verdict(12))));
    }

    /// What a waiter reads as "delivered through" is the newest revision its watcher
    /// handed it, verdict or not (a wait that polls an unsynced watcher stops polling once
    /// it is past the revision it read at).
    #[test]
    fn a_waiter_has_seen_through_the_newest_event_delivered_to_it() {
        let (sender, receiver) = unbounded_channel();
        let (commands, _) = unbounded_channel();
        let seen = Arc::new(AtomicI64::new(0));
        let waiting: Waiting<Reaches> = Waiting {
            handle: Subscribed {
                spec: Spec::key(b"k", crate::transport::watch::Only::Deletes),
                id: 1,
                commands,
                waiter: None,
            },
            sender: sender.downgrade(),
            receiver,
            seen: seen.clone(),
        };
        assert_eq!(waiting.seen_through(), 0, "nothing delivered yet");
        let mut judged = Judged {
            condition: Some(Reaches(30)),
            known: 10,
            sender,
            seen,
        };
        assert!(judged.tell(Delivery::From {
            after: 10,
            fresh: false
        }));
        assert!(judged.events(&batch(&[11, 17])));
        assert_eq!(waiting.seen_through(), 17);
        assert!(judged.events(&batch(&[23])));
        assert_eq!(waiting.seen_through(), 23);
    }
}
