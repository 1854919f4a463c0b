//! A key that appears right before a write that puts it and goes right after (an operator
//! putting and deleting it, a late copy of an earlier attempt applied and swept): the race
//! a join of the line bounds (`line/queue`'s `JOIN_TRIES`), which no timing of real
//! processes provokes on demand.

use super::SimCluster;
use super::lag::Applied;
use super::leases::Leases;
use super::store::Store;
use super::watchers::Watchers;
use crate::transport::generated::etcdserverpb as pb;
use pb::request_op::Request as Op;

/// The key that flickers, and how many more writes it flickers around.
#[derive(Debug, Clone)]
pub(crate) struct Flicker {
    key: Vec<u8>,
    lease: i64,
    left: usize,
    count: u64,
}

impl SimCluster {
    /// Makes `key` flicker around the next `times` transactions that put it: right before
    /// each, the store puts `key` with `lease` (a revision of its own), right after, it
    /// deletes it (another): the transaction finds the key, and a read after it finds it
    /// gone. `times` 0 stops it.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// cluster.set_flicker("jobs/694d", 0x694d, 2);
    /// assert_eq!(cluster.flickers(), 0);
    /// # Ok(()) }
    /// ```
    pub fn set_flicker(&self, key: &str, lease: i64, times: usize) {
        self.shared.lock().flicker = Some(Flicker {
            key: key.as_bytes().to_vec(),
            lease,
            left: times,
            count: 0,
        });
    }

    /// How many transactions the flickering key has appeared and gone around.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// assert_eq!(cluster.flickers(), 0);
    /// # Ok(()) }
    /// ```
    pub fn flickers(&self) -> u64 {
        self.shared.lock().flicker.as_ref().map_or(0, |f| f.count)
    }
}

/// Before `req` is applied: if it puts the flickering key and flickers are left, puts the
/// key, and returns it (to delete after `req`).
pub(crate) fn before(
    flicker: &mut Option<Flicker>,
    (store, leases, watchers): (&mut Store, &Leases, &mut Watchers),
    req: &pb::TxnRequest,
) -> Option<Vec<u8>> {
    let flicker = flicker.as_mut().filter(|f| f.left > 0)?;
    let puts_it = req.success.iter().any(|op| match &op.request {
        Some(Op::RequestPut(put)) => put.key == flicker.key,
        _ => false,
    });
    if !puts_it {
        return None;
    }
    flicker.left -= 1;
    flicker.count += 1;
    let key = flicker.key.clone();
    let put = pb::TxnRequest {
        success: vec![pb::RequestOp {
            request: Some(Op::RequestPut(pb::PutRequest {
                key: key.clone(),
                value: b"flicker".to_vec(),
                lease: flicker.lease,
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    let (_, changes) = store.txn(&put, &|id| leases.exists(id)).ok()?;
    watchers.notify(&changes, store.revision());
    Some(key)
}

/// After the transaction: deletes the key [`before`] put.
pub(crate) fn after(
    (store, watchers, applied): (&mut Store, &mut Watchers, &mut Applied),
    key: Vec<u8>,
) {
    let changes = store.delete_keys(&[key]);
    let revision = store.revision();
    watchers.notify(&changes, revision);
    applied.record(revision);
}
