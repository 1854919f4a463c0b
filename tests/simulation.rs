//! Deterministic simulation (issue 29): the crate's blocking API in simulated processes
//! against a simulated cluster, virtual time, faults and schedule drawn from one seed.
#![cfg(feature = "simulation")]

mod common;
mod fenced;
mod sim_handover;

use std::time::{Duration, Instant};

use etcd_sync::testing::sim::{RunConfig, run};

#[test]
fn one_seed_replays_the_same_trace() {
    // tokio's `select!` picks among ready branches at random unless the runtime's RNG is
    // seeded, which needs tokio built with `--cfg tokio_unstable` (.cargo/config.toml; a
    // RUSTFLAGS variable replaces it). Without it about a fifth of seeds do not replay.
    #[cfg(not(tokio_unstable))]
    panic!("built without --cfg tokio_unstable (is RUSTFLAGS set?): a seed cannot replay");
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
        "{} lines, hash {:x}, {} acquisitions, faults {:?}, virtual {:?}, real {took:?}",
        a.trace.len(),
        a.trace_hash,
        a.acquisitions,
        a.faults,
        a.virtual_time
    );
    if a.trace_hash != b.trace_hash {
        let first = a.trace.iter().zip(&b.trace).position(|(x, y)| x != y);
        // Both traces around the difference, and which of them a third run gives.
        let around = |trace: &[String]| {
            let at = first.unwrap_or(trace.len());
            trace[at.saturating_sub(5)..(at + 5).min(trace.len())].join("\n")
        };
        let c = run(&config).expect("a run");
        panic!(
            "seed 5 gave two traces; first difference at line {first:?}\n-- first run:\n{}\n\
             -- second run:\n{}\n-- a third run is like the first: {}, like the second: {}",
            around(&a.trace),
            around(&b.trace),
            c.trace_hash == a.trace_hash,
            c.trace_hash == b.trace_hash
        );
    }
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    assert!(a.acquisitions > 0);
    assert_eq!(a.history, b.history, "one seed, one history");
    let verdict = fenced::sim::check(&a);
    assert!(
        verdict.failures.is_empty() && verdict.undecided.is_empty(),
        "{verdict:?}"
    );
}

/// The crate's own debug log, in the order things happened (its times are real).
fn sim_log() {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_test_writer()
        .try_init();
}

