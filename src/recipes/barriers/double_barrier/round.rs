//! What the keys under a double barrier's prefix say (a [`Round`]), what a participant does
//! next from there ([`Enter`]), and the [`Condition`] the watch task judges for a waiting
//! participant: the keys are kept up to date from the events, and the participant is woken
//! only once its next step is no longer "wait". The rules are in the module above
//! (`double_barrier/mod.rs`, "Key layout").

use std::collections::HashMap;

use crate::support::error::{Error, Result};
use crate::support::kv::{KeyValue, text};
use crate::transport::watch::{Event, EventKind};
use crate::transport::watches::waiting::Condition;

/// The last part of the ready key, `<name>/ready` (never a lease id in hex).
pub(crate) const READY: &[u8] = b"ready";

/// The keys under one double barrier's prefix, as of some revision.
#[derive(Debug, Clone, Default)]
pub(crate) struct Round {
    prefix: Vec<u8>,
    /// How many participants a round has, as we count: participants that say otherwise
    /// are not counted (the younger of a disagreeing pair refuses, see [`Enter::Refused`]).
    count: u64,
    /// Participant keys: create revision, the count they expect, and the round they were
    /// stamped with.
    members: HashMap<Vec<u8>, Member>,
    /// The ready key: its create revision and the round it names.
    ready: Option<(i64, i64)>,
}

#[derive(Debug, Clone, Copy)]
struct Member {
    created: i64,
    count: u64,
    stamp: Option<i64>,
}

/// A participant's next step in [`enter`](crate::DoubleBarrier::enter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Enter {
    /// Our key is in the round that filled at this revision: stamp it and return.
    In(i64),
    /// Enough participants are in at once, none has said so, and we are one of the first
    /// `count`: create the ready key for the round that filled at this revision.
    Decide(i64),
    /// The ready key (created at this revision) belongs to a round whose participants
    /// are all gone: remove it, then look again.
    ClearReady(i64),
    /// Our key is gone.
    Gone,
    /// Too few participants, or a round we are not part of is on: wait for a change.
    Wait,
    /// A participant older than us expects another count (why, for the error): we must
    /// not wait. The older one of a disagreeing pair goes on, not counting the younger.
    Refused(String),
}

impl Round {
    /// The keys read under `prefix`, for a participant of a barrier for `count`.
    pub(crate) fn read(prefix: &[u8], count: u64, kvs: Vec<KeyValue>) -> Result<Round> {
        let mut round = Round {
            prefix: prefix.to_vec(),
            count,
            ..Round::default()
        };
        for kv in kvs {
            round.put(&kv)?;
        }
        Ok(round)
    }

    /// A key created or changed. Anything that is not a participant key
    /// (`<name>/<lease hex>` = `<count>`, or `<count> <round>` with a round no older than
    /// itself) or the ready key (`<name>/ready` = `<round>`) is an error: the prefix is the
    /// barrier's.
    fn put(&mut self, kv: &KeyValue) -> Result<()> {
        let Some(last) = kv.key.strip_prefix(self.prefix.as_slice()) else {
            return Err(self.foreign(kv, "outside the barrier's prefix"));
        };
        let number = || {
            std::str::from_utf8(&kv.value)
                .ok()
                .and_then(|v| v.parse::<i64>().ok())
                .filter(|r| *r > 0)
        };
        if last == READY {
            let round = number().ok_or_else(|| self.foreign(kv, "not a round revision"))?;
            self.ready = Some((kv.create_revision, round));
        } else if is_lease_hex(last) {
            let value = std::str::from_utf8(&kv.value).unwrap_or_default();
            let mut words = value.split(' ');
            let count = words.next().and_then(|c| c.parse::<u64>().ok());
            let stamp = words.next().map(|r| r.parse::<i64>().ok());
            let member = match (count, stamp, words.next()) {
                (Some(count), None, None) if count > 0 => Member {
                    created: kv.create_revision,
                    count,
                    stamp: None,
                },
                (Some(count), Some(Some(round)), None)
                    if count > 0 && round >= kv.create_revision =>
                {
                    Member {
                        created: kv.create_revision,
                        count,
                        stamp: Some(round),
                    }
                }
                _ => return Err(self.foreign(kv, "not `<count>` or `<count> <round>`")),
            };
            self.members.insert(kv.key.clone(), member);
        } else {
            return Err(self.foreign(kv, "neither <name>/<lease hex> nor <name>/ready"));
        }
        Ok(())
    }

