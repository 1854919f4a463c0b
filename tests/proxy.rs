//! Every recipe through etcd's gRPC proxy (`etcd grpc-proxy start`, run from the same
//! binary as the server), plain and with `--namespace`: waits hand over, guards follow
//! their keys, and the proxy restarting or dying under a wait changes neither.
//!
//! The proxy numbers a stream's watchers itself (0, 1, 2, …) and ignores the ids a client
//! asks for; before `transport/watch_ids.rs`, every wait through it hung until its limit.

#![cfg(feature = "testing")]

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{client, etcdctl_command, eventually, keys, session};
use etcd_sync::Client;
use etcd_sync::LeaderEvent;
use etcd_sync::testing::{EtcdProxy, EtcdServer};

/// Generous: a handover through a proxy takes milliseconds.
const HANDOVER: Duration = Duration::from_secs(5);
const NAMESPACE: &str = "/tenant-a/";

/// An etcd member and a proxy in front of it.
struct Hop {
    etcd: EtcdServer,
    proxy: EtcdProxy,
    namespace: Option<&'static str>,
}

impl Hop {
    fn start(namespace: Option<&'static str>) -> Hop {
        common::trace_from_env();
        let etcd = common::etcd();
        let mut builder = EtcdProxy::builder(&etcd.endpoints());
        if let Some(namespace) = namespace {
            builder = builder.namespace(namespace);
        }
        let proxy = builder.start().expect("start etcd grpc-proxy");
        Hop {
            etcd,
            proxy,
            namespace,
        }
    }

    /// A client through the proxy.
    fn client(&self) -> Client {
        client(&[self.proxy.endpoint()])
    }

    /// A client straight to the member.
    fn direct(&self) -> Client {
        client(&self.etcd.endpoints())
    }

    /// `key` as the member stores it.
    fn stored(&self, key: &str) -> String {
        format!("{}{key}", self.namespace.unwrap_or(""))
    }
}

/// Runs `wait` on another thread; its result arrives on the receiver.
fn on_thread<T: Send + 'static>(wait: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(wait());
    });
    rx
}

fn mutex_hands_over(hop: &Hop) {
    let a = hop.client();
    let b = hop.client();
    let sa = session(&a, 10);
    let guard = sa.mutex("m").unwrap().lock().unwrap();
    let waiter = on_thread(move || {
        let sb = session(&b, 10);
        let got = sb
            .mutex("m")
            .unwrap()
            .lock_timeout(Duration::from_secs(20))
            .map(|g| g.fencing_token());
        (got, Instant::now())
    });
    thread::sleep(Duration::from_millis(300));
    let token = guard.fencing_token();
    drop(guard);
    let released = Instant::now();
    let (got, at) = waiter.recv_timeout(Duration::from_secs(25)).unwrap();
    let next = got.expect("the waiter takes the lock through the proxy");
    assert!(next > token, "fencing tokens increase: {token} then {next}");
    assert!(
        at.duration_since(released) < HANDOVER,
        "handover took {:?}",
        at.duration_since(released)
    );
    // The member holds the keys under the namespace, and none is left.
    let direct = hop.direct();
    assert!(
        eventually(Duration::from_secs(3), || keys(&direct, &hop.stored("m/"))
            .is_empty()),
        "keys left: {:?}",
        keys(&direct, &hop.stored("m/"))
    );
}

fn guard_follows_a_deleted_key(hop: &Hop) {
    let a = hop.client();
    let sa = session(&a, 10);
    let guard = sa.mutex("followed").unwrap().lock().unwrap();
    let lost = guard.lost();
    // Deleted by an operator on the member, under the namespace.
    let key = hop.stored(&guard.key_str());
    let deleted = Instant::now();
    hop.direct().delete(&key).unwrap();
    // lost() fires by closing: a message or a disconnect, not a timeout.
    let fired = lost.recv_timeout(Duration::from_secs(5));
    assert!(
        !matches!(
            fired,
            Err(etcd_sync::crossbeam_channel::RecvTimeoutError::Timeout)
        ),
        "lost() never fired through the proxy"
    );
    assert!(
        deleted.elapsed() < Duration::from_secs(2),
        "{:?}",
        deleted.elapsed()
    );
    assert!(!guard.is_held());
}

