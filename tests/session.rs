//! Sessions against a real etcd: keep-alive, close, orphan, resume, TTL handling and the
//! lease-loss timing property.

#![cfg(feature = "testing")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{client, etcd, eventually, session};
use etcd_sync::{Error, LossReason, MAX_TTL};

#[test]
fn keep_alive_holds_a_short_lease_for_three_ttls() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 2);
    assert_eq!(s.ttl(), Duration::from_secs(2));
    c.put_with_lease("ka/key", "v", s.lease_id()).unwrap();
    std::thread::sleep(Duration::from_secs(7)); // 3.5 TTLs
    assert!(s.is_alive(), "{:?}", s.loss_reason());
    assert!(
        c.get("ka/key").unwrap().is_some(),
        "leased key expired despite keep-alive"
    );
    assert!(s.remaining() > Duration::ZERO);
}

#[test]
fn close_removes_leased_keys_at_once() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 30);
    c.put_with_lease("close/key", "v", s.lease_id()).unwrap();
    s.close().unwrap();
    assert!(c.get("close/key").unwrap().is_none());
    assert_eq!(s.loss_reason(), Some(LossReason::Closed));
    assert!(s.lost().recv().is_err(), "lost() must be ready after close");
    // Closing twice is fine: the lease is already gone.
    s.close().unwrap();
}

/// `close()` reports a loss that came before it, with its reason, instead of `Ok`; closing
/// a session this process closed stays `Ok`, however often.
#[test]
fn close_reports_an_earlier_loss_and_is_idempotent_after_our_own() {
    let server = etcd();
    let c = client(&server.endpoints());

    // Healthy: close twice, both Ok (the second revoke finds no lease: the goal holds).
    let healthy = session(&c, 10);
    healthy.close().unwrap();
    healthy.close().unwrap();
    assert_eq!(healthy.loss_reason(), Some(LossReason::Closed));

    // Revoked elsewhere (another client takes the lease over and revokes it).
    let s = session(&c, 3);
    c.put_with_lease("close-lost/key", "v", s.lease_id())
        .unwrap();
    let other = client(&server.endpoints());
    other
        .session_builder()
        .resume(s.lease_id())
        .start()
        .unwrap()
        .close()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(3), || s.loss_reason().is_some()),
        "the keep-alive did not notice the revoke"
    );
    assert_eq!(s.loss_reason(), Some(LossReason::Revoked));
    for _ in 0..2 {
        let closed = s.close();
        assert!(
            matches!(closed, Err(Error::SessionLost(LossReason::Revoked))),
            "{closed:?}"
        );
        assert!(closed.is_err_and(|e| e.is_session_lost() && e.is_lost()));
    }
    // close() does not rewrite the reason.
    assert_eq!(s.loss_reason(), Some(LossReason::Revoked));
    assert!(c.get("close-lost/key").unwrap().is_none());

    // Orphaned: reported as such, and the lease is left alone (it may have been resumed).
    let orphaned = session(&c, 10);
    c.put_with_lease("close-orphan/key", "v", orphaned.lease_id())
        .unwrap();
    orphaned.orphan();
    let closed = orphaned.close();
    assert!(
        matches!(closed, Err(Error::SessionLost(LossReason::Orphaned))),
        "{closed:?}"
    );
    assert!(
        c.get("close-orphan/key").unwrap().is_some(),
        "close() after orphan() must not revoke"
    );
}

#[test]
fn orphan_lets_the_lease_expire() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 2);
    c.put_with_lease("orphan/key", "v", s.lease_id()).unwrap();
    s.orphan();
    assert_eq!(s.loss_reason(), Some(LossReason::Orphaned));
    assert!(
        c.get("orphan/key").unwrap().is_some(),
        "orphan must not revoke"
    );
    assert!(eventually(Duration::from_secs(6), || c
        .get("orphan/key")
        .unwrap()
        .is_none()));
}

