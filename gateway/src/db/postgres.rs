//! Connecting to PostgreSQL as libpq would from the same URL: `sslmode` and its certificates
//! honoured over rustls (ring), the rest of the URL read by the `postgres` crate.
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default) | when the server offers it | as `require` |
//! | `require` | always | not checked, unless `sslrootcert` is given: then as `verify-ca` |
//! | `verify-ca` | always | signed by the system's roots or `sslrootcert`'s |
//! | `verify-full` | always | as `verify-ca`, and issued for the host connected to |
//!
//! `sslcert` and `sslkey` (PEM files) are presented when the server asks for a client
//! certificate. Any other `ssl…` parameter of libpq is refused by name.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error as TlsError, SignatureScheme};

use super::DbError;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<SslMode, DbError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // libpq's `allow` tries plain first: a downgrade no one should choose.
            other => {
                return Err(DbError(format!(
                    "sslmode `{other}`: give disable, prefer (the default), require, verify-ca or \
                     verify-full"
                )))
            }
        })
    }
}

/// A PostgreSQL URL with its TLS parameters taken out.
#[derive(Debug, Clone, PartialEq)]
pub struct PgUrl {
    /// The URL without `sslmode`, `sslrootcert`, `sslcert` and `sslkey`.
    pub rest: String,
    pub mode: SslMode,
    pub root_cert: Option<PathBuf>,
    /// The client certificate and its key.
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl PgUrl {
    pub fn parse(url: &str) -> Result<PgUrl, DbError> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        let (mut mode, mut root_cert, mut cert, mut key) = (None, None, None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let value = || percent_decode(v);
            match k {
                "sslmode" => mode = Some(SslMode::parse(&value()?)?),
                "sslrootcert" => root_cert = Some(PathBuf::from(value()?)),
                "sslcert" => cert = Some(PathBuf::from(value()?)),
                "sslkey" => key = Some(PathBuf::from(value()?)),
                k if k.starts_with("ssl") => {
                    return Err(DbError(format!(
                        "`{k}` in the PostgreSQL URL is not supported (sslmode, sslrootcert, \
                         sslcert and sslkey are)"
                    )))
                }
                _ => kept.push(pair),
            }
        }
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(DbError(
                    "sslcert and sslkey go together: the client certificate and its key".into(),
                ))
            }
        };
        let mode = mode.unwrap_or(SslMode::Prefer);
        if mode == SslMode::Disable && (root_cert.is_some() || identity.is_some()) {
            return Err(DbError(
                "sslmode=disable with sslrootcert / sslcert: certificates need TLS".into(),
            ));
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok(PgUrl {
            rest,
            mode,
            root_cert,
            identity,
        })
    }
}

fn percent_decode(s: &str) -> Result<String, DbError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| DbError(format!("`{s}`: a bad %-escape in the PostgreSQL URL")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| DbError(format!("`{s}`: not UTF-8 once decoded")))
}

/// A client connected to the PostgreSQL server at `url` (see the module's table for `sslmode`).
pub fn connect(url: &str) -> Result<postgres::Client, DbError> {
    let u = PgUrl::parse(url)?;
    let mut config: postgres::Config = u
        .rest
        .parse()
        .map_err(|e| DbError(format!("the PostgreSQL URL: {e}")))?;
    // With its causes: "error performing TLS handshake" alone does not say what to fix.
    let failed = |e: postgres::Error| {
        DbError(format!(
            "connecting to PostgreSQL: {}",
            crate::error::with_causes(&e)
        ))
    };
    if u.mode == SslMode::Disable {
        config.ssl_mode(postgres::config::SslMode::Disable);
        return config.connect(postgres::NoTls).map_err(failed);
    }
    config.ssl_mode(if u.mode == SslMode::Prefer {
        postgres::config::SslMode::Prefer
    } else {
        postgres::config::SslMode::Require
    });
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(client_config(&u)?);
    config.connect(tls).map_err(failed)
}

/// The TLS settings `u` asks for.
fn client_config(u: &PgUrl) -> Result<rustls::ClientConfig, DbError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(crate::http::client::system_roots().iter().cloned());
    if let Some(path) = &u.root_cert {
        for cert in crate::http::client::read_ca_file(path)
            .map_err(|e| DbError(format!("sslrootcert {}", crate::error::with_causes(&e))))?
        {
            roots
                .add(cert)
                .map_err(|e| DbError(format!("sslrootcert {}: {e}", path.display())))?;
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| DbError(e.to_string()))?;
    let check = match (u.mode, &u.root_cert) {
        (SslMode::VerifyFull, _) => Check::Full,
        (SslMode::VerifyCa, _) | (SslMode::Require | SslMode::Prefer, Some(_)) => Check::Chain,
        _ => Check::None,
    };
    let builder = if check == Check::Full {
        builder.with_root_certificates(roots)
    } else {
        let chain = match check {
            Check::Chain => Some(
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| DbError(format!("the TLS roots: {e}")))?,
            ),
            _ => None,
        };
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Verifier { chain, provider }))
    };
    match &u.identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            use rustls::pki_types::pem::PemObject;
            let chain = crate::http::client::read_ca_file(cert)
                .map_err(|e| DbError(format!("sslcert {}", crate::error::with_causes(&e))))?;
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key)
                .map_err(|e| DbError(format!("sslkey {}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| DbError(format!("sslcert {}: {e}", cert.display())))
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Encrypted only (libpq's `require` without a root certificate).
    None,
    /// The chain to a trusted root, whatever name it was issued for (`verify-ca`).
    Chain,
    /// The chain and the host name (`verify-full`: rustls' own verifier).
    Full,
}

/// The server-certificate check of `require` and `verify-ca`: the chain (when `chain` is set)
/// but not the name. The handshake's signatures are always verified, so the session is with
/// whoever holds the certificate's key.
#[derive(Debug)]
struct Verifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(TlsError::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_the_url_and_checked() {
        let u = PgUrl::parse(
            "postgres://u@db:5432/x?connect_timeout=5&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(u.rest, "postgres://u@db:5432/x?connect_timeout=5");
        assert_eq!(u.mode, SslMode::VerifyFull);
        assert_eq!(u.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        let u = PgUrl::parse("postgresql://u@db/x").unwrap();
        assert_eq!(
            (u.mode, u.rest.as_str()),
            (SslMode::Prefer, "postgresql://u@db/x")
        );
        let err = |url: &str| PgUrl::parse(url).unwrap_err().to_string();
        assert!(err("postgres://db/x?sslmode=allow").contains("verify-full"));
        assert!(err("postgres://db/x?sslcrl=/x").contains("`sslcrl`"));
        assert!(err("postgres://db/x?sslcert=/c.pem").contains("go together"));
        assert!(err("postgres://db/x?sslmode=disable&sslrootcert=/ca.pem").contains("need TLS"));
        assert!(err("postgres://db/x?sslrootcert=%2").contains("%-escape"));
    }

    #[test]
    fn a_missing_root_certificate_is_named() {
        let u =
            PgUrl::parse("postgres://db/x?sslmode=verify-ca&sslrootcert=/no/such/ca.pem").unwrap();
        let e = client_config(&u).unwrap_err().to_string();
        assert!(
            e.contains("sslrootcert") && e.contains("/no/such/ca.pem"),
            "{e}"
        );
    }
}
