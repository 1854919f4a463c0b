//! The crate's error type.
//!
//! One [`Error`] enum for every fallible call, so callers can `match` on what happened
//! (a lost session, a timeout, an etcd that refused) instead of parsing strings.

use std::fmt;
use std::time::Duration;

/// A `Result` whose error is this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong talking to etcd through this crate.
///
/// The enum is `#[non_exhaustive]`: later versions may add variants, so keep a `_` arm.
///
/// # Example
///
/// ```no_run
/// use etcd_sync::{Client, Error};
///
/// match Client::connect(["http://127.0.0.1:2379"]) {
///     Ok(_client) => println!("connected"),
///     Err(Error::Connect { endpoints, reason }) => eprintln!("no etcd at {endpoints}: {reason}"),
///     Err(other) => eprintln!("{other}"),
/// }
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No endpoint could be reached within the connect timeout.
    #[error("could not connect to etcd at {endpoints}: {reason}")]
    Connect {
        /// The endpoints that were tried, comma separated.
        endpoints: String,
        /// Why the last attempt failed, with what to check.
        reason: String,
    },

    /// etcd refused the TLS connection because the client presented no certificate, or
    /// one it does not trust: etcd runs with `--client-cert-auth` and wants a client
    /// certificate signed by its client CA.
    #[error(
        "etcd at {endpoint} requires a TLS client certificate signed by its CA and refused \
         ours (none was given, or it is not trusted); give one with \
         TlsConfig::client_identity_pem or TlsConfig::from_files [{detail}]"
    )]
    ClientCertificateRejected {
        /// The endpoint that refused.
        endpoint: String,
        /// How it refused (a TLS alert, or the connection closed after the handshake).
        detail: String,
    },

    /// An operation did not finish in time.
    #[error("{operation} timed out after {after:?}")]
    Timeout {
        /// What was being done (`"lock"`, `"request"`, ...).
        operation: &'static str,
        /// The limit that ran out.
        after: Duration,
    },

    /// etcd could not be reached or has no leader right now; retrying later may work.
    #[error("etcd unavailable: {0}")]
    Unavailable(String),

    /// The session (lease) under this operation is gone; everything bound to it
    /// (locks, leadership, keys put with its lease) is gone too.
    #[error("session lost: {0} (start a new session to continue)")]
    SessionLost(LossReason),

    /// The lock is no longer ours: its key was deleted or belongs to a newer holder.
    #[error("lock lost: our lock key is gone or no longer has our create revision")]
    LockLost,

    /// Leadership is no longer ours (or was never won).
    #[error("not leader: our election key is gone or no longer has our create revision")]
    NotLeader,

    /// This thread already holds the named lock or leadership on this session (through a
    /// guard it acquired): waiting for it would never end. Locks are not re-entrant; drop
    /// or unlock the guard first, or use another session.
    #[error(
        "this thread already holds {0:?} on this session; waiting for it would deadlock \
         (locks are not re-entrant)"
    )]
    WouldDeadlock(String),

    /// A caller passed a value this crate or etcd does not accept.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A blocking call was made on a thread that drives async tasks (a tokio worker, or
    /// inside `block_on`), where blocking would stall or deadlock the runtime. Calls from
    /// `tokio::task::spawn_blocking` threads and inside `block_in_place` are allowed.
    #[error(
        "blocking etcd-sync call made from inside an async runtime; call it from a plain \
         thread or wrap it in tokio::task::spawn_blocking"
    )]
    InsideAsyncRuntime,

    /// etcd rejected our user name or password (or auth is not enabled on the server).
    #[error("authentication failed: {0} (check the user name and password given to the client)")]
    Authentication(String),

    /// The client was shut down (its last handle dropped, or its runtime stopped).
    #[error("client closed")]
    Closed,

    /// etcd answered with an error status.
    #[error("etcd returned {code:?}: {message}")]
    Server {
        /// The gRPC status code.
        code: Code,
        /// etcd's message, e.g. `etcdserver: requested lease not found`.
        message: String,
    },
}

/// Why a [`Session`](crate::Session) ended.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let session = client.session()?;
/// session.close()?;
/// assert_eq!(session.loss_reason(), Some(etcd_sync::LossReason::Closed));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// [`Session::close`](crate::Session::close) was called (or the session was dropped).
    Closed,
    /// [`Session::orphan`](crate::Session::orphan) stopped the keep-alive.
    Orphaned,
    /// etcd says the lease does not exist: it was revoked, or it expired on the server.
    Revoked,
    /// No keep-alive was acknowledged in time: the lease may have expired on the server,
    /// so it is treated as gone (see [`Session::valid_until`](crate::Session::valid_until)).
    Expired,
    /// etcd rejected the keep-alive with an error that retrying cannot fix.
    KeepAliveFailed(String),
    /// The client was shut down.
    ClientClosed,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Closed => f.write_str("the session was closed"),
            LossReason::Orphaned => f.write_str("the session was orphaned"),
            LossReason::Revoked => f.write_str("etcd reports the lease revoked or expired"),
            LossReason::Expired => {
                f.write_str("no keep-alive was acknowledged before the lease deadline")
            }
            LossReason::KeepAliveFailed(msg) => write!(f, "keep-alive failed: {msg}"),
            LossReason::ClientClosed => f.write_str("the client was shut down"),
        }
    }
}

/// gRPC status codes, as etcd reports them in [`Error::Server`].
///
/// # Example
///
/// ```
/// use etcd_sync::Code;
/// assert_ne!(Code::NotFound, Code::Unavailable);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum Code {
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Error {
    /// True when etcd refused our auth token as invalid or outdated: authenticating again
    /// and retrying can succeed.
    pub(crate) fn is_auth_expired(&self) -> bool {
        match self {
            Error::Server { code, message } => {
                *code == Code::Unauthenticated
                    || message.contains("invalid auth token")
                    || message.contains("revision of auth store is old")
                    || message.contains("user name is empty")
            }
            _ => false,
        }
    }

    /// True when retrying the same request on another endpoint, or later, may succeed.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::Timeout { .. })
    }
}

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