/// Seeds to sweep: `ETCD_SYNC_SIM_SEED` replays one (with its full trace printed);
/// otherwise from [`common::sweep_base`] (printed), `ETCD_SYNC_SIM_SECS` of them (default 20).
#[test]
#[ignore = "a minute of schedules: scripts/test runs it optimized, with --include-ignored"]
fn seeded_schedules_under_faults_break_no_invariant() {
    if let Ok(seed) = std::env::var("ETCD_SYNC_SIM_SEED") {
        let seed: u64 = seed.parse().expect("ETCD_SYNC_SIM_SEED is a number");
        if std::env::var_os("ETCD_SYNC_SIM_LOG").is_some() {
            sim_log();
        }
        // A mutation's seed replays with it: ETCD_SYNC_SIM_MUTATION=<its name>.
        let mutation = std::env::var("ETCD_SYNC_SIM_MUTATION").ok().map(|name| {
            *etcd_sync::testing::sim::Mutation::ALL
                .iter()
                .find(|m| format!("{m:?}") == name)
                .expect("ETCD_SYNC_SIM_MUTATION names a Mutation")
        });
        // A seed of `leaders_that_hand_over_break_no_invariant`: ETCD_SYNC_SIM_HANDOVERS=1;
        // of `hand_overs_whose_writes_go_unanswered_fail_only_with_cause`:
        // ETCD_SYNC_SIM_HANDOVER_FAULTS=1.
        let handover_faults = std::env::var_os("ETCD_SYNC_SIM_HANDOVER_FAULTS").is_some();
        let handovers = handover_faults || std::env::var_os("ETCD_SYNC_SIM_HANDOVERS").is_some();
        let config = RunConfig::from_seed(seed);
        let outcome = run(&RunConfig {
            mutation,
            handovers: handovers || config.handovers,
            handover_faults,
            ..config
        })
        .expect("a run");
        for line in &outcome.trace {
            println!("{line}");
        }
        let verdict = fenced::sim::check(&outcome);
        println!("{}", verdict.summary());
        assert!(
            outcome.violations.is_empty(),
            "seed {seed}: {:?}",
            outcome.violations
        );
        assert!(
            verdict.failures.is_empty() && verdict.undecided.is_empty(),
            "seed {seed}: {verdict:?}"
        );
        return;
    }
    let secs: u64 = std::env::var("ETCD_SYNC_SIM_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let base = common::sweep_base();
    println!("sweeping from seed {base} for {secs} s (replay one: ETCD_SYNC_SIM_SEED=<seed>)");
    let started = Instant::now();
    let (mut schedules, mut virtual_time, mut acquisitions) = (0u64, Duration::ZERO, 0u64);
    let mut compacted_watchers = 0;
    let mut progress_notifications = 0;
    let (mut requests_asked, mut requests_heard) = (0, 0);
    let (mut multi_locks, mut multi_locks_in_one_txn) = (0, 0);
    let mut handovers = 0;
    let mut failed = Vec::new();
    // The outside judge (issue 52): every schedule's history, linearizable against a
    // fenced lock (`tests/fenced/`).
    let mut linearizability = fenced::Verdict::default();
    let mut faults = std::collections::BTreeMap::new();
    while started.elapsed() < Duration::from_secs(secs) {
        let seed = base + schedules;
        let outcome = run(&RunConfig::from_seed(seed)).expect("a run");
        schedules += 1;
        virtual_time += outcome.virtual_time;
        acquisitions += outcome.acquisitions;
        compacted_watchers += outcome.compacted_watchers;
        progress_notifications += outcome.progress_notifications;
        requests_asked += outcome.requests_asked;
        requests_heard += outcome.requests_heard;
        multi_locks += outcome.multi_locks;
        multi_locks_in_one_txn += outcome.multi_locks_in_one_txn;
        handovers += outcome.handovers;
        for (kind, n) in &outcome.faults {
            *faults.entry(*kind).or_insert(0u64) += n;
        }
        let mut verdict = fenced::sim::check(&outcome);
        if verdict.failures.is_empty() && !verdict.undecided.is_empty() {
            println!("seed {seed}: undecided, checked again longer: {verdict:?}");
            verdict = fenced::sim::check_longer(&outcome);
        }
        if !verdict.failures.is_empty() || !verdict.undecided.is_empty() {
            failed.push((seed, vec![format!("{verdict:?}")]));
        }
        linearizability.add(verdict);
        if !outcome.violations.is_empty() {
            failed.push((seed, outcome.violations));
        }
    }
    let per_minute = schedules as f64 * 60.0 / started.elapsed().as_secs_f64();
    println!(
        "{schedules} schedules ({per_minute:.0} per minute), {acquisitions} acquisitions, \
         {:.1} s of virtual time per schedule, {compacted_watchers} watchers resumed from \
         compacted history, {progress_notifications} progress notifications, \
         {requests_asked} holders asked to let go ({requests_heard} requests heard), \
         {multi_locks} multi-locks held ({multi_locks_in_one_txn} joined in one Txn), \
         {handovers} leaderships handed over, faults {faults:?}",
        virtual_time.as_secs_f64() / schedules.max(1) as f64
    );
    println!(
        "{} (of {:.1} s of the sweep)",
        linearizability.summary(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "seeds with violations (replay: ETCD_SYNC_SIM_SEED=<seed>): {failed:#?}"
    );
    assert!(acquisitions > schedules, "the schedules did acquire");
    assert!(faults.len() >= 9, "every kind of fault ran: {faults:?}");
    assert!(compacted_watchers > 0, "some watchers met compaction");
    assert!(
        progress_notifications > 0,
        "some watchers got progress notifications"
    );
    assert!(
        requests_heard > 0,
        "some holders were asked to let go, and heard it"
    );
    assert!(
        multi_locks_in_one_txn > 0 && multi_locks > multi_locks_in_one_txn,
        "multi-locks joined both ways: {multi_locks} held, {multi_locks_in_one_txn} in one Txn"
    );
}

/// Seeds that found defects, pinned (each failed before its fix):
/// - 1795498751495566: a cleanup after an ambiguous enqueue deleted "our lease's key", and
///   a copy applied late deleted the session's next key (a wait lost its key to nobody);
///   fixed in `removal::remove_if_leased`.
/// - 1795498917515773, 1795499020361835, 1795499020361239: the follow task gave up on a gap
///   whose read failed (no leader, a learner), so a deletion in it went unseen and the
///   guard said "held" until its release; fixed in `client/follow.rs` (`Entry::unread`).
/// - 1795502016563042: the sweep of a late-applied join let go of the line's turn when its
///   removal was not answered; a re-campaign adopted the key, and the removal applied late
///   under it; fixed in `client/follow.rs` (`spawn_sweep` holds the turn until answered).
/// - 1795510111326349, 1795510111327266: a process that restarted and resumed its lease
///   found a writer key of its earlier life under the name and waited behind it with its
///   read (and everyone behind with it) for as long as the session lived; fixed in
///   `ownership/leftover.rs` (and pinned against real etcd in `tests/rwlock.rs`).
/// - 1795512401326470, 1795512401326469: a watcher resumed right after the last revision
///   it saw; a server with etcd #18089 (Debian's 3.4.23) loses the deletes at exactly its
///   compact revision from a watcher that starts there, so a waiter never saw its own key
///   and the key ahead go, and took a later delete of a re-created key for its turn (rule
///   4). Fixed in `transport/watches/watcher.rs` (resume one revision early; pinned against
///   real etcd in `tests/compaction.rs`).
/// - 1748, 1795514135847217: the watch stream's reconnect backoff grew with every break of
///   the run and never shrank after a healthy stream, so one blip after old failures left
///   every watcher blind for a second (rule 2). Fixed in `transport/watches/hub.rs`
///   (`HEALTHY`; the second seed, with a leader loop, needed it at 100 ms, not 1 s).
/// - 1795513100111575: a lock-delay that ended while the watcher's stream was down
///   returned a guard whose key had just been deleted (rule 4). Fixed in
///   `ownership/proof.rs` (one read when the step ends).
/// - 1795794799848384 (a CI run): a waiter with a lock-delay judged a lease ahead at its
///   own turn, 650 ms after that lease's key was released and after the lease had ended,
///   and waited the whole delay (rule 5). Fixed in `ownership/delay.rs` (judge each key
///   ahead at the instant it went, `line/crossing.rs` `Departures`); pinned against real
///   etcd in `tests/lock_delay.rs`. 1795795367634572 (with deadlock detection, below):
///   the same, where no reading proved the lease alive when its key went (under a second
///   left); fixed by a lookup as each key ahead goes, and by counting a lease etcd still
///   has (TTL 0) as not ended.
/// - 1795786719240592 (with leaders proclaiming): a guard's watcher created from now on a
///   member without etcd #18089's fix was registered unsynced; the operator's delete of
///   the key and a compaction both at its first revision, before etcd's sync loop, left
///   the delete out of what it sent, and the guard said "held" past the 1 s bound (rule
///   2). Fixed in `transport/watches/hub.rs` (`settle_unsynced`: once such a watcher is
///   synced, its subscribers that knew no further than its start read again).
/// - 153440704745228 (a defect of the run, not of the library): a leader proclaimed before
///   its campaign's guard was judged; the answers were lost, its lease ended and took the
///   key, and the late judgement said the campaign returned a guard without its key
///   (rule 4). The guard had its key when it returned (the proclamation's Txn, which
///   compares our create revision, applied) and reported the loss within the bound. Fixed
///   in `testing/sim/run/holding.rs` (`hold_and`: judged first, then proclaimed).
/// - 103143790174062 (found by the superset sweep of session 34's final commit): a late
///   copy of an earlier enqueue put our key; the next enqueue found it, and its removal
///   (a fresh create revision for every acquisition) met a leader election: "no leader"
///   ended a blocking wait with 9 s left (the patience rule). Fixed in
///   `ownership/leftover.rs` (`remove_found`: a blocking wait retries that removal, as it
///   retries the enqueue) and `acquire.rs` (a re-campaign's put, on refusals only).
///
/// A seed names a schedule of the workload as it was when the seed was found: the first
/// five were found before the workload restarted processes and cancelled waits, and now
/// replay other schedules (kept as regression runs; the defects they found have
/// mutations or real-etcd tests of their own).
#[test]
fn seeds_that_found_defects_stay_clean() {
    for seed in [
        1_795_498_751_495_566,
        1_795_498_917_515_773,
        1_795_499_020_361_835,
        1_795_499_020_361_239,
        1_795_502_016_563_042,
        1_795_510_111_326_349,
        1_795_510_111_327_266,
        1_795_512_401_326_470,
        1_795_512_401_326_469,
        1_748,
        1_795_513_100_111_575,
        1_795_514_135_847_217,
        1_795_794_799_848_384,
        1_795_786_719_240_592,
        // The judge's own defect: a leader's proclamation ran before its campaign was
        // judged, so a key its lease took with it after the campaign returned (lost
        // answers, the session ending) was blamed on the wait (rule 4).
        153_440_704_745_228,
        103_143_790_174_062,
    ] {
        common::assert_seed_clean(seed);
    }
    let seed = 1_795_795_367_634_572;
    let outcome = run(&RunConfig {
        deadlock_detection: true,
        ..RunConfig::from_seed(seed)
    })
    .expect("a run");
    assert!(
        outcome.violations.is_empty(),
        "seed {seed}: {:?}",
        outcome.violations
    );
}

/// 1795522494251834 with leader loops in its run (found by a sweep with leader loops in
/// every run): a campaign decided on a lagging member's late events returned a leadership
/// whose key the nemesis had deleted after those events. A documented limit (RELIABILITY,
/// "What it cannot guarantee"): the run must show the guard saying so within the loss
/// bound, and nothing else.
#[test]
fn a_guard_decided_on_a_lagging_members_events_reports_its_gone_key_in_time() {
    let config = RunConfig {
        leader_loops: true,
        ..RunConfig::from_seed(1_795_522_494_251_834)
    };
    let outcome = run(&config).expect("a run");
    assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
    // A guard returned for a key already gone is still linearizable: its acquire took
    // effect (the keys ahead went) before the operator deleted its key.
    let verdict = fenced::sim::check(&outcome);
    assert!(
        verdict.failures.is_empty() && verdict.undecided.is_empty(),
        "{verdict:?}"
    );
    assert!(
        outcome
            .trace
            .iter()
            .any(|l| l.contains("returned after its key went")),
        "the schedule no longer meets the case"
    );
}

/// 1795782095067634 (a CI sweep): a crashed process's removals (`LeaseKeys`) never returned,
/// and each was given the last return of anything on its lease, which lived on across the
/// whole schedule; no window could be cut, and one name's 174 operations took the search
/// past its 2,000,000 steps (undecided). Its horizon is now the last return of the keys it
/// may remove (its lease's, created up to its revision): the schedule is decided in a few
/// thousand steps.
#[test]
fn a_crashed_processs_removals_do_not_hold_a_window_open() {
    let outcome = run(&RunConfig::from_seed(1_795_782_095_067_634)).expect("a run");
    assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
    let verdict = fenced::sim::check(&outcome);
    assert!(
        verdict.failures.is_empty() && verdict.undecided.is_empty(),
        "{verdict:?}"
    );
    assert!(verdict.steps < 200_000, "{verdict:?}");
}

/// 1795784949148490 (a sweep): a leader loop's term runs on a session of the loop's own;
/// the judge of rule 2 against etcd's expiry looked up the process's session, whose lease
/// had expired, not the term's, whose key an operator had just deleted: "still held after
/// etcd expired its lease". It now judges the lease of the guard's key.
#[test]
fn a_leader_loops_term_is_judged_by_the_lease_of_its_own_key() {
    let outcome = run(&RunConfig::from_seed(1_795_784_949_148_490)).expect("a run");
    assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
    assert!(
        outcome
            .trace
            .iter()
            .any(|l| l.contains("leader loop stopped")),
        "the schedule no longer meets the case"
    );
}

/// Deadlock detection never ends a wait without a cycle: the same seeded schedules with
/// every client checking under every name (`ClientBuilder::deadlock_detection("")`). Each
/// `Deadlock` a wait ends with is judged by the run (`judge_deadlock`: the cycle it names
/// is in the store at its revision, apart from the search that found it), and the rest of
/// the judges hold as before: no key left behind, linearizable. The workload rarely makes
/// a real cycle (a restarted process's leftover keys, multi-locks), so most runs must not
/// see one at all. Multi-locks run in the seeds that have them (forced on in every seed,
/// seed 1795785420422326's linearizability check is undecided within its 5 s, with or
/// without detection). `ETCD_SYNC_SIM_SECS` of seeds (default 20); with `ETCD_SYNC_SIM_SEED`
/// and `ETCD_SYNC_SIM_SECS=0`, that one seed with its full trace.
#[test]
#[ignore = "schedules for a while: run optimized, with --include-ignored"]
fn with_deadlock_detection_no_wait_ends_without_a_cycle() {
    let secs: u64 = std::env::var("ETCD_SYNC_SIM_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let base = match std::env::var("ETCD_SYNC_SIM_SEED") {
        Ok(seed) => seed.parse().expect("ETCD_SYNC_SIM_SEED is a number"),
        Err(_) => common::sweep_base(),
    };
    if std::env::var_os("ETCD_SYNC_SIM_LOG").is_some() {
        sim_log();
    }
    println!("sweeping from seed {base} for {secs} s (replay from one: ETCD_SYNC_SIM_SEED=<seed>)");
    let started = Instant::now();
    let (mut schedules, mut acquisitions, mut deadlocks) = (0u64, 0u64, 0usize);
    let mut failed = Vec::new();
    while schedules == 0 || started.elapsed() < Duration::from_secs(secs) {
        let seed = base + schedules;
        let outcome = run(&RunConfig {
            // ETCD_SYNC_SIM_DEADLOCK=0: the same schedules without it, to compare.
            deadlock_detection: std::env::var("ETCD_SYNC_SIM_DEADLOCK").map_or(true, |v| v != "0"),
            ..RunConfig::from_seed(seed)
        })
        .expect("a run");
        schedules += 1;
        acquisitions += outcome.acquisitions;
        if std::env::var_os("ETCD_SYNC_SIM_SEED").is_some() && secs == 0 {
            for line in &outcome.trace {
                println!("{line}");
            }
        }
        let fired: Vec<&String> = outcome
            .trace
            .iter()
            .filter(|l| l.contains("DEADLOCK"))
            .collect();
        deadlocks += fired.len();
        for line in fired {
            println!("seed {seed}: {line}");
        }
        let mut verdict = fenced::sim::check(&outcome);
        if verdict.failures.is_empty() && !verdict.undecided.is_empty() {
            verdict = fenced::sim::check_longer(&outcome);
        }
        if !verdict.failures.is_empty() || !verdict.undecided.is_empty() {
            failed.push((seed, vec![format!("{verdict:?}")]));
        }
        if !outcome.violations.is_empty() {
            failed.push((seed, outcome.violations));
        }
    }
    println!(
        "{schedules} schedules with deadlock detection, {acquisitions} acquisitions, \
         {deadlocks} Deadlock errors (each judged against the store), in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "seeds with violations (replay: ETCD_SYNC_SIM_SEED=<seed>): {failed:#?}"
    );
    assert!(acquisitions > schedules, "the schedules did acquire");
}

/// 1795789661116000 (a CI sweep): a campaign cancelled, its removal on its way when the
/// process crashed; the next life resumed the lease, and its campaign adopted the key that
/// removal then deleted, late: the wait ended with `LockLost` (the documented limit of an
/// adopted key, RELIABILITY "What it cannot guarantee"), which the judge took for a key
/// lost to nobody. A campaign's wait within 3 s of its process's restart is now excused
/// as its guard already was.
#[test]
fn a_campaign_that_adopted_an_earlier_lifes_key_may_lose_it_to_that_lifes_removal() {
    let outcome = run(&RunConfig::from_seed(1_795_789_661_116_000)).expect("a run");
    assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
    assert!(
        outcome.trace.iter().any(|l| l.contains("Lead: lock lost")),
        "the schedule no longer meets the case"
    );
}

/// Issue 53: leaders hand their leadership to the candidate next in line,
/// under every fault: no invariant breaks (the successor's guard is judged as every
/// guard is, the old one must not lead), and the outside judge accepts every history,
/// whose hold goes on on the successor's lease.
#[test]
fn leaders_that_hand_over_break_no_invariant() {
    // Seeds that found defects: the follow task's sweep of a late-applied join deleted a
    // key of ours by its create revision after its leadership was handed over (the key
    // is the successor's then: the sweep compares the lease too); the adoption put the
    // value the candidate's key had before its campaign proclaimed a new one (it reads
    // it again once answered, and requires it unchanged); the outside judge settled a
    // lease's end before the hand-over of a hold on it (a token's operations count for
    // every lease it was on).
    for seed in [
        1_795_884_535_808_105,
        213_935_860_906_273,
        213_935_860_906_793,
    ] {
        handed_over_clean(seed);
    }
    let base = common::sweep_base();
    let (mut handovers, mut schedules) = (0, 0);
    let started = Instant::now();
    while handovers < 5 || schedules < 12 {
        handovers += handed_over_clean(base + schedules);
        schedules += 1;
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "{handovers} hand-overs in {schedules} schedules"
        );
    }
    println!("{handovers} hand-overs in {schedules} schedules");
}

/// Issue 52: hand-overs while every member loses its answers to writes, a fault aimed at
/// them (`RunConfig::handover_faults`): requests, answers and adoptions apply unheard and
/// are retried. No invariant breaks, the outside judge accepts every history, and no
/// hand-over fails without cause (the judges in `testing/sim/run/handover.rs`): a retried
/// request refused as another hand-over's, found by hand in mutation testing, is found by
/// this sweep with its fix undone; a hand-over begun in a calm cluster to a candidate that
/// waits with time to spare must not run out of its limit (`late`). Some are.
/// `ETCD_SYNC_SIM_HANDOVER_SECS` long (default 20 s).
#[test]
#[ignore = "a sweep of 20 s: scripts/test runs it optimized, with --include-ignored"]
fn hand_overs_whose_writes_go_unanswered_fail_only_with_cause() {
    let secs: u64 = std::env::var("ETCD_SYNC_SIM_HANDOVER_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    // Seeds that found defects of the simulation's own judges: an adoption applied unheard
    // whose successor let go before the retry read the key back (`NotLeader`, and the
    // hand-over did happen: the history had it as not handed over, and the outside judge
    // found no order for the successor's hold); a candidate that left and joined again
    // at the back between the leader's look at the line and its hand-over, so that the
    // hand-over passed over two waiters, whose smaller tokens the token check refused.
    for (pinned, case) in [
        (1_796_601_113_344_308, "hand-over: lock lost"),
        (195_972_611_609_322, "p0 handed over to p1"),
        // A library defect: after such a `NotLeader`, the old leader's release deleted
        // the key by its create revision alone, which the successor's key keeps; it now
        // compares the lease too.
        (175_055_077_164_272, "p2 hand-over: lock lost"),
    ] {
        let outcome = run(&RunConfig {
            handovers: true,
            handover_faults: true,
            ..RunConfig::from_seed(pinned)
        })
        .expect("a run");
        assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
        let verdict = fenced::sim::check(&outcome);
        assert!(verdict.failures.is_empty(), "seed {pinned}: {verdict:?}");
        assert!(
            outcome.trace.iter().any(|l| l.contains(case)),
            "seed {pinned} no longer meets its case"
        );
    }
    let base = common::sweep_base();
    println!("sweeping from seed {base} for {secs} s");
    let started = Instant::now();
    let (mut schedules, mut handovers, mut aimed, mut owed) = (0u64, 0u64, 0u64, 0u64);
    let mut failed = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        let seed = base + schedules;
        schedules += 1;
        let outcome = run(&RunConfig {
            handovers: true,
            handover_faults: true,
            ..RunConfig::from_seed(seed)
        })
        .expect("a run");
        handovers += outcome.handovers;
        owed += outcome.handovers_owed_in_time;
        aimed += outcome
            .faults
            .get("lost answers during a hand-over")
            .copied()
            .unwrap_or(0);
        let verdict = fenced::sim::check(&outcome);
        if !verdict.failures.is_empty() {
            failed.push((seed, vec![format!("{verdict:?}")]));
        }
        if !outcome.violations.is_empty() {
            failed.push((seed, outcome.violations));
        }
    }
    println!(
        "{schedules} schedules, {handovers} leaderships handed over, {aimed} hand-overs \
         whose writes went unanswered, {owed} owed in time (begun calm, to a candidate \
         that waits)"
    );
    assert!(
        failed.is_empty(),
        "seeds with violations (replay: ETCD_SYNC_SIM_HANDOVER_FAULTS=1 \
         ETCD_SYNC_SIM_SEED=<seed>): {failed:#?}"
    );
    assert!(
        aimed >= 10,
        "only {aimed} hand-overs met the fault aimed at them"
    );
    assert!(
        owed >= 1,
        "no hand-over was owed in time: the `late` judge judged none"
    );
}

/// Runs `seed` with hand-overs on: no violation, and the outside judge accepts its
/// history. The number of leaderships handed over.
fn handed_over_clean(seed: u64) -> u64 {
    let outcome = run(&RunConfig {
        handovers: true,
        ..RunConfig::from_seed(seed)
    })
    .expect("a run");
    assert!(
        outcome.violations.is_empty(),
        "seed {seed} (replay: ETCD_SYNC_SIM_HANDOVERS=1 ETCD_SYNC_SIM_SEED={seed}): {:?}",
        outcome.violations
    );
    let verdict = fenced::sim::check(&outcome);
    assert!(verdict.failures.is_empty(), "seed {seed}: {verdict:?}");
    outcome.handovers
}

/// A join whose key of ours is there when its Txn runs and gone by the read after it (an
/// operator's put and delete; a late copy of an earlier attempt, swept) joins again; one
/// that keeps meeting that gives up after three Txns, with a retryable error, and leaves
/// no key. The race is timed by the simulated cluster (`SimCluster::set_flicker`): no
/// timing of real processes provokes it on demand.
#[test]
fn a_join_whose_key_appears_and_goes_joins_again_and_gives_up_after_three_tries() {
    use etcd_sync::TryLockError;

    let (cluster, _client, session) = one_session(1);
    let lease = session.lease_id();
    let key = format!("jobs/{lease:x}");
    let mutex = session.mutex("jobs").expect("a mutex");

    cluster.set_flicker(&key, lease, 1);
    let guard = mutex
        .try_lock()
        .expect("the second join takes the free lock");
    assert_eq!(cluster.flickers(), 1, "the first join met the key");
    let held = cluster.keys("jobs/");
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].0, key, "our key, put by the second join");
    assert!(guard.is_held());
    drop(guard);
    assert!(cluster.keys("jobs/").is_empty());

    cluster.set_flicker(&key, lease, usize::MAX);
    // On a thread of its own: a join that never gives up fails this test, not hangs it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send((mutex.try_lock().map(drop), mutex));
    });
    let (tried, mutex) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a join that keeps meeting its key gone gives up");
    match tried {
        Err(TryLockError::Error(e)) => {
            assert!(e.is_retryable(), "{e}");
            assert!(e.to_string().contains("appearing and going"), "{e}");
        }
        Ok(_) => panic!("a join that always met its key gone took the lock"),
        Err(e) => panic!("{e}"),
    }
    assert_eq!(cluster.flickers(), 3, "three joins, then the error");
    assert!(cluster.keys("jobs/").is_empty(), "no key left");

    cluster.set_flicker(&key, lease, 0);
    let guard = mutex.try_lock().expect("the lock, once the key stays away");
    assert!(guard.is_held());
}

