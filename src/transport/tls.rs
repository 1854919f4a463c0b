//! Our TLS settings as tonic's: the only place that knows tonic's TLS types.

use crate::support::error::{Error, Result};
use crate::support::tls::TlsConfig;

pub(crate) fn client_tls(tls: &TlsConfig) -> Result<tonic::transport::ClientTlsConfig> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let Some(ca) = &tls.ca_pem else {
        return Err(Error::InvalidArgument(
            "TLS needs the CA certificate that signed etcd's certificate \
             (TlsConfig::ca_certificate_pem or from_files)"
                .into(),
        ));
    };
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(Identity::from_pem(cert, key));
    }
    if let Some(name) = &tls.domain_name {
        config = config.domain_name(name.clone());
    }
    Ok(config)
}
