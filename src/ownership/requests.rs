//! The holder's side of release requests (`line/request.rs`): a task that reads the request
//! key of a hold and then follows its puts on the client's watch stream, and hands every
//! request meant for this hold to a crossbeam channel. Started on the first call to
//! `release_requested()` (a guard nobody asks about costs etcd nothing), stopped when the
//! hold is dropped.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use tokio::sync::oneshot;

use super::{Held, Hold, Place};
use crate::line::request::{self, ReleaseRequest};
use crate::support::backoff::Backoff;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::client::removal::{self, Owned};
use crate::support::error::code::Code;
use crate::support::error::{Error, Result};
use crate::support::kv::{KeyValue, Range, text};
use crate::support::sim::{Mutation, mutation};
use crate::transport::watch::{EventKind, Only};
use crate::transport::watches::{Delivery, Spec, Watches};
use crate::transport::{Retry, Rpc};
use std::time::Duration;

/// A hold's request follower: its channel, and the task's stop (dropping it stops it).
pub(crate) struct Requests {
    receiver: Receiver<ReleaseRequest>,
    _stop: Stop,
}

/// Stops a request follower when dropped.
pub(crate) struct Stop(#[allow(dead_code)] oneshot::Sender<()>);

impl Held {
    /// The hold's release requests (see [`Guard::release_requested`](crate::Guard::release_requested)):
    /// the first call starts following them, every call returns the same channel.
    pub(crate) fn release_requested(&self) -> Receiver<ReleaseRequest> {
        let hold = self.hold();
        let mut requests = hold.requests.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(requests) = &*requests {
            return requests.receiver.clone();
        }
        let (sender, receiver) = crossbeam_channel::unbounded();
        let stop = start(hold, sender);
        *requests = Some(Requests {
            receiver: receiver.clone(),
            _stop: stop,
        });
        receiver
    }

    /// Follows the hold's release requests into `sender` (a guard over several holds
    /// gathers theirs on one channel) until the returned [`Stop`] is dropped.
    pub(crate) fn forward_release_requests(&self, sender: Sender<ReleaseRequest>) -> Stop {
        start(self.hold(), sender)
    }
}

/// The release request of a line's key, as its releases delete it.
pub(super) struct RequestKey {
    key: Option<Vec<u8>>,
    /// Shared with the line: etcd refused a delete of it once.
    denied: Arc<AtomicBool>,
}

impl RequestKey {
    /// The request of `key`, a hold's key under `line`'s name.
    pub(super) fn of(line: &Place, key: &[u8]) -> RequestKey {
        RequestKey {
            key: release_request_key(line, key),
            denied: line.requests_denied.clone(),
        }
    }

    /// The request key to delete with the holder's key, unless etcd refused that before.
    pub(super) fn to_delete(&self) -> Option<&[u8]> {
        match self.denied.load(Ordering::Relaxed) {
            true => None,
            false => self.key.as_deref(),
        }
    }

    /// etcd refused a delete of the request key: delete the key alone from now on.
    pub(super) fn deny(&self) {
        self.denied.store(true, Ordering::Relaxed);
    }
}

/// Removes `key` if it is still ours (`owned`), and its release request in the same Txn.
/// A role that covers `<name>/` but not `<name>.revoke/` makes etcd refuse that Txn whole:
/// then the key is removed alone, now and in every later release of the line (its request,
/// if any was written, goes with the lease). When the key was not ours any more, its
/// request is removed next if the key is gone altogether (a forced release), as
/// [`remove_after_loss`] does; a transient failure of that is the caller's to retry, as
/// one of the removal's own.
pub(super) async fn remove_key_and_request(
    rpc: &Rpc,
    key: &[u8],
    request: &RequestKey,
    owned: Owned,
) -> Result<bool> {
    let removed = remove_key_and_request_once(rpc, key, request, owned).await?;
    if let (false, Some(also)) = (removed, request.to_delete()) {
        match rpc
            .txn(&removal::remove_if_gone(key, also), Retry::Safe)
            .await
        {
            Ok(_) => {}
            Err(Error::Server {
                code: Code::PermissionDenied,
                ..
            }) => request.deny(),
            // Not answered: the caller asks again, the removal first (its answer again).
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => {
                tracing::debug!(error = %e, key = %text(also), "release request left to the lease");
            }
        }
    }
    Ok(removed)
}

async fn remove_key_and_request_once(
    rpc: &Rpc,
    key: &[u8],
    request: &RequestKey,
    owned: Owned,
) -> Result<bool> {
    let also = match request.denied.load(Ordering::Relaxed) {
        true => None,
        false => request.key.as_deref(),
    };
    match removal::remove_with(rpc, key, owned, also).await {
        Err(Error::Server {
            code: Code::PermissionDenied,
            ..
        }) if also.is_some() => {
            request.denied.store(true, Ordering::Relaxed);
            tracing::warn!(
                key = %text(key),
                "may not delete release requests beside this name: releasing without"
            );
            removal::remove_with(rpc, key, owned, None).await
        }
        other => other,
    }
}

/// After our key was deleted by someone else (the hold is lost, nothing of ours is left to
/// release): removes the key's release request while the key is still gone
/// ([`removal::remove_if_gone`]), retried in the background until etcd answers or the
/// session ends (its lease then takes the request with it). Without it a forced release
/// after a request left the request key for as long as the session lived, and under a
/// nested name (`p/q.revoke/...`) it blocked every lock of the parent (issue 48).
pub(super) fn remove_after_loss(line: &Place, key: &[u8]) {
    let request = RequestKey::of(line, key);
    let Some(also) = request.to_delete().map(<[u8]>::to_vec) else {
        return;
    };
    let session = line.session.lease().clone();
    if session.loss_reason().is_some() {
        return; // the lease takes the request with it
    }
    let rpc = line.session.client().rpc().clone();
    let txn = removal::remove_if_gone(key, &also);
    line.session.client().spawn(async move {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            match rpc.txn(&txn, Retry::Safe).await {
                Ok(_) => return,
                Err(Error::Server {
                    code: Code::PermissionDenied,
                    ..
                }) => return request.deny(),
                Err(e) if e.is_transient() && session.loss_reason().is_none() => {
                    tracing::debug!(error = %e, "request removal not answered; retrying");
                    backoff.sleep().await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, key = %text(&also), "release request left to the lease");
                    return;
                }
            }
        }
    });
}

