//! Crossing off the keys ahead: what a waiter in the line waits for, as a
//! [`Condition`] the watch task judges on the deletes under the name. The task applies it
//! to each batch as it arrives and wakes the waiter only with the outcome, so a handoff
//! wakes the one waiter it concerns. Why the last delete is proof of ownership:
//! docs/design/handoff.md.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::line::mode::Sorted;
use crate::support::clock;
use crate::transport::watch::{Event, EventKind};
use crate::transport::watches::waiting::Condition;

/// What a waiter waits for: every key in `keys` deleted (the keys ahead of `own` in a line,
/// exact at revision `known`), with no delete of `own` before.
#[derive(Debug, Clone)]
pub(crate) struct Awaited {
    pub(crate) own: Vec<u8>,
    /// The keys ahead, sorted by what they mean to `own`: cleared once none that blocks
    /// and fewer permits than there are remain.
    pub(crate) keys: Sorted,
    /// Passed back in [`Crossed::Cleared`]: whether `keys` were all the keys ahead.
    pub(crate) complete: bool,
    pub(crate) known: i64,
    /// Where to note when each key ahead was seen to go, for a wait that asks.
    pub(crate) departures: Option<Departures>,
}

/// When each key ahead of a wait was seen to go, on this client's clock: a lock-delay
/// asks whether a key's lease was still alive when the key went (then the key was
/// released, and a later end of its lease owes nothing). A key is seen to go when a delete
/// crosses it off, or when a read of the wait's place no longer finds it (then it went
/// before the read's answer: a later instant, so a proof of its lease's life at it holds
/// at the real one too).
#[derive(Debug, Clone, Default)]
pub(crate) struct Departures {
    /// The keys ahead when the wait began (the only ones that can go; none joins later).
    ahead: Arc<Vec<Vec<u8>>>,
    went: Arc<Mutex<HashMap<Vec<u8>, Instant>>>,
    news: Arc<tokio::sync::Notify>,
}

impl Departures {
    /// Departures of the keys `ahead` of a wait.
    pub(crate) fn of_keys<'a>(ahead: impl IntoIterator<Item = &'a Vec<u8>>) -> Departures {
        Departures {
            ahead: Arc::new(ahead.into_iter().cloned().collect()),
            ..Departures::default()
        }
    }

    fn record(&self, key: &[u8]) {
        if let Ok(mut map) = self.went.lock() {
            map.entry(key.to_vec()).or_insert_with(clock::now);
        }
        self.news.notify_one();
    }

    /// A read of the wait's place found only `remaining` ahead: every other key that was
    /// ahead went, by now at the latest.
    pub(crate) fn all_but<'a>(&self, remaining: impl IntoIterator<Item = &'a Vec<u8>>) {
        if self.ahead.is_empty() {
            return;
        }
        let remaining: HashSet<&Vec<u8>> = remaining.into_iter().collect();
        let gone: Vec<&Vec<u8>> = self
            .ahead
            .iter()
            .filter(|key| !remaining.contains(key))
            .collect();
        let now = clock::now();
        let mut news = false;
        if let Ok(mut map) = self.went.lock() {
            for key in gone {
                if !map.contains_key(key) {
                    map.insert(key.clone(), now);
                    news = true;
                }
            }
        }
        if news {
            self.news.notify_one();
        }
    }

    /// Resolves once a key went since the last call (a key that went before the first
    /// call counts).
    pub(crate) async fn one_went(&self) {
        self.news.notified().await;
    }

    /// When `key` was seen to go, if a delete crossed it off or a read no longer found it.
    pub(crate) fn of(&self, key: &[u8]) -> Option<Instant> {
        self.went.lock().ok().and_then(|map| map.get(key).copied())
    }
}

/// The outcome of waiting for [`Awaited`] keys.
#[derive(Debug, Clone)]
pub(crate) enum Crossed {
    /// The last of them was deleted, with every event through revision `at` applied and no
    /// delete of the waiter's own key.
    Cleared { at: i64, complete: bool },
    /// The waiter's own key was deleted first.
    OwnDeleted,
}

impl Condition for Awaited {
    type Verdict = Crossed;

