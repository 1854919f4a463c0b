//! Liveness, beside safety: a free lock is taken by a waiter, and a deleted key is noticed
//! by its guard, within bounds, whenever no fault is in progress.
//!
//! * **Handoff**: while a waiter waits (an attempt, `BEG` to `END`), a name that no guard
//!   holds (no logged hold covers the instant; for the semaphore, no permit held: see
//!   [`free_gaps`])
//!   must be taken, by that waiter or another, within [`HANDOFF_BOUND`]. Judged only where
//!   the window `[t0, t0 + bound]` (`t0`: the later of the wait's start and the name
//!   becoming free) overlaps no fault, each fault extended by its recovery
//!   ([`recovery`]: the session TTL plus 1 s, in which a SIGKILLed child's keys expire and
//!   leases are renewed after a leader change; twice the TTL plus 1 s after faults that
//!   stall the cluster or move its leader, whose next leader extends every lease). The
//!   figure: the longest time a judged free name stayed free while someone waited, until
//!   someone took it.
//! * **Loss report**: a guard whose key the operator deleted must see it (`lost()` fires or
//!   `is_held()` says no) within [`LOSS_BOUND`] of the delete; a guard still held and not
//!   lost after that is a violation. Judged when no fault overlaps `[delete, delete +
//!   bound]`. The figure: the slowest report after a judged delete.
//!
//! A hold ends at its release's return (a drop's background delete counts against the
//! bound); at an operator's delete of its key; a failed unlock (retried in the background)
//! is taken to block the name for a TTL more.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use super::TTL;
use super::analysis::{Section, permits_of};

/// A free name must be taken within this while someone waits (the brief's 2 s; the
/// handoff itself, one watch event and one Txn, is well within it).
pub(crate) const HANDOFF_BOUND: Duration = Duration::from_secs(2);
/// A guard must notice its key's deletion within this.
pub(crate) const LOSS_BOUND: Duration = Duration::from_secs(1);

/// The parent's log: faults, operator deletes, children killed.
pub(crate) struct Delete {
    pub(crate) key: String,
    pub(crate) token: i64,
    pub(crate) before: u64,
    pub(crate) after: u64,
}

#[derive(Default)]
pub(crate) struct Events {
    /// Kind, start, end (ns).
    pub(crate) faults: Vec<(String, u64, u64)>,
    /// Deletes: key and its create revision (the token of a guard on it), time before the
    /// delete was sent, time after it returned.
    pub(crate) deletes: Vec<Delete>,
    /// Child log number → when it was SIGKILLed.
    pub(crate) kills: HashMap<usize, u64>,
    /// Name → (time, the keys etcd had under it: `key@create_rev,...` or `-`).
    pub(crate) keys: HashMap<String, Vec<(u64, String)>>,
}

impl Events {
    /// What etcd had under `name` at the first look in `[from, to]`.
    pub(crate) fn keys_seen(&self, name: &str, from: u64, to: u64) -> String {
        self.keys
            .get(name)
            .and_then(|seen| seen.iter().find(|(t, _)| (from..=to).contains(t)))
            .map_or_else(
                || "etcd's keys not observed then".into(),
                |(_, keys)| match keys.as_str() {
                    "-" => "etcd had no key under it then".into(),
                    keys => format!("etcd had {keys} then"),
                },
            )
    }
}

pub(crate) fn parse_events(path: &Path) -> Events {
    let mut events = Events::default();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match f.first() {
            Some(&"FAULT") => events.faults.push((f[1].to_string(), num(2), num(3))),
            Some(&"DEL") => events.deletes.push(Delete {
                key: f[1].to_string(),
                token: num(2) as i64,
                before: num(3),
                after: num(4),
            }),
            Some(&"KEYS") if f.len() == 4 => events
                .keys
                .entry(f[2].to_string())
                .or_default()
                .push((num(1), f[3].to_string())),
            Some(&"KILL") => {
                events.kills.insert(num(1) as usize, num(2));
            }
            _ => {}
        }
    }
    events
}

