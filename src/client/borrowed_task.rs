//! How the blocking seam runs a call: the caller's future, which may borrow the caller's
//! stack, becomes a task of the client's runtime, and the calling thread parks until that
//! task has ended. As in `reqwest::blocking`, the caller sleeps once per call and wakes
//! once, when the answer is there; every step in between (a request, its response, a
//! watch event handed over by the watch hub) happens on the runtime's worker thread with no
//! thread switch. Polling the future on the caller's thread instead (tokio's `block_on`)
//! woke the caller for each step and the worker for each request it sent: at 256 processes
//! about 6 and 11 wake-ups per acquisition (docs/design/blocking-seam.md).
//!
//! The future may borrow the caller's stack. That is sound because the caller stays parked
//! until the task has finished or has been dropped unfinished (see [`Task`]), and takes the
//! output only then: nothing the future borrows is used after the caller's frame returns.
//! `client/simulated.rs` runs a simulated process's calls the same way, with a baton in
//! place of the [`Ended`] flag.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};

use crate::support::error::{Error, Result};

/// Runs `fut` as a task of the runtime behind `handle` and parks the calling thread until
/// it has ended. Its output; `Err(Closed)` if the runtime dropped it unfinished (it shuts
/// down). A panic of `fut` resumes on the calling thread.
pub(crate) fn run<T: Send, F: Future<Output = T> + Send>(
    handle: &tokio::runtime::Handle,
    fut: F,
) -> Result<T> {
    // SAFETY: `work` may borrow this thread's stack, and `T` may hold borrows. This thread
    // parks below until `ended` is set, and `Task` sets it only after it dropped `work`:
    // when `work` completed, when its poll panicked, or when the task is dropped unfinished
    // (the runtime shuts down, or it refused the task and dropped it inside `spawn`). Only
    // then is the output taken; nothing `work` borrows is used after this frame returns.
    let (work, slot) = unsafe { erase(fut) };
    let ended = Arc::new(Ended::default());
    drop(handle.spawn(Task {
        work: Some(work),
        ended: Some(ended.clone()),
    }));
    if let Some(panic) = ended.wait() {
        std::panic::resume_unwind(panic);
    }
    let out = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    out.ok_or(Error::Closed)
}

/// A caller's future with its lifetime erased, as a task's work, and the slot its output
/// is put in when it completes.
pub(crate) type Work = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// `fut` as [`Work`] and the slot of its output.
///
/// # Safety
///
/// `fut` may borrow the caller's stack and its output may hold borrows: the caller must not
/// return, nor use anything `fut` borrows, until the work has been dropped (completed, or
/// dropped unfinished), and may take the output only then.
pub(crate) unsafe fn erase<'a, T: Send + 'a, F: Future<Output = T> + Send + 'a>(
    fut: F,
) -> (Work, Arc<Mutex<Option<T>>>) {
    let slot: Arc<Mutex<Option<T>>> = Arc::new(Mutex::new(None));
    let filled = slot.clone();
    let work: Pin<Box<dyn Future<Output = ()> + Send + 'a>> = Box::pin(async move {
        let out = fut.await;
        *filled.lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
    });
    // SAFETY: only the lifetime changes; the caller keeps it alive (above).
    let work: Work = unsafe { std::mem::transmute(work) };
    (work, slot)
}

/// Set once a [`Task`] has dropped its work: the caller may go on.
#[derive(Default)]
struct Ended {
    state: Mutex<Option<Outcome>>,
    changed: Condvar,
}

/// How a task ended: its work done or dropped, or its poll panicked (the payload).
enum Outcome {
    Done,
    Panicked(Box<dyn Any + Send>),
}

impl Ended {
    fn set(&self, outcome: Outcome) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        self.changed.notify_one();
    }

    /// Parks until set; the panic's payload, if the work panicked.
    fn wait(&self) -> Option<Box<dyn Any + Send>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match state.take() {
                Some(Outcome::Done) => return None,
                Some(Outcome::Panicked(payload)) => return Some(payload),
                None => state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }
}

/// A caller's future as a task: when it ends (completed, panicked, or dropped unfinished),
/// its work is dropped first and only then is its caller let go.
struct Task {
    work: Option<Work>,
    ended: Option<Arc<Ended>>,
}

impl Task {
    fn finish(&mut self, outcome: Outcome) {
        // The work first: whatever it borrows from the caller must be gone before the
        // caller runs again.
        self.work = None;
        if let Some(ended) = self.ended.take() {
            ended.set(outcome);
        }
    }
}

impl Future for Task {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(());
        };
        // A panic is caught here rather than by tokio, to hand it to the caller.
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(())) => {
                self.finish(Outcome::Done);
                Poll::Ready(())
            }
            Err(payload) => {
                self.finish(Outcome::Panicked(payload));
                Poll::Ready(())
            }
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.finish(Outcome::Done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn the_future_borrows_the_callers_stack_and_runs_on_the_worker() {
        let rt = runtime();
        let caller = std::thread::current().id();
        let mut seen = Vec::new();
        let out = run(rt.handle(), async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            seen.push(std::thread::current().id());
            seen.len()
        });
        assert_eq!(out.unwrap(), 1);
        assert_ne!(seen[0], caller, "polled on the worker, not the caller");
    }

    #[test]
    fn a_panic_of_the_future_resumes_on_the_caller() {
        let rt = runtime();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(rt.handle(), async { panic!("boom in the task") })
        }));
        let payload = caught.expect_err("the panic reaches the caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom in the task"));
        // The runtime lives on: the next call runs.
        assert_eq!(run(rt.handle(), async { 7 }).unwrap(), 7);
    }

    #[test]
    fn a_runtime_that_shuts_down_lets_the_caller_go_after_dropping_the_future() {
        let rt = runtime();
        let handle = rt.handle().clone();
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let flag = Flag(dropped.clone());
        let caller = std::thread::spawn(move || {
            let out = run(&handle, async move {
                let _flag = flag;
                std::future::pending::<()>().await;
            });
            (
                matches!(out, Err(Error::Closed)),
                dropped.load(std::sync::atomic::Ordering::SeqCst),
            )
        });
        std::thread::sleep(Duration::from_millis(50));
        rt.shutdown_timeout(Duration::from_secs(5));
        let (closed, was_dropped) = caller.join().unwrap();
        assert!(closed, "Err(Closed) for a task dropped unfinished");
        assert!(
            was_dropped,
            "the future was dropped before the caller went on"
        );
    }
}
