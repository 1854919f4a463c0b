//! The barrier checks of the randomized checker, on the lines of `barriers.rs`.
//!
//! Double barrier ([`DB_COUNT`] participants), through every fault:
//!
//! * **No early entry.** A participant's key exists at the earliest from its `beg`, and at
//!   the latest until its `out` (a leave that returned `ok` removed it), else a margin after
//!   its failed enter (a late join is removed as soon as it appears), else its process's
//!   kill plus the TTL, else the end of the run. A participant that returned from `enter`
//!   at `t` must have had `count` participants, itself included, whose keys could exist at
//!   one instant between its `beg` and `t`.
//! * **Rounds.** At most `count` participants name one round; when `count` of them do,
//!   none entered before the last of them began.
//! * **Leave together.** A leave that returned `ok` did so no earlier than every other
//!   participant of its round was confirmed still in (`alive`, just before that one's
//!   leave: its session alive, so its key there). Not judged across a member pause or a
//!   cluster freeze (etcd 3.4's paused old leader can revoke a live lease, #15247).
//! * **Counted out** (liveness): a leave may time out only when a fault other than a
//!   SIGKILLed client was near: a partner killed while in is counted out when its lease
//!   expires, within the TTL, well within the leave's limit.
//!
//! Barrier and latch: a `wait` that returned `ok` must have seen the barrier down (the
//! latch open) at some instant of its call. It is a violation when a `hold` that returned
//! `1` ended before the wait began and no `release` ran between that hold's start and the
//! wait's return (a release deletes only the key it read, so one that had returned before
//! the hold started cannot remove it, even if applied late); likewise for a latch set to
//! `k` by a `try_set_count` that returned `1`, when fewer than `k` count-downs ran in that
//! span (each takes exactly one off, by compare-and-swap on what it read).

use std::collections::HashMap;

use super::REQUEST_TIMEOUT;
use super::TTL;
use super::barriers::{DB_COUNT, LEAVE_LIMIT};
use super::liveness::{Events, fault_windows};

/// One double-barrier cycle.
#[derive(Default, Clone)]
struct Cycle {
    id: String,
    log: usize,
    beg: u64,
    fail: Option<(u64, String)>,
    /// When `enter` returned, and the round (0: not read).
    entered: Option<(u64, i64)>,
    alive: Option<u64>,
    leave: Option<u64>,
    out: Option<(u64, String)>,
}

/// One gate call.
struct Call {
    op: String,
    count: u64,
    beg: u64,
    /// Its return, else when its process was killed, else the end of the run.
    end: u64,
    result: Option<String>,
}

#[derive(Default)]
pub(crate) struct Totals {
    cycles: Vec<Cycle>,
    calls: Vec<Call>,
}

/// What the checks found, and how much they judged.
#[derive(Default, Debug)]
pub(crate) struct Report {
    pub(crate) entered: u64,
    pub(crate) left: u64,
    pub(crate) enter_failures: u64,
    pub(crate) leave_failures: u64,
    /// Rounds whose every participant logged it, checked for entry order.
    pub(crate) full_rounds: u64,
    /// Leaves judged against a partner's confirmed presence.
    pub(crate) leaves_judged: u64,
    /// Leaves that returned after a partner of their round was killed while in.
    pub(crate) counted_out: u64,
    pub(crate) barrier_waits_ok: u64,
    /// Waits that began while the barrier was certainly up (the latch certainly closed).
    pub(crate) barrier_waits_judged: u64,
    pub(crate) latch_waits_ok: u64,
    pub(crate) latch_waits_judged: u64,
    #[allow(dead_code)] // printed with `{:?}`
    pub(crate) violations: Vec<String>,
    #[allow(dead_code)]
    pub(crate) liveness: Vec<String>,
}

pub(crate) fn parse(dir: &std::path::Path, files: usize, events: &Events, end_ns: u64) -> Totals {
    let mut totals = Totals::default();
    for n in 1..=files {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("log-{n}"))) else {
            continue;
        };
        let cut = events.kills.get(&n).copied().unwrap_or(end_ns);
        let mut cycles: HashMap<String, Cycle> = HashMap::new();
        let mut order = Vec::new();
        let mut open: HashMap<String, usize> = HashMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
            match (f.first(), f.len()) {
                (Some(&"DB"), 4 | 5) => {
                    let Some(t) = num(3) else { continue };
                    let c = cycles.entry(f[1].to_string()).or_insert_with(|| {
                        order.push(f[1].to_string());
                        Cycle {
                            id: f[1].to_string(),
                            log: n,
                            ..Cycle::default()
                        }
                    });
                    let rest = f.get(4).copied().unwrap_or_default().to_string();
                    match f[2] {
                        "beg" => c.beg = t,
                        "fail" => c.fail = Some((t, rest)),
                        "in" => c.entered = Some((t, rest.parse().unwrap_or(0))),
                        "alive" => c.alive = Some(t),
                        "leave" => c.leave = Some(t),
                        "out" => c.out = Some((t, rest)),
                        _ => {}
                    }
                }
                (Some(&"G"), 5) => {
                    if let (Some(beg), Some(count)) = (num(3), num(4)) {
                        open.insert(f[1].to_string(), totals.calls.len());
                        totals.calls.push(Call {
                            op: f[2].to_string(),
                            count,
                            beg,
                            end: cut,
                            result: None,
                        });
                    }
                }
                (Some(&"GE"), 4) => {
                    if let (Some(i), Some(end)) = (open.remove(f[1]), num(2)) {
                        totals.calls[i].end = end;
                        totals.calls[i].result = Some(f[3].to_string());
                    }
                }
                _ => {}
            }
        }
        totals
            .cycles
            .extend(order.into_iter().filter_map(|id| cycles.remove(&id)));
    }
    totals
}

