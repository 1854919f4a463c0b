//! The guard core: one acquisition ([`Hold`]), the guard-side handle on it ([`Held`]),
//! release, proclamation and guarded transactions.

use std::sync::{Arc, Mutex as StdMutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use tokio::sync::OwnedMutexGuard;

use super::requests::{self, RequestKey};
use super::{Kind, Place, Wait};
use crate::client::follow::Followed;
use crate::client::lease::LeaseState;
use crate::client::removal::Owned;
use crate::line::queue;
use crate::support::backoff::Backoff;
use crate::support::error::operation::Operation;
use crate::support::error::{Error, Result};
use crate::support::kv::text;
use crate::support::kv::{Compare, CompareOp, Txn, TxnOp, TxnResponse};
use crate::support::signal::Signal;
use crate::transport::Rpc;

mod downgrade;
mod together;

use crate::support::sim::{Mutation, mutation};
use together::guarded_txn;
pub(crate) use together::{guarded_txn_all, release_together};

/// One acquisition of a line.
pub(crate) struct Hold {
    pub(super) line: Arc<Place>,
    /// For a leadership handed over to this session, the old leader's key, which now
    /// carries our lease (`handover.rs`); `None`: the line's own key (no copy of it per
    /// acquire).
    pub(super) handed_key: Option<Vec<u8>>,
    /// The key's create revision: what guarded writes and the release compare.
    pub(super) rev: i64,
    /// The fencing token: the create revision of the key it joined the line with (for a
    /// leadership handed over, that key's, not the adopted key's: docs/design/handover.md).
    pub(super) token: i64,
    pub(super) kind: Kind,
    /// When the hold began, for the hold-time metric (zero-sized without `metrics`).
    pub(super) acquired: crate::support::telemetry::Stopwatch,
    pub(super) state: StdMutex<HoldState>,
    /// Serialises proclamations, whose exactly-once condition is the last value revision.
    pub(super) proclaiming: tokio::sync::Mutex<()>,
    /// Its release requests' follower, once asked for (`requests.rs`).
    pub(super) requests: StdMutex<Option<super::requests::Requests>>,
}

pub(super) struct HoldState {
    /// Which [`Held`] is live: a re-campaign hands the hold to a new guard.
    pub(super) generation: u64,
    /// The thread that acquired (or re-campaigned) it: a second acquire from that thread
    /// would wait on itself.
    pub(super) thread: ThreadId,
    /// The live guard's "lost" signal.
    pub(super) signal: Arc<Signal>,
    /// The local turn, until the release (or its cleanup) is answered.
    pub(super) local_turn: Option<OwnedMutexGuard<()>>,
    pub(super) ended: bool,
    /// A hand-over's adoption is on its way (`handover.rs`): the guard does not lead
    /// meanwhile (it leads again if the hand-over fails, and ends if it applied).
    pub(super) handing_over: bool,
    /// Mod revision of our key as we last wrote or read it (proclaim's condition).
    pub(super) value_rev: i64,
}

impl Hold {
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, HoldState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.state().ended
    }

    /// The key held: the line's own, or the one handed over to it.
    pub(super) fn key(&self) -> &[u8] {
        self.handed_key.as_deref().unwrap_or(&self.line.key)
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// Ends the hold because its key is gone (deleted by anyone, or re-created with another
    /// revision): every guard on it turns false and its `lost()` fires. The local turn is
    /// released; there is nothing left to delete but the key's release request, if the key
    /// is still gone (`requests::remove_after_loss`).
    fn lose_key(&self) {
        let mut state = self.state();
        if state.ended {
            return;
        }
        state.ended = true;
        state.signal.fire();
        state.local_turn = None;
        drop(state);
        requests::remove_after_loss(&self.line, self.key());
        crate::support::telemetry::key_lost(&self.line.name, self.kind.operation(), || {
            self.line.session.lease().loss_reason()
        });
    }
}

impl Followed for Hold {
    fn lose_key(&self) {
        Hold::lose_key(self);
    }

    fn is_ended(&self) -> bool {
        Hold::is_ended(self)
    }
}

/// The guard side of a hold: what every `Guard` (recipes/guard.rs) is made of.
pub(crate) struct Held {
    hold: Arc<Hold>,
    generation: u64,
    signal: Arc<Signal>,
    /// A release still being retried in the background: `resign` waits for it again.
    pending: Option<tokio::sync::oneshot::Receiver<Result<bool>>>,
}

/// How a release ended.
#[derive(Debug)]
pub(crate) enum Released {
    /// Our key was deleted.
    Deleted,
    /// The key was already gone or belonged to someone else: nothing was deleted.
    NotOurs,
    /// This guard no longer owned the hold (superseded, or already ended).
    NotCurrent,
}

impl Held {
    pub(super) fn new(hold: Arc<Hold>) -> Held {
        let (generation, signal) = {
            let state = hold.state();
            (state.generation, state.signal.clone())
        };
        hold.line.session.lease().on_lost(&signal);
        Held {
            hold,
            generation,
            signal,
            pending: None,
        }
    }

    pub(crate) fn key(&self) -> &[u8] {
        self.hold.key()
    }

    /// The prefix of the line the key is in (`<name>/`).
    pub(crate) fn prefix(&self) -> &[u8] {
        &self.hold.line.prefix
    }

    /// The lease our key is bound to: the session's.
    pub(crate) fn lease_id(&self) -> i64 {
        self.hold.line.session.lease_id()
    }

    /// The fencing token (see [`Hold::token`]).
    pub(crate) fn token(&self) -> i64 {
        self.hold.token
    }

    pub(super) fn hold(&self) -> &Arc<Hold> {
        &self.hold
    }

    pub(crate) fn rev(&self) -> i64 {
        self.hold.rev
    }

    /// How the key shares its name's line.
    pub(crate) fn mode(&self) -> crate::line::mode::Mode {
        self.hold.line.mode
    }

    /// Whether this guard is the hold's live one and the hold has not ended.
    pub(crate) fn is_current(&self) -> bool {
        let state = self.hold.state();
        state.generation == self.generation && !state.ended && !state.handing_over
    }

    /// Marks (`true`) or unmarks a hand-over's adoption on its way: while marked the guard
    /// does not lead ([`is_current`](Held::is_current) is false), so it never says it leads
    /// once the successor may. `false` if this guard no longer owns the hold.
    pub(super) fn handing_over(&self, on: bool) -> bool {
        let mut state = self.hold.state();
        if state.generation != self.generation || state.ended {
            return false;
        }
        state.handing_over = on;
        true
    }

    /// Runs `txn` inside a transaction that first checks that our key still has our
    /// create revision: `Ok(None)` if it does not. Nothing is sent once this process
    /// knows the hold is over: a superseded guard (`Ok(None)`), or a lost session
    /// (`SessionLost`; past its keep-alive deadline the lease may be gone on the server
    /// although etcd's answer would still show our key).
    pub(crate) fn guarded_txn(&self, txn: Txn) -> Result<Option<TxnResponse>> {
        if !self.is_current() {
            return Ok(None);
        }
        self.hold.line.session.lease().check()?;
        guarded_txn(
            self.hold.line.session.client(),
            self.ownership().to_vec(),
            txn,
        )
    }

    /// The conditions "our key still has our create revision, and our lease": after a
    /// leadership was handed over, the key keeps its create revision on the successor's
    /// lease, so the revision alone would let the old leader's late writes pass.
    fn ownership(&self) -> [Compare; 2] {
        let lease = self.hold.line.session.lease_id();
        [
            Compare::create_revision(self.key().to_vec(), CompareOp::Equal, self.rev()),
            Compare::lease(self.key().to_vec(), CompareOp::Equal, lease),
        ]
    }

    /// Makes this guard's "lost" signal `shared` (a guard over several holds: the first
    /// loss of any of them fires it). Fires it at once if this hold's signal already
    /// fired. Under the hold's state lock, so no loss falls between the two signals.
    pub(crate) fn share_signal(&mut self, shared: &Arc<Signal>) {
        let mut state = self.hold.state();
        if state.generation == self.generation {
            if state.ended || state.signal.is_fired() {
                shared.fire();
            }
            state.signal = shared.clone();
        } else {
            shared.fire();
        }
        drop(state);
        self.signal = shared.clone();
        self.hold.line.session.lease().on_lost(shared);
    }

    /// Puts `key = value` while we own: the revision of the write, or `None` if not ours.
    pub(crate) fn put(&self, key: &[u8], value: &[u8]) -> Result<Option<i64>> {
        let key = crate::client::non_empty_key(key)?;
        let response = self.guarded_txn(Txn::new().and_then([TxnOp::put(key, value)]))?;
        Ok(response.map(|r| r.revision))
    }

    /// Deletes `key` while we own: how many keys went (0 or 1), or `None` if not ours.
    pub(crate) fn delete(&self, key: &[u8]) -> Result<Option<i64>> {
        let key = crate::client::non_empty_key(key)?;
        let response = self.guarded_txn(Txn::new().and_then([TxnOp::delete(key)]))?;
        Ok(response.map(|r| match r.responses.first() {
            Some(crate::support::kv::TxnOpResponse::Delete { deleted }) => *deleted,
            _ => 0,
        }))
    }

    /// A guard's explicit release (`release`, `resign`): waits one request timeout for
    /// etcd's answer; if none came, the release goes on in the background and calling
    /// this again waits for it once more.
    pub(crate) fn release_now(&mut self) -> Result<Released> {
        crate::client::runtime::ensure_blocking_allowed()?;
        let wait = self.hold.line.session.client().rpc().request_timeout();
        self.release(Some(wait))
    }

    /// Held as far as this process can tell without asking etcd: current, not lost, and
    /// the session's lease deadline has not passed.
    pub(crate) fn is_held(&self) -> bool {
        !self.signal.is_fired() && self.is_current() && self.hold.line.session.is_alive()
    }

    pub(crate) fn lost(&self) -> crossbeam_channel::Receiver<()> {
        // An already-passed lease deadline shows in the channel too.
        if !self.hold.line.session.is_alive() {
            self.signal.fire();
        }
        self.signal.receiver()
    }

    /// Ends the hold and deletes our key by its create revision and our lease (a key handed
    /// over keeps its create revision under the successor's lease). Waits for etcd's answer
    /// at most `wait` (`None`: not at all); the removal goes on in the background until
    /// etcd answers, keeping the local turn until then.
    fn release(&mut self, wait: Option<Duration>) -> Result<Released> {
        if let Some(pending) = self.pending.take() {
            return self.await_release(pending, wait, crate::support::clock::now());
        }
        let Some(local_turn) = self.end() else {
            return Ok(Released::NotCurrent);
        };
        let line = self.hold.line.clone();
        // Our key is on our lease: one on another lease (a hand-over that applied unheard
        // and reported `NotLeader`) is the successor's, whose create revision it keeps.
        let owned = Owned::Leased(self.hold.rev, line.session.lease_id());
        let Some(limit) = wait else {
            // Not waiting at all: the whole release runs in the background.
            drop(spawn_removal_of(&line, self.hold.key(), owned, local_turn));
            return Ok(Released::NotCurrent);
        };
        // The first attempt runs on the caller's thread (no hand-over to the runtime on
        // the fast path); only an unanswered one moves to the background, local turn in
        // hand.
        let rpc = line.session.client().rpc().clone();
        let started = crate::support::clock::now();
        let key = self.hold.key();
        let first = line.session.client().block_on(async {
            let request = RequestKey::of(&line, key);
            let removal = requests::remove_key_and_request(&rpc, key, &request, owned);
            Ok(tokio::time::timeout(limit, removal).await)
        })?;
        match first {
            Ok(Ok(true)) => Ok(Released::Deleted),
            Ok(Ok(false)) => Ok(Released::NotOurs),
            Ok(Err(e)) if !e.is_transient() => Err(e),
            _ => {
                let pending = spawn_removal_of(&line, self.hold.key(), owned, local_turn);
                // What is left of the caller's bound; a timeout reports all of it.
                let left = limit.saturating_sub(crate::support::clock::since(started));
                self.await_release(pending, Some(left), started)
            }
        }
    }

    /// Ends the hold for its release: `None` if this guard no longer owns it, else the
    /// local turn, to be kept until etcd has answered the removal of our key.
    fn end(&mut self) -> Option<Option<OwnedMutexGuard<()>>> {
        let local_turn = {
            let mut state = self.hold.state();
            if state.generation != self.generation || state.ended {
                return None;
            }
            state.ended = true;
            state.signal.fire();
            state.local_turn.take()
        };
        let hold = &self.hold;
        let session_loss = || hold.line.session.lease().loss_reason();
        crate::support::telemetry::released(
            &hold.line.name,
            hold.kind.operation(),
            hold.acquired,
            session_loss,
        );
        tracing::debug!(key = %text(self.key()), fencing_token = self.rev(), "releasing");
        Some(local_turn)
    }

    /// Waits up to `wait` for a release running in the background; a timeout reports the
    /// time since `since`, when the caller started waiting for this release.
    fn await_release(
        &mut self,
        mut pending: tokio::sync::oneshot::Receiver<Result<bool>>,
        wait: Option<Duration>,
        since: Instant,
    ) -> Result<Released> {
        let Some(limit) = wait else {
            return Ok(Released::NotCurrent);
        };
        let client = self.hold.line.session.client();
        let outcome =
            client.block_on(async { Ok(tokio::time::timeout(limit, &mut pending).await) })?;
        match outcome {
            Ok(Ok(Ok(true))) => Ok(Released::Deleted),
            Ok(Ok(Ok(false))) => Ok(Released::NotOurs),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => {
                self.pending = Some(pending);
                Err(Error::Timeout {
                    operation: Operation::Release,
                    after: crate::support::clock::since(since),
                    endpoint: None,
                })
            }
        }
    }

    /// The client's request timeout: how long an explicit release waits for etcd.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.hold.line.session.client().rpc().request_timeout()
    }

    /// The bound for a release from `Drop`: none inside an async runtime or once the lease
    /// is gone (etcd deletes the key with it and may be unreachable), else one request
    /// timeout.
    pub(crate) fn drop_wait(&self) -> Option<Duration> {
        let session = &self.hold.line.session;
        if crate::client::runtime::inside_async() || !session.is_alive() {
            None
        } else {
            Some(session.client().rpc().request_timeout())
        }
    }

    /// Proclaims `value` under our key (see [`proclaim`]); `Ok(false)` when this guard is
    /// not current or the key is no longer ours.
    pub(crate) fn proclaim(&self, value: &[u8]) -> Result<bool> {
        if !self.is_current() {
            return Ok(false);
        }
        proclaim(&self.hold, value, &Wait::forever())
    }

    /// Ends the hold after its key was handed over to another session (`handover.rs`):
    /// nothing to delete, the key is the successor's now. The guard reports the loss.
    pub(super) fn end_handed_over(&self) {
        let mut state = self.hold.state();
        if state.generation != self.generation || state.ended {
            return;
        }
        state.handing_over = false;
        state.ended = true;
        state.signal.fire();
        state.local_turn = None;
        drop(state);
        let hold = &self.hold;
        crate::support::telemetry::released(
            &hold.line.name,
            hold.kind.operation(),
            hold.acquired,
            || None,
        );
    }

    /// Supersedes this guard with a new one on the same hold (a re-campaign): this one
    /// reports the loss, the new one is live.
    pub(crate) fn supersede(hold: &Arc<Hold>) -> Option<Held> {
        {
            let mut state = hold.state();
            if state.ended {
                return None;
            }
            if mutation(Mutation::ReCampaignAliases) {
                drop(state);
                return Some(Held::new(hold.clone()));
            }
            state.signal.fire();
            state.generation += 1;
            state.signal = Arc::new(Signal::new());
            state.thread = std::thread::current().id();
        }
        Some(Held::new(hold.clone()))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.pending.is_some() || !self.is_current() {
            return; // superseded, ended, or its release already runs in the background
        }
        let wait = self.drop_wait();
        let _ = self.release(wait);
    }
}

