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
    let anonymous = common::client(&server.endpoints());
    let r = anonymous.put("app/x", "v");
    assert!(matches!(r, Err(Error::Server { .. })), "{r:?}");
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