fn rwlock_reader_behind_writer_and_downgrade(hop: &Hop) {
    let a = hop.client();
    let sa = session(&a, 10);
    let rw = sa.rwlock("rw").unwrap();
    let writer = rw.write_downgradable().unwrap();
    let b = hop.client();
    let reader = on_thread(move || {
        let sb = session(&b, 10);
        let r = sb
            .rwlock("rw")
            .unwrap()
            .read_timeout(Duration::from_secs(20));
        r.map(|g| g.is_held())
    });
    thread::sleep(Duration::from_millis(300));
    // A reader waits behind the writer; the downgrade lets it in with no gap.
    let read = writer.downgrade().expect("downgrade through the proxy");
    assert!(
        reader
            .recv_timeout(HANDOVER)
            .expect("the reader is let in")
            .unwrap()
    );
    assert!(read.is_held());
    // A writer waits behind the reader.
    let c = hop.client();
    let writer2 = on_thread(move || {
        let sc = session(&c, 10);
        sc.rwlock("rw")
            .unwrap()
            .write_timeout(Duration::from_secs(20))
            .map(|g| g.is_held())
    });
    thread::sleep(Duration::from_millis(300));
    drop(read);
    assert!(
        writer2
            .recv_timeout(HANDOVER)
            .expect("writer after reader")
            .unwrap()
    );
}

fn semaphore_waiter_admitted(hop: &Hop) {
    let a = hop.client();
    let sa = session(&a, 10);
    let sa2 = session(&a, 10);
    let one = sa.semaphore("sem", 2).unwrap().acquire().unwrap();
    let two = sa2.semaphore("sem", 2).unwrap().acquire().unwrap();
    let b = hop.client();
    let waiter = on_thread(move || {
        let sb = session(&b, 10);
        let sem = sb.semaphore("sem", 2).unwrap();
        // Both permits at once.
        sem.acquire_many(2).map(|p| p.is_held())
    });
    thread::sleep(Duration::from_millis(300));
    drop(one);
    thread::sleep(Duration::from_millis(200));
    drop(two);
    assert!(waiter.recv_timeout(HANDOVER).expect("admitted").unwrap());
}

fn election_campaign_and_observe(hop: &Hop) {
    let a = hop.client();
    let sa = session(&a, 10);
    let observer = hop.client().observe("el").unwrap();
    let mut leadership = sa.election("el").unwrap().campaign("node-a").unwrap();
    let b = hop.client();
    let second = on_thread(move || {
        let sb = session(&b, 10);
        sb.election("el")
            .unwrap()
            .campaign_timeout("node-b", Duration::from_secs(20))
            .map(|l| (l.is_leader(), l, sb))
    });
    let first_seen = loop {
        match observer
            .recv_timeout(HANDOVER)
            .expect("the observer hears the first leader")
        {
            LeaderEvent::Elected(holder) => break holder.value_str().into_owned(),
            _ => continue,
        }
    };
    assert_eq!(first_seen, "node-a");
    thread::sleep(Duration::from_millis(300));
    leadership.resign().unwrap();
    // Kept (with its session) until the observer has seen it.
    let (leads, _leadership, _session) = second
        .recv_timeout(HANDOVER)
        .expect("node-b leads")
        .unwrap();
    assert!(leads);
    let next = loop {
        match observer
            .recv_timeout(HANDOVER)
            .expect("the observer hears node-b")
        {
            LeaderEvent::Elected(holder) => break holder.value_str().into_owned(),
            _ => continue,
        }
    };
    assert_eq!(next, "node-b");
}