/// A waiter at the front whose new watcher etcd registered unsynced (a write landed while
/// it registered it; its events then wait for etcd's 100 ms sync loop) reads now and then
/// through the watcher's first 120 ms, so a release in that window is taken within a poll
/// (15 ms), not at the next sync round (up to 100 ms). Real etcd registers
/// a watcher unsynced only when a write races it; the simulated cluster does it on demand
/// (`set_unsynced_every`), while another client writes every millisecond.
#[test]
fn a_waiter_on_an_unsynced_watcher_takes_a_release_within_its_polls() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use etcd_sync::Client;
    use etcd_sync::testing::sim::SimCluster;

    let cluster = SimCluster::start(1).expect("a simulated cluster");
    cluster.set_unsynced_every(1);
    let connect = || Client::connect(cluster.endpoints()).expect("a client");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (client, stop) = (connect(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let _ = client.put("noise", i.to_string());
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let holder = connect().session().expect("a session");
    let holder = holder.mutex("u").expect("a mutex");
    let mut took = Vec::new();
    for _ in 0..12 {
        let guard = holder.lock().expect("the free lock");
        // A new client each round: its watcher of the name is new, and registered unsynced.
        let session = connect().session().expect("a session");
        let waiter = session.mutex("u").expect("a mutex");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let guard = waiter.lock();
            let _ = tx.send((Instant::now(), guard.is_ok()));
            drop(guard);
            drop(session);
        });
        let queued = Instant::now();
        while cluster.keys("u/").len() < 2 {
            assert!(
                queued.elapsed() < Duration::from_secs(5),
                "the waiter never queued"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Well inside the watcher's unsynced window.
        std::thread::sleep(Duration::from_millis(20));
        let released = Instant::now();
        guard.release().expect("a release");
        let (held, ok) = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the waiter's turn");
        assert!(ok, "the waiter got an error");
        took.push(held - released);
        // Its key gone before the next round.
        let gone = Instant::now();
        while !cluster.keys("u/").is_empty() {
            assert!(
                gone.elapsed() < Duration::from_secs(5),
                "the waiter's key stayed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = writer.join();
    took.sort();
    let median = took[took.len() / 2];
    println!("release to the waiter's turn: median {median:?}, each {took:?}");
    // Without the polls: 60-70 ms each here (the sync round after the release).
    assert!(
        median < Duration::from_millis(35),
        "a release in the unsynced window waited for the sync loop: median {median:?}, {took:?}"
    );
}

/// A guard hears of its key's deletion within a second while a read of the follow task
/// waits: after a break, its watcher's resume revision was compacted, so the watcher starts
/// again from now and the gap is read; the member's linearizable reads wait 3 s for their
/// read index (an election dropped it; `SimCluster::set_read_wait`) while its watchers
/// deliver at once. The delete's event came while that read waited, and the follow task,
/// awaiting it, heard the event only once the read answered (2.7 s; found in CI on etcd
/// 3.4.23 after a failover with compaction, `compaction.rs`).
#[test]
fn a_guard_hears_its_key_deleted_while_a_read_of_its_gap_waits() {
    use etcd_sync::Client;
    use etcd_sync::testing::sim::SimCluster;

    let cluster = SimCluster::start(1).expect("a simulated cluster");
    let client = Client::connect(cluster.endpoints()).expect("a client");
    let session = client.session().expect("a session");
    let guard = session
        .mutex("g")
        .expect("a mutex")
        .lock()
        .expect("the free lock");
    std::thread::sleep(Duration::from_millis(400)); // the guard follows its key
    for i in 0..5 {
        client.put("g-noise", i.to_string()).expect("a put");
    }
    cluster.compact();
    cluster.set_read_wait(0, Some(Duration::from_secs(3)));
    cluster.break_connections(0);
    std::thread::sleep(Duration::from_millis(300)); // the watcher is back; its gap is read
    let lost = guard.lost();
    let other = Client::connect(cluster.endpoints()).expect("a client");
    let deleted = Instant::now();
    other.delete(guard.key()).expect("delete the guard's key");
    let noticed = lost
        .recv_timeout(Duration::from_secs(5))
        .is_err_and(|e| e.is_disconnected());
    let took = deleted.elapsed();
    assert!(noticed && !guard.is_held(), "the guard never noticed");
    assert!(
        took < Duration::from_secs(1),
        "the guard heard of its key's deletion {took:?} after it"
    );
}

/// While the cluster has no leader (every member refuses at once with "no leader", as
/// etcd does for a client that requires one), `try_lock` gives up after one attempt per
/// member with a retryable error (within about a request timeout: it removes what its
/// attempt may have left), and a blocking `lock` rides the election out and takes the lock
/// once a leader is back (`ownership/acquire.rs`: the join's patience; with the two
/// swapped, `try_lock` had not answered after 20 s).
#[test]
fn without_a_leader_try_lock_gives_up_and_a_blocking_lock_waits_for_one() {
    use etcd_sync::TryLockError;

    let (cluster, _client, session) = one_session(3);
    let mutex = session.mutex("election").expect("a mutex");
    cluster.set_leader(None);

    // On a thread of its own: a `try_lock` that waited for the leader fails this test, not
    // hangs it.
    let (tx, rx) = std::sync::mpsc::channel();
    let tried = {
        let mutex = mutex.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let _ = tx.send((mutex.try_lock().map(drop), started.elapsed()));
        })
    };
    let (outcome, took) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("try_lock answers");
    let _ = tried.join();
    match outcome {
        Err(TryLockError::Error(e)) => assert!(e.is_retryable(), "{e}"),
        Ok(()) => panic!("try_lock took the lock with no leader"),
        Err(e) => panic!("{e}"),
    }
    assert!(
        took < etcd_sync::DEFAULT_REQUEST_TIMEOUT + Duration::from_secs(1),
        "try_lock waited {took:?} for a leader"
    );

    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = {
        let mutex = mutex.clone();
        std::thread::spawn(move || {
            let guard = mutex.lock_timeout(Duration::from_secs(10));
            let _ = tx.send(guard.map(|g| g.is_held()));
        })
    };
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        rx.try_recv().is_err(),
        "the blocking lock ended while there was no leader"
    );
    cluster.set_leader(Some(1));
    let held = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the blocking lock answers");
    let _ = waiter.join();
    assert!(
        matches!(held, Ok(true)),
        "the blocking lock did not take the lock once a leader was back: {held:?}"
    );
}

/// The deadlock check rides out reads that fail for a passing reason: two sessions that
/// wait for each other's mutex while the cluster has no leader for 1.5 s (every read of a
/// check refused "no leader") still end the youngest wait with `Deadlock` once a leader is
/// back (`ownership/deadlock.rs`; with a failed read turning the check off, the wait ran
/// to its limit).
#[test]
fn a_deadlock_check_whose_reads_fail_for_a_while_still_finds_the_cycle() {
    use etcd_sync::testing::sim::SimCluster;

    let cluster = SimCluster::start(1).expect("a simulated cluster");
    let detecting = || {
        etcd_sync::Client::builder()
            .endpoints(cluster.endpoints())
            .deadlock_detection("d/")
            .connect()
            .expect("a client")
    };
    let (ca, cb) = (detecting(), detecting());
    let (a, b) = (
        ca.session().expect("a session"),
        cb.session().expect("a session"),
    );
    let x = a.mutex("d/x").expect("a mutex").lock().expect("x");
    let y = b.mutex("d/y").expect("a mutex").lock().expect("y");
    let wait = |mutex: etcd_sync::Mutex| {
        std::thread::spawn(move || {
            let started = Instant::now();
            let result = mutex.lock_timeout(Duration::from_secs(12)).map(drop);
            (result, started.elapsed())
        })
    };
    let a_waits = wait(a.mutex("d/y").expect("a mutex"));
    let queued = |prefix: &str| {
        let since = Instant::now();
        while cluster.keys(prefix).len() < 2 {
            assert!(since.elapsed() < Duration::from_secs(5), "no wait queued");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    queued("d/y/");
    // b's wait closes the cycle; its checks' reads fail from the moment it queued.
    let b_waits = wait(b.mutex("d/x").expect("a mutex"));
    queued("d/x/");
    cluster.set_leader(None);
    std::thread::sleep(Duration::from_millis(1500));
    cluster.set_leader(Some(0));
    let (result, took) = b_waits.join().expect("b's wait");
    let e = result.expect_err("b's wait closes a cycle");
    assert!(e.is_deadlock(), "b's wait ended with {e} after {took:?}");
    assert!(
        took < Duration::from_secs(6),
        "Deadlock {took:?} after b's wait began"
    );
    drop(y);
    let (result, _) = a_waits.join().expect("a's wait");
    assert!(result.is_ok(), "a's wait: {result:?}");
    drop(x);
}

/// A proclamation whose put applied while its answer was lost (the only member swallows
/// write answers) reads its key back, finds its value there, and succeeds: the ambiguity is
/// settled by the read, not reported. (Mutation testing, shard 6/10: with a transient
/// failure of the put returned at once, the proclamation failed with `Timeout` although it
/// had applied.)
#[test]
fn a_proclamation_whose_answer_was_lost_reads_that_it_applied() {
    use etcd_sync::testing::sim::SimCluster;

    let cluster = SimCluster::start(1).expect("a simulated cluster");
    let client = etcd_sync::Client::builder()
        .endpoints(cluster.endpoints())
        .request_timeout(Duration::from_secs(1))
        .connect()
        .expect("a client");
    let session = client.session().expect("a session");
    let leadership = session
        .election("said")
        .expect("an election")
        .campaign("first")
        .expect("the free leadership");
    cluster.set_swallow_writes(0, true);
    let proclaimed = leadership.proclaim("second");
    cluster.set_swallow_writes(0, false);
    assert!(proclaimed.is_ok(), "the proclamation: {proclaimed:?}");
    assert!(leadership.is_leader());
    let keys = cluster.keys("said/");
    assert_eq!(keys.len(), 1, "one key: {keys:?}");
    let kv = client
        .get(leadership.key())
        .expect("a read")
        .expect("the leader's key");
    assert_eq!(kv.value, b"second");
}

/// A leader of `name` campaigning with "first" whose process crashed (no resign, its
/// session orphaned), and a session resuming its lease; with the leadership's fencing token.
fn leader_crashed_and_resumed(client: &etcd_sync::Client, name: &str) -> (etcd_sync::Session, i64) {
    let session = client.session().expect("a session");
    let first = session
        .election(name)
        .expect("an election")
        .campaign("first")
        .expect("the free leadership");
    let token = first.fencing_token();
    std::mem::forget(first); // a crash: no resign
    session.orphan();
    let resumed = client
        .session_builder()
        .resume(session.lease_id())
        .start()
        .expect("the resumed session");
    (resumed, token)
}

/// A resumed session's re-campaign with a new value: the join's Txns are answered, and the
/// cluster loses its leader before the put of the new value. The campaign rides out the
/// election (as a blocking wait does) and leads with the new value in its old place.
/// (Mutation testing, shard 6/10: with the put's "no leader" refusal returned at once, the
/// campaign failed.)
#[test]
fn a_recampaign_whose_put_meets_an_election_waits_it_out() {
    use etcd_sync::testing::sim::{AfterWrites, SimCluster};

    let cluster = SimCluster::start(1).expect("a simulated cluster");
    let client = etcd_sync::Client::connect(cluster.endpoints()).expect("a client");
    let (resumed, token) = leader_crashed_and_resumed(&client, "vote");
    // Answered: the join's Txn (it finds our key) and the read-only Txn that reads it.
    cluster.after_writes(2, AfterWrites::LoseLeader);
    let election = std::thread::scope(|s| {
        leader_back_after(s, &cluster, Duration::from_millis(300));
        let started = Instant::now();
        let campaign = resumed.election("vote").expect("an election");
        (campaign.campaign("second"), started.elapsed())
    });
    let (again, took) = election;
    let again = again.expect("the re-campaign after the election");
    assert!(
        took >= Duration::from_millis(250),
        "met no election: {took:?}"
    );
    assert_eq!(again.fencing_token(), token, "kept its place");
    let keys = cluster.keys("vote/");
    assert_eq!(keys.len(), 1, "one key: {keys:?}");
    let kv = client
        .get(again.key())
        .expect("a read")
        .expect("the leader's key");
    assert_eq!(kv.value, b"second");
}

/// A resumed session's re-campaign with a new value whose put's answer is lost (the join's
/// Txns were answered): the put may have applied, and sent again it would fail its own compare,
/// so the campaign fails with the put's `Timeout` (not `NotLeader`) and leaves no key.
/// (Mutation testing, shard 6/10: with every failure of the put retried, the campaign sent
/// it again and reported `NotLeader` for a place it had.)
#[test]
fn a_recampaign_whose_put_answer_is_lost_fails_with_timeout_and_leaves_no_key() {
    use etcd_sync::Error;
    use etcd_sync::testing::sim::{AfterWrites, SimCluster};

    let cluster = SimCluster::start(1).expect("a simulated cluster");
    let client = etcd_sync::Client::builder()
        .endpoints(cluster.endpoints())
        .request_timeout(Duration::from_millis(500))
        .connect()
        .expect("a client");
    let (resumed, _) = leader_crashed_and_resumed(&client, "cast");
    // Answered: the join's Txn (it finds our key) and the read-only Txn that reads it.
    cluster.after_writes(2, AfterWrites::SwallowAnswers);
    let campaign = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(1500));
            cluster.set_swallow_writes(0, false);
        });
        resumed
            .election("cast")
            .expect("an election")
            .campaign("second")
    });
    cluster.set_swallow_writes(0, false);
    match campaign {
        Err(Error::Timeout { .. }) => {}
        other => panic!("the campaign: {other:?}"),
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cluster.keys("cast/").is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(cluster.keys("cast/").is_empty(), "a key left behind");
}

