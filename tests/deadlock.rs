//! The opt-in `Deadlock` error (`ClientBuilder::deadlock_detection`), against real etcd:
//! two sessions that each hold one mutex and wait for the other's: exactly one wait (the
//! youngest) ends with `Deadlock` naming both, within about a second, leaves no key, and
//! the other then gets its lock; a ring of three ends its youngest wait only; a chain of
//! waits never fires, however long its head holds; and without the option the same
//! deadlock ends only by the waits' own limits.

#![cfg(feature = "testing")]

mod common;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{etcd, eventually, keys};
use etcd_sync::{CancelToken, Client, Error, Session, WaitOptions};

const TTL: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(15);
/// How long a wait on a thread waits at most: far beyond any check, so that only a
/// `Deadlock` (or the test's own releases) ends it.
const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// A client (one per session: as separate processes) that checks for deadlocks under `d/`.
fn detecting(endpoints: &[String]) -> Client {
    Client::builder()
        .endpoints(endpoints)
        .request_timeout(Duration::from_secs(3))
        .deadlock_detection("d/")
        .connect()
        .expect("connect to the test etcd")
}

fn named(c: &Client, identity: &str) -> Session {
    c.session_builder()
        .ttl(TTL)
        .identity(identity)
        .start()
        .expect("start a session")
}

/// `session` waits for the mutex `name` on a thread for at most [`WAIT_LIMIT`], and
/// releases it at once if it gets it; with the time its wait took.
fn wait_for(session: &Session, name: &str) -> JoinHandle<(etcd_sync::Result<()>, Duration)> {
    let m = session.mutex(name).unwrap();
    std::thread::spawn(move || {
        let at = Instant::now();
        let result = m.lock_timeout(WAIT_LIMIT).map(drop);
        (result, at.elapsed())
    })
}

#[test]
fn of_two_sessions_waiting_for_each_other_the_youngest_wait_ends() {
    let server = etcd();
    let (ca, cb) = (
        detecting(&server.endpoints()),
        detecting(&server.endpoints()),
    );
    let (a, b) = (named(&ca, "proc-a"), named(&cb, "proc-b"));
    let x = a.mutex("d/x").unwrap().lock().unwrap();
    let y = b.mutex("d/y").unwrap().lock().unwrap();
    let a_waits = wait_for(&a, "d/y");
    assert!(eventually(WAIT, || keys(&ca, "d/y/").len() == 2));
    // b's wait closes the cycle, and its key is the youngest: it ends, a's does not.
    let b_waits = wait_for(&b, "d/x");
    let (result, took) = b_waits.join().unwrap();
    let e = result.expect_err("b's wait closes a cycle");
    assert!(e.is_deadlock(), "{e}");
    assert!(took < Duration::from_secs(2), "Deadlock after {took:?}");
    eprintln!("two sessions: Deadlock after {took:?}: {e}");
    assert!(!e.is_retryable() && !e.is_lost());
    let Error::Deadlock { cycle, revision } = &e else {
        panic!("{e:?}")
    };
    assert!(*revision > 0);
    assert_eq!(e.deadlock_cycle(), Some(cycle));
    let mut steps: Vec<_> = cycle
        .steps
        .iter()
        .map(|s| {
            (
                s.lease,
                s.name_str().into_owned(),
                s.holder,
                s.identity.clone(),
            )
        })
        .collect();
    steps.sort();
    let mut expected = vec![
        (
            a.lease_id(),
            "d/y".to_string(),
            b.lease_id(),
            Some("proc-a".to_string()),
        ),
        (
            b.lease_id(),
            "d/x".to_string(),
            a.lease_id(),
            Some("proc-b".to_string()),
        ),
    ];
    expected.sort();
    assert_eq!(steps, expected, "{e}");
    assert!(e.to_string().contains("proc-b"), "{e}");
    // No key of b's wait is left behind: d/x has a's key only.
    assert_eq!(keys(&ca, "d/x/"), [format!("d/x/{:x}", a.lease_id())]);
    // a's wait goes on: still waiting after more checks than it takes.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!a_waits.is_finished(), "a's wait ended too");
    // b lets go of y (the victim releases): a gets it.
    drop(y);
    let (result, _) = a_waits.join().unwrap();
    result.expect("a gets d/y once b let go");
    drop(x);
    assert!(keys(&ca, "d/").is_empty(), "{:?}", keys(&ca, "d/"));
}

