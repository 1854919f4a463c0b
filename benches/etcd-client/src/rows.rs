//! The contender-count rows (issue 28), as `benches/compare/rows.rs` measures them for
//! etcd-sync: at each count of `--rows`, that many tasks, each with its own client and
//! lease, take turns on one lock through etcd's server-side Lock service. The first N
//! acquisitions (and at least 1 s) are a warm-up; then a window of `--total` acquisitions
//! or `--row-secs`, whichever comes first: acquisitions/s, the handoff (release start → the
//! next holder's `lock` returns) median and p99, and etcd's work per acquisition from its
//! /metrics at both ends of the window (watch events delivered, watch responses sent,
//! Range, Txn, CPU). Then the line drains (each waiter takes its turn without counting;
//! a dropped `lock` call leaves a watcher behind in etcd 3.4's Lock service) and the
//! leases are revoked.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, LockOptions};
use tokio::sync::{Mutex, Semaphore, watch};

use crate::{Args, Res, TTL, WAIT};

const SETUP_AT_ONCE: usize = 16;
const ROW_WAIT: Duration = Duration::from_secs(600);
/// How long the end of a row waits for the line to drain before it drops waiting calls.
const DRAIN: Duration = Duration::from_secs(60);

/// The series of etcd's /metrics the rows read, summed by name (and gRPC method).
type Snapshot = HashMap<String, f64>;

/// GET /metrics over plain HTTP/1.0 (blocking; run off the async workers).
fn fetch_blocking(endpoint: &str) -> Res<Snapshot> {
    let hostport = endpoint
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let mut stream = TcpStream::connect(&hostport)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET /metrics HTTP/1.0\r\nHost: {hostport}\r\nAccept-Encoding: identity\r\n\r\n"
    )?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    let mut out = Snapshot::new();
    for line in body.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let key = match name {
            "etcd_debugging_mvcc_events_total"
            | "process_cpu_seconds_total"
            | "etcd_debugging_mvcc_watcher_total" => name.to_string(),
            "grpc_server_handled_total"
            | "grpc_server_msg_sent_total"
            | "grpc_server_started_total" => {
                let Some(method) = labels
                    .split("grpc_method=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                else {
                    continue;
                };
                format!("{name}/{method}")
            }
            _ => continue,
        };
        *out.entry(key).or_default() += value;
    }
    Ok(out)
}

async fn fetch(endpoint: &str) -> Res<Snapshot> {
    let endpoint = endpoint.to_string();
    tokio::task::spawn_blocking(move || fetch_blocking(&endpoint)).await?
}

fn per_acq(before: &Snapshot, after: &Snapshot, n: u64) -> String {
    let d = |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let n = n.max(1) as f64;
    format!(
        "events_per_acq={:.2} watch_msgs_sent_per_acq={:.2} range_per_acq={:.3} \
         txn_per_acq={:.2} watch_streams_per_acq={:.3} etcd_cpu_us_per_acq={:.0}",
        d("etcd_debugging_mvcc_events_total") / n,
        d("grpc_server_msg_sent_total/Watch") / n,
        d("grpc_server_handled_total/Range") / n,
        d("grpc_server_handled_total/Txn") / n,
        d("grpc_server_started_total/Watch") / n,
        d("process_cpu_seconds_total") * 1e6 / n,
    )
}

/// Waits (at most `limit`) until etcd has at most `watchers` watchers and used under 10 %
/// of a core over the last 500 ms.
async fn quiesce(endpoint: &str, watchers: f64, limit: Duration) -> Duration {
    let t = Instant::now();
    let mut last = fetch(endpoint).await.ok().map(|s| (Instant::now(), s));
    while t.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = fetch(endpoint).await.ok().map(|s| (Instant::now(), s));
        if let (Some((t0, a)), Some((t1, b))) = (&last, &now) {
            let cpu = |s: &Snapshot| s.get("process_cpu_seconds_total").copied().unwrap_or(0.0);
            let w = b
                .get("etcd_debugging_mvcc_watcher_total")
                .copied()
                .unwrap_or(f64::MAX);
            if (cpu(b) - cpu(a)) / (*t1 - *t0).as_secs_f64() < 0.1 && w <= watchers {
                break;
            }
        }
        last = now;
    }
    t.elapsed()
}

