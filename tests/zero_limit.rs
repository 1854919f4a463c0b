//! Issue 51, item 1: a wait with a zero (or tiny) limit tries once, as `try_*` does and as
//! parking_lot's `try_lock_for`, tokio's `timeout` and std's `recv_timeout` do: a free name
//! is taken, a held one gives up at once with `Timeout`, printed with the limit as written
//! (`0s`), and nothing is left behind.

#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, Instant};

use common::{client, etcd, keys, session};
use etcd_sync::Error;

fn timed_out(e: &Error) -> bool {
    e.is_wait_timeout()
}

#[test]
fn a_zero_or_tiny_limit_takes_a_free_name_and_gives_up_on_a_held_one() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let other = session(&c, 10);
    for limit in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_micros(100),
    ] {
        // Free: taken.
        let m = s.mutex("zero").unwrap();
        let g = m
            .lock_timeout(limit)
            .unwrap_or_else(|e| panic!("{limit:?}: {e}"));
        assert!(g.is_held());
        // Held: gives up at once, leaving only the holder's key.
        let started = Instant::now();
        let e = other
            .mutex("zero")
            .unwrap()
            .lock_timeout(limit)
            .unwrap_err();
        assert!(timed_out(&e), "{limit:?}: {e:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(keys(&c, "zero/"), vec![g.key_str().into_owned()]);
        drop(g);

        let mut lead = s
            .election("zero-el")
            .unwrap()
            .campaign_timeout("a", limit)
            .unwrap_or_else(|e| panic!("{limit:?}: {e}"));
        let e = other
            .election("zero-el")
            .unwrap()
            .campaign_timeout("b", limit)
            .unwrap_err();
        assert!(timed_out(&e), "{e:?}");
        lead.resign().unwrap();

        let permit = s
            .semaphore("zero-sem", 1)
            .unwrap()
            .acquire_timeout(limit)
            .unwrap_or_else(|e| panic!("{limit:?}: {e}"));
        let e = other
            .semaphore("zero-sem", 1)
            .unwrap()
            .acquire_timeout(limit)
            .unwrap_err();
        assert!(timed_out(&e), "{e:?}");
        drop(permit);

        let read = s
            .rwlock("zero-rw")
            .unwrap()
            .read_timeout(limit)
            .unwrap_or_else(|e| panic!("{limit:?}: {e}"));
        let e = other
            .rwlock("zero-rw")
            .unwrap()
            .write_timeout(limit)
            .unwrap_err();
        assert!(timed_out(&e), "{e:?}");
        drop(read);

        let both = s
            .multi_lock(["zero-x", "zero-y"])
            .unwrap()
            .lock_timeout(limit)
            .unwrap_or_else(|e| panic!("{limit:?}: {e}"));
        drop(both);
    }
    for prefix in [
        "zero/",
        "zero-el/",
        "zero-sem/",
        "zero-rw/",
        "zero-x/",
        "zero-y/",
    ] {
        assert!(
            common::eventually(Duration::from_secs(3), || keys(&c, prefix).is_empty()),
            "{prefix}: {:?}",
            keys(&c, prefix)
        );
    }
}

#[test]
fn a_zero_limit_prints_as_written() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let other = session(&c, 10);
    let _g = s.mutex("shown").unwrap().lock().unwrap();
    let e = other
        .mutex("shown")
        .unwrap()
        .lock_timeout(Duration::ZERO)
        .unwrap_err();
    assert_eq!(e.to_string(), "lock timed out after 0s");
}

#[test]
fn barrier_and_latch_waits_with_a_zero_limit_look_once() {
    let server = etcd();
    let c = client(&server.endpoints());
    // An open barrier and a latch at zero: the wait returns at once.
    c.barrier("zero-gate")
        .unwrap()
        .wait_timeout(Duration::ZERO)
        .unwrap();
    let latch = c.count_down_latch("zero-latch").unwrap();
    latch.wait_timeout(Duration::ZERO).unwrap();
    // Closed ones: `Timeout`, at once.
    let gate = c.barrier("zero-gate").unwrap();
    assert!(gate.hold().unwrap());
    let e = gate.wait_timeout(Duration::ZERO).unwrap_err();
    assert!(timed_out(&e), "{e:?}");
    assert!(latch.try_set_count(1).unwrap());
    let e = latch.wait_timeout(Duration::ZERO).unwrap_err();
    assert!(timed_out(&e), "{e:?}");
    // A double barrier of one: entering fills the round.
    let s = session(&c, 10);
    let one = s.double_barrier("zero-db", 1).unwrap();
    one.enter_timeout(Duration::ZERO).unwrap();
    one.leave_timeout(Duration::from_secs(5)).unwrap();
    // A round of two that this one cannot fill: `Timeout`, no key left.
    let two = s.double_barrier("zero-db2", 2).unwrap();
    let e = two.enter_timeout(Duration::ZERO).unwrap_err();
    assert!(timed_out(&e), "{e:?}");
    assert!(common::eventually(Duration::from_secs(3), || keys(
        &c,
        "zero-db2/"
    )
    .is_empty()));
}
