//! A distributed mutex with an RAII guard: `std::sync::Mutex`'s distributed sibling, on
//! etcd's lock recipe (and wire format).

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::error::{Error, Result, TryLockError};
use crate::kv::text;
use crate::kv::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};
use crate::mode::Mode;
use crate::ownership::{self, Held, Kind, Line, Released, Wait};
use crate::session::Session;

/// A distributed lock named by a string, held through a [`Session`].
///
/// The lock key is `<name>/<session lease id in lowercase hex>` and acquisition uses the
/// transaction of etcd's Go `concurrency.Mutex`, so this lock, `etcdctl lock <name>` and
/// etcd's server-side Lock service exclude each other. Waiters are served first come,
/// first served (by the key's create revision); a waiter owns when every key ahead of it
/// is reported deleted, with no read after the release it waited for.
///
/// `Mutex` is `Send + Sync` and cheap to clone. Any number of threads may share one
/// session and one name: they take turns (a process-local queue sits in front of the
/// etcd key), unlike Go's Mutex, where two Mutex values of one session both "hold" the
/// same key.
///
/// Names are any non-empty byte string up to 4096 bytes. `"a"` and `"ab"` do not
/// interfere (keys are `a/…` and `ab/…`).
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let session = client.session()?;
/// let mutex = session.mutex("shard-7")?;
/// {
///     let guard = mutex.lock()?;
///     // Writes that must only happen while we hold the lock:
///     guard.put("shard-7/owner", "host-a")?; // fails with Error::LockLost if we lost it
/// } // released here
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Mutex {
    line: Arc<Line>,
}

impl Session {
    /// A mutex named `name` on this session. No request is sent until you lock it.
    ///
    /// **The name is a key prefix, and every key under `<name>/` counts as a holder**
    /// (as with Go's Mutex and `etcdctl lock`): while `jobs/nightly` is locked, or while a
    /// data key such as `jobs/nightly-progress` exists, a wait on `jobs` does not end. Keep
    /// lock names and data apart and do not nest lock names; a wait blocked by a key that is
    /// not a lock key logs a `tracing` warning naming it. `a` and `ab` never interfere.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `name` is empty or
    /// longer than 4096 bytes.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let mutex = session.mutex("jobs/nightly-report")?;
    /// assert!(session.mutex("").is_err()); // InvalidArgument
    /// # let _ = mutex;
    /// # Ok(()) }
    /// ```
    pub fn mutex(&self, name: impl AsRef<[u8]>) -> Result<Mutex> {
        Ok(Mutex {
            line: Line::of(self, name.as_ref(), Mode::Exclusive)?,
        })
    }
}

