//! `etcd-sync lock -n N` (one of N semaphore permits) and `etcd-sync lock --shared` (the read
//! side of a read-write lock): how many CMDs run at once, exclusion with `Mutex` and
//! `etcdctl lock`, argument errors, and kill on loss.

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use etcd_sync::TryLockError;
use etcd_sync::testing::EtcdServer;

use crate::common::{client, etcd, eventually, keys, session};
use crate::proc::{Proc, etcd_sync, etcd_sync_bare, etcdctl};
use crate::{WAIT, expect_started, loss_script};

/// CMD of a holder: prints `in <pgid> <key> <fencing token>` once it runs, then sleeps
/// until stopped (`exec`: SIGTERM ends it at once, with code 128 + SIGTERM).
const HOLD: &str = r#"echo "in $$ $ETCD_LOCK_KEY $ETCD_LOCK_REV"; exec sleep 30"#;

/// How long a waiter must stay waiting to count as excluded.
const EXCLUDED_FOR: Duration = Duration::from_secs(1);

/// `etcd-sync lock MODE... NAME -- sh -c HOLD`.
fn holder(server: &EtcdServer, mode: &[&str], name: &str) -> Proc {
    let mut args = vec!["lock"];
    args.extend(mode);
    args.extend([name, "--", "sh", "-c", HOLD]);
    Proc::spawn(etcd_sync(server, &args))
}

/// Waits until the holder's CMD runs; registers its group for cleanup; returns its
/// ETCD_LOCK_KEY and ETCD_LOCK_REV.
fn running(p: &mut Proc) -> (String, i64) {
    let line = p.line(WAIT);
    let words: Vec<&str> = line.split(' ').collect();
    match words[..] {
        ["in", pgid, key, rev] => {
            p.owns_group(pgid.parse().expect("pgid"));
            (key.to_string(), rev.parse().expect("ETCD_LOCK_REV"))
        }
        _ => panic!("unexpected line {line:?}; stderr: {}", p.stderr()),
    }
}

/// Asserts that `p` is still waiting: its CMD prints nothing for [`EXCLUDED_FOR`].
fn still_waiting(p: &mut Proc) {
    match p.lines.recv_timeout(EXCLUDED_FOR) {
        Err(RecvTimeoutError::Timeout) => {}
        other => panic!("ran while excluded: {other:?}; stderr: {}", p.stderr()),
    }
    assert!(p.is_running(), "stderr: {}", p.stderr());
}

/// Stops a holder: SIGTERM is passed on to CMD, whose exit code (128 + SIGTERM) comes back.
fn stop(p: &mut Proc) {
    p.signal(libc::SIGTERM);
    assert_eq!(p.code(WAIT), 128 + libc::SIGTERM, "stderr: {}", p.stderr());
}

#[test]
fn permits_let_n_commands_run_at_once_and_the_next_waits() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut first = holder(&server, &["-n", "2"], "batch");
    let mut second = holder(&server, &["--permits", "2"], "batch");
    let (key1, rev1) = running(&mut first);
    let (key2, _) = running(&mut second);
    for key in [&key1, &key2] {
        assert!(
            key.starts_with("batch/") && key.ends_with(".permits-2"),
            "{key}"
        );
    }
    let kv = c.get(&key1).unwrap().expect("first permit's key");
    assert_eq!(
        kv.create_revision, rev1,
        "ETCD_LOCK_REV is the fencing token"
    );

    let s = session(&c, 10);
    assert!(matches!(
        s.semaphore("batch", 2).unwrap().try_acquire(),
        Err(TryLockError::WouldBlock)
    ));
    let mut third = holder(&server, &["-n", "2"], "batch");
    assert!(eventually(WAIT, || keys(&c, "batch/").len() == 3));
    still_waiting(&mut third);

    stop(&mut first);
    let (key3, _) = running(&mut third);
    let mut expected = vec![key2, key3];
    expected.sort();
    assert_eq!(keys(&c, "batch/"), expected);
    stop(&mut second);
    stop(&mut third);
    assert!(keys(&c, "batch/").is_empty());
}

