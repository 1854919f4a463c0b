//! Release requests in the simulated workload (in the runs that ask, [`World::asking`]):
//! processes ask the holders of a random name to let go, half the holds listen and let go
//! when asked. Invariants: a holder hears only requests for its own key, written after its
//! key was created; a request written for a hold that listens is heard within
//! [`LOSS_BOUND`] of the cluster being calm (through compaction, restarts and failover);
//! and no request outlives a release.

use std::collections::BTreeMap;

use crossbeam_channel::Receiver;
use tokio::time::Instant;

use super::{LOSS_BOUND, World};
use crate::client::Client;
use crate::line::request::ReleaseRequest;
use crate::support::error::Result;

/// What the run's processes asked and heard, by the hold (key, create revision).
#[derive(Debug, Default)]
pub(super) struct Requests {
    /// When each hold was last asked (taken before the asking call).
    asked: BTreeMap<(String, i64), Instant>,
    /// When each hold last heard a request.
    heard: BTreeMap<(String, i64), Instant>,
}

/// Asks the holders of `name` to let go, and notes whom: their keys.
pub(super) fn ask(world: &World, client: &Client, name: &str) -> Result<Vec<String>> {
    let at = Instant::now();
    let holders = client.request_release(name)?;
    let mut log = world.log();
    log.outcome.requests_asked += holders.len() as u64;
    for holder in &holders {
        let hold = (holder.key_str().into_owned(), holder.create_revision);
        log.requests.asked.insert(hold, at);
    }
    Ok(holders.iter().map(|h| h.key_str().into_owned()).collect())
}

/// After a release etcd answered (our key deleted by us): no request for the hold is left
/// (the release deletes it with the key, and none can be written once the key is gone).
pub(super) fn released(world: &World, me: &str, request: Option<&[u8]>) {
    let Some(request) = request.map(String::from_utf8_lossy) else {
        return;
    };
    if world
        .cluster
        .keys(&request)
        .iter()
        .any(|(k, _)| *k == *request)
    {
        world.violation(me, format!("{request} outlived the hold it was for"));
    }
}

/// A hold that listens for requests.
pub(super) struct Listening {
    requests: Receiver<ReleaseRequest>,
    since: Instant,
}

impl Listening {
    pub(super) fn new(requests: Receiver<ReleaseRequest>) -> Listening {
        Listening {
            requests,
            since: Instant::now(),
        }
    }

    /// Takes the requests that arrived: whether any did. Each must be for this hold.
    pub(super) fn hear(&self, world: &World, me: &str, (key, token): (&str, i64)) -> bool {
        let mut heard = false;
        while let Ok(request) = self.requests.try_recv() {
            heard = true;
            let for_us = request.key == key.as_bytes() && request.revision > token;
            if !for_us {
                world.violation(
                    me,
                    format!("holding {key} token {token}, heard a request {request:?}"),
                );
            }
            let mut log = world.log();
            log.outcome.requests_heard += 1;
            log.requests
                .heard
                .insert((key.to_string(), token), Instant::now());
            drop(log);
            world.note(
                me,
                format!("asked to let go of {key} by {}", request.requester),
            );
        }
        heard
    }

    /// At the end of a hold that was not lost: a request written for it was heard within
    /// the bound of when it could be (asked, listening, and the cluster calm).
    pub(super) fn settle(&self, world: &World, me: &str, (key, token): (&str, i64)) {
        let hold = (key.to_string(), token);
        let calm = world.calm_since();
        let mut log = world.log();
        let asked = log.requests.asked.remove(&hold);
        let heard = log.requests.heard.remove(&hold);
        drop(log);
        let Some(asked) = asked else { return };
        if heard.is_some_and(|heard| heard >= asked) {
            return;
        }
        let owed = calm.map(|calm| calm.max(asked).max(self.since));
        if owed.is_some_and(|owed| Instant::now().duration_since(owed) > LOSS_BOUND) {
            world.violation(
                me,
                format!("{key} token {token} was asked to let go and never heard it"),
            );
        }
    }
}
