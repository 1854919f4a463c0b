//! A worker that owns a shard while it holds its lock, watches who leads the scheduler, and
//! shuts down cleanly on Ctrl-C: one `select!` over the guard's `lost()`, an observer's
//! receiver and a shutdown channel fed from a signal handler. On shutdown it releases the
//! lock and closes its session, so nobody waits for the lease to expire.
//!
//! `cargo run --features testing --example shutdown` (starts its own etcd and sends itself
//! SIGINT after two seconds), or pass endpoints and press Ctrl-C:
//! `cargo run --example shutdown -- http://127.0.0.1:2379`.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_sync::Client;
use etcd_sync::crossbeam_channel::{bounded, select, tick};

/// Set by the signal handler; the only thing a handler may safely do is touch an atomic.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let etcd = common::etcd_from_args()?;
    // SAFETY: installs a handler that only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    // A thread turns the flag into a channel message, so that `select!` can wait for it.
    let (shutdown_tx, shutdown) = bounded::<()>(1);
    std::thread::spawn(move || {
        while !INTERRUPTED.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = shutdown_tx.send(());
    });
    if etcd.started_here() {
        // Nobody to press Ctrl-C: interrupt ourselves after a while.
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_secs(2));
            // SAFETY: raise(2) on our own process.
            unsafe { libc::raise(libc::SIGINT) };
        });
    }

    let client = Client::connect(&etcd.endpoints)?;
    let session = client
        .session_builder()
        .ttl(Duration::from_secs(10))
        .start()?;
    let guard = session.mutex("example/shard-7")?.lock()?;
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
            recv(shutdown) -> _ => {
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
