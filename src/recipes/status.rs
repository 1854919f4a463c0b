//! Reading who holds a name and who waits, without a session: one linearizable Range of
//! `<name>/` sorted by create revision, split into holders and waiters by the rule the
//! waiters themselves apply ([`mode::holding`]), then one LeaseTimeToLive per distinct
//! lease. `Client::leader` and every recipe's `status()` are this read; the wait graph
//! splits each name of a wider read and looks its leases up the same way.

use std::collections::HashMap;
use std::time::Duration;

use crate::client::Client;
use crate::line::names::split;
use crate::line::queue;
use crate::recipes::holder::{Holder, Status};
use crate::support::error::code::Code;
use crate::support::error::{Error, Result};
use crate::support::kv::{KeyValue, Range};
use crate::transport::Rpc;

impl Client {
    /// Who holds lock, semaphore, read-write lock or election `name` now, and who waits, in
    /// line order; needs no session. The holders are decided by the rules the waiters
    /// apply: the oldest key holds, readers in a row hold together, the first permits of a
    /// semaphore of N hold as long as their weights fit in N (one each, k for
    /// [`acquire_many(k)`](crate::Semaphore::acquire_many)), and any other key under
    /// `<name>/` counts as exclusive.
    ///
    /// One linearizable read of the keys under `<name>/`, then one lease lookup per
    /// distinct lease for [`Holder::ttl`]. A key taken by `etcdctl lock` has an empty
    /// value: its [`Holder::identity`] is `None`.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `name` is empty, ends with `/` or is longer than 4096 bytes.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: no endpoint answered (reads and
    ///   lookups are retried on every endpoint first).
    /// * [`Error::Server`]: etcd refused a request (e.g. `PermissionDenied`);
    ///   [`Error::Authentication`]: re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let status = client.status("db-migration")?;
    /// for holder in &status.holders {
    ///     println!("held by {} until {:?}", holder.value_str(), holder.ttl);
    /// }
    /// for waiter in &status.waiters {
    ///     println!("then {}", waiter.value_str());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn status(&self, name: impl AsRef<[u8]>) -> Result<Status> {
        let name = name.as_ref();
        let prefix = queue::key_prefix(name)?;
        let rpc = self.rpc().clone();
        self.block_on(async move {
            let (line, holding, revision) = read_line(&rpc, &prefix).await?;
            let mut line = describe(&rpc, &prefix, line).await?;
            let waiters = line.split_off(holding);
            Ok(Status {
                name: name.to_vec(),
                holders: line,
                waiters,
                revision,
            })
        })
    }

    /// The current leader of election `name`, without a session: the oldest key under
    /// `<name>/`, or `Ok(None)` when nobody leads. The [`holder`](Status::holder) of
    /// [`status`](Client::status), the same read (with the lease TTL left), as
    /// [`Election::leader`](crate::Election::leader) is.
    ///
    /// # Errors
    ///
    /// As [`status`](Client::status): [`Error::InvalidArgument`] (`name` is empty,
    /// ends with `/` or is longer than 4096 bytes), [`Error::Timeout`] / [`Error::Unavailable`],
    /// [`Error::Server`], [`Error::Authentication`], [`Error::InsideAsyncRuntime`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// if let Some(leader) = client.leader("scheduler")? {
    ///     println!("{}", leader.value_str());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn leader(&self, name: impl AsRef<[u8]>) -> Result<Option<Holder>> {
        Ok(self.status(name)?.holders.into_iter().next())
    }
}

/// Reads every key under `prefix`, oldest first: the line, how many of its keys hold,
/// and the revision of the read.
pub(super) async fn read_line(rpc: &Rpc, prefix: &[u8]) -> Result<(Vec<KeyValue>, usize, i64)> {
    let range = Range {
        by_create_revision: Some(true),
        ..Range::prefix(prefix)
    };
    let read = rpc.read(&range).await?;
    let (kvs, holding) = split(prefix, read.kvs);
    Ok((kvs, holding, read.revision))
}

/// How many lease lookups are in flight at once: a long line costs round trips in
/// batches, not one after another, without flooding etcd.
const LOOKUPS_IN_FLIGHT: usize = 64;

/// `kvs` as [`Holder`]s, with one LeaseTimeToLive per distinct lease, sent concurrently.
pub(super) async fn describe(rpc: &Rpc, prefix: &[u8], kvs: Vec<KeyValue>) -> Result<Vec<Holder>> {
    let ttls = lease_ttls(rpc, kvs.iter().map(|kv| kv.lease)).await?;
    Ok(kvs
        .into_iter()
        .map(|kv| {
            let ttl = ttls.get(&kv.lease).and_then(|ttl| ttl.map(|t| t.left));
            Holder::of(prefix, kv, ttl)
        })
        .collect())
}

/// What etcd says of a live lease: the TTL left, and the TTL it was granted (the longest
/// a holder that stopped renewing keeps its keys), both in whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseTtl {
    pub(crate) left: Duration,
    pub(crate) granted: Duration,
}

/// One LeaseTimeToLive per distinct lease of `leases` but 0, [`LOOKUPS_IN_FLIGHT`] at a
/// time: `None` for a lease etcd no longer knows.
pub(crate) async fn lease_ttls(
    rpc: &Rpc,
    leases: impl IntoIterator<Item = i64>,
) -> Result<HashMap<i64, Option<LeaseTtl>>> {
    let mut leases: Vec<i64> = leases.into_iter().filter(|&l| l != 0).collect();
    leases.sort_unstable();
    leases.dedup();
    let mut ttls = HashMap::with_capacity(leases.len());
    for batch in leases.chunks(LOOKUPS_IN_FLIGHT) {
        let mut lookups = tokio::task::JoinSet::new();
        for &lease in batch {
            let rpc = rpc.clone();
            lookups.spawn(async move { (lease, ttl_left(&rpc, lease).await) });
        }
        while let Some(done) = lookups.join_next().await {
            let (lease, ttl) =
                done.map_err(|e| Error::unavailable(format!("lease lookup failed: {e}")))?;
            ttls.insert(lease, ttl?);
        }
    }
    Ok(ttls)
}

/// What is left of `lease`'s TTL and what it was granted, or `None` if etcd no longer
/// knows it (etcd 3.4 answers TTL -1; a server that reports `NotFound` instead is read the
/// same way).
async fn ttl_left(rpc: &Rpc, lease: i64) -> Result<Option<LeaseTtl>> {
    match rpc.lease_time_to_live(lease).await {
        Ok(info) => Ok(u64::try_from(info.ttl).ok().map(|left| LeaseTtl {
            left: Duration::from_secs(left),
            granted: Duration::from_secs(u64::try_from(info.granted_ttl).unwrap_or(0)),
        })),
        Err(Error::Server {
            code: Code::NotFound,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}
