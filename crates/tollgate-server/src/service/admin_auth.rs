//! Who may use the `Admin` service, and for what.
//!
//! With a tokens file, every `Admin` call must carry `authorization: Bearer
//! <token>` with one of its tokens, or it is refused with UNAUTHENTICATED
//! before it reaches the store. Each token names its operator, and that
//! name (authenticated, unlike the `x-tollgate-actor` a client claims) goes
//! into the audit line of every change. Each token also has a [`Role`]: an
//! `operator` may call everything, a `read-only` token only the methods
//! that change nothing ([`READ_ONLY_METHODS`]); any other call with it is
//! refused with PERMISSION_DENIED. Without a tokens file, `Admin` is open
//! to whoever reaches the port (protect it with mutual TLS or the network
//! instead).
//!
//! A token may also be *scoped* to an organisation (`organization=ID`):
//! it acts for that organisation's administrators, on its tenants only.
//! It may call only [`SCOPED_METHODS`], each of which names one tenant
//! (or organisation), and the service then checks that the id is in the
//! organisation's subtree ([`Scope`]): below it to change anything, the
//! organisation itself or below it to read. Everything that reaches
//! beyond one tenant (tiers' definitions, creating, deleting or moving
//! tenants, listing every tenant) needs an unscoped token. The limits,
//! budget and tier of the organisation itself are its provider's to set,
//! so a scoped token only reads them.
//!
//! The file holds one `NAME TOKEN [ROLE] [organization=ID]` line per
//! operator (`#` starts a comment; the role is `operator` unless given).
//! The check sits in front of the service ([`AdminGuard`]), where the
//! method is known before the request is decoded. Read-only and scoped
//! methods are listed, not inferred: a method added later is closed to
//! read-only and scoped tokens until it is listed.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::Status;
use tonic::server::NamedService;
use tower::Service;

use tollgate_core::TenantId;

use super::credentials::{
    CredentialsError, CredentialsFile, Live, TokenTable, presented_token, token_lines,
};
use crate::telemetry::Metrics;

/// The `Admin` methods a read-only token may call: those that change
/// nothing. Every method not listed needs an operator, so a method added
/// later is closed to read-only tokens until it is listed here.
pub const READ_ONLY_METHODS: [&str; 13] = [
    "GetTenant",
    "ListTenants",
    "ListKeyBuckets",
    "ListClosedBuckets",
    "GetTier",
    "ListTiers",
    "DescribeTenant",
    "GetBudget",
    "GetUsage",
    "GetHistory",
    "PreviewLimits",
    "GetOrganization",
    "ListOrganizations",
];

/// The `Admin` methods a token scoped to an organisation may call: those
/// that act on one tenant or organisation, whose id the service checks
/// against the scope, and the reads of tiers' definitions. Every method
/// not listed needs an unscoped token.
pub const SCOPED_METHODS: [&str; 23] = [
    "UpdateTenantResourceLimits",
    "GetTenant",
    "ListTenants",
    "ListKeyBuckets",
    "ListClosedBuckets",
    "SuspendTenant",
    "ResumeTenant",
    "GetTier",
    "ListTiers",
    "SetTenantTier",
    "SetBucketOverride",
    "ClearBucketOverride",
    "DescribeTenant",
    "SetTableLimits",
    "ClearTableLimits",
    "SetBudget",
    "ClearBudget",
    "GetBudget",
    "GetUsage",
    "GetHistory",
    "PreviewLimits",
    "GetOrganization",
    "ListOrganizations",
];

/// The organisation a scoped token acts for, in an `Admin` request's
/// extensions: the service lets it act on that organisation's subtree
/// only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope(pub TenantId);

/// What a token may do: its role, and the organisation it is scoped to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub role: Role,
    pub scope: Option<TenantId>,
}

/// What an `Admin` token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Every `Admin` method.
    Operator,
    /// Only [`READ_ONLY_METHODS`].
    ReadOnly,
}

impl Role {
    fn parse(word: &str) -> Option<Role> {
        match word {
            "operator" => Some(Role::Operator),
            "read-only" => Some(Role::ReadOnly),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Operator => "operator",
            Role::ReadOnly => "read-only",
        }
    }

    /// Whether this role may call `method` (its bare name, `GetTenant`).
    pub fn may_call(self, method: &str) -> bool {
        match self {
            Role::Operator => true,
            Role::ReadOnly => READ_ONLY_METHODS.contains(&method),
        }
    }
}

/// The operators' tokens.
#[derive(Clone)]
pub struct AdminTokens {
    table: TokenTable<Grant>,
}

