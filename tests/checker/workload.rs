//! The children's workload: random acquisitions of every primitive, guarded writes while
//! holding, and releases, each logged for the checks (`analysis.rs`, `liveness.rs`).
//!
//! Log lines (times on CLOCK_MONOTONIC, in ns, shared by every process):
//!
//! * `BEG <id> <name> <start>` and `END <id> <end> <outcome>` around every attempt;
//! * `CS <name> <mode> <token> <holder> <enter> <confirmed> <accepted> <rejected>
//!   <first_rev> <last_rev> <key> <held_until> <lost_at> <released_at> <how>` per guard;
//! * `WAIT`, `ERR`, `NOTE`, `STALE` as before (timed waits, errors, stale writes).

use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use etcd_sync::{
    Client, Error, Leadership, MutexGuard, Permit, RwLockReadGuard, RwLockWriteGuard, Session,
    TryLockError, Txn, TxnOp,
};

use super::common::monotonic_ns;
use super::{Log, NAMES, PERMITS, RW_NAME, Rng, SEM_NAME, TTL, linearizable, log, revoke};

const ZERO: Duration = Duration::ZERO;

/// The session this thread works with: the slot's, or a new one if it is lost.
pub(crate) fn current_session(
    client: &Client,
    slot: &StdMutex<Option<Session>>,
) -> Option<Session> {
    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = slot.as_ref().filter(|s| s.is_alive()) {
        return Some(s.clone());
    }
    let fresh = client.session_builder().ttl(TTL).start().ok()?;
    *slot = Some(fresh.clone());
    Some(fresh)
}

/// A held guard of any kind.
pub(crate) enum Guard {
    Lock(MutexGuard),
    Lead(Leadership),
    Read(RwLockReadGuard),
    Write(RwLockWriteGuard),
    Permit(Permit),
}

/// The same call on whichever guard it is.
macro_rules! each {
    ($guard:expr, $g:ident => $call:expr) => {
        match $guard {
            Guard::Lock($g) => $call,
            Guard::Lead($g) => $call,
            Guard::Read($g) => $call,
            Guard::Write($g) => $call,
            Guard::Permit($g) => $call,
        }
    };
}

impl Guard {
    pub(crate) fn token(&self) -> i64 {
        each!(self, g => g.fencing_token())
    }
    /// The key's create revision: the token, except for a leadership handed over to us
    /// (the old leader's key; the outside judge's hold).
    pub(crate) fn rev(&self) -> i64 {
        each!(self, g => g.create_revision())
    }
    pub(crate) fn is_held(&self) -> bool {
        match self {
            Guard::Lead(l) => l.is_leader(),
            Guard::Lock(g) => g.is_held(),
            Guard::Read(g) => g.is_held(),
            Guard::Write(g) => g.is_held(),
            Guard::Permit(p) => p.is_held(),
        }
    }
    fn put(&self, key: &str, value: String) -> etcd_sync::Result<i64> {
        each!(self, g => g.put(key, value))
    }
    fn ownership_compare(&self) -> etcd_sync::Compare {
        each!(self, g => g.ownership_compare())
    }
    pub(crate) fn key(&self) -> String {
        each!(self, g => g.key_str().into_owned())
    }
    pub(crate) fn lost(&self) -> crossbeam_channel::Receiver<()> {
        each!(self, g => g.lost())
    }
    fn release_requested(&self) -> crossbeam_channel::Receiver<etcd_sync::ReleaseRequest> {
        each!(self, g => g.release_requested())
    }
    /// How the guard shares its name, for the log: exclusive, shared, or a permit.
    pub(crate) fn mode(&self) -> String {
        match self {
            Guard::Read(_) => "s".into(),
            Guard::Permit(p) if p.num_permits() > 1 => format!("p{PERMITS}x{}", p.num_permits()),
            Guard::Permit(_) => format!("p{PERMITS}"),
            _ => "x".into(),
        }
    }
    /// Releases and reports what etcd said: the key deleted (`Some(true)`), found gone
    /// (`Some(false)`), or no answer (`None`: the release may still apply).
    fn release(self) -> Option<bool> {
        match self {
            Guard::Lock(g) => linearizable::seen(&g.release()),
            // `resign` answers Ok also when the key was already gone (as Go's `Resign`):
            // it never confirms that the key was ours until then (seed 6812124288175: an
            // operator deleted a leader's key 25 ms before it resigned; logged as a
            // confirmed release, which the outside judge rightly found impossible).
            Guard::Lead(mut l) if l.is_leader() => match linearizable::seen(&l.resign()) {
                Some(true) => None,
                other => other,
            },
            Guard::Lead(_) => None,
            Guard::Read(g) => linearizable::seen(&g.release()),
            Guard::Write(g) => linearizable::seen(&g.release()),
            Guard::Permit(p) => linearizable::seen(&p.release()),
        }
    }
}