/// How long after a fault ends its effects may still delay a handoff or a loss report.
fn recovery(kind: &str) -> u64 {
    match kind {
        // The compaction itself is instant: watchers that must start again do so at once.
        "compaction" => 500_000_000,
        // Faults that stall the cluster or move its leader: a session lost in them keeps
        // its keys until etcd expires its lease, and a leader elected after the fault
        // first extends every lease by a whole TTL from its promotion (etcd's lessor
        // `Promote`), which itself may come a while after the fault's end. Seen: a
        // semaphore blocked by two lost sessions' keys until 6.0 s after a 1.8 s
        // `cluster_freeze` ended (TTL 3 s), then taken 20 ms after they went (seed
        // 21104487390366).
        "member_kill" | "member_pause" | "cluster_freeze" | "snapshot_restart"
        | "leader_transfer" | "partition" => (2 * TTL + Duration::from_secs(1)).as_nanos() as u64,
        _ => (TTL + Duration::from_secs(1)).as_nanos() as u64,
    }
}

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) violations: Vec<String>,
    /// Judged free-while-waiting windows that ended with an acquisition, and the longest.
    pub(crate) handoffs: u64,
    pub(crate) slowest_handoff_ms: u64,
    /// Judged deletes of held keys, and the slowest loss report among them.
    pub(crate) loss_reports: u64,
    pub(crate) slowest_loss_ms: u64,
    /// Deletes of keys that were held, of keys that were not (waiters'), and guards
    /// returned after their key had been deleted.
    pub(crate) deleted_held: u64,
    pub(crate) deleted_other: u64,
    pub(crate) granted_after_delete: u64,
}

/// A guard's hold ends, for the exclusion checks, where the operator deleted its key:
/// another guard may then enter before it notices (within [`LOSS_BOUND`], checked here).
pub(crate) fn clip_deleted(sections: &mut HashMap<String, Vec<Section>>, events: &Events) {
    let deleted = deleted(events);
    for s in sections.values_mut().flatten() {
        if let Some(d) = deleted.get(&(s.key.as_str(), s.rev)) {
            s.confirmed = s.confirmed.min(d.before.max(s.enter));
        }
    }
}

/// The operator's deletes by key and create revision (a guard's key and token).
fn deleted(events: &Events) -> HashMap<(&str, i64), &Delete> {
    events
        .deletes
        .iter()
        .map(|d| ((d.key.as_str(), d.token), d))
        .collect()
}

struct Attempt {
    id: String,
    start: u64,
    end: u64,
}

/// `BEG`/`END` pairs per name; an attempt with no end ends when its process was killed, or
/// at `end_ns`.
fn attempts(
    dir: &Path,
    files: usize,
    events: &Events,
    end_ns: u64,
) -> HashMap<String, Vec<Attempt>> {
    let mut by_name: HashMap<String, Vec<Attempt>> = HashMap::new();
    for n in 1..=files {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("log-{n}"))) else {
            continue;
        };
        let cut = events.kills.get(&n).copied().unwrap_or(end_ns);
        let mut open: HashMap<&str, (&str, u64)> = HashMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match (f.first(), f.len()) {
                (Some(&"BEG"), 4) => {
                    if let Ok(start) = f[3].parse() {
                        open.insert(f[1], (f[2], start));
                    }
                }
                (Some(&"END"), 4) => {
                    if let (Some((name, start)), Ok(end)) = (open.remove(f[1]), f[2].parse()) {
                        let id = f[1].to_string();
                        by_name
                            .entry(name.into())
                            .or_default()
                            .push(Attempt { id, start, end });
                    }
                }
                _ => {}
            }
        }
        for (id, (name, start)) in open {
            let id = format!("{id} (unfinished)");
            by_name.entry(name.into()).or_default().push(Attempt {
                id,
                start,
                end: cut,
            });
        }
    }
    by_name
}

