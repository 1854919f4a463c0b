//! `Semaphore::acquire_many(k)` against real etcd: k permits at once, all or none, in line
//! order (a small request never overtakes a waiting large one), every wait variant, nothing
//! left behind, agreement on N, bad input, and exclusion with `etcdctl lock`.

#![cfg(feature = "testing")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{ChildGuard, client, etcd, etcdctl_command, eventually, keys, session};
use etcd_sync::{CancelToken, Error, KeyMode, TryLockError, WaitOptions};

fn would_block<T: std::fmt::Debug>(result: Result<T, TryLockError>) -> bool {
    matches!(result, Err(TryLockError::WouldBlock))
}

#[test]
fn k_permits_are_taken_at_once_and_count_k_against_the_others() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2, s3) = (session(&c, 10), session(&c, 10), session(&c, 10));
    let three = s1.semaphore("gpus", 4).unwrap().acquire_many(3).unwrap();
    assert_eq!(three.num_permits(), 3);
    assert!(
        three.key_str().ends_with(".permits-4.x3"),
        "{}",
        three.key_str()
    );
    // One permit is left: a single permit fits, two do not.
    let sem2 = s2.semaphore("gpus", 4).unwrap();
    assert!(would_block(sem2.try_acquire_many(2)));
    let one = sem2.try_acquire().expect("the fourth permit is free");
    assert_eq!(one.num_permits(), 1);
    assert!(
        one.key_str().ends_with(".permits-4"),
        "k = 1 keeps the plain key"
    );
    let sem3 = s3.semaphore("gpus", 4).unwrap();
    assert!(would_block(sem3.try_acquire()));
    assert!(would_block(sem3.try_acquire_many(2)));
    let timed = sem3.acquire_many_timeout(2, Duration::from_millis(300));
    assert!(
        timed.as_ref().is_err_and(Error::is_wait_timeout),
        "{timed:?}"
    );
    assert_eq!(
        keys(&c, "gpus/").len(),
        2,
        "failed tries and waits leave no key"
    );

    let status = sem3.status().unwrap();
    let taken: Vec<Option<u32>> = status.holders.iter().map(|h| h.num_permits()).collect();
    assert_eq!(taken, vec![Some(3), Some(1)]);
    assert!(status.holders.iter().all(|h| h.mode == KeyMode::Permits(4)));

    // The 3 permits go: the waiter for 3 holds beside the single one.
    let waiter = std::thread::spawn(move || sem3.acquire_many(3).map(|p| (p, sem3)));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "gpus/")
        .len()
        == 3));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!waiter.is_finished(), "3 + 1 + 3 permits of 4");
    three.release().unwrap();
    let (again, sem3) = waiter.join().unwrap().unwrap();
    assert_eq!(again.num_permits(), 3);
    assert!(would_block(s1.semaphore("gpus", 4).unwrap().try_acquire()));
    drop(one);
    // All 4 free once the 3 go too.
    drop(again);
    let four = sem3.acquire_many(4).unwrap();
    assert_eq!(c.status("gpus").unwrap().holders.len(), 1);
    drop(four);
    assert!(keys(&c, "gpus/").is_empty());
}

