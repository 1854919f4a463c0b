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
    /// `grpc_server_msg_sent_total`: for `Watch`, the watch responses etcd sent.
    pub msg_sent: BTreeMap<String, f64>,
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
            msg_sent: diff(&self.msg_sent, &before.msg_sent),
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
        add(&mut self.msg_sent, &other.msg_sent);
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
            "grpc_server_msg_sent_total" => &mut c.msg_sent,
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

/// What one read of etcd's /metrics says about the work it did: request counters, the watch
/// events it delivered and the CPU time it used.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub counters: Counters,
    /// `etcd_debugging_mvcc_events_total`: events etcd sent to watchers, one per watcher an
    /// event reached (etcd 3.4.23 counts them in the v3rpc watch server's send loop).
    pub events: f64,
    /// `process_cpu_seconds_total` of the etcd process (user + system; 10 ms ticks).
    pub cpu_seconds: f64,
}

/// The work etcd did between two snapshots, per operation.
#[derive(Debug, Clone, Copy, Default)]
pub struct PerOp {
    pub txn: f64,
    pub range: f64,
    pub events: f64,
    pub watch_msgs_sent: f64,
    pub watch_streams: f64,
    pub cpu_us: f64,
}

impl Snapshot {
    /// The work from `before` to `self`, divided by `n` (at least 1).
    pub fn per_op_since(&self, before: &Snapshot, n: f64) -> PerOp {
        let c = self.counters.minus(&before.counters);
        let n = n.max(1.0);
        PerOp {
            txn: Counters::get(&c.handled, "Txn") / n,
            range: Counters::get(&c.handled, "Range") / n,
            events: (self.events - before.events) / n,
            watch_msgs_sent: Counters::get(&c.msg_sent, "Watch") / n,
            watch_streams: Counters::get(&c.started, "Watch") / n,
            cpu_us: (self.cpu_seconds - before.cpu_seconds) * 1e6 / n,
        }
    }
}

impl PerOp {
    /// `key=value` fields for a `RESULT` line, each key prefixed with `what_`.
    pub fn fields(&self, what: &str) -> String {
        format!(
            "events_per_{what}={:.2} watch_msgs_sent_per_{what}={:.2} range_per_{what}={:.3} \
             txn_per_{what}={:.2} watch_streams_per_{what}={:.3} etcd_cpu_us_per_{what}={:.0}",
            self.events,
            self.watch_msgs_sent,
            self.range,
            self.txn,
            self.watch_streams,
            self.cpu_us
        )
    }
}

/// One read of etcd's /metrics: its counters, delivered watch events and CPU seconds.
pub fn snapshot(endpoint: &str) -> Res<Snapshot> {
    // etcd can be slow to serve /metrics while it delivers a storm of events (the rwlock
    // row's release to 1,024 readers once timed out): a few attempts before giving up.
    let mut attempts = 5;
    let m = loop {
        match metrics::fetch(endpoint) {
            Ok(m) => break m,
            Err(e) if attempts > 1 => {
                attempts -= 1;
                eprintln!("compare: etcd's /metrics: {e}; again");
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            Err(e) => return Err(e.into()),
        }
    };
    Ok(Snapshot {
        counters: parse_counters(&m),
        events: m
            .get("etcd_debugging_mvcc_events_total", &[])
            .ok_or("etcd's /metrics has no etcd_debugging_mvcc_events_total")?,
        cpu_seconds: m
            .get("process_cpu_seconds_total", &[])
            .ok_or("etcd's /metrics has no process_cpu_seconds_total")?,
    })
}

/// etcd's gauge of unsynced ("slow") watchers, if /metrics has it.
pub fn unsynced_watchers(endpoint: &str) -> Res<Option<f64>> {
    Ok(metrics::fetch(endpoint)?.get("etcd_debugging_mvcc_slow_watcher_total", &[]))
}

/// etcd's gauge of watchers (all streams, all clients), if /metrics has it.
pub fn watchers(endpoint: &str) -> Res<Option<f64>> {
    Ok(metrics::fetch(endpoint)?.get("etcd_debugging_mvcc_watcher_total", &[]))
}
