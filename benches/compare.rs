//! Side-by-side comparison driver: measures etcd-sync against an etcd that is already running
//! (`scripts/bench-compare` starts one and runs this, then etcd's own Go `concurrency`
//! package from `benches/go/main.go`, against the same server).
//!
//! Run: `cargo bench --bench compare -- --endpoints http://127.0.0.1:2379`
//!
//! Options (unknown arguments, such as the `--bench` cargo passes, are ignored):
//!
//! * `--endpoints URL[,URL]` (required; also read from `$ETCD_ENDPOINTS`)
//! * `--n N` uncontended lock+unlock and floor iterations (1000)
//! * `--contenders N` threads in the contended run, each with its own client (8)
//! * `--total N` acquisitions in the contended run (2000)
//! * `--campaigns N` election campaign+resign iterations (500)
//! * `--waiters A,B,..` queue lengths for the scaling run (2,16,256)
//! * `--handoffs N` measured handoffs per queue length (200)
//! * `--sessions N` sessions (and held locks) for the thread and memory figures (1000)
//! * `--only PHASE[,PHASE]` run only some of: uncontended, election, cost, contended,
//!   scaling, diagnose (a shorter contended run while sampling etcd's unsynced-watcher
//!   gauge), resources (threads and memory, measured in a fresh child process)
//! * `--timeout-secs N` the whole run is aborted (exit 3) after this long (900)
//!
//! Every figure is printed as one machine-readable line,
//! `RESULT rust <figure> key=value ...`, latencies in microseconds, followed by a summary.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex as StdMutex, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use etcd_sync::{Client, Compare, CompareOp, Txn, TxnOp};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// Upper bound for every single lock, campaign or hand-over wait in this driver.
const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
struct Args {
    endpoints: Vec<String>,
    n: usize,
    contenders: usize,
    total: usize,
    campaigns: usize,
    waiters: Vec<usize>,
    handoffs: usize,
    hold: Duration,
    sessions: usize,
    only: Option<Vec<String>>,
    timeout: Duration,
    prefix: String,
}

impl Args {
    fn parse() -> Res<Args> {
        let mut args = Args {
            endpoints: std::env::var("ETCD_ENDPOINTS")
                .map(|s| split_list(&s))
                .unwrap_or_default(),
            n: 1000,
            contenders: 8,
            total: 2000,
            campaigns: 500,
            waiters: vec![2, 16, 256],
            handoffs: 200,
            hold: Duration::from_millis(5),
            sessions: 1000,
            only: None,
            timeout: Duration::from_secs(900),
            prefix: format!("compare/rust/{}", std::process::id()),
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let known = [
                "--endpoints",
                "--n",
                "--contenders",
                "--total",
                "--campaigns",
                "--waiters",
                "--handoffs",
                "--hold-ms",
                "--sessions",
                "--only",
                "--timeout-secs",
                "--prefix",
            ];
            if !known.contains(&flag.as_str()) {
                continue; // `--bench` from cargo, filters, anything else: ignored
            }
            let value = match inline {
                Some(v) => v,
                None => it.next().ok_or_else(|| format!("{flag} needs a value"))?,
            };
            let num = |v: &str| -> Res<usize> {
                v.parse::<usize>()
                    .map_err(|e| format!("{flag} {v:?}: {e}").into())
            };
            match flag.as_str() {
                "--endpoints" => args.endpoints = split_list(&value),
                "--n" => args.n = num(&value)?.max(1),
                "--contenders" => args.contenders = num(&value)?.max(2),
                "--total" => args.total = num(&value)?.max(1),
                "--campaigns" => args.campaigns = num(&value)?.max(1),
                "--waiters" => {
                    args.waiters = split_list(&value)
                        .iter()
                        .map(|v| num(v))
                        .collect::<Res<Vec<_>>>()?
                }
                "--handoffs" => args.handoffs = num(&value)?.max(1),
                "--hold-ms" => args.hold = Duration::from_millis(num(&value)? as u64),
                "--sessions" => args.sessions = num(&value)?.max(2),
                "--only" => args.only = Some(split_list(&value)),
                "--timeout-secs" => args.timeout = Duration::from_secs(num(&value)? as u64),
                "--prefix" => args.prefix = value,
                _ => {}
            }
        }
        Ok(args)
    }

    fn wants(&self, phase: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|p| p == phase))
    }
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Statistics and output

#[derive(Debug, Clone, Copy)]
struct Stats {
    n: usize,
    median: f64,
    p90: f64,
    p99: f64,
    mean: f64,
    min: f64,
    max: f64,
}

/// Nearest-rank percentiles (the same definition as benches/go/main.go), in microseconds.
fn stats(samples: &[Duration]) -> Option<Stats> {
    if samples.is_empty() {
        return None;
    }
    let mut s: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let rank = |p: f64| -> f64 {
        let idx = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
        s[idx]
    };
    Some(Stats {
        n,
        median: rank(0.50),
        p90: rank(0.90),
        p99: rank(0.99),
        mean: s.iter().sum::<f64>() / n as f64,
        min: s[0],
        max: s[n - 1],
    })
}

