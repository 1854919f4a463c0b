//! The contender-count rows (issue 28): the mutex at each count of `--rows` (default 8, 64,
//! 256 and 1,024 contenders, each with its own client and session, as a process would
//! have; the clients share the process's runtime thread, as the other drivers' clients
//! share their runtime, or with `--own-runtimes` each has one of its own), then a semaphore (`--rows`' largest count of workers, `SEM_PERMITS` permits) and
//! the read-write lock row ([`crate::readers`]).
//!
//! Each row: every contender loops lock → count itself in → unlock. The first `N`
//! acquisitions (every contender has had a turn and queued again) are a warm-up; then a
//! window of `--total` acquisitions, or `--row-secs`, whichever comes first, is measured:
//! acquisitions/s, the handoff (release start → the next holder's lock returns) median and
//! p99, and etcd's work per acquisition read from its /metrics at both ends of the window:
//! watch events delivered (each acquisition has exactly one release, so this is the events
//! per release), watch responses sent, Range and Txn, and etcd's CPU time. Then every
//! waiter is cancelled and the contenders are closed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex as StdMutex};
use std::thread;
use std::time::{Duration, Instant};

use etcd_sync::{CancelToken, WaitOptions};

use crate::args::Args;
use crate::fleet::{ROW_WAIT, WORKER_STACK, Window, close_many, connect_many, quiesce, window};
use crate::metrics::watchers;
use crate::stats::{Summary, report};
use crate::turns::locked;
use crate::{Res, WAIT, join_bounded};

/// Permits of the semaphore row.
pub const SEM_PERMITS: u32 = 8;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Mutex,
    Semaphore,
}

/// What the workers of one row share.
struct Shared {
    count: AtomicU64,
    /// Holders inside now (more than allowed: a violation).
    inside: AtomicUsize,
    violations: AtomicU64,
    releases: StdMutex<Releases>,
    /// (acquisition number, handoff latency).
    handoffs: StdMutex<Vec<(u64, Duration)>>,
    errors: StdMutex<Vec<String>>,
    error_count: AtomicU64,
    stop: AtomicBool,
    token: CancelToken,
}

/// Release starts, for the handoff latencies.
#[derive(Default)]
struct Releases {
    /// Mutex: the last release start and who released.
    last: Option<(Instant, usize)>,
    /// Semaphore: release starts not yet matched with an admission, oldest first (each
    /// admission takes the oldest).
    pending: VecDeque<Instant>,
}

/// What one row measured.
struct Row {
    window: Window,
    handoffs: Vec<Duration>,
    violations: u64,
    errors: Vec<String>,
    error_count: u64,
    setup: Duration,
}

