//! Which watch ids a stream's server uses, and the translation to ours.
//!
//! The client names its watchers itself (`WatchCreateRequest.watch_id`, at or above
//! [`FIRST_OWN_ID`]) and matches etcd's answers by those names. An etcd member keeps them.
//! etcd's gRPC proxy (`etcd grpc-proxy start`) does not: it numbers the watchers of each
//! client stream itself, 0, 1, 2, … in the order it accepts their create requests, and
//! answers with its own numbers. Worse, a proxy confirms a watcher that joins one of its
//! running broadcasts at once but a new one only when etcd confirms it, so its `created`
//! answers need not come in the order of the requests: matching them in order (what Go's
//! client does, sending one create at a time) would hand one watcher another's events.
//!
//! So each stream keeps, for every create it sent and that is not answered yet, our id and
//! the number a numbering server will give it. The first accepted answer tells which of the
//! two the server uses (our ids and the proxy's numbers never meet: a proxy would need
//! 2^40 watchers on one stream). Every later response is translated to our id, and a cancel
//! is sent with the server's id. A refusal (`created` and `canceled`, id -1, on etcd and the
//! proxy alike) belongs to the oldest create not answered: etcd answers creates in order, and
//! a proxy refuses before numbering, so it gives that number to the next create instead.

use std::collections::{HashMap, VecDeque};

/// The first watch id the client gives its own watchers.
pub(crate) const FIRST_OWN_ID: i64 = 1 << 40;

/// The id etcd (and its proxy) answer a refused create with.
const REFUSED: i64 = -1;

/// One stream's ids.
#[derive(Debug, Default)]
pub(crate) struct WatchIds {
    /// Whether the server keeps the ids we give; `None` until its first accepted answer.
    keeps_ours: Option<bool>,
    /// Creates sent and not answered yet, in order: our id (0: the server chooses) and the
    /// number a numbering server gives it.
    pending: VecDeque<(i64, i64)>,
    /// The number a numbering server gives the next create it accepts.
    next_theirs: i64,
    /// A numbering server's id → ours, and back, for the watchers it confirmed.
    to_ours: HashMap<i64, i64>,
    to_theirs: HashMap<i64, i64>,
}

impl WatchIds {
    /// Records a create request sent with id `ours` (0: the server chooses).
    pub(crate) fn sent_create(&mut self, ours: i64) {
        self.pending.push_back((ours, self.next_theirs));
        self.next_theirs += 1;
    }

    /// Whether the server numbers the watchers itself (etcd's gRPC proxy), once known.
    pub(crate) fn server_numbers(&self) -> Option<bool> {
        self.keeps_ours.map(|keeps| !keeps)
    }

    /// The ids to send a cancel for our watcher `ours` with: the server's, or both while
    /// the server has not said which it uses (a cancel for an id nobody has is ignored by
    /// etcd and by the proxy, and the two kinds never meet).
    pub(crate) fn cancel_ids(&mut self, ours: i64) -> Vec<i64> {
        let theirs = self.to_theirs.remove(&ours).or_else(|| {
            self.pending
                .iter()
                .find(|(o, _)| *o == ours)
                .map(|(_, theirs)| *theirs)
        });
        if let Some(theirs) = theirs {
            self.to_ours.remove(&theirs);
        }
        match (self.keeps_ours, theirs) {
            (Some(true), _) | (_, None) => vec![ours],
            (Some(false), Some(theirs)) => vec![theirs],
            (None, Some(theirs)) => vec![ours, theirs],
        }
    }

    /// Translates the id of a response from the server to ours, in place.
    pub(crate) fn translate(&mut self, created: bool, canceled: bool, watch_id: &mut i64) {
        if created {
            self.answered(watch_id);
            return;
        }
        if self.keeps_ours != Some(false) {
            return;
        }
        if let Some(&ours) = self.to_ours.get(watch_id) {
            if canceled {
                self.to_ours.remove(watch_id);
                self.to_theirs.remove(&ours);
            }
            *watch_id = ours;
        } else {
            // A watcher we cancelled (or never had): an id that is none of ours.
            *watch_id = REFUSED;
        }
    }

    fn answered(&mut self, watch_id: &mut i64) {
        if *watch_id == REFUSED {
            let Some((ours, _)) = self.pending.pop_front() else {
                return;
            };
            // A numbering server did not number it: the ones after it get one less.
            for (_, theirs) in self.pending.iter_mut() {
                *theirs -= 1;
            }
            self.next_theirs -= 1;
            if ours != 0 {
                *watch_id = ours;
            }
            return;
        }
        if *watch_id >= FIRST_OWN_ID
            && let Some(at) = self.pending.iter().position(|(o, _)| *o == *watch_id)
        {
            self.keeps_ours = Some(true);
            self.pending.remove(at);
            return;
        }
        if let Some(at) = self.pending.iter().position(|(_, t)| *t == *watch_id) {
            let Some((ours, theirs)) = self.pending.remove(at) else {
                return;
            };
            if ours == 0 {
                return; // the server chose; nothing to translate
            }
            self.keeps_ours = Some(false);
            self.to_ours.insert(theirs, ours);
            self.to_theirs.insert(ours, theirs);
            *watch_id = ours;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: i64 = FIRST_OWN_ID + 1;
    const B: i64 = FIRST_OWN_ID + 2;
    const C: i64 = FIRST_OWN_ID + 3;

    fn created(ids: &mut WatchIds, id: i64) -> i64 {
        let mut id = id;
        ids.translate(true, false, &mut id);
        id
    }

    #[test]
    fn a_member_keeps_our_ids() {
        let mut ids = WatchIds::default();
        ids.sent_create(A);
        ids.sent_create(B);
        assert_eq!(created(&mut ids, A), A);
        assert_eq!(ids.server_numbers(), Some(false));
        assert_eq!(created(&mut ids, B), B);
        let mut event = B;
        ids.translate(false, false, &mut event);
        assert_eq!(event, B);
        assert_eq!(ids.cancel_ids(A), vec![A]);
    }

    #[test]
    fn a_proxy_answering_out_of_order_is_matched_by_its_numbers() {
        let mut ids = WatchIds::default();
        ids.sent_create(A); // the proxy's 0: a new broadcast, confirmed late
        ids.sent_create(B); // 1: joins a running broadcast, confirmed at once
        assert_eq!(created(&mut ids, 1), B);
        assert_eq!(ids.server_numbers(), Some(true));
        assert_eq!(created(&mut ids, 0), A);
        let mut event = 0;
        ids.translate(false, false, &mut event);
        assert_eq!(event, A);
        let mut event = 1;
        ids.translate(false, false, &mut event);
        assert_eq!(event, B);
        ids.sent_create(C);
        // Cancelled before its answer: the proxy's number it will have.
        assert_eq!(ids.cancel_ids(C), vec![2]);
        assert_eq!(ids.cancel_ids(A), vec![0]);
        // A late event for a cancelled watcher is nobody's.
        let mut late = 0;
        ids.translate(false, false, &mut late);
        assert_eq!(late, REFUSED);
    }

    #[test]
    fn a_refusal_is_the_oldest_create_and_takes_no_number() {
        let mut ids = WatchIds::default();
        ids.sent_create(A);
        ids.sent_create(B);
        assert_eq!(created(&mut ids, REFUSED), A);
        // The proxy gave B the number A would have had.
        assert_eq!(created(&mut ids, 0), B);
    }

    #[test]
    fn a_cancel_before_the_server_said_goes_both_ways() {
        let mut ids = WatchIds::default();
        ids.sent_create(A);
        assert_eq!(ids.cancel_ids(A), vec![A, 0]);
    }
}
