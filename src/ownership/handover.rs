//! Leadership handover to a chosen waiting candidate (issue 53, docs/design/handover.md).
//!
//! The leader L cannot make a candidate C first in line (a Go waiter ahead of C waits for
//! keys older than its own, and etcd never changes a create revision), so C **adopts** L's
//! key: one Txn puts L's key with C's value on C's lease (create revision unchanged, so
//! every waiter keeps its place behind it) and deletes C's own key. Before it, a handshake
//! makes sure C still waits and will take the key, so a dead candidate never leaves the
//! name without a leader for a TTL:
//!
//! 1. L writes the request `<name>.handover/<C's suffix>` on L's lease ([`hand_over`]);
//! 2. C's wait, which watches that key while it waits ([`answer`]), writes its answer over
//!    it (still on L's lease, so it goes with L's session);
//! 3. L's adoption Txn requires the answer, C's key and L's own key and lease; it deletes
//!    the request. No answer within the caller's limit: L deletes the request and still
//!    leads ([`Error::HandOverFailed`]).
//! 4. C's wait sees its key deleted, reads the name once and holds the key of its lease
//!    that is first in line ([`adopted`]); a wait that answered and then ended anyway
//!    removes such a key after its own ([`remove_after_answer`]), so none is left.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::hold::{Held, remove_until_answered};
use super::requests::RequestKey;
use super::{Place, Wait};
use crate::client::lease::LeaseState;
use crate::client::removal::{self, Owned};
use crate::line::handed::{self, Handed};
use crate::line::mode::Mode;
use crate::line::wait::Granted;
use crate::support::error::operation::Operation;
use crate::support::error::{Error, Result};
use crate::support::kv::{Compare, CompareOp, KeyValue, Range, Txn, TxnOp, text};
use crate::support::sim::{Mutation, mutation};
use crate::transport::watch::{EventKind, Only};
use crate::transport::watches::{Delivery, Spec, Watches};
use crate::transport::{Retry, Rpc};

/// The waiting side, run beside a candidate's wait: answers every hand-over request
/// addressed to our key (created at `rev`, known to exist at `from`), and sets `answered`
/// first. Never ends; a failed watch only stops the answering (a hand-over then fails on
/// the leader's side, which still leads).
pub(super) async fn answer(
    rpc: &Rpc,
    watches: &Watches,
    line: &Place,
    (rev, from): (i64, i64),
    answered: &AtomicBool,
) -> Infallible {
    if let Some(request) = handed::request_key(&line.name, &line.key) {
        let asked = handed::request_value(rev);
        let mut requests = watches.subscribe(Spec::key(&request, Only::Puts), from);
        let mut known = from;
        loop {
            let found = match requests.next().await {
                Delivery::Events(batch) => batch
                    .iter()
                    .filter(|e| e.kind == EventKind::Put && e.kv.value == asked)
                    .map(|e| e.kv.clone())
                    .next_back(),
                // History we cannot watch: one read of the request says if one waits.
                Delivery::From { after, .. } if after > known => {
                    known = after;
                    match rpc.read(&Range::key(&request)).await {
                        Ok(read) => read.kvs.into_iter().find(|kv| kv.value == asked),
                        Err(_) => None,
                    }
                }
                Delivery::From { .. } => None,
                Delivery::Failed(e) => {
                    tracing::debug!(error = %e, "hand-over requests not watched");
                    break;
                }
            };
            if let Some(kv) = found {
                answered.store(true, Ordering::SeqCst);
                let txn = Txn::new()
                    .when([
                        Compare::create_revision(line.key.clone(), CompareOp::Equal, rev),
                        Compare::mod_revision(request.clone(), CompareOp::Equal, kv.mod_revision),
                    ])
                    .and_then([TxnOp::put_with_lease(
                        request.clone(),
                        handed::ack_value(rev),
                        kv.lease,
                    )]);
                let answer = rpc.txn(&txn, Retry::Safe).await;
                tracing::debug!(key = %text(&line.key), ?answer, "hand-over request answered");
            }
        }
    }
    std::future::pending().await
}

