//! The private tokio runtime behind the blocking API.
//!
//! Like `reqwest::blocking`, every blocking call hands its future to the runtime as a task
//! and waits until it has ended (`client/borrowed_task.rs`); the runtime is driven by that
//! caller when it is alone, else by the runtime's idle thread (`client/driver.rs`). Like
//! the `postgres` crate, the runtime is owned in one place. Nothing of tokio shows in the
//! public API.

use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio_util::task::TaskTracker;

pub(crate) use super::blocking::{ensure_blocking_allowed, inside_async};
use super::driver::Driver;

use crate::support::cancel::CancelToken;
use crate::support::error::{Error, Result};

/// Owns the runtime, or a share of the process's shared one. Dropping it stops the runtime
/// and joins its idle thread (the shared one's once its last client is gone), except
/// inside an async context, where the idle thread is left to stop by itself.
pub(crate) struct Runtime {
    rt: Option<Arc<Driver>>,
    /// In a simulated run (feature `simulation`): its scheduler, whose runtime this client
    /// shares instead of owning one.
    #[cfg(feature = "simulation")]
    sim: Option<Arc<super::simulated::Simulation>>,
    /// Background work started with [`Runtime::spawn`] (revokes, releases).
    tasks: TaskTracker,
    /// Stops the background work of this client once it is dropped and [`CLEANUP_GRACE`]
    /// has passed, on a runtime that goes on without it (shared, or simulated), as
    /// dropping a runtime of its own would.
    stop: tokio_util::sync::CancellationToken,
}

/// How long dropping the client waits for background cleanup (a revoke from a dropped
/// session, a release from a guard dropped inside an async runtime) before cancelling it.
const CLEANUP_GRACE: Duration = Duration::from_secs(1);

impl Runtime {
    /// A runtime and its idle thread (`client/driver.rs`), which drives the HTTP/2
    /// connections (pings, GOAWAY, stream resets) while no caller is inside `block_on`.
    /// `shared`: the process's shared one (started by the first client that asks for it,
    /// stopped with the last).
    pub(crate) fn new(shared: bool) -> Result<Runtime> {
        let rt = if shared {
            shared_runtime()?
        } else {
            Arc::new(Driver::start()?)
        };
        Ok(Runtime {
            rt: Some(rt),
            #[cfg(feature = "simulation")]
            sim: None,
            tasks: TaskTracker::new(),
            stop: tokio_util::sync::CancellationToken::new(),
        })
    }

    /// The runtime a client started on this thread runs on, and whether it is a simulated
    /// run's: on a simulated process's thread, the run's runtime (`client/simulated.rs`);
    /// elsewhere, [`Runtime::new`]'s.
    pub(crate) fn for_this_thread(shared: bool) -> Result<(Runtime, bool)> {
        #[cfg(feature = "simulation")]
        if let Some(sim) = super::simulated::current() {
            return Ok((Runtime::simulated(sim), true));
        }
        Ok((Runtime::new(shared)?, false))
    }

    /// The runtime of the simulated run `sim` (see `client/simulated.rs`).
    #[cfg(feature = "simulation")]
    pub(crate) fn simulated(sim: Arc<super::simulated::Simulation>) -> Runtime {
        Runtime {
            rt: None,
            sim: Some(sim),
            tasks: TaskTracker::new(),
            stop: tokio_util::sync::CancellationToken::new(),
        }
    }

    pub(crate) fn handle(&self) -> Result<&tokio::runtime::Handle> {
        #[cfg(feature = "simulation")]
        if let Some(sim) = &self.sim {
            return Ok(sim.handle());
        }
        self.driver()?.handle()
    }

    fn driver(&self) -> Result<&Driver> {
        self.rt.as_deref().ok_or(Error::Closed)
    }