/// A `try_lock` whose first member does not answer (frozen) tries the next one within its
/// one attempt per endpoint, and takes the free lock there; the first attempt, applied
/// once the member thaws, is swept. (Mutation testing, shard 6/10: with the next endpoint
/// never tried, `try_lock` failed with the first member's `Timeout`.)
#[test]
fn a_try_lock_whose_member_is_frozen_takes_the_free_lock_on_the_next() {
    use etcd_sync::testing::sim::SimCluster;

    let cluster = SimCluster::start(3).expect("a simulated cluster");
    // The client starts on the first endpoint: member 0.
    let client = etcd_sync::Client::builder()
        .endpoints(cluster.endpoints())
        .request_timeout(Duration::from_millis(500))
        .connect()
        .expect("a client");
    let session = client.session().expect("a session");
    let mutex = session.mutex("next").expect("a mutex");
    cluster.set_frozen(0, true);
    let (tx, rx) = std::sync::mpsc::channel();
    let tried = {
        let mutex = mutex.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let tried = mutex.try_lock().map(|g| g.is_held());
            let _ = tx.send((tried, started.elapsed()));
        })
    };
    let (outcome, took) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("try_lock answers");
    let _ = tried.join();
    cluster.set_frozen(0, false);
    match outcome {
        Ok(true) => {}
        other => panic!("try_lock with member 0 frozen: {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(400),
        "met no frozen member: {took:?}"
    );
    // The thawed member may apply its attempt late; the sweep removes it.
    std::thread::sleep(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cluster.keys("next/").is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(cluster.keys("next/").is_empty(), "a key left behind");
}

/// A wait cut short by its limit while its join's answer is lost cleans up its key, and a
/// removal refused meanwhile (no leader) is tried again until etcd answers: the name is free
/// afterwards. (Mutation testing, shard 6/10: with a refused removal given up, the key
/// stayed on the lease and blocked the name for the rest of the session.)
#[test]
fn an_ambiguous_join_whose_removal_meets_an_election_still_removes_its_key() {
    use etcd_sync::testing::sim::AfterWrites;

    let (cluster, client, session) = one_session(1);
    let mutex = session.mutex("gone").expect("a mutex");
    // The join's Txn applies unheard, and then the cluster has no leader: the cleanup's
    // removal is refused until one is back.
    cluster.set_swallow_writes(0, true);
    cluster.after_writes(1, AfterWrites::LoseLeader);
    let waited = mutex.lock_timeout(Duration::from_millis(300));
    assert!(
        matches!(waited, Err(etcd_sync::Error::Timeout { .. })),
        "the wait: {waited:?}"
    );
    assert_eq!(cluster.leader(), None, "the join's Txn came");
    assert_eq!(cluster.keys("gone/").len(), 1, "the join's key applied");
    cluster.set_swallow_writes(0, false);
    std::thread::sleep(Duration::from_millis(500));
    cluster.set_leader(Some(0));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cluster.keys("gone/").is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(cluster.keys("gone/").is_empty(), "the key stayed");
    let other = client.session().expect("another session");
    let guard = other
        .mutex("gone")
        .expect("a mutex")
        .lock_timeout(Duration::from_secs(2))
        .expect("the free name");
    assert!(guard.is_held());
}

/// Restores the leader `after` the cluster lost it (waiting up to 10 s for the loss), on a
/// thread of the caller's scope.
fn leader_back_after<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    cluster: &'s etcd_sync::testing::sim::SimCluster,
    after: Duration,
) {
    s.spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while cluster.leader().is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(after);
        cluster.set_leader(Some(0));
    });
}

