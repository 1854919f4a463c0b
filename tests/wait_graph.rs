//! Who waits for whom across sessions, against real etcd: `Client::wait_graph` on locks,
//! read-write locks and semaphores held and waited for by several sessions (the edges and
//! identities), a real deadlock between two sessions (each holds one mutex and waits, on a
//! thread, for the other's) reported as a cycle naming both, and none where there is none.

#![cfg(feature = "testing")]

mod common;

use std::thread::JoinHandle;
use std::time::Duration;

use common::{client, etcd, eventually, keys};
use etcd_sync::{Client, Error, KeyMode, Participant, Session, WaitGraph};

const TTL: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(15);
/// How long the waits on threads wait at most: long enough to be read, short enough that
/// a failed test does not hang.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

fn named(c: &Client, identity: &str) -> Session {
    c.session_builder()
        .ttl(TTL)
        .identity(identity)
        .start()
        .expect("start a session")
}

fn of<'g>(graph: &'g WaitGraph, session: &Session) -> &'g Participant {
    graph
        .participant(session.lease_id())
        .unwrap_or_else(|| panic!("{:x} not in {graph:#?}", session.lease_id()))
}

fn names(places: &[etcd_sync::Place]) -> Vec<String> {
    places.iter().map(|p| p.name_str().into_owned()).collect()
}

/// `session` waits for the mutex `name` on a thread, for at most [`WAIT_LIMIT`].
fn wait_for_mutex(session: &Session, name: &'static str) -> JoinHandle<etcd_sync::Result<()>> {
    let m = session.mutex(name).unwrap();
    std::thread::spawn(move || m.lock_timeout(WAIT_LIMIT).map(drop))
}

#[test]
fn holders_and_waiters_of_every_kind_are_edges_with_identities() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (a, b, w1, w2) = (
        named(&c, "a"),
        named(&c, "b"),
        named(&c, "w1"),
        named(&c, "w2"),
    );
    // g/x: a holds, w1 waits. g/r: a and b read, w2 waits to write.
    // g/s (2 permits): a and b hold, w1 waits too (its second wait).
    let x = a.mutex("g/x").unwrap().lock().unwrap();
    let ra = a.rwlock("g/r").unwrap().read().unwrap();
    let rb = b.rwlock("g/r").unwrap().read().unwrap();
    let sa = a.semaphore("g/s", 2).unwrap().acquire().unwrap();
    let sb = b.semaphore("g/s", 2).unwrap().acquire().unwrap();
    let outside = b.mutex("other/x").unwrap().lock().unwrap();
    let w1x = wait_for_mutex(&w1, "g/x");
    let w2r = {
        let lock = w2.rwlock("g/r").unwrap();
        std::thread::spawn(move || lock.write_timeout(WAIT_LIMIT).map(drop))
    };
    let w1s = {
        let sem = w1.semaphore("g/s", 2).unwrap();
        std::thread::spawn(move || sem.acquire_timeout(WAIT_LIMIT).map(drop))
    };
    assert!(eventually(WAIT, || keys(&c, "g/").len() == 8));
    // A release request (`g/x.revoke/<a's key>`, under g/ too, with a's lease) is no name.
    assert_eq!(c.request_release("g/x").unwrap().len(), 1);
    assert_eq!(keys(&c, "g/").len(), 9);

    let graph = c.wait_graph("g/").unwrap();
    assert_eq!(graph.prefix, b"g/");
    let listed: Vec<String> = graph
        .names
        .iter()
        .map(|s| s.name_str().into_owned())
        .collect();
    assert_eq!(
        listed,
        ["g/r", "g/s", "g/x"],
        "other/x is outside the prefix"
    );
    assert!(graph.cycles.is_empty(), "{:?}", graph.cycles);
    assert_eq!(graph.participants.len(), 4, "{graph:#?}");
    for (session, identity) in [(&a, "a"), (&b, "b"), (&w1, "w1"), (&w2, "w2")] {
        let p = of(&graph, session);
        assert_eq!(p.identity.as_deref(), Some(identity));
        assert!(!p.stuck, "{p:#?}");
        let ttl = p.ttl.expect("a live lease");
        assert!(ttl > Duration::ZERO && ttl <= TTL, "{ttl:?}");
        assert_eq!(p.granted_ttl, Some(TTL));
    }
    let pa = of(&graph, &a);
    assert_eq!(names(&pa.holds), ["g/r", "g/s", "g/x"]);
    assert!(pa.waits.is_empty());
    assert_eq!(pa.holds[2].key.key, x.key());
    assert_eq!(names(&of(&graph, &b).holds), ["g/r", "g/s"]);

    let pw1 = of(&graph, &w1);
    assert!(pw1.holds.is_empty());
    assert_eq!(names(&pw1.waits), ["g/s", "g/x"]);
    assert_eq!(pw1.waits[0].position, 2);
    assert_eq!(pw1.waits[0].key.mode, KeyMode::Permits(2));
    assert_eq!(pw1.waits[0].blocked_by, [a.lease_id(), b.lease_id()]);
    assert_eq!(pw1.waits[1].position, 1);
    assert_eq!(pw1.waits[1].blocked_by, [a.lease_id()]);
    let pw2 = of(&graph, &w2);
    assert_eq!(names(&pw2.waits), ["g/r"]);
    assert_eq!(pw2.waits[0].key.mode, KeyMode::Exclusive);
    assert_eq!(pw2.waits[0].blocked_by, [a.lease_id(), b.lease_id()]);

    let mut edges: Vec<(i64, String, i64)> = graph
        .edges()
        .map(|(w, name, h)| (w, String::from_utf8_lossy(name).into_owned(), h))
        .collect();
    edges.sort();
    let mut expected = vec![
        (w1.lease_id(), "g/x".to_string(), a.lease_id()),
        (w1.lease_id(), "g/s".to_string(), a.lease_id()),
        (w1.lease_id(), "g/s".to_string(), b.lease_id()),
        (w2.lease_id(), "g/r".to_string(), a.lease_id()),
        (w2.lease_id(), "g/r".to_string(), b.lease_id()),
    ];
    expected.sort();
    assert_eq!(edges, expected);
    // Each name's line is what `status` says.
    let line = |keys: &[etcd_sync::Holder]| -> Vec<Vec<u8>> {
        keys.iter().map(|k| k.key.clone()).collect()
    };
    for status in &graph.names {
        let alone = c.status(&status.name).unwrap();
        assert_eq!(line(&alone.holders), line(&status.holders));
        assert_eq!(line(&alone.waiters), line(&status.waiters));
    }

    // The whole keyspace has other/x too; a narrower prefix only g/x.
    let all = c.wait_graph("").unwrap();
    assert!(all.names.iter().any(|s| s.name == b"other/x"));
    let narrow = c.wait_graph("g/x").unwrap();
    assert_eq!(narrow.names.len(), 1);
    assert_eq!(narrow.participants.len(), 2);

    drop((x, ra, rb, sa, sb, outside));
    for wait in [w1x, w2r, w1s] {
        wait.join().unwrap().unwrap();
    }
    assert!(eventually(WAIT, || c
        .wait_graph("g/")
        .unwrap()
        .names
        .is_empty()));
}

