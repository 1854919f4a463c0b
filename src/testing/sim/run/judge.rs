//! What every simulated hold and wait is judged by, for single names and multi-locks
//! alike: how a wait is bounded, the checks on a guard just returned (rules 4 and 1,
//! fencing), a guard returned after its key went, and a wait that ended on its limit.

use std::time::Duration;

use tokio::time::Instant;

use super::kinds::{Kind, admitted, line, own_key, present, value_of};
use super::{Held, LOSS_BOUND, Rng, World, sleep};
use crate::client::Client;
use crate::recipes::guard::{Guard, LeaderKind};
use crate::session::Session;
use crate::support::cancel::{CancelToken, WaitOptions};

/// How a wait is bounded: its limit and, a third of the time, a cancel token that a task
/// of the simulation cancels at a random moment within it (then `true`).
pub(super) fn options(client: &Client, limit: Duration, rng: &mut Rng) -> (WaitOptions, bool) {
    let options = WaitOptions::new().timeout(limit);
    if rng.below(3) != 0 {
        return (options, false);
    }
    let token = CancelToken::new();
    let at = rng.millis(0, limit.as_millis() as u64);
    let cancel = token.clone();
    client.spawn(async move {
        tokio::time::sleep(at).await;
        cancel.cancel();
    });
    (options.cancel_token(&token), true)
}

/// A wait that ended on its limit or token returns once its key is removed: with no fault
/// since 3 s before it began (no write of it can still apply late), the store has no key
/// of ours under the name.
pub(super) fn left_behind(world: &World, me: &str, session: &Session, what: Kind, since: Instant) {
    let calm = world
        .calm_since()
        .is_some_and(|calm| calm + Duration::from_secs(3) <= since);
    if !calm {
        return;
    }
    let name = what.name();
    if let Some(key) = own_key(&line(world, name), what, session.lease_id()) {
        world.violation(
            me,
            format!("a {what:?} wait ended on its limit or token, and left {key} behind"),
        );
    }
}

/// At the end of a run, with its session alive and every step ended: once the cluster has
/// been calm for [`AT_REST`] (every removal the client owes, answered or retried, has
/// applied by then), no key of its lease is left under any name, but for what a crashed
/// life may have left (created up to `crashed_upto`: before its last restart, or a write
/// of that life applied late, within [`CAUSE_WINDOW`](super::CAUSE_WINDOW) after it; no life of the client can
/// know those). Catches a cleanup given up on a transient error that only the lease's end
/// would have covered.
pub(super) fn none_left_at_rest(world: &World, me: &str, session: &Session, crashed_upto: i64) {
    let give_up = Instant::now() + Duration::from_secs(30);
    while world
        .calm_since()
        .is_none_or(|calm| calm + AT_REST > Instant::now())
    {
        if Instant::now() >= give_up || !session.is_alive() {
            return;
        }
        sleep(Duration::from_millis(100));
    }
    if !session.is_alive() {
        return;
    }
    let lease = session.lease_id();
    for name in Kind::NAMES {
        let ours = format!("{name}/{lease:x}");
        for (key, rev) in line(world, name) {
            // A key named after our lease but bound to another was handed over.
            let handed = super::kinds::lease_of_key(world, key.as_bytes()) != Some(lease);
            if key.starts_with(&ours) && rev > crashed_upto && !handed {
                world.violation(
                    me,
                    format!("{key} (created at {rev}) left behind at rest, its session alive"),
                );
            }
        }
    }
}

/// Rule 2 as a caller that `select!`s on it sees it: once `is_held()` says a hold ended,
/// its `lost()` channel (taken when the hold began) has fired too, within [`LOSS_BOUND`].
pub(super) fn lost_fires(world: &World, me: &str, lost: &crossbeam_channel::Receiver<()>) {
    let by = Instant::now() + LOSS_BOUND;
    while !matches!(
        lost.try_recv(),
        Err(crossbeam_channel::TryRecvError::Disconnected)
    ) {
        if Instant::now() >= by {
            let what =
                format!("is_held() says the hold ended; lost() did not fire in {LOSS_BOUND:?}");
            return world.violation(me, what);
        }
        sleep(Duration::from_millis(50));
    }
}

