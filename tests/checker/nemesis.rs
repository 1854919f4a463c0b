//! The nemesis: the faults production sees, picked at random from the run's seed, one at a
//! time, with quiet stretches of 5-7 s between some of them (where the liveness checks judge).
//!
//! Every fault is logged to the parent's log as `FAULT <kind> <start> <end>` (CLOCK_MONOTONIC
//! ns), every operator delete as `DEL <key> <create revision> <before> <after> <lease>`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use etcd_sync::testing::{EtcdCluster, EtcdProxy, Fault, NetFaults, Node};
use etcd_sync::{Client, Txn, TxnOp, TxnOpResponse};

use super::common::monotonic_ns;
use super::{Log, NAMES, REQUEST_TIMEOUT, Rng, log};

/// Every fault the nemesis knows. `CHECKER_FAULTS` picks among them.
pub(crate) const FAULTS: [&str; 11] = [
    "client_sigkill",
    "member_kill",
    "member_pause",
    "cluster_freeze",
    "compaction",
    "snapshot_restart",
    "leader_transfer",
    "learner",
    "operator_delete",
    "proxy_restart",
    "partition",
];

/// The voting members the cluster starts with (learners get the indices after them).
pub(crate) const VOTERS: usize = 3;
/// `--snapshot-count` of the cluster: a member down for more than etcd's catch-up window
/// (5,000 entries in 3.4 and 3.5) plus this many entries is sent a snapshot.
pub(crate) const SNAPSHOT_COUNT: u64 = 50;
/// etcd's in-memory catch-up window (`snapshot-catchup-entries`, fixed in 3.4 and 3.5).
const CATCH_UP_ENTRIES: u64 = 5_000;
/// The cluster's periodic auto-compaction (when compaction is among the faults).
pub(crate) const AUTO_COMPACTION: Duration = Duration::from_secs(2);

/// The faults of this run: `CHECKER_FAULTS` is a comma-separated list of fault names (all
/// of them if unset or empty); names prefixed with `-` are taken out (`-compaction`: every
/// fault but compaction).
pub(crate) fn enabled_faults() -> Vec<&'static str> {
    let spec = std::env::var("CHECKER_FAULTS").unwrap_or_default();
    let words: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .collect();
    for word in &words {
        let name = word.trim_start_matches('-');
        assert!(
            FAULTS.contains(&name) || name == "all",
            "CHECKER_FAULTS: unknown fault {name:?} (known: {FAULTS:?})"
        );
    }
    let included: Vec<&str> = words
        .iter()
        .filter(|w| !w.starts_with('-') && **w != "all")
        .copied()
        .collect();
    FAULTS
        .into_iter()
        .filter(|f| included.is_empty() || included.contains(f))
        .filter(|f| !words.contains(&format!("-{f}").as_str()))
        .collect()
}

/// Faults that break watch streams or move the leadership: a compaction may come first.
fn disruptive(fault: &str) -> bool {
    matches!(
        fault,
        "member_kill"
            | "proxy_restart"
            | "partition"
            | "member_pause"
            | "cluster_freeze"
            | "snapshot_restart"
            | "leader_transfer"
            | "learner"
    )
}

pub(crate) struct Nemesis<'a> {
    pub(crate) cluster: &'a mut EtcdCluster,
    /// etcd's gRPC proxy in front of the cluster, which half the children talk to.
    pub(crate) proxy: &'a EtcdProxy,
    /// The run's network namespace, where links can be cut (when `partition` is enabled).
    pub(crate) net: Option<&'a NetFaults>,
    pub(crate) client: Client,
    pub(crate) log: Log,
    pub(crate) enabled: Vec<&'static str>,
    /// How many times each fault ran (a compaction before another fault counts too).
    pub(crate) counts: BTreeMap<String, u64>,
    /// Faults that could not be injected (an etcdctl refusal, say), for the summary.
    pub(crate) errors: Vec<String>,
    /// Restarts after which the member's log says it received a snapshot.
    pub(crate) snapshots_received: u64,
    /// Keys deleted by the operator.
    pub(crate) deletes: u64,
}

