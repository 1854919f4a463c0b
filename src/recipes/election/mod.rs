//! Leader election: campaign / proclaim / resign / leader / observe, on etcd's election
//! recipe (and wire format), with a [`Leadership`] guard that resigns on `Drop`. Here too
//! (`docs/election.md`): watching an election without taking part (`observe.rs`) and the
//! supervised leader loop (`leader_loop/`).

mod handover;
pub(crate) mod leader_loop;
pub(crate) mod observe;

use std::sync::Arc;
use std::time::Duration;

use crate::line::mode::Mode;
use crate::ownership::{self, Held, Kind, Place, Wait};
use crate::recipes::election::observe::{Observer, observe_prefix};
use crate::recipes::guard::{Guard, LeaderKind};
use crate::recipes::holder::{Holder, Status};
use crate::session::Session;
use crate::support::cancel::WaitOptions;
use crate::support::error::try_lock::TryLockError;
use crate::support::error::{Error, Result};
use crate::support::kv::text;

/// A leader election named by a string, campaigned through a [`Session`].
///
/// Candidates' keys are `<name>/<lease id in hex>` holding the candidate's value; the
/// oldest key leads. The campaign transaction is the one of etcd's Go
/// `concurrency.Election`, so candidates started with `etcdctl elect` and ours share one
/// line. One session has one key per name: campaigning again on the same session and name
/// proclaims the new value instead of queueing twice (as in Go).
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let session = client.session()?;
/// let election = session.election("scheduler")?;
/// let leadership = election.campaign("host-a:8080")?; // blocks until we lead
/// assert!(leadership.is_leader());
/// leadership.proclaim("host-a:9090")?;
/// drop(leadership); // resigns
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    line: Arc<Place>,
}

