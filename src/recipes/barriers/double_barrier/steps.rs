//! The steps of entering and leaving a double barrier, run on the client's runtime: join
//! (one Txn), wait on the client's watch stream until the round fills (`round.rs` judges
//! the events in the watch task), stamp or decide, and on the way out remove our key and
//! wait until the round has left.

use crate::client::lease::LeaseState;
use crate::client::removal::{self, Owned};
use crate::line::queue::key_gone_error;
use crate::recipes::barriers::double_barrier::round::{Enter, Goal, Round, Watching};
use crate::support::backoff::Backoff;
use crate::support::error::{Error, Result};
use crate::support::kv::{Compare, CompareOp, KeyValue, Range, Txn, TxnOp, TxnOpResponse, text};
use crate::transport::watch::Only;
use crate::transport::watches::waiting::Wake;
use crate::transport::watches::{Spec, Watches};
use crate::transport::{Retry, Rpc};

/// Where a participant stands: its barrier's keys, its session, and how to have its key
/// swept for a join applied late (see `client/follow.rs`).
pub(crate) struct Place<'a> {
    pub(crate) rpc: &'a Rpc,
    pub(crate) watches: &'a Watches,
    pub(crate) session: &'a LeaseState,
    pub(crate) prefix: &'a [u8],
    pub(crate) key: &'a [u8],
    pub(crate) ready: &'a [u8],
    /// How many participants a round has (written in our key's value).
    pub(crate) count: u64,
    /// Sweeps our key from this revision on (the participant's local turn guards it).
    pub(crate) sweep: &'a (dyn Fn(i64) + Sync),
}

/// The outcome of [`join`].
pub(crate) struct Joined {
    /// Our key's create revision.
    pub(crate) created: i64,
    /// Every key under the prefix at `at`, ours included (read by [`settle`], which
    /// removes our key if one of them is not a double barrier's).
    pub(crate) kvs: Vec<KeyValue>,
    pub(crate) at: i64,
}

/// Joins in one Txn: if our key does not exist, put it (our count, with our lease) and read
/// every key under the prefix. Sent once per endpoint after an ambiguous failure, and, when
/// `patient`, again after a refusal no member handled ("no leader": the caller's bound ends
/// that). A key of ours found there is a leftover (a resumed lease, a removal that never
/// reached etcd; we own the local turn, so no participant of this process uses it): it is
/// removed by its revision and we join again. Any ambiguous attempt has our key swept (it
/// may still be applied late); after a failure whose outcome is unknown, a key of ours is
/// removed first. A caller that cuts the join short does the same ([`remove_unknown`]).
pub(crate) async fn join(place: &Place<'_>, patient: bool) -> Result<Joined> {
    let (rpc, key) = (place.rpc, place.key);
    let lease = place.session.id();
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put_with_lease(key, place.count.to_string(), lease),
            TxnOp::range(Range::prefix(place.prefix)),
        ])
        .or_else([TxnOp::range(Range::key(key))]);
    let mut ambiguous = false;
    let mut attempts = rpc.endpoints().len();
    let mut backoff = Backoff::quick();
    loop {
        let error = match rpc.txn(&txn, Retry::Never).await {
            Ok(resp) => {
                let mut kvs = resp.responses.into_iter().filter_map(|op| match op {
                    TxnOpResponse::Get(kvs) => Some(kvs),
                    _ => None,
                });
                let kvs = kvs.next().unwrap_or_default();
                if !resp.succeeded {
                    if let Some(old) = kvs.first() {
                        tracing::debug!(key = %text(key), "removing a leftover participant key");
                        removal::remove(rpc, key, Owned::Revision(old.create_revision)).await?;
                    }
                    continue;
                }
                if ambiguous {
                    (place.sweep)(resp.revision + 1);
                }
                return Ok(Joined {
                    created: resp.revision,
                    kvs,
                    at: resp.revision,
                });
            }
            Err(e) if patient && e.is_refused_unhandled() => {
                backoff.sleep().await;
                continue;
            }
            Err(e) if e.is_transient() && attempts > 1 => {
                attempts -= 1;
                ambiguous = true;
                continue;
            }
            Err(e) => e,
        };
        if ambiguous || error.is_transient() {
            remove_unknown(rpc, key, lease, place.sweep).await;
        }
        return Err(place.session.judge(error));
    }
}