impl Mutex {
    /// The lock's name.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert_eq!(session.mutex("x")?.name(), b"x");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &[u8] {
        self.line.name()
    }

    /// The session this mutex locks with.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let mutex = session.mutex("x")?;
    /// assert_eq!(mutex.session().lease_id(), session.lease_id());
    /// # Ok(()) }
    /// ```
    pub fn session(&self) -> &Session {
        self.line.session()
    }

    /// Blocks until the lock is held.
    ///
    /// Returns [`Error::SessionLost`] as soon as the session is lost while waiting (never a
    /// guard without the lock), [`Error::LockLost`] if our queued key is deleted by someone
    /// else. On every error our key is removed.
    ///
    /// Like `std::sync::Mutex`, the lock is not re-entrant. Threads of one session take
    /// turns; the thread that acquired a guard gets [`Error::WouldDeadlock`] (and
    /// `try_lock` gets `WouldBlock`) instead of waiting on itself. (Detection follows the
    /// acquiring thread: a guard sent to another thread is not tracked there.) A [`Mutex`] and an
    /// [`Election`](crate::Election) of the same name on one session share one etcd key,
    /// so they take turns too.
    ///
    /// # Errors
    ///
    /// * [`Error::SessionLost`]: the session was lost before the call or while waiting
    ///   (at once, not at the end of the wait), or etcd answered the enqueue with
    ///   `requested lease not found` (the lease was revoked elsewhere before the
    ///   keep-alive noticed: the session is marked lost with
    ///   [`LossReason::Revoked`](crate::LossReason::Revoked)); no key is left behind.
    /// * [`Error::LockLost`]: our queued key was deleted by someone else while we waited.
    /// * [`Error::WouldDeadlock`]: this thread holds a guard of this name on this session
    ///   (a [`MutexGuard`], or a [`Leadership`](crate::Leadership) of the same name).
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd could not be reached (each
    ///   request is tried on every endpoint first); our key is removed in the background.
    /// * [`Error::Server`]: etcd refused a request (e.g. `PermissionDenied`).
    ///   [`Error::Authentication`]: re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let mutex = session.mutex("db-migration")?;
    /// let guard = mutex.lock()?;
    /// println!("holding {} with token {}", guard.key_str(), guard.fencing_token());
    /// # Ok(()) }
    /// ```
    pub fn lock(&self) -> Result<MutexGuard> {
        self.acquire(Wait::Forever).map_err(|e| match e {
            TryLockError::Error(e) => e,
            TryLockError::WouldBlock => Error::LockLost,
        })
    }

    /// Like [`lock`](Mutex::lock), but gives up with [`Error::Timeout`] after `timeout`,
    /// leaving no key behind.
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] with `operation: "lock"` and `after: timeout`
    ///   ([`is_wait_timeout`](Error::is_wait_timeout)): the lock was not ours in time
    ///   (someone else holds it, or etcd was too slow); no key is left behind. A request
    ///   that timed out on the way is a `Timeout` too, with `operation: "etcd request"`
    ///   and the endpoint that did not answer.
    /// * Otherwise as [`lock`](Mutex::lock): [`Error::SessionLost`], [`Error::LockLost`],
    ///   [`Error::WouldDeadlock`], [`Error::Unavailable`], [`Error::Server`],
    ///   [`Error::Authentication`], [`Error::InsideAsyncRuntime`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.mutex("db-migration")?.lock_timeout(Duration::from_secs(5)) {
    ///     Ok(_guard) => println!("migrating"),
    ///     Err(e) if e.is_wait_timeout() => println!("someone else is migrating"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        self.acquire(Wait::from_timeout(timeout))
            .map_err(|e| match e {
                TryLockError::Error(e) => e,
                TryLockError::WouldBlock => Error::LockLost,
            })
    }

    /// Takes the lock only if it is free now. One transaction when free; when held, one
    /// more request removes our queued key, so nothing is left behind.
    ///
    /// # Errors
    ///
    /// * [`TryLockError::WouldBlock`]: someone holds the lock, or another thread of this
    ///   session holds or waits for it, or this very thread holds it (no
    ///   [`Error::WouldDeadlock`] here: nothing would wait).
    /// * [`TryLockError::Error`] with [`Error::SessionLost`] (the session is gone),
    ///   [`Error::Timeout`] / [`Error::Unavailable`] (etcd unreachable), [`Error::Server`],
    ///   [`Error::Authentication`] or [`Error::InsideAsyncRuntime`], as for
    ///   [`lock`](Mutex::lock).
    ///
    /// ```no_run
    /// use etcd_sync::TryLockError;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.mutex("cron/cleanup")?.try_lock() {
    ///     Ok(_guard) => println!("running cleanup"),
    ///     Err(TryLockError::WouldBlock) => println!("another instance runs it"),
    ///     Err(TryLockError::Error(e)) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_lock(&self) -> std::result::Result<MutexGuard, TryLockError> {
        self.acquire(Wait::Never)
    }

    fn acquire(&self, wait: Wait) -> std::result::Result<MutexGuard, TryLockError> {
        let span = tracing::debug_span!("lock", key = %text(self.line.key()));
        let _entered = span.enter();
        let held = ownership::acquire(&self.line, Kind::Lock, b"", wait)?;
        tracing::debug!(fencing_token = held.rev(), "lock acquired");
        Ok(MutexGuard { held })
    }
}