#[test]
fn two_sessions_waiting_for_each_other_are_a_cycle_naming_both() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (a, b) = (named(&c, "proc-a"), named(&c, "proc-b"));
    let x = a.mutex("d/x").unwrap().lock().unwrap();
    let y = b.mutex("d/y").unwrap().lock().unwrap();
    let a_waits = wait_for_mutex(&a, "d/y");
    let b_waits = wait_for_mutex(&b, "d/x");
    assert!(eventually(WAIT, || keys(&c, "d/").len() == 4));

    let graph = c.wait_graph("d/").unwrap();
    assert_eq!(graph.cycles.len(), 1, "{graph:#?}");
    let cycle = &graph.cycles[0];
    let (low, high) = if a.lease_id() < b.lease_id() {
        ((&a, "d/y"), (&b, "d/x"))
    } else {
        ((&b, "d/x"), (&a, "d/y"))
    };
    assert_eq!(cycle.steps.len(), 2);
    assert_eq!(cycle.steps[0].lease, low.0.lease_id());
    assert_eq!(cycle.steps[0].name_str(), low.1);
    assert_eq!(cycle.steps[0].holder, high.0.lease_id());
    assert_eq!(cycle.steps[1].lease, high.0.lease_id());
    assert_eq!(cycle.steps[1].name_str(), high.1);
    assert_eq!(cycle.steps[1].holder, low.0.lease_id());
    let identity = |s: &Session| {
        if s.lease_id() == a.lease_id() {
            "proc-a"
        } else {
            "proc-b"
        }
    };
    assert_eq!(cycle.steps[0].identity.as_deref(), Some(identity(low.0)));
    assert_eq!(cycle.steps[1].identity.as_deref(), Some(identity(high.0)));
    let text = cycle.to_string();
    assert!(
        text.contains(&format!(
            "{:x} (proc-a) waits for d/y held by {:x}",
            a.lease_id(),
            b.lease_id()
        )) && text.contains(&format!(
            "{:x} (proc-b) waits for d/x held by {:x}",
            b.lease_id(),
            a.lease_id()
        )),
        "{text}"
    );
    for (session, identity) in [(&a, "proc-a"), (&b, "proc-b")] {
        let p = of(&graph, session);
        assert!(p.stuck);
        assert_eq!(p.identity.as_deref(), Some(identity));
        assert_eq!(p.holds.len(), 1);
        assert_eq!(p.waits.len(), 1);
    }

    // A third session behind the deadlock is stuck, and on no cycle.
    let c3 = named(&c, "proc-c");
    let c3_waits = wait_for_mutex(&c3, "d/x");
    assert!(eventually(WAIT, || keys(&c, "d/").len() == 5));
    let graph = c.wait_graph("d/").unwrap();
    assert_eq!(graph.cycles.len(), 1, "{:?}", graph.cycles);
    assert!(of(&graph, &c3).stuck);
    assert!(!graph.cycles[0].leases().any(|l| l == c3.lease_id()));

    // Break it: a lets go of x; b gets x, then lets go of both; a gets y, c gets x.
    drop(x);
    b_waits.join().unwrap().unwrap();
    drop(y);
    a_waits.join().unwrap().unwrap();
    c3_waits.join().unwrap().unwrap();
    let graph = c.wait_graph("d/").unwrap();
    assert!(graph.cycles.is_empty(), "{:?}", graph.cycles);
}

