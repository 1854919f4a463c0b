//! Several holds at once: their releases sent together (a guard over several holds, such
//! as a multi-lock or a downgradable write's two keys), and guarded transactions over
//! all of them.

use std::time::Duration;

use super::{Held, Released, spawn_removal_of};
use crate::client::removal::Owned;
use crate::support::error::operation::Operation;
use crate::support::error::{Error, Result};
use crate::support::kv::{Compare, Txn, TxnOp, TxnResponse};
use crate::transport::Retry;

/// Releases every hold of `helds` at once (a guard over several holds): each removal is
/// the one a single release sends, all sent together, each in a task that owns its local
/// turn until etcd answers. Waits at most `wait` for all the answers (`None`: not at all);
/// an unanswered removal goes on in the background, and its guard's outcome is a
/// [`Error::Timeout`] (calling [`Held::release_now`] waits for it again). One outcome per
/// hold, in order.
pub(crate) fn release_together(
    helds: &mut [Held],
    wait: Option<Duration>,
) -> Vec<Result<Released>> {
    let started = crate::support::clock::now();
    let mut outcomes = Vec::with_capacity(helds.len());
    let mut removals = Vec::new();
    for (i, held) in helds.iter_mut().enumerate() {
        if held.pending.is_some() {
            outcomes.push(held.release(wait));
            continue;
        }
        outcomes.push(Ok(Released::NotCurrent));
        if let Some(local_turn) = held.end() {
            let (line, key) = (&held.hold.line, held.hold.key());
            let owned = Owned::Leased(held.hold.rev, line.session.lease_id());
            removals.push((i, spawn_removal_of(line, key, owned, local_turn)));
        }
    }
    let (Some(limit), Some(first)) = (wait, helds.first()) else {
        return outcomes; // the removals run in the background
    };
    let client = first.hold.line.session.client().clone();
    let first_removal = removals.first().map(|(i, _)| *i);
    let answered = client.block_on(async {
        let deadline = tokio::time::Instant::now() + limit;
        let mut answers = Vec::with_capacity(removals.len());
        for (i, mut removal) in removals {
            let answer = tokio::time::timeout_at(deadline, &mut removal).await;
            answers.push((i, removal, answer));
        }
        Ok(answers)
    });
    let answers = match answered {
        Ok(answers) => answers,
        Err(e) => {
            // Not waited for (an async worker thread): the removals go on regardless.
            if let Some(i) = first_removal {
                outcomes[i] = Err(e);
            }
            return outcomes;
        }
    };
    for (i, removal, answer) in answers {
        outcomes[i] = match answer {
            Ok(Ok(Ok(true))) => Ok(Released::Deleted),
            Ok(Ok(Ok(false))) => Ok(Released::NotOurs),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => {
                helds[i].pending = Some(removal);
                Err(Error::Timeout {
                    operation: Operation::Release,
                    after: crate::support::clock::since(started),
                    endpoint: None,
                })
            }
        };
    }
    outcomes
}

/// [`Held::guarded_txn`] over every hold of `helds` (on one client): `txn` commits only
/// while every key still has its create revision, all compares in one Txn. `Ok(None)`
/// if any is not ours; nothing is sent once this process knows one hold is over.
pub(crate) fn guarded_txn_all(helds: &[Held], txn: Txn) -> Result<Option<TxnResponse>> {
    let Some(first) = helds.first() else {
        return Ok(None);
    };
    if !helds.iter().all(Held::is_current) {
        return Ok(None);
    }
    for held in helds {
        held.hold.line.session.lease().check()?;
    }
    let ownership = helds.iter().flat_map(Held::ownership).collect();
    guarded_txn(first.hold.line.session.client(), ownership, txn)
}

/// Runs `txn` nested inside an outer transaction that first checks `ownership`:
/// `Ok(Some(response))` if we still own, `Ok(None)` if not.
pub(super) fn guarded_txn(
    client: &crate::client::Client,
    ownership: Vec<Compare>,
    txn: Txn,
) -> Result<Option<TxnResponse>> {
    let outer = Txn::new().when(ownership).and_then([TxnOp::txn(txn)]);
    let rpc = client.rpc().clone();
    let response = client.block_on(rpc.txn(&outer, Retry::Never))?;
    if !response.succeeded {
        return Ok(None);
    }
    match response.responses.into_iter().next() {
        // etcd leaves nested responses without a header: report the outer revision.
        Some(crate::support::kv::TxnOpResponse::Txn(mut inner)) => {
            inner.revision = response.revision;
            Ok(Some(inner))
        }
        _ => Err(Error::unavailable("malformed guarded transaction response")),
    }
}
