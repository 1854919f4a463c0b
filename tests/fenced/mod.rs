//! An outside judge of lock histories (issue 52): `stateright`'s `LinearizabilityTester`
//! against a sequential fenced lock, shared by the randomized checker (real etcd) and the
//! deterministic simulation. Neither the tester nor its search is ours; the sequential
//! specification below and the adapters that record histories are.
//!
//! **The specification.** One object per name: the keys that hold it (each with its mode,
//! its lease and its fencing token), the tokens issued so far, and the leases that ended.
//!
//! - `Acquire` returns token `t` only if the name is free for its mode (nothing for an
//!   exclusive hold, no exclusive hold for a reader, fewer than N permits taken), its lease
//!   has not ended, and `t` is newer than every token issued before it (an exclusive hold)
//!   or than the last exclusive one (a reader, a permit). The same token again on the same
//!   lease is the same hold (a re-campaign, or a key adopted after a restart).
//! - `Release(t)` deleted the key only if `t` holds on the releaser's lease (and ends it).
//!   One that found the key gone (`LockLost`) may have deleted it itself: a first attempt
//!   whose answer was lost, then a retry that found nothing (the simulation's lost answers
//!   show it), so it only says the key is gone when it returns, if it was on the
//!   releaser's lease: a release compares the lease, and leaves a key handed over alone.
//! - `Observe(t)` (a guarded write's outcome, or the simulation's look at the store)
//!   finds the key only while `t` holds.
//! - What else ends a hold: an operator delete (`RemoveAll`), the end of its lease
//!   (`EndLease`: revoked, closed, or left to expire; a lease that ended never holds
//!   again), a removal the client sent and never saw answered (`Remove`, usually pending:
//!   it may apply at any time after it was sent, or never), and what a crashed process had
//!   on its way (`LeaseKeys`: its lease's keys up to a revision).
//! - `HandOver(t, to)`: an exclusive hold `t` goes on under lease `to` (a leadership handed
//!   over keeps its key and token); only while `t` holds. The successor's acquire then
//!   returns `t` on lease `to`: the same hold.
//!
//! So a key may go only when something could remove it, never comes back, and a name is
//! never held by two conflicting keys: a history passes if some order of its operations,
//! each placed between its call and its return, satisfies all of that. A holder that lost
//! its key without knowing is allowed (its lease ended, or an operator deleted it); what a
//! holder *believes* is not judged here (`lost()` within the bound is the analysis's job).
//!
//! Linearizability is local, so each name is checked on its own (an operation on every
//! name, as a lease's end, goes into each). The tester's search has no memo and copies the
//! remaining history at every step it tries, so what it is given is made small first,
//! keeping exactly the verdicts: looks another look implies and operations that never
//! returned are settled (`reduce.rs`), each name's history is cut into windows where its
//! state is known (`windows.rs`), removals are tried last, and an acquire that would leave
//! an older token no place is refused at once. Each check runs on a thread with a large
//! stack under a step budget per window; a window it could not settle within the budget
//! is reported as undecided, not as passed. `FENCED_DUMP=1` prints a failing window,
//! `FENCED_WINDOWS=1` every window's size, lanes, steps and time.

#![allow(dead_code)]

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

/// How a hold shares its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A mutex, a write lock, leadership.
    Exclusive,
    /// A read lock.
    Shared,
    /// `take` permits of a semaphore of `of`.
    Permits { of: u32, take: u32 },
}

/// An operation on one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Acquire {
        mode: Mode,
        lease: i64,
    },
    /// The release of hold `token` by a holder on `lease` (`None`: not known, any): it
    /// deletes the key only while the key is on that lease, as the client compares it.
    Release {
        token: i64,
        lease: Option<i64>,
    },
    Observe(i64),
    /// A write hold that goes on as a read with no gap.
    Downgrade(i64),
    Remove(i64),
    RemoveAll,
    EndLease(i64),
    /// The keys of `lease` created up to revision `upto` may be removed (what a crashed
    /// process had on its way; an operator delete of a key, which names a lease).
    LeaseKeys {
        lease: i64,
        upto: i64,
    },
    /// The exclusive hold `token` goes on, on lease `to`: a leadership handed over (its
    /// key kept its create revision and moved to the successor's lease).
    HandOver {
        token: i64,
        to: i64,
    },
}

/// What it returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ret {
    Acquired(i64),
    Released,
    Gone,
    Present,
    Absent,
    Done,
}

/// One operation of a history: `called` and `returned` are positions on one clock shared
/// by every caller (ties count as overlapping); `returned: None` never returned.
#[derive(Debug, Clone)]
pub struct Event {
    pub name: Option<String>,
    pub op: Op,
    pub ret: Ret,
    pub called: u64,
    pub returned: Option<u64>,
}

