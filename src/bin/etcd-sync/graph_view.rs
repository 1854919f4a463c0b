//! What `etcd-sync top` shows of a `WaitGraph`: the screen (each name's holders and
//! waiters, the cycles first) and the JSON object of `top --json`, whose fields and their
//! order [`GraphJson`] and the structs under it fix (documented in `args::TOP_ABOUT`).

use std::fmt::Write as _;
use std::time::Duration;

use etcd_sync::{Holder, KeyMode, Participant, Place, WaitGraph};
use serde::Serialize;

use crate::status::{NO_IDENTITY, StatusJson};

/// How long `top` has seen a wait: since its first refresh that showed it; `at_least` when
/// that was `top`'s first refresh (the wait began before `top` started).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub waiting: Duration,
    pub at_least: bool,
}

/// The screen: a title, the cycles, then each name's line.
pub fn screen(graph: &WaitGraph, seen: &dyn Fn(&Holder) -> Option<Seen>) -> String {
    let prefix = String::from_utf8_lossy(&graph.prefix);
    let waits: usize = graph.participants.iter().map(|p| p.waits.len()).sum();
    let mut out = format!(
        "etcd-sync top {prefix:?}  revision {}  {} names, {} sessions, {waits} waiting  (q or Ctrl-C quits)\n",
        graph.revision,
        graph.names.len(),
        graph.participants.iter().filter(|p| p.lease != 0).count(),
    );
    if graph.cycles.is_empty() {
        out.push_str("no cycles\n");
    }
    for cycle in &graph.cycles {
        out.push_str("CYCLE (deadlock):\n");
        for step in &cycle.steps {
            let _ = writeln!(
                out,
                "  {} waits for {} held by {}",
                who(graph, step.lease),
                step.name_str(),
                who(graph, step.holder),
            );
        }
    }
    for status in &graph.names {
        let _ = write!(out, "\n{}  ", status.name_str());
        if status.is_held() {
            let _ = writeln!(
                out,
                "held by {}, {} waiting",
                status.holders.len(),
                status.waiters.len()
            );
        } else {
            out.push_str("free\n");
        }
        let keys = status.holders.iter().map(|h| ("holder", h));
        for (i, (role, key)) in keys
            .chain(status.waiters.iter().map(|w| ("waiter", w)))
            .enumerate()
        {
            let p = graph.participant(key.lease);
            let _ = write!(
                out,
                "  {role}  {}  {}",
                lease_text(key.lease),
                key.identity().as_deref().unwrap_or(NO_IDENTITY)
            );
            if role == "waiter" {
                let _ = write!(out, "  {i} ahead");
                if let Some(seen) = seen(key) {
                    let plus = if seen.at_least { "+" } else { "" };
                    let _ = write!(out, "  waiting {}s{plus}", seen.waiting.as_secs());
                }
            }
            if let Some(p) = p.filter(|p| p.lease != 0) {
                let _ = write!(out, "  ttl {}", ttl_text(p));
                if p.stuck && role == "waiter" {
                    out.push_str("  STUCK");
                }
            }
            match key.mode {
                KeyMode::Exclusive => {}
                KeyMode::Shared => out.push_str("  shared"),
                KeyMode::Permits(n) => {
                    let _ = write!(out, "  permits {n}");
                }
                KeyMode::Other => out.push_str("  not a lock key"),
            }
            out.push('\n');
        }
    }
    if graph.names.is_empty() {
        out.push_str("\nno locks, semaphores or elections under this prefix\n");
    }
    out
}

/// A session as `lease (identity)`.
fn who(graph: &WaitGraph, lease: i64) -> String {
    let identity = graph
        .participant(lease)
        .and_then(|p| p.identity.as_deref())
        .unwrap_or(NO_IDENTITY);
    format!("{} ({identity})", lease_text(lease))
}

fn lease_text(lease: i64) -> String {
    if lease == 0 {
        "no-lease".into()
    } else {
        format!("{lease:x}")
    }
}

/// `left/granted` in seconds, `gone` when etcd no longer knows the lease.
fn ttl_text(p: &Participant) -> String {
    match (p.ttl, p.granted_ttl) {
        (Some(left), Some(granted)) => format!("{}s/{}s", left.as_secs(), granted.as_secs()),
        _ => "gone".into(),
    }
}

/// `top --json`: the whole graph in one object.
pub fn json(graph: &WaitGraph) -> serde_json::Result<String> {
    serde_json::to_string(&GraphJson {
        prefix: String::from_utf8_lossy(&graph.prefix).into_owned(),
        revision: graph.revision,
        names: graph.names.iter().map(StatusJson::new).collect(),
        sessions: graph.participants.iter().map(SessionJson::new).collect(),
        cycles: graph
            .cycles
            .iter()
            .map(|cycle| {
                cycle
                    .steps
                    .iter()
                    .map(|step| StepJson {
                        lease: hex(step.lease),
                        identity: graph
                            .participant(step.lease)
                            .and_then(|p| p.identity.clone()),
                        waits_for: step.name_str().into_owned(),
                        held_by: hex(step.holder),
                    })
                    .collect()
            })
            .collect(),
    })
}

#[derive(Serialize)]
struct GraphJson {
    prefix: String,
    revision: i64,
    names: Vec<StatusJson>,
    sessions: Vec<SessionJson>,
    /// Each cycle as its steps.
    cycles: Vec<Vec<StepJson>>,
}

#[derive(Serialize)]
struct SessionJson {
    /// In hex; `null` gathers the keys without a lease.
    lease: Option<String>,
    identity: Option<String>,
    /// Seconds left, and granted; `null` without a lease or once it is gone.
    ttl: Option<u64>,
    granted_ttl: Option<u64>,
    holds: Vec<PlaceJson>,
    waits: Vec<PlaceJson>,
    stuck: bool,
}

