//! [`ClientBuilder`]: the settings of a connection, their limits, and their validation.

use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::support::error::{Error, Result};
use crate::support::tuning::LineTuning;
use crate::transport::{RpcConfig, parse_endpoint};

/// Default limit for establishing a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default limit for one unary request (a get, a put, one lock transaction).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The fastest HTTP/2 keep-alive ping interval allowed: etcd closes connections that ping
/// more often than its `--grpc-keepalive-min-time` (5 s by default).
pub const MIN_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// The slowest HTTP/2 keep-alive ping interval accepted (2 hours, TCP's own default):
/// beyond that a dead connection would go unnoticed for longer than any session lives.
pub const MAX_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(2 * 60 * 60);
/// The longest connect or request timeout accepted (1 hour). Longer values are almost
/// always a unit mistake, and they overflow timer arithmetic deep in the HTTP stack.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60 * 60);

// The ways to a client live with the builder they go through, so that `mod.rs` (what a
// client is) needs nothing from here.
impl Client {
    /// Connects with default settings. Endpoints are URLs like `http://127.0.0.1:2379`
    /// (`127.0.0.1:2379` is read as `http://`).
    ///
    /// # Errors
    ///
    /// As [`ClientBuilder::connect`]: mainly [`Error::InvalidArgument`] for a malformed
    /// endpoint and [`Error::Connect`] when no endpoint answers within
    /// [`DEFAULT_CONNECT_TIMEOUT`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// # let _ = client;
    /// # Ok(()) }
    /// ```
    pub fn connect<I, S>(endpoints: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Client::builder().endpoints(endpoints).connect()
    }

    /// A builder for timeouts and other settings.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::builder()
    ///     .endpoints(["http://10.0.0.1:2379", "http://10.0.0.2:2379"])
    ///     .connect_timeout(Duration::from_secs(1))
    ///     .request_timeout(Duration::from_secs(2))
    ///     .connect()?;
    /// # let _ = client;
    /// # Ok(()) }
    /// ```
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }
}

