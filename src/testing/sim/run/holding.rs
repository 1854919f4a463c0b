//! Holding a guard a simulated process took: checking it as it returns (rules 4 and 1,
//! fencing), following its key while it is held (rule 2), now and then ending the session
//! under it, and releasing it, with every step in the run's history.

use std::time::Duration;

use tokio::time::Instant;

use super::history::{Mode, What};
use super::judge::{enters, reports_gone};
use super::kinds::{Kind, PERMITS, kind, present};
use super::requests::{self, Listening};
use super::session_end::{close_under, orphan_under};
use super::{LOSS_BOUND, Rng, World, sleep};
use crate::recipes::guard::{Guard, GuardKind};
use crate::session::Session;

/// Holds a guard just returned a while (see [`watch`]), then releases it.
pub(super) fn hold<K: GuardKind>(
    world: &World,
    (me, p): (&str, usize),
    (what, guard, session, called): (Kind, Guard<K>, &Session, u64),
    rng: &mut Rng,
) {
    hold_and(world, (me, p), (what, guard, session, called), rng, |_| {});
}

/// Like [`hold`], with `first` done with the guard once it was judged as it returned
/// (a leader's proclamation: judged later, a key gone since would be blamed on the wait).
pub(super) fn hold_and<K: GuardKind>(
    world: &World,
    (me, p): (&str, usize),
    (what, guard, session, called): (Kind, Guard<K>, &Session, u64),
    rng: &mut Rng,
    first: impl FnOnce(&Guard<K>),
) {
    watch(
        world,
        (me, p),
        (what, &guard, session, called),
        rng,
        (true, first),
    );
    release(world, me, what, guard);
}

/// Releases a guard and records what the release did.
pub(super) fn release<K: GuardKind>(world: &World, me: &str, what: Kind, guard: Guard<K>) {
    let request = crate::line::request::request_key(what.name().as_bytes(), guard.key());
    let token = super::judge::created(&guard);
    let lease = guard.held.lease_id();
    let called = world.tick();
    let name = Some(what.name());
    match guard.release() {
        Ok(()) => {
            world.note(me, "released".into());
            let released = What::Release {
                token,
                lease,
                deleted: true,
            };
            world.record(me, name, released, (called, true));
            requests::released(world, me, request.as_deref());
        }
        Err(e) => {
            world.note(me, format!("release: {}", kind(&e)));
            // `LockLost`: the key was gone; anything else: it may go, or may have gone.
            let (what, returned) = if e.is_lost() {
                (
                    What::Release {
                        token,
                        lease,
                        deleted: false,
                    },
                    true,
                )
            } else {
                (What::Remove { token }, false)
            };
            world.record(me, name, what, (called, returned));
        }
    }
}

