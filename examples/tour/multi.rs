//! The tour's multi-lock step: several names all or none, in one order whatever order
//! they are given in. Each step checks what it shows.

use std::thread;
use std::time::{Duration, Instant};

use etcd_sync::{Client, TryLockError};

use crate::step;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const ACCOUNTS: [&str; 2] = ["tour/account-1", "tour/account-2"];

fn balance(client: &Client, account: &str) -> etcd_sync::Result<i64> {
    Ok(client
        .get(format!("{account}-balance"))?
        .map_or(0, |kv| kv.value_str().parse().unwrap_or(0)))
}

/// Two sessions move money between two accounts, locking both in opposite orders: no
/// deadlock, no lost transfer. Then all or none: with one name busy, `try_lock` takes
/// neither, and a plain mutex of a held name is refused.
pub fn multi_lock(client: &Client) -> Res<()> {
    step("MultiLock: two names at once, all or none, in one order whatever order is given");
    client.put(format!("{}-balance", ACCOUNTS[0]), "100")?;
    client.put(format!("{}-balance", ACCOUNTS[1]), "100")?;
    let started = Instant::now();
    let movers: Vec<_> = [(ACCOUNTS[0], ACCOUNTS[1]), (ACCOUNTS[1], ACCOUNTS[0])]
        .into_iter()
        .map(|(from, to)| {
            let client = client.clone();
            thread::spawn(move || -> etcd_sync::Result<()> {
                let session = client.session()?;
                // Given as [from, to]: one thread says [1, 2], the other [2, 1].
                let both = session.multi_lock([from, to])?;
                for _ in 0..10 {
                    let guard = both.lock_timeout(Duration::from_secs(10))?;
                    let (a, b) = (balance(&client, from)?, balance(&client, to)?);
                    // Each write commits only while both locks are still ours.
                    guard.put(format!("{from}-balance"), (a - 5).to_string())?;
                    guard.put(format!("{to}-balance"), (b + 5).to_string())?;
                    let done = balance(&client, "tour/transfers")?;
                    guard.put("tour/transfers-balance", (done + 1).to_string())?;
                }
                session.close()
            })
        })
        .collect();
    for mover in movers {
        mover.join().map_err(|_| "a mover panicked")??;
    }
    let (a, b) = (balance(client, ACCOUNTS[0])?, balance(client, ACCOUNTS[1])?);
    let done = balance(client, "tour/transfers")?;
    if (a, b, done) != (100, 100, 20) {
        return Err(format!(
            "after 10 transfers each way the accounts hold {a} and {b}, {done} transfers counted"
        )
        .into());
    }
    println!(
        "   2 sessions, 10 transfers of 5 each way, locking [1, 2] and [2, 1]: no deadlock, \
         {done} transfers counted, balances {a} and {b} in {:?}",
        started.elapsed()
    );

    let (holder, other) = (client.session()?, client.session()?);
    let busy = holder.mutex(ACCOUNTS[1])?.lock()?;
    match other.multi_lock(ACCOUNTS)?.try_lock() {
        Err(TryLockError::WouldBlock) => {}
        other => return Err(format!("try_lock with one name busy: {other:?}").into()),
    }
    let ours: usize = ACCOUNTS
        .iter()
        .map(|n| client.get_prefix(format!("{n}/")))
        .collect::<etcd_sync::Result<Vec<_>>>()?
        .iter()
        .flatten()
        .filter(|kv| kv.lease == other.lease_id())
        .count();
    if ours != 0 {
        return Err(format!("a try_lock that found a name busy left {ours} keys").into());
    }
    println!(
        "   {} held by a mutex: try_lock of both returns WouldBlock and took neither",
        ACCOUNTS[1]
    );
    drop(busy);
    let guard = other.multi_lock(ACCOUNTS)?.lock()?;
    match holder.mutex(ACCOUNTS[0])?.try_lock() {
        Err(TryLockError::WouldBlock) => {}
        other => return Err(format!("a mutex beside the multi-lock: {other:?}").into()),
    }
    println!(
        "   both taken together (tokens {:?}); a plain mutex of {} is refused meanwhile",
        guard
            .fencing_tokens()
            .iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>(),
        ACCOUNTS[0]
    );
    guard.release()?;
    Ok(())
}
