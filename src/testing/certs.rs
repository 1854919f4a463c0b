//! Certificates for TLS-mode etcd, generated at test time with rcgen.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::error::context;
use super::scratch::create_private_dir;

/// Certificates generated at test time for a TLS-mode etcd (see
/// [`EtcdServerBuilder::tls`](super::EtcdServerBuilder::tls)): a CA, a server certificate for `127.0.0.1` and
/// `localhost`, a client certificate, and a second, unrelated CA to test rejection. All
/// files are PEM, in the server's temporary directory.
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::{EtcdServer, etcdctl_binary};
///
/// let etcd = EtcdServer::builder().tls().start()?;
/// let Some(certs) = etcd.tls_certs() else { unreachable!("started in TLS mode") };
/// let status = std::process::Command::new(etcdctl_binary()?)
///     .arg("--endpoints").arg(etcd.endpoint())
///     .arg("--cacert").arg(&certs.ca_cert)
///     .arg("--cert").arg(&certs.client_cert)
///     .arg("--key").arg(&certs.client_key)
///     .args(["put", "greeting", "hello"])
///     .status()?;
/// assert!(status.success());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct TlsCerts {
    /// The CA that signed the server and client certificates.
    pub ca_cert: PathBuf,
    /// The server certificate (SANs `127.0.0.1`, `localhost`).
    pub server_cert: PathBuf,
    /// The server's private key.
    pub server_key: PathBuf,
    /// A client certificate signed by the CA (common name `etcd-sync-client`).
    pub client_cert: PathBuf,
    /// The client certificate's private key.
    pub client_key: PathBuf,
    /// A CA that etcd does not trust: trusting only it must fail the handshake.
    pub other_ca_cert: PathBuf,
    /// A client certificate signed by the unrelated CA: etcd must refuse it.
    pub untrusted_client_cert: PathBuf,
    /// The untrusted client certificate's private key.
    pub untrusted_client_key: PathBuf,
}

impl TlsCerts {
    pub(super) fn generate(dir: &Path) -> io::Result<TlsCerts> {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let fail = |e: rcgen::Error| io::Error::other(format!("generating test certificates: {e}"));
        create_private_dir(dir)?;
        let ca = |name: &str| -> io::Result<CertifiedIssuer<'static, KeyPair>> {
            let mut params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(fail)?).map_err(fail)
        };
        let issuer = ca("etcd-sync test CA")?;
        let other = ca("etcd-sync unrelated CA")?;
        let leaf = |names: Vec<String>,
                    cn: &str,
                    usages,
                    signer: &CertifiedIssuer<'static, KeyPair>|
         -> io::Result<(String, String)> {
            let mut params = CertificateParams::new(names).map_err(fail)?;
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = usages;
            let key = KeyPair::generate().map_err(fail)?;
            let cert = params.signed_by(&key, signer).map_err(fail)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let (server_pem, server_key_pem) = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            "etcd-sync test server",
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            &issuer,
        )?;
        let (client_pem, client_key_pem) = leaf(
            Vec::new(),
            "etcd-sync-client",
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            &issuer,
        )?;
        let (untrusted_pem, untrusted_key_pem) = leaf(
            Vec::new(),
            "etcd-sync-untrusted-client",
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            &other,
        )?;
        let write = |name: &str, contents: &str| -> io::Result<PathBuf> {
            let path = dir.join(name);
            fs::write(&path, contents)
                .map_err(|e| context(e, format_args!("cannot write {}", path.display())))?;
            Ok(path)
        };
        Ok(TlsCerts {
            ca_cert: write("ca.pem", &issuer.pem())?,
            server_cert: write("server.pem", &server_pem)?,
            server_key: write("server-key.pem", &server_key_pem)?,
            client_cert: write("client.pem", &client_pem)?,
            client_key: write("client-key.pem", &client_key_pem)?,
            other_ca_cert: write("other-ca.pem", &other.pem())?,
            untrusted_client_cert: write("untrusted-client.pem", &untrusted_pem)?,
            untrusted_client_key: write("untrusted-client-key.pem", &untrusted_key_pem)?,
        })
    }
}
