//! The crate's error type.
//!
//! One [`Error`] enum for every fallible call, so callers can `match` on what happened
//! (a lost session, a timeout, an etcd that refused) instead of parsing strings.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What a failure at the transport level wraps: the error chain below it (the socket's
/// `io::Error`, a TLS or HTTP/2 error), shared so that [`Error`] stays `Clone`.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A `Result` whose error is this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong talking to etcd through this crate.
///
/// The enum is `#[non_exhaustive]`: later versions may add variants, so keep a `_` arm.
/// Each fallible method lists the variants it can return in its `# Errors` section.
///
/// # Branching
///
/// Rather than matching every variant, ask what a program usually needs to decide:
///
/// * [`is_retryable`](Error::is_retryable): the same call may succeed later or on
///   another endpoint (etcd unreachable, busy, or too slow);
/// * [`is_lost`](Error::is_lost): the lock or leadership is gone
///   ([`LockLost`](Error::LockLost), [`NotLeader`](Error::NotLeader) or
///   [`SessionLost`](Error::SessionLost)): stop the work it protected;
///   [`is_session_lost`](Error::is_session_lost) and [`loss_reason`](Error::loss_reason)
///   tell whether a new session is needed, and why;
/// * [`is_timeout`](Error::is_timeout), [`is_connect`](Error::is_connect),
///   [`is_invalid_argument`](Error::is_invalid_argument): a limit ran out, no etcd could be
///   reached at connect time, or the input was refused (and retrying it cannot help).
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let mutex = session.mutex("jobs/nightly")?;
/// let guard = loop {
///     match mutex.lock() {
///         Ok(guard) => break guard,
///         Err(e) if e.is_retryable() => std::thread::sleep(Duration::from_secs(1)),
///         Err(e) if e.is_session_lost() => {
///             eprintln!("session gone ({:?}): start a new one", e.loss_reason());
///             return Err(e);
///         }
///         Err(e) => return Err(e),
///     }
/// };
/// if let Err(e) = guard.put("jobs/nightly-state", "running") {
///     if e.is_lost() {
///         eprintln!("no longer the holder: stop");
///     }
/// }
/// # Ok(()) }
/// ```
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

    /// An operation did not finish in time: a request etcd did not answer within the
    /// request timeout (`operation` is `"etcd request"`, `endpoint` the member asked), or
    /// the limit given to a wait (`"lock"`, `"campaign"`;
    /// [`is_wait_timeout`](Error::is_wait_timeout) tells these apart).
    #[error("{operation} timed out after {after:?}{}", at(endpoint))]
    Timeout {
        /// What was being done (`"lock"`, `"campaign"`, `"etcd request"`, ...).
        operation: &'static str,
        /// The limit that ran out.
        after: Duration,
        /// The endpoint that did not answer, when one request timed out.
        endpoint: Option<String>,
    },

    /// etcd could not be reached, the connection broke, or the member has no leader right
    /// now; retrying later (or on another endpoint) may work.
    ///
    /// `source` is the chain below (the socket's `io::Error` with its OS error, a TLS
    /// or HTTP/2 error), reachable through [`std::error::Error::source`].
    #[error("etcd unavailable{}: {reason}", at(endpoint))]
    Unavailable {
        /// The endpoint that failed, when the failure belongs to one.
        endpoint: Option<String>,
        /// What happened, e.g. `connection refused` or `etcdserver: no leader`.
        reason: String,
        /// The error chain under it, if the failure came from the transport.
        #[source]
        source: Option<Cause>,
    },

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

    /// A [`CancelToken`](crate::CancelToken) given to the wait was cancelled. The wait left
    /// no key behind.
    #[error("the wait was cancelled")]
    Cancelled,

    /// etcd answered with an error status.
    #[error("etcd returned {code:?}: {message}")]
    Server {
        /// The gRPC status code.
        code: Code,
        /// etcd's message, e.g. `etcdserver: requested lease not found`.
        message: String,
    },
}

/// `" at <endpoint>"` when there is one, for the messages above.
fn at(endpoint: &Option<String>) -> String {
    endpoint
        .as_deref()
        .map_or_else(String::new, |e| format!(" at {e}"))
}

