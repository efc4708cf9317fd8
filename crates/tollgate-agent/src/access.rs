//! Who may use which tenant through the agent (`--access FILE`).
//!
//! The agent holds the pod token that lets it act for its tenants at the
//! server, so whoever reaches the agent acts with that token. Two kinds of
//! caller reach it:
//!
//! - **Socket callers** are trusted by the Unix socket's file permissions
//!   (`--socket-mode`, 0660 by default: the agent's user and group). They
//!   send no token.
//! - **TCP callers** (`--listen`, loopback only) cannot be told apart by
//!   the kernel, so each must show the tenant's token, as `authorization:
//!   Bearer <token>` (gRPC metadata or HTTP header).
//!
//! The file:
//!
//! ```toml
//! [tenants.acme]
//! token_file = "/run/secrets/acme-agent-token"
//!
//! [tenants.globex]
//! token = "s3cret"
//!
//! [tenants.initech]   # socket callers only
//! ```
//!
//! The rules:
//!
//! - With tenants in the file, only those are served, to every caller:
//!   another tenant is PERMISSION_DENIED, naming it.
//! - A TCP caller needs the tenant's token: without an `authorization`
//!   header, or with a token that is not the tenant's, UNAUTHENTICATED; a
//!   tenant without a token is PERMISSION_DENIED to TCP callers.
//! - Without `--access` (or with a file that lists no tenant), socket
//!   callers may use any tenant and TCP callers none (PERMISSION_DENIED):
//!   the safe default, since nothing could check a TCP caller.
//!
//! The file is read once, at start, and checked whole: unknown keys,
//! invalid tenant ids, empty or unprintable tokens, both `token` and
//! `token_file`, or a token file that cannot be read are errors naming the
//! file and the key. Tokens are compared in constant time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tollgate_core::TenantId;

use crate::error::AgentError;

/// Why the access file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AccessFileError {
    #[error("--access {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--access {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// How a caller reached the agent, and the bearer token it showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Through the Unix socket: trusted by its file permissions.
    Socket,
    /// Through the loopback TCP listener, with the token of its
    /// `authorization: Bearer` header, if any.
    Tcp { bearer: Option<String> },
}

impl Caller {
    /// A caller on `listener` that sent `authorization` (a header's value).
    pub fn new(listener: Listener, authorization: Option<&[u8]>) -> Caller {
        match listener {
            Listener::Socket => Caller::Socket,
            Listener::Tcp => Caller::Tcp {
                bearer: authorization
                    .and_then(|value| std::str::from_utf8(value).ok())
                    .and_then(|value| value.strip_prefix("Bearer "))
                    .map(|token| token.trim().to_owned()),
            },
        }
    }
}

/// Which of the agent's listeners a call came through (set on every
/// request by the listener's router).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    Socket,
    Tcp,
}

/// The access rules in force.
#[derive(Clone, Debug, Default)]
pub struct AccessRules {
    /// The file they came from, for messages; `None` without `--access`.
    source: Option<PathBuf>,
    /// The tenants served (valid ids), with their tokens; empty: any
    /// tenant (socket).
    tenants: BTreeMap<String, Option<Token>>,
}

/// A tenant's token for TCP callers.
#[derive(Clone)]
struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    /// Compares in time that depends on the lengths only.
    fn matches(&self, shown: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), shown.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessFile {
    #[serde(default)]
    tenants: BTreeMap<String, TenantEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    token: Option<String>,
    token_file: Option<PathBuf>,
}

impl AccessRules {
    /// No `--access`: socket callers any tenant, TCP callers none.
    pub fn socket_only() -> AccessRules {
        AccessRules::default()
    }

