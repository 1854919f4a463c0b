//! The crate's error type.
//!
//! One [`Error`] enum for every fallible call, so callers can `match` on what happened
//! (a lost session, a timeout, an etcd that refused) instead of parsing strings.
//!
//! | module          | holds                                                           |
//! |-----------------|-----------------------------------------------------------------|
//! | this one        | [`Error`], [`Result`], [`Cause`] and the crate's constructors   |
//! | `predicates.rs` | the `is_*` questions, [`Error::endpoint`], [`Error::loss_reason`] |
//! | `operation.rs`  | [`Operation`]: what a [`Error::Timeout`] was doing              |
//! | `loss.rs`       | [`LossReason`]: why a session ended                             |
//! | `code.rs`       | [`Code`]: gRPC status codes of [`Error::Server`]                |
//! | `try_lock.rs`   | [`TryLockError`]: the error of `try_*` calls                    |
//! | `cycle.rs`      | [`Cycle`]: what a [`Error::Deadlock`] names                     |

use std::sync::Arc;
use std::time::Duration;

pub(crate) mod code;
pub(crate) mod cycle;
pub(crate) mod loss;
pub(crate) mod operation;
mod predicates;
#[cfg(test)]
mod tests;
pub(crate) mod try_lock;

use code::Code;
use cycle::Cycle;
use loss::LossReason;
use operation::Operation;
#[cfg(doc)]
use try_lock::TryLockError;

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
/// * [`is_wait_timeout`](Error::is_wait_timeout): the time limit given to a wait ran out
///   (every blocking call with a limit reports it this way, `Observer::recv_timeout`
///   included); its documentation states the rule;
/// * [`is_conflict`](Error::is_conflict): a software transaction gave up after its bound
///   on retries ([`Conflict`](Error::Conflict));
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
        /// Why the last attempt failed, with what to check: which it met of a DNS lookup
        /// that failed (`DNS lookup of "host" failed`), a refused connection (`connection
        /// refused, nothing listens there`), a failed TLS handshake (`TLS handshake
        /// failed`), a server that does not speak etcd's gRPC (an HTTP/1 server, another
        /// service, etcd's peer port), a server certificate we do not trust, no answer in
        /// time, or etcd's own answer (a learner).
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
    /// request timeout (`operation` is [`Operation::Request`], `endpoint` the member
    /// asked), or the limit given to a wait ([`Operation::Lock`],
    /// [`Operation::Campaign`], [`Operation::Observe`], ...;
    /// [`is_wait_timeout`](Error::is_wait_timeout) tells these apart).
    #[error("{operation} timed out after {}{}", written(after), at(endpoint))]
    Timeout {
        /// What was being done; [`Operation::is_wait`] tells a wait's own limit from a
        /// request timeout.
        operation: Operation,
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
    /// or release the guard first, or use another session.
    #[error(
        "this thread already holds {0:?} on this session; waiting for it would deadlock \
         (locks are not re-entrant)"
    )]
    WouldDeadlock(String),

    /// This wait would have completed a cycle of waits across sessions (a deadlock: this
    /// session holds x and waits for y, another holds y and waits for x), and it was the
    /// one chosen to end so that the others can go on: of the cycle's waits, the one whose
    /// key is youngest (highest create revision). Only with
    /// [`ClientBuilder::deadlock_detection`](crate::ClientBuilder::deadlock_detection) on,
    /// for a name under its prefix. The wait left no key behind, as a timed-out wait;
    /// what this session already holds it still holds: release something (typically
    /// everything) and try again. [`is_deadlock`](Error::is_deadlock) asks for it,
    /// [`deadlock_cycle`](Error::deadlock_cycle) gives the cycle.
    #[error(
        "deadlock: this wait would complete a cycle of waits (as of revision {revision}: \
         {cycle}); it was ended and its key removed so that the others can go on"
    )]
    Deadlock {
        /// The cycle, as the wait graph read at `revision` showed it.
        cycle: Cycle,
        /// The store revision of that read: the cycle existed there.
        revision: i64,
    },

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

    /// A software transaction ([`StmBuilder::run`](crate::StmBuilder::run),
    /// [`Client::stm`](crate::Client::stm)) met a conflict on every attempt its retry bound
    /// allowed ([`StmBuilder::max_retries`](crate::StmBuilder::max_retries)): other writers
    /// kept changing what it read. Nothing of it was committed; running it again later may
    /// succeed. [`is_conflict`](Error::is_conflict) asks for it.
    #[error(
        "transaction gave up after {attempts} attempts, each in conflict with another writer \
         (the bound set with StmBuilder::max_retries); nothing was committed"
    )]
    Conflict {
        /// How many times the closure ran and its commit failed (the bound plus one).
        attempts: u32,
    },

    /// A [`Leadership::hand_over`](crate::Leadership::hand_over) did not happen, and we
    /// **still lead** (the guard stays valid): the candidate named was not waiting behind
    /// us, its session ended, it did not take the hand-over within the call's limit (a
    /// candidate of another client, such as Go's `Election` or `etcdctl elect`, never
    /// does), or another hand-over to it was under way.
    /// [`is_hand_over_failed`](Error::is_hand_over_failed) asks for it.
    #[error("leadership not handed over to {to}: {reason}; we still lead")]
    HandOverFailed {
        /// The candidate's key, or what the caller named it by if no key matched.
        to: String,
        /// What happened.
        reason: String,
    },

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
/// A limit as a user writes it: `0s`, not `0ns`; otherwise as `Duration`'s `Debug`
/// (`1.5s`, `250ms`).
fn written(limit: &Duration) -> String {
    if limit.is_zero() {
        "0s".to_string()
    } else {
        format!("{limit:?}")
    }
}

fn at(endpoint: &Option<String>) -> String {
    endpoint
        .as_deref()
        .map_or_else(String::new, |e| format!(" at {e}"))
}

impl Error {
    /// An [`Unavailable`](Error::Unavailable) error that belongs to no endpoint.
    pub(crate) fn unavailable(reason: impl Into<String>) -> Error {
        Error::Unavailable {
            endpoint: None,
            reason: reason.into(),
            source: None,
        }
    }

    /// A wait that ran out of its limit `after` (`operation` is a wait:
    /// [`Operation::is_wait`]).
    pub(crate) fn wait_timeout(operation: Operation, after: Duration) -> Error {
        debug_assert!(operation.is_wait(), "{operation:?}");
        Error::Timeout {
            operation,
            after,
            endpoint: None,
        }
    }
}
