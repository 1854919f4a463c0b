//! A distributed read-write lock: `std::sync::RwLock`'s distributed sibling, fair, on the
//! same line as [`Mutex`](crate::Mutex).
//!
//! Writers take the exclusive key `<name>/<lease hex>`, the one a `Mutex` and
//! `etcdctl lock NAME` take: all three exclude each other and every reader. Readers take
//! `<name>/<lease hex>.shared` and wait only for the keys ahead of them that are not
//! shared, so readers in a row hold together, while a reader that arrives after a waiting
//! writer queues behind it (writers do not starve). See `line/mode.rs`.

use std::sync::Arc;
use std::time::Duration;

// `Error` names the variants in the docs' `# Errors` links.
#[cfg(doc)]
use crate::support::error::Error;

use crate::line::mode::Mode;
use crate::ownership::{self, Place, Wait};
use crate::recipes::guard::{Guard, ReadKind, WriteKind};
use crate::recipes::holder::Status;
use crate::session::Session;
use crate::support::cancel::WaitOptions;
use crate::support::error::Result;
use crate::support::error::operation::Operation;
use crate::support::error::try_lock::TryLockError;

mod downgrade;

pub use downgrade::DowngradeError;

/// A distributed read-write lock named by a string, held through a [`Session`].
///
/// Fair by arrival (the keys' create revisions): a reader waits for every writer that
/// queued before it, a writer for everyone that queued before it. The write side is the
/// same line as [`Mutex`](crate::Mutex) and `etcdctl lock` of the same name, so they
/// exclude each other and every reader; readers of one name share.
///
/// As with `Mutex`, threads of one session take turns on that session's key: two read
/// guards of one name on one session do not overlap (use a session per reader for that),
/// and a thread that holds a read or write guard of a name gets
/// [`Error::WouldDeadlock`] instead of waiting for the other side on the same session.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let session = client.session()?;
/// let config = session.rwlock("config")?;
/// {
///     let _read = config.read()?; // many processes may read at once
/// }
/// let write = config.write()?; // waits for the readers before it; excludes everyone
/// write.put("config/version", "7")?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RwLock {
    readers: Arc<Place>,
    writers: Arc<Place>,
    lock_delay: Duration,
}

impl Session {
    /// A read-write lock named `name` on this session. No request is sent until you lock
    /// it.
    ///
    /// The name is a key prefix, as for [`mutex`](Session::mutex): every key under
    /// `<name>/` that is not a reader's counts as a writer.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `name` is empty, ends with `/` or is longer than 4096 bytes.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let lock = session.rwlock("catalog")?;
    /// assert!(session.rwlock("").is_err()); // InvalidArgument
    /// # let _ = lock;
    /// # Ok(()) }
    /// ```
    pub fn rwlock(&self, name: impl AsRef<[u8]>) -> Result<RwLock> {
        Ok(RwLock {
            readers: Place::of(self, name.as_ref(), Mode::Shared)?,
            writers: Place::of(self, name.as_ref(), Mode::Exclusive)?,
            lock_delay: Duration::ZERO,
        })
    }
}

impl RwLock {
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
    /// let rwlock = session.rwlock("catalog")?.lock_delay(Duration::from_secs(10))?;
    /// # let _ = rwlock;
    /// # Ok(()) }
    /// ```
    pub fn lock_delay(mut self, delay: Duration) -> Result<RwLock> {
        self.lock_delay = ownership::checked_lock_delay(delay)?;
        Ok(self)
    }

