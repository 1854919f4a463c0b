//! A supervised leader loop: campaign, do the leader's work while leading, step down and
//! campaign again after a loss, until cancelled. What client-go's `RunOrDie` and Curator's
//! `LeaderSelector` give, on top of [`Election`].
//!
//! The loop runs on the caller's thread and so does the work closure: leadership cannot
//! be taken away from running code, so the closure is told (the [`Leadership`]'s `lost()`
//! and the [`CancelToken`]'s `cancelled()`) and must return. The loop never campaigns again
//! while the closure runs, so this process is never two candidates; after the closure
//! returns or panics, the loop resigns before anything else. What the loop reports about
//! itself (its state, health, and why a term ended) is in `health.rs`.

pub(crate) mod health;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::recipes::election::leader_loop::health::{LoopHealth, LoopState, TermEnd};
use crate::recipes::election::observe::LeaderEvent;
use crate::recipes::election::{Election, Leadership};
use crate::session::Session;
use crate::support::backoff::Backoff;
use crate::support::cancel::{CancelToken, WaitOptions};
use crate::support::error::{Error, Result};

type Elected<'a> = Box<dyn FnMut(&Leadership) + 'a>;
type Lost<'a> = Box<dyn FnMut(&TermEnd) + 'a>;
type Changed = Box<dyn FnMut(&LeaderEvent) + Send + 'static>;

/// Shortest and longest pause between failed attempts, by default.
pub const DEFAULT_LOOP_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_secs(10));

/// How long a loop may be neither leading nor campaigning before it is wedged, by default.
pub const DEFAULT_WEDGED_AFTER: Duration = Duration::from_secs(60);

/// A supervised leader loop on one [`Election`]; made by [`Election::leader_loop`],
/// configured with callbacks, started with [`run`](LeaderLoop::run).
///
/// `run` campaigns, calls the work closure while leading, and when the term ends (the
/// leadership is lost, the closure returns or panics) resigns, reports it, and campaigns
/// again after a capped backoff. A lost session is replaced by a new one of the same TTL
/// on the same client. Cancelling the token ends the campaign at once, or asks the
/// closure to return (it gets the token) and then resigns; `run` then returns `Ok(())`.
///
/// ```no_run
/// use etcd_sync::crossbeam_channel::select;
/// use etcd_sync::CancelToken;
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let cancel = CancelToken::new();
/// session
///     .election("scheduler")?
///     .leader_loop("host-a")
///     .on_elected(|l| println!("elected with token {}", l.fencing_token()))
///     .on_lost(|why| println!("term ended: {why:?}"))
///     .on_leader_changed(|event| println!("leader: {event:?}"))
///     .run(&cancel, |leadership, cancel| {
///         // Lead until the leadership is lost or we are asked to stop.
///         select! {
///             recv(leadership.lost()) -> _ => {}
///             recv(cancel.cancelled()) -> _ => {}
///         }
///     })?;
/// # Ok(()) }
/// ```
pub struct LeaderLoop<'a> {
    election: &'a Election,
    value: Vec<u8>,
    backoff: (Duration, Duration),
    health: LoopHealth,
    on_elected: Option<Elected<'a>>,
    on_lost: Option<Lost<'a>>,
    on_leader_changed: Option<Changed>,
}

impl Election {
    /// A supervised leader loop campaigning with `value` (see [`LeaderLoop`]).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let cancel = etcd_sync::CancelToken::new();
    /// session.election("e")?.leader_loop("v").run(&cancel, |leadership, _| {
    ///     let _ = leadership.lost().recv();
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn leader_loop(&self, value: impl AsRef<[u8]>) -> LeaderLoop<'_> {
        LeaderLoop {
            election: self,
            value: value.as_ref().to_vec(),
            backoff: DEFAULT_LOOP_BACKOFF,
            health: LoopHealth::new(DEFAULT_WEDGED_AFTER),
            on_elected: None,
            on_lost: None,
            on_leader_changed: None,
        }
    }

    /// [`leader_loop(value)`](Election::leader_loop)`.run(cancel, work)`: leads with
    /// `work` until `cancel` is cancelled, campaigning again after every lost term.
    ///
    /// # Errors
    ///
    /// As [`LeaderLoop::run`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let cancel = etcd_sync::CancelToken::new();
    /// session.election("e")?.lead("host-a", &cancel, |leadership, cancel| {
    ///     while leadership.is_leader() && !cancel.is_cancelled() {
    ///         std::thread::sleep(std::time::Duration::from_millis(100)); // lead a little
    ///     }
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn lead(
        &self,
        value: impl AsRef<[u8]>,
        cancel: &CancelToken,
        work: impl FnMut(&Leadership, &CancelToken),
    ) -> Result<()> {
        self.leader_loop(value).run(cancel, work)
    }
}

impl<'a> LeaderLoop<'a> {
    /// Called on the loop's thread when elected, before the closure runs.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let e = session.election("e")?;
    /// let _loop = e.leader_loop("v").on_elected(|l| println!("token {}", l.fencing_token()));
    /// # Ok(()) }
    /// ```
    pub fn on_elected(mut self, f: impl FnMut(&Leadership) + 'a) -> Self {
        self.on_elected = Some(Box::new(f));
        self
    }

