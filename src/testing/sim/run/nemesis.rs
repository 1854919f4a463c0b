//! The faults of a simulated run, drawn from its seed: what production makes every day.

use tokio::time::Instant;

use super::{Rng, World};

pub(super) async fn nemesis(world: &World, rng: &mut Rng, until: Instant) {
    let members = world.cluster.endpoints().len() as u64;
    while Instant::now() < until {
        // Quiet spells of up to 4 s: long enough for liveness to be owed and checked.
        tokio::time::sleep(rng.millis(100, 4000)).await;
        let member = rng.below(members) as usize;
        world.calm(false);
        let pause = rng.millis(100, 1500);
        let fault = match rng.below(9) {
            0 => {
                world.cluster.compact();
                "compaction"
            }
            1 => {
                world.cluster.break_connections(member);
                "broken connections"
            }
            2 => {
                world.cluster.set_up(member, false);
                tokio::time::sleep(pause).await;
                world.cluster.set_up(member, true);
                "member restart"
            }
            3 => {
                world.cluster.set_frozen(member, true);
                tokio::time::sleep(pause).await;
                world.cluster.set_frozen(member, false);
                "frozen member"
            }
            4 => {
                world.cluster.set_leader(None);
                tokio::time::sleep(pause).await;
                world.cluster.set_leader(Some(member));
                "leader election"
            }
            5 => {
                world.cluster.set_swallow_writes(member, true);
                tokio::time::sleep(pause).await;
                world.cluster.set_swallow_writes(member, false);
                "lost answers"
            }
            6 => {
                world.cluster.delete_prefix(&format!("{}/", super::NAME));
                "operator delete"
            }
            7 => {
                let holder = world.log().holders.values().next().cloned();
                let lease = holder.and_then(|(key, _)| {
                    let hex = key.rsplit('/').next()?;
                    i64::from_str_radix(hex, 16).ok()
                });
                if let Some(lease) = lease {
                    world.cluster.revoke(lease);
                }
                "holder's lease revoked"
            }
            _ => {
                world.cluster.set_unsynced_every(rng.below(4));
                "unsynced watchers"
            }
        };
        world.calm(true);
        world.note("nemesis", fault.to_string());
        *world.log().outcome.faults.entry(fault).or_default() += 1;
    }
}
