//! Leader election against a real etcd, mirroring etcd's own election scenarios.

#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, Instant};

use common::{client, etcd, eventually, handled, keys, session};
use etcd_sync::{Error, Holder, LeaderEvent, Observer, Txn, TxnOp};

fn next_event(observer: &Observer) -> LeaderEvent {
    match observer.recv_timeout(Duration::from_secs(5)) {
        Ok(event) => event,
        Err(e) if e.is_wait_timeout() => panic!("no leadership event within 5 s: {e}"),
        Err(e) => panic!("observer error: {e:?}"),
    }
}

fn value_of(event: &LeaderEvent) -> Option<String> {
    match event {
        LeaderEvent::Elected(l) | LeaderEvent::Proclaimed(l) => Some(l.value_str().into_owned()),
        LeaderEvent::NoLeader => None,
    }
}

#[test]
fn campaign_blocks_until_the_leader_resigns_and_observers_follow() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s1 = session(&c, 10);
    let s2 = session(&c, 10);
    let e1 = s1.election("elect").unwrap();
    let e2 = s2.election("elect").unwrap();
    assert_eq!(e1.leader().unwrap(), None, "no leader is Ok(None)");
    let observer = e1.observe().unwrap();
    assert_eq!(next_event(&observer), LeaderEvent::NoLeader);

    let mut l1 = e1.campaign("p1").unwrap();
    assert_eq!(value_of(&next_event(&observer)).as_deref(), Some("p1"));
    let leader = e2.leader().unwrap().unwrap();
    assert_eq!(leader.value, b"p1");
    assert_eq!(leader.create_revision, l1.fencing_token());
    assert_eq!(leader.lease, s1.lease_id());
    assert_eq!(leader.key_str(), format!("elect/{:x}", s1.lease_id()));

    let t = std::thread::spawn(move || {
        let l = e2.campaign("p2").unwrap();
        (l.fencing_token(), Instant::now(), l)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !t.is_finished(),
        "second candidate led while the first still did"
    );
    l1.proclaim("p1b").unwrap();
    assert_eq!(
        next_event(&observer),
        // An observer looks no lease up: its holders have no TTL.
        LeaderEvent::Proclaimed(Holder {
            ttl: None,
            ..e1.leader().unwrap().unwrap()
        })
    );
    let resigned = Instant::now();
    l1.resign().unwrap();
    let (token2, led_at, l2) = t.join().unwrap();
    assert!(led_at.duration_since(resigned) < Duration::from_secs(1));
    assert!(token2 > l1.fencing_token());
    match next_event(&observer) {
        LeaderEvent::Elected(l) => assert_eq!(l.value, b"p2"),
        other => panic!("expected the new leader, got {other:?}"),
    }
    // Proclaiming after resigning is refused.
    assert!(matches!(l1.proclaim("late"), Err(Error::NotLeader)));
    drop(l2);
    assert_eq!(next_event(&observer), LeaderEvent::NoLeader);
    assert!(keys(&c, "elect/").is_empty());
}

/// Upstream TestElectionFailover, with the leader's session closed.
/// A proclamation is written once. When the leader's key already holds the value (here
/// written behind the leader's back, with its lease, as an earlier attempt that applied
/// late would have), proclaiming it writes nothing more; a new value is then written on
/// the newer revision, and the leader still leads.
#[test]
fn a_proclamation_the_key_already_holds_is_not_written_again() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let leadership = s.election("once").unwrap().campaign("a").unwrap();
    let key = leadership.key_str().into_owned();
    let behind = c
        .txn(Txn::new().and_then([TxnOp::put_with_lease(key.as_str(), "b", s.lease_id())]))
        .unwrap();
    leadership.proclaim("b").unwrap();
    let kv = c.get(&key).unwrap().expect("the leader's key");
    assert_eq!(kv.value, b"b");
    assert_eq!(
        kv.mod_revision, behind.revision,
        "the value was written again"
    );
    leadership.proclaim("c").unwrap();
    let kv = c.get(&key).unwrap().expect("the leader's key");
    assert_eq!(kv.value, b"c");
    assert_eq!(kv.create_revision, leadership.fencing_token());
    assert!(kv.mod_revision > behind.revision);
    assert!(leadership.is_held());
}

