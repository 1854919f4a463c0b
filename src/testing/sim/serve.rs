//! Serving a simulated member: an accept loop takes the server's end of each in-memory
//! connection (`transport/memory.rs`) and runs HTTP/2 on it with the member's gRPC
//! services, routed by path as a real etcd routes them.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::DuplexStream;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::AbortHandle;
use tower_service::Service as _;

use super::services::Member;
use crate::transport::generated::etcdserverpb as pb;
use pb::kv_server::KvServer;
use pb::lease_server::LeaseServer;
use pb::maintenance_server::MaintenanceServer;
use pb::watch_server::WatchServer;

/// One member's gRPC services, by path.
#[derive(Clone)]
struct Router {
    kv: KvServer<Member>,
    watch: WatchServer<Member>,
    lease: LeaseServer<Member>,
    maintenance: MaintenanceServer<Member>,
}

type Answer =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send>>;

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Router {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Answer {
        // The generated services are always ready: no `poll_ready` to wait for.
        match req.uri().path().split('/').nth(1) {
            Some("etcdserverpb.KV") => self.kv.clone().call(req),
            Some("etcdserverpb.Watch") => self.watch.clone().call(req),
            Some("etcdserverpb.Lease") => self.lease.clone().call(req),
            Some("etcdserverpb.Maintenance") => self.maintenance.clone().call(req),
            // Auth, Cluster and the rest: a simulated cluster has no auth and no
            // membership changes.
            _ => Box::pin(async { Ok(tonic::Status::unimplemented("not simulated").into_http()) }),
        }
    }
}

/// The connections a member serves now, to cut them when it stops or breaks its streams.
pub(crate) type Connections = Arc<Mutex<Vec<AbortHandle>>>;

/// Serves every connection `accepted` hands over, until the listener is dropped.
pub(crate) async fn accept(
    member: Member,
    mut accepted: UnboundedReceiver<DuplexStream>,
    connections: Connections,
) {
    let router = Router {
        kv: KvServer::new(member.clone()),
        watch: WatchServer::new(member.clone()),
        lease: LeaseServer::new(member.clone()),
        maintenance: MaintenanceServer::new(member),
    };
    while let Some(io) = accepted.recv().await {
        // No `date` header: its value is the wall clock's second, and a header block whose
        // size changes with it changes how the client's reads split over the task budget,
        // and so the order of tasks: a run would not replay exactly from its seed.
        let serving = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .auto_date_header(false)
            .serve_connection(TokioIo::new(io), router.clone());
        let task = tokio::spawn(async move {
            let _ = serving.await;
        });
        let mut connections = connections.lock().unwrap_or_else(|e| e.into_inner());
        connections.retain(|c| !c.is_finished());
        connections.push(task.abort_handle());
    }
}

/// Cuts every connection in `connections` (the client sees them reset).
pub(crate) fn cut(connections: &Connections) {
    for connection in connections
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain(..)
    {
        connection.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing of a simulated member's answer depends on the wall clock (one seed, one
    /// trace): hyper's default `date` header is off.
    #[tokio::test]
    async fn answers_carry_no_wall_clock_date() {
        let cluster = crate::testing::sim::SimCluster::start_here(1).expect("a cluster");
        let endpoint: http::Uri = cluster.endpoints()[0].parse().expect("a URI");
        let mut connector = crate::transport::memory::Connector;
        let ours = connector.call(endpoint).await.expect("a member listens");
        let (mut send, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), ours)
                .await
                .expect("an HTTP/2 connection");
        tokio::spawn(connection);
        let request = http::Request::post("http://m0.sim.invalid/etcdserverpb.Auth/Authenticate")
            .header("content-type", "application/grpc")
            .body(tonic::body::Body::empty())
            .expect("a request");
        let answer = send.send_request(request).await.expect("an answer");
        assert_eq!(
            answer.headers().get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"12"[..]),
            "the unimplemented service answered: {:?}",
            answer.headers()
        );
        assert!(
            answer.headers().get(http::header::DATE).is_none(),
            "{:?}",
            answer.headers()
        );
    }
}