fn run_row(args: &Args, kind: Kind, n: usize, name: &str) -> Res<Row> {
    let t = Instant::now();
    let contenders = connect_many(args, n)?;
    let setup = t.elapsed();
    let shared = Arc::new(Shared {
        count: AtomicU64::new(0),
        inside: AtomicUsize::new(0),
        violations: AtomicU64::new(0),
        releases: StdMutex::new(Releases::default()),
        handoffs: StdMutex::new(Vec::new()),
        errors: StdMutex::new(Vec::new()),
        error_count: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        token: CancelToken::new(),
    });
    let allowed = match kind {
        Kind::Mutex => 1,
        Kind::Semaphore => SEM_PERMITS as usize,
    };
    let barrier = Arc::new(Barrier::new(n + 1));
    let mut threads = Vec::with_capacity(n);
    let mut spawn_error = None;
    for (me, c) in contenders.iter().enumerate() {
        // One handle per contender, kept for the whole row (as an application would).
        let handle = match kind {
            Kind::Mutex => c.session.mutex(name).map(Handle::Mutex),
            Kind::Semaphore => c
                .session
                .semaphore(name, SEM_PERMITS)
                .map(Handle::Semaphore),
        };
        let handle = match handle {
            Ok(h) => h,
            Err(e) => {
                spawn_error = Some(e.to_string());
                break;
            }
        };
        let (shared, barrier) = (shared.clone(), barrier.clone());
        let spawned = thread::Builder::new()
            .name(format!("row-{me}"))
            .stack_size(WORKER_STACK)
            .spawn(move || worker(me, kind, allowed, handle, &shared, &barrier));
        match spawned {
            Ok(h) => threads.push(h),
            Err(e) => {
                spawn_error = Some(format!("spawning worker {me}: {e}"));
                break;
            }
        }
    }
    if let Some(e) = spawn_error {
        // The workers already started wait at the barrier: let them through and stop them.
        shared.stop.store(true, Ordering::SeqCst);
        shared.token.cancel();
        let missing = n - threads.len();
        for _ in 0..missing {
            let b = barrier.clone();
            thread::spawn(move || b.wait());
        }
        barrier.wait();
        join_bounded(threads, Instant::now() + WAIT * 2);
        close_many(contenders);
        return Err(e.into());
    }
    barrier.wait();
    let failed = || shared.error_count.load(Ordering::SeqCst) > 0;
    let measured = window(
        &args.endpoints[0],
        &shared.count,
        n as u64,
        args.total as u64,
        args.row_time,
        &failed,
    );
    // Stop: holders see `stop` and release, waiters are cancelled (their keys removed).
    shared.stop.store(true, Ordering::SeqCst);
    shared.token.cancel();
    let left = join_bounded(threads, Instant::now() + WAIT * 2);
    close_many(contenders);
    let window = measured?;
    if left > 0 {
        locked(&shared.errors).push(format!("{left} workers still running at the deadline"));
    }
    let handoffs = locked(&shared.handoffs)
        .iter()
        .filter(|(c, _)| window.contains(*c))
        .map(|(_, d)| *d)
        .collect();
    let errors = std::mem::take(&mut *locked(&shared.errors));
    Ok(Row {
        window,
        handoffs,
        violations: shared.violations.load(Ordering::SeqCst),
        error_count: shared.error_count.load(Ordering::SeqCst) + left as u64,
        errors,
        setup,
    })
}

enum Handle {
    Mutex(etcd_sync::Mutex),
    Semaphore(etcd_sync::Semaphore),
}

fn worker(
    me: usize,
    kind: Kind,
    allowed: usize,
    handle: Handle,
    shared: &Shared,
    barrier: &Barrier,
) {
    barrier.wait();
    let options = WaitOptions::new()
        .timeout(ROW_WAIT)
        .cancel_token(&shared.token);
    while !shared.stop.load(Ordering::SeqCst) {
        let guard: Result<Box<dyn std::any::Any>, etcd_sync::Error> = match &handle {
            Handle::Mutex(m) => m.lock_with(options.clone()).map(|g| Box::new(g) as _),
            Handle::Semaphore(s) => s.acquire_with(options.clone()).map(|g| Box::new(g) as _),
        };
        let guard = match guard {
            Ok(g) => g,
            Err(_) if shared.stop.load(Ordering::SeqCst) => return,
            Err(e) => {
                shared.error_count.fetch_add(1, Ordering::SeqCst);
                let mut errors = locked(&shared.errors);
                if errors.len() < 10 {
                    errors.push(format!("worker {me}: {e}"));
                }
                return;
            }
        };
        let acquired = Instant::now();
        if shared.stop.load(Ordering::SeqCst) {
            return; // drops the guard
        }
        if shared.inside.fetch_add(1, Ordering::SeqCst) + 1 > allowed {
            shared.violations.fetch_add(1, Ordering::SeqCst);
        }
        let c = shared.count.fetch_add(1, Ordering::SeqCst) + 1;
        let handoff = {
            let mut releases = locked(&shared.releases);
            match kind {
                Kind::Mutex => match releases.last {
                    Some((at, who)) if who != me => Some(acquired.saturating_duration_since(at)),
                    _ => None,
                },
                Kind::Semaphore => releases
                    .pending
                    .pop_front()
                    .map(|at| acquired.saturating_duration_since(at)),
            }
        };
        if let Some(h) = handoff {
            locked(&shared.handoffs).push((c, h));
        }
        shared.inside.fetch_sub(1, Ordering::SeqCst);
        {
            let mut releases = locked(&shared.releases);
            let now = Instant::now();
            match kind {
                Kind::Mutex => releases.last = Some((now, me)),
                Kind::Semaphore => releases.pending.push_back(now),
            }
        }
        drop(guard);
    }
}

