//! Who drives the private runtime: the caller that waits for an answer, else one idle thread.
//!
//! The runtime is tokio's current-thread scheduler, whose sockets, timers and tasks are
//! driven by whichever thread is inside its `block_on`. A blocking call enters `block_on`
//! (`client/borrowed_task.rs`): if no other thread drives at that moment, the caller does,
//! polling its own future, so it sends its own request and sleeps in `epoll` until the
//! answer arrives; the kernel wakes the thread that wants the answer. Go's `concurrency`
//! gets the same from its scheduler (the goroutine that waits runs on the thread the
//! network poller wakes). With a worker thread of its own, each call cost three wake-ups
//! of a sleeping thread instead of one: the worker for the request, the worker for the
//! answer, the caller for the result (issue 49: on 2 cores, 117 µs from an answer's
//! arrival to the next request leaving, against Go's 49, with etcd's own time equal).
//!
//! A caller drives only when it comes in alone. While none does, the idle thread drives, so
//! HTTP/2 pings, watch events, the follow task and background cleanup go on with no call in
//! progress: it takes over [`LINGER`] after the last caller left (a thread making call after
//! call keeps driving itself), or at once when callers are inside that do not drive, and it
//! leaves `block_on` as soon as a lone caller comes in, then naps ([`NAP`]) and sleeps
//! until that caller leaves. A caller that finds others inside runs its future as a task
//! and waits for its end, as with a worker thread: its task runs on the driving thread,
//! and the end wakes it once. So under contention one thread drives, as a worker did,
//! instead of the role passing from caller to caller at every call's end (at 256
//! processes sharing a runtime both measured alike, within the machine's noise).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::support::error::{Error, Result};

/// How long the idle thread leaves the runtime to callers after the last one left. Events
/// that arrive meanwhile wait at most about twice this (rule 2 allows a second).
pub(crate) const LINGER: Duration = Duration::from_millis(1);

/// While a lone caller drives, the idle thread looks again after naps from [`LINGER`]
/// doubling up to this, then sleeps until that caller leaves: a caller that leaves while
/// the idle thread naps is not made to wake it, and the runtime goes undriven for at most
/// one nap (events then wait at most this long, rule 2 allows a second).
const NAP: Duration = Duration::from_millis(16);

/// The runtime and the thread that drives it while no caller does. Dropping it stops and
/// joins that thread, then drops the runtime.
pub(crate) struct Driver {
    shared: Arc<Shared>,
    idle: Option<JoinHandle<()>>,
}

struct Shared {
    rt: Option<tokio::runtime::Runtime>,
    /// Callers inside [`Driver::block_on`] (driving or waiting to).
    callers: AtomicUsize,
    /// When the last caller left, in ns since `epoch`.
    left_at: AtomicU64,
    epoch: Instant,
    /// A caller came in alone and drives (or is about to take over from the idle thread).
    lone: AtomicBool,
    /// Told when a lone caller comes in, so that the idle thread leaves `block_on`.
    wanted: tokio::sync::Notify,
    /// The idle thread sleeps until the lone caller leaves, which wakes it.
    asleep: AtomicBool,
    idle: std::sync::OnceLock<std::thread::Thread>,
    stop: AtomicBool,
    /// Times the idle thread woke and looked (for tests: how often callers wake it).
    looks: AtomicU64,
}

impl Shared {
    fn runtime(&self) -> Result<&tokio::runtime::Runtime> {
        self.rt.as_ref().ok_or(Error::Closed)
    }

