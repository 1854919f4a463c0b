//! The simulated cluster's replicated state machine: etcd's MVCC key-value store, with
//! revisions, each key's create and mod revision and version, reads at past revisions,
//! transactions (read-your-writes inside one), compaction, and the change events that
//! watchers are served from. Semantics follow etcd 3.4's `apply.go` and `mvcc/`: a range's
//! `count` ignores the revision filters, a value compare on a missing key fails, a
//! transaction with writes makes one revision whose changes have sub-revisions in order.

use std::collections::BTreeMap;

use crate::transport::generated::etcdserverpb as pb;
use crate::transport::generated::mvccpb;
use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::range_request::{SortOrder, SortTarget};
use pb::request_op::Request;
use pb::response_op::Response;

/// A refusal in etcd's words: the gRPC code and message etcd sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) code: tonic::Code,
    pub(crate) message: &'static str,
}

impl Refusal {
    pub(crate) const COMPACTED: Refusal = Refusal {
        code: tonic::Code::OutOfRange,
        message: "etcdserver: mvcc: required revision has been compacted",
    };
    pub(crate) const FUTURE_REV: Refusal = Refusal {
        code: tonic::Code::OutOfRange,
        message: "etcdserver: mvcc: required revision is a future revision",
    };
    pub(crate) const LEASE_NOT_FOUND: Refusal = Refusal {
        code: tonic::Code::NotFound,
        message: "etcdserver: requested lease not found",
    };
    pub(crate) const EMPTY_KEY: Refusal = Refusal {
        code: tonic::Code::InvalidArgument,
        message: "etcdserver: key is not provided",
    };
    pub(crate) const DUPLICATE_KEY: Refusal = Refusal {
        code: tonic::Code::InvalidArgument,
        message: "etcdserver: duplicate key given in txn request",
    };
    pub(crate) const TOO_MANY_OPS: Refusal = Refusal {
        code: tonic::Code::InvalidArgument,
        message: "etcdserver: too many operations in txn request",
    };

    pub(crate) fn status(&self) -> tonic::Status {
        tonic::Status::new(self.code, self.message)
    }
}

/// etcd's default `--max-txn-ops`.
const MAX_TXN_OPS: usize = 128;

/// One state of a key: its value at revision (`rev`, `sub`), or its deletion (`None`).
#[derive(Debug, Clone)]
struct Version {
    rev: i64,
    sub: i64,
    kv: Option<mvccpb::KeyValue>,
}

/// One change, as a watcher receives it (with the previous value, for `prev_kv`).
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) rev: i64,
    pub(crate) sub: i64,
    pub(crate) event: mvccpb::Event,
}

/// The key-value store.
#[derive(Debug, Default)]
pub(crate) struct Store {
    /// The newest revision (1 for an empty store, as etcd's).
    rev: i64,
    /// Revisions up to this one are compacted (0: none).
    compacted: i64,
    /// Every key's states, oldest first, back to the last one at or before `compacted`.
    keys: BTreeMap<Vec<u8>, Vec<Version>>,
    /// Compaction keeps a delete at exactly the compact revision, so a watcher that starts
    /// there gets it (etcd 3.4.34, 3.5.15 and later); before, it was dropped (etcd #18089).
    pub(crate) keeps_compacted_tombstones: bool,
}

/// The keys `[key, end)` in etcd's encoding: an empty `end` is `key` alone, `"\0"` every
/// key from `key` on.
fn in_range(key: &[u8], end: &[u8], candidate: &[u8]) -> bool {
    match end {
        [] => candidate == key,
        [0] => candidate >= key,
        end => candidate >= key && candidate < end,
    }
}

impl Store {
    pub(crate) fn new() -> Store {
        Store {
            rev: 1,
            ..Store::default()
        }
    }

    pub(crate) fn revision(&self) -> i64 {
        self.rev
    }

    #[cfg(test)]
    pub(crate) fn compacted(&self) -> i64 {
        self.compacted
    }

    /// The live keys in `[key, end)` at revision `at`, in key order.
    fn live_at(&self, key: &[u8], end: &[u8], at: i64) -> Vec<mvccpb::KeyValue> {
        let upper = match end {
            [] => std::ops::Bound::Included(key.to_vec()),
            [0] => std::ops::Bound::Unbounded,
            end if end <= key => return Vec::new(),
            end => std::ops::Bound::Excluded(end.to_vec()),
        };
        self.keys
            .range((std::ops::Bound::Included(key.to_vec()), upper))
            .filter_map(|(_, versions)| {
                versions
                    .iter()
                    .rev()
                    .find(|v| v.rev <= at)
                    .and_then(|v| v.kv.clone())
            })
            .collect()
    }