struct Shared {
    count: AtomicU64,
    holders: AtomicUsize,
    violations: AtomicU64,
    errors: AtomicU64,
    last: Mutex<Option<(Instant, usize)>>,
    handoffs: Mutex<Vec<(u64, Duration)>>,
    messages: Mutex<Vec<String>>,
    stopped: AtomicBool,
}

async fn connect_many(args: &Args, n: usize) -> Res<Vec<(Client, i64)>> {
    let gate = Arc::new(Semaphore::new(SETUP_AT_ONCE));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (gate, endpoint) = (gate.clone(), args.endpoints.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire().await?;
            let mut client = Client::connect([endpoint.as_str()], None).await?;
            let lease = client.lease_grant(TTL, None).await?.id();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((client, lease))
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

async fn row(args: &Args, n: usize) -> Res<()> {
    let t = Instant::now();
    let workers = connect_many(args, n).await?;
    let setup = t.elapsed();
    let name = format!("{}/row-{n}", args.prefix);
    let shared = Arc::new(Shared {
        count: AtomicU64::new(0),
        holders: AtomicUsize::new(0),
        violations: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        last: Mutex::new(None),
        handoffs: Mutex::new(Vec::new()),
        messages: Mutex::new(Vec::new()),
        stopped: AtomicBool::new(false),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    for (me, (mut client, lease)) in workers.into_iter().enumerate() {
        let (shared, name, mut stop) = (shared.clone(), name.clone(), stop_rx.clone());
        tasks.push(tokio::spawn(async move {
            while !shared.stopped.load(Ordering::SeqCst) {
                let options = Some(LockOptions::new().with_lease(lease));
                let locked = tokio::select! {
                    r = tokio::time::timeout(ROW_WAIT, client.lock(name.as_str(), options)) => r,
                    _ = stop.wait_for(|s| *s) => break,
                };
                let locked = match locked {
                    Ok(Ok(l)) => l,
                    other => {
                        if !shared.stopped.load(Ordering::SeqCst) {
                            shared.errors.fetch_add(1, Ordering::SeqCst);
                            let e = match other {
                                Ok(Err(e)) => e.to_string(),
                                _ => "lock timed out".into(),
                            };
                            shared.messages.lock().await.push(format!("{me}: {e}"));
                        }
                        break;
                    }
                };
                let acquired = Instant::now();
                if !shared.stopped.load(Ordering::SeqCst) {
                    if shared.holders.fetch_add(1, Ordering::SeqCst) != 0 {
                        shared.violations.fetch_add(1, Ordering::SeqCst);
                    }
                    let c = shared.count.fetch_add(1, Ordering::SeqCst) + 1;
                    let mut last = shared.last.lock().await;
                    if let Some((at, who)) = *last
                        && who != me
                    {
                        shared.handoffs.lock().await.push((c, acquired - at));
                    }
                    shared.holders.fetch_sub(1, Ordering::SeqCst);
                    *last = Some((Instant::now(), me));
                }
                if let Err(e) = client.unlock(locked.key()).await {
                    if !shared.stopped.load(Ordering::SeqCst) {
                        shared.errors.fetch_add(1, Ordering::SeqCst);
                        shared
                            .messages
                            .lock()
                            .await
                            .push(format!("{me}: unlock: {e}"));
                    }
                    break;
                }
            }
            let _ = tokio::time::timeout(WAIT, client.lease_revoke(lease)).await;
        }));
    }
    let limit = Duration::from_secs(args.row_secs.max(1));
    let failed = || shared.errors.load(Ordering::SeqCst) > 0;
    let until = async |target: u64, deadline: Instant| {
        while shared.count.load(Ordering::SeqCst) < target && Instant::now() < deadline && !failed()
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let mark = async || -> Res<(u64, Instant, Snapshot)> {
        let (c0, t0) = (shared.count.load(Ordering::SeqCst), Instant::now());
        let snap = fetch(&args.endpoints).await?;
        let (c1, t1) = (shared.count.load(Ordering::SeqCst), Instant::now());
        Ok(((c0 + c1) / 2, t0 + (t1 - t0) / 2, snap))
    };
    let begun = Instant::now();
    until(n as u64, begun + limit).await;
    tokio::time::sleep_until((begun + Duration::from_secs(1).min(limit)).into()).await;
    let start = mark().await;
    let end = match &start {
        Ok((first, t0, _)) => {
            until(first + args.total, *t0 + limit).await;
            mark().await
        }
        Err(_) => Err("no window".into()),
    };
    // Drain: every waiter takes its turn and unlocks without counting. Dropping a waiting
    // `lock` call instead leaves etcd's Lock service a watcher behind per waiter (etcd
    // 3.4.23), and the next row stalls behind them. Calls still waiting after `DRAIN` are
    // dropped.
    shared.stopped.store(true, Ordering::SeqCst);
    let mut left = 0;
    let drained = Instant::now() + DRAIN;
    let mut pending = Vec::new();
    for mut t in tasks {
        if tokio::time::timeout_at(drained.into(), &mut t)
            .await
            .is_err()
        {
            pending.push(t);
        }
    }
    if !pending.is_empty() {
        eprintln!(
            "etcdclient: row {n}: {} waiters not drained after {DRAIN:?}; dropping their calls",
            pending.len()
        );
        let _ = stop_tx.send(true);
        let deadline = Instant::now() + WAIT;
        for t in pending {
            if tokio::time::timeout_at(deadline.into(), t).await.is_err() {
                left += 1;
            }
        }
    }
    let ((first, t0, before), (last, t1, after)) = (start?, end?);
    let k = last.saturating_sub(first);
    let mut hs: Vec<Duration> = shared
        .handoffs
        .lock()
        .await
        .iter()
        .filter(|(c, _)| *c > first && *c <= last)
        .map(|(_, d)| *d)
        .collect();
    hs.sort();
    let us = |p: f64| {
        if hs.is_empty() {
            f64::NAN
        } else {
            hs[((p * hs.len() as f64).ceil() as usize).clamp(1, hs.len()) - 1].as_secs_f64() * 1e6
        }
    };
    let el = t1 - t0;
    println!(
        "RESULT etcdclient row_mutex contenders={n} throughput_acq_s={:.1} acquisitions={k} \
         window_ms={} window_timed_out={} handoff_median_us={:.0} handoff_p90_us={:.0} \
         handoff_p99_us={:.0} handoffs={} {} violations={} errors={} setup_ms={}",
        k as f64 / el.as_secs_f64().max(1e-9),
        el.as_millis(),
        k < args.total,
        us(0.5),
        us(0.9),
        us(0.99),
        hs.len(),
        per_acq(&before, &after, k),
        shared.violations.load(Ordering::SeqCst),
        shared.errors.load(Ordering::SeqCst) + left,
        setup.as_millis()
    );
    for m in shared.messages.lock().await.iter().take(10) {
        eprintln!("etcdclient: row {n}: {m}");
    }
    if shared.errors.load(Ordering::SeqCst) + left + shared.violations.load(Ordering::SeqCst) > 0 {
        return Err(format!("row {n}: errors or violations").into());
    }
    Ok(())
}

pub async fn rows(args: &Args) -> Res<()> {
    let counts: Vec<usize> = args
        .rows
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .filter(|&v| v >= 2)
        .collect();
    let base = fetch(&args.endpoints)
        .await?
        .get("etcd_debugging_mvcc_watcher_total")
        .copied()
        .unwrap_or(0.0);
    let mut bad = Vec::new();
    for n in counts {
        eprintln!("etcdclient: rows: mutex, {n} contenders ...");
        if let Err(e) = row(args, n).await {
            bad.push(e.to_string());
        }
        let waited = quiesce(&args.endpoints, base, WAIT * 2).await;
        eprintln!(
            "etcdclient: rows: etcd quiet {:.1} s after the {n}-contender row",
            waited.as_secs_f64()
        );
    }
    if !bad.is_empty() {
        return Err(bad.join("; ").into());
    }
    Ok(())
}
