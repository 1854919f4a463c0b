//! A distributed counting semaphore: at most N holders of one name, FIFO, on the same line
//! model as [`Mutex`](crate::Mutex).
//!
//! A permit is the key `<name>/<lease hex>.permits-<N>`: the number of permits is part of
//! every key, so each participant checks the others' N in the keys it already reads to
//! wait (no extra key, nothing to agree on first). The first N permits by create revision
//! hold; a waiter holds once fewer than N older permits remain. A key of another N, and
//! any key that is not a permit (a `Mutex`, `etcdctl lock`, a reader), is waited for
//! entirely, so `etcdctl lock NAME` excludes every permit holder. See `line/mode.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::line::mode::{MAX_PERMITS, Mode};
use crate::ownership::{self, Line, Wait};
use crate::recipes::guard::{Guard, PermitKind};
use crate::recipes::holder::Status;
use crate::session::Session;
use crate::support::cancel::WaitOptions;
use crate::support::error::operation::Operation;
use crate::support::error::try_lock::TryLockError;
use crate::support::error::{Error, Result};

/// A distributed counting semaphore named by a string: at most `permits` holders at once,
/// across every process that uses the name with the same number of permits.
///
/// Waiters are served in arrival order (the keys' create revisions); releasing a permit
/// wakes only the waiter that can now hold. A participant whose number of permits differs
/// from that of a key ahead of it gets [`Error::InvalidArgument`] naming that key, and
/// leaves no key behind. `permits = 1` behaves as a [`Mutex`](crate::Mutex) (but its keys
/// differ, so a one-permit semaphore and a `Mutex` of one name exclude each other rather
/// than share a line).
///
/// As with `Mutex`, one session holds at most one permit of a name at a time: threads of
/// one session take turns on that session's key. Use one session per concurrent holder.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let session = client.session()?;
/// let api = session.semaphore("licensed-api", 4)?; // at most 4 callers fleet-wide
/// let permit = api.acquire()?;
/// println!("calling the API with permit {}", permit.fencing_token());
/// drop(permit);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    line: Arc<Line>,
    permits: u32,
    lock_delay: Duration,
}

impl Session {
    /// A semaphore named `name` with `permits` permits on this session. No request is sent
    /// until you acquire it.
    ///
    /// The name is a key prefix, as for [`mutex`](Session::mutex): every key under
    /// `<name>/` that is not a permit of this semaphore is waited for as a whole.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `name` is empty or longer than 4096 bytes, or if
    /// `permits` is 0 or above 1024.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let workers = session.semaphore("batch-workers", 8)?;
    /// assert!(session.semaphore("batch-workers", 0).is_err()); // InvalidArgument
    /// # let _ = workers;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: impl AsRef<[u8]>, permits: u32) -> Result<Semaphore> {
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(Error::InvalidArgument(format!(
                "a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"
            )));
        }
        Ok(Semaphore {
            line: Line::of(self, name.as_ref(), Mode::Permits(permits))?,
            permits,
            lock_delay: Duration::ZERO,
        })
    }
}

impl Semaphore {
    /// Opts in to a lock-delay (Chubby, Consul): when the holder before us lost its lease
    /// (it expired, or was revoked) instead of releasing, wait `delay` more before taking
    /// over, so that a paused holder that cannot check fencing tokens has time to notice it
    /// lost. A clean release hands over at once. Default: no delay (as Go's `concurrency`).
    ///
    /// **Covered:** a wait whose key was already in the line, behind the holder's key, when
    /// etcd deleted that key with its ended lease. The leases of the keys that were ahead of
    /// ours when we joined are looked up once the wait is over (one LeaseTimeToLive each,
    /// for at most 16 keys); if any of them ended, the delay starts then, when the wait
    /// sees that its turn came.
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
    /// let semaphore = session.semaphore("workers", 4)?.lock_delay(Duration::from_secs(10))?;
    /// # let _ = semaphore;
    /// # Ok(()) }
    /// ```
    pub fn lock_delay(mut self, delay: Duration) -> Result<Semaphore> {
        self.lock_delay = ownership::checked_lock_delay(delay)?;
        Ok(self)
    }

