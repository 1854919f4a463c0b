//! etcd authentication: credentials, the restricted user's permissions, and tokens that
//! expire in the middle of a lock wait (`--auth-token-ttl`).

#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, Instant};

use etcd_sync::testing::{AUTH_ROOT, AUTH_USER, EtcdServer};
use etcd_sync::{Client, Code, Error};

fn auth_server(extra: &[&str]) -> EtcdServer {
    let server = EtcdServer::builder()
        .args(extra.iter().copied())
        .start()
        .expect("start etcd");
    server.enable_auth().expect("enable auth with etcdctl");
    server
}

fn user_client(server: &EtcdServer, (user, password): (&str, &str)) -> etcd_sync::Result<Client> {
    Client::builder()
        .endpoints(server.endpoints())
        .user(user, password)
        .request_timeout(Duration::from_secs(3))
        .connect()
}

/// The restricted user's client of these endpoints, with a session (TTL 10 s).
fn app_session(endpoints: Vec<String>) -> (Client, etcd_sync::Session) {
    let client = Client::builder()
        .endpoints(endpoints)
        .user(AUTH_USER.0, AUTH_USER.1)
        .request_timeout(Duration::from_secs(2))
        .connect()
        .expect("connect as the restricted user");
    let session = client
        .session_builder()
        .ttl(Duration::from_secs(10))
        .start()
        .expect("a session as the restricted user");
    (client, session)
}

#[test]
fn wrong_credentials_and_missing_credentials_are_clear_errors() {
    let server = auth_server(&[]);
    match user_client(&server, (AUTH_USER.0, "wrong")) {
        Err(Error::Authentication(message)) => {
            assert!(message.contains("authentication failed"), "{message}")
        }
        other => panic!("expected Authentication error, got {other:?}"),
    }
    assert!(matches!(
        user_client(&server, ("", "x")),
        Err(Error::InvalidArgument(_))
    ));
    // Without credentials: current releases (3.4.42+, 3.5.28+, 3.6, 3.7) refuse even the
    // connect probe, which says what is missing; older ones answer it and refuse the put.
    match Client::connect(server.endpoints()) {
        Err(Error::Authentication(message)) => {
            assert!(message.contains("requires authentication"), "{message}")
        }
        Err(other) => panic!("expected an Authentication error, got {other:?}"),
        Ok(anonymous) => {
            let r = anonymous.put("app/x", "v");
            assert!(matches!(r, Err(Error::Server { .. })), "{r:?}");
        }
    }
    // The builder's Debug output never shows the password.
    let debug = format!("{:?}", Client::builder().user("u", "hunter2"));
    assert!(!debug.contains("hunter2"), "{debug}");
}

#[test]
fn restricted_user_locks_inside_its_prefix_only() {
    let server = auth_server(&[]);
    let c = user_client(&server, AUTH_USER).unwrap();
    let s = c.session().unwrap();
    let g = s.mutex("app/jobs").unwrap().lock().unwrap();
    g.put("app/data", "ok").unwrap();
    drop(g);
    match s.mutex("other/jobs").unwrap().lock() {
        Err(Error::Server {
            code: Code::PermissionDenied,
            ..
        }) => {}
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    let root = user_client(&server, AUTH_ROOT).unwrap();
    assert!(
        root.get_prefix("other/jobs/").unwrap().is_empty(),
        "a denied lock left a key"
    );
    assert!(root.get_prefix("app/jobs/").unwrap().is_empty());
}

#[test]
fn tokens_expiring_mid_wait_are_renewed() {
    let server = auth_server(&["--auth-token-ttl=2"]);
    let holder = user_client(&server, AUTH_USER).unwrap();
    let hs = holder
        .session_builder()
        .ttl(Duration::from_secs(10))
        .start()
        .unwrap();
    let g = hs.mutex("app/long").unwrap().lock().unwrap();
    let waiter = user_client(&server, AUTH_USER).unwrap();
    let ws = waiter
        .session_builder()
        .ttl(Duration::from_secs(10))
        .start()
        .unwrap();
    let m = ws.mutex("app/long").unwrap();
    let t = std::thread::spawn(move || {
        let start = Instant::now();
        m.lock().map(|g| (start.elapsed(), g.fencing_token()))
    });
    std::thread::sleep(Duration::from_secs(5)); // both tokens expire (2 s without use)
    assert!(hs.is_alive() && ws.is_alive());
    g.put("app/long-data", "still mine")
        .expect("guarded write with a renewed token");
    drop(g);
    let (waited, token) = t
        .join()
        .unwrap()
        .expect("waiter acquires after its token expired");
    assert!(waited >= Duration::from_secs(4));
    assert!(token > 0);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        holder.get("app/long-data").unwrap().unwrap().value,
        b"still mine"
    );
}