/// A proclamation after the leader's key was put on another lease (an operator's put keeps
/// the create revision) is refused with `NotLeader` and leaves the key where it was: the key
/// is no longer ours, and a proclamation never puts it back on our lease. (Mutation testing,
/// shard 6/10: with the read-back's "ours" reduced to the create revision, the proclamation
/// put the key back on the old leader's lease and succeeded.)
#[test]
fn a_proclamation_after_the_key_moved_to_another_lease_is_refused() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s, other) = (session(&c, 10), session(&c, 10));
    let leadership = s.election("moved").unwrap().campaign("a").unwrap();
    let key = leadership.key_str().into_owned();
    c.put_with_lease(&key, "operator", other.lease_id())
        .unwrap();
    match leadership.proclaim("b") {
        Err(Error::NotLeader) => {}
        other => panic!("a proclamation over a key on another lease: {other:?}"),
    }
    let kv = c.get(&key).unwrap().expect("the key stands");
    assert_eq!(kv.value, b"operator", "the operator's value stays");
    assert_eq!(
        kv.lease,
        other.lease_id(),
        "the key stays on the other lease"
    );
    assert_eq!(kv.create_revision, leadership.fencing_token());
}

#[test]
fn failover_when_the_leaders_session_is_closed() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s1 = session(&c, 10);
    let s2 = session(&c, 10);
    let l1 = s1.election("fo").unwrap().campaign("foo").unwrap();
    let observer = session(&c, 10).election("fo").unwrap().observe().unwrap();
    assert_eq!(value_of(&next_event(&observer)).as_deref(), Some("foo"));
    let e2 = s2.election("fo").unwrap();
    let t = std::thread::spawn(move || e2.campaign("bar").map(|l| (l.fencing_token(), l)));
    std::thread::sleep(Duration::from_millis(200));
    s1.close().unwrap();
    let (token, _l2) = t.join().unwrap().unwrap();
    assert!(token > l1.fencing_token());
    assert_eq!(value_of(&next_event(&observer)).as_deref(), Some("bar"));
    assert!(!l1.is_leader());
    assert!(matches!(l1.proclaim("x"), Err(Error::NotLeader)));
    assert!(matches!(l1.put("k", "v"), Err(Error::NotLeader)));
}

#[test]
fn campaign_with_a_revoked_session_is_not_phantom_leadership() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s1 = session(&c, 10);
    let _l1 = s1.election("ph").unwrap().campaign("a").unwrap();
    let s2 = session(&c, 10);
    let e2 = s2.election("ph").unwrap();
    let t = std::thread::spawn(move || e2.campaign("b").map(|l| l.fencing_token()));
    assert!(eventually(Duration::from_secs(2), || keys(&c, "ph/").len() == 2));
    s2.close().unwrap();
    let result = t.join().unwrap();
    assert!(matches!(result, Err(Error::SessionLost(_))), "{result:?}");
    assert_eq!(keys(&c, "ph/").len(), 1);
}

#[test]
fn campaign_timeout_leaves_no_key() {
    let server = etcd();
    let c = client(&server.endpoints());
    let _l = session(&c, 10)
        .election("ct")
        .unwrap()
        .campaign("a")
        .unwrap();
    let s2 = session(&c, 10);
    let start = Instant::now();
    let r = s2
        .election("ct")
        .unwrap()
        .campaign_timeout("b", Duration::from_millis(400));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(keys(&c, "ct/").len(), 1);
}

/// Upstream TestElectionSessionRecampaign.
#[test]
fn recampaign_on_the_same_session_proclaims() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let e = s.election("rc").unwrap();
    let first = e.campaign("abc").unwrap();
    let second = e.campaign("def").unwrap();
    assert_eq!(first.fencing_token(), second.fencing_token());
    assert_eq!(e.leader().unwrap().unwrap().value, b"def");
    let observer = e.observe().unwrap();
    assert_eq!(value_of(&next_event(&observer)).as_deref(), Some("def"));
    // The first guard was superseded: it reports so and its drop resigns nothing.
    assert!(!first.is_leader());
    drop(first);
    assert!(second.is_leader());
    assert_eq!(e.leader().unwrap().unwrap().value, b"def");
}

