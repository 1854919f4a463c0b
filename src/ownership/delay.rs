//! Lock-delay (Chubby's, Consul's): after a wait, if a key ahead of ours went because its
//! lease ended (expired, or revoked) rather than by a release, hold off for the delay
//! before taking over. A holder that was paused (GC, SIGSTOP, a frozen VM) and cannot
//! check fencing tokens gets that long to notice its loss before the next holder starts.
//!
//! The key's name carries its lease id (`<name>/<lease hex>`), so one LeaseTimeToLive per
//! key ahead tells a lease that ended (etcd answers TTL -1, or "lease not found") from a
//! key that was deleted with its lease still alive (a release, a timed-out waiter).
//!
//! Covered: a wait whose key was in the line behind the ended holder's key. Not covered:
//! an acquire that joins after that key is gone (it sees no key ahead; etcd keeps no record
//! of an ended lease). The caller runs [`hold_off`] under `proof::while_ours`, so the
//! delay ends with `LockLost` if our own key is deleted meanwhile.

use std::time::Duration;

use super::Wait;
use crate::client::lease::LeaseState;
use crate::line::mode::Mode;
use crate::line::queue::Ahead;
use crate::support::error::code::Code;
use crate::support::error::operation::Operation;
use crate::support::error::{Error, Result};
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

/// Waits `delay` if a lease of a key in `ahead` has ended, within `wait`'s limit and
/// token, ending early on session loss.
pub(crate) async fn hold_off(
    rpc: &Rpc,
    session: &LeaseState,
    wait: &Wait,
    operation: Operation,
    prefix: &[u8],
    ahead: &Ahead,
    delay: Duration,
) -> Result<()> {
    if delay.is_zero() {
        return Ok(());
    }
    let mut leases: Vec<i64> = ahead
        .keys()
        .filter_map(|key| Mode::lease_of(prefix, key))
        .collect();
    leases.sort_unstable();
    leases.dedup();
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
        "the holder's lease ended without a release: lock-delay"
    );
    wait.bound_alive(operation, session, async {
        tokio::time::sleep(delay).await;
        Ok(())
    })
    .await
}

/// The first of `leases` (at most [`CHECKED`]) that has ended: etcd reports TTL -1 for it,
/// or no longer knows it. A lookup is retried until answered (a leader election must not
/// fail a wait whose turn came).
async fn first_ended(rpc: &Rpc, session: &LeaseState, leases: &[i64]) -> Result<Option<i64>> {
    for &lease in leases.iter().take(CHECKED) {
        let looked_up = session
            .retry_while_alive(|| rpc.lease_time_to_live(lease))
            .await;
        let gone = match looked_up {
            Ok(info) => info.ttl <= 0,
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