/// One acquisition attempt of a random kind; logs a WAIT line for timed waits. Returns
/// its outcome for the `END` line (`ok`, `busy` for a `try_*` that found the name taken,
/// else the error's kind) and the guard.
fn acquire(
    session: &Session,
    name: &str,
    value: &str,
    rng: &mut Rng,
    log_file: &Log,
) -> (&'static str, Option<Guard>) {
    let started = Instant::now();
    let timeout = rng.millis(20, 600);
    let (timed, result) = match name {
        RW_NAME => read_or_write(session, rng, timeout),
        SEM_NAME => permit(session, rng, timeout),
        _ => lock_or_lead(session, name, value, rng, timeout),
    };
    // `None`: a `try_*` found the name busy, which is no error.
    let Some(result) = result else {
        return ("busy", None);
    };
    let took = started.elapsed();
    if timed {
        log(
            log_file,
            format!(
                "WAIT {} {} {}",
                timeout.as_millis(),
                took.as_millis(),
                // When it started (UNIX ms), to find it in the traces if it was slow.
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |now| now.saturating_sub(took).as_millis())
            ),
        );
    }
    match result {
        Ok(guard) => ("ok", Some(guard)),
        // A wait with a limit ends with a guard, its limit, or a failure that is still
        // true: a transport failure is tried again within the limit (issue 48, item 1).
        Err(e @ Error::Unavailable { .. }) if timed => {
            log(log_file, "ERR wait_unavailable".to_string());
            log(log_file, format!("NOTE {e}"));
            ("wait_unavailable", None)
        }
        Err(e) => {
            log(log_file, format!("ERR {}", error_kind(&e)));
            super::deadlocks::judge(session.client(), log_file, &e);
            if error_kind(&e) == "other" {
                log(log_file, format!("NOTE {e}")); // for diagnosis; not parsed
            }
            (error_kind(&e), None)
        }
    }
}

