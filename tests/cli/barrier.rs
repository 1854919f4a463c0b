//! `etcd-sync barrier hold|release|wait NAME`: the library's `Barrier` from the shell,
//! with the tool's exit codes, and mixed with the library on the same barrier.

use std::time::{Duration, Instant};

use crate::WAIT;
use crate::common::{client, etcd, hostname};
use crate::proc::{Proc, etcd_sync, etcd_sync_bare, etcdctl};

use etcd_sync::testing::EtcdServer;

/// `etcd-sync barrier ARGS...` run to the end: its exit code, stdout and stderr.
fn barrier(server: &EtcdServer, args: &[&str]) -> (i32, String, String) {
    let mut cmd = etcd_sync(server, &["barrier"]);
    cmd.args(args);
    let out = cmd.output().expect("run etcd-sync barrier");
    (
        out.status.code().expect("exited"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn barrier_hold_wait_release_from_the_shell() {
    let server = etcd();
    let c = client(&server.endpoints());
    assert_eq!(
        barrier(&server, &["hold", "gate"]),
        (0, "gate: held\n".into(), String::new())
    );
    let value = c
        .get("gate")
        .unwrap()
        .expect("the barrier's key")
        .value_str()
        .into_owned();
    assert!(value.starts_with(&format!("{}:", hostname())), "{value}");
    assert_eq!(
        barrier(&server, &["hold", "gate"]).1,
        "gate: already held\n"
    );
    // It stays up after `hold` exited: a library wait blocks, a CLI wait too.
    assert!(!c.barrier("gate").unwrap().try_wait().unwrap());
    let mut waiting = Proc::spawn(etcd_sync(&server, &["barrier", "wait", "gate"]));
    std::thread::sleep(Duration::from_millis(300));
    assert!(waiting.is_running(), "stderr: {}", waiting.stderr());

    // --timeout: exit 4, with a message.
    let started = Instant::now();
    let (code, out, err) = barrier(&server, &["wait", "--timeout", "300ms", "gate"]);
    assert_eq!(code, 4, "{err}");
    assert_eq!(out, "");
    assert!(err.contains("--timeout") && err.contains("gate"), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(300));

    // A release by the library ends the CLI's wait.
    let released = Instant::now();
    assert!(c.barrier("gate").unwrap().release().unwrap());
    assert_eq!(waiting.line(WAIT), "gate: released");
    assert_eq!(waiting.code(WAIT), 0, "stderr: {}", waiting.stderr());
    assert!(released.elapsed() < Duration::from_secs(3));
    assert_eq!(barrier(&server, &["release", "gate"]).1, "gate: not held\n");
    assert_eq!(
        barrier(&server, &["wait", "gate"]),
        (0, "gate: released\n".into(), String::new())
    );

    // A release from the shell ends a library wait.
    assert_eq!(barrier(&server, &["hold", "gate"]).0, 0);
    let lib = c.barrier("gate").unwrap();
    let waiter = std::thread::spawn(move || lib.wait_timeout(WAIT));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!waiter.is_finished());
    assert_eq!(
        barrier(&server, &["release", "gate"]),
        (0, "gate: released\n".into(), String::new())
    );
    waiter.join().expect("the waiter").expect("released");
    assert!(c.get("gate").unwrap().is_none());
}

/// The barrier is a plain key: `etcdctl del` releases it, and a key `etcdctl put` raises
/// one (as Go's `recipe.Barrier` does).
#[test]
fn etcdctl_raises_and_releases_the_same_barrier() {
    let server = etcd();
    let mut put = Proc::spawn(etcdctl(&server, &["put", "shared-gate", ""]));
    assert_eq!(put.code(WAIT), 0, "etcdctl: {}", put.stderr());
    assert_eq!(
        barrier(&server, &["hold", "shared-gate"]).1,
        "shared-gate: already held\n"
    );
    let mut waiting = Proc::spawn(etcd_sync(&server, &["barrier", "wait", "shared-gate"]));
    std::thread::sleep(Duration::from_millis(300));
    assert!(waiting.is_running(), "stderr: {}", waiting.stderr());
    let mut del = Proc::spawn(etcdctl(&server, &["del", "shared-gate"]));
    assert_eq!(del.code(WAIT), 0, "etcdctl: {}", del.stderr());
    assert_eq!(waiting.line(WAIT), "shared-gate: released");
    assert_eq!(waiting.code(WAIT), 0, "stderr: {}", waiting.stderr());
}

#[test]
fn a_signal_ends_a_barrier_wait_with_128_plus_n() {
    let server = etcd();
    assert_eq!(barrier(&server, &["hold", "sig"]).0, 0);
    let mut waiting = Proc::spawn(etcd_sync(&server, &["barrier", "wait", "sig"]));
    std::thread::sleep(Duration::from_millis(300));
    assert!(waiting.is_running(), "stderr: {}", waiting.stderr());
    waiting.signal(libc::SIGTERM);
    assert_eq!(waiting.code(WAIT), 128 + libc::SIGTERM);
    // The barrier is untouched.
    assert!(client(&server.endpoints()).get("sig").unwrap().is_some());
}

#[test]
fn barrier_bad_arguments_exit_2() {
    let server = etcd();
    let long_name = "x".repeat(5000);
    let cases: &[&[&str]] = &[
        &["barrier"],
        &["barrier", "hold"],
        &["barrier", "hold", ""],
        &["barrier", "lift", "x"],
        &["barrier", "wait", "--timeout", "soon", "x"],
        &["barrier", "release", "x", "y"],
    ];
    for args in cases {
        let out = etcd_sync_bare(args).output().expect("run etcd-sync");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
    // Only the library can tell this one is wrong; still exit 2.
    let (code, _, err) = barrier(&server, &["hold", &long_name]);
    assert_eq!(code, 2, "{err}");
    assert!(err.starts_with("etcd-sync: "), "{err}");
}
