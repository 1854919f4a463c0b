//! A count-down latch (Redisson's `RCountDownLatch`, Java's `CountDownLatch` across
//! processes): one key `<name>` whose value is the count left, in decimal. Setting the count
//! creates it (only if absent), each count-down is a compare-and-swap on its mod revision,
//! and the last one deletes it: a wait is a wait for the key's absence (`barriers/gone.rs`).

use crate::client::Client;
use crate::ownership::Wait;
use crate::recipes::barriers::gone::{absence_waits, block_until_absent, checked_key};
use crate::support::error::operation::Operation;
use crate::support::error::{Error, Result};
use crate::support::kv::{Compare, CompareOp, KeyValue, Range, Txn, TxnOp, text};
use crate::transport::{Retry, Rpc};

/// A count-down latch named by a string: the count is set once, each
/// [`count_down`](CountDownLatch::count_down) takes one off, and every
/// [`wait`](CountDownLatch::wait) returns once it reaches zero. Needs no session.
///
/// **Key and values.** The latch is the etcd key `<name>` (no lease), whose value is the
/// count left in decimal (`etcdctl get <name>` shows it). The count-down that reaches zero
/// deletes the key, so "no key" means "open": a latch never set, or already opened, lets
/// every wait through at once (as Redisson's `await` on a count of zero), and a count-down
/// on it does nothing.
///
/// **Concurrent creation.** [`try_set_count`](CountDownLatch::try_set_count) creates the
/// key only if it does not exist (one transaction): of several processes setting the count
/// at once, exactly one does (`Ok(true)`); the others get `Ok(false)` and the count stays
/// the winner's, whatever count they asked for. Once the latch has opened (the key is gone),
/// the next `try_set_count` starts a new latch under the same name.
///
/// **Count-downs are exact.** Each is `if mod_revision(<name>) == what I read then put
/// count - 1` (the last: `delete`), repeated on a conflict, so concurrent count-downs never
/// merge, and a retried or late copy of one never applies twice (its compare fails). A
/// count-down that failed with [`Error::Timeout`] or [`Error::Unavailable`] may or may not
/// have been applied, as for a plain write.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let latch = client.count_down_latch("batch-42/loaded")?;
/// latch.try_set_count(3)?; // the coordinator, before starting 3 loaders
/// // ... each loader, when done: latch.count_down()?;
/// # for _ in 0..3 { latch.count_down()?; }
/// latch.wait()?; // returns once all 3 counted down
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct CountDownLatch {
    client: Client,
    key: Vec<u8>,
}

impl Client {
    /// The count-down latch named `name` (the etcd key `<name>`). No request is sent until
    /// it is used.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `name` is empty or longer than 4096 bytes.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let latch = client.count_down_latch("shards-loaded")?;
    /// assert!(client.count_down_latch("").is_err()); // InvalidArgument
    /// # let _ = latch;
    /// # Ok(()) }
    /// ```
    pub fn count_down_latch(&self, name: impl AsRef<[u8]>) -> Result<CountDownLatch> {
        Ok(CountDownLatch {
            client: self.clone(),
            key: checked_key(name.as_ref(), "latch")?,
        })
    }
}