impl std::fmt::Debug for AdminTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.table.names().collect();
        f.debug_struct("AdminTokens")
            .field("operators", &names)
            .finish()
    }
}

impl AdminTokens {
    /// Parses a tokens file.
    pub fn parse(text: &str) -> Result<AdminTokens, CredentialsError> {
        let mut entries = Vec::new();
        for line in token_lines(text, "NAME TOKEN [operator|read-only] [organization=ID]", 2)? {
            let invalid = |reason: String| CredentialsError::Invalid {
                line: line.line,
                name: line.name.to_owned(),
                reason,
            };
            let mut role = None;
            let mut scope = None;
            for word in &line.rest {
                if let Some(id) = word.strip_prefix("organization=") {
                    if scope.is_some() {
                        return Err(invalid("more than one organization=".into()));
                    }
                    let id = TenantId::parse("organization", id)
                        .map_err(|e| invalid(format!("organization={id}: {e}")))?;
                    scope = Some(id);
                } else if role.is_some() {
                    return Err(invalid(format!(
                        "{word:?} after the role (organization=ID names a scope)"
                    )));
                } else {
                    role = Some(Role::parse(word).ok_or_else(|| {
                        invalid(format!("unknown role {word:?} (operator or read-only)"))
                    })?);
                }
            }
            let grant = Grant {
                role: role.unwrap_or(Role::Operator),
                scope,
            };
            entries.push((line.name.to_owned(), line.token.as_bytes().to_vec(), grant));
        }
        Ok(AdminTokens {
            table: TokenTable::new(entries),
        })
    }

    /// How many operators have a token.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }

    /// The operator whose token `presented` is, and what it may do.
    fn operator(&self, presented: &[u8]) -> Option<(&str, &Grant)> {
        self.table.find(presented)
    }
}

impl CredentialsFile for AdminTokens {
    const OPTION: &'static str = "--admin-tokens-file";

    fn parse(text: &str) -> Result<Self, CredentialsError> {
        AdminTokens::parse(text)
    }

    fn count(&self) -> usize {
        self.len()
    }
}

/// The operator an `Admin` request was authenticated as, in its extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operator(pub String);

/// Who an authenticated call is from.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Caller {
    operator: Operator,
    scope: Option<Scope>,
}

/// Who may call the `Admin` service: the tokens in force, or nobody's
/// business (`None`: open).
#[derive(Clone, Debug, Default)]
pub struct AdminAuth {
    tokens: Option<Live<AdminTokens>>,
    metrics: Option<Arc<Metrics>>,
}

impl AdminAuth {
    /// Requires one of `tokens` (as reloads leave them); `None` lets every
    /// call through.
    pub fn new(tokens: Option<Live<AdminTokens>>) -> Self {
        AdminAuth {
            tokens,
            metrics: None,
        }
    }

    /// Refuses every call: no token is good. For a door that has no way
    /// to check callers, such as the web console's over plain HTTP when
    /// client certificates, not tokens, guard the Admin service.
    pub fn nobody() -> Self {
        AdminAuth::new(Some(Arc::new(arc_swap::ArcSwap::from_pointee(
            AdminTokens {
                table: TokenTable::new(Vec::new()),
            },
        ))))
    }

    /// Counts refused calls in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// `service` (the `Admin` server) behind this check.
    pub fn guard<S>(self, service: S) -> AdminGuard<S> {
        AdminGuard {
            inner: service,
            auth: self,
        }
    }

    /// As for a call of `ListTenants` of every tenant: whoever may list
    /// them (any role, unscoped) may read what the web console shows.
    pub fn check_reader(&self, headers: &http::HeaderMap) -> Result<Option<Operator>, Status> {
        let caller = self.check("/tollgate.v1.Admin/ListTenants", headers)?;
        match caller {
            Some(Caller {
                operator,
                scope: Some(Scope(org)),
            }) => Err(self.refused(
                "permission_denied",
                Status::permission_denied(format!(
                    "the token of {} is scoped to organization {org}: the console shows every tenant, \
                     so it needs an unscoped token",
                    operator.0
                )),
            )),
            Some(caller) => Ok(Some(caller.operator)),
            None => Ok(None),
        }
    }

