//! In-memory connections, for the simulated cluster (feature `simulation`): an endpoint
//! whose authority a listener registered here is dialled through a pipe in this process
//! instead of TCP. Everything above the socket (HTTP/2, gRPC, our calls, retries and
//! failover) is the code real etcd is spoken to with.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::DuplexStream;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Bytes a pipe buffers in each direction.
const PIPE_BUFFER: usize = 256 * 1024;

type Listeners = HashMap<String, UnboundedSender<DuplexStream>>;

fn listeners() -> &'static Mutex<Listeners> {
    static LISTENERS: std::sync::OnceLock<Mutex<Listeners>> = std::sync::OnceLock::new();
    LISTENERS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The authority (`host:port`) of `url`.
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
}

/// Starts accepting connections for `authority`: each dial hands the server's end of a new
/// pipe to the receiver. A second listener replaces the first.
pub(crate) fn listen(authority: &str) -> UnboundedReceiver<DuplexStream> {
    let (accept, accepted) = unbounded_channel();
    listeners()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(authority.to_string(), accept);
    accepted
}

/// Stops accepting for `authority`: dials are refused, as by a port nobody listens on.
pub(crate) fn unlisten(authority: &str) {
    listeners()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(authority);
}

/// Whether `url` names an in-memory endpoint (one that is or was listened on: a stopped
/// one still dials here, and is refused).
pub(crate) fn is_memory(url: &str) -> bool {
    authority(url).ends_with(".sim.invalid:2379")
}

/// The connector tonic dials in-memory endpoints with.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Connector;

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<DuplexStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
        let dialled = {
            let listeners = listeners().lock().unwrap_or_else(|e| e.into_inner());
            listeners.get(&authority).and_then(|accept| {
                let (ours, theirs) = tokio::io::duplex(PIPE_BUFFER);
                accept.send(theirs).ok().map(|()| TokioIo::new(ours))
            })
        };
        Box::pin(async move {
            dialled.ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!("nothing listens on {authority} (a stopped simulated member)"),
                )
            })
        })
    }
}