/// A hand-over (issue 53) through the proxy: the candidate's watch of its request, its
/// answer, the adoption and its wait's read all pass through it.
fn election_hands_over(hop: &Hop) {
    let a = hop.client();
    let sa = session(&a, 10);
    let leadership = sa.election("ho").unwrap().campaign("node-a").unwrap();
    let b = hop.client();
    let next = on_thread(move || {
        let sb = session(&b, 10);
        sb.election("ho")
            .unwrap()
            .campaign_timeout("node-b", Duration::from_secs(20))
            .map(|l| (l.is_leader(), l.key().to_vec(), l, sb))
    });
    let election = sa.election("ho").unwrap();
    assert!(eventually(HANDOVER, || election
        .status()
        .is_ok_and(|s| s.waiters.len() == 1)));
    let holder = leadership.hand_over("node-b").unwrap();
    assert!(!leadership.is_leader());
    let (leads, key, _leadership, _session) =
        next.recv_timeout(HANDOVER).expect("node-b leads").unwrap();
    assert!(leads);
    assert_eq!(key, leadership.key(), "node-b holds node-a's key");
    assert_eq!(holder.value, b"node-b");
    let stored = hop.stored(&leadership.key_str());
    let on_member = hop
        .direct()
        .get(&stored)
        .unwrap()
        .expect("the key on the member");
    assert_eq!(on_member.value, b"node-b");
}

fn barrier_latch_and_multi_lock(hop: &Hop) {
    let c = hop.client();
    let barrier = c.barrier("gate").unwrap();
    assert!(barrier.hold().unwrap());
    let c2 = hop.client();
    let waiting = on_thread(move || {
        c2.barrier("gate")
            .unwrap()
            .wait_timeout(Duration::from_secs(20))
    });
    thread::sleep(Duration::from_millis(300));
    barrier.release().unwrap();
    waiting
        .recv_timeout(HANDOVER)
        .expect("the barrier opens")
        .unwrap();

    let latch = c.count_down_latch("latch").unwrap();
    assert!(latch.try_set_count(1).unwrap());
    let c3 = hop.client();
    let waiting = on_thread(move || {
        c3.count_down_latch("latch")
            .unwrap()
            .wait_timeout(Duration::from_secs(20))
    });
    thread::sleep(Duration::from_millis(300));
    latch.count_down().unwrap();
    waiting
        .recv_timeout(HANDOVER)
        .expect("the latch opens")
        .unwrap();

    let sa = session(&c, 10);
    let both = sa.multi_lock(["x", "y"]).unwrap().lock().unwrap();
    let c4 = hop.client();
    let waiting = on_thread(move || {
        let sb = session(&c4, 10);
        sb.multi_lock(["y", "x"])
            .unwrap()
            .lock_timeout(Duration::from_secs(20))
            .map(|g| g.is_held())
    });
    thread::sleep(Duration::from_millis(300));
    drop(both);
    assert!(waiting.recv_timeout(HANDOVER).expect("multi-lock").unwrap());
}

fn stm_and_status(hop: &Hop) {
    let c = hop.client();
    for _ in 0..3 {
        c.stm(|tx| {
            let n = tx.get("hits")?.map_or(0, |v| {
                String::from_utf8_lossy(&v).parse::<u64>().unwrap_or(0)
            });
            tx.put("hits", (n + 1).to_string());
            Ok(())
        })
        .unwrap();
    }
    let stored = hop.direct().get(hop.stored("hits")).unwrap().unwrap();
    assert_eq!(stored.value_str(), "3");
    let s = session(&c, 10);
    let m = s.mutex("st").unwrap();
    let _g = m.lock().unwrap();
    let status = m.status().unwrap();
    assert!(status.is_held());
}

