//! The distributed Mutex against a real etcd.

#![cfg(feature = "testing")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{client, etcd, eventually, handled, keys, session, store_ranges, streams_started};
use etcd_sync::{Client, Error, TryLockError};

/// A counter kept in etcd, incremented with a plain get + put: only correct under the lock.
fn increment(c: &Client, key: &str) {
    let n: u64 = c
        .get(key)
        .unwrap()
        .map(|kv| kv.value_str().parse().unwrap())
        .unwrap_or(0);
    std::thread::yield_now();
    c.put(key, (n + 1).to_string()).unwrap();
}

fn counter(c: &Client, key: &str) -> u64 {
    c.get(key)
        .unwrap()
        .map(|kv| kv.value_str().parse().unwrap())
        .unwrap_or(0)
}

#[test]
fn mutual_exclusion_across_four_sessions() {
    let server = etcd();
    let endpoints = server.endpoints();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let endpoints = endpoints.clone();
            std::thread::spawn(move || {
                let c = client(&endpoints);
                let s = session(&c, 10);
                let m = s.mutex("excl").unwrap();
                for _ in 0..25 {
                    let _g = m.lock().unwrap();
                    increment(&c, "excl-counter");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let c = client(&endpoints);
    assert_eq!(counter(&c, "excl-counter"), 100);
    assert!(keys(&c, "excl/").is_empty());
}

#[test]
fn threads_sharing_one_session_exclude_each_other() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let inside = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (c, m, inside) = (c.clone(), s.mutex("shared").unwrap(), inside.clone());
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let g = m.lock().unwrap();
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    increment(&c, "shared-counter");
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(g);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(counter(&c, "shared-counter"), 160);
    assert!(keys(&c, "shared/").is_empty());
}

#[test]
fn fencing_tokens_strictly_increase_across_holders() {
    let server = etcd();
    let c = client(&server.endpoints());
    let sessions: Vec<_> = (0..3).map(|_| session(&c, 10)).collect();
    let mut last = 0;
    for round in 0..6 {
        let s = &sessions[round % 3];
        let g = s.mutex("fence").unwrap().lock().unwrap();
        assert!(
            g.fencing_token() > last,
            "token {} after {last}",
            g.fencing_token()
        );
        let kv = c.get(g.key()).unwrap().expect("lock key exists while held");
        assert_eq!(kv.create_revision, g.fencing_token());
        assert_eq!(g.key_str(), format!("fence/{:x}", s.lease_id()));
        last = g.fencing_token();
    }
}

#[test]
fn try_lock_exactly_one_of_n_succeeds_and_losers_leave_no_key() {
    let server = etcd();
    let c = client(&server.endpoints());
    let n = 5;
    let barrier = Arc::new(Barrier::new(n));
    let done = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let s = session(&c, 10);
            let (barrier, done) = (barrier.clone(), done.clone());
            std::thread::spawn(move || {
                let m = s.mutex("try").unwrap();
                barrier.wait();
                let result = m.try_lock();
                done.wait(); // the winner holds until every thread tried
                match result {
                    Ok(_guard) => 1,
                    Err(TryLockError::WouldBlock) => 0,
                    Err(TryLockError::Error(e)) => panic!("unexpected error {e}"),
                }
            })
        })
        .collect();
    let winners: i32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(winners, 1);
    assert!(keys(&c, "try/").is_empty());

    let holder = session(&c, 10);
    let g = holder.mutex("try").unwrap().lock().unwrap();
    let other = session(&c, 10);
    assert!(matches!(
        other.mutex("try").unwrap().try_lock(),
        Err(TryLockError::WouldBlock)
    ));
    assert_eq!(keys(&c, "try/"), vec![g.key_str().into_owned()]);
}

/// `try_lock` of a held lock answers `WouldBlock` at once, while the holder keeps it: it
/// never waits for the lock to come free.
#[test]
fn try_lock_of_a_held_lock_is_would_block_at_once() {
    let server = etcd();
    let c = client(&server.endpoints());
    let holder = session(&c, 10);
    let g = holder.mutex("busy").unwrap().lock().unwrap();
    let other = session(&c, 10);
    let m = other.mutex("busy").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let started = Instant::now();
        let tried = m.try_lock().map(drop);
        let _ = tx.send((tried, started.elapsed()));
    });
    let (tried, took) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("try_lock returns while the lock is held");
    assert!(matches!(tried, Err(TryLockError::WouldBlock)), "{tried:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert_eq!(keys(&c, "busy/"), vec![g.key_str().into_owned()]);
}