/// Checks a guard just returned (rules 4 and 1, fencing), does `first` with it, then
/// holds it a while, checking that it follows its key (rule 2) and, if `may_close`, now
/// and then closing the session under it.
pub(super) fn watch<K: GuardKind>(
    world: &World,
    (me, p): (&str, usize),
    (what, guard, session, called): (Kind, &Guard<K>, &Session, u64),
    rng: &mut Rng,
    (may_close, first): (bool, impl FnOnce(&Guard<K>)),
) {
    let name = what.name();
    let key = guard.key_str().into_owned();
    let token = super::judge::created(guard);
    // The guard's own lease: a leadership handed over holds a key named after another.
    let lease = guard.held.lease_id();
    let mode = match what {
        Kind::Read => Mode::Shared,
        Kind::Permit => Mode::Permit(PERMITS as u32),
        Kind::Mutex | Kind::Write | Kind::Lead => Mode::Exclusive,
    };
    let acquired = What::Acquire { mode, lease, token };
    world.record(me, Some(name), acquired, (called, true));
    if !enters(world, (me, p), what, (&key, token)) {
        reports_gone(world, me, &key, || guard.is_held());
        return;
    }
    world.note(me, format!("{what:?} {key} token {token}"));
    first(guard);
    // In the runs that ask, half the holds listen, and let go when asked.
    let listening =
        (world.asking && rng.below(2) == 0).then(|| Listening::new(guard.release_requested()));
    let mut lost = false;
    let until = Instant::now() + rng.millis(0, 500);
    // A fifth of the holds end with the session closed under the guard; three in four
    // orphan it instead (the process stops renewing, as a paused one does): its lease
    // expires, and waiters with a lock-delay behind it must wait the delay (a revoked
    // lease hands over at once).
    let mut close_at = (may_close && rng.below(5) == 0)
        .then(|| (Instant::now() + rng.millis(0, 400), rng.below(4) != 0));
    let mut gone_since: Option<Instant> = None;
    let lost_signal = guard.lost();
    loop {
        if let Some((at, orphan)) = close_at
            && Instant::now() >= at
        {
            close_at = None;
            let called = world.tick();
            if orphan {
                orphan_under(world, me, session, guard, &key);
                world.record(me, None, What::EndLease { lease }, (called, false));
            } else {
                let closed = close_under(world, me, session, guard, (name, &key, token));
                world.record(me, None, What::EndLease { lease }, (called, closed));
            }
        }
        if !guard.is_held() {
            lost = true;
            world.note(me, "lost".into());
            super::judge::lost_fires(world, me, &lost_signal);
            // A leader loop's term may run on a session of the loop's own.
            if !session.is_alive() || !may_close {
                world.lease_lost(me, lease);
            }
            // A key adopted after a restart (a campaign keeps its place) may be deleted by
            // a removal of the earlier life that applies late (the guard says so: rule 2
            // holds).
            let late_removal = what == Kind::Lead && world.inherited(p, token);
            if session.is_alive() && !world.deletion_explained() && !late_removal {
                world.violation(me, format!("lost {key}, and nobody deleted it"));
            }
            break;
        }
        world.alive(lease);
        let here = present(world, name, &key, token);
        world.record_now(
            me,
            Some(name),
            What::Observe {
                token,
                present: here,
            },
        );
        if !here {
            // Rule 2 at its sharpest: etcd expired our lease (whatever our clock's rate
            // within the margin), and the guard must have said so before, since another
            // process may hold now. The lease of the guard's key: a leader loop's terms run
            // on a session of the loop's own, not on `session` (seed 1795784949148490: the
            // process's own lease had expired, the term's had not, and an operator deleted
            // the term's key).
            if let Some(at) = expired_at(world, lease)
                && guard.is_held()
            {
                world.violation(
                    me,
                    format!(
                        "still held after etcd expired its lease at {} ms",
                        at.duration_since(world.start).as_millis(),
                    ),
                );
                lost = true;
                break;
            }
            let since = *gone_since.get_or_insert_with(Instant::now);
            // Rule 2: a guard follows its key within the bound, counted from when the
            // cluster can tell it (no fault in progress: a cluster without a leader answers
            // no read).
            let owed = world.calm_since().map(|calm| since.max(calm));
            if owed.is_some_and(|owed| Instant::now().duration_since(owed) > LOSS_BOUND) {
                world.violation(me, format!("still held {LOSS_BOUND:?} after {key} went"));
                lost = true;
                break;
            }
        } else if Instant::now() >= until {
            break;
        }
        if listening
            .as_ref()
            .is_some_and(|l| l.hear(world, me, (&key, token)))
        {
            break; // asked to let go: the caller releases
        }
        sleep(Duration::from_millis(50));
    }
    if let Some(listening) = listening.filter(|_| !lost) {
        listening.settle(world, me, (&key, token));
    }
    world.log().holders.remove(&(p, name));
}

/// When etcd expired `lease` (its TTL ran out), if it did.
fn expired_at(world: &World, lease: i64) -> Option<Instant> {
    let state = world.cluster.shared.lock();
    state
        .leases
        .ends_since(world.start)
        .find(|end| end.lease == lease && end.expired)
        .map(|end| end.at)
}