    /// The lock's name.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert_eq!(session.rwlock("x")?.name(), b"x");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &[u8] {
        self.writers.name()
    }

    /// The session this lock is taken with.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert_eq!(session.rwlock("x")?.session().lease_id(), session.lease_id());
    /// # Ok(()) }
    /// ```
    pub fn session(&self) -> &Session {
        self.writers.session()
    }

    /// Who holds the lock now and who waits, readers and writers, in line order: the
    /// same read as [`Client::status`](crate::Client::status) of this name. The holders,
    /// oldest first, are the readers that share it
    /// ([`KeyMode::Shared`](crate::KeyMode::Shared)), or the one writer (or `Mutex`, or
    /// `etcdctl lock`), each with its [`identity`](crate::Session::identity), lease,
    /// fencing token and lease TTL left; none when it is free. One linearizable read, then
    /// one lease lookup per distinct lease.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] / [`Error::Unavailable`]: no endpoint answered (reads and lease
    /// lookups are retried on every endpoint first); [`Error::Server`] /
    /// [`Error::Authentication`]: etcd refused a request; [`Error::InsideAsyncRuntime`]:
    /// called on an async worker thread.
    ///
    /// ```no_run
    /// use etcd_sync::KeyMode;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let status = session.rwlock("catalog")?.status()?;
    /// let readers = status.holders.iter().filter(|h| h.mode == KeyMode::Shared).count();
    /// println!("{readers} readers, {} writers", status.holders.len() - readers);
    /// for waiter in &status.waiters {
    ///     println!("{} waits ({:?})", waiter.value_str(), waiter.mode);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn status(&self) -> Result<Status> {
        self.session().client().status(self.name())
    }

    /// Blocks until the read lock is held: until no writer (or `Mutex`, or
    /// `etcdctl lock`) that queued before us holds or waits.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock): [`Error::SessionLost`] (at once, while
    /// waiting too), [`Error::LockLost`] (our queued key was deleted by someone else),
    /// [`Error::WouldDeadlock`] (this thread holds a guard of this name on this session),
    /// [`Error::Timeout`] / [`Error::Unavailable`], [`Error::Server`],
    /// [`Error::Authentication`], [`Error::InsideAsyncRuntime`]. No key is left behind.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.rwlock("catalog")?.read()?;
    /// println!("reading under {}", guard.key_str());
    /// # Ok(()) }
    /// ```
    pub fn read(&self) -> Result<RwLockReadGuard> {
        ownership::blocking(self.read_for(Wait::forever()))
    }

    /// Like [`read`](RwLock::read), but gives up after `timeout`, leaving no key behind.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] with [`Operation::Read`]
    /// ([`is_wait_timeout`](Error::is_wait_timeout)) when the limit ran out; otherwise as
    /// [`read`](RwLock::read).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.rwlock("catalog")?.read_timeout(std::time::Duration::from_secs(1)) {
    ///     Ok(_guard) => println!("reading"),
    ///     Err(e) if e.is_wait_timeout() => println!("a writer holds it"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn read_timeout(&self, timeout: Duration) -> Result<RwLockReadGuard> {
        ownership::blocking(self.read_for(Wait::from_timeout(timeout)))
    }

    /// Like [`read`](RwLock::read), with a time limit and/or a
    /// [`CancelToken`](crate::CancelToken) (see [`WaitOptions`]).
    ///
    /// # Errors
    ///
    /// [`Error::Cancelled`](crate::Error::Cancelled) when the token is cancelled (no key is
    /// left behind), a wait timeout when the limit passes, otherwise as
    /// [`read`](RwLock::read).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let token = etcd_sync::CancelToken::new();
    /// let _reader = session.rwlock("catalog")?.read_with(&token)?;
    /// # Ok(()) }
    /// ```
    pub fn read_with(&self, options: impl Into<WaitOptions>) -> Result<RwLockReadGuard> {
        ownership::blocking(self.read_for(Wait::from_options(options.into())))
    }

    /// Takes the read lock only if no writer holds or waits before us now.
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if a writer is ahead (our queued key is removed);
    /// otherwise as [`read`](RwLock::read), in [`TryLockError::Error`].
    ///
    /// ```no_run
    /// use etcd_sync::TryLockError;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.rwlock("catalog")?.try_read() {
    ///     Ok(_guard) => println!("reading"),
    ///     Err(TryLockError::WouldBlock) => println!("a writer is ahead"),
    ///     Err(TryLockError::Error(e)) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_read(&self) -> std::result::Result<RwLockReadGuard, TryLockError> {
        self.read_for(Wait::never())
    }

    /// Blocks until the write lock is held: until everyone who queued before us (readers,
    /// writers, `Mutex` and `etcdctl lock` holders of this name) is gone.
    ///
    /// # Errors
    ///
    /// As [`read`](RwLock::read).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.rwlock("catalog")?.write()?;
    /// guard.put("catalog/version", "8")?;
    /// # Ok(()) }
    /// ```
    pub fn write(&self) -> Result<RwLockWriteGuard> {
        ownership::blocking(self.write_for(Wait::forever()))
    }

    /// Like [`write`](RwLock::write), but gives up after `timeout`, leaving no key behind.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] with [`Operation::Write`]
    /// ([`is_wait_timeout`](Error::is_wait_timeout)) when the limit ran out; otherwise as
    /// [`write`](RwLock::write).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let lock = session.rwlock("catalog")?;
    /// if let Ok(guard) = lock.write_timeout(std::time::Duration::from_secs(5)) {
    ///     guard.put("catalog/version", "9")?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn write_timeout(&self, timeout: Duration) -> Result<RwLockWriteGuard> {
        ownership::blocking(self.write_for(Wait::from_timeout(timeout)))
    }

    /// Like [`write`](RwLock::write), with a time limit and/or a
    /// [`CancelToken`](crate::CancelToken) (see [`WaitOptions`]).
    ///
    /// # Errors
    ///
    /// [`Error::Cancelled`](crate::Error::Cancelled) when the token is cancelled (no key is
    /// left behind), a wait timeout when the limit passes, otherwise as
    /// [`write`](RwLock::write).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let token = etcd_sync::CancelToken::new();
    /// let options = etcd_sync::WaitOptions::new().timeout(Duration::from_secs(10)).cancel_token(&token);
    /// let _writer = session.rwlock("catalog")?.write_with(options)?;
    /// # Ok(()) }
    /// ```
    pub fn write_with(&self, options: impl Into<WaitOptions>) -> Result<RwLockWriteGuard> {
        ownership::blocking(self.write_for(Wait::from_options(options.into())))
    }

    /// Takes the write lock only if nobody holds or waits for this name now.
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if anyone is ahead (our queued key is removed);
    /// otherwise as [`write`](RwLock::write), in [`TryLockError::Error`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// if let Ok(guard) = session.rwlock("catalog")?.try_write() {
    ///     guard.put("catalog/version", "10")?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_write(&self) -> std::result::Result<RwLockWriteGuard, TryLockError> {
        self.write_for(Wait::never())
    }

    /// Like [`write`](RwLock::write), and the guard can later
    /// [`downgrade`](Guard::downgrade) to a read guard with no gap: no other writer holds
    /// between the two, and we hold throughout.
    ///
    /// It costs one more key: with the writer key `<name>/<lease hex>`, the same Txn puts
    /// its twin `<name>/<lease hex>.shared` (this session's reader key), so both have one
    /// create revision, one place in the line. Every key waits only for keys created before
    /// its own, so the writer holds with its twin beside it; everyone who queues later waits
    /// for both (a reader only for the writer key). The downgrade deletes the writer key:
    /// the twin keeps our place as a reader, so readers queued behind us get in, and
    /// writers behind us keep waiting. Go's `Mutex` and `etcdctl lock` wait for every older
    /// key, the twin too. Release, `Drop`, a failed wait and session loss remove both keys.
    ///
    /// The session's read guards of this name share the twin's key: while another thread
    /// of this session holds (or waits for) a read guard of this name, this waits for it.
    ///
    /// # Errors
    ///
    /// As [`write`](RwLock::write).
    ///
    /// ```no_run
    /// use etcd_sync::DowngradeError;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let write = session.rwlock("catalog")?.write_downgradable()?;
    /// write.put("catalog/data", "new contents")?;
    /// // No writer gets in between.
    /// let read = write.downgrade().map_err(DowngradeError::into_error)?;
    /// assert!(read.is_held());
    /// # Ok(()) }
    /// ```
    pub fn write_downgradable(&self) -> Result<RwLockWriteGuard> {
        ownership::blocking(self.write_downgradable_for(Wait::forever()))
    }

    /// Like [`write_downgradable`](RwLock::write_downgradable), but gives up after
    /// `timeout`, leaving no key behind.
    ///
    /// # Errors
    ///
    /// As [`write_timeout`](RwLock::write_timeout).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let lock = session.rwlock("catalog")?;
    /// if let Ok(write) = lock.write_downgradable_timeout(std::time::Duration::from_secs(5)) {
    ///     let _read = write.downgrade().map_err(etcd_sync::DowngradeError::into_error)?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn write_downgradable_timeout(&self, timeout: Duration) -> Result<RwLockWriteGuard> {
        ownership::blocking(self.write_downgradable_for(Wait::from_timeout(timeout)))
    }

    /// Like [`write_downgradable`](RwLock::write_downgradable), with a time limit and/or a
    /// [`CancelToken`](crate::CancelToken) (see [`WaitOptions`]).
    ///
    /// # Errors
    ///
    /// As [`write_with`](RwLock::write_with).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let token = etcd_sync::CancelToken::new();
    /// let write = session.rwlock("catalog")?.write_downgradable_with(&token)?;
    /// # let _ = write;
    /// # Ok(()) }
    /// ```
    pub fn write_downgradable_with(
        &self,
        options: impl Into<WaitOptions>,
    ) -> Result<RwLockWriteGuard> {
        ownership::blocking(self.write_downgradable_for(Wait::from_options(options.into())))
    }

    /// Like [`try_write`](RwLock::try_write), downgradable (see
    /// [`write_downgradable`](RwLock::write_downgradable)).
    ///
    /// # Errors
    ///
    /// As [`try_write`](RwLock::try_write); [`TryLockError::WouldBlock`] also when another
    /// thread of this session holds a read guard of this name.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// if let Ok(write) = session.rwlock("catalog")?.try_write_downgradable() {
    ///     let _read = write.downgrade().map_err(etcd_sync::DowngradeError::into_error)?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_write_downgradable(&self) -> std::result::Result<RwLockWriteGuard, TryLockError> {
        self.write_downgradable_for(Wait::never())
    }

    /// The line of one side (`write`: the writers') and the lock-delay, for a
    /// [`MultiLock`](crate::MultiLock) over this lock.
    pub(crate) fn line_and_delay(&self, write: bool) -> (&Arc<Place>, Duration) {
        let line = if write { &self.writers } else { &self.readers };
        (line, self.lock_delay)
    }

    fn read_for(&self, wait: Wait) -> std::result::Result<RwLockReadGuard, TryLockError> {
        let held = ownership::lock(
            &self.readers,
            Operation::Read,
            wait.with_delay(self.lock_delay),
        )?;
        Ok(Guard::new(held))
    }

    fn write_for(&self, wait: Wait) -> std::result::Result<RwLockWriteGuard, TryLockError> {
        let held = ownership::lock(
            &self.writers,
            Operation::Write,
            wait.with_delay(self.lock_delay),
        )?;
        Ok(Guard::new(held))
    }

    fn write_downgradable_for(
        &self,
        wait: Wait,
    ) -> std::result::Result<RwLockWriteGuard, TryLockError> {
        let span = tracing::debug_span!("acquire", operation = %Operation::Write, key = %crate::support::kv::text(self.writers.key()), downgradable = true);
        let _entered = span.enter();
        let identity = self.session().identity().as_bytes().to_vec();
        let (writer, twin) = ownership::acquire_twin(
            &self.writers,
            &self.readers,
            ownership::Kind::Lock(Operation::Write),
            &identity,
            wait.with_delay(self.lock_delay),
        )?;
        tracing::debug!(fencing_token = writer.rev(), "acquired");
        Ok(Guard::with_twin(writer, twin))
    }
}

