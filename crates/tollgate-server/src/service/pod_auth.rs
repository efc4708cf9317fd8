//! Who may act for which tenant on the pod-facing services.
//!
//! A pod's calls take its tenant's tokens and add to its tenant's bill, so
//! a server reachable by more than one tenant's pods must know which
//! tenant a caller is. Two kinds of credential bind a caller to tenants:
//!
//! - **Pod tokens** (`--pod-tokens-file`): the call carries
//!   `authorization: Bearer <token>`, and the token's line names the
//!   tenants it may act for, `NAME TOKEN TENANT[,TENANT…]`, or `*` for
//!   every tenant (a gateway serving them all).
//! - **Client certificates** (`--tls-client-tenants`, with mutual TLS):
//!   the certificate the connection was made with names its tenants as URI
//!   subject alternative names, `tollgate://tenant/<id>` (or
//!   `tollgate://tenant/*`), read with `x509-parser`.
//!
//! With either configured, every pod-facing call (`TokenBucket`, `Check`,
//! `PartitionLoad`, Envoy's `ShouldRateLimit`) is checked before it is
//! admitted or reaches the store, in two steps. Who the caller is comes
//! first, from the call's metadata and connection alone, before its
//! message is decoded ([`PodAuth::guard`], a tonic interceptor in front of
//! each service): no credential, or an unknown token, is UNAUTHENTICATED
//! whatever bytes the call carries. Then the handler, which has decoded
//! the message and knows its tenants, checks that the credential names
//! every one of them ([`PodAuth::authorize`]), or the call is
//! PERMISSION_DENIED. A refused call changes nothing; it is counted
//! (`tollgate_auth_refusals_total`) and logged. With both configured, a
//! call that carries a token is judged by the token, one without by its
//! certificate. With neither, every call may act for any tenant: the
//! network is the boundary.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::TenantId;
use tonic::Status;
use tonic::service::{Interceptor, interceptor::InterceptedService};
use x509_parser::extensions::GeneralName;

use super::credentials::{
    CredentialsError, CredentialsFile, Live, TokenTable, presented_token, token_lines,
};
use super::log_throttle::LogThrottle;
use crate::telemetry::Metrics;

/// The URI a client certificate names a tenant with, before the tenant id.
pub const TENANT_URI_PREFIX: &str = "tollgate://tenant/";
/// Stands for every tenant, in a tokens file or a certificate's URI.
pub const ANY_TENANT: &str = "*";

/// The tenants one credential may act for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tenants {
    Any,
    Only(BTreeSet<String>),
}

impl Tenants {
    pub fn allows(&self, tenant: &TenantId) -> bool {
        match self {
            Tenants::Any => true,
            Tenants::Only(tenants) => tenants.contains(tenant.as_str()),
        }
    }
}

/// One pod credential: who it is (for logs) and what it may act for.
#[derive(Clone, Debug)]
struct PodGrant {
    name: Arc<str>,
    tenants: Arc<Tenants>,
}

/// The pods' tokens.
#[derive(Clone)]
pub struct PodTokens {
    table: TokenTable<PodGrant>,
}

impl std::fmt::Debug for PodTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.table.names().collect();
        f.debug_struct("PodTokens").field("names", &names).finish()
    }
}

impl PodTokens {
    /// Parses a pod tokens file: `NAME TOKEN TENANTS` lines, `TENANTS`
    /// being `*` or tenant ids separated by commas.
    pub fn parse(text: &str) -> Result<PodTokens, CredentialsError> {
        const SHAPE: &str = "NAME TOKEN TENANT[,TENANT...] (or * for every tenant)";
        let mut entries = Vec::new();
        for line in token_lines(text, SHAPE, 1)? {
            let Some(list) = line.rest.first() else {
                return Err(CredentialsError::Malformed {
                    line: line.line,
                    expected: SHAPE,
                });
            };
            let tenants = if *list == ANY_TENANT {
                Tenants::Any
            } else {
                let mut tenants = BTreeSet::new();
                for id in list.split(',') {
                    let id =
                        TenantId::parse("tenant", id).map_err(|e| CredentialsError::Invalid {
                            line: line.line,
                            name: line.name.to_owned(),
                            reason: e.to_string(),
                        })?;
                    tenants.insert(id.as_str().to_owned());
                }
                Tenants::Only(tenants)
            };
            let grant = PodGrant {
                name: Arc::from(line.name),
                tenants: Arc::new(tenants),
            };
            entries.push((line.name.to_owned(), line.token.as_bytes().to_vec(), grant));
        }
        Ok(PodTokens {
            table: TokenTable::new(entries),
        })
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }
}

impl CredentialsFile for PodTokens {
    const OPTION: &'static str = "--pod-tokens-file";

    fn parse(text: &str) -> Result<Self, CredentialsError> {
        PodTokens::parse(text)
    }

    fn count(&self) -> usize {
        self.len()
    }
}

