//! STM (issue 30): read-modify-write transactions per second (`Client::stm`, Go's default
//! isolation, serializable snapshot), `--stm-workers` threads with a client each, for
//! `--stm-secs`: with no conflict (each worker increments its own key) and with high
//! conflict (every worker increments one key). benches/go/stm.go runs the same with Go's
//! `concurrency.NewSTM`. Each row checks its counters against its commits (`violations`).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use etcd_sync::Client;

use crate::args::Args;
use crate::stats::{Summary, report};
use crate::{Res, connect};

pub fn stm(args: &Args, summary: &mut Summary) -> Res<()> {
    row(
        args,
        summary,
        "stm_0",
        "no conflict, each worker its own key",
        false,
    )?;
    row(
        args,
        summary,
        "stm_high",
        "high conflict, every worker on one key",
        true,
    )
}

/// What one worker did in the measured window.
#[derive(Default)]
struct Worker {
    commits: u64,
    attempts: u64,
    latencies: Vec<Duration>,
}

fn row(args: &Args, summary: &mut Summary, figure: &str, label: &str, shared: bool) -> Res<()> {
    let workers = args.stm_workers;
    let key = |w: usize| {
        if shared {
            format!("{}/{figure}/counter", args.prefix)
        } else {
            format!("{}/{figure}/counter-{w}", args.prefix)
        }
    };
    let clients = (0..workers)
        .map(|_| connect(args))
        .collect::<Res<Vec<Client>>>()?;
    let start = Arc::new(Barrier::new(workers));
    let window = args.stm_time;
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(w, client)| {
                let (key, start) = (key(w), start.clone());
                scope.spawn(move || -> Res<Worker> {
                    let mut done = Worker::default();
                    let mut attempts = 0u64;
                    for _ in 0..20 {
                        increment(client, &key, &mut attempts)?; // warm-up: connections, etcd's caches
                    }
                    start.wait();
                    let end = Instant::now() + window;
                    let before = attempts;
                    while Instant::now() < end {
                        let t0 = Instant::now();
                        increment(client, &key, &mut attempts)?;
                        done.latencies.push(t0.elapsed());
                        done.commits += 1;
                    }
                    done.attempts = attempts - before;
                    Ok(done)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| "an STM worker panicked")?)
            .collect::<Res<Vec<Worker>>>()
    })?;
    let commits: u64 = results.iter().map(|w| w.commits).sum();
    let attempts: u64 = results.iter().map(|w| w.attempts).sum();
    let latencies: Vec<Duration> = results.iter().flat_map(|w| w.latencies.clone()).collect();
    // Every commit, warm-up included, is one increment: the counters must add up.
    let warmup = 20 * workers as u64;
    let keys: Vec<String> = if shared {
        vec![key(0)]
    } else {
        (0..workers).map(key).collect()
    };
    let mut counted = 0u64;
    for k in &keys {
        counted += clients[0]
            .get(k)?
            .map_or(0, |kv| kv.value_str().parse().unwrap_or(0));
    }
    let violations = (commits + warmup).abs_diff(counted);
    let per_sec = commits as f64 / window.as_secs_f64();
    let per_commit = attempts as f64 / commits.max(1) as f64;
    let st = report(
        figure,
        &latencies,
        &format!(
            "workers={workers} secs={:.1} commits={commits} attempts={attempts} \
             txn_s={per_sec:.0} attempts_per_commit={per_commit:.2} violations={violations}",
            window.as_secs_f64()
        ),
    );
    summary.text(format!(
        "STM, {label}: {per_sec:.0} transactions/s with {workers} workers, \
         {per_commit:.2} attempts per commit, {violations} violations"
    ));
    summary.latency(&format!("STM transaction, {label}"), st);
    clients[0].delete_prefix(format!("{}/{figure}/", args.prefix))?;
    Ok(())
}

/// One read-modify-write transaction on `key`, counting its attempts.
fn increment(client: &Client, key: &str, attempts: &mut u64) -> etcd_sync::Result<()> {
    client.stm(|tx| {
        *attempts += 1;
        let n: u64 = tx
            .get(key)?
            .and_then(|v| String::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        tx.put(key, (n + 1).to_string());
        Ok(())
    })
}
