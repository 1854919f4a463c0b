//! A lease as this process sees it: the state shared between a session's handles and the
//! keep-alive thread, and the rule that decides when the lease must be taken for lost.

use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdMutexGuard, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::support::error::loss::LossReason;
use crate::support::error::{Error, Result};
use crate::support::kv::LeaseHex;
use crate::support::signal::Signal;

/// How long before the conservative expiry we give up on a lease: covers the wake-up
/// latency of this thread and of whoever reacts to the loss. 10 % of the TTL, between
/// 100 ms and 1 s.
pub(crate) fn safety_margin(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// State shared between a session's handles and the keep-alive thread.
pub(crate) struct LeaseState {
    id: i64,
    /// Unique in this process (lease ids are unique only per cluster).
    serial: u64,
    state: StdMutex<State>,
    lost_rx: Receiver<()>,
    lost_async: tokio::sync::watch::Sender<bool>,
    /// Signals of guards built on this session: fired when the session is lost.
    dependents: StdMutex<Dependents>,
}

/// Weak references to guards' signals; dropped guards leave dead entries, pruned when the
/// list has doubled since the last prune, so registering costs O(1) amortized however many
/// guards the session holds.
#[derive(Default)]
struct Dependents {
    signals: Vec<Weak<Signal>>,
    prune_at: usize,
}

struct State {
    ttl: Duration,
    /// When we stop trusting the lease (monotonic): send time of the last acknowledged
    /// keep-alive + its TTL - the safety margin.
    deadline: Instant,
    /// The same deadline on the boot clock, which keeps counting through a suspend.
    boot_deadline: Duration,
    reason: Option<LossReason>,
    /// Dropped on loss, which disconnects every `lost()` receiver at once.
    lost_tx: Option<Sender<()>>,
}

impl LeaseState {
    pub(crate) fn new(id: i64, ttl: Duration, deadline: Instant) -> Arc<LeaseState> {
        let (lost_tx, lost_rx) = crossbeam_channel::bounded(0);
        let (lost_async, _) = tokio::sync::watch::channel(false);
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Arc::new(LeaseState {
            id,
            serial: SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            state: StdMutex::new(State {
                ttl,
                deadline,
                boot_deadline: crate::support::clock::boot_deadline(deadline),
                reason: None,
                lost_tx: Some(lost_tx),
            }),
            lost_rx,
            lost_async,
            dependents: StdMutex::default(),
        })
    }

    /// Fires `signal` when this session is lost (at once if it already is).
    pub(crate) fn on_lost(&self, signal: &Arc<Signal>) {
        if self.loss_reason().is_some() {
            signal.fire();
            return;
        }
        let mut dependents = self.dependents.lock().unwrap_or_else(|e| e.into_inner());
        if dependents.signals.len() >= dependents.prune_at {
            dependents.signals.retain(|weak| weak.strong_count() > 0);
            dependents.prune_at = (dependents.signals.len() * 2).max(64);
        }
        dependents.signals.push(Arc::downgrade(signal));
        drop(dependents);
        // Lost in between: mark_lost may have drained the list before our push.
        if self.state().reason.is_some() {
            signal.fire();
        }
    }

    fn state(&self) -> StdMutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.state().ttl
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.state().deadline
    }

    /// Records the first loss; later ones are ignored. Returns whether this call ended it.
    pub(crate) fn mark_lost(&self, reason: LossReason) -> bool {
        let mut state = self.state();
        if state.reason.is_some() {
            return false;
        }
        match &reason {
            LossReason::Closed | LossReason::Orphaned => {
                tracing::debug!(lease = %LeaseHex(self.id), %reason, "session ended")
            }
            _ => tracing::warn!(lease = %LeaseHex(self.id), %reason, "session lost"),
        }
        crate::support::telemetry::session_ended(&reason);
        state.reason = Some(reason);
        state.lost_tx = None;
        drop(state);
        self.lost_async.send_replace(true);
        let dependents = std::mem::take(
            &mut self
                .dependents
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .signals,
        );
        for signal in dependents.iter().filter_map(Weak::upgrade) {
            signal.fire();
        }
        true
    }

    /// Moves the deadline forward after an acknowledged keep-alive. A lost session stays
    /// lost, whatever etcd says later.
    pub(crate) fn extend(&self, deadline: Instant, ttl: Duration) {
        let mut state = self.state();
        if state.reason.is_none() && deadline > state.deadline {
            crate::support::telemetry::keepalive_acknowledged(state.deadline); // the old deadline
            state.deadline = deadline;
            state.boot_deadline = crate::support::clock::boot_deadline(deadline);
            state.ttl = ttl;
        }
    }

    /// Why the session ended, or `None` while it is alive. Checks the deadline itself, so
    /// a late keep-alive thread can never make a dead lease look alive.
    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        let state = self.state();
        if let Some(reason) = &state.reason {
            return Some(reason.clone());
        }
        // Either clock: the monotonic one stops while the host is suspended.
        if crate::support::clock::now() >= state.deadline
            || crate::support::clock::boot_now() >= state.boot_deadline
        {
            drop(state);
            self.mark_lost(LossReason::Expired);
            return self.state().reason.clone();
        }
        None
    }

    pub(crate) fn lost_receiver(&self) -> Receiver<()> {
        self.lost_rx.clone()
    }

    /// Resolves when the session is lost (for waits running inside the runtime).
    pub(crate) async fn wait_lost(&self) -> LossReason {
        let mut rx = self.lost_async.subscribe();
        let deadline = self.deadline();
        tokio::select! {
            _ = rx.wait_for(|lost| *lost) => {}
            // The keep-alive thread fires at the deadline too; this is a second line.
            _ = tokio::time::sleep_until(deadline.into()) => {}
        }
        // The deadline may have moved on in the meantime: re-check before reporting.
        loop {
            if let Some(reason) = self.loss_reason() {
                return reason;
            }
            let deadline = self.deadline();
            tokio::select! {
                _ = rx.wait_for(|lost| *lost) => {}
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }

    /// `error`, from a request that used this lease, as the session sees it: etcd's
    /// `requested lease not found` means the lease is gone (revoked elsewhere, or expired
    /// on the server) before the keep-alive told us, so the session is lost now.
    pub(crate) fn judge(&self, error: Error) -> Error {
        match &error {
            Error::Server {
                code: crate::support::error::code::Code::NotFound,
                message,
            } if message.contains(crate::support::etcd_text::LEASE_NOT_FOUND) => {
                self.mark_lost(LossReason::Revoked);
                self.check().err().unwrap_or(error)
            }
            _ => error,
        }
    }

    /// `Err(SessionLost)` once the session is gone.
    pub(crate) fn check(&self) -> Result<()> {
        match self.loss_reason() {
            Some(reason) => Err(Error::SessionLost(reason)),
            None => Ok(()),
        }
    }

    /// Runs the retry-safe `attempt` until etcd answers it: a transient failure (a member
    /// unreachable or without a leader on every endpoint, as during a leader election) is
    /// retried after a quick backoff. Ends with `SessionLost` at once when the session is
    /// lost, also mid-attempt. For the steps of a wait, which a leader change must not end
    /// (rule 5); the wait's own bound ends it at its deadline or cancel.
    pub(crate) async fn retry_while_alive<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut backoff = crate::support::backoff::Backoff::quick();
        loop {
            let answered = tokio::select! {
                result = attempt() => result,
                reason = self.wait_lost() => return Err(Error::SessionLost(reason)),
            };
            match answered {
                Err(e) if e.is_transient() => {
                    tracing::debug!(error = %e, "not answered; retrying");
                    tokio::select! {
                        () = backoff.sleep() => {}
                        reason = self.wait_lost() => return Err(Error::SessionLost(reason)),
                    }
                }
                answered => return answered,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_is_sticky_and_disconnects_receivers() {
        let shared = LeaseState::new(
            1,
            Duration::from_secs(5),
            crate::support::clock::now() + Duration::from_secs(5),
        );
        let rx = shared.lost_receiver();
        assert!(rx.try_recv().is_err());
        assert!(matches!(
            rx.try_recv(),
            Err(crossbeam_channel::TryRecvError::Empty)
        ));
        assert!(shared.mark_lost(LossReason::Orphaned));
        assert!(!shared.mark_lost(LossReason::Expired));
        shared.extend(
            crate::support::clock::now() + Duration::from_secs(60),
            Duration::from_secs(60),
        );
        assert_eq!(shared.loss_reason(), Some(LossReason::Orphaned));
        assert!(matches!(
            rx.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        ));
    }

    #[test]
    fn a_suspend_that_passed_the_deadline_means_lost() {
        // As after a host suspend: the monotonic deadline is still ahead, but the boot
        // clock (which counted the suspended time) is past it.
        let shared = LeaseState::new(
            1,
            Duration::from_secs(5),
            crate::support::clock::now() + Duration::from_secs(5),
        );
        assert_eq!(shared.loss_reason(), None);
        shared.state().boot_deadline = crate::support::clock::boot_now() - Duration::from_millis(1);
        assert_eq!(shared.loss_reason(), Some(LossReason::Expired));
    }

    #[test]
    fn passed_deadline_means_lost() {
        let shared = LeaseState::new(1, Duration::from_secs(2), crate::support::clock::now());
        assert_eq!(shared.loss_reason(), Some(LossReason::Expired));
    }
}
