//! TLS with rustls (ring): certificate and key from PEM files, ALPN `h2` then `http/1.1`, and the
//! certificate reloaded without a restart when its files change or on SIGHUP. A reload that fails
//! (unreadable or mismatched files) keeps serving the previous certificate and logs why.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error(transparent)]
    Pem(#[from] crate::http::client::PemError),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a certificate chain and its private key.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let file_err = |path: &Path, msg: String| TlsError::File {
        path: path.into(),
        msg,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_err(cert, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(file_err(cert, "no CERTIFICATE in the file".into()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| file_err(key, e.to_string()))?;
    let ck = CertifiedKey::from_der(chain, key_der, &provider())?;
    Ok(ck)
}

/// Serves the current certificate; `reload` swaps it.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, Option<SystemTime>)>,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl ReloadingCert {
    pub fn new(cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        let ck = load_certified_key(cert, key)?;
        let stamp = mtime(cert).max(mtime(key));
        Ok(Arc::new(ReloadingCert {
            cert: cert.into(),
            key: key.into(),
            current: RwLock::new((Arc::new(ck), stamp)),
        }))
    }

    /// Reloads if the files changed since the last load (or always, when `force`).
    pub fn reload(&self, force: bool) {
        let stamp = mtime(&self.cert).max(mtime(&self.key));
        if !force && stamp == self.current.read().expect("cert lock").1 {
            return;
        }
        match load_certified_key(&self.cert, &self.key) {
            Ok(ck) => {
                *self.current.write().expect("cert lock") = (Arc::new(ck), stamp);
                tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => {
                tracing::warn!(error = %e, "TLS certificate reload failed; keeping the previous one")
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("cert lock").0.clone())
    }
}

/// A server config over a reloading certificate, offering HTTP/2 and HTTP/1.1.
pub fn server_config(cert: Arc<ReloadingCert>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    server_config_with_clients(cert, None)
}

/// As [`server_config`], and with `client_ca` (PEM) every client must present a certificate
/// that CA signed (mutual TLS): a handshake without one fails.
pub fn server_config_with_clients(
    cert: Arc<ReloadingCert>,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in crate::http::client::read_ca_file(path)? {
                roots.add(c)?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .map_err(|e| TlsError::File {
                path: path.into(),
                msg: format!("client CA: {e}"),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder.with_cert_resolver(cert);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