/// The tenants a client certificate (DER) names, and its subject for the
/// log. A certificate that names none may act for no tenant.
pub fn certificate_tenants(der: &[u8]) -> Result<(String, Tenants), String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("unreadable client certificate: {e}"))?;
    let mut tenants = BTreeSet::new();
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("unreadable subject alternative names: {e}"))?;
    for name in san.iter().flat_map(|san| san.value.general_names.iter()) {
        let GeneralName::URI(uri) = name else {
            continue;
        };
        let Some(id) = uri.strip_prefix(TENANT_URI_PREFIX) else {
            continue;
        };
        if id == ANY_TENANT {
            return Ok((cert.subject().to_string(), Tenants::Any));
        }
        if TenantId::parse("tenant", id).is_ok() {
            tenants.insert(id.to_owned());
        }
    }
    Ok((cert.subject().to_string(), Tenants::Only(tenants)))
}

/// Who made a pod-facing call, once authenticated.
#[derive(Clone, Debug)]
pub struct PodCaller {
    /// `None` when no pod credentials are configured: anyone, for any
    /// tenant.
    grant: Option<PodGrant>,
    /// What proved it, for the log: `token` or `certificate`.
    proof: &'static str,
}

/// The pod credentials in force, checked by every pod-facing service.
#[derive(Clone, Debug, Default)]
pub struct PodAuth {
    tokens: Option<Live<PodTokens>>,
    certificates: bool,
    metrics: Option<Arc<Metrics>>,
}

/// Refusals logged at most once a second each kind; the rest are counted.
static UNAUTHENTICATED: LogThrottle = LogThrottle::new(Duration::from_secs(1));
static DENIED: LogThrottle = LogThrottle::new(Duration::from_secs(1));

impl PodAuth {
    /// Checks calls against `tokens` (as reloads leave them) and, with
    /// `certificates`, against the tenants of the client's certificate.
    /// Neither: every call may act for any tenant.
    pub fn new(tokens: Option<Live<PodTokens>>, certificates: bool) -> Self {
        PodAuth {
            tokens,
            certificates,
            metrics: None,
        }
    }

    /// Counts refused calls in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Whether any pod credential is required.
    pub fn is_open(&self) -> bool {
        self.tokens.is_none() && !self.certificates
    }

    /// `service` (a pod-facing gRPC server) behind the check of who the
    /// caller is, made before the request is decoded.
    pub fn guard<S>(self, service: S) -> InterceptedService<S, PodAuth> {
        InterceptedService::new(service, self)
    }

    /// Who made `request`: as the guard found, or (for a service served
    /// without it) found now. UNAUTHENTICATED if not known.
    pub fn caller<T>(&self, request: &tonic::Request<T>) -> Result<PodCaller, Status> {
        match request.extensions().get::<PodCaller>() {
            Some(caller) => Ok(caller.clone()),
            None => self.authenticate(request),
        }
    }

    /// Who made `request`, from its metadata and connection, or
    /// UNAUTHENTICATED.
    fn authenticate<T>(&self, request: &tonic::Request<T>) -> Result<PodCaller, Status> {
        if self.is_open() {
            return Ok(PodCaller {
                grant: None,
                proof: "none",
            });
        }
        let peer = request.remote_addr();
        if let Some(tokens) = &self.tokens
            && let Some(presented) = presented_token(request.metadata().as_ref())
        {
            let tokens = tokens.load();
            return match tokens.table.find(presented.as_bytes()) {
                Some((_, grant)) => Ok(PodCaller {
                    grant: Some(grant.clone()),
                    proof: "token",
                }),
                None => Err(self.unauthenticated(peer, "unknown pod token")),
            };
        }
        if self.certificates
            && let Some(certs) = request.peer_certs()
            && let Some(leaf) = certs.first()
        {
            return match certificate_tenants(leaf) {
                Ok((subject, tenants)) => Ok(PodCaller {
                    grant: Some(PodGrant {
                        name: Arc::from(subject),
                        tenants: Arc::new(tenants),
                    }),
                    proof: "certificate",
                }),
                Err(e) => Err(self.unauthenticated(peer, &e)),
            };
        }
        let wanted = match (self.tokens.is_some(), self.certificates) {
            (true, true) => {
                "pod calls need `authorization: Bearer <pod token>` or a client certificate naming the tenant"
            }
            (true, false) => "pod calls need `authorization: Bearer <pod token>`",
            _ => "pod calls need a client certificate naming the tenant",
        };
        Err(self.unauthenticated(peer, wanted))
    }

