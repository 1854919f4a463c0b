//! A multi-member etcd cluster: members addressed by index, their faults and their state.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use super::certs::TlsCerts;
use super::health::{self, START_TIMEOUT};
use super::member::Member;
use super::scratch::TempDir;
use super::version::EtcdVersion;

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
    // Field order matters: the members (whose drop kills their process) are dropped before
    // the directory holding their data is removed.
    pub(super) members: Vec<Member>,
    pub(super) tls: Option<TlsCerts>,
    /// The version of the etcd binary every member runs.
    pub(super) version: EtcdVersion,
    /// The members that are learners now, with their etcd member ids (hex), for
    /// [`EtcdCluster::promote`].
    pub(super) learners: std::sync::Mutex<Vec<(usize, String)>>,
    /// What a member added later starts with ([`EtcdCluster::add_learner`]).
    pub(super) join: super::member::JoinSettings,
    pub(super) _dir: TempDir,
}

impl EtcdCluster {
    /// The version of etcd the members run, as `etcd --version` printed it.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// if cluster.version().at_least(3, 5) {
    ///     println!("MemberList is linearizable on {}", cluster.version());
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn version(&self) -> EtcdVersion {
        self.version
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
        self.members.len()
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
        self.members.is_empty()
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
        self.members
            .iter()
            .map(|member| member.client_url.clone())
            .collect()
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
        self.member(i).client_url.clone()
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
        self.member(i).pause()
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
        self.member(i).resume()
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
        self.member(i).kill()
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
        self.member(i).restart()
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
        for member in &self.members {
            member.kill()?;
        }
        for member in &self.members {
            member.spawn()?;
        }
        self.wait_all_healthy(START_TIMEOUT)
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
        self.member(i).pid()
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
        self.member(i).is_running()
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
        health::leader(&self.members)
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
        self.member(i).metrics()
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
        &self.member(i).data_dir
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
        &self.member(i).log_path
    }

    /// The loopback address member `i` listens on: `127.0.0.1` unless the builder gave
    /// each member its own ([`EtcdClusterBuilder::member_addresses`]).
    ///
    /// [`EtcdClusterBuilder::member_addresses`]: super::EtcdClusterBuilder::member_addresses
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// assert!(cluster.member_address(0).is_loopback());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_address(&self, i: usize) -> Ipv4Addr {
        match self.member(i).client_addr.ip() {
            IpAddr::V4(ip) => ip,
            IpAddr::V6(_) => Ipv4Addr::LOCALHOST,
        }
    }

    /// The port member `i` serves clients on (the port of its
    /// [`member_endpoint`](Self::member_endpoint)).
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// let port = cluster.client_port(1);
    /// assert!(cluster.member_endpoint(1).ends_with(&format!(":{port}")));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn client_port(&self, i: usize) -> u16 {
        self.member(i).client_addr.port()
    }

    /// The port member `i`'s peers reach it on (raft traffic), on
    /// [`member_address`](Self::member_address).
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// assert_ne!(cluster.peer_port(0), cluster.client_port(0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn peer_port(&self, i: usize) -> u16 {
        self.member(i).peer_port
    }

    /// The user id member `i`'s etcd runs as, if the builder set one
    /// ([`EtcdClusterBuilder::member_uids`]); `None` when it runs as the test's user.
    ///
    /// [`EtcdClusterBuilder::member_uids`]: super::EtcdClusterBuilder::member_uids
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// assert_eq!(cluster.member_uid(0), None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_uid(&self, i: usize) -> Option<u32> {
        self.member(i).uid
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
            .members
            .iter()
            .filter(|member| !member.was_killed())
            .collect();
        health::wait_healthy(&members, timeout)
    }

    /// Turns on etcd's authentication for the whole cluster, as
    /// [`EtcdServer::enable_auth`](super::EtcdServer::enable_auth) does for one server:
    /// the users [`AUTH_ROOT`](super::AUTH_ROOT) and [`AUTH_USER`](super::AUTH_USER), the
    /// latter limited to [`AUTH_PREFIX`](super::AUTH_PREFIX).
    ///
    /// # Errors
    ///
    /// If `etcdctl` is missing or one of its commands fails.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use etcd_sync::testing::{AUTH_USER, EtcdCluster};
    /// let cluster = EtcdCluster::start(3)?;
    /// cluster.enable_auth()?;
    /// let client = etcd_sync::Client::builder()
    ///     .endpoints(cluster.endpoints())
    ///     .user(AUTH_USER.0, AUTH_USER.1)
    ///     .connect()?;
    /// # let _ = client;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn enable_auth(&self) -> io::Result<()> {
        super::auth::enable_auth(&self.endpoints().join(","), self.tls())
    }

    /// Like [`wait_healthy`](Self::wait_healthy), but a killed member is an error instead
    /// of being skipped: for a start, and for a server, which has no other member.
    pub(super) fn wait_all_healthy(&self, timeout: Duration) -> io::Result<()> {
        let members: Vec<&Member> = self.members.iter().collect();
        health::wait_healthy(&members, timeout)
    }

    pub(super) fn tls(&self) -> Option<&TlsCerts> {
        self.tls.as_ref()
    }

    pub(super) fn member(&self, i: usize) -> &Member {
        self.members.get(i).unwrap_or_else(|| {
            panic!(
                "etcd member index {i} out of range: the cluster has {} member(s)",
                self.members.len()
            )
        })
    }
}
