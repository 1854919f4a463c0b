//! TLS settings for `https://` endpoints (cargo feature `tls`): rustls, no OpenSSL.

use std::path::Path;

use crate::support::error::{Error, Result};

/// How to reach etcd over TLS: the CA that signed etcd's certificate, and optionally a
/// client certificate and key (for etcd's `--client-cert-auth`).
///
/// # Example
///
/// ```no_run
/// use etcd_sync::{Client, TlsConfig};
/// # fn main() -> etcd_sync::Result<()> {
/// let tls = TlsConfig::from_files("ca.pem", Some(("client.pem", "client-key.pem")))?;
/// let client = Client::builder()
///     .endpoints(["https://10.0.0.1:2379"])
///     .tls(tls)
///     .connect()?;
/// # let _ = client;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct TlsConfig {
    pub(crate) ca_pem: Option<Vec<u8>>,
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) domain_name: Option<String>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity.is_some()) // never the key
            .field("domain_name", &self.domain_name)
            .finish()
    }
}

/// Reads a PEM file, naming it in the error.
fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::InvalidArgument(format!("cannot read {what} {}: {e}", path.display())))
}

impl TlsConfig {
    /// Empty settings; a CA certificate is required before connecting.
    ///
    /// ```
    /// let tls = etcd_sync::TlsConfig::new().ca_certificate_pem("-----BEGIN CERTIFICATE-----...");
    /// # let _ = tls;
    /// ```
    pub fn new() -> TlsConfig {
        TlsConfig::default()
    }

    /// Reads the CA certificate and, optionally, a client certificate and key (PEM files,
    /// `(certificate, key)`). For paths that are not `&str`, use
    /// [`client_identity_files`](TlsConfig::client_identity_files).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming the file that cannot be read.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// use etcd_sync::TlsConfig;
    /// let server_only = TlsConfig::from_files("/etc/etcd/ca.pem", None)?;
    /// let mutual = TlsConfig::from_files("ca.pem", Some(("client.pem", "client-key.pem")))?;
    /// # let _ = (server_only, mutual);
    /// # Ok(()) }
    /// ```
    pub fn from_files(ca: impl AsRef<Path>, client: Option<(&str, &str)>) -> Result<TlsConfig> {
        let config = TlsConfig::new().ca_certificate_pem(read(ca.as_ref(), "CA certificate")?);
        match client {
            Some((cert, key)) => config.client_identity_files(cert, key),
            None => Ok(config),
        }
    }

    /// Reads a client certificate and its key (PEM files) for etcd's `--client-cert-auth`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming the file that cannot be read.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let dir = std::path::PathBuf::from("/etc/etcd");
    /// let tls = etcd_sync::TlsConfig::from_files(dir.join("ca.pem"), None)?
    ///     .client_identity_files(dir.join("client.pem"), dir.join("client-key.pem"))?;
    /// # let _ = tls;
    /// # Ok(()) }
    /// ```
    pub fn client_identity_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<TlsConfig> {
        Ok(self.client_identity_pem(
            read(cert.as_ref(), "client certificate")?,
            read(key.as_ref(), "client key")?,
        ))
    }

    /// Trusts this CA (PEM) for etcd's server certificate.
    ///
    /// ```
    /// let tls = etcd_sync::TlsConfig::new().ca_certificate_pem(std::fs::read("ca.pem").unwrap_or_default());
    /// # let _ = tls;
    /// ```
    pub fn ca_certificate_pem(mut self, pem: impl Into<Vec<u8>>) -> TlsConfig {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Presents this client certificate and key (PEM) to etcd (mutual TLS).
    ///
    /// ```
    /// let tls = etcd_sync::TlsConfig::new().client_identity_pem(b"cert".to_vec(), b"key".to_vec());
    /// # let _ = tls;
    /// ```
    pub fn client_identity_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> TlsConfig {
        self.identity = Some((cert.into(), key.into()));
        self
    }

    /// Checks etcd's certificate against this name instead of the endpoint's host.
    ///
    /// ```
    /// let tls = etcd_sync::TlsConfig::new().domain_name("etcd.internal");
    /// # let _ = tls;
    /// ```
    pub fn domain_name(mut self, name: impl Into<String>) -> TlsConfig {
        self.domain_name = Some(name.into());
        self
    }
}