/// Proclaims `value` under the hold's key, exactly once: the Txn requires our create
/// revision *and* the value revision we last wrote or read, so an attempt that reaches etcd
/// late (after a newer proclamation) changes nothing. `Ok(false)`: the key is not ours.
/// Within `wait` (a re-campaign is a campaign: its limit and cancel token apply) and ended
/// by the session's loss; a proclamation cut short that reaches etcd later applies only if
/// nothing newer was written, so the value is never older than the last one proclaimed.
pub(crate) fn proclaim(hold: &Arc<Hold>, value: &[u8], wait: &Wait) -> Result<bool> {
    // A lost session writes nothing, although etcd may still show our key.
    let lease = hold.line.session.lease().clone();
    lease.check()?;
    let hold = hold.clone();
    let value = value.to_vec();
    let session = hold.line.session.clone();
    let rpc = session.client().rpc().clone();
    let operation = Operation::Campaign;
    session
        .client()
        .block_on(wait.bound_alive(operation, &lease, async {
            let _one_at_a_time = hold.proclaiming.lock().await;
            proclaim_once(&rpc, &hold, &value).await
        }))
        .map_err(|e| lease.judge(e))
}

/// The proclaim Txn with the exactly-once condition; on a failed condition (or no answer)
/// one read tells "an attempt of ours applied" (the key has our value) from "not ours any
/// more" (another create revision, or no key). A key still ours with another value was
/// written after the base we compared: by someone behind our back, or by an earlier attempt
/// of ours that reached etcd late, after the read (a second put on the same base is refused
/// then). Either way the newer revision becomes the base and the Txn goes again; each round
/// needs a write in between, which the caller's wait and the session bound.
async fn proclaim_once(rpc: &Rpc, hold: &Hold, value: &[u8]) -> Result<bool> {
    let key = hold.key();
    let lease = hold.line.session.lease_id();
    let mut base = hold.state().value_rev;
    let done = |revision: i64| {
        hold.state().value_rev = revision;
        Ok(true)
    };
    loop {
        match queue::put_if_unchanged(rpc, key, hold.rev, base, value, lease).await {
            Ok(Some(revision)) => return done(revision),
            Ok(None) => {}
            Err(e) if e.is_transient() => {} // it may have applied: the read below tells
            Err(e) => return Err(e),
        }
        match queue::read_key(rpc, key).await? {
            // Ours: our create revision *and* our lease (a leadership handed over keeps
            // its create revision on the successor's lease: never put it back on ours).
            Some(kv) if kv.create_revision == hold.rev && kv.lease == lease => {
                if kv.value == value {
                    return done(kv.mod_revision);
                }
                base = kv.mod_revision;
            }
            _ => {
                hold.lose_key();
                return Ok(false);
            }
        }
    }
}

