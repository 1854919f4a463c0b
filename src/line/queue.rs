//! The waiting line shared by every recipe: keys `<name>/<lease hex>[suffix]` ordered by
//! create revision. An exclusive key owns when it is the oldest; shared keys and permits
//! pass some of the keys ahead of them (see `line/mode.rs`).
//!
//! One implementation of "wait for the keys before mine": the enqueue Txn returns them
//! (keys only); one watcher of deletes under the name, shared by every waiter of the name
//! on the client (see `transport/watches/`), reports them leaving in revision order, and the last
//! one leaving *is* the proof of ownership, with no read on the handoff path. The wait
//! stops at once if our session is lost or our key disappears (upstream Go keeps waiting,
//! etcd #19597).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::client::lease::LeaseState;
use crate::line::behind::{self, Woken};
use crate::line::crossing::{Awaited, Crossed};
use crate::line::mode::{Mode, Sorted};
use crate::support::error::{Error, Result};
use crate::support::kv::text;
use crate::support::kv::{
    Compare, CompareOp, KeyValue, LeaseHex, Range, Txn, TxnOp, TxnOpResponse,
};
use crate::transport::watch::Only;
use crate::transport::watches::waiting::{Waiting, Wake};
use crate::transport::watches::{Spec, UNSYNCED_WINDOW, Watches};
use crate::transport::{Retry, Rpc};

/// Longest name accepted for a lock or an election.
pub(crate) const MAX_NAME_LEN: usize = 4096;

/// Checks a lock or election name and returns the key prefix `<name>/`.
pub(crate) fn key_prefix(name: &[u8]) -> Result<Vec<u8>> {
    if name.is_empty() {
        return Err(Error::InvalidArgument("empty lock/election name".into()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidArgument(format!(
            "name is {} bytes; at most {MAX_NAME_LEN} are allowed",
            name.len()
        )));
    }
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    Ok(prefix)
}

/// Our key under `prefix`, named like Go's: `<prefix><lease id as lowercase hex>`, with
/// the mode's suffix (none for an exclusive key, so Go and etcdctl see theirs).
pub(crate) fn own_key(prefix: &[u8], lease: i64, mode: Mode) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(LeaseHex(lease).to_string().as_bytes());
    key.extend_from_slice(&mode.suffix());
    key
}

/// Where our key stands in the line.
#[derive(Debug, Clone)]
pub(crate) enum Position {
    /// Our key is gone, or is not the one we created.
    Gone,
    /// No key before ours keeps us from holding: we own.
    Owner,
    /// Keys created before ours keep us waiting.
    Behind(Ahead),
    /// Another participant uses the name as a semaphore of another size: we must not wait.
    Refused(String),
}

/// The keys created before ours that keep us waiting. No key can join them (create
/// revisions only grow), so a waiter that sees enough of them deleted, on one watcher that
/// also covers its own key, knows it owns without reading again.
#[derive(Debug, Clone)]
pub(crate) struct Ahead {
    keys: Sorted,
    /// Whether `keys` come from every key before ours, or only the newest [`TRACKED`] of
    /// them (a very long line): then a read finds the rest when these are gone.
    complete: bool,
    /// For a waiter far from its turn: the key it watches instead of waiting at the front,
    /// with its create revision (see `line/behind.rs`).
    lookout: Option<(Vec<u8>, i64)>,
}

impl Ahead {
    fn len(&self) -> usize {
        self.keys.len()
    }

    /// Every key ahead that kept us waiting (blocking or counted).
    pub(crate) fn keys(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.keys.blocking.iter().chain(&self.keys.counted)
    }
}