    fn foreign(&self, kv: &KeyValue, why: &str) -> Error {
        Error::InvalidArgument(format!(
            "double barrier {:?}: key {:?} = {:?} was not written by a double barrier ({why}); \
             every key under {:?} belongs to it: remove that key, or use another name",
            text(self.prefix.strip_suffix(b"/").unwrap_or(&self.prefix)),
            text(&kv.key),
            text(&kv.value),
            text(&self.prefix),
        ))
    }

    /// A key deleted.
    fn delete(&mut self, key: &[u8]) {
        if key.strip_prefix(self.prefix.as_slice()) == Some(READY) {
            self.ready = None;
        } else {
            self.members.remove(key);
        }
    }

    /// The participants that expect our count.
    fn agreeing(&self) -> impl Iterator<Item = &Member> {
        self.members.values().filter(|m| m.count == self.count)
    }

    /// The newest round anyone said has filled: the ready key's, or a participant's stamp.
    fn known_round(&self) -> Option<i64> {
        let stamps = self.agreeing().filter_map(|m| m.stamp);
        stamps.chain(self.ready.map(|(_, r)| r)).max()
    }

    /// Whether a participant of the round that filled at `round` is still in.
    pub(crate) fn any_up_to(&self, round: i64) -> bool {
        self.agreeing().any(|m| m.created <= round)
    }

    /// The ready key's create revision, if it names a round with nobody left in it.
    pub(crate) fn stale_ready(&self) -> Option<i64> {
        self.ready
            .filter(|(_, round)| !self.any_up_to(*round))
            .map(|(created, _)| created)
    }

    /// What the participant with key `own` does next.
    pub(crate) fn judge_enter(&self, own: &[u8]) -> Enter {
        let Some(mine) = self.members.get(own) else {
            return Enter::Gone;
        };
        let older_disagreeing = self
            .members
            .iter()
            .find(|(_, m)| m.count != self.count && m.created < mine.created);
        if let Some((key, them)) = older_disagreeing {
            return Enter::Refused(format!(
                "double barrier {:?}: participant {:?} expects {} participants, this one {}: \
                 every participant must give the same count",
                text(self.prefix.strip_suffix(b"/").unwrap_or(&self.prefix)),
                text(key),
                them.count,
                self.count
            ));
        }
        if let Some(round) = self.known_round() {
            if mine.created <= round {
                return Enter::In(round);
            }
            if self.any_up_to(round) {
                return Enter::Wait; // late for that round: wait until it is over
            }
        }
        if let Some(created) = self.stale_ready() {
            return Enter::ClearReady(created);
        }
        // No round on: the first `count` participants by age make one, if all are in.
        let mut created: Vec<i64> = self.agreeing().map(|m| m.created).collect();
        created.sort_unstable();
        let nth = usize::try_from(self.count.max(1)).unwrap_or(usize::MAX) - 1;
        let Some(&round) = created.get(nth) else {
            return Enter::Wait; // fewer than `count` are in
        };
        if mine.created <= round {
            Enter::Decide(round)
        } else {
            Enter::Wait
        }
    }

    /// Applies one event.
    fn apply(&mut self, event: &Event) -> Result<()> {
        match event.kind {
            EventKind::Put => self.put(&event.kv),
            EventKind::Delete => {
                self.delete(&event.kv.key);
                Ok(())
            }
        }
    }
}

