//! The `etcd-sync` command-line tool, run as a subprocess against real etcd servers (and
//! the real `etcdctl`). Needs features `cli` and `testing`: `cargo test --all-features`.
#![cfg(all(feature = "cli", feature = "testing"))]

mod barrier;
#[path = "../common/mod.rs"]
mod common;
mod errors;
mod modes;
mod proc;
mod proxy;
mod revoke;
mod status;
mod top;
mod waiting;
mod zero;

use proc::{Proc, etcd_sync, etcd_sync_bare, etcdctl, lease_of, leases};

use std::time::{Duration, Instant};

use common::{client, etcd, eventually, keys, session};
use etcd_sync::testing::EtcdServer;
use etcd_sync::{LeaderEvent, TryLockError};

/// Generous: the machine may be busy building or running other suites.
pub(crate) const WAIT: Duration = Duration::from_secs(15);

#[test]
fn lock_prints_key_holds_and_releases_on_sigint() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut p = Proc::spawn(etcd_sync(&server, &["lock", "job"]));
    let key = p.line(WAIT);
    assert!(key.starts_with("job/"), "{key:?}");
    assert_eq!(keys(&c, "job/"), vec![key.clone()]);
    assert!(leases(&server).contains(lease_of(&key)));

    let s = session(&c, 10);
    assert!(matches!(
        s.mutex("job").unwrap().try_lock(),
        Err(TryLockError::WouldBlock)
    ));
    std::thread::sleep(Duration::from_millis(300));
    assert!(p.is_running(), "stderr: {}", p.stderr());

    p.signal(libc::SIGINT);
    assert_eq!(p.code(WAIT), 0, "stderr: {}", p.stderr());
    assert!(keys(&c, "job/").is_empty());
    // The session was closed (lease revoked), not left to expire.
    assert!(!leases(&server).contains(lease_of(&key)));
    let _g = s.mutex("job").unwrap().try_lock().expect("free again");
}

#[test]
fn lock_command_gets_key_and_fencing_token_and_its_exit_code_passes_through() {
    let server = etcd();
    let c = client(&server.endpoints());
    // Contended, so that the create revision differs from the revision at acquisition
    // (etcdctl's ETCD_LOCK_REV is the latter; ours is the fencing token).
    let s = session(&c, 10);
    let ours = s.mutex("envs").unwrap().lock().unwrap();
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &[
            "lock",
            "envs",
            "--",
            "sh",
            "-c",
            r#"echo "$ETCD_LOCK_KEY $ETCD_LOCK_REV""#,
        ],
    ));
    assert!(eventually(WAIT, || keys(&c, "envs/").len() == 2));
    let queued = c
        .get_prefix("envs/")
        .unwrap()
        .into_iter()
        .find(|kv| kv.key != ours.key())
        .expect("etcd-sync's key");
    for i in 0..3 {
        c.put("noise", i.to_string()).unwrap();
    }
    drop(ours);
    let line = p.line(WAIT);
    assert_eq!(
        line,
        format!("{} {}", queued.key_str(), queued.create_revision)
    );
    assert_eq!(p.code(WAIT), 0, "stderr: {}", p.stderr());
    assert!(keys(&c, "envs/").is_empty());

    let mut p = Proc::spawn(etcd_sync(
        &server,
        &["lock", "envs", "--", "sh", "-c", "exit 7"],
    ));
    assert_eq!(p.code(WAIT), 7);
    assert_eq!(p.stderr(), "", "no message when the code is CMD's");
    assert!(keys(&c, "envs/").is_empty());

    let mut p = Proc::spawn(etcd_sync(
        &server,
        &["lock", "envs", "--", "sh", "-c", "kill -KILL $$"],
    ));
    assert_eq!(p.code(WAIT), 128 + libc::SIGKILL);
    assert!(keys(&c, "envs/").is_empty());
}

#[test]
fn missing_command_exits_127_and_releases() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &["lock", "nf", "--", "/nonexistent/etcd-sync-test-cmd"],
    ));
    assert_eq!(p.code(WAIT), 127);
    assert!(p.stderr().starts_with("etcd-sync: "), "{}", p.stderr());
    assert!(keys(&c, "nf/").is_empty());
}

