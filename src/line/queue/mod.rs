//! The waiting line shared by every recipe: keys `<name>/<lease hex>[suffix]` ordered by
//! create revision. An exclusive key owns when it is the oldest; shared keys and permits
//! pass some of the keys ahead of them (see `line/mode.rs`).
//!
//! Joining the line (the enqueue Txn returns the keys before ours, keys only) and reading
//! one's place in it; waiting for one's turn is `line/wait.rs`.

use std::collections::{HashMap, HashSet};

use crate::client::lease::LeaseState;
use crate::line::behind::{self, Lookout, Widths};
use crate::line::mode::{Mode, Sorted};
use crate::support::error::{Error, Result};
use crate::support::kv::text;
use crate::support::kv::{
    Compare, CompareOp, KeyValue, LeaseHex, Range, Txn, TxnOp, TxnOpResponse,
};
use crate::support::sim::{Mutation, mutation};
use crate::transport::{Retry, Rpc};

mod existing;
mod many;

pub(crate) use many::{Joining, MAX_LINES, enqueue_many};

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
    refuse_trailing_slash(name)?;
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    Ok(prefix)
}

/// Refuses a name that ends with `/`. Its keys (`q//<lease>` for `q/`) lie under the prefix
/// of the name without it (`q/`): `q/` could be taken while `q` is held, and `q`'s waiters
/// would count `q/`'s holder as one of theirs, two lines that look alike but are not one.
/// Every line, and the double barrier, whose keys are `<name>/...` too, checks it here.
pub(crate) fn refuse_trailing_slash(name: &[u8]) -> Result<()> {
    let Some(trimmed) = name.strip_suffix(b"/") else {
        return Ok(());
    };
    let (name, trimmed) = (text(name), text(trimmed));
    Err(Error::InvalidArgument(format!(
        "name {name:?} ends with '/': its keys ({name}/<lease>) would lie inside the line of \
         {trimmed:?} ({trimmed}/...), so {name:?} could be taken while {trimmed:?} is held; \
         drop the trailing '/'"
    )))
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
    pub(crate) keys: Sorted,
    /// Whether `keys` come from every key before ours, or only the newest [`TRACKED`] of
    /// them (a very long line): then a read finds the rest when these are gone.
    pub(crate) complete: bool,
    /// For a waiter far from its turn: the key it watches instead of waiting at the front,
    /// with its create revision (see `line/behind/`).
    pub(crate) lookout: Option<Lookout>,
    /// For a waiter that waits for every key ahead (no permits counted): the newest of
    /// them, with its create revision. While it exists, our turn has not come, which one
    /// single-key read tells (see `wait_at_front`'s polls).
    pub(crate) last: Option<(Vec<u8>, i64)>,
}

impl Ahead {
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Every key ahead that kept us waiting (blocking or counted).
    pub(crate) fn keys(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.keys.keys()
    }
}