/// Intervals in which `name` could be taken by whoever waits first: nothing holds it.
/// `covers` count as holds: multi-lock attempts in progress on the name (`multi.rs`), which
/// may hold it before any `CS` line says so. The semaphore counts as free only with no
/// permit held: a waiter may ask for both permits at once (`acquire_many`), and whoever
/// waits behind it may not overtake it, so one free permit is not a turn anyone is owed.
pub(crate) fn free_gaps(
    _name: &str,
    sections: &[Section],
    events: &Events,
    covers: &[(u64, u64)],
    from: u64,
    to: u64,
) -> Vec<(u64, u64)> {
    let room = 1;
    let deleted = deleted(events);
    let mut edges: Vec<(u64, i64)> = Vec::new();
    for &(start, end) in covers {
        // Taken to block every room: a multi-lock's read side is counted as a writer.
        if end > start {
            edges.push((start, room));
            edges.push((end, -room));
        }
    }
    for s in sections {
        let mut end = match s.how.as_str() {
            "unlock_err" => s.released_at + TTL.as_nanos() as u64,
            _ => s.released_at,
        };
        if let Some(d) = deleted.get(&(s.key.as_str(), s.rev)) {
            end = end.min(d.after.max(s.enter));
        }
        // k permits taken at once weigh k.
        let weight = permits_of(&s.mode).map_or(1, |(_, k)| k as i64);
        if end > s.enter {
            edges.push((s.enter, weight));
            edges.push((end, -weight));
        }
    }
    // At one instant, ends before starts: a handoff at the same nanosecond is no gap.
    edges.sort_by_key(|&(t, d)| (t, d));
    let mut gaps = Vec::new();
    let (mut held, mut free_since) = (0i64, Some(from));
    for (t, d) in edges {
        held += d;
        match free_since {
            Some(since) if held >= room => {
                if t > since {
                    gaps.push((since, t));
                }
                free_since = None;
            }
            None if held < room => free_since = Some(t),
            _ => {}
        }
    }
    if let Some(since) = free_since.filter(|&since| since < to) {
        gaps.push((since, to));
    }
    gaps
}

/// The stretches of `[from, to]` outside every fault window.
pub(crate) fn quiet_spans(windows: &[(u64, u64)], from: u64, to: u64) -> Vec<(u64, u64)> {
    let mut sorted = windows.to_vec();
    sorted.sort_unstable();
    let mut spans = Vec::new();
    let mut at = from;
    for (s, e) in sorted {
        if s > at {
            spans.push((at, s.min(to)));
        }
        at = at.max(e);
    }
    if at < to {
        spans.push((at, to));
    }
    spans.retain(|(a, b)| b > a);
    spans
}

/// Each fault's window: from its start to its end plus its recovery.
pub(crate) fn fault_windows(events: &Events) -> Vec<(u64, u64)> {
    events
        .faults
        .iter()
        .map(|(kind, start, end)| (*start, end + recovery(kind)))
        .collect()
}

