//! Software transactional memory on etcd (Go's `concurrency.NewSTM`): a closure reads and
//! writes keys through a [`StmTx`](tx::StmTx), and one Txn commits its writes only if what
//! it read is unchanged, else the closure runs again. [`Isolation`] picks Go's four levels;
//! [`StmBuilder`] the level, a bound on retries and keys to prefetch. The keys and
//! compares are Go's (less one it implies), so Go's STM and ours transact on the same keys.

pub(crate) mod tx;

use crate::client::Client;
use crate::support::error::Error;
use tx::{Commit, StmTx};

/// How a software transaction's reads see other writers, and what makes its commit fail
/// (Go's `concurrency.Isolation`, with the same four levels and the same rules).
///
/// | level | reads | the commit fails when |
/// |---|---|---|
/// | [`SerializableSnapshot`](Isolation::SerializableSnapshot) (default) | one snapshot: the revision of the attempt's first read | a key read has changed, or a key written was written by anyone after the snapshot |
/// | [`Serializable`](Isolation::Serializable) | one snapshot | a key read has changed |
/// | [`RepeatableReads`](Isolation::RepeatableReads) | the newest each key has when first read | a key read has changed |
/// | [`ReadCommitted`](Isolation::ReadCommitted) | the newest each key has when first read | never: last writer wins |
///
/// Every level reads a key once per attempt (a second read returns the first answer). "A
/// key read has changed" compares the key's mod revision with the one read (0 for a key
/// that was absent, so a key created since counts as changed).
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// use etcd_sync::Isolation;
/// let stm = client.stm_builder().isolation(Isolation::RepeatableReads);
/// stm.run(|tx| {
///     let latest = tx.get("latest")?.unwrap_or_default();
///     tx.put("seen", latest);
///     Ok::<_, etcd_sync::Error>(())
/// })?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Isolation {
    /// Serializable, and also fails on write-write conflicts: the commit fails if a key the
    /// transaction read has changed, or if a key it writes was written by anyone after its
    /// snapshot. Reads see one snapshot (the first read's revision). Go's default.
    #[default]
    SerializableSnapshot,
    /// Reads see one snapshot (the first read's revision); the commit fails if a key read
    /// has changed since. Blind writes (keys written but not read) never conflict.
    Serializable,
    /// Each key is read once, at the newest revision the member asked has; the commit
    /// fails if a key read has changed since. Two reads may come from different revisions.
    RepeatableReads,
    /// Each key is read once, at the newest revision the member asked has; the commit
    /// never fails: writes apply whatever happened to the keys read (lost updates are
    /// possible). For transactions that only need their writes applied together.
    ReadCommitted,
}

/// A software transaction's options, and [`run`](StmBuilder::run) to run one: the
/// [`Isolation`] level, a bound on retries after conflicts, keys to read up front. Made by
/// [`Client::stm_builder`]; reusable (each `run` is one transaction).
///
/// ```no_run
/// use etcd_sync::Isolation;
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let next_id = client
///     .stm_builder()
///     .isolation(Isolation::SerializableSnapshot)
///     .max_retries(10)
///     .run(|tx| {
///         let id: u64 = tx.get("ids/next")?.and_then(|v| String::from_utf8(v).ok()?.parse().ok()).unwrap_or(1);
///         tx.put("ids/next", (id + 1).to_string());
///         Ok::<_, etcd_sync::Error>(id)
///     })?;
/// println!("got id {next_id}");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct StmBuilder {
    client: Client,
    isolation: Isolation,
    max_retries: Option<u32>,
    prefetch: Vec<Vec<u8>>,
}