/// After our wait's key (created at `rev`) was deleted, having answered a hand-over: one
/// read of the name; the key of our lease that is first in line, if any, is ours (the
/// leader's key, adopted). `None`: not handed over (our key was deleted by someone).
pub(super) async fn adopted(rpc: &Rpc, line: &Place, rev: i64) -> Result<Option<Granted>> {
    let session = line.session.lease();
    let range = Range::prefix(&line.prefix);
    let read = session.retry_while_alive(|| rpc.read(&range)).await?;
    let lease = line.session.lease_id();
    let in_line = |kv: &&KeyValue| Mode::of_key(&line.prefix, &kv.key).is_some();
    let first = read
        .kvs
        .iter()
        .filter(in_line)
        .min_by_key(|kv| kv.create_revision);
    let Some(first) =
        first.filter(|kv| kv.lease == lease && kv.key != line.key && kv.create_revision < rev)
    else {
        return Ok(None);
    };
    tracing::info!(key = %text(&first.key), at = first.mod_revision, "leadership handed over to us");
    Ok(Some(Granted {
        at: read.revision,
        keep: None,
        handed: Some(Handed {
            key: first.key.clone(),
            rev: first.create_revision,
            value_rev: first.mod_revision,
        }),
    }))
}

/// Whether `kv`, a key of our lease under the name, is a leader's key handed over to us:
/// an exclusive key named after another lease (our own keys are named after ours).
fn handed_to_us(line: &Place, kv: &KeyValue) -> bool {
    Mode::of_key(&line.prefix, &kv.key) == Some(Mode::Exclusive)
        && Mode::lease_of(&line.prefix, &kv.key) != Some(line.session.lease_id())
}

/// A wait that answered a hand-over and failed anyway (its limit, a cancel, the session):
/// removes our key (created at `rev`) until etcd answers, then any key of our lease in the
/// line that is not the line's own (a hand-over applied before our key went: nobody holds
/// it), local turn in hand. Once our key is gone no hand-over to it can apply.
pub(super) fn remove_after_answer(
    line: &Arc<Place>,
    rev: i64,
    local_turn: tokio::sync::OwnedMutexGuard<()>,
) -> tokio::sync::oneshot::Receiver<Result<bool>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let session = line.session.lease().clone();
    let rpc = line.session.client().rpc().clone();
    let line = line.clone();
    line.session.client().clone().spawn(async move {
        let request = RequestKey::of(&line, &line.key);
        let owned = Owned::Revision(rev);
        let answer = remove_until_answered(&rpc, &session, &line.key, &request, owned).await;
        if answer.is_ok() {
            let lease = line.session.lease_id();
            let range = Range::prefix(&line.prefix);
            if let Ok(read) = session.retry_while_alive(|| rpc.read(&range)).await {
                for kv in read.kvs.iter().filter(|kv| kv.lease == lease && handed_to_us(&line, kv)) {
                    tracing::info!(key = %text(&kv.key), "removing a leadership handed over to a wait that ended");
                    let owned = Owned::Revision(kv.create_revision);
                    let _ = session.retry_while_alive(|| removal::remove(&rpc, &kv.key, owned)).await;
                }
            }
        }
        let _ = tx.send(answer);
        drop(local_turn);
    });
    rx
}

/// Whom a hand-over goes to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum To<'a> {
    /// The waiting candidate with this key, or else this value (wherever it waits).
    Named(&'a [u8]),
    /// The first key in line behind the leader, as the hand-over's own read finds it. No
    /// key can come between the two later (new keys queue behind, and only the leader's
    /// key is adopted), so nobody is passed over and the successor's token is the least
    /// of the waiters'.
    Next,
}

impl To<'_> {
    /// How an error names the candidate.
    fn shown(&self) -> &[u8] {
        match self {
            To::Named(to) => to,
            To::Next => b"the next in line",
        }
    }
}

