//! TLS for the connections the server opens (to PostgreSQL, to webhooks):
//! the system's trusted certificate authorities, and a client
//! configuration whose crypto provider is chosen here, not process-wide.

use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};

/// The system's trusted certificate authorities; one that cannot be read
/// is left out (and logged at debug level).
pub(crate) fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::debug!(%error, "cannot load a system certificate");
    }
    roots.add_parsable_certificates(native.certs);
    roots
}

/// A client configuration trusting `roots`, without client certificates.
pub(crate) fn client_config(roots: RootCertStore) -> Result<ClientConfig, rustls::Error> {
    Ok(
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}