#[test]
fn lock_command_waits_for_etcdctl_lock() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut held = Proc::spawn(etcdctl(&server, &["lock", "shared", "--", "sleep", "2"]));
    assert!(eventually(WAIT, || keys(&c, "shared/").len() == 1));
    let started = Instant::now();
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &["lock", "shared", "--", "sh", "-c", "echo got-it"],
    ));
    assert_eq!(p.line(WAIT), "got-it");
    let waited = started.elapsed();
    assert!(
        waited > Duration::from_millis(800),
        "did not wait for etcdctl: {waited:?}"
    );
    assert_eq!(p.code(WAIT), 0);
    assert_eq!(held.code(WAIT), 0, "etcdctl: {}", held.stderr());
    assert!(keys(&c, "shared/").is_empty());
}

#[test]
fn etcdctl_lock_waits_while_etcd_sync_holds() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut p = Proc::spawn(etcd_sync(&server, &["lock", "shared"]));
    let key = p.line(WAIT);
    let mut other = Proc::spawn(etcdctl(
        &server,
        &["lock", "shared", "--", "echo", "etcdctl-got-it"],
    ));
    assert!(eventually(WAIT, || keys(&c, "shared/").len() == 2));
    std::thread::sleep(Duration::from_millis(1000));
    assert!(other.is_running(), "etcdctl got the lock while we held it");
    assert!(keys(&c, "shared/").contains(&key));

    p.signal(libc::SIGTERM);
    assert_eq!(p.code(WAIT), 0);
    assert_eq!(other.line(WAIT), "etcdctl-got-it");
    assert_eq!(other.code(WAIT), 0);
}

#[test]
fn timeout_exits_4_and_leaves_no_key() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let guard = s.mutex("busy").unwrap().lock().unwrap();
    let started = Instant::now();
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &["lock", "--timeout", "1s", "busy", "--", "echo", "never"],
    ));
    assert_eq!(p.code(WAIT), 4, "stderr: {}", p.stderr());
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(p.rest(WAIT).expect("EOF").is_empty(), "CMD must not run");
    assert!(p.stderr().contains("--timeout"), "{}", p.stderr());
    assert_eq!(keys(&c, "busy/"), vec![guard.key_str().into_owned()]);

    // The same for a campaign.
    let leading = s.election("busy-e").unwrap().campaign("us").unwrap();
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &["elect", "busy-e", "them", "--timeout", "500ms"],
    ));
    assert_eq!(p.code(WAIT), 4, "stderr: {}", p.stderr());
    assert_eq!(
        keys(&c, "busy-e/"),
        vec![String::from_utf8_lossy(leading.key()).into_owned()]
    );
}

#[test]
fn signal_while_waiting_exits_128_plus_n_and_removes_the_key() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let _guard = s.mutex("wait").unwrap().lock().unwrap();
    let mut p = Proc::spawn(etcd_sync(&server, &["lock", "wait", "--", "echo", "never"]));
    assert!(eventually(WAIT, || keys(&c, "wait/").len() == 2));
    p.signal(libc::SIGINT);
    assert_eq!(p.code(WAIT), 128 + libc::SIGINT, "stderr: {}", p.stderr());
    assert!(p.rest(WAIT).expect("EOF").is_empty(), "CMD must not run");
    assert_eq!(keys(&c, "wait/").len(), 1);
}

#[test]
fn elect_prints_key_and_value_and_etcdctl_sees_the_leader() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut p = Proc::spawn(etcd_sync(&server, &["elect", "ee", "proposal-1"]));
    let key = p.line(WAIT);
    assert!(key.starts_with("ee/"), "{key:?}");
    assert_eq!(p.line(WAIT), "proposal-1");

    let listener = Proc::spawn(etcdctl(&server, &["elect", "-l", "ee"]));
    assert_eq!(listener.line(WAIT), key);
    assert_eq!(listener.line(WAIT), "proposal-1");
    let s = session(&c, 10);
    let leader = s
        .election("ee")
        .unwrap()
        .leader()
        .unwrap()
        .expect("a leader");
    assert_eq!(leader.key_str(), key);

    p.signal(libc::SIGINT);
    assert_eq!(p.code(WAIT), 0, "stderr: {}", p.stderr());
    assert_eq!(s.election("ee").unwrap().leader().unwrap(), None);
}

