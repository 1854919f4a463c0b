//! OS threads per client do not grow with sessions and are all joined on drop.
//! (Alone in its own test binary so no other test's threads disturb the count.)

#![cfg(feature = "testing")]

mod common;

use std::time::Duration;

fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn thread_count_is_constant_in_sessions_and_returns_to_baseline() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let server = common::etcd();
    let baseline = os_threads();
    let c = common::client(&server.endpoints());
    let first = common::session(&c, 10);
    let with_one = os_threads();
    assert!(with_one > baseline, "the client runs its own threads");
    assert!(
        with_one - baseline <= 3,
        "{} threads for one client",
        with_one - baseline
    );
    let mut sessions = vec![first];
    for _ in 0..99 {
        sessions.push(common::session(&c, 10));
    }
    let mutexes: Vec<_> = sessions.iter().map(|s| s.mutex("t").unwrap()).collect();
    let guard = mutexes[0].lock().unwrap();
    assert_eq!(os_threads(), with_one, "threads grew with 100 sessions");
    drop(guard);
    drop(mutexes);
    drop(sessions);
    drop(c);
    assert!(
        common::eventually(Duration::from_secs(2), || os_threads() == baseline),
        "threads left after the client was dropped: {} vs baseline {baseline}",
        os_threads()
    );
}

/// The last handle of a client dropped inside an async runtime: the drop returns at once
/// (its idle thread is told to stop, not joined on the executor's thread), and the
/// client's threads are gone soon after all the same.
#[test]
fn a_client_dropped_inside_an_async_runtime_stops_its_threads_without_a_join() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let server = common::etcd();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let baseline = os_threads();
    let c = common::client(&server.endpoints());
    c.get("warm").unwrap();
    assert!(os_threads() > baseline);
    let took = rt.block_on(async move {
        let started = std::time::Instant::now();
        drop(c);
        started.elapsed()
    });
    assert!(took < Duration::from_secs(2), "the drop took {took:?}");
    assert!(
        common::eventually(Duration::from_secs(3), || os_threads() == baseline),
        "threads left after the client was dropped in an async runtime: {} vs baseline \
         {baseline}",
        os_threads()
    );
}

/// The tests of this binary count the process's threads: one at a time.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
