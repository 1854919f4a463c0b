//! The few series of etcd's /metrics this driver reads (gRPC request counters, the
//! unsynced-watcher gauge), through the crate's one /metrics reader and parser
//! (`etcd_sync::testing::metrics`).

use std::collections::BTreeMap;

use etcd_sync::testing::metrics::{self, Metrics};

use crate::Res;

/// Counters of etcd's gRPC server, by method.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub handled: BTreeMap<String, f64>,
    pub handled_unary_total: f64,
    pub started: BTreeMap<String, f64>,
    pub msg_received: BTreeMap<String, f64>,
}

impl Counters {
    pub fn minus(&self, before: &Counters) -> Counters {
        fn diff(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
            a.iter()
                .map(|(k, v)| (k.clone(), v - b.get(k).copied().unwrap_or(0.0)))
                .collect()
        }
        Counters {
            handled: diff(&self.handled, &before.handled),
            handled_unary_total: self.handled_unary_total - before.handled_unary_total,
            started: diff(&self.started, &before.started),
            msg_received: diff(&self.msg_received, &before.msg_received),
        }
    }

    pub fn add(&mut self, other: &Counters) {
        fn add(a: &mut BTreeMap<String, f64>, b: &BTreeMap<String, f64>) {
            for (k, v) in b {
                *a.entry(k.clone()).or_default() += v;
            }
        }
        add(&mut self.handled, &other.handled);
        add(&mut self.started, &other.started);
        add(&mut self.msg_received, &other.msg_received);
        self.handled_unary_total += other.handled_unary_total;
    }

    pub fn get(map: &BTreeMap<String, f64>, k: &str) -> f64 {
        map.get(k).copied().unwrap_or(0.0)
    }

    /// `txn=.. range=.. ...` per operation (counters divided by `n`).
    pub fn per_op(&self, n: usize) -> String {
        let n = n.max(1) as f64;
        let h = |m| Counters::get(&self.handled, m) / n;
        format!(
            "txn={:.2} range={:.2} delete_range={:.2} put={:.2} unary_total={:.2} \
             watch_streams={:.2} watch_msgs={:.2}",
            h("Txn"),
            h("Range"),
            h("DeleteRange"),
            h("Put"),
            self.handled_unary_total / n,
            Counters::get(&self.started, "Watch") / n,
            Counters::get(&self.msg_received, "Watch") / n,
        )
    }
}

/// Adds up the gRPC server counters this driver reads, by method.
fn parse_counters(metrics: &Metrics) -> Counters {
    let mut c = Counters::default();
    for sample in metrics.samples() {
        let Some(method) = sample.label("grpc_method") else {
            continue;
        };
        let map = match sample.name.as_str() {
            "grpc_server_handled_total" => {
                if sample.label("grpc_type") == Some("unary") {
                    c.handled_unary_total += sample.value;
                }
                &mut c.handled
            }
            "grpc_server_started_total" => &mut c.started,
            "grpc_server_msg_received_total" => &mut c.msg_received,
            _ => continue,
        };
        *map.entry(method.to_string()).or_default() += sample.value;
    }
    c
}

/// etcd's gRPC request counters as of now.
pub fn counters(endpoint: &str) -> Res<Counters> {
    Ok(parse_counters(&metrics::fetch(endpoint)?))
}

/// etcd's gauge of unsynced ("slow") watchers, if /metrics has it.
pub fn unsynced_watchers(endpoint: &str) -> Res<Option<f64>> {
    Ok(metrics::fetch(endpoint)?.get("etcd_debugging_mvcc_slow_watcher_total", &[]))
}

/// etcd's gauge of watchers (all streams, all clients), if /metrics has it.
pub fn watchers(endpoint: &str) -> Res<Option<f64>> {
    Ok(metrics::fetch(endpoint)?.get("etcd_debugging_mvcc_watcher_total", &[]))
}
