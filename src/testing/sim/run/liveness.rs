//! Liveness, checked every 100 ms of virtual time (rule 5): a wait ends within its limit
//! and [`WAIT_SLACK`]; a waiting process whose key has been the oldest of the name (its
//! turn has come) for [`TURN_BOUND`], with no fault in progress or just over, has returned
//! with a guard.

use std::time::Duration;

use tokio::time::Instant;

use super::{NAME, World};

/// How long past its limit a wait may take to return (a request timeout, a failover).
pub(crate) const WAIT_SLACK: Duration = Duration::from_secs(3);

/// How long a waiter's turn may have come, with no fault in progress or just over,
/// before its wait returns: a request cut by the last fault times out after 1 s, and the
/// retry or failover that follows takes another.
pub(crate) const TURN_BOUND: Duration = Duration::from_millis(2500);

pub(super) async fn liveness(world: std::sync::Arc<World>) {
    let mut oldest: Option<((String, i64), Instant)> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = Instant::now();
        let keys = world.cluster.keys(&format!("{NAME}/"));
        let first = keys.iter().min_by_key(|(_, rev)| *rev).cloned();
        oldest = match (oldest, first) {
            (Some((key, since)), Some(first)) if key == first => Some((key, since)),
            (_, first) => first.map(|key| (key, now)),
        };
        let log = world.log();
        let mut broken = Vec::new();
        for (p, (lease, since, limit)) in &log.waiting {
            if now.duration_since(*since) > *limit + WAIT_SLACK {
                broken.push((
                    *p,
                    format!(
                        "still waiting {limit:?} + {WAIT_SLACK:?} after lock_timeout({limit:?})"
                    ),
                ));
            }
            if let (Some(((key, _), turn)), Some(calm)) = (&oldest, world.calm_since())
                && key.ends_with(&format!("/{lease:x}"))
                && now.duration_since((*turn).max(calm)) > TURN_BOUND
            {
                broken.push((
                    *p,
                    format!(
                        "its key {key} has been the oldest for {TURN_BOUND:?}, and it still waits"
                    ),
                ));
            }
        }
        drop(log);
        for (p, what) in broken {
            world.violation(&format!("p{p}"), what);
            // Once per wait: forget it.
            world.log().waiting.remove(&p);
        }
    }
}