/// A leader proclaims a new value: a proclamation that returned `Ok` is the key's value in
/// the store (unless the key went since), and one refused as `NotLeader` was refused
/// because the key is not ours any more (after a re-campaign too, whose new value has a
/// new value revision).
/// A third of the leaders proclaim, drawn from a stream of their own (so schedules stay
/// as they were).
pub(super) fn proclaims(world: &World, me: &str, guard: &Guard<LeaderKind>) {
    if Rng(created(guard) as u64 ^ 0x9c1a).below(3) != 0 {
        return;
    }
    let key = guard.key_str().into_owned();
    let token = created(guard);
    let value = format!("{me} proclaims at {}", world.now_ms());
    match guard.proclaim(&value) {
        Ok(()) => match value_of(world, &key) {
            Some(stored) if stored != value.as_bytes() => world.violation(
                me,
                format!(
                    "proclaimed {value:?}; the store has {:?}",
                    String::from_utf8_lossy(&stored)
                ),
            ),
            _ => world.note(me, "proclaimed".into()),
        },
        Err(crate::support::error::Error::NotLeader) => {
            if present(world, Kind::Lead.name(), &key, token) && !world.deletion_explained() {
                world.violation(me, format!("a proclamation refused while {key} holds"));
            }
        }
        Err(e) => world.note(me, format!("proclaim: {}", super::kinds::kind(&e))),
    }
}

/// Campaigns, half the time with a value of this moment (drawn apart, so schedules stay
/// as they were): a life that resumed its lease and finds its earlier life's key there
/// proclaims the new value in place (Go's re-campaign), and the store must have it, and
/// a later proclamation must find the value's revision it wrote.
pub(super) fn campaign(
    world: &World,
    me: &str,
    election: &crate::recipes::election::Election,
    options: WaitOptions,
) -> crate::support::error::Result<Guard<LeaderKind>> {
    let now = world.now_ms();
    let value = if Rng(now as u64 ^ 0x7a11).below(2) == 0 {
        me.to_string()
    } else {
        format!("{me} at {now}")
    };
    let guard = election.campaign_with(&value, options)?;
    re_campaigned_value(world, me, &guard, &value);
    Ok(guard)
}

/// A campaign's (or re-campaign's) value is the key's value in the store (unless the key
/// went since).
pub(super) fn re_campaigned_value(world: &World, me: &str, guard: &Guard<LeaderKind>, value: &str) {
    if let Some(stored) = value_of(world, &guard.key_str())
        && stored != value.as_bytes()
    {
        world.violation(
            me,
            format!(
                "campaigned with {value:?}; the store has {:?}",
                String::from_utf8_lossy(&stored)
            ),
        );
    }
}

/// How long the cluster is calm before [`none_left_at_rest`] looks.
const AT_REST: Duration = Duration::from_secs(5);