#[test]
fn elect_command_gets_key_and_fencing_token() {
    let server = etcd();
    let c = client(&server.endpoints());
    let observer = session(&c, 10).election("ec").unwrap().observe().unwrap();
    assert_eq!(observer.recv_timeout(WAIT).unwrap(), LeaderEvent::NoLeader);
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &[
            "elect",
            "ec",
            "v",
            "--",
            "sh",
            "-c",
            r#"echo "$ETCD_ELECT_KEY $ETCD_ELECT_REV"; exit 5"#,
        ],
    ));
    let line = p.line(WAIT);
    assert_eq!(p.code(WAIT), 5);
    let leader = match observer.recv_timeout(WAIT).unwrap() {
        LeaderEvent::Elected(leader) => leader,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        line,
        format!("{} {}", leader.key_str(), leader.create_revision)
    );
    assert!(keys(&c, "ec/").is_empty(), "resigned after CMD");
}

#[test]
fn listen_json_prints_the_state_then_every_change() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut p = Proc::spawn(etcd_sync(&server, &["elect", "--listen", "--json", "obs"]));
    assert_eq!(p.line(WAIT), r#"{"event":"no-leader"}"#);

    let s = session(&c, 10);
    let mut leadership = s.election("obs").unwrap().campaign("v1").unwrap();
    let key = String::from_utf8_lossy(leadership.key()).into_owned();
    let elected = p.line(WAIT);
    let revision = leadership.fencing_token();
    assert!(
        elected.starts_with(&format!(
            r#"{{"event":"elected","key":"{key}","value":"v1","revision":{revision},"#
        )),
        "{elected}"
    );
    assert!(
        elected.ends_with(&format!(r#","lease":"{:x}"}}"#, s.lease_id())),
        "{elected}"
    );

    leadership.proclaim("v2").unwrap();
    let proclaimed = p.line(WAIT);
    assert!(
        proclaimed.starts_with(&format!(
            r#"{{"event":"proclaimed","key":"{key}","value":"v2","#
        )),
        "{proclaimed}"
    );
    leadership.resign().unwrap();
    assert_eq!(p.line(WAIT), r#"{"event":"no-leader"}"#);

    p.signal(libc::SIGINT);
    assert_eq!(p.code(WAIT), 0, "stderr: {}", p.stderr());
}

#[test]
fn listen_prints_human_lines() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let leadership = s.election("hum").unwrap().campaign("first").unwrap();
    let key = String::from_utf8_lossy(leadership.key()).into_owned();
    let mut p = Proc::spawn(etcd_sync(&server, &["elect", "-l", "hum"]));
    assert_eq!(p.line(WAIT), format!("leader {key} first"));
    drop(leadership);
    assert_eq!(p.line(WAIT), "no-leader");
    p.signal(libc::SIGTERM);
    assert_eq!(p.code(WAIT), 0);
}

/// The CMD of the kill-on-loss tests: prints `started <pgid>` (its pid is its process
/// group), starts a grandchild in its group, and waits.
pub(crate) fn loss_script(on_term: &str) -> String {
    format!("trap '{on_term}' TERM; echo started $$; sleep 30 & wait")
}

/// Reads `started <pgid>` and registers the group for cleanup.
pub(crate) fn expect_started(p: &mut Proc) {
    let line = p.line(WAIT);
    let pgid = line
        .strip_prefix("started ")
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("unexpected line {line:?}"));
    p.owns_group(pgid);
}

#[test]
fn lost_lock_terminates_the_command_group_and_exits_3() {
    let server = etcd();
    let script = loss_script("echo got-term; exit 0");
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &[
            "--ttl",
            "2",
            "lock",
            "--kill-grace",
            "2s",
            "lost",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    expect_started(&mut p);
    server.pause().expect("pause etcd");
    // TTL (2 s) + grace (2 s) + slack.
    let code = p.wait_timeout(Duration::from_secs(2 + 2 + 6));
    server.resume().expect("resume etcd");
    let code = code.and_then(|status| status.code());
    assert_eq!(code, Some(3), "stderr: {}", p.stderr());
    // CMD got SIGTERM; EOF shows the grandchild (`sleep 30`) is gone too.
    let rest = p
        .rest(Duration::from_secs(5))
        .expect("CMD's whole group ended");
    assert_eq!(rest, vec!["got-term".to_string()]);
    assert!(p.stderr().contains("lock lost"), "{}", p.stderr());
}

#[test]
fn lost_lock_escalates_to_sigkill_after_the_grace() {
    let server = etcd();
    // Ignores SIGTERM (and so does its grandchild): only SIGKILL ends them.
    let script = loss_script("");
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &[
            "--ttl",
            "2",
            "lock",
            "--kill-grace",
            "1s",
            "stubborn",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    expect_started(&mut p);
    server.pause().expect("pause etcd");
    let code = p.wait_timeout(Duration::from_secs(2 + 1 + 6));
    server.resume().expect("resume etcd");
    assert_eq!(
        code.and_then(|status| status.code()),
        Some(3),
        "stderr: {}",
        p.stderr()
    );
    assert_eq!(p.rest(Duration::from_secs(5)), Some(vec![]));
}

#[test]
fn lost_leadership_without_command_exits_3() {
    let server = etcd();
    let mut p = Proc::spawn(etcd_sync(&server, &["--ttl", "2", "elect", "lead", "me"]));
    assert!(p.line(WAIT).starts_with("lead/"));
    assert_eq!(p.line(WAIT), "me");
    server.pause().expect("pause etcd");
    let code = p.wait_timeout(Duration::from_secs(2 + 6));
    server.resume().expect("resume etcd");
    assert_eq!(
        code.and_then(|status| status.code()),
        Some(3),
        "stderr: {}",
        p.stderr()
    );
    assert!(p.stderr().contains("leadership lost"), "{}", p.stderr());
}

#[test]
fn signals_are_forwarded_to_the_command_then_the_lock_is_released() {
    let server = etcd();
    let c = client(&server.endpoints());
    let script = loss_script("echo got-term; exit 5");
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &[
            "lock",
            "--kill-grace",
            "2s",
            "fwd",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    expect_started(&mut p);
    assert_eq!(keys(&c, "fwd/").len(), 1);
    p.signal(libc::SIGTERM);
    assert_eq!(p.code(WAIT), 5, "stderr: {}", p.stderr());
    assert_eq!(p.rest(WAIT), Some(vec!["got-term".to_string()]));
    assert!(keys(&c, "fwd/").is_empty());
}

#[test]
fn cannot_connect_exits_1() {
    let port = free_port();
    let mut cmd = etcd_sync_bare(&["--dial-timeout", "500ms", "lock", "x"]);
    cmd.env("ETCD_SYNC_ENDPOINTS", format!("http://127.0.0.1:{port}"));
    let mut p = Proc::spawn(cmd);
    assert_eq!(p.code(WAIT), 1);
    let stderr = p.stderr();
    assert!(stderr.starts_with("etcd-sync: "), "{stderr}");
    assert!(stderr.contains(&port.to_string()), "{stderr}");
}

/// A port nothing listens on.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn endpoints_come_from_the_environment_comma_separated() {
    let server = etcd();
    let c = client(&server.endpoints());
    let dead = format!("http://127.0.0.1:{}", free_port());
    let mut cmd = etcd_sync_bare(&["lock", "envep", "--", "sh", "-c", "echo $ETCD_LOCK_KEY"]);
    cmd.env(
        "ETCD_SYNC_ENDPOINTS",
        format!("{dead}, {}", server.endpoint()),
    );
    let mut p = Proc::spawn(cmd);
    assert!(p.line(WAIT).starts_with("envep/"));
    assert_eq!(p.code(WAIT), 0, "stderr: {}", p.stderr());
    assert!(keys(&c, "envep/").is_empty());
}

#[test]
fn bad_arguments_exit_2() {
    let cases: &[&[&str]] = &[
        &[],
        &["lock"],
        &["lock", ""],
        &["lock", "x", "echo"],
        &["elect", "e"],
        &["elect", "-l", "e", "p"],
        &["elect", "--json", "e", "p"],
        &["elect", "-l", "e", "--", "true"],
        &["elect", "-l", "e", "--timeout", "1s"],
        &["--ttl", "0", "lock", "x"],
        &["--ttl", "ten", "lock", "x"],
        &["--dial-timeout", "soon", "lock", "x"],
        &["lock", "--timeout", "-1s", "x"],
        &["unlock", "x"],
        // Only the library can tell these are wrong; still bad arguments, not runtime errors.
        &["--endpoints", "not a url", "lock", "x"],
        &["--endpoints", "", "lock", "x"],
        &["--endpoints", "127.0.0.1:99999", "lock", "x"],
        &["--dial-timeout", "0s", "lock", "x"],
        &["--command-timeout", "0s", "lock", "x"],
        &["--identity", "", "lock", "x"],
        &["--identity", "two\nlines", "lock", "x"],
    ];
    let long_name = "x".repeat(5000);
    let long_identity = "i".repeat(etcd_sync::MAX_IDENTITY_LEN + 1);
    let server = etcd();
    let long = etcd_sync(&server, &["lock", &long_name]);
    let mut runs: Vec<(String, std::process::Command)> = cases
        .iter()
        .map(|args| (format!("{args:?}"), etcd_sync_bare(args)))
        .collect();
    runs.push(("a 5000-byte name".into(), long));
    runs.push((
        "a 257-byte identity".into(),
        etcd_sync(&server, &["--identity", &long_identity, "lock", "x"]),
    ));
    for (what, mut cmd) in runs {
        let out = cmd.output().expect("run etcd-sync");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stderr.is_empty(), "{what}: no message");
    }
    // The table is in the top-level help once; subcommands point to it.
    let out = etcd_sync_bare(&["--help"]).output().expect("run etcd-sync");
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Exit codes:") && text.contains("128+N"),
        "{text}"
    );
    for help in [&["lock", "--help"][..], &["elect", "--help"]] {
        let out = etcd_sync_bare(help).output().expect("run etcd-sync");
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("etcd-sync --help") && !text.contains("128+N"),
            "{text}"
        );
    }
}