/// Configures a [`Client`].
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::builder()
///     .endpoints(["http://127.0.0.1:2379"])
///     .request_timeout(Duration::from_secs(2))
///     .connect()?;
/// # let _ = client;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until .connect()"]
pub struct ClientBuilder {
    endpoints: Vec<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    keep_alive_interval: Duration,
    credentials: Option<(String, String)>,
    shared_runtime: bool,
    line_tuning: LineTuning,
    deadlock_prefix: Option<Vec<u8>>,
    #[cfg(feature = "tls")]
    tls: Option<crate::support::tls::TlsConfig>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("endpoints", &self.endpoints)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("keep_alive_interval", &self.keep_alive_interval)
            // Never print the password.
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("shared_runtime", &self.shared_runtime)
            .field(
                "deadlock_detection",
                &self.deadlock_prefix.as_deref().map(String::from_utf8_lossy),
            )
            .finish()
    }
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            endpoints: Vec::new(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            keep_alive_interval: MIN_KEEP_ALIVE_INTERVAL,
            credentials: None,
            shared_runtime: false,
            line_tuning: LineTuning::default(),
            deadlock_prefix: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl ClientBuilder {
    fn uses_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Sets the etcd endpoints (members of one cluster). Requests go to the first one that
    /// answers and move on to the next when it fails.
    ///
    /// ```
    /// let b = etcd_sync::Client::builder().endpoints(["127.0.0.1:2379", "127.0.0.1:22379"]);
    /// # let _ = b;
    /// ```
    pub fn endpoints<I, S>(mut self, endpoints: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.endpoints = endpoints
            .into_iter()
            .map(|s| s.as_ref().to_string())
            .collect();
        self
    }

    /// How long connecting may take before [`Error::Connect`] (default 3 s). Until an
    /// endpoint answers, the client keeps trying every endpoint, pausing up to 1 s between
    /// rounds (like etcdctl's `--dial-timeout`): a long timeout waits for an etcd that is
    /// still starting. An endpoint that refuses the client certificate ends it at once.
    ///
    /// ```
    /// let b = etcd_sync::Client::builder().connect_timeout(std::time::Duration::from_secs(1));
    /// # let _ = b;
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.connect_timeout = timeout;
        self
    }

    /// How long one unary request may take before [`Error::Timeout`] (default 5 s). Also
    /// bounds the release a guard's `Drop` performs.
    ///
    /// ```
    /// let b = etcd_sync::Client::builder().request_timeout(std::time::Duration::from_secs(2));
    /// # let _ = b;
    /// ```
    pub fn request_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.request_timeout = timeout;
        self
    }

    /// HTTP/2 ping interval while streams are open (default and minimum 10 s: etcd drops
    /// connections that ping faster).
    ///
    /// ```
    /// let b = etcd_sync::Client::builder().keep_alive_interval(std::time::Duration::from_secs(30));
    /// # let _ = b;
    /// ```
    pub fn keep_alive_interval(mut self, interval: Duration) -> ClientBuilder {
        self.keep_alive_interval = interval;
        self
    }

    /// Authenticates as `user` with `password` (etcd auth). The client sends its token with
    /// every call and stream, and authenticates again by itself when etcd says the token
    /// expired, also in the middle of a long lock wait. Wrong credentials make
    /// [`connect`](ClientBuilder::connect) fail with [`Error::Authentication`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::builder()
    ///     .endpoints(["http://127.0.0.1:2379"])
    ///     .user("app", "secret")
    ///     .connect()?;
    /// # let _ = client;
    /// # Ok(()) }
    /// ```
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> ClientBuilder {
        self.credentials = Some((user.into(), password.into()));
        self
    }

    /// Connects over TLS (`https://` endpoints; `host:port` is read as `https://`).
    /// Requires the cargo feature `tls`.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let tls = etcd_sync::TlsConfig::from_files("ca.pem", Some(("client.pem", "client-key.pem")))?;
    /// let client = etcd_sync::Client::builder().endpoints(["https://127.0.0.1:2379"]).tls(tls).connect()?;
    /// # let _ = client;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, tls: crate::support::tls::TlsConfig) -> ClientBuilder {
        self.tls = Some(tls);
        self
    }

    /// Runs this client's I/O on the process's shared runtime (`true`) instead of one of its
    /// own (`false`, the default). A runtime is driven by the thread that waits for a call,
    /// and by its idle thread between calls; every client built with this shares one
    /// runtime and idle thread, started by the first and stopped when the last is dropped,
    /// as the clients of an async program share their executor. For a process that holds
    /// many clients at once (one per cluster or per tenant, or many contenders in one
    /// test): one thread instead of one each, and fewer thread switches
    /// (docs/design/blocking-seam.md). The clients' futures then take turns on whichever
    /// thread drives, so a client's calls wait while another's are being handled. Each
    /// client still has its own connection, keep-alive thread and watch stream, and
    /// dropping one stops its own work
    /// only.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let a = etcd_sync::Client::builder().endpoints(["127.0.0.1:2379"]).shared_runtime(true).connect()?;
    /// let b = etcd_sync::Client::builder().endpoints(["127.0.0.1:22379"]).shared_runtime(true).connect()?;
    /// # let _ = (a, b);
    /// # Ok(()) }
    /// ```
    pub fn shared_runtime(mut self, shared: bool) -> ClientBuilder {
        self.shared_runtime = shared;
        self
    }

    /// Opt in to deadlock detection for the names under `prefix` (`""`: every name): a
    /// blocking wait of this client's sessions (`lock`, `lock_timeout`, `lock_with`, a
    /// read or write lock, a permit, a multi-lock, a campaign) for a name under `prefix`
    /// that would complete a cycle of waits across sessions ends with
    /// [`Error::Deadlock`], naming the cycle, instead of waiting forever. Off by default.
    ///
    /// **How.** The check is [`Client::wait_graph`]'s read without the lease lookups: one
    /// linearizable Range of `prefix` (with the values: etcd 3.7 leaves leases out of a
    /// keys-only answer) and the cycle search on it. A wait that does not own at once
    /// checks once right after its key joined the line (the read is at a revision after
    /// its key's: the wait that closes a cycle sees it there), then again once a second
    /// while it waits (a cycle can also close later: a stuck session that gives up, a
    /// session that acquires on another thread), or once every 10 ms a key read when that
    /// is longer, up to 10 s (1,000 keys: every 10 s).
    /// **Cost:** one Range of the whole prefix per check: 1 for a wait, plus one per
    /// second waited (fewer for a long prefix), plus one when a cycle is seen; nothing for
    /// a wait that owns at once, or for a name outside `prefix`. Keep the prefix narrow
    /// (the names that can deadlock with each other): a Range of 1,000 sessions' keys
    /// takes 5-10 ms on one local etcd (BENCHMARKS.md).
    ///
    /// **Who ends.** A cycle read at revision R existed at R (every session on it waited,
    /// at R, for a name the next one held or was ahead of it in). It ends a wait only if
    /// a second read 250 ms later shows it again. Only one wait of the cycle ends: the
    /// one whose key is youngest (highest create revision); the others keep waiting, and
    /// go on once it has let go of what it holds. Its key is removed as a timed-out
    /// wait's is. Cycles the library undoes by itself end no wait: a session behind its
    /// own key, a multi-lock's keys on the names after the one it waits for, a key of the
    /// waiter's own session that no guard in this process holds (a release still due).
    /// The graph's parties are sessions: a session that holds a name on one thread and
    /// waits on another counts as holding while it waits, so use a session per thread
    /// for work that may take names in different orders. A read that fails is skipped
    /// (the next check reads again); a refusal (`PermissionDenied` on the prefix) turns
    /// the check off for that wait, with a warning.
    ///
    /// Every process whose sessions take names under the prefix should opt in: a wait
    /// chosen to end in a process without the option keeps waiting.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::builder()
    ///     .endpoints(["http://127.0.0.1:2379"])
    ///     .deadlock_detection("accounts/")
    ///     .connect()?;
    /// let session = client.session()?;
    /// let _a = session.mutex("accounts/a")?.lock()?;
    /// match session.mutex("accounts/b")?.lock() {
    ///     Ok(_b) => { /* transfer */ }
    ///     Err(e) if e.is_deadlock() => eprintln!("{e}: let go of accounts/a and retry"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn deadlock_detection(mut self, prefix: impl AsRef<[u8]>) -> ClientBuilder {
        self.deadlock_prefix = Some(prefix.as_ref().to_vec());
        self
    }

    /// Test tuning of how this client's waiters wait (`line/behind/`): the crate's own
    /// tests narrow the front of a line with it, so that short lines also wait at the back.
    /// Not part of the API.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn line_tuning(mut self, tuning: LineTuning) -> ClientBuilder {
        self.line_tuning = tuning;
        self
    }

    /// Validates the settings, starts the private runtime and keep-alive thread, and
    /// connects. Fails within the connect timeout when no endpoint answers.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`] (nothing is sent): no endpoints; an endpoint that is not
    ///   a valid `http://` URL (`https://` with [`tls`](ClientBuilder::tls)), has no host,
    ///   an invalid port, or a comma; a connect or request timeout of zero or above
    ///   [`MAX_TIMEOUT`]; a keep-alive interval outside [`MIN_KEEP_ALIVE_INTERVAL`] ..=
    ///   [`MAX_KEEP_ALIVE_INTERVAL`]; an empty user name; TLS settings without a CA
    ///   certificate.
    /// * [`Error::Connect`]: no endpoint answered within the connect timeout; `reason`
    ///   says why the last one failed (connection refused, no answer, a server certificate
    ///   that was not trusted...).
    /// * [`Error::ClientCertificateRejected`]: etcd refused the TLS connection for want of
    ///   a trusted client certificate (`--client-cert-auth`).
    /// * [`Error::Authentication`]: etcd rejected the [`user`](ClientBuilder::user) and
    ///   password, or auth is not enabled on it.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: an endpoint answered the probe, but
    ///   the authentication request then failed; [`Error::Unavailable`] also if the
    ///   runtime or keep-alive thread cannot be started (the OS refused a thread).
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::builder().endpoints(["127.0.0.1:2379"]).connect()?;
    /// # let _ = client;
    /// # Ok(()) }
    /// ```
    pub fn connect(self) -> Result<Client> {
        crate::client::runtime::ensure_blocking_allowed()?;
        if self.endpoints.is_empty() {
            return Err(Error::InvalidArgument(
                "no endpoints given (expected e.g. http://127.0.0.1:2379)".into(),
            ));
        }
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| parse_endpoint(e, self.uses_tls()))
            .collect::<Result<Vec<_>>>()?;
        for (name, value) in [
            ("connect timeout", self.connect_timeout),
            ("request timeout", self.request_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::InvalidArgument(format!("{name} must be positive")));
            }
            if value > MAX_TIMEOUT {
                return Err(Error::InvalidArgument(format!(
                    "{name} {value:?} is above the maximum of {MAX_TIMEOUT:?}"
                )));
            }
        }
        if self.keep_alive_interval < MIN_KEEP_ALIVE_INTERVAL {
            return Err(Error::InvalidArgument(format!(
                "keep-alive interval {:?} is below {MIN_KEEP_ALIVE_INTERVAL:?}: etcd closes \
                 connections that ping that often",
                self.keep_alive_interval
            )));
        }
        if self.keep_alive_interval > MAX_KEEP_ALIVE_INTERVAL {
            return Err(Error::InvalidArgument(format!(
                "keep-alive interval {:?} is above the maximum of {MAX_KEEP_ALIVE_INTERVAL:?}",
                self.keep_alive_interval
            )));
        }
        if let Some((user, _)) = &self.credentials
            && user.is_empty()
        {
            return Err(Error::InvalidArgument("empty user name".into()));
        }
        let config = RpcConfig {
            endpoints,
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
            keep_alive_interval: self.keep_alive_interval,
            keep_alive_timeout: Duration::from_secs(5),
            credentials: self.credentials,
            #[cfg(feature = "tls")]
            tls: self.tls.clone(),
            line_tuning: self.line_tuning,
            deadlock_prefix: self.deadlock_prefix.map(Arc::from),
        };
        Client::start(&config, self.shared_runtime)
    }
}
