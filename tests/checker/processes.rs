//! The parent's side of the child processes: starting, SIGKILLing and finishing them, and
//! the observer that logs what etcd holds under every name meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_sync::Client;

use crate::common::{ChildGuard, monotonic_ns, spawn_child};
use crate::{Log, NAMES, Rng, log};

/// Logs the keys of every name twice a second (`KEYS <ns> <name> <key@create_rev,...>`, `-`
/// for none): what etcd held while a liveness check found a name free and a waiter waiting.
pub(crate) fn observe_keys(c: Client, events: Log) -> Observer {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            for name in NAMES {
                if let Ok(kvs) = c.get_prefix(format!("{name}/")) {
                    let keys = keys_field(&kvs);
                    log(&events, format!("KEYS {} {name} {keys}", monotonic_ns()));
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    Observer { stop, thread }
}

/// The keys of a name as a log field: `<key>@<create revision>,...`, or `-` for none.
pub(crate) fn keys_field(kvs: &[etcd_sync::KeyValue]) -> String {
    if kvs.is_empty() {
        return "-".into();
    }
    let keys: Vec<String> = kvs
        .iter()
        .map(|kv| format!("{}@{}", kv.key_str(), kv.create_revision))
        .collect();
    keys.join(",")
}

pub(crate) struct Observer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Observer {
    pub(crate) fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// The worker processes: started with their own log, SIGKILLed by the nemesis (and
/// replaced), and at the end waited for; every kill is logged (`KILL <log> <ns>`).
pub(crate) struct Children {
    pub(crate) endpoints: Vec<String>,
    /// The gRPC proxy's endpoint: half the children talk to it first.
    pub(crate) proxy: String,
    /// How many children were started talking to the proxy.
    pub(crate) through_proxy: usize,
    pub(crate) dir: std::path::PathBuf,
    pub(crate) deadline_ns: u64,
    pub(crate) events: Log,
    /// Log number (from 1) and process.
    pub(crate) running: Vec<(usize, ChildGuard)>,
    pub(crate) spawned: usize,
}

impl Children {
    pub(crate) fn spawn(&mut self, rng: &mut Rng) -> (usize, ChildGuard) {
        self.spawned += 1;
        let n = self.spawned;
        let through = if rng.below(2) == 0 {
            self.through_proxy += 1;
            self.proxy.clone()
        } else {
            String::new()
        };
        let mut envs = vec![("ENDPOINTS", self.endpoints.join(","))];
        if !through.is_empty() {
            envs.push(("THROUGH_PROXY", through));
        }
        envs.extend([
            ("DEADLINE_NS", self.deadline_ns.to_string()),
            ("SEED", rng.next().to_string()),
            // The front of a line is 16 waiters wide; the few processes here rarely
            // queue that deep, so most children narrow it (the client builder's hidden
            // `line_tuning`), and their waiters also wait at the back on one lookout key
            // (line/behind/).
            (
                "FRONT",
                ["0", "1", "2", "16"][rng.below(4) as usize].to_string(),
            ),
            // Half of them start every lookout's watcher from the revision the waiter
            // read (the library does so only 200 keys from the front), so that such
            // watchers meet compaction and restarts too.
            ("FAR_START", ["0", "200"][rng.below(2) as usize].to_string()),
            // Half of them read a lookout's start gap late, not poll it, however near
            // (the library does so from 33 keys on), so that a lookout deleted in that
            // gap, out of order, is found by that read under every fault.
            ("POLL_NEAR", ["0", "32"][rng.below(2) as usize].to_string()),
            (
                "LOG",
                self.dir.join(format!("log-{n}")).display().to_string(),
            ),
        ]);
        let child = spawn_child("checker_child", "worker", &envs);
        (n, ChildGuard(Some(child)))
    }

    /// SIGKILLs a random child (no release, no revoke) and starts another.
    pub(crate) fn sigkill(&mut self, rng: &mut Rng) {
        let victim = rng.below(self.running.len() as u64) as usize;
        let (n, child) = &mut self.running[victim];
        child.kill();
        log(&self.events, format!("KILL {n} {}", monotonic_ns()));
        self.running[victim] = self.spawn(rng);
    }

    /// Waits until `stop_by` for the children to exit (closing their sessions), then
    /// kills the rest; returns how many exited by themselves, and the logs of the others.
    pub(crate) fn finish(&mut self, stop_by: Instant) -> (usize, Vec<usize>) {
        let (mut clean_exits, mut hung) = (0, Vec::new());
        for (n, child) in &mut self.running {
            while Instant::now() < stop_by && child.child().try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            if child.child().try_wait().ok().flatten().is_some() {
                clean_exits += 1;
            } else {
                child.kill();
                log(&self.events, format!("KILL {n} {}", monotonic_ns()));
                hung.push(*n);
            }
        }
        (clean_exits, hung)
    }
}

/// Calls `each` with every line of every child's log (`log-1` to `log-<files>`), and the
/// child's number; a log that is missing reads as empty.
pub(crate) fn each_log_line(
    dir: &std::path::Path,
    files: usize,
    mut each: impl FnMut(usize, &str),
) {
    for n in 1..=files {
        let text = std::fs::read_to_string(dir.join(format!("log-{n}"))).unwrap_or_default();
        text.lines().for_each(|line| each(n, line));
    }
}