/// Started with `&` from a non-interactive script, a command inherits SIGINT ignored;
/// `kill -INT` must still release the lock and stop it (etcdctl stops too).
#[test]
fn sigint_inherited_as_ignored_still_releases_and_stops() {
    use std::os::unix::process::CommandExt;
    let server = etcd();
    let c = client(&server.endpoints());
    let mut cmd = etcd_sync(&server, &["lock", "bg"]);
    // SAFETY: only signal(2), async-signal-safe, between fork and exec (runs after the
    // helper's own pre_exec, which restored the default).
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut p = Proc::spawn(cmd);
    let key = p.line(WAIT);
    assert!(key.starts_with("bg/"), "{key:?}");
    p.signal(libc::SIGINT);
    assert_eq!(p.code(WAIT), 0, "stderr: {}", p.stderr());
    assert!(keys(&c, "bg/").is_empty());
}

#[test]
fn tls_and_auth_flags_reach_a_secured_etcd() {
    // mutual TLS
    let server = EtcdServer::builder()
        .tls()
        .start()
        .expect("start etcd with TLS");
    let certs = server.tls_certs().expect("TLS mode").clone();
    let (ca, cert, key) = (
        certs.ca_cert.display().to_string(),
        certs.client_cert.display().to_string(),
        certs.client_key.display().to_string(),
    );
    let mut ok = Proc::spawn(etcd_sync(
        &server,
        &[
            "--cacert", &ca, "--cert", &cert, "--key", &key, "lock", "tls-cli", "--", "true",
        ],
    ));
    assert_eq!(ok.code(WAIT), 0, "{}", ok.stderr());
    let mut no_client_cert = Proc::spawn(etcd_sync(
        &server,
        &["--cacert", &ca, "lock", "tls-cli", "--", "true"],
    ));
    assert_eq!(no_client_cert.code(WAIT), 1);
    // One stable message whichever way etcd refused (alert or closed connection).
    let stderr = no_client_cert.stderr();
    assert!(
        stderr.contains("requires a TLS client certificate signed by its CA")
            && stderr.contains("pass --cert FILE --key FILE"),
        "{stderr}"
    );
    assert!(!stderr.contains("is etcd running"), "{stderr}");
    let mut cert_without_ca = Proc::spawn(etcd_sync(
        &server,
        &["--cert", &cert, "--key", &key, "lock", "x"],
    ));
    // A flag combination that cannot work: bad arguments.
    assert_eq!(cert_without_ca.code(WAIT), 2);
    assert!(
        cert_without_ca.stderr().contains("--cacert"),
        "{}",
        cert_without_ca.stderr()
    );

    // auth
    let server = EtcdServer::start().expect("start etcd");
    server.enable_auth().expect("enable auth");
    let (user, password) = etcd_sync::testing::AUTH_USER;
    let credentials = format!("{user}:{password}");
    let mut ok = Proc::spawn(etcd_sync(
        &server,
        &["--user", &credentials, "lock", "app/cli", "--", "true"],
    ));
    assert_eq!(ok.code(WAIT), 0, "{}", ok.stderr());
    let mut via_env = etcd_sync(&server, &["--user", user, "lock", "app/cli", "--", "true"]);
    via_env.env("ETCD_SYNC_PASSWORD", password);
    let mut via_env = Proc::spawn(via_env);
    assert_eq!(via_env.code(WAIT), 0, "{}", via_env.stderr());
    let mut wrong = Proc::spawn(etcd_sync(
        &server,
        &["--user", "app:wrong", "lock", "app/cli"],
    ));
    assert_eq!(wrong.code(WAIT), 1);
    assert!(
        wrong.stderr().contains("authentication failed"),
        "{}",
        wrong.stderr()
    );
}