#[test]
fn lock_timeout_times_out_and_leaves_no_key() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s1 = session(&c, 10);
    let s2 = session(&c, 10);
    let g = s1.mutex("to").unwrap().lock().unwrap();
    let start = Instant::now();
    let r = s2
        .mutex("to")
        .unwrap()
        .lock_timeout(Duration::from_millis(500));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(start.elapsed() >= Duration::from_millis(500));
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(keys(&c, "to/"), vec![g.key_str().into_owned()]);
    drop(g);
    let g2 = s2
        .mutex("to")
        .unwrap()
        .lock_timeout(Duration::from_secs(2))
        .unwrap();
    assert!(g2.is_held());
}

#[test]
fn waiter_whose_session_is_revoked_gets_session_lost_not_the_lock() {
    let server = etcd();
    let c = client(&server.endpoints());
    let holder = session(&c, 10);
    let g = holder.mutex("rv").unwrap().lock().unwrap();
    let waiter = session(&c, 10);
    let lease = waiter.lease_id();
    let m = waiter.mutex("rv").unwrap();
    let t = std::thread::spawn(move || {
        let start = Instant::now();
        (m.lock().map(|g| g.fencing_token()), start.elapsed())
    });
    assert!(eventually(Duration::from_secs(2), || keys(&c, "rv/").len() == 2));
    // Revoke the waiter's lease from another client: the waiter's process learns it only
    // from etcd.
    let other = client(&server.endpoints());
    other
        .session_builder()
        .resume(lease)
        .start()
        .unwrap()
        .close()
        .unwrap();
    let (result, waited) = t.join().unwrap();
    assert!(
        matches!(result, Err(Error::SessionLost(_))),
        "waiter got {result:?} instead of SessionLost"
    );
    assert!(waited < Duration::from_secs(5));
    assert!(g.is_held());
    assert_eq!(keys(&c, "rv/"), vec![g.key_str().into_owned()]);
}

/// Upstream TestMutexWaitsOnCurrentHolder.
#[test]
fn waiter_behind_closed_middle_waiter_waits_for_the_holder() {
    let server = etcd();
    let c = client(&server.endpoints());
    let owner = session(&c, 10);
    let g = owner.mutex("cur").unwrap().lock().unwrap();
    let victim = session(&c, 10);
    let vm = victim.mutex("cur").unwrap();
    let victim_thread = std::thread::spawn(move || vm.lock().map(|_| ()));
    assert!(eventually(Duration::from_secs(2), || keys(&c, "cur/")
        .len()
        == 2));
    let new_owner = session(&c, 10);
    let nm = new_owner.mutex("cur").unwrap();
    let acquired = Arc::new(AtomicUsize::new(0));
    let acq = acquired.clone();
    let new_thread = std::thread::spawn(move || {
        let g = nm.lock().unwrap();
        acq.store(1, Ordering::SeqCst);
        g.fencing_token()
    });
    assert!(eventually(Duration::from_secs(2), || keys(&c, "cur/")
        .len()
        == 3));
    victim.close().unwrap();
    assert!(matches!(
        victim_thread.join().unwrap(),
        Err(Error::SessionLost(_))
    ));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        acquired.load(Ordering::SeqCst),
        0,
        "acquired while the owner still held"
    );
    let released = Instant::now();
    let owner_token = g.fencing_token();
    drop(g);
    let token = new_thread.join().unwrap();
    assert!(released.elapsed() < Duration::from_secs(1));
    assert!(token > owner_token);
}

#[test]
fn names_that_are_prefixes_do_not_interfere() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s1 = session(&c, 10);
    let s2 = session(&c, 10);
    let _a = s1.mutex("a").unwrap().lock().unwrap();
    let ab = s2.mutex("ab").unwrap().try_lock();
    assert!(ab.is_ok(), "lock 'ab' blocked by 'a': {ab:?}");
    let a2 = s2.mutex("a").unwrap().try_lock();
    assert!(matches!(a2, Err(TryLockError::WouldBlock)));
}

