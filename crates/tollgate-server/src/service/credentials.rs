//! Credentials files: the bearer tokens operators and pods present, read
//! from files the server can reload while it runs.
//!
//! Both files have one credential per line, `NAME TOKEN` and then what
//! the credential may do (an operator's role, a pod's tenants); `#` starts
//! a comment. Names and tokens are unique within a file, and a token is
//! at least [`MIN_TOKEN_LEN`] printable ASCII characters, so that guessing
//! one is hopeless. A file is parsed whole or refused whole, naming the
//! line: a reload that fails keeps the credentials in force, so a typo
//! never locks everybody out (nor lets everybody in).
//!
//! The parsed credentials live behind an [`arc_swap::ArcSwap`]: every call
//! reads the current table without a lock, and a reload replaces it at
//! once for the calls that follow.
//!
//! A `TokenTable` is keyed by the SHA-256 of each token: one lookup
//! whatever their number, and no comparison whose timing depends on how
//! much of a guess was right. `tollgate serve` reloads both files on SIGHUP
//! and when their text changes.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};

/// The shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// Why a credentials file was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialsError {
    #[error("line {line}: expected `{expected}`")]
    Malformed { line: usize, expected: &'static str },
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
    #[error("line {line}: {name}: {reason}")]
    Invalid {
        line: usize,
        name: String,
        reason: String,
    },
    #[error("no tokens")]
    Empty,
}

/// One line of a credentials file: a named token and the words after it.
#[derive(Debug)]
pub(crate) struct TokenLine<'a> {
    pub line: usize,
    pub name: &'a str,
    pub token: &'a str,
    pub rest: Vec<&'a str>,
}

/// Splits `text` into its credential lines, checking what every file
/// shares: the shape (`expected` describes it), token length and alphabet,
/// and unique names and tokens. `max_rest` is how many words may follow
/// the token.
pub(crate) fn token_lines<'a>(
    text: &'a str,
    expected: &'static str,
    max_rest: usize,
) -> Result<Vec<TokenLine<'a>>, CredentialsError> {
    let mut lines: Vec<TokenLine<'a>> = Vec::new();
    let mut names: HashSet<&str> = HashSet::new();
    let mut tokens: HashSet<&str> = HashSet::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.split('#').next().unwrap_or_default().trim();
        if content.is_empty() {
            continue;
        }
        let mut fields = content.split_whitespace();
        let (Some(name), Some(token)) = (fields.next(), fields.next()) else {
            return Err(CredentialsError::Malformed { line, expected });
        };
        let rest: Vec<&str> = fields.collect();
        if rest.len() > max_rest {
            return Err(CredentialsError::Malformed { line, expected });
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(CredentialsError::TooShort {
                line,
                name: name.to_owned(),
            });
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(CredentialsError::NotPrintable {
                line,
                name: name.to_owned(),
            });
        }
        if !names.insert(name) {
            return Err(CredentialsError::Duplicate {
                line,
                what: "name",
                name: name.to_owned(),
            });
        }
        if !tokens.insert(token) {
            return Err(CredentialsError::Duplicate {
                line,
                what: "the token of",
                name: name.to_owned(),
            });
        }
        lines.push(TokenLine {
            line,
            name,
            token,
            rest,
        });
    }
    if lines.is_empty() {
        return Err(CredentialsError::Empty);
    }
    Ok(lines)
}

/// Named tokens, each with what it grants (`T`), found by the SHA-256 of
/// the token: a lookup costs the same whatever the number of tokens (a
/// tenant each, at 100 000 tenants), and its time tells nothing of how
/// much of a token matched, only of a hash nobody can aim at.
#[derive(Clone)]
pub(crate) struct TokenTable<T> {
    by_digest: HashMap<[u8; 32], (String, T)>,
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl<T> TokenTable<T> {
    /// The table of `entries` (name, token, grant); tokens are unique
    /// ([`token_lines`] checks).
    pub fn new(entries: Vec<(String, Vec<u8>, T)>) -> Self {
        TokenTable {
            by_digest: entries
                .into_iter()
                .map(|(name, token, grant)| (digest(&token), (name, grant)))
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_digest.values().map(|(name, _)| name.as_str())
    }

    /// The name and grant of the token `presented`.
    pub fn find(&self, presented: &[u8]) -> Option<(&str, &T)> {
        self.by_digest
            .get(&digest(presented))
            .map(|(name, grant)| (name.as_str(), grant))
    }
}

/// The token of an `authorization: Bearer <token>` value. The scheme is
/// case-insensitive (RFC 9110, section 11.1); spaces around the token are
/// not part of it.
pub(crate) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The `authorization` bearer token of a call's headers (its metadata), if
/// it has one.
pub(crate) fn presented_token(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
}

/// Credentials in force, replaced whole by a reload.
pub type Live<T> = Arc<ArcSwap<T>>;

/// A credentials file the server reads at start and again on reload.
pub trait CredentialsFile: Sized + Send + Sync + 'static {
    /// The option naming the file, for messages (`--pod-tokens-file`).
    const OPTION: &'static str;
    fn parse(text: &str) -> Result<Self, CredentialsError>;
    /// How many credentials the file holds, for the log.
    fn count(&self) -> usize;
}

/// Why a credentials file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{option}: read {path}: {source}")]
    Read {
        option: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{option}: {path}: {source}")]
    Parse {
        option: &'static str,
        path: PathBuf,
        #[source]
        source: CredentialsError,
    },
}

/// One credentials file and the credentials read from it.
#[derive(Debug)]
pub struct Watched<T> {
    path: PathBuf,
    live: Live<T>,
    /// The text of the last attempt, to tell a changed file from one that
    /// did not change; `None` if the last attempt could not read it.
    last_text: std::sync::Mutex<Option<String>>,
}

/// What a reload of one file did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// The file is as it was.
    Unchanged,
    /// The file was read and its credentials are in force; how many.
    Replaced(usize),
    /// The file could not be read or parsed; the old credentials stay.
    Failed(String),
}