#[test]
fn dropping_a_session_revokes_in_the_background() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 60);
    c.put_with_lease("drop/key", "v", s.lease_id()).unwrap();
    drop(s);
    assert!(eventually(Duration::from_secs(3), || c
        .get("drop/key")
        .unwrap()
        .is_none()));
}

#[test]
fn resume_a_live_lease_and_keep_it_alive() {
    let server = etcd();
    let c = client(&server.endpoints());
    let first = session(&c, 3);
    let id = first.lease_id();
    c.put_with_lease("resume/key", "v", id).unwrap();
    first.orphan();
    let second = c.session_builder().resume(id).start().unwrap();
    assert_eq!(second.lease_id(), id);
    assert_eq!(second.ttl(), Duration::from_secs(3));
    assert!(second.is_alive());
    std::thread::sleep(Duration::from_secs(5));
    assert!(second.is_alive(), "{:?}", second.loss_reason());
    assert!(c.get("resume/key").unwrap().is_some());
}

#[test]
fn resume_a_dead_lease_is_reported_lost() {
    let server = etcd();
    let c = client(&server.endpoints());
    let first = session(&c, 10);
    let id = first.lease_id();
    first.close().unwrap();
    let resumed = c.session_builder().resume(id).start();
    assert!(
        matches!(resumed, Err(Error::SessionLost(LossReason::Revoked))),
        "{resumed:?}"
    );
    assert!(matches!(
        c.session_builder().resume(-5).start(),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn ttl_below_minimum_is_raised_and_bad_ttls_are_rejected() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = c
        .session_builder()
        .ttl(Duration::from_secs(1))
        .start()
        .unwrap();
    assert_eq!(
        s.ttl(),
        Duration::from_secs(2),
        "etcd 3.4 raises TTL 1 to its minimum 2"
    );
    for bad in [
        Duration::ZERO,
        Duration::from_millis(1500),
        MAX_TTL + Duration::from_secs(1),
    ] {
        let r = c.session_builder().ttl(bad).start();
        assert!(
            matches!(r, Err(Error::InvalidArgument(_))),
            "{bad:?}: {r:?}"
        );
    }
}

#[test]
fn revoked_lease_is_reported_revoked() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 3);
    let other = client(&server.endpoints());
    // Revoke from another client: the next keep-alive answer has TTL 0.
    let resumed = other
        .session_builder()
        .resume(s.lease_id())
        .start()
        .unwrap();
    resumed.close().unwrap();
    assert!(
        s.lost()
            .recv_timeout(Duration::from_secs(3))
            .is_err_and(|e| e.is_disconnected())
    );
    assert_eq!(s.loss_reason(), Some(LossReason::Revoked));
}

