//! Multi-locks in the randomized checker (issue 30): one more thread per child takes
//! several of the workers' names at once (`ck-a`, `ck-b`, and a side of the read-write
//! lock `ck-rw`), 2 or 3 of them, given in a random order, so that the children take
//! overlapping sets in different orders while the workers take the same names one at a time
//! (Mutex, Election, read and write locks). Waits are `lock`, `lock_timeout`, `lock_with` a
//! token cancelled at a random moment, and `try_lock`.
//!
//! Each held multi-lock logs one `CS` line per name (`workload.rs`'s format: its key, its
//! token, the one interval of the whole set), so the checks of `analysis.rs` and
//! `liveness.rs` judge multi-locks and single holders of a name together: exclusion, write
//! order (its guarded writes compare every key), loss reports after an operator's delete.
//! Its own lines:
//!
//! * `MBEG <id> <name,name,...> <start>` and `MEND <id> <end> <outcome>` around each attempt;
//! * `MLEFT <id> <at> <left> <after> <keys>` after a failed attempt: the keys of our lease
//!   still under the set's names, then and one request timeout and a half later (all or
//!   none, `all_or_none.rs`);
//! * `MBAD <id> <what>` when a returned guard does not hold exactly the set.
//!
//! Liveness (`check`): while an attempt waits, its names count as held (it may hold some
//! of them, which no `CS` line shows yet), so no other waiter is judged on them; and an
//! attempt that waits while every name of its set is free (no logged hold, no other
//! attempt in progress on any of them) must be granted within the handoff bound outside
//! faults: a deadlock, or a wedge, is a violation. An attempt that never returned is
//! reported by name.

use std::collections::HashMap;
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use etcd_sync::{
    CancelToken, Client, MultiLock, MultiLockGuard, MultiLockMember, Session, TryLockError, Txn,
    TxnOp, WaitOptions,
};

use super::all_or_none::{self, Look};
use super::common::monotonic_ns;
use super::liveness::{self, Events};
use super::workload::{current_session, error_kind};
use super::{Log, RW_NAME, Rng, log};

/// The names multi-locks take: the workers' Mutex/Election names and the read-write lock.
pub(crate) const MULTI_NAMES: [&str; 3] = ["ck-a", "ck-b", RW_NAME];

