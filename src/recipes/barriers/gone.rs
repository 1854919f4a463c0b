//! Waiting until one key is absent: what a [`Barrier`](crate::Barrier) and a
//! [`CountDownLatch`](crate::CountDownLatch) wait for. One read, then the deletes of the
//! key on the client's one watch stream (`transport/watches/`), judged by the watch task:
//! the waiter wakes only when the key's delete arrives. A watcher that starts after what
//! the read saw (the first waiter of the key on this client, a restart after compaction or
//! a failover that found its resume revision compacted) leaves a gap, and one read closes
//! it. Reads are retried until etcd answers: a leader election or a failover does not end
//! a wait; only its bound (limit, token) does. The blocking wait both recipes make of it
//! ([`block_until_absent`]) and their public `wait`, `wait_timeout` and `wait_with`
//! ([`absence_waits`]) are written here once.

use crate::client::Client;
use crate::ownership::Wait;
use crate::support::backoff::Backoff;
use crate::support::error::operation::Operation;
use crate::support::error::{Error, Result};
use crate::support::kv::{KeyValue, Range};
use crate::transport::Rpc;
use crate::transport::watch::{Event, EventKind, Only};
use crate::transport::watches::waiting::{Condition, Wake};
use crate::transport::watches::{Spec, Watches};

/// The blocking wait of a [`Barrier`](crate::Barrier) or a
/// [`CountDownLatch`](crate::CountDownLatch) for its key's absence, within `wait`: a limit
/// too short to wait gets one look (`try_wait`, the recipe's own: `false` is the timeout
/// of `operation`), any other the [`wait_absent`] of `key` with `check`, bounded by
/// `wait`. Returns the revision at which the key was absent, or `None` after one look.
pub(crate) fn block_until_absent(
    client: &Client,
    key: &[u8],
    wait: Wait,
    operation: Operation,
    try_wait: impl FnOnce() -> Result<bool>,
    check: impl Fn(&KeyValue) -> Result<()> + Send,
) -> Result<Option<i64>> {
    wait.check()?;
    if wait.tries_once() {
        // A zero or very short limit: one look, as `try_wait`.
        return match try_wait()? {
            true => Ok(None),
            false => Err(wait.timeout_error(operation)),
        };
    }
    let (rpc, watches) = (client.rpc(), client.watches());
    let at = client.block_on(wait.bound(operation, wait_absent(rpc, watches, key, check)))?;
    Ok(Some(at))
}

