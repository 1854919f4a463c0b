//! Configuring and starting a cluster: fresh ports and directories, retried when etcd does
//! not come up.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use super::binary::etcd_binary;
use super::certs::TlsCerts;
use super::cluster::EtcdCluster;
use super::error::context;
use super::health::START_TIMEOUT;
use super::member::JoinSettings;
use super::member::{Member, MemberConfig, MemberPorts, member_name, peer_url};
use super::scratch::{TempDir, free_ports, unique_suffix};
use super::version::{EtcdVersion, version_of};

/// Attempts (with fresh ports each time) to start a server or cluster: another process may
/// grab a port between the moment it is picked and the moment etcd binds it.
const START_ATTEMPTS: usize = 3;

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
            learners: 0,
            progress_notify: None,
            snapshot_count: None,
            auto_compaction: None,
            addresses: None,
            uids: None,
        }
    }
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
    learners: usize,
    progress_notify: Option<Duration>,
    snapshot_count: Option<u64>,
    /// `--auto-compaction-mode` and `--auto-compaction-retention`.
    auto_compaction: Option<(&'static str, String)>,
    /// Each member's own loopback address, if not all on 127.0.0.1.
    addresses: Option<Vec<Ipv4Addr>>,
    /// Each member's user id, if not ours.
    uids: Option<Vec<u32>>,
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

    /// Serves clients over TLS with certificates generated for this cluster (see
    /// [`TlsCerts`]): `https://` endpoints, and client certificates required
    /// (`--client-cert-auth`). Health and metrics stay on a plain-HTTP metrics port.
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

    /// Adds `learners` non-voting members after the voting ones, each with `etcdctl member
    /// add --learner` and started to join the running cluster: they take the indices after
    /// the voters (`EtcdCluster::builder(3).learners(1)` has voters 0, 1, 2 and learner 3).
    ///
    /// A learner replicates the log but votes for nothing and serves only `Status` and
    /// serializable reads; clients must not depend on it. etcd allows one learner per
    /// cluster unless started with a larger `--max-learners` (3.6+), so
    /// [`start`](EtcdClusterBuilder::start) refuses more than one with `InvalidInput` before
    /// starting anything.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3).learners(1).start()?;
    /// assert_eq!(cluster.len(), 4);
    /// assert!(cluster.is_learner(3));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn learners(mut self, learners: usize) -> Self {
        self.learners = learners;
        self
    }

    /// Makes every member send watch progress notifications (a response with a header
    /// and no events) this often on idle watchers, with the flag the running etcd version
    /// spells (`--experimental-watch-progress-notify-interval` up to 3.5,
    /// `--watch-progress-notify-interval` from 3.6). Rounded to whole milliseconds, at
    /// least 1.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3)
    ///     .watch_progress_notify_interval(Duration::from_millis(100))
    ///     .start()?;
    /// # let _ = cluster;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn watch_progress_notify_interval(mut self, interval: Duration) -> Self {
        self.progress_notify = Some(interval);
        self
    }

    /// Makes every member snapshot its state every `count` applied entries
    /// (`--snapshot-count`, etcd's default 100,000). With a small count, a member that was
    /// down while more than etcd's catch-up window of entries (5,000 in 3.4 and 3.5)
    /// were applied is sent a snapshot when it comes back, instead of the entries it missed.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3)
    ///     .snapshot_count(50)
    ///     .start()?;
    /// # let _ = cluster;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn snapshot_count(mut self, count: u64) -> Self {
        self.snapshot_count = Some(count);
        self
    }

    /// Makes the cluster compact its history by itself every `period`, keeping about
    /// `period` of history (`--auto-compaction-mode=periodic
    /// --auto-compaction-retention=<period>`, in whole seconds, at least 1): revisions older
    /// than that are gone, and a watch asking for them is cancelled as compacted.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3)
    ///     .auto_compaction_period(Duration::from_secs(2))
    ///     .start()?;
    /// # let _ = cluster;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn auto_compaction_period(mut self, period: Duration) -> Self {
        let secs = period.as_secs().max(1);
        self.auto_compaction = Some(("periodic", format!("{secs}s")));
        self
    }

    /// Makes the cluster keep only the last `revisions` revisions of history
    /// (`--auto-compaction-mode=revision --auto-compaction-retention=<revisions>`). etcd
    /// 3.4 and 3.5 check this every 5 minutes only: for compactions within a short test,
    /// use [`auto_compaction_period`](Self::auto_compaction_period).
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3)
    ///     .auto_compaction_revisions(100)
    ///     .start()?;
    /// # let _ = cluster;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn auto_compaction_revisions(mut self, revisions: u64) -> Self {
        self.auto_compaction = Some(("revision", revisions.to_string()));
        self
    }

    /// Makes member `i` listen (client, peer and metrics ports) on the `i`-th of
    /// `addresses` instead of `127.0.0.1`: one loopback address per member (127.0.0.0/8
    /// is all local on Linux), so that firewall rules can tell the members apart by address
    /// (see [`NetFaults`](super::NetFaults)). The test process's own connections still
    /// come from `127.0.0.1`.
    ///
    /// [`start`](Self::start) refuses (`InvalidInput`) a number of addresses other than
    /// the number of members, an address outside 127.0.0.0/8, or learners.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::net::Ipv4Addr;
    ///
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3)
    ///     .member_addresses((2..5).map(|i| Ipv4Addr::new(127, 0, 0, i)))
    ///     .start()?;
    /// assert_eq!(cluster.member_address(1), Ipv4Addr::new(127, 0, 0, 3));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_addresses(mut self, addresses: impl IntoIterator<Item = Ipv4Addr>) -> Self {
        self.addresses = Some(addresses.into_iter().collect());
        self
    }

    /// Runs member `i`'s etcd as the `i`-th of `uids` (its directory is given to that user,
    /// the cluster's directory made traversable, and etcd copied into it so that any user
    /// can run it; the system's temporary directory must be reachable), so that firewall rules can match
    /// each member's packets by their socket's owner (`meta skuid`). Needs root; the user
    /// ids need no account.
    ///
    /// [`start`](Self::start) refuses (`InvalidInput`) a number of user ids other than the
    /// number of members, TLS (the keys are the test's), or learners.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3)
    ///     .member_uids([61_000, 61_001, 61_002])
    ///     .start()?;
    /// assert_eq!(cluster.member_uid(2), Some(61_002));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_uids(mut self, uids: impl IntoIterator<Item = u32>) -> Self {
        self.uids = Some(uids.into_iter().collect());
        self
    }

    /// `InvalidInput` if the per-member addresses or user ids do not fit this cluster.
    fn check_placement(&self) -> io::Result<()> {
        let invalid = |message: String| Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        if let Some(addresses) = &self.addresses {
            if addresses.len() != self.members {
                return invalid(format!(
                    "member_addresses: {} address(es) for {} member(s)",
                    addresses.len(),
                    self.members
                ));
            }
            if let Some(outside) = addresses.iter().find(|ip| !ip.is_loopback()) {
                return invalid(format!(
                    "member_addresses: {outside} is not a loopback address (127.0.0.0/8)"
                ));
            }
        }
        if let Some(uids) = &self.uids {
            if uids.len() != self.members {
                return invalid(format!(
                    "member_uids: {} user id(s) for {} member(s)",
                    uids.len(),
                    self.members
                ));
            }
            if self.tls {
                return invalid("member_uids: not with tls(): the keys belong to the test".into());
            }
        }
        if (self.addresses.is_some() || self.uids.is_some()) && self.learners > 0 {
            return invalid("member_addresses and member_uids: not with learners".into());
        }
        Ok(())
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
        let size = self.members;
        if size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an etcd cluster needs at least one member",
            ));
        }
        if self.learners > 1 {
            // etcd refuses a second `member add --learner` itself, but only after the
            // voters are up and three start attempts: say so at once instead.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "learners({}): etcd allows one learner per cluster by default",
                    self.learners
                ),
            ));
        }
        self.check_placement()?;
        let binary = etcd_binary()?;
        let version = version_of(&binary)?;
        tracing::info!(target: "etcd_sync::testing", binary = %binary.display(), %version, "starting etcd");
        let mut args = self.args.clone();
        if let Some(interval) = self.progress_notify {
            let flag = version.flag("--experimental-watch-progress-notify-interval");
            let millis = interval.as_millis().max(1);
            args.push(format!("{flag}={millis}ms").into());
        }
        if let Some(count) = self.snapshot_count {
            args.push(format!("--snapshot-count={count}").into());
        }
        if let Some((mode, retention)) = &self.auto_compaction {
            args.push(format!("--auto-compaction-mode={mode}").into());
            args.push(format!("--auto-compaction-retention={retention}").into());
        }
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            // An error from `try_start` itself (no directory, cannot spawn) is final; a
            // cluster that does not come up is retried with fresh ports.
            match self.try_start(&binary, version, &args)? {
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
        &self,
        binary: &Path,
        version: EtcdVersion,
        args: &[OsString],
    ) -> io::Result<Result<EtcdCluster, io::Error>> {
        let size = self.members;
        let suffix = unique_suffix();
        let dir = TempDir::create(&format!("etcd-sync-{suffix}"))?;
        let own_copy;
        let binary = if self.uids.is_some() {
            // The members' own users must reach their directories inside, and run etcd,
            // which may sit under a directory only we can enter (such as ~/.cargo).
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
            own_copy = dir.path().join("etcd");
            std::fs::copy(binary, &own_copy).map_err(|e| {
                context(
                    e,
                    format_args!("cannot copy {} for the members' users", binary.display()),
                )
            })?;
            std::fs::set_permissions(&own_copy, std::fs::Permissions::from_mode(0o755))?;
            own_copy.as_path()
        } else {
            binary
        };
        let tls = if self.tls {
            Some(TlsCerts::generate(&dir.path().join("tls"))?)
        } else {
            None
        };
        let all = size + self.learners;
        let ports = free_ports(3 * all)?;
        let ports: Vec<MemberPorts> = (0..all)
            .map(|i| MemberPorts {
                ip: self
                    .addresses
                    .as_ref()
                    .and_then(|addresses| addresses.get(i).copied())
                    .unwrap_or(Ipv4Addr::LOCALHOST),
                client: ports[i],
                peer: ports[all + i],
                metrics: ports[2 * all + i],
                uid: self.uids.as_ref().and_then(|uids| uids.get(i).copied()),
            })
            .collect();
        let initial_cluster = ports[..size]
            .iter()
            .enumerate()
            .map(|(i, ports)| format!("{}={}", member_name(i), peer_url(ports.ip, ports.peer)))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("etcd-sync-{suffix}");
        let config = MemberConfig {
            binary,
            dir: dir.path(),
            initial_cluster: &initial_cluster,
            token: &token,
            extra_args: args,
            tls: tls.as_ref(),
            joining: false,
            version,
        };
        let members = ports[..size]
            .iter()
            .enumerate()
            .map(|(i, ports)| Member::new(&config, i, ports))
            .collect::<io::Result<Vec<_>>>()?;
        let mut cluster = EtcdCluster {
            members,
            tls,
            version,
            learners: std::sync::Mutex::new(Vec::new()),
            join: JoinSettings {
                binary: binary.to_path_buf(),
                token: token.clone(),
                extra_args: args.to_vec(),
            },
            _dir: dir,
        };
        // Spawn everyone first: a member of a new cluster only becomes healthy once a
        // quorum of its peers is up.
        for member in &cluster.members {
            member.spawn()?;
        }
        if let Err(failure) = cluster.wait_all_healthy(START_TIMEOUT) {
            return Ok(Err(failure));
        }
        let mut joined = initial_cluster;
        for (index, ports) in ports.iter().enumerate().skip(size) {
            if let Err(failure) = cluster.join_learner(&mut joined, index, ports) {
                return Ok(Err(failure));
            }
        }
        Ok(Ok(cluster))
    }
}
