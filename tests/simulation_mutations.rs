//! The simulation's teeth (issue 29): each defect this project fixed, re-introduced on its
//! own (`Mutation`), must make a seeded schedule break an invariant within 1,500 schedules
//! (about a minute on 2 cores; a count, not a time, so that a busy machine finds the same).
//! A test binary of its own: a mutation is switched on process-wide.
#![cfg(feature = "simulation")]

use std::time::Instant;

use etcd_sync::testing::sim::{Mutation, RunConfig, run};

#[test]
#[ignore = "up to a minute per defect: scripts/test runs it optimized, with --include-ignored"]
fn the_simulation_finds_every_reintroduced_defect() {
    let budget: u64 = std::env::var("ETCD_SYNC_SIM_MUTATION_SCHEDULES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_500);
    // Fixed seeds: the table is the same on every machine and every run.
    let base = 1_000;
    let mut table = Vec::new();
    let mut missed = Vec::new();
    // ETCD_SYNC_SIM_MUTATION=<name>: that one only.
    let only = std::env::var("ETCD_SYNC_SIM_MUTATION").ok();
    for mutation in Mutation::ALL {
        if only
            .as_ref()
            .is_some_and(|name| *name != format!("{mutation:?}"))
        {
            continue;
        }
        let started = Instant::now();
        let mut seed = base;
        let mut found = None;
        while seed - base < budget {
            // A defect of downgrades shows only in the runs that downgrade; one of
            // hand-overs, in the runs with the fault aimed at them.
            let handing = mutation == Mutation::RetryRefusesOwnRequest;
            let schedule = RunConfig {
                downgrades: mutation == Mutation::DowngradeTakesAnyGoneWriter
                    || RunConfig::from_seed(seed).downgrades,
                handovers: handing || RunConfig::from_seed(seed).handovers,
                handover_faults: handing,
                ..RunConfig::from_seed(seed)
            };
            let config = RunConfig {
                mutation: Some(mutation),
                ..schedule.clone()
            };
            let outcome = run(&config).expect("a run");
            if let Some(first) = outcome.violations.first() {
                // The control: the same schedule without the defect breaks nothing, so the
                // defect is what broke it.
                let control = run(&schedule).expect("a run");
                assert!(
                    control.violations.is_empty(),
                    "seed {seed} breaks an invariant without {mutation:?} too: {:?}",
                    control.violations
                );
                found = Some((seed, started.elapsed(), seed - base + 1, first.clone()));
                break;
            }
            seed += 1;
        }
        match found {
            Some((seed, took, schedules, violation)) => table.push(format!(
                "| {mutation:?} | {:.2} s | {schedules} | {seed} | {} |",
                took.as_secs_f64(),
                violation.trim()
            )),
            None => missed.push(mutation),
        }
    }
    println!("| defect | found after | schedules | seed | first violation |");
    println!("|---|---|---|---|---|");
    for row in &table {
        println!("{row}");
    }
    assert!(
        missed.is_empty(),
        "not found within {budget} schedules: {missed:?}"
    );
}