#[test]
fn a_ring_of_three_ends_its_youngest_wait_only() {
    let server = etcd();
    let clients: Vec<Client> = (0..3).map(|_| detecting(&server.endpoints())).collect();
    let (a, b, c) = (
        named(&clients[0], "a"),
        named(&clients[1], "b"),
        named(&clients[2], "c"),
    );
    let x = a.mutex("d/x").unwrap().lock().unwrap();
    let y = b.mutex("d/y").unwrap().lock().unwrap();
    let z = c.mutex("d/z").unwrap().lock().unwrap();
    let a_waits = wait_for(&a, "d/y");
    let b_waits = wait_for(&b, "d/z");
    assert!(eventually(WAIT, || keys(&clients[0], "d/").len() == 5));
    let c_waits = wait_for(&c, "d/x");
    let (result, took) = c_waits.join().unwrap();
    let e = result.expect_err("c's wait closes the ring");
    assert!(e.is_deadlock(), "{e}");
    assert!(took < Duration::from_secs(2), "Deadlock after {took:?}");
    eprintln!("three sessions: Deadlock after {took:?}");
    let mut leases: Vec<i64> = e.deadlock_cycle().unwrap().leases().collect();
    leases.sort_unstable();
    let mut expected = vec![a.lease_id(), b.lease_id(), c.lease_id()];
    expected.sort_unstable();
    assert_eq!(leases, expected, "{e}");
    assert_eq!(
        keys(&clients[0], "d/x/"),
        [format!("d/x/{:x}", a.lease_id())]
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!a_waits.is_finished() && !b_waits.is_finished());
    // c lets go: b gets z (and lets go of it), then b lets go of y: a gets y.
    drop(z);
    b_waits.join().unwrap().0.expect("b gets d/z");
    drop(y);
    a_waits.join().unwrap().0.expect("a gets d/y");
    drop(x);
}

#[test]
fn a_chain_of_waits_never_fires() {
    let server = etcd();
    let clients: Vec<Client> = (0..3).map(|_| detecting(&server.endpoints())).collect();
    let (a, b, c) = (
        named(&clients[0], "a"),
        named(&clients[1], "b"),
        named(&clients[2], "c"),
    );
    // c holds z; b holds y and waits for z; a waits for y.
    let z = c.mutex("d/z").unwrap().lock().unwrap();
    let y = b.mutex("d/y").unwrap().lock().unwrap();
    let b_waits = wait_for(&b, "d/z");
    let a_waits = wait_for(&a, "d/y");
    assert!(eventually(WAIT, || keys(&clients[0], "d/").len() == 4));
    // c holds for several seconds: every wait checks several times, and none ends.
    std::thread::sleep(Duration::from_secs(5));
    assert!(!a_waits.is_finished() && !b_waits.is_finished());
    drop(z);
    b_waits.join().unwrap().0.expect("b gets d/z");
    drop(y);
    a_waits.join().unwrap().0.expect("a gets d/y");
}

#[test]
fn without_the_option_a_deadlock_waits_out_its_limits() {
    let server = etcd();
    let plain = || {
        Client::builder()
            .endpoints(server.endpoints())
            .connect()
            .unwrap()
    };
    let (ca, cb) = (plain(), plain());
    let (a, b) = (named(&ca, "a"), named(&cb, "b"));
    let _x = a.mutex("d/x").unwrap().lock().unwrap();
    let _y = b.mutex("d/y").unwrap().lock().unwrap();
    let limited = |s: &Session, name: &str| {
        let m = s.mutex(name).unwrap();
        std::thread::spawn(move || m.lock_timeout(Duration::from_secs(3)).map(drop))
    };
    let a_waits = limited(&a, "d/y");
    assert!(eventually(WAIT, || keys(&ca, "d/y/").len() == 2));
    let b_waits = limited(&b, "d/x");
    // The graph sees the cycle; nobody ends for it.
    assert!(eventually(WAIT, || ca
        .wait_graph("d/")
        .unwrap()
        .cycles
        .len()
        == 1));
    for waits in [a_waits, b_waits] {
        let e = waits.join().unwrap().expect_err("a deadlock");
        assert!(e.is_wait_timeout() && !e.is_deadlock(), "{e}");
    }
    assert_eq!(keys(&ca, "d/").len(), 2);
}