/// After a join whose outcome is unknown (no answer, or cut short): removes a key of our
/// lease at `key` (by its revision, read first), then has it swept for the join applied
/// late.
pub(crate) async fn remove_unknown(
    rpc: &Rpc,
    key: &[u8],
    lease: i64,
    sweep: &(dyn Fn(i64) + Sync),
) {
    let from = removal::remove_if_leased(rpc, key, lease)
        .await
        .unwrap_or(0);
    sweep(from + 1);
}

/// Waits until the round we joined fills (or one we are part of is found), and stamps our
/// key with it: returns that round. With `patient` false (`try_enter`), returns `None`
/// instead of waiting. The caller removes our key on any other outcome.
pub(crate) async fn settle(
    place: &Place<'_>,
    created: i64,
    (kvs, mut known): (Vec<KeyValue>, i64),
    patient: bool,
) -> Result<Option<i64>> {
    let mut round = Round::read(place.prefix, place.count, kvs)?;
    loop {
        match round.judge_enter(place.key) {
            Enter::In(filled) => {
                stamp(place, created, filled).await?;
                return Ok(Some(filled));
            }
            Enter::Decide(filled) => match decide(place, created, filled).await? {
                Decided::Filled => {
                    tracing::debug!(key = %text(place.key), round = filled, "the round filled");
                    return Ok(Some(filled));
                }
                // Someone else saw it fill first: we are in that round if our key is as
                // old. Taken from the Txn's answer, not from a read after it, which would
                // miss a round that filled and emptied meanwhile.
                Decided::Ready(named) if created <= named => {
                    stamp(place, created, named).await?;
                    return Ok(Some(named));
                }
                Decided::Gone => return Err(key_gone_error(place.rpc, place.session).await),
                Decided::Ready(_) | Decided::Unclear => (round, known) = read_round(place).await?,
            },
            Enter::ClearReady(ready) => {
                removal::remove(place.rpc, place.ready, Owned::Revision(ready)).await?;
                (round, known) = read_round(place).await?;
            }
            Enter::Gone => return Err(key_gone_error(place.rpc, place.session).await),
            Enter::Refused(why) => return Err(Error::InvalidArgument(why)),
            Enter::Wait if !patient => return Ok(None),
            Enter::Wait => {
                let goal = Goal::Enter {
                    own: place.key.to_vec(),
                };
                (round, known) = wait_until(place, round, known, goal).await?;
            }
        }
    }
}

/// The first half of leaving: removes our key by its revision, retried until etcd answers
/// (a lost session ends it: the lease takes the key).
pub(crate) async fn remove_own(place: &Place<'_>, created: i64) -> Result<()> {
    let owned = Owned::Revision(created);
    place
        .session
        .retry_while_alive(|| removal::remove(place.rpc, place.key, owned))
        .await?;
    Ok(())
}

/// The second half of leaving: our key is gone; waits until no participant of the round
/// that filled at `filled` is left, then removes the ready key if it names a round with
/// nobody left in it.
pub(crate) async fn wait_for_round_to_leave(place: &Place<'_>, filled: i64) -> Result<()> {
    let (mut round, mut known) = read_round(place).await?;
    if round.any_up_to(filled) {
        let goal = Goal::Leave { round: filled };
        (round, known) = wait_until(place, round, known, goal).await?;
    }
    tracing::debug!(key = %text(place.key), round = filled, at = known, "the round left");
    if let Some(ready) = round.stale_ready() {
        // Best effort: the next participant to join clears it otherwise, and it goes with
        // its writer's lease anyway.
        let _ = removal::remove(place.rpc, place.ready, Owned::Revision(ready)).await;
    }
    Ok(())
}

/// Removes the ready key if it names a round with nobody left in it (one read; best
/// effort): after a participant left without waiting for the others (dropped while in).
pub(crate) async fn clear_stale_ready(rpc: &Rpc, (prefix, count): (&[u8], u64), ready: &[u8]) {
    let Ok(read) = rpc.read(&Range::prefix(prefix)).await else {
        return;
    };
    if let Ok(round) = Round::read(prefix, count, read.kvs)
        && let Some(created) = round.stale_ready()
    {
        let _ = removal::remove(rpc, ready, Owned::Revision(created)).await;
    }
}

/// Stamps our key with the round it is in (only while it is the key we created), so the
/// round stays known after the ready key's writer is gone.
async fn stamp(place: &Place<'_>, created: i64, filled: i64) -> Result<()> {
    let txn = Txn::new()
        .when([Compare::create_revision(
            place.key,
            CompareOp::Equal,
            created,
        )])
        .and_then([TxnOp::put_with_lease(
            place.key,
            stamped(place.count, filled),
            place.session.id(),
        )]);
    let resp = place.rpc.txn(&txn, Retry::Safe).await;
    match resp.map_err(|e| place.session.judge(e))? {
        resp if resp.succeeded => Ok(()),
        _ => Err(key_gone_error(place.rpc, place.session).await),
    }
}

