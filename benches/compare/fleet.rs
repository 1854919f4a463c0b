//! Many contenders in one process, each standing for a process of its own: its own
//! [`Client`] (one connection, one runtime thread) and its own [`Session`]. Up to 1,024 of
//! them: the open-file limit is raised to its hard limit, connections are set up by a
//! bounded pool of threads, and they are closed the same way.
//!
//! Also the measuring window of the contender-count rows: etcd's counters, delivered watch
//! events and CPU are read once the line is full (warm-up done) and once the window ends,
//! and only the acquisitions between the two count.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use etcd_sync::{Client, Session};

use crate::Res;
use crate::args::Args;
use crate::metrics::{Snapshot, snapshot, watchers};

/// The time limit of one wait in a row. A waiter at the back of a line of 1,024 waits for
/// every other contender's turn, which at the low rates of the large rows takes far longer
/// than the driver's usual 30 s bound; rows end by cancelling their waiters instead.
pub const ROW_WAIT: Duration = Duration::from_secs(600);

/// Threads that connect (or close) contenders at once.
const SETUP_THREADS: usize = 16;
/// Stack of a contender's own thread: the default (a blocking call runs the library's
/// future on the caller's thread; 256 KiB overflowed). Only what is touched is resident.
pub const WORKER_STACK: usize = 2 * 1024 * 1024;

/// A contender: what a process of its own would have.
pub struct Contender {
    pub client: Client,
    pub session: Session,
}

/// Raises the soft open-file limit to the hard limit; returns the soft limit now in force.
/// Each contender holds a connection plus its runtime's epoll and wake-up descriptors.
pub fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                return want.rlim_cur;
            }
        }
        lim.rlim_cur
    }
}

