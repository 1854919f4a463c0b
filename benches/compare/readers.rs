//! The read-write lock row (issue 28): `n` readers, each with its own client and session,
//! queue behind one held write lock; the writer's release is measured alone: the time
//! until every reader's `read` returned (and the median reader), and what etcd did from
//! just before the release until `LINGER` after the last admission (watch events
//! delivered, watch responses, Range, Txn, CPU). `ROUNDS` rounds with the same clients (one above `LARGE`),
//! each measured once etcd is quiet again.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::thread;
use std::time::{Duration, Instant};

use etcd_sync::{CancelToken, WaitOptions};

use crate::args::Args;
use crate::fleet::{ROW_WAIT, WORKER_STACK, close_many, connect_many, quiesce};
use crate::metrics::{PerOp, snapshot};
use crate::stats::Summary;
use crate::turns::locked;
use crate::{Res, WAIT, connect, join_bounded};

/// Rounds up to 256 readers; above, one: between rounds every read release is delivered to
/// every reader's client (N² events), which at 1,024 readers on 2 cores starves keep-alives.
const ROUNDS: u64 = 3;
const LARGE: usize = 256;
/// After the last reader queued: past every reader's double check of a new watcher.
const SETTLE: Duration = Duration::from_millis(800);
/// After the last admission: time for stray reads or events to show in the counters.
const LINGER: Duration = Duration::from_millis(400);

struct Shared {
    /// The round the readers are to queue for (0: none yet).
    go: AtomicU64,
    /// The round whose read locks the readers are to give back.
    release: AtomicU64,
    admitted: AtomicUsize,
    released: AtomicUsize,
    failed: AtomicUsize,
    /// More than `LARGE` readers: one round.
    large: bool,
    admits: StdMutex<Vec<Instant>>,
    token: CancelToken,
}

fn wait_for(what: impl Fn() -> bool, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !what() {
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(1));
    }
    true
}

fn reader(handle: etcd_sync::RwLock, shared: &Shared) {
    let options = WaitOptions::new()
        .timeout(ROW_WAIT)
        .cancel_token(&shared.token);
    let rounds = if shared.large { 1 } else { ROUNDS };
    for round in 1..=rounds {
        while shared.go.load(Ordering::SeqCst) < round {
            if shared.token.is_cancelled() {
                return;
            }
            thread::sleep(Duration::from_millis(2));
        }
        let guard = match handle.read_with(options.clone()) {
            Ok(g) => g,
            Err(_) => {
                shared.failed.fetch_add(1, Ordering::SeqCst);
                return;
            }
        };
        locked(&shared.admits).push(Instant::now());
        shared.admitted.fetch_add(1, Ordering::SeqCst);
        while shared.release.load(Ordering::SeqCst) < round && !shared.token.is_cancelled() {
            thread::sleep(Duration::from_millis(2));
        }
        drop(guard);
        shared.released.fetch_add(1, Ordering::SeqCst);
    }
}

/// One writer release with `n` readers queued: (all admitted after, median reader, cost).
struct Round {
    all: Duration,
    median: Duration,
    admitted: usize,
    cost: PerOp,
}

