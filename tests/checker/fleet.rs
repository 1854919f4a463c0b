//! Mixed fleets (issue 52 item 3): Go's `concurrency` package, as `etcdctl lock NAME --
//! CMD` children, on the names our children lock, under the same faults.
//!
//! The parent keeps [`GO_CHILDREN`] etcdctl processes running (each in its own process
//! group, half through the gRPC proxy, session TTL as ours), restarts each one that
//! exits, and SIGKILLs one (with its command) at every `client_sigkill` fault. The command
//! etcdctl runs while it holds is this test binary ([`checker_go_hold`]): it logs the key
//! and the start on the machine-wide monotonic clock, sleeps, reads its key with a client
//! of ours (found: the key existed all along the hold), logs the end. A thread polls
//! the names' keys every [`POLL`] (`GOKEYS`), so that the judge knows until when a Go
//! holder's key certainly existed and from when it was certainly gone.
//!
//! The judge (after the operator's deletes have clipped our guards' intervals):
//!
//! * one of our guards still confirmed while a Go holder ran whose key certainly still
//!   existed: a violation of ours;
//! * one of our guards overlapping a Go holder whose key was certainly gone (deleted by
//!   the operator, or its lease expired: Go does not notice): Go's problem, counted;
//! * between the two (the key's end fell between two polls): undecided, counted, printed;
//! * two Go holders at once: Go's bug (etcd-io/etcd#19597, #22082), counted as
//!   `go_overlaps`, not failed on.
//!
//! `CHECKER_GO_TEETH=1` shows the judge has teeth: Go then locks `<name>/teeth`, whose keys
//! our guards wait for but whose holders never wait for ours, so the run must fail with
//! overlaps beside live Go keys.
//!
//! Log lines (parent's `go` file): `GOSPAWN <n> <name> <proxy 0|1> <ns>`, `GOEXIT <n>
//! <ns> <code>`, `GOKILL <n> <ns> <why>`, `GOKEYS <sent> <received> <name> <key@rev,...|->`;
//! each command's `go-<n>`: `GOHOLD <key> <rev> <ns>`, `GOSEEN <sent>` or `GOGONE <sent>
//! <received>` (its key read at the end), `GOEND <ns>`.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use etcd_sync::Client;

use super::common::{CHILD_ROLE, monotonic_ns};
use super::{Log, RW_NAME, Rng, TTL, log};

/// The names Go locks: ours that are exclusive lines (`Mutex`, `Election`, the write side
/// of the read-write lock); not the semaphore, whose permits Go would count as holders.
pub(crate) const GO_NAMES: [&str; 3] = ["ck-a", "ck-b", RW_NAME];
/// etcdctl processes running at once.
const GO_CHILDREN: usize = 2;
const GO_ROLE: &str = "gohold";
/// An etcdctl process alive this long is killed (and counted as stuck).
const STUCK: Duration = Duration::from_secs(15);
/// How often the names' keys are read.
const POLL: Duration = Duration::from_millis(50);

/// What etcdctl runs while it holds: logs the hold on the shared clock, sleeps, logs its end.
#[test]
fn checker_go_hold() {
    if std::env::var(CHILD_ROLE).ok().as_deref() != Some(GO_ROLE) {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let path = var("GO_LOG");
    let append = |line: String| {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path);
        if let Ok(mut f) = file {
            let _ = writeln!(f, "{line}");
        }
    };
    let (key, rev) = (var("ETCD_LOCK_KEY"), var("ETCD_LOCK_REV"));
    append(format!("GOHOLD {key} {rev} {}", monotonic_ns()));
    // A client of ours, to read the key at the end: found, it existed all along the hold.
    let endpoints: Vec<String> = var("GO_ENDPOINTS").split(',').map(String::from).collect();
    let client = super::common::try_client_for(&endpoints, super::REQUEST_TIMEOUT).ok();
    let ms: u64 = var("GO_HOLD_MS").parse().unwrap_or(50);
    std::thread::sleep(Duration::from_millis(ms));
    let sent = monotonic_ns();
    match client.map(|c| c.get(&key)) {
        Some(Ok(Some(_))) => append(format!("GOSEEN {sent}")),
        Some(Ok(None)) => append(format!("GOGONE {sent} {}", monotonic_ns())),
        _ => {}
    }
    append(format!("GOEND {}", monotonic_ns()));
}

