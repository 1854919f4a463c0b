//! The transport: everything that knows gRPC. Internal gRPC layer: one HTTP/2 channel per endpoint, request timeouts, retries of
//! retry-safe requests on the next endpoint, and the metadata every call carries.
//!
//! Everything here is async and crate-private; the blocking API calls it through
//! [`Runtime::block_on`](crate::client::runtime::Runtime::block_on).

mod coalesce;
mod connect;
mod convert;
pub(crate) mod fault;
pub(crate) mod generated;
pub(crate) mod kv;
pub(crate) mod lease;
#[cfg(feature = "simulation")]
pub(crate) mod memory;
#[cfg(feature = "tls")]
mod tls;
pub(crate) mod watch;
pub(crate) mod watch_ids;
pub(crate) mod watches;
mod whole;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Endpoint;
pub(crate) use whole::Channel;

use crate::support::error::operation::Operation;
use crate::support::error::{Error, Result};
use crate::support::etcd_text;

use crate::support::sim::{Mutation, Process, mutation};
use crate::support::tuning::LineTuning;
use generated::etcdserverpb as pb;
use pb::auth_client::AuthClient;
use pb::watch_client::WatchClient;

/// Connection settings resolved by the client builder. `Debug` by hand: no password.
#[derive(Clone)]
pub(crate) struct RpcConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) keep_alive_interval: Duration,
    pub(crate) keep_alive_timeout: Duration,
    /// User name and password for etcd's auth, if enabled.
    pub(crate) credentials: Option<(String, String)>,
    /// TLS settings for `https://` endpoints.
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<crate::support::tls::TlsConfig>,
    /// Test tuning of how this client's waiters wait (`line/behind/`).
    pub(crate) line_tuning: LineTuning,
    /// The prefix whose wait graph this client's waits check for a cycle they would
    /// complete (`ownership/deadlock.rs`); `None`: no check.
    pub(crate) deadlock_prefix: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for RpcConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcConfig")
            .field("endpoints", &self.endpoints)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("keep_alive_interval", &self.keep_alive_interval)
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .finish_non_exhaustive()
    }
}

/// Whether a request may be sent again after an ambiguous failure (timeout, broken
/// connection) without changing its effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Reads, revision-guarded deletes, our lease-keyed acquire transaction.
    Safe,
    /// Plain writes: a retry could apply twice.
    Never,
}

/// Whether a call carries the auth token.
#[derive(Debug, Clone, Copy)]
enum Token {
    Send,
    Omit,
}

/// Cheap to clone: all clones share the channels and the current-endpoint cursor.
#[derive(Clone)]
pub(crate) struct Rpc {
    inner: Arc<RpcInner>,
}

struct RpcInner {
    endpoints: Vec<String>,
    /// See [`RpcConfig::line_tuning`].
    line_tuning: LineTuning,
    /// See [`RpcConfig::deadlock_prefix`].
    deadlock_prefix: Option<Arc<[u8]>>,
    channels: Vec<Channel>,
    /// Index of the endpoint requests go to; moved on when that endpoint fails.
    current: AtomicUsize,
    /// Counts the moves of `current`, so that a watch stream learns of one at once instead
    /// of checking on a timer ([`Rpc::moves`]).
    moves: tokio::sync::watch::Sender<u64>,
    request_timeout: Duration,
    credentials: Option<(String, String)>,
    /// The current auth token, sent as `token` metadata on every call and stream.
    token: std::sync::RwLock<Option<MetadataValue<Ascii>>>,
    /// Serialises re-authentication so a burst of expired-token errors asks once.
    authenticating: tokio::sync::Mutex<()>,
    /// The simulated process this client belongs to: once it crashed, nothing of it
    /// reaches etcd any more (requests already on their way still may). Empty, and never
    /// crashed, without the `simulation` feature.
    process: Process,
}