    /// Called on the loop's thread when a term has ended (after the closure returned and
    /// the loop resigned), with the reason.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let e = session.election("e")?;
    /// let _loop = e.leader_loop("v").on_lost(|why| eprintln!("no longer leader: {why:?}"));
    /// # Ok(()) }
    /// ```
    pub fn on_lost(mut self, f: impl FnMut(&TermEnd) + 'a) -> Self {
        self.on_lost = Some(Box::new(f));
        self
    }

    /// Called for every change of the election's leader as observed (ours included), on a
    /// thread of its own that runs while [`run`](LeaderLoop::run) does.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let e = session.election("e")?;
    /// let _loop = e.leader_loop("v").on_leader_changed(|event| println!("{event:?}"));
    /// # Ok(()) }
    /// ```
    pub fn on_leader_changed(mut self, f: impl FnMut(&LeaderEvent) + Send + 'static) -> Self {
        self.on_leader_changed = Some(Box::new(f));
        self
    }

    /// Pauses between failed attempts: from `first`, doubling up to `cap` (default
    /// 200 ms to 10 s), each drawn between half and the whole of its step (jitter, so that
    /// loops that failed together do not retry together). Both are clamped to at least
    /// 10 ms, and `cap` to at least `first`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let e = session.election("e")?;
    /// let _loop = e.leader_loop("v").backoff(Duration::from_millis(100), Duration::from_secs(5));
    /// # Ok(()) }
    /// ```
    pub fn backoff(mut self, first: Duration, cap: Duration) -> Self {
        let first = first.max(Duration::from_millis(10));
        self.backoff = (first, cap.max(first));
        self
    }

    /// The bound of the health check (default 60 s; see [`LoopHealth`]).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let e = session.election("e")?;
    /// let _loop = e.leader_loop("v").wedged_after(std::time::Duration::from_secs(30));
    /// # Ok(()) }
    /// ```
    pub fn wedged_after(self, bound: Duration) -> Self {
        self.health.lock().wedged_after = bound;
        self
    }

    /// The loop's health check, to hand to another thread before calling
    /// [`run`](LeaderLoop::run).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let e = session.election("e")?;
    /// let health = e.leader_loop("v").health();
    /// # let _ = health;
    /// # Ok(()) }
    /// ```
    pub fn health(&self) -> LoopHealth {
        self.health.clone()
    }

    /// Runs the loop on this thread until `cancel` is cancelled (then `Ok(())`).
    ///
    /// `work(leadership, cancel)` runs while this process leads; it should return soon
    /// after `leadership.lost()` or `cancel.cancelled()` fires. Whatever ends the term,
    /// the loop resigns (deleting the key only if it is still ours) before it reports
    /// [`on_lost`](LeaderLoop::on_lost) and campaigns again.
    ///
    /// # Errors
    ///
    /// Only errors that retrying cannot fix end the loop early: etcd refused the campaign
    /// ([`Error::Server`], e.g. `PermissionDenied`), [`Error::Authentication`],
    /// [`Error::WouldDeadlock`] (this thread holds a lock of the same name),
    /// [`Error::InsideAsyncRuntime`]. Lost sessions, lost leadership, unreachable members and
    /// timeouts are retried with backoff.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let cancel = etcd_sync::CancelToken::new();
    /// session.election("e")?.leader_loop("v").run(&cancel, |l, c| {
    ///     etcd_sync::crossbeam_channel::select! {
    ///         recv(l.lost()) -> _ => {}
    ///         recv(c.cancelled()) -> _ => {}
    ///     }
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn run(
        mut self,
        cancel: &CancelToken,
        mut work: impl FnMut(&Leadership, &CancelToken),
    ) -> Result<()> {
        crate::client::runtime::ensure_blocking_allowed()?;
        let observer = self.observe()?;
        let result = self.campaign_and_lead(cancel, &mut work);
        self.health.set(LoopState::Stopped);
        if let Some((stop, thread)) = observer {
            stop.cancel();
            let _ = thread.join();
        }
        result
    }

    /// Starts the observer thread for `on_leader_changed`, if one was given.
    fn observe(&mut self) -> Result<Option<(CancelToken, JoinHandle<()>)>> {
        let Some(mut changed) = self.on_leader_changed.take() else {
            return Ok(None);
        };
        let client = self.election.session().client();
        let observer = client.observe(self.election.name())?;
        let stop = CancelToken::new();
        let token = stop.clone();
        let thread = std::thread::Builder::new()
            .name("etcd-sync-leader-observer".into())
            .spawn(move || {
                // Ends on the stop token, or when the observer stops after an error.
                while let Ok(event) = observer.recv_with(&token) {
                    changed(&event);
                }
            })
            .map_err(|e| Error::unavailable(format!("cannot start the observer thread: {e}")))?;
        Ok(Some((stop, thread)))
    }

