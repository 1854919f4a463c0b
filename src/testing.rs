//! Start real etcd servers and clusters on `127.0.0.1` for tests, benches and examples.
//!
//! This module is only compiled with the `testing` cargo feature. It runs the real `etcd`
//! binary (3.4 or newer) as child processes: [`EtcdServer`] is a single-member cluster,
//! [`EtcdCluster`] a multi-member one whose members can be paused (`SIGSTOP`), resumed,
//! killed and restarted to exercise failover.
//!
//! # Finding the binary
//!
//! [`etcd_binary`] uses, in order: the `ETCD_BIN` environment variable (an error if it
//! names a file that does not exist), `etcd` on `PATH`, then `/usr/bin/etcd`. On Debian and
//! Ubuntu, `apt-get install etcd-server` provides it. [`etcdctl_binary`] does the same with
//! `ETCDCTL_BIN`, `etcdctl` and Debian's `etcd-client` package.
//!
//! # What a server looks like
//!
//! Every member listens on free ports of `127.0.0.1` (picked by binding port 0; if etcd
//! fails to start, for example because another process grabbed a port in the meantime, the
//! whole start is retried with fresh ports, up to 3 attempts in all), and keeps its data in a
//! fresh directory under [`std::env::temp_dir`] (mode `0700`) that is removed on drop. etcd's
//! stdout and stderr go to `etcd.log` next to the member's data directory; when a start
//! fails, the error message includes the last lines of that log. Environment variables
//! starting with `ETCD_` (except `ETCD_UNSUPPORTED_ARCH`) are not passed to etcd: etcd reads
//! them as configuration, and refuses to start if one conflicts with a command-line flag.
//!
//! Startup times with the default raft timings (100 ms heartbeat, 1 s election timeout): a
//! new single member is healthy after 0.1 to 1 s (it waits a random part of its election
//! timeout before electing itself), a restarted one after 1 to 2 s (a full election
//! timeout), and a new 3-member cluster after 0.3 to 2.5 s (etcd 3.4 spends up to a second
//! checking whether its peers were already bootstrapped, then connects to them). Tests that
//! start many servers can pass smaller timings, for example
//! `.args(["--heartbeat-interval=20", "--election-timeout=200"])`.
//!
//! # Reading metrics
//!
//! [`EtcdServer::metrics`] and [`EtcdCluster::metrics`] return etcd's Prometheus text as
//! it is; [`metrics::parse`] turns it into samples to look up by name and labels.
//!
//! # Process hygiene
//!
//! Every etcd process is killed (`SIGKILL`) and waited for when its [`EtcdServer`] or
//! [`EtcdCluster`] is dropped, including during the unwinding of a panicking test, and
//! including paused members. In case the test process dies without unwinding (abort, a
//! signal), each etcd process is also started with the Linux parent-death signal
//! (`PR_SET_PDEATHSIG`) set to `SIGKILL`. That signal is tied to the *thread* that spawned
//! the process, not to the whole process: etcd is killed as soon as the thread that started
//! it (or restarted it) exits. Drop a server before the thread that started it exits, which
//! is what happens naturally in a test function; do not start one lazily from a test thread
//! into a `static` shared by other tests.
//!
//! # Example
//!
//! ```no_run
//! use etcd_sync::testing::{EtcdCluster, EtcdServer};
//!
//! let etcd = EtcdServer::start()?;
//! println!("etcd is listening on {}", etcd.endpoint());
//!
//! let cluster = EtcdCluster::start(3)?;
//! let leader = cluster.leader()?;
//! cluster.kill(leader)?;
//! let new_leader = cluster.leader()?;
//! assert_ne!(leader, new_leader);
//! # Ok::<(), std::io::Error>(())
//! ```

#[cfg(not(unix))]
compile_error!(
    "etcd_sync::testing starts etcd processes with Unix signals and needs a Unix platform"
);

pub mod metrics;

use std::ffi::OsString;
use std::fmt::{self, Write as _};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a start or restart waits for etcd to report itself healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`EtcdCluster::leader`] looks for a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connect, read and write timeout of the raw HTTP requests.
const IO_TIMEOUT: Duration = Duration::from_millis(500);
/// Pause between two health polls.
const HEALTH_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Pause between two leader polls.
const LEADER_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Attempts (with fresh ports each time) to start a server or cluster.
const START_ATTEMPTS: usize = 3;
/// Lines of the etcd log quoted in error messages.
const LOG_TAIL_LINES: usize = 25;
/// At most this many bytes at the end of the log are read to find its last lines.
const LOG_TAIL_BYTES: u64 = 64 * 1024;
/// File, in each member's directory, that receives etcd's stdout and stderr.
const LOG_FILE_NAME: &str = "etcd.log";

/// Returns the etcd server binary to run.
///
/// Uses the `ETCD_BIN` environment variable if it is set (an error if that file does not
/// exist), else `etcd` found on `PATH`, else `/usr/bin/etcd`.
///
/// # Errors
///
/// [`io::ErrorKind::NotFound`] if `ETCD_BIN` names a missing file, or if no binary is found:
/// "etcd binary not found: set ETCD_BIN to an etcd 3.4+ binary, or install Debian's
/// package: apt-get install etcd-server".
///
/// # Example
///
/// ```no_run
/// let etcd = etcd_sync::testing::etcd_binary()?;
/// println!("using {}", etcd.display());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn etcd_binary() -> io::Result<PathBuf> {
    find_binary("ETCD_BIN", "etcd", "etcd-server")
}

