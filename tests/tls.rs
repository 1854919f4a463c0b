//! TLS against a real etcd serving https with client-certificate auth, using certificates
//! generated at test time: a good mutual-TLS handshake, a wrong CA, and a missing client
//! certificate, each a clear error.
#![cfg(all(feature = "tls", feature = "testing"))]

use std::time::Duration;

use etcd_sync::testing::EtcdServer;
use etcd_sync::{Client, Error, TlsConfig};

fn tls_server() -> EtcdServer {
    EtcdServer::builder()
        .tls()
        .start()
        .expect("start etcd with TLS")
}

fn connect(server: &EtcdServer, tls: TlsConfig) -> etcd_sync::Result<Client> {
    Client::builder()
        .endpoints(server.endpoints())
        .connect_timeout(Duration::from_secs(2))
        .tls(tls)
        .connect()
}

#[test]
fn mutual_tls_works_end_to_end() {
    let server = tls_server();
    assert!(server.endpoint().starts_with("https://"));
    let certs = server.tls_certs().unwrap();
    let tls = TlsConfig::from_files(&certs.ca_cert, None)
        .and_then(|t| t.client_identity_files(&certs.client_cert, &certs.client_key))
        .unwrap();
    let c = connect(&server, tls).unwrap();
    let s = c.session().unwrap();
    let g = s.mutex("tls-lock").unwrap().lock().unwrap();
    g.put("tls-data", "over tls").unwrap();
    drop(g);
    assert_eq!(c.get("tls-data").unwrap().unwrap().value, b"over tls");
    // Host:port endpoints are read as https:// when TLS is configured.
    let hostport = server.endpoint().trim_start_matches("https://").to_string();
    let tls = TlsConfig::from_files(&certs.ca_cert, None)
        .and_then(|t| t.client_identity_files(&certs.client_cert, &certs.client_key))
        .unwrap();
    assert!(
        Client::builder()
            .endpoints([hostport])
            .tls(tls)
            .connect()
            .is_ok()
    );
}

#[test]
fn wrong_ca_is_a_clear_connect_error() {
    let server = tls_server();
    let certs = server.tls_certs().unwrap();
    let tls = TlsConfig::from_files(&certs.other_ca_cert, None)
        .and_then(|t| t.client_identity_files(&certs.client_cert, &certs.client_key))
        .unwrap();
    match connect(&server, tls) {
        Err(Error::Connect { reason, .. }) => {
            assert!(
                reason.contains("server certificate was not accepted"),
                "{reason}"
            );
            assert!(reason.contains("UnknownIssuer"), "{reason}");
            assert!(!reason.contains("is etcd running"), "{reason}");
        }
        other => panic!("expected a Connect error, got {other:?}"),
    }
}

#[test]
fn missing_client_certificate_is_a_clear_connect_error() {
    let server = tls_server();
    let certs = server.tls_certs().unwrap();
    // etcd refuses either with a certificate alert or by closing the connection right
    // after the handshake (timing and TLS version decide); both are this one error.
    for _ in 0..5 {
        let tls = TlsConfig::from_files(&certs.ca_cert, None).unwrap();
        match connect(&server, tls) {
            Err(e @ Error::ClientCertificateRejected { .. }) => {
                let text = e.to_string();
                assert!(text.contains("TlsConfig::client_identity_pem"), "{text}");
                assert!(!text.contains("is etcd running"), "{text}");
            }
            other => panic!("expected ClientCertificateRejected, got {other:?}"),
        }
    }
}

#[test]
fn untrusted_client_certificate_is_the_same_error() {
    let server = tls_server();
    let certs = server.tls_certs().unwrap();
    // A client certificate that etcd's CA did not sign.
    let tls = TlsConfig::from_files(&certs.ca_cert, None)
        .and_then(|t| {
            t.client_identity_files(&certs.untrusted_client_cert, &certs.untrusted_client_key)
        })
        .unwrap();
    match connect(&server, tls) {
        Err(Error::ClientCertificateRejected { .. }) => {}
        other => panic!("expected ClientCertificateRejected, got {other:?}"),
    }
}

#[test]
fn tls_settings_are_checked() {
    let server = tls_server();
    // https endpoints without TLS settings, and TLS settings without a CA.
    assert!(matches!(
        Client::connect(server.endpoints()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        connect(&server, TlsConfig::new()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        TlsConfig::from_files("/nonexistent/ca.pem", None),
        Err(Error::InvalidArgument(_))
    ));
}
