//! Clock rates (issue 52, item 4): the loss deadline assumes the client's clock does not run
//! slower than etcd's beyond its margin (10 % of the TTL: a session reports its loss at
//! `TTL - 10 %` after a renewal was sent, measured on its own clock). Every simulated run
//! gives each process a lease clock 0.9 to 1.1 times as fast as its own
//! (`RunConfig::clock_rates`), and a guard still held when etcd expires its lease is a
//! violation. This test shows that check has teeth: with etcd's clock 1.25 times as fast,
//! beyond the margin, some schedule breaks it. (At 1.12 none of 600 schedules did: etcd's
//! lessor expires leases only every 500 ms, which the library does not count on.)
#![cfg(feature = "simulation")]

use etcd_sync::testing::sim::{RunConfig, run};

/// The rate past the margin the test runs at: a 3 s TTL then lasts 2.4 s of the
/// process's time, before its loss deadline at 2.7 s (etcd's lessor checks every 500 ms,
/// so some expiries still come after it).
const BEYOND: f64 = 1.25;

/// How many schedules may pass before the breach is found.
const BUDGET: u64 = 600;

#[test]
#[ignore = "up to a minute of schedules: scripts/test runs it optimized, with --include-ignored"]
fn a_lease_clock_beyond_the_margin_is_caught() {
    let base = 7_000;
    for seed in base..base + BUDGET {
        let config = RunConfig {
            clock_rates: (BEYOND, BEYOND),
            ..RunConfig::from_seed(seed)
        };
        let outcome = run(&config).expect("a run");
        if let Some(breach) = outcome
            .violations
            .iter()
            .find(|v| v.contains("after etcd expired its lease"))
        {
            println!(
                "etcd's clock {BEYOND}x: seed {seed}, after {} schedules: {breach}",
                seed - base + 1
            );
            // The control: the same schedule with clocks within the margin breaks nothing.
            let control = run(&RunConfig::from_seed(seed)).expect("a run");
            assert!(
                control.violations.is_empty(),
                "seed {seed} breaks an invariant within the margin too: {:?}",
                control.violations
            );
            return;
        }
    }
    panic!("no schedule of {BUDGET} held a guard past its lease's expiry at {BEYOND}x");
}
