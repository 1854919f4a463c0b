//! The mixed fleet's logs read back and judged against our guards (see `fleet.rs`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::super::TTL;
use super::super::analysis::Section;

/// One hold of a Go holder: its command's run, from its first log line to its last (or
/// to when its etcdctl was killed or exited).
#[derive(Debug)]
pub(crate) struct GoHold {
    pub(crate) n: usize,
    pub(crate) name: String,
    pub(crate) key: String,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// A read of a name's keys: when it was sent, when it returned, the keys.
#[derive(Debug)]
pub(crate) struct Seen {
    pub(crate) sent: u64,
    pub(crate) received: u64,
    pub(crate) keys: Vec<String>,
    /// The read's one key, for a command's read of its own key (a poll reads the name).
    pub(crate) only: Option<String>,
}

#[derive(Default)]
pub(crate) struct Parsed {
    pub(crate) holds: Vec<GoHold>,
    /// Per etcdctl process: its name, when it started, until when it may block the name
    /// (its exit; a kill plus the session TTL, for its key to expire).
    pub(crate) lives: Vec<(String, u64, u64)>,
    pub(crate) seen: HashMap<String, Vec<Seen>>,
    pub(crate) spawned: usize,
    pub(crate) through_proxy: usize,
    /// Exits by exit code, kills by why.
    pub(crate) ends: BTreeMap<String, usize>,
}

pub(crate) fn parse(dir: &Path, end_ns: u64) -> Parsed {
    let mut parsed = Parsed::default();
    let text = std::fs::read_to_string(dir.join("go")).unwrap_or_default();
    // n → (name, spawn, end, killed)
    let mut procs: BTreeMap<usize, (String, u64, Option<u64>, bool)> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match (f.first(), f.len()) {
            (Some(&"GOSPAWN"), 5) => {
                parsed.spawned += 1;
                parsed.through_proxy += usize::from(f[3] == "1");
                procs.insert(num(1) as usize, (f[2].to_string(), num(4), None, false));
            }
            (Some(&"GOEXIT"), 4) => {
                *parsed.ends.entry(format!("exit:{}", f[3])).or_default() += 1;
                if let Some(p) = procs.get_mut(&(num(1) as usize)) {
                    p.2 = Some(num(2));
                }
            }
            (Some(&"GOKILL"), 4) => {
                *parsed.ends.entry(format!("kill:{}", f[3])).or_default() += 1;
                if let Some(p) = procs.get_mut(&(num(1) as usize)) {
                    (p.2, p.3) = (Some(num(2)), true);
                }
            }
            (Some(&"GOKEYS"), 5) => parsed.seen.entry(f[3].to_string()).or_default().push(Seen {
                sent: num(1),
                received: num(2),
                keys: match f[4] {
                    "-" => Vec::new(),
                    keys => keys
                        .split(',')
                        .map(|k| k.rsplit_once('@').map_or(k, |(key, _)| key).to_string())
                        .collect(),
                },
                only: None,
            }),
            _ => {}
        }
    }
    let ttl = TTL.as_nanos() as u64;
    for (&n, (name, spawned, ended, killed)) in &procs {
        let ended = ended.unwrap_or(end_ns);
        let blocks = if *killed { ended + ttl } else { ended };
        parsed.lives.push((name.clone(), *spawned, blocks));
        let Ok(text) = std::fs::read_to_string(dir.join(format!("go-{n}"))) else {
            continue;
        };
        let mut hold: Option<GoHold> = None;
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match (f.first(), f.len()) {
                (Some(&"GOHOLD"), 4) => {
                    hold = f[3].parse().ok().map(|start| GoHold {
                        n,
                        name: name.clone(),
                        key: f[1].to_string(),
                        start,
                        end: ended,
                    });
                }
                // The command's own read of its key: one more read of the name.
                (Some(&"GOSEEN"), 2) | (Some(&"GOGONE"), 3) => {
                    if let (Some(h), Ok(sent)) = (hold.as_ref(), f[1].parse()) {
                        let found = f[0] == "GOSEEN";
                        let received = f.get(2).and_then(|v| v.parse().ok()).unwrap_or(sent);
                        let keys = if found {
                            vec![h.key.clone()]
                        } else {
                            Vec::new()
                        };
                        let seen = parsed.seen.entry(name.clone()).or_default();
                        seen.push(Seen {
                            sent,
                            received,
                            keys,
                            only: Some(h.key.clone()),
                        });
                    }
                }
                (Some(&"GOEND"), 2) => {
                    if let (Some(h), Ok(end)) = (hold.as_mut(), f[1].parse()) {
                        h.end = end;
                    }
                }
                _ => {}
            }
        }
        parsed.holds.extend(hold);
    }
    parsed
}

