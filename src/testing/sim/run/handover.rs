//! Leaders that hand their leadership to a waiting candidate instead of resigning
//! ([`RunConfig::handovers`](super::RunConfig::handovers), issue 53), and what is judged
//! of it: the successor's `campaign` returns a guard over the old leader's key on its own
//! lease (checked as every guard is, by `enters` and `watch`), the old guard no longer
//! leads, and the history records the hold going on on the successor's lease
//! ([`What::HandOver`]), which the outside judge (`tests/fenced`) checks. A failed
//! hand-over is owed its reason ([`unowed`]), and one to a candidate that waited all along
//! in a calm cluster is owed in time ([`late`]).

use std::time::Duration;

use tokio::time::Instant;

use super::history::What;
use super::holding::release;
use super::kinds::{Kind, kind, lease_of_key, present};
use super::{Rng, World};
use crate::ownership::handover::reason;
use crate::recipes::guard::{Guard, LeaderKind};
use crate::recipes::holder::Holder;
use crate::session::Session;
use crate::support::cancel::WaitOptions;
use crate::support::error::Error;

/// Ends a leadership: a third of the time, when another session's candidate waits next in
/// line, by a hand-over to it (whose token must exceed ours: `leads_after`); else (and if
/// the hand-over fails) by a resignation. Drawn from a stream of its own.
pub(super) fn hand_over_or_release(
    world: &World,
    me: &str,
    session: &Session,
    guard: Guard<LeaderKind>,
) {
    let token = super::judge::created(&guard);
    let draw = Rng(token as u64 ^ 0x4a0d).below(3);
    let name = Kind::Lead.name();
    let lease = guard.held.lease_id();
    let status = match (world.handovers && draw == 0, session.election(name)) {
        (true, Ok(election)) => election.status().ok(),
        _ => None,
    };
    // Only when another session's candidate waits first; the hand-over itself finds the
    // first in line (`hand_over_next`): `to`'s key may have gone and come back behind
    // another waiter since this read, and a hand-over by its name would pass that one over.
    let to = status.and_then(|s| s.waiters.into_iter().next());
    let to = to.filter(|w| w.lease != lease && w.lease != 0);
    let Some(to) = to.filter(|_| guard.is_held()) else {
        return release(world, me, Kind::Lead, guard);
    };
    let first_ask = world.log().asked.insert(to.key.clone());
    let called = world.tick();
    let limit = Duration::from_millis(200 + (token as u64 % 5) * 300);
    let began = Instant::now();
    let owed = owed_in_time(world, &to, limit);
    world.log().outcome.handovers_owed_in_time += u64::from(owed);
    // A nemesis waiting for a hand-over runs first, once this process yields.
    world.handover_faults.1.notify_waiters();
    match guard.hand_over_next_with(WaitOptions::new().timeout(limit)) {
        Ok(next) => {
            let handed = What::HandOver {
                token,
                lease: next.lease,
            };
            world.record(me, Some(name), handed, (called, true));
            world.log().outcome.handovers += 1;
            world.note(me, format!("handed over to {}", next.value_str()));
            if guard.is_held() {
                world.violation(me, "still leads after handing over".into());
            }
            if next.key != guard.key() || next.lease == lease || next.lease == 0 {
                let what = format!("handed over to {next:?}, from lease {lease:x}");
                world.violation(me, what);
            }
            drop(guard); // deletes nothing: the key is the successor's
        }
        Err(e) => {
            world.note(me, format!("hand-over: {}", kind(&e)));
            if e.is_lost() {
                // The adoption may have been on its way (it may apply, or not), or have
                // applied unheard, its successor gone before the retry read it back.
                // To whoever first led with our key since the call (it may have been handed
                // on again before this error came), else its lease now, else `to`'s.
                let went = first_successor(world, token, lease, called)
                    .or_else(|| lease_of_key(world, guard.key()))
                    .filter(|&l| l != lease && l != 0);
                let handed = What::HandOver {
                    token,
                    lease: went.unwrap_or(to.lease),
                };
                world.record(me, Some(name), handed, (called, false));
            } else if let Some(what) = unowed(world, &e, &to, first_ask) {
                world.violation(me, what);
            } else if let Some(what) = late(world, &e, &to, began).filter(|_| owed) {
                world.violation(me, what);
            } else if e.is_hand_over_failed() && !guard.is_held() && session.is_alive() {
                // A failed hand-over keeps the leader, unless its key went meanwhile.
                if lease_of_key(world, guard.key()) == Some(lease) {
                    world.violation(me, format!("a failed hand-over ended the leadership: {e}"));
                }
            }
            release(world, me, Kind::Lead, guard);
        }
    }
}

