//! One attempt of a software transaction, as its closure sees it ([`StmTx`]): the keys it
//! read (with the mod revision each had), the writes it buffers, the snapshot revision of
//! the serializable levels, and the one Txn that commits it (Go's `stm` and
//! `stmSerializable`, `clientv3/concurrency/stm.go`).

use std::collections::BTreeMap;

use super::Isolation;
use crate::client::Client;
use crate::support::error::{Error, Result};
use crate::support::etcd_text;
use crate::support::kv::{
    Compare, CompareOp, KeyValue, Range, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use crate::transport::Retry;

/// A key as the transaction read it (`None`: absent).
type Seen = Option<KeyValue>;

/// A buffered write.
#[derive(Debug)]
enum Write {
    Put { value: Vec<u8>, lease: i64 },
    Delete,
}

/// How a commit ended.
pub(super) enum Commit {
    /// The writes are applied.
    Done,
    /// A compare failed (or the snapshot was compacted): run the closure again.
    Conflict,
}

/// The transaction handed to an STM closure: read keys with [`get`](StmTx::get) and
/// [`rev`](StmTx::rev), buffer writes with [`put`](StmTx::put) and
/// [`delete`](StmTx::delete). Nothing is written until the closure returns `Ok`; then one
/// etcd Txn commits every write if nothing the transaction read has changed since (what
/// "changed" means is the [`Isolation`] level's), else the closure runs again on fresh
/// reads.
///
/// Reads of a key the transaction has already read return the same answer (they are not
/// sent again), and reads of a key it wrote return that write.
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// // move 10 from one account to another, atomically
/// client.stm(|tx| {
///     let balance = |v: Option<Vec<u8>>| -> i64 {
///         v.and_then(|v| String::from_utf8(v).ok()?.parse().ok()).unwrap_or(0)
///     };
///     let from = balance(tx.get("accounts/alice")?);
///     let to = balance(tx.get("accounts/bob")?);
///     tx.put("accounts/alice", (from - 10).to_string());
///     tx.put("accounts/bob", (to + 10).to_string());
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
pub struct StmTx<'a> {
    client: &'a Client,
    isolation: Isolation,
    /// 0 for the first run of the closure, then one more per conflict.
    attempt: u32,
    reads: BTreeMap<Vec<u8>, Seen>,
    writes: BTreeMap<Vec<u8>, Write>,
    /// The serializable levels: the revision every read of this attempt sees (the first
    /// read's, or the failed commit's that filled `prefetched`).
    snapshot: Option<i64>,
    /// What the last failed commit read of its read set (its `else` branch), at
    /// `prefetched_at`: the next attempt's reads, without a round trip each.
    prefetched: BTreeMap<Vec<u8>, Seen>,
    prefetched_at: i64,
    /// The first failed read or refused write of this attempt: it cannot commit.
    failure: Option<Error>,
    /// The snapshot revision was compacted away: the attempt starts again.
    restart: bool,
}

impl std::fmt::Debug for StmTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StmTx")
            .field("isolation", &self.isolation)
            .field("attempt", &self.attempt)
            .field("reads", &self.reads.len())
            .field("writes", &self.writes.len())
            .field("snapshot", &self.snapshot)
            .finish_non_exhaustive()
    }
}