/// The simulation's seam in the transport: a dial of an in-memory endpoint (a simulated
/// member's, `memory.rs`) goes through a pipe in this process instead of TCP. `None` for any
/// other endpoint, and always without the `simulation` feature.
async fn dial_memory(
    endpoint: &Endpoint,
) -> Option<std::result::Result<Channel, tonic::transport::Error>> {
    #[cfg(feature = "simulation")]
    if memory::is_memory(&endpoint.uri().to_string()) {
        return Some(
            endpoint
                .connect_with_connector(memory::Connector)
                .await
                .map(Channel::from),
        );
    }
    let _ = endpoint;
    None
}

/// [`dial_memory`], connecting on first use.
#[inline(always)]
fn dial_memory_lazy(endpoint: &Endpoint) -> Option<Channel> {
    #[cfg(feature = "simulation")]
    if memory::is_memory(&endpoint.uri().to_string()) {
        return Some(
            endpoint
                .connect_with_connector_lazy(memory::Connector)
                .into(),
        );
    }
    let _ = endpoint;
    None
}

/// Normalises `host:port` to `http://host:port` (`https://` with TLS) and checks the URL:
/// with TLS settings every endpoint must be `https://`, without them `http://`.
pub(crate) fn parse_endpoint(raw: &str, tls: bool) -> Result<String> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err(Error::InvalidArgument("empty endpoint".into()));
    }
    let scheme = if tls { "https://" } else { "http://" };
    let url = if trimmed.contains("://") {
        trimmed.to_string()
    } else {
        format!("{scheme}{trimmed}")
    };
    if url.starts_with("https://") && !tls {
        return Err(Error::InvalidArgument(format!(
            "endpoint {raw:?} is https:// but no TLS settings were given \
             (ClientBuilder::tls, cargo feature `tls`)"
        )));
    }
    if !url.starts_with(scheme) {
        return Err(Error::InvalidArgument(format!(
            "endpoint {raw:?}: expected a {scheme} URL"
        )));
    }
    if trimmed.contains(',') {
        return Err(Error::InvalidArgument(format!(
            "endpoint {raw:?} contains a comma: give each endpoint as its own element \
             (split \"a,b\" into [\"a\", \"b\"])"
        )));
    }
    Endpoint::from_shared(url.clone())
        .map_err(|e| Error::InvalidArgument(format!("endpoint {raw:?} is not a valid URL: {e}")))?;
    let authority = &url[scheme.len()..];
    let host_port = authority.split('/').next().unwrap_or_default();
    // The text after the last ':' is the port, unless it is inside an IPv6 address's [].
    if let Some(colon) = host_port.rfind(':')
        && !host_port[colon..].contains(']')
    {
        let port = &host_port[colon + 1..];
        if !port.parse::<u16>().is_ok_and(|port| port > 0) {
            return Err(Error::InvalidArgument(format!(
                "endpoint {raw:?} has an invalid port {port:?} (expected 1-65535)"
            )));
        }
    }
    if authority.is_empty() || authority.starts_with('/') || authority.starts_with(':') {
        return Err(Error::InvalidArgument(format!(
            "endpoint {raw:?} has no host (expected e.g. http://127.0.0.1:2379)"
        )));
    }
    // etcd serves gRPC at the root: a path (or a query) would be dropped from every call,
    // so an endpoint that has one is not the address the user meant.
    let uri: http::Uri = url
        .parse()
        .map_err(|e| Error::InvalidArgument(format!("endpoint {raw:?} is not a valid URL: {e}")))?;
    let path = uri.path_and_query().map_or("", |p| p.as_str());
    if !path.is_empty() && path != "/" {
        let root = format!("{scheme}{}", uri.authority().map_or("", |a| a.as_str()));
        return Err(Error::InvalidArgument(format!(
            "endpoint {raw:?} has a path ({path:?}): etcd's gRPC is served at the root, so \
             give scheme, host and port only ({root})"
        )));
    }
    Ok(url)
}