/// `elect --hand-over-next`: a signal hands leadership to the first candidate in line,
/// whoever it is; the one behind it keeps waiting and leads after it.
#[test]
fn elect_hands_over_to_the_first_in_line_on_a_signal() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &["elect", "hn", "first", "--hand-over-next"],
    ));
    let key = p.line(WAIT);
    assert_eq!(p.line(WAIT), "first");
    let (sb, sc) = (session(&c, 10), session(&c, 10));
    let eb = sb.election("hn").unwrap();
    let next = std::thread::spawn(move || eb.campaign("next"));
    assert!(eventually(WAIT, || keys(&c, "hn/").len() == 2));
    let ec = sc.election("hn").unwrap();
    let behind = std::thread::spawn(move || ec.campaign_timeout("behind", Duration::from_secs(8)));
    assert!(eventually(WAIT, || keys(&c, "hn/").len() == 3));

    p.signal(libc::SIGTERM);
    assert_eq!(p.code(WAIT), 0, "stderr: {}", p.stderr());
    assert!(p.stderr().contains("handed over to next"), "{}", p.stderr());
    let leadership = next.join().unwrap().unwrap();
    assert_eq!(
        leadership.key_str(),
        key,
        "the successor holds the old leader's key"
    );
    assert!(!behind.is_finished(), "the candidate behind led");
    drop(leadership);
    assert!(
        behind.join().unwrap().is_ok(),
        "the candidate behind leads after the successor"
    );
}