/// etcdctl on the member and our lock through the proxy exclude each other, on the name
/// as the member sees it.
fn excludes_etcdctl_on_the_member(hop: &Hop) {
    let c = hop.client();
    let s = session(&c, 10);
    let guard = s.mutex("shared").unwrap().lock().unwrap();
    let name = hop.stored("shared");
    let mut etcdctl = etcdctl_command(&hop.etcd.endpoint(), &["lock", &name])
        .spawn()
        .expect("run etcdctl lock");
    thread::sleep(Duration::from_millis(1500));
    let direct = hop.direct();
    let waiting = keys(&direct, &format!("{name}/"));
    assert_eq!(waiting.len(), 2, "ours and etcdctl's: {waiting:?}");
    // etcdctl prints its key once it holds: not while we do.
    let out = etcdctl.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        use std::io::BufRead;
        let mut line = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "etcdctl holds too"
    );
    drop(guard);
    let line = rx
        .recv_timeout(HANDOVER)
        .expect("etcdctl holds after our release");
    assert!(line.starts_with(&name), "{line}");
    let _ = etcdctl.kill();
    let _ = etcdctl.wait();
}

/// A wait through a proxy that is restarted under it goes on and takes the lock.
fn wait_survives_a_proxy_restart(hop: &Hop) {
    let a = hop.direct();
    let sa = session(&a, 10);
    let guard = sa.mutex(hop.stored("r")).unwrap().lock().unwrap();
    let b = hop.client();
    let waiter = on_thread(move || {
        let sb = session(&b, 30);
        sb.mutex("r")
            .unwrap()
            .lock_timeout(Duration::from_secs(30))
            .map(|g| g.is_held())
    });
    thread::sleep(Duration::from_millis(500));
    hop.proxy.restart().unwrap();
    thread::sleep(Duration::from_millis(500));
    drop(guard);
    let got = waiter
        .recv_timeout(Duration::from_secs(35))
        .expect("the waiter returns");
    assert!(got.expect("the waiter takes the lock after the proxy came back"));
}