impl Rpc {
    /// Connects to the endpoints (see [`connect::connect`]).
    pub(crate) async fn connect(config: &RpcConfig) -> Result<Rpc> {
        let connect::Connected {
            channels,
            current,
            token,
        } = connect::connect(config).await?;
        let rpc = Rpc {
            inner: Arc::new(RpcInner {
                endpoints: config.endpoints.clone(),
                line_tuning: config.line_tuning,
                deadlock_prefix: config.deadlock_prefix.clone(),
                channels,
                current: AtomicUsize::new(current),
                moves: tokio::sync::watch::Sender::new(0),
                request_timeout: config.request_timeout,
                credentials: config.credentials.clone(),
                token: std::sync::RwLock::new(token),
                authenticating: tokio::sync::Mutex::new(()),
                process: Process::default(),
            }),
        };
        Ok(rpc)
    }

    /// The auth token calls carry now (to pass back to [`Rpc::reauthenticate`] as the
    /// stale one, so a burst of failures re-authenticates once).
    pub(crate) fn token(&self) -> Option<MetadataValue<Ascii>> {
        self.inner
            .token
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether a failed call should be retried after a fresh token: we have credentials and
    /// etcd said the token is invalid or outdated.
    pub(crate) fn can_reauthenticate(&self, error: &Error) -> bool {
        self.inner.credentials.is_some() && error.is_auth_expired()
    }

    /// Gets a new token with our credentials (no-op without credentials). `stale` is the
    /// token the failed call used: if another caller already replaced it, nothing is sent.
    pub(crate) async fn reauthenticate(&self, stale: Option<MetadataValue<Ascii>>) -> Result<()> {
        let Some((name, password)) = &self.inner.credentials else {
            return Ok(());
        };
        let _one_at_a_time = self.inner.authenticating.lock().await;
        if stale.is_some() && self.token() != stale {
            return Ok(());
        }
        tracing::debug!(user = %name, "authenticating");
        let req = pb::AuthenticateRequest {
            name: name.clone(),
            password: password.clone(),
        };
        let resp = self
            // Without the old token: etcd rejects any call carrying an invalid one.
            .unary_once(Retry::Safe, Token::Omit, &req, |ch, r| async move {
                AuthClient::new(ch).authenticate(r).await
            })
            .await
            .map_err(|e| match e {
                Error::Server { message, .. } => Error::Authentication(message),
                other => other,
            })?;
        let token = MetadataValue::try_from(resp.token.as_str())
            .map_err(|_| Error::Authentication("etcd returned an unusable token".into()))?;
        let old = (self.inner.token.write().unwrap_or_else(|e| e.into_inner())).replace(token);
        crate::support::telemetry::authenticated(old.is_some());
        Ok(())
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    pub(crate) fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// The URL of endpoint `index`, for errors that name it.
    pub(crate) fn endpoint_url(&self, index: usize) -> &str {
        &self.inner.endpoints[index % self.inner.endpoints.len()]
    }

    /// The endpoint requests go to now, with its index for [`Rpc::fail_over`].
    pub(crate) fn channel(&self) -> (usize, Channel) {
        let i = self.current();
        (i, self.inner.channels[i].clone())
    }

    /// The index of the endpoint requests go to now.
    pub(crate) fn current(&self) -> usize {
        self.inner.current.load(Ordering::Relaxed) % self.inner.channels.len()
    }

    /// Tells of every later move to another endpoint ([`Rpc::fail_over`]): its `changed()`
    /// returns once requests go elsewhere than when it was made.
    pub(crate) fn moves(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.moves.subscribe()
    }

    /// Moves on from endpoint `failed` to the next one, unless another caller already did.
    pub(crate) fn fail_over(&self, failed: usize) {
        let next = (failed + 1) % self.inner.channels.len();
        if self
            .inner
            .current
            .compare_exchange(failed, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && next != failed
        {
            self.inner.moves.send_modify(|moves| *moves += 1);
            crate::support::telemetry::failover(
                &self.inner.endpoints[failed],
                &self.inner.endpoints[next],
            );
            tracing::warn!(
                failed = %self.inner.endpoints[failed],
                next = %self.inner.endpoints[next],
                "etcd endpoint failed; switching"
            );
        }
    }

    /// Wraps a message with the metadata every etcd call carries: the auth token, and
    /// `hasleader`, so a member cut off from the quorum refuses at once ("no leader",
    /// before handling the call: safe to send elsewhere) instead of serving stale state to
    /// a stream or holding a unary call until our request timeout.
    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = without_token(message);
        if let Some(token) = self.token() {
            request.metadata_mut().insert("token", token);
        }
        request
    }

    /// Runs `attempt`; if etcd refused our token as expired (simple tokens live
    /// `--auth-token-ttl`, 300 s by default, since their last use) or auth changed,
    /// authenticates again and runs it once more. The one re-authentication rule for unary
    /// calls and streams: passing the token the attempt used makes a burst of failures
    /// authenticate once.
    pub(super) async fn with_fresh_token<T, F, Fut>(&self, attempt: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let used = self.token();
        match attempt().await {
            Err(e) if self.can_reauthenticate(&e) => {
                self.reauthenticate(used).await?;
                attempt().await
            }
            other => other,
        }
    }

    /// Sends one unary request with the request timeout; retry-safe requests go on to the
    /// next endpoints when one is unavailable or silent.
    pub(super) async fn unary<Req: Clone, Resp>(
        &self,
        retry: Retry,
        message: Req,
        call: impl UnaryCall<Req, Resp>,
    ) -> Result<Resp> {
        if self.is_dead() {
            return Err(Error::Closed);
        }
        self.with_fresh_token(|| self.unary_once(retry, Token::Send, &message, &call))
            .await
    }

    /// Test tuning of how this client's waiters wait (see [`RpcConfig::line_tuning`]).
    pub(crate) fn line_tuning(&self) -> LineTuning {
        self.inner.line_tuning
    }

    /// The prefix of the deadlock check, if it is on (see [`RpcConfig::deadlock_prefix`]).
    pub(crate) fn deadlock_prefix(&self) -> Option<&Arc<[u8]>> {
        self.inner.deadlock_prefix.as_ref()
    }

    /// The simulated process this client belongs to (see `RpcInner::process`).
    #[cfg(feature = "simulation")]
    pub(crate) fn process(&self) -> &Process {
        &self.inner.process
    }

    /// Whether the simulated process this client belongs to crashed: always `false`
    /// without the `simulation` feature.
    #[inline(always)]
    pub(crate) fn is_dead(&self) -> bool {
        self.inner.process.crashed()
    }

    /// One round over the endpoints; `message` is copied into each attempt's request only.
    async fn unary_once<Req: Clone, Resp>(
        &self,
        retry: Retry,
        token: Token,
        message: &Req,
        call: impl UnaryCall<Req, Resp>,
    ) -> Result<Resp> {
        let mut last = Error::Closed;
        for _ in 0..self.inner.channels.len() {
            let (index, channel) = self.channel();
            let request = match token {
                Token::Send => self.request(message.clone()),
                Token::Omit => without_token(message.clone()),
            };
            match tokio::time::timeout(self.inner.request_timeout, call(channel, request)).await {
                Ok(Ok(response)) => return Ok(response.into_inner()),
                Ok(Err(status)) => {
                    let error = fault::status_error(&status, self.endpoint_url(index));
                    if !error.is_transient() {
                        return Err(error);
                    }
                    self.fail_over(index);
                    // A learner, or a member without a leader, refused before handling the
                    // call: even a write that must never be sent twice may go elsewhere.
                    let unhandled = etcd_text::is_refused_unhandled(status.message());
                    if !unhandled && retry == Retry::Never {
                        return Err(error);
                    }
                    last = error;
                }
                Err(_) => {
                    self.fail_over(index);
                    last = Error::Timeout {
                        operation: Operation::Request,
                        after: self.inner.request_timeout,
                        endpoint: Some(self.endpoint_url(index).to_string()),
                    };
                    if retry == Retry::Never {
                        return Err(last);
                    }
                }
            }
        }
        Err(last)
    }

    /// Whether the member behind `channel` says (Status) it has etcd #18089's fix; no if
    /// it cannot say (a failure here is the watch stream's to meet).
    pub(crate) async fn member_keeps_compacted_deletes(&self, channel: Channel) -> bool {
        if mutation(Mutation::ResumeAfterOnEveryRelease) {
            return true;
        }
        let request = self.request(pb::StatusRequest {});
        match pb::maintenance_client::MaintenanceClient::new(channel)
            .status(request)
            .await
        {
            Ok(status) => etcd_text::keeps_compacted_deletes(&status.into_inner().version),
            Err(_) => false,
        }
    }

    /// Opens a watch stream; the same rule as for keep-alive applies (see `transport/lease.rs`): queue the first
    /// create request before awaiting.
    pub(crate) async fn watch(
        &self,
        endpoint: usize,
        channel: Channel,
        requests: UnboundedReceiver<pb::WatchRequest>,
    ) -> Result<tonic::Streaming<pb::WatchResponse>> {
        let request = self.request(UnboundedReceiverStream::new(requests));
        WatchClient::new(channel)
            .watch(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| fault::status_error(&s, self.endpoint_url(endpoint)))
    }
}

/// A request with the `hasleader` metadata and no token (see [`Rpc::request`]).
fn without_token<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("hasleader", MetadataValue::from_static("true"));
    request
}

/// One unary gRPC call on a channel: what [`Rpc::unary`] sends, on each endpoint it tries.
pub(super) trait UnaryCall<Req, Resp>:
    Fn(Channel, tonic::Request<Req>) -> Self::Answer
{
    /// The call's future.
    type Answer: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>;
}

impl<Req, Resp, F, A> UnaryCall<Req, Resp> for F
where
    F: Fn(Channel, tonic::Request<Req>) -> A,
    A: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
{
    type Answer = A;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_normalised_and_checked() {
        assert_eq!(
            parse_endpoint("127.0.0.1:2379", false).ok(),
            Some("http://127.0.0.1:2379".to_string())
        );
        assert!(parse_endpoint("", false).is_err());
        assert!(parse_endpoint("ftp://x:1", false).is_err());
        assert!(parse_endpoint("http://", false).is_err());
        assert!(parse_endpoint("http://exa mple:2379", false).is_err());
        assert!(parse_endpoint("https://127.0.0.1:2379", false).is_err());
        assert!(parse_endpoint("http://127.0.0.1:2379", true).is_err());
        // A path or a query is refused; a bare trailing '/' is the root.
        let with_path = parse_endpoint("http://host:2379/some/path", false).unwrap_err();
        assert!(with_path.is_invalid_argument(), "{with_path:?}");
        assert_eq!(
            with_path.to_string(),
            "invalid argument: endpoint \"http://host:2379/some/path\" has a path \
             (\"/some/path\"): etcd's gRPC is served at the root, so give scheme, host and \
             port only (http://host:2379)"
        );
        assert!(parse_endpoint("host:2379/v3", false).is_err());
        assert!(parse_endpoint("http://host:2379?x=1", false).is_err());
        assert_eq!(
            parse_endpoint("http://host:2379/", false).ok(),
            Some("http://host:2379/".to_string())
        );
        assert_eq!(
            parse_endpoint("127.0.0.1:2379", true).ok(),
            Some("https://127.0.0.1:2379".to_string())
        );
    }
}
