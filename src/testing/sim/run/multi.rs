//! Several names at once in the simulated workload (in the runs of
//! [`RunConfig::multi_locks`](crate::testing::sim::RunConfig::multi_locks)): a process
//! takes the mutex and a side of the read-write lock together with a `MultiLock`, whose
//! join is one Txn when both are free. Each name's key is judged as a single hold's is
//! (rules 4 and 1, fencing), the guard must follow both keys (rule 2), a wait that ends on
//! its limit leaves no key under either name, and the wait ends within its limit. Nothing
//! may be left once the sessions end, as for every hold.

use std::time::Duration;

use tokio::time::Instant;

use super::judge::{enters, left_behind, options, reports_gone};
use super::kinds::{Kind, kind, present};
use super::liveness::WAIT_SLACK;
use super::{LOSS_BOUND, Rng, World, sleep};
use crate::recipes::locks::multi_lock::{MultiLock, MultiLockMember};
use crate::session::Session;
use crate::support::error::Result;

/// Takes both names within `limit` (maybe cancelled), holds them a while, releases.
pub(super) fn take_and_hold(
    world: &World,
    (me, p): (&str, usize),
    session: &Session,
    (limit, delay): (Duration, Duration),
    rng: &mut Rng,
) -> Result<()> {
    let mutex = session.mutex(Kind::Mutex.name())?.lock_delay(delay)?;
    let rwlock = session.rwlock(Kind::Write.name())?.lock_delay(delay)?;
    let side = if rng.below(2) == 0 {
        Kind::Write
    } else {
        Kind::Read
    };
    let member = match side {
        Kind::Write => MultiLockMember::write(&rwlock),
        _ => MultiLockMember::read(&rwlock),
    };
    let both = MultiLock::new([MultiLockMember::from(&mutex), member])?;
    let kinds = [Kind::Mutex, side];
    let since = Instant::now();
    let (options, _) = options(session.client(), limit, rng);
    let guard = match both.lock_with(options) {
        Ok(guard) => guard,
        Err(e) => {
            world.note(me, format!("multi {side:?}: {}", kind(&e)));
            super::judge::judge_deadlock(world, me, &e);
            ends_in_time(world, me, since, limit);
            if (e.is_wait_timeout() || e.is_cancelled() || e.is_deadlock()) && session.is_alive() {
                for what in kinds {
                    left_behind(world, me, session, what, since);
                }
            }
            return Ok(());
        }
    };
    ends_in_time(world, me, since, limit);
    // Each name's key, as the guard names it.
    let held: Vec<(Kind, String, i64)> = kinds
        .iter()
        .filter_map(|what| {
            let name = what.name().as_bytes();
            let key = guard
                .keys()
                .into_iter()
                .find(|k| k.starts_with(name) && k.get(name.len()) == Some(&b'/'))?;
            let token = guard.fencing_token(name)?;
            Some((*what, String::from_utf8_lossy(key).into_owned(), token))
        })
        .collect();
    if held.len() != kinds.len() {
        world.violation(me, format!("a multi-lock guard names {held:?}"));
        return Ok(());
    }
    let mut entered = Vec::new();
    for (what, key, token) in &held {
        if !enters(world, (me, p), *what, (key, *token)) {
            reports_gone(world, me, key, || guard.is_held());
            leave(world, p, &entered);
            return Ok(());
        }
        entered.push(*what);
    }
    world.note(me, format!("multi {held:?}"));
    {
        let mut log = world.log();
        log.outcome.multi_locks += 1;
        if held.iter().all(|(_, _, token)| *token == held[0].2) {
            log.outcome.multi_locks_in_one_txn += 1;
        }
    }
    let until = Instant::now() + rng.millis(0, 500);
    let mut gone_since: Option<Instant> = None;
    let lost_signal = guard.lost();
    loop {
        if !guard.is_held() {
            world.note(me, "multi lost".into());
            super::judge::lost_fires(world, me, &lost_signal);
            if session.is_alive() && !world.deletion_explained() {
                world.violation(me, format!("lost one of {held:?}, and nobody deleted it"));
            }
            break;
        }
        let gone = held
            .iter()
            .find(|(what, key, token)| !present(world, what.name(), key, *token));
        if let Some((_, key, _)) = gone {
            // Rule 2: the guard follows every key it holds.
            let since = *gone_since.get_or_insert_with(Instant::now);
            let owed = world.calm_since().map(|calm| since.max(calm));
            if owed.is_some_and(|owed| Instant::now().duration_since(owed) > LOSS_BOUND) {
                world.violation(me, format!("still held {LOSS_BOUND:?} after {key} went"));
                break;
            }
        } else if Instant::now() >= until {
            break;
        }
        sleep(Duration::from_millis(50));
    }
    match guard.release() {
        Ok(()) => world.note(me, "multi released".into()),
        Err(e) => world.note(me, format!("multi release: {}", kind(&e))),
    }
    leave(world, p, &entered);
    Ok(())
}

/// A wait ends within its limit and [`WAIT_SLACK`] (rule 5).
fn ends_in_time(world: &World, me: &str, since: Instant, limit: Duration) {
    let took = Instant::now().duration_since(since);
    if took > limit + WAIT_SLACK {
        world.violation(
            me,
            format!("a multi-lock wait of {limit:?} returned after {took:?}"),
        );
    }
}

/// Counts the process out of the holders of the names it held.
fn leave(world: &World, p: usize, held: &[Kind]) {
    let mut log = world.log();
    for what in held {
        log.holders.remove(&(p, what.name()));
    }
}