impl Nemesis<'_> {
    /// Faults until 5 s before `deadline`; `sigkill` SIGKILLs a random child and starts
    /// another.
    pub(crate) fn run(
        &mut self,
        rng: &mut Rng,
        deadline: Instant,
        sigkill: &mut dyn FnMut(&mut Rng),
    ) {
        let mut choices: Vec<&'static str> = self.enabled.clone();
        choices.push("none");
        if self.enabled.contains(&"operator_delete") {
            choices.push("operator_delete"); // cheap and no outage: twice as likely
        }
        while Instant::now() + Duration::from_secs(5) < deadline {
            std::thread::sleep(rng.millis(1000, 2500));
            if rng.below(4) == 0 {
                // A quiet stretch: no fault, so the liveness checks have windows to judge.
                *self.counts.entry("quiet".into()).or_default() += 1;
                std::thread::sleep(rng.millis(5000, 7000));
                continue;
            }
            let mut fault = choices[rng.below(choices.len() as u64) as usize];
            let left = deadline.saturating_duration_since(Instant::now());
            if matches!(fault, "snapshot_restart" | "learner") && left < Duration::from_secs(20) {
                fault = "none"; // too long to end before the children stop
            }
            if disruptive(fault) && self.enabled.contains(&"compaction") && rng.below(2) == 0 {
                self.inject(rng, "compaction", sigkill);
            }
            self.inject(rng, fault, sigkill);
        }
    }

    fn inject(&mut self, rng: &mut Rng, fault: &'static str, sigkill: &mut dyn FnMut(&mut Rng)) {
        let start = monotonic_ns();
        let result = match fault {
            "client_sigkill" => {
                sigkill(rng);
                Ok(())
            }
            "member_kill" => self.member_kill(rng),
            "member_pause" => self.member_pause(rng),
            "cluster_freeze" => self.cluster_freeze(rng),
            "compaction" => self.compaction(),
            "snapshot_restart" => self.snapshot_restart(rng),
            "leader_transfer" => self.leader_transfer(rng),
            "learner" => self.learner(rng),
            "operator_delete" => self.operator_delete(rng),
            "proxy_restart" => self.proxy_restart(rng),
            "partition" => self.partition(rng),
            _ => Ok(()),
        };
        let end = monotonic_ns();
        *self.counts.entry(fault.into()).or_default() += 1;
        if fault != "none" && fault != "operator_delete" {
            log(&self.log, format!("FAULT {fault} {start} {end}"));
        }
        if let Err(e) = result {
            self.errors.push(format!("{fault}: {e}"));
        }
    }

    fn member_kill(&mut self, rng: &mut Rng) -> Result<(), String> {
        let member = rng.below(VOTERS as u64) as usize;
        self.cluster.kill(member).map_err(|e| e.to_string())?;
        std::thread::sleep(rng.millis(300, 1500));
        self.cluster.restart(member).map_err(|e| e.to_string())
    }

    /// The gRPC proxy killed and started again on its port: the children talking to it
    /// lose their streams and move to a member, or wait for it.
    fn proxy_restart(&mut self, rng: &mut Rng) -> Result<(), String> {
        self.proxy.kill().map_err(|e| e.to_string())?;
        std::thread::sleep(rng.millis(300, 1500));
        self.proxy.restart().map_err(|e| e.to_string())
    }

    /// A real network partition (nftables in the run's namespace), black hole or reset, for
    /// 0.5-4 s: the clients (children, the proxy, the parent) cut from a member both ways or
    /// one way, the leader or a follower cut from the other members, or a bridge (two
    /// members cut from each other, the third sees both). Each kind is counted as
    /// `partition:<kind>:<fault>`.
    fn partition(&mut self, rng: &mut Rng) -> Result<(), String> {
        let Some(net) = self.net else {
            return Ok(());
        };
        let fault = if rng.below(2) == 0 {
            Fault::BlackHole
        } else {
            Fault::Reset
        };
        let member = rng.below(VOTERS as u64) as usize;
        let others =
            |m: usize| -> Vec<Node> { (0..VOTERS).filter(|o| *o != m).map(Node::Member).collect() };
        let client = [Node::Client];
        let kind = rng.below(6);
        let (name, cut) = match kind {
            0 => (
                "client_both",
                net.cut_both(self.cluster, &client, &[Node::Member(member)], fault),
            ),
            1 => (
                "client_to_member",
                net.cut(self.cluster, &client, &[Node::Member(member)], fault),
            ),
            2 => (
                "member_to_client",
                net.cut(self.cluster, &[Node::Member(member)], &client, fault),
            ),
            3 | 4 => {
                let leader = self.cluster.leader().map_err(|e| e.to_string())?;
                let (name, m) = if kind == 3 {
                    ("leader_isolated", leader)
                } else {
                    ("follower_isolated", (leader + 1) % VOTERS)
                };
                (
                    name,
                    net.cut_both(self.cluster, &[Node::Member(m)], &others(m), fault),
                )
            }
            _ => {
                let other = (member + 1) % VOTERS;
                (
                    "bridge",
                    net.cut_both(
                        self.cluster,
                        &[Node::Member(member)],
                        &[Node::Member(other)],
                        fault,
                    ),
                )
            }
        };
        let cut = cut.map_err(|e| e.to_string())?;
        let label = match fault {
            Fault::BlackHole => "black_hole",
            Fault::Reset => "reset",
        };
        *self
            .counts
            .entry(format!("partition:{name}:{label}"))
            .or_default() += 1;
        std::thread::sleep(rng.millis(500, 4000));
        cut.heal().map_err(|e| e.to_string())
    }

    fn member_pause(&mut self, rng: &mut Rng) -> Result<(), String> {
        let member = rng.below(VOTERS as u64) as usize;
        self.cluster.pause(member).map_err(|e| e.to_string())?;
        std::thread::sleep(rng.millis(300, 2500));
        self.cluster.resume(member).map_err(|e| e.to_string())
    }

    /// The whole cluster frozen for longer than the request timeout.
    fn cluster_freeze(&mut self, rng: &mut Rng) -> Result<(), String> {
        for m in 0..VOTERS {
            self.cluster.pause(m).map_err(|e| e.to_string())?;
        }
        std::thread::sleep(REQUEST_TIMEOUT + rng.millis(200, 1500));
        for m in 0..VOTERS {
            self.cluster.resume(m).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// An explicit compaction at the current revision (as an operator or Kubernetes does),
    /// so that any watcher behind it must start again.
    fn compaction(&mut self) -> Result<(), String> {
        let revision = self
            .client
            .txn(Txn::new())
            .map_err(|e| e.to_string())?
            .revision;
        match self.client.compact(revision) {
            // The periodic compaction got there first.
            Err(e) if e.to_string().contains("compacted") => Ok(()),
            other => other.map_err(|e| e.to_string()),
        }
    }

    /// A member down while more entries than etcd keeps for catch-up are written, then
    /// restarted: the leader must send it a snapshot.
    fn snapshot_restart(&mut self, rng: &mut Rng) -> Result<(), String> {
        let member = rng.below(VOTERS as u64) as usize;
        let log_path = self.cluster.log_path(member).to_path_buf();
        let received_before = snapshot_receipts(&log_path);
        self.cluster.kill(member).map_err(|e| e.to_string())?;
        // A margin over the window: the leader compacts its log only at its next snapshot.
        let written = fill(&self.client, CATCH_UP_ENTRIES + 20 * SNAPSHOT_COUNT);
        self.cluster.restart(member).map_err(|e| e.to_string())?;
        let received = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            snapshot_receipts(&log_path) > received_before
        });
        self.snapshots_received += u64::from(received);
        if !received {
            // Not a failure of ours; counted (`snapshots_received` of the restarts).
            log(
                &self.log,
                format!("NOSNAP member {member} after {written} writes"),
            );
        }
        Ok(())
    }

    /// The raft leadership handed to another voter (`etcdctl move-leader`).
    fn leader_transfer(&mut self, rng: &mut Rng) -> Result<(), String> {
        let leader = self.cluster.leader().map_err(|e| e.to_string())?;
        let to = (leader + 1 + rng.below(VOTERS as u64 - 1) as usize) % VOTERS;
        self.cluster.move_leader(to).map_err(|e| e.to_string())
    }

    /// A learner added, sometimes promoted to a voter, then removed.
    fn learner(&mut self, rng: &mut Rng) -> Result<(), String> {
        let member = self.cluster.add_learner().map_err(|e| e.to_string())?;
        std::thread::sleep(rng.millis(200, 800));
        if rng.below(2) == 0 {
            // etcd refuses while the learner's log is behind the leader's.
            let until = Instant::now() + Duration::from_secs(10);
            let promoted = loop {
                match self.cluster.promote(member) {
                    Ok(()) => break Ok(()),
                    Err(_) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(300))
                    }
                    Err(e) => break Err(e.to_string()),
                }
            };
            match promoted {
                Ok(()) => {
                    *self.counts.entry("learner_promoted".into()).or_default() += 1;
                    std::thread::sleep(rng.millis(200, 800));
                }
                Err(e) => self.errors.push(format!("learner promote: {e}")),
            }
        }
        self.cluster
            .remove_member(member)
            .map_err(|e| e.to_string())
    }

    /// An operator deleting lock keys (`etcdctl del`): 1-3 keys, the holder's half the
    /// time, else any key of the line (often a waiter's).
    fn operator_delete(&mut self, rng: &mut Rng) -> Result<(), String> {
        for _ in 0..1 + rng.below(3) {
            let name = NAMES[rng.below(NAMES.len() as u64) as usize];
            let mut keys = self
                .client
                .get_prefix(format!("{name}/"))
                .map_err(|e| e.to_string())?;
            keys.sort_by_key(|kv| kv.create_revision);
            let pick = if rng.below(2) == 0 {
                0
            } else {
                rng.below(keys.len().max(1) as u64) as usize
            };
            if let Some(kv) = keys.get(pick) {
                // By key, as an operator does; read in the same transaction, so the log
                // says which key went (a hand-over keeps the key name on another lease).
                let before = monotonic_ns();
                let txn = Txn::new()
                    .and_then([TxnOp::get(kv.key.clone()), TxnOp::delete(kv.key.clone())]);
                let r = self.client.txn(txn).map_err(|e| e.to_string())?;
                let after = monotonic_ns();
                let gone = match r.responses.first() {
                    Some(TxnOpResponse::Get(kvs)) => kvs.first().cloned(),
                    _ => None,
                };
                if let Some(kv) = gone {
                    self.deletes += 1;
                    let (key, token, lease) = (kv.key_str(), kv.create_revision, kv.lease);
                    log(
                        &self.log,
                        format!("DEL {key} {token} {before} {after} {lease}"),
                    );
                }
            }
            std::thread::sleep(rng.millis(50, 300));
        }
        Ok(())
    }
}

/// Writes at least `entries` separate requests (raft entries) from 8 threads, within 30 s;
/// returns how many were written.
fn fill(client: &Client, entries: u64) -> u64 {
    let written = std::sync::atomic::AtomicU64::new(0);
    let until = Instant::now() + Duration::from_secs(30);
    std::thread::scope(|scope| {
        for t in 0..8 {
            let (client, written) = (client.clone(), &written);
            scope.spawn(move || {
                while written.load(std::sync::atomic::Ordering::Relaxed) < entries
                    && Instant::now() < until
                {
                    if client.put(format!("nemesis-fill/{t}"), "x").is_ok() {
                        written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let _ = client.delete_prefix("nemesis-fill/");
    written.into_inner()
}

/// How many snapshots a member's log says it received from the leader.
fn snapshot_receipts(log_path: &std::path::Path) -> usize {
    std::fs::read_to_string(log_path)
        .map(|text| text.matches("received and saved database snapshot").count())
        .unwrap_or(0)
}
