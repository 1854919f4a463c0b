//! Operator actions on a running cluster's membership and leadership, through the real
//! `etcdctl`: member ids (`member list`) and leader transfer (`move-leader`).

use std::io;

use super::cluster::EtcdCluster;
use super::etcdctl;

impl EtcdCluster {
    /// Member `i`'s etcd member id, in hex as etcdctl prints and takes it (`etcdctl member
    /// list`, asked of a running member; the member is found by its peer URL, so a learner
    /// that has not started yet is found too).
    ///
    /// # Errors
    ///
    /// If no running member answers `member list`, or the list does not include member `i`
    /// (it was removed).
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// println!("member 0 is {}", cluster.member_id(0)?);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_id(&self, i: usize) -> io::Result<String> {
        let peer = self.member(i).peer_url.clone();
        let mut last = None;
        for other in (0..self.len()).filter(|&o| self.member(o).is_answering()) {
            match etcdctl::run(
                &self.member(other).client_url,
                self.tls.as_ref(),
                &["member", "list"],
            ) {
                Ok(list) => {
                    return id_with_peer_url(&list, &peer).ok_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::NotFound,
                            format!("member {i} ({peer}) is not in the member list: {list}"),
                        )
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no member is running")))
    }

    /// Hands the raft leadership to member `to` (`etcdctl move-leader`, which finds the
    /// current leader among the members that run and are not paused, and asks it to
    /// transfer). Returns once etcd reports the transfer done; a no-op if `to` leads.
    ///
    /// # Errors
    ///
    /// etcdctl's error: for example, `to` is a learner or is not running, or the transfer
    /// did not finish in time.
    ///
    /// # Panics
    ///
    /// If `to >= self.len()`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// let cluster = etcd_sync::testing::EtcdCluster::start(3)?;
    /// let next = (cluster.leader()? + 1) % 3;
    /// cluster.move_leader(next)?;
    /// assert_eq!(cluster.leader()?, next);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn move_leader(&self, to: usize) -> io::Result<()> {
        if self.leader().ok() == Some(to) {
            return Ok(());
        }
        let id = self.member_id(to)?;
        let endpoints = (0..self.len())
            .filter(|&m| self.member(m).is_answering())
            .map(|m| self.member(m).client_url.clone())
            .collect::<Vec<_>>()
            .join(",");
        etcdctl::run(&endpoints, self.tls.as_ref(), &["move-leader", &id]).map(drop)
    }
}

/// The id in `etcdctl member list`'s simple output ("8e9e05c52164694d, started, m0,
/// http://127.0.0.1:2380, http://127.0.0.1:2379, false") of the member with `peer` among
/// its peer URLs.
fn id_with_peer_url(list: &str, peer: &str) -> Option<String> {
    list.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(", ").collect();
        let peers = fields.get(3)?;
        peers
            .split(',')
            .any(|url| url.trim() == peer)
            .then(|| fields[0].trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::id_with_peer_url;

    #[test]
    fn ids_are_found_by_peer_url() {
        let list = "8e9e05c52164694d, started, m0, http://127.0.0.1:2380, http://127.0.0.1:2379, false\n\
                    91bc3c398fb3c146, unstarted, , http://127.0.0.1:2480, , true\n";
        assert_eq!(
            id_with_peer_url(list, "http://127.0.0.1:2380").as_deref(),
            Some("8e9e05c52164694d")
        );
        assert_eq!(
            id_with_peer_url(list, "http://127.0.0.1:2480").as_deref(),
            Some("91bc3c398fb3c146")
        );
        assert_eq!(id_with_peer_url(list, "http://127.0.0.1:9"), None);
    }
}
