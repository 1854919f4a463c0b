//! The simulated cluster's leases, on the clock of the runtime that serves it (tokio's: a
//! paused runtime makes it virtual). As in etcd: a TTL below the minimum is raised to it,
//! a renewal restarts the TTL from when the leader handles it, an expired lease is revoked
//! (its keys deleted in one revision) by the leader's periodic check, and a new leader
//! restarts every lease's TTL. A lease may run on a clock of its own ([`Leases::set_rate`]):
//! etcd's clock against its holder's, so that a holder whose clock runs slow sees its
//! lease expire early.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::store::Refusal;

/// etcd's minimum lease TTL with the default raft timings (1.5 election timeouts of 1 s,
/// rounded up to whole seconds).
pub(crate) const MIN_TTL: i64 = 2;

/// etcd's largest lease TTL (`MaxLeaseTTL`).
const MAX_TTL: i64 = 9_000_000_000;

/// How often the leader revokes expired leases (etcd's lessor checks every 500 ms).
pub(crate) const EXPIRY_CHECK: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
struct Lease {
    granted: i64,
    deadline: Instant,
    /// Its keep-alives go unanswered and renew nothing (a holder cut off one way).
    starved: bool,
    /// How fast etcd's clock runs against its holder's: a TTL of `t` seconds lasts `t /
    /// rate` of the run's time, and a remaining TTL is reported in etcd's seconds.
    rate: f64,
}

/// The lease table.
#[derive(Debug)]
pub(crate) struct Leases {
    by_id: BTreeMap<i64, Lease>,
    /// The next id a grant without one gets (etcd derives them from the member id and
    /// time; any positive 63-bit value will do).
    next_id: i64,
    /// Every lease that ended, in order: the run's judge of lock-delays reads it.
    ends: Vec<End>,
}

/// A lease that ended: when, the keys it took with it, and whether it expired (its TTL ran
/// out) or was revoked.
#[derive(Debug, Clone)]
pub(crate) struct End {
    pub(crate) lease: i64,
    pub(crate) at: Instant,
    pub(crate) keys: Vec<String>,
    pub(crate) expired: bool,
}

impl Leases {
    pub(crate) fn new() -> Leases {
        Leases {
            by_id: BTreeMap::new(),
            next_id: 0x694d_7a1b_0000_0001,
            ends: Vec::new(),
        }
    }

    pub(crate) fn exists(&self, id: i64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// Grants a lease (`id` 0: one we choose); returns its id and TTL.
    pub(crate) fn grant(&mut self, id: i64, ttl: i64, now: Instant) -> Result<(i64, i64), Refusal> {
        if ttl > MAX_TTL {
            return Err(Refusal {
                code: tonic::Code::OutOfRange,
                message: "etcdserver: too large lease TTL",
            });
        }
        let id = if id == 0 {
            while self.by_id.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id
        } else if self.by_id.contains_key(&id) {
            return Err(Refusal {
                code: tonic::Code::FailedPrecondition,
                message: "etcdserver: lease already exists",
            });
        } else {
            id
        };
        self.next_id = self.next_id.max(id) + 1;
        let ttl = ttl.max(MIN_TTL);
        self.by_id.insert(
            id,
            Lease {
                granted: ttl,
                deadline: now + secs(ttl),
                starved: false,
                rate: 1.0,
            },
        );
        Ok((id, ttl))
    }

    /// Forgets a lease (the caller deletes its keys); false if there was none.
    pub(crate) fn remove(&mut self, id: i64) -> bool {
        self.by_id.remove(&id).is_some()
    }

    /// Notes that a lease ended at `at` with `keys`, by expiry or by a revoke.
    pub(crate) fn ended(&mut self, lease: i64, at: Instant, keys: Vec<String>, expired: bool) {
        self.ends.push(End {
            lease,
            at,
            keys,
            expired,
        });
    }

    /// Runs `id`'s TTL on a clock `rate` times as fast as its holder's, from its next
    /// renewal on; false if there is no such lease.
    pub(crate) fn set_rate(&mut self, id: i64, rate: f64) -> bool {
        self.by_id
            .get_mut(&id)
            .map(|lease| lease.rate = rate)
            .is_some()
    }

    /// The leases that ended at or after `from`, oldest first.
    pub(crate) fn ends_since(&self, from: Instant) -> impl Iterator<Item = &End> {
        let first = self.ends.partition_point(|end| end.at < from);
        self.ends[first..].iter()
    }

    /// From now on, `id`'s keep-alives go unanswered: it expires at its deadline. False if
    /// there is no such lease.
    pub(crate) fn starve(&mut self, id: i64) -> bool {
        self.by_id
            .get_mut(&id)
            .map(|lease| lease.starved = true)
            .is_some()
    }

    /// Whether `id`'s keep-alives go unanswered ([`Leases::starve`]).
    pub(crate) fn is_starved(&self, id: i64) -> bool {
        self.by_id.get(&id).is_some_and(|lease| lease.starved)
    }

    /// Renews a lease from `now`; its TTL, or `None` if it does not exist or has expired
    /// (etcd answers such a keep-alive with TTL 0).
    pub(crate) fn renew(&mut self, id: i64, now: Instant) -> Option<i64> {
        let lease = self.by_id.get_mut(&id)?;
        if lease.deadline <= now {
            return None;
        }
        lease.deadline = now + lasts(lease.granted, lease.rate);
        Some(lease.granted)
    }

    /// Remaining whole seconds and granted TTL; `None` if it does not exist.
    pub(crate) fn time_to_live(&self, id: i64, now: Instant) -> Option<(i64, i64)> {
        let lease = self.by_id.get(&id)?;
        let left = lease
            .deadline
            .saturating_duration_since(now)
            .mul_f64(lease.rate)
            .as_secs() as i64;
        Some((left, lease.granted))
    }

    /// Leases whose TTL has run out, oldest id first.
    pub(crate) fn expired(&self, now: Instant) -> Vec<i64> {
        self.by_id
            .iter()
            .filter(|(_, lease)| lease.deadline <= now)
            .map(|(id, _)| *id)
            .collect()
    }

    /// A new leader: every lease's TTL starts again from `now`.
    pub(crate) fn restart_all(&mut self, now: Instant) {
        for lease in self.by_id.values_mut() {
            lease.deadline = now + lasts(lease.granted, lease.rate);
        }
    }
}

/// How much of the run's time a TTL of `ttl` etcd seconds lasts on a clock `rate` times as
/// fast as the run's.
fn lasts(ttl: i64, rate: f64) -> Duration {
    secs(ttl).div_f64(rate)
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(0))
}
