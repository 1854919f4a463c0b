//! The CLI through etcd's gRPC proxy: the two commands of issue 47's report, where the
//! second `lock` and `elect --listen` waited forever before the stream translated the
//! proxy's watch ids.

use std::process::Command;
use std::time::{Duration, Instant};

use super::WAIT;
use super::common::{client, etcd, eventually, keys};
use super::proc::{Proc, etcd_sync_bare};
use etcd_sync::testing::EtcdProxy;

fn through(proxy: &EtcdProxy, args: &[&str]) -> Command {
    let endpoint = proxy.endpoint();
    let mut cmd = etcd_sync_bare(&["--endpoints", &endpoint]);
    cmd.args(args);
    cmd
}

#[test]
fn a_second_lock_through_the_proxy_runs_after_the_first() {
    let server = etcd();
    let proxy = EtcdProxy::start(&server.endpoints()).unwrap();
    let c = client(&server.endpoints());
    let mut first = Proc::spawn(through(&proxy, &["lock", "hop", "--", "sleep", "1"]));
    assert!(eventually(WAIT, || keys(&c, "hop/").len() == 1));
    let started = Instant::now();
    let mut second = Proc::spawn(through(
        &proxy,
        &["lock", "hop", "--", "sh", "-c", "echo second-ran"],
    ));
    assert_eq!(
        second.line(WAIT),
        "second-ran",
        "stderr: {}",
        second.stderr()
    );
    assert_eq!(second.code(WAIT), 0, "stderr: {}", second.stderr());
    assert_eq!(first.code(WAIT), 0, "stderr: {}", first.stderr());
    // The first held for a second; the second ran right after it.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(keys(&c, "hop/").is_empty());
}

#[test]
fn elect_listen_through_the_proxy_prints_the_leader_and_its_end() {
    let server = etcd();
    let proxy = EtcdProxy::start(&server.endpoints()).unwrap();
    let mut listener = Proc::spawn(through(&proxy, &["elect", "-l", "hop-el"]));
    assert_eq!(listener.line(WAIT), "no-leader");
    let mut leader = Proc::spawn(through(
        &proxy,
        &["elect", "hop-el", "node1", "--", "sleep", "1"],
    ));
    let line = listener.line(WAIT);
    assert!(
        line.starts_with("leader hop-el/") && line.ends_with(" node1"),
        "{line:?}"
    );
    assert_eq!(leader.code(WAIT), 0, "stderr: {}", leader.stderr());
    assert_eq!(listener.line(WAIT), "no-leader");
    listener.signal(libc::SIGTERM);
    assert_eq!(listener.code(WAIT), 0);
}
