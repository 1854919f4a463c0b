//! Connect errors that say which failure it was (issue 51 item 4): a host name that does not
//! resolve, a port nothing listens on, a listener that does not speak etcd's gRPC (an
//! HTTP/1 server, a TCP server that hangs up), and TLS spoken to a plain etcd. Each is one
//! `Error::Connect` whose message names what happened, once, without tonic's layers
//! ("transport error: transport error") or a gRPC code ("Unknown:").

#![cfg(feature = "testing")]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use etcd_sync::{Client, Error};

/// Connects to `endpoint` (with `tls` when given), expecting a connect error; checks what
/// every such error has in common and returns its message.
fn connect_error(endpoint: &str, tls: Option<etcd_sync::TlsConfig>) -> String {
    let mut builder = Client::builder()
        .endpoints([endpoint])
        .connect_timeout(Duration::from_secs(1));
    #[cfg(feature = "tls")]
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    #[cfg(not(feature = "tls"))]
    let _ = tls;
    let error = builder
        .connect()
        .expect_err("nothing that answers etcd's gRPC there");
    assert!(error.is_connect(), "{error:?}");
    assert!(
        !error.is_retryable() && !error.is_invalid_argument(),
        "{error:?}"
    );
    let Error::Connect { endpoints, reason } = &error else {
        panic!("expected Error::Connect, got {error:?}");
    };
    assert_eq!(endpoints, endpoint);
    let text = error.to_string();
    assert_eq!(
        text,
        format!("could not connect to etcd at {endpoint}: {reason}")
    );
    for noise in [
        "transport error",
        "Unknown:",
        "Cancelled:",
        "operation was canceled",
    ] {
        assert!(!text.contains(noise), "{noise:?} in {text}");
    }
    text
}

/// A loopback listener that answers every connection with `answer` (after reading what
/// the client sent first), then hangs up.
fn listener(answer: &'static [u8]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let address = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            if !answer.is_empty() {
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(answer);
            }
        }
    });
    format!("http://{address}")
}

#[test]
fn a_host_name_that_does_not_resolve_is_a_dns_failure() {
    let text = connect_error("http://etcd-sync-test.invalid:2379", None);
    assert!(
        text.contains("DNS lookup of \"etcd-sync-test.invalid\" failed: "),
        "{text}"
    );
    assert!(text.ends_with("(check the endpoint's host name)"), "{text}");
}

#[test]
fn a_port_nothing_listens_on_is_refused() {
    // A port that was free a moment ago.
    let free = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let text = connect_error(&format!("http://{free}"), None);
    assert!(
        text.contains("connection refused, nothing listens there: "),
        "{text}"
    );
    let os = std::io::Error::from_raw_os_error(libc::ECONNREFUSED).to_string();
    assert!(text.contains(&os), "{text} lacks {os}");
    assert!(
        text.ends_with("(is etcd running and listening there?)"),
        "{text}"
    );
}

#[test]
fn an_http1_server_or_a_tcp_server_that_hangs_up_does_not_speak_etcds_grpc() {
    let http1 =
        listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    let hangs_up = listener(b"");
    for endpoint in [http1, hangs_up] {
        let text = connect_error(&endpoint, None);
        assert!(
            text.contains(": the server there does not speak etcd's gRPC: "),
            "{text}"
        );
        assert!(text.contains("(is this etcd's client URL?"), "{text}");
        assert!(!text.contains("is etcd running"), "{text}");
    }
}

#[cfg(feature = "tls")]
#[test]
fn tls_spoken_to_a_plain_etcd_is_a_tls_failure() {
    let plain = common::etcd();
    // Any CA will do: the handshake fails before a certificate is seen.
    let tls_etcd = etcd_sync::testing::EtcdServer::builder()
        .tls()
        .start()
        .expect("start etcd with TLS");
    let certs = tls_etcd.tls_certs().expect("TLS mode");
    let tls = etcd_sync::TlsConfig::from_files(&certs.ca_cert, None).expect("read the CA");
    let https = plain.endpoint().replace("http://", "https://");
    let text = connect_error(&https, Some(tls));
    assert!(text.contains(": TLS handshake failed: "), "{text}");
    assert!(
        text.ends_with(
            "(does etcd serve TLS there? An etcd started without --cert-file speaks plain \
             http://)"
        ),
        "{text}"
    );

    // The other way round: plain HTTP/2 to an etcd that serves TLS only.
    let http = tls_etcd.endpoint().replace("https://", "http://");
    let text = connect_error(&http, None);
    assert!(
        text.contains("does not speak etcd's gRPC") && text.contains("etcd with TLS"),
        "{text}"
    );
}
