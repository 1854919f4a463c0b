//! A fixed number of one operation, for `valgrind --tool=callgrind` (`scripts/callgrind`):
//! instruction counts do not move with the machine's load, so two runs that differ only in
//! their count give the client's instructions per operation (issue 49).
//!
//! `instructions <lock|floor|get> <count> <endpoint>`: `lock` is an uncontended
//! `Mutex::lock` + `release`; `floor` sends the same two Txns through `Client::txn`; `get`
//! is a linearizable Get.

use std::time::Duration;

use etcd_sync::{Client, Compare, CompareOp, Txn, TxnOp};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, count, endpoint] = args.as_slice() else {
        return Err("usage: instructions <lock|floor|get> <count> <endpoint>".into());
    };
    let count: u64 = count.parse()?;
    let client = Client::connect([endpoint.as_str()])?;
    let session = client
        .session_builder()
        .ttl(Duration::from_secs(30))
        .start()?;
    let mutex = session.mutex("instructions/lock")?;
    let lease = session.lease_id();
    let key = format!("instructions/floor/{lease:x}");
    // One of each first: connections, watchers and caches are warm before the count.
    for _ in 0..count + 1 {
        match mode.as_str() {
            "lock" => mutex.lock()?.release()?,
            "floor" => floor(&client, &key, lease)?,
            "get" => drop(client.get("instructions/get")?),
            other => return Err(format!("unknown mode {other:?}").into()),
        }
    }
    session.close()?;
    Ok(())
}

/// The two Txns an uncontended lock + unlock sends.
fn floor(client: &Client, key: &str, lease: i64) -> Res<()> {
    let acquired = client.txn(
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put_with_lease(key, "", lease),
                TxnOp::get_prefix("instructions/floor/"),
            ]),
    )?;
    client.txn(
        Txn::new()
            .when([Compare::create_revision(
                key,
                CompareOp::Equal,
                acquired.revision,
            )])
            .and_then([
                TxnOp::delete(key),
                // The release request the lock's release deletes too (`line/request.rs`).
                TxnOp::delete(format!("instructions/floor.revoke/{lease:x}")),
            ]),
    )?;
    Ok(())
}
