//! The blocking client: connection, private runtime, keep-alive thread, and a small KV API.

pub(crate) mod blocking;
mod borrowed_task;
pub(crate) mod builder;
pub(crate) mod driver;
pub(crate) mod follow;
pub(crate) mod keepalive;
pub(crate) mod lease;
pub(crate) mod removal;
pub(crate) mod runtime;
#[cfg(feature = "simulation")]
pub(crate) mod simulated;

use std::future::Future;
use std::sync::Arc;

use crate::client::follow::Follower;
use crate::client::keepalive::KeepAlive;
use crate::client::lease::LeaseState;
use crate::client::runtime::Runtime;
use crate::support::error::{Error, Result};
use crate::support::kv::{KeyValue, Range, Txn, TxnResponse};
use crate::transport::watches::Watches;
use crate::transport::{Retry, Rpc, RpcConfig};

/// A blocking etcd v3 client. Cheap to clone (clones share one connection, one private
/// runtime thread and one keep-alive thread); `Send + Sync`.
///
/// When the last clone (including those inside sessions, mutexes and guards) is dropped,
/// its threads stop and are joined.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// client.put("greeting", "hello")?;
/// let kv = client.get("greeting")?.expect("just written");
/// assert_eq!(kv.value, b"hello");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

// Field order is drop order: the keep-alive thread is joined before the runtime it uses
// is shut down.
struct ClientInner {
    rpc: Rpc,
    /// The task that follows live guards' keys.
    follower: Follower,
    /// The client's one watch stream, shared by waiters, guards and observers.
    watches: Watches,
    /// Leases with a live session in this client: resuming one of them again would give
    /// two sessions one lease, and the first would never hear of its loss.
    live_leases: std::sync::Mutex<std::collections::HashMap<i64, std::sync::Weak<LeaseState>>>,
    keepalive: KeepAlive,
    runtime: Runtime,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.inner.rpc.endpoints())
            .finish()
    }
}

impl Client {
    /// The endpoints this client was given.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["127.0.0.1:2379"])?;
    /// assert_eq!(client.endpoints(), ["http://127.0.0.1:2379"]);
    /// # Ok(()) }
    /// ```
    pub fn endpoints(&self) -> &[String] {
        self.inner.rpc.endpoints()
    }

    /// Reads one key (linearizable).
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `key` is empty.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: no endpoint answered (reads are
    ///   retried on every endpoint first).
    /// * [`Error::Server`]: etcd refused the read (e.g. `PermissionDenied`);
    ///   [`Error::Authentication`]: re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// match client.get("config/mode")? {
    ///     Some(kv) => println!("mode = {}", kv.value_str()),
    ///     None => println!("not set"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<KeyValue>> {
        let range = Range::key(&non_empty_key(key.as_ref())?);
        let read = self.block_on(self.rpc().read(&range))?;
        Ok(read.kvs.into_iter().next())
    }

    /// Reads every key starting with `prefix`, in key order (linearizable).
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `prefix` is empty.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: no endpoint answered (reads are
    ///   retried on every endpoint first).
    /// * [`Error::Server`]: etcd refused the read (e.g. `PermissionDenied`);
    ///   [`Error::Authentication`]: re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// for kv in client.get_prefix("jobs/")? {
    ///     println!("{}", kv.key_str());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn get_prefix(&self, prefix: impl AsRef<[u8]>) -> Result<Vec<KeyValue>> {
        let range = Range::prefix(&non_empty_key(prefix.as_ref())?);
        Ok(self.block_on(self.rpc().read(&range))?.kvs)
    }

    /// Reads every key starting with `prefix` as the store was at `revision`, in key
    /// order: a snapshot of the past, as long as etcd still has that revision's history
    /// (compaction removes it). E.g. to check what an [`Error::Deadlock`] names against
    /// the keys at its revision.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `prefix` is empty, or `revision` is not positive.
    /// * [`Error::Server`] with code `OutOfRange`: the revision was compacted, or is
    ///   newer than the store.
    /// * Otherwise as [`get_prefix`](Client::get_prefix).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let before = client.put("jobs/1", "queued")?;
    /// client.put("jobs/1", "done")?;
    /// let then = client.get_prefix_at("jobs/", before)?;
    /// assert_eq!(then[0].value_str(), "queued");
    /// # Ok(()) }
    /// ```
    pub fn get_prefix_at(&self, prefix: impl AsRef<[u8]>, revision: i64) -> Result<Vec<KeyValue>> {
        if revision <= 0 {
            return Err(Error::InvalidArgument(format!(
                "revision {revision}: a read of the past needs a positive revision"
            )));
        }
        let range = Range {
            revision,
            ..Range::prefix(&non_empty_key(prefix.as_ref())?)
        };
        Ok(self.block_on(self.rpc().read(&range))?.kvs)
    }