/// `covers`: per name, multi-lock attempts in progress (index, start, end).
pub(crate) fn check(
    dir: &Path,
    files: usize,
    sections: &HashMap<String, Vec<Section>>,
    covers: &HashMap<String, Vec<(usize, u64, u64)>>,
    events: &Events,
    start_ns: u64,
    end_ns: u64,
) -> Report {
    let mut report = Report::default();
    let windows = fault_windows(events);
    let quiet = |from: u64, to: u64| windows.iter().all(|&(s, e)| e < from || s > to);
    let spans = quiet_spans(&windows, start_ns, end_ns);
    let secs = |t: u64| t.saturating_sub(start_ns) as f64 / 1e9;
    let bound = HANDOFF_BOUND.as_nanos() as u64;
    let no_sections = Vec::new();
    // One violation per free stretch of a name: (name, start) → first message, others.
    let mut wedged: std::collections::BTreeMap<(String, u64), (String, usize)> = Default::default();
    for (name, attempts) in attempts(dir, files, events, end_ns) {
        let sections = sections.get(&name).unwrap_or(&no_sections);
        let covered: Vec<(u64, u64)> = (covers.get(&name).into_iter().flatten())
            .map(|&(_, s, e)| (s, e))
            .collect();
        let gaps = free_gaps(&name, sections, events, &covered, start_ns, end_ns);
        for a in &attempts {
            for &(g0, g1) in gaps.iter().filter(|&&(g0, g1)| g0 < a.end && g1 > a.start) {
                // Free while this one waited: judged on its stretches outside faults.
                let (t0, t1) = (a.start.max(g0), a.end.min(g1));
                let longest = spans
                    .iter()
                    .map(|&(q0, q1)| (t0.max(q0), t1.min(q1)))
                    .filter(|(from, to)| to > from)
                    .max_by_key(|(from, to)| to - from);
                let Some((from, to)) = longest else {
                    continue;
                };
                if to - from > bound {
                    let (first, more) = wedged.entry((name.clone(), g0)).or_default();
                    *more += usize::from(!first.is_empty());
                    if !first.is_empty() {
                        continue;
                    }
                    *first = format!(
                        "liveness: {name} free from {:.3} s while {} waited (since {:.3} s), \
                         not taken within {HANDOFF_BOUND:?}: {} ms free outside faults, {} ms \
                         in all; {}",
                        secs(t0),
                        a.id,
                        secs(a.start),
                        (to - from) / 1_000_000,
                        (t1 - t0) / 1_000_000,
                        events.keys_seen(&name, from + bound, to),
                    );
                } else if (from, to) == (t0, t1) && t1 == g1 && g1 < end_ns {
                    // Wholly outside faults and ended by an acquisition: a handoff figure.
                    report.handoffs += 1;
                    report.slowest_handoff_ms =
                        report.slowest_handoff_ms.max((t1 - t0) / 1_000_000);
                }
            }
        }
    }
    for (message, more) in wedged.into_values() {
        report.violations.push(match more {
            0 => message,
            more => format!("{message} (and {more} more waiters)"),
        });
    }
    let loss_bound = LOSS_BOUND.as_nanos() as u64;
    for d in &events.deletes {
        // The guard on the deleted key: the last hold of it (a re-campaign's).
        let guard = sections
            .values()
            .flatten()
            .filter(|s| s.key == d.key && s.rev == d.token)
            .max_by_key(|s| s.enter);
        let Some(s) = guard else {
            report.deleted_other += 1;
            continue;
        };
        report.deleted_held += 1;
        report.granted_after_delete += u64::from(s.enter > d.after);
        if !quiet(d.before, d.after + loss_bound) {
            continue;
        }
        if s.lost_at >= d.before {
            let took = s.lost_at.saturating_sub(d.after);
            report.loss_reports += 1;
            report.slowest_loss_ms = report.slowest_loss_ms.max(took / 1_000_000);
            if took > loss_bound {
                report.violations.push(format!(
                    "liveness: {} saw its key {} (token {}) deleted at {:.3} s only {} ms later",
                    s.holder,
                    d.key,
                    d.token,
                    secs(d.after),
                    took / 1_000_000,
                ));
            }
        } else if s.held_until > d.after + loss_bound {
            report.violations.push(format!(
                "liveness: {} still held {} (token {}, entered {} ms after the delete) {} ms \
                 after its deletion at {:.3} s without noticing",
                s.holder,
                d.key,
                d.token,
                (s.enter as i64 - d.after as i64) / 1_000_000,
                (s.held_until - d.after) / 1_000_000,
                secs(d.after)
            ));
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(key: &str, enter: u64, released_at: u64) -> Section {
        Section {
            mode: "x".into(),
            token: 1,
            holder: "1:0:0".into(),
            enter,
            confirmed: released_at,
            accepted: 0,
            rejected: 0,
            first_rev: 0,
            last_rev: 0,
            key: key.into(),
            held_until: released_at,
            lost_at: 0,
            released_at,
            how: "unlock".into(),
            rev: 1,
        }
    }

    #[test]
    fn quiet_spans_are_outside_fault_windows() {
        assert_eq!(
            quiet_spans(&[(10, 20), (15, 30), (40, 45)], 0, 100),
            vec![(0, 10), (30, 40), (45, 100)]
        );
        assert_eq!(quiet_spans(&[], 0, 5), vec![(0, 5)]);
    }

    #[test]
    fn gaps_are_where_nothing_is_held() {
        let events = Events::default();
        let sections = vec![
            section("a/1", 10, 20),
            section("a/2", 20, 30),
            section("a/3", 40, 50),
        ];
        assert_eq!(
            free_gaps("a", &sections, &events, &[], 0, 60),
            vec![(0, 10), (30, 40), (50, 60)]
        );
        let mut events = Events::default();
        events.deletes.push(Delete {
            key: "a/3".into(),
            token: 1,
            before: 44,
            after: 45,
        });
        assert_eq!(
            free_gaps("a", &sections, &events, &[], 0, 60),
            vec![(0, 10), (30, 40), (45, 60)]
        );
    }

    #[test]
    fn the_semaphore_is_free_only_with_no_permit_held() {
        // Both permits at once (10-20), then one (20-30) overlapping another (25-35): a
        // waiter for both is owed a turn only from 35 on.
        let mut both = section("ck-sem/1.permits-2.x2", 10, 20);
        both.mode = "p2x2".into();
        let mut one = section("ck-sem/2.permits-2", 20, 30);
        one.mode = "p2".into();
        let mut other = section("ck-sem/3.permits-2", 25, 35);
        other.mode = "p2".into();
        assert_eq!(
            free_gaps(
                "ck-sem",
                &[both, one, other],
                &Events::default(),
                &[],
                0,
                60
            ),
            vec![(0, 10), (35, 60)]
        );
    }
}
