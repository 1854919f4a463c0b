//! The tour's step on asking a holder to let go: a request reaches the holder with who
//! asked, the holder decides to release, and the waiter behind it takes over.

use std::time::{Duration, Instant};

use etcd_sync::Client;

use crate::step;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A worker holds a shard; an operator's `request_release` reaches its guard within a
/// second, naming the operator; the worker releases and a waiter takes the shard.
pub fn release_request(client: &Client) -> Res<()> {
    step("Asking a holder to let go: Client::request_release, guard.release_requested()");
    let worker = client.session_builder().identity("tour-worker").start()?;
    let guard = worker.mutex("tour/shard")?.lock()?;
    let asked = guard.release_requested();

    let next = client.session_builder().identity("tour-next").start()?;
    let mutex = next.mutex("tour/shard")?;
    let waiting = std::thread::spawn(move || mutex.lock_timeout(Duration::from_secs(10)));

    let started = Instant::now();
    let holders = client.request_release_with_reason("tour/shard", "rebalancing")?;
    if holders.len() != 1 || holders[0].key != guard.key() {
        return Err(format!("asked {holders:?}, not the holder {}", guard.key_str()).into());
    }
    let request = asked.recv_timeout(Duration::from_secs(2))?;
    let heard = started.elapsed();
    println!(
        "   the holder heard {:?} from {} after {heard:.0?}, still holding: {}",
        request.reason.as_deref().unwrap_or(""),
        request.requester,
        guard.is_held()
    );
    if request.reason.as_deref() != Some("rebalancing") || !guard.is_held() {
        return Err(format!("unexpected request {request:?}").into());
    }
    guard.release()?;
    let taken = waiting.join().map_err(|_| "the waiter panicked")??;
    println!(
        "   it released; the waiter holds {} (token {})",
        taken.key_str(),
        taken.fencing_token()
    );
    if !client.get_prefix("tour/shard.revoke/")?.is_empty() {
        return Err("the request outlived the hold".into());
    }
    println!("   the request went with the holder's key: nothing left behind");
    Ok(())
}
