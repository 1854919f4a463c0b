//! How a [`LeaderLoop`](crate::LeaderLoop) is doing, for another thread: where it is
//! ([`LoopState`]), whether it is wedged ([`LoopHealth`]), and why a term ended
//! ([`TermEnd`]).

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use crate::support::error::Error;

/// Why a term (one leadership of the loop) ended, as [`LeaderLoop::on_lost`](crate::LeaderLoop::on_lost) reports it.
///
/// ```
/// use etcd_sync::TermEnd;
/// fn describe(end: &TermEnd) -> String {
///     match end {
///         TermEnd::Lost(e) => format!("lost: {e}"),
///         TermEnd::Returned => "work finished".into(),
///         TermEnd::Panicked(msg) => format!("work panicked: {msg}"),
///         TermEnd::Cancelled => "cancelled".into(),
///         _ => "other".into(),
///     }
/// }
/// assert_eq!(describe(&TermEnd::Returned), "work finished");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TermEnd {
    /// The leadership ended under the closure: the session was lost
    /// ([`Error::SessionLost`] with its reason) or the key was deleted or superseded
    /// ([`Error::NotLeader`]).
    Lost(Error),
    /// The closure returned while still leading; the loop resigned and campaigns again.
    Returned,
    /// The closure panicked (the panic's message); the loop resigned and campaigns again.
    Panicked(String),
    /// The token was cancelled; the loop resigned and returns.
    Cancelled,
}

/// Where a [`LeaderLoop`](crate::LeaderLoop) is, as its [`LoopHealth`] reports it.
///
/// ```
/// assert_ne!(etcd_sync::LoopState::Leading, etcd_sync::LoopState::Campaigning);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoopState {
    /// Not started yet.
    Idle,
    /// Starting a session (the first one, or a new one after a loss).
    Starting,
    /// Waiting in the election's line.
    Campaigning,
    /// The closure runs as leader.
    Leading,
    /// Resigning after a term.
    Resigning,
    /// Waiting before the next attempt, after an error.
    BackingOff,
    /// `run` returned.
    Stopped,
}

/// A health check of a running [`LeaderLoop`](crate::LeaderLoop), usable from any thread.
///
/// The loop is *wedged* when, for longer than the bound set with
/// [`LeaderLoop::wedged_after`](crate::LeaderLoop::wedged_after), it has neither led nor waited in a campaign (it keeps
/// failing to start a session or to reach etcd: failed attempts and the pauses between
/// them add up), or its closure kept running after the leadership was lost (a phantom
/// leader: the closure ignores `lost()`). A campaign attempt in progress is not wedged;
/// choose a bound well above the client's request timeout.
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let election = session.election("scheduler")?;
/// let leader_loop = election.leader_loop("host-a");
/// let health = leader_loop.health();
/// std::thread::spawn(move || loop {
///     if health.is_wedged() {
///         eprintln!("leader loop wedged in {:?}", health.state());
///     }
///     std::thread::sleep(std::time::Duration::from_secs(5));
/// });
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LoopHealth {
    inner: Arc<StdMutex<Health>>,
}

pub(super) struct Health {
    pub(super) state: LoopState,
    since: Instant,
    /// Since when the loop has neither led nor been in a campaign that lasted: failed
    /// attempts (session starts, campaigns cut short by errors) and pauses add up.
    idle_since: Option<Instant>,
    /// When the current term's leadership was lost, while the closure still runs.
    pub(super) lost_at: Option<Instant>,
    pub(super) wedged_after: Duration,
}

impl LoopHealth {
    pub(super) fn new(wedged_after: Duration) -> LoopHealth {
        LoopHealth {
            inner: Arc::new(StdMutex::new(Health {
                state: LoopState::Idle,
                since: crate::support::clock::now(),
                idle_since: None,
                lost_at: None,
                wedged_after,
            })),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Health> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn set(&self, state: LoopState) {
        let mut h = self.lock();
        let now = crate::support::clock::now();
        match state {
            LoopState::Leading | LoopState::Stopped | LoopState::Idle => h.idle_since = None,
            // The idle clock keeps running: only a campaign that lasts (or wins) resets it.
            LoopState::Campaigning => {}
            LoopState::Starting | LoopState::Resigning | LoopState::BackingOff => {
                if h.state == LoopState::Campaigning
                    && crate::support::clock::since(h.since) > h.wedged_after
                {
                    // It waited in line for a while before failing: that was not idle.
                    h.idle_since = Some(now);
                } else if h.idle_since.is_none() {
                    h.idle_since = Some(now);
                }
            }
        }
        if h.state != state {
            h.state = state;
            h.since = now;
        }
        h.lost_at = None;
    }

    /// What the loop does now.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let health = session.election("e")?.leader_loop("v").health();
    /// assert_eq!(health.state(), etcd_sync::LoopState::Idle);
    /// # Ok(()) }
    /// ```
    pub fn state(&self) -> LoopState {
        self.lock().state
    }

    /// How long the loop has been in its current [`state`](LoopHealth::state).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let health = session.election("e")?.leader_loop("v").health();
    /// println!("{:?} for {:?}", health.state(), health.in_state_for());
    /// # Ok(()) }
    /// ```
    pub fn in_state_for(&self) -> Duration {
        crate::support::clock::since(self.lock().since)
    }

    /// Whether the loop is wedged (see [`LoopHealth`]).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let health = session.election("e")?.leader_loop("v").health();
    /// assert!(!health.is_wedged()); // not started: not wedged
    /// # Ok(()) }
    /// ```
    pub fn is_wedged(&self) -> bool {
        let h = self.lock();
        match h.state {
            LoopState::Idle | LoopState::Stopped | LoopState::Campaigning => false,
            LoopState::Leading => h
                .lost_at
                .is_some_and(|at| crate::support::clock::since(at) > h.wedged_after),
            LoopState::Starting | LoopState::Resigning | LoopState::BackingOff => h
                .idle_since
                .is_some_and(|since| crate::support::clock::since(since) > h.wedged_after),
        }
    }
}

impl std::fmt::Debug for LoopHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopHealth")
            .field("state", &self.state())
            .field("in_state_for", &self.in_state_for())
            .finish()
    }
}
