//! Deadlock detection in the randomized checker (issue 53, item 2): every child's client
//! checks for cycles under [`PREFIX`] (`ClientBuilder::deadlock_detection`), so a wait of
//! any thread may end with `Deadlock`. The workers of one session share it across threads,
//! and the graph's parties are sessions: a session whose thread holds `ck-a` while its other
//! thread waits for `ck-b`, and another session the other way round, is a cycle by the
//! documented rule, and one of the waits may end with it.
//!
//! The judge: a `Deadlock` must name a cycle etcd had at the error's revision. Right after
//! the error the child reads every key under the prefix *at that revision*
//! (`Client::get_prefix_at`) and checks each step: the waiting session has a key on the
//! name that does not hold, and the next session of the ring (the step's holder) has an
//! older key on it. Each error logs `DEADLOCK <verdict> <revision> <steps>`: `ring`,
//! `compacted` (the history is gone: not judged), `unread` (no endpoint answered: not
//! judged) or `bad:<why>` (a violation); then `CYCLE <revision> <the cycle's text>`.

use std::collections::BTreeMap;

use etcd_sync::{Client, Error, KeyValue};

use super::{Log, log};

/// The names whose waits check for cycles: every lock, election, read-write lock and
/// semaphore name of the checker (their data, barrier and STM keys too, which the
/// detection reads and ignores).
pub(crate) const PREFIX: &str = "ck-";

/// Judges `e` if it is a `Deadlock`, and logs the verdict.
pub(crate) fn judge(client: &Client, log_file: &Log, e: &Error) {
    let (Some(cycle), Error::Deadlock { revision, .. }) = (e.deadlock_cycle(), e) else {
        return;
    };
    let verdict = match client.get_prefix_at(PREFIX, *revision) {
        Ok(kvs) => match ring_at(&kvs, cycle) {
            Ok(()) => "ring".to_string(),
            Err(why) => format!("bad:{}", why.replace(' ', "_")),
        },
        Err(Error::Server {
            code: etcd_sync::Code::OutOfRange,
            ..
        }) => "compacted".to_string(),
        // Unreachable now (a fault): not judged either.
        Err(_) => "unread".to_string(),
    };
    log(
        log_file,
        format!("DEADLOCK {verdict} {revision} {}", cycle.steps.len()),
    );
    log(log_file, format!("CYCLE {revision} {cycle}"));
}

/// Whether `kvs` (every key under the prefix at the error's revision) has the ring.
fn ring_at(kvs: &[KeyValue], cycle: &etcd_sync::Cycle) -> Result<(), String> {
    let steps = &cycle.steps;
    if steps.is_empty() {
        return Err("no steps".into());
    }
    for (step, next) in steps.iter().zip(steps.iter().cycle().skip(1)) {
        if step.holder != next.lease {
            return Err(format!("{:x} is not the next waiter", step.holder));
        }
    }
    for step in steps {
        let prefix = [step.name.as_slice(), b"/"].concat();
        let mut line: Vec<&KeyValue> = kvs
            .iter()
            .filter(|kv| kv.key.starts_with(&prefix))
            .collect();
        line.sort_by_key(|kv| kv.create_revision);
        let holding = holding(&line);
        let Some(waits) = line[holding.min(line.len())..]
            .iter()
            .filter(|kv| kv.lease == step.lease)
            .map(|kv| kv.create_revision)
            .max()
        else {
            return Err(format!(
                "{:x} did not wait on {}",
                step.lease,
                step.name_str()
            ));
        };
        if !line
            .iter()
            .any(|kv| kv.lease == step.holder && kv.create_revision < waits)
        {
            return Err(format!(
                "{:x} was not ahead of {:x} on {}",
                step.holder,
                step.lease,
                step.name_str()
            ));
        }
    }
    Ok(())
}

/// How many of a line's oldest keys hold (the line in create order): readers in a row,
/// the permits whose weights fit, else the oldest key alone.
fn holding(line: &[&KeyValue]) -> usize {
    let suffix = |kv: &KeyValue| {
        let key = kv.key_str();
        key.rsplit_once('/')
            .map_or(String::new(), |(_, k)| k.to_string())
    };
    let Some(first) = line.first() else {
        return 0;
    };
    let first = suffix(first);
    if first.ends_with(".shared") {
        return line
            .iter()
            .take_while(|kv| suffix(kv).ends_with(".shared"))
            .count();
    }
    let Some((_, permits)) = first.split_once(".permits-") else {
        return 1;
    };
    // `.permits-N` or `.permits-N.xK`: K of N permits.
    let of = |s: &str| -> Option<(u64, u64)> {
        let (_, p) = s.split_once(".permits-")?;
        match p.split_once(".x") {
            Some((n, k)) => Some((n.parse().ok()?, k.parse().ok()?)),
            None => Some((p.parse().ok()?, 1)),
        }
    };
    let Some((n, _)) = of(&format!(".permits-{permits}")) else {
        return 1;
    };
    let mut used = 0;
    line.iter()
        .take_while(|kv| match of(&suffix(kv)) {
            Some((_, k)) if used + k <= n => {
                used += k;
                true
            }
            _ => false,
        })
        .count()
}