    /// Writes a key; returns the store revision of the write.
    ///
    /// # Errors
    ///
    /// As [`put_with_lease`](Client::put_with_lease), without the lease.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let revision = client.put("k", "v")?;
    /// assert!(revision > 0);
    /// # Ok(()) }
    /// ```
    pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<i64> {
        self.put_with_lease(key, value, 0)
    }

    /// Writes a key bound to a lease (e.g. [`Session::lease_id`](crate::Session::lease_id)): etcd deletes it when
    /// the lease ends. Returns the store revision of the write.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `key` is empty.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer. Plain writes are
    ///   not retried: the put may or may not have been applied.
    /// * [`Error::Server`]: etcd refused the put: `NotFound` (`requested lease not found`)
    ///   for a lease that does not exist (any more), `InvalidArgument` for a request above
    ///   etcd's size limit (`ResourceExhausted` far above it: see
    ///   [`Error::is_invalid_argument`]), `PermissionDenied`...; [`Error::Authentication`]:
    ///   re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let session = client.session()?;
    /// client.put_with_lease("members/me", "10.0.0.7", session.lease_id())?;
    /// # Ok(()) }
    /// ```
    pub fn put_with_lease(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        lease: i64,
    ) -> Result<i64> {
        let key = non_empty_key(key.as_ref())?;
        let value = value.as_ref().to_vec();
        self.block_on(self.rpc().put(key, value, lease))
    }

    /// Deletes one key; returns how many keys were deleted (0 or 1).
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `key` is empty.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer. Plain writes are
    ///   not retried: the delete may or may not have been applied.
    /// * [`Error::Server`]: etcd refused the delete (e.g. `PermissionDenied`);
    ///   [`Error::Authentication`]: re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// client.put("k", "v")?;
    /// assert_eq!(client.delete("k")?, 1);
    /// # Ok(()) }
    /// ```
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<i64> {
        let range = Range::key(&non_empty_key(key.as_ref())?);
        self.block_on(self.rpc().delete(&range))
    }

    /// Deletes every key starting with `prefix`; returns how many were deleted.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `prefix` is empty.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer. Plain writes are
    ///   not retried: the delete may or may not have been applied.
    /// * [`Error::Server`]: etcd refused the delete (e.g. `PermissionDenied`);
    ///   [`Error::Authentication`]: re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let n = client.delete_prefix("tmp/")?;
    /// # let _ = n;
    /// # Ok(()) }
    /// ```
    pub fn delete_prefix(&self, prefix: impl AsRef<[u8]>) -> Result<i64> {
        let range = Range::prefix(&non_empty_key(prefix.as_ref())?);
        self.block_on(self.rpc().delete(&range))
    }

