//! (h): no herd at 256 waiters. 256 waiters queue on a 4-permit semaphore (and, separately,
//! 256 readers behind a write lock), spread round robin over 1, 16 or 256 clients (a client
//! stands for a process). Each release is measured on its own: who was admitted, and what
//! etcd did meanwhile — requests by method, and the watch events it delivered
//! (`etcd_debugging_mvcc_events_total`, counted as etcd sends them to watchers).
//!
//! What "no herd" means here: a released permit admits exactly one waiter and a released
//! write lock all the readers behind it, with no read by anyone, and every client gets one
//! delete event per release whatever number of its waiters share the name (they share one
//! watcher), rather than one per waiter.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use etcd_sync::testing::metrics;
use etcd_sync::{Client, Session};

use crate::args::Args;
use crate::metrics::{Counters, counters};
use crate::stats::Summary;
use crate::{Res, WAIT, connect, join_bounded};

const WAITERS: usize = 256;
const PERMITS: u32 = 4;
/// Releases measured one by one on the semaphore (each admits one waiter).
const RELEASES: usize = 4;
/// After the last waiter enqueued: past every waiter's double check of a just-created
/// watcher, so that only the release itself is measured.
const SETTLE: Duration = Duration::from_millis(800);
/// After the expected admissions: time for any extra (wrong) admission or read to show.
const LINGER: Duration = Duration::from_millis(400);

/// etcd's counters and delivered watch events at one instant.
struct Snapshot {
    counters: Counters,
    events: f64,
}

fn snapshot(endpoint: &str) -> Res<Snapshot> {
    let events = metrics::fetch(endpoint)?
        .get("etcd_debugging_mvcc_events_total", &[])
        .ok_or("etcd's /metrics has no etcd_debugging_mvcc_events_total")?;
    Ok(Snapshot {
        counters: counters(endpoint)?,
        events,
    })
}

/// What one release cost, from two snapshots.
struct Cost {
    admitted: usize,
    txn: f64,
    range: f64,
    events: f64,
}

impl Cost {
    fn between(before: &Snapshot, after: &Snapshot, admitted: usize) -> Cost {
        let c = after.counters.minus(&before.counters);
        Cost {
            admitted,
            txn: Counters::get(&c.handled, "Txn"),
            range: Counters::get(&c.handled, "Range"),
            events: after.events - before.events,
        }
    }
}

/// The waiters of one measurement: threads blocked in an acquire, each counting itself in
/// when admitted and holding until `done`.
struct Queue {
    admitted: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    _clients: Vec<Client>,
}