/// `n` contenders, connected by at most [`SETUP_THREADS`] threads at once.
pub fn connect_many(args: &Args, n: usize) -> Res<Vec<Contender>> {
    let limit = raise_nofile();
    // A connection, an epoll and an eventfd or two per contender, and the rest.
    if limit != 0 && (limit as usize) < n * 4 + 256 {
        eprintln!("compare: open-file limit {limit} may be too low for {n} contenders (ulimit -n)");
    }
    let (tx, rx) = mpsc::channel::<(usize, Res<Contender>)>();
    let next = AtomicU64::new(0);
    thread::scope(|s| {
        for _ in 0..SETUP_THREADS.min(n) {
            let (tx, next) = (tx.clone(), &next);
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                    if i >= n {
                        return;
                    }
                    let made = Client::builder()
                        .endpoints(&args.endpoints)
                        .shared_runtime(!args.own_runtimes)
                        .connect()
                        .map_err(Into::into)
                        .and_then(|client| {
                            let session = client.session()?;
                            Ok(Contender { client, session })
                        });
                    let failed = made.is_err();
                    let _ = tx.send((i, made));
                    if failed {
                        next.store(n as u64, Ordering::SeqCst);
                        return;
                    }
                }
            });
        }
    });
    drop(tx);
    let mut made: Vec<(usize, Contender)> = Vec::with_capacity(n);
    let mut first_error = None;
    for (i, r) in rx {
        match r {
            Ok(c) => made.push((i, c)),
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    if let Some(e) = first_error {
        close_many(made.into_iter().map(|(_, c)| c).collect());
        return Err(format!("connecting {n} contenders: {e}").into());
    }
    made.sort_by_key(|(i, _)| *i);
    Ok(made.into_iter().map(|(_, c)| c).collect())
}

/// Closes every session and drops every client, [`SETUP_THREADS`] at a time.
pub fn close_many(contenders: Vec<Contender>) {
    let mut shares: Vec<Vec<Contender>> = (0..SETUP_THREADS).map(|_| Vec::new()).collect();
    for (i, c) in contenders.into_iter().enumerate() {
        shares[i % SETUP_THREADS].push(c);
    }
    thread::scope(|s| {
        for share in shares {
            s.spawn(move || {
                for Contender { client, session } in share {
                    let _ = session.close();
                    // Joins the client's runtime thread.
                    drop(client);
                }
            });
        }
    });
}

/// The measured part of a row: from the end of the warm-up to the end of the window.
pub struct Window {
    /// Acquisition counts at both ends (the mean of the counts before and after each
    /// /metrics read, which takes a few milliseconds).
    pub first: u64,
    pub last: u64,
    pub start: Instant,
    pub end: Instant,
    pub before: Snapshot,
    pub after: Snapshot,
    /// Whether the window ended on its time bound rather than its acquisition count.
    pub timed_out: bool,
}

impl Window {
    pub fn acquisitions(&self) -> u64 {
        self.last.saturating_sub(self.first)
    }
    pub fn throughput(&self) -> f64 {
        self.acquisitions() as f64 / (self.end - self.start).as_secs_f64().max(1e-9)
    }
    /// Whether acquisition number `c` (1-based) falls inside the window.
    pub fn contains(&self, c: u64) -> bool {
        c > self.first && c <= self.last
    }
}

/// Reads etcd's /metrics with the acquisition count and time at that moment.
fn mark(endpoint: &str, count: &AtomicU64) -> Res<(u64, Instant, Snapshot)> {
    let (c0, t0) = (count.load(Ordering::SeqCst), Instant::now());
    let snap = snapshot(endpoint)?;
    let (c1, t1) = (count.load(Ordering::SeqCst), Instant::now());
    Ok(((c0 + c1) / 2, t0 + (t1 - t0) / 2, snap))
}

/// The shortest warm-up of a row.
const WARMUP_MIN: Duration = Duration::from_secs(1);

/// Waits for `warmup` acquisitions and at least `WARMUP_MIN` (at most `limit`), then measures until `measured` more
/// (at most `limit` again). `failed` ends the waits early (the workers stopped).
pub fn window(
    endpoint: &str,
    count: &AtomicU64,
    warmup: u64,
    measured: u64,
    limit: Duration,
    failed: &dyn Fn() -> bool,
) -> Res<Window> {
    let until = |target: u64, deadline: Instant| {
        while count.load(Ordering::SeqCst) < target && Instant::now() < deadline && !failed() {
            thread::sleep(Duration::from_millis(1));
        }
    };
    let begun = Instant::now();
    until(warmup, begun + limit);
    // Past the waiters' double checks of a just-created watcher (a read each for about
    // 120 ms), which a line of 8 passes in fewer than 8 acquisitions.
    let settled = begun + WARMUP_MIN.min(limit);
    while Instant::now() < settled && !failed() {
        thread::sleep(Duration::from_millis(1));
    }
    if failed() {
        return Err("the workers stopped during the warm-up".into());
    }
    let (first, start, before) = mark(endpoint, count)?;
    until(first + measured, start + limit);
    let (last, end, after) = mark(endpoint, count)?;
    Ok(Window {
        first,
        last,
        start,
        end,
        before,
        after,
        timed_out: last < first + measured,
    })
}

/// Waits (at most `limit`) until etcd is back to `watchers` watchers or fewer and has used
/// under 10 % of a core over the last 500 ms: the removals at the end of a row (every key
/// of a line of N deleted, each delivered to the watchers still open) must not spill into
/// the next row's figures. Returns how long it waited.
pub fn quiesce(endpoint: &str, watchers_at_most: f64, limit: Duration) -> Duration {
    let t = Instant::now();
    let mut last = snapshot(endpoint)
        .ok()
        .map(|s| (Instant::now(), s.cpu_seconds));
    while t.elapsed() < limit {
        thread::sleep(Duration::from_millis(500));
        let now = snapshot(endpoint)
            .ok()
            .map(|s| (Instant::now(), s.cpu_seconds));
        let calm = match (last, now) {
            (Some((t0, c0)), Some((t1, c1))) => (c1 - c0) / (t1 - t0).as_secs_f64() < 0.1,
            _ => false,
        };
        let few = watchers(endpoint)
            .ok()
            .flatten()
            .is_some_and(|w| w <= watchers_at_most);
        if calm && few {
            break;
        }
        last = now;
    }
    t.elapsed()
}