/// A set of 2 or 3 names in a random order, each with its mode (`x`, or `s` for the read
/// side of `ck-rw`), and the lock over it.
fn random_lock(
    session: &Session,
    rng: &mut Rng,
) -> etcd_sync::Result<(Vec<(String, &'static str)>, MultiLock)> {
    let mut names: Vec<&str> = MULTI_NAMES.to_vec();
    // Fisher-Yates, then keep 2 or 3: every order of every subset.
    for i in (1..names.len()).rev() {
        names.swap(i, rng.below(i as u64 + 1) as usize);
    }
    names.truncate(2 + rng.below(2) as usize);
    let rw_side = rng.below(3);
    let set: Vec<(String, &'static str)> = names
        .iter()
        .map(|n| {
            (
                n.to_string(),
                if *n == RW_NAME && rw_side == 1 {
                    "s"
                } else {
                    "x"
                },
            )
        })
        .collect();
    let lock = if rw_side == 0 || !names.contains(&RW_NAME) {
        // Every name exclusive, each the lock a Mutex of that name takes.
        session.multi_lock(&names)?
    } else {
        let mut members = Vec::new();
        for n in &names {
            members.push(if *n == RW_NAME {
                let rw = session.rwlock(RW_NAME)?;
                if rw_side == 1 {
                    MultiLockMember::read(&rw)
                } else {
                    MultiLockMember::write(&rw)
                }
            } else {
                MultiLockMember::from(&session.mutex(*n)?)
            });
        }
        MultiLock::new(members)?
    };
    Ok((set, lock))
}

/// One attempt of a random kind: its outcome for the `MEND` line and the guard.
fn attempt(
    (client, log_file): (&Client, &Log),
    lock: &MultiLock,
    rng: &mut Rng,
) -> (&'static str, Option<MultiLockGuard>) {
    let timeout = rng.millis(50, 1_500);
    let result = match rng.below(6) {
        0 | 1 => lock.lock(),
        2 | 3 => lock.lock_timeout(timeout),
        4 => {
            let token = CancelToken::new();
            let (canceller, after) = (token.clone(), rng.millis(0, 600));
            std::thread::spawn(move || {
                std::thread::sleep(after);
                canceller.cancel();
            });
            lock.lock_with(WaitOptions::new().timeout(timeout).cancel_token(&token))
        }
        _ => match lock.try_lock() {
            Ok(g) => Ok(g),
            Err(TryLockError::WouldBlock) => return ("busy", None),
            Err(TryLockError::Error(e)) => Err(e),
        },
    };
    match result {
        Ok(g) => ("ok", Some(g)),
        Err(e) => {
            super::deadlocks::judge(client, log_file, &e);
            (error_kind(&e), None)
        }
    }
}

/// A child's multi-lock thread, on a session of its own, until the deadline.
pub(crate) fn worker(client: &Client, log_file: &Log, who: &str, deadline_ns: u64, seed: u64) {
    let mut rng = Rng::new(seed);
    let slot = StdMutex::new(None);
    let mut attempts = 0u64;
    while monotonic_ns() < deadline_ns {
        let Some(session) = current_session(client, &slot) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let Ok((set, lock)) = random_lock(&session, &mut rng) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        attempts += 1;
        let id = format!("{who}#{attempts}");
        let names: Vec<&str> = set.iter().map(|(n, _)| n.as_str()).collect();
        log(
            log_file,
            format!("MBEG {id} {} {}", names.join(","), monotonic_ns()),
        );
        let (outcome, guard) = attempt((client, log_file), &lock, &mut rng);
        log(log_file, format!("MEND {id} {} {outcome}", monotonic_ns()));
        let Some(guard) = guard else {
            all_or_none::look(client, log_file, &id, &names, session.lease_id());
            std::thread::sleep(rng.millis(20, 200));
            continue;
        };
        hold(client, guard, &set, &id, who, log_file, &mut rng);
        // A pause between attempts: the workers' single holds of these names stay the
        // bulk of the run.
        std::thread::sleep(rng.millis(20, 200));
    }
}

/// Holds the set for a while (guarded writes, watching for a loss), releases it, and logs
/// one `CS` line per name and the stale-write probe.
fn hold(
    client: &Client,
    guard: MultiLockGuard,
    set: &[(String, &'static str)],
    id: &str,
    who: &str,
    log_file: &Log,
    rng: &mut Rng,
) {
    let enter = monotonic_ns();
    let mut sorted: Vec<&str> = set.iter().map(|(n, _)| n.as_str()).collect();
    sorted.sort_unstable();
    let held: Vec<String> = guard
        .names()
        .iter()
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    let tokens = guard.fencing_tokens();
    if held != sorted || tokens.len() != set.len() || tokens.iter().any(|(_, t)| *t <= 0) {
        log(
            log_file,
            format!("MBAD {id} held {held:?} tokens {tokens:?} of {sorted:?}"),
        );
    }
    let lost = guard.lost();
    let (mut confirmed, mut lost_at) = (enter, 0u64);
    let (mut accepted, mut rejected, mut first_rev, mut last_rev) = (0u32, 0u32, 0i64, 0i64);
    let check = |wait: Duration, confirmed: &mut u64, lost_at: &mut u64| {
        if *lost_at != 0 {
            return;
        }
        if let Err(crossbeam_channel::RecvTimeoutError::Disconnected) = lost.recv_timeout(wait) {
            *lost_at = monotonic_ns();
            return;
        }
        let before = monotonic_ns();
        if guard.is_held() {
            *confirmed = before;
        } else {
            *lost_at = before;
        }
    };
    for _ in 0..1 + rng.below(2) {
        // One Txn comparing every key: its revision is inside every name's hold.
        match guard.put(format!("{}-data", sorted[0]), format!("multi:{who}")) {
            Ok(revision) => {
                accepted += 1;
                first_rev = if first_rev == 0 { revision } else { first_rev };
                last_rev = revision;
            }
            Err(_) => rejected += 1,
        }
        check(rng.millis(0, 20), &mut confirmed, &mut lost_at);
    }
    let hold_for = if rng.below(16) == 0 {
        rng.millis(1_100, 1_800)
    } else {
        rng.millis(0, 60)
    };
    let until = Instant::now() + hold_for;
    while lost_at == 0 && Instant::now() < until {
        let left = until.saturating_duration_since(Instant::now());
        check(
            left.min(Duration::from_millis(20)),
            &mut confirmed,
            &mut lost_at,
        );
    }
    let held_until = monotonic_ns();
    let compares = guard.ownership_compares();
    // Name, mode, token, key: read before the guard goes.
    let entries: Vec<(String, &str, i64, String)> = (guard.fencing_tokens().into_iter())
        .zip(guard.keys())
        .map(|((name, token), key)| {
            let name = String::from_utf8_lossy(name).into_owned();
            let mode = set
                .iter()
                .find(|(n, _)| *n == name)
                .map_or("x", |(_, m)| *m);
            (name, mode, token, String::from_utf8_lossy(key).into_owned())
        })
        .collect();
    let (how, confirmed_release) = if rng.below(3) == 0 {
        let released = guard.release().is_ok();
        (if released { "unlock" } else { "unlock_err" }, released)
    } else {
        drop(guard);
        ("drop", false)
    };
    let released_at = monotonic_ns();
    let holder = format!("{who}:0");
    for (name, mode, token, key) in &entries {
        log(
            log_file,
            format!(
                "CS {name} {mode} {token} {holder} {enter} {confirmed} {accepted} {rejected} \
                 {first_rev} {last_rev} {key} {held_until} {lost_at} {released_at} {how}"
            ),
        );
    }
    if confirmed_release
        && let Ok(r) = client.txn(
            Txn::new()
                .when(compares)
                .and_then([TxnOp::put(format!("{}-stale", sorted[0]), "x")]),
        )
    {
        let token = entries.first().map_or(0, |e| e.2);
        log(log_file, format!("STALE {token} {}", u8::from(r.succeeded)));
    }
}

/// One multi-lock attempt from the logs.
pub(crate) struct Attempt {
    pub(crate) id: String,
    pub(crate) names: Vec<String>,
    pub(crate) start: u64,
    /// Its `MEND`, else when its process was killed, else the end of the run.
    pub(crate) end: u64,
    /// `None`: it never returned.
    pub(crate) outcome: Option<String>,
    pub(crate) log: usize,
}

/// What the children's logs say of their multi-locks.
#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) attempts: Vec<Attempt>,
    /// After each failed attempt, the keys of its lease left under its names.
    pub(crate) left: Vec<Look>,
    pub(crate) bad: Vec<String>,
    pub(crate) outcomes: std::collections::BTreeMap<String, u64>,
}

impl std::fmt::Debug for Totals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "attempts={} outcomes={:?} all_or_none_looks={}",
            self.attempts.len(),
            self.outcomes,
            self.left.len()
        )
    }
}