impl Queue {
    /// Starts `WAITERS` waiters over `clients` clients; `wait` is one waiter's acquire.
    fn start(
        args: &Args,
        clients: usize,
        wait: impl Fn(&Session) -> Res<Box<dyn std::any::Any>> + Send + Sync + 'static,
    ) -> Res<Queue> {
        let wait = Arc::new(wait);
        let pool = (0..clients)
            .map(|_| connect(args))
            .collect::<Res<Vec<_>>>()?;
        let (admitted, failed, done) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let mut threads = Vec::new();
        for i in 0..WAITERS {
            let session = pool[i % clients].session()?;
            let (wait, admitted, failed, done) =
                (wait.clone(), admitted.clone(), failed.clone(), done.clone());
            threads.push(thread::spawn(move || {
                match wait(&session) {
                    Ok(guard) => {
                        admitted.fetch_add(1, Ordering::SeqCst);
                        while !done.load(Ordering::SeqCst) {
                            thread::sleep(Duration::from_millis(5));
                        }
                        drop(guard);
                    }
                    Err(_) => {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
                let _ = session.close();
            }));
        }
        Ok(Queue {
            admitted,
            failed,
            done,
            threads,
            _clients: pool,
        })
    }

    fn admitted(&self) -> usize {
        self.admitted.load(Ordering::SeqCst)
    }

    /// Waits until `n` were admitted (or `WAIT` passed), then `LINGER` more.
    fn admitted_after(&self, n: usize) -> usize {
        let deadline = Instant::now() + WAIT;
        while self.admitted() < n && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        thread::sleep(LINGER);
        self.admitted()
    }

    /// Lets every admitted waiter go and the rest give up; returns the failed waits and
    /// the threads that did not end in time.
    fn finish(self, leave: impl FnOnce()) -> (usize, usize) {
        self.done.store(true, Ordering::SeqCst);
        leave();
        let left = join_bounded(self.threads, Instant::now() + WAIT * 2);
        (self.failed.load(Ordering::SeqCst), left)
    }
}

/// Waits until `n` keys exist under `prefix`, then `SETTLE`.
fn queued(client: &Client, prefix: &str, n: usize) -> Res<()> {
    let deadline = Instant::now() + WAIT;
    while client.get_prefix(prefix)?.len() < n {
        if Instant::now() > deadline {
            return Err(format!("fewer than {n} keys under {prefix} after {WAIT:?}").into());
        }
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(SETTLE);
    Ok(())
}

/// A 4-permit semaphore, 4 holders, `WAITERS` waiters; `RELEASES` permits released one by one.
fn semaphore(args: &Args, clients: usize) -> Res<Vec<Cost>> {
    let name = format!("{}/herd-sem-{clients}", args.prefix);
    let owner = connect(args)?;
    let holders: Vec<Session> = (0..PERMITS)
        .map(|_| owner.session())
        .collect::<Result<_, _>>()?;
    let mut held = Vec::new();
    for s in &holders {
        held.push(s.semaphore(&name, PERMITS)?.acquire_timeout(WAIT)?);
    }
    let n = name.clone();
    let queue = Queue::start(args, clients, move |s| {
        Ok(Box::new(
            s.semaphore(&n, PERMITS)?.acquire_timeout(WAIT * 4)?,
        ))
    })?;
    queued(&owner, &format!("{name}/"), WAITERS + PERMITS as usize)?;
    let mut costs = Vec::new();
    for r in 1..=RELEASES {
        let before = snapshot(&args.endpoints[0])?;
        drop(held.remove(0));
        let admitted = queue.admitted_after(r) - (r - 1);
        costs.push(Cost::between(
            &before,
            &snapshot(&args.endpoints[0])?,
            admitted,
        ));
    }
    // The rest go through one by one: each admitted waiter sees `done` and releases.
    let (failed, left) = queue.finish(move || drop(held));
    if failed + left > 0 {
        return Err(format!("{failed} semaphore waiters failed, {left} did not end").into());
    }
    Ok(costs)
}

/// A write lock with `WAITERS` readers queued behind it; one release admits them all.
fn rwlock(args: &Args, clients: usize) -> Res<Cost> {
    let name = format!("{}/herd-rw-{clients}", args.prefix);
    let owner = connect(args)?;
    let writer = owner.session()?;
    let w = writer.rwlock(&name)?.write_timeout(WAIT)?;
    let n = name.clone();
    let queue = Queue::start(args, clients, move |s| {
        Ok(Box::new(s.rwlock(&n)?.read_timeout(WAIT * 4)?))
    })?;
    queued(&owner, &format!("{name}/"), WAITERS + 1)?;
    let before = snapshot(&args.endpoints[0])?;
    drop(w);
    let admitted = queue.admitted_after(WAITERS);
    let cost = Cost::between(&before, &snapshot(&args.endpoints[0])?, admitted);
    let (failed, left) = queue.finish(|| ());
    if failed + left > 0 {
        return Err(format!("{failed} readers failed, {left} did not end").into());
    }
    Ok(cost)
}

/// The phase: both primitives over 1, 16 and 256 clients.
pub fn herd(args: &Args, summary: &mut Summary) -> Res<()> {
    let mut wrong = Vec::new();
    for clients in [1, 16, WAITERS] {
        let costs = semaphore(args, clients)?;
        let n = costs.len() as f64;
        let mean = |f: fn(&Cost) -> f64| costs.iter().map(f).sum::<f64>() / n;
        let admitted: Vec<usize> = costs.iter().map(|c| c.admitted).collect();
        if admitted.iter().any(|&a| a != 1) {
            wrong.push(format!(
                "semaphore over {clients} clients admitted {admitted:?}"
            ));
        }
        println!(
            "RESULT rust herd_semaphore waiters={WAITERS} clients={clients} releases={} \
             admitted_per_release={admitted:?} events_per_release={:.1} \
             range_per_release={:.2} txn_per_release={:.2}",
            costs.len(),
            mean(|c| c.events),
            mean(|c| c.range),
            mean(|c| c.txn),
        );
        let rw = rwlock(args, clients)?;
        if rw.admitted != WAITERS {
            wrong.push(format!(
                "write lock release over {clients} clients admitted {} of {WAITERS} readers",
                rw.admitted
            ));
        }
        println!(
            "RESULT rust herd_rwlock waiters={WAITERS} clients={clients} admitted={} \
             events={:.0} range={:.0} txn={:.0}",
            rw.admitted, rw.events, rw.range, rw.txn,
        );
        summary.lines.push(format!(
            "  (h) {WAITERS} waiters over {clients} clients: a released permit admits {:?}, \
             {:.1} watch events, {:.2} Range; a released write lock admits {} readers, \
             {:.0} watch events, {:.0} Range",
            admitted,
            mean(|c| c.events),
            mean(|c| c.range),
            rw.admitted,
            rw.events,
            rw.range,
        ));
    }
    if !wrong.is_empty() {
        return Err(wrong.join("; ").into());
    }
    Ok(())
}