/// Whether `text` is a lease id as this crate and Go write it: lowercase hex, 1 to 16
/// digits.
fn is_lease_hex(text: &[u8]) -> bool {
    (1..=16).contains(&text.len())
        && text
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// What a waiting participant waits for.
#[derive(Debug, Clone)]
pub(crate) enum Goal {
    /// In [`enter`](crate::DoubleBarrier::enter): a next step other than [`Enter::Wait`].
    Enter { own: Vec<u8> },
    /// In [`leave`](crate::DoubleBarrier::leave): every participant of the round that
    /// filled at this revision gone.
    Leave { round: i64 },
}

/// A waiting participant's condition, judged by the watch task on every batch: the
/// round kept up to date, known through revision `known`.
pub(crate) struct Watching {
    pub(crate) round: Round,
    pub(crate) known: i64,
    pub(crate) goal: Goal,
}

impl Watching {
    /// Whether the goal is reached (or the next step is no longer "wait").
    pub(crate) fn reached(&self) -> bool {
        match &self.goal {
            Goal::Enter { own } => self.round.judge_enter(own) != Enter::Wait,
            Goal::Leave { round } => !self.round.any_up_to(*round),
        }
    }
}

impl Condition for Watching {
    /// The round as it stands once the goal is reached, and the revision it is known
    /// through; or a key under the prefix that no double barrier wrote.
    type Verdict = Result<(Round, i64)>;

    /// Judged after each revision, not once per response: one response can span
    /// revisions, and a round that filled and emptied within it (a participant that
    /// entered and closed its session at once) still filled.
    fn apply(&mut self, batch: &[Event]) -> Option<Self::Verdict> {
        let after = self.known;
        let mut events = batch
            .iter()
            .filter(|e| e.kv.mod_revision > after)
            .peekable();
        while let Some(event) = events.next() {
            let revision = event.kv.mod_revision;
            if let Err(e) = self.round.apply(event) {
                return Some(Err(e));
            }
            self.known = revision;
            let last_of_revision = events
                .peek()
                .is_none_or(|next| next.kv.mod_revision != revision);
            if last_of_revision && self.reached() {
                return Some(Ok((std::mem::take(&mut self.round), self.known)));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, created: i64, value: &str) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            create_revision: created,
            mod_revision: created,
            ..Default::default()
        }
    }

    /// The keys as a participant of a barrier for `count` reads them.
    fn round(count: u64, kvs: &[(&str, i64, &str)]) -> Round {
        let kvs = kvs.iter().map(|(k, c, v)| kv(k, *c, v)).collect();
        Round::read(b"b/", count, kvs).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_first_count_participants_make_a_round_when_all_are_in() {
        let r = round(3, &[("b/a1", 3, "3"), ("b/b2", 5, "3")]);
        assert_eq!(r.judge_enter(b"b/a1"), Enter::Wait);
        let r = round(2, &[("b/a1", 3, "2"), ("b/b2", 5, "2")]);
        assert_eq!(r.judge_enter(b"b/a1"), Enter::Decide(5));
        assert_eq!(r.judge_enter(b"b/b2"), Enter::Decide(5));
        // A third that came with them is late for that round.
        let r = round(2, &[("b/a1", 3, "2"), ("b/b2", 5, "2"), ("b/c3", 7, "2")]);
        assert_eq!(r.judge_enter(b"b/c3"), Enter::Wait);
        assert_eq!(r.judge_enter(b"b/gone"), Enter::Gone);
    }

    #[test]
    fn a_stamp_or_the_ready_key_lets_the_round_in_and_keeps_the_late_out() {
        // The ready key's writer is gone, its stamp with it: another stamp still tells.
        let r = round(2, &[("b/a1", 3, "2 5"), ("b/b2", 5, "2"), ("b/c3", 7, "2")]);
        assert_eq!(r.judge_enter(b"b/b2"), Enter::In(5));
        assert_eq!(r.judge_enter(b"b/c3"), Enter::Wait);
        let r = round(
            2,
            &[("b/ready", 6, "5"), ("b/b2", 5, "2"), ("b/c3", 7, "2")],
        );
        assert_eq!(r.judge_enter(b"b/b2"), Enter::In(5));
        assert_eq!(r.judge_enter(b"b/c3"), Enter::Wait);
    }

    #[test]
    fn a_ready_key_whose_round_left_is_cleared_then_the_next_round_forms() {
        let mut r = round(
            2,
            &[("b/ready", 6, "5"), ("b/c3", 7, "2"), ("b/d4", 9, "2")],
        );
        assert_eq!(r.stale_ready(), Some(6));
        assert_eq!(r.judge_enter(b"b/c3"), Enter::ClearReady(6));
        r.delete(b"b/ready");
        assert_eq!(r.judge_enter(b"b/c3"), Enter::Decide(9));
    }

    #[test]
    fn the_younger_of_a_pair_that_disagrees_on_the_count_refuses() {
        let r = round(2, &[("b/a1", 3, "3"), ("b/b2", 5, "2")]);
        match r.judge_enter(b"b/b2") {
            Enter::Refused(why) => assert!(why.contains("b/a1") && why.contains("expects 3")),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // The older one goes on, not counting the younger.
        let r = round(3, &[("b/a1", 3, "3"), ("b/b2", 5, "2"), ("b/c3", 7, "3")]);
        assert_eq!(r.judge_enter(b"b/a1"), Enter::Wait);
        let r = round(2, &[("b/a1", 3, "2"), ("b/b2", 5, "3"), ("b/c3", 7, "2")]);
        assert_eq!(r.judge_enter(b"b/a1"), Enter::Decide(7));
    }

    #[test]
    fn leaving_waits_for_every_participant_of_the_round() {
        let mut w = Watching {
            round: round(
                2,
                &[("b/a1", 3, "2 5"), ("b/b2", 5, "2 5"), ("b/c3", 7, "2")],
            ),
            known: 8,
            goal: Goal::Leave { round: 5 },
        };
        let delete = |key: &str, rev| Event {
            kind: EventKind::Delete,
            kv: KeyValue {
                mod_revision: rev,
                ..kv(key, 0, "")
            },
        };
        assert!(w.apply(&[delete("b/a1", 9)]).is_none());
        // Old news changes nothing; the late one does not count.
        assert!(w.apply(&[delete("b/b2", 8)]).is_none());
        match w.apply(&[delete("b/b2", 10)]) {
            Some(Ok((_, 10))) => {}
            other => panic!("expected the round left at 10, got {other:?}"),
        }
    }

    #[test]
    fn a_round_that_filled_and_emptied_within_one_response_still_filled() {
        // B waits; A decides (the ready key and its stamp at 10) and its session closes
        // at 11, all in one response: B is in the round of 5.
        let mut w = Watching {
            round: round(2, &[("b/a1", 3, "2"), ("b/b2", 5, "2")]),
            known: 8,
            goal: Goal::Enter {
                own: b"b/b2".to_vec(),
            },
        };
        let event = |kind, key: &str, created, value: &str, rev| Event {
            kind,
            kv: KeyValue {
                mod_revision: rev,
                ..kv(key, created, value)
            },
        };
        let batch = [
            event(EventKind::Put, "b/ready", 10, "5", 10),
            event(EventKind::Put, "b/a1", 3, "2 5", 10),
            event(EventKind::Delete, "b/a1", 0, "", 11),
            event(EventKind::Delete, "b/ready", 0, "", 11),
        ];
        match w.apply(&batch) {
            Some(Ok((r, 10))) => assert_eq!(r.judge_enter(b"b/b2"), Enter::In(5)),
            other => panic!("expected the round of 5 at 10, got {other:?}"),
        }
    }

    #[test]
    fn keys_no_double_barrier_wrote_are_errors() {
        for (key, value) in [
            ("b/nothex", "2"),
            ("b/A1", "2"),
            ("b/a1", ""),
            ("b/a1", "x"),
            ("b/a1", "0"),
            ("b/a1", "2 2"), // a stamp older than the key
            ("b/a1", "2 5 7"),
            ("b/a1", "2  5"),
            ("b/ready", ""),
            ("b/ready", "-3"),
            ("b/a1/deeper", "2"),
        ] {
            let e = Round::read(b"b/", 2, vec![kv(key, 3, value)]).err();
            assert!(
                e.as_ref().is_some_and(Error::is_invalid_argument),
                "{key}={value}: {e:?}"
            );
        }
    }
}
