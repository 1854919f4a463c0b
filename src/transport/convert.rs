//! Our key-value types to and from the generated protobuf messages: the only place that
//! spells them both, so nothing above the transport sees a generated type.

use super::generated::etcdserverpb as pb;
use super::generated::mvccpb;
use crate::support::kv::{Compare, CompareOp, CompareTarget, KeyValue, Op, Range, Txn, TxnOp};
use crate::support::kv::{TxnOpResponse, TxnResponse};

impl From<mvccpb::KeyValue> for KeyValue {
    fn from(kv: mvccpb::KeyValue) -> Self {
        KeyValue {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        }
    }
}

pub(super) fn range_request(range: &Range) -> pb::RangeRequest {
    use pb::range_request::{SortOrder, SortTarget};
    let (sort_order, sort_target) = match range.by_create_revision {
        None => (SortOrder::None, SortTarget::Key),
        Some(true) => (SortOrder::Ascend, SortTarget::Create),
        Some(false) => (SortOrder::Descend, SortTarget::Create),
    };
    pb::RangeRequest {
        key: range.key.clone(),
        range_end: range.range_end.clone(),
        limit: range.limit,
        sort_order: sort_order as i32,
        sort_target: sort_target as i32,
        max_create_revision: range.max_create_revision,
        keys_only: range.keys_only,
        revision: range.revision,
        serializable: range.serializable,
        ..Default::default()
    }
}

fn compare(c: &Compare) -> pb::Compare {
    use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let result = match c.op {
        CompareOp::Equal => R::Equal,
        CompareOp::NotEqual => R::NotEqual,
        CompareOp::Greater => R::Greater,
        CompareOp::Less => R::Less,
    };
    let (target, value) = match &c.target {
        CompareTarget::Version(v) => (T::Version, U::Version(*v)),
        CompareTarget::Create(r) => (T::Create, U::CreateRevision(*r)),
        CompareTarget::Mod(r) => (T::Mod, U::ModRevision(*r)),
        CompareTarget::Value(v) => (T::Value, U::Value(v.clone())),
        CompareTarget::Lease(l) => (T::Lease, U::Lease(*l)),
    };
    pb::Compare {
        result: result as i32,
        target: target as i32,
        key: c.key.clone(),
        target_union: Some(value),
        range_end: Vec::new(),
    }
}

fn request_op(op: &TxnOp) -> pb::RequestOp {
    use pb::request_op::Request;
    let request = match &op.0 {
        Op::Range(range) => Request::RequestRange(range_request(range)),
        Op::Put { key, value, lease } => Request::RequestPut(pb::PutRequest {
            key: key.clone(),
            value: value.clone(),
            lease: *lease,
            ..Default::default()
        }),
        Op::Delete { key } => Request::RequestDeleteRange(pb::DeleteRangeRequest {
            key: key.clone(),
            ..Default::default()
        }),
        Op::Txn(txn) => Request::RequestTxn(txn_request(txn)),
    };
    pb::RequestOp {
        request: Some(request),
    }
}

pub(super) fn txn_request(txn: &Txn) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: txn.when.iter().map(compare).collect(),
        success: txn.then.iter().map(request_op).collect(),
        failure: txn.otherwise.iter().map(request_op).collect(),
    }
}

impl From<pb::TxnResponse> for TxnResponse {
    fn from(r: pb::TxnResponse) -> Self {
        use pb::response_op::Response;
        TxnResponse {
            succeeded: r.succeeded,
            revision: r.header.map_or(0, |h| h.revision),
            responses: r
                .responses
                .into_iter()
                .filter_map(|op| op.response)
                .map(|op| match op {
                    Response::ResponseRange(r) => {
                        TxnOpResponse::Get(r.kvs.into_iter().map(KeyValue::from).collect())
                    }
                    Response::ResponsePut(_) => TxnOpResponse::Put,
                    Response::ResponseDeleteRange(d) => {
                        TxnOpResponse::Delete { deleted: d.deleted }
                    }
                    Response::ResponseTxn(t) => TxnOpResponse::Txn(t.into()),
                })
                .collect(),
        }
    }
}
