//! A fault that strikes between two writes of one operation: the cluster answers the next
//! `n` writes and then loses its leader, its answers, or its consent to deletes. A recipe
//! that writes twice (a re-campaign's join and its put, a join and its cleanup) meets the
//! fault at its second write, which no timing of the other faults provokes on demand.
//! Deletes refused for good, and deletes or reads that time out for a while, are set here
//! too.

use super::SimCluster;
use crate::transport::generated::etcdserverpb as pb;
use pb::request_op::Request as Op;

/// What strikes once the writes counted by [`SimCluster::after_writes`] are answered.
///
/// ```
/// use etcd_sync::testing::sim::AfterWrites;
///
/// assert_ne!(AfterWrites::LoseLeader, AfterWrites::SwallowAnswers);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AfterWrites {
    /// The cluster loses its leader, as [`SimCluster::set_leader`]`(None)`: every member
    /// refuses with "etcdserver: no leader" until a leader is set again.
    LoseLeader,
    /// Every member applies writes and swallows their answers, as
    /// [`SimCluster::set_swallow_writes`]`(i, true)` for each `i`, until that is undone.
    SwallowAnswers,
    /// Every member refuses deletes, as [`SimCluster::set_deny_deletes`]`(true)`.
    DenyDeletes,
    /// Every member times deletes out, as
    /// [`SimCluster::set_time_out`]`(TimedOut::Deletes, true)`.
    TimeOutDeletes,
}

/// The faults of this file in the cluster's state.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Faults {
    /// The fault waiting for its writes.
    pub(crate) pending: Option<Pending>,
    /// Requests that delete are refused.
    pub(crate) deny_deletes: bool,
    /// Requests that delete time out (not applied).
    pub(crate) time_out_deletes: bool,
    /// Linearizable and serializable reads time out.
    pub(crate) time_out_reads: bool,
}

/// Which requests [`SimCluster::set_time_out`] makes every member refuse.
///
/// ```
/// use etcd_sync::testing::sim::TimedOut;
///
/// assert_ne!(TimedOut::Deletes, TimedOut::Reads);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimedOut {
    /// A DeleteRange, or a Txn with a delete on either branch.
    Deletes,
    /// A Range.
    Reads,
}

/// What a member answers a request [`SimCluster::set_time_out`] refuses.
pub(crate) const TIMED_OUT: &str = "etcdserver: request timed out";

/// The fault waiting for its writes, and how many are left to answer first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    left: u64,
    fault: AfterWrites,
}

impl SimCluster {
    /// Answers the next `n` writes (Put, DeleteRange and Txn requests, read-only Txns
    /// included, on any member) as usual, and then strikes with `fault`; `n` 0 strikes at
    /// once. A later call replaces a fault that has not struck yet.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use etcd_sync::testing::sim::{AfterWrites, SimCluster};
    ///
    /// let cluster = SimCluster::start(1)?;
    /// let client = etcd_sync::Client::connect(cluster.endpoints())?;
    /// cluster.after_writes(1, AfterWrites::LoseLeader);
    /// client.put("first", "answered")?;
    /// assert_eq!(cluster.leader(), None);
    /// assert!(client.put("second", "refused").is_err());
    /// # Ok(()) }
    /// ```
    pub fn after_writes(&self, n: u64, fault: AfterWrites) {
        let mut state = self.shared.lock();
        state.after_writes.pending = Some(Pending { left: n, fault });
        if n == 0 {
            state.after_writes.pending = None;
            state.strike(fault);
        }
    }
}

impl SimCluster {
    /// How many writes are still to be answered before the fault of
    /// [`after_writes`](SimCluster::after_writes) strikes (`None`: no fault is waiting).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use etcd_sync::testing::sim::{AfterWrites, SimCluster};
    ///
    /// let cluster = SimCluster::start(1)?;
    /// assert_eq!(cluster.writes_before_fault(), None);
    /// cluster.after_writes(3, AfterWrites::SwallowAnswers);
    /// assert_eq!(cluster.writes_before_fault(), Some(3));
    /// # Ok(()) }
    /// ```
    pub fn writes_before_fault(&self) -> Option<u64> {
        self.shared.lock().after_writes.pending.map(|p| p.left)
    }

