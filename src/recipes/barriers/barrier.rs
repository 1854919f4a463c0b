//! A barrier that holds everyone until it is removed: etcd's Go `recipe.Barrier`,
//! ZooKeeper's barrier recipe, Curator's `DistributedBarrier`. One key, `<name>` itself:
//! [`hold`](Barrier::hold) creates it, [`release`](Barrier::release) deletes it, and
//! [`wait`](Barrier::wait) returns once it does not exist (`barriers/gone.rs`).

// `Error` names the variants in the docs' `# Errors` links.
#[cfg(doc)]
use crate::support::error::Error;

use crate::client::Client;
use crate::client::removal::{self, Owned};
use crate::ownership::Wait;
use crate::recipes::barriers::gone::{absence_waits, block_until_absent, checked_key};
use crate::support::error::Result;
use crate::support::error::operation::Operation;
use crate::support::identity::default_identity;
use crate::support::kv::{Compare, CompareOp, Txn, TxnOp, text};
use crate::transport::Retry;

/// A barrier named by a string: while it is held, [`wait`](Barrier::wait) blocks; once it
/// is released (or was never held), every wait returns. Needs no session.
///
/// The barrier is the etcd key `<name>` itself (no suffix), without a lease, as in etcd's
/// Go `recipe.Barrier`: it stays up until someone releases it, whoever raised it and
/// whether or not that process still runs (`etcdctl del <name>` releases it too). Its value
/// is the `"<hostname>:<pid>"` of the process that raised it, for operators. A wait reads
/// the key once and then waits for its delete on the client's one watch stream, so a
/// thousand waiters in one process cost etcd one watcher and wake on the one event;
/// compaction and failover are ridden out (a gap in the watcher's history is closed by one
/// read).
///
/// A barrier released and raised again at once may be missed by a waiter that had not yet
/// read it: a wait returns when it sees the key absent, or sees it deleted, and neither
/// happens for a waiter that reads only after the key is back. Name barriers apart from
/// locks: a barrier `jobs/x` is a key under the lock `jobs`, and would block it.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let barrier = client.barrier("deploy/freeze")?;
/// barrier.hold()?; // coordinator: everyone waits from now on
/// // ... elsewhere, workers call barrier.wait()? and block ...
/// barrier.release()?; // every waiter returns
/// barrier.wait()?; // returns at once: the barrier is down
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Barrier {
    client: Client,
    key: Vec<u8>,
}

impl Client {
    /// The barrier named `name` (the etcd key `<name>`). No request is sent until it is
    /// used.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `name` is empty or longer than 4096 bytes.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let barrier = client.barrier("reindex/start")?;
    /// assert!(client.barrier("").is_err()); // InvalidArgument
    /// # let _ = barrier;
    /// # Ok(()) }
    /// ```
    pub fn barrier(&self, name: impl AsRef<[u8]>) -> Result<Barrier> {
        Ok(Barrier {
            client: self.clone(),
            key: checked_key(name.as_ref(), "barrier")?,
        })
    }
}

