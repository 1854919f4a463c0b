//! Client basics against a real etcd: KV round trips, compare-and-swap, bad input,
//! unreachable endpoints and blocking calls from inside an async runtime.

#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, Instant};

use common::{client, etcd, session};
use etcd_sync::{Client, Compare, CompareOp, Error, Txn, TxnOp, TxnOpResponse};

#[test]
fn kv_round_trip() {
    let server = etcd();
    let c = client(&server.endpoints());
    let rev = c.put("app/a", "1").unwrap();
    c.put("app/b", "2").unwrap();
    c.put("other", "x").unwrap();
    let a = c.get("app/a").unwrap().expect("app/a exists");
    assert_eq!(a.value, b"1");
    assert_eq!(a.create_revision, rev);
    assert_eq!(a.version, 1);
    let listed: Vec<_> = c
        .get_prefix("app/")
        .unwrap()
        .into_iter()
        .map(|kv| kv.value)
        .collect();
    assert_eq!(listed, vec![b"1".to_vec(), b"2".to_vec()]);
    assert_eq!(c.delete("app/a").unwrap(), 1);
    assert_eq!(c.delete("app/a").unwrap(), 0);
    assert!(c.get("app/a").unwrap().is_none());
    assert_eq!(c.delete_prefix("app/").unwrap(), 1);
    assert_eq!(
        c.get("other").unwrap().map(|kv| kv.value),
        Some(b"x".to_vec())
    );
}

/// A read of the past sees the keys as they were at its revision, and says clearly when
/// that history is gone or the revision is not a revision.
#[test]
fn a_prefix_read_at_a_revision_sees_the_store_as_it_was() {
    let server = etcd();
    let c = client(&server.endpoints());
    let first = c.put("past/a", "1").unwrap();
    let both = c.put("past/b", "2").unwrap();
    c.put("past/a", "3").unwrap();
    c.delete("past/b").unwrap();
    let values = |kvs: Vec<etcd_sync::KeyValue>| -> Vec<(String, String)> {
        kvs.iter()
            .map(|kv| (kv.key_str().into_owned(), kv.value_str().into_owned()))
            .collect()
    };
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert_eq!(
        values(c.get_prefix_at("past/", first).unwrap()),
        vec![pair("past/a", "1")]
    );
    assert_eq!(
        values(c.get_prefix_at("past/", both).unwrap()),
        vec![pair("past/a", "1"), pair("past/b", "2")]
    );
    assert_eq!(
        values(c.get_prefix("past/").unwrap()),
        vec![pair("past/a", "3")]
    );
    for bad in [0, -1] {
        let e = c.get_prefix_at("past/", bad).unwrap_err();
        assert!(e.is_invalid_argument(), "{e}");
    }
    assert!(c.get_prefix_at("", both).unwrap_err().is_invalid_argument());
    let newest = c.put("past/c", "4").unwrap();
    c.compact(newest).unwrap();
    let compacted = c.get_prefix_at("past/", both).unwrap_err();
    assert!(
        matches!(
            compacted,
            Error::Server {
                code: etcd_sync::Code::OutOfRange,
                ..
            }
        ),
        "{compacted:?}"
    );
    let future = c.get_prefix_at("past/", newest + 100).unwrap_err();
    assert!(
        matches!(
            future,
            Error::Server {
                code: etcd_sync::Code::OutOfRange,
                ..
            }
        ),
        "{future:?}"
    );
}

