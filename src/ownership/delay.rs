//! Lock-delay (Chubby's, Consul's): after a wait, if a key ahead of ours went because its
//! lease ended (expired, or revoked) rather than by a release, hold off for the delay
//! before taking over. A holder that was paused (GC, SIGSTOP, a frozen VM) and cannot
//! check fencing tokens gets that long to notice its loss before the next holder starts.
//!
//! The key's name carries its lease id (`<name>/<lease hex>`), so one LeaseTimeToLive per
//! key ahead tells a lease that ended (etcd answers TTL -1, or "lease not found") from a
//! key that was deleted with its lease still alive (a release, a timed-out waiter).
//!
//! A lease that ended is not yet an expiry: a holder that releases and then closes its
//! session (a process exiting normally) revokes its lease one round trip after the delete,
//! often before the waiter's lookup (issue 48, item 4). So while it waits, a wait with a
//! delay keeps [`Readings`] of the leases ahead: a TTL answer proves the lease cannot
//! expire before `sent + ttl - safety margin` (etcd only ever extends a deadline: a new
//! leader renews every lease). A key ahead that went while such a proof of its lease still
//! held was released (or deleted), not taken by an expiry, whatever became of its lease
//! later; the wait notes when each key went (`line/crossing.rs`, `Departures`: when a delete
//! crossed it off, or when a read of the wait's place no longer found it; a key whose going
//! it did not see counts as gone when the turn came). So is a key ahead whose lease
//! a lookup sent after the key went still found (even at TTL 0, under a second left): a
//! lease's end deletes its keys as it goes, so the key did not go with it. Each key ahead
//! that goes is therefore followed by a lookup of its lease at once. Only an expiry, the
//! loss a paused or cut-off holder cannot see, costs the delay.
//!
//! Covered: a wait whose key was in the line behind the ended holder's key. Not covered:
//! an acquire that joins after that key is gone (it sees no key ahead; etcd keeps no record
//! of an ended lease). The caller runs [`hold_off`] under `proof::while_ours`, so the
//! delay ends with `LockLost` if our own key is deleted meanwhile.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use super::Wait;
use crate::client::lease::{LeaseState, safety_margin};
use crate::line::crossing::Departures;
use crate::line::mode::Mode;
use crate::line::queue::Ahead;
use crate::support::clock;
use crate::support::error::code::Code;
use crate::support::error::operation::Operation;
use crate::support::error::{Error, Result};
use crate::support::sim::{Mutation, mutation};
use crate::transport::Rpc;

/// The longest lock-delay accepted (Consul's cap), 60 s.
///
/// ```
/// assert_eq!(etcd_sync::MAX_LOCK_DELAY, std::time::Duration::from_secs(60));
/// ```
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);

/// How many keys ahead have their lease looked up: the holders are the oldest keys, and a
/// lock-delay line is short; past this, a long line would pay a request per waiter.
const CHECKED: usize = 16;

/// `delay` if it is within bounds.
pub(crate) fn checked(delay: Duration) -> Result<Duration> {
    if delay > MAX_LOCK_DELAY {
        return Err(Error::InvalidArgument(format!(
            "lock_delay {delay:?} is longer than the maximum of {MAX_LOCK_DELAY:?}"
        )));
    }
    Ok(delay)
}

/// The leases of the keys in `ahead` (at most [`CHECKED`]), each once.
pub(crate) fn leases_ahead(prefix: &[u8], ahead: &Ahead) -> Vec<i64> {
    let mut leases: Vec<i64> = ahead
        .keys()
        .filter_map(|key| Mode::lease_of(prefix, key))
        .collect();
    leases.sort_unstable();
    leases.dedup();
    leases.truncate(CHECKED);
    leases
}

/// What the lookups of each lease ahead showed: until when it cannot expire (from the
/// last TTL etcd reported), and the last instant a lookup was sent that found it.
#[derive(Clone, Default)]
pub(crate) struct Readings(Arc<StdMutex<HashMap<i64, Reading>>>);

#[derive(Clone, Copy, Default)]
struct Reading {
    alive_until: Option<Instant>,
    found_at: Option<Instant>,
}

