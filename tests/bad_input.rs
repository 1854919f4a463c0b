//! Every public entry point driven with bad input returns its documented error within a
//! bounded time, without a panic and without leaving anything in etcd; lock names are
//! property-tested over arbitrary bytes and unicode.

#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, Instant};

use common::{client, etcd, keys, session};
use etcd_sync::testing::EtcdServer;
use etcd_sync::{Client, Error, LossReason, MAX_TTL, TryLockError};
use proptest::prelude::*;

/// Runs `f`, asserting it finishes within `limit` and its result satisfies `expected`.
fn check<T: std::fmt::Debug>(
    case: &str,
    limit: Duration,
    f: impl FnOnce() -> etcd_sync::Result<T>,
    expected: impl FnOnce(&Error) -> bool,
) {
    let start = Instant::now();
    let result = f();
    let took = start.elapsed();
    match &result {
        Err(e) => assert!(expected(e), "{case}: unexpected error {e:?}"),
        Ok(v) => panic!("{case}: expected an error, got Ok({v:?})"),
    }
    assert!(took <= limit, "{case}: took {took:?} (limit {limit:?})");
}

fn invalid(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument(_))
}

#[test]
fn constructors_and_operations_reject_bad_input() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let quick = Duration::from_secs(1);
    let oversized = vec![b'x'; 4097];

    check(
        "no endpoints",
        quick,
        || Client::connect(Vec::<String>::new()),
        invalid,
    );
    check("empty endpoint", quick, || Client::connect([""]), invalid);
    check(
        "endpoint without host",
        quick,
        || Client::connect(["http://"]),
        invalid,
    );
    check(
        "unsupported scheme",
        quick,
        || Client::connect(["ftp://127.0.0.1:2379"]),
        invalid,
    );
    check(
        "port out of range",
        quick,
        || Client::connect(["127.0.0.1:99999"]),
        |e| matches!(e, Error::InvalidArgument(m) if m.contains("invalid port")),
    );
    check(
        "two endpoints in one string",
        quick,
        || Client::connect(["http://127.0.0.1:2379,http://127.0.0.1:22379"]),
        |e| matches!(e, Error::InvalidArgument(m) if m.contains("comma")),
    );
    check(
        "endpoint with a path",
        quick,
        || Client::connect(["http://127.0.0.1:2379/some/path"]),
        |e| matches!(e, Error::InvalidArgument(m) if m.contains("has a path (\"/some/path\")")),
    );
    check(
        "space in host",
        quick,
        || Client::connect(["http://exa mple:2379"]),
        invalid,
    );
    check(
        "zero request timeout",
        quick,
        || {
            Client::builder()
                .endpoints(server.endpoints())
                .request_timeout(Duration::ZERO)
                .connect()
        },
        invalid,
    );
    // Regression (#10, item 7): Duration::MAX reached hyper's timer arithmetic and
    // panicked on the runtime thread. Every Duration knob has an upper bound.
    let builder = || Client::builder().endpoints(server.endpoints());
    check(
        "huge keep-alive interval",
        quick,
        || builder().keep_alive_interval(Duration::MAX).connect(),
        invalid,
    );
    check(
        "keep-alive interval just over the bound",
        quick,
        || {
            builder()
                .keep_alive_interval(etcd_sync::MAX_KEEP_ALIVE_INTERVAL + Duration::from_secs(1))
                .connect()
        },
        invalid,
    );
    check(
        "huge request timeout",
        quick,
        || builder().request_timeout(Duration::MAX).connect(),
        invalid,
    );
    check(
        "huge connect timeout",
        quick,
        || builder().connect_timeout(Duration::MAX).connect(),
        invalid,
    );
    // At the bounds: accepted.
    assert!(
        builder()
            .keep_alive_interval(etcd_sync::MAX_KEEP_ALIVE_INTERVAL)
            .request_timeout(etcd_sync::MAX_TIMEOUT)
            .connect_timeout(etcd_sync::MAX_TIMEOUT)
            .connect()
            .is_ok()
    );
    // Waits with an unbounded timeout simply wait (no overflow, no error).
    let m = s.mutex("bad/max-timeout").unwrap();
    let g = m.lock_timeout(Duration::MAX).unwrap();
    drop(g);
    let l = s
        .election("bad/max-timeout-e")
        .unwrap()
        .campaign_timeout("v", Duration::MAX)
        .unwrap();
    drop(l);
    check(
        "unreachable endpoint",
        Duration::from_secs(2),
        || {
            Client::builder()
                .endpoints(["http://127.0.0.1:1"])
                .connect_timeout(Duration::from_millis(300))
                .connect()
        },
        |e| matches!(e, Error::Connect { endpoints, .. } if endpoints.contains("127.0.0.1:1")),
    );

    check("empty key get", quick, || c.get(""), invalid);
    check("empty key put", quick, || c.put("", "v"), invalid);
    check("empty prefix", quick, || c.get_prefix(""), invalid);
    check("empty mutex name", quick, || s.mutex(""), invalid);
    check("empty election name", quick, || s.election(""), invalid);
    // A trailing '/' would put the name's keys inside the line of the name without it.
    let trailing_slash =
        |e: &Error| matches!(e, Error::InvalidArgument(m) if m.contains("ends with '/'"));
    check("mutex name q/", quick, || s.mutex("q/"), trailing_slash);
    check(
        "election name q/",
        quick,
        || s.election("q/"),
        trailing_slash,
    );
    check("rwlock name q/", quick, || s.rwlock("q/"), trailing_slash);
    check(
        "semaphore name q/",
        quick,
        || s.semaphore("q/", 2),
        trailing_slash,
    );
    check(
        "multi-lock name q/",
        quick,
        || s.multi_lock(["a", "q/"]),
        trailing_slash,
    );
    check(
        "double barrier name q/",
        quick,
        || s.double_barrier("q/", 2),
        trailing_slash,
    );
    check("observe q/", quick, || c.observe("q/"), trailing_slash);
    check("status q/", quick, || c.status("q/"), trailing_slash);
    check(
        "oversized mutex name",
        quick,
        || s.mutex(&oversized),
        invalid,
    );
    check(
        "oversized election name",
        quick,
        || s.election(&oversized),
        invalid,
    );

    for ttl in [
        Duration::ZERO,
        Duration::from_millis(1500),
        MAX_TTL + Duration::from_secs(1),
    ] {
        check(
            &format!("ttl {ttl:?}"),
            quick,
            || c.session_builder().ttl(ttl).start(),
            invalid,
        );
    }
    check(
        "ttl Duration::MAX",
        quick,
        || c.session_builder().ttl(Duration::MAX).start(),
        |e| matches!(e, Error::InvalidArgument(m) if m.contains("is too long")),
    );
    check(
        "resume negative lease",
        quick,
        || c.session_builder().resume(-1).start(),
        invalid,
    );
    check(
        "resume unknown lease",
        quick,
        || c.session_builder().resume(0x7777).start(),
        |e| matches!(e, Error::SessionLost(LossReason::Revoked)),
    );

    // A closed session: everything built on it refuses, quickly, and leaves nothing.
    let closed = session(&c, 10);
    let m = closed.mutex("bad/closed").unwrap();
    let e = closed.election("bad/closed-e").unwrap();
    closed.close().unwrap();
    let lost = |e: &Error| matches!(e, Error::SessionLost(LossReason::Closed));
    check("lock on closed session", quick, || m.lock(), lost);
    check(
        "lock_timeout on closed session",
        quick,
        || m.lock_timeout(Duration::from_secs(5)),
        lost,
    );
    check(
        "try_lock on closed session",
        quick,
        || {
            m.try_lock().map_err(|e| match e {
                TryLockError::Error(e) => e,
                TryLockError::WouldBlock => Error::LockLost,
            })
        },
        lost,
    );
    check(
        "campaign on closed session",
        quick,
        || e.campaign("v"),
        lost,
    );
    assert!(keys(&c, "bad/").is_empty());

    // The client handle being dropped does not strand sessions: they keep it alive.
    let c2 = client(&server.endpoints());
    let s2 = session(&c2, 10);
    drop(c2);
    let g = s2.mutex("bad/dropped-client").unwrap().lock().unwrap();
    g.release().unwrap();
}

