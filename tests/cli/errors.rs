//! Errors that point at the fix (issue 51 item 4): connection and TLS errors name this
//! tool's flags (`--cacert`, `--user`), not the library's API, and say each part once.

use etcd_sync::testing::EtcdServer;

use crate::WAIT;
use crate::common::etcd;
use crate::proc::{Proc, etcd_sync_bare};

/// Runs `etcd-sync ARGS`; its exit code and stderr, checked for the library's names.
fn run(args: &[&str]) -> (i32, String) {
    let mut p = Proc::spawn(etcd_sync_bare(args));
    let code = p.code(WAIT);
    let stderr = p.stderr();
    for library in [
        "ClientBuilder::",
        "TlsConfig::",
        "transport error: transport error",
    ] {
        assert!(!stderr.contains(library), "{args:?}: {stderr}");
    }
    (code, stderr)
}

#[test]
fn tls_and_auth_errors_name_the_flags() {
    let plain = etcd();
    let address = plain.endpoint().replace("http://", "");
    let https = format!("https://{address}");
    let (code, stderr) = run(&["--endpoints", &https, "status", "x"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("pass --cacert FILE"), "{stderr}");

    let (code, stderr) = run(&["--cacert", "/nonexistent/ca.pem", "status", "x"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("cannot read --cacert /nonexistent/ca.pem"),
        "{stderr}"
    );

    let tls = EtcdServer::builder()
        .tls()
        .start()
        .expect("start etcd with TLS");
    let certs = tls.tls_certs().expect("TLS mode").clone();
    let ca = certs.ca_cert.display().to_string();
    let (code, stderr) = run(&[
        "--endpoints",
        &plain.endpoint(),
        "--cacert",
        &ca,
        "status",
        "x",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--cacert turns on TLS"), "{stderr}");

    // A plain etcd spoken to with TLS: a connect error, in one piece.
    let (code, stderr) = run(&[
        "--endpoints",
        &address,
        "--cacert",
        &ca,
        "--dial-timeout",
        "1s",
        "status",
        "x",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("TLS handshake failed"), "{stderr}");
    assert!(stderr.contains("drop --cacert"), "{stderr}");

    // A CA that did not sign etcd's certificate.
    let client = certs.client_cert.display().to_string();
    let key = certs.client_key.display().to_string();
    let (code, stderr) = run(&[
        "--endpoints",
        &tls.endpoint(),
        "--cacert",
        "/etc/ssl/certs/ca-certificates.crt",
        "--cert",
        &client,
        "--key",
        &key,
        "--dial-timeout",
        "2s",
        "status",
        "x",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("with --cacert FILE"), "{stderr}");

    // Auth on, no --user.
    plain.enable_auth().expect("enable auth");
    let (code, stderr) = run(&["--endpoints", &plain.endpoint(), "status", "x"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("--user NAME"), "{stderr}");
}
