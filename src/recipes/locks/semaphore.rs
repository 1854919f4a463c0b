//! A distributed counting semaphore: at most N holders of one name, FIFO, on the same line
//! model as [`Mutex`](crate::Mutex).
//!
//! A permit is the key `<name>/<lease hex>.permits-<N>`: the number of permits is part of
//! every key, so each participant checks the others' N in the keys it already reads to
//! wait (no extra key, nothing to agree on first). The first N permits by create revision
//! hold; a waiter holds once fewer than N older permits remain. A key of another N, and
//! any key that is not a permit (a `Mutex`, `etcdctl lock`, a reader), is waited for
//! entirely, so `etcdctl lock NAME` excludes every permit holder. See `line/mode.rs`.
//!
//! `acquire_many(k)` takes k permits at once with one key of weight k,
//! `<name>/<lease hex>.permits-<N>.x<k>`: it holds once the older permits of N still
//! present weigh at most N − k, and every younger request counts its weight while it
//! waits, so nobody overtakes it. Versions of this crate before weights read that key as
//! an unknown one, which they wait for as a whole: safe with them, if not as fair.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use crate::line::mode::{MAX_PERMITS, Mode};
use crate::ownership::{self, Place, Wait};
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
/// [`acquire_many`](Semaphore::acquire_many) takes several permits at once, all or none,
/// in the same line (one key that weighs k permits; threads of one session take turns on
/// it too).
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
    line: Arc<Place>,
    permits: u32,
    lock_delay: Duration,
    /// The lines of `acquire_many(k)` for k > 1 used so far, kept so that their next wait
    /// finds the name's watcher running (as the one-permit line does).
    many: Arc<StdMutex<BTreeMap<u32, Arc<Place>>>>,
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
    /// [`Error::InvalidArgument`] if `name` is empty, ends with `/` or is longer than 4096
    /// bytes, or if `permits` is 0 or above 1024.
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
            line: Place::of(self, name.as_ref(), Mode::Permits(permits, 1))?,
            permits,
            lock_delay: Duration::ZERO,
            many: Arc::default(),
        })
    }
}

impl Semaphore {
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
    /// are permits that take up to N in all, each with its holder's [`identity`](crate::Session::identity),
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

    /// Blocks until `k` permits are held at once, all or none: until the permits queued
    /// before ours that are still there take at most N − `k` of them, and no key of this
    /// name that is not a permit of this size is older. `acquire_many(1)` is
    /// [`acquire`](Semaphore::acquire).
    ///
    /// Fair: first come, first served, whatever the sizes. A request of `k` permits that
    /// waits keeps every request that queued after it waiting too, even one that would
    /// fit in the permits free now, so a large request is never starved by small ones.
    ///
    /// One key holds the `k` permits (`<name>/<lease hex>.permits-<N>.x<k>`), and one
    /// guard releases them all. A `Semaphore` of this crate from before `acquire_many`
    /// reads that key as an unknown key and waits for it as a whole (safe, but it does not
    /// share the free permits with it meanwhile): upgrade every participant.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `k` is 0 or more than the semaphore's permits
    ///   (nothing is sent), or a key ahead of ours is a permit of another size (our key is
    ///   removed).
    /// * Otherwise as [`acquire`](Semaphore::acquire).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let gpus = session.semaphore("gpus", 8)?;
    /// let four = gpus.acquire_many(4)?; // 4 of the 8, all at once
    /// assert_eq!(four.num_permits(), 4);
    /// assert!(gpus.acquire_many(9).is_err()); // InvalidArgument: more than there are
    /// # Ok(()) }
    /// ```
    pub fn acquire_many(&self, k: u32) -> Result<Permit> {
        ownership::blocking(self.acquire_many_for(k, Wait::forever()))
    }