/// The leader's side: hands `held`'s leadership to the candidate `to` within `wait`.
/// `Ok`: the candidate leads (the key as the hand-over left it) and `held` has ended
/// without deleting anything. `Err(HandOverFailed)`: `held` still leads.
pub(crate) fn hand_over(held: &Held, to: To<'_>, wait: &Wait) -> Result<KeyValue> {
    crate::client::runtime::ensure_blocking_allowed()?;
    if !held.is_current() {
        return Err(Error::NotLeader);
    }
    let hold = held.hold().clone();
    let line = hold.line.clone();
    let session = line.session.lease().clone();
    session.check()?;
    let client = line.session.client().clone();
    let rpc = client.rpc().clone();
    let ours = (hold.key().to_vec(), hold.rev, line.session.lease_id());
    // Bounded as a campaign is (the wait's limit, token and the session); a limit that
    // passed is reported as the hand-over's failure.
    let outcome = client.block_on(async {
        let watches = client.watches();
        let asking = ask(&rpc, watches, &line, &ours, to);
        let asked = wait
            .bound_alive(Operation::Campaign, &session, asking)
            .await?;
        // The guard stops leading before the successor can (and leads again if the
        // adoption fails): never two guards that say they lead.
        if !held.handing_over(true) {
            return Err(Error::NotLeader);
        }
        // From here only etcd's answer (or our session's end) ends the call: an adoption
        // cut short could apply later, while this guard led again.
        adopt(&rpc, &session, &ours, asked).await
    });
    if outcome.is_err() {
        held.handing_over(false);
    }
    let holder = outcome.map_err(|e| match e {
        Error::Timeout { after, .. } if e.is_wait_timeout() => Error::HandOverFailed {
            to: text(to.shown()).into_owned(),
            reason: format!("{} {after:?}", reason::NOT_TAKEN_WITHIN),
        },
        e => session.judge(e),
    });
    let holder = match holder {
        Ok(holder) => holder,
        Err(e) => {
            // Whatever happened, no request of ours stays: it goes with our lease, and
            // sooner here (a late answer then changes nothing).
            withdraw(&client, &rpc, &line);
            return Err(e);
        }
    };
    held.end_handed_over();
    Ok(holder)
}

/// A request answered: the candidate's key as read, the request key and the revision of
/// the answer.
struct Asked {
    candidate: KeyValue,
    request: Vec<u8>,
    answered_at: i64,
}

/// The reasons of [`Error::HandOverFailed`] that say the candidate or another's request was
/// in the way (the simulation checks that each was true: `testing/sim/run/handover.rs`).
pub(crate) mod reason {
    /// The first read found no such waiter behind the leader.
    pub(crate) const NO_CANDIDATE: &str = "no such candidate waits behind us";
    /// Another request for the candidate stands.
    pub(crate) const ANOTHER: &str = "another hand-over to it is under way";
    /// etcd refused the adoption: the candidate's lease is gone.
    pub(crate) const SESSION_ENDED: &str = "its session ended";
    /// The caller's limit ran out before the candidate answered (followed by the limit).
    pub(crate) const NOT_TAKEN_WITHIN: &str = "the candidate did not take it within";
}

fn failed(to: &[u8], reason: &str) -> Error {
    Error::HandOverFailed {
        to: text(to).into_owned(),
        reason: reason.to_owned(),
    }
}