/// A `try_*` result as the others': `WouldBlock` is "no guard", not an error.
fn tried<G>(result: Result<G, TryLockError>) -> etcd_sync::Result<Option<G>> {
    match result {
        Ok(g) => Ok(Some(g)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// One attempt: whether its wait had a limit, and its outcome (`None`: a `try_*` found
/// the name busy).
type Attempt = (bool, Option<etcd_sync::Result<Guard>>);

/// A `try_*` attempt.
fn attempt<G>(result: Result<G, TryLockError>, wrap: fn(G) -> Guard) -> Attempt {
    (false, tried(result).map(|g| g.map(wrap)).transpose())
}

/// Read and write locks and a Mutex on [`RW_NAME`].
fn read_or_write(session: &Session, rng: &mut Rng, timeout: Duration) -> Attempt {
    let rw = match session.rwlock(RW_NAME) {
        Ok(rw) => rw,
        Err(e) => return (false, Some(Err(e))),
    };
    match rng.below(7) {
        0 | 1 => (false, Some(rw.read().map(Guard::Read))),
        2 => (true, Some(rw.read_timeout(timeout).map(Guard::Read))),
        3 => attempt(rw.try_read(), Guard::Read),
        // Half the plain writes may be downgraded to reads while held (`worker`).
        4 if rng.below(2) == 0 => (false, Some(rw.write_downgradable().map(Guard::Write))),
        4 => (false, Some(rw.write().map(Guard::Write))),
        5 => (true, Some(rw.write_timeout(timeout).map(Guard::Write))),
        _ => (
            false,
            Some(
                session
                    .mutex(RW_NAME)
                    .and_then(|m| m.lock())
                    .map(Guard::Lock),
            ),
        ),
    }
}

/// The semaphore of [`PERMITS`] on [`SEM_NAME`].
fn permit(session: &Session, rng: &mut Rng, timeout: Duration) -> Attempt {
    let sem = match session.semaphore(SEM_NAME, PERMITS) {
        Ok(sem) => sem,
        Err(e) => return (false, Some(Err(e))),
    };
    // A third of the attempts take both permits at once (`acquire_many`).
    let k = if rng.below(3) == 0 { PERMITS } else { 1 };
    match rng.below(3) {
        0 => (false, Some(sem.acquire_many(k).map(Guard::Permit))),
        1 => (
            true,
            Some(sem.acquire_many_timeout(k, timeout).map(Guard::Permit)),
        ),
        _ => attempt(sem.try_acquire_many(k), Guard::Permit),
    }
}

/// Mutex and Election on the other names; whether the wait had a limit.
fn lock_or_lead(
    session: &Session,
    name: &str,
    value: &str,
    rng: &mut Rng,
    timeout: Duration,
) -> Attempt {
    let op = rng.below(9);
    let result: etcd_sync::Result<Guard> = match op {
        7 => {
            // A wait cancelled from another thread at a random moment (often while waiting,
            // sometimes before it starts or after it got the lock).
            let token = etcd_sync::CancelToken::new();
            let (canceller, after) = (token.clone(), rng.millis(0, 400));
            std::thread::spawn(move || {
                std::thread::sleep(after);
                canceller.cancel();
            });
            let options = etcd_sync::WaitOptions::new()
                .timeout(timeout)
                .cancel_token(&token);
            session
                .mutex(name)
                .and_then(|m| m.lock_with(options))
                .map(Guard::Lock)
        }
        8 => session
            .mutex(name)
            .and_then(|m| m.lock_delay(rng.millis(0, 300)))
            .and_then(|m| m.lock_timeout(timeout))
            .map(Guard::Lock),
        // Half the plain waits with a lock-delay, so that deletes and lost holders find
        // delays in flight.
        0 => {
            let delay = if rng.below(2) == 0 {
                rng.millis(1, 300)
            } else {
                Duration::ZERO
            };
            session
                .mutex(name)
                .and_then(|m| m.lock_delay(delay))
                .and_then(|m| m.lock())
                .map(Guard::Lock)
        }
        1 => session
            .mutex(name)
            .and_then(|m| m.lock_timeout(timeout))
            .map(Guard::Lock),
        2 => match session.mutex(name).map(|m| tried(m.try_lock())) {
            Ok(Ok(Some(g))) => Ok(Guard::Lock(g)),
            Ok(Ok(None)) => return (false, None),
            Ok(Err(e)) | Err(e) => Err(e),
        },
        3 => {
            // A retry loop around a short timeout, as users write them.
            let m = match session.mutex(name) {
                Ok(m) => m,
                Err(e) => return (false, Some(Err(e))),
            };
            let mut result = Err(Error::Closed);
            for _ in 0..3 {
                result = m.lock_timeout(timeout).map(Guard::Lock);
                if !matches!(result, Err(Error::Timeout { .. })) {
                    break;
                }
            }
            result
        }
        4 => session
            .election(name)
            .and_then(|e| e.campaign(value))
            .map(Guard::Lead),
        5 => session
            .election(name)
            .and_then(|e| e.campaign_timeout(value, timeout))
            .map(Guard::Lead),
        _ => {
            let e = match session.election(name) {
                Ok(e) => e,
                Err(e) => return (false, Some(Err(e))),
            };
            let mut result = Err(Error::Closed);
            for _ in 0..3 {
                result = e.campaign_timeout(value, timeout).map(Guard::Lead);
                if !matches!(result, Err(Error::Timeout { .. })) {
                    break;
                }
            }
            result
        }
    };
    // Timed waits: the lock-delay counts against the limit too.
    (matches!(op, 1 | 5 | 7 | 8), Some(result))
}

pub(crate) fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Timeout { .. } => "timeout",
        Error::SessionLost(_) => "session_lost",
        Error::Unavailable { .. } => "unavailable",
        Error::LockLost | Error::NotLeader => "lost",
        Error::WouldDeadlock(_) => "would_deadlock",
        Error::Deadlock { .. } => "deadlock",
        Error::Cancelled => "cancelled",
        // The session handed a leadership of the name over: its key name is the
        // successor's until that ends (documented; campaign on another session).
        Error::InvalidArgument(m) if m.contains("handed over") => "name_handed_over",
        _ => "other",
    }
}

/// How long a guard is kept: mostly briefly, sometimes long enough (over a second) for an
/// operator's delete of its key to be reported while it is still held.
fn hold_time(rng: &mut Rng) -> Duration {
    if rng.below(8) == 0 {
        rng.millis(1_100, 1_800)
    } else {
        rng.millis(0, 60)
    }
}

/// What a guard's log line says about it while it was held.
struct Hold {
    enter: u64,
    confirmed: u64,
    accepted: u32,
    rejected: u32,
    first_rev: i64,
    last_rev: i64,
    lost_at: u64,
}

impl Hold {
    fn new() -> Hold {
        let enter = monotonic_ns();
        Hold {
            enter,
            confirmed: enter,
            accepted: 0,
            rejected: 0,
            first_rev: 0,
            last_rev: 0,
            lost_at: 0,
        }
    }

    /// The `CS` line of a guard whose hold ended (`how`: unlock, unlock_err, drop, recamp).
    fn line(&self, name: &str, held: &Held, who: &str, held_until: u64, how: &str) -> String {
        format!(
            "CS {name} {} {} {who} {} {} {} {} {} {} {} {held_until} {} {} {how} {}",
            held.mode,
            held.token,
            self.enter,
            self.confirmed,
            self.accepted,
            self.rejected,
            self.first_rev,
            self.last_rev,
            held.key,
            self.lost_at,
            monotonic_ns(),
            held.rev,
        )
    }
}

/// What identifies a guard in the log, kept past its release.
pub(crate) struct Held {
    mode: String,
    pub(crate) token: i64,
    /// The key's create revision (the token but for a leadership handed over to us).
    pub(crate) rev: i64,
    key: String,
}

impl Held {
    pub(crate) fn of(guard: &Guard) -> Held {
        Held {
            mode: guard.mode(),
            token: guard.token(),
            rev: guard.rev(),
            key: guard.key(),
        }
    }
}

/// Waits up to `wait` for the guard to be lost; records when it was seen lost (its
/// `lost()` channel fired or `is_held()` said no), else confirms it held.
fn watch(guard: &Guard, lost: &crossbeam_channel::Receiver<()>, hold: &mut Hold, wait: Duration) {
    if hold.lost_at != 0 {
        return;
    }
    if let Err(crossbeam_channel::RecvTimeoutError::Disconnected) = lost.recv_timeout(wait) {
        hold.lost_at = monotonic_ns();
        return;
    }
    let before = monotonic_ns();
    if guard.is_held() {
        hold.confirmed = before;
    } else {
        hold.lost_at = before;
    }
}

pub(crate) fn worker(
    client: &Client,
    slot: &StdMutex<Option<Session>>,
    log_file: &Log,
    who: &str,
    deadline_ns: u64,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let mut attempts = 0u64;
    // The last session this thread used, and how long it was known alive, to log its
    // lease's end once it is seen lost.
    let mut previous: Option<(Session, u64)> = None;
    while monotonic_ns() < deadline_ns {
        // One attempt in ten is a short-lived process's whole life: a session of its own,
        // closed right after the release, as a process that exits normally does. Waiters
        // with a lock-delay behind it see its lease end one round trip after a clean
        // delete (issue 48, item 4).
        let private = rng.below(10) == 0;
        let session = if private {
            client.session_builder().ttl(TTL).start().ok()
        } else {
            current_session(client, slot)
        };
        let mut seen_lost = None;
        if let Some((old, alive)) = previous.take_if(|(old, _)| !old.is_alive()) {
            linearizable::lease_ended(log_file, old.lease_id(), alive, false);
            seen_lost = Some((old.lease_id(), alive));
        }
        let Some(session) = session else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let lease = session.lease_id();
        // How long the lease is known alive: what this thread knew of it (also when the
        // slot hands back the session just seen lost: no new one could start), and its
        // deadline now. Never 0 for a lease once known alive: a lease's end logged as
        // "from 0 on" kept every window of the run open (seed 77584001365089).
        let mut alive = match (previous.take(), seen_lost) {
            (Some((old, alive)), _) if old.lease_id() == lease => alive,
            (_, Some((old, alive))) if old == lease => alive,
            _ => 0,
        }
        .max(linearizable::alive_until(&session));
        let name = NAMES[rng.below(NAMES.len() as u64) as usize];
        attempts += 1;
        let id = format!("{who}#{attempts}");
        let began = monotonic_ns();
        log(log_file, format!("BEG {id} {name} {began}"));
        let (outcome, guard) = acquire(&session, name, who, &mut rng, log_file);
        log(log_file, format!("END {id} {} {outcome}", monotonic_ns()));
        alive = alive.max(linearizable::alive_until(&session));
        let close = |session: Session, alive: u64| {
            // Ended by the close, or earlier (lost), after it was last known alive.
            let called = if session.is_alive() {
                monotonic_ns()
            } else {
                alive
            };
            let closed = session.close().is_ok();
            linearizable::lease_ended(log_file, lease, called, closed);
        };
        if !private {
            previous = Some((session.clone(), alive));
        }
        let Some(mut guard) = guard else {
            if private {
                close(session, alive);
            }
            continue;
        };
        linearizable::acquired(log_file, name, &guard, lease, began);
        let mut hold = Hold::new();
        let mut lost = guard.lost();
        let hold_for = hold_time(&mut rng);
        for _ in 0..1 + rng.below(3) {
            alive = alive.max(linearizable::alive_until(&session));
            let called = monotonic_ns();
            let put = guard.put(&format!("{name}-data"), format!("{}:{who}", guard.token()));
            let seen = linearizable::seen(&put);
            linearizable::observed(log_file, name, guard.rev(), called, seen);
            match put {
                Ok(revision) => {
                    hold.accepted += 1;
                    if hold.first_rev == 0 {
                        hold.first_rev = revision;
                    }
                    hold.last_rev = revision;
                }
                Err(_) => hold.rejected += 1,
            }
            if let Guard::Lead(l) = &guard
                && rng.below(3) == 0
            {
                let _ = l.proclaim(format!("{who}-{}", rng.below(100)));
            }
            // A re-campaign on the same session and name: the old guard is superseded
            // (its interval ends here), the new one carries the same token (same hold).
            let called = monotonic_ns();
            if let Guard::Lead(_) = &guard
                && rng.below(5) == 0
                && let Ok(again) = session.election(name).and_then(|e| e.campaign(who))
            {
                let line = hold.line(name, &Held::of(&guard), who, monotonic_ns(), "recamp");
                log(log_file, line);
                guard = Guard::Lead(again);
                linearizable::acquired(log_file, name, &guard, lease, called);
                lost = guard.lost();
                hold = Hold::new();
            }
            watch(&guard, &lost, &mut hold, rng.millis(0, 20));
            if hold.lost_at != 0 {
                break;
            }
        }
        // Half the downgradable writes go on as reads with no gap: the write's section
        // ends here and the read's begins (one token, one session: as a re-campaign).
        let downgrade = matches!(&guard, Guard::Write(w) if w.is_downgradable())
            && hold.lost_at == 0
            && rng.below(2) == 0;
        if downgrade {
            let held = Held::of(&guard);
            let Guard::Write(write) = guard else {
                unreachable!("matched above")
            };
            let held_until = monotonic_ns();
            match write.downgrade() {
                Ok(read) => {
                    linearizable::downgraded(log_file, name, held.rev, held_until);
                    log(
                        log_file,
                        hold.line(name, &held, who, held_until, "downgrade"),
                    );
                    guard = Guard::Read(read);
                    lost = guard.lost();
                    hold = Hold::new();
                    watch(&guard, &lost, &mut hold, ZERO);
                }
                Err(e) => {
                    log(log_file, format!("ERR {}", error_kind(e.error())));
                    let Some(write) = e.into_guard() else {
                        // The write is over; its keys go in the background.
                        log(
                            log_file,
                            hold.line(name, &held, who, held_until, "unlock_err"),
                        );
                        linearizable::released(log_file, name, held.rev, held_until, None);
                        if private {
                            close(session, alive);
                        }
                        continue;
                    };
                    guard = Guard::Write(write);
                }
            }
        }
        // Keep it (watching for its loss) for the rest of its hold time; half the holds
        // listen for release requests and let go when asked (`revoke.rs`).
        let requests = (rng.below(2) == 0).then(|| guard.release_requested());
        let until = Instant::now() + hold_for;
        while hold.lost_at == 0 && Instant::now() < until {
            let left = until.saturating_duration_since(Instant::now());
            watch(
                &guard,
                &lost,
                &mut hold,
                left.min(Duration::from_millis(20)),
            );
            let asked = |r| revoke::heard(log_file, name, (&guard.key(), guard.rev()), r, ZERO);
            if requests.as_ref().is_some_and(asked) {
                break;
            }
        }
        let held_until = monotonic_ns();
        // A leadership's condition compares its lease too: a hand-over keeps the key and
        // its create revision on the successor's lease.
        let mut ownership = vec![guard.ownership_compare()];
        if let Guard::Lead(l) = &guard {
            ownership.push(l.lease_compare());
        }
        // Release; only a release etcd confirmed makes the old condition stale (a drop, or
        // a release that timed out, may still be finishing in the background, and a
        // superseded guard's hold lives on in its successor).
        let held = Held::of(&guard);
        alive = alive.max(linearizable::alive_until(&session));
        if !private {
            previous = Some((session.clone(), alive));
        }
        let called = monotonic_ns();
        let handed = match &guard {
            Guard::Lead(l) if rng.below(2) == 0 => {
                super::handover::hand_over_next(&session, name, l, log_file, &mut rng)
            }
            _ => false,
        };
        let (how, confirmed_release) = if handed {
            drop(guard); // deletes nothing: the key is the successor's
            ("handover", true)
        } else if rng.below(3) == 0 {
            let released = guard.release();
            linearizable::released(log_file, name, held.rev, called, released);
            let confirmed = released == Some(true);
            (if confirmed { "unlock" } else { "unlock_err" }, confirmed)
        } else {
            drop(guard);
            linearizable::released(log_file, name, held.rev, called, None);
            ("drop", false)
        };
        // Written after the release, with the release's end time.
        log(log_file, hold.line(name, &held, who, held_until, how));
        if private {
            close(session, alive);
        }
        let called = monotonic_ns();
        if confirmed_release
            && let Ok(r) = client.txn(
                Txn::new()
                    .when(ownership)
                    .and_then([TxnOp::put(format!("{name}-stale"), "x")]),
            )
        {
            if !handed {
                // (Handed over, the hold goes on: the judge's model knows no lease compare.)
                linearizable::observed(log_file, name, held.rev, called, Some(r.succeeded));
            }
            log(
                log_file,
                format!("STALE {} {}", held.token, u8::from(r.succeeded)),
            );
        }
    }
}
