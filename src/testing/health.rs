//! What members say about themselves over HTTP: health, metrics, and who leads.

use std::fmt::Write as _;
use std::io;
use std::thread;
use std::time::{Duration, Instant};

use super::error::context;
use super::http;
use super::member::Member;
use super::metrics;

/// How long a start or restart waits for etcd to report itself healthy.
pub(super) const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`leader`] looks for a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two health polls.
const HEALTH_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Pause between two leader polls.
const LEADER_POLL_INTERVAL: Duration = Duration::from_millis(100);

impl Member {
    /// Kills the member and starts it again on its data, then waits until it is healthy.
    /// (Here rather than in `member.rs`, which knows nothing of health: no import circle.)
    pub(super) fn restart(&self) -> io::Result<()> {
        self.kill()?;
        self.spawn()?;
        wait_healthy(&[self], START_TIMEOUT)
    }

    /// One health poll: `Ok(true)` once `GET /health` says so, an error if the process is
    /// not running.
    fn poll_health(&self) -> io::Result<bool> {
        self.check_running()?;
        // Unhealthy etcd answers 503 with `"health":"false"`; the body alone decides.
        Ok(http::get(self.metrics_addr, "/health")
            .is_ok_and(|response| response.body.contains(r#""health":"true""#)))
    }

    /// `GET /metrics`, as text.
    pub(super) fn metrics(&self) -> io::Result<String> {
        let what = || {
            format!(
                "GET {}/metrics (etcd member {})",
                self.client_url, self.name
            )
        };
        let response = http::get(self.metrics_addr, "/metrics").map_err(|e| context(e, what()))?;
        if response.status != 200 {
            return Err(io::Error::other(format!(
                "{}: HTTP status {}",
                what(),
                response.status
            )));
        }
        Ok(response.body)
    }

    /// Whether this member is running, not paused, and says it is the raft leader.
    fn claims_leadership(&self) -> bool {
        self.is_answering()
            && self
                .metrics()
                .and_then(|text| metrics::parse(&text))
                .is_ok_and(|metrics| metrics.get("etcd_server_is_leader", &[]) == Some(1.0))
    }
}

/// Polls `GET /health` of `members` until all are healthy, one exits, or `timeout` passes.
pub(super) fn wait_healthy(members: &[&Member], timeout: Duration) -> io::Result<()> {
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

/// The index of the one member claiming the raft leadership, polled until exactly one
/// does: a member that was just resumed may briefly still believe it leads.
pub(super) fn leader(members: &[Member]) -> io::Result<usize> {
    let deadline = Instant::now() + LEADER_TIMEOUT;
    loop {
        let leaders: Vec<usize> = members
            .iter()
            .enumerate()
            .filter(|(_, member)| member.claims_leadership())
            .map(|(i, _)| i)
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
