//! A simulated process: one client and session, taking a mutex, a permit of a semaphore,
//! a read or a write lock, or leadership, in a loop, and checking the invariants of its own
//! acquisitions and holds.

use std::time::Duration;

use tokio::time::Instant;

use super::{Held, LOSS_BOUND, Rng, Waiting, World, sleep};
use crate::client::Client;
use crate::recipes::guard::{Guard, GuardKind};
use crate::session::Session;
use crate::support::error::{Error, Result};

/// How many permits the simulated semaphore has.
const PERMITS: usize = 2;

/// What a process takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Mutex,
    Permit,
    Read,
    Write,
    Lead,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Mutex,
        Kind::Permit,
        Kind::Read,
        Kind::Write,
        Kind::Lead,
    ];

    /// The name it is taken under (reads and writes share one).
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Mutex => "m",
            Kind::Permit => "s",
            Kind::Read | Kind::Write => "r",
            Kind::Lead => "e",
        }
    }

    /// Whether a key of this kind holds with `older` (the keys created before it).
    pub(super) fn admits(self, older: &[&str]) -> bool {
        match self {
            Kind::Mutex | Kind::Write | Kind::Lead => older.is_empty(),
            Kind::Read => older.iter().all(|k| k.ends_with(".shared")),
            Kind::Permit => older.len() < PERMITS,
        }
    }

    /// Whether these holders (their kinds) may hold one name together.
    fn may_share(holders: &[Kind]) -> bool {
        let writers = holders
            .iter()
            .filter(|k| matches!(k, Kind::Mutex | Kind::Write | Kind::Lead))
            .count();
        let permits = holders.iter().filter(|k| **k == Kind::Permit).count();
        (writers == 0 || holders.len() == 1) && permits <= PERMITS
    }

    /// Whether successive holders of the name have growing fencing tokens.
    fn exclusive_name(self) -> bool {
        matches!(self, Kind::Mutex | Kind::Lead)
    }
}

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

/// The keys under `name` with their create revisions, oldest first.
pub(super) fn line(world: &World, name: &str) -> Vec<(String, i64)> {
    let mut keys = world.cluster.keys(&format!("{name}/"));
    keys.sort_by_key(|(_, rev)| *rev);
    keys
}

/// Whether `key` holds in `line` for `kind`; `None` if it is not there.
pub(super) fn admitted(line: &[(String, i64)], key: &str, kind: Kind) -> Option<bool> {
    let at = line.iter().position(|(k, _)| k == key)?;
    let older: Vec<&str> = line[..at].iter().map(|(k, _)| k.as_str()).collect();
    Some(kind.admits(&older))
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
    let mut what = Kind::ALL[rng.below(Kind::ALL.len() as u64) as usize];
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
        let attempt = take_and_hold(world, (&me, p), &live, (what, limit, delay), &mut rng);
        if let Err(e) = attempt {
            world.log().waiting.remove(&p);
            world.note(&me, format!("{what:?}: {}", kind(&e)));
            if kind(&e) == "lock lost" && live.is_alive() && !world.deletion_explained() {
                world.violation(&me, "a wait lost its key, and nobody deleted it".into());
            }
            sleep(rng.millis(0, 200));
        }
    }
}

/// Takes `what` within `limit` and holds it a while (see [`hold`]).
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
    match what {
        Kind::Mutex => {
            let guard = session
                .mutex(name)?
                .lock_delay(delay)?
                .lock_timeout(limit)?;
            got(world);
            hold(world, (me, p), (what, guard, session), rng);
        }
        Kind::Permit => {
            let guard = session
                .semaphore(name, PERMITS as u32)?
                .lock_delay(delay)?
                .acquire_timeout(limit)?;
            got(world);
            hold(world, (me, p), (what, guard, session), rng);
        }
        Kind::Read => {
            let guard = session
                .rwlock(name)?
                .lock_delay(delay)?
                .read_timeout(limit)?;
            got(world);
            hold(world, (me, p), (what, guard, session), rng);
        }
        Kind::Write => {
            let guard = session
                .rwlock(name)?
                .lock_delay(delay)?
                .write_timeout(limit)?;
            got(world);
            hold(world, (me, p), (what, guard, session), rng);
        }
        Kind::Lead => {
            let guard = session.election(name)?.campaign_timeout(me, limit)?;
            got(world);
            hold(world, (me, p), (what, guard, session), rng);
        }
    }
    Ok(())
}

/// Whether the store holds `key` with create revision `token`.
fn present(world: &World, name: &str, key: &str, token: i64) -> bool {
    line(world, name)
        .iter()
        .any(|(k, rev)| k == key && *rev == token)
}

fn hold<K: GuardKind>(
    world: &World,
    (me, p): (&str, usize),
    (what, guard, session): (Kind, Guard<K>, &Session),
    rng: &mut Rng,
) {
    let name = what.name();
    let key = guard.key_str().into_owned();
    let token = guard.fencing_token();
    // Rule 4: the proof is still true when the guard is returned.
    let keys = line(world, name);
    let created = keys.iter().find(|(k, _)| *k == key).map(|(_, rev)| *rev);
    match admitted(&keys, &key, what) {
        Some(true) if created == Some(token) => {}
        other => world.violation(
            me,
            format!(
                "{what:?} returned {key} token {token}, but the store has it at {created:?} \
                 (admitted: {other:?}); the line is {keys:?}"
            ),
        ),
    }
    {
        let log = world.log();
        // Rule 1: the holders whose keys are in the store may hold together.
        let mut together = vec![what];
        let mut others = Vec::new();
        for (other, held) in &log.holders {
            if *other != p
                && held.name == name
                && keys.iter().any(|(k, r)| *k == held.key && *r == held.token)
            {
                together.push(held.kind);
                others.push(format!("p{other} {:?} ({})", held.kind, held.key));
            }
        }
        let last = log.last_token.get(name).copied();
        drop(log);
        if !Kind::may_share(&together) {
            world.violation(
                me,
                format!("{what:?} {key} held with {}", others.join(", ")),
            );
        }
        if what.exclusive_name() && last.is_some_and(|last| token <= last) {
            world.violation(me, format!("fencing token {token} after {last:?}"));
        }
        let mut log = world.log();
        log.holders.insert(
            p,
            Held {
                name,
                key: key.clone(),
                token,
                kind: what,
            },
        );
        if what.exclusive_name() {
            log.last_token.insert(name, token);
        }
        log.outcome.acquisitions += 1;
    }
    world.note(me, format!("{what:?} {key} token {token}"));
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
        if !present(world, name, &key, token) {
            let since = *gone_since.get_or_insert_with(Instant::now);
            // Rule 2: a guard follows its key within the bound, counted from when the
            // cluster can tell it (no fault in progress: a cluster without a leader answers
            // no read).
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
    world.log().holders.remove(&p);
    match guard.release() {
        Ok(()) => world.note(me, "released".into()),
        Err(e) => world.note(me, format!("release: {}", kind(&e))),
    }
}
