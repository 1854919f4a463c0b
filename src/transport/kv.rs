//! Key-value calls in our own types: reads, writes and transactions, with the retry rule
//! each one allows.

use super::convert::{range_request, txn_request};
use super::generated::etcdserverpb as pb;
use super::{Retry, Rpc};
use crate::support::error::Result;
use crate::support::kv::{KeyValue, Range, Txn, TxnResponse};
use pb::kv_client::KvClient;

/// What a read returned, and the store revision it saw.
pub(crate) struct Read {
    pub(crate) kvs: Vec<KeyValue>,
    pub(crate) revision: i64,
}

impl Rpc {
    /// A linearizable read (retried on the next endpoints: reads change nothing).
    pub(crate) async fn read(&self, range: &Range) -> Result<Read> {
        let resp = self
            .unary(Retry::Safe, range_request(range), |ch, r| async move {
                KvClient::new(ch).range(r).await
            })
            .await?;
        Ok(Read {
            revision: resp.header.map_or(0, |h| h.revision),
            kvs: resp.kvs.into_iter().map(KeyValue::from).collect(),
        })
    }

    /// A plain put; returns the revision of the write. Never retried: it could apply twice.
    pub(crate) async fn put(&self, key: Vec<u8>, value: Vec<u8>, lease: i64) -> Result<i64> {
        let req = pb::PutRequest {
            key,
            value,
            lease,
            ..Default::default()
        };
        let resp = self
            .unary(Retry::Never, req, |ch, r| async move {
                KvClient::new(ch).put(r).await
            })
            .await?;
        Ok(resp.header.map_or(0, |h| h.revision))
    }

    /// Deletes the key or key range; returns how many keys were deleted. Never retried.
    pub(crate) async fn delete(&self, range: &Range) -> Result<i64> {
        let req = pb::DeleteRangeRequest {
            key: range.key.clone(),
            range_end: range.range_end.clone(),
            ..Default::default()
        };
        let resp = self
            .unary(Retry::Never, req, |ch, r| async move {
                KvClient::new(ch).delete_range(r).await
            })
            .await?;
        Ok(resp.deleted)
    }

    /// Runs a transaction; `retry` says whether a second application would be harmless.
    pub(crate) async fn txn(&self, txn: &Txn, retry: Retry) -> Result<TxnResponse> {
        let resp = self
            .unary(retry, txn_request(txn), |ch, r| async move {
                KvClient::new(ch).txn(r).await
            })
            .await?;
        Ok(resp.into())
    }

    /// [`txn`](Self::txn), also returning how many keys each range of the branch that ran
    /// found (etcd counts them before its limit applies), in order: how long a line is,
    /// from a read that returns only its newest keys.
    pub(crate) async fn txn_counted(
        &self,
        txn: &Txn,
        retry: Retry,
    ) -> Result<(TxnResponse, Vec<i64>)> {
        let resp = self
            .unary(retry, txn_request(txn), |ch, r| async move {
                KvClient::new(ch).txn(r).await
            })
            .await?;
        let counts = resp
            .responses
            .iter()
            .filter_map(|op| match &op.response {
                Some(pb::response_op::Response::ResponseRange(r)) => Some(r.count),
                _ => None,
            })
            .collect();
        Ok((resp.into(), counts))
    }

    /// Compacts the history up to `revision` (physical: returns once it is done).
    pub(crate) async fn compact(&self, revision: i64) -> Result<()> {
        let req = pb::CompactionRequest {
            revision,
            physical: true,
        };
        self.unary(Retry::Safe, req, |ch, r| async move {
            KvClient::new(ch).compact(r).await
        })
        .await?;
        Ok(())
    }
}