/// A writer key of our lease that nothing here uses (an earlier life's enqueue applied
/// late) is removed by a read that finds it ahead, also when the cluster loses its leader
/// right after the read's join: the removal is tried again until a leader answers, and the
/// read holds. (Mutation testing, shard 6/10: with a refused removal given up, the read
/// waited behind its own leftover out to its limit.)
#[test]
fn a_leftover_whose_removal_meets_an_election_is_removed_once_a_leader_is_back() {
    use etcd_sync::testing::sim::AfterWrites;

    let (cluster, client, session) = one_session(1);
    let lease = session.lease_id();
    let rw = session.rwlock("left").expect("a read-write lock");
    client
        .put_with_lease(format!("left/{lease:x}"), "", lease)
        .expect("the leftover writer key");
    // Answered: the read's join Txn; then no leader, and the leftover's removal is refused.
    cluster.after_writes(1, AfterWrites::LoseLeader);
    let read = std::thread::scope(|s| {
        leader_back_after(s, &cluster, Duration::from_millis(500));
        rw.read_timeout(Duration::from_secs(5))
    });
    let read = read.expect("the read holds once the leftover is gone");
    assert!(read.is_held());
    let keys: Vec<String> = cluster.keys("left/").into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec![format!("left/{lease:x}.shared")]);
}

