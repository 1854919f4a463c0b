//! A distributed mutex with an RAII guard: `std::sync::Mutex`'s distributed sibling, on
//! etcd's lock recipe (and wire format).

use std::sync::Arc;
use std::time::Duration;

// `Error` names the variants in the docs' `# Errors` links.
#[cfg(doc)]
use crate::support::error::Error;

use crate::line::mode::Mode;
use crate::ownership::{self, Place, Wait};
use crate::recipes::guard::{Guard, MutexKind};
use crate::recipes::holder::Status;
use crate::session::Session;
use crate::support::cancel::WaitOptions;
use crate::support::error::Result;
use crate::support::error::operation::Operation;
use crate::support::error::try_lock::TryLockError;

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
    line: Arc<Place>,
    lock_delay: Duration,
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
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `name` is empty,
    /// ends with `/` or is longer than 4096 bytes.
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
            line: Place::of(self, name.as_ref(), Mode::Exclusive)?,
            lock_delay: Duration::ZERO,
        })
    }
}

impl Mutex {
    /// Opts in to a lock-delay (Chubby, Consul): when the holder before us lost its lease
    /// to an expiry (its keep-alives stopped: a paused, frozen or cut-off process) instead
    /// of releasing, wait `delay` more before taking over, so that a holder that cannot
    /// check fencing tokens has time to notice it lost. A release, a forced delete of the
    /// key and a revoked lease (`Session::close`, even right after a release, or
    /// `etcdctl lease revoke`) hand over at once. Default: no delay (as Go's `concurrency`).
    ///
    /// **Covered:** a wait whose key was already in the line, behind the holder's key, when
    /// etcd deleted that key with its expired lease. While it waits, the leases of the keys
    /// that were ahead of ours when we joined (at most 16) are looked up, each again when
    /// half its reported TTL is used: a TTL proves the lease cannot expire before then. A
    /// lease that ended while such a proof held was revoked, not expired. If one ended
    /// without that proof, the delay starts when the wait sees that its turn came.
    ///
    /// **Not covered:** an acquire that joins after the ended holder's key is gone. It finds
    /// the name free and holds at once, however recently the lease ended: etcd keeps no
    /// record of an ended lease, and this crate writes none (docs/waits.md, "Lock-delay"). Where
    /// that matters, check fencing tokens, or keep a waiter queued on the name.
    ///
    /// The delay counts against the wait's time limit and ends early on a cancel or a lost
    /// session, and with [`LockLost`](crate::Error::LockLost) if our own key is deleted
    /// meanwhile (no guard is returned without its key).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `delay` is longer than
    /// [`MAX_LOCK_DELAY`](crate::MAX_LOCK_DELAY) (60 s).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let mutex = session.mutex("deploy")?.lock_delay(Duration::from_secs(10))?;
    /// # let _ = mutex;
    /// # Ok(()) }
    /// ```
    pub fn lock_delay(mut self, delay: Duration) -> Result<Mutex> {
        self.lock_delay = ownership::checked_lock_delay(delay)?;
        Ok(self)
    }

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

    /// Who holds the lock now and who waits, in line order: the same read as
    /// [`Client::status`](crate::Client::status) of this name (no session is needed for
    /// that). [`Status::holder`] is the holder (the oldest of them, when readers or permits
    /// of the name share it): its key, the holder's [`identity`](crate::Session::identity)
    /// (empty for `etcdctl lock`), lease, fencing token and lease TTL left; `None` when the
    /// lock is free. One linearizable read and one lease lookup per distinct lease.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] / [`Error::Unavailable`]: no endpoint answered (reads and lease
    /// lookups are retried on every endpoint first); [`Error::Server`] /
    /// [`Error::Authentication`]: etcd refused a request; [`Error::InsideAsyncRuntime`]:
    /// called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let status = session.mutex("db-migration")?.status()?;
    /// if let Some(holder) = status.holder() {
    ///     println!("{} holds it (token {})", holder.value_str(), holder.create_revision);
    /// }
    /// for waiter in &status.waiters {
    ///     println!("waiting: {}", waiter.value_str());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn status(&self) -> Result<Status> {
        self.session().client().status(self.name())
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
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd could not be reached to join the
    ///   line (the request is tried on every endpoint first); our key is removed in the
    ///   background. A leader election is waited out instead ("no leader" from every member
    ///   is retried), and once in the line the wait retries its reads until etcd answers:
    ///   only the session's loss ends it then.
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
        ownership::blocking(self.acquire(Wait::forever()))
    }

    /// Like [`lock`](Mutex::lock), but gives up with [`Error::Timeout`] after `timeout`,
    /// leaving no key behind.
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] with [`Operation::Lock`] and `after: timeout`
    ///   ([`is_wait_timeout`](Error::is_wait_timeout)): the lock was not ours in time
    ///   (someone else holds it, or etcd was too slow); no key is left behind. A request
    ///   that timed out on the way is a `Timeout` too, with [`Operation::Request`] and
    ///   the endpoint that did not answer.
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
        ownership::blocking(self.acquire(Wait::from_timeout(timeout)))
    }

    /// Like [`lock`](Mutex::lock), with a time limit and/or a [`CancelToken`](crate::CancelToken) that another
    /// thread may cancel: `lock_with(&token)`, `lock_with(Duration::from_secs(5))`, or a
    /// [`WaitOptions`] with both.
    ///
    /// # Errors
    ///
    /// * [`Error::Cancelled`]: the token was cancelled before or during the wait. The call
    ///   returns within about one request round trip (the removal of our queued key); no
    ///   key is left behind.
    /// * [`Error::Timeout`] ([`is_wait_timeout`](Error::is_wait_timeout)): the time limit
    ///   passed, as for [`lock_timeout`](Mutex::lock_timeout).
    /// * Otherwise as [`lock`](Mutex::lock).
    ///
    /// ```no_run
    /// use etcd_sync::CancelToken;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let token = CancelToken::new();
    /// let canceller = token.clone(); // give it to the thread that handles shutdown
    /// # drop(canceller);
    /// match session.mutex("db-migration")?.lock_with(&token) {
    ///     Ok(_guard) => println!("migrating"),
    ///     Err(e) if e.is_cancelled() => println!("shutting down"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lock_with(&self, options: impl Into<WaitOptions>) -> Result<MutexGuard> {
        ownership::blocking(self.acquire(Wait::from_options(options.into())))
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
        self.acquire(Wait::never())
    }

    /// The line and lock-delay, for a [`MultiLock`](crate::MultiLock) over this mutex.
    pub(crate) fn line_and_delay(&self) -> (&Arc<Place>, Duration) {
        (&self.line, self.lock_delay)
    }

    fn acquire(&self, wait: Wait) -> std::result::Result<MutexGuard, TryLockError> {
        let held = ownership::lock(
            &self.line,
            Operation::Lock,
            wait.with_delay(self.lock_delay),
        )?;
        Ok(Guard::new(held))
    }
}

/// Proof that a [`Mutex`] is held; releases it on `Drop`. A [`Guard`]: its methods are
/// the ones every guard has.
///
/// A lock held through a lease can be lost (session expiry, network partition): watch
/// [`lost`](Guard::lost), and make writes conditional on still holding the lock with
/// [`put`](Guard::put), [`delete`](Guard::delete), [`txn`](Guard::txn), or stamp them
/// elsewhere with the [`fencing_token`](Guard::fencing_token). Use
/// [`release`](Guard::release) to see the outcome of the release.
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
/// guard.release()?;
/// # Ok(()) }
/// ```
pub type MutexGuard = Guard<MutexKind>;