fn report(figure: &str, samples: &[Duration], extra: &str) -> Option<Stats> {
    let st = stats(samples);
    match st {
        Some(st) => println!(
            "RESULT rust {figure} median_us={:.0} p90_us={:.0} p99_us={:.0} mean_us={:.0} \
             min_us={:.0} max_us={:.0} n={}{}{extra}",
            st.median,
            st.p90,
            st.p99,
            st.mean,
            st.min,
            st.max,
            st.n,
            if extra.is_empty() { "" } else { " " },
        ),
        None => println!("RESULT rust {figure} n=0 error=no_samples"),
    }
    st
}

/// How many samples are slower than 10 ms and 50 ms (etcd's unsynced-watcher loop runs
/// every 100 ms, so hand-overs that wait for it show up here).
fn tail(samples: &[Duration]) -> String {
    let over = |ms| {
        samples
            .iter()
            .filter(|d| **d > Duration::from_millis(ms))
            .count()
    };
    format!("over_10ms={} over_50ms={}", over(10), over(50))
}

/// Figures for the closing human-readable summary.
#[derive(Default)]
struct Summary {
    lines: Vec<String>,
}

impl Summary {
    fn latency(&mut self, label: &str, st: Option<Stats>) {
        if let Some(st) = st {
            self.lines.push(format!(
                "  {label:<44} median {:>8.0} µs   p90 {:>8.0} µs   p99 {:>8.0} µs   (n={})",
                st.median, st.p90, st.p99, st.n
            ));
        }
    }
    fn text(&mut self, line: String) {
        self.lines.push(format!("  {line}"));
    }
}

// ---------------------------------------------------------------------------------------
// etcd /metrics over plain HTTP

/// Counters of etcd's gRPC server, by method.
#[derive(Debug, Clone, Default)]
struct Counters {
    handled: BTreeMap<String, f64>,
    handled_unary_total: f64,
    started: BTreeMap<String, f64>,
    msg_received: BTreeMap<String, f64>,
}

impl Counters {
    fn minus(&self, before: &Counters) -> Counters {
        fn diff(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
            a.iter()
                .map(|(k, v)| (k.clone(), v - b.get(k).copied().unwrap_or(0.0)))
                .collect()
        }
        Counters {
            handled: diff(&self.handled, &before.handled),
            handled_unary_total: self.handled_unary_total - before.handled_unary_total,
            started: diff(&self.started, &before.started),
            msg_received: diff(&self.msg_received, &before.msg_received),
        }
    }

    fn add(&mut self, other: &Counters) {
        fn add(a: &mut BTreeMap<String, f64>, b: &BTreeMap<String, f64>) {
            for (k, v) in b {
                *a.entry(k.clone()).or_default() += v;
            }
        }
        add(&mut self.handled, &other.handled);
        add(&mut self.started, &other.started);
        add(&mut self.msg_received, &other.msg_received);
        self.handled_unary_total += other.handled_unary_total;
    }

    fn get(map: &BTreeMap<String, f64>, k: &str) -> f64 {
        map.get(k).copied().unwrap_or(0.0)
    }

    /// `txn=.. range=.. ...` per operation (counters divided by `n`).
    fn per_op(&self, n: usize) -> String {
        let n = n.max(1) as f64;
        let h = |m| Counters::get(&self.handled, m) / n;
        format!(
            "txn={:.2} range={:.2} delete_range={:.2} put={:.2} unary_total={:.2} \
             watch_streams={:.2} watch_msgs={:.2}",
            h("Txn"),
            h("Range"),
            h("DeleteRange"),
            h("Put"),
            self.handled_unary_total / n,
            Counters::get(&self.started, "Watch") / n,
            Counters::get(&self.msg_received, "Watch") / n,
        )
    }
}

/// The value of label `name` in a Prometheus label set `{a="x",b="y"}`.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let pat = format!("{name}=\"");
    let start = labels.find(&pat)? + pat.len();
    let end = labels[start..].find('"')?;
    Some(&labels[start..start + end])
}

fn parse_counters(text: &str) -> Counters {
    let mut c = Counters::default();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        let Some(method) = label(labels, "grpc_method") else {
            continue;
        };
        let map = match name {
            "grpc_server_handled_total" => {
                if label(labels, "grpc_type") == Some("unary") {
                    c.handled_unary_total += value;
                }
                &mut c.handled
            }
            "grpc_server_started_total" => &mut c.started,
            "grpc_server_msg_received_total" => &mut c.msg_received,
            _ => continue,
        };
        *map.entry(method.to_string()).or_default() += value;
    }
    c
}

/// `GET path` on the first endpoint (etcd serves /metrics on its client URL), bounded.
fn http_get(endpoint: &str, path: &str) -> Res<String> {
    let authority = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let addr = authority
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| format!("cannot resolve {authority}"))?;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {authority}\r\nAccept: text/plain\r\n\r\n"
    )?;
    let mut body = Vec::new();
    stream.read_to_end(&mut body)?;
    let text = String::from_utf8_lossy(&body).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("malformed HTTP response")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!("GET {path}: {}", head.lines().next().unwrap_or_default()).into());
    }
    Ok(body.to_string())
}

