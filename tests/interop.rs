//! Interoperation with the real `etcdctl lock` / `etcdctl elect` (Debian package etcd-client).

#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, Instant};

use common::{ChildGuard, client, etcd, etcdctl_command as etcdctl, eventually, keys, session};
use etcd_sync::LeaderEvent;

#[test]
fn our_lock_waits_for_etcdctl_lock() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut child = ChildGuard::spawn(etcdctl(
        &server.endpoint(),
        &["lock", "shared", "--", "sleep", "2"],
    ));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "shared/")
        .len()
        == 1));
    let started = Instant::now();
    let s = session(&c, 10);
    let g = s.mutex("shared").unwrap().lock().unwrap();
    let waited = started.elapsed();
    assert!(
        waited > Duration::from_millis(800),
        "did not wait for etcdctl: {waited:?}"
    );
    assert_eq!(keys(&c, "shared/"), vec![g.key_str().into_owned()]);
    let status = child.child().wait().unwrap();
    assert!(status.success());
}

#[test]
fn etcdctl_lock_waits_for_our_guard() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let g = s.mutex("shared").unwrap().lock().unwrap();
    let mut child = ChildGuard::spawn(etcdctl(
        &server.endpoint(),
        &["lock", "shared", "--", "echo", "got-it"],
    ));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.child().try_wait().unwrap().is_none(),
        "etcdctl got the lock while we held it"
    );
    assert_eq!(keys(&c, "shared/").len(), 2, "etcdctl queued behind us");
    drop(g);
    let out = child.take().wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("got-it"));
}

#[test]
fn election_interop_with_etcdctl_elect() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let e = s.election("ee").unwrap();
    let observer = e.observe().unwrap();
    assert_eq!(
        observer.recv_timeout(Duration::from_secs(5)).unwrap(),
        LeaderEvent::NoLeader
    );
    // etcdctl leads first: our campaign blocks until it exits.
    let mut child = ChildGuard::spawn(etcdctl(&server.endpoint(), &["elect", "ee", "p1"]));
    match observer.recv_timeout(Duration::from_secs(5)).unwrap() {
        LeaderEvent::Elected(l) => assert_eq!(l.value, b"p1"),
        other => panic!("expected etcdctl as leader, got {other:?}"),
    }
    let e2 = e.clone();
    let t = std::thread::spawn(move || e2.campaign("ours").map(|l| (Instant::now(), l)));
    std::thread::sleep(Duration::from_millis(500));
    assert!(!t.is_finished(), "we led while etcdctl did");
    // SIGINT makes etcdctl resign and exit 0.
    unsafe { libc::kill(child.child().id() as i32, libc::SIGINT) };
    assert!(child.child().wait().unwrap().success());
    let (_, leadership) = t.join().unwrap().unwrap();
    // etcdctl elect -l prints our key and value.
    let mut listener = ChildGuard::spawn(etcdctl(&server.endpoint(), &["elect", "-l", "ee"]));
    std::thread::sleep(Duration::from_millis(1000));
    let _ = listener.child().kill();
    let output = listener.take().wait_with_output().unwrap();
    drop(leadership);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains(&format!("ee/{:x}", s.lease_id())),
        "etcdctl elect -l printed {text:?}"
    );
    assert!(text.contains("ours"), "{text:?}");
}

#[test]
fn observer_reports_etcdctl_leadership_changes() {
    let server = etcd();
    let c = client(&server.endpoints());
    let observer = session(&c, 10).election("obs").unwrap().observe().unwrap();
    assert_eq!(
        observer.recv_timeout(Duration::from_secs(5)).unwrap(),
        LeaderEvent::NoLeader
    );
    let mut first = ChildGuard::spawn(etcdctl(&server.endpoint(), &["elect", "obs", "one"]));
    match observer.recv_timeout(Duration::from_secs(5)).unwrap() {
        LeaderEvent::Elected(l) => assert_eq!(l.value, b"one"),
        other => panic!("{other:?}"),
    }
    let _second = ChildGuard::spawn(etcdctl(&server.endpoint(), &["elect", "obs", "two"]));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "obs/")
        .len()
        == 2));
    unsafe { libc::kill(first.child().id() as i32, libc::SIGINT) };
    first.child().wait().unwrap();
    match observer.recv_timeout(Duration::from_secs(5)).unwrap() {
        LeaderEvent::Elected(l) => assert_eq!(l.value, b"two"),
        other => panic!("{other:?}"),
    }
}

/// A hand-over (issue 53) seen by etcd's own clients: an `etcdctl elect` candidate ahead
/// of the successor keeps waiting (it does not lead on the hand-over), `etcdctl elect -l`
/// sees an ordinary change of leader, and the Go candidate leads after the successor
/// resigns.
#[test]
fn etcdctl_sees_a_hand_over_as_a_change_of_leader_and_keeps_its_place() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (sa, sc) = (session(&c, 10), session(&c, 10));
    let ea = sa.election("hx").unwrap();
    let a = ea.campaign("a").unwrap();
    let mut listener = ChildGuard::spawn(etcdctl(&server.endpoint(), &["elect", "-l", "hx"]));
    let listened = common::child_lines(listener.child()).unwrap();
    let mut go = ChildGuard::spawn(etcdctl(&server.endpoint(), &["elect", "hx", "go"]));
    let go_lines = common::child_lines(go.child()).unwrap();
    assert!(eventually(Duration::from_secs(5), || keys(&c, "hx/").len() == 2));
    let ec = sc.election("hx").unwrap();
    let cand = std::thread::spawn(move || ec.campaign("c"));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "hx/").len() == 3));

    let next = a.hand_over("c").unwrap();
    assert_eq!(next.lease, sc.lease_id());
    let mut c_lead = cand.join().unwrap().unwrap();
    // The Go candidate, ahead of c in line, did not lead on the hand-over.
    assert!(
        go_lines.recv_timeout(Duration::from_millis(800)).is_err(),
        "etcdctl elect led after a hand-over to another candidate"
    );
    // etcdctl elect -l printed a's value, then c's under the same key.
    let mut seen = Vec::new();
    while let Ok(line) = listened.recv_timeout(Duration::from_millis(500)) {
        seen.push(line);
    }
    assert!(seen.iter().any(|l| l == "a"), "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("c"), "{seen:?}");
    // c resigns: the Go candidate leads.
    c_lead.resign().unwrap();
    let led = go_lines.recv_timeout(Duration::from_secs(5));
    assert!(led.is_ok_and(|l| l.starts_with("hx/")), "etcdctl never led");
    drop(a);
    go.kill();
    listener.kill();
}