/// The sequential fenced lock of one name.
#[derive(Debug, Clone, Default)]
pub struct FencedLock {
    held: BTreeMap<i64, (Mode, i64)>,
    ended: BTreeSet<i64>,
    newest: i64,
    last_exclusive: i64,
    /// Steps the search has taken, shared by every clone: once past the budget, no step
    /// is valid and the search ends.
    steps: Rc<Cell<u64>>,
    budget: u64,
    /// When the whole check gives up: every window not settled by then is undecided (a
    /// search that copies its history at each step must never hold up a run).
    deadline: Option<Instant>,
    /// The tokens of the completed acquires given to the tester, each with whether it is
    /// exclusive, and those placed so far: for pruning only (see [`FencedLock::acquire`]).
    tokens: Rc<Vec<(i64, bool)>>,
    placed: BTreeSet<i64>,
}

impl FencedLock {
    fn new(budget: u64) -> FencedLock {
        FencedLock {
            budget,
            ..FencedLock::default()
        }
    }

    fn free_for(&self, mode: Mode) -> bool {
        let mut holders = self.held.values().map(|(m, _)| *m);
        match mode {
            Mode::Exclusive => self.held.is_empty(),
            Mode::Shared => holders.all(|m| m == Mode::Shared),
            Mode::Permits { of, take } => {
                let mut taken = 0;
                for m in holders {
                    match m {
                        Mode::Permits { of: o, take: t } if o == of => taken += t,
                        _ => return false,
                    }
                }
                taken + take <= of
            }
        }
    }

    /// Whether hold `token` is on `lease` (any lease for `None`; true if it does not hold).
    fn on(&self, token: i64, lease: Option<i64>) -> bool {
        match (self.held.get(&token), lease) {
            (Some((_, held)), Some(lease)) => *held == lease,
            _ => true,
        }
    }

    fn acquire(&mut self, mode: Mode, lease: i64, token: i64) -> bool {
        if let Some((_, l)) = self.held.get(&token) {
            self.placed.insert(token);
            return *l == lease; // the same hold again: a re-campaign, an adopted key
        }
        let fresh = match mode {
            Mode::Exclusive => token > self.newest,
            _ => token > self.last_exclusive,
        };
        if self.ended.contains(&lease) || !fresh || !self.free_for(mode) {
            return false;
        }
        // Pruning, which accepts and refuses the same histories: after a token, no older
        // exclusive one can be acquired (it would not be the newest), and after an
        // exclusive token no older one at all (a reader or permit is newer than the last
        // exclusive token). So an acquire that leaves such a completed acquire unplaced
        // leads nowhere: refused at once instead of after trying every order of the rest.
        let exclusive = mode == Mode::Exclusive;
        let stranded = self.tokens.iter().any(|&(t, x)| {
            t < token
                && (x || exclusive)
                && !self.placed.contains(&t)
                && !self.held.contains_key(&t)
        });
        if stranded {
            return false;
        }
        self.placed.insert(token);
        self.held.insert(token, (mode, lease));
        self.newest = self.newest.max(token);
        if mode == Mode::Exclusive {
            self.last_exclusive = token;
        }
        true
    }

    /// The effect of an operation that cannot fail (and of one that never returned).
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Remove(token) => {
                self.held.remove(token);
            }
            Op::Release { token, lease } => {
                if self.on(*token, *lease) {
                    self.held.remove(token);
                }
            }
            Op::RemoveAll => self.held.clear(),
            Op::EndLease(lease) => {
                self.held.retain(|_, (_, l)| l != lease);
                self.ended.insert(*lease);
            }
            Op::LeaseKeys { lease, upto } => self.held.retain(|t, (_, l)| l != lease || t > upto),
            Op::Downgrade(token) => {
                if let Some((mode, _)) = self.held.get_mut(token) {
                    *mode = Mode::Shared;
                }
            }
            Op::HandOver { token, to } => {
                if let Some((_, lease)) = self.held.get_mut(token) {
                    *lease = *to;
                }
            }
            Op::Acquire { .. } | Op::Observe(_) => {}
        }
    }
}

impl SequentialSpec for FencedLock {
    type Op = Op;
    type Ret = Ret;

