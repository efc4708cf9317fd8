//! TLS to the database.
//!
//! A connection is encrypted when the URL says `sslmode=require` or a CA
//! file is given, and then the server's certificate is always verified:
//! against the system's trusted roots and the CA file, with the host name
//! checked. (libpq's `require` encrypts without verifying; that protects
//! against eavesdroppers but not against an impostor, which is not good
//! enough for billing data.) Without either, connections are plain, as
//! with `sslmode=disable`: `prefer`, the default, does not try TLS.

use std::path::{Path, PathBuf};

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::StoreError;

/// How connections to the database are secured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PostgresTls {
    /// PEM file of certificate authorities to trust besides the system's;
    /// giving one turns TLS on.
    pub ca_file: Option<PathBuf>,
}

/// The TLS connector to use with `config`, or `None` for plain connections.
pub(super) fn connector(
    config: &tokio_postgres::Config,
    tls: &PostgresTls,
) -> Result<Option<MakeRustlsConnect>, StoreError> {
    let wanted = config.get_ssl_mode() == SslMode::Require || tls.ca_file.is_some();
    if !wanted {
        return Ok(None);
    }
    if config.get_ssl_mode() == SslMode::Disable {
        return Err(StoreError::internal(
            "configure TLS to PostgreSQL",
            "a CA file is given but the URL says sslmode=disable",
        ));
    }
    let mut roots = crate::client_tls::system_roots();
    if let Some(path) = &tls.ca_file {
        for cert in read_pem(path)? {
            roots.add(cert).map_err(|e| {
                StoreError::internal(
                    "configure TLS to PostgreSQL",
                    format!("{}: not a usable CA certificate: {e}", path.display()),
                )
            })?;
        }
    }
    if roots.is_empty() {
        return Err(StoreError::internal(
            "configure TLS to PostgreSQL",
            "no trusted certificate authorities: the system has none; give a CA file",
        ));
    }
    let config = crate::client_tls::client_config(roots)
        .map_err(|e| StoreError::internal("configure TLS to PostgreSQL", e))?;
    Ok(Some(MakeRustlsConnect::new(config)))
}

fn read_pem(path: &Path) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            StoreError::internal(
                "configure TLS to PostgreSQL",
                format!("read the CA file {}: {e}", path.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(StoreError::internal(
            "configure TLS to PostgreSQL",
            format!("the CA file {} holds no PEM certificate", path.display()),
        ));
    }
    Ok(certs)
}
