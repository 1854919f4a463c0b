//! What a failed call's error chain says happened on the wire.
//!
//! tonic reports a broken connection, a TLS alert and etcd's own refusal all as a
//! `Status`; the difference is only visible in the source chain (tonic → hyper → h2 →
//! `io::Error` → rustls). This module walks that chain once, by type where the type is
//! reachable and by `io::ErrorKind` otherwise, so callers decide on a cause, not on text.
//! The one exception is a TLS alert that crossed h2, which keeps only its message.

use std::error::Error as StdError;
use std::io;
use std::sync::Arc;

use crate::support::error::code::Code;
use crate::support::error::{Cause, Error};

/// The cause found in an error chain, most specific first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wire {
    /// The TLS peer refused our client certificate, or the lack of one (etcd with
    /// `--client-cert-auth`): alert `BadCertificate`, `CertificateRequired`, `UnknownCA`...
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    CertificateRefused(String),
    /// We refused the server's certificate (not signed by the CA we were given, wrong name).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    ServerCertificateRejected(String),
    /// The connection broke or could not be made (reset, broken pipe, EOF, refused, an
    /// HTTP/2 connection error): a request in flight may or may not have been applied.
    Broken(io::ErrorKind),
    /// No transport fault in the chain: etcd itself answered.
    Answered,
}

/// TLS alerts with which a server refuses the client's certificate or its absence.
#[cfg(feature = "tls")]
const CERTIFICATE_ALERTS: [rustls::AlertDescription; 8] = {
    use rustls::AlertDescription as A;
    [
        A::BadCertificate,
        A::CertificateRequired,
        A::UnknownCA,
        A::UnsupportedCertificate,
        A::CertificateRevoked,
        A::CertificateExpired,
        A::CertificateUnknown,
        A::AccessDenied,
    ]
};

/// The certificate alert named in a rustls message that h2 turned into text: h2 keeps
/// only the kind and the message of the I/O errors it reports, so once a TLS alert has
/// passed through an HTTP/2 connection, its text is all there is. The names come from
/// rustls itself (`received fatal alert: {alert:?}`), so they cannot drift apart.
#[cfg(feature = "tls")]
fn certificate_alert_in(text: &str) -> Option<rustls::AlertDescription> {
    let named = text.split("received fatal alert: ").nth(1)?;
    let name: String = named
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    CERTIFICATE_ALERTS
        .into_iter()
        .find(|alert| format!("{alert:?}") == name)
}

/// Classifies one error in the chain, or `None` when it says nothing about the wire.
fn classify_one(error: &(dyn StdError + 'static)) -> Option<Wire> {
    #[cfg(feature = "tls")]
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(match tls {
            rustls::Error::AlertReceived(alert) if CERTIFICATE_ALERTS.contains(alert) => {
                Wire::CertificateRefused(format!("TLS alert {alert:?}"))
            }
            rustls::Error::InvalidCertificate(why) => {
                Wire::ServerCertificateRejected(format!("{why:?}"))
            }
            _ => Wire::Broken(io::ErrorKind::InvalidData),
        });
    }
    if let Some(io_error) = error.downcast_ref::<io::Error>() {
        // `io::Error::source` skips the error it wraps: look inside explicitly (that is
        // where tokio-rustls puts the rustls error).
        if let Some(inner) = io_error.get_ref()
            && let Some(found) = classify(inner)
        {
            return Some(found);
        }
        #[cfg(feature = "tls")]
        if let Some(alert) = certificate_alert_in(&io_error.to_string()) {
            return Some(Wire::CertificateRefused(format!("TLS alert {alert:?}")));
        }
        return Some(Wire::Broken(io_error.kind()));
    }
    if let Some(h2_error) = error.downcast_ref::<h2::Error>() {
        // h2 does not chain the I/O error it holds as a source.
        if let Some(io_error) = h2_error.get_io() {
            return classify_one(io_error);
        }
        // A GOAWAY or a reset stream: the connection or the stream ended under us.
        return Some(Wire::Broken(io::ErrorKind::ConnectionReset));
    }
    None
}

