//! Liveness, checked every 100 ms of virtual time (rule 5): a wait ends within its limit
//! and [`WAIT_SLACK`]; a waiting process whose key holds in the store (its turn has come)
//! for [`TURN_BOUND`], with no fault in progress or just over, has returned with a guard.
//! Its lock-delay adds to that bound only when something excuses it ([`delay_owed`]): a
//! lease under its name expired, a fault may have failed its lease readings, or a lease
//! ahead ended right after it joined. Otherwise, with every request answered, it owes
//! its guard within [`PROMPT`]: a delay applied after a release or a revoke breaks that
//! (issue 48, item 4).

use std::time::Duration;

use tokio::time::Instant;

use super::World;
use super::kinds::{admitted, line, own_key};

/// How long past its limit a wait may take to return (a request timeout, a failover).
pub(crate) const WAIT_SLACK: Duration = Duration::from_secs(3);

/// How long a waiter's turn may have come, with no fault in progress or just over,
/// before its wait returns: a request cut by the last fault times out after 1 s, and the
/// retry or failover that follows takes another.
pub(crate) const TURN_BOUND: Duration = Duration::from_millis(2500);

/// How soon a waiter with an unexcused lock-delay returns once its turn came, when no
/// fault has been near its wait: a few round trips (its watch event, the check that our
/// key is still there).
pub(crate) const PROMPT: Duration = Duration::from_millis(1000);

/// How long after a wait began a lease ahead may end and still go unread by the wait
/// (its enqueue, then its first lookup): such an end may cost the delay (the documented
/// corner of `ownership/delay.rs`).
const CORNER: Duration = Duration::from_secs(1);

/// How long after a fault ended its requests may still fail (a request timeout, the
/// retry's backoff, a reconnect).
const AFTERMATH: Duration = Duration::from_secs(3);

pub(super) async fn liveness(world: std::sync::Arc<World>) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = Instant::now();
        let calm = world.calm_since();
        let mut broken = Vec::new();
        let waiting: Vec<(usize, super::Waiting)> = world
            .log()
            .waiting
            .iter()
            .map(|(p, w)| (*p, w.clone()))
            .collect();
        for (p, w) in waiting {
            if now.duration_since(w.since) > w.limit + WAIT_SLACK {
                broken.push((
                    p,
                    format!(
                        "still waiting {:?} after a wait of {:?}",
                        WAIT_SLACK, w.limit
                    ),
                ));
                continue;
            }
            let name = w.kind.name();
            let keys = line(&world, name);
            let ours = own_key(&keys, w.kind, w.lease);
            // A waiter holds nothing, so any other key of its lease under the name is a
            // leftover (of a restart, an attempt applied late): it must not keep the
            // waiter (and everyone behind) from its turn.
            let lease = format!("{name}/{:x}", w.lease);
            let keys: Vec<(String, i64)> = keys
                .into_iter()
                .filter(|(k, _)| Some(k) == ours.as_ref() || !is_of_lease(k, &lease))
                .collect();
            let holds = ours.and_then(|key| admitted(&keys, &key, w.kind)) == Some(true);
            let mut log = world.log();
            let Some(entry) = log.waiting.get_mut(&p) else {
                continue;
            };
            entry.admitted_since = match (holds, entry.admitted_since) {
                (true, Some(since)) => Some(since),
                (true, None) => Some(now),
                (false, _) => None,
            };
            let bound = if w.delay.is_zero() {
                TURN_BOUND
            } else if delay_owed(&world, &w) {
                TURN_BOUND + w.delay
            } else {
                PROMPT
            };
            if let (Some(turn), Some(calm)) = (entry.admitted_since, calm)
                && now.duration_since(turn.max(calm)) > bound
            {
                broken.push((
                    p,
                    format!(
                        "its {:?} key has held in the store for {bound:?} (its lock-delay of \
                         {:?} {}), and it still waits",
                        w.kind,
                        w.delay,
                        if bound == PROMPT {
                            "not owed: no lease under its name expired"
                        } else {
                            "included"
                        }
                    ),
                ));
            }
        }
        for (p, what) in broken {
            world.violation(&format!("p{p}"), what);
            // Once per wait: forget it.
            world.log().waiting.remove(&p);
        }
    }
}

/// Whether `w`'s lock-delay may run: a lease with a key under its name expired since it
/// began (the loss the delay is for), a fault that may fail requests was near it (its
/// lease readings, its proof that a holder's lease was alive, may be missing), or such a
/// lease ended (revoked) within [`CORNER`] of its start.
fn delay_owed(world: &World, w: &super::Waiting) -> bool {
    let impaired = world
        .impaired_until()
        .is_some_and(|until| until + AFTERMATH >= w.since);
    if impaired {
        return true;
    }
    let prefix = format!("{}/", w.kind.name());
    let state = world.cluster.shared.lock();
    state.leases.ends_since(w.since).any(|end| {
        end.keys.iter().any(|key| key.starts_with(&prefix))
            && (end.expired || end.at.duration_since(w.since) <= CORNER)
    })
}

/// Whether `key` is one of `<name>/<lease hex>` (in any mode).
fn is_of_lease(key: &str, lease: &str) -> bool {
    key.strip_prefix(lease)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}