    /// Withdraws the fault of [`after_writes`](SimCluster::after_writes) if it has not
    /// struck yet; whether one was waiting.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use etcd_sync::testing::sim::{AfterWrites, SimCluster};
    ///
    /// let cluster = SimCluster::start(1)?;
    /// cluster.after_writes(1, AfterWrites::LoseLeader);
    /// assert!(cluster.cancel_after_writes());
    /// assert!(!cluster.cancel_after_writes());
    /// # Ok(()) }
    /// ```
    pub fn cancel_after_writes(&self) -> bool {
        self.shared.lock().after_writes.pending.take().is_some()
    }
}

impl SimCluster {
    /// Makes every member refuse a request that deletes (a DeleteRange, or a Txn with a
    /// delete on either branch: etcd checks both) with "etcdserver: permission denied"
    /// (`true`), as etcd refuses a user whose role lost its write permission; or serve them
    /// again (`false`).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// let client = etcd_sync::Client::connect(cluster.endpoints())?;
    /// client.put("kept", "1")?;
    /// cluster.set_deny_deletes(true);
    /// assert!(client.delete("kept").is_err());
    /// cluster.set_deny_deletes(false);
    /// assert_eq!(client.delete("kept")?, 1);
    /// # Ok(()) }
    /// ```
    pub fn set_deny_deletes(&self, deny: bool) {
        self.shared.lock().after_writes.deny_deletes = deny;
    }
}

impl SimCluster {
    /// Makes every member refuse `what` with "etcdserver: request timed out", unapplied
    /// (`true`), as a member does whose proposal or read index does not come back in
    /// time, while watches and keep-alives go on; or serve them again (`false`). A client
    /// gives a request up after its own retries; what retries after that is the caller's.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use etcd_sync::testing::sim::{SimCluster, TimedOut};
    ///
    /// let cluster = SimCluster::start(1)?;
    /// let client = etcd_sync::Client::builder()
    ///     .endpoints(cluster.endpoints())
    ///     .request_timeout(std::time::Duration::from_millis(300))
    ///     .connect()?;
    /// client.put("kept", "1")?;
    /// cluster.set_time_out(TimedOut::Reads, true);
    /// assert!(client.get("kept").is_err_and(|e| e.is_retryable()));
    /// cluster.set_time_out(TimedOut::Reads, false);
    /// assert!(client.get("kept")?.is_some());
    /// # Ok(()) }
    /// ```
    pub fn set_time_out(&self, what: TimedOut, on: bool) {
        let mut state = self.shared.lock();
        match what {
            TimedOut::Deletes => state.after_writes.time_out_deletes = on,
            TimedOut::Reads => state.after_writes.time_out_reads = on,
        }
    }
}

/// Whether `req` deletes on a branch.
fn deletes(req: &pb::TxnRequest) -> bool {
    req.success
        .iter()
        .chain(&req.failure)
        .any(|op| matches!(op.request, Some(Op::RequestDeleteRange(_))))
}

/// Whether `req` is refused by [`SimCluster::set_deny_deletes`]: it deletes on a branch.
pub(crate) fn denied(faults: &Faults, req: &pb::TxnRequest) -> bool {
    faults.deny_deletes && deletes(req)
}

/// Whether `req` times out by [`SimCluster::set_time_out`]`(TimedOut::Deletes, true)`.
pub(crate) fn timed_out(faults: &Faults, req: &pb::TxnRequest) -> bool {
    faults.time_out_deletes && deletes(req)
}

/// Counts one answered write: the fault to strike now if this write used up the count
/// (it then meets the writes after it).
pub(crate) fn answered(faults: &mut Faults) -> Option<AfterWrites> {
    let waiting = faults.pending.as_mut()?;
    waiting.left = waiting.left.saturating_sub(1);
    if waiting.left > 0 {
        return None;
    }
    faults.pending.take().map(|p| p.fault)
}