#[test]
fn guarded_writes_fail_once_the_lock_is_lost() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let g = s.mutex("gw").unwrap().lock().unwrap();
    let revision = g.put("gw-data", "1").unwrap();
    assert!(revision > 0);
    assert_eq!(c.get("gw-data").unwrap().unwrap().mod_revision, revision);
    g.put("gw-scratch", "x").unwrap();
    assert_eq!(g.delete("gw-scratch").unwrap(), 1, "one key deleted");
    assert_eq!(g.delete("gw-scratch").unwrap(), 0, "nothing left to delete");
    assert_eq!(c.get("gw-data").unwrap().unwrap().value, b"1");
    let other = client(&server.endpoints());
    other
        .session_builder()
        .resume(s.lease_id())
        .start()
        .unwrap()
        .close()
        .unwrap();
    assert!(matches!(g.put("gw-data", "2"), Err(Error::LockLost)));
    assert!(matches!(g.delete("gw-data"), Err(Error::LockLost)));
    assert_eq!(
        c.get("gw-data").unwrap().unwrap().value,
        b"1",
        "a stale write went through"
    );
    // The loss reaches the guard through the session too.
    assert!(
        g.lost()
            .recv_timeout(Duration::from_secs(5))
            .is_err_and(|e| e.is_disconnected())
    );
    assert!(!g.is_held());
}

#[test]
fn stale_unlock_never_deletes_a_newer_holder() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s1 = session(&c, 10);
    let s2 = session(&c, 10);
    let g1 = s1.mutex("stale").unwrap().lock().unwrap();
    c.delete(g1.key()).unwrap(); // e.g. an operator removed it
    let g2 = s2
        .mutex("stale")
        .unwrap()
        .lock_timeout(Duration::from_secs(2))
        .unwrap();
    assert!(matches!(g1.release(), Err(Error::LockLost)));
    assert_eq!(keys(&c, "stale/"), vec![g2.key_str().into_owned()]);
    g2.release().unwrap();
    assert!(keys(&c, "stale/").is_empty());
}

#[test]
fn guard_is_released_when_the_holding_thread_panics() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let m = s.mutex("panic").unwrap();
    let result = std::thread::spawn(move || {
        let _g = m.lock().unwrap();
        panic!("boom while holding the lock");
    })
    .join();
    assert!(result.is_err());
    let s2 = session(&c, 10);
    assert!(s2.mutex("panic").unwrap().try_lock().is_ok());

    let m = s.mutex("panic2").unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _g = m.lock().unwrap();
        panic!("boom");
    }));
    assert!(caught.is_err());
    assert!(keys(&c, "panic2/").is_empty());
}

/// A release that finds its key already gone (an operator deleted it, before the guard's
/// follow heard of it) reports the loss and costs two Txns: the guarded delete, and the
/// removal of the key's release request while the key is still gone. Nothing is asked
/// again in the background (a mutant of `Held::release` that treated "not ours" as
/// unanswered asked twice more; docs/design/mutation-score.md).
#[test]
fn a_release_that_finds_its_key_gone_asks_once_and_reports_the_loss() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 30);
    let m = s.mutex("gone-at-release").unwrap();
    let count = || handled(&server.metrics().unwrap(), "Txn");
    for _ in 0..3 {
        let g = m.lock().unwrap();
        // Within the follow's 200 ms deferral: the guard cannot know yet.
        c.delete(g.key()).unwrap();
        let before = count();
        let released = g.release();
        std::thread::sleep(Duration::from_millis(300)); // a background retry would be done
        assert_eq!(
            count() - before,
            2,
            "the guarded delete and the release request's removal"
        );
        assert!(
            matches!(&released, Err(e) if e.is_lost()),
            "released: {released:?}"
        );
        assert!(keys(&c, "gone-at-release/").is_empty());
    }
}