/// `elect --hand-over-to` and `--hand-over-next` together are refused before anything
/// is written.
#[test]
fn elect_refuses_both_hand_over_options() {
    let server = etcd();
    let out = etcd_sync(
        &server,
        &[
            "elect",
            "hb",
            "v",
            "--hand-over-to",
            "x",
            "--hand-over-next",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be used with"),
        "{out:?}"
    );
    assert!(keys(&client(&server.endpoints()), "hb/").is_empty());
}

/// `elect --hand-over-to`: a signal hands leadership to the named waiting candidate
/// instead of resigning; the candidate ahead of it keeps waiting (issue 53).
#[test]
fn elect_hands_over_to_the_named_candidate_on_a_signal() {
    let server = etcd();
    let c = client(&server.endpoints());
    let mut p = Proc::spawn(etcd_sync(
        &server,
        &["elect", "hv", "first", "--hand-over-to", "chosen"],
    ));
    let key = p.line(WAIT);
    assert_eq!(p.line(WAIT), "first");
    let (sb, sc) = (session(&c, 10), session(&c, 10));
    let eb = sb.election("hv").unwrap();
    let b = std::thread::spawn(move || eb.campaign_timeout("other", Duration::from_secs(8)));
    assert!(eventually(WAIT, || keys(&c, "hv/").len() == 2));
    let ec = sc.election("hv").unwrap();
    let chosen = std::thread::spawn(move || ec.campaign("chosen"));
    assert!(eventually(WAIT, || keys(&c, "hv/").len() == 3));

    p.signal(libc::SIGTERM);
    assert_eq!(p.code(WAIT), 0, "stderr: {}", p.stderr());
    assert!(
        p.stderr().contains("handed over to chosen"),
        "{}",
        p.stderr()
    );
    let leadership = chosen.join().unwrap().unwrap();
    assert_eq!(
        leadership.key_str(),
        key,
        "the successor holds the old leader's key"
    );
    assert!(!b.is_finished(), "the candidate ahead led");
    drop(leadership);
    assert!(
        b.join().unwrap().is_ok(),
        "the candidate ahead leads after the successor"
    );
}
