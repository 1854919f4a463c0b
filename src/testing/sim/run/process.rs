//! A simulated process: one client and session, taking a mutex, a permit of a semaphore,
//! a read or a write lock, or leadership, in a loop, and checking the invariants of its own
//! acquisitions and holds.

use std::time::Duration;

use tokio::time::Instant;

use super::history::{Mode, What};
use super::holding::{hold, watch};
use super::judge::{judge_deadlock, left_behind, options};
use super::kinds::{Kind, PERMITS, kind};
use super::requests;
use super::{Rng, Waiting, World, sleep};
use crate::client::Client;
use crate::recipes::guard::{Guard, LeaderKind};
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
                cancellable: false,
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
    let (options, cancellable) = options(session.client(), limit, rng);
    if let Some(waiting) = world.log().waiting.get_mut(&p) {
        waiting.cancellable = cancellable;
    }
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
        // In the runs with downgrades, half the writes may go on as reads.
        Kind::Write if world.downgrades && rng.below(2) == 0 => {
            let rwlock = session.rwlock(name)?.lock_delay(delay)?;
            let guard = rwlock.write_downgradable_with(options)?;
            got(world);
            super::downgrade::hold(world, (me, p), (guard, session, called), rng);
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
                    (false, |_| {}),
                );
                // The loop resigns after the term, out of the run's sight.
                let token = super::judge::created(leadership);
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
            super::judge::leads_after(world, me, &guard);
            got(world);
            let guard = if rng.below(3) == 0 {
                re_campaign(world, me, session, guard, limit)
            } else {
                Some(guard)
            };
            if let Some(guard) = guard {
                let proclaims =
                    |guard: &Guard<LeaderKind>| super::judge::proclaims(world, me, guard);
                let held = (what, &guard, session, called);
                watch(world, (me, p), held, rng, (true, proclaims));
                super::handover::hand_over_or_release(world, me, session, guard);
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
            world.note(
                me,
                format!("re-campaigned, token {}", super::judge::created(&new)),
            );
            let acquired = What::Acquire {
                mode: Mode::Exclusive,
                lease: new.held.lease_id(),
                token: super::judge::created(&new),
            };
            world.record(me, Some(Kind::Lead.name()), acquired, (called, true));
            if old.is_held() && new.is_held() {
                world.violation(me, format!("two live guards over {}", new.key_str()));
            }
            if super::judge::created(&new) != super::judge::created(&old) {
                world.violation(
                    me,
                    format!(
                        "a re-campaign moved from token {} to {}",
                        super::judge::created(&old),
                        super::judge::created(&new)
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
