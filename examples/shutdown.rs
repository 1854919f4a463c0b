//! A worker that owns a shard while it holds its lock, watches who leads the scheduler, and
//! shuts down cleanly on Ctrl-C: the `ctrlc` crate's handler cancels a [`CancelToken`],
//! which ends the wait for the lock (`lock_with`) if it is still waiting, and afterwards is
//! one arm of a `select!` beside the guard's `lost()` and an observer's receiver. On
//! shutdown it releases the lock and closes its session, so nobody waits for the lease to
//! expire.
//!
//! `cargo run --features testing --example shutdown` (starts its own etcd and sends itself
//! SIGINT after two seconds), or pass endpoints and press Ctrl-C:
//! `cargo run --example shutdown -- http://127.0.0.1:2379`.

mod common;

use std::time::Duration;

use etcd_sync::crossbeam_channel::{select, tick};
use etcd_sync::{CancelToken, Client};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let etcd = common::etcd_from_args()?;
    // Ctrl-C (SIGINT; SIGTERM too with ctrlc's `termination` feature) cancels the token.
    // ctrlc runs the handler on a thread of its own, so it may do anything: `cancel()`
    // wakes every wait given the token and every receiver of `cancelled()`.
    let token = CancelToken::new();
    let on_ctrl_c = token.clone();
    ctrlc::set_handler(move || {
        on_ctrl_c.cancel();
    })?;
    if etcd.started_here() {
        // Nobody to press Ctrl-C: interrupt ourselves after a while, as a terminal would.
        let pid = std::process::id().to_string();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            let _ = std::process::Command::new("kill")
                .args(["-INT", &pid])
                .status();
        });
    }

    let client = Client::connect(&etcd.endpoints)?;
    let session = client
        .session_builder()
        .ttl(Duration::from_secs(10))
        .start()?;
    // A wait for the lock ends at Ctrl-C too, leaving no key behind.
    let guard = match session.mutex("example/shard-7")?.lock_with(&token) {
        Ok(guard) => guard,
        Err(e) if e.is_cancelled() => {
            println!("interrupted before we got the lock");
            session.close()?;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    println!(
        "holding {} (token {})",
        guard.key_str(),
        guard.fencing_token()
    );
    let observer = client.observe("example/scheduler")?;
    let work = tick(Duration::from_millis(500));
    loop {
        select! {
            recv(observer.receiver()) -> event => match event {
                Ok(Ok(event)) => println!("scheduler: {event:?}"),
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => break, // the observer stopped
            },
            recv(guard.lost()) -> _ => {
                eprintln!("lost the shard lock: stop touching the shard");
                break;
            }
            recv(token.cancelled()) -> _ => {
                println!("interrupted: releasing");
                break;
            }
            recv(work) -> _ => println!("working on shard 7"),
        }
    }
    guard.release()?;
    session.close()?;
    println!("released; session closed");
    Ok(())
}