/// The `DEADLOCK` lines of every child: verdicts and how many of each.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// How many `Deadlock` errors had each verdict (`ring`, `compacted`, `unread`, `bad`).
    pub(crate) verdicts: BTreeMap<String, u64>,
    /// Every `bad` one, with its child's log: a `Deadlock` without a cycle.
    pub(crate) bad: Vec<String>,
}

pub(crate) fn parse(dir: &std::path::Path, files: usize) -> Report {
    let mut report = Report::default();
    for n in 1..=files {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("log-{n}"))) else {
            continue;
        };
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() != 4 || f[0] != "DEADLOCK" {
                continue;
            }
            let verdict = f[1].split(':').next().unwrap_or_default();
            *report.verdicts.entry(verdict.to_string()).or_default() += 1;
            if verdict == "bad" {
                report.bad.push(format!(
                    "a Deadlock at revision {} named no cycle etcd had then ({}, log-{n})",
                    f[2], f[1]
                ));
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, lease: i64, create_revision: i64) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            lease,
            create_revision,
            ..Default::default()
        }
    }

    fn step(lease: i64, name: &str, holder: i64) -> etcd_sync::CycleStep {
        etcd_sync::CycleStep {
            lease,
            name: name.as_bytes().to_vec(),
            holder,
            identity: None,
        }
    }

    /// The judge refuses what the store did not have: the teeth of the checker's verdict.
    #[test]
    fn a_cycle_is_judged_against_the_keys_at_its_revision() {
        // 0xa holds ck-a and waits for ck-rw (a writer); 0xb holds ck-rw (a reader) and
        // waits for ck-a.
        let kvs = [
            kv("ck-a/a", 0xa, 10),
            kv("ck-a/b", 0xb, 12),
            kv("ck-rw/b.shared", 0xb, 11),
            kv("ck-rw/a", 0xa, 13),
        ];
        let cycle = |steps| etcd_sync::Cycle { steps };
        let real = cycle(vec![step(0xa, "ck-rw", 0xb), step(0xb, "ck-a", 0xa)]);
        assert_eq!(ring_at(&kvs, &real), Ok(()));
        // Not a ring: 0xa's holder is not the next step's waiter.
        let broken = cycle(vec![step(0xa, "ck-rw", 0xc), step(0xb, "ck-a", 0xa)]);
        assert!(
            ring_at(&kvs, &broken)
                .unwrap_err()
                .contains("not the next waiter")
        );
        // A ring the store did not have: 0xa's key on ck-a is the older one, so 0xa did
        // not wait on ck-a behind 0xb.
        let reversed = cycle(vec![step(0xa, "ck-a", 0xb), step(0xb, "ck-rw", 0xa)]);
        assert!(ring_at(&kvs, &reversed).is_err());
        // A session that holds (the first reader) does not wait.
        let holding = [kv("ck-rw/b.shared", 0xb, 11), kv("ck-rw/a.shared", 0xa, 13)];
        let readers = cycle(vec![step(0xa, "ck-rw", 0xb), step(0xb, "ck-rw", 0xa)]);
        assert!(
            ring_at(&holding, &readers)
                .unwrap_err()
                .contains("did not wait")
        );
        assert!(ring_at(&kvs, &cycle(Vec::new())).is_err());
    }

    #[test]
    fn the_holding_keys_of_each_mode() {
        let line = |keys: &[&str]| -> usize {
            let kvs: Vec<KeyValue> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| kv(k, 1, i as i64))
                .collect();
            holding(&kvs.iter().collect::<Vec<_>>())
        };
        assert_eq!(line(&[]), 0);
        assert_eq!(line(&["ck-a/1", "ck-a/2"]), 1);
        assert_eq!(
            line(&[
                "ck-rw/1.shared",
                "ck-rw/2.shared",
                "ck-rw/3",
                "ck-rw/4.shared"
            ]),
            2
        );
        assert_eq!(line(&["ck-rw/3", "ck-rw/4.shared"]), 1);
        assert_eq!(
            line(&[
                "ck-sem/1.permits-2",
                "ck-sem/2.permits-2",
                "ck-sem/3.permits-2"
            ]),
            2
        );
        assert_eq!(line(&["ck-sem/1.permits-2.x2", "ck-sem/2.permits-2"]), 1);
    }
}