#[test]
fn a_chain_of_waits_is_no_cycle() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (a, b, d) = (named(&c, "a"), named(&c, "b"), named(&c, "d"));
    // a holds x; b holds y and waits for x; d waits for y. And a deadlock elsewhere is not
    // in this prefix's graph.
    let _x = a.mutex("n/x").unwrap().lock().unwrap();
    let _y = b.mutex("n/y").unwrap().lock().unwrap();
    let b_waits = wait_for_mutex(&b, "n/x");
    let d_waits = wait_for_mutex(&d, "n/y");
    let _q = a.mutex("m/q").unwrap().lock().unwrap();
    let _p = b.mutex("m/p").unwrap().lock().unwrap();
    let a_m = wait_for_mutex(&a, "m/p");
    let b_m = wait_for_mutex(&b, "m/q");
    assert!(eventually(WAIT, || keys(&c, "n/").len() == 4
        && keys(&c, "m/").len() == 4));

    let graph = c.wait_graph("n/").unwrap();
    assert!(graph.cycles.is_empty(), "{:?}", graph.cycles);
    assert!(graph.participants.iter().all(|p| !p.stuck), "{graph:#?}");
    assert_eq!(of(&graph, &b).waits[0].blocked_by, [a.lease_id()]);
    assert_eq!(of(&graph, &d).waits[0].blocked_by, [b.lease_id()]);
    // The whole keyspace sees the other deadlock.
    assert_eq!(c.wait_graph("").unwrap().cycles.len(), 1);

    a.close().unwrap();
    b.close().unwrap();
    d.close().unwrap();
    for wait in [b_waits, d_waits, a_m, b_m] {
        let _ = wait.join().unwrap();
    }
    assert!(matches!(
        c.wait_graph("x".repeat(5000)),
        Err(Error::InvalidArgument(_))
    ));
}

/// What one graph costs: 1,000 sessions on one client, 100 names, each held by one session
/// and waited for by nine (900 waits on threads). Prints the time of each read. Not run by
/// default (it starts 1,000 threads): `cargo test --all-features --test wait_graph -- --ignored --nocapture`.
#[test]
#[ignore]
fn the_graph_of_a_thousand_sessions() {
    const SESSIONS: usize = 1000;
    const NAMES: usize = 100;
    let server = etcd();
    let c = client(&server.endpoints());
    let started = std::time::Instant::now();
    let sessions: Vec<Session> = (0..SESSIONS)
        .map(|i| named(&c, &format!("worker-{i}")))
        .collect();
    eprintln!("{SESSIONS} sessions in {:?}", started.elapsed());
    // Each thread keeps what it gets until the end.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waits: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let m = s.mutex(format!("k/{:03}", i % NAMES)).unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let _held = m.lock_timeout(Duration::from_secs(300));
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .collect();
    let queued = eventually(Duration::from_secs(600), || {
        std::thread::sleep(Duration::from_millis(200));
        keys(&c, "k/").len() == SESSIONS
    });
    assert!(queued);
    eprintln!("set up in {:?}", started.elapsed());
    let mut times = Vec::new();
    for _ in 0..5 {
        let at = std::time::Instant::now();
        let graph = c.wait_graph("k/").unwrap();
        times.push(at.elapsed());
        assert_eq!(graph.names.len(), NAMES);
        assert_eq!(graph.participants.len(), SESSIONS);
        let waiting: usize = graph.participants.iter().map(|p| p.waits.len()).sum();
        assert_eq!(waiting, SESSIONS - NAMES);
        assert!(graph.cycles.is_empty());
    }
    eprintln!("wait_graph of {SESSIONS} sessions: {times:?}");
    // What a deadlock check reads: one Range of the prefix.
    let mut reads = Vec::new();
    for _ in 0..5 {
        let at = std::time::Instant::now();
        assert_eq!(c.get_prefix("k/").unwrap().len(), SESSIONS);
        reads.push(at.elapsed());
    }
    eprintln!("one Range of the {SESSIONS} keys: {reads:?}");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for s in &sessions {
        let _ = s.close();
    }
    for wait in waits {
        wait.join().unwrap();
    }
}
