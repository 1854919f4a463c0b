//! The `metrics` feature against real etcd: what each event records, read back from a
//! recorder installed for this test binary. Every test uses names of its own, so tests
//! running side by side do not see each other's series (the unlabelled keep-alive gauge
//! and re-authentication counter are only checked for being set).

#![cfg(all(feature = "testing", feature = "metrics"))]

#[path = "../common/mod.rs"]
mod common;
mod recorder;

use std::time::Duration;

use common::{client, cluster, etcd, eventually, keys, session};
use etcd_sync::metric_names::*;
use recorder::recorded;

/// Waits for `lost` to fire.
fn fires(lost: &etcd_sync::crossbeam_channel::Receiver<()>, limit: Duration) -> bool {
    matches!(
        lost.recv_timeout(limit),
        Err(etcd_sync::crossbeam_channel::RecvTimeoutError::Disconnected)
    )
}

/// A guard older than this is followed by the client's follow task (200 ms, with room).
const FOLLOWED: Duration = Duration::from_millis(600);

#[test]
fn an_uncontended_lock_records_an_acquisition_its_wait_and_its_hold_time() {
    let m = recorded();
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let labels = [(NAME, "metrics/free"), (PRIMITIVE, "mutex")];
    let guard = s.mutex("metrics/free").unwrap().lock().unwrap();
    assert_eq!(m.counter(ACQUISITIONS, &labels), 1);
    let waits = m.samples(WAIT_SECONDS, &labels);
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert!(waits[0] >= 0.0 && waits[0] < 3.0, "{waits:?}");
    assert!(m.samples(HOLD_SECONDS, &labels).is_empty());
    std::thread::sleep(Duration::from_millis(300));
    guard.release().unwrap();
    let holds = m.samples(HOLD_SECONDS, &labels);
    assert_eq!(holds.len(), 1, "{holds:?}");
    assert!(holds[0] >= 0.3 && holds[0] < 5.0, "{holds:?}");
    assert_eq!(m.counter(LOSSES, &labels), 0);
}

#[test]
fn a_contended_lock_records_a_wait_as_long_as_the_holder_kept_it() {
    let m = recorded();
    let server = etcd();
    let c = client(&server.endpoints());
    let (holder, waiter) = (session(&c, 10), session(&c, 10));
    let labels = [(NAME, "metrics/busy"), (PRIMITIVE, "mutex")];
    let guard = holder.mutex("metrics/busy").unwrap().lock().unwrap();
    let wm = waiter.mutex("metrics/busy").unwrap();
    let t = std::thread::spawn(move || wm.lock().map(drop));
    // The waiter's key is in the line: its wait began before this point.
    assert!(eventually(Duration::from_secs(5), || {
        keys(&c, "metrics/busy/").len() == 2
    }));
    let held_after_waiter_joined = Duration::from_secs(1);
    std::thread::sleep(held_after_waiter_joined);
    drop(guard);
    t.join().unwrap().expect("the waiter acquires");
    assert_eq!(m.counter(ACQUISITIONS, &labels), 2);
    let holds = m.samples(HOLD_SECONDS, &labels);
    let waits = m.samples(WAIT_SECONDS, &labels);
    // The holder released first; the waiter released at once.
    assert_eq!((holds.len(), waits.len()), (2, 2), "{holds:?} {waits:?}");
    let longest_wait = waits.iter().copied().fold(0.0, f64::max);
    let floor = held_after_waiter_joined.as_secs_f64();
    assert!(holds[0] >= floor, "holder's hold {holds:?}");
    assert!(
        longest_wait >= floor && longest_wait < floor + 5.0,
        "waits {waits:?}"
    );
}

#[test]
fn a_key_deleted_by_someone_else_records_a_loss_and_no_hold_time() {
    let m = recorded();
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let labels = [(NAME, "metrics/deleted"), (PRIMITIVE, "mutex")];
    let guard = s.mutex("metrics/deleted").unwrap().lock().unwrap();
    std::thread::sleep(FOLLOWED);
    assert_eq!(c.delete(guard.key()).unwrap(), 1);
    assert!(fires(&guard.lost(), Duration::from_secs(3)));
    let deleted = [labels[0], labels[1], (REASON, "key_deleted")];
    assert!(eventually(Duration::from_secs(2), || m
        .counter(LOSSES, &deleted)
        == 1));
    drop(guard);
    assert_eq!(m.counter(LOSSES, &labels), 1);
    assert!(m.samples(HOLD_SECONDS, &labels).is_empty());
    assert!(s.is_alive());
}

#[test]
fn a_session_revoked_elsewhere_records_a_loss_and_the_session_end() {
    let m = recorded();
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 3);
    let labels = [(NAME, "metrics/revoked"), (PRIMITIVE, "mutex")];
    let guard = s.mutex("metrics/revoked").unwrap().lock().unwrap();
    std::thread::sleep(FOLLOWED);
    let revoked = common::etcdctl_command(
        &server.endpoint(),
        &["lease", "revoke", &format!("{:x}", s.lease_id())],
    )
    .status()
    .expect("run etcdctl");
    assert!(revoked.success());
    assert!(fires(&guard.lost(), Duration::from_secs(3)));
    // The keep-alive learns of it at its next renewal (every TTL/3).
    assert!(fires(&s.lost(), Duration::from_secs(5)));
    assert_eq!(s.loss_reason(), Some(etcd_sync::LossReason::Revoked));
    drop(guard);
    // Seen through the deleted key first, or through the session: one loss either way.
    assert!(eventually(Duration::from_secs(2), || m
        .counter(LOSSES, &labels)
        == 1));
    let by_key = m.counter(LOSSES, &[labels[0], (REASON, "key_deleted")]);
    let by_session = m.counter(LOSSES, &[labels[0], (REASON, "revoked")]);
    assert_eq!(by_key + by_session, 1);
    assert!(m.samples(HOLD_SECONDS, &labels).is_empty());
    assert!(m.counter(SESSIONS_ENDED, &[(REASON, "revoked")]) >= 1);
}