impl SessionJson {
    fn new(p: &Participant) -> SessionJson {
        SessionJson {
            lease: hex(p.lease),
            identity: p.identity.clone(),
            ttl: p.ttl.map(|t| t.as_secs()),
            granted_ttl: p.granted_ttl.map(|t| t.as_secs()),
            holds: p.holds.iter().map(|h| PlaceJson::new(h, false)).collect(),
            waits: p.waits.iter().map(|w| PlaceJson::new(w, true)).collect(),
            stuck: p.stuck,
        }
    }
}

#[derive(Serialize)]
struct PlaceJson {
    name: String,
    key: String,
    /// Keys ahead in the name's line.
    position: usize,
    /// Only for a wait: the holders' leases in hex (`null` for a holder key without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    blocked_by: Option<Vec<Option<String>>>,
}

impl PlaceJson {
    fn new(place: &Place, wait: bool) -> PlaceJson {
        PlaceJson {
            name: place.name_str().into_owned(),
            key: place.key.key_str().into_owned(),
            position: place.position,
            blocked_by: wait.then(|| place.blocked_by.iter().map(|&l| hex(l)).collect()),
        }
    }
}

#[derive(Serialize)]
struct StepJson {
    lease: Option<String>,
    identity: Option<String>,
    waits_for: String,
    held_by: Option<String>,
}

/// A lease in hex, as in its keys; `None` for 0 (no lease).
fn hex(lease: i64) -> Option<String> {
    (lease != 0).then(|| format!("{lease:x}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_sync::{Cycle, CycleStep, Status};

    fn key(name: &str, lease: i64, rev: i64, identity: &str) -> Holder {
        Holder {
            key: format!("{name}/{lease:x}").into_bytes(),
            value: identity.as_bytes().to_vec(),
            lease,
            create_revision: rev,
            mod_revision: rev,
            mode: KeyMode::Exclusive,
            ttl: Some(Duration::from_secs(9)),
        }
    }

    fn place(name: &str, key: Holder, position: usize, blocked_by: &[i64]) -> Place {
        Place {
            name: name.as_bytes().to_vec(),
            key,
            position,
            blocked_by: blocked_by.to_vec(),
        }
    }

    /// a (lease 0xa) holds x and waits for y; b (0xb) holds y and waits for x.
    fn deadlock() -> WaitGraph {
        let status = |name: &str, holder: i64, waiter: i64| Status {
            name: name.as_bytes().to_vec(),
            holders: vec![key(name, holder, holder, &format!("host-{holder:x}"))],
            waiters: vec![key(name, waiter, 20 + waiter, &format!("host-{waiter:x}"))],
            revision: 40,
        };
        let participant = |lease: i64, holds: &str, waits: &str, other: i64| Participant {
            lease,
            identity: Some(format!("host-{lease:x}")),
            ttl: Some(Duration::from_secs(9)),
            granted_ttl: Some(Duration::from_secs(10)),
            holds: vec![place(holds, key(holds, lease, lease, ""), 0, &[])],
            waits: vec![place(waits, key(waits, lease, 20 + lease, ""), 1, &[other])],
            stuck: true,
        };
        WaitGraph {
            prefix: b"d/".to_vec(),
            revision: 40,
            names: vec![status("d/x", 0xa, 0xb), status("d/y", 0xb, 0xa)],
            participants: vec![
                participant(0xa, "d/x", "d/y", 0xb),
                participant(0xb, "d/y", "d/x", 0xa),
            ],
            cycles: vec![Cycle {
                steps: vec![
                    CycleStep {
                        lease: 0xa,
                        name: b"d/y".to_vec(),
                        holder: 0xb,
                        identity: None,
                    },
                    CycleStep {
                        lease: 0xb,
                        name: b"d/x".to_vec(),
                        holder: 0xa,
                        identity: None,
                    },
                ],
            }],
        }
    }

    #[test]
    fn screen_shows_the_cycle_then_each_line() {
        let seen = |key: &Holder| {
            (key.lease == 0xb).then_some(Seen {
                waiting: Duration::from_secs(7),
                at_least: true,
            })
        };
        assert_eq!(
            screen(&deadlock(), &seen),
            "etcd-sync top \"d/\"  revision 40  2 names, 2 sessions, 2 waiting  (q or Ctrl-C quits)\n\
             CYCLE (deadlock):\n  \
               a (host-a) waits for d/y held by b (host-b)\n  \
               b (host-b) waits for d/x held by a (host-a)\n\
             \n\
             d/x  held by 1, 1 waiting\n  \
               holder  a  host-a  ttl 9s/10s\n  \
               waiter  b  host-b  1 ahead  waiting 7s+  ttl 9s/10s  STUCK\n\
             \n\
             d/y  held by 1, 1 waiting\n  \
               holder  b  host-b  ttl 9s/10s\n  \
               waiter  a  host-a  1 ahead  ttl 9s/10s  STUCK\n"
        );
    }

    #[test]
    fn json_object() {
        let text = json(&deadlock()).unwrap();
        assert!(
            text.starts_with(r#"{"prefix":"d/","revision":40,"names":[{"name":"d/x","holders":"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#""sessions":[{"lease":"a","identity":"host-a","ttl":9,"granted_ttl":10,"holds":[{"name":"d/x","key":"d/x/a","position":0}],"waits":[{"name":"d/y","key":"d/y/a","position":1,"blocked_by":["b"]}],"stuck":true},"#
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                r#""cycles":[[{"lease":"a","identity":"host-a","waits_for":"d/y","held_by":"b"},{"lease":"b","identity":"host-b","waits_for":"d/x","held_by":"a"}]]}"#
            ),
            "{text}"
        );
    }
}