pub(crate) struct Config {
    pub(crate) endpoints: Vec<String>,
    pub(crate) proxy: String,
    pub(crate) dir: PathBuf,
    pub(crate) deadline: Instant,
    pub(crate) seed: u64,
}

/// One etcdctl process and the command it runs: SIGKILLed together (its process group)
/// when dropped, unless it exited.
struct GoChild {
    n: usize,
    child: std::process::Child,
    started: Instant,
}

impl GoChild {
    fn kill(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: kill(2) on the process group this etcdctl leads (not yet reaped).
            unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for GoChild {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The fleet's threads; stopped (every process killed) when dropped, pass or fail.
pub(crate) struct Fleet {
    stop: Arc<AtomicBool>,
    kills: Arc<AtomicUsize>,
    spawner: Option<JoinHandle<()>>,
    poller: Option<JoinHandle<()>>,
}

impl Fleet {
    /// `None` (and says why) without an etcdctl, or with `CHECKER_GO=0`.
    pub(crate) fn start(config: Config, client: Client) -> Option<Fleet> {
        if std::env::var("CHECKER_GO").ok().as_deref() == Some("0") {
            println!("CHECKER go fleet: off (CHECKER_GO=0)");
            return None;
        }
        let etcdctl = match etcd_sync::testing::etcdctl_binary() {
            Ok(path) => path,
            Err(e) => {
                println!("CHECKER go fleet: off, no etcdctl: {e}");
                return None;
            }
        };
        let events: Log = Arc::new(std::sync::Mutex::new(
            std::fs::File::create(config.dir.join("go")).ok()?,
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let kills = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let poller = {
            let (done, events) = (done.clone(), events.clone());
            std::thread::spawn(move || poll_keys(&client, &events, &done))
        };
        let spawner = {
            let (stop, kills) = (stop.clone(), kills.clone());
            std::thread::spawn(move || {
                run(&etcdctl, &config, &events, &stop, &kills);
                done.store(true, Ordering::Relaxed);
            })
        };
        Some(Fleet {
            stop,
            kills,
            spawner: Some(spawner),
            poller: Some(poller),
        })
    }

    /// Asks for one etcdctl process to be SIGKILLed (a `client_sigkill` fault).
    pub(crate) fn sigkill(&self) {
        self.kills.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits for the fleet to end by itself (it stops at the deadline, then waits up to
    /// 3 s for its processes before killing them).
    pub(crate) fn finish(mut self) {
        self.join();
    }

    fn join(&mut self) {
        for thread in [self.spawner.take(), self.poller.take()]
            .into_iter()
            .flatten()
        {
            let _ = thread.join();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.join();
    }
}

fn poll_keys(client: &Client, events: &Log, done: &AtomicBool) {
    while !done.load(Ordering::Relaxed) {
        for name in GO_NAMES {
            let sent = monotonic_ns();
            if let Ok(kvs) = client.get_prefix(format!("{name}/")) {
                let received = monotonic_ns();
                let keys = super::processes::keys_field(&kvs);
                log(events, format!("GOKEYS {sent} {received} {name} {keys}"));
            }
        }
        std::thread::sleep(POLL);
    }
}

fn run(etcdctl: &Path, config: &Config, events: &Log, stop: &AtomicBool, kills: &AtomicUsize) {
    let mut rng = Rng::new(config.seed ^ 0x474f_0000);
    let mut running: Vec<GoChild> = Vec::new();
    let mut spawned = 0;
    let grace = config.deadline + Duration::from_secs(3);
    loop {
        running.retain_mut(|c| match c.child.try_wait() {
            Ok(Some(status)) => {
                let code = status.code().unwrap_or(-1);
                log(events, format!("GOEXIT {} {} {code}", c.n, monotonic_ns()));
                false
            }
            _ => true,
        });
        let kill = |running: &mut Vec<GoChild>, i: usize, why: &str| {
            let mut c = running.remove(i);
            c.kill();
            log(events, format!("GOKILL {} {} {why}", c.n, monotonic_ns()));
        };
        for _ in 0..kills.swap(0, Ordering::Relaxed) {
            if !running.is_empty() {
                let i = rng.below(running.len() as u64) as usize;
                kill(&mut running, i, "sigkill");
            }
        }
        while let Some(i) = running.iter().position(|c| c.started.elapsed() > STUCK) {
            kill(&mut running, i, "stuck");
        }
        let now = Instant::now();
        if stop.load(Ordering::Relaxed) || (now >= config.deadline && running.is_empty()) {
            break;
        }
        if now >= grace {
            while !running.is_empty() {
                kill(&mut running, 0, "end");
            }
            break;
        }
        while now < config.deadline && running.len() < GO_CHILDREN {
            spawned += 1;
            match spawn(etcdctl, config, spawned, &mut rng, events) {
                Some(child) => running.push(child),
                None => break,
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    while !running.is_empty() {
        let mut c = running.remove(0);
        c.kill();
        log(events, format!("GOKILL {} {} end", c.n, monotonic_ns()));
    }
}

fn spawn(
    etcdctl: &Path,
    config: &Config,
    n: usize,
    rng: &mut Rng,
    events: &Log,
) -> Option<GoChild> {
    let name = GO_NAMES[rng.below(GO_NAMES.len() as u64) as usize];
    let through_proxy = rng.below(2) == 0;
    let endpoints = if through_proxy {
        config.proxy.clone()
    } else {
        let mut members = config.endpoints.clone();
        let turn = rng.below(members.len() as u64) as usize;
        members.rotate_left(turn);
        members.join(",")
    };
    // Mostly short holds, as ours; one in eight long enough for a lease to expire under
    // a partition while its command still runs.
    let hold_ms = if rng.below(8) == 0 {
        1500 + rng.below(2000)
    } else {
        10 + rng.below(190)
    };
    // Teeth: Go locks `<name>/teeth`, a line of its own whose keys ours wait for but
    // Go's does not wait for ours: its holds overlap our guards, with live keys.
    let teeth = std::env::var("CHECKER_GO_TEETH").is_ok_and(|v| v == "1");
    let lock_name = if teeth {
        format!("{name}/teeth")
    } else {
        name.to_string()
    };
    let exe = std::env::current_exe().ok()?;
    let go_log = config.dir.join(format!("go-{n}"));
    let child = std::process::Command::new(etcdctl)
        .args(["--endpoints", &endpoints, "--dial-timeout", "1s", "lock"])
        .args(["--ttl", &TTL.as_secs().to_string(), &lock_name, "--"])
        .arg(exe)
        .args(["fleet::checker_go_hold", "--exact", "--nocapture"])
        .args(["--test-threads=1", "-q"])
        .env(CHILD_ROLE, GO_ROLE)
        .env("GO_LOG", go_log)
        .env("GO_HOLD_MS", hold_ms.to_string())
        .env("GO_ENDPOINTS", &endpoints)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .ok()?;
    let proxy = u8::from(through_proxy);
    log(
        events,
        format!("GOSPAWN {n} {name} {proxy} {}", monotonic_ns()),
    );
    Some(GoChild {
        n,
        child,
        started: Instant::now(),
    })
}

#[path = "fleet_judge.rs"]
mod judge;
pub(crate) use judge::{add_covers, judge_and_report, parse, remove_covers};