    fn invoke(&mut self, op: &Op) -> Ret {
        self.steps.set(self.steps.get() + 1);
        self.apply(op);
        Ret::Done
    }

    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        self.steps.set(self.steps.get() + 1);
        if self.steps.get() > self.budget {
            return false;
        }
        if self.steps.get().is_multiple_of(1024)
            && self.deadline.is_some_and(|d| Instant::now() > d)
        {
            self.steps.set(self.budget + 1);
            return false;
        }
        match (op, ret) {
            (Op::Acquire { mode, lease }, Ret::Acquired(token)) => {
                self.acquire(*mode, *lease, *token)
            }
            (Op::Release { token, lease }, Ret::Released) => {
                let holds = self.held.contains_key(token) && self.on(*token, *lease);
                self.apply(op);
                holds
            }
            (Op::Observe(token), Ret::Present) => self.held.contains_key(token),
            (Op::Observe(token), Ret::Absent) => !self.held.contains_key(token),
            (Op::HandOver { token, to }, Ret::Done) => {
                let exclusive = matches!(self.held.get(token), Some((Mode::Exclusive, _)));
                self.apply(op);
                exclusive && !self.ended.contains(to)
            }
            // The key is gone when the release returns, maybe by its own first attempt,
            // whose answer was lost before a retry found nothing (`LockLost`); or it was
            // on another lease (handed over), which the release leaves alone.
            (Op::Release { .. }, Ret::Gone) => {
                self.apply(op);
                true
            }
            (Op::Downgrade(token), Ret::Done) => {
                let exclusive = matches!(self.held.get(token), Some((Mode::Exclusive, _)));
                self.apply(op);
                exclusive
            }
            (Op::Remove(_) | Op::RemoveAll | Op::EndLease(_) | Op::LeaseKeys { .. }, Ret::Done) => {
                self.apply(op);
                true
            }
            _ => false,
        }
    }
}

/// What a check found.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Names checked.
    pub names: usize,
    /// Operations given to the tester (an operation on every name counts once per name).
    pub operations: usize,
    /// Of those, operations that never returned.
    pub pending: usize,
    /// Windows the names' histories were cut into (`windows.rs`).
    pub windows: usize,
    /// Steps of the tester's search.
    pub steps: u64,
    /// Time the tester took.
    pub took: Duration,
    /// Names whose history is not linearizable, each with the operation no order can
    /// place (the first return of the shortest prefix that fails).
    pub failures: Vec<String>,
    /// Windows whose search ran out of budget.
    pub undecided: Vec<String>,
}

impl Verdict {
    pub fn add(&mut self, other: Verdict) {
        self.names += other.names;
        self.operations += other.operations;
        self.pending += other.pending;
        self.windows += other.windows;
        self.steps += other.steps;
        self.took += other.took;
        self.failures.extend(other.failures);
        self.undecided.extend(other.undecided);
    }

    pub fn summary(&self) -> String {
        format!(
            "linearizability (stateright): {} names, {} operations ({} never returned) in {} \
             windows, {} search steps, {:.1} ms; {} not linearizable, {} undecided",
            self.names,
            self.operations,
            self.pending,
            self.windows,
            self.steps,
            self.took.as_secs_f64() * 1000.0,
            self.failures.len(),
            self.undecided.len()
        )
    }
}

/// Checks a history, name by name, on a thread of its own (a deep search needs a deep
/// stack), with at most `budget` search steps per window and `limit` in all: what is not
/// settled by then is undecided, never passed.
pub fn check(events: Vec<Event>, budget: u64, limit: Duration) -> Verdict {
    let deadline = Instant::now() + limit;
    std::thread::Builder::new()
        .name("linearizability".into())
        .stack_size(1 << 30)
        .spawn(move || check_here(events, budget, deadline))
        .expect("a thread for the check")
        .join()
        .expect("the check did not panic")
}

fn check_here(events: Vec<Event>, budget: u64, deadline: Instant) -> Verdict {
    let (every, named): (Vec<Event>, Vec<Event>) =
        events.into_iter().partition(|e| e.name.is_none());
    let mut by_name: BTreeMap<String, Vec<Event>> = BTreeMap::new();
    for event in named {
        let name = event.name.clone().unwrap_or_default();
        by_name.entry(name).or_default().push(event);
    }
    let mut verdict = Verdict::default();
    for (name, mut events) in by_name {
        events.extend(every.iter().cloned());
        let started = Instant::now();
        verdict.pending += events.iter().filter(|e| e.returned.is_none()).count();
        let events = reduce::settle(reduce::thin(reduce::untaken_hand_overs(events)));
        verdict.names += 1;
        verdict.operations += events.len();
        let windows = windows::cut(
            events,
            FencedLock {
                deadline: Some(deadline),
                ..FencedLock::new(budget)
            },
        );
        verdict.windows += windows.len();
        for (start, events) in windows {
            let feed = Feed::new(&events);
            let took = Instant::now();
            let (ok, steps) = feed.linearizable(&start, feed.events.len());
            verdict.steps += steps;
            if std::env::var_os("FENCED_WINDOWS").is_some() {
                let lanes = feed.lanes.iter().max().map_or(0, |l| l + 1);
                let took = took.elapsed().as_secs_f64() * 1000.0;
                println!(
                    "{name}: {} ops, {lanes} lanes, {steps} steps, {took:.1} ms",
                    events.len()
                );
                if steps > 100_000 {
                    let base = events.first().map_or(0, |e| e.called);
                    for (e, lane) in events.iter().zip(&feed.lanes) {
                        let r = e.returned.map_or(0, |r| r - base) / 1_000_000;
                        let c = (e.called - base) / 1_000_000;
                        println!("  lane {lane} {c:>6}..{r:<6} {:?} -> {:?}", e.op, e.ret);
                    }
                }
            }
            if !ok && steps > budget {
                verdict
                    .undecided
                    .push(format!("{name}: {} operations", events.len()));
            } else if !ok {
                let at = feed.first_failure(&start);
                if std::env::var_os("FENCED_DUMP").is_some() {
                    println!("{name} from {start:?}");
                    for e in &events {
                        println!(
                            "{name} {:>6} {:>8?} {:?} -> {:?}",
                            e.called, e.returned, e.op, e.ret
                        );
                    }
                }
                verdict.failures.push(format!(
                    "{name}: {} operations; no order places {}",
                    events.len(),
                    feed.describe(at)
                ));
                break;
            }
        }
        verdict.took += started.elapsed();
    }
    verdict
}