/// The release request of the line's key, which every release and cleanup deletes with
/// the key (`hold/mod.rs`).
fn release_request_key(line: &Place, key: &[u8]) -> Option<Vec<u8>> {
    if mutation(Mutation::ReleaseKeepsRequest) {
        return None;
    }
    request::request_key(&line.name, key)
}

fn start(hold: &Arc<Hold>, sender: Sender<ReleaseRequest>) -> Stop {
    let (stop, stopped) = oneshot::channel();
    let client = hold.line.session.client();
    let Some(request_key) = request::request_key(&hold.line.name, hold.key()) else {
        return Stop(stop); // our keys are always under the name: nothing to follow
    };
    let follower = Follower {
        rpc: client.rpc().clone(),
        watches: client.watches().clone(),
        key: hold.key().to_vec(),
        request_key,
        created: hold.rev,
        sender,
        covered: 0,
    };
    client.spawn(async move {
        tokio::select! {
            _ = stopped => {}
            result = follower.run() => {
                if let Err(e) = result {
                    tracing::warn!(error = %e, "release requests can no longer be followed");
                }
            }
        }
    });
    Stop(stop)
}

struct Follower {
    rpc: Rpc,
    watches: Watches,
    /// The held key.
    key: Vec<u8>,
    request_key: Vec<u8>,
    /// The held key's create revision: requests for another hold of it are not ours.
    created: i64,
    sender: Sender<ReleaseRequest>,
    /// Every put of the request key up to this revision has been handed on (or was older
    /// than what a read saw).
    covered: i64,
}

impl Follower {
    async fn run(mut self) -> Result<()> {
        self.read().await?;
        let spec = Spec::key(&self.request_key, Only::Puts);
        let mut puts = self.watches.subscribe(spec, self.covered);
        loop {
            match puts.next().await {
                // The watcher starts later than what we know: a put in between is not on it.
                Delivery::From { after, .. } if after > self.covered => self.read().await?,
                Delivery::From { .. } => {}
                Delivery::Events(batch) => {
                    for event in batch.iter().filter(|e| e.kind == EventKind::Put) {
                        self.hand_on(&event.kv);
                    }
                }
                Delivery::Failed(e) => return Err(e),
            }
        }
    }

    /// Reads the request key (retrying until etcd answers) and hands on what it finds.
    async fn read(&mut self) -> Result<()> {
        let mut backoff = Backoff::quick();
        let read = loop {
            match self.rpc.read(&Range::key(&self.request_key)).await {
                Ok(read) => break read,
                Err(e) if e.is_transient() => backoff.sleep().await,
                Err(e) => return Err(e),
            }
        };
        if let Some(kv) = read.kvs.first() {
            self.hand_on(kv);
        }
        self.covered = self.covered.max(read.revision);
        Ok(())
    }

    /// Hands on the request `kv` (a version of the request key) once, if it is for us.
    fn hand_on(&mut self, kv: &KeyValue) {
        if kv.mod_revision <= self.covered {
            return;
        }
        self.covered = kv.mod_revision;
        let decoded = request::decode(&kv.value);
        match ReleaseRequest::of(decoded, &self.key, self.created, kv.mod_revision) {
            Some(asked) => {
                tracing::debug!(key = %text(&self.key), by = %asked.requester, "release requested");
                let _ = self.sender.send(asked);
            }
            None => {
                tracing::debug!(key = %text(&self.key), "a release request for an earlier hold")
            }
        }
    }
}
