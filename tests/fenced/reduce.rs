//! What the tester need not see: operations another one already implies, and returns for
//! the operations that never returned. Each step keeps exactly the histories that pass.

use std::collections::{BTreeMap, BTreeSet};

use super::{Event, Op, Ret};

/// Drops what another operation already says: the looks that found a key between the
/// first and the last look that found it (a key that went never comes back: no token is
/// issued twice, so it holds in between), and all but the first-called copy of a lease's
/// end (one end ends it; the others are then no-ops).
pub(super) fn thin(events: Vec<Event>) -> Vec<Event> {
    let mut span: BTreeMap<i64, (u64, u64)> = BTreeMap::new();
    let mut first_end: BTreeMap<i64, u64> = BTreeMap::new();
    for e in &events {
        match (&e.op, &e.ret) {
            (Op::Observe(t), Ret::Present) => {
                let s = span.entry(*t).or_insert((e.called, e.called));
                *s = (s.0.min(e.called), s.1.max(e.called));
            }
            (Op::EndLease(l), _) => {
                let at = first_end.entry(*l).or_insert(e.called);
                *at = (*at).min(e.called);
            }
            _ => {}
        }
    }
    let mut kept_end = BTreeSet::new();
    events
        .into_iter()
        .filter(|e| match (&e.op, &e.ret) {
            (Op::Observe(t), Ret::Present) => span
                .get(t)
                .is_none_or(|(a, b)| e.called == *a || e.called == *b),
            (Op::EndLease(l), _) => first_end[l] == e.called && kept_end.insert(*l),
            _ => true,
        })
        .collect()
}

/// Hand-overs no guard took. A successor whose wait answered a hand-over and then ended
/// anyway (its limit came as the adoption applied) returns no guard and removes the key it
/// may have adopted (`ownership/handover.rs`, `remove_after_answer`); one SIGKILLed leaves
/// it to its lease. So such a hold may end any time after the hand-over began: a removal
/// that never returns (checker seed 70419003244212: the successor's campaign timed out 20
/// ms after the adoption, its cleanup deleted the key, and the next waiter's acquire had no
/// order). And a hand-over that never returned and that no guard took may have applied or
/// not: with that removal, its hold ends where either would end it, so it is dropped (kept,
/// the search had to place it while its hold lasted, which made the rest of the name's
/// history one window: checker seed 76757429038322, 203 operations, undecided). A hold a
/// guard did take is judged as every hold.
pub(super) fn untaken_hand_overs(mut events: Vec<Event>) -> Vec<Event> {
    let taken: BTreeSet<(i64, i64)> = events
        .iter()
        .filter_map(|e| match (&e.op, &e.ret) {
            (Op::Acquire { lease, .. }, Ret::Acquired(token)) => Some((*token, *lease)),
            _ => None,
        })
        .collect();
    let mut orphans = Vec::new();
    events.retain(|e| match e.op {
        Op::HandOver { token, to } if !taken.contains(&(token, to)) => {
            orphans.push(Event {
                name: e.name.clone(),
                op: Op::Remove(token),
                ret: Ret::Done,
                called: e.called,
                returned: None,
            });
            e.returned.is_some()
        }
        _ => true,
    });
    events.extend(orphans);
    events
}

/// Gives every operation that never returned a return: the last return of an operation
/// that names its key or its lease (for a crashed process's removal, the keys of its lease
/// up to its revision), or its own call if later (after that a removal changes
/// nothing an operation can see but that the name is free, and no later acquire is of that
/// lease, so applying at once is as good as later, or never). The same histories pass, and the
/// tester's search, which tries every unreturned operation at every step on a thread of
/// its own, stays small.
pub(super) fn settle(events: Vec<Event>) -> Vec<Event> {
    // Every lease a token's hold was on: its acquirer's, and a hand-over's successor's
    // (an operation on the token counts for each: a later horizon is only more orders).
    let mut lease_of: BTreeMap<i64, BTreeSet<i64>> = BTreeMap::new();
    for e in &events {
        match (&e.op, &e.ret) {
            (Op::Acquire { lease, .. }, Ret::Acquired(token))
            | (Op::HandOver { token, to: lease }, _) => {
                lease_of.entry(*token).or_default().insert(*lease);
            }
            _ => {}
        }
    }
    let (mut by_token, mut by_lease) = (BTreeMap::new(), BTreeMap::new());
    let mut last = 0;
    for e in &events {
        let Some(returned) = e.returned else { continue };
        last = last.max(returned);
        let token = match (&e.op, &e.ret) {
            (_, Ret::Acquired(token)) => Some(*token),
            (
                Op::Release { token: t, .. } | Op::Observe(t) | Op::Downgrade(t) | Op::Remove(t),
                _,
            ) => Some(*t),
            (Op::HandOver { token, .. }, _) => Some(*token),
            _ => None,
        };
        let leases: Vec<i64> = match &e.op {
            Op::Acquire { lease, .. } => vec![*lease],
            _ => token
                .and_then(|t| lease_of.get(&t))
                .map(|leases| leases.iter().copied().collect())
                .unwrap_or_default(),
        };
        let keys = token.map(|t| (t, &mut by_token)).into_iter();
        for (key, map) in keys {
            let at: &mut u64 = map.entry(key).or_default();
            *at = (*at).max(returned);
        }
        for lease in leases {
            let at: &mut u64 = by_lease.entry(lease).or_default();
            *at = (*at).max(returned);
        }
    }
    events
        .into_iter()
        .map(|mut e| {
            if e.returned.is_none() {
                let horizon = match &e.op {
                    // A hand-over some guard took applied before that guard returned.
                    Op::Remove(t) | Op::HandOver { token: t, .. } => by_token.get(t).copied(),
                    Op::EndLease(l) => by_lease.get(l).copied(),
                    // Only the keys of its lease created up to `upto`: later keys of the
                    // same lease (a lease lives on across many holds) are not its business.
                    Op::LeaseKeys { lease, upto } => lease_of
                        .iter()
                        .filter(|(t, l)| l.contains(lease) && *t <= upto)
                        .filter_map(|(t, _)| by_token.get(t).copied())
                        .max(),
                    _ => Some(last),
                };
                // Called after it: it applies at once (it frees the name, and nothing
                // later names its key), no different from applying later or never.
                e.returned = Some(horizon.unwrap_or(e.called).max(e.called));
            }
            e
        })
        .collect()
}