/// Layers that exist only when the transport failed; what they wrap may say more.
fn is_transport_layer(error: &(dyn StdError + 'static)) -> bool {
    error.downcast_ref::<tonic::transport::Error>().is_some()
        || error.downcast_ref::<hyper::Error>().is_some()
}

/// Walks `error` and its sources; `None` if no layer is a transport or TLS error.
fn classify(error: &(dyn StdError + 'static)) -> Option<Wire> {
    let (mut transport, mut canceled) = (false, false);
    let mut next = Some(error);
    while let Some(layer) = next {
        if let Some(found) = classify_one(layer) {
            return Some(found);
        }
        transport |= is_transport_layer(layer);
        // hyper dropped the request unsent because its connection closed first (a server
        // that refuses our client certificate by closing right after the handshake, met
        // before our first write); its cause, "connection closed", is only text.
        canceled |= layer
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled);
        next = layer.source();
    }
    if canceled {
        return Some(Wire::Broken(io::ErrorKind::ConnectionAborted));
    }
    transport.then_some(Wire::Broken(io::ErrorKind::Other))
}

/// What the chain behind a failed call says happened.
pub(crate) fn wire_cause(error: &(dyn StdError + 'static)) -> Wire {
    classify(error).unwrap_or(Wire::Answered)
}

/// Maps a gRPC status from etcd, received from `endpoint`, to an error a caller can act on.
pub(crate) fn status_error(status: &tonic::Status, endpoint: &str) -> Error {
    let message = status.message().to_string();
    // A broken connection reaches us as Unknown/Cancelled/Internal with a transport error
    // behind it: it is the wire failing, not etcd answering, so it is transient (and a
    // write in flight may or may not have been applied).
    if let Wire::Broken(kind) = wire_cause(status) {
        return Error::Unavailable {
            endpoint: Some(endpoint.to_string()),
            reason: broken_reason(status, kind),
            source: Some(Arc::new(Below(status.clone()))),
        };
    }
    match status.code() {
        // A refusal before handling (a learner, a member without a leader) whatever its
        // code: etcd 3.7 answers a learner with FailedPrecondition, earlier releases with
        // Unavailable. Either way another member may take the call.
        _ if crate::support::etcd_text::is_refused_unhandled(&message) => Error::Unavailable {
            endpoint: Some(endpoint.to_string()),
            reason: message,
            source: None,
        },
        tonic::Code::Unavailable => Error::Unavailable {
            endpoint: Some(endpoint.to_string()),
            reason: if message.is_empty() {
                "connection to etcd failed".to_string()
            } else {
                message
            },
            source: status
                .source()
                .is_some()
                .then(|| Arc::new(Below(status.clone())) as Cause),
        },
        code => Error::Server {
            code: code_of(code),
            message,
        },
    }
}

/// One line for a broken connection: the transport's words, then the innermost cause
/// (the OS error, e.g. `Connection refused (os error 111)`), so the message alone says
/// what to check.
fn broken_reason(status: &tonic::Status, kind: io::ErrorKind) -> String {
    let mut innermost = None;
    let mut next = status.source();
    while let Some(layer) = next {
        innermost = Some(layer.to_string());
        next = match layer
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => layer.source(),
        };
    }
    let message = status.message();
    match innermost {
        Some(cause) if !message.contains(&cause) => format!("{message}: {cause}"),
        _ => format!("connection broke: {message} ({kind})"),
    }
}

/// The error chain under a failed call's status, without the status's own wrapping (its
/// `Display` is a debug dump; its message and code are already in our error).
#[derive(Debug)]
struct Below(tonic::Status);

impl std::fmt::Display for Below {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.message())
    }
}