    /// Reads and checks the file at `path` (see the module docs). A
    /// relative `token_file` is relative to the file's directory.
    pub fn load(path: &Path) -> Result<AccessRules, AccessFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| AccessFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        AccessRules::parse(path, &text)
    }

    /// The rules `text` (the contents of `path`) sets.
    pub fn parse(path: &Path, text: &str) -> Result<AccessRules, AccessFileError> {
        let invalid = |message: String| AccessFileError::Invalid {
            path: path.to_owned(),
            message,
        };
        let file: AccessFile = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let mut tenants = BTreeMap::new();
        for (id, entry) in file.tenants {
            let key = format!("tenants.{id:?}");
            let tenant =
                TenantId::parse(&key, &id).map_err(|e| invalid(format!("{e} (a tenant id)")))?;
            let token = match (entry.token, entry.token_file) {
                (Some(_), Some(_)) => {
                    return Err(invalid(format!(
                        "{key}: give token or token_file, not both"
                    )));
                }
                (Some(token), None) => Some(token),
                (None, Some(file)) => {
                    let file = match path.parent() {
                        Some(dir) if file.is_relative() => dir.join(file),
                        _ => file,
                    };
                    let token = std::fs::read_to_string(&file).map_err(|e| {
                        invalid(format!("{key}.token_file: read {}: {e}", file.display()))
                    })?;
                    Some(token.trim().to_owned())
                }
                (None, None) => None,
            };
            if let Some(token) = &token
                && (token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()))
            {
                return Err(invalid(format!(
                    "{key}.token: must be printable ASCII without spaces, and not empty"
                )));
            }
            tenants.insert(tenant.as_str().to_owned(), token.map(Token));
        }
        Ok(AccessRules {
            source: Some(path.to_owned()),
            tenants,
        })
    }

    /// The tenants the file lists (empty: any, through the socket).
    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.tenants.keys().map(String::as_str)
    }

    /// What can be said of `caller` before the tenant it names is known:
    /// TCP callers are refused at once without `--access`
    /// (PERMISSION_DENIED) or without a bearer token (UNAUTHENTICATED),
    /// whatever else their call holds.
    pub fn admit(&self, caller: &Caller) -> Result<(), AgentError> {
        match caller {
            Caller::Socket => Ok(()),
            Caller::Tcp { .. } if self.tenants.is_empty() => {
                Err(AgentError::PermissionDenied(self.tcp_needs_tokens()))
            }
            Caller::Tcp { bearer: None } => Err(AgentError::Unauthenticated(
                "TCP callers must send `authorization: Bearer <token>` with the tenant's token \
                 from the agent's --access file"
                    .to_owned(),
            )),
            Caller::Tcp { bearer: Some(_) } => Ok(()),
        }
    }

    /// Whether `caller` may use `tenant` (see the module docs).
    pub fn authorize(&self, caller: &Caller, tenant: &str) -> Result<(), AgentError> {
        self.admit(caller)?;
        if self.tenants.is_empty() {
            // Only socket callers get here.
            return Ok(());
        }
        let Some(token) = self.tenants.get(tenant) else {
            return Err(AgentError::PermissionDenied(format!(
                "tenant {tenant:?} is not served by this agent (it is not in {})",
                self.describe_source()
            )));
        };
        let Caller::Tcp { bearer } = caller else {
            return Ok(());
        };
        let Some(token) = token else {
            return Err(AgentError::PermissionDenied(format!(
                "tenant {tenant:?} has no token in {}: only socket callers may use it",
                self.describe_source()
            )));
        };
        match bearer {
            Some(shown) if token.matches(shown) => Ok(()),
            _ => Err(AgentError::Unauthenticated(format!(
                "the bearer token is not tenant {tenant:?}'s"
            ))),
        }
    }

    fn tcp_needs_tokens(&self) -> String {
        match &self.source {
            None => {
                "TCP callers need --access with a token for their tenant; use the Unix socket, \
                     or start the agent with --access FILE"
                    .to_owned()
            }
            Some(path) => format!(
                "TCP callers need a tenant with a token in --access {}; it lists none",
                path.display()
            ),
        }
    }

    fn describe_source(&self) -> String {
        match &self.source {
            Some(path) => format!("--access {}", path.display()),
            None => "--access".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> AccessRules {
        AccessRules::parse(Path::new("/etc/tollgate/access.toml"), text).expect("valid")
    }

    fn refusal(text: &str) -> String {
        AccessRules::parse(Path::new("/etc/tollgate/access.toml"), text)
            .expect_err("refused")
            .to_string()
    }

    fn tcp(token: Option<&str>) -> Caller {
        Caller::Tcp {
            bearer: token.map(str::to_owned),
        }
    }

    #[test]
    fn without_a_file_socket_callers_use_any_tenant_and_tcp_callers_none() {
        let rules = AccessRules::socket_only();
        rules.authorize(&Caller::Socket, "acme").expect("socket");
        let error = rules
            .authorize(&tcp(Some("anything")), "acme")
            .expect_err("tcp");
        assert!(matches!(error, AgentError::PermissionDenied(_)), "{error}");
        assert!(error.to_string().contains("--access"), "{error}");
    }

    #[test]
    fn listed_tenants_only_and_tcp_callers_with_their_tenants_token() {
        let rules = rules(
            r#"
            [tenants.acme]
            token = "acme-secret"
            [tenants.initech]
            "#,
        );
        rules.authorize(&Caller::Socket, "acme").expect("socket");
        rules.authorize(&Caller::Socket, "initech").expect("socket");
        let other = rules
            .authorize(&Caller::Socket, "globex")
            .expect_err("not listed");
        assert!(matches!(other, AgentError::PermissionDenied(_)));
        assert!(other.to_string().contains("\"globex\""), "{other}");

        rules
            .authorize(&tcp(Some("acme-secret")), "acme")
            .expect("its token");
        for (caller, tenant) in [
            (tcp(None), "acme"),
            (tcp(Some("acme-secreT")), "acme"),
            (tcp(Some("acme-secret-")), "acme"),
        ] {
            let error = rules.authorize(&caller, tenant).expect_err("refused");
            assert!(matches!(error, AgentError::Unauthenticated(_)), "{error}");
        }
        let no_token = rules
            .authorize(&tcp(Some("acme-secret")), "initech")
            .expect_err("no token for TCP");
        assert!(matches!(no_token, AgentError::PermissionDenied(_)));
        // An absent header is refused before the tenant is even read.
        assert!(matches!(
            rules.admit(&tcp(None)),
            Err(AgentError::Unauthenticated(_))
        ));
    }

    #[test]
    fn token_files_are_read_relative_to_the_access_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("acme.token"), "from-file\n").expect("write");
        let path = dir.path().join("access.toml");
        std::fs::write(&path, "[tenants.acme]\ntoken_file = \"acme.token\"\n").expect("write");
        let rules = AccessRules::load(&path).expect("valid");
        rules
            .authorize(&tcp(Some("from-file")), "acme")
            .expect("the file's token, trimmed");
        let missing = AccessRules::load(&dir.path().join("nope.toml")).expect_err("missing");
        assert!(missing.to_string().contains("nope.toml"), "{missing}");
    }

    #[test]
    fn a_bad_file_is_refused_naming_the_key() {
        let unknown = refusal("[tenants.acme]\ntokn = \"x\"\n");
        assert!(unknown.contains("tokn"), "{unknown}");
        assert!(unknown.contains("access.toml"), "{unknown}");
        let top = refusal("[tenant.acme]\n");
        assert!(top.contains("tenant"), "{top}");
        let id = refusal("[tenants.\"bad tenant\"]\n");
        assert!(id.contains("tenants.\"bad tenant\""), "{id}");
        let both = refusal("[tenants.acme]\ntoken = \"a\"\ntoken_file = \"b\"\n");
        assert!(both.contains("not both"), "{both}");
        let empty = refusal("[tenants.acme]\ntoken = \"\"\n");
        assert!(empty.contains("tenants.\"acme\".token"), "{empty}");
        let spaced = refusal("[tenants.acme]\ntoken = \"a b\"\n");
        assert!(spaced.contains("printable"), "{spaced}");
        let unreadable = refusal("[tenants.acme]\ntoken_file = \"/nonexistent/t\"\n");
        assert!(unreadable.contains("token_file"), "{unreadable}");
    }

    #[test]
    fn only_bearer_tokens_count() {
        assert_eq!(
            Caller::new(Listener::Tcp, Some(b"Bearer abc")),
            tcp(Some("abc"))
        );
        assert_eq!(Caller::new(Listener::Tcp, Some(b"Basic abc")), tcp(None));
        assert_eq!(Caller::new(Listener::Tcp, None), tcp(None));
        assert_eq!(
            Caller::new(Listener::Socket, Some(b"Bearer abc")),
            Caller::Socket
        );
    }
}
