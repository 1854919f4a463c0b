//! Barriers against a real etcd (issue 30, item 3): `Barrier` (hold, release, wait),
//! `DoubleBarrier` (enter together, leave together, participants counted out when their
//! session ends) and `CountDownLatch`; their time limits, cancels, leftover keys and bad
//! input.

#![cfg(feature = "testing")]

#[path = "../common/mod.rs"]
mod common;
mod double;
mod faults;
mod latch;
mod wake;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{client, etcd};
use etcd_sync::{CancelToken, Error, Operation, WaitOptions};

/// A limit on every wait that must end, so that one that does not fails the test instead
/// of hanging it.
const BACKSTOP: Duration = Duration::from_secs(15);

/// Runs `f` on a thread; its result and when it returned arrive on the receiver.
fn spawn<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> mpsc::Receiver<(T, Instant)> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let result = f();
        let _ = tx.send((result, Instant::now()));
    });
    rx
}

/// Asserts that nothing arrived on `rx` within `during`: the call still blocks.
fn still_blocked<T: std::fmt::Debug>(
    rx: &mpsc::Receiver<(T, Instant)>,
    during: Duration,
    what: &str,
) {
    match rx.recv_timeout(during) {
        Err(mpsc::RecvTimeoutError::Timeout) => {}
        other => panic!("{what} returned early: {other:?}"),
    }
}

/// The result of the call on `rx`, which must return within [`BACKSTOP`].
fn returned<T>(rx: &mpsc::Receiver<(T, Instant)>, what: &str) -> (T, Instant) {
    rx.recv_timeout(BACKSTOP)
        .unwrap_or_else(|e| panic!("{what} did not return within {BACKSTOP:?}: {e}"))
}

#[test]
fn barrier_wait_returns_on_release_and_not_before() {
    let server = etcd();
    let c = client(&server.endpoints());
    let barrier = c.barrier("gate").unwrap();
    assert!(barrier.try_wait().unwrap(), "a barrier never held is down");
    barrier.wait().unwrap(); // at once
    assert!(barrier.hold().unwrap(), "this call raised it");
    assert!(!barrier.hold().unwrap(), "it was up already");
    assert!(!barrier.try_wait().unwrap());
    // Waiters on this client (sharing its watch stream) and on another client.
    let other = client(&server.endpoints());
    let waiters: Vec<_> = [&c, &c, &other]
        .into_iter()
        .map(|c| {
            let b = c.barrier("gate").unwrap();
            spawn(move || b.wait())
        })
        .collect();
    for w in &waiters {
        still_blocked(w, Duration::from_millis(300), "a wait on a held barrier");
    }
    let released_at = Instant::now();
    assert!(barrier.release().unwrap(), "it was up");
    for w in &waiters {
        let (result, at) = returned(w, "a wait after the release");
        result.unwrap();
        let after = at.duration_since(released_at);
        assert!(
            after < Duration::from_secs(2),
            "woke {after:?} after the release"
        );
    }
    assert!(!barrier.release().unwrap(), "nothing left to release");
    assert!(c.get("gate").unwrap().is_none());
    // Anyone deleting the key releases it (etcdctl del, here a plain delete).
    barrier.hold().unwrap();
    let w = {
        let b = other.barrier("gate").unwrap();
        spawn(move || b.wait())
    };
    still_blocked(&w, Duration::from_millis(200), "a wait on a held barrier");
    c.delete("gate").unwrap();
    returned(&w, "a wait after a plain delete").0.unwrap();
}

#[test]
fn barrier_waits_end_at_their_limit_or_cancel() {
    let server = etcd();
    let c = client(&server.endpoints());
    let barrier = c.barrier("held").unwrap();
    barrier.hold().unwrap();
    let started = Instant::now();
    let e = barrier
        .wait_timeout(Duration::from_millis(300))
        .unwrap_err();
    let took = started.elapsed();
    assert!(e.is_wait_timeout(), "{e:?}");
    assert!(
        matches!(e, Error::Timeout { operation: Operation::Barrier, after, .. } if after == Duration::from_millis(300))
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );

    let token = CancelToken::new();
    let canceller = token.clone();
    let started = Instant::now();
    thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        canceller.cancel();
    });
    let e = barrier
        .wait_with(WaitOptions::new().timeout(BACKSTOP).cancel_token(&token))
        .unwrap_err();
    assert!(e.is_cancelled(), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // An already cancelled token ends the wait before it starts.
    assert!(barrier.wait_with(&token).unwrap_err().is_cancelled());
    // A limit as a Duration.
    assert!(
        barrier
            .wait_with(Duration::from_millis(50))
            .unwrap_err()
            .is_wait_timeout()
    );
    // None of it touched the barrier.
    assert!(c.get("held").unwrap().is_some());
}
#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<etcd_sync::Barrier>();
    check::<etcd_sync::CountDownLatch>();
    check::<etcd_sync::DoubleBarrier>();
}