impl StdError for Below {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

/// Our copy of a gRPC status code (tonic's type stays out of the public API).
fn code_of(code: tonic::Code) -> Code {
    use tonic::Code as T;
    match code {
        T::Ok => Code::Ok,
        T::Cancelled => Code::Cancelled,
        T::Unknown => Code::Unknown,
        T::InvalidArgument => Code::InvalidArgument,
        T::DeadlineExceeded => Code::DeadlineExceeded,
        T::NotFound => Code::NotFound,
        T::AlreadyExists => Code::AlreadyExists,
        T::PermissionDenied => Code::PermissionDenied,
        T::ResourceExhausted => Code::ResourceExhausted,
        T::FailedPrecondition => Code::FailedPrecondition,
        T::Aborted => Code::Aborted,
        T::OutOfRange => Code::OutOfRange,
        T::Unimplemented => Code::Unimplemented,
        T::Internal => Code::Internal,
        T::Unavailable => Code::Unavailable,
        T::DataLoss => Code::DataLoss,
        T::Unauthenticated => Code::Unauthenticated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer that only points at its source, as hyper's and tonic's errors do.
    #[derive(Debug)]
    struct Layer(Box<dyn StdError + Send + Sync + 'static>);
    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("transport error")
        }
    }
    impl StdError for Layer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.0)
        }
    }

    #[test]
    fn broken_pipe_after_the_handshake_is_a_broken_connection() {
        // etcd 3.4 with TLS 1.3: the server checks the certificate after our handshake
        // finished, closes, and our first write fails (what h2 reports, inside hyper).
        let chain = Layer(Box::new(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "stream closed because of a broken pipe",
        )));
        assert_eq!(wire_cause(&chain), Wire::Broken(io::ErrorKind::BrokenPipe));
    }

    #[test]
    fn a_killed_member_is_a_broken_connection() {
        // What tonic reports when a stream dies under us: Unknown, with h2's error behind
        // it. (h2's I/O variant cannot be built outside h2; the faults suite kills a real
        // member for it.)
        let h2_error = h2::Error::from(h2::Reason::CANCEL);
        let status = tonic::Status::from_error(Box::new(h2_error));
        assert_eq!(
            wire_cause(&status),
            Wire::Broken(io::ErrorKind::ConnectionReset)
        );
        let error = status_error(&status, "http://127.0.0.1:2379");
        assert!(error.is_transient(), "{error:?}");
        assert_eq!(error.endpoint(), Some("http://127.0.0.1:2379"));
    }

    #[test]
    fn a_refused_connection_names_the_endpoint_and_the_os_error() {
        // What tonic reports for a connect to a closed port: "tcp connect error" with the
        // socket's io::Error (and its OS error) at the bottom of the chain.
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        let os_text = refused.to_string();
        let mut status = tonic::Status::unavailable("tcp connect error");
        status.set_source(Arc::new(Layer(Box::new(refused))));
        let error = status_error(&status, "http://127.0.0.1:1");
        let text = error.to_string();
        assert!(text.contains("at http://127.0.0.1:1"), "{text}");
        assert!(text.contains("tcp connect error"), "{text}");
        assert!(text.contains(&os_text), "{text}");
        assert!(error.is_retryable() && !error.is_connect(), "{error:?}");
        // The chain under the error ends at the io::Error itself, for callers that walk it.
        let mut chain = Vec::new();
        let mut next = StdError::source(&error);
        while let Some(layer) = next {
            chain.push(layer.to_string());
            next = layer.source();
        }
        assert_eq!(chain.first().map(String::as_str), Some("tcp connect error"));
        assert_eq!(chain.last(), Some(&os_text), "{chain:?}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn certificate_alerts_are_refusals() {
        for alert in [
            rustls::AlertDescription::BadCertificate,
            rustls::AlertDescription::CertificateRequired,
            rustls::AlertDescription::UnknownCA,
        ] {
            // tokio-rustls wraps the rustls error in an io::Error of kind InvalidData.
            let chain = Layer(Box::new(io::Error::new(
                io::ErrorKind::InvalidData,
                rustls::Error::AlertReceived(alert),
            )));
            assert!(
                matches!(wire_cause(&chain), Wire::CertificateRefused(_)),
                "{alert:?}"
            );
        }
        // The same alert after h2 turned it into text (the TLS 1.3 path: the alert is read
        // on the HTTP/2 connection after the handshake).
        let text = Layer(Box::new(io::Error::new(
            io::ErrorKind::InvalidData,
            "received fatal alert: BadCertificate",
        )));
        assert!(matches!(wire_cause(&text), Wire::CertificateRefused(_)));
        let other = Layer(Box::new(io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure),
        )));
        assert_eq!(wire_cause(&other), Wire::Broken(io::ErrorKind::InvalidData));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn untrusted_server_certificate_is_ours_to_fix() {
        let chain = Layer(Box::new(io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        )));
        assert!(matches!(
            wire_cause(&chain),
            Wire::ServerCertificateRejected(_)
        ));
    }

    #[test]
    fn a_plain_status_is_an_answer() {
        let status = tonic::Status::failed_precondition("etcdserver: requested lease not found");
        assert_eq!(wire_cause(&status), Wire::Answered);
    }
}