/// A name's history as the tester takes it: calls and returns in order, each operation
/// on a lane (a thread id: a lane runs one operation at a time, and one that never returns
/// keeps its lane).
struct Feed<'a> {
    events: Vec<(u64, bool, usize)>,
    ops: &'a [Event],
    lanes: Vec<usize>,
}

impl<'a> Feed<'a> {
    fn new(ops: &'a [Event]) -> Feed<'a> {
        // Calls before returns at one position: operations that touch are concurrent.
        let mut events: Vec<(u64, bool, usize)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            events.push((op.called, false, i));
            if let Some(returned) = op.returned {
                events.push((returned.max(op.called), true, i));
            }
        }
        events.sort();
        // The search tries lanes in order at every step, and a removal fits almost
        // anywhere: tried first, removals went in early and the search backtracked through
        // whole windows to find that a later look still saw the key. So removals share
        // lanes of their own, after the callers' lanes: tried only where nothing else fits.
        let removal = |i: usize| {
            matches!(
                ops[i].op,
                Op::Remove(_) | Op::RemoveAll | Op::EndLease(_) | Op::LeaseKeys { .. }
            )
        };
        let mut lanes = vec![0; ops.len()];
        let mut next = 0;
        for group in [false, true] {
            let mut free: BTreeSet<usize> = BTreeSet::new();
            for &(_, returns, i) in events.iter().filter(|(_, _, i)| removal(*i) == group) {
                if returns {
                    free.insert(lanes[i]);
                } else {
                    lanes[i] = free.pop_first().unwrap_or_else(|| {
                        next += 1;
                        next - 1
                    });
                }
            }
        }
        Feed { events, ops, lanes }
    }

    /// Whether the first `upto` calls and returns are linearizable from `start`, and the
    /// steps taken.
    fn linearizable(&self, start: &FencedLock, upto: usize) -> (bool, u64) {
        let mut spec = start.clone();
        spec.steps = Rc::new(Cell::new(0));
        let steps = spec.steps.clone();
        let returned: BTreeSet<usize> = (self.events[..upto].iter())
            .filter(|(_, returns, _)| *returns)
            .map(|(_, _, i)| *i)
            .collect();
        let tokens =
            returned
                .into_iter()
                .filter_map(|i| match (&self.ops[i].op, &self.ops[i].ret) {
                    (Op::Acquire { mode, .. }, Ret::Acquired(t)) => {
                        Some((*t, *mode == Mode::Exclusive))
                    }
                    _ => None,
                });
        spec.tokens = Rc::new(tokens.collect());
        spec.placed = BTreeSet::new();
        let mut tester = LinearizabilityTester::new(spec);
        for &(_, returns, i) in &self.events[..upto] {
            let fed = if returns {
                tester.on_return(self.lanes[i], self.ops[i].ret.clone())
            } else {
                tester.on_invoke(self.lanes[i], self.ops[i].op.clone())
            };
            fed.expect("one operation at a time per lane");
        }
        let ok = tester.serialized_history().is_some();
        (ok, steps.get())
    }

    /// The shortest failing prefix (linearizability is prefix-closed): its last event.
    fn first_failure(&self, start: &FencedLock) -> usize {
        let (mut good, mut bad) = (0, self.events.len());
        while bad - good > 1 {
            let mid = (good + bad) / 2;
            if self.linearizable(start, mid).0 {
                good = mid;
            } else {
                bad = mid;
            }
        }
        bad - 1
    }

    fn describe(&self, at: usize) -> String {
        let (_, _, i) = self.events[at];
        let op = &self.ops[i];
        format!(
            "{:?} -> {:?} (called at {}, returned at {:?})",
            op.op, op.ret, op.called, op.returned
        )
    }
}

mod reduce;
#[cfg(feature = "simulation")]
pub mod sim;
mod windows;
