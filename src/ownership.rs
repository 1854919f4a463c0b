//! The ownership core every recipe (Mutex, Election, and the ones to come) is built on:
//! one path from "I want this name" to a guard, and back.
//!
//! * A [`Line`] is one session's place under one name: the etcd key `<name>/<lease hex>`
//!   and the process-local **turn** in front of it. Every recipe of that session and name
//!   queues on the same turn, so two live guards over one key cannot exist.
//! * [`acquire`] takes the turn, joins the line in etcd (one Txn), waits for the
//!   predecessor ([`queue::wait_turn`]) and, on any failure, cleans up while still owning
//!   the turn.
//! * A [`Hold`] is one acquisition: the create revision (fencing token), the turn, and a
//!   signal that fires when the hold ends for any reason (release, session loss, a
//!   re-campaign that superseded it). [`Held`] is the guard-side handle on it.
//!
//! Cleanup rules (the safety argument is in ARCHITECTURE.md, "Ownership core"):
//! * by create revision whenever the revision is known: it can only delete that one key;
//! * by lease only after an ambiguous enqueue, and only while the turn is owned. Then no
//!   guard or waiter of this process uses the key, so any key of our lease under the name
//!   is a leftover of that attempt, never the key of a live or later guard;
//! * the turn passes to the next local acquirer only after etcd answered the cleanup or
//!   release, so a successor never finds (and adopts) a key that is about to be deleted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use tokio::sync::OwnedMutexGuard;

use crate::error::{Error, Result, TryLockError};
use crate::follow::{Follow, Followed};
use crate::lease::LeaseState;
use crate::queue::{self, Owned, Position};
use crate::session::Session;
use crate::signal::Signal;
use crate::transport::Rpc;

/// What a hold is for: decides what to do with a key this session already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A lock: an existing key of ours is replaced, so fencing tokens strictly increase.
    Lock,
    /// Leadership: an existing key of ours is adopted with its place (Go's re-campaign
    /// after a restart with a resumed lease), and its value proclaimed.
    Lead,
}

/// How long an acquire may wait for its turn.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    Forever,
    /// Until the instant; the duration is the caller's timeout, for the error.
    Until(Instant, Duration),
    /// Only if free now (`try_lock`).
    Never,
}

impl Kind {
    /// The operation's name in errors.
    fn operation(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Lead => "campaign",
        }
    }
}

impl Wait {
    /// `Until(now + timeout)`, or `Forever` when that instant is not representable.
    pub(crate) fn from_timeout(timeout: Duration) -> Wait {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => Wait::Until(deadline, timeout),
            None => Wait::Forever,
        }
    }
}

/// One session's place under one name, shared by every recipe of that session and name.
pub(crate) struct Line {
    session: Session,
    name: Vec<u8>,
    prefix: Vec<u8>,
    key: Vec<u8>,
    /// The process-local turn: owned by whoever uses the key (waiter, guard, cleanup).
    turn: Arc<tokio::sync::Mutex<()>>,
    /// The hold that owns the turn now, if any.
    current: StdMutex<Weak<Hold>>,
}

/// The lines of every session of this process, by session and name. It lives here, not in
/// the session, so the session module does not depend on the ownership core.
static LINES: StdMutex<BTreeMap<(u64, Vec<u8>), Slot>> = StdMutex::new(BTreeMap::new());

/// One session's line under one name, and its turn. The turn is kept apart from the line:
/// a release or cleanup still running in the background holds the turn after the last
/// Mutex, Election and guard of the name are gone, and a line created again must queue
/// behind it.
struct Slot {
    line: Weak<Line>,
    turn: Weak<tokio::sync::Mutex<()>>,
}

impl Line {
    /// The session's line under `name`, shared by every recipe of that session and name
    /// (so a Mutex and an Election of one name on one session take turns on one key).
    pub(crate) fn of(session: &Session, name: &[u8]) -> Result<Arc<Line>> {
        let id = (session.lease().serial(), name.to_vec());
        let mut lines = LINES.lock().unwrap_or_else(|e| e.into_inner());
        let turn = match lines.get(&id) {
            Some(slot) => match slot.line.upgrade() {
                Some(line) => return Ok(line),
                None => slot.turn.upgrade(),
            },
            None => None,
        };
        let turn = turn.unwrap_or_default();
        let line = Arc::new(Line::new(session.clone(), name, turn.clone())?);
        lines.retain(|_, slot| slot.line.strong_count() > 0 || slot.turn.strong_count() > 0);
        lines.insert(
            id,
            Slot {
                line: Arc::downgrade(&line),
                turn: Arc::downgrade(&turn),
            },
        );
        Ok(line)
    }