/// The latest a participant's key can exist.
fn key_end(c: &Cycle, events: &Events) -> u64 {
    let ttl = TTL.as_nanos() as u64;
    match (&c.out, &c.fail) {
        (Some((t, ok)), _) if ok == "ok" => *t,
        // A join applied late by a member that was frozen is removed when it appears.
        (None, Some((t, _))) => t + 2 * REQUEST_TIMEOUT.as_nanos() as u64 + 3_000_000_000,
        _ => events
            .kills
            .get(&c.log)
            .map_or(u64::MAX, |k| k + ttl + 1_000_000_000),
    }
}

pub(crate) fn check(totals: &Totals, events: &Events) -> Report {
    let mut r = Report::default();
    let windows = fault_windows(events);
    let pick = |keep: &dyn Fn(&str) -> bool| -> Vec<(u64, u64)> {
        (events.faults.iter().zip(&windows))
            .filter(|((kind, _, _), _)| keep(kind))
            .map(|(_, w)| *w)
            .collect()
    };
    let near = pick(&|kind| kind == "member_pause" || kind == "cluster_freeze");
    let near_but_kills = pick(&|kind| kind != "client_sigkill");
    let overlaps =
        |ws: &[(u64, u64)], from: u64, to: u64| ws.iter().any(|&(s, e)| !(e < from || s > to));
    let spans: Vec<(u64, u64)> = totals
        .cycles
        .iter()
        .map(|c| (c.beg, key_end(c, events)))
        .collect();
    let mut rounds: HashMap<i64, Vec<&Cycle>> = HashMap::new();
    for c in &totals.cycles {
        r.enter_failures += u64::from(c.fail.as_ref().is_some_and(|(_, k)| k != "busy"));
        let Some((t_in, round)) = c.entered else {
            continue;
        };
        r.entered += 1;
        if round > 0 {
            rounds.entry(round).or_default().push(c);
        }
        // Some instant in [beg, t_in] with `count` keys that could exist at once.
        let mut edges: Vec<(u64, i64)> = Vec::new();
        for &(s, e) in &spans {
            let (s, e) = (s.max(c.beg), e.min(t_in));
            if e >= s {
                edges.push((s, 1));
                edges.push((e, -1));
            }
        }
        edges.sort_by_key(|&(t, d)| (t, -d));
        let (mut now, mut most) = (0i64, 0i64);
        for (_, d) in edges {
            now += d;
            most = most.max(now);
        }
        if most < DB_COUNT as i64 {
            r.violations.push(format!(
                "double barrier: {} entered (log-{}) when at most {most} of {DB_COUNT} participants \
                 could have been in",
                c.id, c.log
            ));
        }
    }
    for (round, members) in &rounds {
        if members.len() > DB_COUNT {
            let ids: Vec<&str> = members.iter().map(|c| c.id.as_str()).collect();
            r.violations.push(format!(
                "double barrier: round {round} has {} participants, over {DB_COUNT}: {ids:?}",
                members.len()
            ));
            continue;
        }
        if members.len() == DB_COUNT {
            r.full_rounds += 1;
            let last_beg = members.iter().map(|c| c.beg).max().unwrap_or(0);
            for c in members {
                if let Some((t_in, _)) = c.entered
                    && t_in < last_beg
                {
                    r.violations.push(format!(
                        "double barrier: {} entered round {round} {} µs before its last participant began",
                        c.id,
                        (last_beg - t_in) / 1000
                    ));
                }
            }
        }
        for c in members {
            let Some((t_out, ok)) = &c.out else { continue };
            let first_beg = members.iter().map(|c| c.beg).min().unwrap_or(0);
            if ok == "ok" {
                r.left += 1;
                if !overlaps(&near, first_beg, *t_out) {
                    for other in members.iter().filter(|o| o.id != c.id) {
                        let Some(alive) = other.alive else { continue };
                        r.leaves_judged += 1;
                        if *t_out < alive {
                            r.violations.push(format!(
                                "double barrier: {} left round {round} {} µs before {} (still in) left",
                                c.id,
                                (alive - t_out) / 1000,
                                other.id
                            ));
                        }
                    }
                }
                let partner_killed = members.iter().any(|o| {
                    o.id != c.id
                        && o.out.is_none()
                        && events.kills.get(&o.log).is_some_and(|k| k < t_out)
                });
                r.counted_out += u64::from(partner_killed);
            } else {
                r.leave_failures += 1;
                let from = c
                    .leave
                    .unwrap_or(*t_out)
                    .saturating_sub(TTL.as_nanos() as u64);
                if ok == "timeout" && !overlaps(&near_but_kills, from, *t_out) {
                    r.liveness.push(format!(
                        "liveness: double barrier {} could not leave round {round} within {LEAVE_LIMIT:?} \
                         with no fault near but killed clients (counted out within the TTL)",
                        c.id
                    ));
                }
            }
        }
    }
    gates(totals, &mut r);
    r
}