/// Cost per operation, from etcd's own request counters.
#[test]
fn acquire_and_release_cost_one_request_and_handoff_no_read() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s1 = session(&c, 30);
    let s2 = session(&c, 30);
    let m1 = s1.mutex("cost").unwrap();
    let m2 = s2.mutex("cost").unwrap();
    let metrics = || server.metrics().unwrap();
    let count = |method| handled(&metrics(), method);
    let watches = || streams_started(&metrics(), "Watch");

    let (txn0, range0) = (count("Txn"), count("Range"));
    let g = m1.lock().unwrap();
    assert_eq!(count("Txn") - txn0, 1, "uncontended acquire = 1 Txn");
    assert_eq!(count("Range") - range0, 0);
    drop(g);
    assert_eq!(count("Txn") - txn0, 2, "release = 1 request");
    assert_eq!(count("Range") - range0, 0);

    // The first wait on a name creates the client's watcher of deletes under it.
    let g = m1.lock().unwrap();
    let waiter = std::thread::spawn(move || m2.lock().map(|g| (g, m2)));
    assert!(eventually(Duration::from_secs(2), || keys(&c, "cost/")
        .len()
        == 2));
    // The waiter's watcher is set up, and its double-check window (120 ms) is over.
    std::thread::sleep(Duration::from_millis(600));
    let (txn1, range1) = (count("Txn"), count("Range"));
    drop(g);
    let (guard, m2) = waiter.join().unwrap().unwrap();
    assert_eq!(count("Txn") - txn1, 1, "only the release");
    assert_eq!(
        count("Range") - range1,
        0,
        "handoff: the delete event proves ownership, no read"
    );

    // Now m1 waits behind m2: the watcher exists (pinned by m2's line) and is shared, so
    // the whole contended acquisition is the enqueue Txn: no read, no new watch stream.
    let (txn2, range2, watch2) = (count("Txn"), count("Range"), watches());
    let waiter = std::thread::spawn(move || m1.lock());
    std::thread::sleep(Duration::from_millis(300));
    // This check is one Range of its own, subtracted below.
    assert_eq!(keys(&c, "cost/").len(), 2, "m1 queued");
    let released_token = guard.fencing_token();
    drop(guard);
    let g1 = waiter.join().unwrap().unwrap();
    assert!(g1.is_held());
    assert!(g1.fencing_token() > released_token);
    assert_eq!(count("Txn") - txn2, 2, "enqueue + release");
    assert_eq!(
        count("Range") - range2 - 1,
        0,
        "no read in a warm contended acquisition"
    );
    assert_eq!(watches() - watch2, 0, "no watch stream opened");
    // Without a lock-delay no wait reads the leases ahead (mutation testing, shard 3/10:
    // `acquire.rs`, the delay's guard taken as always true, read them while nobody used
    // the readings).
    assert_eq!(
        count("LeaseTimeToLive"),
        0,
        "a lease read without a lock-delay"
    );
    drop(m2);
}

/// What etcd reads for an uncontended lock, counted inside its requests (the store's range
/// count, a Txn's compares included): the first acquisition on a name compares our key's
/// absence and reads the line and our lease's keys under the name (a resumed lease's
/// leftovers may be there); a later one, after a short line, compares and reads the line
/// alone (our lease's keys are in it); a release compares our key's create revision and
/// lease. (Mutation testing, `line/queue/mod.rs`: a line taken for long when its read was
/// whole read our lease's keys again in every Txn, at no cost in requests.)
#[test]
fn an_uncontended_lock_reads_our_leases_keys_only_on_its_first_acquisition() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 30);
    let m = s.mutex("reads").unwrap();
    let ranges = || store_ranges(&server.metrics().unwrap());
    for round in 0..3 {
        let before = ranges();
        let g = m.lock().unwrap();
        let acquired = ranges();
        drop(g);
        let released = ranges();
        let expected = if round == 0 { 3 } else { 2 };
        assert_eq!(
            acquired - before,
            expected,
            "round {round}: ranges of the acquisition"
        );
        assert_eq!(
            released - acquired,
            2,
            "round {round}: ranges of the release"
        );
    }
}

/// A waiter's line keeps the watcher of deletes under its name while the line lives: later
/// waits at the front create and cancel no watcher, though nobody used it in between
/// (etcd's count of watch messages received). (Mutation testing, shard 7/10: `place.rs`,
/// the front's pin dropped, created and cancelled the watcher with each wait.)
#[test]
fn waits_at_the_front_reuse_the_lines_watcher() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2) = (session(&c, 30), session(&c, 30));
    let (m1, m2) = (s1.mutex("reuse").unwrap(), s2.mutex("reuse").unwrap());
    let messages = || common::watch_messages(&server.metrics().unwrap());
    let mut before = None;
    for round in 0..3 {
        let held = m1.lock().unwrap();
        let m = m2.clone();
        let waiter = std::thread::spawn(move || m.lock().map(drop));
        assert!(eventually(Duration::from_secs(2), || keys(&c, "reuse/")
            .len()
            == 2));
        std::thread::sleep(Duration::from_millis(300));
        drop(held);
        waiter.join().unwrap().unwrap();
        // Nobody holds or waits now.
        std::thread::sleep(Duration::from_millis(300));
        let now = messages();
        if let Some(before) = before {
            assert_eq!(now - before, 0.0, "round {round}: watch messages");
        }
        before = Some(now);
    }
}