    /// The semaphore's name.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert_eq!(session.semaphore("x", 2)?.name(), b"x");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &[u8] {
        self.line.name()
    }

    /// How many holders the semaphore admits at once.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert_eq!(session.semaphore("x", 3)?.permits(), 3);
    /// # Ok(()) }
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The session this semaphore acquires with.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert_eq!(session.semaphore("x", 2)?.session().lease_id(), session.lease_id());
    /// # Ok(()) }
    /// ```
    pub fn session(&self) -> &Session {
        self.line.session()
    }

    /// Who holds the name now and who waits for a permit, in line order: the same read as
    /// [`Client::status`](crate::Client::status) of this name. The holders, oldest first,
    /// are up to N permits, each with its holder's [`identity`](crate::Session::identity),
    /// lease, fencing token ([`create_revision`](crate::Holder::create_revision)) and lease
    /// TTL left. While a key this semaphore waits for as a whole (a `Mutex`, `etcdctl
    /// lock`) is oldest, that key is the one holder (its [`mode`](crate::Holder::mode)
    /// says so). One linearizable read, then one lease lookup per distinct lease.
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
    /// let status = session.semaphore("licensed-api", 4)?.status()?;
    /// for holder in &status.holders {
    ///     println!("{} holds with token {}", holder.value_str(), holder.create_revision);
    /// }
    /// println!("{} waiting for a permit", status.waiters.len());
    /// # Ok(()) }
    /// ```
    pub fn status(&self) -> Result<Status> {
        self.session().client().status(self.name())
    }

    /// Blocks until a permit is held: until fewer than N permits that were queued before
    /// ours remain, and no key of this name that is not a permit of this size is older.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: a key ahead of ours is a permit of another size
    ///   (participants disagree on N); our key is removed.
    /// * Otherwise as [`Mutex::lock`](crate::Mutex::lock): [`Error::SessionLost`],
    ///   [`Error::LockLost`], [`Error::WouldDeadlock`], [`Error::Timeout`] /
    ///   [`Error::Unavailable`], [`Error::Server`], [`Error::Authentication`],
    ///   [`Error::InsideAsyncRuntime`]. No key is left behind.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let permit = session.semaphore("batch-workers", 8)?.acquire()?;
    /// permit.put("batch-workers-status/host-a", "busy")?;
    /// # Ok(()) }
    /// ```
    pub fn acquire(&self) -> Result<Permit> {
        ownership::blocking(self.acquire_for(Wait::forever()))
    }

    /// Like [`acquire`](Semaphore::acquire), but gives up after `timeout`, leaving no key
    /// behind.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] with [`Operation::Acquire`]
    /// ([`is_wait_timeout`](Error::is_wait_timeout)) when the limit ran out; otherwise as
    /// [`acquire`](Semaphore::acquire).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.semaphore("batch-workers", 8)?.acquire_timeout(std::time::Duration::from_secs(2)) {
    ///     Ok(_permit) => println!("working"),
    ///     Err(e) if e.is_wait_timeout() => println!("all 8 permits are taken"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Permit> {
        ownership::blocking(self.acquire_for(Wait::from_timeout(timeout)))
    }

    /// Like [`acquire`](Semaphore::acquire), with a time limit and/or a
    /// [`CancelToken`](crate::CancelToken) (see [`WaitOptions`]).
    ///
    /// # Errors
    ///
    /// [`Error::Cancelled`](crate::Error::Cancelled) when the token is cancelled (no key is
    /// left behind), a wait timeout when the limit passes, otherwise as
    /// [`acquire`](Semaphore::acquire).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let token = etcd_sync::CancelToken::new();
    /// let _permit = session.semaphore("api-quota", 4)?.acquire_with(&token)?;
    /// # Ok(()) }
    /// ```
    pub fn acquire_with(&self, options: impl Into<WaitOptions>) -> Result<Permit> {
        ownership::blocking(self.acquire_for(Wait::from_options(options.into())))
    }

    /// Takes a permit only if one is free now (and nobody queued before us waits).
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if no permit is free (our queued key is removed);
    /// otherwise as [`acquire`](Semaphore::acquire), in [`TryLockError::Error`].
    ///
    /// ```no_run
    /// use etcd_sync::TryLockError;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.semaphore("batch-workers", 8)?.try_acquire() {
    ///     Ok(_permit) => println!("working"),
    ///     Err(TryLockError::WouldBlock) => println!("all permits are taken"),
    ///     Err(TryLockError::Error(e)) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_acquire(&self) -> std::result::Result<Permit, TryLockError> {
        self.acquire_for(Wait::never())
    }

    fn acquire_for(&self, wait: Wait) -> std::result::Result<Permit, TryLockError> {
        let held = ownership::lock(
            &self.line,
            Operation::Acquire,
            wait.with_delay(self.lock_delay),
        )?;
        Ok(Guard::new(held))
    }
}

/// Proof that a permit of a [`Semaphore`] is held; releases it on `Drop`. A [`Guard`]:
/// its methods are the ones every guard has: a fencing token (unique per acquisition,
/// growing), [`lost`](Guard::lost), guarded writes that commit only while the permit is
/// ours, and [`release`](Guard::release) to see the outcome.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let permit = session.semaphore("licensed-api", 4)?.acquire()?;
/// crossbeam_channel::select! {
///     recv(permit.lost()) -> _ => eprintln!("permit lost: stop calling the API"),
///     default(std::time::Duration::from_secs(1)) => println!("called the API"),
/// }
/// permit.release()?;
/// # Ok(()) }
/// ```
pub type Permit = Guard<PermitKind>;
