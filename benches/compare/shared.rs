//! (g): the primitives of issue 14 beside the mutex, in one run: 16 contenders on a
//! 4-permit semaphore, 16 on a read-write lock with 90 % reads, and 16 on a mutex as the
//! reference; each for a fixed time, with etcd's request counters over each run and an
//! exclusion check (never more holders than the primitive allows).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use etcd_sync::Session;

use crate::args::Args;
use crate::metrics::{Counters, counters};
use crate::stats::Summary;
use crate::{Res, WAIT, connect, join_bounded};

const CONTENDERS: usize = 16;
const PERMITS: u32 = 4;
const RUN: Duration = Duration::from_secs(5);

/// What one contender does per turn: acquire, count itself in, leave, release.
#[derive(Clone, Copy, PartialEq)]
enum Primitive {
    Mutex,
    Semaphore,
    /// A read-write lock where this share of turns (in percent) reads.
    RwLock(u64),
}

/// Holders inside right now: exclusive ones count as `EXCLUSIVE`, so one number tells
/// both "too many shared" and "exclusive not alone".
const EXCLUSIVE: usize = 1 << 20;

struct Run {
    acquisitions: u64,
    reads: u64,
    elapsed: Duration,
    violations: u64,
    errors: u64,
    cost: Option<Counters>,
}

/// One contender's handle on the primitive, made once: a handle keeps its name's watcher
/// pinned, so turns after the first need no read (a handle made per turn pays a read to
/// start a watcher each time, which is not what this phase measures).
enum Handle {
    Mutex(etcd_sync::Mutex),
    Semaphore(etcd_sync::Semaphore),
    RwLock(etcd_sync::RwLock),
}

impl Handle {
    fn new(session: &Session, name: &str, primitive: Primitive) -> Res<Handle> {
        Ok(match primitive {
            Primitive::Mutex => Handle::Mutex(session.mutex(name)?),
            Primitive::Semaphore => Handle::Semaphore(session.semaphore(name, PERMITS)?),
            Primitive::RwLock(_) => Handle::RwLock(session.rwlock(name)?),
        })
    }

    fn turn(&self, read: bool) -> Res<Box<dyn std::any::Any>> {
        Ok(match self {
            Handle::Mutex(m) => Box::new(m.lock_timeout(WAIT)?),
            Handle::Semaphore(s) => Box::new(s.acquire_timeout(WAIT)?),
            Handle::RwLock(rw) if read => Box::new(rw.read_timeout(WAIT)?),
            Handle::RwLock(rw) => Box::new(rw.write_timeout(WAIT)?),
        })
    }
}

fn run(args: &Args, name: &str, primitive: Primitive) -> Res<Run> {
    let mut sessions = Vec::new();
    for _ in 0..CONTENDERS {
        let client = connect(args)?;
        let session = client.session()?;
        let handle = Handle::new(&session, name, primitive)?;
        sessions.push((client, session, handle));
    }
    let mut kept = Vec::new();
    let inside = Arc::new(AtomicUsize::new(0));
    let (count, reads, violations, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let allowed = match primitive {
        Primitive::Semaphore => PERMITS as usize,
        _ => 1,
    };
    let before = counters(&args.endpoints[0]).ok();
    let start = Instant::now();
    let mut handles = Vec::new();
    let handles_of: Vec<Arc<Handle>> = sessions
        .drain(..)
        .map(|(client, session, handle)| {
            kept.push((client, session));
            Arc::new(handle)
        })
        .collect();
    for (me, handle) in handles_of.into_iter().enumerate() {
        let (inside, count, reads, violations, errors, stop) = (
            inside.clone(),
            count.clone(),
            reads.clone(),
            violations.clone(),
            errors.clone(),
            stop.clone(),
        );
        handles.push(thread::spawn(move || {
            let mut rng = (me as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            while !stop.load(Ordering::SeqCst) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let read = matches!(primitive, Primitive::RwLock(share) if rng % 100 < share);
                let guard = match handle.turn(read) {
                    Ok(guard) => guard,
                    Err(_) => {
                        errors.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                };
                // Readers and permits add 1, exclusive holders EXCLUSIVE.
                let weight = if read || primitive == Primitive::Semaphore {
                    1
                } else {
                    EXCLUSIVE
                };
                let now = inside.fetch_add(weight, Ordering::SeqCst) + weight;
                let ok = if now >= EXCLUSIVE {
                    now == EXCLUSIVE
                } else {
                    read || now <= allowed
                };
                if !ok {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                count.fetch_add(1, Ordering::SeqCst);
                reads.fetch_add(u64::from(read), Ordering::SeqCst);
                inside.fetch_sub(weight, Ordering::SeqCst);
                drop(guard);
            }
        }));
    }
    thread::sleep(RUN);
    stop.store(true, Ordering::SeqCst);
    let elapsed = start.elapsed();
    let left = join_bounded(handles, Instant::now() + WAIT * 2);
    let after = counters(&args.endpoints[0]).ok();
    for (_client, session) in &kept {
        let _ = session.close();
    }
    Ok(Run {
        acquisitions: count.load(Ordering::SeqCst),
        reads: reads.load(Ordering::SeqCst),
        elapsed,
        violations: violations.load(Ordering::SeqCst) + left as u64,
        errors: errors.load(Ordering::SeqCst),
        cost: before.zip(after).map(|(b, a)| a.minus(&b)),
    })
}

/// The semaphore, the read-write lock and the mutex under the same contention.
pub fn shared(args: &Args, summary: &mut Summary) -> Res<()> {
    let mutex = run(args, "bench-shared-mutex", Primitive::Mutex)?;
    let semaphore = run(args, "bench-shared-sem", Primitive::Semaphore)?;
    let rwlock = run(args, "bench-shared-rw", Primitive::RwLock(90))?;
    let rate = |r: &Run| r.acquisitions as f64 / r.elapsed.as_secs_f64().max(1e-9);
    for (figure, r) in [
        ("shared_mutex", &mutex),
        ("shared_semaphore", &semaphore),
        ("shared_rwlock", &rwlock),
    ] {
        let per = |method: &str| {
            r.cost.as_ref().map_or(f64::NAN, |c| {
                Counters::get(&c.handled, method) / (r.acquisitions.max(1)) as f64
            })
        };
        println!(
            "RESULT rust {figure} contenders={CONTENDERS} throughput_acq_s={:.1} \
             acquisitions={} reads={} violations={} errors={} txn_per_acq={:.2} \
             range_per_acq={:.2} vs_mutex={:.2}",
            rate(r),
            r.acquisitions,
            r.reads,
            r.violations,
            r.errors,
            per("Txn"),
            per("Range"),
            rate(r) / rate(&mutex).max(1e-9),
        );
    }
    summary.lines.push(format!(
        "  (g) {CONTENDERS} contenders: mutex {:.0} acq/s; semaphore of {PERMITS} {:.0} acq/s \
         ({:.2}x); rwlock with 90% reads {:.0} acq/s ({:.2}x); violations {}/{}/{}",
        rate(&mutex),
        rate(&semaphore),
        rate(&semaphore) / rate(&mutex).max(1e-9),
        rate(&rwlock),
        rate(&rwlock) / rate(&mutex).max(1e-9),
        mutex.violations,
        semaphore.violations,
        rwlock.violations,
    ));
    if mutex.violations + semaphore.violations + rwlock.violations > 0 {
        return Err("exclusion violated in the shared phase".into());
    }
    Ok(())
}