    fn campaign_and_lead(
        &mut self,
        cancel: &CancelToken,
        work: &mut impl FnMut(&Leadership, &CancelToken),
    ) -> Result<()> {
        let (first, cap) = self.backoff;
        let mut backoff = Backoff::new(first, cap);
        // The user's session first; after it is lost, sessions of our own (closed at the end).
        let mut own: Option<Session> = None;
        let result = loop {
            if cancel.is_cancelled() {
                break Ok(());
            }
            let session = match self.live_session(&mut own) {
                Ok(session) => session,
                Err(e) if retry(&e) => {
                    self.pause(&mut backoff, cancel, &e);
                    continue;
                }
                Err(e) => break Err(e),
            };
            self.health.set(LoopState::Campaigning);
            let campaign = session.election(self.election.name()).and_then(|election| {
                election.campaign_with(&self.value, WaitOptions::from(cancel))
            });
            match campaign {
                Ok(leadership) => {
                    backoff.reset();
                    let end = self.lead(leadership, &session, cancel, work);
                    let cancelled = matches!(end, TermEnd::Cancelled);
                    if let Some(on_lost) = self.on_lost.as_mut() {
                        on_lost(&end);
                    }
                    if cancelled {
                        break Ok(());
                    }
                    if !matches!(end, TermEnd::Returned) {
                        // A lost or panicked term: not straight back into the line.
                        self.pause(&mut backoff, cancel, &Error::NotLeader);
                    }
                }
                Err(Error::Cancelled) => break Ok(()),
                Err(e) if retry(&e) => self.pause(&mut backoff, cancel, &e),
                Err(e) => break Err(e),
            }
        };
        if let Some(session) = own {
            let _ = session.close();
        }
        result
    }

    /// The session to campaign on: the election's own while it lives, then ours.
    fn live_session(&self, own: &mut Option<Session>) -> Result<Session> {
        let original = self.election.session();
        if own.is_none() && original.is_alive() {
            return Ok(original.clone());
        }
        if let Some(session) = own.as_ref().filter(|s| s.is_alive()) {
            return Ok(session.clone());
        }
        self.health.set(LoopState::Starting);
        let session = original
            .client()
            .session_builder()
            .ttl(original.ttl())
            .start()?;
        tracing::info!(lease = session.lease_id(), "leader loop: new session");
        *own = Some(session.clone());
        Ok(session)
    }

    /// One term: the callbacks, the closure (panics caught), and the resignation.
    fn lead(
        &mut self,
        mut leadership: Leadership,
        session: &Session,
        cancel: &CancelToken,
        work: &mut impl FnMut(&Leadership, &CancelToken),
    ) -> TermEnd {
        self.health.set(LoopState::Leading);
        let watcher = self.watch_loss(&leadership);
        if let Some(on_elected) = self.on_elected.as_mut() {
            on_elected(&leadership);
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| work(&leadership, cancel)));
        let end = match outcome {
            Err(panic) => TermEnd::Panicked(panic_message(panic.as_ref())),
            Ok(()) if !leadership.is_leader() => TermEnd::Lost(match session.loss_reason() {
                Some(reason) => Error::SessionLost(reason),
                None => Error::NotLeader,
            }),
            Ok(()) if cancel.is_cancelled() => TermEnd::Cancelled,
            Ok(()) => TermEnd::Returned,
        };
        self.health.set(LoopState::Resigning);
        if let Err(e) = leadership.resign() {
            // Still retried in the background, or the key goes with the lease.
            tracing::warn!(error = %e, "leader loop: resignation not confirmed");
        }
        drop(watcher);
        end
    }

    /// Records in the health check when this term's leadership is lost, while the
    /// closure may still run. Stops when the returned sender is dropped.
    fn watch_loss(&self, leadership: &Leadership) -> crossbeam_channel::Sender<()> {
        let (done_tx, done) = crossbeam_channel::bounded::<()>(0);
        let lost = leadership.lost();
        let health = self.health.clone();
        let _ = std::thread::Builder::new()
            .name("etcd-sync-leader-health".into())
            .spawn(move || {
                crossbeam_channel::select! {
                    recv(lost) -> _ => {
                        let mut h = health.lock();
                        if h.state == LoopState::Leading {
                            h.lost_at = Some(crate::support::clock::now());
                        }
                    }
                    recv(done) -> _ => {}
                }
            });
        done_tx
    }

    /// Waits out the next backoff pause, or until cancelled.
    fn pause(&self, backoff: &mut Backoff, cancel: &CancelToken, why: &Error) {
        self.health.set(LoopState::BackingOff);
        let pause = backoff.next_pause();
        tracing::info!(error = %why, ?pause, "leader loop: trying again");
        // Through the runtime's seam: virtual time in a simulated run.
        crate::client::runtime::pause(pause, cancel);
    }
}

/// Whether the loop retries after `e` (rather than ending with it).
fn retry(e: &Error) -> bool {
    e.is_retryable() || e.is_lost()
}

/// The text of a panic payload (`&str` or `String`, as `panic!` makes them).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-text payload".into())
}
