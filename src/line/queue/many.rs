//! Joining several lines in one transaction (a multi-lock whose names are all free): every
//! key's `create_revision == 0` compare, then for each line [`enqueue`](super::enqueue)'s
//! put and its range of the line, in the given (bytewise) order.

use super::{Enqueued, Ours, ahead_of_new, read_position_at, the_line};
use crate::line::behind::Widths;
use crate::support::error::{Error, Result};
use crate::support::kv::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, text};
use crate::support::sim::{Mutation, mutation};
use crate::transport::{Retry, Rpc};

/// The most lines one [`enqueue_many`] joins: 2 operations each (the put and the range),
/// and etcd refuses a branch of more than 128 by default (`--max-txn-ops`).
pub(crate) const MAX_LINES: usize = 64;

/// One line to join: our key, and whether to read the whole line (see
/// [`enqueue`](super::enqueue)).
pub(crate) struct Joining<'a> {
    pub(crate) ours: Ours<'a>,
    pub(crate) whole_line: bool,
}

/// Joins every line of `lines` in one Txn, if none of our keys exists: `Some` with each
/// line's [`Enqueued`] (in order; every key created at the Txn's revision, each position
/// read by the same Txn right after its own put), `None` if a key of ours existed (nothing
/// was written: the caller joins name by name, which replaces such keys).
///
/// Sent once, to one endpoint: the caller must know that an attempt was ambiguous, since
/// it may still be applied late (every key at once, or none). `lines` must be sorted
/// bytewise by name and hold at most [`MAX_LINES`] lines. In that order no key we put lies
/// under the prefix of a line read after it (a key `<x>/<hex>[.suffix]` has no `/` past
/// the name, so it lies under `<y>/` only when `y` is `x` or a path prefix of `x`, which
/// sorts first): each range sees exactly the keys created before the Txn, and ours.
pub(crate) async fn enqueue_many(
    rpc: &Rpc,
    lines: &[Joining<'_>],
    value: &[u8],
    lease: i64,
) -> Result<Option<Vec<Enqueued>>> {
    if lines.len() > MAX_LINES {
        return Err(Error::InvalidArgument(format!(
            "at most {MAX_LINES} lines join in one transaction"
        )));
    }
    let widths = Widths::of(rpc);
    let absent = lines
        .iter()
        .map(|l| Compare::create_revision(l.ours.key, CompareOp::Equal, 0));
    let absent: Vec<Compare> = if mutation(Mutation::EnqueueWithoutCondition) {
        Vec::new()
    } else {
        absent.collect()
    };
    let mut limits = Vec::with_capacity(lines.len());
    let mut ops = Vec::with_capacity(2 * lines.len());
    for l in lines {
        let range = the_line(widths, l.ours.prefix, l.ours.mode, l.whole_line);
        limits.push(range.limit);
        ops.push(TxnOp::put_with_lease(l.ours.key, value, lease));
        ops.push(TxnOp::range(range));
    }
    let txn = Txn::new().when(absent).and_then(ops);
    let (resp, counts) = rpc.txn_counted(&txn, Retry::Never).await?;
    let at = resp.revision;
    tracing::debug!(
        keys = lines.len(),
        first = %lines.first().map(|l| text(l.ours.key)).unwrap_or_default(),
        succeeded = resp.succeeded,
        at,
        "enqueue txn of several lines"
    );
    if !resp.succeeded {
        return Ok(None);
    }
    let ranges: Vec<_> = resp
        .responses
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(kvs) => Some(kvs),
            _ => None,
        })
        .collect();
    if ranges.len() != lines.len() || counts.len() != lines.len() {
        return Err(Error::unavailable(
            "inconsistent transaction result (one range per line expected)",
        ));
    }
    let mut joined = Vec::with_capacity(lines.len());
    for (((l, kvs), limit), counted) in lines.iter().zip(ranges).zip(limits).zip(counts) {
        let ours = Ours { rev: at, ..l.ours };
        let (position, seen_at) = match ahead_of_new(widths, kvs, (limit, counted), ours) {
            Some(position) => (position, at),
            // A reader behind a very long line: the Txn's answer cannot tell.
            None => read_position_at(rpc, ours).await?,
        };
        joined.push(Enqueued {
            rev: at,
            existed: false,
            value: value.to_vec(),
            value_rev: at,
            position,
            seen_at,
            twin_existed: None,
            leased: Vec::new(),
            long: false,
        });
    }
    Ok(Some(joined))
}
