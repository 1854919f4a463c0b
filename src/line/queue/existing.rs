//! Joining when a key of ours is already in the line: the join's compare failed (an
//! earlier attempt of this session that applied, a resumed lease, a release that never
//! reached etcd). One read-only Txn then reads our key, the owner and, without a twin, our
//! lease's other keys under the name (with a twin: the twin), all at one revision. The
//! join's own Txn used to carry these reads as its else branch; sent only when needed, the
//! common join is smaller for the client to build and for etcd to decode.

use super::{Enqueued, Ours, Position, first_created, of_lease, other_keys_of, read_position_at};
use crate::support::error::Result;
use crate::support::kv::{Range, Txn, TxnOp, TxnOpResponse};
use crate::transport::{Retry, Rpc};

/// What the line holds of ours, read after the join's compare failed: `None` if neither
/// our key nor its twin exists any more (deleted since the compare: join again).
pub(super) async fn found(
    rpc: &Rpc,
    ours: Ours<'_>,
    twin: Option<&[u8]>,
    lease: i64,
) -> Result<Option<Enqueued>> {
    let Ours { prefix, key, .. } = ours;
    let mut reads = Vec::with_capacity(3);
    reads.push(TxnOp::range(Range::key(key)));
    reads.push(TxnOp::range(first_created(prefix)));
    match twin {
        Some(twin) => reads.push(TxnOp::range(Range::key(twin))),
        None => reads.push(TxnOp::range(of_lease(prefix, lease))),
    }
    let read = rpc.txn(&Txn::new().and_then(reads), Retry::Safe).await?;
    let at = read.revision;
    let mut ranges = read.responses.into_iter().filter_map(|op| match op {
        TxnOpResponse::Get(kvs) => Some(kvs),
        _ => None,
    });
    let mine = ranges.next().and_then(|kvs| kvs.into_iter().next());
    if twin.is_some() {
        // A key of ours exists: a lock replaces whichever exists (a downgradable write is
        // always a lock), so the position is not read.
        (mine.iter()).try_for_each(|mine| crate::line::handed::not_handed_over(mine, lease))?;
        let _owner = ranges.next();
        let twin_kv = ranges.next().and_then(|kvs| kvs.into_iter().next());
        if mine.is_none() && twin_kv.is_none() {
            return Ok(None);
        }
        return Ok(Some(Enqueued {
            rev: mine.as_ref().map_or(0, |kv| kv.create_revision),
            existed: true,
            value: Vec::new(),
            value_rev: 0,
            position: Position::Gone,
            seen_at: at,
            twin_existed: twin_kv.map(|kv| kv.create_revision),
            leased: Vec::new(),
            long: false,
        }));
    }
    // Our key exists already (same session, earlier attempt or a resumed lease).
    let Some(mine) = mine else {
        return Ok(None);
    };
    crate::line::handed::not_handed_over(&mine, lease)?;
    let owner = ranges.next().and_then(|kvs| kvs.into_iter().next());
    let rev = mine.create_revision;
    let leased = other_keys_of(prefix, lease, &ranges.next().unwrap_or_default(), rev);
    let (position, seen_at) = match owner {
        Some(owner) if owner.create_revision == rev => (Position::Owner, at),
        _ => read_position_at(rpc, Ours { rev, ..ours }).await?,
    };
    Ok(Some(Enqueued {
        rev,
        existed: true,
        value: mine.value,
        value_rev: mine.mod_revision,
        position,
        seen_at,
        twin_existed: None,
        leased,
        long: false,
    }))
}
