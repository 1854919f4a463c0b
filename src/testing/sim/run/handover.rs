//! Leaders that hand their leadership to a waiting candidate instead of resigning
//! ([`RunConfig::handovers`](super::RunConfig::handovers), issue 53), and what is judged
//! of it: the successor's `campaign` returns a guard over the old leader's key on its own
//! lease (checked as every guard is, by `enters` and `watch`), the old guard no longer
//! leads, and the history records the hold going on on the successor's lease
//! ([`What::HandOver`]), which the outside judge (`tests/fenced`) checks. A failed
//! hand-over is owed its reason ([`unowed`]).

use std::time::Duration;

use super::history::What;
use super::holding::release;
use super::kinds::{Kind, kind, lease_of_key, present};
use super::{Rng, World};
use crate::ownership::handover::reason;
use crate::recipes::guard::{Guard, LeaderKind};
use crate::recipes::holder::Holder;
use crate::session::Session;
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
    // The next in line: then fencing tokens keep growing (a candidate passed over would
    // get a smaller token than its successor's; `tests/handover.rs` passes one over).
    let to = status.and_then(|s| s.waiters.into_iter().next());
    let to = to.filter(|w| w.lease != lease && w.lease != 0);
    let Some(to) = to.filter(|_| guard.is_held()) else {
        return release(world, me, Kind::Lead, guard);
    };
    let first_ask = world.log().asked.insert(to.key.clone());
    let called = world.tick();
    let limit = Duration::from_millis(200 + (token as u64 % 5) * 300);
    // A nemesis waiting for a hand-over runs first, once this process yields.
    world.handover_faults.1.notify_waiters();
    match guard.hand_over_timeout(&to.key, limit) {
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
            if next.key != guard.key() || next.lease != to.lease {
                let what = format!("handed over to {:?}, asked for {:?}", next, to);
                world.violation(me, what);
            }
            drop(guard); // deletes nothing: the key is the successor's
        }
        Err(e) => {
            world.note(me, format!("hand-over: {}", kind(&e)));
            if e.is_lost() {
                // The adoption may have been on its way (it may apply, or not), or have
                // applied unheard, its successor gone before the retry read it back.
                let handed = What::HandOver {
                    token,
                    lease: to.lease,
                };
                world.record(me, Some(name), handed, (called, false));
            } else if let Some(what) = unowed(world, &e, &to, first_ask) {
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