#[test]
fn blocking_calls_inside_a_tokio_runtime_are_refused() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let m = s.mutex("bad/async").unwrap();
    let e = s.election("bad/async-e").unwrap();
    let mut leadership = e.campaign("v").unwrap();
    let observer = e.observe().unwrap();
    let endpoints = server.endpoints();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let inside = |e: &Error| matches!(e, Error::InsideAsyncRuntime);
        let quick = Duration::from_millis(100);
        check("connect", quick, || Client::connect(&endpoints), inside);
        check("get", quick, || c.get("k"), inside);
        check("put", quick, || c.put("k", "v"), inside);
        check("session", quick, || c.session(), inside);
        check("lock", quick, || m.lock(), inside);
        check(
            "lock_timeout",
            quick,
            || m.lock_timeout(Duration::from_secs(1)),
            inside,
        );
        assert!(matches!(
            m.try_lock(),
            Err(TryLockError::Error(Error::InsideAsyncRuntime))
        ));
        check("campaign", quick, || e.campaign("w"), inside);
        check("leader", quick, || e.leader(), inside);
        check("observe", quick, || e.observe(), inside);
        check("recv", quick, || observer.recv(), inside);
        check("proclaim", quick, || leadership.proclaim("x"), inside);
        check("resign", quick, || leadership.resign(), inside);
        check("close", quick, || s.close(), inside);
    });
    drop(rt);
    assert!(s.is_alive());
    leadership.resign().unwrap();
}

