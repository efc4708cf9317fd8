//! Who may use the `Admin` service.
//!
//! With a tokens file, every `Admin` call must carry `authorization: Bearer
//! <token>` with one of its tokens, or it is refused with UNAUTHENTICATED
//! before it reaches the store. Each token names its operator, and that
//! name (authenticated, unlike the `x-tollgate-actor` a client claims) goes
//! into the audit line of every change. Pods' `TokenBucket` calls are not
//! affected. Without a tokens file, `Admin` is open to whoever reaches the
//! port (protect it with mutual TLS or the network instead).
//!
//! The file holds one `NAME TOKEN` pair per line; `#` starts a comment.

use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::{Request, Status};

/// The shortest token accepted: guessing one must be hopeless.
pub const MIN_TOKEN_LEN: usize = 16;

/// Why a tokens file was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdminTokensError {
    #[error("line {line}: expected `NAME TOKEN`")]
    Malformed { line: usize },
    #[error("line {line}: the token of {name} is shorter than {MIN_TOKEN_LEN} characters")]
    TooShort { line: usize, name: String },
    #[error("line {line}: the token of {name} is not printable ASCII")]
    NotPrintable { line: usize, name: String },
    #[error("line {line}: {what} {name} appears twice")]
    Duplicate {
        line: usize,
        what: &'static str,
        name: String,
    },
    #[error("no tokens")]
    Empty,
}

/// The operators' tokens.
#[derive(Clone, Default)]
pub struct AdminTokens {
    entries: Arc<Vec<(String, Vec<u8>)>>,
}

impl std::fmt::Debug for AdminTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("AdminTokens")
            .field("operators", &names)
            .finish()
    }
}

impl AdminTokens {
    /// Parses a tokens file.
    pub fn parse(text: &str) -> Result<AdminTokens, AdminTokensError> {
        let mut entries: Vec<(String, Vec<u8>)> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let content = raw.split('#').next().unwrap_or_default().trim();
            if content.is_empty() {
                continue;
            }
            let mut fields = content.split_whitespace();
            let (Some(name), Some(token), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(AdminTokensError::Malformed { line });
            };
            let name = name.to_owned();
            if token.len() < MIN_TOKEN_LEN {
                return Err(AdminTokensError::TooShort { line, name });
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(AdminTokensError::NotPrintable { line, name });
            }
            if entries.iter().any(|(n, _)| *n == name) {
                return Err(AdminTokensError::Duplicate {
                    line,
                    what: "operator",
                    name,
                });
            }
            if entries.iter().any(|(_, t)| t == token.as_bytes()) {
                return Err(AdminTokensError::Duplicate {
                    line,
                    what: "the token of",
                    name,
                });
            }
            entries.push((name, token.as_bytes().to_vec()));
        }
        if entries.is_empty() {
            return Err(AdminTokensError::Empty);
        }
        Ok(AdminTokens {
            entries: Arc::new(entries),
        })
    }

    /// How many operators have a token.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The operator whose token `presented` is. Every token is compared in
    /// full, so the time taken does not tell how much of one matched.
    fn operator(&self, presented: &[u8]) -> Option<&str> {
        let mut found = None;
        for (name, token) in self.entries.iter() {
            if constant_time_eq(token, presented) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The operator an `Admin` request was authenticated as, in its extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operator(pub String);

/// The interceptor in front of the `Admin` service.
#[derive(Clone, Debug, Default)]
pub struct AdminAuth {
    tokens: Option<AdminTokens>,
}

impl AdminAuth {
    /// Requires one of `tokens`; `None` lets every call through.
    pub fn new(tokens: Option<AdminTokens>) -> Self {
        AdminAuth { tokens }
    }
}

/// The token of an `authorization: Bearer <token>` value. The scheme is
/// case-insensitive (RFC 9110, section 11.1); spaces around the token are
/// not part of it.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Interceptor for AdminAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let Some(tokens) = &self.tokens else {
            return Ok(request);
        };
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        let Some(presented) = presented else {
            return Err(Status::unauthenticated(
                "the Admin service needs `authorization: Bearer <token>` (tollgate --token)",
            ));
        };
        match tokens.operator(presented.as_bytes()) {
            Some(name) => {
                let operator = Operator(name.to_owned());
                request.extensions_mut().insert(operator);
                Ok(request)
            }
            None => {
                tracing::warn!(peer = ?request.remote_addr(), "Admin call with an unknown token refused");
                Err(Status::unauthenticated("unknown token"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str =
        "# operators\nalice  0123456789abcdef-alice\nbob 0123456789abcdef-bob # on call\n\n";

    #[test]
    fn tokens_name_their_operators() {
        let tokens = AdminTokens::parse(FILE).expect("valid");
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.operator(b"0123456789abcdef-bob"), Some("bob"));
        assert_eq!(tokens.operator(b"0123456789abcdef-bo"), None);
        assert_eq!(tokens.operator(b""), None);
        assert!(!format!("{tokens:?}").contains("0123"), "no token in Debug");
    }

    #[test]
    fn bad_files_are_refused_with_the_line() {
        for (text, expected) in [
            ("alice", AdminTokensError::Malformed { line: 1 }),
            ("alice a b", AdminTokensError::Malformed { line: 1 }),
            (
                "\nalice short",
                AdminTokensError::TooShort {
                    line: 2,
                    name: "alice".into(),
                },
            ),
            (
                "alice 0123456789abcdef\nalice 0123456789abcdeg",
                AdminTokensError::Duplicate {
                    line: 2,
                    what: "operator",
                    name: "alice".into(),
                },
            ),
            (
                "alice 0123456789abcdef\nbob 0123456789abcdef",
                AdminTokensError::Duplicate {
                    line: 2,
                    what: "the token of",
                    name: "bob".into(),
                },
            ),
            ("# nothing\n", AdminTokensError::Empty),
        ] {
            assert_eq!(
                AdminTokens::parse(text).map(|_| ()),
                Err(expected),
                "{text:?}"
            );
        }
    }

    #[test]
    fn calls_need_a_known_bearer_token() {
        let mut auth = AdminAuth::new(Some(AdminTokens::parse(FILE).expect("valid")));
        let with = |value: Option<&str>| {
            let mut request = Request::new(());
            if let Some(value) = value {
                request
                    .metadata_mut()
                    .insert("authorization", value.parse().expect("ascii"));
            }
            request
        };
        for scheme in ["Bearer", "bearer", "BEARER"] {
            let ok = auth
                .call(with(Some(&format!("{scheme} 0123456789abcdef-alice"))))
                .expect("known token, the scheme in any case");
            assert_eq!(
                ok.extensions().get::<Operator>(),
                Some(&Operator("alice".into()))
            );
        }
        for refused in [
            None,
            Some("Bearer nope-nope-nope-nope"),
            Some("0123456789abcdef-alice"),
            Some("Bearer"),
            Some("Basic 0123456789abcdef-alice"),
        ] {
            let status = auth.call(with(refused)).expect_err("refused");
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
        }
        let mut open = AdminAuth::new(None);
        assert!(open.call(with(None)).is_ok());
    }
}