#[test]
fn a_small_request_never_overtakes_a_waiting_large_one() {
    let server = etcd();
    let c = client(&server.endpoints());
    let holders = [session(&c, 10), session(&c, 10)];
    let mut held: Vec<_> = holders
        .iter()
        .map(|s| s.semaphore("fifo", 3).unwrap().acquire().unwrap())
        .collect();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let spawn = |k: u32, tag: &'static str| {
        let s = session(&c, 10);
        let order = order.clone();
        std::thread::spawn(move || {
            let p = s.semaphore("fifo", 3).unwrap().acquire_many(k).unwrap();
            order.lock().unwrap().push(tag);
            std::thread::sleep(Duration::from_millis(200));
            drop(p);
            drop(s);
        })
    };
    // 2 of 3 permits held: a request of 3 waits...
    let big = spawn(3, "big");
    assert!(eventually(Duration::from_secs(5), || keys(&c, "fifo/")
        .len()
        == 3));
    // ...and a single permit queued after it waits too, though one permit is free.
    let late = session(&c, 10);
    let late_sem = late.semaphore("fifo", 3).unwrap();
    assert!(would_block(late_sem.try_acquire()));
    let timed = late_sem.acquire_timeout(Duration::from_millis(300));
    assert!(
        timed.as_ref().is_err_and(Error::is_wait_timeout),
        "{timed:?}"
    );
    let small = spawn(1, "small");
    assert!(eventually(Duration::from_secs(5), || keys(&c, "fifo/")
        .len()
        == 4));
    let status = c.status("fifo").unwrap();
    assert_eq!(status.holders.len(), 2);
    let waiting: Vec<Option<u32>> = status.waiters.iter().map(|w| w.num_permits()).collect();
    assert_eq!(
        waiting,
        vec![Some(3), Some(1)],
        "the waiters, in line order"
    );
    // One holder goes: 1 permit still held, the big request still waits, and so does the
    // small one behind it.
    drop(held.remove(0));
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        order.lock().unwrap().is_empty(),
        "{:?}",
        order.lock().unwrap()
    );
    drop(held);
    big.join().unwrap();
    small.join().unwrap();
    assert_eq!(*order.lock().unwrap(), vec!["big", "small"]);
    assert!(keys(&c, "fifo/").is_empty());
}

#[test]
fn k_outside_1_to_n_is_an_invalid_argument_and_sends_nothing() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let sem = s.semaphore("bad", 4).unwrap();
    let invalid = |result: Result<etcd_sync::Permit, Error>| match result {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("1 to 4"), "{why}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    invalid(sem.acquire_many(0));
    invalid(sem.acquire_many(5));
    invalid(sem.acquire_many_timeout(5, Duration::from_secs(1)));
    invalid(sem.acquire_many_with(0, WaitOptions::new()));
    match sem.try_acquire_many(u32::MAX) {
        Err(TryLockError::Error(Error::InvalidArgument(_))) => {}
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(keys(&c, "bad/").is_empty());
    // 1 and N are fine.
    drop(sem.acquire_many(1).unwrap());
    drop(sem.acquire_many(4).unwrap());
    assert!(keys(&c, "bad/").is_empty());
}

#[test]
fn participants_that_disagree_on_n_are_refused_with_weights_too() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2) = (session(&c, 10), session(&c, 10));
    let two = s1.semaphore("agree", 4).unwrap().acquire_many(2).unwrap();
    let other = s2.semaphore("agree", 3).unwrap();
    for result in [other.acquire_many(2), other.acquire()] {
        match result {
            Err(Error::InvalidArgument(why)) => {
                assert!(why.contains(&*two.key_str()), "{why} names the other key");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
    assert_eq!(keys(&c, "agree/"), vec![two.key_str().into_owned()]);
    // And the other way round: a weighted request behind a permit of another N.
    drop(two);
    let one = s1.semaphore("agree", 4).unwrap().acquire().unwrap();
    assert!(matches!(
        other.acquire_many(3),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(keys(&c, "agree/"), vec![one.key_str().into_owned()]);
}

#[test]
fn a_cancelled_or_deadlocking_request_leaves_nothing_behind() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2) = (session(&c, 10), session(&c, 10));
    let sem1 = s1.semaphore("cancel", 2).unwrap();
    let one = sem1.acquire().unwrap();
    let token = CancelToken::new();
    let waiter = {
        let token = token.clone();
        let sem = s2.semaphore("cancel", 2).unwrap();
        std::thread::spawn(move || sem.acquire_many_with(2, &token))
    };
    assert!(eventually(Duration::from_secs(5), || keys(&c, "cancel/")
        .len()
        == 2));
    token.cancel();
    let result = waiter.join().unwrap();
    assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    assert_eq!(keys(&c, "cancel/"), vec![one.key_str().into_owned()]);
    // The thread that holds a permit of the name on this session would wait on itself.
    assert!(matches!(sem1.acquire_many(2), Err(Error::WouldDeadlock(_))));
    assert!(would_block(sem1.try_acquire_many(2)));
    drop(one);
    assert!(keys(&c, "cancel/").is_empty());
}

#[test]
fn etcdctl_lock_excludes_k_permits_and_waits_for_them() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2) = (session(&c, 10), session(&c, 10));
    // Our 2 of 4 permits held: etcdctl lock waits for them.
    let two = s1.semaphore("mixed", 4).unwrap().acquire_many(2).unwrap();
    let mut child = ChildGuard::spawn(etcdctl_command(
        &server.endpoint(),
        &["lock", "mixed", "--", "sleep", "1"],
    ));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "mixed/")
        .len()
        == 2));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.child().try_wait().unwrap().is_none(),
        "etcdctl took the lock while 2 permits were held"
    );
    // A request queued behind etcdctl's key waits for it, though 2 permits are free.
    let late = s2.semaphore("mixed", 4).unwrap();
    assert!(would_block(late.try_acquire_many(2)));
    let started = Instant::now();
    let waiter = std::thread::spawn(move || late.acquire_many(2).map(|p| (p, late)));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "mixed/")
        .len()
        == 3));
    drop(two);
    let status = child.take().wait().unwrap();
    assert!(status.success());
    let (p, _late) = waiter.join().unwrap().unwrap();
    assert!(
        started.elapsed() > Duration::from_millis(900),
        "did not wait for etcdctl's 1 s hold: {:?}",
        started.elapsed()
    );
    assert_eq!(p.num_permits(), 2);
    drop(p);
    assert!(keys(&c, "mixed/").is_empty());
}

