//! The counting semaphore against real etcd: at most N holders, FIFO, no herd, agreement
//! on N, and exclusion with `Mutex` and `etcdctl lock`.

#![cfg(feature = "testing")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{
    ChildGuard, client, cluster, etcd, etcdctl_command, events_delivered, eventually, handled,
    keys, session, try_client_for,
};
use etcd_sync::{Error, TryLockError};

#[test]
fn n_holders_at_once_and_the_next_waits() {
    let server = etcd();
    let c = client(&server.endpoints());
    let sessions: Vec<_> = (0..4).map(|_| session(&c, 10)).collect();
    let permits: Vec<_> = sessions[..3]
        .iter()
        .map(|s| {
            s.semaphore("sem", 3)
                .unwrap()
                .try_acquire()
                .expect("a free permit")
        })
        .collect();
    assert!(permits.iter().all(|p| p.is_held()));
    assert!(permits[0].key_str().ends_with(".permits-3"));
    let fourth = sessions[3].semaphore("sem", 3).unwrap();
    assert_eq!(fourth.permits(), 3);
    let holders = fourth.status().unwrap().holders;
    let tokens: Vec<i64> = permits.iter().map(|p| p.fencing_token()).collect();
    assert_eq!(
        holders
            .iter()
            .map(|h| h.create_revision)
            .collect::<Vec<_>>(),
        tokens
    );
    assert!(matches!(
        fourth.try_acquire(),
        Err(TryLockError::WouldBlock)
    ));
    assert_eq!(
        keys(&c, "sem/").len(),
        3,
        "a failed try_acquire leaves no key"
    );
    let timed = fourth.acquire_timeout(Duration::from_millis(300));
    assert!(
        timed.as_ref().is_err_and(Error::is_wait_timeout),
        "{timed:?}"
    );
    assert_eq!(
        keys(&c, "sem/").len(),
        3,
        "a timed-out acquire leaves no key"
    );
    let waiter = std::thread::spawn(move || fourth.acquire());
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "a fourth holder of three permits");
    // Releasing any permit lets the waiter in: the middle one here.
    let mut permits = permits;
    permits.remove(1).release().unwrap();
    let p = waiter.join().unwrap().unwrap();
    assert!(p.fencing_token() > tokens[2]);
    drop(permits);
    drop(p);
    assert!(keys(&c, "sem/").is_empty());
}

#[test]
fn waiters_are_served_in_arrival_order() {
    let server = etcd();
    let c = client(&server.endpoints());
    let holder_sessions = [session(&c, 10), session(&c, 10)];
    let mut held: Vec<_> = holder_sessions
        .iter()
        .map(|s| s.semaphore("fifo", 2).unwrap().acquire().unwrap())
        .collect();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let s = session(&c, 10);
        let order = order.clone();
        waiters.push(std::thread::spawn(move || {
            let p = s.semaphore("fifo", 2).unwrap().acquire().unwrap();
            order.lock().unwrap().push(i);
            std::thread::sleep(Duration::from_millis(200));
            drop(p);
            drop(s);
        }));
        // Queue one after the other.
        assert!(eventually(Duration::from_secs(5), || keys(&c, "fifo/")
            .len()
            == 3 + i));
    }
    drop(held.remove(0));
    for w in waiters {
        w.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    drop(held);
}