pub fn readers(args: &Args, n: usize, summary: &mut Summary) -> Res<()> {
    let name = format!("{}/row-rw-{n}", args.prefix);
    let owner = connect(args)?;
    let writer_session = owner.session()?;
    let writer = writer_session.rwlock(&name)?;
    let t = Instant::now();
    let contenders = connect_many(args, n)?;
    let setup = t.elapsed();
    let shared = Arc::new(Shared {
        go: AtomicU64::new(0),
        release: AtomicU64::new(0),
        admitted: AtomicUsize::new(0),
        released: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
        large: n > LARGE,
        admits: StdMutex::new(Vec::new()),
        token: CancelToken::new(),
    });
    let mut threads = Vec::with_capacity(n);
    let mut result: Res<Vec<Round>> = Ok(Vec::new());
    for (i, c) in contenders.iter().enumerate() {
        let handle = match c.session.rwlock(&name) {
            Ok(h) => h,
            Err(e) => {
                result = Err(e.into());
                break;
            }
        };
        let shared = shared.clone();
        match thread::Builder::new()
            .name(format!("reader-{i}"))
            .stack_size(WORKER_STACK)
            .spawn(move || reader(handle, &shared))
        {
            Ok(h) => threads.push(h),
            Err(e) => {
                result = Err(format!("spawning reader {i}: {e}").into());
                break;
            }
        }
    }
    if result.is_ok() {
        result = rounds(args, &owner, &writer, &name, n, &shared);
    }
    shared.token.cancel();
    let left = join_bounded(threads, Instant::now() + WAIT * 2);
    close_many(contenders);
    let _ = writer_session.close();
    let rounds = result?;
    if left > 0 {
        return Err(format!("{left} readers still running at the deadline").into());
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut all: Vec<f64> = rounds.iter().map(|r| ms(r.all)).collect();
    all.sort_by(f64::total_cmp);
    let mean = |f: fn(&PerOp) -> f64| {
        rounds.iter().map(|r| f(&r.cost)).sum::<f64>() / rounds.len().max(1) as f64
    };
    let cost = PerOp {
        txn: mean(|c| c.txn),
        range: mean(|c| c.range),
        events: mean(|c| c.events),
        watch_msgs_sent: mean(|c| c.watch_msgs_sent),
        watch_streams: mean(|c| c.watch_streams),
        cpu_us: mean(|c| c.cpu_us),
    };
    let admitted: Vec<String> = rounds.iter().map(|r| r.admitted.to_string()).collect();
    let each: Vec<String> = all.iter().map(|a| format!("{a:.1}")).collect();
    let medians: Vec<String> = rounds
        .iter()
        .map(|r| format!("{:.1}", ms(r.median)))
        .collect();
    println!(
        "RESULT rust row_rwlock readers={n} rounds={} admit_all_ms={:.1} \
         admit_all_ms_each={} admit_median_ms_each={} admitted={} {} setup_ms={}",
        rounds.len(),
        all[all.len() / 2],
        each.join("/"),
        medians.join("/"),
        admitted.join("/"),
        cost.fields("release"),
        setup.as_millis()
    );
    summary.text(format!(
        "row: rwlock, {n} readers behind a writer: its release admitted {} readers, all of \
         them in {} ms; {:.1} watch events, {:.2} Range, {:.0} µs of etcd CPU per release",
        admitted.join("/"),
        each.join("/"),
        cost.events,
        cost.range,
        cost.cpu_us
    ));
    if rounds.iter().any(|r| r.admitted != n) {
        return Err(format!("a release admitted {} of {n} readers", admitted.join("/")).into());
    }
    Ok(())
}

fn rounds(
    args: &Args,
    owner: &etcd_sync::Client,
    writer: &etcd_sync::RwLock,
    name: &str,
    n: usize,
    shared: &Shared,
) -> Res<Vec<Round>> {
    let endpoint = &args.endpoints[0];
    let mut out = Vec::new();
    for round in 1..=if shared.large { 1 } else { ROUNDS } {
        let w = writer.write_timeout(WAIT)?;
        shared.admitted.store(0, Ordering::SeqCst);
        shared.released.store(0, Ordering::SeqCst);
        locked(&shared.admits).clear();
        shared.go.store(round, Ordering::SeqCst);
        let deadline = Instant::now() + WAIT * 2;
        // A read can time out while etcd delivers a storm of events: retried until the deadline.
        while owner
            .get_prefix(format!("{name}/"))
            .map_or(0, |kvs| kvs.len())
            < n + 1
        {
            if Instant::now() > deadline || shared.failed.load(Ordering::SeqCst) > 0 {
                return Err(format!("round {round}: not all {n} readers queued").into());
            }
            thread::sleep(Duration::from_millis(50));
        }
        thread::sleep(SETTLE);
        // The previous round's read releases, each delivered to every reader's client.
        let waited = quiesce(endpoint, f64::INFINITY, WAIT * 2);
        eprintln!(
            "compare: rows: rwlock round {round}: {n} readers queued, etcd quiet after {:.1} s",
            waited.as_secs_f64()
        );
        let before = snapshot(endpoint)?;
        let t0 = Instant::now();
        drop(w);
        wait_for(|| shared.admitted.load(Ordering::SeqCst) >= n, WAIT);
        thread::sleep(LINGER);
        let after = snapshot(endpoint)?;
        let mut admits: Vec<Duration> = locked(&shared.admits)
            .iter()
            .map(|a| a.saturating_duration_since(t0))
            .collect();
        admits.sort();
        let admitted = admits.len();
        out.push(Round {
            all: admits.last().copied().unwrap_or(WAIT),
            median: admits.get(admitted / 2).copied().unwrap_or(WAIT),
            admitted,
            cost: after.per_op_since(&before, 1.0),
        });
        shared.release.store(round, Ordering::SeqCst);
        if !wait_for(|| shared.released.load(Ordering::SeqCst) >= admitted, WAIT) {
            return Err(format!("round {round}: readers did not give their locks back").into());
        }
        // Each read release reaches every reader's client: let etcd deliver them first.
        quiesce(endpoint, f64::INFINITY, WAIT * 2);
    }
    Ok(out)
}