/// Where a key in `mode` stands, given the keys before it with their create revisions (all
/// of them if `complete`). `None`: those keys let us hold, but older ones were not read
/// (read further back).
fn judge(
    widths: Widths,
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
            let lookout = behind::lookout(widths, &keys, &created);
            let last = keys
                .counted
                .is_empty()
                .then(|| {
                    keys.blocking
                        .iter()
                        .filter_map(|key| Some((key.clone(), *created.get(key)?)))
                        .max_by_key(|&(_, rev)| rev)
                })
                .flatten();
            Some(Position::Behind(Ahead {
                keys,
                complete,
                lookout,
                last,
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

/// The next page back of a position read at revision `at` (the same snapshot): the
/// [`TRACKED`] newest keys created before `oldest`, the oldest revision the pages held, and
/// the `seen` keys created at `oldest` again, which sort first and the caller drops. One
/// Txn can put several keys (a downgradable write and its twin, or anyone's), and a page
/// may end among them: the next must not skip the rest. `seen` of `None`: every key up
/// to `oldest`, unlimited (a Txn put more keys than a page).
fn older_page(prefix: &[u8], oldest: i64, seen: Option<usize>, at: i64) -> Range {
    Range {
        revision: at,
        limit: seen.map_or(0, |seen| TRACKED + seen as i64),
        ..newest_up_to(prefix, oldest)
    }
}

/// What the enqueue Txn reads right after our put, when every other key under `prefix` is
/// older than ours: the line ahead of us, keys only.
///
/// An exclusive key needs only the newest keys ahead: with more than [`front`] of them it
/// waits at the back, on one of those it read (`line/behind/`), and reads again when that
/// one goes. So it reads at most [`front`] + 1 keys besides its own, newest first, and a
/// long line costs the answer a few keys, not one per waiting process (etcd reads the whole
/// line either way). A permit of a semaphore of `n` likewise reads the newest [`front`] +
/// `n` + 1 keys ahead: if there are more, those alone weigh more than `n` + [`front`]
/// permits, so it waits at the back, on the newest of them (`line/behind/`), and reads
/// its place when they go. With 1,024 workers on 8 permits that is 26 keys in the answer
/// instead of 1,023, which etcd encodes and sends and the waiter sorts (BENCHMARKS.md at
/// `fe26d71`, "Eighth step"). Neither when another waiter of the client waits at the front
/// (`whole_line`): then it waits there too, and to take its turn on an event, with no read,
/// it must know every key ahead. A reader needs to know which keys ahead block it, and the
/// newest ones may all be readers, so it reads every key (up to [`TRACKED`] + 1),
/// unsorted; so does a permit of a semaphore so large that its newest keys would be as
/// many.
fn the_line(widths: Widths, prefix: &[u8], mode: Mode, whole_line: bool) -> Range {
    let newest = |limit: i64| Range {
        limit,
        by_create_revision: Some(false),
        keys_only: true,
        ..Range::prefix(prefix)
    };
    match mode {
        Mode::Exclusive if !whole_line => newest(widths.front as i64 + 2),
        Mode::Permits(n, _) if !whole_line && permits_read_newest(widths, n) => {
            newest(widths.front as i64 + i64::from(n) + 2)
        }
        _ => Range {
            limit: TRACKED + 1,
            keys_only: true,
            ..Range::prefix(prefix)
        },
    }
}

/// Whether the enqueue of a permit of a semaphore of `n` reads only the newest keys ahead
/// (see [`the_line`]): when they are fewer than the whole line it would read otherwise.
fn permits_read_newest(widths: Widths, n: u32) -> bool {
    widths.front as i64 + i64::from(n) + 2 <= TRACKED
}

/// The position of `key`, just put, from `line` (read with the limit `limit` in the same
/// Txn, see [`the_line`]; etcd counted `counted` keys in it, ours included); `None` if older
/// keys beyond the ones returned must be read to tell.
fn ahead_of_new(
    widths: Widths,
    kvs: Vec<KeyValue>,
    (limit, counted): (i64, i64),
    ours: Ours<'_>,
) -> Option<Position> {
    let complete = (kvs.len() as i64) < limit;
    // Every key created at our revision came from our own Txn: ours, or its twin (a
    // downgradable write's reader key), never a key ahead.
    let before = kvs
        .into_iter()
        .filter(|kv| kv.key != ours.key && kv.create_revision != ours.rev)
        .map(|kv| (kv.key, kv.create_revision))
        .collect();
    let mut position = judge(widths, ours.mode, ours.prefix, before, complete);
    // An exclusive key or a permit read only the newest keys ahead: its lookout is as far
    // as every key etcd counted says (ours among them), less those an exclusive key leaves
    // ahead; a permit's, less the free permits (each key weighs at least one).
    if let Some(Position::Behind(Ahead {
        lookout: Some(lookout),
        complete: false,
        ..
    })) = &mut position
    {
        let counted = usize::try_from(counted).unwrap_or(0);
        let away = match ours.mode {
            Mode::Exclusive => counted.saturating_sub(1 + widths.leaves),
            Mode::Permits(n, _) => counted.saturating_sub(n as usize),
            Mode::Shared => 0,
        };
        lookout.away = lookout.away.max(away);
    }
    position
}

/// Every key of our lease under `prefix`, keys only: ours, and any other mode's (a
/// leftover of an earlier life of the lease, or a key this process uses). A long line's
/// enqueue reads only the newest keys ahead, so a leftover further ahead would be seen by
/// no one who may remove it; this read finds it wherever it is.
fn of_lease(prefix: &[u8], lease: i64) -> Range {
    let mut start = prefix.to_vec();
    start.extend_from_slice(LeaseHex(lease).to_string().as_bytes());
    Range {
        limit: TRACKED,
        keys_only: true,
        ..Range::prefix(&start)
    }
}

/// The keys of `lease` in `kvs` (from [`of_lease`]) other than those created at `rev`
/// (ours, and a downgradable write's twin). The range's prefix also covers longer lease
/// ids that start with ours: the key names the lease.
fn other_keys_of(prefix: &[u8], lease: i64, kvs: &[KeyValue], rev: i64) -> Vec<Vec<u8>> {
    kvs.iter()
        .filter(|kv| kv.create_revision != rev && Mode::lease_of(prefix, &kv.key) == Some(lease))
        .map(|kv| kv.key.clone())
        .collect()
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
///
/// The newest keys are those created at our revision: ours, and a downgradable write's
/// twin, put by the same Txn (etcd sorts ties in no fixed order, so ours may come second).
/// Keys at one create revision all come from one Txn, so none of them is ahead of ours.
fn before_ours(kvs: Vec<KeyValue>, ours: Ours<'_>) -> Option<(Vec<KeyValue>, bool)> {
    let complete = (kvs.len() as i64) <= TRACKED;
    let (same, before): (Vec<KeyValue>, Vec<KeyValue>) = kvs
        .into_iter()
        .partition(|kv| kv.create_revision == ours.rev);
    same.iter()
        .any(|kv| kv.key == ours.key)
        .then_some((before, complete))
}

/// Warns about keys ahead that no lock or campaign created: data under the name (`jobs/x`
/// for the lock `jobs`) or another lock nested in it (`jobs/nightly/<lease>`). They block
/// the line like holders (Go's Mutex counts them too), usually to the user's surprise.
pub(crate) fn warn_of_foreign_keys(prefix: &[u8], ahead: &Ahead) {
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
pub(crate) async fn read_position_at(rpc: &Rpc, ours: Ours<'_>) -> Result<(Position, i64)> {
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
    // The oldest create revision read so far, and the keys read with it.
    let mut oldest: Option<(i64, HashSet<Vec<u8>>)> = None;
    loop {
        let mut grew = false;
        for kv in page {
            let rev = kv.create_revision;
            match &mut oldest {
                Some((at_rev, keys)) if *at_rev == rev => {
                    if !keys.insert(kv.key.clone()) {
                        continue; // read with the last page
                    }
                }
                Some((at_rev, _)) if *at_rev < rev => {}
                _ => oldest = Some((rev, HashSet::from([kv.key.clone()]))),
            }
            grew = true;
            before.push((kv.key, rev));
        }
        if let Some(position) = judge(
            Widths::of(rpc),
            ours.mode,
            ours.prefix,
            before.clone(),
            complete,
        ) {
            return Ok((position, at));
        }
        // Older keys were not returned: read the next page back, in the same snapshot.
        let Some((rev, keys)) = &oldest else {
            return Ok((Position::Owner, at));
        };
        // A full page of keys read before: one Txn's keys fill it; read every key left.
        let seen = grew.then_some(keys.len());
        let read = older_page(ours.prefix, *rev, seen, at);
        let older = rpc.read(&read).await?;
        complete = read.limit == 0 || (older.kvs.len() as i64) < read.limit;
        page = older.kvs;
    }
}

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
    /// With a twin: its create revision when the read after a failed compare found it (a
    /// key of this session's reader line, to be replaced with ours).
    pub(crate) twin_existed: Option<i64>,
    /// The other keys of our lease under the name, in any mode, as the Txn found them:
    /// leftovers to remove unless this process uses them (`ownership/leftover.rs`).
    pub(crate) leased: Vec<Vec<u8>>,
    /// The line held more keys than the Txn's read of it returned (see `enqueue`'s
    /// `apart`).
    pub(crate) long: bool,
}

/// How many times a join tries again when the key of ours that failed its compare was gone
/// by the read that followed (deleted in between: by an operator, or a late copy swept).
const JOIN_TRIES: usize = 3;

/// Joins the line in one transaction, with the compare and put of Go's `Mutex.tryAcquire`
/// / `Election.Campaign`: if our key does not exist, put it with our lease. Instead of Go's
/// sorted read of the owner, the put branch reads the whole line, keys only (every other
/// key is ahead of ours): so an uncontended acquire is one request, and a waiter knows
/// what to wait for. If our key exists (the compare failed), a read-only Txn reads it and
/// the owner right after ([`existing::found`]); the join's own Txn carries no reads for
/// that rare case, so the common one sends and etcd decodes less.
/// Retry-safe: a second run finds the key and reads it. It is sent to one endpoint only:
/// the caller retries, because it must know that an attempt was ambiguous (it may still be
/// applied late, after the key is gone again).
///
/// `twin`: a downgradable write's reader key, put by the same Txn with the same lease, so
/// that both keys have one create revision (docs/design/downgrade.md).
/// The Txn then also requires the twin to be absent: a put on an existing reader key would
/// keep that key's older revision, and it would be no twin. A key of ours found then
/// (either one) is reported as `existed`, with `rev` 0 if only the twin existed. Without a
/// twin, every key of our lease under the name is found too ([`Enqueued::leased`]): in the
/// put branch's read of the line when that returns every key under the name (a short
/// line: no read of its own, which cost etcd about 10 us a Txn), else by a read of our
/// lease's keys, in the Txn when `apart` (the first enqueue of the line, or the last one
/// found it long) or right after it.
pub(crate) async fn enqueue(
    rpc: &Rpc,
    ours: Ours<'_>,
    value: &[u8],
    (lease, apart): (i64, bool),
    whole_line: bool,
    twin: Option<&[u8]>,
) -> Result<Enqueued> {
    let Ours {
        prefix, key, mode, ..
    } = ours;
    let widths = Widths::of(rpc);
    // Our key (and the twin) absent; put them, then read the line (and our lease's keys).
    let ours_and_twin = || std::iter::once(key).chain(twin);
    let conditioned = !mutation(Mutation::EnqueueWithoutCondition);
    let mut tries = 0;
    let (resp, counts, limit) = loop {
        let line = the_line(widths, prefix, mode, whole_line);
        let limit = line.limit;
        let absent = ours_and_twin()
            .filter(|_| conditioned)
            .map(|k| Compare::create_revision(k, CompareOp::Equal, 0));
        let puts = ours_and_twin().map(|k| TxnOp::put_with_lease(k, value, lease));
        let leased_read = (twin.is_none() && apart).then(|| TxnOp::range(of_lease(prefix, lease)));
        let reads = std::iter::once(TxnOp::range(line)).chain(leased_read);
        let txn = Txn::new().when(absent).and_then(puts.chain(reads));
        let (resp, counts) = rpc.txn_counted(&txn, Retry::Never).await?;
        tracing::debug!(
            key = %text(key),
            succeeded = resp.succeeded,
            at = resp.revision,
            "enqueue txn"
        );
        if resp.succeeded {
            break (resp, counts, limit);
        }
        // A key of ours is there: read it (gone again by the read: join again).
        if let Some(enqueued) = existing::found(rpc, ours, twin, lease).await? {
            return Ok(enqueued);
        }
        tries += 1;
        if tries == JOIN_TRIES {
            return Err(Error::unavailable(
                "our key under the name kept appearing and going while we joined the line",
            ));
        }
    };
    let txn_revision = resp.revision;
    let mut ranges = resp.responses.into_iter().filter_map(|op| match op {
        TxnOpResponse::Get(kvs) => Some(kvs),
        _ => None,
    });
    let line = ranges.next().unwrap_or_default();
    let counted = counts.first().copied().unwrap_or(0);
    let long = counted > line.len() as i64;
    // Our lease's other keys: read apart, or found in the line's read (not copied).
    let read_apart;
    let leased: &[KeyValue] = match (twin, apart, long) {
        (Some(_), ..) => &[],
        (None, true, _) => {
            read_apart = ranges.next().unwrap_or_default();
            &read_apart
        }
        (None, false, false) => &line,
        (None, false, true) => {
            read_apart = rpc.read(&of_lease(prefix, lease)).await?.kvs;
            &read_apart
        }
    };
    let leased = other_keys_of(prefix, lease, leased, txn_revision);
    let ours = Ours {
        rev: txn_revision,
        ..ours
    };
    let (position, seen_at) = match ahead_of_new(widths, line, (limit, counted), ours) {
        Some(position) => (position, txn_revision),
        // A reader or permit behind a very long line: the Txn's answer cannot tell.
        None => read_position_at(rpc, ours).await?,
    };
    Ok(Enqueued {
        rev: txn_revision,
        existed: false,
        value: value.to_vec(),
        value_rev: txn_revision,
        position,
        seen_at,
        twin_existed: None,
        leased,
        long,
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

#[cfg(test)]
mod tests;