impl Client {
    /// Runs `apply` as a software transaction with the default options
    /// ([`Isolation::SerializableSnapshot`], no bound on retries): the same as
    /// `client.stm_builder().run(apply)`, which documents it, with this crate's [`Error`]
    /// as the closure's error type (so `Ok(value)` needs no annotation). For an error type
    /// of your own, which passes through unchanged, use
    /// [`stm_builder`](Client::stm_builder)`().run(..)`.
    ///
    /// # Errors
    ///
    /// As [`StmBuilder::run`], but for [`Error::Conflict`], which needs a bound on retries:
    /// the closure's own error at once, a failed read, or the commit's failure.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let total = client.stm(|tx| {
    ///     let a: i64 = tx.get("a")?.and_then(|v| String::from_utf8(v).ok()?.parse().ok()).unwrap_or(0);
    ///     tx.put("b", (a * 2).to_string());
    ///     Ok(a * 2)
    /// })?;
    /// println!("wrote {total}");
    /// # Ok(()) }
    /// ```
    pub fn stm<T, F>(&self, apply: F) -> Result<T, Error>
    where
        F: FnMut(&mut StmTx<'_>) -> Result<T, Error>,
    {
        self.stm_builder().run(apply)
    }

    /// Options for a software transaction (Go's `concurrency.NewSTM` and its options):
    /// the [`Isolation`] level, a bound on retries, keys to prefetch; then
    /// [`run`](StmBuilder::run).
    ///
    /// ```no_run
    /// use etcd_sync::Isolation;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let stm = client.stm_builder().isolation(Isolation::Serializable).max_retries(3);
    /// stm.run(|tx| {
    ///     tx.put("k", "v");
    ///     Ok::<_, etcd_sync::Error>(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn stm_builder(&self) -> StmBuilder {
        StmBuilder {
            client: self.clone(),
            isolation: Isolation::default(),
            max_retries: None,
            prefetch: Vec::new(),
        }
    }
}

impl StmBuilder {
    /// The isolation level ([`Isolation::SerializableSnapshot`] by default, as in Go).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let stm = client.stm_builder().isolation(etcd_sync::Isolation::ReadCommitted);
    /// # let _ = stm;
    /// # Ok(()) }
    /// ```
    pub fn isolation(mut self, isolation: Isolation) -> StmBuilder {
        self.isolation = isolation;
        self
    }

    /// Runs the closure again at most `retries` times after a conflict (so at most
    /// `retries + 1` times in all), then gives up with [`Error::Conflict`]. Without it,
    /// as in Go, the transaction retries until it commits (each conflict means another
    /// writer committed, so the system as a whole makes progress, but one transaction may
    /// wait behind a busy key for long). `max_retries(0)`: one attempt only.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let outcome = client.stm_builder().max_retries(5).run(|tx| {
    ///     let n = tx.get("hot")?.map_or(0, |v| v.len());
    ///     tx.put("hot", "x".repeat(n + 1));
    ///     Ok::<_, etcd_sync::Error>(())
    /// });
    /// match outcome {
    ///     Err(e) if e.is_conflict() => eprintln!("too busy, try later: {e}"),
    ///     other => other?,
    /// }
    /// # Ok(()) }
    /// ```
    pub fn max_retries(mut self, retries: u32) -> StmBuilder {
        self.max_retries = Some(retries);
        self
    }

