//! etcd's gRPC proxy (`etcd grpc-proxy start`, the same binary as the server) in front of a
//! test server or cluster: the topology where clients talk to a proxy, not to a member.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::binary::etcd_binary;
use super::error::context;
use super::member::is_etcd_config_var;
use super::process::spawn_dying_with_parent;
use super::scratch::{TempDir, free_ports, unique_suffix};

/// How long a proxy may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// A running `etcd grpc-proxy` on `127.0.0.1`, in front of the members it was given;
/// killed on drop.
///
/// Clients connect to [`endpoint`](EtcdProxy::endpoint) as to a member. With a
/// [`namespace`](EtcdProxyBuilder::namespace) the proxy puts the prefix before every key
/// it forwards and strips it from every answer.
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::{EtcdProxy, EtcdServer};
///
/// let etcd = EtcdServer::start()?;
/// let proxy = EtcdProxy::start(&etcd.endpoints())?;
/// let client = etcd_sync::Client::connect([proxy.endpoint()])?;
/// # let _ = client;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct EtcdProxy {
    binary: PathBuf,
    args: Vec<OsString>,
    addr: SocketAddr,
    log_path: PathBuf,
    child: Mutex<Option<Child>>,
    // Last: removed after the process is gone.
    _dir: TempDir,
}

/// Configures an [`EtcdProxy`]; see [`EtcdProxy::builder`].
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::{EtcdProxy, EtcdServer};
///
/// let etcd = EtcdServer::start()?;
/// let proxy = EtcdProxy::builder(&etcd.endpoints())
///     .namespace("/tenant-a/")
///     .start()?;
/// # let _ = proxy;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .start() is called"]
pub struct EtcdProxyBuilder {
    endpoints: Vec<String>,
    namespace: Option<String>,
    binary: Option<PathBuf>,
}

impl EtcdProxyBuilder {
    /// Every key the proxy forwards gets this prefix, and loses it in answers
    /// (`--namespace`).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// let proxy = etcd_sync::testing::EtcdProxy::builder(&etcd.endpoints())
    ///     .namespace("/tenant-a/")
    ///     .start()?;
    /// # let _ = proxy;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn namespace(mut self, prefix: impl Into<String>) -> Self {
        self.namespace = Some(prefix.into());
        self
    }

    /// The etcd binary to run the proxy from (by default [`etcd_binary`], the servers'
    /// own).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// let proxy = etcd_sync::testing::EtcdProxy::builder(&etcd.endpoints())
    ///     .binary("/usr/bin/etcd")
    ///     .start()?;
    /// # let _ = proxy;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Starts the proxy and waits until it listens.
    ///
    /// # Errors
    ///
    /// If no endpoint was given, the binary cannot be run, or the proxy does not listen
    /// within 15 seconds (the message quotes its log).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// let proxy = etcd_sync::testing::EtcdProxy::builder(&etcd.endpoints()).start()?;
    /// # let _ = proxy;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<EtcdProxy> {
        if self.endpoints.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a gRPC proxy needs at least one etcd endpoint",
            ));
        }
        let binary = match self.binary {
            Some(binary) => binary,
            None => etcd_binary()?,
        };
        let dir = TempDir::create(&format!("etcd-sync-proxy-{}", unique_suffix()))?;
        let port = free_ports(1)?[0];
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        // The proxy takes host:port, not URLs.
        let members: Vec<&str> = self
            .endpoints
            .iter()
            .map(|e| e.split_once("://").map_or(e.as_str(), |(_, rest)| rest))
            .collect();
        let mut args: Vec<OsString> = vec![
            "grpc-proxy".into(),
            "start".into(),
            format!("--endpoints={}", members.join(",")).into(),
            format!("--listen-addr={addr}").into(),
        ];
        let mut data_dir = OsString::from("--data-dir=");
        data_dir.push(dir.path().join("data"));
        args.push(data_dir);
        if let Some(namespace) = &self.namespace {
            args.push(format!("--namespace={namespace}").into());
        }
        let proxy = EtcdProxy {
            binary,
            args,
            addr,
            log_path: dir.path().join("proxy.log"),
            child: Mutex::new(None),
            _dir: dir,
        };
        proxy.spawn()?;
        Ok(proxy)
    }
}

impl EtcdProxy {
    /// Starts a plain proxy in front of `endpoints` (members' client URLs).
    ///
    /// # Errors
    ///
    /// As [`EtcdProxyBuilder::start`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// let proxy = etcd_sync::testing::EtcdProxy::start(&etcd.endpoints())?;
    /// # let _ = proxy;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(endpoints: &[String]) -> io::Result<EtcdProxy> {
        Self::builder(endpoints).start()
    }

    /// A builder for a proxy in front of `endpoints`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// let builder = etcd_sync::testing::EtcdProxy::builder(&etcd.endpoints());
    /// # let _ = builder;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder(endpoints: &[String]) -> EtcdProxyBuilder {
        EtcdProxyBuilder {
            endpoints: endpoints.to_vec(),
            namespace: None,
            binary: None,
        }
    }

    /// The URL clients connect to, such as `"http://127.0.0.1:41234"`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// let proxy = etcd_sync::testing::EtcdProxy::start(&etcd.endpoints())?;
    /// assert!(proxy.endpoint().starts_with("http://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kills the proxy (`SIGKILL`) and waits for it; its clients' connections break.
    /// Does nothing if it is not running.
    ///
    /// # Errors
    ///
    /// If the process cannot be killed or waited for.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// let proxy = etcd_sync::testing::EtcdProxy::start(&etcd.endpoints())?;
    /// proxy.kill()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kill(&self) -> io::Result<()> {
        let Some(mut child) = self.lock().take() else {
            return Ok(());
        };
        child.kill()?;
        child.wait().map(drop)
    }

    /// Starts the proxy again on the same port (killing it first if it runs) and waits
    /// until it listens.
    ///
    /// # Errors
    ///
    /// As [`EtcdProxyBuilder::start`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # let etcd = etcd_sync::testing::EtcdServer::start()?;
    /// let proxy = etcd_sync::testing::EtcdProxy::start(&etcd.endpoints())?;
    /// proxy.restart()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart(&self) -> io::Result<()> {
        self.kill()?;
        self.spawn()
    }

    fn lock(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spawn(&self) -> io::Result<()> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| context(e, format_args!("cannot open {}", self.log_path.display())))?;
        writeln!(
            log,
            "=== etcd-sync: starting {:?} {:?}",
            self.binary, self.args
        )?;
        let stderr = log.try_clone()?;
        let mut command = Command::new(&self.binary);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        // etcd reads ETCD_* as configuration, the proxy too: the members' rule.
        for (key, _) in std::env::vars_os() {
            if is_etcd_config_var(&key) {
                command.env_remove(key);
            }
        }
        let child = spawn_dying_with_parent(&mut command).map_err(|e| {
            context(
                e,
                format_args!("cannot run {} grpc-proxy", self.binary.display()),
            )
        })?;
        *self.lock() = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            let exited = self
                .lock()
                .as_mut()
                .map(|child| matches!(child.try_wait(), Ok(Some(_))))
                .unwrap_or(true);
            if exited || Instant::now() >= deadline {
                let _ = self.kill();
                let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "etcd grpc-proxy on {} did not listen{}; its log ends:\n{}",
                        self.addr,
                        if exited {
                            " (it exited)"
                        } else {
                            " within 15 s"
                        },
                        tail.join("\n")
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for EtcdProxy {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}
