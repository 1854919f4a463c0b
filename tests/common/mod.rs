//! Shared helpers for the integration tests: every test starts its own real etcd.
#![allow(dead_code)]

use std::time::Duration;

use etcd_sync::testing::{EtcdCluster, EtcdServer};
use etcd_sync::{Client, Session};

/// A fresh single-member etcd on free loopback ports; killed when dropped.
pub fn etcd() -> EtcdServer {
    match EtcdServer::start() {
        Ok(server) => server,
        Err(e) => panic!("cannot start etcd for the test: {e}"),
    }
}

/// A fresh 3-member cluster.
pub fn cluster() -> EtcdCluster {
    match EtcdCluster::start(3) {
        Ok(cluster) => cluster,
        Err(e) => panic!("cannot start an etcd cluster for the test: {e}"),
    }
}

pub fn client(endpoints: &[String]) -> Client {
    Client::builder()
        .endpoints(endpoints)
        .request_timeout(Duration::from_secs(3))
        .connect()
        .expect("connect to the test etcd")
}

pub fn session(client: &Client, ttl_secs: u64) -> Session {
    client
        .session_builder()
        .ttl(Duration::from_secs(ttl_secs))
        .start()
        .expect("start a session")
}

/// Keys currently under `prefix`, as strings.
pub fn keys(client: &Client, prefix: &str) -> Vec<String> {
    client
        .get_prefix(prefix)
        .expect("list keys")
        .into_iter()
        .map(|kv| kv.key_str().into_owned())
        .collect()
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// The sum of etcd's `grpc_server_handled_total` for one gRPC method (e.g. "Txn").
pub fn handled(metrics: &str, method: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{"))
        .filter(|l| l.contains(&format!("grpc_method=\"{method}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}
