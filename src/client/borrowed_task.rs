//! How the blocking seam runs a call. A caller alone drives the runtime itself and polls its
//! future in its `block_on` (`client/driver.rs`), so the answer wakes it in `epoll`. A
//! caller that finds others inside makes its future, which may borrow the caller's stack, a
//! task of the client's runtime, and sleeps in `block_on` until that task, run by the
//! driving thread, has ended: it wakes once. Polling the future on the caller's thread while
//! another thread drove (tokio's `Handle::block_on` on the future itself) woke the caller
//! for each step and the driver for each request it sent: at 256 processes about 6 and 11
//! wake-ups per acquisition (docs/design/blocking-seam.md).
//!
//! The future may borrow the caller's stack. That is sound because the caller does not
//! return until the task has finished or has been dropped unfinished (see [`Task`]), and
//! takes the output only then: nothing the future borrows is used after the caller's frame returns.
//! `client/simulated.rs` runs a simulated process's calls the same way, with a baton in
//! place of the [`Ended`] flag.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};

use super::driver::Driver;
use crate::support::error::{Error, Result};

/// Runs `fut` on the calling thread if it drives `driver`'s runtime alone; else as a task of
/// that runtime, keeping the calling thread in its `block_on` (driving it, or waiting for
/// the thread that does) until the task has ended.
/// Its output; `Err(Closed)` if the runtime dropped it unfinished (it shuts
/// down). A panic of `fut` resumes on the calling thread.
pub(crate) fn run<T: Send, F: Future<Output = T> + Send>(driver: &Driver, fut: F) -> Result<T> {
    // Alone, the caller drives and polls its future itself: nothing to hand over.
    let fut = match driver.run_if_alone(fut)? {
        Ok(out) => return Ok(out),
        Err(fut) => fut,
    };
    let handle = driver.handle()?;
    // SAFETY: `work` may borrow this thread's stack, and `T` may hold borrows. This thread
    // does not return before `ended` is set (`Ended::wait` below, also after a panic of
    // the driving), and `Task` sets it only after it dropped `work`: when `work`
    // completed, when its poll panicked, or when the task is dropped unfinished (the
    // runtime shuts down, or it refused the task and dropped it inside `spawn`). Only
    // then is the output taken; nothing `work` borrows is used after this frame returns.
    let (work, slot) = unsafe { erase(fut) };
    let ended = Arc::new(Ended::default());
    drop(handle.spawn(Task {
        work: Some(work),
        ended: Some(ended.clone()),
    }));
    // Drive the runtime (or wait for the thread that does) until the task has ended.
    let driven = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        driver.block_on(std::future::poll_fn(|cx| ended.poll_set(cx)))
    }));
    if let Some(panic) = ended.wait() {
        std::panic::resume_unwind(panic);
    }
    if let Err(panic) = driven {
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
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    outcome: Option<Outcome>,
    /// The caller's `block_on`, woken when the outcome is set.
    waker: Option<Waker>,
}

/// How a task ended: its work done or dropped, or its poll panicked (the payload).
enum Outcome {
    Done,
    Panicked(Box<dyn Any + Send>),
}