    /// Who a call to `path` with `metadata` is made by, or why it is
    /// refused. `None` when no tokens are required.
    fn check(&self, path: &str, headers: &http::HeaderMap) -> Result<Option<Caller>, Status> {
        let Some(tokens) = &self.tokens else {
            return Ok(None);
        };
        let Some(presented) = presented_token(headers) else {
            return Err(self.refused(
                "unauthenticated",
                Status::unauthenticated(
                    "the Admin service needs `authorization: Bearer <token>` (tollgate --token)",
                ),
            ));
        };
        let tokens = tokens.load();
        let Some((name, grant)) = tokens.operator(presented.as_bytes()) else {
            tracing::warn!(path, "Admin call with an unknown token refused");
            return Err(self.refused("unauthenticated", Status::unauthenticated("unknown token")));
        };
        let method = path.rsplit('/').next().unwrap_or(path);
        let role = grant.role;
        if !role.may_call(method) {
            tracing::warn!(
                operator = name,
                method,
                role = role.name(),
                "Admin call refused: the token's role does not allow it"
            );
            return Err(self.refused(
                "permission_denied",
                Status::permission_denied(format!(
                    "the token of {name} is {}: it may call only {}, not {method}",
                    role.name(),
                    READ_ONLY_METHODS.join(", ")
                )),
            ));
        }
        if let Some(org) = &grant.scope
            && !SCOPED_METHODS.contains(&method)
        {
            tracing::warn!(
                operator = name,
                method,
                organization = %org,
                "Admin call refused: the token is scoped to an organization"
            );
            return Err(self.refused(
                "permission_denied",
                Status::permission_denied(format!(
                    "the token of {name} is scoped to organization {org}: {method} reaches \
                     beyond one tenant, so it needs an unscoped token"
                )),
            ));
        }
        Ok(Some(Caller {
            operator: Operator(name.to_owned()),
            scope: grant.scope.clone().map(Scope),
        }))
    }

    fn refused(&self, reason: &'static str, status: Status) -> Status {
        if let Some(metrics) = &self.metrics {
            metrics.observe_auth_refusal("admin", reason);
        }
        status
    }
}

/// The `Admin` service behind its token check ([`AdminAuth::guard`]).
#[derive(Clone, Debug)]
pub struct AdminGuard<S> {
    inner: S,
    auth: AdminAuth,
}

