//! The etcd version under test: detected from the binary, the one the test matrix asked
//! for, and given only flags it accepts.

#![cfg(feature = "testing")]

mod common;

use std::time::Duration;

use etcd_sync::testing::{EtcdServer, etcd_version};

#[test]
fn the_version_is_detected_and_is_the_one_the_matrix_asked_for() {
    let etcd = common::etcd();
    let version = etcd_version().expect("etcd --version");
    assert_eq!(etcd.version(), version);
    assert!(version.at_least(3, 4), "{version}");
    // scripts/test runs each part of the matrix with the version it means to test here
    // ("3.7.2", or a series: "3.4"), and names the etcdctl it pairs the server with.
    if let Ok(expected) = std::env::var("ETCD_SYNC_EXPECT_VERSION") {
        let full = version.to_string();
        let series = format!("{}.{}", version.major, version.minor);
        assert!(
            full == expected || series == expected,
            "the matrix part for {expected} ran etcd {version}"
        );
    }
    let expected_peer = std::env::var("ETCD_SYNC_EXPECT_ETCDCTL").ok();
    let etcdctl = etcd_sync::testing::etcdctl_binary().expect("etcdctl");
    let output = std::process::Command::new(&etcdctl)
        .arg("version")
        .output()
        .expect("etcdctl version");
    let text = String::from_utf8_lossy(&output.stdout);
    // The interop peer is the one the matrix chose; without a choice, any etcdctl 3.4+.
    match expected_peer {
        Some(peer) => assert!(
            text.contains(&format!("etcdctl version: {peer}")),
            "{} is not etcdctl {peer}: {text}",
            etcdctl.display()
        ),
        None => assert!(
            text.contains("etcdctl version: 3."),
            "{} is not an etcdctl 3.x: {text}",
            etcdctl.display()
        ),
    }
}

#[test]
fn a_version_specific_flag_is_spelled_for_the_running_version() {
    // etcd refuses to start on a flag it does not know: starting at all proves the
    // spelling, and waits still hand over with progress notifications configured.
    let etcd = EtcdServer::builder()
        .watch_progress_notify_interval(Duration::from_millis(50))
        .start()
        .expect("etcd with a watch progress interval");
    let client = common::client(&etcd.endpoints());
    let holder = common::session(&client, 10);
    let guard = holder.mutex("versions/lock").unwrap().lock().unwrap();
    let waiter_session = common::session(&client, 10);
    let waiter_mutex = waiter_session.mutex("versions/lock").unwrap();
    let waiter = std::thread::spawn(move || waiter_mutex.lock().map(|g| g.fencing_token()));
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiter.is_finished(), "acquired while held");
    let token = guard.fencing_token();
    drop(guard);
    let next = waiter.join().unwrap().expect("the waiter acquires");
    assert!(next > token);
}