    /// Applies one batch; the outcome, once there is one.
    fn apply(&mut self, batch: &[Event]) -> Option<Crossed> {
        let mut through = self.known;
        let mut own_deleted = false;
        for event in batch.iter().filter(|e| e.kv.mod_revision > self.known) {
            through = through.max(event.kv.mod_revision);
            if event.kind != EventKind::Delete {
                continue;
            }
            if event.kv.key == self.own {
                own_deleted = true;
            } else if self.keys.remove(&event.kv.key)
                && let Some(departures) = &self.departures
            {
                departures.record(&event.kv.key);
            }
        }
        self.known = through;
        // A batch can span revisions (etcd's catch-up): all of it counts before deciding.
        if own_deleted {
            Some(Crossed::OwnDeleted)
        } else if self.keys.is_clear() {
            Some(Crossed::Cleared {
                at: through,
                complete: self.complete,
            })
        } else {
            None
        }
    }
}

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
            departures: None,
        }
    }

    #[test]
    fn a_permit_is_cleared_when_fewer_than_n_older_permits_remain() {
        let keys = Mode::Permits(2, 1)
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
            departures: None,
        };
        // The reader ahead blocks; one permit may remain.
        assert!(a.apply(&[delete(b"l/1.permits-2", 11)]).is_none());
        assert!(matches!(
            a.apply(&[delete(b"l/3.shared", 12)]),
            Some(Crossed::Cleared { at: 12, .. })
        ));
    }

    #[test]
    fn k_permits_are_cleared_when_the_older_permits_weigh_at_most_n_minus_k() {
        // 4 permits, a request of 2: ahead weigh 1 + 3 + 1 = 5, at most 2 may remain.
        let keys = Mode::Permits(4, 2)
            .sort(
                b"l/",
                ["l/1.permits-4", "l/2.permits-4.x3", "l/3.permits-4"]
                    .iter()
                    .map(|k| k.as_bytes().to_vec()),
            )
            .unwrap_or_else(|d| panic!("{d:?}"));
        let mut a = Awaited {
            own: b"l/4.permits-4.x2".to_vec(),
            keys,
            complete: true,
            known: 10,
            departures: None,
        };
        // Two single permits go: 3 remain, one too many.
        assert!(a.apply(&[delete(b"l/1.permits-4", 11)]).is_none());
        assert!(a.apply(&[delete(b"l/3.permits-4", 12)]).is_none());
        // The weight of 3 goes: 0 remain.
        assert!(matches!(
            a.apply(&[delete(b"l/2.permits-4.x3", 13)]),
            Some(Crossed::Cleared { at: 13, .. })
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
            Some(Crossed::Cleared {
                at: 14,
                complete: true,
            }) => {}
            other => panic!("expected Cleared at 14, got {other:?}"),
        }
    }

    #[test]
    fn departures_note_only_the_keys_ahead_when_they_go() {
        let departures = Departures::default();
        let mut a = Awaited {
            departures: Some(departures.clone()),
            ..awaiting(&[b"l/a", b"l/b"], 10)
        };
        assert!(
            a.apply(&[delete(b"l/newer", 11), delete(b"l/a", 12)])
                .is_none()
        );
        assert!(departures.of(b"l/a").is_some(), "a key ahead that went");
        assert!(departures.of(b"l/b").is_none(), "still there");
        assert!(departures.of(b"l/newer").is_none(), "never ahead");
    }

    #[test]
    fn a_read_that_no_longer_finds_a_key_ahead_notes_it_gone_once() {
        let keys: Vec<Vec<u8>> = vec![b"l/a".to_vec(), b"l/b".to_vec(), b"l/c".to_vec()];
        let departures = Departures::of_keys(&keys);
        departures.record(b"l/a");
        let crossed = departures.of(b"l/a");
        departures.all_but([&keys[2]]);
        assert_eq!(departures.of(b"l/a"), crossed, "the first sighting stands");
        let read = departures.of(b"l/b").expect("gone by the read");
        assert!(read >= crossed.expect("crossed off"));
        assert!(departures.of(b"l/c").is_none(), "still ahead");
        departures.all_but([]);
        assert!(departures.of(b"l/c").is_some(), "gone once none is ahead");
        assert_eq!(departures.of(b"l/b"), Some(read));
    }

    #[test]
    fn own_delete_in_the_same_batch_wins() {
        // One batch can span revisions: the own key's delete after the last key ahead
        // must not be read as a clear turn.
        let mut a = awaiting(&[b"l/a"], 10);
        assert!(matches!(
            a.apply(&[delete(b"l/a", 11), delete(b"l/own", 12)]),
            Some(Crossed::OwnDeleted)
        ));
        let mut a = awaiting(&[b"l/a"], 10);
        assert!(matches!(
            a.apply(&[delete(b"l/own", 11)]),
            Some(Crossed::OwnDeleted)
        ));
    }
}
