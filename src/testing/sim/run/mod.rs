//! A deterministic simulated run: a [`SimCluster`] and simulated processes using the
//! crate's blocking API, on one current-thread runtime with paused (virtual) time, every
//! choice (workload, fault timing, tokio's `select!` order) drawn from one seed, and the
//! processes taking turns with the runtime (`client/simulated.rs`). The same seed gives the
//! same trace, line for line; [`Outcome::trace_hash`] says so in one number.
//!
//! The invariants are checked at the exact moments they concern, which only a run where
//! nothing moves unseen allows: when `lock` returns a guard, the store must hold its key,
//! with its fencing token, as the oldest key of the name (rule 4), and no other live guard
//! may have its key there (rule 1); while a process holds, a guard whose key is gone must
//! say so within [`LOSS_BOUND`] of virtual time (rule 2); and a key is lost (a guard's, or
//! a waiter's: `LockLost`) only when something outside the process deleted it: the
//! nemesis, or the end of its session.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::SimCluster;
use crate::client::simulated::{self, Simulation};
use crate::support::backoff;
pub use crate::support::sim::Mutation;
use crate::support::sim::{self as seam, Mark};
use crate::support::tuning::LineTuning;
pub use history::{Mode, Operation, What};

/// How long a guard may go on saying it holds after its key is gone (rule 2).
pub const LOSS_BOUND: Duration = Duration::from_secs(1);

/// How long after the nemesis deleted lock keys a loss may be blamed on it: a guard hears
/// of its key's deletion within [`LOSS_BOUND`], and a waiter within a request timeout.
const CAUSE_WINDOW: Duration = Duration::from_secs(3);

/// How long after every process ended its keys must be gone: the sessions' TTL (3 s) and
/// some.
const LEFT_BEHIND_AFTER: Duration = Duration::from_secs(5);

/// What a run does.
///
/// ```
/// let config = etcd_sync::testing::sim::RunConfig { seed: 7, ..Default::default() };
/// assert_eq!(config.processes, 3);
/// ```
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Every random choice of the run comes from it.
    pub seed: u64,
    /// Simulated processes contending for one mutex, each with its own client.
    pub processes: usize,
    /// Members of the simulated cluster.
    pub members: usize,
    /// Virtual time the workload runs (processes then finish their current step).
    pub duration: Duration,
    /// Inject faults (compaction, broken connections, stopped, frozen and leaderless
    /// members, lost answers, operator deletes and revokes, unsynced watchers).
    pub faults: bool,
    /// A defect to re-introduce for the run (process-wide: see [`Mutation`]).
    pub mutation: Option<Mutation>,
    /// A quarter of the campaigns run a supervised leader loop (from a seed: an eleventh
    /// of the seeds, none of those pinned before leader loops were in the workload).
    pub leader_loops: bool,
    /// A quarter of the steps take the mutex and a side of the read-write lock at once
    /// with a `MultiLock` (from a seed: two sevenths of the seeds, none of those pinned
    /// before multi-locks were in the workload).
    pub multi_locks: bool,
    /// How the processes' waiters wait (their clients' hidden
    /// [`line_tuning`](crate::client::builder::ClientBuilder::line_tuning)): the library's
    /// own widths by default, under which the simulation's short lines wait at the front;
    /// `tests/simulation_back.rs` narrows the front so that they wait at the back.
    pub line_tuning: LineTuning,
    /// How fast etcd's lease clock runs against each process's clock, drawn per process
    /// within this range (default 0.9 to 1.1; `(1.0, 1.0)`: one clock). A process whose
    /// clock runs slow sees its lease expire early; its guards must still report the loss
    /// before etcd expires the lease (the loss deadline's margin, RELIABILITY.md).
    pub clock_rates: (f64, f64),
    /// Half the write locks are downgradable, and half of those go on as reads
    /// (`RwLockWriteGuard::downgrade`) after their hold (from a seed: a fifth of the seeds,
    /// none of those pinned before downgrades were in the workload).
    pub downgrades: bool,
    /// Every process's client checks for deadlocks under every name
    /// ([`deadlock_detection`](crate::client::builder::ClientBuilder::deadlock_detection)``("")``),
    /// and every `Deadlock` a wait ends with is judged: the cycle it names must be in the
    /// store at the revision it names (off by default and in [`from_seed`](Self::from_seed):
    /// `tests/simulation.rs` sweeps seeds with it on).
    pub deadlock_detection: bool,
    /// A third of the leaders that have another session's candidate next in line hand
    /// their leadership over to it instead of resigning (`Leadership::hand_over`; from a seed:
    /// two thirteenths of the seeds, none of those pinned before hand-overs were in the
    /// workload).
    pub handovers: bool,
    /// With [`handovers`](Self::handovers), a third of the nemesis's faults wait for a
    /// hand-over to begin and then lose every member's answers to writes for up to 0.8 s:
    /// the request, the candidate's answer or the adoption applies unheard, and is retried
    /// (off by default and in [`from_seed`](Self::from_seed): `tests/simulation.rs` sweeps
    /// seeds with it on).
    pub handover_faults: bool,
}