#[test]
fn compare_and_swap() {
    let server = etcd();
    let c = client(&server.endpoints());
    c.put("counter", "0").unwrap();
    let seen = c.get("counter").unwrap().unwrap();
    // Someone else writes in between: our swap on the old mod revision must fail.
    c.put("counter", "5").unwrap();
    let stale = c
        .txn(
            Txn::new()
                .when([Compare::mod_revision(
                    "counter",
                    CompareOp::Equal,
                    seen.mod_revision,
                )])
                .and_then([TxnOp::put("counter", "1")])
                .or_else([TxnOp::get("counter")]),
        )
        .unwrap();
    assert!(!stale.succeeded);
    match &stale.responses[..] {
        [TxnOpResponse::Get(kvs)] => assert_eq!(kvs[0].value, b"5"),
        other => panic!("unexpected responses {other:?}"),
    }
    let fresh = c.get("counter").unwrap().unwrap();
    let ok = c
        .txn(
            Txn::new()
                .when([
                    Compare::mod_revision("counter", CompareOp::Equal, fresh.mod_revision),
                    Compare::value("counter", CompareOp::Equal, "5"),
                    Compare::version("counter", CompareOp::Equal, 2),
                    Compare::create_revision("counter", CompareOp::Equal, seen.create_revision),
                    Compare::lease("counter", CompareOp::Equal, 0),
                ])
                .and_then([TxnOp::put("counter", "6")]),
        )
        .unwrap();
    assert!(ok.succeeded);
    assert_eq!(c.get("counter").unwrap().unwrap().value, b"6");
}