/// Proof that the lock is held; releases it on `Drop`.
///
/// Release deletes the lock key only if it still has our create revision, so a late or
/// repeated release can never delete a newer holder's key. `Drop` never blocks longer than
/// the client's request timeout, and inside an async runtime it hands the release to the
/// client's own runtime instead of blocking. Use [`unlock`](MutexGuard::unlock) to see the
/// outcome.
///
/// A lock held through a lease can be lost (session expiry, network partition): watch
/// [`lost`](MutexGuard::lost), and make writes conditional on still holding the lock with
/// [`put`](MutexGuard::put), [`delete`](MutexGuard::delete), [`txn`](MutexGuard::txn), or
/// stamp them elsewhere with the [`fencing_token`](MutexGuard::fencing_token).
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let guard = session.mutex("leader-only-job")?.lock()?;
/// crossbeam_channel::select! {
///     recv(guard.lost()) -> _ => eprintln!("lock lost: stop now"),
///     default(std::time::Duration::from_secs(1)) => println!("did a second of work"),
/// }
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct MutexGuard {
    held: Held,
}

impl std::fmt::Debug for MutexGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MutexGuard")
            .field("key", &self.key_str())
            .field("fencing_token", &self.held.rev())
            .finish()
    }
}

impl MutexGuard {
    /// The lock key in etcd: `<name>/<lease id in hex>`.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// assert!(guard.key().starts_with(b"m/"));
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &[u8] {
        self.held.key()
    }