fn counters(endpoint: &str) -> Res<Counters> {
    Ok(parse_counters(&http_get(endpoint, "/metrics")?))
}

// ---------------------------------------------------------------------------------------
// Process figures

fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn vm_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Joins `handles`, waiting at most until `deadline`; returns the number left running.
fn join_bounded(handles: Vec<JoinHandle<()>>, deadline: Instant) -> usize {
    let mut left = handles;
    while !left.is_empty() && Instant::now() < deadline {
        let (done, running): (Vec<_>, Vec<_>) = left.into_iter().partition(|h| h.is_finished());
        for h in done {
            let _ = h.join();
        }
        left = running;
        if !left.is_empty() {
            thread::sleep(Duration::from_millis(5));
        }
    }
    left.len()
}

fn connect(args: &Args) -> Res<Client> {
    Ok(Client::connect(&args.endpoints)?)
}

// ---------------------------------------------------------------------------------------
// (a) + (d): uncontended lock+unlock, interleaved with the floor

fn floor_once(client: &Client, key: &str, prefix: &str, lease: i64) -> Res<(Duration, Duration)> {
    let t0 = Instant::now();
    let acquired = client.txn(
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put_with_lease(key, "", lease),
                TxnOp::get_prefix(prefix),
            ])
            .or_else([TxnOp::get(key)]),
    )?;
    let t1 = Instant::now();
    let deleted = client.txn(
        Txn::new()
            .when([Compare::create_revision(
                key,
                CompareOp::Equal,
                acquired.revision,
            )])
            .and_then([TxnOp::delete(key)]),
    )?;
    let t2 = Instant::now();
    if !acquired.succeeded || !deleted.succeeded {
        return Err("floor transaction did not take its success branch".into());
    }
    Ok((t1 - t0, t2 - t1))
}