/// The lease of the first other session whose campaign returned leading with the key of
/// `token` since `called`: the successor of a hand-over whose answer came late.
fn first_successor(world: &World, token: i64, ours: i64, called: u64) -> Option<i64> {
    let log = world.log();
    log.outcome
        .history
        .iter()
        .filter(|op| op.name == Some(Kind::Lead.name()))
        .filter_map(|op| match op.what {
            What::Acquire {
                lease, token: t, ..
            } if t == token && lease != ours => {
                op.returned.filter(|&at| at >= called).map(|at| (at, lease))
            }
            _ => None,
        })
        .min()
        .map(|(_, lease)| lease)
}

/// Why the failure `e` of a hand-over to `to` was not owed, if it was not: refused as
/// another hand-over's when none was ever asked for that candidate key (a retry that met
/// its own request: issue 52's first hand-over defect), or because the candidate was gone
/// while its key still stands with the create revision it waited with (the key, and so its
/// lease, stood all along). Other reasons (a limit, a changed or deleted request or value)
/// are not judged.
fn unowed(world: &World, e: &Error, to: &Holder, first_ask: bool) -> Option<String> {
    let Error::HandOverFailed { reason, .. } = e else {
        return None;
    };
    let key = String::from_utf8_lossy(&to.key);
    let stands = || present(world, Kind::Lead.name(), &key, to.create_revision);
    let wrong = match reason.as_str() {
        reason::ANOTHER => first_ask,
        reason::NO_CANDIDATE | reason::SESSION_ENDED => stands(),
        _ => false,
    };
    wrong.then(|| format!("a hand-over to {key} failed ({reason}) without cause"))
}

/// The shortest limit a hand-over is judged by: a request, the candidate's watch event (up
/// to 100 ms late from an unsynced watcher), its answer, the leader's event, a read and the
/// adoption, a few milliseconds each in a calm cluster.
const OWED_WITHIN: Duration = Duration::from_millis(1000);

/// How long before a hand-over began the last fault that may fail or delay requests must
/// have ended for it to be judged: a write applied late up to 2.5 s after, a request cut by
/// the fault timing out after 1 s.
const AFTERMATH: Duration = Duration::from_secs(3);

/// How long before a hand-over began any other fault (an operator's delete or revoke,
/// watchers made unsynced) must have ended: the watch streams it broke are open again.
const SETTLED: Duration = Duration::from_secs(1);

/// Whether a hand-over to `to` with `limit`, beginning now, is owed in time: a limit of at
/// least [`OWED_WITHIN`], no fault now or just before ([`calm_since`]), and the candidate's
/// process waiting for the leadership with no cancel token and its own limit past ours.
fn owed_in_time(world: &World, to: &Holder, limit: Duration) -> bool {
    let now = Instant::now();
    let until = now + limit + Duration::from_secs(1);
    limit >= OWED_WITHIN && calm_since(world, now) && waits(world, to, (now, until))
}

/// No fault ran since `from` less [`SETTLED`], none that may fail requests since `from`
/// less the [`AFTERMATH`], and none runs now.
fn calm_since(world: &World, from: Instant) -> bool {
    world.calm_since().is_some_and(|c| c + SETTLED <= from)
        && world.impaired_until().is_none_or(|i| i + AFTERMATH < from)
}

/// `to`'s process waits for the leadership, since `from` or before, with no cancel token,
/// and its limit ends after `until`.
fn waits(world: &World, to: &Holder, (from, until): (Instant, Instant)) -> bool {
    world.log().waiting.values().any(|w| {
        w.lease == to.lease
            && w.kind == Kind::Lead
            && !w.cancellable
            && w.since <= from
            && w.since + w.limit > until
    })
}

/// Why a hand-over owed in time (from `began`) that ran out of its limit was not excused,
/// if it was not: the candidate still waits, its lease did not end, its key stands with
/// the create revision it waited with, and no fault began meanwhile.
fn late(world: &World, e: &Error, to: &Holder, began: Instant) -> Option<String> {
    let Error::HandOverFailed { reason, .. } = e else {
        return None;
    };
    if !reason.starts_with(reason::NOT_TAKEN_WITHIN) {
        return None;
    }
    let key = String::from_utf8_lossy(&to.key);
    let stands = present(world, Kind::Lead.name(), &key, to.create_revision);
    let lived = !world
        .cluster
        .shared
        .lock()
        .leases
        .ends_since(began)
        .any(|end| end.lease == to.lease);
    let excused = !calm_since(world, began)
        || !waits(world, to, (began, Instant::now()))
        || !stands
        || !lived;
    (!excused).then(|| {
        format!("a hand-over to {key}, which waited all along in a calm cluster, failed ({reason})")
    })
}
