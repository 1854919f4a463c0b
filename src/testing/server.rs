//! A single etcd server: a cluster of one member, with the member index left out.

use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::time::Duration;

use super::auth;
use super::certs::TlsCerts;
use super::cluster::EtcdCluster;
use super::start::EtcdClusterBuilder;
use super::version::EtcdVersion;

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
    cluster: EtcdCluster,
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
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .start() is called"]
pub struct EtcdServerBuilder {
    cluster: EtcdClusterBuilder,
}

impl Default for EtcdServerBuilder {
    fn default() -> Self {
        EtcdServerBuilder {
            cluster: EtcdCluster::builder(1),
        }
    }
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
    pub fn arg(self, arg: impl Into<OsString>) -> Self {
        EtcdServerBuilder {
            cluster: self.cluster.arg(arg),
        }
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
    pub fn args<I, S>(self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        EtcdServerBuilder {
            cluster: self.cluster.args(args),
        }
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
        self.cluster.start().map(|cluster| EtcdServer { cluster })
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
    pub fn tls(self) -> Self {
        EtcdServerBuilder {
            cluster: self.cluster.tls(),
        }
    }

    /// Sends watch progress notifications this often; see
    /// [`EtcdClusterBuilder::watch_progress_notify_interval`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let etcd = etcd_sync::testing::EtcdServer::builder()
    ///     .watch_progress_notify_interval(Duration::from_millis(100))
    ///     .start()?;
    /// # let _ = etcd;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn watch_progress_notify_interval(self, interval: Duration) -> Self {
        EtcdServerBuilder {
            cluster: self.cluster.watch_progress_notify_interval(interval),
        }
    }
}

impl EtcdServer {
    /// The version of etcd the server runs.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// println!("etcd {}", etcd.version());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn version(&self) -> EtcdVersion {
        self.cluster.version()
    }

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
        self.cluster.endpoint()
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
        self.cluster.pause(0)
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
        self.cluster.resume(0)
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
        self.cluster.kill(0)
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
        self.cluster.restart(0)
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
        self.cluster.pid(0)
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
        self.cluster.is_running(0)
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
        self.cluster.metrics(0)
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
        self.cluster.data_dir(0)
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
        self.cluster.log_path(0)
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
        self.cluster.wait_all_healthy(timeout)
    }

    /// Turns on etcd's authentication with the users described at
    /// [`AUTH_ROOT`](super::AUTH_ROOT) and [`AUTH_USER`](super::AUTH_USER) (created with the
    /// real `etcdctl`). Afterwards clients must call
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
        auth::enable_auth(&self.endpoint(), self.tls_certs())
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
        self.cluster.tls()
    }
}
