//! The questions a program asks an [`Error`] to decide what to do (`is_retryable`,
//! `is_lost`, `is_wait_timeout`, ...), and the crate's own narrower ones.

use super::Error;
use super::code::Code;
use super::cycle::Cycle;
use super::loss::LossReason;
#[cfg(doc)]
use super::operation::Operation;

impl Error {
    /// True when etcd refused our auth token as invalid or outdated: authenticating again
    /// and retrying can succeed.
    pub(crate) fn is_auth_expired(&self) -> bool {
        match self {
            Error::Server { code, message } => {
                *code == Code::Unauthenticated || crate::support::etcd_text::is_stale_token(message)
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
            if crate::support::etcd_text::is_refused_unhandled(reason))
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
    /// use etcd_sync::{Code, Error, Operation};
    /// let no_leader = Error::Unavailable {
    ///     endpoint: Some("http://127.0.0.1:2379".into()),
    ///     reason: "etcdserver: no leader".into(),
    ///     source: None,
    /// };
    /// assert!(no_leader.is_retryable());
    /// let slow = Error::Timeout {
    ///     operation: Operation::Request,
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
                if message.contains(crate::support::etcd_text::GRPC_TOO_LARGE)
        )
    }

    /// True when the limit given to a wait ran out: a [`Timeout`](Error::Timeout) whose
    /// [`operation`](Operation) is a wait ([`Operation::is_wait`]). The lock, permit or
    /// leadership stayed with others for the whole limit (or etcd was too slow to tell),
    /// or no leadership change came. False for a single request that etcd did not answer
    /// in time ([`Operation::Request`]), which [`is_timeout`](Error::is_timeout) also
    /// covers.
    ///
    /// # One rule for every limit
    ///
    /// **A blocking call whose time limit runs out returns `Err`, and
    /// `is_wait_timeout()` is true for that error.** This holds for every call that takes
    /// a limit, whether as a `Duration` or in [`WaitOptions`](crate::WaitOptions):
    ///
    /// * [`Mutex::lock_timeout`](crate::Mutex::lock_timeout) and `lock_with`:
    ///   [`Operation::Lock`];
    /// * [`RwLock::read_timeout`](crate::RwLock::read_timeout) and `read_with`:
    ///   [`Operation::Read`]; [`write_timeout`](crate::RwLock::write_timeout) and
    ///   `write_with`: [`Operation::Write`];
    /// * [`Semaphore::acquire_timeout`](crate::Semaphore::acquire_timeout) and
    ///   `acquire_with`: [`Operation::Acquire`];
    /// * [`Election::campaign_timeout`](crate::Election::campaign_timeout) and
    ///   `campaign_with`: [`Operation::Campaign`];
    /// * [`Observer::recv_timeout`](crate::Observer::recv_timeout) and `recv_with`:
    ///   [`Operation::Observe`];
    /// * [`Barrier::wait_timeout`](crate::Barrier::wait_timeout) and `wait_with`:
    ///   [`Operation::Barrier`];
    /// * [`DoubleBarrier::enter_timeout`](crate::DoubleBarrier::enter_timeout) and
    ///   `enter_with`: [`Operation::Enter`]; `leave_timeout` and `leave_with`:
    ///   [`Operation::Leave`];
    /// * [`CountDownLatch::wait_timeout`](crate::CountDownLatch::wait_timeout) and
    ///   `wait_with`: [`Operation::Latch`].
    ///
    /// It is the shape of std's
    /// [`Receiver::recv_timeout`](std::sync::mpsc::Receiver::recv_timeout)
    /// (`Err(RecvTimeoutError::Timeout)`): the success type says what the call was for (a
    /// guard, an event), never "maybe", and `?` passes a limit that ran out up like any
    /// other failure. Calls that do not wait keep their own shape: a `try_*` that finds the
    /// lock busy returns [`TryLockError::WouldBlock`](crate::TryLockError::WouldBlock), and
    /// [`Observer::try_recv`](crate::Observer::try_recv) returns `Ok(None)` when no change
    /// is ready, like a poll.
    ///
    /// ```
    /// use std::time::Duration;
    /// use etcd_sync::{Error, Operation};
    /// let busy = Error::Timeout {
    ///     operation: Operation::Lock,
    ///     after: Duration::from_secs(1),
    ///     endpoint: None,
    /// };
    /// assert!(busy.is_wait_timeout() && busy.is_timeout());
    /// let quiet = Error::Timeout {
    ///     operation: Operation::Observe,
    ///     after: Duration::from_secs(5),
    ///     endpoint: None,
    /// };
    /// assert!(quiet.is_wait_timeout());
    /// let slow = Error::Timeout {
    ///     operation: Operation::Request,
    ///     after: Duration::from_secs(5),
    ///     endpoint: Some("http://127.0.0.1:2379".into()),
    /// };
    /// assert!(!slow.is_wait_timeout() && slow.is_timeout());
    /// ```
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let observer = session.election("scheduler")?.observe()?;
    /// loop {
    ///     match observer.recv_timeout(Duration::from_secs(5)) {
    ///         Ok(event) => println!("{event:?}"),
    ///         Err(e) if e.is_wait_timeout() => break, // quiet for 5 s
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_wait_timeout(&self) -> bool {
        matches!(self, Error::Timeout { operation, .. } if operation.is_wait())
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

    /// True for [`Conflict`](Error::Conflict): a software transaction
    /// ([`StmBuilder::run`](crate::StmBuilder::run)) conflicted with other writers on every
    /// attempt its [`max_retries`](crate::StmBuilder::max_retries) bound allowed, and gave
    /// up with nothing committed. Not [`is_retryable`](Error::is_retryable), which is about
    /// etcd's availability: whether to run the transaction again is the caller's choice.
    ///
    /// ```
    /// use etcd_sync::Error;
    /// assert!(Error::Conflict { attempts: 4 }.is_conflict());
    /// assert!(!Error::Conflict { attempts: 4 }.is_retryable());
    /// assert!(!Error::LockLost.is_conflict());
    /// ```
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict { .. })
    }

    /// True for [`HandOverFailed`](Error::HandOverFailed): a hand-over of leadership did
    /// not happen, and the caller still leads.
    ///
    /// ```
    /// use etcd_sync::Error;
    /// let e = Error::HandOverFailed { to: "e/694d".into(), reason: "not waiting".into() };
    /// assert!(e.is_hand_over_failed());
    /// assert!(!e.is_retryable());
    /// assert!(!Error::NotLeader.is_hand_over_failed());
    /// ```
    pub fn is_hand_over_failed(&self) -> bool {
        matches!(self, Error::HandOverFailed { .. })
    }

    /// True for [`Deadlock`](Error::Deadlock): the wait would have completed a cycle of
    /// waits across sessions and was ended, its key removed, so that the others can go on
    /// (only with [`ClientBuilder::deadlock_detection`](crate::ClientBuilder::deadlock_detection)).
    /// Not [`is_retryable`](Error::is_retryable) as it is: the same wait would complete
    /// the same cycle; release what this session holds first.
    ///
    /// ```
    /// use etcd_sync::{Cycle, CycleStep, Error};
    /// let cycle = Cycle { steps: vec![
    ///     CycleStep { lease: 1, name: b"x".to_vec(), holder: 2, identity: None },
    ///     CycleStep { lease: 2, name: b"y".to_vec(), holder: 1, identity: None },
    /// ] };
    /// let e = Error::Deadlock { cycle, revision: 9 };
    /// assert!(e.is_deadlock() && !e.is_retryable() && !e.is_lost());
    /// assert!(!Error::LockLost.is_deadlock());
    /// ```
    pub fn is_deadlock(&self) -> bool {
        matches!(self, Error::Deadlock { .. })
    }

    /// The cycle a [`Deadlock`](Error::Deadlock) names: the sessions (leases, identities)
    /// and the names each waits for; `None` for any other error.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::builder()
    ///     .endpoints(["http://127.0.0.1:2379"])
    ///     .deadlock_detection("jobs/")
    ///     .connect()?;
    /// let session = client.session()?;
    /// let _x = session.mutex("jobs/x")?.lock()?;
    /// match session.mutex("jobs/y")?.lock() {
    ///     Ok(_y) => { /* both held */ }
    ///     Err(e) if e.is_deadlock() => {
    ///         for step in &e.deadlock_cycle().expect("a deadlock names its cycle").steps {
    ///             eprintln!("{:x} waits for {}", step.lease, step.name_str());
    ///         }
    ///     }
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn deadlock_cycle(&self) -> Option<&Cycle> {
        match self {
            Error::Deadlock { cycle, .. } => Some(cycle),
            _ => None,
        }
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

    /// True when a time limit ran out: one of ours ([`Timeout`](Error::Timeout): a request
    /// timeout, or the limit of a wait such as [`Mutex::lock_timeout`](crate::Mutex::lock_timeout)
    /// or [`Observer::recv_timeout`](crate::Observer::recv_timeout)), or etcd's own
    /// ([`Server`](Error::Server) with code `DeadlineExceeded`, `etcdserver: request timed
    /// out`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use etcd_sync::{Code, Error, Operation};
    /// let lock_timeout = Error::Timeout {
    ///     operation: Operation::Lock,
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
