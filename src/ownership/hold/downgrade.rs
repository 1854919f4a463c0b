//! Downgrading a write hold to the read hold of its twin (docs/design/downgrade.md): a
//! downgradable write owns two holds created by one Txn at one revision
//! `c`, the writer key `W` (`<name>/<lease hex>`) and its twin `R`
//! (`<name>/<lease hex>.shared`), each on its own line with its own local turn. The
//! downgrade is one Txn, `if create_revision(W) == c and create_revision(R) == c then
//! delete W, put R`: from its revision on, `R` alone holds our place, as a reader.
//!
//! The put of `R` (same value, same lease, so its create revision and place stay) is the
//! downgrade's mark: it moves `R`'s mod revision past `c`. Nothing else writes `R` while we
//! hold it, so a retried attempt that finds `W` gone can tell an earlier copy of itself
//! (`R` modified after `c`) from someone else's delete of `W`, a forced release (`R`
//! untouched since `c`): that one is a loss, never a read guard (issue 48).

use std::sync::Arc;

use super::super::requests::RequestKey;
use super::Held;
use crate::support::error::code::Code;
use crate::support::error::{Error, Result};
use crate::support::kv::{Compare, CompareOp, Range, Txn, TxnOp, TxnOpResponse};
use crate::support::signal::Signal;
use crate::support::sim::{Mutation, mutation};
use crate::transport::{Retry, Rpc};

impl Held {
    /// Gives this guard (and its hold) a "lost" signal of its own, no longer shared with
    /// another hold's; false if the hold is over or its signal already fired (a loss of
    /// either hold that shared it).
    fn unshare_signal(&mut self) -> bool {
        let fresh = Arc::new(Signal::new());
        {
            let mut state = self.hold.state();
            if state.generation != self.generation || state.ended || state.signal.is_fired() {
                return false;
            }
            state.signal = fresh.clone();
        }
        self.signal = fresh.clone();
        self.hold.line.session.lease().on_lost(&fresh);
        true
    }

    /// Downgrades the write hold `self` to `twin`, the read hold created with it: deletes
    /// our writer key only while both keys still have their create revision, then ends
    /// this hold (its local turn goes once etcd has answered) and returns `twin`, whose
    /// guard now has a "lost" signal of its own and follows its key as before.
    ///
    /// On any error both holds are dropped, so both keys are released (in the background
    /// if etcd does not answer): never a write hold whose writer key may be gone.
    pub(crate) fn downgrade(mut self, mut twin: Held) -> Result<Held> {
        crate::client::runtime::ensure_blocking_allowed()?;
        if !self.is_current() || !twin.is_current() || self.rev() != twin.rev() {
            return Err(Error::LockLost);
        }
        let lease = self.hold.line.session.lease().clone();
        lease.check()?;
        // From here the read guard's signal is its own: the delete of the writer key, which
        // the follow task reports as that key's loss, must not end it.
        if !twin.unshare_signal() {
            return Err(Error::LockLost);
        }
        let line = self.hold.line.clone();
        let client = line.session.client().clone();
        let rpc = client.rpc().clone();
        let request = RequestKey::of(&line, &line.key);
        let rev = self.rev();
        let twin_key = twin.key().to_vec();
        // The twin's own value (the enqueue put the session's identity in both keys).
        let mark = (line.session.identity().as_bytes(), line.session.lease_id());
        let downgraded = client
            .block_on(delete_writer_key(
                &rpc,
                (&line.key, &twin_key),
                (rev, mark),
                &request,
            ))
            .map_err(|e| lease.judge(e))?;
        if !downgraded {
            // Our writer key was deleted by someone else (or either key is no longer
            // ours): both holds are dropped here, the write guard's `lost()` fires and the
            // twin is released.
            tracing::warn!(key = %crate::support::kv::text(&line.key), fencing_token = rev, "writer key gone before the downgrade: the lock is lost");
            return Err(Error::LockLost);
        }
        // Our writer key is gone, as etcd said: end its hold and let its local turn go.
        drop(self.end());
        tracing::debug!(key = %crate::support::kv::text(&twin_key), fencing_token = rev, "downgraded");
        Ok(twin)
    }
}

/// `if create_revision(writer) == rev and create_revision(twin) == rev then delete writer
/// (and its release request), put twin (its value and lease `mark`)`, else read both keys.
/// True when the twin holds our place alone: the Txn deleted the writer key, or (a retried
/// attempt, after an earlier one applied) the writer key is gone and the twin is ours *and*
/// was written after `rev`, by that earlier attempt. A writer key deleted by anyone else
/// leaves the twin as the enqueue put it (mod revision `rev`): false, a loss. The outcome is
/// the same however often it applies, so it is retried like a read.
async fn delete_writer_key(
    rpc: &Rpc,
    (writer, twin): (&[u8], &[u8]),
    (rev, (value, lease)): (i64, (&[u8], i64)),
    request: &RequestKey,
) -> Result<bool> {
    let txn = |also: Option<&[u8]>| {
        let mut deletes = vec![TxnOp::delete(writer)];
        deletes.extend(also.map(TxnOp::delete));
        deletes.push(TxnOp::put_with_lease(twin, value, lease));
        Txn::new()
            .when([
                Compare::create_revision(writer, CompareOp::Equal, rev),
                Compare::create_revision(twin, CompareOp::Equal, rev),
            ])
            .and_then(deletes)
            .or_else([
                TxnOp::range(Range::key(writer)),
                TxnOp::range(Range::key(twin)),
            ])
    };
    let also = request.to_delete();
    let resp = match rpc.txn(&txn(also), Retry::Safe).await {
        Err(Error::Server {
            code: Code::PermissionDenied,
            ..
        }) if also.is_some() => {
            request.deny();
            rpc.txn(&txn(None), Retry::Safe).await?
        }
        other => other?,
    };
    if resp.succeeded {
        return Ok(true);
    }
    let mut ranges = resp.responses.into_iter().filter_map(|op| match op {
        TxnOpResponse::Get(kvs) => Some(kvs),
        _ => None,
    });
    let writer_kv = ranges.next().and_then(|kvs| kvs.into_iter().next());
    let twin_kv = ranges.next().and_then(|kvs| kvs.into_iter().next());
    let marked = |kv: &crate::support::kv::KeyValue| {
        kv.create_revision == rev
            && (kv.mod_revision > rev || mutation(Mutation::DowngradeTakesAnyGoneWriter))
    };
    Ok(writer_kv.is_none() && twin_kv.is_some_and(|kv| marked(&kv)))
}