/// The three public waits of a recipe that waits for its key's absence
/// ([`Barrier`](crate::Barrier), [`CountDownLatch`](crate::CountDownLatch)), written once:
/// `wait` (no limit), `wait_timeout` and `wait_with`, each the recipe's own
/// `wait_within(Wait)` (which calls [`block_until_absent`]). Used in the recipe's `impl`,
/// each method's docs before its name:
/// `absence_waits! { /// docs  wait; /// docs  wait_timeout; /// docs  wait_with; }`.
macro_rules! absence_waits {
    (
        $(#[$wait:meta])* wait;
        $(#[$timeout:meta])* wait_timeout;
        $(#[$with:meta])* wait_with;
    ) => {
        $(#[$wait])*
        pub fn wait(&self) -> $crate::support::error::Result<()> {
            self.wait_within($crate::ownership::Wait::forever())
        }

        $(#[$timeout])*
        pub fn wait_timeout(
            &self,
            timeout: std::time::Duration,
        ) -> $crate::support::error::Result<()> {
            self.wait_within($crate::ownership::Wait::from_timeout(timeout))
        }

        $(#[$with])*
        pub fn wait_with(
            &self,
            options: impl Into<$crate::support::cancel::WaitOptions>,
        ) -> $crate::support::error::Result<()> {
            self.wait_within($crate::ownership::Wait::from_options(options.into()))
        }
    };
}
pub(crate) use absence_waits;

/// Blocks (asynchronously) until `key` does not exist, and returns a revision at which it
/// did not. `check` judges every version of the key the wait reads (a value that is not
/// what the recipe writes is an error, not a wait that never ends).
pub(crate) async fn wait_absent(
    rpc: &Rpc,
    watches: &Watches,
    key: &[u8],
    check: impl Fn(&KeyValue) -> Result<()>,
) -> Result<i64> {
    let (present, mut known) = read_patiently(rpc, key).await?;
    match present {
        None => return Ok(known),
        Some(kv) => check(&kv)?,
    }
    let mut deletes = watches.wait_for_from(
        Spec::key(key, Only::Deletes),
        known,
        Deleted { after: known },
    );
    loop {
        match deletes.next().await {
            // Every delete after what we read follows: nothing to do.
            Wake::From { after, .. } if after <= known => {}
            // The watcher starts later than our read: a delete in between is not on it.
            Wake::From { .. } => {
                let (present, at) = read_patiently(rpc, key).await?;
                match present {
                    None => return Ok(at),
                    Some(kv) => check(&kv)?,
                }
                known = at;
                deletes.wait_again(known, Deleted { after: known });
            }
            Wake::Verdict(at) => return Ok(at),
            Wake::Failed(e) => return Err(e),
        }
    }
}

/// One linearizable read of `key` and its revision, retried after a transient failure (no
/// endpoint answered, no leader) until etcd answers.
pub(crate) async fn read_patiently(rpc: &Rpc, key: &[u8]) -> Result<(Option<KeyValue>, i64)> {
    let mut backoff = Backoff::quick();
    loop {
        match rpc.read(&Range::key(key)).await {
            Ok(read) => return Ok((read.kvs.into_iter().next(), read.revision)),
            Err(e) if e.is_transient() => {
                tracing::debug!(error = %e, "read not answered; retrying");
                backoff.sleep().await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The key checked for a name: not empty, at most [`MAX_KEY_LEN`] bytes.
pub(crate) fn checked_key(name: &[u8], what: &str) -> Result<Vec<u8>> {
    if name.is_empty() {
        return Err(Error::InvalidArgument(format!("empty {what} name")));
    }
    if name.len() > MAX_KEY_LEN {
        return Err(Error::InvalidArgument(format!(
            "{what} name is {} bytes; at most {MAX_KEY_LEN} are allowed",
            name.len()
        )));
    }
    Ok(name.to_vec())
}

/// The longest name of a barrier or latch (as for locks).
pub(crate) const MAX_KEY_LEN: usize = 4096;

/// What the waiter waits for: a delete of the key after revision `after`.
struct Deleted {
    after: i64,
}

impl Condition for Deleted {
    type Verdict = i64;

    fn apply(&mut self, batch: &[Event]) -> Option<i64> {
        batch
            .iter()
            .find(|e| e.kind == EventKind::Delete && e.kv.mod_revision > self.after)
            .map(|e| e.kv.mod_revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, rev: i64) -> Event {
        Event {
            kind,
            kv: KeyValue {
                key: b"b".to_vec(),
                mod_revision: rev,
                ..Default::default()
            },
        }
    }

    #[test]
    fn only_a_delete_after_the_read_counts() {
        let mut d = Deleted { after: 10 };
        // Old news from the watcher's history, and a put (the barrier raised again).
        assert_eq!(d.apply(&[event(EventKind::Delete, 9)]), None);
        assert_eq!(d.apply(&[event(EventKind::Delete, 10)]), None);
        assert_eq!(d.apply(&[event(EventKind::Put, 11)]), None);
        assert_eq!(
            d.apply(&[event(EventKind::Put, 12), event(EventKind::Delete, 13)]),
            Some(13)
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(checked_key(b"", "barrier").is_err());
        assert!(checked_key(&[b'a'; MAX_KEY_LEN + 1], "barrier").is_err());
        assert_eq!(checked_key(b"x", "barrier").ok(), Some(b"x".to_vec()));
    }
}