#[test]
fn names_outside_the_prefix_are_not_checked() {
    let server = etcd();
    let (ca, cb) = (
        detecting(&server.endpoints()),
        detecting(&server.endpoints()),
    );
    let (a, b) = (named(&ca, "a"), named(&cb, "b"));
    let _x = a.mutex("other/x").unwrap().lock().unwrap();
    let _y = b.mutex("other/y").unwrap().lock().unwrap();
    let limited = |s: &Session, name: &str| {
        let m = s.mutex(name).unwrap();
        std::thread::spawn(move || m.lock_timeout(Duration::from_secs(3)).map(drop))
    };
    let a_waits = limited(&a, "other/y");
    assert!(eventually(WAIT, || keys(&ca, "other/y/").len() == 2));
    let b_waits = limited(&b, "other/x");
    for waits in [a_waits, b_waits] {
        let e = waits.join().unwrap().expect_err("a deadlock");
        assert!(e.is_wait_timeout(), "{e}");
    }
}

#[test]
fn a_read_write_lock_and_a_semaphore_close_cycles_too() {
    let server = etcd();
    let (ca, cb) = (
        detecting(&server.endpoints()),
        detecting(&server.endpoints()),
    );
    let (a, b) = (named(&ca, "a"), named(&cb, "b"));
    // a reads d/r and holds d/s's only permit; b holds d/x.
    let read = a.rwlock("d/r").unwrap().read().unwrap();
    let permit = a.semaphore("d/s", 1).unwrap().acquire().unwrap();
    let x = b.mutex("d/x").unwrap().lock().unwrap();
    let a_waits = wait_for(&a, "d/x");
    assert!(eventually(WAIT, || keys(&ca, "d/x/").len() == 2));
    // b waits to write d/r behind a's read: a cycle, b's wait the youngest.
    let write = b.rwlock("d/r").unwrap();
    let at = Instant::now();
    let e = write
        .write_timeout(WAIT_LIMIT)
        .map(drop)
        .expect_err("a cycle");
    assert!(e.is_deadlock(), "{e}");
    assert!(at.elapsed() < Duration::from_secs(2), "{:?}", at.elapsed());
    assert_eq!(keys(&cb, "d/r/").len(), 1, "b's writer key is gone");
    // And for d/s's permit: the same.
    let sem = b.semaphore("d/s", 1).unwrap();
    let e = sem
        .acquire_timeout(WAIT_LIMIT)
        .map(drop)
        .expect_err("a cycle");
    assert!(e.is_deadlock(), "{e}");
    assert_eq!(keys(&cb, "d/s/").len(), 1, "b's permit key is gone");
    // b lets go of x: a gets it.
    drop(x);
    a_waits.join().unwrap().0.expect("a gets d/x");
    drop((read, permit));
}

/// A key of a session's lease that no guard of its holds (a leftover of an earlier life,
/// or a release whose answer is still due) is on its way out: a cycle of waits through it
/// ends no wait.
#[test]
fn a_cycle_through_a_key_of_ours_that_nobody_here_holds_ends_no_wait() {
    let server = etcd();
    let (ca, cb) = (
        detecting(&server.endpoints()),
        detecting(&server.endpoints()),
    );
    let (a, b) = (named(&ca, "proc-a"), named(&cb, "proc-b"));
    // a's leftover on `d/x`: a key of its lease that no guard of a holds.
    let leftover = format!("d/x/{:x}", a.lease_id());
    let put = etcd_sync::TxnOp::put_with_lease(leftover.as_str(), "", a.lease_id());
    assert!(
        ca.txn(etcd_sync::Txn::new().and_then([put]))
            .unwrap()
            .succeeded
    );
    let y = b.mutex("d/y").unwrap().lock().unwrap();
    let b_waits = wait_for(&b, "d/x");
    assert!(eventually(WAIT, || keys(&ca, "d/x/").len() == 2));
    // a waits behind b, b behind a's leftover: a cycle only through a key on its way out.
    let a_waits = wait_for(&a, "d/y");
    assert!(eventually(WAIT, || keys(&ca, "d/y/").len() == 2));
    // A deadlock would end a wait within about 1.5 s (a check a second, confirmed 250 ms
    // later).
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        !a_waits.is_finished(),
        "a's wait ended: {:?}",
        a_waits.join()
    );
    assert!(
        !b_waits.is_finished(),
        "b's wait ended: {:?}",
        b_waits.join()
    );
    // Gone, the leftover lets b through, then y's release lets a through.
    assert_eq!(ca.delete(&leftover).unwrap(), 1);
    let (b_result, _) = b_waits.join().unwrap();
    assert!(b_result.is_ok(), "{b_result:?}");
    drop(y);
    let (a_result, _) = a_waits.join().unwrap();
    assert!(a_result.is_ok(), "{a_result:?}");
}