impl Readings {
    fn record(&self, lease: i64, reading: Reading) {
        if let Ok(mut map) = self.0.lock() {
            let r = map.entry(lease).or_default();
            r.alive_until = r.alive_until.max(reading.alive_until);
            r.found_at = r.found_at.max(reading.found_at);
        }
    }

    /// Whether `lease` was proven unable to expire before `at`.
    fn alive_at(&self, lease: i64, at: Instant) -> bool {
        self.get(lease).alive_until.is_some_and(|until| until > at)
    }

    /// Whether a lookup sent at or after `at` found `lease`: it was not revoked (nor
    /// expired, which revokes) by then, so a key of it that went before `at` did not go
    /// with it.
    fn found_after(&self, lease: i64, at: Instant) -> bool {
        self.get(lease).found_at.is_some_and(|found| found >= at)
    }

    fn get(&self, lease: i64) -> Reading {
        self.0
            .lock()
            .ok()
            .and_then(|map| map.get(&lease).copied())
            .unwrap_or_default()
    }
}

/// How soon an unanswered lookup is tried again.
const RETRY: Duration = Duration::from_millis(200);

/// Looks up `leases` while the wait runs, each again when half of its proven life is
/// used, and each at once when a key ahead went (`departures`): a lookup after the key
/// went that finds its lease proves the key went by a release, not with its lease.
/// Records into `readings`; stops looking at a lease that ended. Never returns: the wait
/// drops it when its turn comes. A failed lookup only leaves a proof missing, which costs
/// a delay, never a wrong handover.
pub(crate) async fn keep_reading(
    rpc: &Rpc,
    leases: Vec<i64>,
    readings: Readings,
    departures: Departures,
) -> Infallible {
    let mut due: HashMap<i64, Instant> = leases.into_iter().map(|l| (l, clock::now())).collect();
    loop {
        let now = clock::now();
        let ready: Vec<i64> = due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(lease, _)| *lease)
            .collect();
        for lease in ready {
            let sent = clock::now();
            match rpc.lease_time_to_live(lease).await {
                // A lease etcd still has: TTL 0 is under a second left (or just past its
                // deadline, not yet revoked), a proof of nothing but that it is there.
                Ok(info) if info.ttl >= 0 => {
                    // etcd truncates the remaining TTL to whole seconds: at least this.
                    let ttl = Duration::from_secs(info.ttl.unsigned_abs());
                    let proven = ttl - safety_margin(ttl).min(ttl);
                    readings.record(
                        lease,
                        Reading {
                            alive_until: (info.ttl > 0).then_some(sent + proven),
                            found_at: Some(sent),
                        },
                    );
                    due.insert(lease, sent + (proven / 2).max(RETRY));
                }
                Ok(_) => {
                    due.remove(&lease);
                }
                Err(Error::Server {
                    code: Code::NotFound,
                    ..
                }) => {
                    due.remove(&lease);
                }
                Err(e) if e.is_transient() => {
                    due.insert(lease, clock::now() + RETRY);
                }
                // Refused (strict auth needs read access to the lease's keys): no proof.
                Err(_) => {
                    due.remove(&lease);
                }
            }
        }
        let next = due.values().min().copied();
        tokio::select! {
            () = async {
                match next {
                    Some(next) => tokio::time::sleep_until(next.into()).await,
                    None => std::future::pending::<()>().await,
                }
            } => {}
            () = departures.one_went() => {
                let now = clock::now();
                due.values_mut().for_each(|at| *at = now);
            }
        }
    }
}

/// What the wait saw of the keys ahead: the [`Readings`] of their leases, when each key
/// went ([`Departures`]), and when the turn came (for a key whose going it did not see).
pub(crate) struct Seen<'a> {
    pub(crate) readings: &'a Readings,
    pub(crate) departures: &'a Departures,
    pub(crate) turn_at: Instant,
}

impl Seen<'_> {
    /// Whether every key of `lease` in `ahead` went while `lease` was proven alive: each
    /// was released (or deleted), not taken by the lease's end.
    fn released(&self, prefix: &[u8], ahead: &Ahead, lease: i64) -> bool {
        ahead
            .keys()
            .filter(|key| Mode::lease_of(prefix, key) == Some(lease))
            .all(|key| {
                let went = self.departures.of(key).unwrap_or(self.turn_at);
                self.readings.alive_at(lease, went) || self.readings.found_after(lease, went)
            })
    }
}

