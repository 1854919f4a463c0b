//! Shared helpers for the integration tests: every test starts its own real etcd.
#![allow(dead_code)]

use std::time::Duration;

use etcd_sync::testing::{EtcdCluster, EtcdServer};
use etcd_sync::{Client, Session};

/// A fresh single-member etcd on free loopback ports; killed when dropped.
pub fn etcd() -> EtcdServer {
    match EtcdServer::start() {
        Ok(server) => server,
        Err(e) => panic!("cannot start etcd for the test: {e}"),
    }
}

/// Diagnostics: with `ETCD_SYNC_TEST_TRACE=<dir>`, the crate's debug events go to
/// `<dir>/trace-<pid>` (one file per test process; a test's threads are named).
pub fn trace_from_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(trace_to_dir);
}

fn trace_to_dir() {
    let Ok(dir) = std::env::var("ETCD_SYNC_TEST_TRACE") else {
        return;
    };
    let path = std::path::Path::new(&dir).join(format!("trace-{}", std::process::id()));
    if let Ok(file) = std::fs::File::create(path) {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        let filter = tracing_subscriber::filter::Targets::new()
            .with_target("etcd_sync", tracing::Level::DEBUG)
            .with_target("etcd_sync::client::keepalive", tracing::Level::TRACE);
        let _ = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_thread_names(true)
                    .with_writer(std::sync::Mutex::new(file)),
            )
            .with(filter)
            .try_init();
    }
}

/// A fresh 3-member cluster.
pub fn cluster() -> EtcdCluster {
    trace_from_env();
    match EtcdCluster::start(3) {
        Ok(cluster) => cluster,
        Err(e) => panic!("cannot start an etcd cluster for the test: {e}"),
    }
}

pub fn client(endpoints: &[String]) -> Client {
    Client::builder()
        .endpoints(endpoints)
        .request_timeout(Duration::from_secs(3))
        .connect()
        .expect("connect to the test etcd")
}

/// A client with a short request timeout, for tests that freeze etcd.
pub fn client_with_timeout(endpoints: &[String], request_timeout: Duration) -> Client {
    Client::builder()
        .endpoints(endpoints)
        .request_timeout(request_timeout)
        .connect()
        .expect("connect to the test etcd")
}

/// A client for fault tests: short request and connect timeouts, so a paused member is
/// passed over quickly.
pub fn try_client_for(
    endpoints: &[String],
    request_timeout: Duration,
) -> etcd_sync::Result<Client> {
    Client::builder()
        .endpoints(endpoints)
        .request_timeout(request_timeout)
        .connect_timeout(Duration::from_secs(1))
        .connect()
}

/// A client whose waiters have no front (every wait with a key ahead waits at the back, on
/// a lookout), with `poll_near` (`None`: the library's own) and a 2 s request timeout.
pub fn client_without_front(endpoints: &[String], poll_near: Option<usize>) -> Client {
    Client::builder()
        .endpoints(endpoints)
        .request_timeout(Duration::from_secs(2))
        .line_tuning(etcd_sync::testing::LineTuning {
            front: Some(0),
            far_start: None,
            poll_near,
        })
        .connect()
        .expect("connect to etcd")
}

pub fn session(client: &Client, ttl_secs: u64) -> Session {
    client
        .session_builder()
        .ttl(Duration::from_secs(ttl_secs))
        .start()
        .expect("start a session")
}

/// A read lock on `name` tried from another thread of the same session, for up to `limit`:
/// what a second user of one session on a name meets.
pub fn read_on_another_thread(
    session: &Session,
    name: &'static str,
    limit: Duration,
) -> etcd_sync::Result<()> {
    let session = session.clone();
    std::thread::spawn(move || session.rwlock(name)?.read_timeout(limit).map(|_| ()))
        .join()
        .unwrap_or_else(|_| panic!("the reading thread panicked"))
}

/// Keys currently under `prefix`, as strings.
pub fn keys(client: &Client, prefix: &str) -> Vec<String> {
    client
        .get_prefix(prefix)
        .expect("list keys")
        .into_iter()
        .map(|kv| kv.key_str().into_owned())
        .collect()
}