/// Holder names of the covers below.
const COVER: &str = "go:";

/// Every etcdctl process's life counts as a hold of its name for the liveness checks
/// (ours and the multi-lock's): a waiter of ours may wait behind a Go waiter or holder,
/// or behind the key of a killed one until its lease expires.
pub(crate) fn add_covers(sections: &mut HashMap<String, Vec<Section>>, parsed: &Parsed) {
    for (i, (name, start, end)) in parsed.lives.iter().enumerate() {
        sections.entry(name.clone()).or_default().push(Section {
            mode: "x".into(),
            token: -1,
            holder: format!("{COVER}{i}"),
            enter: *start,
            confirmed: *start,
            accepted: 0,
            rejected: 0,
            first_rev: 0,
            last_rev: 0,
            key: String::new(),
            held_until: *end,
            lost_at: 0,
            released_at: *end,
            how: "go".into(),
            rev: -1,
        });
    }
}

/// Takes the covers out again, before the safety checks.
pub(crate) fn remove_covers(sections: &mut HashMap<String, Vec<Section>>) {
    for list in sections.values_mut() {
        list.retain(|s| !s.holder.starts_with(COVER));
    }
}

/// Overlaps by kind, each with a line that says who and when.
#[derive(Debug, Default)]
pub(crate) struct Judged {
    /// Our guard confirmed while a Go holder ran with its key still there: ours.
    pub(crate) ours: Vec<String>,
    /// Our guard beside a Go holder whose key was gone: Go's (it did not notice).
    pub(crate) go_lost: Vec<String>,
    /// The key's end fell between two reads: not judged.
    pub(crate) undecided: Vec<String>,
    /// Two Go holders at once: Go's bug.
    pub(crate) go_overlaps: Vec<String>,
    /// Go holds whose key a read found (the others' overlaps could only be undecided).
    pub(crate) keys_seen: usize,
}

/// Until when `hold`'s key certainly existed (sent time of the last read that found it),
/// and from when it was certainly gone (the return of the first later read without it).
fn key_life(hold: &GoHold, seen: &HashMap<String, Vec<Seen>>) -> (Option<u64>, Option<u64>) {
    let reads: Vec<&Seen> = (seen.get(&hold.name).into_iter().flatten())
        .filter(|r| r.only.as_ref().is_none_or(|k| *k == hold.key))
        .collect();
    let present = reads
        .iter()
        .filter(|r| r.keys.contains(&hold.key))
        .map(|r| r.sent)
        .max();
    // Reads sent after the hold began (its key existed then) that no longer list it.
    let after = present.unwrap_or(0).max(hold.start);
    let gone = reads
        .iter()
        .filter(|r| r.sent >= after && !r.keys.contains(&hold.key))
        .map(|r| r.received)
        .min();
    (present, gone)
}

