//! Sessions: an etcd lease kept alive by the client's keep-alive thread, and the signal
//! that tells everything built on it (locks, leadership) when it is gone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::client::Client;
use crate::client::lease::{LeaseState, safety_margin};
use crate::support::error::code::Code;
use crate::support::error::loss::LossReason;
use crate::support::error::{Error, Result};
use crate::support::identity;
use crate::support::kv::LeaseHex;

/// Default session TTL: **60 seconds**, as in etcd's Go `concurrency` package.
///
/// It is also how long a crashed (SIGKILLed, powered-off) holder blocks everyone else:
/// nobody can release its locks until etcd expires the lease. A process that exits
/// normally, or on Ctrl-C with a handler that drops or [`close`](Session::close)s its
/// session, releases at once. Choose a shorter TTL with
/// [`SessionBuilder::ttl`] if a crashed holder may not block for a minute.
///
/// ```
/// assert_eq!(etcd_sync::DEFAULT_TTL, std::time::Duration::from_secs(60));
/// ```
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);

/// The largest TTL etcd accepts (`MaxLeaseTTL`, 9,000,000,000 s).
pub const MAX_TTL: Duration = Duration::from_secs(9_000_000_000);

// Sessions are built on a client, so the constructors live here, with what they construct:
// the client module does not know sessions (arrows run one way).
impl Client {
    /// Starts a session with the default TTL (60 s).
    ///
    /// # Errors
    ///
    /// As [`SessionBuilder::start`]: [`Error::Timeout`] / [`Error::Unavailable`] if etcd
    /// cannot be reached (the grant is retried on every endpoint first),
    /// [`Error::Server`] / [`Error::Authentication`] if etcd refuses the grant, and
    /// [`Error::InsideAsyncRuntime`] on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let session = client.session()?;
    /// assert!(session.is_alive());
    /// # Ok(()) }
    /// ```
    pub fn session(&self) -> Result<Session> {
        self.session_builder().start()
    }

    /// A builder for a session with a chosen TTL, or resuming an existing lease.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let session = client.session_builder().ttl(std::time::Duration::from_secs(10)).start()?;
    /// # let _ = session;
    /// # Ok(()) }
    /// ```
    pub fn session_builder(&self) -> SessionBuilder {
        SessionBuilder::new(self.clone())
    }
}

/// An etcd lease kept alive in the background: the lifetime that locks and leadership
/// built on it share. Go's `concurrency.Session`, Rust-shaped.
///
/// Handles are cheap to clone and share one lease. When the last handle (including those
/// held by mutexes, elections and guards) is dropped, the lease is revoked in the
/// background, so everything bound to it is released at once; [`close`](Session::close)
/// does the same and reports the outcome.
///
/// # Loss
///
/// The keep-alive thread renews the lease every TTL/3. The session counts as lost from
/// [`valid_until`](Session::valid_until) on: the send time of the last keep-alive etcd
/// acknowledged, plus the TTL it granted, minus a safety margin (10 % of the TTL, between
/// 100 ms and 1 s). Because etcd starts the TTL when it *processes* the request, this is
/// never later than the server-side expiry. A lost session stays lost.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let session = client.session_builder().ttl(Duration::from_secs(10)).start()?;
/// println!("lease {:x}, ttl {:?}", session.lease_id(), session.ttl());
/// let lost = session.lost();
/// std::thread::spawn(move || {
///     let _ = lost.recv(); // returns (with an error) once the lease is gone
///     eprintln!("session lost: stop work that needs it");
/// });
/// session.close()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

pub(crate) struct SessionInner {
    pub(crate) client: Client,
    pub(crate) lease: Arc<LeaseState>,
    /// Stored as the value of every lock key this session takes.
    identity: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease_id", &LeaseHex(self.lease_id()))
            .field("identity", &self.identity())
            .field("ttl", &self.ttl())
            .field("loss_reason", &self.loss_reason())
            .finish()
    }
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        // Best effort, never blocking: revoke in the background so keys go now, not at TTL.
        if self.lease.mark_lost(LossReason::Closed) {
            let rpc = self.client.rpc().clone();
            let id = self.lease.id();
            self.client.spawn(async move {
                let _ = rpc.lease_revoke(id).await;
            });
        }
    }
}

impl Session {
    pub(crate) fn lease(&self) -> &Arc<LeaseState> {
        &self.inner.lease
    }

    /// The client this session belongs to.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let client = session.client();
    /// client.put("k", "v")?;
    /// # Ok(()) }
    /// ```
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The lease ID. Keys of this session are named `<name>/<lease id in lowercase hex>`.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// println!("my lock key would be jobs/{:x}", session.lease_id());
    /// # Ok(()) }
    /// ```
    pub fn lease_id(&self) -> i64 {
        self.inner.lease.id()
    }