/// Waits `delay` if a lease of a key in `ahead` has expired (ended, with a key of it
/// ahead gone at an instant no reading in `seen` proves it alive at), within `wait`'s
/// limit and token, ending early on session loss.
pub(crate) async fn hold_off(
    rpc: &Rpc,
    session: &LeaseState,
    wait: &Wait,
    operation: Operation,
    (prefix, ahead): (&[u8], &Ahead),
    delay: Duration,
    seen: Seen<'_>,
) -> Result<()> {
    if delay.is_zero() {
        return Ok(());
    }
    let leases: Vec<i64> = leases_ahead(prefix, ahead)
        .into_iter()
        .filter(|lease| {
            mutation(Mutation::DelayOnEveryEnd) || !seen.released(prefix, ahead, *lease)
        })
        .collect();
    // The lookups are part of the wait: bounded by its limit and token, and ended by a
    // session loss, like every other step of it. (Unbounded, a frozen member held a wait
    // of 303 ms for 2.6 s: one request timeout per endpoint.)
    let ended = wait
        .bound_alive(operation, session, first_ended(rpc, session, &leases))
        .await?;
    let Some(lease) = ended else {
        return Ok(());
    };
    tracing::info!(
        lease = %crate::support::kv::LeaseHex(lease),
        ?delay,
        "the holder's lease expired without a release: lock-delay"
    );
    wait.bound_alive(operation, session, async {
        tokio::time::sleep(delay).await;
        Ok(())
    })
    .await
}

/// The first of `leases` that has ended: etcd reports TTL -1 for it, or no longer knows it. A lookup is retried until answered (a leader election must not
/// fail a wait whose turn came).
async fn first_ended(rpc: &Rpc, session: &LeaseState, leases: &[i64]) -> Result<Option<i64>> {
    for &lease in leases {
        let looked_up = session
            .retry_while_alive(|| rpc.lease_time_to_live(lease))
            .await;
        // A lease etcd still has (TTL 0: under a second left) did not take its keys: a
        // lease's end deletes them as it goes.
        let gone = match looked_up {
            Ok(info) => info.ttl < 0,
            Err(Error::Server {
                code: Code::NotFound,
                ..
            }) => true,
            Err(e) => return Err(e),
        };
        if gone {
            return Ok(Some(lease));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_alive_only_until_its_proven_instant() {
        let readings = Readings::default();
        let now = clock::now();
        readings.record(
            7,
            Reading {
                alive_until: Some(now + Duration::from_secs(1)),
                found_at: Some(now),
            },
        );
        assert!(readings.alive_at(7, now));
        assert!(!readings.alive_at(7, now + Duration::from_secs(2)));
        assert!(
            !readings.alive_at(8, now),
            "a lease never read proves nothing"
        );
        assert!(readings.found_after(7, now));
        assert!(!readings.found_after(7, now + Duration::from_millis(1)));
        // A later lookup that found it with under a second left: found, proves no life.
        let later = now + Duration::from_secs(3);
        readings.record(
            7,
            Reading {
                alive_until: None,
                found_at: Some(later),
            },
        );
        assert!(readings.found_after(7, later) && !readings.alive_at(7, later));
    }

    #[test]
    fn the_leases_ahead_are_each_lock_keys_lease_once() {
        let prefix = b"job/".to_vec();
        let keys = [&b"job/1f"[..], b"job/a", b"job/1f.shared", b"job/nested/3"];
        let sorted = Mode::Exclusive
            .sort(&prefix, keys.iter().map(|k| k.to_vec()))
            .expect("one mode");
        let ahead = Ahead {
            keys: sorted,
            complete: true,
            lookout: None,
            last: None,
        };
        // Two keys of lease 0x1f, one of 0xa; the nested name's key is no lock key.
        assert_eq!(leases_ahead(&prefix, &ahead), vec![0xa, 0x1f]);
    }
}