impl Election {
    /// The election's name.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert_eq!(session.election("e")?.name(), b"e");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &[u8] {
        self.line.name()
    }

    /// Blocks until we lead, then returns the guard. Our value is stored under our key
    /// while we wait. Ends at once with [`Error::SessionLost`] if the session is lost,
    /// [`Error::NotLeader`] if our key is deleted by someone else; on every error our key
    /// is removed.
    ///
    /// One session has one key per name. Campaigning again while this session leads under
    /// the name (from any thread) re-campaigns, as in Go: the new value is proclaimed and
    /// the new [`Leadership`] supersedes the old one, which then reports
    /// `is_leader() == false`, fires `lost()`, and does nothing on `Drop`. A re-campaign
    /// keeps the time limit and cancel token of `campaign_timeout`/`campaign_with`; if it
    /// fails or is cut short, the old guard stays valid (a proclamation cut short may still
    /// apply, but never over a newer one). A campaign while
    /// another thread of this session *waits* under the name, or holds a [`Mutex`](crate::Mutex)
    /// of the same name, takes turns with it.
    ///
    /// # Errors
    ///
    /// * [`Error::SessionLost`]: the session was lost before the call or while waiting
    ///   (at once, not at the end of the wait), or etcd answered the enqueue with
    ///   `requested lease not found` (the lease was revoked elsewhere before the
    ///   keep-alive noticed: the session is marked lost with
    ///   [`LossReason::Revoked`](crate::LossReason::Revoked)); no key is left behind.
    /// * [`Error::NotLeader`]: our key was deleted by someone else while we waited, or (on a
    ///   re-campaign) it was no longer ours when the new value was to be proclaimed.
    /// * [`Error::WouldDeadlock`]: this thread holds a [`MutexGuard`](crate::MutexGuard) of
    ///   this name on this session.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd could not be reached to join the
    ///   line (the request is tried on every endpoint first); our key is removed in the
    ///   background. A leader election is waited out instead ("no leader" from every member
    ///   is retried), and once in the line the wait retries its reads until etcd answers:
    ///   only the session's loss ends it then.
    /// * [`Error::Server`]: etcd refused a request (e.g. `PermissionDenied`).
    ///   [`Error::Authentication`]: re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let leadership = session.election("scheduler")?.campaign("host-a")?;
    /// println!("leading with token {}", leadership.fencing_token());
    /// # Ok(()) }
    /// ```
    pub fn campaign(&self, value: impl AsRef<[u8]>) -> Result<Leadership> {
        self.campaign_until(value.as_ref(), Wait::forever())
    }

    /// Like [`campaign`](Election::campaign), but gives up with [`Error::Timeout`] after
    /// `timeout`, leaving no key behind.
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] with [`Operation::Campaign`](crate::Operation::Campaign) and
    ///   `after: timeout` ([`is_wait_timeout`](Error::is_wait_timeout)): we did not lead
    ///   in time; no key is left behind. A request that timed out on the way is a
    ///   `Timeout` too, with [`Operation::Request`](crate::Operation::Request) and the
    ///   endpoint that did not answer.
    /// * Otherwise as [`campaign`](Election::campaign): [`Error::SessionLost`],
    ///   [`Error::NotLeader`], [`Error::WouldDeadlock`], [`Error::Unavailable`],
    ///   [`Error::Server`], [`Error::Authentication`], [`Error::InsideAsyncRuntime`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let e = session.election("scheduler")?;
    /// match e.campaign_timeout("host-a", std::time::Duration::from_secs(1)) {
    ///     Ok(_leadership) => println!("leading"),
    ///     Err(e) if e.is_wait_timeout() => println!("someone else leads"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn campaign_timeout(
        &self,
        value: impl AsRef<[u8]>,
        timeout: Duration,
    ) -> Result<Leadership> {
        self.campaign_until(value.as_ref(), Wait::from_timeout(timeout))
    }

    /// Like [`campaign`](Election::campaign), with a time limit and/or a
    /// [`CancelToken`](crate::CancelToken) another thread may cancel (see
    /// [`WaitOptions`]).
    ///
    /// # Errors
    ///
    /// * [`Error::Cancelled`]: the token was cancelled before or during the campaign,
    ///   which returns within about one request round trip; no key is left behind.
    /// * A wait timeout ([`is_wait_timeout`](Error::is_wait_timeout)) when the limit
    ///   passes, as for [`campaign_timeout`](Election::campaign_timeout).
    /// * Otherwise as [`campaign`](Election::campaign).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let token = etcd_sync::CancelToken::new();
    /// match session.election("scheduler")?.campaign_with("host-a", &token) {
    ///     Ok(_leadership) => println!("leading"),
    ///     Err(e) if e.is_cancelled() => println!("stopped campaigning"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn campaign_with(
        &self,
        value: impl AsRef<[u8]>,
        options: impl Into<WaitOptions>,
    ) -> Result<Leadership> {
        self.campaign_until(value.as_ref(), Wait::from_options(options.into()))
    }

    fn campaign_until(&self, value: &[u8], wait: Wait) -> Result<Leadership> {
        let span = tracing::debug_span!("campaign", key = %text(self.line.key()));
        let _entered = span.enter();
        wait.check()?;
        if let Some(hold) = self.line.live_hold()
            && hold.kind() == Kind::Lead
        {
            // Re-campaign: proclaim first (the old guard stays valid if that fails), then
            // hand the hold to a new guard.
            if !ownership::proclaim(&hold, value, &wait)? {
                return Err(Error::NotLeader);
            }
            let held = Held::supersede(&hold).ok_or(Error::NotLeader)?;
            tracing::info!(fencing_token = held.token(), "re-campaigned");
            return Ok(Guard::new(held));
        }
        let held =
            ownership::acquire(&self.line, Kind::Lead, value, wait).map_err(|e| match e {
                TryLockError::Error(Error::LockLost) | TryLockError::WouldBlock => Error::NotLeader,
                TryLockError::Error(other) => other,
            })?;
        tracing::info!(fencing_token = held.token(), "elected leader");
        Ok(Guard::new(held))
    }

    /// The session this election campaigns on.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let election = session.election("e")?;
    /// assert_eq!(election.session().lease_id(), session.lease_id());
    /// # Ok(()) }
    /// ```
    pub fn session(&self) -> &Session {
        self.line.session()
    }

    /// Who leads and who campaigns, in line order (the next leader first): the same read
    /// as [`Client::status`](crate::Client::status) of this name. The leader is the
    /// [`holder`](Status::holder); the candidates waiting to lead are the
    /// [`waiters`](Status::waiters), each with the value it campaigned with, its lease,
    /// create revision (its fencing token once it leads) and lease TTL left. One
    /// linearizable read, then one lease lookup per distinct lease.
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
    /// let status = session.election("scheduler")?.status()?;
    /// for candidate in &status.waiters {
    ///     println!("next in line: {}", candidate.value_str());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn status(&self) -> Result<Status> {
        self.session().client().status(self.name())
    }

    /// The current leader (the oldest key under the name), or `Ok(None)` when nobody
    /// leads: the [`holder`](Status::holder) of [`status`](Election::status), as Go's
    /// `Election.Leader` and `etcdctl elect -l` name it.
    ///
    /// # Errors
    ///
    /// As [`status`](Election::status).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.election("scheduler")?.leader()? {
    ///     Some(leader) => println!("leader: {} ({:?} left)", leader.value_str(), leader.ttl),
    ///     None => println!("no leader"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn leader(&self) -> Result<Option<Holder>> {
        Ok(self.status()?.holders.into_iter().next())
    }

    /// Follows leadership changes: a blocking iterator of [`LeaderEvent`](crate::LeaderEvent)s that starts with
    /// the current state (a leader or [`LeaderEvent::NoLeader`](crate::LeaderEvent::NoLeader)). It survives compaction and
    /// broken watch streams (it re-reads the current leader), and only ever reports a key
    /// that was the leader at the revision it read. Dropping it cancels its watch.
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] on an async worker thread. Nothing is sent before this
    /// returns: etcd's errors arrive through the [`Observer`].
    ///
    /// ```no_run
    /// use etcd_sync::LeaderEvent;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// for event in session.election("scheduler")?.observe()? {
    ///     match event? {
    ///         LeaderEvent::Elected(l) | LeaderEvent::Proclaimed(l) => println!("leader: {}", l.value_str()),
    ///         LeaderEvent::NoLeader => println!("no leader"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn observe(&self) -> Result<Observer> {
        observe_prefix(
            self.line.session().client().clone(),
            self.line.prefix().to_vec(),
        )
    }
}