    /// The lock key as text.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// println!("{}", session.mutex("m")?.lock()?.key_str());
    /// # Ok(()) }
    /// ```
    pub fn key_str(&self) -> std::borrow::Cow<'_, str> {
        text(self.key())
    }

    /// The fencing token: our key's create revision. Strictly increasing across
    /// successive holders of one name; hand it to storage that rejects lower tokens.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let mutex = session.mutex("m")?;
    /// let first = mutex.lock()?.fencing_token();
    /// let second = mutex.lock()?.fencing_token();
    /// assert!(second > first);
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> i64 {
        self.held.rev()
    }

    /// Whether the lock is still held as far as this process knows: not released, the
    /// session's lease deadline has not passed, and our key has not been seen deleted. No
    /// request is sent; use a guarded write to have etcd confirm.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// assert!(guard.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// A channel that becomes ready (disconnected) when the lock may be lost or is given
    /// up: the session's lease deadline passed or the session ended, our key was seen
    /// deleted, or the guard was released. Nothing is ever sent on it.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// let lost = guard.lost();
    /// std::thread::spawn(move || { let _ = lost.recv(); eprintln!("lost the lock"); });
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> Receiver<()> {
        self.held.lost()
    }

    /// The condition "we still hold this lock" (our key still has our create revision),
    /// to add to your own transactions: Go's `Mutex.IsOwner()`.
    ///
    /// ```no_run
    /// use etcd_sync::{Txn, TxnOp};
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// let r = session.client().txn(
    ///     Txn::new().when([guard.ownership_compare()]).and_then([TxnOp::put("k", "v")]),
    /// )?;
    /// assert!(r.succeeded);
    /// # Ok(()) }
    /// ```
    pub fn ownership_compare(&self) -> Compare {
        Compare::create_revision(self.key().to_vec(), CompareOp::Equal, self.held.rev())
    }

    /// Puts `key = value` only while we hold the lock; [`Error::LockLost`] otherwise. Returns the
    /// store revision of the write, as [`Client::put`](crate::Client::put) does (use
    /// [`txn`](Self::txn) for the whole response).
    ///
    /// # Errors
    ///
    /// * [`Error::LockLost`]: our key no longer has our create revision (deleted by
    ///   someone else, or gone with the session's lease); nothing was written.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer. Not retried: the
    ///   write may or may not have been applied.
    /// * [`Error::SessionLost`]: the session is known lost (etcd said so, or no keep-alive
    ///   was acknowledged before the lease deadline); nothing was sent.
    /// * [`Error::InvalidArgument`]: `key` is empty; nothing was sent.
    /// * [`Error::Server`]: etcd refused the transaction (e.g. `PermissionDenied`, or
    ///   `InvalidArgument` for a value above its size limit);
    ///   [`Error::Authentication`]: re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// guard.put("state", "written by the holder")?;
    /// # Ok(()) }
    /// ```
    pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<i64> {
        let key = crate::client::non_empty_key(key.as_ref())?;
        // The revision of the write, as `Client::put` returns it.
        Ok(self
            .txn(Txn::new().and_then([TxnOp::put(key, value.as_ref())]))?
            .revision)
    }

    /// Deletes `key` only while we hold the lock; [`Error::LockLost`] otherwise. Returns the number
    /// of keys deleted (0 or 1), as [`Client::delete`](crate::Client::delete) does.
    ///
    /// # Errors
    ///
    /// * [`Error::LockLost`]: our key no longer has our create revision (deleted by
    ///   someone else, or gone with the session's lease); nothing was written.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer. Not retried: the
    ///   write may or may not have been applied.
    /// * [`Error::SessionLost`]: the session is known lost (etcd said so, or no keep-alive
    ///   was acknowledged before the lease deadline); nothing was sent.
    /// * [`Error::InvalidArgument`]: `key` is empty; nothing was sent.
    /// * [`Error::Server`]: etcd refused the transaction (e.g. `PermissionDenied`);
    ///   [`Error::Authentication`]: re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// guard.delete("state")?;
    /// # Ok(()) }
    /// ```
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<i64> {
        let key = crate::client::non_empty_key(key.as_ref())?;
        let response = self.txn(Txn::new().and_then([TxnOp::delete(key)]))?;
        // The number of keys deleted, as `Client::delete` returns it.
        Ok(match response.responses.first() {
            Some(TxnOpResponse::Delete { deleted }) => *deleted,
            _ => 0,
        })
    }

    /// Runs `txn` only while we hold the lock, atomically with that check; returns `txn`'s
    /// own response, or [`Error::LockLost`]. A failed comparison of `txn` itself is not an
    /// error: `Ok` with `succeeded == false`.
    ///
    /// # Errors
    ///
    /// * [`Error::LockLost`]: our key no longer has our create revision (deleted by
    ///   someone else, or gone with the session's lease); nothing was written.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer. Not retried: the
    ///   write may or may not have been applied.
    /// * [`Error::SessionLost`]: the session is known lost (etcd said so, or no keep-alive
    ///   was acknowledged before the lease deadline); nothing was sent.
    /// * [`Error::Server`]: etcd refused the transaction (e.g. `PermissionDenied`, or
    ///   `InvalidArgument` for a malformed `txn`); [`Error::Authentication`]:
    ///   re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// use etcd_sync::{Compare, CompareOp, Txn, TxnOp};
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// let r = guard.txn(
    ///     Txn::new()
    ///         .when([Compare::version("job", CompareOp::Equal, 0)])
    ///         .and_then([TxnOp::put("job", "started")]),
    /// )?;
    /// println!("started: {}", r.succeeded);
    /// # Ok(()) }
    /// ```
    pub fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.held.guarded_txn(txn)?.ok_or(Error::LockLost)
    }

    /// Releases the lock and reports the outcome: [`Error::LockLost`] if it was no longer
    /// ours (nothing was deleted then), or the request's error. Returns within about one
    /// request timeout; if etcd has not answered by then, the release goes on in the
    /// background (the next holder of this session and name waits for it) and this
    /// returns [`Error::Timeout`].
    ///
    /// It takes the guard by value, like `parking_lot`'s `MutexGuard::unlock`: after it
    /// the lock is not ours whatever the outcome, and a later [`Mutex::lock`] of this
    /// session waits for a release still running. [`Leadership::resign`](crate::Leadership::resign)
    /// takes `&mut self` instead, because a leader usually wants to *confirm* that it has
    /// stepped down (Go's `Election.Resign` can be called again).
    ///
    /// # Errors
    ///
    /// * [`Error::LockLost`]: the lock was no longer ours: our key was seen deleted, or it
    ///   no longer had our create revision (deleted by someone else, or gone with the
    ///   session's revoked or closed lease). Nothing was deleted.
    /// * [`Error::Timeout`] with `operation: "release (still retried in the background)"`:
    ///   etcd did not answer within the request timeout; the release goes on.
    /// * [`Error::SessionLost`]: the session is lost and etcd could not be reached; the
    ///   key goes with the lease.
    /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused the delete.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread (the guard is
    ///   dropped, and its `Drop` releases in the background).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// guard.unlock()?;
    /// # Ok(()) }
    /// ```
    pub fn unlock(mut self) -> Result<()> {
        crate::runtime::ensure_blocking_allowed()?;
        let wait = self.held.line().session().client().rpc().request_timeout();
        match self.held.release(Some(wait))? {
            Released::Deleted => Ok(()),
            Released::NotOurs | Released::NotCurrent => Err(Error::LockLost),
        }
    }
}
