//! etcd's /metrics over plain HTTP: a minimal HTTP/1.0 GET and the few Prometheus text
//! series this driver reads (gRPC request counters, the unsynced-watcher gauge).
//!
//! Kept in this one file on purpose: it is to be replaced by a shared /metrics parser.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

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

/// The value of label `name` in a Prometheus label set `{a="x",b="y"}`.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let pat = format!("{name}=\"");
    let start = labels.find(&pat)? + pat.len();
    let end = labels[start..].find('"')?;
    Some(&labels[start..start + end])
}

fn parse_counters(text: &str) -> Counters {
    let mut c = Counters::default();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        let Some(method) = label(labels, "grpc_method") else {
            continue;
        };
        let map = match name {
            "grpc_server_handled_total" => {
                if label(labels, "grpc_type") == Some("unary") {
                    c.handled_unary_total += value;
                }
                &mut c.handled
            }
            "grpc_server_started_total" => &mut c.started,
            "grpc_server_msg_received_total" => &mut c.msg_received,
            _ => continue,
        };
        *map.entry(method.to_string()).or_default() += value;
    }
    c
}

/// `GET path` on the first endpoint (etcd serves /metrics on its client URL), bounded.
fn http_get(endpoint: &str, path: &str) -> Res<String> {
    let authority = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let addr = authority
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| format!("cannot resolve {authority}"))?;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {authority}\r\nAccept: text/plain\r\n\r\n"
    )?;
    let mut body = Vec::new();
    stream.read_to_end(&mut body)?;
    let text = String::from_utf8_lossy(&body).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("malformed HTTP response")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!("GET {path}: {}", head.lines().next().unwrap_or_default()).into());
    }
    Ok(body.to_string())
}

/// etcd's gRPC request counters as of now.
pub fn counters(endpoint: &str) -> Res<Counters> {
    Ok(parse_counters(&http_get(endpoint, "/metrics")?))
}

/// etcd's gauge of unsynced ("slow") watchers, if /metrics has it.
pub fn unsynced_watchers(endpoint: &str) -> Res<Option<f64>> {
    let text = http_get(endpoint, "/metrics")?;
    Ok(text
        .lines()
        .find(|l| l.starts_with("etcd_debugging_mvcc_slow_watcher_total "))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.trim().parse::<f64>().ok()))
}
