//! The blocking seam in a simulated run (feature `simulation`, used by `testing::sim`): one
//! thread drives a current-thread tokio runtime with paused (virtual) time, and each
//! simulated process is an OS thread running the blocking API. A baton makes them take
//! turns: exactly one of them runs at a time, and a process runs only from the moment its
//! `block_on` future completes until its next `block_on` (or its end). So the order of
//! everything is decided by the runtime's single thread, and a run replays exactly from
//! its seed.
//!
//! A process's `block_on` does not poll its future itself: it hands the future to the
//! runtime as a task and parks until the task is done. The future may borrow the process's
//! stack; that is sound because the process stays parked until the task has finished or
//! has been dropped (see [`Task`]).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll};

use crate::support::error::{Error, Result};

/// Who holds the baton.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    Runtime,
    Process(u64),
}

#[derive(Debug)]
struct Baton {
    holder: Holder,
    /// No new `block_on` is served (the run is ending).
    closed: bool,
    next_process: u64,
}

/// One simulated run's scheduler, shared by its runtime and its processes.
#[derive(Debug)]
pub(crate) struct Simulation {
    handle: tokio::runtime::Handle,
    baton: Mutex<Baton>,
    turned: Condvar,
}

thread_local! {
    /// On a simulated process's thread: its run and its id.
    static CURRENT: RefCell<Option<(Arc<Simulation>, u64)>> = const { RefCell::new(None) };
}

/// The run the calling thread is a process of, if any.
pub(crate) fn current() -> Option<Arc<Simulation>> {
    CURRENT.with(|c| c.borrow().as_ref().map(|(s, _)| s.clone()))
}

fn current_process() -> Option<u64> {
    CURRENT.with(|c| c.borrow().as_ref().map(|(_, id)| *id))
}

impl Simulation {
    /// A scheduler for the runtime behind `handle` (current-thread, time paused), whose
    /// thread holds the baton.
    pub(crate) fn new(handle: tokio::runtime::Handle) -> Arc<Simulation> {
        Arc::new(Simulation {
            handle,
            baton: Mutex::new(Baton {
                holder: Holder::Runtime,
                closed: false,
                next_process: 1,
            }),
            turned: Condvar::new(),
        })
    }

    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    fn baton(&self) -> MutexGuard<'_, Baton> {
        self.baton.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives the baton to `to` and waits until it comes back to `me`.
    fn pass(&self, to: Holder, me: Holder) {
        let mut baton = self.baton();
        baton.holder = to;
        self.turned.notify_all();
        while baton.holder != me {
            baton = self.turned.wait(baton).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Ends the run: every later `block_on` fails with [`Error::Closed`] at once.
    pub(crate) fn close(&self) {
        self.baton().closed = true;
    }

    /// Starts a process running `body` on a thread of its own (called on the runtime's
    /// thread, from a task): it runs until its first `block_on` before this returns.
    pub(crate) fn spawn_process<F>(self: &Arc<Self>, name: String, body: F) -> std::io::Result<()>
    where
        F: FnOnce() + Send + 'static,
    {
        let id = {
            let mut baton = self.baton();
            baton.next_process += 1;
            baton.next_process - 1
        };
        let sim = self.clone();
        std::thread::Builder::new().name(name).spawn(move || {
            // Tokio's clock (and so the crate's) is the run's virtual one on this thread.
            let _entered = sim.handle.enter();
            CURRENT.with(|c| *c.borrow_mut() = Some((sim.clone(), id)));
            {
                let mut baton = sim.baton();
                while baton.holder != Holder::Process(id) {
                    baton = sim.turned.wait(baton).unwrap_or_else(|e| e.into_inner());
                }
            }
            // A panicking body still gives the baton back.
            let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
            CURRENT.with(|c| *c.borrow_mut() = None);
            let mut baton = sim.baton();
            baton.holder = Holder::Runtime;
            sim.turned.notify_all();
            drop(baton);
            if let Err(panic) = ended {
                std::panic::resume_unwind(panic);
            }
        })?;
        self.pass(Holder::Process(id), Holder::Runtime);
        Ok(())
    }

    /// The blocking seam on a process's thread: runs `fut` as a task of the run's runtime
    /// and parks until it is done.
    pub(crate) fn block_on<T: Send, F: Future<Output = T> + Send>(
        self: &Arc<Self>,
        fut: F,
    ) -> Result<T> {
        let Some(me) = current_process() else {
            return Err(Error::InsideAsyncRuntime);
        };
        if self.baton().closed {
            return Err(Error::Closed);
        }
        // SAFETY: `work` may borrow this thread's stack, and `T` may hold borrows. This
        // thread parks below until the task has ended: completed, or dropped unfinished
        // (`Task::finish` drops `work` before it passes the baton back, and a task dropped
        // at once by a runtime that is gone is dropped here, on this thread, before
        // `spawn` returns). Only then is the output taken; nothing `work` borrows is used
        // after this frame returns.
        let (work, slot) = unsafe { super::borrowed_task::erase(fut) };
        drop(self.handle.spawn(Task {
            work: Some(work),
            sim: Some(self.clone()),
            process: me,
        }));
        if !self.baton().closed {
            self.pass(Holder::Runtime, Holder::Process(me));
        }
        let out = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        out.ok_or(Error::Closed)
    }
}

/// A process's `block_on` future as a task: when it ends (or is dropped unfinished, when
/// the runtime shuts down), the baton goes back to its process, which waits for it.
struct Task {
    work: Option<super::borrowed_task::Work>,
    sim: Option<Arc<Simulation>>,
    process: u64,
}

impl Task {
    fn finish(&mut self) {
        // The work first: whatever it borrows from the process must be gone before the
        // process runs again.
        self.work = None;
        let Some(sim) = self.sim.take() else {
            return;
        };
        if current_process() == Some(self.process) {
            // Dropped on the process's own thread: the runtime is gone.
            sim.close();
        } else {
            sim.pass(Holder::Process(self.process), Holder::Runtime);
        }
    }
}

impl Future for Task {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(());
        };
        match work.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                self.finish();
                Poll::Ready(())
            }
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.finish();
    }
}
