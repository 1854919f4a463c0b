//! Several workers (each with its own session, as separate processes would have) share one
//! job lock; each critical section writes a fenced record that etcd accepts only while the
//! writer still holds the lock.
//!
//! `cargo run --features testing --example mutex` (starts its own etcd), or pass endpoints:
//! `cargo run --example mutex -- http://127.0.0.1:2379`.

mod common;

use std::time::Duration;

use etcd_sync::{Client, Compare, CompareOp, Txn, TxnOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let etcd = common::etcd_from_args()?;
    let client = Client::connect(&etcd.endpoints)?;
    client.put("example/last-token", format!("{:020}", 0))?;

    let workers: Vec<_> = (0..3)
        .map(|id| {
            let client = client.clone();
            std::thread::spawn(move || -> etcd_sync::Result<()> {
                let session = client
                    .session_builder()
                    .ttl(Duration::from_secs(5))
                    .start()?;
                let job = session.mutex("example/report-job")?;
                for run in 0..2 {
                    let guard = job.lock()?;
                    // Fenced write: only if we still hold the lock, and only if no later
                    // holder (higher token) has written already.
                    let written = guard.txn(
                        Txn::new()
                            .when([Compare::value(
                                "example/last-token",
                                CompareOp::Less,
                                format!("{:020}", guard.fencing_token()),
                            )])
                            .and_then([TxnOp::put(
                                "example/last-token",
                                format!("{:020}", guard.fencing_token()),
                            )]),
                    )?;
                    println!(
                        "worker {id} run {run}: holds {} with token {} (fenced write accepted: {})",
                        guard.key_str(),
                        guard.fencing_token(),
                        written.succeeded
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker.join().map_err(|_| "worker panicked")??;
    }
    println!(
        "last token written: {}",
        client
            .get("example/last-token")?
            .map(|kv| kv.value_str().into_owned())
            .unwrap_or_default()
    );
    Ok(())
}
