//! Criterion benches of etcd-sync's operations against a real single-member etcd that the
//! bench starts itself (loopback, temporary data dir).
//!
//! `lock/floor` sends the same two requests as `lock/uncontended` (the acquire-shaped Txn and
//! a guarded delete) through the crate's plain `Client::txn`, with no session, queue or guard
//! logic around them: `lock/uncontended ÷ lock/floor` is the overhead of the lock itself.
//!
//! Run: `cargo bench --features testing --bench lock`.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use etcd_sync::testing::EtcdServer;
use etcd_sync::{Client, Compare, CompareOp, LeaderEvent, Txn, TxnOp};

fn start() -> (EtcdServer, Client) {
    let etcd = EtcdServer::start().expect("start etcd (apt-get install etcd-server)");
    let client = Client::connect(etcd.endpoints()).expect("connect");
    (etcd, client)
}

fn lock(c: &mut Criterion) {
    let (_etcd, client) = start();
    let session = client.session().expect("session");
    let mut group = c.benchmark_group("lock");

    let mutex = session.mutex("bench/uncontended").expect("mutex");
    group.bench_function("uncontended", |b| {
        b.iter(|| drop(mutex.lock().expect("lock")));
    });

    // The floor: the same Txn (compare create==0; put with lease and a read of the name, no
    // else branch) and the same guarded delete, through the public transaction API.
    let key = format!("bench/floor/{:x}", session.lease_id());
    let lease = session.lease_id();
    group.bench_function("floor", |b| {
        b.iter(|| {
            let acquired = client
                .txn(
                    Txn::new()
                        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                        .and_then([
                            TxnOp::put_with_lease(key.as_str(), "", lease),
                            TxnOp::get_prefix("bench/floor/"),
                        ]),
                )
                .expect("txn");
            client
                .txn(
                    Txn::new()
                        .when([Compare::create_revision(
                            key.as_str(),
                            CompareOp::Equal,
                            acquired.revision,
                        )])
                        .and_then([TxnOp::delete(key.as_str())]),
                )
                .expect("delete");
        });
    });

    let holder = client.session().expect("session");
    let _held = holder
        .mutex("bench/held")
        .expect("mutex")
        .lock()
        .expect("lock");
    let contender = session.mutex("bench/held").expect("mutex");
    group.bench_function("try_lock_held", |b| {
        b.iter(|| assert!(contender.try_lock().is_err()));
    });

    // Handoff: release in this thread -> acquire in the waiting thread.
    let other = client.session().expect("session");
    let mine = session.mutex("bench/handoff").expect("mutex");
    let theirs = other.mutex("bench/handoff").expect("mutex");
    group.bench_function("handoff", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let guard = mine.lock().expect("lock");
                let (ready_tx, ready_rx) = mpsc::channel();
                let (done_tx, done_rx) = mpsc::channel();
                let theirs = theirs.clone();
                let waiter = std::thread::spawn(move || {
                    ready_tx.send(()).ok();
                    let g = theirs.lock().expect("lock");
                    done_tx.send(Instant::now()).ok();
                    drop(g);
                });
                ready_rx.recv().ok();
                std::thread::sleep(Duration::from_millis(5)); // queued and watching
                let released = Instant::now();
                drop(guard);
                let acquired = done_rx.recv().expect("acquired");
                total += acquired - released;
                waiter.join().ok();
            }
            total
        });
    });
    group.finish();
}

fn election(c: &mut Criterion) {
    let (_etcd, client) = start();
    let session = client.session().expect("session");
    let mut group = c.benchmark_group("election");
    let e = session.election("bench/election").expect("election");
    group.bench_function("campaign_resign", |b| {
        b.iter(|| {
            let mut l = e.campaign("v").expect("campaign");
            l.resign().expect("resign");
        });
    });
    let leadership = session
        .election("bench/observed")
        .expect("election")
        .campaign("0")
        .expect("campaign");
    let observer = client
        .session()
        .expect("session")
        .election("bench/observed")
        .expect("election")
        .observe()
        .expect("observe");
    while observer.try_recv().expect("observer").is_some() {}
    let _ = observer.recv_timeout(Duration::from_millis(200));
    let mut n = 0u64;
    group.bench_function("proclaim_observed", |b| {
        b.iter(|| {
            n += 1;
            leadership.proclaim(n.to_string()).expect("proclaim");
            loop {
                match observer.recv_timeout(Duration::from_secs(5)) {
                    Ok(LeaderEvent::Proclaimed(l)) if l.value == n.to_string().as_bytes() => {
                        break;
                    }
                    Ok(_) => continue,
                    Err(e) if e.is_wait_timeout() => panic!("observer saw nothing"),
                    Err(e) => panic!("observer: {e}"),
                }
            }
        });
    });
    group.finish();
}

fn session(c: &mut Criterion) {
    let (_etcd, client) = start();
    let mut group = c.benchmark_group("session");
    group.bench_function("start_close", |b| {
        b.iter(|| client.session().expect("session").close().expect("close"));
    });
    group.bench_function("get_floor", |b| {
        b.iter(|| client.get("bench/none").expect("get"));
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5)).sample_size(50);
    targets = lock, election, session
}
criterion_main!(benches);