/// Where a key in `mode` stands, given the keys before it with their create revisions (all
/// of them if `complete`). `None`: those keys let us hold, but older ones were not read
/// (read further back).
fn judge(
    mode: Mode,
    prefix: &[u8],
    before: Vec<(Vec<u8>, i64)>,
    complete: bool,
) -> Option<Position> {
    let created: HashMap<Vec<u8>, i64> = before.into_iter().collect();
    let keys = match mode.sort(prefix, created.keys().cloned()) {
        Ok(keys) => keys,
        Err(disagreement) => return Some(Position::Refused(disagreement.0)),
    };
    match (keys.is_clear(), complete) {
        (true, true) => Some(Position::Owner),
        (true, false) => None,
        (false, _) => {
            let lookout = behind::lookout(&keys, &created);
            Some(Position::Behind(Ahead {
                keys,
                complete,
                lookout,
            }))
        }
    }
}

/// How many keys before ours a waiter tracks. The enqueue Txn returns them (keys only), so
/// a longer line costs bytes in one answer, not extra requests; past this, a waiter reads
/// again when the ones it tracks are gone.
const TRACKED: i64 = 1024;

/// Range over `prefix` newest-first, keys only, limited to create revisions up to
/// `max_create`: our key and the [`TRACKED`] keys before it.
fn newest_up_to(prefix: &[u8], max_create: i64) -> Range {
    Range {
        limit: TRACKED + 1,
        by_create_revision: Some(false),
        max_create_revision: max_create,
        // Only keys and revisions matter here; election values can be large.
        keys_only: true,
        ..Range::prefix(prefix)
    }
}

/// Every key under `prefix` (up to [`TRACKED`] + 1), keys only and unsorted: right after
/// our put, every other key is older than ours, so this is the line ahead of us. Unsorted,
/// because etcd then reads the line once; a sorted range reads every key of the line again.
fn the_line(prefix: &[u8]) -> Range {
    Range {
        limit: TRACKED + 1,
        keys_only: true,
        ..Range::prefix(prefix)
    }
}

/// The position of `key`, just put, from [`the_line`] read in the same Txn; `None` if
/// older keys beyond the ones returned must be read to tell.
fn ahead_of_new(kvs: Vec<KeyValue>, ours: Ours<'_>) -> Option<Position> {
    let complete = (kvs.len() as i64) <= TRACKED;
    let before = kvs
        .into_iter()
        .filter(|kv| kv.key != ours.key)
        .map(|kv| (kv.key, kv.create_revision))
        .collect();
    judge(ours.mode, ours.prefix, before, complete)
}

/// Range over `prefix` oldest-first, one key: the owner (Go's `WithFirstCreate`).
pub(crate) fn first_created(prefix: &[u8]) -> Range {
    Range {
        limit: 1,
        by_create_revision: Some(true),
        ..Range::prefix(prefix)
    }
}

/// Interprets "our key and the ones before it" (newest first, from [`newest_up_to`]): the
/// keys before ours, and whether they are all of them; `None` if our key is gone.
fn before_ours(kvs: Vec<KeyValue>, ours: Ours<'_>) -> Option<(Vec<KeyValue>, bool)> {
    let mut kvs = kvs.into_iter();
    match kvs.next() {
        Some(first) if first.key == ours.key && first.create_revision == ours.rev => {
            let before: Vec<KeyValue> = kvs.collect();
            let complete = (before.len() as i64) < TRACKED;
            Some((before, complete))
        }
        _ => None,
    }
}

/// Warns about keys ahead that no lock or campaign created: data under the name (`jobs/x`
/// for the lock `jobs`) or another lock nested in it (`jobs/nightly/<lease>`). They block
/// the line like holders (Go's Mutex counts them too), usually to the user's surprise.
fn warn_of_foreign_keys(prefix: &[u8], ahead: &Ahead) {
    let mut foreign = ahead
        .keys
        .keys()
        .filter(|k| Mode::of_key(prefix, k).is_none());
    if let Some(first) = foreign.next() {
        tracing::warn!(
            name = %text(&prefix[..prefix.len().saturating_sub(1)]),
            blocking_key = %text(first),
            others = foreign.count(),
            "waiting behind a key that is not a lock key: every key under `<name>/` counts \
             as a holder until it is deleted (keep data and nested lock names out of a \
             lock's prefix)"
        );
    }
}

