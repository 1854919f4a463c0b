//! The faults of a simulated run, drawn from its seed: what production makes every day.

use std::time::Duration;

use tokio::time::Instant;

use super::history::What;
use super::kinds::Kind;
use super::{Rng, World};

pub(super) async fn nemesis(world: &World, rng: &mut Rng, until: Instant) {
    let members = world.cluster.endpoints().len() as u64;
    // The faults aimed at hand-overs draw from a stream of their own.
    let mut aimed = Rng(rng.0 ^ 0x4a0d_fa17);
    while Instant::now() < until {
        // Quiet spells of up to 4 s: long enough for liveness to be owed and checked.
        tokio::time::sleep(rng.millis(100, 4000)).await;
        if world.handover_faults.0
            && aimed.below(3) == 0
            && lost_at_a_hand_over(world, &mut aimed).await
        {
            continue;
        }
        let member = rng.below(members) as usize;
        world.calm(false);
        let pause = rng.millis(100, 1500);
        let fault = match rng.below(13) {
            9 => {
                world.cluster.set_learner(member, true);
                tokio::time::sleep(pause).await;
                world.cluster.set_learner(member, false);
                "learner"
            }
            10 | 11 => {
                // Writes that apply after the client gave up on them and retried: on one
                // member, or on all (a leader whose disk stalls commits every write late).
                let all = rng.below(2) == 0;
                let late: Vec<usize> = if all {
                    (0..members as usize).collect()
                } else {
                    vec![member]
                };
                for &m in &late {
                    world
                        .cluster
                        .set_late_writes(m, Some(rng.millis(1100, 2500)));
                }
                tokio::time::sleep(pause * 2).await;
                for &m in &late {
                    world.cluster.set_late_writes(m, None);
                }
                if all {
                    "late writes, every member"
                } else {
                    "late writes"
                }
            }
            0 => {
                // Half the time every client's streams break first (a network blip), and
                // the periodic compaction runs while all their watchers resume.
                let everywhere = rng.below(2) == 0;
                if everywhere {
                    for m in 0..members as usize {
                        world.cluster.break_connections(m);
                    }
                    tokio::time::sleep(rng.millis(0, 150)).await;
                }
                world.cluster.compact();
                if everywhere {
                    "broken connections everywhere, compaction meanwhile"
                } else {
                    "compaction"
                }
            }
            1 => {
                world.cluster.break_connections(member);
                // Half the time the history is compacted while its clients' watchers are
                // resuming elsewhere (etcd serves a resumed watcher unsynced, for up to
                // 100 ms): they resume from a compacted revision.
                if rng.below(2) == 0 {
                    tokio::time::sleep(rng.millis(0, 150)).await;
                    world.cluster.compact();
                    // Its linearizable reads wait meanwhile (a read index dropped in an
                    // election), while its watchers deliver: the reads that close the
                    // compacted gaps must not hold up any event. A read that came just
                    // before the end still waits its whole pause.
                    world.cluster.set_read_wait(member, Some(pause));
                    tokio::time::sleep(pause).await;
                    world.cluster.set_read_wait(member, None);
                    tokio::time::sleep(pause).await;
                    "broken connections, compaction and waiting reads meanwhile"
                } else {
                    "broken connections"
                }
            }
            2 => {
                // Half the time the history is compacted while the member is down: its
                // clients' watchers then resume from a compacted revision.
                let compact = rng.below(2) == 0;
                world.cluster.set_up(member, false);
                tokio::time::sleep(pause / 2).await;
                if compact {
                    world.cluster.compact();
                }
                tokio::time::sleep(pause / 2).await;
                world.cluster.set_up(member, true);
                if compact {
                    "member restart, compaction meanwhile"
                } else {
                    "member restart"
                }
            }
            3 => {
                world.cluster.set_frozen(member, true);
                tokio::time::sleep(pause).await;
                world.cluster.set_frozen(member, false);
                "frozen member"
            }
            4 => {
                // Half the time the periodic compaction runs during the election, while
                // watchers that lost their streams wait to resume.
                let compact = rng.below(2) == 0;
                world.cluster.set_leader(None);
                tokio::time::sleep(pause).await;
                if compact {
                    world.cluster.compact();
                }
                world.cluster.set_leader(Some(member));
                if compact {
                    "leader election, compaction meanwhile"
                } else {
                    "leader election"
                }
            }
            5 => {
                world.cluster.set_swallow_writes(member, true);
                tokio::time::sleep(pause).await;
                world.cluster.set_swallow_writes(member, false);
                "lost answers"
            }
            // In the runs with downgrades, half the operator deletes are forced releases
            // (the documented way): the holder's key of each name alone, the writer key of
            // a downgradable write without its twin (a downgrade after it must fail).
            6 if world.downgrades && rng.below(2) == 0 => {
                for name in Kind::NAMES {
                    force_release(world, name);
                }
                world.deleted();
                "forced release (each name's oldest key)"
            }
            6 => {
                // Half the time a member's streams break as the keys go, and the periodic
                // compaction runs before its clients' watchers have resumed: the deletes
                // are only in the compacted history.
                let blip = rng.below(2) == 0;
                if blip {
                    world.cluster.break_connections(member);
                }
                for name in ["m", "s", "r", "e"] {
                    world.cluster.delete_prefix(&format!("{name}/"));
                    world.record_now("nemesis", Some(name), What::RemoveAll);
                }
                world.deleted();
                if blip {
                    tokio::time::sleep(rng.millis(0, 50)).await;
                    world.cluster.compact();
                    "operator delete, broken connections and compaction"
                } else {
                    "operator delete"
                }
            }
            7 => {
                let holders: Vec<String> = world
                    .log()
                    .holders
                    .values()
                    .map(|h| h.key.clone())
                    .collect();
                let holder = holders.get(rng.below(holders.len().max(1) as u64) as usize);
                let lease = holder.and_then(|key| {
                    let hex = key.rsplit('/').next()?.split('.').next()?;
                    i64::from_str_radix(hex, 16).ok()
                });
                // Half the time the lease expires instead: its keep-alives go unanswered,
                // as for a holder cut off one way, and waiters with a lock-delay behind it
                // wait the delay (a revoke hands over at once).
                let expire = rng.below(2) == 0;
                match (lease, holder) {
                    (Some(lease), Some(key)) if expire => {
                        // The lease ends some time from now (unanswered: it may, or not).
                        let called = world.tick();
                        world.record("nemesis", None, What::EndLease { lease }, (called, false));
                        world.cluster.starve(lease);
                        world.deleted();
                        // Then, once it expired (TTL 3 s, checked every 500 ms), an
                        // operator deletes the keys under its name: lock-delays in flight
                        // must end with their wait's key.
                        tokio::time::sleep(rng.millis(3500, 5000)).await;
                        if let Some((name, _)) = key.rsplit_once('/') {
                            world.cluster.delete_prefix(&format!("{name}/"));
                            let name = Kind::NAMES.into_iter().find(|n| *n == name);
                            world.record_now("nemesis", name, What::RemoveAll);
                        }
                        world.deleted();
                    }
                    (Some(lease), _) => {
                        world.cluster.revoke(lease);
                        world.record_now("nemesis", None, What::EndLease { lease });
                        world.deleted();
                    }
                    _ => {}
                }
                if expire {
                    "holder's lease left to expire, then its name's keys deleted"
                } else {
                    "holder's lease revoked"
                }
            }
            12 => {
                // A follower behind the leader: late answers and events, and old
                // serializable reads. Short of the loss bound, so that a guard on it still
                // hears of its key's deletion within the bound once the fault is over.
                world.cluster.set_lag(member, Some(rng.millis(100, 700)));
                tokio::time::sleep(pause * 2).await;
                world.cluster.set_lag(member, None);
                world.caught_up();
                "lagging member"
            }
            _ => {
                world.cluster.set_unsynced_every(rng.below(4));
                "unsynced watchers"
            }
        };
        // An operator's delete or revoke fails no request; every other fault may.
        if !matches!(
            fault,
            "operator delete"
                | "forced release (each name's oldest key)"
                | "holder's lease revoked"
                | "holder's lease left to expire, then its name's keys deleted"
                | "unsynced watchers"
        ) {
            world.impaired();
        }
        world.calm(true);
        world.note("nemesis", fault.to_string());
        *world.log().outcome.faults.entry(fault).or_default() += 1;
    }
}