    /// Who this session is, for people reading the line: the value stored under every
    /// lock key it takes (a [`Mutex`](crate::Mutex), either side of an
    /// [`RwLock`](crate::RwLock), a [`Semaphore`](crate::Semaphore) permit), shown by
    /// [`Client::status`] and `etcd-sync status`. `"<hostname>:<pid>"` unless set with
    /// [`SessionBuilder::identity`]. Election keys hold the campaign value instead.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let session = client.session_builder().identity("billing-worker-3").start()?;
    /// assert_eq!(session.identity(), "billing-worker-3");
    /// # Ok(()) }
    /// ```
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// The TTL etcd granted (etcd raises TTLs below its minimum, 2 s by default).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let s = client.session_builder().ttl(std::time::Duration::from_secs(1)).start()?;
    /// assert!(s.ttl() >= std::time::Duration::from_secs(1));
    /// # Ok(()) }
    /// ```
    pub fn ttl(&self) -> Duration {
        self.inner.lease.ttl()
    }

    /// Whether the lease is still trusted to be alive (checked against the deadline now).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert!(session.is_alive());
    /// session.orphan();
    /// assert!(!session.is_alive());
    /// # Ok(()) }
    /// ```
    pub fn is_alive(&self) -> bool {
        self.inner.lease.loss_reason().is_none()
    }