#[test]
fn bad_input_is_an_error() {
    let server = etcd();
    let c = client(&server.endpoints());
    assert!(matches!(c.get(""), Err(Error::InvalidArgument(_))));
    assert!(matches!(c.put("", "v"), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        Client::connect(Vec::<String>::new()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        Client::connect(["ftp://127.0.0.1:1"]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        Client::builder()
            .endpoints(server.endpoints())
            .keep_alive_interval(Duration::from_secs(1))
            .connect(),
        Err(Error::InvalidArgument(_))
    ));
    let session = c.session().unwrap();
    assert!(matches!(session.mutex(""), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        session.election(""),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn unreachable_endpoint_fails_within_connect_timeout() {
    // A port nobody listens on (bound and released), and a blackholed-but-local address.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    let result = Client::builder()
        .endpoints([&endpoint])
        .connect_timeout(Duration::from_millis(500))
        .connect();
    let took = start.elapsed();
    match result {
        Err(Error::Connect { endpoints, .. }) => assert!(endpoints.contains(&endpoint)),
        other => panic!("expected Connect error, got {other:?}"),
    }
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

/// Like grpc-go's blocking dial (etcdctl's `--dial-timeout`): connecting keeps trying
/// until the connect timeout, so a client started beside its etcd waits for it.
#[test]
fn connect_waits_for_an_etcd_that_starts_within_the_connect_timeout() {
    let server = etcd();
    server.kill().unwrap();
    let endpoints = server.endpoints();
    let start = Instant::now();
    let connecting = std::thread::spawn(move || {
        Client::builder()
            .endpoints(&endpoints)
            .connect_timeout(Duration::from_secs(30))
            .connect()
    });
    std::thread::sleep(Duration::from_millis(1500));
    server.restart().unwrap();
    let client = connecting
        .join()
        .unwrap()
        .expect("connected once etcd was up");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(1500), "took {took:?}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    client.put("k", "v").unwrap();
}

#[test]
fn paused_server_times_out_instead_of_hanging() {
    let server = etcd();
    let c = common::client_with_timeout(&server.endpoints(), Duration::from_millis(500));
    c.put("k", "v").unwrap();
    server.pause().unwrap();
    let start = Instant::now();
    let result = c.get("k");
    server.resume().unwrap();
    assert!(
        matches!(
            result,
            Err(Error::Timeout { .. } | Error::Unavailable { .. })
        ),
        "{result:?}"
    );
    let error = result.unwrap_err();
    assert_eq!(
        error.endpoint(),
        Some(server.endpoints()[0].as_str()),
        "{error}"
    );
    assert!(error.is_retryable(), "{error:?}");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(c.get("k").unwrap().unwrap().value, b"v");
}

#[test]
fn a_dead_member_is_named_with_the_os_error_under_it() {
    let server = etcd();
    let c = common::client_with_timeout(&server.endpoints(), Duration::from_millis(500));
    c.put("k", "v").unwrap();
    server.kill().unwrap();
    let error = c.get("k").unwrap_err();
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(error.is_retryable() && !error.is_lost(), "{error:?}");
    let endpoint = server.endpoints()[0].clone();
    assert_eq!(error.endpoint(), Some(endpoint.as_str()));
    let text = error.to_string();
    assert!(text.contains(&format!("at {endpoint}")), "{text}");
    // The chain under it ends at the socket's io::Error, which has the OS error's words.
    let mut innermost = None;
    let mut next = std::error::Error::source(&error);
    while let Some(layer) = next {
        innermost = Some(layer);
        next = layer.source();
    }
    let innermost = innermost.expect("a source chain under a transport error");
    assert!(
        innermost.downcast_ref::<std::io::Error>().is_some(),
        "innermost cause {innermost:?} in {error:?}"
    );
    assert!(
        text.contains(&innermost.to_string()),
        "{text} lacks {innermost}"
    );
}

#[test]
fn blocking_inside_async_runtime_is_an_error() {
    let server = etcd();
    let c = client(&server.endpoints());
    let session = c.session().unwrap();
    let mutex = session.mutex("async-lock").unwrap();
    let guard = mutex.lock().unwrap();
    let rt = tokio_rt();
    let endpoints = server.endpoints();
    rt.block_on(async {
        assert!(matches!(c.get("k"), Err(Error::InsideAsyncRuntime)));
        assert!(matches!(c.session(), Err(Error::InsideAsyncRuntime)));
        assert!(matches!(mutex.lock(), Err(Error::InsideAsyncRuntime)));
        assert!(matches!(
            Client::connect(&endpoints),
            Err(Error::InsideAsyncRuntime)
        ));
        // Dropping a guard inside a runtime must not panic; the release happens anyway.
        drop(guard);
    });
    drop(rt);
    assert!(common::eventually(Duration::from_secs(3), || common::keys(
        &c,
        "async-lock/"
    )
    .is_empty()));
}

/// Regression (#10, item 8): `spawn_blocking` and `block_in_place` threads may block, so
/// the crate must work there, while async worker threads are still refused.
#[test]
fn blocking_calls_work_on_spawn_blocking_and_block_in_place_threads() {
    let server = etcd();
    let c = client(&server.endpoints());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let on_pool = c.clone();
    let token = rt
        .block_on(rt.spawn_blocking(move || {
            let session = on_pool.session()?;
            let guard = session.mutex("pool-lock")?.lock()?;
            let token = guard.fencing_token();
            guard.release()?;
            let leadership = session.election("pool-election")?.campaign("v")?;
            assert!(leadership.is_leader());
            drop(leadership);
            session.close()?;
            Ok::<_, Error>(token)
        }))
        .unwrap()
        .expect("blocking calls on a spawn_blocking thread");
    assert!(token > 0);
    let in_place = c.clone();
    let got = rt.block_on(async move {
        tokio::spawn(async move {
            // On the worker itself: refused. Inside block_in_place: allowed.
            let refused = matches!(in_place.get("k"), Err(Error::InsideAsyncRuntime));
            let allowed = tokio::task::block_in_place(|| in_place.put("k", "in place"));
            (refused, allowed.is_ok())
        })
        .await
        .unwrap()
    });
    assert_eq!(got, (true, true));
    assert_eq!(c.get("k").unwrap().unwrap().value, b"in place");
}

#[test]
fn dropping_the_last_client_handle_inside_a_runtime_does_not_panic() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = c.session().unwrap();
    let rt = tokio_rt();
    rt.block_on(async move {
        drop(s);
        drop(c);
    });
}

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The read system calls etcd (process `pid`) has made so far.
fn reads_of(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/io: {e}"));
    io.lines()
        .find_map(|l| l.strip_prefix("syscr:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no syscr in /proc/{pid}/io"))
}

/// etcd's (process `pid`) read calls per run of `op`, over `count` runs: the fewest of
/// three rounds, since a loaded machine can only add reads (a PING acknowledgement that
/// waited 5 ms in vain goes alone).
fn fewest_reads_per_op(pid: u32, count: u32, op: &dyn Fn()) -> f64 {
    (0..3)
        .map(|_| {
            let before = reads_of(pid);
            for _ in 0..count {
                op();
            }
            (reads_of(pid) - before) as f64 / f64::from(count)
        })
        .fold(f64::INFINITY, f64::min)
}

/// A request reaches etcd in one write: hyper sends a call's HEADERS and its DATA in two
/// flushes and acknowledges etcd's PING (one rides on about every answer) in a third, so
/// etcd read each request in three pieces; `transport/coalesce.rs` gathers them. Counted
/// as etcd's own read calls (Go reads a socket once per arrival, and once more to find it
/// empty).
#[test]
fn a_request_reaches_etcd_in_one_write() {
    let server = etcd();
    let Some(pid) = server.pid() else {
        panic!("etcd is not running")
    };
    let c = client(&server.endpoints());
    c.put("one-write", "x").unwrap();
    for _ in 0..50 {
        c.get("one-write").unwrap();
    }
    let per_request = fewest_reads_per_op(pid, 300, &|| {
        assert!(c.get("one-write").unwrap().is_some());
    });
    eprintln!("etcd read calls per sequential get: {per_request:.2}");
    assert!(
        per_request < 3.0,
        "etcd read each request in {per_request:.2} calls (about 2 for one write, 6 for three)"
    );
}

/// A larger request reaches etcd in one write too, and so does an uncontended lock +
/// release. tonic's request body learns it has ended only when polled after its message,
/// so hyper sent the end of the stream as an empty DATA frame of its own, and past about
/// 250 bytes (an acquire's Txn is about 370) that frame missed the first write and went
/// in a second: etcd read such a request in about 4 calls, a lock + release in 6
/// (`transport/whole.rs` hands the body over whole).
#[test]
fn a_large_request_and_a_lock_reach_etcd_in_one_write_each() {
    let server = etcd();
    let Some(pid) = server.pid() else {
        panic!("etcd is not running")
    };
    let c = client(&server.endpoints());
    let session = c.session().unwrap();
    let mutex = session.mutex("one-write-lock").unwrap();
    let value = "v".repeat(1_000);
    for _ in 0..50 {
        c.put("one-write-large", &value).unwrap();
        mutex.lock().unwrap().release().unwrap();
    }
    let per_put = fewest_reads_per_op(pid, 200, &|| {
        c.put("one-write-large", &value).unwrap();
    });
    let per_lock = fewest_reads_per_op(pid, 200, &|| mutex.lock().unwrap().release().unwrap());
    eprintln!("etcd read calls per 1 KB put: {per_put:.2}, per lock + release: {per_lock:.2}");
    assert!(
        per_put < 3.0,
        "etcd read each 1 KB put in {per_put:.2} calls (about 2 for one write, 4 for two)"
    );
    assert!(
        per_lock < 4.6,
        "etcd read each lock + release in {per_lock:.2} calls (about 4 for one write per \
         request, 6 when the acquire took two)"
    );
}

/// An endpoint given as a host name that resolves to several addresses (`localhost`: `::1`,
/// where nothing listens, and `127.0.0.1`) connects, and a lock taken through it hands over.
#[test]
fn a_host_name_endpoint_with_several_addresses_works() {
    let server = etcd();
    let port = server.endpoint().rsplit(':').next().unwrap().to_string();
    let by_name = format!("http://localhost:{port}");
    let c = client(std::slice::from_ref(&by_name));
    c.put("named", "yes").unwrap();
    assert_eq!(c.get("named").unwrap().unwrap().value_str(), "yes");
    let s = session(&c, 10);
    let guard = s.mutex("named-lock").unwrap().lock().unwrap();
    let c2 = client(&[by_name]);
    let waiter = std::thread::spawn(move || {
        let s2 = session(&c2, 10);
        s2.mutex("named-lock")
            .unwrap()
            .lock_timeout(Duration::from_secs(10))
            .map(|g| g.is_held())
    });
    std::thread::sleep(Duration::from_millis(200));
    drop(guard);
    assert!(waiter.join().unwrap().unwrap());
}
