//! `etcd-sync revoke NAME` and `lock|elect --release-on-request`: asking a holder to let go
//! from the shell, and a holder that gives up when asked, mixed with the library.

use std::time::Duration;

use crate::common::{client, etcd, eventually, keys, session};
use crate::proc::{Proc, etcd_sync};
use crate::{WAIT, expect_started, loss_script};

use etcd_sync::testing::EtcdServer;

/// `etcd-sync revoke ARGS...` run to the end: its exit code, stdout and stderr.
fn revoke(server: &EtcdServer, args: &[&str]) -> (i32, String, String) {
    let mut cmd = etcd_sync(server, &["revoke"]);
    cmd.args(args);
    let out = cmd.output().expect("run etcd-sync revoke");
    (
        out.status.code().expect("exited"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn revoke_asks_a_library_holder_and_names_it() {
    let server = etcd();
    let c = client(&server.endpoints());
    assert_eq!(
        revoke(&server, &["free"]),
        (0, "free: not held\n".into(), String::new())
    );
    assert!(keys(&c, "free").is_empty());

    let s = c.session_builder().identity("worker-3").start().unwrap();
    let guard = s.mutex("job").unwrap().lock().unwrap();
    let asked = guard.release_requested();
    let (code, out, err) = revoke(&server, &["--reason", "deploy", "job"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, format!("job: asked {} (worker-3)\n", guard.key_str()));
    let request = asked.recv_timeout(WAIT).expect("the holder hears it");
    assert_eq!(request.reason.as_deref(), Some("deploy"));
    assert!(guard.is_held(), "asking forces nothing");

    let (code, _, err) = revoke(&server, &["--reason", &"x".repeat(1025), "job"]);
    assert_eq!(code, 2, "a reason too long is a usage error: {err}");
}

#[test]
fn lock_release_on_request_releases_and_exits_0() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut p = Proc::spawn(etcd_sync(&server, &["lock", "--release-on-request", "job"]));
    let key = p.line(WAIT);
    // Without the flag a holder keeps the lock when asked.
    let mut keeper = Proc::spawn(etcd_sync(&server, &["lock", "other"]));
    let other_key = keeper.line(WAIT);

    let (code, out, _) = revoke(&server, &["job"]);
    assert_eq!(code, 0);
    assert!(out.starts_with(&format!("job: asked {key} (")), "{out}");
    assert_eq!(p.code(WAIT), 0, "stderr: {}", p.stderr());
    assert!(
        p.stderr().contains("release of the lock requested by"),
        "{}",
        p.stderr()
    );
    assert!(keys(&c, "job").is_empty(), "key and request gone");

    assert_eq!(revoke(&server, &["other"]).0, 0);
    std::thread::sleep(Duration::from_millis(500));
    assert!(keeper.is_running(), "stderr: {}", keeper.stderr());
    assert_eq!(keys(&c, "other/"), vec![other_key]);
    keeper.signal(libc::SIGINT);
    assert_eq!(keeper.code(WAIT), 0);
}

#[test]
fn release_on_request_stops_the_command_then_a_waiter_takes_over() {
    let server = etcd();
    let c = client(&server.endpoints());
    let script = loss_script("echo got-term; exit 7");
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &[
            "elect",
            "--release-on-request",
            "leader",
            "host-a",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    expect_started(&mut p);
    let s = session(&c, 10);
    let election = s.election("leader").unwrap();
    let asker = election.clone();
    let campaign = std::thread::spawn(move || asker.campaign_timeout("host-b", WAIT));
    assert!(eventually(WAIT, || keys(&c, "leader/").len() == 2));
    let leader = election.request_release().unwrap().expect("host-a leads");
    assert_eq!(leader.value, b"host-a");
    // CMD got SIGTERM, its exit code passes through, and the leadership moved.
    assert_eq!(p.code(WAIT), 7, "stderr: {}", p.stderr());
    assert_eq!(
        p.rest(WAIT).unwrap_or_default(),
        vec!["got-term".to_string()]
    );
    let mine = campaign.join().unwrap().unwrap();
    assert!(mine.is_leader());
    assert_eq!(
        c.leader("leader").unwrap().map(|h| h.value),
        Some(b"host-b".to_vec())
    );
}