/// Returns the `etcdctl` binary, for tests that want to poke at a server from the outside.
///
/// Uses the `ETCDCTL_BIN` environment variable if it is set (an error if that file does not
/// exist), else `etcdctl` found on `PATH`, else `/usr/bin/etcdctl`.
///
/// # Errors
///
/// [`io::ErrorKind::NotFound`] if `ETCDCTL_BIN` names a missing file, or if no binary is
/// found: "etcdctl binary not found: set ETCDCTL_BIN to an etcdctl 3.4+ binary, or install
/// Debian's package: apt-get install etcd-client".
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::{etcdctl_binary, EtcdServer};
///
/// let etcd = EtcdServer::start()?;
/// let status = std::process::Command::new(etcdctl_binary()?)
///     .env("ETCDCTL_API", "3")
///     .args(["--endpoints", &etcd.endpoint(), "put", "greeting", "hello"])
///     .status()?;
/// assert!(status.success());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn etcdctl_binary() -> io::Result<PathBuf> {
    find_binary("ETCDCTL_BIN", "etcdctl", "etcd-client")
}

fn find_binary(env_var: &str, name: &str, package: &str) -> io::Result<PathBuf> {
    if let Some(value) = std::env::var_os(env_var).filter(|value| !value.is_empty()) {
        let path = PathBuf::from(value);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{env_var} is set to {}, but that file does not exist",
                    path.display()
                ),
            ))
        };
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .filter(|dir| !dir.as_os_str().is_empty())
            .map(|dir| dir.join(name))
            .find(|candidate| is_executable(candidate))
    });
    if let Some(path) = on_path {
        return Ok(path);
    }
    let fallback = Path::new("/usr/bin").join(name);
    if is_executable(&fallback) {
        return Ok(fallback);
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "{name} binary not found: set {env_var} to an {name} 3.4+ binary, \
             or install Debian's package: apt-get install {package}"
        ),
    ))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// A single-member etcd server listening on `127.0.0.1`, killed and deleted on drop.
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::EtcdServer;
///
/// let etcd = EtcdServer::start()?;
/// let endpoints = etcd.endpoints(); // e.g. ["http://127.0.0.1:41234"]
/// # let _ = endpoints;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct EtcdServer {
    cluster: Cluster,
}

/// Configures an [`EtcdServer`] before starting it; see [`EtcdServer::builder`].
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::EtcdServer;
///
/// let etcd = EtcdServer::builder()
///     .arg("--auth-token-ttl=5")
///     .args(["--max-request-bytes=1024"])
///     .start()?;
/// # let _ = etcd;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until .start() is called"]
pub struct EtcdServerBuilder {
    args: Vec<OsString>,
    tls: bool,
}

impl EtcdServerBuilder {
    /// Adds one extra command-line flag for etcd, such as `"--auth-token-ttl=5"`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::builder()
    ///     .arg("--max-request-bytes=1024")
    ///     .start()?;
    /// # let _ = etcd;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds extra command-line flags for etcd.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::builder()
    ///     .args(["--auth-token-ttl=5", "--max-request-bytes=1024"])
    ///     .start()?;
    /// # let _ = etcd;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts the server and waits until it reports itself healthy.
    ///
    /// # Errors
    ///
    /// If the etcd binary is not found or cannot be run, or if etcd does not become
    /// healthy (within 30 seconds, in each of 3 attempts with fresh ports). The message
    /// includes the last lines of etcd's log.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::builder().start()?;
    /// # let _ = etcd;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<EtcdServer> {
        Cluster::start(1, &self.args, self.tls).map(|cluster| EtcdServer { cluster })
    }

    /// Serves clients over TLS with certificates generated for this server (see
    /// [`TlsCerts`]): `https://` endpoints, and client certificates required
    /// (`--client-cert-auth`). Health and metrics stay on a plain-HTTP metrics port.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::builder().tls().start()?;
    /// let certs = etcd.tls_certs().expect("TLS mode");
    /// println!("CA at {}", certs.ca_cert.display());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }
}