    fn now(&self) -> u64 {
        u64::try_from(crate::support::clock::since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The idle thread: drives the runtime while no caller does: at once while callers
    /// wait that do not drive (a caller drives only when it is alone, see
    /// [`Driver::block_on`]), and [`LINGER`] after the last caller left; it leaves as soon
    /// as a lone caller comes in. While a lone caller drives it sleeps until that caller
    /// leaves (a thread blocked in a long wait drives, and nothing else wakes).
    fn idle(&self) {
        let Ok(rt) = self.runtime() else { return };
        let mut nap = LINGER;
        while !self.stop.load(Ordering::SeqCst) {
            self.looks.fetch_add(1, Ordering::Relaxed);
            if self.lone.load(Ordering::SeqCst) && nap < NAP {
                // A caller drives. Look again after a nap that doubles (1, 2, 4, 8 ms):
                // a thread making call after call leaves and comes back many times in
                // between, and is not made to wake this thread at each call's end. A lone
                // caller leaving with others inside wakes it at once (`Inside::drop`).
                std::thread::park_timeout(nap);
                nap *= 2;
                continue;
            }
            if self.lone.load(Ordering::SeqCst) {
                // Until the lone caller leaves (`Inside::drop` clears `lone`, then looks at
                // `asleep`; either it sees it set or this sees `lone` clear: both are
                // sequentially consistent).
                self.asleep.store(true, Ordering::SeqCst);
                if self.lone.load(Ordering::SeqCst) && !self.stop.load(Ordering::SeqCst) {
                    std::thread::park();
                }
                self.asleep.store(false, Ordering::SeqCst);
                // Woken as that caller left: naps again from the start if another (or
                // the same thread's next call) drives by the time this looks.
                nap = LINGER;
                continue;
            }
            nap = LINGER;
            if self.callers.load(Ordering::SeqCst) == 0 {
                let since = Duration::from_nanos(
                    self.now()
                        .saturating_sub(self.left_at.load(Ordering::SeqCst)),
                );
                if since < LINGER {
                    std::thread::park_timeout(LINGER - since);
                    continue;
                }
            }
            rt.block_on(async {
                loop {
                    let wanted = self.wanted.notified();
                    tokio::pin!(wanted);
                    wanted.as_mut().enable();
                    if self.lone.load(Ordering::SeqCst) || self.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    wanted.await;
                }
            });
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            // Where this thread may not block, dropping a runtime would panic; elsewhere
            // dropping it waits for its blocking threads.
            if super::blocking::inside_async() {
                rt.shutdown_background();
            } else {
                drop(rt);
            }
        }
    }
}

impl Driver {
    /// A current-thread runtime and its idle thread.
    pub(crate) fn start() -> Result<Driver> {
        let unavailable = |e: std::io::Error| Error::Unavailable {
            endpoint: None,
            reason: format!("cannot start the I/O runtime: {e}"),
            source: Some(Arc::new(e)),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .thread_name("etcd-sync-blocking")
            .enable_all()
            .build()
            .map_err(unavailable)?;
        let shared = Arc::new(Shared {
            rt: Some(rt),
            callers: AtomicUsize::new(0),
            left_at: AtomicU64::new(0),
            epoch: crate::support::clock::now(),
            lone: AtomicBool::new(false),
            wanted: tokio::sync::Notify::new(),
            asleep: AtomicBool::new(false),
            idle: std::sync::OnceLock::new(),
            stop: AtomicBool::new(false),
            looks: AtomicU64::new(0),
        });
        let idle = shared.clone();
        let thread = std::thread::Builder::new()
            .name("etcd-sync-runtime".into())
            .spawn(move || idle.idle())
            .map_err(unavailable)?;
        let _ = shared.idle.set(thread.thread().clone());
        Ok(Driver {
            shared,
            idle: Some(thread),
        })
    }

    /// How many times the idle thread has woken and looked so far.
    #[cfg(test)]
    pub(crate) fn idle_looks(&self) -> u64 {
        self.shared.looks.load(Ordering::Relaxed)
    }

    pub(crate) fn handle(&self) -> Result<&tokio::runtime::Handle> {
        Ok(self.shared.runtime()?.handle())
    }

    /// Runs `fut` on the calling thread if it comes in alone: it drives the runtime and
    /// polls `fut` itself (no task, no hand-over of the output); `Ok(Err(fut))` when other
    /// callers are inside, for the caller to run it as a task ([`Driver::block_on`]).
    pub(crate) fn run_if_alone<F: Future>(
        &self,
        fut: F,
    ) -> Result<std::result::Result<F::Output, F>> {
        let rt = self.shared.runtime()?;
        let inside = Inside::enter(&self.shared);
        if !inside.lone {
            return Ok(Err(fut));
        }
        Ok(Ok(rt.block_on(fut)))
    }

    /// Runs `fut` to completion on the calling thread. A caller that comes in alone drives
    /// the runtime itself (it takes it over from the idle thread if that drives); one that
    /// finds other callers inside polls only `fut` and sleeps in between, while the idle
    /// thread drives: with many callers one thread keeps driving (warm, and woken only by
    /// what arrives) instead of the role passing from caller to caller at every call's end.
    pub(crate) fn block_on<F: Future>(&self, fut: F) -> Result<F::Output> {
        let rt = self.shared.runtime()?;
        let inside = Inside::enter(&self.shared);
        Ok(if inside.lone {
            rt.block_on(fut)
        } else {
            rt.handle().block_on(fut)
        })
    }
}

/// A caller inside [`Driver::block_on`]; leaving (also by unwinding) records the time and
/// wakes the idle thread if it slept while this one drove alone.
struct Inside<'a> {
    shared: &'a Shared,
    lone: bool,
}

impl<'a> Inside<'a> {
    fn enter(shared: &'a Shared) -> Inside<'a> {
        let lone = shared.callers.fetch_add(1, Ordering::SeqCst) == 0;
        if lone {
            shared.lone.store(true, Ordering::SeqCst);
            shared.wanted.notify_one();
        }
        Inside { shared, lone }
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        let shared = self.shared;
        shared.left_at.store(shared.now(), Ordering::SeqCst);
        if self.lone {
            shared.lone.store(false, Ordering::SeqCst);
        }
        let others = shared.callers.fetch_sub(1, Ordering::SeqCst) > 1;
        // Callers left inside that do not drive need the idle thread now; one asleep
        // until this caller left, too.
        if self.lone
            && (others || shared.asleep.load(Ordering::SeqCst))
            && let Some(idle) = shared.idle.get()
        {
            idle.unpark();
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wanted.notify_one();
        if let Some(idle) = self.idle.take() {
            idle.thread().unpark();
            // Not on the idle thread itself (a task it ran dropped the last client), nor
            // where this thread may not block (an executor's thread would wait for the
            // idle thread's current poll): it leaves its loop at once by itself and drops
            // the runtime when it does.
            if idle.thread().id() != std::thread::current().id() && !super::blocking::inside_async()
            {
                let _ = idle.join();
            }
        }
    }
}