/// The request and its answer (the module's steps 1 and 2).
async fn ask(
    rpc: &Rpc,
    watches: &Watches,
    line: &Place,
    (key, rev, lease): &(Vec<u8>, i64, i64),
    to: To<'_>,
) -> Result<Asked> {
    let read = rpc.read(&Range::prefix(&line.prefix)).await?;
    let exclusive = |kv: &&KeyValue| Mode::of_key(&line.prefix, &kv.key) == Some(Mode::Exclusive);
    if !read
        .kvs
        .iter()
        .any(|kv| kv.key == *key && kv.create_revision == *rev && kv.lease == *lease)
    {
        return Err(Error::NotLeader);
    }
    let candidates = || {
        read.kvs
            .iter()
            .filter(exclusive)
            .filter(|kv| kv.create_revision > *rev)
    };
    let found = match to {
        To::Named(to) => candidates()
            .find(|kv| kv.key == to)
            .or_else(|| candidates().find(|kv| kv.value == to)),
        // The first in line behind us, if it is a candidate (any other mode never adopts).
        To::Next => read
            .kvs
            .iter()
            .filter(|kv| Mode::of_key(&line.prefix, &kv.key).is_some())
            .filter(|kv| kv.create_revision > *rev)
            .min_by_key(|kv| kv.create_revision)
            .filter(|kv| exclusive(kv)),
    };
    let Some(c) = found.cloned() else {
        return Err(failed(to.shown(), reason::NO_CANDIDATE));
    };
    if c.lease == 0 || c.lease == *lease {
        return Err(failed(
            &c.key,
            "that key is no candidate of another session",
        ));
    }
    let Some(request) = handed::request_key(&line.name, &c.key) else {
        return Err(failed(&c.key, "not under the election's name"));
    };
    let asked = handed::request_value(c.create_revision);
    let leading = [
        Compare::create_revision(key.clone(), CompareOp::Equal, *rev),
        Compare::lease(key.clone(), CompareOp::Equal, *lease),
        Compare::create_revision(c.key.clone(), CompareOp::Equal, c.create_revision),
    ];
    // 1. The request (a retry that finds its own earlier copy goes on from it: the
    // candidate may have answered it already), and 2. the answer, over the request.
    let put = Txn::new()
        .when(leading.iter().cloned().chain([Compare::create_revision(
            request.clone(),
            CompareOp::Equal,
            0,
        )]))
        .and_then([TxnOp::put_with_lease(
            request.clone(),
            asked.clone(),
            *lease,
        )]);
    let taken = handed::ack_value(c.create_revision);
    let waiting = (rpc, watches, &**line.session.lease());
    let answered_at = match rpc.txn(&put, Retry::Safe).await? {
        r if r.succeeded => answer_to(waiting, &request, r.revision, &taken, &c).await?,
        _ => match rpc
            .read(&Range::key(&request))
            .await?
            .kvs
            .into_iter()
            .next()
        {
            Some(kv) if mutation(Mutation::RetryRefusesOwnRequest) && kv.lease == *lease => {
                return Err(failed(&c.key, reason::ANOTHER));
            }
            Some(kv) if kv.lease == *lease && kv.value == asked => {
                answer_to(waiting, &request, kv.mod_revision, &taken, &c).await?
            }
            Some(kv) if kv.lease == *lease && kv.value == taken => kv.mod_revision,
            Some(_) => return Err(failed(&c.key, reason::ANOTHER)),
            None => return Err(not_leading_or_gone(rpc, (key, rev, lease), &c).await),
        },
    };
    // The candidate's value as it waits now (a campaign on a resumed lease proclaims its
    // new value before it waits, and answers only while it waits): the adoption puts it,
    // and requires it unchanged.
    let now = rpc.read(&Range::key(&c.key)).await?.kvs.into_iter().next();
    let Some(c) = now.filter(|kv| kv.create_revision == c.create_revision) else {
        return Err(failed(&c.key, "it no longer waits"));
    };
    Ok(Asked {
        candidate: c,
        request,
        answered_at,
    })
}

/// Waits for the candidate `c`'s answer (`taken`) over our `request`, asked at
/// `asked_at`: the answer's revision, or `HandOverFailed` if the request goes.
async fn answer_to(
    (rpc, watches, session): (&Rpc, &Watches, &LeaseState),
    request: &[u8],
    asked_at: i64,
    taken: &[u8],
    c: &KeyValue,
) -> Result<i64> {
    tracing::debug!(to = %text(&c.key), at = asked_at, "hand-over requested");
    let mut answers = watches.subscribe(Spec::key(request, Only::All), asked_at);
    let range = Range::key(request);
    loop {
        let found = match answers.next().await {
            Delivery::Events(batch) => batch.iter().find_map(|e| match e.kind {
                EventKind::Put if e.kv.value == taken => Some(Ok(e.kv.mod_revision)),
                EventKind::Delete => Some(Err(())),
                EventKind::Put => None,
            }),
            // Part of the wait (after a resumed watch, whose reconnection a first read may
            // still meet): patient with a transient failure, as the watch is.
            Delivery::From { .. } => match session
                .retry_while_alive(|| rpc.read(&range))
                .await?
                .kvs
                .first()
            {
                Some(kv) if kv.value == taken => Some(Ok(kv.mod_revision)),
                Some(_) => None,
                None => Some(Err(())),
            },
            Delivery::Failed(e) => return Err(e),
        };
        match found {
            Some(Ok(at)) => return Ok(at),
            Some(Err(())) => return Err(failed(&c.key, "its request was deleted")),
            None => {}
        }
    }
}

