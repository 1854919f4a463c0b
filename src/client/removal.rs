//! Removing a key only while it is ours: the guarded delete behind every release, every
//! cleanup after a wait, and the follow task's sweep of late-applied joins.

use crate::support::error::Result;
use crate::support::kv::{Compare, CompareOp, Txn, TxnOp};
use crate::transport::{Retry, Rpc};

/// What proves a key is ours when removing it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owned {
    /// The key still has this create revision: a stale or retried release can never delete
    /// a newer holder's key (upstream #22082).
    Revision(i64),
    /// The key is bound to this lease: the cleanup after an ambiguous join, when we do not
    /// know our revision. Only this session's holder uses this key, so it is ours.
    Lease(i64),
}

/// Deletes `key` if it is still ours; returns whether it was.
pub(crate) async fn remove(rpc: &Rpc, key: &[u8], owned: Owned) -> Result<bool> {
    Ok(remove_at(rpc, key, owned).await?.0)
}

/// [`remove`], with the store revision of the answer.
pub(crate) async fn remove_at(rpc: &Rpc, key: &[u8], owned: Owned) -> Result<(bool, i64)> {
    let ours = match owned {
        Owned::Revision(rev) => Compare::create_revision(key, CompareOp::Equal, rev),
        Owned::Lease(lease) => Compare::lease(key, CompareOp::Equal, lease),
    };
    let txn = Txn::new().when([ours]).and_then([TxnOp::delete(key)]);
    let resp = rpc.txn(&txn, Retry::Safe).await?;
    Ok((resp.succeeded, resp.revision))
}
