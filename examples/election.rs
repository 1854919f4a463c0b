//! Three candidates campaign; the leader works until it "dies" (its session is dropped
//! without resigning, as a crashed process would), and an observer watches the failover.
//!
//! `cargo run --features testing --example election` (starts its own etcd), or pass
//! endpoints: `cargo run --example election -- http://127.0.0.1:2379`.

mod common;

use std::time::Duration;

use etcd_sync::{Client, LeaderEvent};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let etcd = common::etcd_from_args()?;
    let client = Client::connect(&etcd.endpoints)?;

    let watcher = client.session()?;
    let observer = watcher.election("example/scheduler")?.observe()?;
    let printer = std::thread::spawn(move || {
        // Until 3 s pass without a change (a wait timeout), or the observer fails.
        while let Ok(event) = observer.recv_timeout(Duration::from_secs(3)) {
            match event {
                LeaderEvent::Elected(l) => println!("observer: {} leads", l.value_str()),
                LeaderEvent::Proclaimed(l) => println!("observer: leader says {}", l.value_str()),
                LeaderEvent::NoLeader => println!("observer: no leader"),
            }
        }
    });

    let candidates: Vec<_> = ["alpha", "bravo", "charlie"]
        .into_iter()
        .map(|name| {
            let client = client.clone();
            std::thread::spawn(move || -> etcd_sync::Result<()> {
                let session = client
                    .session_builder()
                    .ttl(Duration::from_secs(2))
                    .start()?;
                let election = session.election("example/scheduler")?;
                let leadership = election.campaign(name)?;
                println!("{name}: I lead (token {})", leadership.fencing_token());
                for tick in 0..3 {
                    leadership.proclaim(format!("{name} tick {tick}"))?;
                    std::thread::sleep(Duration::from_millis(200));
                }
                println!("{name}: crashing without resigning");
                std::mem::forget(leadership);
                session.orphan(); // the lease expires within its TTL; the next candidate leads
                Ok(())
            })
        })
        .collect();
    for c in candidates {
        c.join().map_err(|_| "candidate panicked")??;
    }
    printer.join().map_err(|_| "observer panicked")?;
    Ok(())
}
