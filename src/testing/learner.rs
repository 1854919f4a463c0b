//! Learners: non-voting members added to a running cluster, as an operator adds them
//! (`etcdctl member add --learner`, then the new member started with
//! `--initial-cluster-state existing`), and promoted to voters.

use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use super::cluster::EtcdCluster;
use super::etcdctl;
use super::health::{START_TIMEOUT, wait_healthy};
use super::member::{Member, MemberConfig, MemberPorts, member_name, peer_url};
use super::version::EtcdVersion;

/// How long a new cluster may refuse `member add` as unhealthy: etcd wants every peer
/// connected for 5 s first.
const RECONFIG_WAIT: Duration = Duration::from_secs(15);
const RECONFIG_POLL: Duration = Duration::from_millis(250);

/// The voters' settings a learner starts with too.
pub(super) struct LearnerBase<'a> {
    pub(super) binary: &'a Path,
    pub(super) token: &'a str,
    pub(super) extra_args: &'a [OsString],
    pub(super) version: EtcdVersion,
}

impl EtcdCluster {
    /// Adds member `index` as a learner and starts it, with the flags of `base` (the
    /// voters' shared settings). `joined` is the `--initial-cluster` of the members so far;
    /// the new member is appended to it.
    pub(super) fn add_learner(
        &mut self,
        base: &LearnerBase<'_>,
        joined: &mut String,
        index: usize,
        ports: &MemberPorts,
    ) -> io::Result<()> {
        let name = member_name(index);
        let peer = peer_url(ports.peer);
        let voter = self.member(0).client_url.clone();
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
        joined.push_str(&format!(",{name}={peer}"));
        let config = MemberConfig {
            binary: base.binary,
            dir: self._dir.path(),
            initial_cluster: joined,
            token: base.token,
            extra_args: base.extra_args,
            tls: self.tls.as_ref(),
            joining: true,
            version: base.version,
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
    use super::member_id;

    #[test]
    fn member_id_is_read_from_etcdctl_output() {
        let output = "Member 8e9e05c52164694d added to cluster cdf818194e3a8c32\n\n\
                      ETCD_NAME=\"m3\"\n";
        assert_eq!(member_id(output).as_deref(), Some("8e9e05c52164694d"));
        assert_eq!(member_id("nothing here"), None);
        assert_eq!(member_id("Member xyz added"), None);
    }
}