/// Proof that we lead; resigns on `Drop`. A [`Guard`]: besides the methods every guard
/// has (a key, a fencing token strictly increasing across successive leaders,
/// [`lost`](Guard::lost), writes that commit only while we lead, [`release`](Guard::release)),
/// a leadership can [`proclaim`](Guard::proclaim) a new value, and
/// [`resign`](Guard::resign) until etcd confirms it. Where a lock guard reports
/// [`Error::LockLost`], a leadership reports [`Error::NotLeader`].
///
/// Resigning deletes our key only if it still has our create revision. If
/// [`resign`](Guard::resign) fails, the guard keeps its state so calling it again works
/// (upstream Go forgets it). A re-campaign on the same session and name supersedes this
/// guard (see [`Election::campaign`]): it then no longer leads, and does nothing on `Drop`.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let mut leadership = session.election("scheduler")?.campaign("host-a")?;
/// crossbeam_channel::select! {
///     recv(leadership.lost()) -> _ => eprintln!("leadership lost: stop leading"),
///     default(std::time::Duration::from_secs(1)) => println!("led for a second"),
/// }
/// leadership.resign()?;
/// # Ok(()) }
/// ```
pub type Leadership = Guard<LeaderKind>;

/// What only a [`Leadership`] does.
impl Guard<LeaderKind> {
    /// Whether we still lead as far as this process knows: [`is_held`](Guard::is_held),
    /// by the election's name for it (not resigned nor superseded by a re-campaign, the
    /// session's lease deadline has not passed, and our key has not been seen deleted).
    /// No request is sent.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert!(session.election("e")?.campaign("v")?.is_leader());
    /// # Ok(()) }
    /// ```
    pub fn is_leader(&self) -> bool {
        self.is_held()
    }

    /// Publishes a new value under our key, only while we lead; [`Error::NotLeader`] if we
    /// no longer do. Exactly once: a retried attempt that etcd applies late can never
    /// overwrite a newer value.
    ///
    /// # Errors
    ///
    /// * [`Error::NotLeader`]: this guard resigned, was superseded by a re-campaign, or our
    ///   key is gone or no longer has our create revision; nothing was written.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer, nor the read
    ///   that tells whether the attempt applied. Calling `proclaim` again is safe.
    /// * [`Error::Server`]: etcd refused the request (e.g. `PermissionDenied`, or
    ///   `InvalidArgument` for a value above its size limit); [`Error::Authentication`]:
    ///   re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let l = session.election("e")?.campaign("starting")?;
    /// l.proclaim("ready")?;
    /// # Ok(()) }
    /// ```
    pub fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<()> {
        if self.held.proclaim(value.as_ref())? {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// Gives up leadership (deletes our key if it still has our create revision): the
    /// same release as [`release`](Guard::release), which a leader that must know it has
    /// stepped down (before another takes over work only one may do) calls until it
    /// succeeds, as with Go's `Election.Resign`. Returns within about one request timeout;
    /// if etcd has not answered by then, this returns [`Error::Timeout`] while the
    /// resignation goes on in the background, and calling `resign` again waits for it
    /// once more. After success (or on a guard superseded by a re-campaign) it does
    /// nothing. Dropping the `Leadership` resigns too, in the background.
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] with [`Operation::Release`](crate::Operation::Release): etcd
    ///   did not answer within the request timeout; the resignation goes on, and `resign`
    ///   may be called again.
    /// * [`Error::SessionLost`]: the session is lost and etcd could not be reached; the
    ///   key goes with the lease.
    /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused the delete.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread (nothing is done).
    ///
    /// A key that was already gone or no longer ours is not an error (there is nothing to
    /// give up): `resign` never returns [`Error::NotLeader`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let mut l = session.election("e")?.campaign("v")?;
    /// while let Err(e) = l.resign() {
    ///     eprintln!("resign not confirmed yet: {e}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn resign(&mut self) -> Result<()> {
        self.held.release_now().map(|_| ())
    }
}

impl Session {
    /// An election named `name` on this session. No request is sent until you use it.
    ///
    /// **The name is a key prefix, and every key under `<name>/` counts as a holder**
    /// (as with Go's Mutex and `etcdctl lock`): while `jobs/nightly` is locked, or while a
    /// data key such as `jobs/nightly-progress` exists, a campaign on `jobs` does not win. Keep
    /// lock names and data apart and do not nest lock names; a wait blocked by a key that is
    /// not a lock key logs a `tracing` warning naming it. `a` and `ab` never interfere.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `name` is empty,
    /// ends with `/` or is longer than 4096 bytes.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let election = session.election("scheduler")?;
    /// # let _ = election;
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: impl AsRef<[u8]>) -> Result<Election> {
        Ok(Election {
            line: Place::of(self, name.as_ref(), Mode::Exclusive)?,
        })
    }
}