/// Our key in the line: the name's prefix, the key, its mode, and the revision that
/// created it (0 while unknown).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ours<'a> {
    pub(crate) prefix: &'a [u8],
    pub(crate) key: &'a [u8],
    pub(crate) mode: Mode,
    pub(crate) rev: i64,
}

/// One linearizable read: does our key still exist with our revision, and what is before
/// it? With the store revision of the read. A reader or a permit whose newest keys ahead
/// let it hold reads further back, at the same revision, until the keys it has seen
/// decide (an exclusive key is decided by any key ahead).
async fn read_position_at(rpc: &Rpc, ours: Ours<'_>) -> Result<(Position, i64)> {
    let read = rpc.read(&newest_up_to(ours.prefix, ours.rev)).await?;
    let at = read.revision;
    tracing::debug!(
        key = %text(ours.key),
        rev = ours.rev,
        at,
        found = ?read.kvs.iter().take(3).map(|kv| (text(&kv.key).into_owned(), kv.create_revision)).collect::<Vec<_>>(),
        keys = read.kvs.len(),
        "position read"
    );
    let Some((mut page, mut complete)) = before_ours(read.kvs, ours) else {
        return Ok((Position::Gone, at));
    };
    let mut before = Vec::new();
    loop {
        let oldest = page.iter().map(|kv| kv.create_revision).min();
        before.extend(page.into_iter().map(|kv| (kv.key, kv.create_revision)));
        if let Some(position) = judge(ours.mode, ours.prefix, before.clone(), complete) {
            return Ok((position, at));
        }
        // Older keys were not returned: read the next page back, in the same snapshot.
        let Some(oldest) = oldest else {
            return Ok((Position::Owner, at));
        };
        let older = rpc
            .read(&Range {
                revision: at,
                limit: TRACKED,
                ..newest_up_to(ours.prefix, oldest - 1)
            })
            .await?;
        complete = (older.kvs.len() as i64) < TRACKED;
        page = older.kvs;
    }
}

/// Read interval inside [`UNSYNCED_WINDOW`].
const UNSYNCED_POLL: Duration = Duration::from_millis(15);

/// The outcome of [`enqueue`].
pub(crate) struct Enqueued {
    /// Our key's create revision (the fencing token).
    pub(crate) rev: i64,
    /// Whether the key already existed (this session had queued or held before).
    pub(crate) existed: bool,
    /// The value stored under our key.
    pub(crate) value: Vec<u8>,
    /// The mod revision of our key (of the value stored under it).
    pub(crate) value_rev: i64,
    pub(crate) position: Position,
    /// The store revision at which `position` was read.
    pub(crate) seen_at: i64,
}