impl RunConfig {
    /// The run a seed alone names: 2 to 5 processes, 1 to 3 members, 3 to 8 s of virtual
    /// time, faults on. A sweep prints only seeds; this gives back the rest.
    ///
    /// ```
    /// let config = etcd_sync::testing::sim::RunConfig::from_seed(17);
    /// assert_eq!(config.seed, 17);
    /// ```
    pub fn from_seed(seed: u64) -> RunConfig {
        let mut rng = Rng(seed ^ 0x5eed);
        RunConfig {
            seed,
            processes: 2 + rng.below(4) as usize,
            members: 1 + rng.below(3) as usize,
            duration: Duration::from_secs(3 + rng.below(6)),
            faults: true,
            mutation: None,
            leader_loops: seed % 11 == 3,
            multi_locks: matches!(seed % 7, 3 | 6),
            downgrades: matches!(seed % 15, 3 | 11 | 12),
            line_tuning: LineTuning::default(),
            clock_rates: CLOCK_RATES,
            deadlock_detection: false,
            handovers: matches!(seed % 13, 3 | 12),
            handover_faults: false,
        }
    }
}

/// [`RunConfig::clock_rates`] by default: clocks within 10 % of etcd's.
const CLOCK_RATES: (f64, f64) = (0.9, 1.1);

impl Default for RunConfig {
    fn default() -> RunConfig {
        RunConfig {
            seed: 1,
            processes: 3,
            members: 3,
            duration: Duration::from_secs(10),
            faults: true,
            mutation: None,
            leader_loops: true,
            multi_locks: true,
            downgrades: true,
            line_tuning: LineTuning::default(),
            clock_rates: CLOCK_RATES,
            deadlock_detection: false,
            handovers: true,
            handover_faults: false,
        }
    }
}

/// What a run saw.
///
/// ```no_run
/// let outcome = etcd_sync::testing::sim::run(&Default::default())?;
/// assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The run's trace: one line per acquisition, release, loss, error and fault, with its
    /// virtual time.
    pub trace: Vec<String>,
    /// A hash of `trace` (equal for two runs of one seed).
    pub trace_hash: u64,
    /// Broken invariants, each with its virtual time (empty: none).
    pub violations: Vec<String>,
    /// Guards that `lock` returned.
    pub acquisitions: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Virtual time the run took.
    pub virtual_time: Duration,
    /// Watchers of the processes' clients that were told their resume revision was
    /// compacted.
    pub compacted_watchers: u64,
    /// Progress notifications the cluster sent to the processes' watchers.
    pub progress_notifications: u64,
    /// Holders asked to let go (`Client::request_release`), and requests they heard.
    pub requests_asked: u64,
    /// Requests that listening holders heard.
    pub requests_heard: u64,
    /// Multi-lock holds (both names), and those joined in one Txn (one fencing token).
    pub multi_locks: u64,
    /// Of [`multi_locks`](Self::multi_locks), those whose keys share one create revision.
    pub multi_locks_in_one_txn: u64,
    /// Leaderships handed over to a waiting candidate ([`RunConfig::handovers`]).
    pub handovers: u64,
    /// Hand-overs begun in a calm cluster to a candidate waiting with time to spare, which
    /// must not run out of their limit (the simulation's `late` judge).
    pub handovers_owed_in_time: u64,
    /// Waits that started at the back of a line, on a lookout key (none with the default
    /// widths: the simulation's lines are short; [`RunConfig::line_tuning`] narrows the
    /// front).
    /// Counted process-wide: exact when no other run overlaps this one.
    pub back_waits: u64,
    /// Of those, reads of the lookout's start gap, made when due (see `line/behind/`).
    pub gap_reads: u64,
    /// Every single-name hold's operations, in the run's order, for a check from outside
    /// (issue 52: `tests/fenced/`).
    pub history: Vec<Operation>,
}

