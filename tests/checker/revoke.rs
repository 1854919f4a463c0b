//! Release requests in the randomized checker (issue 30): one thread per child asks the
//! holders of the workers' names to let go, now and then; half the workers' holds listen
//! and let go when asked. Log lines:
//!
//! * `RQA <name> <key> <token>`: a holder asked (the key and create revision read);
//! * `RQH <name> <key> <token> <request key> <request revision>`: a holder heard a request.
//!
//! The parent checks that every request heard was for the hearer's own key and written
//! after that key was created (a request for an earlier hold of the key, or another key,
//! is a violation), and that requests were both asked and heard (the check cannot pass
//! with nothing to judge).

use std::time::Duration;

use etcd_sync::{Client, ReleaseRequest};

use super::common::monotonic_ns;
use super::{Log, NAMES, Rng, log};

/// A child's asking thread: asks a random name's holders every 50 to 500 ms.
pub(crate) fn asker(client: &Client, log_file: &Log, _who: &str, deadline_ns: u64, seed: u64) {
    let mut rng = Rng::new(seed);
    while monotonic_ns() < deadline_ns {
        std::thread::sleep(rng.millis(50, 500));
        let name = NAMES[rng.below(NAMES.len() as u64) as usize];
        match client.request_release(name) {
            Ok(holders) => {
                for h in holders {
                    log(
                        log_file,
                        format!("RQA {name} {} {}", h.key_str(), h.create_revision),
                    );
                }
            }
            Err(e) => log(log_file, format!("NOTE ask {name}: {e}")),
        }
    }
}

/// What a listening hold heard: logs it, and says whether to let go (any request).
pub(crate) fn heard(
    log_file: &Log,
    name: &str,
    (key, token): (&str, i64),
    requests: &crossbeam_channel::Receiver<ReleaseRequest>,
    wait: Duration,
) -> bool {
    let Ok(request) = requests.recv_timeout(wait) else {
        return false;
    };
    log(
        log_file,
        format!(
            "RQH {name} {key} {token} {} {}",
            String::from_utf8_lossy(&request.key),
            request.revision
        ),
    );
    true
}

/// The requests asked and heard, and what was wrong with them.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    pub(crate) asked: u64,
    pub(crate) heard: u64,
    pub(crate) bad: Vec<String>,
}

/// Reads every child's `RQA`/`RQH` lines.
pub(crate) fn parse(dir: &std::path::Path, files: usize) -> Totals {
    let mut totals = Totals::default();
    super::processes::each_log_line(dir, files, |n, line| {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields[..] {
            ["RQA", ..] => totals.asked += 1,
            ["RQH", _, key, token, request_key, revision] => {
                totals.heard += 1;
                let token: i64 = token.parse().unwrap_or(i64::MAX);
                let revision: i64 = revision.parse().unwrap_or(0);
                if request_key != key || revision <= token {
                    totals.bad.push(format!(
                        "release request: {key} token {token} heard one for \
                         {request_key} at revision {revision} (log-{n})"
                    ));
                }
            }
            _ => {}
        }
    });
    totals
}