/// Operation names of the waits that take a time limit, so that
/// [`Error::is_wait_timeout`] and the code that builds the error agree.
pub(crate) mod wait {
    /// [`Mutex::lock_timeout`](crate::Mutex::lock_timeout).
    pub(crate) const LOCK: &str = "lock";
    /// [`Election::campaign_timeout`](crate::Election::campaign_timeout).
    pub(crate) const CAMPAIGN: &str = "campaign";
    /// [`RwLock::read_timeout`](crate::RwLock::read_timeout).
    pub(crate) const READ: &str = "read";
    /// [`RwLock::write_timeout`](crate::RwLock::write_timeout).
    pub(crate) const WRITE: &str = "write";
    /// [`Semaphore::acquire_timeout`](crate::Semaphore::acquire_timeout).
    pub(crate) const ACQUIRE: &str = "acquire";
    /// Every wait with a limit.
    pub(crate) const ALL: [&str; 5] = [LOCK, CAMPAIGN, READ, WRITE, ACQUIRE];
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
    /// No keep-alive was acknowledged in time (etcd unreachable, or refusing every
    /// keep-alive): the lease may have expired on the server,
    /// so it is treated as gone (see [`Session::valid_until`](crate::Session::valid_until)).
    Expired,
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
                *code == Code::Unauthenticated || crate::etcd_text::is_stale_token(message)
            }
            _ => false,
        }
    }

    /// True when retrying the same request on another endpoint, or later, may succeed.
    ///
    /// Narrower than [`Error::is_retryable`] on purpose: the crate's own retry loops
    /// (failover, enqueue, release, observer reads) retry only a failed or silent
    /// connection, never an answer etcd gave (`Server` with any code), so a request etcd
    /// refused is reported to the caller instead of being repeated in a loop.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Timeout { .. })
    }

    /// True when every member refused the request before handling it: none had a leader
    /// (an election), or only learners were reached. Unlike a timeout or a broken
    /// connection this is not ambiguous: the request was not applied and never will be,
    /// so even a write may be sent again, as often as it takes.
    pub(crate) fn is_refused_unhandled(&self) -> bool {
        matches!(self, Error::Unavailable { reason, .. }
            if crate::etcd_text::is_refused_unhandled(reason))
    }

    /// True when the same call may succeed if tried again later or on another endpoint:
    /// etcd was unreachable or without a leader ([`Unavailable`](Error::Unavailable)), too
    /// slow ([`Timeout`](Error::Timeout)), or answered with a passing condition
    /// ([`Server`](Error::Server) with code `Unavailable`, `DeadlineExceeded`,
    /// `ResourceExhausted` or `Aborted`). One `ResourceExhausted` is not passing: gRPC's
    /// `received message larger than max`, a request above etcd's size limit, which
    /// [`is_invalid_argument`](Error::is_invalid_argument) reports instead.
    ///
    /// A retried plain write (`put`, `delete`, `txn`) may apply twice: after a `Timeout` or
    /// `Unavailable` the first attempt may or may not have been applied. A `Timeout` of
    /// [`Mutex::lock_timeout`](crate::Mutex::lock_timeout) is retryable too: the lock may
    /// be free later.
    ///
    /// ```
    /// use std::time::Duration;
    /// use etcd_sync::{Code, Error};
    /// let no_leader = Error::Unavailable {
    ///     endpoint: Some("http://127.0.0.1:2379".into()),
    ///     reason: "etcdserver: no leader".into(),
    ///     source: None,
    /// };
    /// assert!(no_leader.is_retryable());
    /// let slow = Error::Timeout {
    ///     operation: "etcd request",
    ///     after: Duration::from_secs(5),
    ///     endpoint: Some("http://127.0.0.1:2379".into()),
    /// };
    /// assert!(slow.is_retryable());
    /// let busy = Error::Server {
    ///     code: Code::ResourceExhausted,
    ///     message: "etcdserver: too many requests".into(),
    /// };
    /// assert!(busy.is_retryable());
    /// let huge = Error::Server {
    ///     code: Code::ResourceExhausted,
    ///     message: "grpc: received message larger than max (2600008 vs. 2097152)".into(),
    /// };
    /// assert!(!huge.is_retryable() && huge.is_invalid_argument());
    /// let denied = Error::Server {
    ///     code: Code::PermissionDenied,
    ///     message: "etcdserver: permission denied".into(),
    /// };
    /// assert!(!denied.is_retryable());
    /// assert!(!Error::LockLost.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unavailable { .. } | Error::Timeout { .. } => true,
            Error::Server { code, .. } => {
                matches!(
                    code,
                    Code::Unavailable
                        | Code::DeadlineExceeded
                        | Code::ResourceExhausted
                        | Code::Aborted
                ) && !self.is_too_large_for_grpc()
            }
            _ => false,
        }
    }

    /// gRPC refused the request for its size before etcd saw it (etcd accepts messages up
    /// to `--max-request-bytes` + 512 KiB; etcd's own "request is too large" is
    /// `InvalidArgument`).
    fn is_too_large_for_grpc(&self) -> bool {
        matches!(
            self,
            Error::Server { code: Code::ResourceExhausted, message }
                if message.contains(crate::etcd_text::GRPC_TOO_LARGE)
        )
    }

    /// True when the limit given to a wait ran out ([`Timeout`](Error::Timeout) of
    /// [`Mutex::lock_timeout`](crate::Mutex::lock_timeout) or
    /// [`Election::campaign_timeout`](crate::Election::campaign_timeout)): the lock or
    /// leadership stayed with others for the whole limit, or etcd was too slow to tell.
    /// False for a single request that etcd did not answer in time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use etcd_sync::Error;
    /// let busy = Error::Timeout { operation: "lock", after: Duration::from_secs(1), endpoint: None };
    /// assert!(busy.is_wait_timeout() && busy.is_timeout());
    /// let slow = Error::Timeout {
    ///     operation: "etcd request",
    ///     after: Duration::from_secs(5),
    ///     endpoint: Some("http://127.0.0.1:2379".into()),
    /// };
    /// assert!(!slow.is_wait_timeout() && slow.is_timeout());
    /// ```
    pub fn is_wait_timeout(&self) -> bool {
        matches!(self, Error::Timeout { operation, .. } if wait::ALL.contains(operation))
    }

    /// True for [`Cancelled`](Error::Cancelled): a [`CancelToken`](crate::CancelToken)
    /// ended the wait.
    ///
    /// ```
    /// assert!(etcd_sync::Error::Cancelled.is_cancelled());
    /// assert!(!etcd_sync::Error::LockLost.is_cancelled());
    /// ```
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Error::Cancelled)
    }

    /// The etcd endpoint the error belongs to, when it belongs to one: the member that
    /// did not answer or whose connection broke ([`Unavailable`](Error::Unavailable),
    /// [`Timeout`](Error::Timeout) of a request), or that refused our certificate
    /// ([`ClientCertificateRejected`](Error::ClientCertificateRejected)).
    ///
    /// ```
    /// use etcd_sync::Error;
    /// let refused = Error::Unavailable {
    ///     endpoint: Some("http://127.0.0.1:2379".into()),
    ///     reason: "connection refused".into(),
    ///     source: None,
    /// };
    /// assert_eq!(refused.endpoint(), Some("http://127.0.0.1:2379"));
    /// assert_eq!(Error::LockLost.endpoint(), None);
    /// ```
    pub fn endpoint(&self) -> Option<&str> {
        match self {
            Error::Unavailable { endpoint, .. } | Error::Timeout { endpoint, .. } => {
                endpoint.as_deref()
            }
            Error::ClientCertificateRejected { endpoint, .. } => Some(endpoint),
            _ => None,
        }
    }

    /// An [`Unavailable`](Error::Unavailable) error that belongs to no endpoint.
    pub(crate) fn unavailable(reason: impl Into<String>) -> Error {
        Error::Unavailable {
            endpoint: None,
            reason: reason.into(),
            source: None,
        }
    }

    /// A wait that ran out of its limit (`operation` is one of [`wait::ALL`]).
    pub(crate) fn wait_timeout(operation: &'static str, after: Duration) -> Error {
        debug_assert!(wait::ALL.contains(&operation), "{operation}");
        Error::Timeout {
            operation,
            after,
            endpoint: None,
        }
    }

    /// True when a time limit ran out: one of ours ([`Timeout`](Error::Timeout): a request
    /// timeout, or the limit of [`Mutex::lock_timeout`](crate::Mutex::lock_timeout) /
    /// [`Election::campaign_timeout`](crate::Election::campaign_timeout)), or etcd's own
    /// ([`Server`](Error::Server) with code `DeadlineExceeded`, `etcdserver: request timed
    /// out`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use etcd_sync::{Code, Error};
    /// let lock_timeout = Error::Timeout {
    ///     operation: "lock",
    ///     after: Duration::from_secs(1),
    ///     endpoint: None,
    /// };
    /// assert!(lock_timeout.is_timeout());
    /// let etcd_timeout = Error::Server {
    ///     code: Code::DeadlineExceeded,
    ///     message: "etcdserver: request timed out".into(),
    /// };
    /// assert!(etcd_timeout.is_timeout());
    /// let refused = Error::Unavailable {
    ///     endpoint: Some("http://127.0.0.1:2379".into()),
    ///     reason: "connection refused".into(),
    ///     source: None,
    /// };
    /// assert!(!refused.is_timeout());
    /// ```
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. }
                | Error::Server {
                    code: Code::DeadlineExceeded,
                    ..
                }
        )
    }

    /// True when the session under the call is gone ([`SessionLost`](Error::SessionLost)):
    /// every lock and leadership on it is gone too, and nothing built on it works again.
    /// Start a new session; [`loss_reason`](Error::loss_reason) says why it ended.
    ///
    /// ```
    /// use etcd_sync::{Error, LossReason};
    /// assert!(Error::SessionLost(LossReason::Expired).is_session_lost());
    /// assert!(!Error::LockLost.is_session_lost());
    /// ```
    pub fn is_session_lost(&self) -> bool {
        matches!(self, Error::SessionLost(_))
    }

    /// True when the lock or leadership the call was about is gone: our key was deleted or
    /// replaced ([`LockLost`](Error::LockLost), [`NotLeader`](Error::NotLeader)), or the
    /// session under it ended ([`SessionLost`](Error::SessionLost)). Work that the lock or
    /// leadership protected must stop; retrying the same call cannot bring it back.
    ///
    /// ```
    /// use etcd_sync::{Error, LossReason};
    /// assert!(Error::LockLost.is_lost());
    /// assert!(Error::NotLeader.is_lost());
    /// assert!(Error::SessionLost(LossReason::Revoked).is_lost());
    /// let no_leader = Error::Unavailable {
    ///     endpoint: None,
    ///     reason: "etcdserver: no leader".into(),
    ///     source: None,
    /// };
    /// assert!(!no_leader.is_lost());
    /// ```
    pub fn is_lost(&self) -> bool {
        matches!(
            self,
            Error::LockLost | Error::NotLeader | Error::SessionLost(_)
        )
    }

    /// True when connecting failed: no endpoint answered ([`Connect`](Error::Connect)), or
    /// etcd refused the connection for want of a trusted client certificate
    /// ([`ClientCertificateRejected`](Error::ClientCertificateRejected)). Returned by
    /// [`ClientBuilder::connect`](crate::ClientBuilder::connect) only; later calls report
    /// an unreachable etcd as [`Unavailable`](Error::Unavailable) or
    /// [`Timeout`](Error::Timeout).
    ///
    /// ```
    /// use etcd_sync::Error;
    /// let e = Error::Connect {
    ///     endpoints: "http://127.0.0.1:2379".into(),
    ///     reason: "connection refused".into(),
    /// };
    /// assert!(e.is_connect());
    /// let refused = Error::Unavailable {
    ///     endpoint: Some("http://127.0.0.1:2379".into()),
    ///     reason: "connection refused".into(),
    ///     source: None,
    /// };
    /// assert!(!refused.is_connect());
    /// ```
    pub fn is_connect(&self) -> bool {
        matches!(
            self,
            Error::Connect { .. } | Error::ClientCertificateRejected { .. }
        )
    }

    /// True when an argument was refused: by this crate before anything was sent
    /// ([`InvalidArgument`](Error::InvalidArgument): an empty key or name, a bad endpoint, a
    /// TTL or timeout out of range...), or by etcd ([`Server`](Error::Server) with code
    /// `InvalidArgument`, e.g. `etcdserver: request is too large` or `etcdserver: duplicate
    /// key given in txn request`, or gRPC's `ResourceExhausted` `received message larger
    /// than max` for a request far above etcd's size limit). Retrying the same call cannot
    /// succeed.
    ///
    /// ```
    /// use etcd_sync::{Code, Error};
    /// assert!(Error::InvalidArgument("empty key".into()).is_invalid_argument());
    /// let too_large = Error::Server {
    ///     code: Code::InvalidArgument,
    ///     message: "etcdserver: request is too large".into(),
    /// };
    /// assert!(too_large.is_invalid_argument());
    /// assert!(!Error::LockLost.is_invalid_argument());
    /// ```
    pub fn is_invalid_argument(&self) -> bool {
        matches!(
            self,
            Error::InvalidArgument(_)
                | Error::Server {
                    code: Code::InvalidArgument,
                    ..
                }
        ) || self.is_too_large_for_grpc()
    }

    /// Why the session ended, for a [`SessionLost`](Error::SessionLost) error; `None` for
    /// every other error.
    ///
    /// ```
    /// use etcd_sync::{Error, LossReason};
    /// let e = Error::SessionLost(LossReason::Revoked);
    /// assert_eq!(e.loss_reason(), Some(&LossReason::Revoked));
    /// assert_eq!(Error::LockLost.loss_reason(), None);
    /// ```
    pub fn loss_reason(&self) -> Option<&LossReason> {
        match self {
            Error::SessionLost(reason) => Some(reason),
            _ => None,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: Code) -> Error {
        Error::Server {
            code,
            message: format!("etcdserver: {code:?}"),
        }
    }

    /// A request the member did not answer in time.
    fn slow_request() -> Error {
        Error::Timeout {
            operation: "etcd request",
            after: Duration::from_secs(5),
            endpoint: Some("http://127.0.0.1:2379".into()),
        }
    }

    /// A `lock_timeout` limit that ran out.
    fn lock_wait_ran_out() -> Error {
        Error::wait_timeout(wait::LOCK, Duration::from_secs(1))
    }

    /// One error of every variant (and a `Server` error of every code).
    fn every_error() -> Vec<Error> {
        let mut errors = vec![
            Error::Connect {
                endpoints: "http://127.0.0.1:2379".into(),
                reason: "connection refused".into(),
            },
            Error::ClientCertificateRejected {
                endpoint: "https://127.0.0.1:2379".into(),
                detail: "TLS alert CertificateRequired".into(),
            },
            slow_request(),
            lock_wait_ran_out(),
            Error::unavailable("etcdserver: no leader"),
            Error::SessionLost(LossReason::Expired),
            Error::LockLost,
            Error::NotLeader,
            Error::WouldDeadlock("m".into()),
            Error::InvalidArgument("empty key".into()),
            Error::InsideAsyncRuntime,
            Error::Authentication("etcdserver: authentication failed".into()),
            Error::Closed,
        ];
        errors.extend(
            [
                Code::Ok,
                Code::Cancelled,
                Code::Unknown,
                Code::InvalidArgument,
                Code::DeadlineExceeded,
                Code::NotFound,
                Code::AlreadyExists,
                Code::PermissionDenied,
                Code::ResourceExhausted,
                Code::FailedPrecondition,
                Code::Aborted,
                Code::OutOfRange,
                Code::Unimplemented,
                Code::Internal,
                Code::Unavailable,
                Code::DataLoss,
                Code::Unauthenticated,
            ]
            .into_iter()
            .map(server),
        );
        errors
    }

    /// The errors for which `predicate` holds, by their `Debug` text.
    fn which(predicate: fn(&Error) -> bool) -> Vec<String> {
        every_error()
            .iter()
            .filter(|e| predicate(e))
            .map(|e| format!("{e:?}"))
            .collect()
    }

    fn debug(errors: &[Error]) -> Vec<String> {
        errors.iter().map(|e| format!("{e:?}")).collect()
    }

    #[test]
    fn retryable_means_unreachable_busy_or_slow() {
        assert_eq!(
            which(Error::is_retryable),
            debug(&[
                slow_request(),
                lock_wait_ran_out(),
                Error::unavailable("etcdserver: no leader"),
                server(Code::DeadlineExceeded),
                server(Code::ResourceExhausted),
                server(Code::Aborted),
                server(Code::Unavailable),
            ])
        );
    }

    #[test]
    fn transient_keeps_its_narrower_meaning() {
        // The crate's own retry loops never repeat a request etcd answered.
        assert_eq!(
            which(Error::is_transient),
            debug(&[
                slow_request(),
                lock_wait_ran_out(),
                Error::unavailable("etcdserver: no leader"),
            ])
        );
        for e in every_error() {
            assert!(!e.is_transient() || e.is_retryable(), "{e:?}");
        }
    }

    #[test]
    fn timeout_is_ours_or_etcds() {
        assert_eq!(
            which(Error::is_timeout),
            debug(&[
                slow_request(),
                lock_wait_ran_out(),
                server(Code::DeadlineExceeded),
            ])
        );
    }

    #[test]
    fn wait_timeout_is_only_a_wait_running_out() {
        assert_eq!(which(Error::is_wait_timeout), debug(&[lock_wait_ran_out()]));
        for operation in wait::ALL {
            let e = Error::wait_timeout(operation, Duration::from_secs(1));
            assert!(e.is_wait_timeout() && e.is_timeout() && e.endpoint().is_none());
        }
    }

    #[test]
    fn transport_errors_name_their_endpoint() {
        let e = Error::Unavailable {
            endpoint: Some("http://127.0.0.1:2379".into()),
            reason: "tcp connect error: Connection refused (os error 111)".into(),
            source: None,
        };
        assert_eq!(
            e.to_string(),
            "etcd unavailable at http://127.0.0.1:2379: tcp connect error: \
             Connection refused (os error 111)"
        );
        let slow = Error::Timeout {
            operation: "etcd request",
            after: Duration::from_secs(5),
            endpoint: Some("http://127.0.0.1:2379".into()),
        };
        assert_eq!(
            slow.to_string(),
            "etcd request timed out after 5s at http://127.0.0.1:2379"
        );
        assert_eq!(slow.endpoint(), Some("http://127.0.0.1:2379"));
    }

    #[test]
    fn session_lost_and_its_reason() {
        assert_eq!(
            which(Error::is_session_lost),
            debug(&[Error::SessionLost(LossReason::Expired)])
        );
        for reason in [
            LossReason::Closed,
            LossReason::Orphaned,
            LossReason::Revoked,
            LossReason::Expired,
            LossReason::ClientClosed,
        ] {
            let e = Error::SessionLost(reason.clone());
            assert!(e.is_session_lost() && e.is_lost());
            assert_eq!(e.loss_reason(), Some(&reason));
        }
        for e in every_error() {
            assert_eq!(e.loss_reason().is_some(), e.is_session_lost(), "{e:?}");
        }
    }

    #[test]
    fn lost_is_lock_leadership_or_session() {
        assert_eq!(
            which(Error::is_lost),
            debug(&[
                Error::SessionLost(LossReason::Expired),
                Error::LockLost,
                Error::NotLeader,
            ])
        );
    }

    #[test]
    fn connect_is_only_about_connecting() {
        assert_eq!(
            which(Error::is_connect),
            debug(&[
                Error::Connect {
                    endpoints: "http://127.0.0.1:2379".into(),
                    reason: "connection refused".into(),
                },
                Error::ClientCertificateRejected {
                    endpoint: "https://127.0.0.1:2379".into(),
                    detail: "TLS alert CertificateRequired".into(),
                },
            ])
        );
    }

    #[test]
    fn invalid_argument_is_ours_or_etcds() {
        assert_eq!(
            which(Error::is_invalid_argument),
            debug(&[
                Error::InvalidArgument("empty key".into()),
                server(Code::InvalidArgument),
            ])
        );
    }

    #[test]
    fn a_request_too_large_for_grpc_is_not_retryable() {
        // What etcd's gRPC server answers for a message above --max-request-bytes + 512 KiB
        // (seen with a 2.6 MB put against etcd 3.4's defaults).
        let huge = Error::Server {
            code: Code::ResourceExhausted,
            message: "grpc: received message larger than max (2600008 vs. 2097152)".into(),
        };
        assert!(!huge.is_retryable());
        assert!(huge.is_invalid_argument());
        let busy = Error::Server {
            code: Code::ResourceExhausted,
            message: "etcdserver: too many requests".into(),
        };
        assert!(busy.is_retryable());
        assert!(!busy.is_invalid_argument());
    }

    #[test]
    fn no_error_is_both_lost_and_retryable() {
        // A program that retries retryable errors never retries a loss.
        for e in every_error() {
            assert!(!(e.is_lost() && e.is_retryable()), "{e:?}");
            assert!(!(e.is_invalid_argument() && e.is_retryable()), "{e:?}");
        }
    }
}
