//! Removing a key only while it is ours: the guarded delete behind every release, every
//! cleanup after a wait, and the follow task's sweep of late-applied joins.

use crate::support::error::Result;
use crate::support::kv::{Compare, CompareOp, Range, Txn, TxnOp};
use crate::support::sim::{Mutation, mutation};
use crate::transport::{Retry, Rpc};

/// What proves a key is ours when removing it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owned {
    /// The key still has this create revision: a stale or retried release can never delete
    /// a newer holder's key (upstream #22082), and neither can a copy of the request that
    /// etcd applies late.
    Revision(i64),
    /// The key still has this create revision *and* this lease: a key of ours whose
    /// leadership was handed over keeps its create revision on the successor's lease, and
    /// a sweep of our late-applied joins must not take it (found by the simulation).
    Leased(i64, i64),
}

/// After a join whose outcome is unknown: reads `key` and, if it is bound to `lease`,
/// removes it by its create revision. Returns the revision of the read: a late-applied
/// join can only appear after it (the follow task sweeps from there).
///
/// Not "delete if bound to our lease": a copy of that request applied late (a member that
/// had it in its log when our request timed out) would delete the session's *next* key
/// under the name, and a wait or guard of ours would lose its key to nobody (found by the
/// simulation, issue 29).
pub(crate) async fn remove_if_leased(rpc: &Rpc, key: &[u8], lease: i64) -> Result<i64> {
    let read = rpc.read(&Range::key(key)).await?;
    if let Some(kv) = read.kvs.first()
        && kv.lease == lease
    {
        remove(rpc, key, Owned::Leased(kv.create_revision, lease)).await?;
    }
    Ok(read.revision)
}

/// The defect [`remove_if_leased`] fixes, for the simulation's teeth
/// (`Mutation::CleanupByLease`): delete `key` if it is bound to `lease`, whatever its
/// revision; returns the revision of the answer.
pub(crate) async fn remove_by_lease(rpc: &Rpc, key: &[u8], lease: i64) -> Result<i64> {
    let txn = Txn::new()
        .when([Compare::lease(key, CompareOp::Equal, lease)])
        .and_then([TxnOp::delete(key)]);
    Ok(rpc.txn(&txn, Retry::Safe).await?.revision)
}

/// Deletes `key` if it is still ours; returns whether it was.
pub(crate) async fn remove(rpc: &Rpc, key: &[u8], owned: Owned) -> Result<bool> {
    Ok(remove_at(rpc, key, owned).await?.0)
}

/// [`remove`], also deleting `also` in the same Txn if `key` is ours (a held key's
/// release request, which goes with the hold). When `key` is not ours, `also` is left:
/// the caller removes it with [`remove_if_gone`] if the key is gone altogether (not while
/// it exists with another create revision: then `also` may be the request of a newer
/// hold). That was this Txn's else branch once, and etcd took about 8 µs longer over
/// every release for it, taken or not (issue 49).
pub(crate) async fn remove_with(
    rpc: &Rpc,
    key: &[u8],
    owned: Owned,
    also: Option<&[u8]>,
) -> Result<bool> {
    Ok(remove_at_with(rpc, key, owned, also).await?.0)
}

/// [`remove`], with the store revision of the answer.
pub(crate) async fn remove_at(rpc: &Rpc, key: &[u8], owned: Owned) -> Result<(bool, i64)> {
    remove_at_with(rpc, key, owned, None).await
}

async fn remove_at_with(
    rpc: &Rpc,
    key: &[u8],
    owned: Owned,
    also: Option<&[u8]>,
) -> Result<(bool, i64)> {
    let (rev, lease) = match owned {
        Owned::Revision(rev) => (rev, None),
        Owned::Leased(rev, lease) => (rev, Some(lease)),
    };
    if mutation(Mutation::UnguardedRelease) {
        let resp = rpc
            .txn(&Txn::new().and_then([TxnOp::delete(key)]), Retry::Safe)
            .await?;
        let deleted = matches!(
            resp.responses.first(),
            Some(crate::support::kv::TxnOpResponse::Delete { deleted }) if *deleted > 0
        );
        return Ok((deleted, resp.revision));
    }
    let ours = Compare::create_revision(key, CompareOp::Equal, rev);
    let leased = lease.map(|lease| Compare::lease(key, CompareOp::Equal, lease));
    let mut deletes = vec![TxnOp::delete(key)];
    deletes.extend(also.map(TxnOp::delete));
    let txn = Txn::new()
        .when([ours].into_iter().chain(leased))
        .and_then(deletes);
    let resp = rpc.txn(&txn, Retry::Safe).await?;
    Ok((resp.succeeded, resp.revision))
}

/// `if key is absent then delete also`: the release request `also` of a key deleted by
/// someone else (no hold uses it any more). Never while the key exists: a key of the same
/// name with another create revision is a newer hold, and `also` may be its request. A
/// request written before the key went is for a hold that is over; one for a later hold
/// can only be written once that hold's key exists. So the Txn may apply any number of
/// times, late or not, and only ever deletes a request nobody will read.
pub(crate) fn remove_if_gone(key: &[u8], also: &[u8]) -> Txn {
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::delete(also)])
}