impl Totals {
    /// Per name, the intervals in which an attempt on it was in progress (it may have held
    /// the name), with the attempt's index.
    pub(crate) fn covers(&self) -> HashMap<String, Vec<(usize, u64, u64)>> {
        let mut covers: HashMap<String, Vec<(usize, u64, u64)>> = HashMap::new();
        for (i, a) in self.attempts.iter().enumerate() {
            for n in &a.names {
                covers
                    .entry(n.clone())
                    .or_default()
                    .push((i, a.start, a.end));
            }
        }
        covers
    }
}

/// Reads the multi-lock lines of `log-1` to `log-<files>`.
pub(crate) fn parse(dir: &std::path::Path, files: usize, events: &Events, end_ns: u64) -> Totals {
    let mut totals = Totals::default();
    for n in 1..=files {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("log-{n}"))) else {
            continue;
        };
        let cut = events.kills.get(&n).copied().unwrap_or(end_ns);
        let mut open: HashMap<String, usize> = HashMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match (f.first(), f.len()) {
                (Some(&"MBEG"), 4) => {
                    let Ok(start) = f[3].parse() else { continue };
                    open.insert(f[1].to_string(), totals.attempts.len());
                    totals.attempts.push(Attempt {
                        id: f[1].to_string(),
                        names: f[2].split(',').map(String::from).collect(),
                        start,
                        end: cut,
                        outcome: None,
                        log: n,
                    });
                }
                (Some(&"MEND"), 4) => {
                    if let (Some(i), Ok(end)) = (open.remove(f[1]), f[2].parse()) {
                        totals.attempts[i].end = end;
                        totals.attempts[i].outcome = Some(f[3].to_string());
                        *totals.outcomes.entry(f[3].to_string()).or_default() += 1;
                    }
                }
                (Some(&"MLEFT"), _) => totals.left.extend(Look::parse(&f)),
                (Some(&"MBAD"), _) => totals.bad.push(format!("multi-lock: {line} (log-{n})")),
                _ => {}
            }
        }
    }
    totals
}

