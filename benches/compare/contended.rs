//! (b): contended, one client + session per thread; and the slow-handoff diagnosis (a
//! shorter contended run while etcd's unsynced-watcher gauge is sampled).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex as StdMutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::handoff_floor::over_floor;
use crate::metrics::{Counters, counters, unsynced_watchers};
use crate::stats::{Summary, report, tail};
use crate::turns::{Turns, locked};
use crate::{Res, WAIT, connect, join_bounded, join_bounded_value};

/// What one contended run measured.
struct Contention {
    acquisitions: u64,
    elapsed: Duration,
    violations: u64,
    per_worker: Vec<u64>,
    handoffs: Vec<Duration>,
    waits: Vec<Duration>,
    errors: Vec<String>,
    /// etcd's request counters over the run (`None` if /metrics could not be read).
    cost: Option<Counters>,
}

impl Contention {
    fn throughput(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// `contenders` threads, each with its own client and session, take `total` turns on one
/// lock named `name`.
fn contend(args: &Args, name: &str, contenders: usize, total: usize) -> Res<Contention> {
    let mut workers = Vec::new();
    for _ in 0..contenders {
        let client = connect(args)?;
        let session = client.session()?;
        let mutex = session.mutex(name)?;
        workers.push((client, session, mutex));
    }
    let turns = Arc::new(Turns::new());
    let count = Arc::new(AtomicU64::new(0));
    let handoffs = Arc::new(StdMutex::new(Vec::with_capacity(total)));
    let waits = Arc::new(StdMutex::new(Vec::with_capacity(total)));
    let end = Arc::new(StdMutex::new(None::<Instant>));
    let per_worker: Arc<Vec<AtomicU64>> =
        Arc::new((0..contenders).map(|_| AtomicU64::new(0)).collect());
    let barrier = Arc::new(Barrier::new(contenders + 1));
    let total = total as u64;

    let mut handles = Vec::new();
    for (me, (_client, _session, mutex)) in workers.iter().enumerate() {
        let mutex = mutex.clone();
        let (turns, count, handoffs, waits, end, per_worker, barrier) = (
            turns.clone(),
            count.clone(),
            handoffs.clone(),
            waits.clone(),
            end.clone(),
            per_worker.clone(),
            barrier.clone(),
        );
        handles.push(thread::spawn(move || {
            barrier.wait();
            while !turns.stop.load(Ordering::SeqCst) {
                let t0 = Instant::now();
                let guard = match mutex.lock_timeout(WAIT) {
                    Ok(g) => g,
                    Err(e) => return turns.error(format!("worker {me}: lock: {e}")),
                };
                let acquired = Instant::now();
                if count.load(Ordering::SeqCst) >= total {
                    // Done: pass the lock on without counting.
                    turns.stop.store(true, Ordering::SeqCst);
                    drop(guard);
                    return;
                }
                let handoff = turns.enter(me, guard.fencing_token(), acquired);
                let c = count.fetch_add(1, Ordering::SeqCst) + 1;
                if let Some(h) = handoff {
                    locked(&handoffs).push(h);
                }
                locked(&waits).push(acquired - t0);
                per_worker[me].fetch_add(1, Ordering::SeqCst);
                turns.leave(me);
                let result = guard.release();
                if c == total {
                    *locked(&end) = Some(Instant::now());
                }
                if let Err(e) = result {
                    return turns.error(format!("worker {me}: unlock: {e}"));
                }
            }
        }));
    }
    let before = counters(&args.endpoints[0]).ok();
    barrier.wait();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(60) + WAIT * 2;
    let left = join_bounded(handles, deadline);
    if left > 0 {
        turns.error(format!("{left} workers still running at the deadline"));
    }
    let end = locked(&end).unwrap_or_else(Instant::now);
    let after = counters(&args.endpoints[0]).ok();
    for (_client, session, _mutex) in &workers {
        let _ = session.close();
    }
    Ok(Contention {
        acquisitions: count.load(Ordering::SeqCst),
        elapsed: end - start,
        violations: turns.violations.load(Ordering::SeqCst),
        per_worker: per_worker
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect(),
        handoffs: std::mem::take(&mut *locked(&handoffs)),
        waits: std::mem::take(&mut *locked(&waits)),
        errors: turns.take_errors(),
        cost: before.zip(after).map(|(b, a)| a.minus(&b)),
    })
}

pub fn contended(args: &Args, summary: &mut Summary) -> Res<()> {
    let name = format!("{}/contended", args.prefix);
    let run = contend(args, &name, args.contenders, args.total)?;
    let split: Vec<String> = run.per_worker.iter().map(u64::to_string).collect();
    println!(
        "RESULT rust contended throughput_acq_s={:.0} acquisitions={} contenders={} \
         elapsed_ms={} violations={} per_worker={} errors={}",
        run.throughput(),
        run.acquisitions,
        args.contenders,
        run.elapsed.as_millis(),
        run.violations,
        split.join("/"),
        run.errors.len()
    );
    for e in &run.errors {
        eprintln!("contended: {e}");
    }
    if let Some(cost) = &run.cost {
        // Every request of the run (joins, waits, reads, releases) per acquisition.
        println!(
            "RESULT rust contended_cost {} n={}",
            cost.per_op(run.acquisitions as usize),
            run.acquisitions
        );
    }
    let h = report(
        "handoff",
        &run.handoffs,
        &format!("contenders={} {}", args.contenders, tail(&run.handoffs)),
    );
    report(
        "lock_wait",
        &run.waits,
        &format!("contenders={}", args.contenders),
    );
    summary.text(format!(
        "contended: {} threads (own client + session each), {} acquisitions in {:.2} s = \
         {:.0} acq/s, violations {}",
        args.contenders,
        run.acquisitions,
        run.elapsed.as_secs_f64(),
        run.throughput(),
        run.violations
    ));
    summary.latency("handoff (release start -> next lock returns)", h);
    summary.keep("handoff", h);
    summary
        .values
        .insert("contended_throughput".into(), run.throughput());
    if let Some(cost) = &run.cost {
        let per = |v: f64| v / (run.acquisitions.max(1) as f64);
        summary.values.insert(
            "contended_range".into(),
            per(Counters::get(&cost.handled, "Range")),
        );
        summary.values.insert(
            "contended_watch_streams".into(),
            per(Counters::get(&cost.started, "Watch")),
        );
    }
    over_floor(
        "handoff_over_floor",
        h,
        &format!("contenders={}", args.contenders),
        summary,
    );
    if !run.errors.is_empty() {
        return Err(format!("contended run had {} errors", run.errors.len()).into());
    }
    Ok(())
}

/// Diagnosis of slow handoffs, kept out of the headline figures because polling /metrics
/// costs etcd some CPU: a shorter contended run while a thread samples etcd's gauge of
/// unsynced ("slow") watchers every 20 ms. A waiter's watch is created "from now"; when it
/// lands in etcd's unsynced group anyway, its delete event waits for etcd's 100 ms
/// syncWatchersLoop, which shows as a handoff of tens of milliseconds.
pub fn diagnose(args: &Args, summary: &mut Summary) -> Res<()> {
    let endpoint = args.endpoints[0].clone();
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let stop = stop.clone();
        thread::spawn(move || {
            let (mut samples, mut unsynced, mut max) = (0u64, 0u64, 0f64);
            while !stop.load(Ordering::SeqCst) {
                if let Ok(Some(g)) = unsynced_watchers(&endpoint) {
                    samples += 1;
                    if g > 0.0 {
                        unsynced += 1;
                    }
                    max = max.max(g);
                }
                thread::sleep(Duration::from_millis(20));
            }
            (samples, unsynced, max)
        })
    };
    let total = (args.total / 4).max(100);
    let run = contend(
        args,
        &format!("{}/diagnose", args.prefix),
        args.contenders,
        total,
    );
    stop.store(true, Ordering::SeqCst);
    let (samples, unsynced, max) =
        join_bounded_value(poller, Instant::now() + WAIT).unwrap_or((0, 0, 0.0));
    let run = run?;
    println!(
        "RESULT rust diagnose_unsynced acquisitions={} contenders={} metric_samples={samples} \
         samples_with_unsynced_watchers={unsynced} max_unsynced_watchers={max:.0} {}",
        run.acquisitions,
        args.contenders,
        tail(&run.handoffs)
    );
    summary.text(format!(
        "diagnosis: unsynced watchers present in {unsynced} of {samples} /metrics samples \
         during a {}-acquisition contended run ({})",
        run.acquisitions,
        tail(&run.handoffs)
    ));
    Ok(())
}