/// Joins the line in one transaction, with the compare and put of Go's `Mutex.tryAcquire`
/// / `Election.Campaign`: if our key does not exist, put it with our lease; else read it
/// and the owner (Go's shape). Instead of Go's sorted read of the owner, the put branch
/// reads the whole line, keys only (every other key is ahead of ours): so an uncontended
/// acquire is one request, and a waiter knows what to wait for.
/// Retry-safe: a second run finds the key and takes the read branch. It is sent to one
/// endpoint only: the caller retries, because it must know that an attempt was ambiguous
/// (it may still be applied late, after the key is gone again).
pub(crate) async fn enqueue(
    rpc: &Rpc,
    ours: Ours<'_>,
    value: &[u8],
    lease: i64,
) -> Result<Enqueued> {
    let Ours { prefix, key, .. } = ours;
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put_with_lease(key, value, lease),
            TxnOp::range(the_line(prefix)),
        ])
        .or_else([
            TxnOp::range(Range::key(key)),
            TxnOp::range(first_created(prefix)),
        ]);
    let resp = rpc.txn(&txn, Retry::Never).await?;
    let txn_revision = resp.revision;
    tracing::debug!(
        key = %text(key),
        succeeded = resp.succeeded,
        at = txn_revision,
        "enqueue txn"
    );
    let mut ranges = resp.responses.into_iter().filter_map(|op| match op {
        TxnOpResponse::Get(kvs) => Some(kvs),
        _ => None,
    });
    if resp.succeeded {
        let line = ranges.next().unwrap_or_default();
        let ours = Ours {
            rev: txn_revision,
            ..ours
        };
        let (position, seen_at) = match ahead_of_new(line, ours) {
            Some(position) => (position, txn_revision),
            // A reader or permit behind a very long line: the Txn's answer cannot tell.
            None => read_position_at(rpc, ours).await?,
        };
        return Ok(Enqueued {
            rev: txn_revision,
            existed: false,
            value: value.to_vec(),
            value_rev: txn_revision,
            position,
            seen_at,
        });
    }
    // Our key exists already (same session, earlier attempt or a resumed lease).
    let Some(mine) = ranges.next().and_then(|kvs| kvs.into_iter().next()) else {
        // Deleted between compare and read is impossible inside one txn; treat as gone.
        return Err(Error::unavailable("inconsistent lock transaction result"));
    };
    let owner = ranges.next().and_then(|kvs| kvs.into_iter().next());
    let rev = mine.create_revision;
    let (position, seen_at) = match owner {
        Some(owner) if owner.create_revision == rev => (Position::Owner, txn_revision),
        _ => read_position_at(rpc, Ours { rev, ..ours }).await?,
    };
    Ok(Enqueued {
        rev,
        existed: true,
        value: mine.value,
        value_rev: mine.mod_revision,
        position,
        seen_at,
    })
}

/// Puts `value` under `key` only if the key still has create revision `rev` and mod
/// revision `value_rev` (the value we last wrote or read): a retried or late attempt can
/// never overwrite a newer value. Returns the new mod revision, or `None` if the condition
/// failed.
pub(crate) async fn put_if_unchanged(
    rpc: &Rpc,
    key: &[u8],
    rev: i64,
    value_rev: i64,
    value: &[u8],
    lease: i64,
) -> Result<Option<i64>> {
    let txn = Txn::new()
        .when([
            Compare::create_revision(key, CompareOp::Equal, rev),
            Compare::mod_revision(key, CompareOp::Equal, value_rev),
        ])
        .and_then([TxnOp::put_with_lease(key, value, lease)]);
    let resp = rpc.txn(&txn, Retry::Safe).await?;
    Ok(resp.succeeded.then_some(resp.revision))
}

/// One linearizable read of `key`.
pub(crate) async fn read_key(rpc: &Rpc, key: &[u8]) -> Result<Option<KeyValue>> {
    Ok(rpc.read(&Range::key(key)).await?.kvs.into_iter().next())
}

/// The error for "our key vanished while we waited": `SessionLost` if the lease is gone
/// (asking etcd when we do not know yet: a revoke from elsewhere deletes our key before
/// the next keep-alive tells us), else `LockLost` (someone deleted the key).
pub(crate) async fn key_gone_error(rpc: &Rpc, session: &LeaseState) -> Error {
    if session.loss_reason().is_none()
        && let Ok(live) = rpc.lease_time_to_live(session.id()).await
        && live.ttl <= 0
    {
        session.mark_lost(crate::support::error::loss::LossReason::Revoked);
    }
    match session.loss_reason() {
        Some(reason) => Error::SessionLost(reason),
        None => Error::LockLost,
    }
}