impl CountDownLatch {
    /// The latch's name (its key).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// assert_eq!(client.count_down_latch("l")?.name(), b"l");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &[u8] {
        &self.key
    }

    /// Sets the count if the latch is not counting yet (its key does not exist): `true` if
    /// this call set it, `false` if a count was set already (it is left unchanged, whatever
    /// `count` is). One transaction.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `count` is zero (a latch of zero is open: do not set
    ///   one).
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer; the write may or
    ///   may not have been applied (call again: `false` then means it was).
    /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused (e.g.
    ///   `PermissionDenied`). [`Error::InsideAsyncRuntime`]: called on an async worker
    ///   thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let latch = client.count_down_latch("l")?;
    /// if !latch.try_set_count(5)? {
    ///     println!("already counting: {} left", latch.count()?);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_set_count(&self, count: u64) -> Result<bool> {
        if count == 0 {
            return Err(Error::InvalidArgument(
                "a latch's count must be at least 1".into(),
            ));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(self.key.clone(), count.to_string())]);
        let rpc = self.client.rpc();
        let set = self
            .client
            .block_on(async { rpc.txn(&txn, Retry::Never).await })?
            .succeeded;
        tracing::debug!(key = %text(&self.key), count, set, "latch count set");
        Ok(set)
    }

    /// The count left now: 0 when the latch is open (never set, or counted down to zero).
    /// One read.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: the key holds something that is not a count (written
    ///   by someone else: this name is not a latch).
    /// * [`Error::Timeout`] / [`Error::Unavailable`], [`Error::Server`],
    ///   [`Error::Authentication`], [`Error::InsideAsyncRuntime`], as for
    ///   [`Client::get`](crate::Client::get).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// println!("{} left", client.count_down_latch("l")?.count()?);
    /// # Ok(()) }
    /// ```
    pub fn count(&self) -> Result<u64> {
        let rpc = self.client.rpc();
        let range = Range::key(&self.key);
        let read = self.client.block_on(async { rpc.read(&range).await })?;
        match read.kvs.first() {
            Some(kv) => parse_count(kv),
            None => Ok(0),
        }
    }

    /// Takes one off the count and returns what is left; the count-down that reaches zero
    /// opens the latch (deletes its key) and returns 0. On an open latch it does nothing
    /// and returns 0. A compare-and-swap, repeated while other count-downs win the race.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: the key holds something that is not a count.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer; the count-down
    ///   may or may not have been applied (it is not resent: that could count twice).
    /// * [`Error::Server`] / [`Error::Authentication`], [`Error::InsideAsyncRuntime`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let left = client.count_down_latch("l")?.count_down()?;
    /// println!("{left} to go");
    /// # Ok(()) }
    /// ```
    pub fn count_down(&self) -> Result<u64> {
        let rpc = self.client.rpc();
        let left = self.client.block_on(count_down(rpc, &self.key))?;
        tracing::debug!(key = %text(&self.key), left, "latch counted down");
        Ok(left)
    }

    absence_waits! {
        /// Blocks until the count reaches zero (at once if the latch is open).
        ///
        /// # Errors
        ///
        /// * [`Error::InvalidArgument`]: the key holds something that is not a count.
        /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused the read or the
        ///   watch. Unreachable members, a leader election and compaction are not errors: the
        ///   wait retries and reads again by itself.
        /// * [`Error::Closed`]: the client was shut down. [`Error::InsideAsyncRuntime`]:
        ///   called on an async worker thread.
        ///
        /// ```no_run
        /// # fn main() -> etcd_sync::Result<()> {
        /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
        /// client.count_down_latch("shards-loaded")?.wait()?;
        /// println!("every shard is loaded");
        /// # Ok(()) }
        /// ```
        wait;

        /// Like [`wait`](CountDownLatch::wait), but gives up after `timeout`.
        ///
        /// # Errors
        ///
        /// * [`Error::Timeout`] with [`Operation::Latch`] and `after: timeout`
        ///   ([`is_wait_timeout`](Error::is_wait_timeout)): the count was not zero in time.
        /// * Otherwise as [`wait`](CountDownLatch::wait).
        ///
        /// ```no_run
        /// use std::time::Duration;
        /// # fn main() -> etcd_sync::Result<()> {
        /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
        /// match client.count_down_latch("l")?.wait_timeout(Duration::from_secs(60)) {
        ///     Ok(()) => println!("open"),
        ///     Err(e) if e.is_wait_timeout() => println!("still counting after a minute"),
        ///     Err(e) => return Err(e),
        /// }
        /// # Ok(()) }
        /// ```
        wait_timeout;

        /// Like [`wait`](CountDownLatch::wait), with a time limit and/or a
        /// [`CancelToken`](crate::CancelToken) (see [`WaitOptions`](crate::WaitOptions)).
        ///
        /// # Errors
        ///
        /// * [`Error::Cancelled`]: the token was cancelled before or during the wait.
        /// * [`Error::Timeout`] with [`Operation::Latch`]
        ///   ([`is_wait_timeout`](Error::is_wait_timeout)): the limit passed first.
        /// * Otherwise as [`wait`](CountDownLatch::wait).
        ///
        /// ```no_run
        /// # fn main() -> etcd_sync::Result<()> {
        /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
        /// let token = etcd_sync::CancelToken::new();
        /// match client.count_down_latch("l")?.wait_with(&token) {
        ///     Ok(()) => println!("open"),
        ///     Err(e) if e.is_cancelled() => println!("shutting down"),
        ///     Err(e) => return Err(e),
        /// }
        /// # Ok(()) }
        /// ```
        wait_with;
    }

    /// Whether a wait would return now: `true` if the count is zero. One read.
    ///
    /// # Errors
    ///
    /// As [`count`](CountDownLatch::count).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// if client.count_down_latch("l")?.try_wait()? {
    ///     println!("open");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_wait(&self) -> Result<bool> {
        Ok(self.count()? == 0)
    }

    fn wait_within(&self, wait: Wait) -> Result<()> {
        let try_wait = || self.try_wait();
        let check = |kv: &KeyValue| parse_count(kv).map(|_| ());
        let passed = block_until_absent(
            &self.client,
            &self.key,
            wait,
            Operation::Latch,
            try_wait,
            check,
        )?;
        if let Some(at) = passed {
            tracing::debug!(key = %text(&self.key), at, "latch open");
        }
        Ok(())
    }
}

/// One count-down: compare-and-swap on the mod revision, repeated on a conflict.
async fn count_down(rpc: &Rpc, key: &[u8]) -> Result<u64> {
    loop {
        let Some(kv) = rpc.read(&Range::key(key)).await?.kvs.pop() else {
            return Ok(0); // open: nothing to count down
        };
        let count = parse_count(&kv)?;
        let left = count - 1;
        let write = if left == 0 {
            TxnOp::delete(key)
        } else {
            TxnOp::put_with_lease(key, left.to_string(), kv.lease)
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key,
                CompareOp::Equal,
                kv.mod_revision,
            )])
            .and_then([write]);
        if rpc.txn(&txn, Retry::Never).await?.succeeded {
            return Ok(left);
        }
    }
}

/// The count a latch key holds: a decimal number of at least 1.
fn parse_count(kv: &KeyValue) -> Result<u64> {
    std::str::from_utf8(&kv.value)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "key {:?} holds {:?}, not a latch count (a decimal number of at least 1): \
                 another program uses this name",
                text(&kv.key),
                text(&kv.value)
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(value: &str) -> KeyValue {
        KeyValue {
            key: b"l".to_vec(),
            value: value.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_positive_decimal_is_a_count() {
        assert_eq!(parse_count(&kv("3")).ok(), Some(3));
        for bad in ["", "0", "-1", "x", "1.5", " 2"] {
            let e = parse_count(&kv(bad)).err();
            assert!(
                e.as_ref().is_some_and(Error::is_invalid_argument),
                "{bad:?}: {e:?}"
            );
        }
    }
}