/// A campaign while a guard whose key an operator deleted is still alive is a new
/// campaign, not a re-campaign of the lost key: it leads with a new key and a newer token.
/// (Mutation testing, shard 5/10: with an ended hold taken for a live one, the campaign
/// proclaimed over the deleted key and failed with `NotLeader`.)
#[test]
fn a_campaign_beside_a_lost_guard_campaigns_anew() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let e = s.election("lostrc").unwrap();
    let first = e.campaign("abc").unwrap();
    assert_eq!(c.delete(first.key()).unwrap(), 1);
    assert!(eventually(Duration::from_secs(2), || !first.is_leader()));
    let second = e.campaign("def").unwrap();
    assert!(second.is_leader());
    assert!(second.fencing_token() > first.fencing_token());
    assert!(!first.is_leader());
    assert_eq!(e.leader().unwrap().unwrap().value, b"def");
}

/// A re-campaign is a campaign: its time limit and cancel token bound the proclamation it
/// sends. (The randomized checker saw a 148 ms `campaign_timeout` take 2446 ms: the
/// re-campaign's proclaim waited out request timeouts on a frozen member.) A proclamation
/// cut short may still apply later, but never over a newer one.
#[test]
fn a_recampaign_keeps_its_time_limit_on_a_frozen_etcd() {
    let server = etcd();
    let c = common::client_with_timeout(&server.endpoints(), Duration::from_secs(2));
    let s = session(&c, 30);
    let e = s.election("rc-frozen").unwrap();
    let first = e.campaign("a").unwrap();
    server.pause().unwrap();
    let started = Instant::now();
    let timed = e.campaign_timeout("b", Duration::from_millis(300));
    let took = started.elapsed();
    let token = etcd_sync::CancelToken::new();
    let canceller = {
        let token = token.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            token.cancel();
        })
    };
    let started = Instant::now();
    let cancelled = e.campaign_with("b", &token);
    let took_cancelled = started.elapsed();
    canceller.join().unwrap();
    server.resume().unwrap();
    assert!(
        matches!(&timed, Err(err) if err.is_wait_timeout()),
        "{:?}",
        timed.map(|l| l.fencing_token())
    );
    assert!(
        took < Duration::from_millis(1200),
        "took {took:?} (limit 300 ms, request timeout 2 s)"
    );
    assert!(
        matches!(&cancelled, Err(err) if err.is_cancelled()),
        "{:?}",
        cancelled.map(|l| l.fencing_token())
    );
    assert!(
        took_cancelled < Duration::from_millis(1100),
        "took {took_cancelled:?} (cancelled after 200 ms)"
    );
    // The old guard still leads; a proclamation sent late may have applied ("b").
    assert!(first.is_leader());
    let value = e.leader().unwrap().unwrap().value;
    assert!(
        value == b"a" || value == b"b",
        "{:?}",
        String::from_utf8_lossy(&value)
    );
    first.proclaim("c").unwrap();
    assert_eq!(e.leader().unwrap().unwrap().value, b"c");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        e.leader().unwrap().unwrap().value,
        b"c",
        "an old proclamation applied late"
    );
    assert!(first.is_leader());
}

/// Upstream TestElectionOnPrefixOfExistingKey.
#[test]
fn election_on_a_prefix_of_an_existing_key() {
    let server = etcd();
    let c = client(&server.endpoints());
    c.put("testa", "x").unwrap();
    let s = session(&c, 10);
    let l = s
        .election("test")
        .unwrap()
        .campaign_timeout("v", Duration::from_secs(5))
        .unwrap();
    assert!(l.is_leader());
}