/// Puts `keys` with empty values and no lease, 100 to a Txn (etcd's default limit is 128
/// operations): keys no lock created, which block a line as holders' keys would.
pub fn put_plain(client: &Client, keys: impl IntoIterator<Item = String>) {
    let keys: Vec<String> = keys.into_iter().collect();
    for chunk in keys.chunks(100) {
        let puts = chunk.iter().map(|k| etcd_sync::TxnOp::put(k.as_str(), ""));
        client
            .txn(etcd_sync::Txn::new().and_then(puts))
            .expect("put plain keys");
    }
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// The sum of etcd's `grpc_server_handled_total` for one gRPC method (e.g. "Txn").
pub fn handled(metrics: &str, method: &str) -> u64 {
    let metrics = etcd_sync::testing::metrics::parse(metrics).expect("etcd's /metrics text");
    metrics.sum("grpc_server_handled_total", &[("grpc_method", method)]) as u64
}

/// Ranges etcd's store has served, those inside Txns and a Txn's compares included
/// (`etcd_mvcc_range_total`): what a request reads, where `handled` counts only requests.
pub fn store_ranges(metrics: &str) -> u64 {
    let metrics = etcd_sync::testing::metrics::parse(metrics).expect("etcd's /metrics text");
    metrics.sum("etcd_mvcc_range_total", &[]) as u64
}

/// Watch messages etcd has received (creates and cancels), all streams together.
pub fn watch_messages(metrics: &str) -> f64 {
    let metrics = etcd_sync::testing::metrics::parse(metrics).expect("etcd's /metrics text");
    metrics.sum(
        "grpc_server_msg_received_total",
        &[("grpc_method", "Watch")],
    )
}

/// Watch events etcd has sent to watchers, all streams together.
pub fn events_delivered(metrics: &str) -> u64 {
    let metrics = etcd_sync::testing::metrics::parse(metrics).expect("etcd's /metrics text");
    metrics.sum("etcd_debugging_mvcc_events_total", &[]) as u64
}

/// How many streams of gRPC method `method` etcd has started (`Watch`, `LeaseKeepAlive`).
pub fn streams_started(metrics: &str, method: &str) -> u64 {
    let metrics = etcd_sync::testing::metrics::parse(metrics).expect("etcd's /metrics text");
    metrics.sum("grpc_server_started_total", &[("grpc_method", method)]) as u64
}

/// The environment variable that makes a copy of a test binary act as a child process.
pub const CHILD_ROLE: &str = "ETCD_SYNC_TEST_CHILD_ROLE";

/// Starts this test binary again as a child process that runs only the test `entry`
/// (which must check [`CHILD_ROLE`] and act on it), with extra environment variables.
/// Its stdout is piped; stderr is inherited.
pub fn spawn_child(entry: &str, role: &str, envs: &[(&str, String)]) -> std::process::Child {
    let exe = std::env::current_exe().expect("own test binary");
    std::process::Command::new(exe)
        .args([entry, "--exact", "--nocapture", "--test-threads=1", "-q"])
        .env(CHILD_ROLE, role)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn child test process")
}

/// Kills a child process when dropped, pass or fail.
pub struct ChildGuard(pub Option<std::process::Child>);

impl ChildGuard {
    pub fn spawn(mut cmd: std::process::Command) -> ChildGuard {
        ChildGuard(Some(cmd.spawn().expect("spawn child process")))
    }
    /// The child, no longer killed on drop.
    pub fn take(&mut self) -> std::process::Child {
        self.0.take().expect("child present")
    }
    pub fn child(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("child present")
    }
    pub fn kill(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads a child's stdout until a line starts with `prefix`, with a bound on the wait.
pub fn read_line_starting(
    child: &mut std::process::Child,
    prefix: &str,
    limit: Duration,
) -> Option<String> {
    let lines = child_lines(child)?;
    let deadline = std::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = lines.recv_timeout(left).ok()?;
        if line.starts_with(prefix) {
            return Some(line);
        }
    }
}

/// A child's stdout as a channel of lines (read by a helper thread).
pub fn child_lines(child: &mut std::process::Child) -> Option<std::sync::mpsc::Receiver<String>> {
    use std::io::BufRead;
    let stdout = child.stdout.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if tx.send(line.trim().to_string()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    Some(rx)
}

/// CLOCK_MONOTONIC in nanoseconds: one clock shared by every process on the machine.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `etcdctl --endpoints <endpoint> <args>` with stdout piped and stderr dropped: the
/// interop peer of the lock tests.
pub fn etcdctl_command(endpoint: &str, args: &[&str]) -> std::process::Command {
    let binary =
        etcd_sync::testing::etcdctl_binary().expect("etcdctl (apt-get install etcd-client)");
    let mut cmd = std::process::Command::new(binary);
    cmd.arg("--endpoints").arg(endpoint).args(args);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    cmd
}

/// This machine's name, as the default identity spells it.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into our buffer.
    assert_eq!(
        unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) },
        0
    );
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// Runs the simulation with `seed` and fails on any violation, or if nothing was acquired.
#[cfg(feature = "simulation")]
pub fn assert_seed_clean(seed: u64) {
    use etcd_sync::testing::sim::{RunConfig, run};
    let outcome = run(&RunConfig::from_seed(seed)).expect("a run");
    assert!(
        outcome.violations.is_empty(),
        "seed {seed}: {:?}",
        outcome.violations
    );
    assert!(outcome.acquisitions > 0, "seed {seed} acquired nothing");
}

/// Where a sweep of seeded schedules starts: `ETCD_SYNC_SIM_BASE` if set, else the clock
/// (a new stretch of schedules on every run). Under CI, scripts/test sets it from the
/// commit, so CI sweeps the same schedules as any earlier run of that commit did
/// (docs/design/simulation.md, "Seeds").
pub fn sweep_base() -> u64 {
    if let Some(base) = std::env::var("ETCD_SYNC_SIM_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return base;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
}
