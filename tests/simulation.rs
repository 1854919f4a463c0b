//! Deterministic simulation (issue 29): the crate's blocking API in simulated processes
//! against a simulated cluster, virtual time, faults and schedule drawn from one seed.
#![cfg(feature = "simulation")]

use std::time::{Duration, Instant};

use etcd_sync::testing::sim::{RunConfig, run};

#[test]
fn one_seed_replays_the_same_trace() {
    let config = RunConfig {
        seed: 5,
        ..Default::default()
    };
    let started = Instant::now();
    let a = run(&config).expect("a run");
    let took = started.elapsed();
    let b = run(&config).expect("a run");
    for line in a.trace.iter().take(80) {
        println!("{line}");
    }
    println!(
        "{} lines, {} acquisitions, faults {:?}, virtual {:?}, real {took:?}",
        a.trace.len(),
        a.acquisitions,
        a.faults,
        a.virtual_time
    );
    if a.trace_hash != b.trace_hash {
        let first = a.trace.iter().zip(&b.trace).position(|(x, y)| x != y);
        panic!(
            "seed 5 gave two traces; first difference at line {first:?}: {:?} / {:?}",
            first.and_then(|i| a.trace.get(i)),
            first.and_then(|i| b.trace.get(i))
        );
    }
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    assert!(a.acquisitions > 0);
    let _ = Duration::ZERO;
}
