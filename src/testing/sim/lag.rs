//! Members that are behind: a follower applies what the cluster commits some time after
//! the leader, so its answers come that much late, its watchers' events too, and a
//! serializable read it serves sees the store as it was (etcd answers those from the
//! member's own store, without asking the leader). A member's linearizable reads may
//! also wait for their read index while everything else flows: the leader's confirmation
//! is slow, or its ReadIndex message was dropped in an election and the read waits out
//! etcd's timeout.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::time::Instant;

use super::SimCluster;
use crate::transport::generated::etcdserverpb as pb;

/// How far back [`Applied`] remembers (longer than any lag the nemesis sets).
const MEMORY: Duration = Duration::from_secs(10);

impl SimCluster {
    /// Makes member `i`'s linearizable reads wait `wait` before they are served (`None`:
    /// at once again); its writes, watchers and serializable reads are not held up.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// cluster.set_read_wait(0, Some(std::time::Duration::from_secs(3)));
    /// cluster.set_read_wait(0, None);
    /// # Ok(()) }
    /// ```
    pub fn set_read_wait(&self, i: usize, wait: Option<Duration>) {
        if let Some(member) = self.shared.lock().members.get_mut(i) {
            member.read_wait = wait;
        }
    }
}

/// When each recent revision was applied, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    at: VecDeque<(Instant, i64)>,
}

impl Applied {
    /// Revision `rev` was applied just now.
    pub(crate) fn record(&mut self, rev: i64) {
        let now = Instant::now();
        if self.at.back().is_some_and(|(_, last)| *last == rev) {
            return;
        }
        self.at.push_back((now, rev));
        while self.at.len() > 1 && self.at.front().is_some_and(|(t, _)| now - *t > MEMORY) {
            self.at.pop_front();
        }
    }

    /// The store's revision at `when`: the last one applied by then (`current` if none
    /// is remembered from before).
    pub(crate) fn revision_at(&self, when: Instant, current: i64) -> i64 {
        match self.at.iter().rev().find(|(t, _)| *t <= when) {
            Some((_, rev)) => *rev,
            None => self.at.front().map_or(current, |(_, rev)| (rev - 1).max(1)),
        }
    }
}

/// The answers of a member's watch stream, each held back by the member's lag
/// (`lag_of`) when it was made (in order: a later answer never overtakes an earlier one).
pub(crate) fn delayed(
    lag_of: impl Fn() -> Duration + Send + 'static,
    mut answers: UnboundedReceiver<pb::WatchResponse>,
) -> UnboundedReceiver<pb::WatchResponse> {
    let (stamped_tx, mut stamped) = unbounded_channel();
    let (out, delayed) = unbounded_channel();
    tokio::spawn(async move {
        while let Some(answer) = answers.recv().await {
            if stamped_tx
                .send((Instant::now() + lag_of(), answer))
                .is_err()
            {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some((due, answer)) = stamped.recv().await {
            tokio::time::sleep_until(due).await;
            if out.send(answer).is_err() {
                break;
            }
        }
    });
    delayed
}