    fn unauthenticated(&self, peer: Option<std::net::SocketAddr>, why: &str) -> Status {
        if let Some(metrics) = &self.metrics {
            metrics.observe_auth_refusal("pod", "unauthenticated");
        }
        if let Some(held_back) = UNAUTHENTICATED.allow() {
            tracing::warn!(
                peer = %peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string()),
                reason = why,
                held_back,
                "pod call refused: not authenticated"
            );
        }
        Status::unauthenticated(why.to_owned())
    }

    /// Refuses the call unless `caller` may act for every one of
    /// `tenants`; `service` names the RPC for the log.
    pub fn authorize<'a>(
        &self,
        caller: &PodCaller,
        service: &'static str,
        tenants: impl IntoIterator<Item = &'a TenantId>,
    ) -> Result<(), Status> {
        let Some(grant) = &caller.grant else {
            return Ok(());
        };
        for tenant in tenants {
            if !grant.tenants.allows(tenant) {
                if let Some(metrics) = &self.metrics {
                    metrics.observe_auth_refusal("pod", "permission_denied");
                }
                if let Some(held_back) = DENIED.allow() {
                    tracing::warn!(
                        credential = %grant.name,
                        proof = caller.proof,
                        tenant = tenant.as_str(),
                        service,
                        held_back,
                        "pod call refused: the credential does not name the tenant"
                    );
                }
                return Err(Status::permission_denied(format!(
                    "the {} of {} may not act for tenant {:?}",
                    caller.proof,
                    grant.name,
                    tenant.as_str()
                )));
            }
        }
        Ok(())
    }
}

/// The guard: the caller, authenticated on the metadata alone, goes into
/// the request's extensions for the handler.
impl Interceptor for PodAuth {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let caller = self.authenticate(&request)?;
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# pods\nacme-pods 0123456789abcdef-acme acme\nshared 0123456789abcdef-both acme,globex\ngateway 0123456789abcdef-gate *\n";

    fn tenant(id: &str) -> TenantId {
        TenantId::parse("tenant", id).expect("valid")
    }

    fn auth() -> PodAuth {
        let tokens = PodTokens::parse(FILE).expect("valid");
        PodAuth::new(
            Some(Arc::new(arc_swap::ArcSwap::from_pointee(tokens))),
            false,
        )
    }

    fn with_token(token: Option<&str>) -> tonic::Request<()> {
        let mut request = tonic::Request::new(());
        if let Some(token) = token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ascii"),
            );
        }
        request
    }

    #[test]
    fn tokens_name_their_tenants() {
        let auth = auth();
        let acme = auth
            .caller(&with_token(Some("0123456789abcdef-acme")))
            .expect("known");
        assert!(auth.authorize(&acme, "t", [&tenant("acme")]).is_ok());
        let refused = auth
            .authorize(&acme, "t", [&tenant("acme"), &tenant("globex")])
            .expect_err("not globex");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(
            refused.message().contains("globex"),
            "{}",
            refused.message()
        );

        let both = auth
            .caller(&with_token(Some("0123456789abcdef-both")))
            .expect("known");
        assert!(
            auth.authorize(&both, "t", [&tenant("acme"), &tenant("globex")])
                .is_ok()
        );
        assert!(auth.authorize(&both, "t", [&tenant("initech")]).is_err());

        let gateway = auth
            .caller(&with_token(Some("0123456789abcdef-gate")))
            .expect("known");
        assert!(auth.authorize(&gateway, "t", [&tenant("anyone")]).is_ok());

        for token in [None, Some("0123456789abcdef-nope")] {
            let status = auth
                .caller(&with_token(token))
                .expect_err("unauthenticated");
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
        }
        let open = PodAuth::default();
        let anyone = open.caller(&with_token(None)).expect("open");
        assert!(open.authorize(&anyone, "t", [&tenant("acme")]).is_ok());
    }

    #[test]
    fn bad_pod_token_files_are_refused_with_the_line() {
        for (text, needle) in [
            ("a 0123456789abcdef-aaaa", "line 1: expected"),
            ("a 0123456789abcdef-aaaa acme,", "line 1: a: tenant"),
            ("a 0123456789abcdef-aaaa ac/me", "line 1: a: tenant"),
            ("a 0123456789abcdef-aaaa acme extra", "line 1: expected"),
            ("\na short acme", "line 2: the token of a is shorter"),
        ] {
            let err = PodTokens::parse(text).expect_err(text).to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn certificates_name_tenants_by_uri() {
        let with_uris = |uris: &[&str]| {
            let mut params =
                rcgen::CertificateParams::new(vec!["pod.test".to_owned()]).expect("params");
            for uri in uris {
                params.subject_alt_names.push(rcgen::SanType::URI(
                    rcgen::string::Ia5String::try_from(*uri).expect("ia5"),
                ));
            }
            let key = rcgen::KeyPair::generate().expect("key");
            params.self_signed(&key).expect("cert").der().to_vec()
        };
        let (_, tenants) =
            certificate_tenants(&with_uris(&["tollgate://tenant/acme", "https://x/y"]))
                .expect("readable");
        assert_eq!(tenants, Tenants::Only(BTreeSet::from(["acme".to_owned()])));
        let (_, tenants) = certificate_tenants(&with_uris(&["tollgate://tenant/*"])).expect("ok");
        assert_eq!(tenants, Tenants::Any);
        let (_, tenants) =
            certificate_tenants(&with_uris(&["tollgate://tenant/a/b"])).expect("readable");
        assert_eq!(tenants, Tenants::Only(BTreeSet::new()), "not a tenant id");
        let (_, tenants) = certificate_tenants(&with_uris(&[])).expect("readable");
        assert_eq!(tenants, Tenants::Only(BTreeSet::new()));
        assert!(certificate_tenants(b"not a certificate").is_err());
    }
}
