//! Issue 30: barriers beside the mutex, interleaved in one run (`--handoffs` rounds), so
//! that drift hits every figure alike:
//!
//! * `mutex_lock_unlock`: lock + unlock of one Mutex, uncontended;
//! * `mutex_handoff`: a holder's `release` called → a waiter (another session, blocked in
//!   `lock`) returns with the lock;
//! * `latch_wake`: the last `count_down` of a `CountDownLatch` called → a waiter blocked in
//!   `wait` returns;
//! * `barrier_wake`: `Barrier::release` called → a waiter blocked in `wait` returns;
//! * `double_barrier_2`, `double_barrier_4`: one round trip of a `DoubleBarrier` of 2 and
//!   of 4 participants (each its own session and thread): all told to go → all returned
//!   from `enter` and then `leave`.
//!
//! Each waiter says it is about to block, and the wake is triggered 150 ms later (its
//! watcher is synced by then), and for `*_early` 20 ms later (its watcher may still be
//! unsynced, see [`EARLY`]); the wake time is taken on the waiter's own thread.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::stats::{Summary, report};
use crate::{Res, WAIT, connect};

/// How long after a waiter says it is about to block the wake is triggered: soon, and
/// once its watcher is surely synced. A barrier's or latch's wait creates its watcher one
/// revision early (`transport/watches/watcher.rs`, for etcd #18089), so etcd serves it
/// *unsynced* at first: an event in its first ~100 ms waits for etcd's sync loop.
const EARLY: Duration = Duration::from_millis(20);
const SYNCED: Duration = Duration::from_millis(150);

/// A thread that, on each request, signals `ready`, blocks in `wait`, and reports when it
/// returned.
struct Waiter {
    go: Sender<()>,
    ready: Receiver<()>,
    woke: Receiver<Res<Instant>>,
    thread: JoinHandle<()>,
}

impl Waiter {
    /// `wait` blocks, and returns when it woke.
    fn spawn(wait: impl Fn() -> Res<Instant> + Send + 'static) -> Waiter {
        let (go, go_rx) = channel::<()>();
        let (ready_tx, ready) = channel();
        let (woke_tx, woke) = channel();
        let thread = thread::spawn(move || {
            while go_rx.recv().is_ok() {
                let _ = ready_tx.send(());
                if woke_tx.send(wait()).is_err() {
                    break;
                }
            }
        });
        Waiter {
            go,
            ready,
            woke,
            thread,
        }
    }

    /// One wake: starts the wait, runs `trigger` `settle` after it said it blocks, returns
    /// trigger → wake.
    fn once(&self, settle: Duration, trigger: impl FnOnce() -> Res<()>) -> Res<Duration> {
        self.go.send(())?;
        self.ready.recv()?;
        thread::sleep(settle);
        let t0 = Instant::now();
        trigger()?;
        let woke = self.woke.recv_timeout(WAIT)??;
        Ok(woke.saturating_duration_since(t0))
    }

    fn stop(self) {
        drop(self.go);
        let _ = self.thread.join();
    }
}

/// `n` participants of one double barrier, each its own session and thread; each round:
/// all go, each enters and leaves, the round ends when all have returned.
struct Round {
    go: Vec<Sender<()>>,
    done: Receiver<Res<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl Round {
    fn spawn(args: &Args, name: String, n: usize) -> Res<Round> {
        let (done_tx, done) = channel();
        let (mut go, mut threads) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let session = connect(args)?.session()?;
            let barrier = session.double_barrier(&name, n)?;
            let (go_tx, go_rx) = channel::<()>();
            let done_tx = done_tx.clone();
            threads.push(thread::spawn(move || {
                while go_rx.recv().is_ok() {
                    let result = barrier
                        .enter_timeout(WAIT)
                        .and_then(|()| barrier.leave_timeout(WAIT))
                        .map_err(Into::into);
                    if done_tx.send(result).is_err() {
                        break;
                    }
                }
                let _ = session.close();
            }));
            go.push(go_tx);
        }
        Ok(Round { go, done, threads })
    }

    fn once(&self) -> Res<Duration> {
        let t0 = Instant::now();
        for go in &self.go {
            go.send(())?;
        }
        for _ in &self.go {
            self.done.recv_timeout(WAIT)??;
        }
        Ok(t0.elapsed())
    }