#[test]
fn a_participant_with_another_number_of_permits_is_refused() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2) = (session(&c, 10), session(&c, 10));
    let p = s1.semaphore("agree", 2).unwrap().acquire().unwrap();
    for result in [
        s2.semaphore("agree", 3).unwrap().acquire().map(|_| ()),
        s2.semaphore("agree", 1)
            .unwrap()
            .try_acquire()
            .map(|_| ())
            .map_err(|e| match e {
                TryLockError::Error(e) => e,
                TryLockError::WouldBlock => panic!("WouldBlock instead of a refusal"),
            }),
    ] {
        match result {
            Err(Error::InvalidArgument(why)) => {
                assert!(why.contains("permits"), "{why}");
                assert!(why.contains(&*p.key_str()), "{why} names the other key");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
    assert_eq!(keys(&c, "agree/"), vec![p.key_str().into_owned()]);
    assert!(matches!(
        s2.semaphore("agree", 0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        s2.semaphore("agree", 1025),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn one_permit_is_a_mutex_and_etcdctl_lock_excludes_every_permit() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2, s3) = (session(&c, 10), session(&c, 10), session(&c, 10));
    let one = s1.semaphore("one", 1).unwrap().acquire().unwrap();
    assert!(matches!(
        s2.semaphore("one", 1).unwrap().try_acquire(),
        Err(TryLockError::WouldBlock)
    ));
    assert!(matches!(
        s2.mutex("one").unwrap().try_lock(),
        Err(TryLockError::WouldBlock)
    ));
    drop(one);
    // Two permits held: etcdctl lock waits for both.
    let a = s1.semaphore("many", 2).unwrap().acquire().unwrap();
    let b = s2.semaphore("many", 2).unwrap().acquire().unwrap();
    let mut child = ChildGuard::spawn(etcdctl_command(
        &server.endpoint(),
        &["lock", "many", "--", "echo", "got-it"],
    ));
    std::thread::sleep(Duration::from_millis(800));
    drop(a);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.child().try_wait().unwrap().is_none(),
        "etcdctl took the lock while a permit was held"
    );
    // And a later permit waits behind etcdctl's queued key.
    let late = s3.semaphore("many", 2).unwrap();
    assert!(matches!(late.try_acquire(), Err(TryLockError::WouldBlock)));
    drop(b);
    let out = child.take().wait_with_output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("got-it"));
    assert!(late.try_acquire().is_ok());
}

/// Sessions churn on a 3-permit semaphore while members of the cluster are killed and
/// restarted: never more than 3 holders at once (counting every hold that was still ours
/// when it ended), and progress.
#[test]
fn at_most_n_holders_under_churn_and_member_faults() {
    const PERMITS: usize = 3;
    let cl = cluster();
    let endpoints = cl.endpoints();
    let holds = Arc::new(std::sync::Mutex::new(Vec::<(Instant, Instant)>::new()));
    let lost = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..8u64 {
        let (endpoints, holds, lost, failed, stop) = (
            endpoints.clone(),
            holds.clone(),
            lost.clone(),
            failed.clone(),
            stop.clone(),
        );
        workers.push(std::thread::spawn(move || {
            let c = try_client_for(&endpoints, Duration::from_millis(800)).expect("client");
            let mut rng = w.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            while !stop.load(Ordering::Relaxed) {
                let Ok(s) = c.session_builder().ttl(Duration::from_secs(5)).start() else {
                    failed.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                };
                let sem = s.semaphore("churn", PERMITS as u32).unwrap();
                for _ in 0..5 {
                    let Ok(p) = sem.acquire_timeout(Duration::from_secs(5)) else {
                        failed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let entered = Instant::now();
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    std::thread::sleep(Duration::from_millis(5 + rng % 40));
                    // Still ours at the end means ours throughout: the session's deadline
                    // only moves forward, and a deleted key stays deleted.
                    let left = Instant::now();
                    if p.is_held() {
                        holds.lock().unwrap().push((entered, left));
                    } else {
                        lost.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = p.release();
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                let _ = s.close();
            }
        }));
    }
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    for member in [0, 1] {
        cl.kill(member).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        cl.restart(member).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let holds = holds.lock().unwrap().clone();
    // The most holds that overlap at one instant: entries before exits at equal times
    // would overcount, so exits sort first.
    let mut edges: Vec<(Instant, i32)> = holds
        .iter()
        .flat_map(|&(from, to)| [(from, 1), (to, -1)])
        .collect();
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    let (lost, failed) = (lost.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!(
        "{} holds, {lost} lost, {failed} failed waits, at most {most} holders, in {:?}",
        holds.len(),
        started.elapsed()
    );
    assert!(
        most as usize <= PERMITS,
        "{most} holders of {PERMITS} permits"
    );
    assert!(most >= 2, "the permits were never shared: {most}");
    assert!(holds.len() >= 50, "too little progress: {}", holds.len());
    assert!(
        failed + lost <= holds.len(),
        "{failed} failed waits and {lost} lost holds against {} holds",
        holds.len()
    );
}

/// The costs issue 14 sets: an uncontended acquire is 1 Txn and a release 1 Txn; with 16
/// waiters behind two permits, a release hands one permit to exactly one waiter, with no
/// read (no herd: the other waiters are not woken to read again), and etcd sends the
/// delete to this client once, not once per waiter. The same for a write lock handed to the
/// readers queued behind it. (`scripts/bench-compare --only herd` measures 256 waiters.)
#[test]
fn acquire_and_release_cost_one_txn_and_a_release_wakes_only_who_can_hold() {
    let server = etcd();
    let c = client(&server.endpoints());
    let metrics = || server.metrics().unwrap();
    let count = |method| handled(&metrics(), method);
    let holders = [session(&c, 30), session(&c, 30)];
    let (txn0, range0) = (count("Txn"), count("Range"));
    let p = holders[0].semaphore("cost", 2).unwrap().acquire().unwrap();
    assert_eq!(count("Txn") - txn0, 1, "uncontended acquire = 1 Txn");
    drop(p);
    assert_eq!(count("Txn") - txn0, 2, "release = 1 Txn");
    assert_eq!(count("Range") - range0, 0);

    let mut held: Vec<_> = holders
        .iter()
        .map(|s| s.semaphore("cost", 2).unwrap().acquire().unwrap())
        .collect();
    let waiters: Vec<_> = (0..16)
        .map(|_| {
            let s = session(&c, 30);
            std::thread::spawn(move || {
                let p = s.semaphore("cost", 2).unwrap().acquire();
                (p, s)
            })
        })
        .collect();
    assert!(eventually(Duration::from_secs(5), || keys(&c, "cost/")
        .len()
        == 18));
    // Past every waiter's double-check window for a just-created watcher.
    std::thread::sleep(Duration::from_millis(600));
    let events = || events_delivered(&metrics());
    let (txn1, range1, events1) = (count("Txn"), count("Range"), events());
    drop(held.remove(0));
    assert!(eventually(Duration::from_secs(5), || waiters
        .iter()
        .filter(|w| w.is_finished())
        .count()
        == 1));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        waiters.iter().filter(|w| w.is_finished()).count(),
        1,
        "one released permit admitted more than one waiter"
    );
    assert_eq!(count("Txn") - txn1, 1, "only the release");
    assert_eq!(count("Range") - range1, 0, "no waiter read again");
    let delivered = events() - events1;
    assert!(
        (1..=2).contains(&delivered),
        "one client's 16 waiters share one watcher, yet the release was delivered {delivered} times"
    );
    drop(held);
    // Each waiter returns its permit still held: release them in the order they are
    // admitted, which need not be the order the threads were started in (waiting for an
    // unadmitted one while two admitted ones hold both permits would wait forever).
    let (mut waiters, mut admitted) = (waiters, 0);
    let drained = eventually(Duration::from_secs(30), || {
        while let Some(i) = waiters.iter().position(|w| w.is_finished()) {
            let (p, s) = waiters.swap_remove(i).join().unwrap();
            drop(p.unwrap());
            drop(s);
            admitted += 1;
        }
        waiters.is_empty()
    });
    assert!(drained, "{} waiters never admitted", waiters.len());
    assert_eq!(admitted, 16);

    // A write lock with readers queued behind it: its release admits all of them at once.
    let writer = session(&c, 30);
    let w = writer.rwlock("cost-rw").unwrap().write().unwrap();
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let s = session(&c, 30);
            std::thread::spawn(move || {
                let r = s.rwlock("cost-rw").unwrap().read();
                std::thread::sleep(Duration::from_millis(500));
                (r.map(|r| r.is_held()), s)
            })
        })
        .collect();
    assert!(eventually(Duration::from_secs(5), || keys(&c, "cost-rw/")
        .len()
        == 9));
    std::thread::sleep(Duration::from_millis(600));
    let (range2, events2) = (count("Range"), events());
    drop(w);
    // Read while the readers still hold (500 ms): their own releases are deletes too.
    std::thread::sleep(Duration::from_millis(200));
    let delivered = events() - events2;
    for r in readers {
        let (held_together, _s) = r.join().unwrap();
        assert!(held_together.unwrap(), "a reader lost its lock");
    }
    assert_eq!(
        count("Range") - range2,
        0,
        "readers were admitted without a read"
    );
    assert!(
        (1..=2).contains(&delivered),
        "8 readers on one client, yet the release was delivered {delivered} times"
    );
}

/// A permit joining a long line reads only the newest keys ahead of it in its enqueue
/// (`FRONT` + N + 1 of them), not every key: what etcd sends it stays a few keys long however
/// many permits wait ahead (it was one key per permit ahead, about 20 KB here). The permit
/// still waits its turn (here the limit ends the wait) and removes its key.
#[test]
fn a_permit_behind_a_long_line_is_told_only_the_newest_keys_ahead() {
    let server = etcd();
    let c = client(&server.endpoints());
    const AHEAD: usize = 400;
    for i in 1..=AHEAD {
        c.put(format!("long/{i:016x}.permits-2"), "").unwrap();
    }
    let sent = || {
        let text = server.metrics().unwrap();
        let metrics = etcd_sync::testing::metrics::parse(&text).expect("etcd's /metrics text");
        metrics.sum("etcd_network_client_grpc_sent_bytes_total", &[]) as u64
    };
    let s = session(&c, 30);
    let sem = s.semaphore("long", 2).unwrap();
    let before = sent();
    let started = Instant::now();
    let waited = sem.acquire_timeout(Duration::from_millis(300));
    assert!(
        matches!(waited, Err(ref e) if e.is_timeout()),
        "400 permits ahead of a semaphore of 2: {:?}",
        waited.map(|p| p.num_permits())
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    let bytes = sent() - before;
    eprintln!("a permit behind {AHEAD} others: etcd sent {bytes} bytes");
    assert!(
        bytes < 6_000,
        "etcd sent {bytes} bytes to a permit joining a line of {AHEAD}"
    );
    assert!(eventually(Duration::from_secs(5), || keys(&c, "long/")
        .len()
        == AHEAD));
}