/// Sessions with requests of 1 to N permits churn on one semaphore: the permits held at
/// any instant never sum to more than N (counting every hold that was still ours when it
/// ended), and every size gets its turn.
#[test]
fn the_permits_held_never_sum_to_more_than_n() {
    const PERMITS: u32 = 4;
    let server = etcd();
    let endpoints = server.endpoints();
    let holds = Arc::new(std::sync::Mutex::new(Vec::<(Instant, Instant, u32)>::new()));
    let lost = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..6u64 {
        let (endpoints, holds, lost, stop) =
            (endpoints.clone(), holds.clone(), lost.clone(), stop.clone());
        workers.push(std::thread::spawn(move || {
            let c = client(&endpoints);
            let s = session(&c, 10);
            let sem = s.semaphore("churn", PERMITS).unwrap();
            let mut rng = w.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let k = 1 + (rng % u64::from(PERMITS)) as u32;
                let Ok(p) = sem.acquire_many_timeout(k, Duration::from_secs(10)) else {
                    continue;
                };
                let entered = Instant::now();
                std::thread::sleep(Duration::from_millis(5 + rng % 20));
                let left = Instant::now();
                if p.is_held() {
                    holds.lock().unwrap().push((entered, left, k));
                } else {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
                drop(p);
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let holds = holds.lock().unwrap().clone();
    let mut edges: Vec<(Instant, i64)> = holds
        .iter()
        .flat_map(|&(from, to, k)| [(from, i64::from(k)), (to, -i64::from(k))])
        .collect();
    // Exits before entries at equal times.
    edges.sort();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    let sizes: std::collections::BTreeSet<u32> = holds.iter().map(|h| h.2).collect();
    eprintln!(
        "{} holds of sizes {sizes:?}, {} lost, at most {most} permits held",
        holds.len(),
        lost.load(Ordering::Relaxed)
    );
    assert!(
        most <= i64::from(PERMITS),
        "{most} permits of {PERMITS} held"
    );
    assert_eq!(lost.load(Ordering::Relaxed), 0);
    assert_eq!(sizes.len(), PERMITS as usize, "every size held: {sizes:?}");
    assert!(holds.len() >= 30, "too little progress: {}", holds.len());
}