impl EtcdServer {
    /// Starts a server with the default flags and waits until it is healthy.
    ///
    /// # Errors
    ///
    /// As [`EtcdServerBuilder::start`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// # let _ = etcd;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start() -> io::Result<EtcdServer> {
        Self::builder().start()
    }

    /// Returns a builder to pass extra flags to etcd.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::builder()
    ///     .arg("--auth-token-ttl=5")
    ///     .start()?;
    /// # let _ = etcd;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder() -> EtcdServerBuilder {
        EtcdServerBuilder::default()
    }

    /// The client URL, such as `"http://127.0.0.1:41234"`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// assert!(etcd.endpoint().starts_with("http://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn endpoint(&self) -> String {
        self.member().client_url.clone()
    }

    /// The client URLs (just one), in the form clients usually take them.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// assert_eq!(etcd.endpoints(), vec![etcd.endpoint()]);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn endpoints(&self) -> Vec<String> {
        self.cluster.endpoints()
    }

    /// Freezes the etcd process with `SIGSTOP`: connections stay open but nothing answers.
    ///
    /// # Errors
    ///
    /// If etcd is not running (killed, or exited).
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// etcd.pause()?;
    /// // ... requests now time out ...
    /// etcd.resume()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pause(&self) -> io::Result<()> {
        self.member().pause()
    }

    /// Lets a paused etcd process continue with `SIGCONT`.
    ///
    /// # Errors
    ///
    /// If etcd is not running (killed, or exited).
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// etcd.pause()?;
    /// etcd.resume()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn resume(&self) -> io::Result<()> {
        self.member().resume()
    }

    /// Kills etcd with `SIGKILL` and waits for it to exit. Does nothing if it is not running.
    /// The data directory is kept, so [`restart`](Self::restart) brings back the same data.
    ///
    /// # Errors
    ///
    /// If the process cannot be signalled or waited for.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// etcd.kill()?;
    /// assert!(!etcd.is_running());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kill(&self) -> io::Result<()> {
        self.member().kill()
    }

    /// Starts etcd again with the same data directory, ports and flags (killing it first if
    /// it is still running, even paused) and waits until it is healthy.
    ///
    /// # Errors
    ///
    /// If etcd cannot be started or does not become healthy within 30 seconds (no retry
    /// with other ports here: the ports are part of the member's identity). The message
    /// includes the last lines of etcd's log.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// etcd.kill()?;
    /// etcd.restart()?;
    /// assert!(etcd.is_running());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart(&self) -> io::Result<()> {
        self.member().restart()
    }

    /// The process id of etcd, or `None` if it is not running.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// println!("etcd runs as pid {:?}", etcd.pid());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.member().pid()
    }

    /// Whether the etcd process is alive (a paused process is alive).
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// assert!(etcd.is_running());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_running(&self) -> bool {
        self.member().is_running()
    }

    /// Fetches etcd's Prometheus metrics (`GET /metrics`) as text.
    ///
    /// # Errors
    ///
    /// If etcd does not answer within the short I/O timeouts (for example, when paused)
    /// or answers with an HTTP status other than 200.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// assert!(etcd.metrics()?.contains("etcd_server_is_leader 1"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn metrics(&self) -> io::Result<String> {
        self.member().metrics()
    }

    /// etcd's data directory (`--data-dir`), removed when the server is dropped.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// println!("data in {}", etcd.data_dir().display());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn data_dir(&self) -> &Path {
        &self.member().data_dir
    }

    /// The file receiving etcd's stdout and stderr, removed when the server is dropped.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// let log = std::fs::read_to_string(etcd.log_path())?;
    /// # let _ = log;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn log_path(&self) -> &Path {
        &self.member().log_path
    }

    /// Waits until etcd reports itself healthy (`GET /health`), for at most `timeout`.
    ///
    /// # Errors
    ///
    /// If etcd is not running, exits while waiting, or is still not healthy after
    /// `timeout`. The message includes the last lines of etcd's log.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// etcd.pause()?;
    /// etcd.resume()?;
    /// etcd.wait_healthy(Duration::from_secs(5))?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wait_healthy(&self, timeout: Duration) -> io::Result<()> {
        wait_healthy(&[self.member()], timeout)
    }

    /// Turns on etcd's authentication with the users described at [`AUTH_ROOT`] and
    /// [`AUTH_USER`] (created with the real `etcdctl`). Afterwards clients must call
    /// [`ClientBuilder::user`](crate::ClientBuilder::user).
    ///
    /// # Errors
    ///
    /// If `etcdctl` is missing or one of its commands fails.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use etcd_sync::testing::{AUTH_USER, EtcdServer};
    /// let etcd = EtcdServer::start()?;
    /// etcd.enable_auth()?;
    /// let client = etcd_sync::Client::builder()
    ///     .endpoints(etcd.endpoints())
    ///     .user(AUTH_USER.0, AUTH_USER.1)
    ///     .connect()?;
    /// # let _ = client;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn enable_auth(&self) -> io::Result<()> {
        enable_auth(&self.endpoint(), self.cluster.tls.as_ref())
    }

    /// The certificates of a server started in TLS mode, else `None`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::builder().tls().start()?;
    /// assert!(etcd.tls_certs().is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls_certs(&self) -> Option<&TlsCerts> {
        self.cluster.tls.as_ref()
    }

    fn member(&self) -> &Member {
        self.cluster.member(0)
    }
}

/// A multi-member etcd cluster on `127.0.0.1`, all members killed and deleted on drop.
///
/// Members are addressed by index, `0..len()`.
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::EtcdCluster;
///
/// let cluster = EtcdCluster::start(3)?;
/// let leader = cluster.leader()?;
/// cluster.pause(leader)?;
/// let new_leader = cluster.leader()?;
/// assert_ne!(leader, new_leader);
/// cluster.resume(leader)?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct EtcdCluster {
    cluster: Cluster,
}

/// Configures an [`EtcdCluster`] before starting it; see [`EtcdCluster::builder`].
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::EtcdCluster;
///
/// let cluster = EtcdCluster::builder(3)
///     .arg("--auth-token-ttl=5")
///     .start()?;
/// # let _ = cluster;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .start() is called"]
pub struct EtcdClusterBuilder {
    members: usize,
    args: Vec<OsString>,
    tls: bool,
}

impl EtcdClusterBuilder {
    /// Adds one extra command-line flag for every member, such as `"--auth-token-ttl=5"`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3)
    ///     .arg("--max-request-bytes=1024")
    ///     .start()?;
    /// # let _ = cluster;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds extra command-line flags for every member.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3)
    ///     .args(["--auth-token-ttl=5", "--max-request-bytes=1024"])
    ///     .start()?;
    /// # let _ = cluster;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts all members concurrently and waits until every one is healthy.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidInput`] for zero members; otherwise, if the etcd binary is not
    /// found or cannot be run, or if the cluster does not become healthy (within 30 seconds,
    /// in each of 3 attempts with fresh ports). The message includes the last lines of the
    /// failing members' logs.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(5).start()?;
    /// assert_eq!(cluster.len(), 5);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<EtcdCluster> {
        Cluster::start(self.members, &self.args, self.tls).map(|cluster| EtcdCluster { cluster })
    }

    /// Serves clients over TLS, like [`EtcdServerBuilder::tls`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3).tls().start()?;
    /// # let _ = cluster;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }
}

