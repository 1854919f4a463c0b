//! A client that waits wakes its threads for what happens, not on a timer: with hundreds of
//! waiting processes on one host, periodic wake-ups of every client's thread cost as much
//! CPU as the handoffs (issue 28). Counted from `/proc` for the threads that drive one
//! client's runtime: its idle thread and the thread blocked in the wait, which drives the
//! runtime while it waits (`client/driver.rs`). (Alone in its own test binary so no other
//! test's threads are counted.)

#![cfg(feature = "testing")]

mod common;

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

use etcd_sync::WaitOptions;

/// The ids of this process's threads whose name starts with `prefix` (15 bytes at most).
fn threads_named(prefix: &str) -> BTreeSet<u64> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        panic!("cannot list /proc/self/task");
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        comm.starts_with(prefix)
            .then(|| entry.file_name().to_str()?.parse().ok())
            .flatten()
    })
    .collect()
}

/// How often thread `tid` has blocked (and so was woken) so far.
fn voluntary_switches(tid: u64) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .unwrap_or_else(|e| panic!("read the status of thread {tid}: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no voluntary_ctxt_switches for thread {tid}"))
}

#[test]
fn a_waiting_client_sleeps_until_the_release() {
    let server = common::etcd();
    let holder = common::client(&server.endpoints());
    let holding = common::session(&holder, 30);
    let guard = holding.mutex("quiet").unwrap().lock().unwrap();

    let runtime_threads = || threads_named("etcd-sync-runti");
    let before = runtime_threads();
    let waiter = common::client(&server.endpoints());
    let new: Vec<u64> = runtime_threads().difference(&before).copied().collect();
    assert_eq!(
        new.len(),
        1,
        "one runtime thread for the new client: {new:?}"
    );
    let idle = new[0];
    let waiting = common::session(&waiter, 30);
    let mutex = waiting.mutex("quiet").unwrap();
    let wait = thread::Builder::new()
        .name("quiet-waiter".into())
        .spawn(move || {
            let got = mutex.lock_with(WaitOptions::new().timeout(Duration::from_secs(20)));
            (got.map(|g| g.fencing_token()), Instant::now())
        })
        .unwrap();

    // Settled: the waiter's watcher runs, its stream is open, the session renewed once.
    thread::sleep(Duration::from_secs(1));
    let waiting_thread: Vec<u64> = threads_named("quiet-waiter").into_iter().collect();
    assert_eq!(waiting_thread.len(), 1, "{waiting_thread:?}");
    let drivers = [idle, waiting_thread[0]];
    let switches = || {
        drivers
            .iter()
            .map(|&tid| voluntary_switches(tid))
            .sum::<u64>()
    };
    let start = switches();
    thread::sleep(Duration::from_secs(3));
    let woken = switches() - start;
    eprintln!("woken {woken} times in 3 s");
    // Nothing happens in these 3 s but, at most, an HTTP/2 ping (every 10 s) and its
    // answer. A 250 ms timer on the watch stream and one in the follow task woke it 24
    // times before.
    assert!(
        woken <= 4,
        "the waiting client's idle and waiting threads woke {woken} times in 3 s of quiet"
    );

    let released = Instant::now();
    guard.release().unwrap();
    let Ok((got, at)) = wait.join() else {
        panic!("the waiting thread panicked");
    };
    let revision = got.unwrap_or_else(|e| panic!("the waiter did not get the lock: {e}"));
    assert!(revision > 0);
    assert!(
        at.duration_since(released) < Duration::from_secs(1),
        "the release reached the sleeping waiter after {:?}",
        at.duration_since(released)
    );
}