/// The calls of one kind.
fn of<'a>(totals: &'a Totals, op: &'a str) -> impl Iterator<Item = &'a Call> {
    totals.calls.iter().filter(move |c| c.op == op)
}

/// The barrier and latch checks.
fn gates(totals: &Totals, r: &mut Report) {
    let calls = |op: &'static str| of(totals, op);
    let ran = |op: &'static str, from: u64, to: u64| {
        of(totals, op).filter(move |c| c.beg <= to && c.end >= from)
    };
    for w in calls("bwait") {
        let ok = w.result.as_deref() == Some("ok");
        r.barrier_waits_ok += u64::from(ok);
        // Raised by a hold that returned before the wait began, not released since.
        let up = calls("hold")
            .filter(|h| h.result.as_deref() == Some("1") && h.end <= w.beg)
            .find(|h| ran("release", h.beg, w.beg).next().is_none());
        let Some(h) = up else { continue };
        r.barrier_waits_judged += 1;
        if ok && ran("release", h.beg, w.end).next().is_none() {
            r.violations.push(format!(
                "barrier: a wait returned ok {} µs into its call while the barrier raised {} µs \
                 before it began was never released",
                (w.end - w.beg) / 1000,
                (w.beg - h.end) / 1000
            ));
        }
    }
    for w in calls("lwait") {
        let ok = w.result.as_deref() == Some("ok");
        r.latch_waits_ok += u64::from(ok);
        let closed = calls("set")
            .filter(|s| s.result.as_deref() == Some("1") && s.end <= w.beg)
            .find(|s| (ran("down", s.beg, w.beg).count() as u64) < s.count);
        let Some(s) = closed else { continue };
        r.latch_waits_judged += 1;
        let downs = ran("down", s.beg, w.end).count() as u64;
        if ok && downs < s.count {
            r.violations.push(format!(
                "latch: a wait returned ok after only {downs} count-downs of a latch set to {}",
                s.count
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycle(id: &str, beg: u64, entered: u64, round: i64, out: u64) -> Cycle {
        Cycle {
            id: id.into(),
            log: 1,
            beg,
            entered: Some((entered, round)),
            alive: Some(out - 1),
            leave: Some(out - 1),
            out: Some((out, "ok".into())),
            ..Cycle::default()
        }
    }

    fn call(op: &str, count: u64, beg: u64, end: u64, result: &str) -> Call {
        Call {
            op: op.into(),
            count,
            beg,
            end,
            result: Some(result.into()),
        }
    }

    fn found(cycles: Vec<Cycle>, calls: Vec<Call>) -> usize {
        check(&Totals { cycles, calls }, &Events::default())
            .violations
            .len()
    }

    #[test]
    fn entering_or_leaving_alone_is_a_violation() {
        let together = vec![cycle("a", 0, 20, 7, 40), cycle("b", 10, 20, 7, 41)];
        assert_eq!(found(together, vec![]), 0);
        // `a` entered before `b` began: nobody else could have been in.
        let early = vec![cycle("a", 0, 5, 7, 40), cycle("b", 10, 20, 7, 41)];
        assert_eq!(found(early, vec![]), 2); // alone, and before its round's last began
        // `a` left before `b`, still in, was confirmed alive.
        let left_early = vec![cycle("a", 0, 20, 7, 30), cycle("b", 10, 20, 7, 41)];
        assert_eq!(found(left_early, vec![]), 1);
        let three = vec![
            cycle("a", 0, 20, 7, 40),
            cycle("b", 10, 20, 7, 40),
            cycle("c", 10, 20, 7, 40),
        ];
        assert_eq!(found(three, vec![]), 1);
    }

    #[test]
    fn a_wait_through_a_closed_gate_is_a_violation() {
        let hold = || call("hold", 2, 0, 10, "1");
        assert_eq!(
            found(vec![], vec![hold(), call("bwait", 2, 20, 30, "ok")]),
            1
        );
        let released = vec![
            hold(),
            call("release", 2, 25, 26, "1"),
            call("bwait", 2, 20, 30, "ok"),
        ];
        assert_eq!(found(vec![], released), 0);
        let set = || call("set", 2, 0, 10, "1");
        let one_down = vec![
            set(),
            call("down", 2, 12, 13, "1"),
            call("lwait", 2, 20, 30, "ok"),
        ];
        assert_eq!(found(vec![], one_down), 1);
        let two_down = vec![
            set(),
            call("down", 2, 12, 13, "1"),
            call("down", 2, 22, 23, "0"),
            call("lwait", 2, 20, 30, "ok"),
        ];
        assert_eq!(found(vec![], two_down), 0);
    }
}
