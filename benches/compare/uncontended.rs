//! (a) + (d): uncontended lock + unlock, interleaved with its floor (the same two requests
//! sent through `Client::txn`), and a linearizable Get as the raw client call.

use std::time::{Duration, Instant};

use etcd_sync::{Client, Compare, CompareOp, Txn, TxnOp};

use crate::args::Args;
use crate::cpu;
use crate::stats::{Summary, report};
use crate::{Res, WAIT, connect};

/// The release request key the lock's release deletes with its key (`<name>.revoke/<lease
/// hex>`, `line/request.rs`), for `key` under `prefix` (`<name>/`).
fn request_key(key: &str, prefix: &str) -> String {
    let name = prefix.trim_end_matches('/');
    let lease = key.strip_prefix(prefix).unwrap_or(key);
    format!("{name}.revoke/{lease}")
}

/// The lock's two requests through `Client::txn`: the acquire's put and read (the lock reads
/// our key's place keys-only, newest first, which `Client::txn` cannot ask; here the one key
/// with its value; neither has an else branch), and the release's guarded delete of the key
/// and its release request.
fn floor_once(client: &Client, key: &str, prefix: &str, lease: i64) -> Res<(Duration, Duration)> {
    let t0 = Instant::now();
    let acquired = client.txn(
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put_with_lease(key, "", lease),
                TxnOp::get_prefix(prefix),
            ]),
    )?;
    let t1 = Instant::now();
    let deleted = client.txn(
        Txn::new()
            .when([Compare::create_revision(
                key,
                CompareOp::Equal,
                acquired.revision,
            )])
            .and_then([TxnOp::delete(key), TxnOp::delete(request_key(key, prefix))]),
    )?;
    let t2 = Instant::now();
    if !acquired.succeeded || !deleted.succeeded {
        return Err("floor transaction did not take its success branch".into());
    }
    Ok((t1 - t0, t2 - t1))
}

pub fn uncontended(args: &Args, summary: &mut Summary) -> Res<()> {
    let client = connect(args)?;
    let session = client.session()?;
    let mutex = session.mutex(format!("{}/uncontended", args.prefix))?;
    let floor_prefix = format!("{}/floor/", args.prefix);
    let floor_key = format!("{floor_prefix}{:x}", session.lease_id());
    let lease = session.lease_id();

    let lock_once = || -> Res<(Duration, Duration)> {
        let t0 = Instant::now();
        let guard = mutex.lock_timeout(WAIT)?;
        let t1 = Instant::now();
        guard.release()?;
        Ok((t1 - t0, t1.elapsed()))
    };

    // Warm-up: connection, HTTP/2 windows, allocator, etcd's caches.
    for _ in 0..100 {
        client.get(format!("{}/warmup", args.prefix))?;
        lock_once()?;
        floor_once(&client, &floor_key, &floor_prefix, lease)?;
    }

    let mut get = Vec::with_capacity(args.n);
    for _ in 0..args.n {
        let t = Instant::now();
        client.get(format!("{}/warmup", args.prefix))?;
        get.push(t.elapsed());
    }

    // `try_lock` + unlock, uncontended: the same requests as a lock that owns at once.
    let try_lock_once = || -> Res<Duration> {
        let t0 = Instant::now();
        let guard = mutex
            .try_lock()
            .map_err(|e| format!("try_lock of a free lock: {e}"))?;
        guard.release()?;
        Ok(t0.elapsed())
    };
    let mut tried = Vec::with_capacity(args.n);

    let (mut lock, mut unlock, mut both) = (Vec::new(), Vec::new(), Vec::new());
    let (mut facq, mut frel, mut fboth) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..args.n {
        // Interleaved, alternating which goes first, so drift hits both alike.
        let mut run_lock = || -> Res<()> {
            let (a, b) = lock_once()?;
            lock.push(a);
            unlock.push(b);
            both.push(a + b);
            Ok(())
        };
        let mut run_floor = || -> Res<()> {
            let (a, b) = floor_once(&client, &floor_key, &floor_prefix, lease)?;
            facq.push(a);
            frel.push(b);
            fboth.push(a + b);
            Ok(())
        };
        if i % 2 == 0 {
            run_lock()?;
            run_floor()?;
        } else {
            run_floor()?;
            run_lock()?;
        }
        tried.push(try_lock_once()?);
    }
    // Client CPU per operation: each operation alone, in a pass of its own.
    let get_cpu = cpu::per_op("get", args.n, || {
        client.get(format!("{}/warmup", args.prefix))?;
        Ok(())
    })?;
    let lock_cpu = cpu::per_op("lock_unlock", args.n, || lock_once().map(|_| ()))?;
    let floor_cpu = cpu::per_op("floor_lock_unlock", args.n, || {
        floor_once(&client, &floor_key, &floor_prefix, lease).map(|_| ())
    })?;
    summary.text(format!(
        "client CPU per operation (user + system, getrusage): get {get_cpu:.0} µs, lock + \
         unlock {lock_cpu:.0} µs, floor {floor_cpu:.0} µs"
    ));
    let g = report("get", &get, "");
    let l = report("lock", &lock, "");
    report("unlock", &unlock, "");
    let lu = report("lock_unlock", &both, "");
    report("try_lock_unlock", &tried, "");
    report("floor_acquire", &facq, "");
    report("floor_release", &frel, "");
    let fl = report("floor_lock_unlock", &fboth, "");
    summary.latency("get (linearizable Range)", g);
    summary.latency("lock (uncontended acquire)", l);
    summary.latency("lock + unlock", lu);
    summary.latency("floor: same two requests via Client::txn", fl);
    if let (Some(lu), Some(fl)) = (lu, fl) {
        println!(
            "RESULT rust lock_over_floor median_ratio={:.3} p90_ratio={:.3} p99_ratio={:.3} mean_ratio={:.3}",
            lu.median / fl.median,
            lu.p90 / fl.p90,
            lu.p99 / fl.p99,
            lu.mean / fl.mean
        );
        summary.text(format!(
            "lock+unlock / floor: {:.3}x at the median, {:.3}x at p90",
            lu.median / fl.median,
            lu.p90 / fl.p90
        ));
    }
    session.close()?;
    Ok(())
}