/// splitmix64: small, fast, and the same everywhere.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to.saturating_sub(from) + 1))
    }
}

/// A process that holds.
#[derive(Debug, Clone)]
struct Held {
    name: &'static str,
    key: String,
    token: i64,
    kind: kinds::Kind,
}

/// A process inside a wait.
#[derive(Debug, Clone)]
struct Waiting {
    lease: i64,
    kind: kinds::Kind,
    since: Instant,
    limit: Duration,
    /// Its lock-delay: after a holder's lease ended, the wait holds off that long.
    delay: Duration,
    /// Since when its key holds in the store (its turn has come), as the liveness monitor
    /// last saw.
    admitted_since: Option<Instant>,
    /// Whether a cancel token may end it before its limit.
    cancellable: bool,
}

/// The run's shared record.
#[derive(Debug, Default)]
struct Log {
    outcome: Outcome,
    /// By process and name (a multi-lock holds several names).
    holders: BTreeMap<(usize, &'static str), Held>,
    waiting: BTreeMap<usize, Waiting>,
    /// The last fencing token of each name whose holders exclude each other.
    last_token: BTreeMap<&'static str, i64>,
    /// The fencing token of the last leadership returned per name and its key's create
    /// revision: each must exceed the one before, or equal it for the same key (a resumed
    /// lease's re-campaign).
    last_term: BTreeMap<&'static str, (i64, i64)>,
    /// When each process last restarted (resumed its lease with a new client), and the
    /// store's revision then.
    restarted: BTreeMap<usize, (Instant, i64)>,
    /// Release requests asked and heard (`requests.rs`).
    requests: requests::Requests,
    /// The last position given to a call or a return of [`Outcome::history`].
    clock: u64,
    /// By lease, the last position at which a guard of it held (`history.rs`).
    alive: BTreeMap<i64, u64>,
    /// The candidate keys a hand-over was ever asked for (`handover.rs`).
    asked: std::collections::BTreeSet<Vec<u8>>,
}

struct World {
    cluster: SimCluster,
    log: Mutex<Log>,
    start: Instant,
    stop: AtomicBool,
    running: AtomicUsize,
    /// Since when no fault has been in progress (`None`: one is). Liveness is owed only
    /// from there on.
    calm_since: Mutex<Option<Instant>>,
    /// When the nemesis last deleted lock keys (an operator delete, a revoked lease).
    deleted_at: Mutex<Option<Instant>>,
    /// When the last fault that can fail or slow a request ended (all but an operator's
    /// delete or revoke): a lock-delay's lease readings may have failed until then.
    impaired_until: Mutex<Option<Instant>>,
    /// When a lagging member last caught up (its late events may still be on their way).
    caught_up_at: Mutex<Option<Instant>>,
    /// Whether processes ask holders to let go in this run (a third of the seeds, none of
    /// those pinned before requests existed, whose schedules stay as they were).
    asking: bool,
    /// Whether a quarter of the campaigns run a leader loop ([`RunConfig::leader_loops`]).
    leader_loops: bool,
    /// Whether a quarter of the steps take two names at once ([`RunConfig::multi_locks`]).
    multi_locks: bool,
    /// [`RunConfig::downgrades`].
    downgrades: bool,
    /// [`RunConfig::line_tuning`].
    line_tuning: LineTuning,
    /// [`RunConfig::clock_rates`].
    clock_rates: (f64, f64),
    /// [`RunConfig::deadlock_detection`].
    deadlock_detection: bool,
    /// [`RunConfig::handovers`].
    handovers: bool,
    /// [`RunConfig::handover_faults`], and a hand-over's start (told to the nemesis if it
    /// waits for one).
    handover_faults: (bool, tokio::sync::Notify),
}

impl World {
    fn now_ms(&self) -> u128 {
        Instant::now().duration_since(self.start).as_millis()
    }

    fn note(&self, who: &str, what: String) {
        let line = format!("{:>7} {who} {what}", self.now_ms());
        // In the crate's debug log too (ETCD_SYNC_SIM_LOG), among what caused it.
        tracing::debug!(target: "etcd_sync::sim", "{line}");
        self.log().outcome.trace.push(line);
    }