/// A lock that finds a key of our lease on its own place (an earlier life's) removes it by
/// its revision and joins again with a fresh one, also when the cluster loses its leader
/// right after the join found it: a blocking wait rides out the election. (Mutation
/// testing, shard 6/10: with the refused removal returned at once, the lock failed.)
#[test]
fn a_lock_whose_found_key_meets_an_election_removes_it_and_holds() {
    lock_whose_found_key_meets(etcd_sync::testing::sim::AfterWrites::LoseLeader);
}

/// The same when the removal's answer is lost (a transport failure, not a refusal): the
/// removal by revision is sent again until answered. (Mutation testing, shard 6/10: with
/// only failures that are both a refusal and transient retried, the lock failed with
/// `Timeout`.)
#[test]
fn a_lock_whose_found_keys_removal_goes_unanswered_sends_it_again_and_holds() {
    lock_whose_found_key_meets(etcd_sync::testing::sim::AfterWrites::SwallowAnswers);
}

fn lock_whose_found_key_meets(fault: etcd_sync::testing::sim::AfterWrites) {
    use etcd_sync::testing::sim::{AfterWrites, SimCluster};

    let cluster = SimCluster::start(1).expect("a simulated cluster");
    let client = etcd_sync::Client::builder()
        .endpoints(cluster.endpoints())
        .request_timeout(Duration::from_millis(500))
        .connect()
        .expect("a client");
    let session = client.session().expect("a session");
    let lease = session.lease_id();
    let mutex = session.mutex("found").expect("a mutex");
    let old = client
        .put_with_lease(format!("found/{lease:x}"), "", lease)
        .expect("an earlier life's key");
    // Answered: the join's Txn (it finds the key) and the read-only Txn that reads it.
    cluster.after_writes(2, fault);
    let guard = std::thread::scope(|s| {
        if fault == AfterWrites::LoseLeader {
            leader_back_after(s, &cluster, Duration::from_millis(500));
        } else {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(1200));
                cluster.set_swallow_writes(0, false);
            });
        }
        mutex.lock_timeout(Duration::from_secs(5))
    });
    let guard = guard.expect("the lock after the fault");
    assert!(guard.fencing_token() > old, "a fresh create revision");
    let keys = cluster.keys("found/");
    assert_eq!(keys.len(), 1, "one key: {keys:?}");
    assert_eq!(keys[0].1, guard.fencing_token());
}