/// Blocks (asynchronously) until no key ahead keeps ours from holding (for an exclusive
/// key: until it is the oldest under `prefix`), and returns the revision that proves it.
///
/// The proof (ARCHITECTURE.md, "Handoff without a read"): `ahead` is exact at revision
/// `seen_at`, and no key can join it later. One watcher of deletes under the prefix —
/// shared by every waiter of this name on the client — reports, in revision order, every
/// delete after `seen_at`, including one of our own key. So when the last key ahead is
/// reported deleted at revision R, with no delete of ours before it, we own at R: no read.
/// A read is needed only when the watcher cannot cover everything after what we know (it
/// had to start after `seen_at`), or when a very long line was tracked only in part.
///
/// Errors: `SessionLost` as soon as the session is lost, `LockLost` if our key is deleted
/// by someone else, or an etcd error that retrying cannot fix. The caller removes the key.
pub(crate) async fn wait_turn(
    rpc: &Rpc,
    watches: &Watches,
    session: &LeaseState,
    ours: Ours<'_>,
    (position, seen_at): (Position, i64),
) -> Result<i64> {
    let key = ours.key;
    let (mut position, mut seen_at) = (position, seen_at);
    loop {
        let mut ahead = match position {
            // The revision of the read that showed us first: the key exists there.
            Position::Owner => return Ok(seen_at),
            Position::Gone => return Err(key_gone_error(rpc, session).await),
            Position::Refused(why) => return Err(Error::InvalidArgument(why)),
            Position::Behind(ahead) => ahead,
        };
        let lookout = ahead.lookout.take();
        if let Some((lookout, created)) = lookout.filter(|_| !front_is_watched(watches, ours)) {
            // Far from our turn: watch the lookout only. When it goes, wait at the front
            // with what we know (exact at `seen_at`): the front's watcher starts later, so
            // its one read tells where we stand now.
            tracing::debug!(key = %text(key), lookout = %text(&lookout), "waiting at the back");
            let woken =
                behind::wait_for_lookout(rpc, watches, session, key, (&lookout, created), seen_at);
            if woken.await? == Woken::OwnDeleted {
                return Err(key_gone_error(rpc, session).await);
            }
        }
        match wait_at_front(rpc, watches, session, ours, ahead, seen_at).await? {
            Front::Owner(at) => return Ok(at),
            Front::Far(ahead, at) => (position, seen_at) = (Position::Behind(ahead), at),
        }
    }
}

/// Whether a wait at `position` starts at the back of the line (`line/behind.rs`): far
/// from its turn, on a client where no other waiter of the name waits at the front (if one
/// does, the client hears of every release anyway, and one more subscriber costs nothing).
pub(crate) fn starts_far(watches: &Watches, ours: Ours<'_>, position: &Position) -> bool {
    matches!(position, Position::Behind(ahead) if ahead.lookout.is_some())
        && !front_is_watched(watches, ours)
}

fn front_is_watched(watches: &Watches, ours: Ours<'_>) -> bool {
    watches.has_waiters(&Spec::prefix(ours.prefix, Only::Deletes))
}

/// How a wait at the front ended.
enum Front {
    /// We own, as of this revision.
    Owner(i64),
    /// A read found us far from our turn again (we came from the back and the line moved
    /// less than the lookout said, or a long line was tracked only in part), and no other
    /// waiter of the client is at the front: wait at the back.
    Far(Ahead, i64),
}