/// Judges every Go hold against our guards of its name (after `clip_deleted`) and against
/// the other Go holds.
pub(crate) fn judge(parsed: &Parsed, sections: &HashMap<String, Vec<Section>>) -> Judged {
    let mut judged = Judged::default();
    let none = Vec::new();
    for h in &parsed.holds {
        let (present, gone) = key_life(h, &parsed.seen);
        judged.keys_seen += usize::from(present.is_some());
        for s in sections.get(&h.name).unwrap_or(&none) {
            let (t0, t1) = (s.enter.max(h.start), s.confirmed.min(h.end));
            if t1 <= t0 {
                continue;
            }
            let what = format!(
                "{}: {} token {} ({}, key {}) confirmed over [{t0}, {t1}] ns beside Go holder \
                 go-{} (key {}, held [{}, {}]; key last seen at {}, seen gone by {})",
                h.name,
                s.mode,
                s.token,
                s.holder,
                s.key,
                h.n,
                h.key,
                h.start,
                h.end,
                present.map_or("never".into(), |t| t.to_string()),
                gone.map_or("never".into(), |t| t.to_string()),
            );
            if present.is_some_and(|p| t0 <= p) {
                judged.ours.push(what);
            } else if gone.is_some_and(|g| t0 >= g) {
                judged.go_lost.push(what);
            } else {
                judged.undecided.push(what);
            }
        }
    }
    let mut by_name: HashMap<&str, Vec<&GoHold>> = HashMap::new();
    for h in &parsed.holds {
        by_name.entry(h.name.as_str()).or_default().push(h);
    }
    for (name, mut holds) in by_name {
        holds.sort_by_key(|h| h.start);
        for (i, a) in holds.iter().enumerate() {
            for b in holds[i + 1..].iter().take_while(|b| b.start < a.end) {
                judged.go_overlaps.push(format!(
                    "{name}: Go holders go-{} ({}) and go-{} ({}) at once over [{}, {}] ns",
                    a.n,
                    a.key,
                    b.n,
                    b.key,
                    b.start,
                    a.end.min(b.end)
                ));
            }
        }
    }
    judged
}