#[test]
fn frozen_etcd_gives_timeouts_and_leaves_nothing_behind() {
    let server = etcd();
    let c = common::client_with_timeout(&server.endpoints(), Duration::from_millis(500));
    let s = session(&c, 30);
    let m = s.mutex("bad/frozen").unwrap();
    server.pause().unwrap();
    let timeout = |e: &Error| matches!(e, Error::Timeout { .. } | Error::Unavailable { .. });
    check(
        "lock on frozen etcd",
        Duration::from_secs(4),
        || m.lock_timeout(Duration::from_secs(1)),
        |e| timeout(e),
    );
    check(
        "put on frozen etcd",
        Duration::from_secs(2),
        || c.put("k", "v"),
        timeout,
    );
    server.resume().unwrap();
    assert!(
        common::eventually(Duration::from_secs(8), || keys(&c, "bad/frozen/")
            .is_empty()),
        "left behind: {:?}",
        keys(&c, "bad/frozen/")
    );
}

#[test]
fn etcd_refusing_large_requests_is_a_clear_error() {
    let server = EtcdServer::builder()
        .arg("--max-request-bytes=2048")
        .start()
        .unwrap();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let name = "n".repeat(3000); // valid for us, too large for this etcd
    let m = s.mutex(&name).unwrap();
    check(
        "lock over max-request-bytes",
        Duration::from_secs(3),
        || m.lock(),
        |e| matches!(e, Error::Server { message, .. } if message.contains("too large")),
    );
    assert!(c.get_prefix(format!("{name}/")).unwrap().is_empty());
    check(
        "put over max-request-bytes",
        Duration::from_secs(3),
        || c.put("k", vec![0u8; 4096]),
        |e| matches!(e, Error::Server { .. }),
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn any_non_empty_name_locks_with_go_layout_and_cleans_up(
        bytes in proptest::collection::vec(any::<u8>(), 1..64),
        text in "\\PC{1,24}",
    ) {
        let server = SERVER.with(|s| s.endpoints());
        let c = client(&server);
        let s = session(&c, 10);
        for name in [bytes.clone(), text.clone().into_bytes()] {
            if name.ends_with(b"/") {
                // Refused: its keys would lie inside the line of the name without it.
                prop_assert!(s.mutex(&name).unwrap_err().is_invalid_argument());
                continue;
            }
            let g = s.mutex(&name).unwrap().lock_timeout(Duration::from_secs(5)).unwrap();
            let mut expected = name.clone();
            expected.extend_from_slice(format!("/{:x}", s.lease_id()).as_bytes());
            prop_assert_eq!(g.key(), &expected[..]);
            let mut prefix = name.clone();
            prefix.push(b'/');
            prop_assert_eq!(c.get_prefix(&prefix).unwrap().len(), 1);
            g.release().unwrap();
            prop_assert!(c.get_prefix(&prefix).unwrap().is_empty());
        }
    }
}

thread_local! {
    // One etcd for all cases of the property test (on that test's thread).
    static SERVER: EtcdServer = etcd();
}