    /// The blocking seam: every blocking call of the crate ends here. Runs `fut` to
    /// completion as a task of the runtime while the calling thread parks (refusing on a
    /// thread that drives async tasks), and returns its result.
    pub(crate) fn block_on<T: Send, E: From<Error> + Send>(
        &self,
        fut: impl Future<Output = std::result::Result<T, E>> + Send,
    ) -> std::result::Result<T, E> {
        #[cfg(feature = "simulation")]
        if let Some(sim) = &self.sim {
            return sim.block_on(fut)?;
        }
        ensure_blocking_allowed()?;
        // Boxed once, here: a recipe's future is kilobytes, and each move on the way to
        // the task (the span's wrapper, the erased task, its first poll) copied it whole
        // (half the client's instructions per uncontended lock, `scripts/callgrind`).
        let fut = Box::pin(fut);
        // The caller's span goes along: events of the call are logged within it.
        let fut = tracing::Instrument::instrument(fut, tracing::Span::current());
        super::borrowed_task::run(self.driver()?, fut)?
    }

    /// Runs `fut` in the background (used for best-effort cleanup from `Drop`).
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let stop = self.stop.clone();
        let fut = async move {
            tokio::select! {
                () = fut => {}
                () = stop.cancelled() => {}
            }
        };
        if let Ok(handle) = self.handle() {
            drop(self.tasks.spawn_on(fut, handle));
        }
    }
}

#[cfg(feature = "simulation")]
impl Runtime {
    /// Stops the background work started with [`Runtime::spawn`] at once (a simulated
    /// process's crash).
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }
}

/// Waits `pause` on the calling thread, or until `cancel` is cancelled. In a simulated run
/// the pause is virtual time, like every other wait there (else a loop that fails at once
/// would spin without time passing, and never be cancelled by a timer).
pub(crate) fn pause(pause: Duration, cancel: &CancelToken) {
    #[cfg(feature = "simulation")]
    if let Some(sim) = super::simulated::current() {
        let cancel = cancel.clone();
        let _ = sim.block_on(async move {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = cancel.wait() => {}
            }
        });
        return;
    }
    let _ = cancel.cancelled().recv_timeout(pause);
}

/// The process's shared runtime while a client uses it.
static SHARED: Mutex<Option<Weak<Driver>>> = Mutex::new(None);

/// The process's shared runtime: the running one, or a new one if no client uses it.
fn shared_runtime() -> Result<Arc<Driver>> {
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = shared.as_ref().and_then(Weak::upgrade) {
        return Ok(rt);
    }
    let rt = Arc::new(Driver::start()?);
    *shared = Some(Arc::downgrade(&rt));
    Ok(rt)
}

impl Drop for Runtime {
    fn drop(&mut self) {
        #[cfg(feature = "simulation")]
        if let Some(sim) = self.sim.take() {
            // As below, in virtual time: a grace for background cleanup, then it stops.
            self.tasks.close();
            let (tasks, stop) = (self.tasks.clone(), self.stop.clone());
            let stopped = async move {
                let _ = tokio::time::timeout(CLEANUP_GRACE, tasks.wait()).await;
                stop.cancel();
            };
            if super::simulated::current().is_some() {
                let _ = sim.block_on(stopped);
            } else {
                drop(sim.handle().spawn(stopped));
            }
            return;
        }
        let Some(rt) = self.rt.take() else {
            return;
        };
        if !inside_async() {
            // Give background cleanup a moment to reach etcd, then stop it. `wait` ends
            // once the tracker is closed and its tasks are done.
            self.tasks.close();
            let (tasks, stop) = (&self.tasks, &self.stop);
            let _ = rt.block_on(async {
                let _ = tokio::time::timeout(CLEANUP_GRACE, tasks.wait()).await;
                stop.cancel();
            });
        } else {
            self.stop.cancel();
        }
        // The last user of the runtime stops it (`Driver`'s drop joins its idle thread and
        // drops the runtime), so no thread of ours outlives the last client.
        drop(rt);
    }
}
