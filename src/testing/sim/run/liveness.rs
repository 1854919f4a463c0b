//! Liveness, checked every 100 ms of virtual time (rule 5): a wait ends within its limit
//! and [`WAIT_SLACK`]; a waiting process whose key holds in the store (its turn has come)
//! for [`TURN_BOUND`] and its lock-delay, with no fault in progress or just over, has
//! returned with a guard.

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
            if let (Some(turn), Some(calm)) = (entry.admitted_since, calm)
                && now.duration_since(turn.max(calm)) > TURN_BOUND + w.delay
            {
                broken.push((
                    p,
                    format!(
                        "its {:?} key has held in the store for {TURN_BOUND:?} (+ its lock-delay \
                         of {:?}), and it still waits",
                        w.kind, w.delay
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

/// Whether `key` is one of `<name>/<lease hex>` (in any mode).
fn is_of_lease(key: &str, lease: &str) -> bool {
    key.strip_prefix(lease)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}
