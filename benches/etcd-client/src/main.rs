//! The `etcd-client` column of `scripts/bench-compare`: the same figures as etcd-sync's
//! driver (`benches/compare/`), measured with the async `etcd-client` crate, whose `lock`
//! and `unlock` call etcd's server-side Lock service (v3lock). Prints `RESULT etcdclient
//! <figure> key=value...` lines in the format the script's table reads.
//!
//! - uncontended `lock` + `unlock` on one lease, interleaved with its floor: the acquire
//!   and release transactions etcd-sync sends, here sent through `etcd-client`'s raw
//!   `txn` (a cross-check of etcd-sync's own floor, which goes through `Client::txn`);
//! - a linearizable `get`, the raw client call;
//! - `--contenders` tasks, each with its own client and lease, taking `--total` turns on
//!   one lock: throughput, handoff latency (release start → next `lock` returns), and
//!   mutual-exclusion violations seen by a shared holder count.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use etcd_client::{Client, Compare, CompareOp, GetOptions, LockOptions, PutOptions, Txn, TxnOp};
use tokio::sync::Mutex;

mod rows;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser)]
struct Args {
    /// etcd endpoint, e.g. http://127.0.0.1:2379
    #[arg(long)]
    endpoints: String,
    /// Samples per uncontended figure
    #[arg(long, default_value_t = 1000)]
    n: usize,
    /// Contending tasks, each with its own client and lease
    #[arg(long, default_value_t = 8)]
    contenders: usize,
    /// Acquisitions in the contended run
    #[arg(long, default_value_t = 2000)]
    total: u64,
    /// Key prefix
    #[arg(long, default_value = "bench-etcd-client")]
    prefix: String,
    /// Contender counts of the rows (issue 28), comma separated; each contender has its own
    /// client and lease. Empty: no rows
    #[arg(long, default_value = "8,64,256,1024")]
    rows: String,
    /// Time bound of a row's warm-up, and again of its measured window, in seconds
    #[arg(long, default_value_t = 20)]
    row_secs: u64,
    /// Run only some phases, comma separated: uncontended, contended (runs rows too), rows
    #[arg(long)]
    only: Option<String>,
}

impl Args {
    fn wants(&self, phase: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|o| o.split(',').any(|p| p.trim() == phase))
    }
}

/// Lease TTL: longer than any run, so no keep-alive traffic mixes into the figures; the
/// leases are revoked at the end.
const TTL: i64 = 300;
/// No single lock call may take longer than this.
const WAIT: Duration = Duration::from_secs(30);

/// Nearest-rank percentiles in microseconds, as benches/compare/stats.rs computes them.
/// User + system CPU time this process has used so far (getrusage).
fn process_cpu() -> Duration {
    // SAFETY: `getrusage` writes into the zeroed struct we own and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Prints the client CPU per operation since `before`, as the other drivers do.
fn cpu_result(figure: &str, before: Duration, n: usize) {
    let used = process_cpu().saturating_sub(before);
    println!(
        "RESULT etcdclient cpu_{figure} us_per_op={:.1} n={n}",
        used.as_secs_f64() * 1e6 / n.max(1) as f64
    );
}

fn report(figure: &str, samples: &[Duration]) -> Option<f64> {
    if samples.is_empty() {
        println!("RESULT etcdclient {figure} n=0 error=no_samples");
        return None;
    }
    let mut s: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let rank = |p: f64| s[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
    let mean = s.iter().sum::<f64>() / n as f64;
    println!(
        "RESULT etcdclient {figure} median_us={:.0} p90_us={:.0} p99_us={:.0} mean_us={mean:.0} \
         min_us={:.0} max_us={:.0} n={n}",
        rank(0.5),
        rank(0.9),
        rank(0.99),
        s[0],
        s[n - 1]
    );
    Some(rank(0.5))
}

/// etcd-sync's acquire and release transactions, sent raw.
async fn floor_once(
    client: &mut Client,
    key: &str,
    prefix: &str,
    lease: i64,
) -> Res<(Duration, Duration)> {
    let t0 = Instant::now();
    let acquired = client
        .txn(
            Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(key, "", Some(PutOptions::new().with_lease(lease))),
                    TxnOp::get(prefix, Some(GetOptions::new().with_prefix())),
                ])
                .or_else([TxnOp::get(key, None)]),
        )
        .await?;
    let t1 = Instant::now();
    let revision = acquired.header().map_or(0, |h| h.revision());
    let deleted = client
        .txn(
            Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, revision)])
                .and_then([
                    TxnOp::delete(key, None),
                    // The release request etcd-sync's release deletes with its key.
                    TxnOp::delete(
                        format!(
                            "{}.revoke/{}",
                            prefix.trim_end_matches('/'),
                            key.strip_prefix(prefix).unwrap_or(key)
                        ),
                        None,
                    ),
                ]),
        )
        .await?;
    let t2 = Instant::now();
    if !acquired.succeeded() || !deleted.succeeded() {
        return Err("floor transaction did not take its success branch".into());
    }
    Ok((t1 - t0, t2 - t1))
}

