//! A guided tour of etcd-sync against a throwaway etcd this program starts and stops.
//!
//! Run it with `scripts/demo` (or `cargo run --release --features testing --example tour`).
//! This file walks through sessions, the mutex and elections; `more.rs` goes on with
//! the semaphore, the read-write lock, status, cancelling a wait and the leader loop;
//! `multi.rs` takes several names at once, `permits.rs` several permits, `revoke.rs` asks
//! a holder to let go, `downgrade.rs` goes from write to read with no gap.

mod downgrade;
mod more;
mod multi;
mod permits;
mod revoke;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use etcd_sync::testing::EtcdServer;
use etcd_sync::{Client, LeaderEvent, TryLockError};

fn main() {
    if let Err(e) = run() {
        eprintln!("tour failed: {e}");
        std::process::exit(1);
    }
}

pub(crate) fn step(title: &str) {
    println!("\n== {title}");
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    step("Starting a throwaway etcd on 127.0.0.1");
    let etcd = EtcdServer::start()?;
    println!("   etcd is serving at {}", etcd.endpoint());
    let client = Client::connect(etcd.endpoints())?;

    step("Sessions: a lease kept alive by the client's keep-alive thread");
    let session = client
        .session_builder()
        .ttl(Duration::from_secs(5))
        .start()?;
    println!(
        "   lease {:x}, TTL {:?}, known alive for another {:?}",
        session.lease_id(),
        session.ttl(),
        session.remaining()
    );
    client.put_with_lease("tour/heartbeat", "up", session.lease_id())?;
    println!("   put tour/heartbeat bound to the lease");

    step("Mutex: a std-style lock whose guard releases on drop");
    let mutex = session.mutex("tour/migration")?;
    {
        let guard = mutex.lock()?;
        println!(
            "   locked {} (fencing token {})",
            guard.key_str(),
            guard.fencing_token()
        );
        guard.put("tour/schema", "v2")?;
        println!("   wrote tour/schema=v2, conditional on still holding the lock");
    }
    println!("   released (guard dropped)");

    step(
        "Contention: 4 sessions (as 4 processes would have) add 5 each to a counter read and written in etcd",
    );
    let total = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|id| {
            let client = client.clone();
            let total = total.clone();
            std::thread::spawn(move || -> etcd_sync::Result<Vec<i64>> {
                let session = client.session()?;
                let mutex = session.mutex("tour/counter-lock")?;
                let mut tokens = Vec::new();
                for _ in 0..5 {
                    let guard = mutex.lock()?;
                    let n: u64 = client
                        .get("tour/counter")?
                        .map(|kv| kv.value_str().parse().unwrap_or(0))
                        .unwrap_or(0);
                    client.put("tour/counter", (n + 1).to_string())?;
                    tokens.push(guard.fencing_token());
                    total.fetch_add(1, Ordering::SeqCst);
                }
                println!("   worker {id} done, its fencing tokens: {tokens:?}");
                Ok(tokens)
            })
        })
        .collect();
    for worker in workers {
        worker.join().map_err(|_| "worker panicked")??;
    }
    let counter = client
        .get("tour/counter")?
        .map(|kv| kv.value_str().into_owned());
    println!(
        "   counter = {} after {} locked increments in {:?} (no lost updates)",
        counter.unwrap_or_default(),
        total.load(Ordering::SeqCst),
        started.elapsed()
    );

    step("try_lock and lock_timeout");
    let other = client.session()?;
    let held = mutex.lock()?;
    match other.mutex("tour/migration")?.try_lock() {
        Err(TryLockError::WouldBlock) => println!("   try_lock from another session: WouldBlock"),
        other => return Err(format!("unexpected: {other:?}").into()),
    }
    match other
        .mutex("tour/migration")?
        .lock_timeout(Duration::from_millis(300))
    {
        Err(e) if e.is_wait_timeout() => println!("   lock_timeout: {e}"),
        other => return Err(format!("unexpected: {other:?}").into()),
    }
    let keys: Vec<_> = client
        .get_prefix("tour/migration/")?
        .iter()
        .map(|kv| kv.key_str().into_owned())
        .collect();
    println!("   keys under tour/migration/: {keys:?} (the waiters left nothing behind)");
    drop(held);

    step("Election: campaign, proclaim, observe, resign");
    let observer = session.election("tour/leader")?.observe()?;
    let first = session.election("tour/leader")?.campaign("node-a")?;
    let second_session = client.session()?;
    let second_election = second_session.election("tour/leader")?;
    let second = std::thread::spawn(move || second_election.campaign("node-b"));
    first.proclaim("node-a (ready)")?;
    std::thread::sleep(Duration::from_millis(200));
    drop(first); // resigns: node-b takes over
    let second = second.join().map_err(|_| "campaign thread panicked")??;
    println!(
        "   node-b leads now (fencing token {})",
        second.fencing_token()
    );
    drop(second);
    loop {
        let event = match observer.recv_timeout(Duration::from_millis(300)) {
            Ok(event) => event,
            Err(e) if e.is_wait_timeout() => break, // quiet for 300 ms: caught up
            Err(e) => return Err(e.into()),
        };
        match event {
            LeaderEvent::Elected(l) => println!("   observer: elected {}", l.value_str()),
            LeaderEvent::Proclaimed(l) => println!("   observer: leader says {}", l.value_str()),
            LeaderEvent::NoLeader => println!("   observer: no leader"),
        }
    }

    more::semaphore_and_rwlock(&client)?;
    permits::several_permits(&client)?;
    downgrade::downgrade(&client)?;
    more::status_and_cancel(&client)?;
    multi::multi_lock(&client)?;
    more::barriers(&client)?;
    more::leader_loop(&client)?;
    more::stm(&client)?;
    revoke::release_request(&client)?;

    step("Losing a lease: freeze etcd and watch the guard's loss signal");
    let short = client
        .session_builder()
        .ttl(Duration::from_secs(2))
        .start()?;
    let guard = short.mutex("tour/fragile")?.lock()?;
    etcd.pause()?;
    let frozen = Instant::now();
    // No keep-alive can be acknowledged any more: this is the final deadline, and the
    // lease cannot expire on the server before deadline + margin (200 ms at TTL 2 s).
    let deadline = short.valid_until().ok_or("session already lost")?;
    let server_expiry = deadline + Duration::from_millis(200);
    let fired = guard.lost().recv_timeout(Duration::from_secs(10)).is_err();
    let now = Instant::now();
    println!(
        "   etcd frozen; lost() fired: {fired}, {:?} after the freeze and {:?} before the \
         lease could expire on the server",
        now - frozen,
        server_expiry.saturating_duration_since(now)
    );
    etcd.resume()?;
    println!(
        "   etcd back; guard still held? {} (a lost session never comes back); reason: {}",
        guard.is_held(),
        short
            .loss_reason()
            .map(|r| r.to_string())
            .unwrap_or_default()
    );
    match guard.put("tour/fragile-data", "x") {
        Err(e) => println!("   guarded write after the loss: refused by etcd ({e})"),
        Ok(_) => println!(
            "   a guarded write right now is still accepted: etcd has not expired the lease \
             yet (the client gives up first, by design)"
        ),
    }
    drop(guard);

    step("Closing the session revokes its lease");
    session.close()?;
    println!(
        "   tour/heartbeat present after close? {}",
        client.get("tour/heartbeat")?.is_some()
    );

    println!("\nDone. The throwaway etcd is stopped now.");
    Ok(())
}