/// Checks a guard just returned for `what` with `key` at `token` (rules 4 and 1, fencing)
/// and counts it among the holders; false if it was decided on a lagging member's late
/// events and its key is gone already (see [`reports_gone`]), nothing counted then.
pub(super) fn enters(
    world: &World,
    (me, p): (&str, usize),
    what: Kind,
    (key, token): (&str, i64),
) -> bool {
    let name = what.name();
    // Rule 4: the proof is still true when the guard is returned.
    let keys = line(world, name);
    let created = keys.iter().find(|(k, _)| *k == key).map(|(_, rev)| *rev);
    // A wait decided on a lagging member's late events holds at the revision of those
    // events; a delete of our key after it (by the nemesis) may not have reached that
    // member yet. A documented limit (RELIABILITY, "What it cannot guarantee"): the guard
    // must then say so within the loss bound.
    if created.is_none() && world.lag_recent() && world.deletion_explained() {
        world.note(
            me,
            format!("{what:?} {key} token {token} returned after its key went"),
        );
        return false;
    }
    match admitted(&keys, key, what) {
        Some(true) if created == Some(token) => {}
        other => world.violation(
            me,
            format!(
                "{what:?} returned {key} token {token}, but the store has it at {created:?} \
                 (admitted: {other:?}); the line is {keys:?}"
            ),
        ),
    }
    let adopted = what == Kind::Lead && world.log().last_token.get(name) == Some(&token);
    let log = world.log();
    // Rule 1: the holders whose keys are in the store may hold together.
    let mut together = vec![what];
    let mut others = Vec::new();
    for ((other, _), held) in &log.holders {
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
    // A campaign adopts its session's key (Go's re-campaign after a restart, when a
    // resignation never reached etcd): the same leader, with the same token.
    if what.exclusive_name() && !adopted && last.is_some_and(|last| token <= last) {
        world.violation(me, format!("fencing token {token} after {last:?}"));
    }
    let mut log = world.log();
    log.holders.insert(
        (p, name),
        Held {
            name,
            key: key.to_string(),
            token,
            kind: what,
        },
    );
    if what.exclusive_name() {
        log.last_token.insert(name, token);
    }
    log.outcome.acquisitions += 1;
    true
}

/// A guard returned after its key went (see [`enters`]) must say so within the loss bound.
pub(super) fn reports_gone(world: &World, me: &str, key: &str, is_held: impl Fn() -> bool) {
    let since = Instant::now();
    while is_held() {
        if Instant::now().duration_since(since) > LOSS_BOUND {
            world.violation(me, format!("still held {LOSS_BOUND:?} after {key} went"));
            break;
        }
        sleep(Duration::from_millis(50));
    }
}

/// A wait that ended with `Deadlock` (runs with [`deadlock_detection`]): the cycle it
/// names must be in the store at the revision it names, judged apart from the search that
/// found it. Each step's session has a key in its name's line there that does not hold,
/// and the next session of the ring has a key ahead of it in that line; and the ring
/// closes. A revision compacted since cannot be judged (noted).
///
/// [`deadlock_detection`]: super::RunConfig::deadlock_detection
pub(super) fn judge_deadlock(world: &World, me: &str, e: &crate::support::error::Error) {
    let Some(cycle) = e.deadlock_cycle() else {
        return;
    };
    let crate::support::error::Error::Deadlock { revision, .. } = e else {
        return;
    };
    world.note(me, format!("DEADLOCK at {revision}: {cycle}"));
    let kvs = {
        let state = world.cluster.shared.lock();
        let everything = crate::transport::generated::etcdserverpb::RangeRequest {
            key: vec![0],
            range_end: vec![0],
            revision: *revision,
            keys_only: true,
            ..Default::default()
        };
        match state.store.range_at(&everything, state.store.revision()) {
            Ok(read) => read.kvs,
            Err(_) => {
                return world.note(me, format!("deadlock at {revision}: compacted, not judged"));
            }
        }
    };
    let steps = &cycle.steps;
    let ring = !steps.is_empty()
        && steps
            .iter()
            .zip(steps.iter().cycle().skip(1))
            .all(|(step, next)| step.holder == next.lease);
    if !ring {
        return world.violation(me, format!("Deadlock named no ring: {cycle}"));
    }
    for step in steps {
        let prefix = [step.name.as_slice(), b"/"].concat();
        let mut line: Vec<_> = kvs
            .iter()
            .filter(|kv| kv.key.starts_with(&prefix))
            .collect();
        line.sort_by_key(|kv| kv.create_revision);
        let keys: Vec<Vec<u8>> = line.iter().map(|kv| kv.key.clone()).collect();
        let holding = crate::line::mode::holding(&prefix, &keys);
        let waits = line[holding.min(line.len())..]
            .iter()
            .filter(|kv| kv.lease == step.lease)
            .map(|kv| kv.create_revision)
            .max();
        let ahead = waits.is_some_and(|w| {
            line.iter()
                .any(|kv| kv.lease == step.holder && kv.create_revision < w)
        });
        if !ahead {
            return world.violation(
                me,
                format!("Deadlock named a cycle the store did not have at {revision}: {cycle}"),
            );
        }
    }
}

/// The create revision of the guard's key: what the run's record of holders and its
/// fencing checks follow (a leadership's fencing token is the revision its term began,
/// see [`leads_after`]).
pub(super) fn created<K: crate::recipes::guard::GuardKind>(guard: &Guard<K>) -> i64 {
    guard.held.rev()
}

/// A leadership's fencing token exceeds every earlier leadership's of the name (equals it
/// only for the same key: a resumed lease's earlier life), and is its key's create
/// revision, or for a leadership handed over to it, above it (the key it waited with).
/// The simulation hands over to the first in line only (`hand_over_next`), so nobody is
/// passed over: `hand_over` by name's documented exception (a candidate passed over leads
/// later with a smaller token) does not arise.
pub(super) fn leads_after(world: &World, me: &str, guard: &Guard<LeaderKind>) {
    let name = Kind::Lead.name();
    let token = guard.fencing_token();
    let mut log = world.log();
    let last = log.last_term.insert(name, (token, created(guard)));
    drop(log);
    let stale = |(last, key): (i64, i64)| token < last || (token == last && key != created(guard));
    if last.is_some_and(stale) || token < created(guard) {
        world.violation(
            me,
            format!(
                "leadership token {token} after {last:?} (key created at {})",
                created(guard)
            ),
        );
    }
}