    fn new(session: Session, name: &[u8], turn: Arc<tokio::sync::Mutex<()>>) -> Result<Line> {
        let prefix = queue::key_prefix(name)?;
        let key = queue::own_key(&prefix, session.lease_id());
        Ok(Line {
            session,
            name: name.to_vec(),
            prefix,
            key,
            turn,
            current: StdMutex::new(Weak::new()),
        })
    }

    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    pub(crate) fn name(&self) -> &[u8] {
        &self.name
    }

    pub(crate) fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    /// The hold that owns this line's turn, if it has not ended.
    pub(crate) fn live_hold(&self) -> Option<Arc<Hold>> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.upgrade().filter(|hold| !hold.is_ended())
    }
}

/// One acquisition of a line.
pub(crate) struct Hold {
    line: Arc<Line>,
    rev: i64,
    kind: Kind,
    state: StdMutex<HoldState>,
    /// Serialises proclamations, whose exactly-once condition is the last value revision.
    proclaiming: tokio::sync::Mutex<()>,
}

struct HoldState {
    /// Which [`Held`] is live: a re-campaign hands the hold to a new guard.
    generation: u64,
    /// The thread that acquired (or re-campaigned) it: a second acquire from that thread
    /// would wait on itself.
    thread: ThreadId,
    /// The live guard's "lost" signal.
    signal: Arc<Signal>,
    /// The turn, until the release (or its cleanup) is answered.
    turn: Option<OwnedMutexGuard<()>>,
    ended: bool,
    /// Mod revision of our key as we last wrote or read it (proclaim's condition).
    value_rev: i64,
}

