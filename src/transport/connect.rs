//! Connecting: a channel per endpoint, and the probe that proves a real etcd answers on
//! one of them (with credentials, authenticated first).

use super::Channel;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Endpoint;

use super::fault::{self, Wire, wire_cause};
use super::generated::etcdserverpb as pb;
use super::{RpcConfig, without_token};
use crate::support::backoff::Backoff;
use crate::support::error::{Error, Result};
use crate::support::etcd_text;
use pb::auth_client::AuthClient;
use std::time::Duration;

/// What [`connect`] found: a channel per endpoint (live for `current`, lazy for the others)
/// and, with credentials, the token `current` issued.
pub(super) struct Connected {
    pub(super) channels: Vec<Channel>,
    pub(super) current: usize,
    pub(super) token: Option<MetadataValue<Ascii>>,
}

/// Connects to the endpoints in order. Endpoints that answer get a live channel, the
/// others a lazy one (they may come back later). Until one answers, rounds over all of
/// them repeat with a growing pause, as grpc-go's blocking dial does (so a long connect
/// timeout waits for an etcd that is still starting, or frozen); it fails when none
/// answered within the connect timeout, or at once if one refused our certificate or we
/// do not trust its own (retrying cannot fix either).
pub(super) async fn connect(config: &RpcConfig) -> Result<Connected> {
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
            Some(tls) => endpoint
                .tls_config(super::tls::client_tls(tls)?)
                .map_err(|e| {
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
                    let why = failure.explain(url);
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
            _ => dial_lazy(endpoint),
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
    Ok(Connected {
        channels,
        current,
        token,
    })
}

/// Connects a channel to `endpoint`: over TCP, on sockets that gather a flush's frames into
/// one write (`transport/coalesce.rs`), or, with the `simulation` feature, through an
/// in-memory pipe to a simulated member (`transport/memory.rs`).
async fn dial(endpoint: &Endpoint) -> std::result::Result<Channel, tonic::transport::Error> {
    if let Some(dialled) = super::dial_memory(endpoint).await {
        return dialled;
    }
    endpoint
        .connect_with_connector(super::coalesce::Connector::new())
        .await
        .map(Channel::from)
}

/// [`dial`], connecting on first use.
fn dial_lazy(endpoint: &Endpoint) -> Channel {
    if let Some(memory) = super::dial_memory_lazy(endpoint) {
        return memory;
    }
    endpoint
        .connect_with_connector_lazy(super::coalesce::Connector::new())
        .into()
}

/// The first pause between connect rounds, and the longest.
const CONNECT_RETRY_FIRST: Duration = Duration::from_millis(50);
const CONNECT_RETRY_MAX: Duration = Duration::from_secs(1);

/// Why the connect probe failed at one endpoint.
struct ProbeFailure {
    /// What went wrong, in one line: the innermost cause of a transport failure (the OS's or
    /// the protocol's words, without tonic's "transport error" layers), or etcd's answer.
    text: String,
    cause: Wire,
    /// Whether TCP (and TLS) setup had succeeded and the first request failed.
    after_handshake: bool,
    /// Which of the failures a user tells apart it was.
    met: Met,
}

/// What a probe met, as the message names it: each has its own advice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Met {
    /// The endpoint's host name did not resolve.
    Dns,
    /// Nothing listens on the port (TCP connection refused).
    Refused,
    /// The TLS handshake failed (a certificate refused either way is told apart by
    /// [`ProbeFailure::refused_certificate`] and [`Wire::ServerCertificateRejected`]).
    Tls,
    /// A connection was made, but broke before anything answered the gRPC call: what
    /// listens there does not speak etcd's gRPC (an HTTP/1 server, another service, etcd's
    /// peer port, or an etcd with TLS spoken to over `http://`).
    NotEtcd,
    /// etcd answered (a learner, an error status), or nothing answered in time.
    Other,
}

impl ProbeFailure {
    fn silent(after: Duration) -> ProbeFailure {
        ProbeFailure {
            text: format!("no answer within {after:?}"),
            cause: Wire::Broken(std::io::ErrorKind::TimedOut),
            after_handshake: false,
            met: Met::Other,
        }
    }

    /// A dial that failed: DNS, TCP or TLS, before any HTTP/2.
    fn dial(error: &tonic::transport::Error, tls: bool) -> ProbeFailure {
        use std::io::ErrorKind as K;
        let cause = wire_cause(error);
        let said = |words: &str| layers(error).iter().any(|layer| layer.to_string() == words);
        let met = if said(HYPER_UTIL_DNS) {
            Met::Dns
        } else if cause == Wire::Broken(K::ConnectionRefused) {
            Met::Refused
        } else if tls && !matches!(cause, Wire::Broken(K::TimedOut)) {
            // The TCP connection was made (or it would have been refused or silent).
            Met::Tls
        } else {
            Met::Other
        };
        ProbeFailure {
            text: innermost(error),
            cause,
            after_handshake: false,
            met,
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

    /// The reason with the advice that fits it, for the probe of `url`.
    fn explain(&self, url: &str) -> String {
        let text = &self.text;
        match (&self.cause, self.met) {
            (Wire::ServerCertificateRejected(why), _) => format!(
                "{text} (etcd's server certificate was not accepted: {why}; give the CA that \
                 signed it with TlsConfig::ca_certificate_pem, and check the endpoint's host \
                 name)"
            ),
            // etcd answered, and what it said is the reason (a learner).
            (Wire::Answered, _) if self.after_handshake => text.clone(),
            (_, Met::Dns) => {
                let host = url.parse::<http::Uri>().ok();
                let host = host.as_ref().and_then(http::Uri::host).unwrap_or(url);
                format!("DNS lookup of {host:?} failed: {text} (check the endpoint's host name)")
            }
            (_, Met::Refused) => format!(
                "connection refused, nothing listens there: {text} (is etcd running and \
                 listening there?)"
            ),
            (_, Met::Tls) => format!(
                "TLS handshake failed: {text} (does etcd serve TLS there? An etcd started \
                 without --cert-file speaks plain http://)"
            ),
            (_, Met::NotEtcd) => format!(
                "the server there does not speak etcd's gRPC: {text} (is this etcd's client \
                 URL? An HTTP/1 server, another service or etcd's peer port answers like \
                 this, and so does an etcd with TLS spoken to over http://)"
            ),
            (_, Met::Other) => format!("{text} (is etcd running and listening there?)"),
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
    let tls = endpoint.uri().scheme_str() == Some("https");
    let channel = dial(endpoint)
        .await
        .map_err(|e| ProbeFailure::dial(&e, tls))?;
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
            met: Met::Other,
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

/// A probe's call after the dial (the TCP and TLS handshakes were done) that failed: etcd
/// answered with an error, or the connection broke under the call (then what listens
/// there is not etcd's gRPC, and the status's code and "transport error" layers say
/// nothing: the innermost cause does).
fn answered_failure(status: &tonic::Status) -> ProbeFailure {
    let cause = wire_cause(status);
    if let Wire::Broken(_) = cause {
        return ProbeFailure {
            text: innermost(status),
            cause,
            after_handshake: true,
            met: Met::NotEtcd,
        };
    }
    let mut text = format!("{:?}: {}", status.code(), status.message());
    if let Some(source) = std::error::Error::source(status) {
        text.push_str(": ");
        text.push_str(&error_chain(source));
    }
    ProbeFailure {
        text,
        cause,
        after_handshake: true,
        met: Met::Other,
    }
}

/// How hyper-util's connector names a failed name lookup (its `ConnectError` type is
/// private; its message is all there is).
const HYPER_UTIL_DNS: &str = "dns error";

/// `error` and every error under it, looking inside `io::Error`s too (their `source()`
/// skips the error they wrap: where tokio-rustls and hyper-util put theirs).
fn layers<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut all = Vec::new();
    let mut next = Some(error);
    while let Some(layer) = next {
        all.push(layer);
        next = match layer
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => layer.source(),
        };
    }
    all
}

/// The innermost cause under `error`, in its own words (`Connection refused (os error
/// 111)`, `tls handshake eof`, `frame with invalid size`): the layers above it only say
/// "transport error" or repeat it.
fn innermost(error: &(dyn std::error::Error + 'static)) -> String {
    let layers = layers(error);
    let text = layers.last().map_or_else(String::new, ToString::to_string);
    // h2 prefixes its reason with where it was detected.
    text.strip_prefix("connection error detected: ")
        .map_or(text.clone(), str::to_string)
}

/// Joins an error and its sources into one line: tonic's transport errors hide the useful
/// part ("Connection refused") in the source chain.
pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
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