/// Upstream TestElectionOnSessionRestart.
#[test]
fn resumed_session_recampaigns_and_keeps_leadership() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let l = s.election("restart").unwrap().campaign("abc").unwrap();
    let token = l.fencing_token();
    std::mem::forget(l); // simulate a crash: no resign
    s.orphan();
    let waiter_session = session(&c, 10);
    let we = waiter_session.election("restart").unwrap();
    let waiter = std::thread::spawn(move || we.campaign_timeout("other", Duration::from_secs(2)));
    let resumed = c.session_builder().resume(s.lease_id()).start().unwrap();
    let l2 = resumed
        .election("restart")
        .unwrap()
        .campaign("def")
        .unwrap();
    assert_eq!(l2.fencing_token(), token, "kept its place");
    assert!(matches!(waiter.join().unwrap(), Err(Error::Timeout { .. })));
    let observer = resumed.election("restart").unwrap().observe().unwrap();
    assert_eq!(value_of(&next_event(&observer)).as_deref(), Some("def"));
    // The guard knows the revision the resumed campaign wrote: the next proclamation is
    // one Txn. (Mutation testing, shard 6/10: `join.rs`, the written revision dropped, sent
    // a Txn that failed its compare, a read and the Txn again.)
    let txns = || handled(&server.metrics().unwrap(), "Txn");
    let before = txns();
    l2.proclaim("ghi").unwrap();
    assert_eq!(txns() - before, 1, "one Txn for the proclamation");
    assert_eq!(value_of(&next_event(&observer)).as_deref(), Some("ghi"));
}

/// A resumed session's campaign with the value its key already holds keeps its place and
/// writes nothing: the key's mod revision stays, so observers see no new proclamation.
/// (Mutation testing, shard 6/10: with the value never taken as equal, the campaign put the
/// same value again.) It knows it leads from that one read.
#[test]
fn a_resumed_campaign_with_the_same_value_writes_nothing() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let l = s.election("same").unwrap().campaign("abc").unwrap();
    let (token, key) = (l.fencing_token(), l.key_str().into_owned());
    let before = c.get(&key).unwrap().expect("the leader's key");
    std::mem::forget(l); // a crash: no resign
    s.orphan();
    let resumed = c.session_builder().resume(s.lease_id()).start().unwrap();
    let election = resumed.election("same").unwrap();
    let ranges = || handled(&server.metrics().unwrap(), "Range");
    let before_ranges = ranges();
    let again = election.campaign("abc").unwrap();
    assert_eq!(again.fencing_token(), token, "kept its place");
    // The read of what existed found our key first in line: no read of the line after it
    // (mutation shard 8/10: `existing.rs:66:24`, the owner's check dropped, read it).
    assert_eq!(ranges() - before_ranges, 0, "the line was read again");
    let after = c.get(&key).unwrap().expect("the leader's key");
    assert_eq!(after.value, b"abc");
    assert_eq!(
        after.mod_revision, before.mod_revision,
        "the same value was written again"
    );
}

/// Upstream TestElectionObserveCompacted.
#[test]
fn observe_survives_compaction() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let _l = s.election("cmp").unwrap().campaign("abc").unwrap();
    let mut rev = 0;
    for i in 0..5 {
        rev = c.put("cmp-other", i.to_string()).unwrap();
    }
    c.compact(rev).unwrap();
    let observer = s.election("cmp").unwrap().observe().unwrap();
    assert_eq!(value_of(&next_event(&observer)).as_deref(), Some("abc"));
}

/// Upstream TestElectionObserveFreshResponsesOnProclaim.
#[test]
fn observer_sees_every_proclamation_in_order() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let e = s.election("pr").unwrap();
    let l = e.campaign("abc").unwrap();
    let observer = e.observe().unwrap();
    let mut revisions = Vec::new();
    for expected in ["abc", "def", "ghi"] {
        if expected != "abc" {
            l.proclaim(expected).unwrap();
        }
        let event = next_event(&observer);
        assert_eq!(value_of(&event).as_deref(), Some(expected));
        if let LeaderEvent::Elected(x) | LeaderEvent::Proclaimed(x) = event {
            revisions.push(x.mod_revision);
        }
    }
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "{revisions:?}");
}