impl<'a> StmTx<'a> {
    pub(super) fn new(client: &'a Client, isolation: Isolation) -> StmTx<'a> {
        StmTx {
            client,
            isolation,
            attempt: 0,
            reads: BTreeMap::new(),
            writes: BTreeMap::new(),
            snapshot: None,
            prefetched: BTreeMap::new(),
            prefetched_at: 0,
            failure: None,
            restart: false,
        }
    }

    /// Starts attempt `attempt`: nothing read or written yet (what the last failed commit
    /// prefetched stays).
    pub(super) fn begin(&mut self, attempt: u32) {
        self.attempt = attempt;
        self.reads.clear();
        self.writes.clear();
        self.snapshot = None;
        self.failure = None;
        self.restart = false;
    }

    /// Which run of the closure this is: 0 the first, then one more after each conflict.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// client.stm(|tx| {
    ///     if tx.attempt() > 0 {
    ///         eprintln!("retrying after {} conflicts", tx.attempt());
    ///     }
    ///     tx.put("k", "v");
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The isolation level the transaction runs at.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// use etcd_sync::Isolation;
    /// client.stm(|tx| {
    ///     assert_eq!(tx.isolation(), Isolation::SerializableSnapshot); // the default
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    /// The value of `key` as this transaction sees it: its own buffered write if it wrote
    /// the key (`None` after a [`delete`](StmTx::delete)), else the key as read (once per
    /// attempt; `None` when absent), which adds it to the read set that the commit checks.
    ///
    /// What a read sees depends on the [`Isolation`] level: the serializable levels read
    /// every key at the revision of the attempt's first read (one snapshot); the others
    /// read the newest value the member asked has.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `key` is empty.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: no endpoint answered (reads are
    ///   retried on every endpoint first).
    /// * [`Error::Server`]: etcd refused the read (e.g. `PermissionDenied`).
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// A failed read ends the transaction with that error even if the closure ignores it
    /// and returns `Ok` (as Go's `Get` aborts it): nothing is committed. One failure is
    /// not reported: when etcd has compacted away the revision of the attempt's snapshot,
    /// the attempt starts again on a new snapshot, as after a conflict.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let mode = client.stm(|tx| {
    ///     let mode = tx.get("config/mode")?;
    ///     Ok(mode.map(|v| String::from_utf8_lossy(&v).into_owned()))
    /// })?;
    /// println!("{mode:?}");
    /// # Ok(()) }
    /// ```
    pub fn get(&mut self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        let key = key.as_ref();
        match self.writes.get(key) {
            Some(Write::Put { value, .. }) => return Ok(Some(value.clone())),
            Some(Write::Delete) => return Ok(None),
            None => {}
        }
        Ok(self.seen(key)?.map(|kv| kv.value))
    }

    /// The mod revision of `key` as this transaction read it (0 when absent), reading the
    /// key if it has not yet (which adds it to the read set). Buffered writes do not
    /// change it: it is the revision in etcd.
    ///
    /// # Errors
    ///
    /// As [`get`](StmTx::get).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let rev = client.stm(|tx| tx.rev("config/mode"))?;
    /// println!("last written at revision {rev}");
    /// # Ok(()) }
    /// ```
    pub fn rev(&mut self, key: impl AsRef<[u8]>) -> Result<i64> {
        Ok(self.seen(key.as_ref())?.map_or(0, |kv| kv.mod_revision))
    }

    /// Buffers a write of `key`; it is applied only if the transaction commits. A later
    /// [`get`](StmTx::get) of `key` in this attempt returns `value`.
    ///
    /// An empty key is refused when the closure returns: the transaction ends with
    /// [`Error::InvalidArgument`] and commits nothing.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// client.stm(|tx| {
    ///     let n: u64 = tx.get("counter")?.and_then(|v| String::from_utf8(v).ok()?.parse().ok()).unwrap_or(0);
    ///     tx.put("counter", (n + 1).to_string());
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn put(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.put_with_lease(key, value, 0);
    }

    /// [`put`](StmTx::put) with the key bound to a lease (e.g.
    /// [`Session::lease_id`](crate::Session::lease_id)): etcd deletes it when the lease
    /// ends. A lease that does not exist makes the commit fail with [`Error::Server`]
    /// (`NotFound`).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let session = client.session()?;
    /// client.stm(|tx| {
    ///     if tx.get("workers/leader")?.is_none() {
    ///         tx.put_with_lease("workers/leader", "me", session.lease_id());
    ///     }
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn put_with_lease(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>, lease: i64) {
        let key = key.as_ref();
        if self.refused(key, "put") {
            return;
        }
        let value = value.as_ref().to_vec();
        self.writes
            .insert(key.to_vec(), Write::Put { value, lease });
    }

    /// Buffers a delete of `key` (nothing happens to an absent key); it is applied only if
    /// the transaction commits. A later [`get`](StmTx::get) of `key` in this attempt
    /// returns `None`.
    ///
    /// An empty key is refused when the closure returns, as for [`put`](StmTx::put).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// // take a job from the queue: read it and delete it, or neither
    /// let job = client.stm(|tx| {
    ///     let job = tx.get("queue/1")?;
    ///     tx.delete("queue/1");
    ///     Ok(job)
    /// })?;
    /// # let _ = job;
    /// # Ok(()) }
    /// ```
    pub fn delete(&mut self, key: impl AsRef<[u8]>) {
        let key = key.as_ref();
        if !self.refused(key, "delete") {
            self.writes.insert(key.to_vec(), Write::Delete);
        }
    }

    /// Whether `key` is refused as a write's key (empty); the attempt then cannot commit.
    fn refused(&mut self, key: &[u8], what: &str) -> bool {
        if key.is_empty() {
            self.failure.get_or_insert_with(|| {
                Error::InvalidArgument(format!("empty key given to StmTx::{what}"))
            });
        }
        key.is_empty()
    }

    /// Whether the serializable levels' rules apply (one snapshot; prefetch on conflict).
    fn snapshots(&self) -> bool {
        matches!(
            self.isolation,
            Isolation::SerializableSnapshot | Isolation::Serializable
        )
    }

    /// The read set's entry for `key`, reading it first if needed.
    fn seen(&mut self, key: &[u8]) -> Result<Seen> {
        if let Some(seen) = self.reads.get(key) {
            return Ok(seen.clone());
        }
        let seen = self.fetch(key)?;
        self.reads.insert(key.to_vec(), seen.clone());
        Ok(seen)
    }

    /// Reads `key` for the read set: from what the last failed commit prefetched, else from
    /// etcd with the isolation level's options.
    fn fetch(&mut self, key: &[u8]) -> Result<Seen> {
        if key.is_empty() {
            let refused = Error::InvalidArgument("empty key given to StmTx::get".into());
            return Err(self.failed(refused));
        }
        if self.snapshots() && self.snapshot.is_none_or(|s| s == self.prefetched_at) {
            if let Some(seen) = self.prefetched.remove(key) {
                self.snapshot = Some(self.prefetched_at);
                return Ok(seen);
            }
            if !self.prefetched.is_empty() {
                // The reads of this attempt share the prefetch's snapshot.
                self.snapshot = Some(self.prefetched_at);
            }
        }
        let range = self.range(key);
        let rpc = self.client.rpc();
        let result = self.client.block_on(async {
            match rpc.read(&range).await {
                // A member behind the one that set the snapshot (after a failover): read
                // through consensus, which waits until it has caught up.
                Err(e) if range.serializable && range.revision > 0 && behind(&e) => {
                    let linearizable = Range {
                        serializable: false,
                        ..range.clone()
                    };
                    rpc.read(&linearizable).await
                }
                other => other,
            }
        });
        match result {
            Ok(read) => {
                if self.snapshots() && self.snapshot.is_none() {
                    self.snapshot = Some(read.revision);
                }
                Ok(read.kvs.into_iter().next())
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    /// Reads every key of `keys` the attempt has not read yet, in one Txn (Go's
    /// `WithPrefetch`).
    pub(super) fn prefetch(&mut self, keys: &[Vec<u8>]) -> Result<()> {
        let mut wanted: Vec<&Vec<u8>> = Vec::new();
        for key in keys {
            if !self.reads.contains_key(key) && !wanted.contains(&key) {
                if self.snapshots()
                    && self.snapshot.is_none_or(|s| s == self.prefetched_at)
                    && self.prefetched.contains_key(key)
                {
                    self.seen(key)?;
                } else {
                    wanted.push(key);
                }
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        if self.snapshots() && self.snapshot.is_none() && !self.prefetched.is_empty() {
            self.snapshot = Some(self.prefetched_at);
        }
        let ranges: Vec<Range> = wanted.iter().map(|k| self.range(k)).collect();
        let txn = |serializable| {
            Txn::new().and_then(ranges.iter().map(|r| {
                TxnOp::range(Range {
                    serializable: r.serializable && serializable,
                    ..r.clone()
                })
            }))
        };
        let rpc = self.client.rpc();
        let result = self.client.block_on(async {
            match rpc.txn(&txn(true), Retry::Safe).await {
                // As in `fetch`: a member behind the snapshot.
                Err(e) if behind(&e) => rpc.txn(&txn(false), Retry::Safe).await,
                other => other,
            }
        });
        let response = result.map_err(|e| self.failed(e))?;
        if self.snapshots() && self.snapshot.is_none() {
            self.snapshot = Some(response.revision);
        }
        for (key, seen) in wanted.into_iter().zip(first_of_each(response)) {
            self.reads.insert(key.clone(), seen);
        }
        Ok(())
    }

    /// How the isolation level reads `key` now.
    fn range(&self, key: &[u8]) -> Range {
        match (self.snapshots(), self.snapshot) {
            // The first read of a serializable level: linearizable, its revision the
            // snapshot of the attempt's later reads.
            (true, None) => Range::key(key),
            (true, Some(revision)) => Range {
                revision,
                serializable: true,
                ..Range::key(key)
            },
            // Go reads these levels from the member asked, without consensus: any
            // committed revision may answer; the commit's compares catch what changed.
            (false, _) => Range {
                serializable: true,
                ..Range::key(key)
            },
        }
    }

    /// Notes a failed read: the attempt cannot commit; a compacted snapshot restarts it.
    fn failed(&mut self, e: Error) -> Error {
        let compacted =
            matches!(&e, Error::Server { message, .. } if etcd_text::is_compacted(message));
        if compacted && self.snapshot.is_some() {
            self.restart = true;
            self.prefetched.clear();
        }
        self.failure.get_or_insert_with(|| e.clone());
        e
    }

    /// Whether the attempt must start again whatever the closure returned (its snapshot
    /// was compacted away).
    pub(super) fn must_restart(&self) -> bool {
        self.restart
    }

    /// Commits the attempt the closure accepted: one Txn, if every compare of the
    /// isolation level holds then every buffered write. On a conflict, the serializable
    /// levels read their read set again in the same Txn (its `else` branch), for the
    /// next attempt.
    pub(super) fn commit(&mut self) -> Result<Commit> {
        if self.restart {
            return Ok(Commit::Conflict);
        }
        if let Some(e) = self.failure.take() {
            return Err(e);
        }
        let txn = self.commit_txn();
        if txn.when.is_empty() && txn.then.is_empty() {
            return Ok(Commit::Done); // nothing to check, nothing to write
        }
        // Without writes the Txn only checks: sending it twice changes nothing.
        let retry = if self.writes.is_empty() {
            Retry::Safe
        } else {
            Retry::Never
        };
        let response = self.client.block_on(self.client.rpc().txn(&txn, retry))?;
        if response.succeeded {
            return Ok(Commit::Done);
        }
        self.prefetched.clear();
        if self.snapshots() {
            self.prefetched_at = response.revision;
            let keys: Vec<Vec<u8>> = self.reads.keys().cloned().collect();
            self.prefetched = keys.into_iter().zip(first_of_each(response)).collect();
        }
        Ok(Commit::Conflict)
    }

    /// The commit Txn: Go's compares for the isolation level, the writes, and (serializable
    /// levels) the read set read again on failure.
    fn commit_txn(&self) -> Txn {
        let mut when = Vec::new();
        if self.isolation != Isolation::ReadCommitted {
            // Nothing read has changed since.
            when.extend(self.reads.iter().map(|(key, seen)| {
                let rev = seen.as_ref().map_or(0, |kv| kv.mod_revision);
                Compare::mod_revision(key.clone(), CompareOp::Equal, rev)
            }));
        }
        if let (Isolation::SerializableSnapshot, Some(snapshot)) = (self.isolation, self.snapshot) {
            // Nothing written has been written by anyone since the snapshot either. A key
            // also read at the snapshot has its read compare (mod revision equal to one at
            // or before the snapshot), which implies this one: left out, so that a
            // read-modify-write of n keys costs n compares, not 2n (etcd refuses more than
            // `--max-txn-ops`, 128 by default, in a Txn's compares).
            let implied = |key: &Vec<u8>| {
                self.reads
                    .get(key)
                    .is_some_and(|seen| seen.as_ref().map_or(0, |kv| kv.mod_revision) <= snapshot)
            };
            when.extend(self.writes.keys().filter(|key| !implied(key)).map(|key| {
                Compare::mod_revision(key.clone(), CompareOp::Less, snapshot.saturating_add(1))
            }));
        }
        let then = self.writes.iter().map(|(key, write)| match write {
            Write::Put { value, lease } => {
                TxnOp::put_with_lease(key.clone(), value.clone(), *lease)
            }
            Write::Delete => TxnOp::delete(key.clone()),
        });
        let mut txn = Txn::new().when(when).and_then(then);
        if self.snapshots() {
            txn = txn.or_else(self.reads.keys().map(|key| TxnOp::get(key.clone())));
        }
        txn
    }
}

/// Whether the member asked has not reached the revision read at.
fn behind(e: &Error) -> bool {
    matches!(e, Error::Server { message, .. } if etcd_text::is_future_revision(message))
}

/// The first key each range of a Txn's branch found (`None`: none), in order.
fn first_of_each(response: TxnResponse) -> impl Iterator<Item = Seen> {
    response.responses.into_iter().map(|op| match op {
        TxnOpResponse::Get(kvs) => kvs.into_iter().next(),
        _ => None,
    })
}
