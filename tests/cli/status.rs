//! `etcd-sync status NAME [--json]` for our locks and `etcdctl lock`, and `elect --listen`
//! taking no lease.

use crate::WAIT;
use crate::common::{client, etcd, eventually, hostname, keys};
use crate::proc::{Proc, etcd_sync, etcdctl, lease_of, leases};

use etcd_sync::testing::EtcdServer;

/// `etcd-sync status ARGS...`: its exit code and stdout lines.
fn status(server: &EtcdServer, args: &[&str]) -> (i32, Vec<String>) {
    let mut cmd = etcd_sync(server, &["status"]);
    cmd.args(args);
    let out = cmd.output().expect("run etcd-sync status");
    let code = out.status.code().expect("exited");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        code != 0 || out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, stdout.lines().map(str::to_string).collect())
}

#[test]
fn status_shows_our_holder_then_the_waiters_in_both_forms() {
    let server = etcd();
    let c = client(&server.endpoints());
    let holder = Proc::spawn(etcd_sync(&server, &["lock", "st"]));
    let key = holder.line(WAIT);
    let waiter = Proc::spawn(etcd_sync(&server, &["lock", "st"]));
    assert!(eventually(WAIT, || keys(&c, "st/").len() == 2));
    let waiting = keys(&c, "st/")
        .into_iter()
        .find(|k| *k != key)
        .expect("the waiter's key");
    let rev = |k: &str| c.get(k).unwrap().expect("key").create_revision;
    let host = hostname();

    let (code, lines) = status(&server, &["st"]);
    assert_eq!(code, 0);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0], "st: held by 1, 1 waiting");
    let ttl_of = |line: &str, prefix: &str| -> u64 {
        let rest = line
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("{line:?} does not start with {prefix:?}"));
        rest.strip_suffix('s')
            .and_then(|secs| secs.parse().ok())
            .unwrap_or_else(|| panic!("TTL in {line:?}"))
    };
    let ttl = ttl_of(
        &lines[1],
        &format!(
            "holder  {key}  {host}:{}  lease {}  token {}  ttl ",
            holder.pid(),
            lease_of(&key),
            rev(&key)
        ),
    );
    assert!((1..=10).contains(&ttl), "{ttl}");
    ttl_of(
        &lines[2],
        &format!(
            "waiter  {waiting}  {host}:{}  lease {}  token {}  ttl ",
            waiter.pid(),
            lease_of(&waiting),
            rev(&waiting)
        ),
    );

    let (code, lines) = status(&server, &["--json", "st"]);
    assert_eq!(code, 0);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let json = &lines[0];
    let holder_json = format!(
        r#"{{"name":"st","holders":[{{"key":"{key}","identity":"{host}:{}","lease":"{}","revision":{},"ttl":"#,
        holder.pid(),
        lease_of(&key),
        rev(&key)
    );
    assert!(json.starts_with(&holder_json), "{json}");
    let waiter_json = format!(
        r#"],"waiters":[{{"key":"{waiting}","identity":"{host}:{}","lease":"{}","revision":{},"ttl":"#,
        waiter.pid(),
        lease_of(&waiting),
        rev(&waiting)
    );
    assert!(json.contains(&waiter_json), "{json}");
    assert!(json.ends_with(r#","mode":"exclusive"}]}"#), "{json}");
}

#[test]
fn identity_from_the_flag_or_the_environment_is_what_status_shows() {
    let server = etcd();
    let c = client(&server.endpoints());
    let holder = Proc::spawn(etcd_sync(
        &server,
        &["--identity", "deploy bot #7", "lock", "idn"],
    ));
    let key = holder.line(WAIT);
    let mut cmd = etcd_sync(&server, &["lock", "idn"]);
    cmd.env("ETCD_SYNC_IDENTITY", "ci-runner");
    let _waiter = Proc::spawn(cmd);
    assert!(eventually(WAIT, || keys(&c, "idn/").len() == 2));
    // The identity is the key's value, as any etcd reader sees it.
    let value = c
        .get(&key)
        .unwrap()
        .expect("holder key")
        .value_str()
        .into_owned();
    assert_eq!(value, "deploy bot #7");

    let (code, lines) = status(&server, &["idn"]);
    assert_eq!(code, 0);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[1].starts_with(&format!("holder  {key}  deploy bot #7  lease ")),
        "{lines:?}"
    );
    assert!(
        lines[2].starts_with("waiter  ") && lines[2].contains("  ci-runner  lease "),
        "{lines:?}"
    );
}

#[test]
fn status_of_an_etcdctl_lock_shows_no_identity_then_free() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (code, lines) = status(&server, &["ctl"]);
    assert_eq!((code, lines), (0, vec!["ctl: free".to_string()]));

    let holder = Proc::spawn(etcdctl(&server, &["lock", "ctl"]));
    let key = holder.line(WAIT);
    assert!(key.starts_with("ctl/"), "{key}");
    let (code, lines) = status(&server, &["ctl"]);
    assert_eq!(code, 0);
    assert_eq!(lines[0], "ctl: held by 1, 0 waiting");
    assert!(
        lines[1].starts_with(&format!(
            "holder  {key}  (none: etcdctl or Go)  lease {}  token ",
            lease_of(&key)
        )),
        "{lines:?}"
    );
    let (code, lines) = status(&server, &["--json", "ctl"]);
    assert_eq!(code, 0);
    assert!(
        lines[0].starts_with(&format!(
            r#"{{"name":"ctl","holders":[{{"key":"{key}","identity":null,"lease":"{}","#,
            lease_of(&key)
        )),
        "{lines:?}"
    );

    // etcdctl releases on SIGINT: nobody holds it, which is not an error.
    holder.signal(libc::SIGINT);
    assert!(eventually(WAIT, || keys(&c, "ctl/").is_empty()));
    let (code, lines) = status(&server, &["--json", "ctl"]);
    assert_eq!(
        (code, lines),
        (
            0,
            vec![r#"{"name":"ctl","holders":[],"waiters":[]}"#.to_string()]
        )
    );
}

#[test]
fn status_refuses_a_missing_or_empty_name() {
    let server = etcd();
    for args in [&[][..], &[""], &["--json"]] {
        let (code, _) = status(&server, args);
        assert_eq!(code, 2, "{args:?}");
    }
}

#[test]
fn elect_listen_takes_no_lease() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut listener = Proc::spawn(etcd_sync(&server, &["elect", "--listen", "nolease"]));
    assert_eq!(listener.line(WAIT), "no-leader");
    assert!(
        leases(&server).contains("found 0 leases"),
        "{}",
        leases(&server)
    );
    // It still follows the election.
    let leader = Proc::spawn(etcd_sync(&server, &["elect", "nolease", "v1"]));
    let key = leader.line(WAIT);
    assert_eq!(listener.line(WAIT), format!("leader {key} v1"));
    assert!(keys(&c, "nolease/").len() == 1);
    listener.signal(libc::SIGINT);
    assert_eq!(listener.code(WAIT), 0, "stderr: {}", listener.stderr());
}