#[test]
fn guarded_writes_and_resign_state() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let mut l = s.election("gw").unwrap().campaign("v").unwrap();
    l.put("gw-data", "1").unwrap();
    server.pause().unwrap();
    let failed = l.resign();
    server.resume().unwrap();
    assert!(
        failed.is_err(),
        "resign against a frozen etcd cannot succeed"
    );
    // The failed resign kept the state: a retry runs again (whether or not the first
    // request reached etcd before it froze) and ends with our key gone.
    l.resign().unwrap();
    assert!(keys(&c, "gw/").is_empty());
    assert!(matches!(l.put("gw-data", "2"), Err(Error::NotLeader)));
}

/// Child-process entry point: `leader` campaigns with a 2 s session, reports, then waits
/// to be SIGKILLed.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(common::CHILD_ROLE) else {
        return;
    };
    assert_eq!(role, "leader");
    let c = client(&[std::env::var("ENDPOINT").unwrap()]);
    let s = session(&c, 2);
    let l = s.election("kill").unwrap().campaign("child").unwrap();
    println!("LEADING {}", l.fencing_token());
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn leader_killed_process_is_replaced() {
    // The leader runs in a child process that we SIGKILL: no resign, no revoke. Its lease
    // expires within its TTL, the waiting candidate leads, the observer sees it.
    let server = etcd();
    let c = client(&server.endpoints());
    let observer = session(&c, 10).election("kill").unwrap().observe().unwrap();
    assert_eq!(next_event(&observer), LeaderEvent::NoLeader);
    let mut child = common::ChildGuard(Some(common::spawn_child(
        "child_entry",
        "leader",
        &[("ENDPOINT", server.endpoint())],
    )));
    let line = common::read_line_starting(child.child(), "LEADING ", Duration::from_secs(10))
        .expect("child leads");
    let child_token: i64 = line.trim_start_matches("LEADING ").parse().unwrap();
    assert_eq!(value_of(&next_event(&observer)).as_deref(), Some("child"));
    let s = session(&c, 10);
    let e = s.election("kill").unwrap();
    let t = std::thread::spawn(move || e.campaign("survivor").map(|l| (Instant::now(), l)));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!t.is_finished());
    let killed = Instant::now();
    child.kill();
    let (led_at, leadership) = t.join().unwrap().unwrap();
    assert!(leadership.fencing_token() > child_token);
    assert!(
        led_at - killed <= Duration::from_secs(3),
        "took {:?}",
        led_at - killed
    );
    assert_eq!(
        value_of(&next_event(&observer)).as_deref(),
        Some("survivor")
    );
}

#[test]
fn leader_and_observe_without_a_session() {
    let server = etcd();
    let c = client(&server.endpoints());
    assert_eq!(c.leader("nosession").unwrap(), None);
    assert!(matches!(c.leader(""), Err(Error::InvalidArgument(_))));
    let observer = c.observe("nosession").unwrap();
    assert_eq!(next_event(&observer), LeaderEvent::NoLeader);
    let s = session(&c, 10);
    let l = s.election("nosession").unwrap().campaign("v").unwrap();
    assert_eq!(value_of(&next_event(&observer)).as_deref(), Some("v"));
    assert_eq!(
        c.leader("nosession").unwrap().unwrap().create_revision,
        l.fencing_token()
    );
}

/// Regression (#10): an observer nobody drains used to grow without bound. It now buffers a
/// bounded number of events and coalesces the rest: after draining, the consumer still
/// learns the current value.
#[test]
fn an_undrained_observer_stays_bounded_and_catches_up() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let e = s.election("flood").unwrap();
    let l = e.campaign("v0").unwrap();
    let observer = c.observe("flood").unwrap();
    let proclamations = 600;
    for i in 1..=proclamations {
        l.proclaim(format!("v{i}")).unwrap();
    }
    let mut received = 0;
    let mut last = None;
    loop {
        match observer.recv_timeout(Duration::from_millis(800)) {
            Ok(event) => {
                received += 1;
                last = value_of(&event);
            }
            Err(e) if e.is_wait_timeout() => break, // drained
            Err(e) => panic!("observer error: {e:?}"),
        }
    }
    assert!(
        received < proclamations,
        "{received} events buffered for {proclamations} proclamations"
    );
    assert_eq!(last.as_deref(), Some(format!("v{proclamations}").as_str()));
}
