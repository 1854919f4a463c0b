//! Lease calls in our own types, and the keep-alive stream split into a sending half (ready
//! at once) and a receiving half (ready when etcd answers).

use std::future::Future;

use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::generated::etcdserverpb as pb;
use super::{Retry, Rpc};
use crate::support::error::{Error, Result};
use pb::lease_client::LeaseClient;

/// A lease etcd granted, or what it says of a live one: the id, the TTL it was granted
/// with and the whole seconds it has left (etcd rounds down; ≤ 0 when it is gone).
pub(crate) struct LeaseInfo {
    pub(crate) id: i64,
    pub(crate) granted_ttl: i64,
    pub(crate) ttl: i64,
}

/// One keep-alive answer: the lease's new TTL in seconds (≤ 0: the lease is gone).
pub(crate) struct Renewed {
    pub(crate) id: i64,
    pub(crate) ttl: i64,
}

impl Rpc {
    /// A grant that applied but whose answer was lost only leaks a lease that expires by
    /// itself, so grants are retried.
    pub(crate) async fn lease_grant(&self, ttl: i64) -> Result<LeaseInfo> {
        let req = pb::LeaseGrantRequest { ttl, id: 0 };
        let resp = self
            .unary(Retry::Safe, req, |ch, r| async move {
                LeaseClient::new(ch).lease_grant(r).await
            })
            .await?;
        if !resp.error.is_empty() {
            return Err(Error::Server {
                code: crate::support::error::code::Code::Unknown,
                message: resp.error,
            });
        }
        Ok(LeaseInfo {
            id: resp.id,
            granted_ttl: ttl,
            ttl: resp.ttl,
        })
    }

    pub(crate) async fn lease_revoke(&self, id: i64) -> Result<()> {
        let req = pb::LeaseRevokeRequest { id };
        self.unary(Retry::Safe, req, |ch, r| async move {
            LeaseClient::new(ch).lease_revoke(r).await
        })
        .await?;
        Ok(())
    }

    pub(crate) async fn lease_time_to_live(&self, id: i64) -> Result<LeaseInfo> {
        let req = pb::LeaseTimeToLiveRequest { id, keys: false };
        let resp = self
            .unary(Retry::Safe, req, |ch, r| async move {
                LeaseClient::new(ch).lease_time_to_live(r).await
            })
            .await?;
        Ok(LeaseInfo {
            id,
            granted_ttl: resp.granted_ttl,
            ttl: resp.ttl,
        })
    }

    /// Opens a keep-alive stream on the endpoint in use with `first` queued (etcd sends the
    /// response headers only with its first answer, so the call cannot finish before a
    /// request is queued). The sending half is usable at once; the future yields the
    /// receiving half. `reauthenticate`: get a fresh token first (the last stream was
    /// refused for its token).
    pub(crate) fn keep_alive(
        &self,
        first: &[i64],
        reauthenticate: bool,
    ) -> (
        KeepAliveSender,
        impl Future<Output = Result<KeepAliveReceiver>> + Send + 'static,
    ) {
        let (requests, receiver) = unbounded_channel();
        let (endpoint, channel) = self.channel();
        for id in first {
            let _ = requests.send(pb::LeaseKeepAliveRequest { id: *id });
        }
        let rpc = self.clone();
        let opening = async move {
            if reauthenticate {
                rpc.reauthenticate(None).await?;
            }
            let request = rpc.request(UnboundedReceiverStream::new(receiver));
            let stream = LeaseClient::new(channel)
                .lease_keep_alive(request)
                .await
                .map_err(|s| super::fault::status_error(&s, rpc.endpoint_url(endpoint)))?
                .into_inner();
            Ok(KeepAliveReceiver {
                stream,
                endpoint: rpc.endpoint_url(endpoint).to_string(),
            })
        };
        let sender = KeepAliveSender {
            rpc: self.clone(),
            endpoint,
            requests,
        };
        (sender, opening)
    }
}

/// The sending half of a keep-alive stream; dropping it ends the stream.
pub(crate) struct KeepAliveSender {
    rpc: Rpc,
    endpoint: usize,
    requests: UnboundedSender<pb::LeaseKeepAliveRequest>,
}

impl KeepAliveSender {
    pub(crate) fn send(&self, id: i64) {
        // A closed stream shows on the receiving half.
        let _ = self.requests.send(pb::LeaseKeepAliveRequest { id });
    }

    /// This stream's endpoint failed (an error, or no answer): requests move on to the
    /// next one.
    pub(crate) fn fail_over(&self) {
        self.rpc.fail_over(self.endpoint);
    }
}

/// The receiving half of a keep-alive stream.
pub(crate) struct KeepAliveReceiver {
    stream: tonic::Streaming<pb::LeaseKeepAliveResponse>,
    /// The endpoint's URL, for errors.
    endpoint: String,
}

impl KeepAliveReceiver {
    /// The next answer; `None` when etcd ended the stream.
    pub(crate) async fn next(&mut self) -> Result<Option<Renewed>> {
        match self.stream.message().await {
            Ok(message) => Ok(message.map(|r| Renewed {
                id: r.id,
                ttl: r.ttl,
            })),
            Err(status) => Err(super::fault::status_error(&status, &self.endpoint)),
        }
    }
}