/// Deletes the line's key (and its release request, `line/request.rs`) in a task that owns
/// `local_turn` until etcd answered; the receiver gets the first answer. Transient failures
/// are retried until answered or the session is lost (the lease then takes the key with
/// it).
pub(super) fn spawn_removal(
    line: &Place,
    owned: Owned,
    local_turn: Option<OwnedMutexGuard<()>>,
) -> tokio::sync::oneshot::Receiver<Result<bool>> {
    spawn_removal_of(line, &line.key, owned, local_turn)
}

/// [`spawn_removal`] of `key`, a hold's key (the line's, or one handed over to it).
pub(super) fn spawn_removal_of(
    line: &Place,
    key: &[u8],
    owned: Owned,
    local_turn: Option<OwnedMutexGuard<()>>,
) -> tokio::sync::oneshot::Receiver<Result<bool>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let session = &line.session;
    let rpc = session.client().rpc().clone();
    let shared = session.lease().clone();
    let request = RequestKey::of(line, key);
    let key = key.to_vec();
    session.client().spawn(async move {
        let answer = remove_until_answered(&rpc, &shared, &key, &request, owned).await;
        let _ = tx.send(answer);
        drop(local_turn);
    });
    rx
}

/// [`requests::remove_key_and_request`] until etcd answers, the session is lost, or the client closes.
pub(super) async fn remove_until_answered(
    rpc: &Rpc,
    session: &LeaseState,
    key: &[u8],
    request: &RequestKey,
    owned: Owned,
) -> Result<bool> {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        match requests::remove_key_and_request(rpc, key, request, owned).await {
            Err(e) if e.is_transient() => {
                if let Some(reason) = session.loss_reason() {
                    return Err(Error::SessionLost(reason));
                }
                tracing::debug!(error = %e, "removal not answered; retrying");
                backoff.sleep().await;
            }
            answered => return answered,
        }
    }
}