/// What the multi-lock checks found: safety and liveness violations apart, and how many
/// waits were judged.
#[derive(Default)]
pub(crate) struct Report {
    pub(crate) safety: Vec<String>,
    pub(crate) liveness: Vec<String>,
    /// Attempts that waited while their whole set was free outside faults, and were granted
    /// within the bound; the longest such wait.
    pub(crate) judged: u64,
    pub(crate) slowest_ms: u64,
    /// Failed attempts whose leftover keys were judged (no fault near).
    pub(crate) all_or_none_judged: u64,
    /// Of those, the ones that returned while a removal of theirs was still running (their
    /// keys gone one request timeout later): etcd answered slower than the wait's settle
    /// window, with no fault near. Allowed (the removal goes on in the background), counted.
    pub(crate) removed_after_return: Vec<String>,
}

/// The checks above. `hung`: the logs of children that did not end by themselves.
pub(crate) fn check(
    totals: &Totals,
    sections: &HashMap<String, Vec<super::analysis::Section>>,
    events: &Events,
    (start_ns, end_ns): (u64, u64),
    hung: &[usize],
) -> Report {
    let mut report = Report {
        safety: totals.bad.clone(),
        ..Report::default()
    };
    let windows = liveness::fault_windows(events);
    let quiet = |from: u64, to: u64| windows.iter().all(|&(s, e)| e < from || s > to);
    let by_id: HashMap<&str, &Attempt> =
        totals.attempts.iter().map(|a| (a.id.as_str(), a)).collect();
    let tried = |id: &str| {
        by_id.get(id).map(|a| all_or_none::Tried {
            names: &a.names,
            outcome: a.outcome.as_deref(),
            start: a.start,
            end: a.end,
        })
    };
    // A release of an earlier hold of this thread may still be under way within a request
    // timeout of its start: look from a little before the attempt.
    let quiet_near =
        |a: &all_or_none::Tried<'_>, at| quiet(a.start.saturating_sub(2_000_000_000), at);
    let verdicts = all_or_none::judge(&totals.left, tried, quiet_near);
    report.all_or_none_judged = verdicts.judged;
    report.removed_after_return = verdicts.removed_late;
    report.safety.extend(verdicts.leaks);
    let covers = totals.covers();
    let spans = liveness::quiet_spans(&windows, start_ns, end_ns);
    let bound = liveness::HANDOFF_BOUND.as_nanos() as u64;
    let none = Vec::new();
    for (i, a) in totals.attempts.iter().enumerate() {
        if a.outcome.is_none() && hung.contains(&a.log) {
            report.liveness.push(format!(
                "liveness: multi-lock {} on {:?} never returned (log-{}): a deadlock?",
                a.id, a.names, a.log
            ));
        }
        // Where every name of the set was free of everyone else while it waited.
        let mut free = vec![(a.start, a.end)];
        for n in &a.names {
            let others: Vec<(u64, u64)> = covers
                .get(n)
                .into_iter()
                .flatten()
                .filter(|(j, _, _)| *j != i)
                .map(|&(_, s, e)| (s, e))
                .collect();
            let gaps = liveness::free_gaps(
                n,
                sections.get(n).unwrap_or(&none),
                events,
                &others,
                a.start,
                a.end,
            );
            free = intersect(&free, &gaps);
        }
        for &(g0, g1) in &free {
            let longest = spans
                .iter()
                .map(|&(q0, q1)| (g0.max(q0), g1.min(q1)))
                .filter(|(from, to)| to > from)
                .max_by_key(|(from, to)| to - from);
            let Some((from, to)) = longest else { continue };
            if to - from > bound {
                report.liveness.push(format!(
                    "liveness: multi-lock {} on {:?} waited {} ms outside faults while every name \
                     of its set was free of everyone else (a deadlock or a wedge); {}",
                    a.id,
                    a.names,
                    (to - from) / 1_000_000,
                    events.keys_seen(&a.names[0], from + bound, to),
                ));
            } else if (from, to) == (g0, g1) && g1 == a.end && a.outcome.as_deref() == Some("ok") {
                report.judged += 1;
                report.slowest_ms = report.slowest_ms.max((to - from) / 1_000_000);
            }
        }
    }
    report
}

