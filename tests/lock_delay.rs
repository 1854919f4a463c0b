//! Lock-delay (issue 15, part 4): after a holder whose lease ended (here: an `etcdctl lock`
//! frozen with SIGSTOP until its lease expired), the next holder waits the delay on top;
//! after a clean release it takes over at once.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::{ChildGuard, client, etcd, etcdctl_command, eventually, keys, session};
use etcd_sync::{CancelToken, Error, MAX_LOCK_DELAY, WaitOptions};

const DELAY: Duration = Duration::from_millis(1500);

#[test]
fn after_a_frozen_holder_expires_the_successor_waits_the_delay() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut holder = ChildGuard::spawn(etcdctl_command(
        &server.endpoint(),
        &["lock", "--ttl", "2", "ld-frozen"],
    ));
    assert!(eventually(Duration::from_secs(5), || keys(
        &c,
        "ld-frozen/"
    )
    .len()
        == 1));
    let s = session(&c, 30);
    let mutex = s.mutex("ld-frozen").unwrap().lock_delay(DELAY).unwrap();
    let waiter = thread::spawn(move || {
        let guard = mutex.lock_timeout(Duration::from_secs(20));
        (Instant::now(), guard.map(|g| g.is_held()))
    });
    assert!(eventually(Duration::from_secs(5), || keys(
        &c,
        "ld-frozen/"
    )
    .len()
        == 2));
    // Freeze etcdctl: its keep-alives stop, and etcd expires its lease after ~2 s.
    unsafe { libc::kill(holder.child().id() as i32, libc::SIGSTOP) };
    let frozen = Instant::now();
    let mut deleted = None;
    while frozen.elapsed() < Duration::from_secs(10) {
        if keys(&c, "ld-frozen/").len() < 2 {
            deleted = Some(Instant::now());
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    let deleted = deleted.expect("the frozen holder's lease never expired");
    let (acquired, held) = waiter.join().unwrap();
    assert!(held.unwrap(), "the successor's guard was not held");
    let after = acquired.duration_since(deleted);
    assert!(
        after + Duration::from_millis(50) >= DELAY,
        "took over {after:?} after the expiry, before the {DELAY:?} lock-delay"
    );
    assert!(
        after < DELAY + Duration::from_secs(2),
        "took over {after:?} after the expiry"
    );
    holder.kill();
}

#[test]
fn a_clean_release_hands_over_at_once_and_bad_delays_are_refused() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (a, b) = (session(&c, 30), session(&c, 30));
    let held = a.mutex("ld-clean").unwrap().lock().unwrap();
    let long = Duration::from_secs(5);
    let mutex = b.mutex("ld-clean").unwrap().lock_delay(long).unwrap();
    let waiter = thread::spawn(move || {
        let guard = mutex.lock_timeout(Duration::from_secs(20));
        (Instant::now(), guard.map(|g| g.fencing_token()))
    });
    assert!(eventually(Duration::from_secs(5), || keys(&c, "ld-clean/")
        .len()
        == 2));
    let released = Instant::now();
    held.unlock().unwrap();
    let (acquired, token) = waiter.join().unwrap();
    assert!(token.is_ok());
    assert!(
        acquired.duration_since(released) < Duration::from_secs(1),
        "a clean release took {:?} to hand over",
        acquired.duration_since(released)
    );

    let too_long = a
        .mutex("x")
        .unwrap()
        .lock_delay(MAX_LOCK_DELAY + Duration::from_millis(1));
    assert!(
        matches!(too_long, Err(Error::InvalidArgument(_))),
        "{too_long:?}"
    );
    assert!(
        a.semaphore("x2", 2)
            .unwrap()
            .lock_delay(MAX_LOCK_DELAY)
            .is_ok()
    );
    assert!(
        a.rwlock("x3")
            .unwrap()
            .lock_delay(Duration::from_secs(3600))
            .is_err()
    );
}

#[test]
fn a_cancel_during_the_delay_ends_the_wait_and_leaves_no_key() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (a, b) = (session(&c, 30), session(&c, 30));
    let held = a.rwlock("ld-cancel").unwrap().write().unwrap();
    let rw = b
        .rwlock("ld-cancel")
        .unwrap()
        .lock_delay(Duration::from_secs(30))
        .unwrap();
    let token = CancelToken::new();
    let t = token.clone();
    let waiter = thread::spawn(move || {
        let options = WaitOptions::new()
            .timeout(Duration::from_secs(60))
            .cancel_token(&t);
        rw.read_with(options).map(drop)
    });
    assert!(eventually(Duration::from_secs(5), || keys(
        &c,
        "ld-cancel/"
    )
    .len()
        == 2));
    // The writer's lease ends: the reader is in its lock-delay.
    a.close().unwrap();
    assert!(eventually(Duration::from_secs(5), || keys(
        &c,
        "ld-cancel/"
    )
    .len()
        == 1));
    thread::sleep(Duration::from_millis(300));
    assert!(
        !waiter.is_finished(),
        "the reader did not wait out its lock-delay"
    );
    let cancelled = Instant::now();
    token.cancel();
    let result = waiter.join().unwrap();
    assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    assert!(cancelled.elapsed() < Duration::from_secs(2));
    assert!(eventually(Duration::from_secs(5), || keys(
        &c,
        "ld-cancel/"
    )
    .is_empty()));
    assert!(!held.is_held());
}
