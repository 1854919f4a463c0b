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
        out.push_str("CYCLE (deadlock):");
        for step in &cycle.steps {
            let _ = write!(
                out,
                "  {} waits for {} held by {};",
                who(graph, step.lease),
                step.name_str(),
                who(graph, step.holder),
            );
        }
        out.pop();
        out.push('\n');
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