    fn stop(self) {
        drop(self.go);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

const FIGURES: [(&str, &str); 8] = [
    (
        "mutex_lock_unlock",
        "lock + unlock: one Mutex (beside barriers)",
    ),
    ("mutex_handoff", "Mutex handoff: release → the waiter holds"),
    (
        "latch_wake",
        "CountDownLatch: last count_down → the waiter returns",
    ),
    ("latch_wake_early", "the same, 20 ms after the wait began"),
    ("barrier_wake", "Barrier: release → the waiter returns"),
    ("barrier_wake_early", "the same, 20 ms after the wait began"),
    (
        "double_barrier_2",
        "DoubleBarrier of 2: enter + leave, one round",
    ),
    (
        "double_barrier_4",
        "DoubleBarrier of 4: enter + leave, one round",
    ),
];

pub fn barriers(args: &Args, summary: &mut Summary) -> Res<()> {
    let prefix = format!("{}/barriers", args.prefix);
    let client = connect(args)?;
    let session = client.session()?;
    let mutex = session.mutex(format!("{prefix}/mutex"))?;
    let handoff_name = format!("{prefix}/handoff");
    let holder = session.mutex(&handoff_name)?;
    let waiter_session = connect(args)?.session()?;
    let mutex_waiter = {
        let m = waiter_session.mutex(&handoff_name)?;
        Waiter::spawn(move || {
            let guard = m.lock_timeout(WAIT)?;
            let woke = Instant::now();
            guard.release()?;
            Ok(woke)
        })
    };
    let latch = client.count_down_latch(format!("{prefix}/latch"))?;
    let latch_waiter = {
        let l = connect(args)?.count_down_latch(format!("{prefix}/latch"))?;
        Waiter::spawn(move || {
            l.wait_timeout(WAIT)?;
            Ok(Instant::now())
        })
    };
    let barrier = client.barrier(format!("{prefix}/barrier"))?;
    let barrier_waiter = {
        let b = connect(args)?.barrier(format!("{prefix}/barrier"))?;
        Waiter::spawn(move || {
            b.wait_timeout(WAIT)?;
            Ok(Instant::now())
        })
    };
    let two = Round::spawn(args, format!("{prefix}/double-2"), 2)?;
    let four = Round::spawn(args, format!("{prefix}/double-4"), 4)?;

    let one = |which: usize| -> Res<Duration> {
        match which {
            0 => {
                let t0 = Instant::now();
                mutex.lock_timeout(WAIT)?.release()?;
                Ok(t0.elapsed())
            }
            1 => {
                let guard = holder.lock_timeout(WAIT)?;
                mutex_waiter.once(SYNCED, || Ok(guard.release()?))
            }
            2 | 3 => {
                if !latch.try_set_count(1)? {
                    return Err("the latch was set already".into());
                }
                let settle = if which == 2 { SYNCED } else { EARLY };
                latch_waiter.once(settle, || {
                    latch.count_down()?;
                    Ok(())
                })
            }
            4 | 5 => {
                if !barrier.hold()? {
                    return Err("the barrier was up already".into());
                }
                let settle = if which == 4 { SYNCED } else { EARLY };
                barrier_waiter.once(settle, || {
                    barrier.release()?;
                    Ok(())
                })
            }
            6 => two.once(),
            _ => four.once(),
        }
    };
    let rounds = args.handoffs.max(10);
    for i in 0..rounds / 10 {
        for k in 0..FIGURES.len() {
            one((i + k) % FIGURES.len())?;
        }
    }
    let mut samples: [Vec<Duration>; FIGURES.len()] = Default::default();
    for i in 0..rounds {
        for k in 0..FIGURES.len() {
            // Rotate which goes first, so no figure always follows the same one.
            let which = (i + k) % FIGURES.len();
            samples[which].push(one(which)?);
        }
    }
    let mut medians = Vec::new();
    for ((figure, row), samples) in FIGURES.iter().zip(&samples) {
        let st = report(figure, samples, "");
        summary.latency(row, st);
        medians.push(st.map(|s| s.median));
    }
    if let [
        Some(lock),
        Some(handoff),
        Some(latch),
        Some(barrier),
        Some(d2),
        Some(d4),
    ] = medians[..]
    {
        summary.text(format!(
            "at the median, beside one Mutex lock + unlock ({lock:.0} µs) and its handoff \
             ({handoff:.0} µs): latch wake {latch:.0} µs, barrier wake {barrier:.0} µs, \
             double barrier round {d2:.0} µs with 2, {d4:.0} µs with 4"
        ));
    }
    mutex_waiter.stop();
    latch_waiter.stop();
    barrier_waiter.stop();
    two.stop();
    four.stop();
    waiter_session.close()?;
    session.close()?;
    Ok(())
}