#[test]
fn a_guard_dropped_after_its_session_closed_records_the_close_as_its_loss() {
    let m = recorded();
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let labels = [(NAME, "metrics/closed"), (PRIMITIVE, "rwlock_write")];
    let guard = s.rwlock("metrics/closed").unwrap().write().unwrap();
    s.close().unwrap();
    drop(guard);
    let closed = [labels[0], labels[1], (REASON, "closed")];
    assert!(eventually(Duration::from_secs(2), || m
        .counter(LOSSES, &closed)
        == 1));
    assert_eq!(m.counter(LOSSES, &labels), 1);
    assert!(m.samples(HOLD_SECONDS, &labels).is_empty());
    assert!(m.counter(SESSIONS_ENDED, &[(REASON, "closed")]) >= 1);
}

#[test]
fn an_election_records_its_transitions() {
    let m = recorded();
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let name = "metrics/election";
    let event = |e| m.counter(LEADERSHIP_TRANSITIONS, &[(NAME, name), (EVENT, e)]);
    let election = s.election(name).unwrap();
    let mut leadership = election.campaign("a").unwrap();
    assert_eq!(event("elected"), 1);
    assert_eq!(
        m.counter(ACQUISITIONS, &[(NAME, name), (PRIMITIVE, "election")]),
        1
    );
    leadership.resign().unwrap();
    assert_eq!((event("elected"), event("resigned")), (1, 1));
    // Won again, then lost: the key deleted by someone else.
    let leadership = election.campaign("b").unwrap();
    std::thread::sleep(FOLLOWED);
    c.delete(leadership.key()).unwrap();
    assert!(fires(&leadership.lost(), Duration::from_secs(3)));
    assert!(eventually(Duration::from_secs(2), || event("lost") == 1));
    drop(leadership);
    assert_eq!(
        (event("elected"), event("resigned"), event("lost")),
        (2, 1, 1)
    );
    let holds = m.samples(HOLD_SECONDS, &[(NAME, name), (PRIMITIVE, "election")]);
    assert_eq!(holds.len(), 1, "{holds:?}");
}

#[test]
fn the_keepalive_margin_is_set_and_positive_after_a_few_renewals() {
    let m = recorded();
    let server = etcd();
    let c = client(&server.endpoints());
    let ttl = Duration::from_secs(2);
    let s = session(&c, ttl.as_secs());
    // Renewals every TTL/3: a few of them.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(s.is_alive());
    let margin = m.gauge(KEEPALIVE_MARGIN_SECONDS).expect("the gauge is set");
    // Other tests' sessions set it too; all of them renew well before their deadline.
    assert!(margin > 0.0 && margin <= 60.0, "{margin}");
}

#[test]
fn killing_the_clients_member_counts_a_failover() {
    let m = recorded();
    let cl = cluster();
    let all = cl.endpoints();
    // The client's member is a follower: killing the raft leader would leave the others
    // answering "no leader" until they elect one, and a plain read fails at once then
    // (a retryable error; the suite saw it).
    let first = (cl.leader().unwrap() + 1) % all.len();
    let order: Vec<String> = (0..all.len())
        .map(|i| all[(first + i) % all.len()].clone())
        .collect();
    let c = common::try_client_for(&order, Duration::from_secs(2)).expect("connect");
    let s = session(&c, 5);
    let g = s.mutex("metrics/failover").unwrap().lock().unwrap();
    let from = all[first].as_str();
    assert_eq!(m.counter(FAILOVERS, &[(FROM, from)]), 0);
    cl.kill(first).unwrap();
    // A read fails over at once; the keep-alive and watch streams move too.
    c.get("metrics/anything").expect("a read on another member");
    let moved = m.counter(FAILOVERS, &[(FROM, from)]);
    assert!(moved >= 1, "no failover from {from}");
    assert!(g.is_held());
    drop(g);
}

#[test]
fn a_renewed_auth_token_is_counted() {
    use etcd_sync::testing::{AUTH_USER, EtcdServer};
    let m = recorded();
    let server = EtcdServer::builder()
        .arg("--auth-token-ttl=1")
        .start()
        .expect("start etcd");
    server.enable_auth().expect("enable auth");
    let c = etcd_sync::Client::builder()
        .endpoints(server.endpoints())
        .user(AUTH_USER.0, AUTH_USER.1)
        .connect()
        .unwrap();
    let before = m.counter(REAUTHENTICATIONS, &[]);
    c.put("app/metrics", "1").unwrap();
    std::thread::sleep(Duration::from_secs(3)); // the token expires unused
    c.put("app/metrics", "2")
        .expect("a put with a renewed token");
    assert!(m.counter(REAUTHENTICATIONS, &[]) > before);
}