/// Proof that an [`RwLock`]'s read lock is held; releases it on `Drop`. A [`Guard`]: its
/// methods are the ones every guard has.
///
/// Readers of one name hold together; no writer (nor a `Mutex` or `etcdctl lock` of
/// the name) holds while this guard does. It has a fencing token, [`lost`](Guard::lost),
/// guarded writes, and a release that never deletes a newer key.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let guard = session.rwlock("catalog")?.read()?;
/// let catalog = session.client().get("catalog/data")?;
/// if !guard.is_held() {
///     eprintln!("lost the read lock while reading: read again");
/// }
/// # let _ = catalog;
/// # Ok(()) }
/// ```
pub type RwLockReadGuard = Guard<ReadKind>;

/// Proof that an [`RwLock`]'s write lock is held; releases it on `Drop`. A [`Guard`]: its
/// methods are the ones every guard has.
///
/// Nobody else holds the name while this guard does: no reader, no writer, no `Mutex`
/// or `etcdctl lock`.
///
/// A guard from [`RwLock::write_downgradable`] can [`downgrade`](Guard::downgrade) to a
/// read guard with no gap; it holds two keys, and reports the loss of either one
/// ([`lost`](Guard::lost), [`is_held`](Guard::is_held)); its guarded writes check the
/// writer key, which alone excludes everyone. A guard from [`RwLock::write`] holds one key,
/// as Go's `Mutex` does, and cannot downgrade (docs/design/downgrade.md).
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let guard = session.rwlock("catalog")?.write()?;
/// guard.put("catalog/data", "new contents")?; // only while we hold the write lock
/// guard.release()?;
/// # Ok(()) }
/// ```
pub type RwLockWriteGuard = Guard<WriteKind>;