impl Hold {
    fn state(&self) -> std::sync::MutexGuard<'_, HoldState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.state().ended
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// Ends the hold because its key is gone (deleted by anyone, or re-created with another
    /// revision): every guard on it turns false and its `lost()` fires. The turn is
    /// released; there is nothing left to delete.
    fn lose_key(&self) {
        let mut state = self.state();
        if state.ended {
            return;
        }
        state.ended = true;
        state.signal.fire();
        state.turn = None;
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

/// The guard side of a hold: what `MutexGuard` and `Leadership` are made of.
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
    fn new(hold: Arc<Hold>) -> Held {
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

    pub(crate) fn line(&self) -> &Arc<Line> {
        &self.hold.line
    }

    pub(crate) fn key(&self) -> &[u8] {
        &self.hold.line.key
    }

    pub(crate) fn rev(&self) -> i64 {
        self.hold.rev
    }

    /// Whether this guard is the hold's live one and the hold has not ended.
    pub(crate) fn is_current(&self) -> bool {
        let state = self.hold.state();
        state.generation == self.generation && !state.ended
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

    /// Ends the hold and deletes our key by its create revision. Waits for etcd's answer
    /// at most `wait` (`None`: not at all); the removal goes on in the background until
    /// etcd answers, keeping the turn until then.
    pub(crate) fn release(&mut self, wait: Option<Duration>) -> Result<Released> {
        if let Some(pending) = self.pending.take() {
            return self.await_release(pending, wait);
        }
        let turn = {
            let mut state = self.hold.state();
            if state.generation != self.generation || state.ended {
                return Ok(Released::NotCurrent);
            }
            state.ended = true;
            state.signal.fire();
            state.turn.take()
        };
        tracing::debug!(key = %String::from_utf8_lossy(self.key()), fencing_token = self.rev(), "releasing");
        let line = self.hold.line.clone();
        let owned = Owned::Revision(self.hold.rev);
        let Some(limit) = wait else {
            // Not waiting at all: the whole release runs in the background.
            drop(spawn_removal(&line.session, line.key.clone(), owned, turn));
            return Ok(Released::NotCurrent);
        };
        // The first attempt runs on the caller's thread (no hand-over to the runtime on
        // the fast path); only an unanswered one moves to the background, turn in hand.
        let rpc = line.session.client().rpc().clone();
        let started = Instant::now();
        let first = line.session.client().block_on(async {
            tokio::time::timeout(limit, queue::remove(&rpc, &line.key, owned)).await
        })?;
        match first {
            Ok(Ok(true)) => Ok(Released::Deleted),
            Ok(Ok(false)) => Ok(Released::NotOurs),
            Ok(Err(e)) if !e.is_transient() => Err(e),
            _ => {
                let pending = spawn_removal(&line.session, line.key.clone(), owned, turn);
                // What is left of the caller's bound.
                self.await_release(pending, Some(limit.saturating_sub(started.elapsed())))
            }
        }
    }

    fn await_release(
        &mut self,
        mut pending: tokio::sync::oneshot::Receiver<Result<bool>>,
        wait: Option<Duration>,
    ) -> Result<Released> {
        let Some(limit) = wait else {
            return Ok(Released::NotCurrent);
        };
        let client = self.hold.line.session.client();
        let outcome = client.block_on(async { tokio::time::timeout(limit, &mut pending).await })?;
        match outcome {
            Ok(Ok(Ok(true))) => Ok(Released::Deleted),
            Ok(Ok(Ok(false))) => Ok(Released::NotOurs),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => {
                self.pending = Some(pending);
                Err(Error::Timeout {
                    operation: "release (still retried in the background)",
                    after: limit,
                })
            }
        }
    }

    /// The bound for a release from `Drop`: none inside an async runtime or once the lease
    /// is gone (etcd deletes the key with it and may be unreachable), else one request
    /// timeout.
    fn drop_wait(&self) -> Option<Duration> {
        let session = &self.hold.line.session;
        if crate::runtime::inside_async() || !session.is_alive() {
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
        proclaim(&self.hold, value)
    }

    /// Supersedes this guard with a new one on the same hold (a re-campaign): this one
    /// reports the loss, the new one is live.
    pub(crate) fn supersede(hold: &Arc<Hold>) -> Option<Held> {
        {
            let mut state = hold.state();
            if state.ended {
                return None;
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
pub(crate) fn proclaim(hold: &Arc<Hold>, value: &[u8]) -> Result<bool> {
    let hold = hold.clone();
    let value = value.to_vec();
    let session = hold.line.session.clone();
    session.client().call(|rpc| async move {
        let _one_at_a_time = hold.proclaiming.lock().await;
        proclaim_once(&rpc, &hold, &value).await
    })
}

/// The proclaim Txn with the exactly-once condition; on a failed condition, one read tells
/// "an earlier attempt of ours applied" from "not ours any more".
async fn proclaim_once(rpc: &Rpc, hold: &Hold, value: &[u8]) -> Result<bool> {
    let key = &hold.line.key;
    let lease = hold.line.session.lease_id();
    let value_rev = hold.state().value_rev;
    let done = |revision: i64| {
        hold.state().value_rev = revision;
        Ok(true)
    };
    match queue::put_if_unchanged(rpc, key, hold.rev, value_rev, value, lease).await {
        Ok(Some(revision)) => return done(revision),
        Ok(None) => {}
        Err(e) if e.is_transient() => {} // it may have applied: the read below tells
        Err(e) => return Err(e),
    }
    match queue::read_key(rpc, key).await? {
        Some(kv) if kv.create_revision == hold.rev && kv.value == value => done(kv.mod_revision),
        Some(kv) if kv.create_revision == hold.rev => {
            // Ours, with a value we did not write last: someone wrote it behind our back.
            // Take the newer revision as the base and try once more.
            match queue::put_if_unchanged(rpc, key, hold.rev, kv.mod_revision, value, lease).await?
            {
                Some(revision) => done(revision),
                None => Ok(false),
            }
        }
        _ => {
            hold.lose_key();
            Ok(false)
        }
    }
}

/// Takes the line's turn, ending early on session loss or the deadline.
async fn take_turn(
    line: &Line,
    session: &LeaseState,
    wait: Wait,
    operation: &'static str,
) -> std::result::Result<OwnedMutexGuard<()>, TryLockError> {
    let turn = line.turn.clone();
    match wait {
        Wait::Never => turn.try_lock_owned().map_err(|_| TryLockError::WouldBlock),
        Wait::Forever => tokio::select! {
            turn = turn.lock_owned() => Ok(turn),
            reason = session.wait_lost() => Err(Error::SessionLost(reason).into()),
        },
        Wait::Until(deadline, after) => tokio::select! {
            turn = turn.lock_owned() => Ok(turn),
            reason = session.wait_lost() => Err(Error::SessionLost(reason).into()),
            _ = tokio::time::sleep_until(deadline.into()) => {
                Err(Error::Timeout { operation, after }.into())
            }
        },
    }
}

/// Runs `fut` under the wait's deadline, if it has one.
async fn within<T>(
    wait: Wait,
    operation: &'static str,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    match wait {
        Wait::Until(deadline, after) => tokio::time::timeout_at(deadline.into(), fut)
            .await
            .unwrap_or(Err(Error::Timeout { operation, after })),
        Wait::Forever | Wait::Never => fut.await,
    }
}

/// Acquires `line` for `kind`, storing `value` under the key: the one path every recipe
/// uses. On every error our key is removed (or its removal is running, turn in hand).
pub(crate) fn acquire(
    line: &Arc<Line>,
    kind: Kind,
    value: &[u8],
    wait: Wait,
) -> std::result::Result<Held, TryLockError> {
    crate::runtime::ensure_blocking_allowed()?;
    let session = line.session.lease().clone();
    session.check()?;
    if let Some(hold) = line.live_hold()
        && hold.state().thread == std::thread::current().id()
    {
        // Waiting for a turn this thread owns would never end.
        return Err(match wait {
            Wait::Never => TryLockError::WouldBlock,
            _ => Error::WouldDeadlock(String::from_utf8_lossy(&line.name).into_owned()).into(),
        });
    }
    let client = line.session.client().clone();
    let rpc = client.rpc().clone();
    let lease = line.session.lease_id();
    let (enqueued, turn, alive_at) = client.block_on(async {
        let turn = take_turn(line, &session, wait, kind.operation()).await?;
        // 1. Join the line in etcd.
        let enqueued =
            match within(wait, kind.operation(), join(&rpc, line, kind, value, lease)).await {
                Ok(enqueued) => enqueued,
                Err(e) => {
                    // The Txn may have applied (or apply later): remove by lease, turn in hand.
                    clean_up_ambiguous(line, turn);
                    return Err(e.into());
                }
            };
        // 2. Wait for our turn in etcd, unless asked not to.
        let waited = match (wait, &enqueued.position) {
            (_, Position::Owner) => Ok(enqueued.seen_at),
            (Wait::Never, _) => Err(TryLockError::WouldBlock),
            (_, _) => within(
                wait,
                kind.operation(),
                queue::wait_turn(
                    &rpc,
                    &session,
                    &line.prefix,
                    &line.key,
                    enqueued.rev,
                    enqueued.position.clone(),
                    enqueued.seen_at,
                ),
            )
            .await
            .map_err(TryLockError::from),
        };
        match waited {
            Ok(seen_at) => Ok((enqueued, turn, seen_at)),
            Err(e) => {
                // Known revision: this deletes nothing but the key this attempt created.
                let pending = spawn_removal(
                    &line.session,
                    line.key.clone(),
                    Owned::Revision(enqueued.rev),
                    Some(turn),
                );
                // Bounded: the caller gets its error within one request timeout.
                let _ = tokio::time::timeout(rpc.request_timeout(), pending).await;
                Err(e)
            }
        }
    })??;
    let hold = Arc::new(Hold {
        line: line.clone(),
        rev: enqueued.rev,
        kind,
        state: StdMutex::new(HoldState {
            generation: 0,
            thread: std::thread::current().id(),
            signal: Arc::new(Signal::new()),
            turn: Some(turn),
            ended: false,
            value_rev: enqueued.value_rev,
        }),
        proclaiming: tokio::sync::Mutex::new(()),
    });
    *line.current.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&hold);
    client.follower().follow(Follow::Guard {
        key: line.key.clone(),
        rev: enqueued.rev,
        alive_at,
        hold: Arc::downgrade(&hold) as Weak<dyn Followed>,
    });
    tracing::debug!(
        key = %String::from_utf8_lossy(&line.key),
        fencing_token = enqueued.rev,
        ?kind,
        existed = enqueued.existed,
        proof_revision = alive_at,
        "acquired"
    );
    Ok(Held::new(hold))
}

/// Joins the line: one Txn, plus what to do with a key this session already has.
async fn join(
    rpc: &Rpc,
    line: &Arc<Line>,
    kind: Kind,
    value: &[u8],
    lease: i64,
) -> Result<queue::Enqueued> {
    let enqueued = enqueue_once_or_sweep(rpc, line, value, lease).await?;
    if !enqueued.existed {
        return Ok(enqueued);
    }
    // We own the turn, so no guard of this process uses the key: it came with a resumed
    // lease, or from a release or cleanup that never reached etcd.
    match kind {
        Kind::Lock => {
            // A fresh create revision for every acquisition: fencing tokens strictly grow.
            queue::remove(rpc, &line.key, Owned::Revision(enqueued.rev)).await?;
            enqueue_once_or_sweep(rpc, line, value, lease).await
        }
        Kind::Lead if enqueued.value == value => Ok(enqueued),
        Kind::Lead => {
            // Go's re-campaign: keep the place, proclaim the new value.
            match queue::put_if_unchanged(
                rpc,
                &line.key,
                enqueued.rev,
                enqueued.value_rev,
                value,
                lease,
            )
            .await?
            {
                Some(value_rev) => Ok(queue::Enqueued {
                    value_rev,
                    value: value.to_vec(),
                    ..enqueued
                }),
                None => Err(Error::NotLeader),
            }
        }
    }
}

/// The enqueue Txn, retried on the next endpoints after a transient failure. A failed
/// attempt may still be applied later by the member that had it (etcd has no idempotency
/// keys), re-creating our key after it is gone: if any attempt was ambiguous, the line is
/// swept for that from the successful answer on.
async fn enqueue_once_or_sweep(
    rpc: &Rpc,
    line: &Arc<Line>,
    value: &[u8],
    lease: i64,
) -> Result<queue::Enqueued> {
    let mut ambiguous = false;
    let mut attempts = rpc.endpoints().len();
    loop {
        attempts -= 1;
        match queue::enqueue(rpc, &line.prefix, &line.key, value, lease).await {
            Err(e) if e.is_transient() && attempts > 0 => ambiguous = true,
            Ok(enqueued) => {
                if ambiguous {
                    sweep(line, enqueued.rev + 1);
                }
                return Ok(enqueued);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Has the client's follow task sweep `line` from revision `from` (see `follow.rs`).
fn sweep(line: &Line, from: i64) {
    line.session.client().follower().follow(Follow::Sweep {
        key: line.key.clone(),
        from,
        turn: line.turn.clone(),
        session: line.session.lease().clone(),
    });
}

/// Deletes `key` in a task that owns `turn` until etcd answered; the receiver gets the
/// first answer. Transient failures are retried until answered or the session is lost
/// (the lease then takes the key with it).
fn spawn_removal(
    session: &Session,
    key: Vec<u8>,
    owned: Owned,
    turn: Option<OwnedMutexGuard<()>>,
) -> tokio::sync::oneshot::Receiver<Result<bool>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let rpc = session.client().rpc().clone();
    let shared = session.lease().clone();
    session.client().spawn(async move {
        let answer = remove_until_answered(&rpc, &shared, &key, owned).await;
        let _ = tx.send(answer);
        drop(turn);
    });
    rx
}

/// [`queue::remove`] until etcd answers, the session is lost, or the client closes.
async fn remove_until_answered(
    rpc: &Rpc,
    session: &LeaseState,
    key: &[u8],
    owned: Owned,
) -> Result<bool> {
    let mut delay = Duration::from_millis(50);
    loop {
        match queue::remove(rpc, key, owned).await {
            Err(e) if e.is_transient() => {
                if let Some(reason) = session.loss_reason() {
                    return Err(Error::SessionLost(reason));
                }
                tracing::debug!(error = %e, "removal not answered; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            answered => return answered,
        }
    }
}

/// After an ambiguous enqueue: remove whatever key of our lease exists under the name,
/// owning the turn, then have the client's follow task sweep the line for the same
/// attempt applied late by a member that held it (see `follow.rs`).
fn clean_up_ambiguous(line: &Arc<Line>, turn: OwnedMutexGuard<()>) {
    let rpc = line.session.client().rpc().clone();
    let session = line.session.lease().clone();
    let key = line.key.clone();
    let line = line.clone();
    line.session.client().clone().spawn(async move {
        let removed = loop {
            match queue::remove_at(&rpc, &key, Owned::Lease(session.id())).await {
                Err(e) if e.is_transient() && session.loss_reason().is_none() => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other,
            }
        };
        drop(turn);
        if let Ok((_, revision)) = removed {
            sweep(&line, revision + 1);
        }
    });
}