#[test]
fn shared_holders_run_together_and_exclusive_lockers_wait_for_them() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut readers = [
        holder(&server, &["--shared"], "catalog"),
        holder(&server, &["--shared"], "catalog"),
    ];
    for reader in &mut readers {
        let (key, _) = running(reader);
        assert!(
            key.starts_with("catalog/") && key.ends_with(".shared"),
            "{key}"
        );
    }

    let s = session(&c, 10);
    assert!(matches!(
        s.mutex("catalog").unwrap().try_lock(),
        Err(TryLockError::WouldBlock)
    ));
    let mut other = Proc::spawn(etcdctl(
        &server,
        &["lock", "catalog", "--", "echo", "etcdctl-got-it"],
    ));
    assert!(eventually(WAIT, || keys(&c, "catalog/").len() == 3));
    still_waiting(&mut other);
    let [first, second] = &mut readers;
    stop(first);
    still_waiting(&mut other);
    stop(second);
    assert_eq!(other.line(WAIT), "etcdctl-got-it");
    assert_eq!(other.code(WAIT), 0, "etcdctl: {}", other.stderr());
    assert!(keys(&c, "catalog/").is_empty());
}

#[test]
fn a_shared_holder_waits_for_a_mutex_holder() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let guard = s.mutex("catalog").unwrap().lock().unwrap();
    let mut reader = holder(&server, &["--shared"], "catalog");
    assert!(eventually(WAIT, || keys(&c, "catalog/").len() == 2));
    still_waiting(&mut reader);
    guard.release().unwrap();
    running(&mut reader);
    stop(&mut reader);
    assert!(keys(&c, "catalog/").is_empty());
}

#[test]
fn timeout_exits_4_for_permits_and_shared_holders_too() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let guard = s.mutex("busy").unwrap().lock().unwrap();
    for mode in [&["-n", "2"][..], &["--shared"]] {
        let mut args = vec!["lock", "--timeout", "500ms"];
        args.extend(mode);
        args.extend(["busy", "--", "echo", "never"]);
        let mut p = Proc::spawn(etcd_sync(&server, &args));
        assert_eq!(p.code(WAIT), 4, "{mode:?}: {}", p.stderr());
        assert!(p.rest(WAIT).expect("EOF").is_empty(), "CMD must not run");
        assert!(p.stderr().contains("--timeout"), "{}", p.stderr());
        assert_eq!(keys(&c, "busy/"), vec![guard.key_str().into_owned()]);
    }
}

#[test]
fn bad_permits_and_conflicting_modes_exit_2_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["lock", "-n", "0", "x"], "1 to 1024 permits"),
        (&["lock", "--permits", "1025", "x"], "1 to 1024 permits"),
        (
            &["lock", "-n", "abc", "x"],
            "\"abc\" is not a whole number of permits",
        ),
        (&["lock", "-n", "2", "--shared", "x"], "cannot be used with"),
        (&["lock", "--shared", "-n", "2", "x"], "cannot be used with"),
    ];
    for (args, says) in cases {
        let out = etcd_sync_bare(args).output().expect("run etcd-sync");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("--permits") && stderr.contains(says),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn a_different_number_of_permits_is_refused_with_exit_2() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let permit = s.semaphore("agree", 3).unwrap().acquire().unwrap();
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &["lock", "-n", "2", "agree", "--", "echo", "never"],
    ));
    assert_eq!(p.code(WAIT), 2, "stderr: {}", p.stderr());
    assert!(p.rest(WAIT).expect("EOF").is_empty(), "CMD must not run");
    let stderr = p.stderr();
    assert!(
        stderr.starts_with("etcd-sync: ") && stderr.contains(&*permit.key_str()),
        "{stderr}"
    );
    assert_eq!(keys(&c, "agree/"), vec![permit.key_str().into_owned()]);
}

#[test]
fn deleting_the_key_of_a_permit_or_shared_holder_stops_its_command() {
    let server = etcd();
    let c = client(&server.endpoints());
    let script = loss_script("echo got-term; exit 0");
    let modes: [(&[&str], &str, &str); 2] = [
        (&["-n", "2"], "del-permit", "permit lost"),
        (&["--shared"], "del-shared", "read lock lost"),
    ];
    for (mode, name, lost) in modes {
        let mut args = vec!["lock", "--kill-grace", "2s"];
        args.extend(mode);
        args.extend([name, "--", "sh", "-c", &script]);
        let mut p = Proc::spawn(etcd_sync(&server, &args));
        expect_started(&mut p);
        let prefix = format!("{name}/");
        let held = keys(&c, &prefix);
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(c.delete(&held[0]).unwrap(), 1);
        assert_eq!(p.code(WAIT), 3, "stderr: {}", p.stderr());
        // CMD got SIGTERM; EOF shows its grandchild (`sleep 30`) is gone too.
        assert_eq!(
            p.rest(Duration::from_secs(5)),
            Some(vec!["got-term".to_string()])
        );
        let stderr = p.stderr();
        assert!(
            stderr.contains(lost) && stderr.contains("its key was deleted"),
            "{stderr}"
        );
        assert!(keys(&c, &prefix).is_empty());
    }
}