    /// Why the session ended, or `None` while it is alive.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// if let Some(reason) = session.loss_reason() {
    ///     eprintln!("session gone: {reason}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.inner.lease.loss_reason()
    }

    /// A channel that becomes ready when the session is lost: nothing is ever sent on it;
    /// it disconnects, so `recv()` returns `Err(RecvError)` and `select!` fires. Use it in
    /// `crossbeam_channel::select!` next to your own channels.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let lost = session.lost();
    /// assert!(lost.try_recv().is_err()); // empty while alive
    /// session.orphan();
    /// assert!(lost.recv().is_err()); // ready (disconnected) once lost
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> Receiver<()> {
        // Make sure an already-passed deadline is reflected in the channel.
        let _ = self.inner.lease.loss_reason();
        self.inner.lease.lost_receiver()
    }

    /// The instant (monotonic clock) until which the lease is known to be alive, or `None`
    /// once the session is lost. It moves forward with every acknowledged keep-alive.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// if let Some(until) = session.valid_until() {
    ///     println!("safe for another {:?}", until - std::time::Instant::now());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn valid_until(&self) -> Option<Instant> {
        if self.inner.lease.loss_reason().is_some() {
            return None;
        }
        Some(self.inner.lease.deadline())
    }

    /// How long the lease is known to stay alive from now (zero once lost).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert!(session.remaining() > std::time::Duration::ZERO);
    /// # Ok(()) }
    /// ```
    pub fn remaining(&self) -> Duration {
        self.valid_until().map_or(Duration::ZERO, |until| {
            until.saturating_duration_since(crate::support::clock::now())
        })
    }

    /// Stops the keep-alive and revokes the lease, so every key bound to it (locks,
    /// leadership) is deleted now. Bounded by the client's request timeout (per endpoint
    /// tried).
    ///
    /// Closing again is fine: a session this process closed stays closed, and `close()`
    /// sends the revoke once more, so a close that failed with a retryable error can simply
    /// be repeated. A session that was lost before `close()` (its lease revoked elsewhere,
    /// expired, orphaned, ...) is reported as such instead of `Ok`, so a program learns that
    /// what it held ended earlier than it meant to.
    ///
    /// # Errors
    ///
    /// * [`Error::SessionLost`] with the [`LossReason`] if the session had been lost before
    ///   (any reason but [`LossReason::Closed`]). For [`Expired`](LossReason::Expired) the
    ///   lease may still exist on the server, so the revoke is still sent (best effort)
    ///   before returning; a
    ///   [`Revoked`](LossReason::Revoked) lease is gone already, and an
    ///   [`Orphaned`](LossReason::Orphaned) one is left alone (another session may have
    ///   resumed it).
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: the revoke was not confirmed. The
    ///   session is closed here all the same (its keys go when the lease's TTL runs out);
    ///   call `close()` again to retry the revoke.
    /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused the revoke (e.g.
    ///   `PermissionDenied`). A lease etcd no longer knows (`NotFound`) is not an error:
    ///   the goal of `close()` holds.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread (nothing is done).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// session.close()?;
    /// assert!(!session.is_alive());
    /// session.close()?; // closing twice is fine
    /// # Ok(()) }
    /// ```
    pub fn close(&self) -> Result<()> {
        crate::client::runtime::ensure_blocking_allowed()?;
        let lease = &self.inner.lease;
        // `loss_reason()` first: it applies a deadline that has passed (Expired), which
        // must not be recorded as a close.
        let reason = match lease.loss_reason() {
            Some(reason) => reason,
            None => {
                lease.mark_lost(LossReason::Closed);
                // Lost in between (the keep-alive thread)? Its reason stands.
                lease.loss_reason().unwrap_or(LossReason::Closed)
            }
        };
        match reason {
            LossReason::Closed => self.revoke(),
            LossReason::Expired => {
                // Lost as far as we can tell, but the lease may still exist on the server:
                // revoking it lets its keys go now rather than at its TTL.
                if let Err(e) = self.revoke() {
                    tracing::debug!(
                        lease = %LeaseHex(self.lease_id()),
                        error = %e,
                        "revoking a lost session's lease failed"
                    );
                }
                Err(Error::SessionLost(reason))
            }
            LossReason::Revoked | LossReason::Orphaned | LossReason::ClientClosed => {
                Err(Error::SessionLost(reason))
            }
        }
    }

    /// Revokes the lease; a lease etcd no longer knows counts as revoked.
    fn revoke(&self) -> Result<()> {
        let rpc = self.inner.client.rpc().clone();
        let id = self.lease_id();
        match self
            .inner
            .client
            .block_on(async move { rpc.lease_revoke(id).await })
        {
            Ok(()) => Ok(()),
            // Already revoked or expired: the goal of close() holds.
            Err(Error::Server {
                code: Code::NotFound,
                ..
            }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Stops the keep-alive without revoking: keys bound to the lease stay until its TTL
    /// runs out on the server. The session counts as lost at once.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let id = session.lease_id();
    /// session.orphan(); // another process may resume `id` before it expires
    /// # let _ = id;
    /// # Ok(()) }
    /// ```
    pub fn orphan(&self) {
        self.inner.lease.mark_lost(LossReason::Orphaned);
    }
}

/// Configures and starts a [`Session`]: `client.session_builder().ttl(..).start()`.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let first = client.session_builder().ttl(Duration::from_secs(30)).start()?;
/// let id = first.lease_id();
/// first.orphan();
/// // e.g. after a restart: take the same lease (and the keys bound to it) back
/// let again = client.session_builder().resume(id).start()?;
/// assert_eq!(again.lease_id(), id);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .start()"]
pub struct SessionBuilder {
    client: Client,
    ttl: Duration,
    resume: Option<i64>,
    identity: Option<String>,
}

impl SessionBuilder {
    pub(crate) fn new(client: Client) -> SessionBuilder {
        SessionBuilder {
            client,
            ttl: DEFAULT_TTL,
            resume: None,
            identity: None,
        }
    }

    /// The lease TTL, in whole seconds (default 60 s). etcd raises values below its
    /// minimum (2 s by default); [`Session::ttl`] reports what it granted.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let s = client.session_builder().ttl(std::time::Duration::from_secs(5)).start()?;
    /// # let _ = s;
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> SessionBuilder {
        self.ttl = ttl;
        self
    }

    /// Takes over an existing lease instead of granting a new one (no TTL is sent; the
    /// lease keeps its own). [`start`](SessionBuilder::start) fails with
    /// [`Error::SessionLost`]`(`[`LossReason::Revoked`]`)` if the lease is gone, and with
    /// [`Error::InvalidArgument`] if the id is not positive or the lease already has a live
    /// session in this client.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let s = client.session_builder().resume(0x694d82254d5fa305).start();
    /// # let _ = s;
    /// # Ok(()) }
    /// ```
    pub fn resume(mut self, lease_id: i64) -> SessionBuilder {
        self.resume = Some(lease_id);
        self
    }

    /// Who the session is (default `"<hostname>:<pid>"`): stored as the value of every lock
    /// key the session takes, so [`Client::status`] and `etcd-sync status` can say who
    /// holds and who waits. Non-empty, at most [`MAX_IDENTITY_LEN`](crate::MAX_IDENTITY_LEN)
    /// bytes, no control characters; [`start`](SessionBuilder::start) checks it.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let s = client.session_builder().identity("host-a/importer").start()?;
    /// assert!(client.session_builder().identity("").start().is_err()); // InvalidArgument
    /// # let _ = s;
    /// # Ok(()) }
    /// ```
    pub fn identity(mut self, identity: impl Into<String>) -> SessionBuilder {
        self.identity = Some(identity.into());
        self
    }

    /// Grants (or resumes) the lease and starts keeping it alive.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: a [`ttl`](SessionBuilder::ttl) that is zero, not whole
    ///   seconds, or above [`MAX_TTL`]; a [`resume`](SessionBuilder::resume)d id that is not
    ///   positive, or whose lease already has a live session in this client (clone that
    ///   session instead); an [`identity`](SessionBuilder::identity) that is empty, longer
    ///   than [`MAX_IDENTITY_LEN`](crate::MAX_IDENTITY_LEN) bytes or has a control
    ///   character. Nothing is sent then.
    /// * [`Error::SessionLost`]`(`[`LossReason::Revoked`]`)`: the resumed lease is gone
    ///   (revoked or expired).
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd could not be reached (the grant
    ///   or lookup is retried on every endpoint first). A grant that applied without an
    ///   answer leaks only a lease that expires by itself.
    /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused the request (e.g.
    ///   `PermissionDenied`), or re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let session = client.session_builder().start()?;
    /// # let _ = session;
    /// # Ok(()) }
    /// ```
    pub fn start(self) -> Result<Session> {
        crate::client::runtime::ensure_blocking_allowed()?;
        let identity = match self.identity {
            Some(identity) => {
                identity::validate(&identity)?;
                identity
            }
            None => identity::default_identity(),
        };
        let rpc = self.client.rpc().clone();
        let shared = match self.resume {
            None => {
                let ttl_secs = validate_ttl(self.ttl)?;
                let sent = crate::support::clock::now();
                let granted = self
                    .client
                    .block_on(async move { rpc.lease_grant(ttl_secs).await })?;
                if granted.ttl <= 0 {
                    return Err(Error::InvalidArgument(format!(
                        "etcd granted TTL {} for a requested TTL of {ttl_secs}s",
                        granted.ttl
                    )));
                }
                let ttl = Duration::from_secs(granted.ttl.unsigned_abs());
                LeaseState::new(granted.id, ttl, sent + ttl - safety_margin(ttl))
            }
            Some(id) => {
                if id <= 0 {
                    return Err(Error::InvalidArgument(format!(
                        "lease id {id} cannot be resumed: etcd-assigned lease ids are positive"
                    )));
                }
                let sent = crate::support::clock::now();
                let live = self
                    .client
                    .block_on(async move { rpc.lease_time_to_live(id).await })?;
                if live.ttl <= 0 {
                    return Err(Error::SessionLost(LossReason::Revoked));
                }
                let ttl = Duration::from_secs(live.granted_ttl.max(live.ttl).unsigned_abs());
                // `ttl` in the answer is the whole seconds left, rounded down: a safe bound.
                let left = Duration::from_secs(live.ttl.unsigned_abs());
                LeaseState::new(id, ttl, sent + left - safety_margin(ttl).min(left / 2))
            }
        };
        tracing::debug!(
            lease = %LeaseHex(shared.id()),
            ttl = ?shared.ttl(),
            resumed = self.resume.is_some(),
            "session started"
        );
        self.client.keepalive_register(shared.clone())?;
        Ok(Session {
            inner: Arc::new(SessionInner {
                client: self.client,
                lease: shared,
                identity,
            }),
        })
    }
}

/// TTLs are whole seconds between 1 s and etcd's maximum. Too long is said first: a
/// `Duration::MAX` is too long, whatever its fraction of a second.
fn validate_ttl(ttl: Duration) -> Result<i64> {
    if ttl > MAX_TTL {
        return Err(Error::InvalidArgument(format!(
            "session TTL {}s is too long: etcd's maximum is {}s (MAX_TTL)",
            ttl.as_secs(),
            MAX_TTL.as_secs()
        )));
    }
    if ttl.subsec_nanos() != 0 {
        return Err(Error::InvalidArgument(format!(
            "session TTL {ttl:?} is not a whole number of seconds (etcd leases count seconds)"
        )));
    }
    if ttl.is_zero() {
        return Err(Error::InvalidArgument(
            "session TTL must be at least 1 second".into(),
        ));
    }
    i64::try_from(ttl.as_secs()).map_err(|_| Error::InvalidArgument("session TTL too large".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_validation() {
        assert!(validate_ttl(Duration::ZERO).is_err());
        assert!(validate_ttl(Duration::from_millis(1500)).is_err());
        assert!(validate_ttl(MAX_TTL + Duration::from_secs(1)).is_err());
        assert_eq!(validate_ttl(Duration::from_secs(5)).ok(), Some(5));
        assert_eq!(validate_ttl(MAX_TTL).ok(), Some(9_000_000_000));
        for too_long in [Duration::MAX, MAX_TTL + Duration::from_millis(1)] {
            let text = validate_ttl(too_long).unwrap_err().to_string();
            assert!(text.contains("is too long"), "{text}");
            assert!(text.contains("maximum is 9000000000s"), "{text}");
            assert!(!text.contains("whole number"), "{text}");
        }
        let text = validate_ttl(Duration::from_millis(1500))
            .unwrap_err()
            .to_string();
        assert!(text.contains("not a whole number of seconds"), "{text}");
    }
}