/// Prints one row's `RESULT` line (`figure` is `row_mutex` or `row_semaphore`).
fn print_row(figure: &str, count_field: &str, row: &Row) -> Option<crate::stats::Stats> {
    let w = &row.window;
    let per = w.after.per_op_since(&w.before, w.acquisitions() as f64);
    let st = report(
        &format!("{figure}_handoff_{}", count_field.replace(['=', ' '], "_")),
        &row.handoffs,
        count_field,
    );
    let (median, p90, p99) =
        st.map_or((f64::NAN, f64::NAN, f64::NAN), |s| (s.median, s.p90, s.p99));
    println!(
        "RESULT rust {figure} {count_field} throughput_acq_s={:.1} acquisitions={} \
         window_ms={} window_timed_out={} handoff_median_us={median:.0} \
         handoff_p90_us={p90:.0} handoff_p99_us={p99:.0} handoffs={} {} violations={} \
         errors={} setup_ms={}",
        w.throughput(),
        w.acquisitions(),
        (w.end - w.start).as_millis(),
        w.timed_out,
        row.handoffs.len(),
        per.fields("acq"),
        row.violations,
        row.error_count,
        row.setup.as_millis(),
    );
    for e in &row.errors {
        eprintln!("compare: {figure} {count_field}: {e}");
    }
    st
}

/// The phase: one mutex row per count of `--rows`, the semaphore row and the rwlock row.
pub fn rows(args: &Args, summary: &mut Summary) -> Res<()> {
    let endpoint = &args.endpoints[0];
    let base = watchers(endpoint)?.unwrap_or(0.0);
    let settle = |what: &str| {
        let waited = quiesce(endpoint, base, WAIT * 2);
        eprintln!(
            "compare: rows: etcd quiet {:.1} s after the {what}",
            waited.as_secs_f64()
        );
    };
    let mut bad = Vec::new();
    let mut first_median = None;
    for &n in &args.rows {
        eprintln!("compare: rows: mutex, {n} contenders ...");
        let row = run_row(args, Kind::Mutex, n, &format!("{}/row-{n}", args.prefix))?;
        settle(&format!("{n}-contender row"));
        let st = print_row("row_mutex", &format!("contenders={n}"), &row);
        let w = &row.window;
        let per = w.after.per_op_since(&w.before, w.acquisitions() as f64);
        let median = st.map_or(f64::NAN, |s| s.median);
        let base = *first_median.get_or_insert(median);
        summary.text(format!(
            "row: {n} contenders (own client + session each, {}): {:.0} acq/s, handoff median \
             {median:.0} µs ({:.2}x the {}-contender row), {:.2} watch events, {:.3} Range, \
             {:.2} Txn and {:.0} µs of etcd CPU per acquisition",
            if args.own_runtimes {
                "a runtime thread each"
            } else {
                "one shared runtime thread"
            },
            w.throughput(),
            median / base,
            args.rows[0],
            per.events,
            per.range,
            per.txn,
            per.cpu_us
        ));
        if row.violations + row.error_count > 0 {
            bad.push(format!(
                "mutex row {n}: {} violations, {} errors",
                row.violations, row.error_count
            ));
        }
    }
    if let Some(&n) = args.rows.iter().max() {
        eprintln!("compare: rows: semaphore of {SEM_PERMITS}, {n} workers ...");
        let row = run_row(
            args,
            Kind::Semaphore,
            n,
            &format!("{}/row-sem-{n}", args.prefix),
        )?;
        settle("semaphore row");
        print_row(
            "row_semaphore",
            &format!("workers={n} permits={SEM_PERMITS}"),
            &row,
        );
        let w = &row.window;
        let per = w.after.per_op_since(&w.before, w.acquisitions() as f64);
        summary.text(format!(
            "row: semaphore of {SEM_PERMITS}, {n} workers: {:.0} acq/s, {:.2} watch events, \
             {:.3} Range and {:.0} µs of etcd CPU per acquisition",
            w.throughput(),
            per.events,
            per.range,
            per.cpu_us
        ));
        if row.violations + row.error_count > 0 {
            bad.push(format!(
                "semaphore row: {} violations, {} errors",
                row.violations, row.error_count
            ));
        }
        eprintln!("compare: rows: rwlock, {n} readers behind a writer ...");
        if let Err(e) = crate::readers::readers(args, n, summary) {
            bad.push(format!("rwlock row: {e}"));
        }
    }
    settle("read-write lock row");
    if !bad.is_empty() {
        return Err(bad.join("; ").into());
    }
    Ok(())
}