/// The intersection of two sorted lists of disjoint intervals.
fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(a0, a1) in a {
        for &(b0, b1) in b {
            let (s, e) = (a0.max(b0), a1.min(b1));
            if e > s {
                out.push((s, e));
            }
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_intersect() {
        assert_eq!(
            intersect(&[(0, 10), (20, 30)], &[(5, 25)]),
            vec![(5, 10), (20, 25)]
        );
        assert!(intersect(&[(0, 10)], &[(10, 20)]).is_empty());
    }

    #[test]
    fn a_key_left_after_a_failed_attempt_is_a_leak_unless_its_removal_ends_in_time() {
        let secs = 1_000_000_000;
        let attempt = |id: &str| Attempt {
            id: id.into(),
            names: vec!["a".into(), "b".into()],
            start: 5 * secs,
            end: 6 * secs,
            outcome: Some("timeout".into()),
            log: 1,
        };
        let look = |id: &str, left, after| Look {
            id: id.into(),
            at: 6 * secs + 1_000_000,
            left,
            after,
            keys: "a/1@7".into(),
        };
        let totals = Totals {
            attempts: vec![
                attempt("m#1"),
                attempt("m#2"),
                attempt("m#3"),
                attempt("m#4"),
            ],
            left: vec![
                look("m#1", Some(0), Some(0)),
                // Gone a request timeout later: a removal answered late, counted.
                look("m#2", Some(1), Some(0)),
                // Still there: a leak.
                look("m#3", Some(1), Some(1)),
                // Not read: not judged.
                look("m#4", None, Some(0)),
            ],
            ..Totals::default()
        };
        let report = check(
            &totals,
            &HashMap::new(),
            &Events::default(),
            (0, 10 * secs),
            &[],
        );
        assert_eq!(report.all_or_none_judged, 3);
        assert_eq!(
            report.removed_after_return.len(),
            1,
            "{:?}",
            report.removed_after_return
        );
        assert_eq!(report.safety.len(), 1, "{:?}", report.safety);
        assert!(report.safety[0].contains("m#3") && report.safety[0].contains("a/1@7"));
    }

    #[test]
    fn a_wait_with_its_whole_set_free_is_a_wedge() {
        let attempt = |id: &str, names: &[&str], start, end| Attempt {
            id: id.into(),
            names: names.iter().map(|n| n.to_string()).collect(),
            start,
            end,
            outcome: Some("ok".into()),
            log: 1,
        };
        let secs = 1_000_000_000;
        let totals = Totals {
            attempts: vec![attempt("m#1", &["a", "b"], 0, 5 * secs)],
            ..Totals::default()
        };
        let sections = HashMap::new();
        let events = Events::default();
        let report = check(&totals, &sections, &events, (0, 10 * secs), &[]);
        assert_eq!(report.liveness.len(), 1, "{:?}", report.liveness);
        // Another attempt in progress on `b` may hold it: not judged.
        let totals = Totals {
            attempts: vec![
                attempt("m#1", &["a", "b"], 0, 5 * secs),
                attempt("m#2", &["b", "c"], 0, 5 * secs),
            ],
            ..Totals::default()
        };
        let report = check(&totals, &sections, &events, (0, 10 * secs), &[]);
        assert!(report.liveness.is_empty(), "{:?}", report.liveness);
    }
}
