//! The transport: everything that knows gRPC. Internal gRPC layer: one HTTP/2 channel per endpoint, request timeouts, retries of
//! retry-safe requests on the next endpoint, and the metadata every call carries.
//!
//! Everything here is async and crate-private; the blocking API calls it through
//! [`Runtime::block_on`](crate::runtime::Runtime::block_on).

mod convert;
pub(crate) mod fault;
pub(crate) mod generated;
pub(crate) mod kv;
pub(crate) mod lease;
#[cfg(feature = "tls")]
mod tls;
pub(crate) mod watch;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::etcd_text;
use fault::{Wire, wire_cause};
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
    pub(crate) tls: Option<crate::TlsConfig>,
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
    channels: Vec<Channel>,
    /// Index of the endpoint requests go to; moved on when that endpoint fails.
    current: AtomicUsize,
    request_timeout: Duration,
    credentials: Option<(String, String)>,
    /// The current auth token, sent as `token` metadata on every call and stream.
    token: std::sync::RwLock<Option<MetadataValue<Ascii>>>,
    /// Serialises re-authentication so a burst of expired-token errors asks once.
    authenticating: tokio::sync::Mutex<()>,
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
    Ok(url)
}

impl Rpc {
    /// Connects to the endpoints in order. Endpoints that answer get a live channel, the
    /// others a lazy one (they may come back later). Until one answers, rounds over all of
    /// them repeat with a growing pause, as grpc-go's blocking dial does (so a long connect
    /// timeout waits for an etcd that is still starting, or frozen); it fails when none
    /// answered within the connect timeout, or at once if one refused our certificate or we
    /// do not trust its own (retrying cannot fix either).
    pub(crate) async fn connect(config: &RpcConfig) -> Result<Rpc> {
        let mut endpoints = Vec::with_capacity(config.endpoints.len());
        for url in &config.endpoints {
            let endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| Error::InvalidArgument(format!("endpoint {url:?}: {e}")))?
                .connect_timeout(config.connect_timeout)
                .tcp_nodelay(true)
                // etcd closes connections that ping faster than --grpc-keepalive-min-time
                // (5 s), and counts pings without an open stream as abuse: ping only while
                // a stream is open, every 10 s or slower.
                .http2_keep_alive_interval(config.keep_alive_interval)
                .keep_alive_timeout(config.keep_alive_timeout)
                .keep_alive_while_idle(false);
            #[cfg(feature = "tls")]
            let endpoint = match &config.tls {
                Some(tls) => endpoint.tls_config(tls::client_tls(tls)?).map_err(|e| {
                    Error::InvalidArgument(format!("TLS settings for {url}: {}", error_chain(&e)))
                })?,
                None => endpoint,
            };
            endpoints.push(endpoint);
        }
        let deadline = tokio::time::Instant::now() + config.connect_timeout;
        let mut pause = Backoff::new(CONNECT_RETRY_FIRST, CONNECT_RETRY_MAX);
        let mut last_error = String::new();
        // An endpoint that refused our client certificate: reported as such, because
        // "is etcd running?" would send the user the wrong way.
        let mut refused = None;
        let mut first_live = None;
        // A server certificate we do not trust will not become trusted by trying again.
        let mut untrusted = false;
        // With credentials, the token the first member that authenticated us issued: later
        // probes send it (current etcd releases answer Status only to authenticated calls).
        let mut token = None;
        'rounds: loop {
            for (i, (url, endpoint)) in config.endpoints.iter().zip(&endpoints).enumerate() {
                let probed = probe(endpoint, config.credentials.as_ref(), &mut token);
                let (failure, cut) = match tokio::time::timeout_at(deadline, probed).await {
                    Ok(Ok(channel)) => {
                        first_live = Some((i, channel));
                        break 'rounds;
                    }
                    Ok(Err(ProbeError::Auth(error))) => {
                        tracing::warn!(endpoint = %url, %error, "etcd refused our credentials");
                        return Err(error);
                    }
                    Ok(Err(ProbeError::Failed(failure))) => (failure, false),
                    Err(_) => (ProbeFailure::silent(config.connect_timeout), true),
                };
                match failure.refused_certificate(config) {
                    Some(detail) => refused = Some((url.clone(), detail)),
                    // A probe cut short by the deadline says less than an earlier failure.
                    None if cut && !last_error.is_empty() => {}
                    None => {
                        let why = failure.explain();
                        last_error = if config.endpoints.len() > 1 {
                            format!("{url}: {why}")
                        } else {
                            why
                        };
                        untrusted |= failure.is_untrusted_server();
                    }
                }
                if tokio::time::Instant::now() >= deadline {
                    break 'rounds;
                }
            }
            let now = tokio::time::Instant::now();
            if refused.is_some() || untrusted || now >= deadline {
                break;
            }
            tokio::time::sleep_until(deadline.min(now + pause.next_pause())).await;
        }
        let channels: Vec<Channel> = endpoints
            .iter()
            .enumerate()
            .map(|(i, endpoint)| match &first_live {
                Some((live, channel)) if *live == i => channel.clone(),
                _ => endpoint.connect_lazy(),
            })
            .collect();
        let first_live = first_live.map(|(i, _)| i);
        let Some(current) = first_live else {
            if let Some((endpoint, detail)) = refused {
                tracing::warn!(%endpoint, %detail, "etcd refused our TLS client certificate");
                return Err(Error::ClientCertificateRejected { endpoint, detail });
            }
            tracing::warn!(endpoints = %config.endpoints.join(","), reason = %last_error, "etcd unreachable");
            return Err(Error::Connect {
                endpoints: config.endpoints.join(","),
                reason: last_error,
            });
        };
        tracing::info!(endpoint = %config.endpoints[current], "connected to etcd");
        let rpc = Rpc {
            inner: Arc::new(RpcInner {
                endpoints: config.endpoints.clone(),
                channels,
                current: AtomicUsize::new(current),
                request_timeout: config.request_timeout,
                credentials: config.credentials.clone(),
                token: std::sync::RwLock::new(token),
                authenticating: tokio::sync::Mutex::new(()),
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
            .unary_once(Retry::Safe, Token::Omit, req, |ch, r| async move {
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
        crate::telemetry::authenticated(old.is_some());
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
            crate::telemetry::failover(&self.inner.endpoints[failed], &self.inner.endpoints[next]);
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
    pub(super) async fn unary<Req, Resp, F, Fut>(
        &self,
        retry: Retry,
        message: Req,
        call: F,
    ) -> Result<Resp>
    where
        Req: Clone,
        F: Fn(Channel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.with_fresh_token(|| self.unary_once(retry, Token::Send, message.clone(), &call))
            .await
    }

    async fn unary_once<Req, Resp, F, Fut>(
        &self,
        retry: Retry,
        token: Token,
        message: Req,
        call: F,
    ) -> Result<Resp>
    where
        Req: Clone,
        F: Fn(Channel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
    {
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
                        operation: "etcd request",
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

    /// Opens a watch stream; the same rule as for keep-alive applies (see `lease.rs`): queue the first
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

/// The first pause between connect rounds, and the longest.
const CONNECT_RETRY_FIRST: Duration = Duration::from_millis(50);
const CONNECT_RETRY_MAX: Duration = Duration::from_secs(1);

/// Why the connect probe failed at one endpoint.
struct ProbeFailure {
    /// The error chain as one line.
    text: String,
    cause: Wire,
    /// Whether TCP (and TLS) setup had succeeded and the first request failed.
    after_handshake: bool,
}

impl ProbeFailure {
    fn silent(after: Duration) -> ProbeFailure {
        ProbeFailure {
            text: format!("no answer within {after:?}"),
            cause: Wire::Broken(std::io::ErrorKind::TimedOut),
            after_handshake: false,
        }
    }

    /// The detail, if this failure means the server refused our client certificate.
    ///
    /// A server with `--client-cert-auth` says so in one of two ways, depending on its TLS
    /// version and on timing: a certificate alert (during the handshake with TLS 1.2, or on
    /// our first read with TLS 1.3), or, with TLS 1.3, by closing the connection right
    /// after a handshake that looked complete to us, so our first write meets a broken
    /// pipe or a reset. Both mean the same to the user.
    fn refused_certificate(&self, config: &RpcConfig) -> Option<String> {
        use std::io::ErrorKind as K;
        match &self.cause {
            Wire::CertificateRefused(alert) => Some(alert.clone()),
            Wire::Broken(
                kind @ (K::BrokenPipe
                | K::ConnectionReset
                | K::ConnectionAborted
                | K::UnexpectedEof),
            ) if uses_tls(config) && self.after_handshake => Some(format!(
                "etcd closed the connection right after the TLS handshake ({kind})"
            )),
            _ => None,
        }
    }

    /// Whether we refused the server's certificate: a setting to fix, not a passing fault.
    fn is_untrusted_server(&self) -> bool {
        matches!(self.cause, Wire::ServerCertificateRejected(_))
    }

    /// The reason with the advice that fits it.
    fn explain(&self) -> String {
        match &self.cause {
            Wire::ServerCertificateRejected(why) => format!(
                "{} (etcd's server certificate was not accepted: {why}; give the CA that signed \
                 it with TlsConfig::ca_certificate_pem, and check the endpoint's host name)",
                self.text
            ),
            // etcd answered, and what it said is the reason (a learner).
            Wire::Answered if self.after_handshake => self.text.clone(),
            _ => format!("{} (is etcd running and listening there?)", self.text),
        }
    }
}

fn uses_tls(config: &RpcConfig) -> bool {
    #[cfg(feature = "tls")]
    return config.tls.is_some();
    #[cfg(not(feature = "tls"))]
    {
        let _ = config;
        false
    }
}

/// Why an endpoint did not pass the connect probe.
enum ProbeError {
    /// Not reachable or not serving (yet): the next endpoint, or the next round, may do.
    Failed(ProbeFailure),
    /// etcd answered about our credentials (wrong, missing, or auth not enabled): no other
    /// endpoint or round will answer otherwise, so connecting ends with this error.
    Auth(Error),
}

impl From<ProbeFailure> for ProbeError {
    fn from(failure: ProbeFailure) -> ProbeError {
        ProbeError::Failed(failure)
    }
}

/// Connects and asks etcd for its status: proves a real etcd answers (a frozen process
/// still accepts TCP connections, and with TLS 1.3 a refused client certificate only shows
/// on the first request). With credentials it authenticates first, unless `token` already
/// holds a token from an earlier endpoint, and asks with the token: etcd 3.4.42+, 3.5.28+,
/// 3.6 and 3.7 with auth enabled answer Status only to an authenticated call ("user name
/// is empty").
async fn probe(
    endpoint: &Endpoint,
    credentials: Option<&(String, String)>,
    token: &mut Option<MetadataValue<Ascii>>,
) -> std::result::Result<Channel, ProbeError> {
    let channel = endpoint.connect().await.map_err(|e| ProbeFailure {
        text: error_chain(&e),
        cause: wire_cause(&e),
        after_handshake: false,
    })?;
    if let (Some((name, password)), None) = (credentials, token.as_ref()) {
        *token = Some(authenticate(channel.clone(), name, password).await?);
    }
    let mut request = without_token(pb::StatusRequest {});
    if let Some(token) = token.as_ref() {
        request.metadata_mut().insert("token", token.clone());
    }
    let status = pb::maintenance_client::MaintenanceClient::new(channel.clone())
        .status(request)
        .await;
    let status = match status {
        Ok(status) => status.into_inner(),
        // A server with auth on, asked without credentials: no retry will change that.
        Err(status)
            if credentials.is_none() && status.message().contains(etcd_text::USER_NAME_EMPTY) =>
        {
            return Err(ProbeError::Auth(Error::Authentication(format!(
                "etcd requires authentication ({}): give a user name and password \
                 (ClientBuilder::user)",
                status.message()
            ))));
        }
        Err(status) => return Err(answered_failure(&status).into()),
    };
    // A learner answers Status but refuses every request we would send it: not a member
    // to start on (it stays in the list, lazily connected, and is skipped again if a
    // failover lands on it; it may be promoted later).
    if status.is_learner {
        return Err(ProbeFailure {
            text: format!(
                "a learner (non-voting member): it serves no requests, {}",
                etcd_text::NOT_SUPPORTED_FOR_LEARNER
            ),
            cause: Wire::Answered,
            after_handshake: true,
        }
        .into());
    }
    Ok(channel)
}

/// Asks the member behind `channel` for a token. A refusal of the credentials (or of auth
/// itself) is final; a member that cannot answer now (no leader, a broken connection) is
/// a probe failure like any other, and the next endpoint is tried.
async fn authenticate(
    channel: Channel,
    name: &str,
    password: &str,
) -> std::result::Result<MetadataValue<Ascii>, ProbeError> {
    let request = without_token(pb::AuthenticateRequest {
        name: name.to_string(),
        password: password.to_string(),
    });
    let response = AuthClient::new(channel).authenticate(request).await;
    let response = match response {
        Ok(response) => response.into_inner(),
        Err(status) if fault::status_error(&status, "").is_transient() => {
            return Err(answered_failure(&status).into());
        }
        Err(status) => {
            return Err(ProbeError::Auth(Error::Authentication(
                status.message().to_string(),
            )));
        }
    };
    MetadataValue::try_from(response.token.as_str()).map_err(|_| {
        ProbeError::Auth(Error::Authentication(
            "etcd returned an unusable token".into(),
        ))
    })
}

/// A probe's call that reached etcd (the handshake was done) and failed.
fn answered_failure(status: &tonic::Status) -> ProbeFailure {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    if let Some(source) = std::error::Error::source(status) {
        text.push_str(": ");
        text.push_str(&error_chain(source));
    }
    ProbeFailure {
        text,
        cause: wire_cause(status),
        after_handshake: true,
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

/// Joins an error and its sources into one line: tonic's transport errors hide the useful
/// part ("Connection refused") in the source chain.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut last = text.clone();
    let mut source = error.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        // Layers often repeat their inner error's text ("tcp connect error: tcp connect
        // error: ..."): keep each distinct part once.
        if part != last && !last.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        last = part;
        source = inner.source();
    }
    text
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
        assert_eq!(
            parse_endpoint("127.0.0.1:2379", true).ok(),
            Some("https://127.0.0.1:2379".to_string())
        );
    }
}