/// Every recipe and who-holds-what as the least-privilege user (readwrite on `app/` only):
/// a waiter handed the lock (its watch carries the token), a lock-delay after an ended
/// lease (LeaseTimeToLive of another session's lease), readers and permits, a campaign seen
/// by an observer and by `Client::status`. Current etcd releases require a token on calls
/// older ones answered anonymously (the connect probe among them): this runs on every
/// server of the matrix.
#[test]
fn a_least_privilege_user_uses_every_recipe() {
    let server = auth_server(&[]);
    let c1 = user_client(&server, AUTH_USER).expect("connect as the restricted user");
    let c2 = user_client(&server, AUTH_USER).expect("connect as the restricted user");
    let s1 = c1.session().unwrap();
    let s2 = c2.session().unwrap();

    // A mutex with a waiter behind it, seen by status, then handed over on release.
    let g1 = s1.mutex("app/m").unwrap().lock().unwrap();
    let m2 = s2.mutex("app/m").unwrap();
    let waiter = std::thread::spawn(move || m2.lock_timeout(Duration::from_secs(20)));
    assert!(common::eventually(Duration::from_secs(5), || {
        c1.status("app/m").is_ok_and(|s| s.waiters.len() == 1)
    }));
    let status = c1.status("app/m").unwrap();
    assert_eq!(status.holders.len(), 1);
    assert_eq!(status.holders[0].create_revision, g1.fencing_token());
    let first = g1.fencing_token();
    drop(g1);
    let g2 = waiter.join().unwrap().expect("the waiter takes the lock");
    assert!(g2.is_held() && g2.fencing_token() > first);
    drop(g2);

    // Lock-delay: the holder's lease expires (its keep-alives stop), the waiter looks it
    // up and waits.
    let s3 = c1
        .session_builder()
        .ttl(Duration::from_secs(2))
        .start()
        .unwrap();
    let held = s3.mutex("app/d").unwrap().lock().unwrap();
    let delayed = s2
        .mutex("app/d")
        .unwrap()
        .lock_delay(Duration::from_millis(800))
        .unwrap();
    let waiter = std::thread::spawn(move || {
        let start = Instant::now();
        delayed
            .lock_timeout(Duration::from_secs(20))
            .map(|g| (start, Instant::now(), g.is_held()))
    });
    assert!(common::eventually(Duration::from_secs(5), || {
        c1.status("app/d").is_ok_and(|s| s.waiters.len() == 1)
    }));
    std::mem::forget(held); // its release would be clean: let the lease expire instead
    s3.orphan();
    let orphaned = Instant::now();
    let mut ended = None;
    while ended.is_none() && orphaned.elapsed() < Duration::from_secs(10) {
        if common::keys(&c1, "app/d/").len() < 2 {
            ended = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let ended = ended.expect("the orphaned holder's lease never expired");
    let (_, acquired, is_held) = waiter.join().unwrap().expect("the delayed waiter acquires");
    assert!(is_held);
    assert!(
        acquired.duration_since(ended) >= Duration::from_millis(700),
        "took over {:?} after the lease expired, inside the 800 ms lock-delay",
        acquired.duration_since(ended)
    );

    // Readers share, a writer is refused; permits count.
    let r1 = s1.rwlock("app/rw").unwrap().read().unwrap();
    let r2 = s2.rwlock("app/rw").unwrap().read().unwrap();
    assert!(r1.is_held() && r2.is_held());
    assert!(matches!(
        c1.session().unwrap().rwlock("app/rw").unwrap().try_write(),
        Err(etcd_sync::TryLockError::WouldBlock)
    ));
    let p1 = s1.semaphore("app/sem", 2).unwrap().acquire().unwrap();
    let p2 = s2.semaphore("app/sem", 2).unwrap().acquire().unwrap();
    assert_eq!(c1.status("app/sem").unwrap().holders.len(), 2);
    drop((r1, r2, p1, p2));

    // An election: the leader is seen by an observer, by leader() and by status.
    let observer = c2.observe("app/e").unwrap();
    let leadership = s1.election("app/e").unwrap().campaign("node-a").unwrap();
    let elected = loop {
        match observer.recv_timeout(Duration::from_secs(5)) {
            Ok(etcd_sync::LeaderEvent::Elected(leader)) => break leader,
            Ok(_) => continue,
            other => panic!("expected the election to be observed, got {other:?}"),
        }
    };
    assert_eq!(elected.value, b"node-a");
    assert_eq!(
        c2.leader("app/e").unwrap().map(|l| l.value),
        Some(b"node-a".to_vec())
    );
    assert_eq!(c2.status("app/e").unwrap().holders.len(), 1);
    leadership.proclaim("node-a2").unwrap();
    assert_eq!(
        c2.leader("app/e").unwrap().map(|l| l.value),
        Some(b"node-a2".to_vec())
    );

    // A release request: the restricted user may bind it to the holder's lease (etcd
    // checks that the asker may write every key of that lease), and the holder hears it.
    let asked = leadership.release_requested();
    assert_eq!(c2.request_release("app/e").unwrap().len(), 1);
    let request = asked
        .recv_timeout(Duration::from_secs(5))
        .expect("the leader hears it");
    assert_eq!(request.key, leadership.key());
    drop((asked, leadership));
    assert!(common::eventually(Duration::from_secs(3), || {
        c1.get_prefix("app/e").is_ok_and(|kvs| kvs.is_empty())
    }));

    // Outside its prefix the user is refused, and no key is left behind.
    assert!(matches!(
        s1.election("elsewhere").unwrap().campaign("x"),
        Err(Error::Server {
            code: Code::PermissionDenied,
            ..
        })
    ));
}

/// The same user on a 3-member cluster: connect with the first member down, then lock
/// across a failover away from the member the client uses.
#[test]
fn auth_survives_a_failover() {
    let cluster = etcd_sync::testing::EtcdCluster::start(3).expect("start a 3-member cluster");
    cluster.enable_auth().expect("enable auth with etcdctl");
    let (_c, s) = app_session(cluster.endpoints());
    let g = s.mutex("app/failover").unwrap().lock().unwrap();
    drop(g);
    // Kill a follower the client uses (member 0 unless it leads), so the next call moves.
    let leader = cluster.leader().unwrap();
    let victim = if leader == 0 { 1 } else { 0 };
    let (_late, ls) = app_session(vec![
        cluster.member_endpoint(victim),
        cluster.member_endpoint(3 - leader - victim),
    ]);
    cluster.kill(victim).unwrap();
    let g = ls
        .mutex("app/failover")
        .unwrap()
        .lock_timeout(Duration::from_secs(15))
        .expect("lock after the failover");
    assert!(g.is_held());
    g.put("app/after", "ok")
        .expect("a guarded write on the next member");
    drop(g);
    assert!(
        s.mutex("app/failover")
            .unwrap()
            .lock_timeout(Duration::from_secs(15))
            .is_ok()
    );
    // A client whose first endpoint is down authenticates with the next one.
    let down_first = Client::builder()
        .endpoints([
            cluster.member_endpoint(victim),
            cluster.member_endpoint(leader),
        ])
        .user(AUTH_USER.0, AUTH_USER.1)
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .expect("connect past a dead first member");
    down_first.put("app/x", "1").unwrap();
}

/// TLS and auth together, the way a production cluster runs: connect, lock, elect.
#[cfg(feature = "tls")]
#[test]
fn tls_and_auth_together() {
    let server = EtcdServer::builder()
        .tls()
        .start()
        .expect("start etcd with TLS");
    server.enable_auth().expect("enable auth with etcdctl");
    let certs = server.tls_certs().unwrap();
    let tls = etcd_sync::TlsConfig::from_files(&certs.ca_cert, None)
        .and_then(|t| t.client_identity_files(&certs.client_cert, &certs.client_key))
        .unwrap();
    let c = Client::builder()
        .endpoints(server.endpoints())
        .tls(tls)
        .user(AUTH_USER.0, AUTH_USER.1)
        .connect()
        .expect("connect over TLS as the restricted user");
    let s = c.session().unwrap();
    let g = s.mutex("app/tls").unwrap().lock().unwrap();
    g.put("app/tls-data", "1").unwrap();
    drop(g);
    let l = s.election("app/tls-e").unwrap().campaign("v").unwrap();
    assert_eq!(
        c.leader("app/tls-e").unwrap().map(|l| l.value),
        Some(b"v".to_vec())
    );
    drop(l);
    assert!(matches!(
        c.put("other/x", "1"),
        Err(Error::Server {
            code: Code::PermissionDenied,
            ..
        })
    ));
}

/// `etcdctl <args>` as root against `server`, which must succeed.
fn root_ctl(server: &EtcdServer, args: &[&str]) {
    let root = format!("{}:{}", AUTH_ROOT.0, AUTH_ROOT.1);
    let mut full = vec!["--user", root.as_str()];
    full.extend_from_slice(args);
    let out = common::etcdctl_command(&server.endpoint(), &full)
        .output()
        .expect("run etcdctl");
    assert!(
        out.status.success(),
        "etcdctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A user `name` (password `<name>-secret`) with a role of its own name holding each of
/// `grants` (`[type, key]` or `[type, key, range end]`), connected.
fn user_with_role(server: &EtcdServer, name: &str, grants: &[&[&str]]) -> Client {
    root_ctl(server, &["role", "add", name]);
    for grant in grants {
        let mut args = vec!["role", "grant-permission", name];
        args.extend_from_slice(grant);
        root_ctl(server, &args);
    }
    let password = format!("{name}-secret");
    let user = format!("{name}:{password}");
    root_ctl(server, &["user", "add", &user, "--interactive=false"]);
    root_ctl(server, &["user", "grant-role", name, name]);
    user_client(server, (name, &password)).unwrap_or_else(|e| panic!("connect as {name}: {e}"))
}

/// A role that covers a lock's `<name>/` and nothing beside it: releases and downgrades
/// still work (they fall back to deleting the key alone once etcd refuses the release
/// request's delete), and asking is refused with a clear error, not a hang.
#[test]
fn a_role_on_the_name_alone_still_releases_and_is_refused_asking() {
    let server = auth_server(&[]);
    // Exactly `jobs/nightly/` (range end `jobs/nightly0`).
    let c = user_with_role(
        &server,
        "narrow",
        &[&["readwrite", "jobs/nightly/", "jobs/nightly0"]],
    );
    let mutex = c.session().unwrap().mutex("jobs/nightly").unwrap();
    for round in 0..3 {
        let guard = mutex.lock_timeout(Duration::from_secs(5)).unwrap();
        guard
            .release()
            .unwrap_or_else(|e| panic!("release {round}: {e}"));
        assert!(
            c.get_prefix("jobs/nightly/").unwrap().is_empty(),
            "round {round}: the key went"
        );
    }
    // A downgrade deletes the writer key alone too. (Mutation testing, shard 8/10:
    // `hold/downgrade.rs:125:15`, the fallback never taken, failed the downgrade.)
    let rw = c.session().unwrap().rwlock("jobs/nightly").unwrap();
    let write = rw
        .write_downgradable_timeout(Duration::from_secs(5))
        .unwrap();
    let read = write
        .downgrade()
        .unwrap_or_else(|e| panic!("downgrade: {}", e.error()));
    assert_eq!(
        c.get_prefix("jobs/nightly/").unwrap().len(),
        1,
        "the read key alone"
    );
    read.release().unwrap();
    // The writer's line remembers the refusal: the next downgrade is one Txn, not a
    // refused one and another (mutation testing, shard 7/10: `requests.rs`, `deny` → `()`).
    let write = rw
        .write_downgradable_timeout(Duration::from_secs(5))
        .unwrap();
    let txns = || common::handled(&server.metrics().unwrap(), "Txn");
    let before = txns();
    let read = write
        .downgrade()
        .unwrap_or_else(|e| panic!("second downgrade: {}", e.error()));
    assert_eq!(
        txns() - before,
        1,
        "the second downgrade sent the release request's delete"
    );
    read.release().unwrap();
    let held = mutex.lock().unwrap();
    match c.request_release("jobs/nightly") {
        Err(Error::Server {
            code: Code::PermissionDenied,
            ..
        }) => {}
        other => panic!("asking without permission beside the name: {other:?}"),
    }
    // Listening for requests needs a read beside the name too: refused once, it is not
    // tried again for the hold's life (mutation testing, shard 7/10: `requests.rs`, a
    // refused read retried as an unanswered one). The guard's own read comes first.
    std::thread::sleep(Duration::from_millis(500));
    let ranges = || common::handled(&server.metrics().unwrap(), "Range");
    let before = ranges();
    let _asked = held.release_requested();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        ranges() - before,
        1,
        "reads of a request key we may not read"
    );
    assert!(held.is_held());
    drop(held);
    assert!(c.get_prefix("jobs/nightly/").unwrap().is_empty());
}

/// A stream asks its member's release (Status) as it opens, to start watchers right after
/// what a wait read on releases with etcd #18089's fix: the restricted user may ask it, so
/// a barrier wait that has just begun still hears its release at once (on releases
/// without the fix it may take etcd's 100 ms sync loop: only that it ends is checked).
#[test]
fn a_restricted_users_wait_that_has_just_begun_hears_its_release_at_once() {
    let server = auth_server(&[]);
    let c = user_client(&server, AUTH_USER).unwrap();
    c.barrier("app/warm").unwrap().wait().unwrap();
    let mut wakes = Vec::new();
    for round in 0..9 {
        let name = format!("app/gate-{round}");
        let barrier = c.barrier(&name).unwrap();
        assert!(barrier.hold().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let b = c.barrier(&name).unwrap();
        std::thread::spawn(move || {
            let r = b.wait();
            let _ = tx.send((r, Instant::now()));
        });
        std::thread::sleep(Duration::from_millis(10));
        let released = Instant::now();
        assert!(barrier.release().unwrap());
        let (result, at) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        result.unwrap();
        wakes.push(at.duration_since(released));
    }
    wakes.sort();
    let v = server.version();
    let fixed = match (v.major, v.minor) {
        (3, 4) => v.patch >= 34,
        (3, 5) => v.patch >= 15,
        other => other >= (3, 6),
    };
    if fixed {
        assert!(wakes[4] < Duration::from_millis(25), "{wakes:?}");
    }
}

/// Observing a name outside the user's prefix: etcd refuses the watcher's creation (and
/// the read); the observer reports `PermissionDenied` instead of waiting forever.
#[test]
fn observing_a_name_the_user_may_not_read_is_refused() {
    let server = auth_server(&[]);
    let c = user_client(&server, AUTH_USER).unwrap();
    let observer = c.observe("elsewhere").unwrap();
    match observer.recv_timeout(Duration::from_secs(5)) {
        Err(Error::Server {
            code: Code::PermissionDenied,
            ..
        }) => {}
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
}

/// A hand-over whose last step etcd refuses for want of permission reports etcd's refusal,
/// not the candidate's failure: the leader's role may write its own key and the hand-over
/// requests, but only read the candidate's key, which the adoption deletes. The leader still
/// leads, its request is withdrawn, and the candidate still waits and leads after it.
/// (Mutation testing, shard 5/10: with the adoption's guard on etcd's "lease not found"
/// always true, any refusal of the adoption read as "its session ended".)
#[test]
fn a_hand_over_refused_for_want_of_permission_says_so_and_keeps_the_lead() {
    let server = auth_server(&[]);
    let root_ctl = |args: &[&str]| root_ctl(&server, args);
    let lc = user_with_role(
        &server,
        "leader",
        &[
            &["read", "ho/", "ho0"],
            &["readwrite", "ho.handover/", "ho.handover0"],
        ],
    );
    let ls = lc.session().expect("a session as leader");
    // Its own election key, once its lease is known.
    let own = format!("ho/{:x}", ls.lease_id());
    root_ctl(&["role", "grant-permission", "leader", "readwrite", &own]);
    let election = ls.election("ho").unwrap();
    let mut leading = election.campaign("a").expect("campaign as leader");

    let rc = user_client(&server, AUTH_ROOT).expect("connect as root");
    let rs = rc.session().unwrap();
    let candidate_key = format!("ho/{:x}", rs.lease_id());
    let er = rs.election("ho").unwrap();
    let candidate = std::thread::spawn(move || er.campaign("b"));
    assert!(
        common::eventually(Duration::from_secs(5), || election
            .status()
            .map(|s| s.waiters.len() == 1)
            .unwrap_or(false)),
        "the candidate never waited"
    );

    match leading.hand_over_timeout("b", Duration::from_secs(5)) {
        Err(Error::Server {
            code: Code::PermissionDenied,
            ..
        }) => {}
        other => panic!("a hand-over the leader may not finish: {other:?}"),
    }
    assert!(leading.is_leader(), "the leader still leads");
    assert!(
        common::eventually(Duration::from_secs(2), || rc
            .get_prefix("ho.handover/")
            .map(|kvs| kvs.is_empty())
            .unwrap_or(false)),
        "the hand-over's request was withdrawn"
    );
    let mut keys: Vec<Vec<u8>> = rc
        .get_prefix("ho/")
        .unwrap()
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    let mut expected = vec![own.into_bytes(), candidate_key.into_bytes()];
    keys.sort();
    expected.sort();
    assert_eq!(keys, expected, "both keys stand, each on its own lease");
    assert!(!candidate.is_finished(), "the candidate still waits");
    leading.resign().expect("resign");
    let next = candidate.join().unwrap().expect("the candidate leads next");
    assert!(next.is_leader());
}

/// A proclamation etcd refuses for want of permission reports etcd's refusal at once: the
/// leader's role lost write access to its own key after it campaigned (it may still read
/// it). The leader still leads, with its value unchanged. (Mutation testing, shard 6/10: with
/// every failed put taken as one that may have applied, `proclaim` read its key back, found
/// it still ours with the old value, and put again, forever.)
#[test]
fn a_proclamation_refused_for_want_of_permission_says_so() {
    let server = auth_server(&[]);
    let root_ctl = |args: &[&str]| root_ctl(&server, args);
    let c = user_with_role(&server, "speaker", &[&["read", "pr/", "pr0"]]);
    let s = c.session().expect("a session as speaker");
    let own = format!("pr/{:x}", s.lease_id());
    root_ctl(&["role", "grant-permission", "speaker", "readwrite", &own]);
    let leading = s
        .election("pr")
        .unwrap()
        .campaign("first")
        .expect("campaign");
    leading
        .proclaim("second")
        .expect("proclaim while it may write");
    // Read only from now on: granting the same key anew replaces its permission in one
    // step (a revoke first would leave a moment with no access at all).
    root_ctl(&["role", "grant-permission", "speaker", "read", &own]);

    let (tx, rx) = std::sync::mpsc::channel();
    let proclaiming = std::thread::spawn(move || {
        let _ = tx.send(leading.proclaim("third"));
        leading
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Err(Error::Server {
            code: Code::PermissionDenied,
            ..
        })) => {}
        other => panic!("a proclamation the leader may not write: {other:?}"),
    }
    let leading = proclaiming.join().unwrap();
    assert!(leading.is_leader(), "the leader still leads");
    let root = user_client(&server, AUTH_ROOT).expect("connect as root");
    let kv = root.get(&own).unwrap().expect("the leader's key stands");
    assert_eq!(kv.value, b"second", "the value is the last one written");
}

/// A wait that runs out of time after its user lost write access to the name still ends
/// on time: etcd refuses the removal of its key at once, and the refusal is an answer, not
/// a silence to retry for the rest of a request timeout (3 s here). (Mutation testing,
/// shard 6/10: with every failure of a removal retried, the wait returned 3 s late.)
#[test]
fn a_wait_whose_key_etcd_refuses_to_remove_still_ends_on_time() {
    let server = auth_server(&[]);
    let root_ctl = |args: &[&str]| root_ctl(&server, args);
    let c = user_with_role(&server, "waiting", &[&["readwrite", "rv/", "rv0"]]);
    let root = user_client(&server, AUTH_ROOT).expect("connect as root");
    let held = root.session().unwrap().mutex("rv").unwrap().lock().unwrap();
    let m = c.session().unwrap().mutex("rv").unwrap();
    const LIMIT: Duration = Duration::from_secs(3);
    let waiting = std::thread::spawn(move || {
        let started = Instant::now();
        let result = m.lock_timeout(LIMIT).map(drop);
        (result, started.elapsed())
    });
    assert!(
        common::eventually(Duration::from_secs(5), || root
            .get_prefix("rv/")
            .map(|kvs| kvs.len() == 2)
            .unwrap_or(false)),
        "the wait never joined"
    );
    // Read only from now on, in one step (the same range granted anew replaces its
    // permission; a revoke first left a moment without read access, and a read of the
    // wait's in it ended the wait with `PermissionDenied`, once in a loaded run): the wait
    // goes on, and its key's removal will be refused.
    root_ctl(&["role", "grant-permission", "waiting", "read", "rv/", "rv0"]);
    let (result, took) = waiting.join().unwrap();
    assert!(
        result.as_ref().is_err_and(Error::is_wait_timeout),
        "the wait: {result:?}"
    );
    assert!(
        took < LIMIT + Duration::from_millis(1500),
        "the wait ended {took:?} after it began, with a limit of {LIMIT:?}"
    );
    drop(held);
}

/// A resumed session's campaign with a new value, after its user lost write access to its
/// key, reports etcd's refusal at once and keeps the old value: the refusal is not "no
/// leader" to wait out. (etcd checks a Txn's puts on both branches, so the join's Txn is
/// refused before the re-campaign's own put: this does not reach `join.rs`'s retry of that
/// put, which mutation shard 6/10 left alive.)
#[test]
fn a_recampaign_refused_for_want_of_permission_says_so() {
    let server = auth_server(&[]);
    let root_ctl = |args: &[&str]| root_ctl(&server, args);
    let c = user_with_role(&server, "again", &[&["read", "ra/", "ra0"]]);
    let s = c.session().expect("a session");
    let own = format!("ra/{:x}", s.lease_id());
    root_ctl(&["role", "grant-permission", "again", "readwrite", &own]);
    let first = s
        .election("ra")
        .unwrap()
        .campaign("first")
        .expect("campaign");
    std::mem::forget(first); // a crash: no resign
    s.orphan();
    root_ctl(&["role", "grant-permission", "again", "read", &own]); // replaces readwrite
    let resumed = c.session_builder().resume(s.lease_id()).start().unwrap();
    let started = Instant::now();
    let result = resumed
        .election("ra")
        .unwrap()
        .campaign_timeout("second", Duration::from_secs(5));
    let took = started.elapsed();
    match result {
        Err(Error::Server {
            code: Code::PermissionDenied,
            ..
        }) => {}
        other => panic!("a re-campaign the user may not write: {other:?} after {took:?}"),
    }
    assert!(took < Duration::from_secs(2), "refused after {took:?}");
    let root = user_client(&server, AUTH_ROOT).expect("connect as root");
    let kv = root.get(&own).unwrap().expect("the key stands");
    assert_eq!(kv.value, b"first", "the value is the last one written");
}

/// A release etcd refuses outright (the user's role lost the name while it held) reports
/// the refusal at once: the Txn with the release request's delete, the Txn without it, and
/// no more. (Mutation testing, shard 5/10: `hold/mod.rs`, a refused release handed to the
/// background removal, which was refused once more before the caller heard.)
#[test]
fn a_release_refused_outright_reports_the_refusal_at_once() {
    let server = auth_server(&[]);
    let c = user_with_role(
        &server,
        "leaving",
        &[&["readwrite", "jobs/leaving/", "jobs/leaving0"]],
    );
    let guard = c
        .session()
        .unwrap()
        .mutex("jobs/leaving")
        .unwrap()
        .lock()
        .unwrap();
    root_ctl(
        &server,
        &[
            "role",
            "revoke-permission",
            "leaving",
            "jobs/leaving/",
            "jobs/leaving0",
        ],
    );
    let txns = || common::handled(&server.metrics().unwrap(), "Txn");
    let before = txns();
    match guard.release() {
        Err(Error::Server {
            code: Code::PermissionDenied,
            ..
        }) => {}
        other => panic!("a release the role no longer allows: {other:?}"),
    }
    assert_eq!(txns() - before, 2, "Txns of a release refused outright");
}

/// A downgrade etcd refuses outright (the role lost the name while the write was held),
/// once the line knows its release requests are out of reach, sends its Txn once and ends
/// the write lock. (Mutation testing, shard 8/10: `hold/downgrade.rs`, the fallback without
/// the release request taken when there was none to leave out: the same Txn twice.)
#[test]
fn a_downgrade_refused_outright_is_sent_once() {
    let server = auth_server(&[]);
    let c = user_with_role(
        &server,
        "demoted",
        &[&["readwrite", "jobs/demoted/", "jobs/demoted0"]],
    );
    let rw = c.session().unwrap().rwlock("jobs/demoted").unwrap();
    // The first downgrade learns that the release request may not be deleted.
    let write = rw.write_downgradable().unwrap();
    write
        .downgrade()
        .unwrap_or_else(|e| panic!("downgrade: {}", e.error()))
        .release()
        .unwrap();
    let write = rw.write_downgradable().unwrap();
    root_ctl(
        &server,
        &[
            "role",
            "revoke-permission",
            "demoted",
            "jobs/demoted/",
            "jobs/demoted0",
        ],
    );
    let txns = || common::handled(&server.metrics().unwrap(), "Txn");
    let before = txns();
    let refused = match write.downgrade() {
        Ok(_) => panic!("a downgrade the role no longer allows succeeded"),
        Err(e) => e,
    };
    let sent = txns() - before;
    assert!(
        matches!(
            refused.error(),
            Error::Server {
                code: Code::PermissionDenied,
                ..
            }
        ),
        "{}",
        refused.error()
    );
    // The downgrade's one Txn, then the release of both keys (the write lock is over
    // after a failed downgrade), each refused too.
    assert_eq!(sent, 3, "Txns of a downgrade refused outright");
}

/// A guard's watcher that etcd refuses when it is created again after a break (the role
/// lost the name while the guard followed its key, then the member restarted) is given up
/// at once: the follow is told so, and nothing is created again. etcd counts the watch
/// messages of the stream that finds the client's token stale and of the next one: 2 or 3
/// by release. (Mutation testing, shard 8/10: `hub.rs:364`, a refused re-creation taken for
/// a compacted one: started over from now, refused again, 2 messages more.)
#[test]
fn a_watcher_refused_as_it_is_created_again_is_given_up_at_once() {
    let server = auth_server(&[]);
    let c = user_with_role(
        &server,
        "watcher",
        &[&["readwrite", "jobs/watched/", "jobs/watched0"]],
    );
    let guard = c
        .session()
        .unwrap()
        .mutex("jobs/watched")
        .unwrap()
        .lock()
        .unwrap();
    // The guard follows its key on a watcher from its first 200 ms on.
    std::thread::sleep(Duration::from_millis(600));
    root_ctl(
        &server,
        &[
            "role",
            "revoke-permission",
            "watcher",
            "jobs/watched/",
            "jobs/watched0",
        ],
    );
    server.kill().unwrap();
    server.restart().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    // The member's counters start again with it.
    let messages = common::watch_messages(&server.metrics().unwrap());
    assert!(
        messages <= 3.0,
        "{messages} watch messages after the restart"
    );
    drop(guard);
}