/// Waits on the name's shared prefix watcher until the keys `ahead` (exact at `seen_at`)
/// are gone: the handoff without a read.
async fn wait_at_front(
    rpc: &Rpc,
    watches: &Watches,
    session: &LeaseState,
    ours: Ours<'_>,
    ahead: Ahead,
    seen_at: i64,
) -> Result<Front> {
    let key = ours.key;
    tracing::debug!(key = %text(key), ahead = ahead.len(), complete = ahead.complete, "waiting");
    warn_of_foreign_keys(ours.prefix, &ahead);
    let mut deletes = watches.wait_for(
        Spec::prefix(ours.prefix, Only::Deletes),
        seen_at,
        awaited(key, ahead, seen_at),
    );
    let mut known = seen_at;
    // Until then, etcd may have registered a just-created watcher as unsynced: read now and
    // then, so a handoff in that window does not wait for etcd's 100 ms sync loop.
    let mut poll_until: Option<Instant> = None;
    loop {
        session.check()?;
        let poll = poll_until.filter(|until| Instant::now() < *until);
        let delivery = tokio::select! {
            delivery = deletes.next() => delivery,
            reason = session.wait_lost() => return Err(Error::SessionLost(reason)),
            _ = tokio::time::sleep(UNSYNCED_POLL), if poll.is_some() => {
                match reread(rpc, session, ours, &deletes).await? {
                    Reread::Owner(at) => return Ok(Front::Owner(at)),
                    Reread::Far(ahead, at) => return Ok(Front::Far(ahead, at)),
                    Reread::Waiting(at) => known = at,
                }
                continue;
            }
        };
        match delivery {
            Wake::From { after, fresh } => {
                // Everything after what we know follows, unless the watcher starts later:
                // then deletes in (known, after] are not on it, and one read covers them.
                // A just-created watcher is read for once too, to see whether a write raced
                // its creation (then it may be unsynced for up to 100 ms).
                if after <= known && !fresh {
                    continue;
                }
                match reread(rpc, session, ours, &deletes).await? {
                    Reread::Owner(at) => return Ok(Front::Owner(at)),
                    Reread::Far(ahead, at) => return Ok(Front::Far(ahead, at)),
                    Reread::Waiting(at) => {
                        known = at;
                        if fresh && at > after {
                            poll_until = Some(Instant::now() + UNSYNCED_WINDOW);
                        }
                    }
                }
            }
            Wake::Verdict(Crossed::Cleared { at, complete: true }) => {
                tracing::debug!(key = %text(key), at, "owner by event order");
                return Ok(Front::Owner(at));
            }
            // Only part of a long line was tracked: find the rest.
            Wake::Verdict(Crossed::Cleared { .. }) => {
                match reread(rpc, session, ours, &deletes).await? {
                    Reread::Owner(at) => return Ok(Front::Owner(at)),
                    Reread::Far(ahead, at) => return Ok(Front::Far(ahead, at)),
                    Reread::Waiting(at) => known = at,
                }
            }
            Wake::Verdict(Crossed::OwnDeleted) => return Err(key_gone_error(rpc, session).await),
            Wake::Failed(e) => return Err(e),
        }
    }
}

/// What a waiter awaits: the keys `ahead` of `own`, exact at revision `known`.
fn awaited(own: &[u8], ahead: Ahead, known: i64) -> Awaited {
    Awaited {
        own: own.to_vec(),
        keys: ahead.keys,
        complete: ahead.complete,
        known,
    }
}

/// The outcome of [`reread`].
enum Reread {
    /// We own, as of this revision.
    Owner(i64),
    /// Keys are still ahead, as of this revision; the subscription now awaits them.
    Waiting(i64),
    /// Keys are ahead, as of this revision, we are far from our turn, and no other waiter
    /// of the client is at the front: wait at the back.
    Far(Ahead, i64),
}

/// Reads our place in the line again and has `deletes` await the keys now ahead. Retried
/// until etcd answers: a wait outlives a leader election (its members answer "no leader"
/// meanwhile) and a failover; only its bound, a session loss or an error that retrying
/// cannot fix ends it.
async fn reread(
    rpc: &Rpc,
    session: &LeaseState,
    ours: Ours<'_>,
    deletes: &Waiting<Awaited>,
) -> Result<Reread> {
    let position = session
        .retry_while_alive(|| read_position_at(rpc, ours))
        .await?;
    match position {
        (Position::Owner, at) => Ok(Reread::Owner(at)),
        (Position::Gone, _) => Err(key_gone_error(rpc, session).await),
        (Position::Refused(why), _) => Err(Error::InvalidArgument(why)),
        (Position::Behind(ahead), at) if ahead.lookout.is_some() && deletes.is_alone() => {
            Ok(Reread::Far(ahead, at))
        }
        (Position::Behind(ahead), at) => {
            deletes.wait_again(at, awaited(ours.key, ahead, at));
            Ok(Reread::Waiting(at))
        }
    }
}

#[cfg(test)]
mod tests;
