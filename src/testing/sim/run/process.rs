//! A simulated process: one client and session, contending for one mutex in a loop, and
//! checking the invariants of its own acquisitions and holds.

use std::time::Duration;

use tokio::time::Instant;

use super::{LOSS_BOUND, NAME, Rng, World, sleep};
use crate::client::Client;
use crate::recipes::mutex::MutexGuard;
use crate::session::Session;
use crate::support::error::Error;

/// An error's kind for the trace (its text names endpoints, which differ between runs).
fn kind(e: &Error) -> &'static str {
    if e.is_wait_timeout() {
        "wait timeout"
    } else if e.is_session_lost() {
        "session lost"
    } else if e.is_lost() {
        "lock lost"
    } else if e.is_timeout() {
        "request timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_retryable() {
        "unavailable"
    } else {
        "other"
    }
}

pub(super) fn process(world: &World, p: usize, seed: u64) {
    let me = format!("p{p}");
    let mut rng = Rng(seed);
    let client = match Client::builder()
        .endpoints(world.cluster.endpoints())
        .request_timeout(Duration::from_secs(1))
        .connect()
    {
        Ok(client) => client,
        Err(e) => return world.violation(&me, format!("cannot connect: {e}")),
    };
    let mut session: Option<Session> = None;
    while !world.stop.load(std::sync::atomic::Ordering::SeqCst) {
        let live = match &session {
            Some(s) if s.is_alive() => s.clone(),
            _ => match client.session_builder().ttl(Duration::from_secs(3)).start() {
                Ok(s) => {
                    world.note(&me, format!("session {:x}", s.lease_id()));
                    session = Some(s.clone());
                    s
                }
                Err(e) => {
                    world.note(&me, format!("session: {}", kind(&e)));
                    sleep(rng.millis(50, 300));
                    continue;
                }
            },
        };
        // Half the processes take over from an ended holder only after a lock-delay.
        let delay = if p % 2 == 1 {
            rng.millis(0, 2000)
        } else {
            Duration::ZERO
        };
        let mutex = match live.mutex(NAME).and_then(|m| m.lock_delay(delay)) {
            Ok(mutex) => mutex,
            Err(e) => return world.violation(&me, format!("mutex: {e}")),
        };
        // Short waits give up and queue again; long ones must be served (liveness).
        let limit = if rng.below(2) == 0 {
            rng.millis(100, 3000)
        } else {
            rng.millis(5000, 15000)
        };
        world
            .log()
            .waiting
            .insert(p, (live.lease_id(), Instant::now(), limit));
        let locked = mutex.lock_timeout(limit);
        world.log().waiting.remove(&p);
        match locked {
            Ok(guard) => hold(world, &me, p, (guard, &live), &mut rng),
            Err(e) => {
                world.note(&me, format!("lock: {}", kind(&e)));
                if kind(&e) == "lock lost" && live.is_alive() && !world.deletion_explained() {
                    world.violation(&me, "a wait lost its key, and nobody deleted it".into());
                }
                sleep(rng.millis(0, 200));
            }
        }
    }
}

/// Whether the store holds `key` with create revision `token`.
fn present(world: &World, key: &str, token: i64) -> bool {
    world
        .cluster
        .keys(&format!("{NAME}/"))
        .iter()
        .any(|(k, rev)| k == key && *rev == token)
}

fn hold(
    world: &World,
    me: &str,
    p: usize,
    (guard, session): (MutexGuard, &Session),
    rng: &mut Rng,
) {
    let key = guard.key_str().into_owned();
    let token = guard.fencing_token();
    // Rule 4: the proof is still true when the guard is returned.
    let keys = world.cluster.keys(&format!("{NAME}/"));
    match keys.iter().min_by_key(|(_, rev)| *rev) {
        Some((oldest, rev)) if *oldest == key && *rev == token => {}
        other => world.violation(
            me,
            format!("lock returned {key} token {token}, but the oldest key is {other:?}"),
        ),
    }
    {
        let mut log = world.log();
        // Rule 1: no other live guard has its key in the store.
        let others: Vec<String> = log
            .holders
            .iter()
            .filter(|(other, (k, t))| **other != p && keys.iter().any(|(kk, r)| kk == k && r == t))
            .map(|(other, (k, _))| format!("p{other} ({k})"))
            .collect();
        if !others.is_empty() {
            drop(log);
            world.violation(
                me,
                format!("holds {key} while {} hold too", others.join(", ")),
            );
            log = world.log();
        }
        log.holders.insert(p, (key.clone(), token));
        log.outcome.acquisitions += 1;
    }
    world.note(me, format!("acquired {key} token {token}"));
    let until = Instant::now() + rng.millis(0, 500);
    let mut gone_since: Option<Instant> = None;
    loop {
        if !guard.is_held() {
            world.note(me, "lost".into());
            if session.is_alive() && !world.deletion_explained() {
                world.violation(me, format!("lost {key}, and nobody deleted it"));
            }
            break;
        }
        if !present(world, &key, token) {
            let since = *gone_since.get_or_insert_with(Instant::now);
            // Rule 2: a guard follows its key within the bound.
            if Instant::now().duration_since(since) > LOSS_BOUND {
                world.violation(me, format!("still held {LOSS_BOUND:?} after {key} went"));
                break;
            }
        } else if Instant::now() >= until {
            break;
        }
        sleep(Duration::from_millis(50));
    }
    world.log().holders.remove(&p);
    match guard.release() {
        Ok(()) => world.note(me, "released".into()),
        Err(e) => world.note(me, format!("release: {}", kind(&e))),
    }
}