async fn lock_once(client: &mut Client, name: &str, lease: i64) -> Res<(Duration, Duration)> {
    let t0 = Instant::now();
    let locked = tokio::time::timeout(
        WAIT,
        client.lock(name, Some(LockOptions::new().with_lease(lease))),
    )
    .await??;
    let t1 = Instant::now();
    client.unlock(locked.key()).await?;
    Ok((t1 - t0, t1.elapsed()))
}

async fn uncontended(args: &Args) -> Res<()> {
    let mut client = Client::connect([&args.endpoints], None).await?;
    let lease = client.lease_grant(TTL, None).await?.id();
    let name = format!("{}/uncontended", args.prefix);
    let floor_prefix = format!("{}/floor/", args.prefix);
    let floor_key = format!("{floor_prefix}{lease:x}");
    let warm = format!("{}/warmup", args.prefix);
    for _ in 0..100 {
        client.get(warm.as_str(), None).await?;
        lock_once(&mut client, &name, lease).await?;
        floor_once(&mut client, &floor_key, &floor_prefix, lease).await?;
    }
    let mut get = Vec::with_capacity(args.n);
    for _ in 0..args.n {
        let t = Instant::now();
        client.get(warm.as_str(), None).await?;
        get.push(t.elapsed());
    }
    let (mut lock, mut unlock, mut both) = (Vec::new(), Vec::new(), Vec::new());
    let mut floor = Vec::new();
    for i in 0..args.n {
        // Interleaved, alternating which goes first, so drift hits both alike.
        for first in [i % 2 == 0, i % 2 != 0] {
            if first {
                let (a, b) = lock_once(&mut client, &name, lease).await?;
                lock.push(a);
                unlock.push(b);
                both.push(a + b);
            } else {
                let (a, b) = floor_once(&mut client, &floor_key, &floor_prefix, lease).await?;
                floor.push(a + b);
            }
        }
    }
    // Client CPU per operation: each operation alone, in a pass of its own (issue 49).
    let before = process_cpu();
    for _ in 0..args.n {
        client.get(warm.as_str(), None).await?;
    }
    cpu_result("get", before, args.n);
    let before = process_cpu();
    for _ in 0..args.n {
        lock_once(&mut client, &name, lease).await?;
    }
    cpu_result("lock_unlock", before, args.n);
    let before = process_cpu();
    for _ in 0..args.n {
        floor_once(&mut client, &floor_key, &floor_prefix, lease).await?;
    }
    cpu_result("floor_lock_unlock", before, args.n);
    report("get", &get);
    report("lock", &lock);
    report("unlock", &unlock);
    let lu = report("lock_unlock", &both);
    let fl = report("floor_lock_unlock", &floor);
    if let (Some(lu), Some(fl)) = (lu, fl) {
        println!(
            "RESULT etcdclient lock_over_floor median_ratio={:.3}",
            lu / fl
        );
    }
    client.lease_revoke(lease).await?;
    Ok(())
}

