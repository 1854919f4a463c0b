//! Cutting a name's history where its state is known, so that the tester (whose search
//! copies the whole remaining history at every step it tries) sees short windows.
//!
//! A cut goes between two operations where every operation called before it returned
//! before the next one was called: every order places all of the first ones before the
//! rest. It is taken only where the state there is the same in every order that the first
//! window allows (tokens issued, leases ended, and which keys hold, unless a removal
//! overlaps the acquire of the key it may remove); the next window starts from it.

use std::collections::{BTreeMap, BTreeSet};

use super::{Event, FencedLock, Mode, Op, Ret};

/// The windows of a history in which every operation has returned, each with the state it
/// starts from (the first: `first`).
pub(super) fn cut(mut events: Vec<Event>, first: FencedLock) -> Vec<(FencedLock, Vec<Event>)> {
    events.sort_by_key(|e| e.called);
    let mut windows = Vec::new();
    let mut state = first;
    let mut start = 0;
    let mut returned_by = 0;
    for i in 0..events.len() {
        if i > start
            && returned_by < events[i].called
            && let Some(next) = after(&state, &events[start..i])
        {
            windows.push((state, events[start..i].to_vec()));
            state = next;
            start = i;
        }
        returned_by = returned_by.max(events[i].returned.unwrap_or(u64::MAX));
    }
    windows.push((state, events[start..].to_vec()));
    windows
}

/// The state after `window` from `state`, if every order gives the same one.
fn after(state: &FencedLock, window: &[Event]) -> Option<FencedLock> {
    let mut next = state.clone();
    let mut acquired: BTreeMap<i64, (Mode, i64, &Event)> = BTreeMap::new();
    let mut gone = BTreeSet::new();
    let mut downgraded = BTreeSet::new();
    let mut handed = BTreeMap::new();
    let mut found_gone = Vec::new();
    for e in window {
        match (&e.op, &e.ret) {
            (Op::Acquire { mode, lease }, Ret::Acquired(t)) => {
                next.newest = next.newest.max(*t);
                if *mode == Mode::Exclusive {
                    next.last_exclusive = next.last_exclusive.max(*t);
                }
                if !state.held.contains_key(t) {
                    acquired.entry(*t).or_insert((*mode, *lease, e));
                }
            }
            (Op::Release { token, .. }, Ret::Released) | (Op::Observe(token), Ret::Absent) => {
                gone.insert(*token);
            }
            (Op::Release { token, lease }, _) => {
                found_gone.push((*token, *lease));
            }
            (Op::Downgrade(t), _) => {
                downgraded.insert(*t);
            }
            (Op::EndLease(lease), _) => {
                next.ended.insert(*lease);
            }
            (Op::HandOver { token, to }, _) => {
                handed.insert(*token, *to);
            }
            _ => {}
        }
    }
    // A release that found its key gone ended the hold if it was on the releaser's lease,
    // else left it (handed over): not cut where a hand-over in the window makes that
    // depend on the order.
    for (t, lease) in found_gone {
        let on = |held: i64| lease.is_none_or(|l| l == held);
        let holder = state.held.get(&t).map(|(_, l)| *l);
        let holder = holder.or_else(|| acquired.get(&t).map(|(_, l, _)| *l));
        if handed.contains_key(&t) && lease.is_some() {
            return None;
        }
        if holder.is_none_or(on) {
            gone.insert(t);
        }
    }
    // Keys held at the start: a removal in the window removes them (nothing brings a key
    // back); keys acquired in it: only if the removal surely came after the acquire (an
    // acquire of an ended lease cannot come after its end).
    let removes = |t: i64, lease: i64, e: &Event| match &e.op {
        Op::Remove(r) => *r == t,
        Op::RemoveAll => true,
        Op::EndLease(l) => *l == lease,
        Op::LeaseKeys { lease: l, upto } => *l == lease && t <= *upto,
        _ => false,
    };
    let held_before: Vec<(i64, i64)> = state.held.iter().map(|(t, (_, l))| (*t, *l)).collect();
    for (t, lease) in held_before {
        if gone.contains(&t) || window.iter().any(|e| removes(t, lease, e)) {
            next.held.remove(&t);
        }
    }
    for (t, (mode, lease, acquire)) in acquired {
        let mut held = !gone.contains(&t);
        for e in window.iter().filter(|e| removes(t, lease, e)) {
            if !held {
                break;
            }
            let before = e.returned.is_some_and(|r| r < acquire.called);
            let after = acquire.returned.is_some_and(|r| r < e.called);
            if after || matches!(e.op, Op::EndLease(_)) {
                held = false;
            } else if !before {
                return None; // it may have come before the acquire, or after
            }
        }
        if held {
            next.held.insert(t, (mode, lease));
        }
    }
    // A hold that moved to another lease: its new lease from here on. Not cut where a
    // lease's end may have come before or after the move (which lease it ended with).
    let lease_ends = window
        .iter()
        .any(|e| matches!(e.op, Op::EndLease(_) | Op::LeaseKeys { .. }));
    if !handed.is_empty() && lease_ends {
        return None;
    }
    for (t, to) in handed {
        if let Some((_, lease)) = next.held.get_mut(&t) {
            *lease = to;
        }
    }
    for t in downgraded {
        if let Some((mode, _)) = next.held.get_mut(&t) {
            *mode = Mode::Shared;
        }
    }
    Some(next)
}