/// A cycle through a shared line that a session outside the cycle holds too: a and x read
/// `d/r`, b holds `d/m` and waits to write `d/r`, then a waits for `d/m`. Were x to let go,
/// b would still wait for a: a's wait (the youngest) ends. Of the keys b waits behind only
/// a's own read is a's to vouch for; x's is no key of a's on its way out. (Mutation
/// testing, shard 4/10: with x's key counted among a's, the check took the cycle for one
/// on its way out and a waited out its limit.)
#[test]
fn a_cycle_through_a_read_lock_another_session_also_holds_ends_the_youngest_wait() {
    let server = etcd();
    let (ca, cb, cx) = (
        detecting(&server.endpoints()),
        detecting(&server.endpoints()),
        detecting(&server.endpoints()),
    );
    let (a, b, x) = (named(&ca, "a"), named(&cb, "b"), named(&cx, "x"));
    let a_read = a.rwlock("d/r").unwrap().read().unwrap();
    let x_read = x.rwlock("d/r").unwrap().read().unwrap();
    let m = b.mutex("d/m").unwrap().lock().unwrap();
    let write = b.rwlock("d/r").unwrap();
    let b_writes = std::thread::spawn(move || write.write_timeout(WAIT_LIMIT).map(drop));
    assert!(eventually(WAIT, || keys(&ca, "d/r/").len() == 3));
    let (result, took) = wait_for(&a, "d/m").join().unwrap();
    let e = result.expect_err("a's wait closes a cycle");
    assert!(e.is_deadlock(), "{e}");
    assert!(took < Duration::from_secs(2), "Deadlock after {took:?}");
    let mut leases: Vec<i64> = e.deadlock_cycle().unwrap().leases().collect();
    leases.sort_unstable();
    let mut expected = vec![a.lease_id(), b.lease_id()];
    expected.sort_unstable();
    assert_eq!(leases, expected, "{e}");
    // b's wait goes on behind both reads, and takes the write once both let go.
    drop(a_read);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!b_writes.is_finished(), "b wrote past x's read");
    drop(x_read);
    b_writes
        .join()
        .unwrap()
        .expect("b writes d/r once both reads let go");
    drop(m);
}

/// A cycle that one check sees and the confirming read does not ends no wait: a holds
/// `d/x` and waits for `d/y`, b holds `d/y` and waits for `d/x` (the youngest wait), and
/// a's wait is cancelled as soon as b's key is in the line, well inside the 250 ms before
/// b's check reads again. b waits on and takes `d/x` when a lets go. (Mutation testing,
/// shard 3/10: with the first sight of a cycle taken as proof, b's wait ended with
/// `Deadlock` on a cycle that had already undone itself.)
#[test]
fn a_cycle_that_one_check_sees_and_the_next_does_not_ends_no_wait() {
    let server = etcd();
    let (ca, cb) = (
        detecting(&server.endpoints()),
        detecting(&server.endpoints()),
    );
    let (a, b) = (named(&ca, "a"), named(&cb, "b"));
    let x = a.mutex("d/x").unwrap().lock().unwrap();
    let y = b.mutex("d/y").unwrap().lock().unwrap();
    let token = CancelToken::new();
    let a_waits = {
        let m = a.mutex("d/y").unwrap();
        let options = WaitOptions::new().timeout(WAIT_LIMIT).cancel_token(&token);
        std::thread::spawn(move || m.lock_with(options).map(drop))
    };
    assert!(eventually(WAIT, || keys(&ca, "d/y/").len() == 2));
    let b_waits = wait_for(&b, "d/x");
    assert!(eventually(WAIT, || keys(&ca, "d/x/").len() == 2));
    token.cancel();
    let cancelled = a_waits.join().unwrap();
    assert!(cancelled.is_err_and(|e| e.is_cancelled()));
    // Past a check, its confirmation and the next check.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !b_waits.is_finished(),
        "b's wait ended: {:?}",
        b_waits.join()
    );
    drop(x);
    let (result, _) = b_waits.join().unwrap();
    assert!(result.is_ok(), "b gets d/x once a lets go: {result:?}");
    drop(y);
}
