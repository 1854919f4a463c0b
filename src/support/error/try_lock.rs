//! [`TryLockError`]: the error of a `try_*` call.

use super::Error;

/// The error of [`Mutex::try_lock`](crate::Mutex::try_lock), shaped like
/// [`std::sync::TryLockError`]: either the lock is busy, or something failed.
///
/// # Example
///
/// ```no_run
/// use etcd_sync::TryLockError;
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let session = client.session()?;
/// let mutex = session.mutex("jobs/nightly")?;
/// match mutex.try_lock() {
///     Ok(guard) => println!("got it: token {}", guard.fencing_token()),
///     Err(TryLockError::WouldBlock) => println!("someone else runs it"),
///     Err(TryLockError::Error(e)) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, thiserror::Error)]
pub enum TryLockError {
    /// Another holder has the lock right now.
    #[error("the lock is held by another holder")]
    WouldBlock,
    /// Taking the lock failed.
    #[error(transparent)]
    Error(#[from] Error),
}
