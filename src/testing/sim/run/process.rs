//! A simulated process: one client and session, taking a mutex, a permit of a semaphore,
//! a read or a write lock, or leadership, in a loop, and checking the invariants of its own
//! acquisitions and holds.

use std::time::Duration;

use tokio::time::Instant;

use super::history::{Mode, What, lease_of};
use super::judge::{enters, judge_deadlock, left_behind, options, reports_gone};
use super::kinds::{Kind, PERMITS, kind, present};
use super::requests::{self, Listening};
use super::{LOSS_BOUND, Rng, Waiting, World, sleep};
use crate::client::Client;
use crate::recipes::guard::{Guard, GuardKind, LeaderKind};
use crate::session::Session;
use crate::support::error::Result;

/// A client of the simulated cluster, as every process makes one.
fn connect(world: &World) -> Result<Client> {
    let builder = Client::builder()
        .endpoints(world.cluster.endpoints())
        .request_timeout(Duration::from_secs(1))
        .line_tuning(world.line_tuning);
    if world.deadlock_detection {
        builder.deadlock_detection("").connect()
    } else {
        builder.connect()
    }
}

pub(super) fn process(world: &World, p: usize, seed: u64) {
    let me = format!("p{p}");
    let mut rng = Rng(seed);
    let mut client = match connect(world) {
        Ok(client) => client,
        Err(e) => return world.violation(&me, format!("cannot connect: {e}")),
    };
    let mut session: Option<Session> = None;
    // How fast etcd's lease clock runs against this process's (from a stream of its own,
    // so the rest of the schedule draws as before).
    let (slow, fast) = world.clock_rates;
    let rate = slow + (fast - slow) * (Rng(seed ^ 0xc10c).below(1001) as f64 / 1000.0);
    // The lease whose end the history has (a lost session's).
    let mut ended = 0;
    let mut what = Kind::ALL[rng.below(Kind::ALL.len() as u64) as usize];
    // Keys of its lease created up to this revision may be a crashed life's writes, late
    // (a restart resumes the lease; no life can know what the one before had in flight).
    let (mut crashed_upto, mut restarted_at) = (0, None);
    while !world.stop.load(std::sync::atomic::Ordering::SeqCst) {
        if restarted_at.is_some_and(|at: Instant| Instant::now() >= at + super::CAUSE_WINDOW) {
            crashed_upto = world.cluster.revision();
            restarted_at = None;
        }
        // Now and then the process restarts: it leaves its lease behind and takes it back
        // with a new client, keys and all.
        if session.as_ref().is_some_and(Session::is_alive)
            && rng.below(12) == 0
            && let Some(s) = session.take()
        {
            let revision = world.cluster.revision();
            world.log().restarted.insert(p, (Instant::now(), revision));
            (crashed_upto, restarted_at) = (i64::MAX, Some(Instant::now()));
            session = restart(world, &me, &s, &mut client);
        }
        // A session seen lost: its lease may have ended on the server since a guard of it
        // last held (the client's deadline comes before the server's expiry).
        if let Some(lost) = session.as_ref().filter(|s| !s.is_alive())
            && lost.lease_id() != ended
        {
            ended = lost.lease_id();
            world.lease_lost(&me, ended);
        }
        let live = match &session {
            Some(s) if s.is_alive() => s.clone(),
            _ => match client.session_builder().ttl(Duration::from_secs(3)).start() {
                Ok(s) => {
                    world.note(
                        &me,
                        format!("session {:x}, etcd's clock {rate:.3}x ours", s.lease_id()),
                    );
                    world
                        .cluster
                        .shared
                        .lock()
                        .leases
                        .set_rate(s.lease_id(), rate);
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
        // In the runs that ask, a quarter of the steps first ask a name's holders to let go.
        if world.asking && rng.below(4) == 0 {
            let name = Kind::NAMES[rng.below(Kind::NAMES.len() as u64) as usize];
            match requests::ask(world, &client, name) {
                Ok(keys) => world.note(&me, format!("asked {name}: {keys:?}")),
                Err(e) => world.note(&me, format!("ask {name}: {}", kind(&e))),
            }
        }
        // Half the time the same again (a process that takes one name in a loop, whose
        // next key has the name of its last one); else any.
        if rng.below(2) == 0 {
            what = Kind::ALL[rng.below(Kind::ALL.len() as u64) as usize];
        }
        // Short waits give up and queue again; long ones must be served (liveness).
        let limit = if rng.below(2) == 0 {
            rng.millis(100, 3000)
        } else {
            rng.millis(5000, 15000)
        };
        // Half the processes take a lock or permit over from an ended holder only after a
        // lock-delay.
        let delay = if p % 2 == 1 {
            rng.millis(0, 2000)
        } else {
            Duration::ZERO
        };
        // In the runs with multi-locks, a quarter of the steps take two names at once.
        if world.multi_locks && rng.below(4) == 0 {
            let taken =
                super::multi::take_and_hold(world, (&me, p), &live, (limit, delay), &mut rng);
            if let Err(e) = taken {
                world.note(&me, format!("multi: {}", kind(&e)));
            }
            sleep(rng.millis(0, 200));
            continue;
        }
        world.log().waiting.insert(
            p,
            Waiting {
                lease: live.lease_id(),
                kind: what,
                since: Instant::now(),
                limit,
                delay: if what == Kind::Lead {
                    Duration::ZERO
                } else {
                    delay
                },
                admitted_since: None,
            },
        );
        let since = Instant::now();
        let attempt = take_and_hold(world, (&me, p), &live, (what, limit, delay), &mut rng);
        if let Err(e) = attempt {
            world.log().waiting.remove(&p);
            world.note(&me, format!("{what:?}: {}", kind(&e)));
            judge_deadlock(world, &me, &e);
            if (e.is_wait_timeout() || e.is_cancelled() || e.is_deadlock()) && live.is_alive() {
                left_behind(world, &me, &live, what, since);
            }
            // A wait is patient: with its session alive and time left, a failed request
            // (an answer lost, a member down or slow) is retried, never returned (rule 5;
            // issue 48 item 1).
            let waited = Instant::now().duration_since(since);
            if matches!(kind(&e), "unavailable" | "connect" | "request timeout")
                && live.is_alive()
                && waited + Duration::from_secs(1) < limit
            {
                world.violation(
                    &me,
                    format!(
                        "{what:?} wait ended with {} after {waited:?} of its {limit:?}: {e}",
                        kind(&e)
                    ),
                );
            }
            if kind(&e) == "lock lost" && live.is_alive() && !world.wait_loss_explained(p, what) {
                world.violation(&me, "a wait lost its key, and nobody deleted it".into());
            }
            sleep(rng.millis(0, 200));
        }
    }
    // Nothing of a live session is left once the cluster is calm, nor anything at all once
    // the sessions end (checked after every process ended).
    if let Some(live) = session.as_ref().filter(|s| s.is_alive()) {
        let crashed_upto = if restarted_at.is_some() {
            i64::MAX
        } else {
            crashed_upto
        };
        super::judge::none_left_at_rest(world, &me, live, crashed_upto);
    }
    if let Some(session) = session
        && let Err(e) = session.close()
    {
        world.note(&me, format!("close: {}", kind(&e)));
    }
}

/// A restart: orphans `session` (its keep-alive stops, its lease and keys stay), crashes
/// `client` and replaces it, and resumes the lease with the new one.
fn restart(world: &World, me: &str, session: &Session, client: &mut Client) -> Option<Session> {
    let id = session.lease_id();
    // What the old process sent may still apply to the keys it created, late.
    let called = world.tick();
    let upto = world.cluster.revision();
    world.record(me, None, What::Crashed { lease: id, upto }, (called, false));
    session.orphan();
    // The old process dies: nothing of it reaches etcd any more but what is on its way.
    client.kill();
    match connect(world) {
        Ok(new) => *client = new,
        Err(e) => {
            world.violation(me, format!("cannot connect: {e}"));
            return None;
        }
    }
    match client
        .session_builder()
        .ttl(Duration::from_secs(3))
        .resume(id)
        .start()
    {
        Ok(resumed) if resumed.lease_id() == id => {
            world.note(me, format!("restarted, resumed {id:x}"));
            Some(resumed)
        }
        Ok(other) => {
            world.violation(me, format!("resumed {id:x}, got {:x}", other.lease_id()));
            None
        }
        Err(e) => {
            world.note(me, format!("restarted, resume {id:x}: {}", kind(&e)));
            let called = world.tick();
            world.record(me, None, What::EndLease { lease: id }, (called, false));
            None
        }
    }
}

/// Takes `what` within `limit` (and maybe a cancel) and holds it a while (see [`hold`]).
fn take_and_hold(
    world: &World,
    (me, p): (&str, usize),
    session: &Session,
    (what, limit, delay): (Kind, Duration, Duration),
    rng: &mut Rng,
) -> Result<()> {
    let name = what.name();
    let got = |world: &World| {
        world.log().waiting.remove(&p);
    };
    let options = options(session.client(), limit, rng);
    let called = world.tick();
    match what {
        Kind::Mutex => {
            let guard = session.mutex(name)?.lock_delay(delay)?.lock_with(options)?;
            got(world);
            hold(world, (me, p), (what, guard, session, called), rng);
        }
        Kind::Permit => {
            let guard = session
                .semaphore(name, PERMITS as u32)?
                .lock_delay(delay)?
                .acquire_with(options)?;
            got(world);
            hold(world, (me, p), (what, guard, session, called), rng);
        }
        Kind::Read => {
            let guard = session
                .rwlock(name)?
                .lock_delay(delay)?
                .read_with(options)?;
            got(world);
            hold(world, (me, p), (what, guard, session, called), rng);
        }
        Kind::Write => {
            let guard = session
                .rwlock(name)?
                .lock_delay(delay)?
                .write_with(options)?;
            got(world);
            hold(world, (me, p), (what, guard, session, called), rng);
        }
        Kind::Lead if world.leader_loops && rng.below(4) == 0 => {
            got(world);
            let run_for = rng.millis(500, 4000);
            world.note(me, "leader loop".into());
            // A term's campaign ran inside the loop, since the previous term ended.
            let mut since = world.tick();
            let term = |leadership: &Guard<LeaderKind>| {
                watch(
                    world,
                    (me, p),
                    (what, leadership, session, since),
                    rng,
                    false,
                );
                // The loop resigns after the term, out of the run's sight.
                let token = leadership.fencing_token();
                since = world.tick();
                world.record(
                    me,
                    Some(what.name()),
                    What::Remove { token },
                    (since, false),
                );
            };
            match super::leader_loop::lead(session, name, (me, run_for), term) {
                Ok(terms) => world.note(me, format!("leader loop stopped after {terms} term(s)")),
                Err(e) => world.note(me, format!("leader loop: {}", kind(&e))),
            }
        }
        Kind::Lead => {
            let guard = super::judge::campaign(world, me, &session.election(name)?, options)?;
            got(world);
            let guard = if rng.below(3) == 0 {
                re_campaign(world, me, session, guard, limit)
            } else {
                Some(guard)
            };
            if let Some(guard) = guard {
                super::judge::proclaims(world, me, &guard);
                hold(world, (me, p), (what, guard, session, called), rng);
            }
        }
    }
    Ok(())
}

/// Campaigns again on the same session and name while leading (Go's re-campaign: same
/// key, new value). The new guard is the only live one: the old one says it is not held.
/// A re-campaign that fails (the key went meanwhile) ends the old leadership too.
fn re_campaign(
    world: &World,
    me: &str,
    session: &Session,
    old: Guard<LeaderKind>,
    limit: Duration,
) -> Option<Guard<LeaderKind>> {
    let called = world.tick();
    let again = session
        .election(Kind::Lead.name())
        .and_then(|election| election.campaign_timeout(format!("{me}+"), limit));
    match again {
        Ok(new) => {
            world.note(me, format!("re-campaigned, token {}", new.fencing_token()));
            let acquired = What::Acquire {
                mode: Mode::Exclusive,
                lease: lease_of(&new.key_str()).unwrap_or_default(),
                token: new.fencing_token(),
            };
            world.record(me, Some(Kind::Lead.name()), acquired, (called, true));
            if old.is_held() && new.is_held() {
                world.violation(me, format!("two live guards over {}", new.key_str()));
            }
            if new.fencing_token() != old.fencing_token() {
                world.violation(
                    me,
                    format!(
                        "a re-campaign moved from token {} to {}",
                        old.fencing_token(),
                        new.fencing_token()
                    ),
                );
            }
            super::judge::re_campaigned_value(world, me, &new, &format!("{me}+"));
            // The old guard is superseded: dropping it must leave the key alone.
            drop(old);
            Some(new)
        }
        Err(e) => {
            world.note(me, format!("re-campaign: {}", kind(&e)));
            None
        }
    }
}

/// Whether the store holds `key` with create revision `token`.
fn hold<K: GuardKind>(
    world: &World,
    (me, p): (&str, usize),
    (what, guard, session, called): (Kind, Guard<K>, &Session, u64),
    rng: &mut Rng,
) {
    watch(world, (me, p), (what, &guard, session, called), rng, true);
    let request = crate::line::request::request_key(what.name().as_bytes(), guard.key());
    let token = guard.fencing_token();
    let called = world.tick();
    let name = Some(what.name());
    match guard.release() {
        Ok(()) => {
            world.note(me, "released".into());
            let released = What::Release {
                token,
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

/// Checks a guard just returned (rules 4 and 1, fencing), then holds it a while, checking
/// that it follows its key (rule 2) and, if `may_close`, now and then closing the session
/// under it.
fn watch<K: GuardKind>(
    world: &World,
    (me, p): (&str, usize),
    (what, guard, session, called): (Kind, &Guard<K>, &Session, u64),
    rng: &mut Rng,
    may_close: bool,
) {
    let name = what.name();
    let key = guard.key_str().into_owned();
    let token = guard.fencing_token();
    let lease = lease_of(&key).unwrap_or_default();
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

/// Orphans the session under a held guard (its keep-alive stops; the lease expires on the
/// server a TTL later, keys and all): the guard says so at once.
fn orphan_under<K: GuardKind>(
    world: &World,
    me: &str,
    session: &Session,
    guard: &Guard<K>,
    key: &str,
) {
    session.orphan();
    world.note(me, "orphaned its session".into());
    if guard.is_held() {
        world.violation(
            me,
            format!("{key} still held after its session was orphaned"),
        );
    }
}

/// Closes the session under a held guard: the guard says so at once, and once the close
/// is confirmed (the lease revoked) the key is gone from the store.
fn close_under<K: GuardKind>(
    world: &World,
    me: &str,
    session: &Session,
    guard: &Guard<K>,
    (name, key, token): (&str, &str, i64),
) -> bool {
    let closed = session.close();
    world.note(
        me,
        match &closed {
            Ok(()) => "closed its session".into(),
            Err(e) => format!("close: {}", kind(e)),
        },
    );
    if guard.is_held() {
        world.violation(me, format!("{key} still held after its session closed"));
    }
    if closed.is_ok() && present(world, name, key, token) {
        world.violation(
            me,
            format!("{key} still in the store after its session closed"),
        );
    }
    closed.is_ok()
}