/// A `try_lock` that finds a key of our lease on its own place and then meets an election
/// gives up at once with the refusal, as `try_*` does, and leaves no key of this attempt.
/// (Mutation testing, shard 6/10: with every refusal retried, `try_lock` waited for the
/// next leader.)
#[test]
fn a_try_lock_whose_found_keys_removal_is_refused_gives_up_at_once() {
    use etcd_sync::TryLockError;
    use etcd_sync::testing::sim::AfterWrites;

    let (cluster, client, session) = one_session(1);
    let lease = session.lease_id();
    let mutex = session.mutex("tried").expect("a mutex");
    client
        .put_with_lease(format!("tried/{lease:x}"), "", lease)
        .expect("an earlier life's key");
    cluster.after_writes(2, AfterWrites::LoseLeader);
    let (tried, took) = std::thread::scope(|s| {
        leader_back_after(s, &cluster, Duration::from_secs(3));
        let started = Instant::now();
        (mutex.try_lock().map(drop), started.elapsed())
    });
    match tried {
        Err(TryLockError::Error(e)) => assert!(e.is_retryable(), "{e}"),
        other => panic!("try_lock without a leader: {other:?}"),
    }
    assert!(took < Duration::from_secs(2), "try_lock waited {took:?}");
}

/// A wait cut short while its join's answer is lost, whose cleanup etcd then refuses for
/// good (deletes denied: a role that lost its write permission), gives the cleanup up and
/// lets the line's local turn go: the next lock of the same session reports the refusal at
/// once instead of waiting behind a cleanup that retries forever. (Mutation testing, shard
/// 6/10: with every failure of the cleanup retried, the next lock waited out its limit.)
#[test]
fn a_cleanup_refused_for_good_lets_the_next_lock_report_the_refusal() {
    use etcd_sync::Error;
    use etcd_sync::testing::sim::AfterWrites;

    let (cluster, _client, session) = one_session(1);
    let mutex = session.mutex("denied").expect("a mutex");
    cluster.set_swallow_writes(0, true);
    cluster.after_writes(1, AfterWrites::DenyDeletes);
    let waited = mutex.lock_timeout(Duration::from_millis(300));
    assert!(
        matches!(waited, Err(Error::Timeout { .. })),
        "the wait: {waited:?}"
    );
    cluster.set_swallow_writes(0, false);
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let next = mutex.lock_timeout(Duration::from_secs(3));
    let took = started.elapsed();
    cluster.set_deny_deletes(false);
    assert!(
        matches!(&next, Err(Error::Server { message, .. }) if message.contains("permission denied")),
        "the next lock: {next:?}"
    );
    assert!(
        took < Duration::from_secs(2),
        "the next lock waited {took:?}"
    );
}

/// The same for a leftover writer key of our lease whose removal etcd refuses for good:
/// the removal is given up and the writer line's local turn goes free, so a write of the
/// same session reports the refusal at once. (Mutation testing, shard 6/10: with every
/// failure of the removal retried, the write waited out its limit.)
#[test]
fn a_leftover_removal_refused_for_good_lets_a_write_report_the_refusal() {
    use etcd_sync::Error;
    use etcd_sync::testing::sim::AfterWrites;

    let (cluster, client, session) = one_session(1);
    let lease = session.lease_id();
    let rw = session.rwlock("kept").expect("a read-write lock");
    client
        .put_with_lease(format!("kept/{lease:x}"), "", lease)
        .expect("the leftover writer key");
    // Answered: the read's join Txn; then deletes are refused, the leftover's removal too.
    cluster.after_writes(1, AfterWrites::DenyDeletes);
    let read = rw.read_timeout(Duration::from_millis(500));
    assert!(
        matches!(read, Err(Error::Timeout { .. })),
        "the read behind the leftover: {read:?}"
    );
    let started = Instant::now();
    let write = rw.write_timeout(Duration::from_secs(3));
    let took = started.elapsed();
    cluster.set_deny_deletes(false);
    assert!(
        matches!(&write, Err(Error::Server { message, .. }) if message.contains("permission denied")),
        "the write: {write:?}"
    );
    assert!(took < Duration::from_secs(2), "the write waited {took:?}");
}

