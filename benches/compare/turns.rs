//! State shared by threads taking turns on one lock (the contended, diagnose and scaling
//! phases): who released last and when, and the mutual-exclusion checks.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex as StdMutex, MutexGuard as StdMutexGuard};
use std::time::{Duration, Instant};

/// Locks `m` even if a thread panicked while holding it: the figures collected so far are
/// still worth reporting, and a panic is reported on its own.
pub fn locked<T>(m: &StdMutex<T>) -> StdMutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct Turns {
    /// When the last holder started its release, and which worker it was.
    pub slot: StdMutex<Option<(Instant, usize)>>,
    /// How many workers believe they hold the lock (more than one: a violation).
    holders: AtomicI64,
    /// The latest holder's fencing token (tokens must grow).
    last_token: AtomicI64,
    pub violations: AtomicU64,
    errors: StdMutex<Vec<String>>,
    /// Set on the first error, or when enough turns were taken: every worker stops.
    pub stop: AtomicBool,
}

impl Turns {
    pub fn new() -> Turns {
        Turns {
            slot: StdMutex::new(None),
            holders: AtomicI64::new(0),
            last_token: AtomicI64::new(0),
            violations: AtomicU64::new(0),
            errors: StdMutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        }
    }

    /// Called right after `lock()` returned: checks exclusion and returns the handoff
    /// latency if the lock came from another worker.
    pub fn enter(&self, me: usize, token: i64, acquired: Instant) -> Option<Duration> {
        if self.holders.fetch_add(1, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        if self.last_token.swap(token, Ordering::SeqCst) >= token {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        match *locked(&self.slot) {
            Some((released, who)) if who != me => {
                Some(acquired.saturating_duration_since(released))
            }
            _ => None,
        }
    }

    /// Called right before the guard is released.
    pub fn leave(&self, me: usize) {
        self.holders.fetch_sub(1, Ordering::SeqCst);
        *locked(&self.slot) = Some((Instant::now(), me));
    }

    /// Records an error and stops every worker.
    pub fn error(&self, e: impl std::fmt::Display) {
        self.stop.store(true, Ordering::SeqCst);
        locked(&self.errors).push(e.to_string());
    }

    /// The errors recorded so far (taken out).
    pub fn take_errors(&self) -> Vec<String> {
        std::mem::take(&mut *locked(&self.errors))
    }
}