/// Judges, prints the fleet's figures, and returns the violations of ours.
pub(crate) fn judge_and_report(
    parsed: &Parsed,
    sections: &HashMap<String, Vec<Section>>,
) -> Vec<String> {
    let judged = judge(parsed, sections);
    let mut by_name = BTreeMap::<&str, usize>::new();
    for h in &parsed.holds {
        *by_name.entry(h.name.as_str()).or_default() += 1;
    }
    println!(
        "CHECKER go fleet: children={} through_proxy={} ends={:?} go_holds={} by_name={by_name:?} \
         keys_seen={} overlaps: ours={} go_lost_key={} undecided={} go_go={}",
        parsed.spawned,
        parsed.through_proxy,
        parsed.ends,
        parsed.holds.len(),
        judged.keys_seen,
        judged.ours.len(),
        judged.go_lost.len(),
        judged.undecided.len(),
        judged.go_overlaps.len(),
    );
    println!("CHECKER go_overlaps={}", judged.go_overlaps.len());
    for (kind, lines) in [
        (
            "Go-Go overlap (Go's bug, not failed on)",
            &judged.go_overlaps,
        ),
        (
            "beside a Go holder whose key was gone (Go's)",
            &judged.go_lost,
        ),
        ("beside a Go holder, undecided", &judged.undecided),
    ] {
        for line in lines.iter().take(5) {
            println!("CHECKER go note: {kind}: {line}");
        }
    }
    judged
        .ours
        .iter()
        .map(|o| format!("overlap with a live Go holder: {o}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(enter: u64, confirmed: u64) -> Section {
        Section {
            mode: "x".into(),
            token: 7,
            holder: "1:0:0".into(),
            enter,
            confirmed,
            accepted: 0,
            rejected: 0,
            first_rev: 0,
            last_rev: 0,
            key: "n/ours".into(),
            held_until: confirmed,
            lost_at: 0,
            released_at: confirmed,
            how: "unlock".into(),
            rev: 7,
        }
    }

    fn go(n: usize, start: u64, end: u64) -> GoHold {
        GoHold {
            n,
            name: "n".into(),
            key: format!("n/go{n}"),
            start,
            end,
        }
    }

    fn seen(sent: u64, keys: &[&str]) -> Seen {
        Seen {
            sent,
            received: sent + 1,
            keys: keys.iter().map(|k| k.to_string()).collect(),
            only: None,
        }
    }

    fn judged(holds: Vec<GoHold>, reads: Vec<Seen>, guard: Section) -> Judged {
        let parsed = Parsed {
            holds,
            seen: HashMap::from([("n".to_string(), reads)]),
            ..Parsed::default()
        };
        judge(&parsed, &HashMap::from([("n".to_string(), vec![guard])]))
    }

    #[test]
    fn our_guard_beside_a_live_go_key_is_ours() {
        // The Go key is seen at 25, after our guard entered (15) beside its holder.
        let j = judged(
            vec![go(1, 10, 30)],
            vec![seen(25, &["n/go1"])],
            ours(15, 20),
        );
        assert_eq!((j.ours.len(), j.go_lost.len()), (1, 0), "{j:?}");
    }

    #[test]
    fn a_go_holder_whose_key_was_gone_is_go_s_problem() {
        // Seen at 11, gone by the read sent at 12 (returned at 13); our guard entered at 15.
        let reads = vec![seen(11, &["n/go1"]), seen(12, &[])];
        let j = judged(vec![go(1, 10, 30)], reads, ours(15, 20));
        assert_eq!((j.ours.len(), j.go_lost.len()), (0, 1), "{j:?}");
        // Between the last read with the key and the first without: undecided.
        let reads = vec![seen(11, &["n/go1"]), seen(18, &[])];
        let j = judged(vec![go(1, 10, 30)], reads, ours(15, 20));
        assert_eq!((j.ours.len(), j.undecided.len()), (0, 1), "{j:?}");
        // In turn: nothing.
        let j = judged(vec![go(1, 10, 14)], vec![], ours(15, 20));
        assert_eq!(j.ours.len() + j.go_lost.len() + j.undecided.len(), 0);
    }

    #[test]
    fn logs_are_read_back_into_holds_and_judged() {
        let dir = std::env::temp_dir().join(format!("fleet-judge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let go = "GOSPAWN 1 n 1 5\nGOKEYS 12 13 n n/go1@40,n/ours@41\nGOKEYS 25 26 n n/go1@40\n\
                  GOKEYS 40 41 n -\nGOEXIT 1 35 0\nGOSPAWN 2 n 0 36\nGOKILL 2 50 sigkill\n";
        std::fs::write(dir.join("go"), go).expect("write go");
        std::fs::write(
            dir.join("go-1"),
            "GOHOLD n/go1 44 10\nGOSEEN 29\nGOEND 30\n",
        )
        .expect("write go-1");
        std::fs::write(dir.join("go-2"), "GOHOLD n/go2 47 45\n").expect("write go-2");
        let parsed = parse(&dir, 100);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!((parsed.spawned, parsed.through_proxy), (2, 1));
        let holds: Vec<_> = parsed.holds.iter().map(|h| (h.n, h.start, h.end)).collect();
        // The killed one's hold ends at the kill; its life blocks the name a TTL more.
        assert_eq!(holds, vec![(1, 10, 30), (2, 45, 50)]);
        let ttl = TTL.as_nanos() as u64;
        assert_eq!(parsed.lives[1], ("n".to_string(), 36, 50 + ttl));
        // Our guard entered at 27, after the poller's last sight (25): the command's own
        // read at 29 decides it.
        let sections = HashMap::from([("n".to_string(), vec![ours(27, 28)])]);
        let j = judge(&parsed, &sections);
        assert_eq!((j.ours.len(), j.keys_seen), (1, 1), "{j:?}");
        let mut with_covers = sections;
        add_covers(&mut with_covers, &parsed);
        assert_eq!(with_covers["n"].len(), 3);
        remove_covers(&mut with_covers);
        assert_eq!(with_covers["n"].len(), 1);
    }

    #[test]
    fn go_holders_at_once_are_counted() {
        let j = judged(vec![go(1, 10, 30), go(2, 20, 40)], vec![], ours(50, 60));
        assert_eq!((j.go_overlaps.len(), j.ours.len()), (1, 0), "{j:?}");
    }
}