    fn violation(&self, who: &str, what: String) {
        let line = format!("{:>7} {who} {what}", self.now_ms());
        let mut log = self.log();
        log.outcome.trace.push(format!("VIOLATION {line}"));
        log.outcome.violations.push(line);
    }

    /// A fault begins (`false`) or ends (`true`).
    fn calm(&self, calm: bool) {
        *self.calm_since.lock().unwrap_or_else(|e| e.into_inner()) = calm.then(Instant::now);
    }

    /// A fault that can fail or slow requests ended just now.
    fn impaired(&self) {
        *self
            .impaired_until
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    fn impaired_until(&self) -> Option<Instant> {
        *self
            .impaired_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The nemesis deleted lock keys just now.
    fn deleted(&self) {
        *self.deleted_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// A lagging member stopped lagging just now.
    fn caught_up(&self) {
        *self.caught_up_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Whether a wait may have been decided on a lagging member's late events: one lagged
    /// within [`CAUSE_WINDOW`].
    fn lag_recent(&self) -> bool {
        self.caught_up_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| Instant::now().duration_since(at) <= CAUSE_WINDOW)
    }

    /// Whether a lock key going now has a cause outside the processes: the nemesis deleted
    /// keys within [`CAUSE_WINDOW`].
    fn deletion_explained(&self) -> bool {
        self.deleted_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| Instant::now().duration_since(at) <= CAUSE_WINDOW)
    }

    /// Whether a wait of process `p` for `what` losing its key has a cause outside it: the
    /// nemesis deleted keys, or (a campaign's) `p` restarted within [`CAUSE_WINDOW`]: its
    /// campaign adopts the key an earlier life left under its lease, which that life's
    /// removal, on its way when it crashed, may delete late (the documented limit of
    /// [`World::inherited`], for a wait; seed 1795789661116000).
    fn wait_loss_explained(&self, p: usize, what: kinds::Kind) -> bool {
        self.deletion_explained()
            || (what == kinds::Kind::Lead
                && self
                    .log()
                    .restarted
                    .get(&p)
                    .is_some_and(|(at, _)| Instant::now().duration_since(*at) <= CAUSE_WINDOW))
    }

    /// Whether `token` is a key of an earlier life of process `p` (created before its
    /// last restart, within [`CAUSE_WINDOW`]) that it adopted: a removal or resignation
    /// of that life still on its way when it crashed may apply to it, late.
    fn inherited(&self, p: usize, token: i64) -> bool {
        self.log().restarted.get(&p).is_some_and(|(at, rev)| {
            token <= *rev && Instant::now().duration_since(*at) <= CAUSE_WINDOW
        })
    }

    fn calm_since(&self) -> Option<Instant> {
        *self.calm_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Sleeps `duration` of the run's virtual time, on a simulated process's thread (a real
/// sleep anywhere else).
///
/// ```
/// etcd_sync::testing::sim::sleep(std::time::Duration::from_millis(1));
/// ```
pub fn sleep(duration: Duration) {
    match simulated::current() {
        Some(sim) => {
            let _ = sim.block_on(tokio::time::sleep(duration));
        }
        None => std::thread::sleep(duration),
    }
}

/// Runs one simulated schedule.
///
/// # Errors
///
/// The runtime or a process thread could not be started.
///
/// ```no_run
/// use etcd_sync::testing::sim::{run, RunConfig};
/// let a = run(&RunConfig { seed: 42, ..Default::default() })?;
/// let b = run(&RunConfig { seed: 42, ..Default::default() })?;
/// assert_eq!(a.trace_hash, b.trace_hash);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn run(config: &RunConfig) -> std::io::Result<Outcome> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all().start_paused(true);
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(
        &config.seed.to_le_bytes(),
    ));
    let runtime = builder.build()?;
    let config = config.clone();
    seam::set(config.mutation);
    // Retry pauses without jitter, on the runtime's thread (this one) and on each
    // process's: the schedules, and the seeds pinned for them, stay as they were.
    backoff::without_jitter();
    let back_counts = || (seam::marked(Mark::BackWait), seam::marked(Mark::GapRead));
    let back_before = back_counts();
    let outcome = runtime.block_on(async move {
        let sim = Simulation::new(tokio::runtime::Handle::current());
        let world = Arc::new(World {
            cluster: SimCluster::start_here(config.members)?,
            log: Mutex::new(Log::default()),
            start: Instant::now(),
            stop: AtomicBool::new(false),
            running: AtomicUsize::new(config.processes),
            calm_since: Mutex::new(Some(Instant::now())),
            deleted_at: Mutex::new(None),
            impaired_until: Mutex::new(None),
            caught_up_at: Mutex::new(None),
            asking: matches!(config.seed % 9, 5 | 6 | 8),
            leader_loops: config.leader_loops,
            multi_locks: config.multi_locks,
            downgrades: config.downgrades,
            line_tuning: config.line_tuning,
            clock_rates: config.clock_rates,
            deadlock_detection: config.deadlock_detection,
            handovers: config.handovers,
            handover_faults: (config.handover_faults, tokio::sync::Notify::new()),
        });
        // A third of the runs have etcd send progress notifications (production clusters
        // that set the interval, as Kubernetes asks): a quiet watcher's resume revision
        // then moves on without events. Drawn apart from the workload's choices.
        let mut cluster_rng = Rng(config.seed ^ 0x0070_7267);
        if cluster_rng.below(3) == 0 {
            world
                .cluster
                .set_progress_interval(Some(cluster_rng.millis(200, 2000)));
        }
        // Half the runs are a server with etcd #18089 (a delete at exactly the compact
        // revision lost to a watcher that starts there), half one without.
        world
            .cluster
            .set_keeps_compacted_tombstones(cluster_rng.below(2) == 0);
        let mut rng = Rng(config.seed);
        for p in 0..config.processes {
            let world = world.clone();
            let seed = rng.next();
            sim.spawn_process(format!("sim-p{p}"), move || {
                backoff::without_jitter();
                process(&world, p, seed);
                world.running.fetch_sub(1, Ordering::SeqCst);
            })?;
        }
        let watching = tokio::spawn(liveness(world.clone()));
        let until = world.start + config.duration;
        if config.faults {
            nemesis(&world, &mut rng, until).await;
        } else {
            tokio::time::sleep_until(until).await;
        }
        world.stop.store(true, Ordering::SeqCst);
        // Every process ends its step: waits are bounded, so this takes bounded time.
        let give_up = Instant::now() + Duration::from_secs(60);
        while world.running.load(Ordering::SeqCst) > 0 && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let stuck = world.running.load(Ordering::SeqCst);
        if stuck > 0 {
            world.violation(
                "run",
                format!("{stuck} process(es) still busy 60 s after the end"),
            );
        } else {
            // Every process closed its session (or lost it): once a lease's TTL has run out
            // too, nothing of theirs is left.
            tokio::time::sleep(LEFT_BEHIND_AFTER).await;
            let prefixes = kinds::Kind::NAMES
                .iter()
                .flat_map(|name| [format!("{name}/"), format!("{name}.revoke/")]);
            for prefix in prefixes {
                let left = world.cluster.keys(&prefix);
                if !left.is_empty() {
                    world.violation(
                        "run",
                        format!("left behind after every session ended: {left:?}"),
                    );
                }
            }
        }
        watching.abort();
        sim.close();
        let mut log = world.log();
        log.outcome.virtual_time = Instant::now().duration_since(world.start);
        log.outcome.compacted_watchers = world.cluster.compacted_watchers();
        log.outcome.progress_notifications = world.cluster.progress_notifications();
        let outcome = std::mem::take(&mut log.outcome);
        Ok::<Outcome, std::io::Error>(outcome)
    })?;
    drop(runtime);
    seam::set(None);
    let mut outcome = outcome;
    let back_after = back_counts();
    outcome.back_waits = back_after.0 - back_before.0;
    outcome.gap_reads = back_after.1 - back_before.1;
    let mut hasher = std::hash::DefaultHasher::new();
    outcome.trace.hash(&mut hasher);
    outcome.trace_hash = hasher.finish();
    Ok(outcome)
}

mod downgrade;
mod handover;
mod history;
mod holding;
mod judge;
mod kinds;
mod leader_loop;
mod liveness;
mod multi;
mod nemesis;
mod process;
mod requests;
mod session_end;
use liveness::liveness;
use nemesis::nemesis;
use process::process;