impl<T: CredentialsFile> Watched<T> {
    /// Reads `path`, failing if it cannot be read or parsed.
    pub fn load(path: &Path) -> Result<Watched<T>, LoadError> {
        let text = read(T::OPTION, path)?;
        let parsed = parse::<T>(path, &text)?;
        Ok(Watched {
            path: path.to_owned(),
            live: Arc::new(ArcSwap::from_pointee(parsed)),
            last_text: std::sync::Mutex::new(Some(text)),
        })
    }

    /// The credentials in force, which reloads update.
    pub fn live(&self) -> Live<T> {
        Arc::clone(&self.live)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file again and puts its credentials in force if it
    /// parses; otherwise keeps the old ones. Unless `force`, a file whose
    /// text is unchanged since the last attempt is left alone (a broken
    /// file is then reported once, not at every poll). Logs the outcome.
    pub fn reload(&self, force: bool) -> Reload {
        let mut last = self.last_text.lock().unwrap_or_else(|p| p.into_inner());
        let outcome = match read(T::OPTION, &self.path) {
            Err(e) => {
                // A file being replaced may be missing for a moment; the
                // next poll or signal tries again. Reported once.
                if !force && last.is_none() {
                    return Reload::Unchanged;
                }
                *last = None;
                Reload::Failed(e.to_string())
            }
            Ok(text) => {
                if !force && last.as_deref() == Some(text.as_str()) {
                    return Reload::Unchanged;
                }
                let outcome = match parse::<T>(&self.path, &text) {
                    Ok(parsed) => {
                        let count = parsed.count();
                        self.live.store(Arc::new(parsed));
                        Reload::Replaced(count)
                    }
                    Err(e) => Reload::Failed(e.to_string()),
                };
                *last = Some(text);
                outcome
            }
        };
        drop(last);
        match &outcome {
            Reload::Replaced(count) => tracing::info!(
                option = T::OPTION,
                path = %self.path.display(),
                credentials = count,
                "credentials reloaded"
            ),
            Reload::Failed(error) => tracing::error!(
                option = T::OPTION,
                path = %self.path.display(),
                error = %error,
                "credentials reload failed; the previous credentials stay in force"
            ),
            Reload::Unchanged => {}
        }
        outcome
    }
}

fn read(option: &'static str, path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        option,
        path: path.to_owned(),
        source,
    })
}

fn parse<T: CredentialsFile>(path: &Path, text: &str) -> Result<T, LoadError> {
    T::parse(text).map_err(|source| LoadError::Parse {
        option: T::OPTION,
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_checked_and_named() {
        let ok = token_lines("# x\na 0123456789abcdef r1\n\nb 0123456789abcdeg", "N T", 1)
            .expect("valid");
        assert_eq!(ok.len(), 2);
        assert_eq!((ok[0].line, ok[0].rest.as_slice()), (2, ["r1"].as_slice()));
        assert_eq!((ok[1].line, ok[1].rest.len()), (4, 0));
        for (text, expected) in [
            (
                "alice",
                CredentialsError::Malformed {
                    line: 1,
                    expected: "N T",
                },
            ),
            (
                "alice 0123456789abcdef a b",
                CredentialsError::Malformed {
                    line: 1,
                    expected: "N T",
                },
            ),
            (
                "\nalice short",
                CredentialsError::TooShort {
                    line: 2,
                    name: "alice".into(),
                },
            ),
            (
                "alice 0123456789abcdef\nalice 0123456789abcdeg",
                CredentialsError::Duplicate {
                    line: 2,
                    what: "name",
                    name: "alice".into(),
                },
            ),
            (
                "alice 0123456789abcdef\nbob 0123456789abcdef",
                CredentialsError::Duplicate {
                    line: 2,
                    what: "the token of",
                    name: "bob".into(),
                },
            ),
            ("# nothing\n", CredentialsError::Empty),
        ] {
            assert_eq!(
                token_lines(text, "N T", 1).map(|_| ()),
                Err(expected),
                "{text:?}"
            );
        }
    }

    #[test]
    fn tokens_are_found_whole() {
        let table = TokenTable::new(vec![
            ("a".into(), b"0123456789abcdef".to_vec(), 1),
            ("b".into(), b"0123456789abcdeg".to_vec(), 2),
        ]);
        assert_eq!(table.find(b"0123456789abcdeg"), Some(("b", &2)));
        assert_eq!(table.find(b"0123456789abcde"), None);
        assert_eq!(table.find(b""), None);
    }

    #[test]
    fn bearer_tokens_in_any_case_of_the_scheme() {
        for value in ["Bearer abc", "bearer abc", "BEARER  abc ", " Bearer abc"] {
            assert_eq!(bearer_token(value), Some("abc"), "{value:?}");
        }
        for value in ["abc", "Bearer", "Bearer ", "Basic abc"] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
    }
}