macro_rules! through_both {
    ($($name:ident),* $(,)?) => {
        mod plain {
            use super::*;
            $(#[test] fn $name() { super::$name(&Hop::start(None)); })*
        }
        mod namespaced {
            use super::*;
            $(#[test] fn $name() { super::$name(&Hop::start(Some(NAMESPACE))); })*
        }
    };
}

through_both!(
    mutex_hands_over,
    guard_follows_a_deleted_key,
    rwlock_reader_behind_writer_and_downgrade,
    semaphore_waiter_admitted,
    election_campaign_and_observe,
    election_hands_over,
    barrier_latch_and_multi_lock,
    stm_and_status,
    excludes_etcdctl_on_the_member,
    wait_survives_a_proxy_restart,
    member_restart_behind_the_proxy,
    observer_made_while_the_member_is_down,
);

/// Two proxies as the endpoints; the one in use dies under a wait: the client moves to
/// the other, and the wait takes the lock when it is released.
#[test]
fn wait_moves_to_the_second_proxy_when_the_first_dies() {
    common::trace_from_env();
    let etcd = common::etcd();
    let p1 = EtcdProxy::start(&etcd.endpoints()).unwrap();
    let p2 = EtcdProxy::start(&etcd.endpoints()).unwrap();
    let holder = client(&etcd.endpoints());
    let sa = session(&holder, 10);
    let guard = sa.mutex("two").unwrap().lock().unwrap();
    let endpoints = vec![p1.endpoint(), p2.endpoint()];
    let waiter = on_thread(move || {
        let b = client(&endpoints);
        let sb = session(&b, 30);
        sb.mutex("two")
            .unwrap()
            .lock_timeout(Duration::from_secs(30))
            .map(|g| g.is_held())
    });
    thread::sleep(Duration::from_millis(500));
    p1.kill().unwrap();
    thread::sleep(Duration::from_millis(500));
    drop(guard);
    let got = waiter
        .recv_timeout(Duration::from_secs(35))
        .expect("the waiter returns");
    assert!(got.expect("the waiter takes the lock through the second proxy"));
    drop(p2);
}

/// The member behind the proxy restarts (the proxy's own watch on it breaks and resumes),
/// then an operator deletes a guard's key and a waiter's turn comes: both are heard.
fn member_restart_behind_the_proxy(hop: &Hop) {
    let a = hop.client();
    let sa = session(&a, 30);
    let guard = sa.mutex("kept").unwrap().lock().unwrap();
    let holder = sa.mutex("line").unwrap().lock().unwrap();
    let b = hop.client();
    let waiter = on_thread(move || {
        let sb = session(&b, 30);
        sb.mutex("line")
            .unwrap()
            .lock_timeout(Duration::from_secs(40))
            .map(|g| g.is_held())
    });
    thread::sleep(Duration::from_millis(300));
    hop.etcd.kill().unwrap();
    thread::sleep(Duration::from_millis(500));
    hop.etcd.restart().unwrap();
    thread::sleep(Duration::from_millis(500));
    let lost = guard.lost();
    let key = hop.stored(&guard.key_str());
    let deleted = Instant::now();
    hop.direct().delete(&key).unwrap();
    let fired = lost.recv_timeout(Duration::from_secs(10));
    assert!(
        !matches!(
            fired,
            Err(etcd_sync::crossbeam_channel::RecvTimeoutError::Timeout)
        ),
        "lost() never fired after the member behind the proxy restarted"
    );
    eprintln!("loss heard {:?} after the delete", deleted.elapsed());
    drop(holder);
    let got = waiter
        .recv_timeout(Duration::from_secs(45))
        .expect("the waiter returns");
    assert!(got.expect("the waiter takes the lock after the member restarted"));
}

/// An observer made while the member behind the proxy is down (the proxy refuses its
/// watcher: it cannot check permissions) hears the leader once the member is back.
fn observer_made_while_the_member_is_down(hop: &Hop) {
    let c = hop.client();
    // The client's stream is up before the member goes.
    let _warm = c.observe("warm").unwrap();
    hop.etcd.kill().unwrap();
    let c2 = c.clone();
    let observing = on_thread(move || {
        let observer = c2.observe("down-el")?;
        loop {
            match observer.recv_timeout(Duration::from_secs(30))? {
                LeaderEvent::Elected(holder) => return Ok(holder.value_str().into_owned()),
                _ => continue,
            }
        }
    });
    thread::sleep(Duration::from_millis(1000));
    hop.etcd.restart().unwrap();
    let d = hop.direct();
    let s = session(&d, 10);
    let _leading = s
        .election(hop.stored("down-el"))
        .unwrap()
        .campaign("back")
        .unwrap();
    let seen: etcd_sync::Result<String> = observing
        .recv_timeout(Duration::from_secs(40))
        .expect("the observer returns");
    assert_eq!(seen.expect("the observer hears the leader"), "back");
}

/// Watch creates the member has received, from anyone (the proxy's own stream included).
fn watch_messages(etcd: &EtcdServer) -> f64 {
    let text = etcd.metrics().unwrap();
    let metrics = etcd_sync::testing::metrics::parse(&text).unwrap();
    metrics.sum(
        "grpc_server_msg_received_total",
        &[("grpc_method", "Watch")],
    )
}

/// Through a proxy, an idle guard's watcher is created again about once a second (the
/// bound on an event the proxy loses), and the guard and a waiter still work after several
/// such rounds; straight to a member, an idle client sends etcd nothing on its watch
/// stream.
#[test]
fn silent_watchers_are_rechecked_through_a_proxy_only() {
    let hop = Hop::start(None);
    let a = hop.client();
    let sa = session(&a, 30);
    let guard = sa.mutex("idle").unwrap().lock().unwrap();
    let b = hop.client();
    let waiter = on_thread(move || {
        let sb = session(&b, 30);
        sb.mutex("idle")
            .unwrap()
            .lock_timeout(Duration::from_secs(30))
            .map(|g| (g.is_held(), Instant::now()))
    });
    thread::sleep(Duration::from_millis(500));
    let before = watch_messages(&hop.etcd);
    thread::sleep(Duration::from_secs(3));
    let rechecks = watch_messages(&hop.etcd) - before;
    eprintln!("{rechecks} watch requests reached the member in 3 idle seconds");
    assert!(
        rechecks >= 2.0,
        "idle watchers through the proxy were not rechecked: {rechecks}"
    );
    drop(guard);
    let released = Instant::now();
    let (held, at) = waiter
        .recv_timeout(Duration::from_secs(35))
        .expect("the waiter returns")
        .expect("the waiter takes the lock after the rechecks");
    assert!(held);
    assert!(at.duration_since(released) < HANDOVER);

    drop((sa, a));
    // Straight to the member: nothing while idle.
    let direct = hop.direct();
    let sd = session(&direct, 30);
    let guard = sd.mutex("idle-direct").unwrap().lock().unwrap();
    let lost = guard.lost();
    thread::sleep(Duration::from_millis(500));
    let before = watch_messages(&hop.etcd);
    thread::sleep(Duration::from_secs(2));
    let idle = watch_messages(&hop.etcd) - before;
    assert!(
        idle <= 1.0,
        "{idle} watch requests from an idle direct client"
    );
    hop.direct().delete(guard.key()).unwrap();
    assert!(!matches!(
        lost.recv_timeout(Duration::from_secs(5)),
        Err(etcd_sync::crossbeam_channel::RecvTimeoutError::Timeout)
    ));
}

/// Requests of gRPC method `method` the member has handled, from anyone.
fn handled_at(etcd: &EtcdServer, method: &str) -> f64 {
    let text = etcd.metrics().unwrap();
    let metrics = etcd_sync::testing::metrics::parse(&text).unwrap();
    metrics.sum("grpc_server_handled_total", &[("grpc_method", method)])
}

/// Through a proxy, with a request timeout as short as the silence bound: a confirmed
/// watcher that hears nothing is created again about once a second, not every recheck, and
/// its stream stays open (only a create the proxy never confirms ends it). Each stream
/// opened asks the member's Status once (`transport/watches/hub.rs`), so the member's
/// Status count shows a stream ended. Kills the mutants of `recheck_through_proxy` that
/// end the stream for a quiet confirmed watcher or restart every watcher at every recheck
/// (docs/design/mutation-score.md).
#[test]
fn a_silent_watcher_through_a_proxy_is_created_again_on_the_same_stream() {
    let hop = Hop::start(None);
    let a = common::try_client_for(&[hop.proxy.endpoint()], Duration::from_secs(1))
        .expect("connect through the proxy");
    let sa = session(&a, 30);
    let m = sa.mutex("quiet").unwrap();
    let guard = m.lock().unwrap();
    // The guard's follow subscribes after 200 ms; then its watcher hears nothing.
    thread::sleep(Duration::from_millis(1500));
    let (status0, watches0) = (handled_at(&hop.etcd, "Status"), watch_messages(&hop.etcd));
    thread::sleep(Duration::from_secs(4));
    let status = handled_at(&hop.etcd, "Status") - status0;
    let watches = watch_messages(&hop.etcd) - watches0;
    eprintln!("4 idle seconds through the proxy: {status} Status, {watches} watch requests");
    assert_eq!(status, 0.0, "the client's watch stream was opened again");
    // One watcher (the guard's name: the other name's went with its uncontended guard),
    // created again after a second of silence, at a recheck (every half second): about
    // 4 / 1.5 ≈ 3 times, each a cancel and a create the proxy passes on (4 in the runs
    // seen). A restart at every recheck would be 8 times, 16 requests.
    assert!(
        watches <= 10.0,
        "{watches} watch requests in 4 idle seconds: a silent watcher restarted too often"
    );
    assert!(guard.is_held());
}