/// The safety property: with etcd frozen, the session is declared lost no later than the
/// send time of the last acknowledged keep-alive + TTL (minus the margin), which is before
/// etcd could expire the lease; and it never comes back.
#[test]
fn loss_is_declared_before_the_lease_can_expire_and_is_final() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 3);
    let ttl = s.ttl();
    // Record every deadline the session reports, until it is lost.
    let seen: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let watcher = {
        let s = s.clone();
        let seen = seen.clone();
        std::thread::spawn(move || {
            while let Some(until) = s.valid_until() {
                *seen.lock().unwrap() = Some(until);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(1500)); // a few keep-alives go through
    let paused_at = Instant::now();
    server.pause().unwrap();
    let lost = s.lost().recv_timeout(ttl * 2);
    let lost_at = Instant::now();
    server.resume().unwrap();
    watcher.join().unwrap();
    assert!(
        lost.is_err_and(|e| e.is_disconnected()),
        "lost() did not fire within 2 TTLs"
    );
    assert_eq!(s.loss_reason(), Some(LossReason::Expired));
    let last_deadline = seen.lock().unwrap().expect("a deadline was seen");
    // last_deadline = send time of the last acknowledged keep-alive + TTL - margin; that
    // request was sent before etcd froze, so the server-side expiry is later than
    // paused_at + ... >= last_deadline + margin.
    let last_acked_send = last_deadline + Duration::from_millis(300) - ttl; // margin = 300 ms at TTL 3 s
    assert!(
        last_acked_send < paused_at,
        "an acknowledged request was sent after the pause?"
    );
    assert!(
        lost_at >= last_deadline,
        "declared lost before its own deadline"
    );
    assert!(
        lost_at < last_acked_send + ttl,
        "declared lost {:?} after the earliest server-side expiry",
        lost_at - (last_acked_send + ttl)
    );
    assert!(lost_at < paused_at + ttl);
    // etcd answers again: the session stays lost.
    std::thread::sleep(Duration::from_secs(2));
    assert!(!s.is_alive());
    assert_eq!(s.loss_reason(), Some(LossReason::Expired));
    assert!(s.valid_until().is_none());
    // Everything built on the session refuses to start.
    assert!(matches!(
        s.mutex("m").unwrap().lock(),
        Err(Error::SessionLost(_))
    ));
}

#[test]
fn dropping_session_and_client_together_still_revokes() {
    let server = etcd();
    let observer = client(&server.endpoints());
    let c = client(&server.endpoints());
    let s = session(&c, 60);
    c.put_with_lease("drop-both/key", "v", s.lease_id())
        .unwrap();
    drop(s); // revoke goes to the background...
    drop(c); // ...and the client waits (briefly) for it before shutting down
    assert!(observer.get("drop-both/key").unwrap().is_none());
}

/// Regression (#10): resuming a lease that has a live session in the same client used to
/// replace the keep-alive entry, and the first session's `lost()` never fired.
#[test]
fn resuming_a_lease_live_in_the_same_client_is_refused() {
    let server = common::etcd();
    let c = common::client(&server.endpoints());
    let s = common::session(&c, 10);
    assert!(matches!(
        c.session_builder().resume(s.lease_id()).start(),
        Err(etcd_sync::Error::InvalidArgument(_))
    ));
    // Another client (another process, after a restart) may take it over.
    let other = common::client(&server.endpoints());
    let taken = other
        .session_builder()
        .resume(s.lease_id())
        .start()
        .unwrap();
    assert_eq!(taken.lease_id(), s.lease_id());
    // Once the first session has ended here, resuming in this client works.
    s.orphan();
    let again = c.session_builder().resume(s.lease_id()).start().unwrap();
    assert!(again.is_alive());
}

/// Guards whose session is lost while etcd is frozen drop at once: etcd deletes their keys
/// with the lease, so `Drop` does not wait a request timeout (3 s here) for an answer that
/// cannot come; the removal goes on in the background, and no key is left once etcd is
/// back. A `MultiLockGuard` too. (Mutation testing, shard 6/10: with `drop_wait`'s
/// "inside async or lost" made "inside async and lost", each drop waited the full 3 s.)
#[test]
fn guards_of_a_lost_session_drop_at_once_while_etcd_is_frozen() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 3);
    let guard = s.mutex("frozen/one").unwrap().lock().unwrap();
    let both = s
        .multi_lock(["frozen/two", "frozen/three"])
        .unwrap()
        .lock()
        .unwrap();
    server.pause().unwrap();
    let lost = s.lost().recv_timeout(Duration::from_secs(6));
    assert!(
        lost.is_err_and(|e| e.is_disconnected()),
        "the session was not lost"
    );
    let dropped = Instant::now();
    drop(guard);
    let one = dropped.elapsed();
    let dropped = Instant::now();
    drop(both);
    let multi = dropped.elapsed();
    server.resume().unwrap();
    assert!(
        one < Duration::from_secs(1),
        "a lost guard's drop took {one:?} while etcd was frozen"
    );
    assert!(
        multi < Duration::from_secs(1),
        "a lost multi-lock guard's drop took {multi:?} while etcd was frozen"
    );
    assert!(
        eventually(Duration::from_secs(10), || c
            .get_prefix("frozen/")
            .map(|kvs| kvs.is_empty())
            .unwrap_or(false)),
        "keys left after etcd came back"
    );
}
