//! Connecting: a channel per endpoint, and the probe that proves a real etcd answers on
//! one of them (with credentials, authenticated first).

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};

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
}

/// [`dial`], connecting on first use.
fn dial_lazy(endpoint: &Endpoint) -> Channel {
    if let Some(memory) = super::dial_memory_lazy(endpoint) {
        return memory;
    }
    endpoint.connect_with_connector_lazy(super::coalesce::Connector::new())
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
    let channel = dial(endpoint).await.map_err(|e| ProbeFailure {
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
