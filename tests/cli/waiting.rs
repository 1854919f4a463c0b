//! What the CLI says while it waits (issue 51 item 3): the waiting line, `--quiet`,
//! `-v`/`RUST_LOG` for the library's events, and etcdctl's environment variables.

use std::time::Duration;

use crate::common::{client, etcd, eventually, keys};
use crate::proc::{Proc, etcd_sync, etcd_sync_bare, lease_of};
use crate::{WAIT, free_port};

#[test]
fn a_wait_says_who_holds_and_how_many_are_ahead_unless_quiet() {
    let server = etcd();
    let c = client(&server.endpoints());
    let holder = Proc::spawn(etcd_sync(
        &server,
        &["--identity", "holder-A", "lock", "busy"],
    ));
    let key = holder.line(WAIT);
    let lease = lease_of(&key).to_string();
    let mut loud = Proc::spawn(etcd_sync(&server, &["lock", "busy", "--", "true"]));
    assert!(eventually(WAIT, || keys(&c, "busy/").len() == 2));
    let mut quiet = Proc::spawn(etcd_sync(&server, &["lock", "-q", "busy", "--", "true"]));
    assert!(eventually(WAIT, || keys(&c, "busy/").len() == 3));

    // After about 3 s: one line naming the holder, its lease, and the one key ahead.
    let expected = format!("held by holder-A (lease {lease}, ttl ");
    assert!(
        eventually(WAIT, || loud.stderr().contains(&expected)),
        "stderr: {}",
        loud.stderr()
    );
    let said = loud.stderr();
    assert!(
        said.starts_with("etcd-sync: waiting for \"busy\" for "),
        "{said}"
    );
    assert!(said.trim_end().ends_with("; 1 ahead"), "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(quiet.stderr(), "", "--quiet says nothing");

    holder.signal(libc::SIGINT);
    assert_eq!(loud.code(WAIT), 0, "stderr: {}", loud.stderr());
    assert_eq!(quiet.code(WAIT), 0, "stderr: {}", quiet.stderr());
    assert_eq!(quiet.stderr(), "");
}

#[test]
fn a_barrier_wait_says_who_raised_it() {
    let server = etcd();
    let mut hold = Proc::spawn(etcd_sync(&server, &["barrier", "hold", "gate"]));
    assert_eq!(hold.code(WAIT), 0, "{}", hold.stderr());
    let waiter = Proc::spawn(etcd_sync(&server, &["barrier", "wait", "gate"]));
    assert!(
        eventually(WAIT, || waiter.stderr().contains(
            "etcd-sync: waiting for the barrier \"gate\" for 3s: raised by "
        )),
        "stderr: {}",
        waiter.stderr()
    );
    let mut release = Proc::spawn(etcd_sync(&server, &["barrier", "release", "gate"]));
    assert_eq!(release.code(WAIT), 0, "{}", release.stderr());
    assert_eq!(waiter.line(WAIT), "gate: released");
}

#[test]
fn verbose_and_rust_log_show_the_librarys_events() {
    let server = etcd();
    let run = |args: &[&str], rust_log: Option<&str>| {
        let mut cmd = etcd_sync(&server, args);
        if let Some(spec) = rust_log {
            cmd.env("RUST_LOG", spec);
        }
        let mut p = Proc::spawn(cmd);
        assert_eq!(p.code(WAIT), 0, "{args:?}: {}", p.stderr());
        p.stderr()
    };
    assert_eq!(run(&["lock", "logs", "--", "true"], None), "");
    let info = run(&["-v", "lock", "logs", "--", "true"], None);
    assert!(info.contains("connected to etcd"), "{info}");
    assert!(!info.contains("DEBUG"), "{info}");
    let debug = run(&["lock", "-vv", "logs", "--", "true"], None);
    assert!(
        debug.contains("DEBUG") && debug.contains("acquired"),
        "{debug}"
    );
    let from_env = run(&["lock", "logs", "--", "true"], Some("etcd_sync=debug"));
    assert!(from_env.contains("connected to etcd"), "{from_env}");
    assert!(from_env.contains("acquired"), "{from_env}");
    let level = run(&["--log-level", "info", "lock", "logs", "--", "true"], None);
    assert!(level.contains("connected to etcd"), "{level}");
    let off = run(
        &["--log-level", "off", "-v", "lock", "logs", "--", "true"],
        None,
    );
    assert_eq!(off, "");
}

#[test]
fn etcdctl_variables_are_read_after_ours() {
    let server = etcd();
    let dead = format!("http://127.0.0.1:{}", free_port());
    // ETCDCTL_ENDPOINTS alone is enough.
    let mut cmd = etcd_sync_bare(&["lock", "ctl", "--", "true"]);
    cmd.env("ETCDCTL_ENDPOINTS", server.endpoint());
    let mut p = Proc::spawn(cmd);
    assert_eq!(p.code(WAIT), 0, "{}", p.stderr());
    // Ours wins.
    let mut cmd = etcd_sync_bare(&["--dial-timeout", "500ms", "lock", "ctl", "--", "true"]);
    cmd.env("ETCD_SYNC_ENDPOINTS", &dead)
        .env("ETCDCTL_ENDPOINTS", server.endpoint());
    let mut p = Proc::spawn(cmd);
    assert_eq!(p.code(WAIT), 1, "{}", p.stderr());
    let mut cmd = etcd_sync_bare(&["lock", "ctl", "--", "true"]);
    cmd.env("ETCD_SYNC_ENDPOINTS", server.endpoint())
        .env("ETCDCTL_ENDPOINTS", &dead);
    let mut p = Proc::spawn(cmd);
    assert_eq!(p.code(WAIT), 0, "{}", p.stderr());
    // The others are read too: a bad ETCDCTL_DIAL_TIMEOUT is a bad argument, unless ours
    // is set.
    let mut cmd = etcd_sync(&server, &["lock", "ctl", "--", "true"]);
    cmd.env("ETCDCTL_DIAL_TIMEOUT", "soon");
    let mut p = Proc::spawn(cmd);
    assert_eq!(p.code(WAIT), 2, "{}", p.stderr());
    assert!(p.stderr().contains("--dial-timeout"), "{}", p.stderr());
    let mut cmd = etcd_sync(&server, &["lock", "ctl", "--", "true"]);
    cmd.env("ETCDCTL_DIAL_TIMEOUT", "soon")
        .env("ETCD_SYNC_DIAL_TIMEOUT", "2s");
    let mut p = Proc::spawn(cmd);
    assert_eq!(p.code(WAIT), 0, "{}", p.stderr());
    // --help names both, whatever is set.
    let out = etcd_sync_bare(&["--help"]).output().expect("run etcd-sync");
    let help = String::from_utf8_lossy(&out.stdout);
    for (ours, theirs) in [
        ("ETCD_SYNC_ENDPOINTS", "ETCDCTL_ENDPOINTS"),
        ("ETCD_SYNC_CACERT", "ETCDCTL_CACERT"),
        ("ETCD_SYNC_PASSWORD", "ETCDCTL_PASSWORD"),
    ] {
        assert!(
            help.contains(&format!("[env: {ours}, then {theirs}]")),
            "{help}"
        );
    }
    assert!(
        help.contains("--quiet") && help.contains("--verbose"),
        "{help}"
    );
}
