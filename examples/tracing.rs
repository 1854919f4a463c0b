//! Turning on etcd-sync's tracing: spans and events for connect, sessions, keep-alive
//! trouble, lock waits (with the predecessor waited on), acquire, release, campaigns and
//! leader changes. Without a subscriber they cost next to nothing.
//!
//! This example shows etcd-sync's own events at DEBUG and above (not those of the HTTP/2
//! stack underneath): `cargo run --features testing --example tracing`.

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_target(false))
        .with(
            tracing_subscriber::filter::Targets::new()
                .with_target("etcd_sync", tracing::Level::DEBUG),
        )
        .init();

    let etcd = etcd_sync::testing::EtcdServer::start()?;
    let client = etcd_sync::Client::connect(etcd.endpoints())?;
    let first = client
        .session_builder()
        .ttl(Duration::from_secs(5))
        .start()?;
    let second = client
        .session_builder()
        .ttl(Duration::from_secs(5))
        .start()?;
    let guard = first.mutex("traced")?.lock()?;
    let waiter = {
        let mutex = second.mutex("traced")?;
        std::thread::spawn(move || mutex.lock().map(|g| g.fencing_token()))
    };
    std::thread::sleep(Duration::from_millis(200));
    drop(guard);
    let token = waiter.join().map_err(|_| "waiter panicked")??;
    println!("waiter got the lock with fencing token {token}");
    let leadership = first.election("traced-election")?.campaign("me")?;
    drop(leadership);
    first.close()?;
    Ok(())
}
