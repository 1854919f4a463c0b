//! The back of the line under the deterministic simulation (issue 28). The simulation's
//! lines are short (2 to 5 processes), so with the default widths every waiter waits at the
//! front. This binary narrows the front to one key and has every lookout's start gap read
//! when due rather than polled (`RunConfig::line_tuning`, which its processes pass to their
//! clients' builders): its waiters wait at the back on lookout keys, join the front, and
//! hold, under every fault of the simulation. A binary of its own: the mutation below is
//! switched on process-wide.
#![cfg(feature = "simulation")]

mod common;

use std::time::{Duration, Instant};

use etcd_sync::testing::LineTuning;
use etcd_sync::testing::sim::{Mutation, RunConfig, run};

/// The run of `seed` with the front narrowed to one key, and every lookout's start gap read
/// when due rather than polled; in the odd seeds every lookout is far (`far_start` 1): its
/// watcher starts right after the waiter's read, with no read, as behind 200 keys.
fn narrow(seed: u64) -> RunConfig {
    RunConfig {
        line_tuning: LineTuning {
            front: Some(1),
            poll_near: Some(0),
            far_start: (seed % 2 == 1).then_some(1),
        },
        ..RunConfig::from_seed(seed)
    }
}

fn secs(var: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default),
    )
}

/// A sweep of `ETCD_SYNC_SIM_BACK_SECS` (default 20) breaks no invariant while waiters wait at
/// the back and read their lookouts' gaps; then the defect of never reading that gap
/// (`Mutation::LookoutGapUnread`) must break one within `ETCD_SYNC_SIM_MUTATION_SECS`
/// (default 60), and the same schedule without it must not. `ETCD_SYNC_SIM_SEED` replays
/// one seed instead (with `ETCD_SYNC_SIM_MUTATION=LookoutGapUnread`, with the defect).
#[test]
#[ignore = "a minute or two of schedules: scripts/test runs it optimized, with --include-ignored"]
fn waiters_at_the_back_break_no_invariant_and_an_unread_lookout_gap_is_found() {
    if let Ok(seed) = std::env::var("ETCD_SYNC_SIM_SEED") {
        let seed: u64 = seed.parse().expect("ETCD_SYNC_SIM_SEED is a number");
        if std::env::var_os("ETCD_SYNC_SIM_LOG").is_some() {
            // The crate's own debug log, in the order things happened (its times are real).
            let _ = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_test_writer()
                .try_init();
        }
        let mutation = std::env::var("ETCD_SYNC_SIM_MUTATION")
            .is_ok_and(|name| name == "LookoutGapUnread")
            .then_some(Mutation::LookoutGapUnread);
        let outcome = run(&RunConfig {
            mutation,
            ..narrow(seed)
        })
        .expect("a run");
        for line in &outcome.trace {
            println!("{line}");
        }
        assert!(
            outcome.violations.is_empty(),
            "seed {seed}: {:?}",
            outcome.violations
        );
        return;
    }

    let budget = secs("ETCD_SYNC_SIM_BACK_SECS", 20);
    let base = common::sweep_base();
    println!("sweeping from seed {base} for {budget:?} (replay one: ETCD_SYNC_SIM_SEED=<seed>)");
    let started = Instant::now();
    let (mut schedules, mut acquisitions, mut back_waits, mut gap_reads) = (0u64, 0, 0, 0);
    let mut failed = Vec::new();
    while started.elapsed() < budget {
        let seed = base + schedules;
        let outcome = run(&narrow(seed)).expect("a run");
        schedules += 1;
        acquisitions += outcome.acquisitions;
        back_waits += outcome.back_waits;
        gap_reads += outcome.gap_reads;
        if !outcome.violations.is_empty() {
            failed.push((seed, outcome.violations));
        }
    }
    println!(
        "{schedules} schedules, {acquisitions} acquisitions, {back_waits} waits at the back, \
         {gap_reads} lookout gaps read when due"
    );
    assert!(
        failed.is_empty(),
        "seeds with violations (replay: ETCD_SYNC_SIM_SEED=<seed>): {failed:#?}"
    );
    assert!(
        back_waits > schedules,
        "waiters waited at the back: {back_waits}"
    );
    assert!(gap_reads > 0, "some lookout gaps were read when due");

    // Fixed seeds: the same on every machine and every run.
    let budget = secs("ETCD_SYNC_SIM_MUTATION_SECS", 60);
    let started = Instant::now();
    let mut seed = 1_000;
    let found = loop {
        assert!(
            started.elapsed() < budget,
            "LookoutGapUnread not found within {budget:?} ({} schedules)",
            seed - 1_000
        );
        let outcome = run(&RunConfig {
            mutation: Some(Mutation::LookoutGapUnread),
            ..narrow(seed)
        })
        .expect("a run");
        if let Some(first) = outcome.violations.first() {
            let control = run(&narrow(seed)).expect("a run");
            assert!(
                control.violations.is_empty(),
                "seed {seed} breaks an invariant without LookoutGapUnread too: {:?}",
                control.violations
            );
            break (seed, first.clone());
        }
        seed += 1;
    };
    println!(
        "| LookoutGapUnread | {:.2} s | {} | {} | {} |",
        started.elapsed().as_secs_f64(),
        found.0 - 999,
        found.0,
        found.1.trim()
    );
}

/// Seeds that found defects with the front narrowed, replayed (each failed before its fix).
/// 1795584862204072 (CI, stop 41): a restarted process's reader key of its earlier life sat
/// further ahead than a write's enqueue reads with a long line (`FRONT` keys ahead), so the
/// write waited at the back behind its own leftover until its limit, and everyone behind
/// the leftover too. The enqueue now reads every key of its lease under the name.
/// 139759192639929 (CI, stop 61): a leader's proclamation timed out, the read after it still
/// showed the old value, and the first attempt reached etcd late (the "late writes"
/// nemesis), after that read: the second put on the old base was refused and the leader
/// was told `NotLeader` while its key was still there. A key still ours now makes the
/// proclamation go again on the newer base.
#[test]
fn seeds_that_found_defects_at_the_back_stay_clean() {
    let seeds: &[u64] = &[1_795_584_862_204_072, 139_759_192_639_929];
    for &seed in seeds {
        let outcome = run(&narrow(seed)).expect("a run");
        assert!(
            outcome.violations.is_empty(),
            "seed {seed}: {:?}",
            outcome.violations
        );
        assert!(outcome.acquisitions > 0, "seed {seed} acquired nothing");
    }
}