/// A participant key's value once in: `<count> <round>`.
fn stamped(count: u64, filled: i64) -> String {
    format!("{count} {filled}")
}

/// What [`decide`] found.
enum Decided {
    /// We created the ready key and stamped ours.
    Filled,
    /// A ready key exists already, naming this round (someone else decided first).
    Ready(i64),
    /// Our key is gone.
    Gone,
    /// Neither (a ready key that names no round): read and judge again.
    Unclear,
}

/// Says the round filled: creates the ready key (with our lease) and stamps our key, in one
/// Txn, only if no ready key exists and our key is still ours; else reads both. Safe to
/// apply late: while our key exists, the round it names is not over.
async fn decide(place: &Place<'_>, created: i64, filled: i64) -> Result<Decided> {
    let lease = place.session.id();
    let txn = Txn::new()
        .when([
            Compare::create_revision(place.ready, CompareOp::Equal, 0),
            Compare::create_revision(place.key, CompareOp::Equal, created),
        ])
        .and_then([
            TxnOp::put_with_lease(place.ready, filled.to_string(), lease),
            TxnOp::put_with_lease(place.key, stamped(place.count, filled), lease),
        ])
        .or_else([
            TxnOp::range(Range::key(place.ready)),
            TxnOp::range(Range::key(place.key)),
        ]);
    let resp = place.rpc.txn(&txn, Retry::Safe).await;
    let resp = resp.map_err(|e| place.session.judge(e))?;
    if resp.succeeded {
        return Ok(Decided::Filled);
    }
    let mut read = resp.responses.into_iter().map(|op| match op {
        TxnOpResponse::Get(kvs) => kvs.into_iter().next(),
        _ => None,
    });
    let (ready, own) = (read.next().flatten(), read.next().flatten());
    if own.is_none_or(|kv| kv.create_revision != created) {
        return Ok(Decided::Gone);
    }
    let round = ready.and_then(|kv| std::str::from_utf8(&kv.value).ok()?.parse().ok());
    Ok(round.map_or(Decided::Unclear, Decided::Ready))
}

/// Every key under the prefix, and the revision of the read; retried until etcd answers
/// (only the wait's bound or the session's loss ends it).
async fn read_round(place: &Place<'_>) -> Result<(Round, i64)> {
    let range = Range::prefix(place.prefix);
    let read = place
        .session
        .retry_while_alive(|| place.rpc.read(&range))
        .await?;
    Ok((
        Round::read(place.prefix, place.count, read.kvs)?,
        read.revision,
    ))
}

/// Waits on the client's watch stream until `goal` is reached, starting from `round` as
/// known through `known`; returns the round then. A watcher that starts after `known`
/// (new on this client, or restarted after compaction) is closed by one read.
///
/// The watcher starts from now, not from `known`: the others join and leave within
/// milliseconds, so by the time it is created they have written after `known`, and etcd
/// serves a watcher that starts at a revision it has passed *unsynced*, every event up to
/// 100 ms late (a round cost one such loop per phase: 104 ms for 2 participants). From
/// now it is synced, and the read after it closes the gap. What the participant then
/// judges is a snapshot and every event after it: a suffix of the history, as a
/// participant slow to look would see. A round that filled and emptied inside the gap is
/// missed only if nobody decided it (a decision is the ready key, which stays until the
/// round's participants are gone); then it did not fill for anyone, and the participant
/// that left is counted out as if it had left before the last one came.
async fn wait_until(
    place: &Place<'_>,
    round: Round,
    known: i64,
    goal: Goal,
) -> Result<(Round, i64)> {
    let spec = Spec::prefix(place.prefix, Only::All);
    let condition = Watching {
        round,
        known,
        goal: goal.clone(),
    };
    let mut waiting = place.watches.wait_for(spec, known, condition);
    let mut known = known;
    loop {
        match waiting.next().await {
            Wake::From { after, .. } if after <= known => {}
            Wake::From { .. } => {
                let (round, at) = read_round(place).await?;
                let condition = Watching {
                    round,
                    known: at,
                    goal: goal.clone(),
                };
                if condition.reached() {
                    return Ok((condition.round, at));
                }
                known = at;
                waiting.wait_again(at, condition);
            }
            Wake::Verdict(verdict) => return verdict,
            Wake::Failed(e) => return Err(e),
        }
    }
}
