//! Certificates for tests of TLS: a test CA, a server certificate for
//! `127.0.0.1` and `localhost`, and a client certificate, all made fresh.

/// PEM texts of a test CA and the certificates it signed.
#[derive(Clone)]
pub struct TestPki {
    /// The CA's certificate.
    pub ca_pem: String,
    /// The CA's private key, to sign more certificates
    /// ([`TestPki::client_with_uris`]).
    ca_key_pem: String,
    ca_params: rcgen::CertificateParams,
    /// A server certificate for `127.0.0.1` and `localhost`.
    pub server_cert_pem: String,
    /// The server certificate's private key.
    pub server_key_pem: String,
    /// A client certificate (for mutual TLS).
    pub client_cert_pem: String,
    /// The client certificate's private key.
    pub client_key_pem: String,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki").finish_non_exhaustive()
    }
}

impl TestPki {
    /// A new CA and certificates.
    pub fn generate() -> Result<TestPki, rcgen::Error> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "tollgate test CA");
        let ca_key = KeyPair::generate()?;
        let ca_key_pem = ca_key.serialize_pem();
        let ca_cert = ca.self_signed(&ca_key)?;
        let ca_params = ca.clone();
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |names: Vec<String>| -> Result<(String, String), rcgen::Error> {
            let key = KeyPair::generate()?;
            let cert = CertificateParams::new(names)?.signed_by(&key, &issuer)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let (server_cert_pem, server_key_pem) =
            leaf(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
        let (client_cert_pem, client_key_pem) = leaf(vec!["pod.tollgate.test".to_owned()])?;
        Ok(TestPki {
            ca_pem: ca_cert.pem(),
            ca_key_pem,
            ca_params,
            server_cert_pem,
            server_key_pem,
            client_cert_pem,
            client_key_pem,
        })
    }

    /// A client certificate (and its key, PEM) signed by this CA, naming
    /// `uris` as URI subject alternative names (`tollgate://tenant/acme`).
    pub fn client_with_uris(&self, uris: &[&str]) -> Result<(String, String), rcgen::Error> {
        use rcgen::{CertificateParams, Issuer, KeyPair, SanType};
        let issuer = Issuer::new(self.ca_params.clone(), KeyPair::from_pem(&self.ca_key_pem)?);
        let mut params = CertificateParams::new(vec!["pod.tollgate.test".to_owned()])?;
        for uri in uris {
            params
                .subject_alt_names
                .push(SanType::URI((*uri).try_into()?));
        }
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}