/// Deletes the oldest key under `name` alone (`etcdctl del <key>`), as an operator forces a
/// release; the history has it as a removal of that hold.
fn force_release(world: &World, name: &'static str) {
    if let Some((key, token)) = super::kinds::line(world, name).into_iter().next() {
        super::kinds::delete_key(world, &key);
        world.record_now("nemesis", Some(name), What::Remove { token });
    }
}

/// [`RunConfig::handover_faults`](super::RunConfig::handover_faults): waits up to 4 s for a
/// hand-over to begin, then, before its first request is served, makes every member lose
/// its answers to writes for 20-800 ms (the fault under which issue 52 found a retried
/// request refused as another's). Whether one began.
async fn lost_at_a_hand_over(world: &World, rng: &mut Rng) -> bool {
    let begun = world.handover_faults.1.notified();
    if tokio::time::timeout(Duration::from_secs(4), begun)
        .await
        .is_err()
    {
        return false;
    }
    world.calm(false);
    let members = world.cluster.endpoints().len();
    for m in 0..members {
        world.cluster.set_swallow_writes(m, true);
    }
    tokio::time::sleep(rng.millis(20, 800)).await;
    for m in 0..members {
        world.cluster.set_swallow_writes(m, false);
    }
    world.impaired();
    world.calm(true);
    let fault = "lost answers during a hand-over";
    world.note("nemesis", fault.to_string());
    *world.log().outcome.faults.entry(fault).or_default() += 1;
    true
}
