//! Metrics with a Prometheus exporter: install the recorder, use locks and an election
//! against a throwaway etcd, then print what a scrape of `/metrics` would return.
//!
//! `cargo run --features metrics,testing --example metrics [ENDPOINT...]`
//!
//! A real service would serve `handle.render()` on its HTTP endpoint (or use the exporter's
//! own `http-listener` feature) and call `handle.run_upkeep()` now and then.

use std::time::Duration;

use etcd_sync::{Client, metric_names};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

mod common;

fn main() {
    if let Err(e) = run() {
        eprintln!("metrics example failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    // Before any lock is taken: metrics emitted without a recorder are dropped.
    // Buckets make the time metrics Prometheus histograms (the exporter's default is a summary).
    let seconds = [0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(metric_names::WAIT_SECONDS.into()), &seconds)?
        .set_buckets_for_metric(Matcher::Full(metric_names::HOLD_SECONDS.into()), &seconds)?
        .install_recorder()?;

    let etcd = common::etcd_from_args()?;
    let client = Client::connect(&etcd.endpoints)?;
    let session = client
        .session_builder()
        .ttl(Duration::from_secs(3))
        .start()?;

    // A lock held for a moment, then a contended one: a second session waits for the first.
    let mutex = session.mutex("example/migrations")?;
    let guard = mutex.lock()?;
    std::thread::sleep(Duration::from_millis(50));
    drop(guard);

    let other = client.session()?;
    let held = session.mutex("example/reports")?.lock()?;
    let waiter = std::thread::spawn({
        let mutex = other.mutex("example/reports")?;
        move || mutex.lock().map(drop)
    });
    std::thread::sleep(Duration::from_millis(200));
    drop(held);
    waiter.join().map_err(|_| "waiter panicked")??;

    // An election won and resigned.
    let mut leadership = session.election("example/scheduler")?.campaign("host-a")?;
    leadership.resign()?;

    // A few keep-alives (every TTL/3), so the margin gauge has a value.
    std::thread::sleep(Duration::from_millis(1500));

    handle.run_upkeep();
    println!("{}", handle.render());
    Ok(())
}