    /// Like [`acquire_many`](Semaphore::acquire_many), but gives up after `timeout`,
    /// leaving no key behind.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] with [`Operation::Acquire`]
    /// ([`is_wait_timeout`](Error::is_wait_timeout)) when the limit ran out; otherwise as
    /// [`acquire_many`](Semaphore::acquire_many).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.semaphore("gpus", 8)?.acquire_many_timeout(4, Duration::from_secs(2)) {
    ///     Ok(_four) => println!("training on 4 GPUs"),
    ///     Err(e) if e.is_wait_timeout() => println!("4 GPUs did not free up in time"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn acquire_many_timeout(&self, k: u32, timeout: Duration) -> Result<Permit> {
        ownership::blocking(self.acquire_many_for(k, Wait::from_timeout(timeout)))
    }

    /// Like [`acquire_many`](Semaphore::acquire_many), with a time limit and/or a
    /// [`CancelToken`](crate::CancelToken) (see [`WaitOptions`]).
    ///
    /// # Errors
    ///
    /// [`Error::Cancelled`](crate::Error::Cancelled) when the token is cancelled (no key is
    /// left behind), a wait timeout when the limit passes, otherwise as
    /// [`acquire_many`](Semaphore::acquire_many).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let token = etcd_sync::CancelToken::new();
    /// let options = etcd_sync::WaitOptions::new().timeout(Duration::from_secs(30)).cancel_token(&token);
    /// let _three = session.semaphore("gpus", 8)?.acquire_many_with(3, options)?;
    /// # Ok(()) }
    /// ```
    pub fn acquire_many_with(&self, k: u32, options: impl Into<WaitOptions>) -> Result<Permit> {
        ownership::blocking(self.acquire_many_for(k, Wait::from_options(options.into())))
    }

    /// Takes `k` permits only if that many are free now and nobody queued before us
    /// waits.
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if fewer than `k` permits are free, or a request
    /// queued before us waits (our queued key is removed); otherwise as
    /// [`acquire_many`](Semaphore::acquire_many), in [`TryLockError::Error`].
    ///
    /// ```no_run
    /// use etcd_sync::TryLockError;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.semaphore("gpus", 8)?.try_acquire_many(2) {
    ///     Ok(_two) => println!("two GPUs"),
    ///     Err(TryLockError::WouldBlock) => println!("fewer than 2 GPUs free"),
    ///     Err(TryLockError::Error(e)) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_acquire_many(&self, k: u32) -> std::result::Result<Permit, TryLockError> {
        self.acquire_many_for(k, Wait::never())
    }

    fn acquire_for(&self, wait: Wait) -> std::result::Result<Permit, TryLockError> {
        Self::acquire_on(&self.line, wait.with_delay(self.lock_delay))
    }

    fn acquire_many_for(&self, k: u32, wait: Wait) -> std::result::Result<Permit, TryLockError> {
        if !(1..=self.permits).contains(&k) {
            return Err(Error::InvalidArgument(format!(
                "acquire_many takes 1 to {} permits of this semaphore, not {k}",
                self.permits
            ))
            .into());
        }
        if k == 1 {
            return self.acquire_for(wait);
        }
        let line = {
            let mut many = self.many.lock().unwrap_or_else(|e| e.into_inner());
            match many.get(&k) {
                Some(line) => line.clone(),
                None => {
                    let mode = Mode::Permits(self.permits, k);
                    let line = Place::of(self.session(), self.name(), mode)?;
                    many.insert(k, line.clone());
                    line
                }
            }
        };
        Self::acquire_on(&line, wait.with_delay(self.lock_delay))
    }

    fn acquire_on(line: &Arc<Place>, wait: Wait) -> std::result::Result<Permit, TryLockError> {
        let held = ownership::lock(line, Operation::Acquire, wait)?;
        Ok(Guard::new(held))
    }
}

impl Guard<PermitKind> {
    /// How many permits this guard holds: 1 from [`acquire`](Semaphore::acquire), `k`
    /// from [`acquire_many(k)`](Semaphore::acquire_many). All of them are released
    /// together.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let gpus = session.semaphore("gpus", 8)?;
    /// assert_eq!(gpus.acquire()?.num_permits(), 1);
    /// assert_eq!(gpus.acquire_many(3)?.num_permits(), 3);
    /// # Ok(()) }
    /// ```
    pub fn num_permits(&self) -> u32 {
        self.held.mode().weight().unwrap_or(1)
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
