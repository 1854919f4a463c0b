//! Learners: non-voting members added to a running cluster, as an operator adds them
//! (`etcdctl member add --learner`, then the new member started with
//! `--initial-cluster-state existing`), promoted to voters, and members removed.

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use super::cluster::EtcdCluster;
use super::etcdctl;
use super::health::{START_TIMEOUT, wait_healthy};
use super::member::{Member, MemberConfig, MemberPorts, member_name, peer_url};
use super::scratch::free_ports;

/// How long a new cluster may refuse `member add` as unhealthy: etcd wants every peer
/// connected for 5 s first.
const RECONFIG_WAIT: Duration = Duration::from_secs(15);
const RECONFIG_POLL: Duration = Duration::from_millis(250);

impl EtcdCluster {
    /// Adds member `index` as a learner and starts it, with the voters' flags. `joined` is
    /// the `--initial-cluster` of the members so far; the new member is appended to it
    /// (etcdctl's own `ETCD_INITIAL_CLUSTER` is used instead when it prints one: it leaves
    /// out removed members).
    pub(super) fn join_learner(
        &mut self,
        joined: &mut String,
        index: usize,
        ports: &MemberPorts,
    ) -> io::Result<()> {
        let name = member_name(index);
        let peer = peer_url(ports.ip, ports.peer);
        let voter = (0..self.len())
            .find(|&v| !self.is_learner(v) && self.member(v).is_answering())
            .map_or_else(
                || self.member(0).client_url.clone(),
                |v| self.member(v).client_url.clone(),
            );
        let add = ["member", "add", &name, "--peer-urls", &peer, "--learner"];
        // etcd's --strict-reconfig-check (on by default) refuses to add a member until
        // every peer has been connected for 5 s ("unhealthy cluster"): a new cluster is
        // refused at first.
        let deadline = Instant::now() + RECONFIG_WAIT;
        let added = loop {
            match etcdctl::run(&voter, self.tls.as_ref(), &add) {
                Err(e)
                    if e.to_string().contains("unhealthy cluster") && Instant::now() < deadline =>
                {
                    thread::sleep(RECONFIG_POLL);
                }
                other => break other?,
            }
        };
        let id = member_id(&added).ok_or_else(|| {
            io::Error::other(format!(
                "etcdctl member add printed no member id: {added:?}"
            ))
        })?;
        match initial_cluster(&added) {
            Some(printed) => *joined = printed,
            None => joined.push_str(&format!(",{name}={peer}")),
        }
        let config = MemberConfig {
            binary: &self.join.binary,
            dir: self._dir.path(),
            initial_cluster: joined,
            token: &self.join.token,
            extra_args: &self.join.extra_args,
            tls: self.tls.as_ref(),
            joining: true,
            version: self.version,
        };
        let member = Member::new(&config, index, ports)?;
        member.spawn()?;
        let healthy = wait_healthy(&[&member], START_TIMEOUT);
        self.members.push(member);
        healthy?;
        self.lock_learners().push((index, id));
        Ok(())
    }

    fn lock_learners(&self) -> std::sync::MutexGuard<'_, Vec<(usize, String)>> {
        // Each entry is complete on its own: a panic elsewhere leaves nothing half-written.
        self.learners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a learner to the running cluster, as an operator does (`etcdctl member add
    /// --learner`, then a new etcd started with `--initial-cluster-state existing` and the
    /// voters' flags), and waits until it is healthy. It takes the next index
    /// ([`len`](Self::len) before the call); indices of removed members are not reused.
    /// etcd allows one learner at a time (by default).
    ///
    /// # Errors
    ///
    /// etcdctl's error (for example, a second learner), or the new member not becoming
    /// healthy within 30 seconds (it is killed, and keeps its index).
    ///
    /// # Example
    ///
    /// ```no_run
    /// let mut cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// let learner = cluster.add_learner()?;
    /// cluster.promote(learner)?;
    /// cluster.remove_member(learner)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn add_learner(&mut self) -> io::Result<usize> {
        let index = self.len();
        let ports = free_ports(3)?;
        let ports = MemberPorts::localhost(ports[0], ports[1], ports[2]);
        // The fallback when etcdctl prints no ETCD_INITIAL_CLUSTER: the running members.
        let mut joined = (0..self.len())
            .filter(|&i| self.member(i).is_running())
            .map(|i| format!("{}={}", member_name(i), self.member(i).peer_url))
            .collect::<Vec<_>>()
            .join(",");
        match self.join_learner(&mut joined, index, &ports) {
            Ok(()) => Ok(index),
            Err(e) => {
                if let Some(member) = self.members.get(index) {
                    let _ = member.retire();
                }
                Err(e)
            }
        }
    }

