//! [`RwLockWriteGuard::downgrade`](crate::Guard::downgrade): from write to read with no
//! gap, for a guard from [`RwLock::write_downgradable`](crate::RwLock::write_downgradable)
//! (docs/design/downgrade.md).

use std::fmt;

use super::{RwLockReadGuard, RwLockWriteGuard};
use crate::recipes::guard::{Guard, WriteKind};
use crate::support::error::Error;

/// Why [`downgrade`](Guard::downgrade) failed, and the write guard back when it is still
/// held: only when nothing was sent ([`Error::InvalidArgument`]: the guard is not
/// downgradable). After any other error the write lock is over and both of its keys are
/// released (in the background if etcd does not answer): a write guard whose writer key
/// may already be gone is never handed back.
///
/// It does not convert into [`Error`] by `?` on its own (as [`TryLockError`] does not): a
/// `From<DowngradeError> for Error` would leave the error type of closures such as
/// [`StmBuilder::run`](crate::StmBuilder::run)'s ambiguous in existing code. Use
/// [`into_error`](DowngradeError::into_error):
/// `write.downgrade().map_err(DowngradeError::into_error)?`.
///
/// [`TryLockError`]: crate::TryLockError
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let write = session.rwlock("catalog")?.write()?; // not downgradable
/// let write = match write.downgrade() {
///     Ok(read) => { drop(read); return Ok(()) }
///     Err(e) => {
///         assert!(matches!(e.error(), etcd_sync::Error::InvalidArgument(_)));
///         e.into_guard().expect("nothing was sent: still held")
///     }
/// };
/// assert!(write.is_held());
/// # Ok(()) }
/// ```
pub struct DowngradeError {
    error: Error,
    /// Boxed: an `Err` stays about as small as an [`Error`].
    guard: Option<Box<RwLockWriteGuard>>,
}

impl DowngradeError {
    /// What went wrong.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// if let Err(e) = session.rwlock("m")?.write_downgradable()?.downgrade() {
    ///     eprintln!("downgrade failed: {}", e.error());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The error, without the guard (dropping it releases it).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let read = session.rwlock("m")?.write_downgradable()?.downgrade();
    /// let read = read.map_err(etcd_sync::DowngradeError::into_error)?;
    /// # let _ = read;
    /// # Ok(()) }
    /// ```
    pub fn into_error(self) -> Error {
        self.error
    }

    /// The write guard, still held, when the downgrade sent nothing (the guard was not
    /// from [`write_downgradable`](crate::RwLock::write_downgradable)); `None` after any
    /// other error (the write lock is over).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let error = session.rwlock("m")?.write()?.downgrade().unwrap_err();
    /// let write = error.into_guard().expect("not downgradable: handed back");
    /// write.release()?;
    /// # Ok(()) }
    /// ```
    pub fn into_guard(self) -> Option<RwLockWriteGuard> {
        self.guard.map(|guard| *guard)
    }
}

impl fmt::Debug for DowngradeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DowngradeError")
            .field("error", &self.error)
            .field("guard", &self.guard)
            .finish()
    }
}

impl fmt::Display for DowngradeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "downgrade failed: {}", self.error)
    }
}

impl std::error::Error for DowngradeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl Guard<WriteKind> {
    /// Whether this write guard can [`downgrade`](Guard::downgrade): it came from
    /// [`RwLock::write_downgradable`](crate::RwLock::write_downgradable) (or its
    /// `_timeout`, `_with` and `try_` variants).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert!(session.rwlock("m")?.write_downgradable()?.is_downgradable());
    /// assert!(!session.rwlock("n")?.write()?.is_downgradable());
    /// # Ok(()) }
    /// ```
    pub fn is_downgradable(&self) -> bool {
        self.twin.is_some()
    }

    /// Turns this write lock into a read lock with no gap: no other writer (nor a `Mutex`
    /// or `etcdctl lock` of the name) holds between the two, and we hold throughout. The
    /// readers queued behind us get in at once; the writers behind us keep waiting for our
    /// read guard, as Go's `Mutex` and `etcdctl lock` do. One Txn: our writer key is
    /// deleted only while it and its twin both have our create revision (the same Txn
    /// rewrites the twin, value and lease unchanged, so that a retried attempt knows its
    /// own earlier success from someone else's delete of the writer key), and the twin,
    /// created with it, keeps our place in the line as a reader. The read guard has the
    /// same fencing token, follows the twin key (its deletion by anyone is a loss), and
    /// releases it.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: the guard is not downgradable (it came from
    ///   [`RwLock::write`](crate::RwLock::write)); nothing was sent, and
    ///   [`DowngradeError::into_guard`] gives the write guard back, still held.
    /// * [`Error::LockLost`]: the guard had ended, or either key was deleted (by anyone,
    ///   also just before this call, before the guard noticed) or no longer had our create
    ///   revision; [`Error::SessionLost`]: the session is lost;
    ///   [`Error::Timeout`] / [`Error::Unavailable`], [`Error::Server`]: etcd did not
    ///   answer or refused; [`Error::InsideAsyncRuntime`]. After each of these the write
    ///   lock is over: both keys are released (in the background if etcd does not answer).
    ///
    /// ```no_run
    /// use etcd_sync::DowngradeError;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let write = session.rwlock("catalog")?.write_downgradable()?;
    /// let token = write.fencing_token();
    /// write.put("catalog/data", "v2")?;
    /// // Other readers join us now; writers still wait.
    /// let read = write.downgrade().map_err(DowngradeError::into_error)?;
    /// assert_eq!(read.fencing_token(), token);
    /// let data = session.client().get("catalog/data")?;
    /// # let _ = data;
    /// # Ok(()) }
    /// ```
    pub fn downgrade(self) -> Result<RwLockReadGuard, DowngradeError> {
        let Guard { held, twin, .. } = self;
        let Some(twin) = twin else {
            return Err(DowngradeError {
                error: Error::InvalidArgument(
                    "downgrade() needs a write guard from RwLock::write_downgradable(); \
                     this one came from write()"
                        .into(),
                ),
                guard: Some(Box::new(Guard::new(held))),
            });
        };
        match held.downgrade(twin) {
            Ok(read) => Ok(Guard::new(read)),
            Err(error) => Err(DowngradeError { error, guard: None }),
        }
    }
}