/// Shared by the contenders: who holds, when the last release started, the samples.
struct Turns {
    holders: AtomicUsize,
    violations: AtomicU64,
    count: AtomicU64,
    released_at: Mutex<Option<Instant>>,
    handoffs: Mutex<Vec<Duration>>,
    errors: Mutex<Vec<String>>,
}

async fn contended(args: &Args) -> Res<()> {
    let name = format!("{}/contended", args.prefix);
    let mut workers = Vec::new();
    for _ in 0..args.contenders {
        let mut client = Client::connect([&args.endpoints], None).await?;
        let lease = client.lease_grant(TTL, None).await?.id();
        workers.push((client, lease));
    }
    let turns = Arc::new(Turns {
        holders: AtomicUsize::new(0),
        violations: AtomicU64::new(0),
        count: AtomicU64::new(0),
        released_at: Mutex::new(None),
        handoffs: Mutex::new(Vec::new()),
        errors: Mutex::new(Vec::new()),
    });
    let total = args.total;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (me, (mut client, lease)) in workers.into_iter().enumerate() {
        let (turns, name) = (turns.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let options = Some(LockOptions::new().with_lease(lease));
                let locked = match tokio::time::timeout(WAIT, client.lock(name.as_str(), options))
                    .await
                {
                    Ok(Ok(locked)) => locked,
                    Ok(Err(e)) => break turns.errors.lock().await.push(format!("{me}: lock: {e}")),
                    Err(_) => {
                        break turns
                            .errors
                            .lock()
                            .await
                            .push(format!("{me}: lock timed out"));
                    }
                };
                let acquired = Instant::now();
                let done = turns.count.load(Ordering::SeqCst) >= total;
                if !done {
                    if turns.holders.fetch_add(1, Ordering::SeqCst) != 0 {
                        turns.violations.fetch_add(1, Ordering::SeqCst);
                    }
                    if let Some(released) = turns.released_at.lock().await.take() {
                        turns.handoffs.lock().await.push(acquired - released);
                    }
                    turns.count.fetch_add(1, Ordering::SeqCst);
                    turns.holders.fetch_sub(1, Ordering::SeqCst);
                    *turns.released_at.lock().await = Some(Instant::now());
                }
                if let Err(e) = client.unlock(locked.key()).await {
                    break turns.errors.lock().await.push(format!("{me}: unlock: {e}"));
                }
                if done {
                    break;
                }
            }
            let _ = client.lease_revoke(lease).await;
        }));
    }
    for task in tasks {
        task.await?;
    }
    let elapsed = start.elapsed();
    let acquisitions = turns.count.load(Ordering::SeqCst);
    let errors = turns.errors.lock().await.clone();
    println!(
        "RESULT etcdclient contended throughput_acq_s={:.0} acquisitions={acquisitions} \
         contenders={} elapsed_ms={} violations={} errors={}",
        acquisitions as f64 / elapsed.as_secs_f64().max(1e-9),
        args.contenders,
        elapsed.as_millis(),
        turns.violations.load(Ordering::SeqCst),
        errors.len()
    );
    for e in &errors {
        eprintln!("etcdclient: {e}");
    }
    report("handoff", &turns.handoffs.lock().await);
    if !errors.is_empty() {
        return Err(format!("{} contender errors", errors.len()).into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Res<()> {
    let args = Args::parse();
    if args.wants("uncontended") {
        eprintln!(
            "etcdclient: uncontended lock + unlock and floor, n={}",
            args.n
        );
        uncontended(&args).await?;
    }
    if args.wants("contended") {
        eprintln!(
            "etcdclient: contended, {} contenders, {} acquisitions",
            args.contenders, args.total
        );
        contended(&args).await?;
    }
    if args.wants("contended") || args.wants("rows") {
        rows::rows(&args).await?;
    }
    Ok(())
}