impl Ended {
    fn set(&self, outcome: Outcome) {
        let waker = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.outcome = Some(outcome);
            state.waker.take()
        };
        self.changed.notify_one();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Ready once set (the outcome stays for [`Ended::wait`]).
    fn poll_set(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.outcome.is_some() {
            return Poll::Ready(());
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Parks until set; the panic's payload, if the work panicked.
    fn wait(&self) -> Option<Box<dyn Any + Send>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match state.outcome.take() {
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
    use crate::support::clock::{now, since};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn the_future_borrows_the_callers_stack_and_the_caller_drives_it() {
        let driver = Driver::start().unwrap();
        let caller = std::thread::current().id();
        let mut on_caller = 0;
        for _ in 0..100 {
            let mut seen = Vec::new();
            let out = run(&driver, async {
                tokio::time::sleep(Duration::from_micros(200)).await;
                seen.push(std::thread::current().id());
                seen.len()
            });
            assert_eq!(out.unwrap(), 1);
            on_caller += usize::from(seen[0] == caller);
        }
        // Call after call, the caller drives the runtime itself (the idle thread leaves it
        // to callers for `LINGER` after each); a call may find the idle thread mid-tick.
        assert!(
            on_caller >= 80,
            "{on_caller} of 100 calls ran on the caller"
        );
    }

    #[test]
    fn a_caller_waits_for_its_task_while_another_caller_drives() {
        let driver = Driver::start().unwrap();
        std::thread::scope(|scope| {
            let long = scope.spawn(|| {
                run(&driver, async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    now()
                })
                .unwrap()
            });
            std::thread::sleep(Duration::from_millis(50));
            let caller = std::thread::current().id();
            let (ran_on, done) = run(&driver, async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                (std::thread::current().id(), now())
            })
            .unwrap();
            let long_done = long.join().unwrap();
            assert!(done < long_done, "the short call ended before the long one");
            assert_ne!(
                ran_on, caller,
                "its task ran on the driving caller's thread"
            );
        });
    }

    #[test]
    fn call_after_call_the_caller_does_not_wake_the_idle_thread_each_time() {
        let driver = Driver::start().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let before = driver.idle_looks();
        let started = now();
        let calls = 300;
        for _ in 0..calls {
            // An answer 200 µs later, from another thread (as from a socket).
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(200));
                let _ = tx.send(());
            });
            run(&driver, rx).unwrap().unwrap();
        }
        // Naps of 1, 2, 4, 8 ms and a sleep until the caller leaves: about seven looks per
        // 16 ms of calls, however many calls (when every call's end woke it, 187-234 looks in
        // 300 calls of 80-100 ms).
        let looks = driver.idle_looks() - before;
        let ms = since(started).as_millis() as u64;
        assert!(
            looks <= ms / 2 + 20,
            "the idle thread looked {looks} times in {calls} calls, {ms} ms"
        );
    }

    #[test]
    fn a_caller_that_is_not_alone_leaves_the_driving_to_the_idle_thread() {
        let driver = Driver::start().unwrap();
        std::thread::scope(|scope| {
            let alone = scope.spawn(|| {
                run(&driver, async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                })
            });
            std::thread::sleep(Duration::from_millis(20));
            // Comes in while the first caller drives, and goes on after it left: its task
            // is then driven by the idle thread, at once (not by this caller).
            let (name, took) = run(&driver, async {
                let started = now();
                tokio::time::sleep(Duration::from_millis(300)).await;
                (
                    std::thread::current().name().map(str::to_owned),
                    since(started),
                )
            })
            .unwrap();
            alone.join().unwrap().unwrap();
            assert_eq!(name.as_deref(), Some("etcd-sync-runtime"));
            assert!(took < Duration::from_millis(400), "{took:?}");
        });
    }

    #[test]
    fn the_idle_thread_drives_background_tasks_while_no_caller_does() {
        let driver = Driver::start().unwrap();
        let fired = Arc::new(AtomicBool::new(false));
        let set = fired.clone();
        drop(driver.handle().unwrap().spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            set.store(true, Ordering::SeqCst);
        }));
        let started = now();
        while !fired.load(Ordering::SeqCst) {
            assert!(
                since(started) < Duration::from_secs(2),
                "a timer with no caller inside never fired"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(since(started) < Duration::from_millis(500));
    }

    #[test]
    fn a_panic_of_the_future_resumes_on_the_caller() {
        let driver = Driver::start().unwrap();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(&driver, async { panic!("boom in the task") })
        }));
        let payload = caught.expect_err("the panic reaches the caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom in the task"));
        // The runtime lives on: the next call runs.
        assert_eq!(run(&driver, async { 7 }).unwrap(), 7);
    }

    /// What a guard does when dropped: releases in the background inside the runtime's
    /// context, else with a blocking call on the same client.
    struct Releases<'a> {
        driver: &'a Driver,
        inside: &'a AtomicBool,
    }

    impl Drop for Releases<'_> {
        fn drop(&mut self) {
            if crate::client::blocking::inside_async() {
                self.inside.store(true, Ordering::SeqCst);
            } else {
                let _ = run(self.driver, async {});
            }
        }
    }

    #[test]
    fn a_guard_dropped_by_a_panic_of_the_future_releases_inside_the_runtime() {
        let driver = Arc::new(Driver::start().unwrap());
        let inside = Arc::new(AtomicBool::new(false));
        let (done, ended) = std::sync::mpsc::channel();
        let (d, i) = (driver.clone(), inside.clone());
        // On its own thread, bounded: the guard is dropped as the panic unwinds through the
        // future's poll, in the runtime's context. Its probe of that context, the first in
        // this process when run alone, once installed the probe's panic hook there, which
        // panicked again while unwinding (an abort).
        std::thread::spawn(move || {
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run(&d, async {
                    let _guard = Releases {
                        driver: &d,
                        inside: &i,
                    };
                    tokio::task::yield_now().await;
                    panic!("boom while holding")
                })
            }));
            let _ = done.send(caught.is_err());
        });
        let panicked = ended
            .recv_timeout(Duration::from_secs(5))
            .expect("the call ends (no hang in the guard's drop)");
        assert!(panicked, "the panic reaches the caller");
        assert!(
            inside.load(Ordering::SeqCst),
            "dropped in the runtime's context"
        );
        assert_eq!(run(&driver, async { 7 }).unwrap(), 7);
    }

    #[test]
    fn dropping_the_driver_stops_its_idle_thread() {
        let driver = Driver::start().unwrap();
        let running = Arc::new(());
        let held = running.clone();
        drop(driver.handle().unwrap().spawn(async move {
            let _held = held;
            std::future::pending::<()>().await;
        }));
        assert_eq!(run(&driver, async { 1 }).unwrap(), 1);
        drop(driver);
        // The runtime was dropped with it, and the pending task's future with that.
        assert_eq!(Arc::strong_count(&running), 1);
    }
}
