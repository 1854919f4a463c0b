//! The testing helper itself: every etcd it starts is gone when the handle is dropped,
//! also when the test panics, and a missing binary is a clear error.

#![cfg(feature = "testing")]

mod common;

use std::path::Path;

use etcd_sync::testing::{EtcdCluster, EtcdServer};

fn alive(pid: u32) -> bool {
    // A reaped process has no /proc entry; a zombie would show state Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[test]
fn dropped_servers_and_clusters_leave_no_process() {
    let server = EtcdServer::start().unwrap();
    let pid = server.pid().unwrap();
    assert!(alive(pid));
    server.pause().unwrap(); // a stopped process must be killed too
    drop(server);
    assert!(!alive(pid), "etcd {pid} outlived its EtcdServer");

    let cluster = EtcdCluster::start(3).unwrap();
    let pids: Vec<u32> = (0..3).map(|i| cluster.pid(i).unwrap()).collect();
    let data = cluster.data_dir(0).to_path_buf();
    drop(cluster);
    for pid in pids {
        assert!(!alive(pid), "cluster member {pid} outlived its EtcdCluster");
    }
    assert!(!data.exists(), "data dir left behind");
}

#[test]
fn a_panicking_test_still_kills_its_etcd() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::thread::spawn(move || {
        let server = EtcdServer::start().unwrap();
        tx.send(server.pid().unwrap()).unwrap();
        panic!("test failure while etcd runs");
    })
    .join();
    assert!(result.is_err());
    let pid = rx.recv().unwrap();
    assert!(!alive(pid), "etcd {pid} outlived a panicking test");
}

#[test]
fn restart_keeps_data_and_missing_binary_is_explained() {
    let server = EtcdServer::start().unwrap();
    let client = etcd_sync::Client::connect(server.endpoints()).unwrap();
    client.put("kept", "yes").unwrap();
    drop(client);
    server.kill().unwrap();
    assert!(!server.is_running());
    server.restart().unwrap();
    let client = etcd_sync::Client::connect(server.endpoints()).unwrap();
    assert_eq!(client.get("kept").unwrap().unwrap().value, b"yes");
    assert!(Path::new(server.log_path()).exists());

    // The binary lookup honours ETCD_BIN; checked in a child process so the variable does
    // not leak into other tests.
    let out = common::spawn_child(
        "missing_binary_child",
        "missing-binary",
        &[("ETCD_BIN", "/nonexistent/etcd".to_string())],
    )
    .wait_with_output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn missing_binary_child() {
    if std::env::var(common::CHILD_ROLE).is_err() {
        return;
    }
    let err = EtcdServer::start().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    let text = err.to_string();
    assert!(
        text.starts_with("ETCD_BIN is set to /nonexistent/etcd, but that file does not exist"),
        "{text}"
    );
    assert!(text.contains("unset it"), "{text}");
    // What `unwrap()` shows: the message itself, not an escaped string.
    let debug = format!("{err:?}");
    assert!(debug.contains(&text), "{debug}");
}