impl<S: NamedService> NamedService for AdminGuard<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, ResBody> Service<http::Request<B>> for AdminGuard<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>, Error = Infallible>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        match self.auth.check(request.uri().path(), request.headers()) {
            Ok(caller) => {
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller.operator);
                    if let Some(scope) = caller.scope {
                        request.extensions_mut().insert(scope);
                    }
                }
                Box::pin(self.inner.call(request))
            }
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# operators\nalice  0123456789abcdef-alice\nbob 0123456789abcdef-bob operator # on call\ncarol 0123456789abcdef-carol read-only\n\ndave 0123456789abcdef-dave organization=acme\nerin 0123456789abcdef-erin organization=acme read-only\n";

    fn grant(role: Role, scope: Option<&str>) -> Grant {
        Grant {
            role,
            scope: scope.map(|s| TenantId::parse("scope", s).expect("valid id")),
        }
    }

    fn auth() -> AdminAuth {
        let tokens = AdminTokens::parse(FILE).expect("valid");
        AdminAuth::new(Some(Arc::new(arc_swap::ArcSwap::from_pointee(tokens))))
    }

    fn headers(authorization: Option<&str>) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert("authorization", value.parse().expect("ascii"));
        }
        headers
    }

    #[test]
    fn tokens_name_their_operators_and_roles() {
        let tokens = AdminTokens::parse(FILE).expect("valid");
        assert_eq!(tokens.len(), 5);
        for (token, name, expected) in [
            ("bob", "bob", grant(Role::Operator, None)),
            ("alice", "alice", grant(Role::Operator, None)),
            ("carol", "carol", grant(Role::ReadOnly, None)),
            ("dave", "dave", grant(Role::Operator, Some("acme"))),
            ("erin", "erin", grant(Role::ReadOnly, Some("acme"))),
        ] {
            let presented = format!("0123456789abcdef-{token}");
            assert_eq!(
                tokens.operator(presented.as_bytes()),
                Some((name, &expected))
            );
        }
        assert_eq!(tokens.operator(b"0123456789abcdef-bo"), None);
        assert!(!format!("{tokens:?}").contains("0123"), "no token in Debug");
        assert_eq!(
            AdminTokens::parse("dave 0123456789abcdef-dave admin").map(|_| ()),
            Err(CredentialsError::Invalid {
                line: 1,
                name: "dave".into(),
                reason: "unknown role \"admin\" (operator or read-only)".into()
            })
        );
        for (line, reason) in [
            (
                "dave 0123456789abcdef-dave organization=a organization=b",
                "more than one organization=",
            ),
            (
                "dave 0123456789abcdef-dave operator read-only",
                "\"read-only\" after the role (organization=ID names a scope)",
            ),
        ] {
            assert_eq!(
                AdminTokens::parse(line).map(|_| ()),
                Err(CredentialsError::Invalid {
                    line: 1,
                    name: "dave".into(),
                    reason: reason.into()
                }),
                "{line}"
            );
        }
        let bad_id = AdminTokens::parse("dave 0123456789abcdef-dave organization=a/b")
            .map(|_| ())
            .expect_err("not a tenant id");
        assert!(bad_id.to_string().contains("organization=a/b"), "{bad_id}");
        assert!(
            AdminTokens::parse("dave 0123456789abcdef-dave read-only organization=a x").is_err(),
            "three words after the token"
        );
    }

    #[test]
    fn calls_need_a_known_bearer_token() {
        let auth = auth();
        let path = "/tollgate.v1.Admin/UpdateTenantResourceLimits";
        for scheme in ["Bearer", "bearer", "BEARER"] {
            let operator = auth
                .check(
                    path,
                    &headers(Some(&format!("{scheme} 0123456789abcdef-alice"))),
                )
                .expect("known token, the scheme in any case");
            assert_eq!(operator.map(|c| c.operator), Some(Operator("alice".into())));
        }
        for refused in [
            None,
            Some("Bearer nope-nope-nope-nope"),
            Some("0123456789abcdef-alice"),
            Some("Bearer"),
            Some("Basic 0123456789abcdef-alice"),
        ] {
            let status = auth.check(path, &headers(refused)).expect_err("refused");
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
        }
        let open = AdminAuth::new(None);
        assert_eq!(open.check(path, &headers(None)).expect("open"), None);
    }

    #[test]
    fn read_only_tokens_call_only_what_changes_nothing() {
        let auth = auth();
        let carol = headers(Some("Bearer 0123456789abcdef-carol"));
        for method in READ_ONLY_METHODS {
            let operator = auth
                .check(&format!("/tollgate.v1.Admin/{method}"), &carol)
                .expect("read-only may read");
            assert_eq!(operator.map(|c| c.operator), Some(Operator("carol".into())));
        }
        for method in [
            "UpdateTenantResourceLimits",
            "DeleteTenant",
            "SuspendTenant",
            "ResumeTenant",
            "PutTier",
            "Unknown",
        ] {
            let status = auth
                .check(&format!("/tollgate.v1.Admin/{method}"), &carol)
                .expect_err("read-only may not change");
            assert_eq!(status.code(), tonic::Code::PermissionDenied, "{method}");
            assert!(status.message().contains(method), "{}", status.message());
        }
    }

    #[test]
    fn scoped_tokens_call_only_what_names_one_tenant() {
        let auth = auth();
        let acme = Scope(TenantId::parse("scope", "acme").expect("valid"));
        for (who, role) in [("dave", Role::Operator), ("erin", Role::ReadOnly)] {
            let presented = headers(Some(&format!("Bearer 0123456789abcdef-{who}")));
            for method in SCOPED_METHODS {
                let path = format!("/tollgate.v1.Admin/{method}");
                match auth.check(&path, &presented) {
                    Ok(caller) => {
                        assert!(role.may_call(method), "{who} {method}");
                        let caller = caller.expect("tokens are on");
                        assert_eq!(caller.operator, Operator(who.into()));
                        assert_eq!(caller.scope.as_ref(), Some(&acme), "{who} {method}");
                    }
                    Err(status) => {
                        assert!(!role.may_call(method), "{who} {method}: {status:?}");
                        assert_eq!(status.code(), tonic::Code::PermissionDenied);
                    }
                }
            }
            for method in [
                "CreateTenant",
                "DeleteTenant",
                "PutTier",
                "DeleteTier",
                "CreateOrganization",
                "AddOrganizationMember",
                "RemoveOrganizationMember",
                "DeleteOrganization",
                "Unknown",
            ] {
                let status = auth
                    .check(&format!("/tollgate.v1.Admin/{method}"), &presented)
                    .expect_err("beyond one tenant");
                assert_eq!(status.code(), tonic::Code::PermissionDenied, "{method}");
                assert!(status.message().contains(method), "{}", status.message());
            }
            let status = auth
                .check_reader(&presented)
                .expect_err("the console shows every tenant");
            assert_eq!(status.code(), tonic::Code::PermissionDenied);
        }
        let alice = headers(Some("Bearer 0123456789abcdef-alice"));
        let unscoped = auth
            .check("/tollgate.v1.Admin/PutTier", &alice)
            .expect("unscoped operator")
            .expect("tokens are on");
        assert_eq!(unscoped.scope, None);
    }
}