    /// The current value of one key.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &[u8]) -> Option<mvccpb::KeyValue> {
        self.live_at(key, &[], self.rev).pop()
    }

    /// Every live key attached to `lease`, in key order.
    pub(crate) fn keys_of_lease(&self, lease: i64) -> Vec<Vec<u8>> {
        self.live_at(&[0], &[0], self.rev)
            .into_iter()
            .filter(|kv| kv.lease == lease)
            .map(|kv| kv.key)
            .collect()
    }

    /// A Range, read at `req.revision` (0: newest), as of store revision `now` (inside a
    /// transaction with writes: the revision it is making).
    pub(crate) fn range_at(
        &self,
        req: &pb::RangeRequest,
        now: i64,
    ) -> Result<pb::RangeResponse, Refusal> {
        let at = if req.revision <= 0 { now } else { req.revision };
        if at > now {
            return Err(Refusal::FUTURE_REV);
        }
        if at < self.compacted {
            return Err(Refusal::COMPACTED);
        }
        let mut kvs = self.live_at(&req.key, &req.range_end, at);
        let count = kvs.len() as i64;
        if req.count_only {
            return Ok(pb::RangeResponse {
                header: Some(header(now)),
                count,
                ..Default::default()
            });
        }
        kvs.retain(|kv| {
            (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
                && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
                && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
                && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
        });
        let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
        let mut order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
        if target != SortTarget::Key && order == SortOrder::None {
            order = SortOrder::Ascend;
        }
        if order != SortOrder::None {
            // Stable: equal targets stay in key order.
            kvs.sort_by(|a, b| {
                let ordering = match target {
                    SortTarget::Key => a.key.cmp(&b.key),
                    SortTarget::Version => a.version.cmp(&b.version),
                    SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                    SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                    SortTarget::Value => a.value.cmp(&b.value),
                };
                if order == SortOrder::Descend {
                    ordering.reverse()
                } else {
                    ordering
                }
            });
        }
        let mut more = false;
        if req.limit > 0 && kvs.len() as i64 > req.limit {
            kvs.truncate(req.limit as usize);
            more = true;
        }
        if req.keys_only {
            for kv in &mut kvs {
                kv.value.clear();
            }
        }
        Ok(pb::RangeResponse {
            header: Some(header(now)),
            kvs,
            more,
            count,
        })
    }

    /// A Range on its own (a linearizable read: the newest revision).
    pub(crate) fn range(&self, req: &pb::RangeRequest) -> Result<pb::RangeResponse, Refusal> {
        self.range_at(req, self.rev)
    }

    /// Whether one compare holds now.
    fn holds(&self, compare: &pb::Compare, now: i64) -> bool {
        let kvs = self.live_at(&compare.key, &compare.range_end, now);
        let target = CompareTarget::try_from(compare.target).unwrap_or(CompareTarget::Version);
        if kvs.is_empty() {
            if target == CompareTarget::Value {
                return false;
            }
            return compare_kv(compare, target, &mvccpb::KeyValue::default());
        }
        kvs.iter().all(|kv| compare_kv(compare, target, kv))
    }

    /// Applies a transaction (a Put or DeleteRange is one with a single op and no compare);
    /// `lease_exists` answers for the leases its puts name. Returns the answer and the
    /// changes it made (none: the revision did not move).
    pub(crate) fn txn(
        &mut self,
        req: &pb::TxnRequest,
        lease_exists: &dyn Fn(i64) -> bool,
    ) -> Result<(pb::TxnResponse, Vec<Change>), Refusal> {
        if req.success.len() > MAX_TXN_OPS || req.failure.len() > MAX_TXN_OPS {
            return Err(Refusal::TOO_MANY_OPS);
        }
        check_ops(&req.success)?;
        check_ops(&req.failure)?;
        let mut batch = Batch {
            rev: self.rev + 1,
            changes: Vec::new(),
        };
        // Validate the branches that run before changing anything, as etcd does.
        self.check_leases(req, lease_exists)?;
        let mut resp = self.run_txn(req, &mut batch);
        let changes = batch.changes;
        log_changes(&changes);
        if !changes.is_empty() {
            self.rev += 1;
        }
        resp.header = Some(header(self.rev));
        Ok((resp, changes))
    }

    /// The ops of the branch `req`'s compares choose. Every compare, nested ones too, is
    /// judged on the store as it was before the transaction (etcd's `compareToPath`).
    fn branch<'a>(&self, req: &'a pb::TxnRequest) -> (bool, &'a [pb::RequestOp]) {
        let succeeded = req.compare.iter().all(|c| self.holds(c, self.rev));
        (
            succeeded,
            if succeeded {
                &req.success
            } else {
                &req.failure
            },
        )
    }

    /// Every put on the branch that runs (nested transactions included, each judged now)
    /// names a lease that exists, or none.
    fn check_leases(
        &self,
        req: &pb::TxnRequest,
        lease_exists: &dyn Fn(i64) -> bool,
    ) -> Result<(), Refusal> {
        let (_, ops) = self.branch(req);
        for op in ops {
            match &op.request {
                Some(Request::RequestPut(put)) if put.lease != 0 && !lease_exists(put.lease) => {
                    return Err(Refusal::LEASE_NOT_FOUND);
                }
                Some(Request::RequestTxn(inner)) => self.check_leases(inner, lease_exists)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Runs the chosen branch of `req` into `batch`.
    fn run_txn(&mut self, req: &pb::TxnRequest, batch: &mut Batch) -> pb::TxnResponse {
        let (succeeded, ops) = self.branch(req);
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            let response = match &op.request {
                Some(Request::RequestRange(range)) => {
                    let now = self.now(batch);
                    // Checked ranges inside a Txn cannot fail but for a bad revision,
                    // which etcd also answers with an empty response at this point.
                    Response::ResponseRange(self.range_at(range, now).unwrap_or_default())
                }
                Some(Request::RequestPut(put)) => Response::ResponsePut(self.put(put, batch)),
                Some(Request::RequestDeleteRange(delete)) => {
                    Response::ResponseDeleteRange(self.delete(delete, batch))
                }
                Some(Request::RequestTxn(inner)) => {
                    // etcd leaves a nested transaction's answer without a header.
                    let mut nested = self.run_txn(inner, batch);
                    nested.header = None;
                    Response::ResponseTxn(nested)
                }
                None => continue,
            };
            responses.push(pb::ResponseOp {
                response: Some(response),
            });
        }
        pb::TxnResponse {
            header: Some(header(self.now(batch))),
            succeeded,
            responses,
        }
    }

    fn put(&mut self, req: &pb::PutRequest, batch: &mut Batch) -> pb::PutResponse {
        let prev = self.get_at(&req.key, batch);
        let sub = batch.changes.len() as i64;
        let kv = mvccpb::KeyValue {
            key: req.key.clone(),
            create_revision: prev.as_ref().map_or(batch.rev, |p| p.create_revision),
            mod_revision: batch.rev,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            value: if req.ignore_value {
                prev.as_ref().map(|p| p.value.clone()).unwrap_or_default()
            } else {
                req.value.clone()
            },
            lease: if req.ignore_lease {
                prev.as_ref().map_or(0, |p| p.lease)
            } else {
                req.lease
            },
        };
        self.keys.entry(req.key.clone()).or_default().push(Version {
            rev: batch.rev,
            sub,
            kv: Some(kv.clone()),
        });
        batch.changes.push(Change {
            rev: batch.rev,
            sub,
            event: mvccpb::Event {
                r#type: mvccpb::event::EventType::Put as i32,
                kv: Some(kv),
                prev_kv: prev.clone(),
            },
        });
        pb::PutResponse {
            header: Some(header(batch.rev)),
            prev_kv: if req.prev_kv { prev } else { None },
        }
    }

    /// The revision a transaction's reads see: its own, once it has written.
    fn now(&self, batch: &Batch) -> i64 {
        if batch.changes.is_empty() {
            self.rev
        } else {
            batch.rev
        }
    }

    /// A key's value as the batch has left it so far.
    fn get_at(&self, key: &[u8], batch: &Batch) -> Option<mvccpb::KeyValue> {
        let at = self.now(batch);
        self.live_at(key, &[], at).pop()
    }

    fn delete(
        &mut self,
        req: &pb::DeleteRangeRequest,
        batch: &mut Batch,
    ) -> pb::DeleteRangeResponse {
        let at = self.now(batch);
        let gone = self.live_at(&req.key, &req.range_end, at);
        for kv in &gone {
            let sub = batch.changes.len() as i64;
            self.keys.entry(kv.key.clone()).or_default().push(Version {
                rev: batch.rev,
                sub,
                kv: None,
            });
            batch.changes.push(Change {
                rev: batch.rev,
                sub,
                event: mvccpb::Event {
                    r#type: mvccpb::event::EventType::Delete as i32,
                    kv: Some(mvccpb::KeyValue {
                        key: kv.key.clone(),
                        mod_revision: batch.rev,
                        ..Default::default()
                    }),
                    prev_kv: Some(kv.clone()),
                },
            });
        }
        pb::DeleteRangeResponse {
            header: Some(header(self.now(batch))),
            deleted: gone.len() as i64,
            prev_kvs: if req.prev_kv { gone } else { Vec::new() },
        }
    }

    /// Deletes `keys` in one revision (a lease's revocation or expiry: etcd deletes its
    /// keys in key order, in one transaction).
    pub(crate) fn delete_keys(&mut self, keys: &[Vec<u8>]) -> Vec<Change> {
        let mut batch = Batch {
            rev: self.rev + 1,
            changes: Vec::new(),
        };
        for key in keys {
            let req = pb::DeleteRangeRequest {
                key: key.clone(),
                ..Default::default()
            };
            self.delete(&req, &mut batch);
        }
        if !batch.changes.is_empty() {
            self.rev += 1;
        }
        log_changes(&batch.changes);
        batch.changes
    }
}

/// The writes of one transaction: they all get revision `rev`.
struct Batch {
    rev: i64,
    changes: Vec<Change>,
}

/// A header with only the revision (the member fills in the rest).
fn header(revision: i64) -> pb::ResponseHeader {
    pb::ResponseHeader {
        revision,
        ..Default::default()
    }
}

/// etcd's checks of a branch before anything runs: keys given, no key put twice or put and
/// deleted in one branch.
fn check_ops(ops: &[pb::RequestOp]) -> Result<(), Refusal> {
    let mut puts: Vec<&[u8]> = Vec::new();
    let mut deletes: Vec<(&[u8], &[u8])> = Vec::new();
    for op in ops {
        match &op.request {
            Some(Request::RequestRange(r)) if r.key.is_empty() => return Err(Refusal::EMPTY_KEY),
            Some(Request::RequestPut(p)) => {
                if p.key.is_empty() {
                    return Err(Refusal::EMPTY_KEY);
                }
                if puts.contains(&p.key.as_slice()) {
                    return Err(Refusal::DUPLICATE_KEY);
                }
                puts.push(&p.key);
            }
            Some(Request::RequestDeleteRange(d)) => {
                if d.key.is_empty() {
                    return Err(Refusal::EMPTY_KEY);
                }
                deletes.push((&d.key, &d.range_end));
            }
            Some(Request::RequestTxn(inner)) => {
                check_ops(&inner.success)?;
                check_ops(&inner.failure)?;
            }
            _ => {}
        }
    }
    if puts
        .iter()
        .any(|put| deletes.iter().any(|(key, end)| in_range(key, end, put)))
    {
        return Err(Refusal::DUPLICATE_KEY);
    }
    Ok(())
}

/// etcd's `compareKV`.
fn compare_kv(compare: &pb::Compare, target: CompareTarget, kv: &mvccpb::KeyValue) -> bool {
    let ordering = match (&compare.target_union, target) {
        (Some(TargetUnion::Value(v)), CompareTarget::Value) => kv.value.as_slice().cmp(v),
        (Some(TargetUnion::Version(v)), CompareTarget::Version) => kv.version.cmp(v),
        (Some(TargetUnion::CreateRevision(v)), CompareTarget::Create) => kv.create_revision.cmp(v),
        (Some(TargetUnion::ModRevision(v)), CompareTarget::Mod) => kv.mod_revision.cmp(v),
        (Some(TargetUnion::Lease(v)), CompareTarget::Lease) => kv.lease.cmp(v),
        // A target with no operand of its kind compares against zero.
        (_, CompareTarget::Value) => kv.value.as_slice().cmp(&[][..]),
        (_, CompareTarget::Version) => kv.version.cmp(&0),
        (_, CompareTarget::Create) => kv.create_revision.cmp(&0),
        (_, CompareTarget::Mod) => kv.mod_revision.cmp(&0),
        (_, CompareTarget::Lease) => kv.lease.cmp(&0),
    };
    match CompareResult::try_from(compare.result).unwrap_or(CompareResult::Equal) {
        CompareResult::Equal => ordering.is_eq(),
        CompareResult::Greater => ordering.is_gt(),
        CompareResult::Less => ordering.is_lt(),
        CompareResult::NotEqual => ordering.is_ne(),
    }
}

mod history;
#[cfg(test)]
mod tests;

/// Every change, in the debug log of a replayed seed (`ETCD_SYNC_SIM_LOG`).
fn log_changes(changes: &[Change]) {
    for change in changes {
        let deleted = change.event.r#type == mvccpb::event::EventType::Delete as i32;
        let key = change
            .event
            .kv
            .as_ref()
            .map(|kv| kv.key.as_slice())
            .unwrap_or_default();
        tracing::debug!(
            target: "etcd_sync::sim::store",
            rev = change.rev,
            "{} {}",
            if deleted { "delete" } else { "put" },
            String::from_utf8_lossy(key)
        );
    }
}