    /// Removes member `i` from the cluster (`etcdctl member remove`, asked of another
    /// running member): a learner or a voter. etcd stops the removed member itself; its
    /// process is then reaped and counted as killed, so [`wait_healthy`](Self::wait_healthy)
    /// skips it. Its index is not reused.
    ///
    /// # Errors
    ///
    /// If its member id cannot be found, or etcdctl fails (for example, when removing it
    /// would leave the cluster without a quorum of started members).
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let mut cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// let learner = cluster.add_learner()?;
    /// cluster.remove_member(learner)?;
    /// assert!(!cluster.is_running(learner));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn remove_member(&self, i: usize) -> io::Result<()> {
        let id = self.member_id(i)?;
        let mut last = None;
        for other in (0..self.len()).filter(|&o| o != i && self.member(o).is_answering()) {
            match etcdctl::run(
                &self.member(other).client_url,
                self.tls.as_ref(),
                &["member", "remove", &id],
            ) {
                Ok(_) => {
                    self.lock_learners().retain(|(index, _)| *index != i);
                    return self.member(i).retire();
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no other member is running")))
    }

    /// Whether member `i` is a learner (added with
    /// [`EtcdClusterBuilder::learners`](super::EtcdClusterBuilder::learners) and not
    /// promoted since).
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3).learners(1).start()?;
    /// assert!(!cluster.is_learner(0));
    /// assert!(cluster.is_learner(3));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_learner(&self, i: usize) -> bool {
        self.lock_learners().iter().any(|(index, _)| *index == i)
    }

    /// Promotes learner `i` to a voting member (`etcdctl member promote`), asking the
    /// voting members in turn. etcd refuses while the learner's log is behind the
    /// leader's; that refusal is returned as is.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidInput`] if member `i` is not a learner; etcdctl's error if
    /// no voting member promoted it.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::builder(3).learners(1).start()?;
    /// cluster.promote(3)?;
    /// assert!(!cluster.is_learner(3));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn promote(&self, i: usize) -> io::Result<()> {
        let id = self
            .lock_learners()
            .iter()
            .find(|(index, _)| *index == i)
            .map(|(_, id)| id.clone())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("member {i} is not a learner"),
                )
            })?;
        let mut last = None;
        for voter in (0..self.len()).filter(|&v| !self.is_learner(v) && self.is_running(v)) {
            match etcdctl::run(
                &self.member(voter).client_url,
                self.tls.as_ref(),
                &["member", "promote", &id],
            ) {
                Ok(_) => {
                    self.lock_learners().retain(|(index, _)| *index != i);
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no voting member is running")))
    }
}

/// The `ETCD_INITIAL_CLUSTER` that `etcdctl member add` prints for the new member.
fn initial_cluster(output: &str) -> Option<String> {
    output.lines().find_map(|line| {
        let value = line.strip_prefix("ETCD_INITIAL_CLUSTER=")?;
        let value = value.trim().trim_matches('"');
        (!value.is_empty()).then(|| value.to_string())
    })
}

/// The member id in `etcdctl member add`'s output: "Member 8e9e05c52164694d added to
/// cluster cdf818194e3a8c32".
fn member_id(output: &str) -> Option<String> {
    let mut words = output.split_whitespace();
    words.find(|word| *word == "Member")?;
    let id = words.next()?;
    id.chars()
        .all(|c| c.is_ascii_hexdigit())
        .then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::{initial_cluster, member_id};

    #[test]
    fn member_id_is_read_from_etcdctl_output() {
        let output = "Member 8e9e05c52164694d added to cluster cdf818194e3a8c32\n\n\
                      ETCD_NAME=\"m3\"\n";
        assert_eq!(member_id(output).as_deref(), Some("8e9e05c52164694d"));
        assert_eq!(member_id("nothing here"), None);
        assert_eq!(member_id("Member xyz added"), None);
    }

    #[test]
    fn initial_cluster_is_read_from_etcdctl_output() {
        let output = "Member 8e9e05c52164694d added to cluster cdf818194e3a8c32\n\n\
                      ETCD_NAME=\"m3\"\n\
                      ETCD_INITIAL_CLUSTER=\"m0=http://127.0.0.1:1,m3=http://127.0.0.1:4\"\n\
                      ETCD_INITIAL_CLUSTER_STATE=\"existing\"\n";
        assert_eq!(
            initial_cluster(output).as_deref(),
            Some("m0=http://127.0.0.1:1,m3=http://127.0.0.1:4")
        );
        assert_eq!(initial_cluster("nothing"), None);
    }
}
