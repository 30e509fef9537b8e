//! TLS termination: a certificate chain and its private key, read from PEM files,
//! become the rustls configuration a [`Listener`](crate::Listener) serves with.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Which of the two files a [`TlsError`] is about, so a caller can name the flag
/// that points at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFile {
    /// The certificate chain.
    Certificate,
    /// The private key.
    Key,
}

/// Why the certificate and key do not make a TLS configuration. Each message
/// starts with the path of the file at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The certificate file cannot be read or is not PEM.
    #[error("{}: {source}", path.display())]
    Certificate {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{}: no certificate in the file", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file cannot be read or holds no private key.
    #[error("{}: {source}", path.display())]
    Key {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: pem::Error,
    },
    /// rustls refused the pair (the key does not match the certificate, say).
    #[error("{}: {source}", path.display())]
    Refused {
        /// The key file.
        path: PathBuf,
        /// Why.
        #[source]
        source: tokio_rustls::rustls::Error,
    },
}

impl TlsError {
    /// The file at fault.
    pub fn file(&self) -> TlsFile {
        match self {
            Self::Certificate { .. } | Self::NoCertificate { .. } => TlsFile::Certificate,
            Self::Key { .. } | Self::Refused { .. } => TlsFile::Key,
        }
    }
}

/// The server configuration for the chain in `certificate` and the key in `key`
/// (PEM): rustls with the ring provider, its safe default protocol versions, no
/// client authentication, and ALPN offering HTTP/2 then HTTP/1.1. Read once at
/// startup, so a missing or mismatched file stops the start instead of failing
/// every handshake.
pub fn server_config(certificate: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = CertificateDer::pem_file_iter(certificate)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Certificate {
            path: certificate.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: certificate.to_owned(),
        });
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Key {
        path: key.to_owned(),
        source,
    })?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|builder| {
            builder
                .with_no_client_auth()
                .with_single_cert(chain, private)
        })
        .map_err(|source| TlsError::Refused {
            path: key.to_owned(),
            source,
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