fn uncontended(args: &Args, summary: &mut Summary) -> Res<()> {
    let client = connect(args)?;
    let session = client.session()?;
    let mutex = session.mutex(format!("{}/uncontended", args.prefix))?;
    let floor_prefix = format!("{}/floor/", args.prefix);
    let floor_key = format!("{floor_prefix}{:x}", session.lease_id());
    let lease = session.lease_id();

    let lock_once = || -> Res<(Duration, Duration)> {
        let t0 = Instant::now();
        let guard = mutex.lock_timeout(WAIT)?;
        let t1 = Instant::now();
        guard.unlock()?;
        Ok((t1 - t0, t1.elapsed()))
    };

    // Warm-up: connection, HTTP/2 windows, allocator, etcd's caches.
    for _ in 0..100 {
        client.get(format!("{}/warmup", args.prefix))?;
        lock_once()?;
        floor_once(&client, &floor_key, &floor_prefix, lease)?;
    }

    let mut get = Vec::with_capacity(args.n);
    for _ in 0..args.n {
        let t = Instant::now();
        client.get(format!("{}/warmup", args.prefix))?;
        get.push(t.elapsed());
    }

    let (mut lock, mut unlock, mut both) = (Vec::new(), Vec::new(), Vec::new());
    let (mut facq, mut frel, mut fboth) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..args.n {
        // Interleaved, alternating which goes first, so drift hits both alike.
        let mut run_lock = || -> Res<()> {
            let (a, b) = lock_once()?;
            lock.push(a);
            unlock.push(b);
            both.push(a + b);
            Ok(())
        };
        let mut run_floor = || -> Res<()> {
            let (a, b) = floor_once(&client, &floor_key, &floor_prefix, lease)?;
            facq.push(a);
            frel.push(b);
            fboth.push(a + b);
            Ok(())
        };
        if i % 2 == 0 {
            run_lock()?;
            run_floor()?;
        } else {
            run_floor()?;
            run_lock()?;
        }
    }
    let g = report("get", &get, "");
    let l = report("lock", &lock, "");
    report("unlock", &unlock, "");
    let lu = report("lock_unlock", &both, "");
    report("floor_acquire", &facq, "");
    report("floor_release", &frel, "");
    let fl = report("floor_lock_unlock", &fboth, "");
    summary.latency("get (linearizable Range)", g);
    summary.latency("lock (uncontended acquire)", l);
    summary.latency("lock + unlock", lu);
    summary.latency("floor: same two requests via Client::txn", fl);
    if let (Some(lu), Some(fl)) = (lu, fl) {
        println!(
            "RESULT rust lock_over_floor median_ratio={:.3} p90_ratio={:.3} p99_ratio={:.3} mean_ratio={:.3}",
            lu.median / fl.median,
            lu.p90 / fl.p90,
            lu.p99 / fl.p99,
            lu.mean / fl.mean
        );
        summary.text(format!(
            "lock+unlock / floor: {:.3}x at the median, {:.3}x at p90",
            lu.median / fl.median,
            lu.p90 / fl.p90
        ));
    }
    session.close()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// (c): election campaign + resign

fn election(args: &Args, summary: &mut Summary) -> Res<()> {
    let client = connect(args)?;
    let session = client.session()?;
    let election = session.election(format!("{}/election", args.prefix))?;
    for _ in 0..50 {
        election.campaign_timeout("me", WAIT)?.resign()?;
    }
    let (mut camp, mut res, mut both) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.campaigns {
        let t0 = Instant::now();
        let mut leadership = election.campaign_timeout("me", WAIT)?;
        let t1 = Instant::now();
        leadership.resign()?;
        let t2 = Instant::now();
        camp.push(t1 - t0);
        res.push(t2 - t1);
        both.push(t2 - t0);
    }
    let c = report("campaign", &camp, "");
    report("resign", &res, "");
    let cr = report("campaign_resign", &both, "");
    summary.latency("campaign (uncontended)", c);
    summary.latency("campaign + resign", cr);
    session.close()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// (f): etcd requests per operation

fn cost(args: &Args, summary: &mut Summary) -> Res<()> {
    let endpoint = args.endpoints[0].clone();
    let client = connect(args)?;
    let holder = client.session()?;
    let waiter = client.session()?;
    let name = format!("{}/cost", args.prefix);
    let mine = holder.mutex(&name)?;
    let theirs = waiter.mutex(&name)?;
    mine.lock_timeout(WAIT)?.unlock()?;
    theirs.lock_timeout(WAIT)?.unlock()?;

    const N: usize = 20;
    let (mut acquire, mut release) = (Counters::default(), Counters::default());
    for _ in 0..N {
        let s0 = counters(&endpoint)?;
        let guard = mine.lock_timeout(WAIT)?;
        let s1 = counters(&endpoint)?;
        guard.unlock()?;
        let s2 = counters(&endpoint)?;
        acquire.add(&s1.minus(&s0));
        release.add(&s2.minus(&s1));
    }

    // A queued waiter: what it costs to join the line and start watching, and what one
    // handoff costs (the holder's release plus the waiter's work after the delete event).
    const H: usize = 10;
    let (mut queue, mut handoff) = (Counters::default(), Counters::default());
    for _ in 0..H {
        let guard = mine.lock_timeout(WAIT)?;
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (got_tx, got_rx) = mpsc::channel::<Res<()>>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let theirs = theirs.clone();
        let t = thread::spawn(move || {
            if go_rx.recv_timeout(WAIT).is_err() {
                return;
            }
            match theirs.lock_timeout(WAIT) {
                Ok(g) => {
                    let _ = got_tx.send(Ok(()));
                    let _ = done_rx.recv_timeout(WAIT);
                    let _ = g.unlock();
                }
                Err(e) => {
                    let _ = got_tx.send(Err(e.into()));
                }
            }
        });
        let s0 = counters(&endpoint)?;
        go_tx.send(())?;
        // Long enough to be queued and watching: Txn + Watch created + Range take ~1 ms.
        thread::sleep(Duration::from_millis(300));
        let s1 = counters(&endpoint)?;
        guard.unlock()?;
        got_rx.recv_timeout(WAIT)??;
        let s2 = counters(&endpoint)?;
        let _ = done_tx.send(());
        join_bounded(vec![t], Instant::now() + WAIT);
        queue.add(&s1.minus(&s0));
        handoff.add(&s2.minus(&s1));
    }
    println!("RESULT rust cost_acquire {} n={N}", acquire.per_op(N));
    println!("RESULT rust cost_release {} n={N}", release.per_op(N));
    println!("RESULT rust cost_queue {} n={H}", queue.per_op(H));
    println!("RESULT rust cost_handoff {} n={H}", handoff.per_op(H));
    // After the watch event, excluding the holder's release (one Txn per handoff).
    let h = |m: &str| Counters::get(&handoff.handled, m) / H as f64;
    let r = |m: &str| Counters::get(&release.handled, m) / N as f64;
    let after = (
        h("Txn") - r("Txn"),
        h("Range") - r("Range"),
        h("DeleteRange") - r("DeleteRange"),
    );
    println!(
        "RESULT rust cost_after_event txn={:.2} range={:.2} delete_range={:.2} requests={:.2}",
        after.0,
        after.1,
        after.2,
        after.0 + after.1 + after.2
    );
    summary.text(format!(
        "requests: acquire {:.2}, release {:.2}, waiter after the delete event {:.2} \
         (joining the line: {})",
        acquire.handled_unary_total / N as f64,
        release.handled_unary_total / N as f64,
        after.0 + after.1 + after.2,
        queue.per_op(H)
    ));
    holder.close()?;
    waiter.close()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// (b): contended, one client + session per thread

/// State shared by threads taking turns on one lock: who released last and when, and the
/// mutual-exclusion checks.
struct Turns {
    /// When the last holder started its release, and which worker it was.
    slot: StdMutex<Option<(Instant, usize)>>,
    holders: AtomicI64,
    last_token: AtomicI64,
    violations: AtomicU64,
    errors: StdMutex<Vec<String>>,
    stop: AtomicBool,
}

impl Turns {
    fn new() -> Turns {
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
    fn enter(&self, me: usize, token: i64, acquired: Instant) -> Option<Duration> {
        if self.holders.fetch_add(1, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        if self.last_token.swap(token, Ordering::SeqCst) >= token {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        match *self.slot.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((released, who)) if who != me => {
                Some(acquired.saturating_duration_since(released))
            }
            _ => None,
        }
    }

    /// Called right before the guard is released.
    fn leave(&self, me: usize) {
        self.holders.fetch_sub(1, Ordering::SeqCst);
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), me));
    }

    fn error(&self, e: impl std::fmt::Display) {
        self.stop.store(true, Ordering::SeqCst);
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(e.to_string());
    }

    fn take_errors(&self) -> Vec<String> {
        std::mem::take(&mut *self.errors.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What one contended run measured.
struct Contention {
    acquisitions: u64,
    elapsed: Duration,
    violations: u64,
    per_worker: Vec<u64>,
    handoffs: Vec<Duration>,
    waits: Vec<Duration>,
    errors: Vec<String>,
    /// etcd's request counters over the run (`None` if /metrics could not be read).
    cost: Option<Counters>,
}

impl Contention {
    fn throughput(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// `contenders` threads, each with its own client and session, take `total` turns on one
/// lock named `name`.
fn contend(args: &Args, name: &str, contenders: usize, total: usize) -> Res<Contention> {
    let mut workers = Vec::new();
    for _ in 0..contenders {
        let client = connect(args)?;
        let session = client.session()?;
        let mutex = session.mutex(name)?;
        workers.push((client, session, mutex));
    }
    let turns = Arc::new(Turns::new());
    let count = Arc::new(AtomicU64::new(0));
    let handoffs = Arc::new(StdMutex::new(Vec::with_capacity(total)));
    let waits = Arc::new(StdMutex::new(Vec::with_capacity(total)));
    let end = Arc::new(StdMutex::new(None::<Instant>));
    let per_worker: Arc<Vec<AtomicU64>> =
        Arc::new((0..contenders).map(|_| AtomicU64::new(0)).collect());
    let barrier = Arc::new(Barrier::new(contenders + 1));
    let total = total as u64;

    let mut handles = Vec::new();
    for (me, (_client, _session, mutex)) in workers.iter().enumerate() {
        let mutex = mutex.clone();
        let (turns, count, handoffs, waits, end, per_worker, barrier) = (
            turns.clone(),
            count.clone(),
            handoffs.clone(),
            waits.clone(),
            end.clone(),
            per_worker.clone(),
            barrier.clone(),
        );
        handles.push(thread::spawn(move || {
            barrier.wait();
            while !turns.stop.load(Ordering::SeqCst) {
                let t0 = Instant::now();
                let guard = match mutex.lock_timeout(WAIT) {
                    Ok(g) => g,
                    Err(e) => return turns.error(format!("worker {me}: lock: {e}")),
                };
                let acquired = Instant::now();
                if count.load(Ordering::SeqCst) >= total {
                    // Done: pass the lock on without counting.
                    turns.stop.store(true, Ordering::SeqCst);
                    drop(guard);
                    return;
                }
                let handoff = turns.enter(me, guard.fencing_token(), acquired);
                let c = count.fetch_add(1, Ordering::SeqCst) + 1;
                if let Some(h) = handoff {
                    handoffs.lock().unwrap_or_else(|e| e.into_inner()).push(h);
                }
                waits
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(acquired - t0);
                per_worker[me].fetch_add(1, Ordering::SeqCst);
                turns.leave(me);
                let result = guard.unlock();
                if c == total {
                    *end.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                }
                if let Err(e) = result {
                    return turns.error(format!("worker {me}: unlock: {e}"));
                }
            }
        }));
    }
    let before = counters(&args.endpoints[0]).ok();
    barrier.wait();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(60) + WAIT * 2;
    let left = join_bounded(handles, deadline);
    if left > 0 {
        turns.error(format!("{left} workers still running at the deadline"));
    }
    let end = end
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or_else(Instant::now);
    let after = counters(&args.endpoints[0]).ok();
    for (_client, session, _mutex) in &workers {
        let _ = session.close();
    }
    Ok(Contention {
        acquisitions: count.load(Ordering::SeqCst),
        elapsed: end - start,
        violations: turns.violations.load(Ordering::SeqCst),
        per_worker: per_worker
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect(),
        handoffs: std::mem::take(&mut *handoffs.lock().unwrap_or_else(|e| e.into_inner())),
        waits: std::mem::take(&mut *waits.lock().unwrap_or_else(|e| e.into_inner())),
        errors: turns.take_errors(),
        cost: before.zip(after).map(|(b, a)| a.minus(&b)),
    })
}

fn contended(args: &Args, summary: &mut Summary) -> Res<()> {
    let name = format!("{}/contended", args.prefix);
    let run = contend(args, &name, args.contenders, args.total)?;
    let split: Vec<String> = run.per_worker.iter().map(u64::to_string).collect();
    println!(
        "RESULT rust contended throughput_acq_s={:.0} acquisitions={} contenders={} \
         elapsed_ms={} violations={} per_worker={} errors={}",
        run.throughput(),
        run.acquisitions,
        args.contenders,
        run.elapsed.as_millis(),
        run.violations,
        split.join("/"),
        run.errors.len()
    );
    for e in &run.errors {
        eprintln!("contended: {e}");
    }
    if let Some(cost) = &run.cost {
        // Every request of the run (joins, waits, reads, releases) per acquisition.
        println!(
            "RESULT rust contended_cost {} n={}",
            cost.per_op(run.acquisitions as usize),
            run.acquisitions
        );
    }
    let h = report(
        "handoff",
        &run.handoffs,
        &format!("contenders={} {}", args.contenders, tail(&run.handoffs)),
    );
    report(
        "lock_wait",
        &run.waits,
        &format!("contenders={}", args.contenders),
    );
    summary.text(format!(
        "contended: {} threads (own client + session each), {} acquisitions in {:.2} s = \
         {:.0} acq/s, violations {}",
        args.contenders,
        run.acquisitions,
        run.elapsed.as_secs_f64(),
        run.throughput(),
        run.violations
    ));
    summary.latency("handoff (release start -> next lock returns)", h);
    if !run.errors.is_empty() {
        return Err(format!("contended run had {} errors", run.errors.len()).into());
    }
    Ok(())
}

/// Diagnosis of slow handoffs, kept out of the headline figures because polling /metrics
/// costs etcd some CPU: a shorter contended run while a thread samples etcd's gauge of
/// unsynced ("slow") watchers every 20 ms. A waiter's watch is created "from now"; when it
/// lands in etcd's unsynced group anyway, its delete event waits for etcd's 100 ms
/// syncWatchersLoop, which shows as a handoff of tens of milliseconds.
fn diagnose(args: &Args, summary: &mut Summary) -> Res<()> {
    let endpoint = args.endpoints[0].clone();
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let stop = stop.clone();
        thread::spawn(move || {
            let (mut samples, mut unsynced, mut max) = (0u64, 0u64, 0f64);
            while !stop.load(Ordering::SeqCst) {
                if let Ok(text) = http_get(&endpoint, "/metrics") {
                    let gauge = text
                        .lines()
                        .find(|l| l.starts_with("etcd_debugging_mvcc_slow_watcher_total "))
                        .and_then(|l| l.rsplit_once(' '))
                        .and_then(|(_, v)| v.trim().parse::<f64>().ok());
                    if let Some(g) = gauge {
                        samples += 1;
                        if g > 0.0 {
                            unsynced += 1;
                        }
                        max = max.max(g);
                    }
                }
                thread::sleep(Duration::from_millis(20));
            }
            (samples, unsynced, max)
        })
    };
    let total = (args.total / 4).max(100);
    let run = contend(
        args,
        &format!("{}/diagnose", args.prefix),
        args.contenders,
        total,
    );
    stop.store(true, Ordering::SeqCst);
    let (samples, unsynced, max) =
        join_bounded_value(poller, Instant::now() + WAIT).unwrap_or((0, 0, 0.0));
    let run = run?;
    println!(
        "RESULT rust diagnose_unsynced acquisitions={} contenders={} metric_samples={samples} \
         samples_with_unsynced_watchers={unsynced} max_unsynced_watchers={max:.0} {}",
        run.acquisitions,
        args.contenders,
        tail(&run.handoffs)
    );
    summary.text(format!(
        "diagnosis: unsynced watchers present in {unsynced} of {samples} /metrics samples \
         during a {}-acquisition contended run ({})",
        run.acquisitions,
        tail(&run.handoffs)
    ));
    Ok(())
}

/// Joins one thread that returns a value, waiting at most until `deadline`.
fn join_bounded_value<T>(handle: JoinHandle<T>, deadline: Instant) -> Option<T> {
    while !handle.is_finished() {
        if Instant::now() > deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(5));
    }
    handle.join().ok()
}

// ---------------------------------------------------------------------------------------
// (e): handoff latency with W waiters queued on one name

fn scaling_one(args: &Args, waiters: usize, summary: &mut Summary) -> Res<()> {
    let client = connect(args)?;
    let name = format!("{}/scaling/{waiters}", args.prefix);
    let gate_session = client.session()?;
    let gate = gate_session.mutex(&name)?.lock_timeout(WAIT)?;
    // W waiters queued behind every holder: W + 1 participants take turns; a holder keeps
    // the lock for `hold` so that the previous holder is back in line (queued and watching)
    // before the next handoff.
    let participants = waiters + 1;
    let mut sessions = Vec::with_capacity(participants);
    for _ in 0..participants {
        sessions.push(client.session()?);
    }
    let turns = Arc::new(Turns::new());
    let samples = Arc::new(StdMutex::new(Vec::new()));
    let acquisitions = Arc::new(AtomicU64::new(0));
    // etcd's counters and the acquisition count when the last wanted sample was taken.
    let at_stop = Arc::new(StdMutex::new(None::<(Counters, u64)>));
    let warmup = 5usize;
    let wanted = warmup + args.handoffs;
    let hold = args.hold;
    let mut handles = Vec::new();
    for (me, session) in sessions.iter().enumerate() {
        let mutex = session.mutex(&name)?;
        let (turns, samples, acquisitions, at_stop) = (
            turns.clone(),
            samples.clone(),
            acquisitions.clone(),
            at_stop.clone(),
        );
        let endpoint = args.endpoints[0].clone();
        handles.push(thread::spawn(move || {
            while !turns.stop.load(Ordering::SeqCst) {
                let guard = match mutex.lock_timeout(WAIT) {
                    Ok(g) => g,
                    Err(e) => return turns.error(format!("waiter {me}: lock: {e}")),
                };
                acquisitions.fetch_add(1, Ordering::SeqCst);
                let acquired = Instant::now();
                if turns.stop.load(Ordering::SeqCst) {
                    drop(guard);
                    return;
                }
                if let Some(h) = turns.enter(me, guard.fencing_token(), acquired) {
                    let mut s = samples.lock().unwrap_or_else(|e| e.into_inner());
                    s.push(h);
                    if s.len() >= wanted && !turns.stop.swap(true, Ordering::SeqCst) {
                        let n = acquisitions.load(Ordering::SeqCst);
                        if let Ok(c) = counters(&endpoint) {
                            *at_stop.lock().unwrap_or_else(|e| e.into_inner()) = Some((c, n));
                        }
                    }
                }
                thread::sleep(hold);
                turns.leave(me);
                if let Err(e) = guard.unlock() {
                    return turns.error(format!("waiter {me}: unlock: {e}"));
                }
            }
        }));
    }
    // Everyone queued (gate holder + participants), then give the watches time to start.
    let prefix = format!("{name}/");
    let queued_by = Instant::now() + WAIT;
    loop {
        let queued = client.get_prefix(&prefix)?.len();
        if queued > participants {
            break;
        }
        if Instant::now() > queued_by || turns.stop.load(Ordering::SeqCst) {
            turns.error(format!("only {queued} of {} keys queued", participants + 1));
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(300));
    *turns.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), usize::MAX));
    let before = counters(&args.endpoints[0]).ok();
    gate.unlock()?;
    let deadline = Instant::now() + WAIT * 4 + hold * (wanted as u32 + participants as u32);
    let left = join_bounded(handles, deadline);
    if left > 0 {
        turns.error(format!("{left} waiters still running at the deadline"));
    }
    let stopped = at_stop.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let (Some(b), Some((a, n))) = (before, stopped) {
        // Every request from the gate's release to the last measured handoff (waiters
        // joining again, waiting, reading, releasing), per acquisition.
        println!(
            "RESULT rust scaling_cost_waiters_{waiters} {} n={n}",
            a.minus(&b).per_op(n as usize)
        );
    }
    let errors = turns.take_errors();
    for e in &errors {
        eprintln!("scaling {waiters}: {e}");
    }
    let all = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
    let measured: Vec<Duration> = all.iter().skip(warmup).copied().collect();
    let st = report(
        &format!("handoff_waiters_{waiters}"),
        &measured,
        &format!(
            "waiters={waiters} violations={} errors={} {}",
            turns.violations.load(Ordering::SeqCst),
            errors.len(),
            tail(&measured)
        ),
    );
    summary.latency(&format!("handoff, {waiters} waiters queued"), st);
    for s in &sessions {
        let _ = s.close();
    }
    let _ = gate_session.close();
    if !errors.is_empty() {
        return Err(format!("scaling {waiters}: {} errors", errors.len()).into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// (g): OS threads and resident memory

/// Runs [`resources`] in a fresh child process (this executable, `--only resources-here`):
/// earlier phases leave the allocator's heap grown, which would hide the memory that new
/// sessions and locks take.
fn resources_in_child(args: &Args, summary: &mut Summary) -> Res<()> {
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new(exe)
        .args([
            "--only",
            "resources-here",
            "--endpoints",
            &args.endpoints.join(","),
            "--sessions",
            &args.sessions.to_string(),
            "--prefix",
            &format!("{}/resources", args.prefix),
            "--timeout-secs",
            "600",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut stdout = child.stdout.take().ok_or("no stdout from child")?;
    let reader = thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let deadline = Instant::now() + Duration::from_secs(620);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("resources child did not finish in time".into());
        }
        thread::sleep(Duration::from_millis(20));
    };
    let out = reader.join().map_err(|_| "reader thread panicked")?;
    let mut in_summary = false;
    for line in out.lines() {
        if line.starts_with("RESULT ") {
            println!("{line}");
        } else if line.starts_with("etcd-sync summary") {
            in_summary = true;
        } else if in_summary && !line.trim().is_empty() {
            summary.text(line.trim().to_string());
        }
    }
    if !status.success() {
        return Err(format!("resources child exited with {status}").into());
    }
    Ok(())
}

fn resources(args: &Args, summary: &mut Summary) -> Res<()> {
    let threads_before = os_threads();
    let client = connect(args)?;
    let first = client.session()?;
    let threads_one = os_threads();
    let rss_one = vm_rss_kb();
    let mut sessions = vec![first];
    for _ in 1..args.sessions {
        sessions.push(client.session()?);
    }
    thread::sleep(Duration::from_millis(200));
    let threads_many = os_threads();
    let rss_many = vm_rss_kb();
    let mut guards = Vec::with_capacity(sessions.len());
    for (i, s) in sessions.iter().enumerate() {
        guards.push(
            s.mutex(format!("{}/held/{i}", args.prefix))?
                .lock_timeout(WAIT)?,
        );
    }
    thread::sleep(Duration::from_millis(200));
    let threads_locks = os_threads();
    let rss_locks = vm_rss_kb();
    drop(guards);
    for s in &sessions {
        let _ = s.close();
    }
    drop(sessions);
    drop(client);
    let threads_after = os_threads();
    let n = args.sessions;
    let per = |a: u64, b: u64| (a.saturating_sub(b) as f64 * 1024.0 / n as f64).round();
    println!(
        "RESULT rust threads before_client={threads_before} one_session={threads_one} \
         sessions_{n}={threads_many} locks_{n}={threads_locks} after_drop={threads_after}"
    );
    println!(
        "RESULT rust memory rss_one_session_kb={rss_one} sessions_{n}_delta_kb={} \
         per_session_bytes={} locks_{n}_delta_kb={} per_lock_bytes={}",
        rss_many.saturating_sub(rss_one),
        per(rss_many, rss_one),
        rss_locks.saturating_sub(rss_many),
        per(rss_locks, rss_many),
    );
    summary.text(format!(
        "OS threads: {threads_before} before the client, {threads_one} with 1 session, \
         {threads_many} with {n} sessions, {threads_locks} with {n} locks held"
    ));
    summary.text(format!(
        "RSS: +{} KiB for {n} sessions ({} B each), +{} KiB for {n} held locks ({} B each)",
        rss_many.saturating_sub(rss_one),
        per(rss_many, rss_one),
        rss_locks.saturating_sub(rss_many),
        per(rss_locks, rss_many),
    ));
    Ok(())
}

// ---------------------------------------------------------------------------------------

fn main() {
    let args = match Args::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("compare: {e}");
            std::process::exit(2);
        }
    };
    if args.endpoints.is_empty() {
        // `cargo bench` without `--bench compare` runs this too: nothing to measure against.
        println!(
            "compare: no --endpoints given (or $ETCD_ENDPOINTS); skipping. \
             Run scripts/bench-compare, or: cargo bench --bench compare -- --endpoints URL"
        );
        return;
    }
    // Watchdog: never hang, whatever happens below.
    let timeout = args.timeout;
    thread::spawn(move || {
        thread::sleep(timeout);
        eprintln!("compare: aborted after {timeout:?} (watchdog)");
        std::process::exit(3);
    });

    println!(
        "compare: etcd-sync against {} (n={}, contenders={}, total={}, campaigns={}, \
         waiters={:?}, handoffs={}, sessions={})",
        args.endpoints.join(","),
        args.n,
        args.contenders,
        args.total,
        args.campaigns,
        args.waiters,
        args.handoffs,
        args.sessions
    );
    let mut summary = Summary::default();
    let mut failed = Vec::new();
    let mut run = |phase: &str, f: &dyn Fn(&Args, &mut Summary) -> Res<()>| {
        if !args.wants(phase) {
            return;
        }
        let t = Instant::now();
        eprintln!("compare: {phase} ...");
        if let Err(e) = f(&args, &mut summary) {
            eprintln!("compare: {phase} failed: {e}");
            println!("RESULT rust {phase} error={:?}", e.to_string());
            failed.push(phase.to_string());
        }
        eprintln!("compare: {phase} took {:.1} s", t.elapsed().as_secs_f64());
    };
    run("uncontended", &uncontended);
    run("election", &election);
    run("cost", &cost);
    run("contended", &contended);
    run("scaling", &|args, summary| {
        for &w in &args.waiters {
            scaling_one(args, w, summary)?;
        }
        Ok(())
    });
    run("diagnose", &diagnose);
    run("resources", &resources_in_child);
    if args.only.iter().flatten().any(|p| p == "resources-here") {
        run("resources-here", &resources);
    }

    println!();
    println!("etcd-sync summary ({}):", args.endpoints.join(","));
    for line in &summary.lines {
        println!("{line}");
    }
    if !failed.is_empty() {
        eprintln!("compare: failed phases: {}", failed.join(", "));
        std::process::exit(1);
    }
}