    /// Keys to read before each attempt runs the closure, all in one request (Go's
    /// `WithPrefetch`): a transaction that always reads the same keys saves a round trip
    /// per key. They join the read set as if read by [`StmTx::get`]. Adds to earlier
    /// calls. An empty key makes [`run`](StmBuilder::run) fail with
    /// [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// client.stm_builder().prefetch(["accounts/alice", "accounts/bob"]).run(|tx| {
    ///     let alice = tx.get("accounts/alice")?; // no request: prefetched
    ///     let bob = tx.get("accounts/bob")?;
    ///     tx.put("accounts/alice", bob.unwrap_or_default());
    ///     tx.put("accounts/bob", alice.unwrap_or_default());
    ///     Ok::<_, etcd_sync::Error>(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn prefetch<K: AsRef<[u8]>>(mut self, keys: impl IntoIterator<Item = K>) -> StmBuilder {
        self.prefetch
            .extend(keys.into_iter().map(|k| k.as_ref().to_vec()));
        self
    }

    /// Runs `apply` as one software transaction and returns what it returned.
    ///
    /// Each attempt: `apply` runs with a fresh [`StmTx`]; its reads go to etcd (or to what
    /// the attempt read before), its writes are buffered. When it returns `Ok`, one Txn
    /// commits: if every compare of the [`Isolation`] level holds (the mod revision of each
    /// key read is the one read; for the default level, no key written was written since
    /// the snapshot), every buffered put and delete is applied at one revision and `run`
    /// returns `apply`'s value. Otherwise the attempt conflicted: `apply` runs again, with
    /// the serializable levels' reads already answered by the failed Txn (its `else`
    /// branch reads the read set: no extra round trip), until it commits or the bound of
    /// [`max_retries`](StmBuilder::max_retries) is reached. A transaction that writes
    /// nothing still commits its compares: its reads were consistent.
    ///
    /// So `apply` may run several times: keep its side effects to the `StmTx`, or make
    /// them idempotent. It runs on the calling thread; the crate holds no lock meanwhile.
    ///
    /// A transaction is one etcd Txn, so etcd's limit on operations per Txn
    /// (`--max-txn-ops`, 128 by default) bounds its keys read and its keys written (each
    /// counted separately: a read-modify-write of 128 keys commits at every level).
    ///
    /// Go's STM uses the same keys and the same compares (we leave out one that another
    /// implies), so it and this one may run transactions on the same keys at once.
    ///
    /// # Errors
    ///
    /// `E` is the closure's error type; this crate's errors reach it through `From`.
    ///
    /// * `apply`'s own `Err(e)`: returned as it is, at once, nothing committed and no
    ///   retry.
    /// * [`Error::Conflict`] ([`is_conflict`](Error::is_conflict)): every attempt the bound
    ///   allowed conflicted; nothing was committed.
    /// * A read that failed ([`StmTx::get`]'s errors), even if `apply` ignored it: nothing
    ///   was committed.
    /// * [`Error::InvalidArgument`]: an empty key was given to
    ///   [`prefetch`](StmBuilder::prefetch), [`StmTx::put`] or [`StmTx::delete`]; nothing
    ///   was sent.
    /// * [`Error::Timeout`] / [`Error::Unavailable`] of the commit: etcd did not answer.
    ///   As for [`Client::txn`], the commit may or may not have been applied, and it is
    ///   not sent again (a commit without writes is: it changes nothing).
    /// * [`Error::Server`]: etcd refused the commit: `InvalidArgument` for too many
    ///   operations (`--max-txn-ops`) or too large a request, `NotFound` for a put with a
    ///   lease that does not exist, `PermissionDenied`...; [`Error::Authentication`]:
    ///   re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// #[derive(Debug)]
    /// enum AppError {
    ///     Etcd(etcd_sync::Error),
    ///     Insufficient { balance: i64 },
    /// }
    /// impl From<etcd_sync::Error> for AppError {
    ///     fn from(e: etcd_sync::Error) -> Self {
    ///         AppError::Etcd(e)
    ///     }
    /// }
    ///
    /// # fn main() -> Result<(), AppError> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let withdrawn = client.stm_builder().max_retries(20).run(|tx| {
    ///     let balance: i64 = tx
    ///         .get("accounts/alice")?
    ///         .and_then(|v| String::from_utf8(v).ok()?.parse().ok())
    ///         .unwrap_or(0);
    ///     if balance < 10 {
    ///         return Err(AppError::Insufficient { balance }); // nothing is written
    ///     }
    ///     tx.put("accounts/alice", (balance - 10).to_string());
    ///     Ok(10)
    /// });
    /// match withdrawn {
    ///     Ok(n) => println!("withdrew {n}"),
    ///     Err(AppError::Insufficient { balance }) => println!("only {balance} left"),
    ///     Err(AppError::Etcd(e)) if e.is_conflict() => println!("too busy: {e}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn run<T, E, F>(&self, mut apply: F) -> Result<T, E>
    where
        F: FnMut(&mut StmTx<'_>) -> Result<T, E>,
        E: From<Error>,
    {
        if self.prefetch.iter().any(|key| key.is_empty()) {
            let refused = "empty key given to StmBuilder::prefetch";
            return Err(Error::InvalidArgument(refused.into()).into());
        }
        let mut tx = StmTx::new(&self.client, self.isolation);
        let mut conflicts: u32 = 0;
        loop {
            tx.begin(conflicts);
            let prefetched = if self.prefetch.is_empty() {
                Ok(())
            } else {
                tx.prefetch(&self.prefetch)
            };
            let outcome = match prefetched {
                Ok(()) => apply(&mut tx),
                Err(e) => Err(E::from(e)),
            };
            match outcome {
                // The snapshot was compacted away: whatever the closure made of that read
                // error, the attempt starts again.
                Err(_) if tx.must_restart() => {}
                Err(e) => return Err(e),
                Ok(value) => {
                    if let Commit::Done = tx.commit()? {
                        return Ok(value);
                    }
                }
            }
            conflicts = conflicts.saturating_add(1);
            if self.max_retries.is_some_and(|max| conflicts > max) {
                return Err(Error::Conflict {
                    attempts: conflicts,
                }
                .into());
            }
            tracing::debug!(
                conflicts,
                isolation = ?self.isolation,
                "stm: conflict, running the transaction again"
            );
        }
    }
}