impl EtcdCluster {
    /// Starts a cluster of `members` members with the default flags and waits until every
    /// member is healthy.
    ///
    /// # Errors
    ///
    /// As [`EtcdClusterBuilder::start`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// # let _ = cluster;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(members: usize) -> io::Result<EtcdCluster> {
        Self::builder(members).start()
    }

    /// Returns a builder to pass extra flags to every member.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3)
    ///     .arg("--auth-token-ttl=5")
    ///     .start()?;
    /// # let _ = cluster;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder(members: usize) -> EtcdClusterBuilder {
        EtcdClusterBuilder {
            members,
            args: Vec::new(),
            tls: false,
        }
    }

    /// The number of members.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// assert_eq!(cluster.len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.cluster.members.len()
    }

    /// Always `false`: a cluster has at least one member.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(1)?;
    /// assert!(!cluster.is_empty());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.cluster.members.is_empty()
    }

    /// The client URLs of all members (killed ones included), in member order.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// assert_eq!(cluster.endpoints().len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn endpoints(&self) -> Vec<String> {
        self.cluster.endpoints()
    }

    /// The client URL of member 0.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// assert_eq!(cluster.endpoint(), cluster.member_endpoint(0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn endpoint(&self) -> String {
        self.member_endpoint(0)
    }

    /// The client URL of member `i`, such as `"http://127.0.0.1:41234"`.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// let leader = cluster.leader()?;
    /// println!("leader at {}", cluster.member_endpoint(leader));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_endpoint(&self, i: usize) -> String {
        self.cluster.member(i).client_url.clone()
    }

    /// Freezes member `i` with `SIGSTOP`: its connections stay open but nothing answers,
    /// and its peers see it as unreachable.
    ///
    /// # Errors
    ///
    /// If the member is not running (killed, or exited).
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// cluster.pause(1)?;
    /// cluster.resume(1)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pause(&self, i: usize) -> io::Result<()> {
        self.cluster.member(i).pause()
    }

    /// Lets paused member `i` continue with `SIGCONT`.
    ///
    /// # Errors
    ///
    /// If the member is not running (killed, or exited).
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// cluster.pause(2)?;
    /// cluster.resume(2)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn resume(&self, i: usize) -> io::Result<()> {
        self.cluster.member(i).resume()
    }

    /// Kills member `i` with `SIGKILL` and waits for it to exit. Does nothing if it is not
    /// running. Its data directory is kept for [`restart`](Self::restart).
    ///
    /// # Errors
    ///
    /// If the process cannot be signalled or waited for.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// cluster.kill(0)?;
    /// assert!(!cluster.is_running(0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kill(&self, i: usize) -> io::Result<()> {
        self.cluster.member(i).kill()
    }

    /// Starts member `i` again with the same data directory, ports and flags (killing it
    /// first if it is still running, even paused) and waits until it is healthy. A member
    /// is only healthy when the cluster has a leader, so restarting a member of a cluster
    /// that lost its quorum fails (after 30 seconds) unless enough other members run.
    ///
    /// # Errors
    ///
    /// If the member cannot be started or does not become healthy within 30 seconds. The
    /// message includes the last lines of its log.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// cluster.kill(1)?;
    /// cluster.restart(1)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart(&self, i: usize) -> io::Result<()> {
        self.cluster.member(i).restart()
    }

    /// Kills every member, then starts them all again with their data, ports and flags,
    /// and waits until the cluster is healthy: a full-cluster restart (one member alone
    /// cannot become healthy without a quorum, so [`restart`](Self::restart) one by one
    /// would not work after a total outage).
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// cluster.restart_all()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart_all(&self) -> io::Result<()> {
        for member in &self.cluster.members {
            member.kill()?;
        }
        for member in &self.cluster.members {
            member.spawn()?;
        }
        let members: Vec<&Member> = self.cluster.members.iter().collect();
        wait_healthy(&members, START_TIMEOUT)
    }

    /// The process id of member `i`, or `None` if it is not running.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// println!("member 0 runs as pid {:?}", cluster.pid(0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.cluster.member(i).pid()
    }

    /// Whether member `i`'s process is alive (a paused process is alive).
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// assert!(cluster.is_running(2));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_running(&self, i: usize) -> bool {
        self.cluster.member(i).is_running()
    }

    /// The index of the current raft leader.
    ///
    /// Polls `GET /metrics` of every running, non-paused member for
    /// `etcd_server_is_leader 1`, for up to 10 seconds, until exactly one member claims
    /// the leadership (a member that was just resumed may briefly still believe it leads).
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::TimedOut`] if no single leader is found within 10 seconds, for
    /// example when a majority of the members is killed or paused.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// let leader = cluster.leader()?;
    /// cluster.kill(leader)?;
    /// assert_ne!(cluster.leader()?, leader);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn leader(&self) -> io::Result<usize> {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        loop {
            let leaders: Vec<usize> = (0..self.len())
                .filter(|&i| self.cluster.member(i).claims_leadership())
                .collect();
            if let [leader] = leaders[..] {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                let seen = if leaders.is_empty() {
                    "none".to_owned()
                } else {
                    format!("members {leaders:?}")
                };
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no single raft leader among the running, non-paused members of the \
                         etcd cluster within {LEADER_TIMEOUT:?} (claiming leadership: {seen})"
                    ),
                ));
            }
            thread::sleep(LEADER_POLL_INTERVAL);
        }
    }

    /// Fetches member `i`'s Prometheus metrics (`GET /metrics`) as text.
    ///
    /// # Errors
    ///
    /// If the member does not answer within the short I/O timeouts (for example, when
    /// paused or killed) or answers with an HTTP status other than 200.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// let metrics = cluster.metrics(0)?;
    /// assert!(metrics.contains("etcd_server_has_leader 1"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn metrics(&self, i: usize) -> io::Result<String> {
        self.cluster.member(i).metrics()
    }

    /// Member `i`'s data directory (`--data-dir`), removed when the cluster is dropped.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// println!("member 0 keeps its data in {}", cluster.data_dir(0).display());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn data_dir(&self, i: usize) -> &Path {
        &self.cluster.member(i).data_dir
    }

    /// The file receiving member `i`'s stdout and stderr, removed when the cluster is
    /// dropped.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// let log = std::fs::read_to_string(cluster.log_path(0))?;
    /// # let _ = log;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn log_path(&self, i: usize) -> &Path {
        &self.cluster.member(i).log_path
    }

    /// Waits until every running member (killed members are skipped) reports itself
    /// healthy (`GET /health`), for at most `timeout`. Paused members never become healthy:
    /// resume them first.
    ///
    /// # Errors
    ///
    /// If a member exits on its own, or some member is still not healthy after `timeout`.
    /// The message includes the last lines of the failing members' logs.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// cluster.kill(0)?;
    /// cluster.wait_healthy(Duration::from_secs(10))?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wait_healthy(&self, timeout: Duration) -> io::Result<()> {
        let members: Vec<&Member> = self
            .cluster
            .members
            .iter()
            .filter(|member| !member.was_killed())
            .collect();
        wait_healthy(&members, timeout)
    }
}

/// The members and directory shared by [`EtcdServer`] and [`EtcdCluster`].
#[derive(Debug)]
struct Cluster {
    // Field order matters: the members (whose drop kills their process) are dropped before
    // the directory holding their data is removed.
    members: Vec<Member>,
    tls: Option<TlsCerts>,
    _dir: TempDir,
}

impl Cluster {
    fn start(size: usize, extra_args: &[OsString], tls: bool) -> io::Result<Cluster> {
        if size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an etcd cluster needs at least one member",
            ));
        }
        let binary = etcd_binary()?;
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            // An error from `try_start` itself (no directory, cannot spawn) is final; a
            // cluster that does not come up is retried with fresh ports.
            match Self::try_start(&binary, size, extra_args, tls)? {
                Ok(cluster) => return Ok(cluster),
                Err(failure) => failures.push(failure),
            }
        }
        let mut message = format!(
            "failed to start {} ({size} member(s)) in {START_ATTEMPTS} attempts with fresh ports",
            binary.display()
        );
        let last = failures.len().saturating_sub(1);
        for (attempt, failure) in failures.iter().enumerate() {
            let text = failure.to_string();
            // Earlier attempts get their first line only; the last one is quoted in full.
            let text = match text.lines().next() {
                Some(first) if attempt < last => first,
                _ => &text,
            };
            let _ = write!(message, "\nattempt {}: {text}", attempt + 1);
        }
        let kind = failures
            .last()
            .map_or(io::ErrorKind::Other, |failure| failure.kind());
        Err(io::Error::new(kind, message))
    }

    /// One start attempt: `Err` for a fatal error, `Ok(Err)` for a cluster that did not
    /// come up (worth another attempt with other ports).
    fn try_start(
        binary: &Path,
        size: usize,
        extra_args: &[OsString],
        tls: bool,
    ) -> io::Result<Result<Cluster, io::Error>> {
        let suffix = unique_suffix();
        let dir = TempDir::create(&format!("etcd-sync-{suffix}"))?;
        let tls = if tls {
            Some(TlsCerts::generate(&dir.path.join("tls"))?)
        } else {
            None
        };
        let ports = free_ports(3 * size)?;
        let client_ports = &ports[..size];
        let peer_ports = &ports[size..2 * size];
        let metrics_ports = &ports[2 * size..];
        let initial_cluster = peer_ports
            .iter()
            .enumerate()
            .map(|(i, port)| format!("{}=http://127.0.0.1:{port}", member_name(i)))
            .collect::<Vec<_>>()
            .join(",");
        let config = ClusterConfig {
            binary,
            dir: &dir.path,
            initial_cluster: &initial_cluster,
            token: &format!("etcd-sync-{suffix}"),
            extra_args,
            tls: tls.as_ref(),
        };
        let members = (0..size)
            .map(|i| Member::new(&config, i, client_ports[i], peer_ports[i], metrics_ports[i]))
            .collect::<io::Result<Vec<_>>>()?;
        let cluster = Cluster {
            members,
            tls,
            _dir: dir,
        };
        // Spawn everyone first: a member of a new cluster only becomes healthy once a
        // quorum of its peers is up.
        for member in &cluster.members {
            member.spawn()?;
        }
        let members: Vec<&Member> = cluster.members.iter().collect();
        Ok(wait_healthy(&members, START_TIMEOUT).map(|()| cluster))
    }

    fn member(&self, i: usize) -> &Member {
        self.members.get(i).unwrap_or_else(|| {
            panic!(
                "etcd member index {i} out of range: the cluster has {} member(s)",
                self.members.len()
            )
        })
    }

    fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|member| member.client_url.clone())
            .collect()
    }
}

/// What every member of one cluster shares.
struct ClusterConfig<'a> {
    binary: &'a Path,
    dir: &'a Path,
    initial_cluster: &'a str,
    token: &'a str,
    extra_args: &'a [OsString],
    tls: Option<&'a TlsCerts>,
}

fn member_name(i: usize) -> String {
    format!("m{i}")
}

/// One etcd process: how to start it, and its current state.
#[derive(Debug)]
struct Member {
    name: String,
    binary: PathBuf,
    args: Vec<OsString>,
    data_dir: PathBuf,
    log_path: PathBuf,
    client_url: String,
    /// Plain-HTTP listener for /health and /metrics (`--listen-metrics-urls`), so health
    /// checks work the same with and without TLS on the client port.
    metrics_addr: SocketAddr,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The process, from spawn until it is killed or found to have exited (and reaped).
    child: Option<Child>,
    /// Whether the process was sent `SIGSTOP` (and no `SIGCONT` since).
    paused: bool,
    /// How the process ended, if it exited without being killed by us.
    exited: Option<ExitStatus>,
}

impl Member {
    fn new(
        config: &ClusterConfig<'_>,
        index: usize,
        client_port: u16,
        peer_port: u16,
        metrics_port: u16,
    ) -> io::Result<Member> {
        let name = member_name(index);
        let member_dir = config.dir.join(&name);
        create_private_dir(&member_dir)?;
        let data_dir = member_dir.join("data");
        let log_path = member_dir.join(LOG_FILE_NAME);
        let client_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, client_port));
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let client_url = format!("{scheme}://{client_addr}");
        let metrics_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, metrics_port));
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut args: Vec<OsString> = Vec::new();
        let mut flag = |flag: &str, value: OsString| {
            args.push(flag.into());
            args.push(value);
        };
        flag("--name", name.clone().into());
        flag("--data-dir", data_dir.clone().into());
        flag("--listen-client-urls", client_url.clone().into());
        flag("--advertise-client-urls", client_url.clone().into());
        flag("--listen-peer-urls", peer_url.clone().into());
        flag("--initial-advertise-peer-urls", peer_url.into());
        flag("--initial-cluster", config.initial_cluster.into());
        flag("--initial-cluster-token", config.token.into());
        flag("--initial-cluster-state", "new".into());
        flag(
            "--listen-metrics-urls",
            format!("http://{metrics_addr}").into(),
        );
        if let Some(tls) = config.tls {
            flag("--cert-file", tls.server_cert.clone().into());
            flag("--key-file", tls.server_key.clone().into());
            flag("--trusted-ca-file", tls.ca_cert.clone().into());
            args.push("--client-cert-auth".into());
        }
        args.push("--logger=zap".into());
        args.extend(config.extra_args.iter().cloned());
        Ok(Member {
            name,
            binary: config.binary.to_path_buf(),
            args,
            data_dir,
            log_path,
            client_url,
            metrics_addr,
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notices (and reaps) a process that exited on its own.
    fn reap(state: &mut State) {
        if let Some(child) = state.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            state.child = None;
            state.paused = false;
            state.exited = Some(status);
        }
    }

    /// Starts the process; its output is appended to the log file.
    fn spawn(&self) -> io::Result<()> {
        let mut state = self.lock();
        Self::reap(&mut state);
        if state.child.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("etcd member {} is already running", self.name),
            ));
        }
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| context(e, format_args!("cannot open {}", self.log_path.display())))?;
        let command_line = std::iter::once(self.binary.as_os_str())
            .chain(self.args.iter().map(|arg| arg.as_os_str()))
            .map(|arg| arg.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        writeln!(log, "=== etcd-sync: starting {command_line}")?;
        let stderr = log.try_clone()?;
        let mut command = Command::new(&self.binary);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        for (key, _) in std::env::vars_os() {
            if is_etcd_config_var(&key) {
                command.env_remove(key);
            }
        }
        let parent = std::process::id();
        // SAFETY: the closure runs in the forked child before exec, where only
        // async-signal-safe operations are allowed. It only makes the prctl(2) and
        // getppid(2) system calls and builds `io::Error`s from raw OS error codes, which do
        // not allocate; it touches no lock and no shared state of the parent.
        unsafe {
            command.pre_exec(move || die_with_parent(parent));
        }
        let child = command.spawn().map_err(|e| {
            context(
                e,
                format_args!(
                    "cannot run {} for etcd member {}",
                    self.binary.display(),
                    self.name
                ),
            )
        })?;
        state.child = Some(child);
        state.paused = false;
        state.exited = None;
        Ok(())
    }

    /// `SIGKILL`s (and `SIGCONT`s, in case it is paused) the process and waits for it.
    fn kill(&self) -> io::Result<()> {
        let mut state = self.lock();
        let Some(mut child) = state.child.take() else {
            return Ok(());
        };
        if let Err(e) = child.kill() {
            // Do not wait for a process we could not kill: that could block forever.
            state.child = Some(child);
            return Err(context(
                e,
                format_args!("cannot kill etcd member {}", self.name),
            ));
        }
        // SIGKILL also ends a stopped process; SIGCONT is for good measure. The process is
        // not reaped yet, so its pid cannot have been reused.
        let _ = send_signal(&child, libc::SIGCONT);
        state.paused = false;
        state.exited = None;
        child
            .wait()
            .map(drop)
            .map_err(|e| context(e, format_args!("cannot wait for etcd member {}", self.name)))
    }

    fn restart(&self) -> io::Result<()> {
        self.kill()?;
        self.spawn()?;
        wait_healthy(&[self], START_TIMEOUT)
    }

    fn pause(&self) -> io::Result<()> {
        self.set_paused(true)
    }

    fn resume(&self) -> io::Result<()> {
        self.set_paused(false)
    }

    fn set_paused(&self, paused: bool) -> io::Result<()> {
        let mut state = self.lock();
        Self::reap(&mut state);
        let Some(child) = state.child.as_ref() else {
            return Err(self.not_running(&state));
        };
        let (signal, action) = if paused {
            (libc::SIGSTOP, "pause")
        } else {
            (libc::SIGCONT, "resume")
        };
        send_signal(child, signal)
            .map_err(|e| context(e, format_args!("cannot {action} etcd member {}", self.name)))?;
        if paused {
            // SIGSTOP is asynchronous: a thread busy in the kernel may still finish writing
            // a response. Return only once every thread is stopped, so tests that pause and
            // then send a request can rely on it not being answered.
            wait_all_threads_stopped(child.id());
        }
        state.paused = paused;
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        let mut state = self.lock();
        Self::reap(&mut state);
        state.child.as_ref().map(Child::id)
    }

    fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Whether the process was stopped on purpose (killed, or never started), as opposed to
    /// running or having exited on its own.
    fn was_killed(&self) -> bool {
        let mut state = self.lock();
        Self::reap(&mut state);
        state.child.is_none() && state.exited.is_none()
    }

    /// The error for an operation that needs a running process.
    fn not_running(&self, state: &State) -> io::Error {
        match state.exited {
            Some(status) => {
                let hint = if status.signal() == Some(libc::SIGKILL) {
                    " (not by etcd_sync::testing: by the OOM killer, or by the parent-death \
                     signal because the thread that started it exited)"
                } else {
                    ""
                };
                io::Error::other(format!(
                    "etcd member {} ({}) exited: {status}{hint}; last lines of {}:\n{}",
                    self.name,
                    self.client_url,
                    self.log_path.display(),
                    self.log_tail()
                ))
            }
            None => io::Error::new(
                io::ErrorKind::NotConnected,
                format!(
                    "etcd member {} ({}) is not running (it was killed)",
                    self.name, self.client_url
                ),
            ),
        }
    }

    /// One health poll: `Ok(true)` once `GET /health` says so, an error if the process is
    /// not running.
    fn poll_health(&self) -> io::Result<bool> {
        {
            let mut state = self.lock();
            Self::reap(&mut state);
            if state.child.is_none() {
                return Err(self.not_running(&state));
            }
        }
        Ok(http_get(self.metrics_addr, "/health")
            .is_ok_and(|(_, body)| find(&body, br#""health":"true""#).is_some()))
    }

    fn metrics(&self) -> io::Result<String> {
        let (status, body) = http_get(self.metrics_addr, "/metrics").map_err(|e| {
            context(
                e,
                format_args!(
                    "GET {}/metrics (etcd member {})",
                    self.client_url, self.name
                ),
            )
        })?;
        if status != 200 {
            return Err(io::Error::other(format!(
                "GET {}/metrics (etcd member {}): HTTP status {status}",
                self.client_url, self.name
            )));
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// Whether this member is running, not paused, and says it is the raft leader.
    fn claims_leadership(&self) -> bool {
        {
            let mut state = self.lock();
            Self::reap(&mut state);
            if state.child.is_none() || state.paused {
                return false;
            }
        }
        self.metrics()
            .and_then(|text| metrics::parse(&text))
            .is_ok_and(|metrics| metrics.get("etcd_server_is_leader", &[]) == Some(1.0))
    }

    fn log_tail(&self) -> String {
        read_tail(&self.log_path, LOG_TAIL_LINES)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log_path.display()))
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Polls `GET /health` of `members` until all are healthy, one exits, or `timeout` passes.
fn wait_healthy(members: &[&Member], timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut pending = members.to_vec();
    loop {
        let mut unhealthy = Vec::new();
        for member in pending {
            if !member.poll_health()? {
                unhealthy.push(member);
            }
        }
        pending = unhealthy;
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let mut message = format!("etcd did not become healthy within {timeout:?}");
            for member in &pending {
                let _ = write!(
                    message,
                    "\n--- member {} ({}), last lines of {}:\n{}",
                    member.name,
                    member.client_url,
                    member.log_path.display(),
                    member.log_tail()
                );
            }
            return Err(io::Error::new(io::ErrorKind::TimedOut, message));
        }
        thread::sleep(HEALTH_POLL_INTERVAL);
    }
}

/// Runs in the forked child before exec: asks the kernel to `SIGKILL` etcd when the thread
/// that spawned it exits. Only async-signal-safe, non-allocating calls.
fn die_with_parent(parent: u32) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // SAFETY: prctl(2) with PR_SET_PDEATHSIG takes a signal number and only changes an
        // attribute of the calling process; no pointers are involved.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // If the parent died between fork and prctl, the death signal will never come.
        // SAFETY: getppid(2) has no preconditions.
        if unsafe { libc::getppid() } as u32 != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = parent;
    Ok(())
}

fn send_signal(child: &Child, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(child.id())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "process id out of range"))?;
    // SAFETY: kill(2) has no memory-safety preconditions. `pid` is our own child, not yet
    // reaped (callers hold the `Child`), so it cannot name a recycled, unrelated process.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Environment variables that etcd would read as configuration (and that make it refuse to
/// start when they conflict with a flag), except the one needed on some architectures.
fn is_etcd_config_var(key: &std::ffi::OsStr) -> bool {
    key.to_str()
        .is_some_and(|key| key.starts_with("ETCD_") && key != "ETCD_UNSUPPORTED_ARCH")
}

/// A raw HTTP/1.1 `GET` with short timeouts, read until the server closes the connection.
/// Returns the status code and the (de-chunked) body.
fn http_get(addr: SocketAddr, path: &str) -> io::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;

    let invalid = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("invalid HTTP response to GET http://{addr}{path}: {what}"),
        )
    };
    let header_end = find(&response, b"\r\n\r\n").ok_or_else(|| invalid("no end of headers"))?;
    let (head, body) = response.split_at(header_end);
    let body = body.get(4..).unwrap_or_default();
    let head = std::str::from_utf8(head).map_err(|_| invalid("headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|status_line| status_line.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| invalid("bad status line"))?;
    let chunked = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        decode_chunked(body).ok_or_else(|| invalid("bad chunked body"))?
    } else {
        body.to_vec()
    };
    Ok((status, body))
}

/// Decodes a `Transfer-Encoding: chunked` body (trailers are ignored).
fn decode_chunked(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n")?;
        let (size_line, after) = rest.split_at(line_end);
        let size_line = std::str::from_utf8(size_line).ok()?;
        let size_hex = size_line.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        rest = after.get(2..)?;
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size..)?.strip_prefix(b"\r\n")?;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// The last `lines` lines of a file (looking at its last [`LOG_TAIL_BYTES`] bytes only).
fn read_tail(path: &Path, lines: usize) -> io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    Ok(all[all.len().saturating_sub(lines)..].join("\n"))
}

/// Free ports on 127.0.0.1, all different: every listener is held until all are picked.
fn free_ports(count: usize) -> io::Result<Vec<u16>> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<io::Result<Vec<_>>>()
        .map_err(|e| context(e, "cannot pick a free port on 127.0.0.1"))?;
    listeners
        .iter()
        .map(|listener| listener.local_addr().map(|addr| addr.port()))
        .collect()
}

/// `pid-counter-nanos`: unique within this process, and across processes.
fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since_epoch| since_epoch.subsec_nanos());
    format!("{}-{count}-{nanos}", std::process::id())
}

fn create_private_dir(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new().mode(0o700).create(path).map_err(|e| {
        context(
            e,
            format_args!("cannot create directory {}", path.display()),
        )
    })
}

/// A directory under [`std::env::temp_dir`], removed (with its contents) on drop.
#[derive(Debug)]
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn create(name: &str) -> io::Result<TempDir> {
        let path = std::env::temp_dir().join(name);
        create_private_dir(&path)?;
        Ok(TempDir { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Prefixes an error's message, keeping its kind.
fn context(error: io::Error, what: impl fmt::Display) -> io::Error {
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

/// Waits (up to 1 s) until every thread of `pid` is in the stopped state (`T`).
fn wait_all_threads_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let all_stopped = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks.filter_map(|t| t.ok()).all(|task| {
                    std::fs::read_to_string(task.path().join("stat"))
                        .ok()
                        .and_then(|stat| {
                            // The state follows the ")" that closes the command name.
                            stat.rsplit_once(')')
                                .map(|(_, rest)| rest.trim_start().starts_with('T'))
                        })
                        .unwrap_or(true)
                })
            })
            .unwrap_or(true);
        if all_stopped {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The root user [`EtcdServer::enable_auth`] creates: `(name, password)`.
pub const AUTH_ROOT: (&str, &str) = ("root", "root-secret");

/// The restricted user [`EtcdServer::enable_auth`] creates: `(name, password)`. Its role
/// `app` may read and write keys starting with [`AUTH_PREFIX`] only.
pub const AUTH_USER: (&str, &str) = ("app", "app-secret");

/// The key prefix [`AUTH_USER`] may use.
pub const AUTH_PREFIX: &str = "app/";

/// Creates the root user, a restricted user and role, and enables auth, with `etcdctl`.
fn enable_auth(endpoint: &str, tls: Option<&TlsCerts>) -> io::Result<()> {
    let etcdctl = etcdctl_binary()?;
    let root = format!("{}:{}", AUTH_ROOT.0, AUTH_ROOT.1);
    let user = format!("{}:{}", AUTH_USER.0, AUTH_USER.1);
    let prefix_end = "app0"; // AUTH_PREFIX with its last byte incremented
    let steps: [&[&str]; 6] = [
        &["user", "add", &root, "--interactive=false"],
        &["role", "add", AUTH_USER.0],
        &[
            "role",
            "grant-permission",
            AUTH_USER.0,
            "readwrite",
            AUTH_PREFIX,
            prefix_end,
        ],
        &["user", "add", &user, "--interactive=false"],
        &["user", "grant-role", AUTH_USER.0, AUTH_USER.0],
        &["auth", "enable"],
    ];
    for args in steps {
        let mut command = Command::new(&etcdctl);
        command.env_clear().arg("--endpoints").arg(endpoint);
        if let Some(tls) = tls {
            command
                .arg("--cacert")
                .arg(&tls.ca_cert)
                .arg("--cert")
                .arg(&tls.client_cert)
                .arg("--key")
                .arg(&tls.client_key);
        }
        let output = command
            .args(args)
            .output()
            .map_err(|e| context(e, format_args!("cannot run {}", etcdctl.display())))?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "etcdctl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
    }
    Ok(())
}

/// Certificates generated at test time for a TLS-mode etcd (see
/// [`EtcdServerBuilder::tls`]): a CA, a server certificate for `127.0.0.1` and
/// `localhost`, a client certificate, and a second, unrelated CA to test rejection. All
/// files are PEM, in the server's temporary directory.
#[derive(Debug, Clone)]
pub struct TlsCerts {
    /// The CA that signed the server and client certificates.
    pub ca_cert: PathBuf,
    /// The server certificate (SANs `127.0.0.1`, `localhost`).
    pub server_cert: PathBuf,
    /// The server's private key.
    pub server_key: PathBuf,
    /// A client certificate signed by the CA (common name `etcd-sync-client`).
    pub client_cert: PathBuf,
    /// The client certificate's private key.
    pub client_key: PathBuf,
    /// A CA that etcd does not trust: trusting only it must fail the handshake.
    pub other_ca_cert: PathBuf,
    /// A client certificate signed by the unrelated CA: etcd must refuse it.
    pub untrusted_client_cert: PathBuf,
    /// The untrusted client certificate's private key.
    pub untrusted_client_key: PathBuf,
}

impl TlsCerts {
    fn generate(dir: &Path) -> io::Result<TlsCerts> {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let fail = |e: rcgen::Error| io::Error::other(format!("generating test certificates: {e}"));
        create_private_dir(dir)?;
        let ca = |name: &str| -> io::Result<CertifiedIssuer<'static, KeyPair>> {
            let mut params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(fail)?).map_err(fail)
        };
        let issuer = ca("etcd-sync test CA")?;
        let other = ca("etcd-sync unrelated CA")?;
        let leaf = |names: Vec<String>,
                    cn: &str,
                    usages,
                    signer: &CertifiedIssuer<'static, KeyPair>|
         -> io::Result<(String, String)> {
            let mut params = CertificateParams::new(names).map_err(fail)?;
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = usages;
            let key = KeyPair::generate().map_err(fail)?;
            let cert = params.signed_by(&key, signer).map_err(fail)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let (server_pem, server_key_pem) = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            "etcd-sync test server",
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            &issuer,
        )?;
        let (client_pem, client_key_pem) = leaf(
            Vec::new(),
            "etcd-sync-client",
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            &issuer,
        )?;
        let (untrusted_pem, untrusted_key_pem) = leaf(
            Vec::new(),
            "etcd-sync-untrusted-client",
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            &other,
        )?;
        let write = |name: &str, contents: &str| -> io::Result<PathBuf> {
            let path = dir.join(name);
            fs::write(&path, contents)
                .map_err(|e| context(e, format_args!("cannot write {}", path.display())))?;
            Ok(path)
        };
        Ok(TlsCerts {
            ca_cert: write("ca.pem", &issuer.pem())?,
            server_cert: write("server.pem", &server_pem)?,
            server_key: write("server-key.pem", &server_key_pem)?,
            client_cert: write("client.pem", &client_pem)?,
            client_key: write("client-key.pem", &client_key_pem)?,
            other_ca_cert: write("other-ca.pem", &other.pem())?,
            untrusted_client_cert: write("untrusted-client.pem", &untrusted_pem)?,
            untrusted_client_key: write("untrusted-client-key.pem", &untrusted_key_pem)?,
        })
    }
}