/// A multi-lock whose one Txn goes unanswered past its limit waits for the Txn's answer a
/// quarter of a request timeout more, cleans up its keys and ends with `Timeout`: well
/// before a request timeout, however long that is, and no key is left once etcd answers
/// again (rule 5 for the one-Txn join; shard 7/10 of the mutation run looked here).
#[test]
fn a_multi_lock_cut_short_while_its_txn_goes_unanswered_ends_within_a_request_timeout() {
    use etcd_sync::Error;

    let (cluster, _client, session) = session_with_request_timeout(Duration::from_secs(2));
    let multi = session
        .multi_lock(["cut-a", "cut-b"])
        .expect("a multi-lock");
    cluster.set_swallow_writes(0, true);
    let started = Instant::now();
    let waited = multi.lock_timeout(Duration::from_millis(200));
    let took = started.elapsed();
    cluster.set_swallow_writes(0, false);
    assert!(
        matches!(waited, Err(Error::Timeout { .. })),
        "the wait: {waited:?}"
    );
    assert!(
        took < Duration::from_millis(900),
        "the wait ended {took:?} after its start"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(cluster.keys("cut-a/").is_empty() && cluster.keys("cut-b/").is_empty())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(cluster.keys("cut-a/").is_empty() && cluster.keys("cut-b/").is_empty());
}

/// A simulated cluster of `members`, a client of it and one session: the usual start.
fn one_session(
    members: usize,
) -> (
    etcd_sync::testing::sim::SimCluster,
    etcd_sync::Client,
    etcd_sync::Session,
) {
    let cluster = etcd_sync::testing::sim::SimCluster::start(members).expect("a simulated cluster");
    let client = etcd_sync::Client::connect(cluster.endpoints()).expect("a client");
    let session = client.session().expect("a session");
    (cluster, client, session)
}

/// A client whose requests time out after `request_timeout`, on a simulated cluster of
/// one member, and a session of it.
fn session_with_request_timeout(
    request_timeout: Duration,
) -> (
    etcd_sync::testing::sim::SimCluster,
    etcd_sync::Client,
    etcd_sync::Session,
) {
    members_session_with_request_timeout(1, request_timeout)
}

/// The same on a simulated cluster of `members` members.
fn members_session_with_request_timeout(
    members: usize,
    request_timeout: Duration,
) -> (
    etcd_sync::testing::sim::SimCluster,
    etcd_sync::Client,
    etcd_sync::Session,
) {
    let cluster = etcd_sync::testing::sim::SimCluster::start(members).expect("a simulated cluster");
    let client = etcd_sync::Client::builder()
        .endpoints(cluster.endpoints())
        .request_timeout(request_timeout)
        .connect()
        .expect("a client");
    let session = client.session().expect("a session");
    (cluster, client, session)
}

/// Whether `done` turns true within `limit`, polled every 20 ms.
fn within(limit: Duration, done: impl Fn() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

/// A release request for a hold that an operator then ends: the holder removes the
/// request once it finds its key gone, and a removal that times out (etcd slow to commit,
/// for longer than the client's own retries) is sent again until it goes, so the request
/// does not outlive the hold. (Mutation testing, shard 7/10: `requests.rs:177:27`, with
/// the removal given up at its first transient failure, the request stayed for the
/// session's life.)
#[test]
fn a_request_removal_after_a_forced_release_is_sent_again_after_a_timeout() {
    use etcd_sync::testing::sim::TimedOut;

    let (cluster, client, session) = session_with_request_timeout(Duration::from_millis(300));
    let guard = session
        .mutex("asked")
        .expect("a mutex")
        .lock()
        .expect("the lock");
    let asked = client.request_release("asked").expect("the request");
    assert_eq!(asked.len(), 1, "holders asked: {asked:?}");
    assert_eq!(cluster.keys("asked.revoke/").len(), 1);
    cluster.set_time_out(TimedOut::Deletes, true);
    assert_eq!(cluster.delete_prefix("asked/"), 1);
    assert!(
        within(Duration::from_secs(1), || !guard.is_held()),
        "the holder did not hear its key go"
    );
    // Several request timeouts: the client's own retries of the removal have given up.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        cluster.keys("asked.revoke/").len(),
        1,
        "removed while refused"
    );
    cluster.set_time_out(TimedOut::Deletes, false);
    assert!(
        within(Duration::from_secs(3), || cluster
            .keys("asked.revoke/")
            .is_empty()),
        "the request outlives the hold: {:?}",
        cluster.keys("asked.revoke/")
    );
    assert!(session.is_alive());
}

/// A holder that starts following its release requests while reads time out (for longer
/// than the client's own retries) reads again until etcd answers, and then hears a
/// request. (Mutation testing, shard 7/10: `requests.rs:267:27`, with the read given up
/// at its first transient failure, the follower stopped and no request was ever heard.)
#[test]
fn a_request_follower_whose_first_read_times_out_reads_again_and_hears_requests() {
    use etcd_sync::testing::sim::TimedOut;

    let (cluster, client, session) = session_with_request_timeout(Duration::from_millis(300));
    let guard = session
        .mutex("heard")
        .expect("a mutex")
        .lock()
        .expect("the lock");
    cluster.set_time_out(TimedOut::Reads, true);
    let requests = guard.release_requested();
    std::thread::sleep(Duration::from_millis(1500));
    cluster.set_time_out(TimedOut::Reads, false);
    // The follower's next read, after its backoff (a quick one: at most a second).
    std::thread::sleep(Duration::from_millis(1200));
    let asked = client.request_release("heard").expect("the request");
    assert_eq!(asked.len(), 1, "holders asked: {asked:?}");
    let heard = requests.recv_timeout(Duration::from_secs(2));
    assert!(heard.is_ok(), "no request heard: {heard:?}");
    assert!(guard.is_held());
}

/// The same for a downgradable write (a writer key and its reader twin, in one Txn): cut
/// short while etcd swallows answers, it waits a quarter of a request timeout for each
/// key's removal and ends with `Timeout` within a request timeout; both keys go once etcd
/// answers again. (Mutation testing, shard 7/10: `twin.rs:67:68`, a wait of four request
/// timeouts for the twin's removal instead of a quarter of one.)
#[test]
fn a_downgradable_write_cut_short_while_answers_are_lost_ends_within_a_request_timeout() {
    use etcd_sync::Error;

    let (cluster, _client, session) = session_with_request_timeout(Duration::from_secs(2));
    let rw = session.rwlock("cut-twin").expect("a read-write lock");
    cluster.set_swallow_writes(0, true);
    let started = Instant::now();
    let waited = rw.write_downgradable_timeout(Duration::from_millis(200));
    let took = started.elapsed();
    cluster.set_swallow_writes(0, false);
    assert!(
        matches!(waited, Err(Error::Timeout { .. })),
        "the wait: {:?}",
        waited.map(drop)
    );
    assert!(
        took < Duration::from_secs(2),
        "the wait ended {took:?} after its start"
    );
    assert!(
        within(Duration::from_secs(5), || cluster
            .keys("cut-twin/")
            .is_empty()),
        "keys left: {:?}",
        cluster.keys("cut-twin/")
    );
}

/// A release that does not know yet that an operator deleted its key (its member's events
/// come late) finds the key gone and removes the key's release request instead; when that
/// removal times out (for longer than the client's own retries) it is sent again until it
/// goes. (Mutation testing, shard 7/10: `requests.rs:116:23`, with the removal given up
/// at its first transient failure, the request stayed for the session's life.)
#[test]
fn a_release_that_finds_its_key_gone_sends_the_request_removal_again_after_a_timeout() {
    use etcd_sync::testing::sim::{AfterWrites, TimedOut};

    let (cluster, client, session) = session_with_request_timeout(Duration::from_millis(300));
    let guard = session
        .mutex("gone")
        .expect("a mutex")
        .lock()
        .expect("the lock");
    let asked = client.request_release("gone").expect("the request");
    assert_eq!(asked.len(), 1, "holders asked: {asked:?}");
    // Events, and answers, 200 ms late (within the request timeout).
    cluster.set_lag(0, Some(Duration::from_millis(200)));
    assert_eq!(cluster.delete_prefix("gone/"), 1);
    // The release's own Txn finds the key gone (answered); the request's removal after
    // it times out.
    cluster.after_writes(1, AfterWrites::TimeOutDeletes);
    assert!(guard.is_held(), "the delete was heard at once");
    drop(guard);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        cluster.keys("gone.revoke/").len(),
        1,
        "removed while refused"
    );
    assert_eq!(
        cluster.writes_before_fault(),
        None,
        "the release wrote nothing"
    );
    cluster.set_time_out(TimedOut::Deletes, false);
    cluster.set_lag(0, None);
    assert!(
        within(Duration::from_secs(3), || cluster
            .keys("gone.revoke/")
            .is_empty()),
        "the request outlives the hold: {:?}",
        cluster.keys("gone.revoke/")
    );
    assert!(session.is_alive());
}

/// A downgrade whose Txn applies while its answer is lost is sent again (to the next
/// member, once the first times out): the retry finds
/// the writer key gone and the twin rewritten by the first attempt (its mod revision past
/// the join's), so the downgrade holds. (Mutation testing, shard 8/10:
/// `hold/downgrade.rs:141:28` and `:142:39`, the first attempt's mark not recognised: the
/// downgrade reported `LockLost` and released the read.)
#[test]
fn a_downgrade_whose_answer_is_lost_is_sent_again_and_holds() {
    use etcd_sync::testing::sim::AfterWrites;

    // Two members: the first attempt times out on one, the retry goes to the other.
    let (cluster, _client, session) =
        members_session_with_request_timeout(2, Duration::from_millis(500));
    let write = session
        .rwlock("dg-lost")
        .expect("a read-write lock")
        .write_downgradable()
        .expect("a write");
    let (writer, twin) = (
        write.key_str().into_owned(),
        format!("{}.shared", write.key_str()),
    );
    let token = write.fencing_token();
    cluster.after_writes(0, AfterWrites::SwallowAnswers);
    let read = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            (0..2).for_each(|m| cluster.set_swallow_writes(m, false));
        });
        write.downgrade()
    });
    (0..2).for_each(|m| cluster.set_swallow_writes(m, false));
    let read = read.unwrap_or_else(|e| panic!("the downgrade: {}", e.error()));
    assert!(read.is_held());
    assert_eq!(read.key_str(), twin.as_str());
    let keys = cluster.keys("dg-lost/");
    assert_eq!(
        keys,
        vec![(twin.clone(), token)],
        "{writer} went, the twin stayed"
    );
    read.release().expect("the read's release");
}