    /// Runs a transaction (compare-and-swap and friends). Not retried on an ambiguous
    /// failure, since it may have applied. A failed comparison is not an error: it is
    /// `Ok` with [`succeeded`](TxnResponse::succeeded) `false`.
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer. Plain writes are
    ///   not retried: the transaction may or may not have been applied.
    /// * [`Error::Server`]: etcd refused the transaction: `InvalidArgument` for a malformed
    ///   one (`duplicate key given in txn request`, too many operations, an empty key, too
    ///   large), `NotFound` for a put with a lease that does not exist, `PermissionDenied`
    ///   ...; [`Error::Authentication`]: re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// use etcd_sync::{Compare, CompareOp, Txn, TxnOp};
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let current = client.get("counter")?;
    /// let (rev, n) = current.map_or((0, 0), |kv| (kv.mod_revision, kv.value_str().parse().unwrap_or(0)));
    /// let swapped = client.txn(
    ///     Txn::new()
    ///         .when([Compare::mod_revision("counter", CompareOp::Equal, rev)])
    ///         .and_then([TxnOp::put("counter", (n + 1).to_string())]),
    /// )?;
    /// println!("incremented: {}", swapped.succeeded);
    /// # Ok(()) }
    /// ```
    pub fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.block_on(self.rpc().txn(&txn, Retry::Never))
    }

    /// Compacts etcd's history up to `revision` (older revisions can no longer be read or
    /// watched from).
    ///
    /// # Errors
    ///
    /// * [`Error::Server`] with code `OutOfRange`: `revision` is already compacted
    ///   (`mvcc: required revision has been compacted`) or newer than the store (`mvcc:
    ///   required revision is a future revision`); other codes when etcd refuses (e.g.
    ///   `PermissionDenied`). [`Error::Authentication`]: re-authenticating after an expired
    ///   token failed.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: no endpoint answered (a compaction is
    ///   retried on every endpoint first: repeating it is harmless).
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let rev = client.put("k", "v")?;
    /// client.compact(rev)?;
    /// # Ok(()) }
    /// ```
    pub fn compact(&self, revision: i64) -> Result<()> {
        self.block_on(self.rpc().compact(revision))
    }

    pub(crate) fn rpc(&self) -> &Rpc {
        &self.inner.rpc
    }

    /// Runs `fut` on the calling thread through the runtime's blocking seam.
    pub(crate) fn block_on<T: Send, E: From<Error> + Send>(
        &self,
        fut: impl Future<Output = std::result::Result<T, E>> + Send,
    ) -> std::result::Result<T, E> {
        self.inner.runtime.block_on(fut)
    }

    /// Runs `fut` in the background on the private runtime (cleanup from `Drop`).
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.inner.runtime.spawn(fut);
    }

    /// Crashes this client's simulated process: none of its requests reach etcd any more,
    /// and its background work stops (feature `simulation`).
    #[cfg(feature = "simulation")]
    pub(crate) fn kill(&self) {
        self.inner.rpc.process().crash();
        self.inner.runtime.stop();
    }

    pub(crate) fn follower(&self) -> &Follower {
        &self.inner.follower
    }

    pub(crate) fn watches(&self) -> &Watches {
        &self.inner.watches
    }

    pub(crate) fn keepalive_register(&self, session: Arc<LeaseState>) -> Result<()> {
        {
            let mut live = self
                .inner
                .live_leases
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            live.retain(|_, s| s.upgrade().is_some_and(|s| s.loss_reason().is_none()));
            if live.contains_key(&session.id()) {
                return Err(Error::InvalidArgument(format!(
                    "lease {:x} already has a live session in this client: clone that \
                     Session instead of resuming the lease again",
                    session.id()
                )));
            }
            live.insert(session.id(), Arc::downgrade(&session));
        }
        self.inner.keepalive.register(session)
    }
}

pub(crate) fn non_empty_key(key: &[u8]) -> Result<Vec<u8>> {
    if key.is_empty() {
        return Err(Error::InvalidArgument("empty key".into()));
    }
    Ok(key.to_vec())
}

impl Client {
    /// Starts what a client owns (the runtime or its share of the shared one, the
    /// connection, the keep-alive thread, the watch and follow tasks) for a validated
    /// configuration.
    pub(crate) fn start(config: &RpcConfig, shared_runtime: bool) -> Result<Client> {
        // On a simulated process's thread: the run's runtime, and the keep-alive loop as
        // one of its tasks (`client/simulated.rs`).
        let (runtime, simulated) = Runtime::for_this_thread(shared_runtime)?;
        let rpc = runtime.block_on(Rpc::connect(config))?;
        let keepalive = if simulated {
            KeepAlive::start_task(runtime.handle()?, rpc.clone())
        } else {
            KeepAlive::start(runtime.handle()?.clone(), rpc.clone())?
        };
        let watches = Watches::start(runtime.handle()?, rpc.clone());
        let follower = Follower::start(runtime.handle()?, rpc.clone(), watches.clone());
        Ok(Client {
            inner: Arc::new(ClientInner {
                rpc,
                follower,
                watches,
                live_leases: std::sync::Mutex::default(),
                keepalive,
                runtime,
            }),
        })
    }
}
