//! The simulated cluster against real etcd (issue 29): the same scripted requests
//! (`etcd_sync::testing::sim::transcript`) against a fresh real etcd and a fresh simulated
//! one must get the same answers, line by line. What the simulation is faithful to is this
//! script; a difference names the request.
#![cfg(feature = "simulation")]

mod common;

use etcd_sync::testing::EtcdCluster;
use etcd_sync::testing::sim::{PROGRESS_INTERVAL, SimCluster, transcript};

#[test]
fn the_simulated_cluster_answers_the_script_as_real_etcd_does() {
    // Both send timed progress notifications as often (the script waits for one).
    let etcd = EtcdCluster::builder(1)
        .watch_progress_notify_interval(PROGRESS_INTERVAL)
        .start()
        .expect("a real etcd");
    let real = transcript(&etcd.endpoint()).expect("the script runs against real etcd");
    let cluster = SimCluster::start(1).expect("a simulated cluster");
    cluster.set_progress_interval(Some(PROGRESS_INTERVAL));
    // etcd #18089 (a delete at exactly the compact revision lost to a watcher that starts
    // there) was fixed in 3.4.34 and 3.5.15.
    let v = etcd.version();
    let fixed = match (v.major, v.minor) {
        (3, 4) => v.patch >= 34,
        (3, 5) => v.patch >= 15,
        _ => true,
    };
    cluster.set_keeps_compacted_tombstones(fixed);
    let simulated =
        transcript(&cluster.endpoints()[0]).expect("the script runs against the simulation");
    let differences: Vec<String> = real
        .iter()
        .zip(&simulated)
        .filter(|(r, s)| r != s)
        .map(|(r, s)| format!("  etcd {}: {r}\n  sim:  {s}", etcd.version()))
        .collect();
    for line in &real {
        println!("{line}");
    }
    assert!(
        differences.is_empty() && real.len() == simulated.len(),
        "{} of {} lines differ ({} against {} lines):\n{}",
        differences.len(),
        real.len(),
        real.len(),
        simulated.len(),
        differences.join("\n")
    );
    // The script covers what it says: a catch-up, a compaction answer, refusals.
    let has = |text: &str| real.iter().any(|line| line.contains(text));
    assert!(has("compact") && has("refused OutOfRange") && has("catch-up"));
    assert!(
        has(
            "progress after a write outside p/: id 30 created false events so far 0 \
             rev is the last write's true"
        ),
        "a progress notification"
    );
}