impl Barrier {
    /// The barrier's name (its key).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// assert_eq!(client.barrier("b")?.name(), b"b");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &[u8] {
        &self.key
    }

    /// Raises the barrier: from now on every wait blocks until it is released. Returns
    /// `true` if this call raised it, `false` if it was up already (it is left as it is).
    /// One transaction (`if create_revision(<name>) == 0 then put`).
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer. Like a plain
    ///   write, the hold is not resent after an ambiguous failure: it may or may not have
    ///   been applied (call `hold()` again to find out: it then answers `false` if the
    ///   barrier is up). A refusal before etcd handled it ("no leader") is tried on the
    ///   next endpoint.
    /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused (e.g.
    ///   `PermissionDenied`). [`Error::InsideAsyncRuntime`]: called on an async worker
    ///   thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let barrier = client.barrier("b")?;
    /// if !barrier.hold()? {
    ///     println!("someone else had raised it already");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn hold(&self) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(self.key.clone(), default_identity())]);
        let rpc = self.client.rpc();
        let raised = self
            .client
            .block_on(async { rpc.txn(&txn, Retry::Never).await })?
            .succeeded;
        tracing::debug!(key = %text(&self.key), raised, "barrier held");
        Ok(raised)
    }

    /// Releases the barrier: every wait returns. Returns `true` if it was up, `false` if
    /// there was nothing to release. A read, then a delete guarded by the key's create
    /// revision, so a retried or late release can never remove a barrier raised after it;
    /// both are retried on the next endpoint.
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: no endpoint answered. Call `release()`
    ///   again: it is safe to repeat.
    /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused (e.g.
    ///   `PermissionDenied`). [`Error::InsideAsyncRuntime`]: called on an async worker
    ///   thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let released = client.barrier("b")?.release()?;
    /// println!("released: {released}");
    /// # Ok(()) }
    /// ```
    pub fn release(&self) -> Result<bool> {
        let rpc = self.client.rpc();
        let key = &self.key;
        let released = self.client.block_on(async {
            loop {
                let Some(kv) = rpc
                    .read(&crate::support::kv::Range::key(key))
                    .await?
                    .kvs
                    .pop()
                else {
                    return Ok(false);
                };
                // A barrier raised again in between is released on the next round.
                if removal::remove(rpc, key, Owned::Revision(kv.create_revision)).await? {
                    return Ok(true);
                }
            }
        })?;
        tracing::debug!(key = %text(key), released, "barrier released");
        Ok(released)
    }

    absence_waits! {
        /// Blocks until the barrier is released: returns at once if it is not up, else when
        /// its key is deleted (by [`release`](Barrier::release), `etcdctl del`, anyone).
        ///
        /// # Errors
        ///
        /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused the read or the
        ///   watch (e.g. `PermissionDenied`). Unreachable members, a leader election and
        ///   compaction are not errors: the wait retries and reads again by itself.
        /// * [`Error::Closed`]: the client was shut down. [`Error::InsideAsyncRuntime`]:
        ///   called on an async worker thread.
        ///
        /// ```no_run
        /// # fn main() -> etcd_sync::Result<()> {
        /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
        /// client.barrier("deploy/freeze")?.wait()?;
        /// println!("the freeze is over");
        /// # Ok(()) }
        /// ```
        wait;

        /// Like [`wait`](Barrier::wait), but gives up after `timeout`.
        ///
        /// # Errors
        ///
        /// * [`Error::Timeout`] with [`Operation::Barrier`] and `after: timeout`
        ///   ([`is_wait_timeout`](Error::is_wait_timeout)): the barrier was still up.
        /// * Otherwise as [`wait`](Barrier::wait).
        ///
        /// ```no_run
        /// use std::time::Duration;
        /// # fn main() -> etcd_sync::Result<()> {
        /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
        /// match client.barrier("b")?.wait_timeout(Duration::from_secs(30)) {
        ///     Ok(()) => println!("released"),
        ///     Err(e) if e.is_wait_timeout() => println!("still held after 30 s"),
        ///     Err(e) => return Err(e),
        /// }
        /// # Ok(()) }
        /// ```
        wait_timeout;

        /// Like [`wait`](Barrier::wait), with a time limit and/or a
        /// [`CancelToken`](crate::CancelToken) (see [`WaitOptions`](crate::WaitOptions)).
        ///
        /// # Errors
        ///
        /// * [`Error::Cancelled`]: the token was cancelled before or during the wait.
        /// * [`Error::Timeout`] with [`Operation::Barrier`]
        ///   ([`is_wait_timeout`](Error::is_wait_timeout)): the limit passed first.
        /// * Otherwise as [`wait`](Barrier::wait).
        ///
        /// ```no_run
        /// # fn main() -> etcd_sync::Result<()> {
        /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
        /// let token = etcd_sync::CancelToken::new();
        /// match client.barrier("b")?.wait_with(&token) {
        ///     Ok(()) => println!("released"),
        ///     Err(e) if e.is_cancelled() => println!("shutting down"),
        ///     Err(e) => return Err(e),
        /// }
        /// # Ok(()) }
        /// ```
        wait_with;
    }

    /// Whether a wait would return now: `true` if the barrier is not up. One read; never
    /// blocks on the barrier.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] / [`Error::Unavailable`] (no endpoint answered the read),
    /// [`Error::Server`], [`Error::Authentication`], [`Error::InsideAsyncRuntime`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// if !client.barrier("b")?.try_wait()? {
    ///     println!("held: come back later");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_wait(&self) -> Result<bool> {
        let rpc = self.client.rpc();
        let range = crate::support::kv::Range::key(&self.key);
        let read = self.client.block_on(async { rpc.read(&range).await })?;
        Ok(read.kvs.is_empty())
    }

    fn wait_within(&self, wait: Wait) -> Result<()> {
        let try_wait = || self.try_wait();
        let passed = block_until_absent(
            &self.client,
            &self.key,
            wait,
            Operation::Barrier,
            try_wait,
            |_| Ok(()),
        )?;
        if let Some(at) = passed {
            tracing::debug!(key = %text(&self.key), at, "barrier passed");
        }
        Ok(())
    }
}