/// The adoption (the module's step 3): one Txn, retried until etcd answers it or our
/// session ends (its compares make a late copy a no-op: the request and the candidate's
/// key are gone once it applied); then one read of our key says who holds it.
async fn adopt(
    rpc: &Rpc,
    session: &LeaseState,
    (key, rev, lease): &(Vec<u8>, i64, i64),
    asked: Asked,
) -> Result<KeyValue> {
    let Asked {
        candidate: c,
        request,
        answered_at,
    } = asked;
    let leading = [
        Compare::create_revision(key.clone(), CompareOp::Equal, *rev),
        Compare::lease(key.clone(), CompareOp::Equal, *lease),
        Compare::create_revision(c.key.clone(), CompareOp::Equal, c.create_revision),
        Compare::mod_revision(c.key.clone(), CompareOp::Equal, c.mod_revision),
    ];
    let adopt = Txn::new()
        .when(leading.iter().cloned().chain([Compare::mod_revision(
            request.clone(),
            CompareOp::Equal,
            answered_at,
        )]))
        .and_then([
            TxnOp::put_with_lease(key.clone(), c.value.clone(), c.lease),
            TxnOp::delete(c.key.clone()),
            TxnOp::delete(request.clone()),
        ]);
    let applied = match session
        .retry_while_alive(|| rpc.txn(&adopt, Retry::Safe))
        .await
    {
        Ok(r) => r.succeeded.then_some(r.revision),
        Err(Error::Server { message, .. })
            if message.contains(crate::support::etcd_text::LEASE_NOT_FOUND) =>
        {
            return Err(failed(&c.key, reason::SESSION_ENDED));
        }
        Err(e) => return Err(e),
    };
    if let Some(at) = applied {
        tracing::info!(from = %text(key), to = %text(&c.key), at, "leadership handed over");
        // The key as the Txn left it (the successor may have changed or released it since).
        return Ok(KeyValue {
            key: key.clone(),
            value: c.value,
            lease: c.lease,
            create_revision: *rev,
            mod_revision: at,
            version: 0,
        });
    }
    // Refused: an earlier copy of ours applied (the key is on the successor's lease), or
    // the compares failed.
    let range = Range::key(key);
    let now = session.retry_while_alive(|| rpc.read(&range)).await?;
    match now.kvs.into_iter().next() {
        Some(kv) if kv.create_revision == *rev && kv.lease == c.lease => {
            tracing::info!(from = %text(key), to = %text(&c.key), "leadership handed over");
            Ok(kv)
        }
        _ => Err(not_leading_or_gone(rpc, (key, rev, lease), &c).await),
    }
}

/// Why a step's compares failed: `NotLeader` if our key is no longer ours, else the
/// candidate is gone.
async fn not_leading_or_gone(
    rpc: &Rpc,
    (key, rev, lease): (&[u8], &i64, &i64),
    c: &KeyValue,
) -> Error {
    match rpc.read(&Range::key(key)).await {
        Ok(read)
            if read
                .kvs
                .first()
                .is_some_and(|kv| kv.create_revision == *rev && kv.lease == *lease) =>
        {
            Error::HandOverFailed {
                to: text(&c.key).into_owned(),
                reason: "it no longer waits".into(),
            }
        }
        Ok(_) => Error::NotLeader,
        Err(e) => e,
    }
}

/// Deletes every hand-over request of ours under the name that is left (in the
/// background, once; our lease would take them otherwise).
fn withdraw(client: &crate::client::Client, rpc: &Rpc, line: &Place) {
    let lease = line.session.lease_id();
    let rpc = rpc.clone();
    let Some(requests) = handed::request_key(&line.name, &line.prefix) else {
        return;
    };
    client.spawn(async move {
        if let Ok(read) = rpc.read(&Range::prefix(&requests)).await {
            for kv in read.kvs.into_iter().filter(|kv| kv.lease == lease) {
                let txn = Txn::new()
                    .when([Compare::lease(kv.key.clone(), CompareOp::Equal, lease)])
                    .and_then([TxnOp::delete(kv.key)]);
                let _ = rpc.txn(&txn, Retry::Safe).await;
            }
        }
    });
}
