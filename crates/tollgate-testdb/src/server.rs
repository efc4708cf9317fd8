//! Where the tests' PostgreSQL server comes from.
//!
//! In order, first usable wins:
//!
//! 1. `DATABASE_URL`, if set: a `postgres://` URL naming an existing database
//!    on the server, used as the maintenance connection. If it cannot be
//!    reached the tests fail: CI sets what it means, and silently testing
//!    against another server would hide that.
//! 2. The local default server: `postgres@127.0.0.1:5432`, then the current
//!    OS user on the unix socket in `/var/run/postgresql` (Debian, Ubuntu)
//!    or `/tmp` (macOS, source builds). The user must be allowed to create
//!    databases.
//! 3. A [`TempCluster`] started for the whole test process, once, on first
//!    use (see the cluster module for how it is cleaned up).
//!
//! If none works, the error says what was tried and what to do. The choice is
//! made once per test process and logged.

use std::str::FromStr;
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::error::pg_error_text;
use crate::{HarnessError, TempCluster};

/// The environment variable naming the server to use.
pub(crate) const DATABASE_URL_VAR: &str = "DATABASE_URL";

/// How long to wait for a server before trying the next one.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Unix socket directories of a local server, in the order tried.
const LOCAL_SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];

/// A server the harness may create databases on.
#[derive(Debug, Clone)]
pub(crate) struct Server {
    /// A `postgres://` URL of an existing database on it, for `CREATE
    /// DATABASE` and `DROP DATABASE`.
    pub(crate) maintenance_url: String,
    /// Where it was found, for the log and the tests.
    pub(crate) source: Source,
}

/// Where a [`Server`] was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// Named by `DATABASE_URL`.
    DatabaseUrl,
    /// The local default server, over TCP or a unix socket.
    Local,
    /// The temporary cluster of the test process.
    TempCluster,
}

impl Server {
    /// The server for this test process: located on first use, then reused.
    pub(crate) async fn for_process() -> Result<&'static Server, HarnessError> {
        static SERVER: OnceCell<Server> = OnceCell::const_new();
        SERVER
            .get_or_try_init(|| async {
                let database_url = database_url_from_env()?;
                let server = Server::locate(database_url.as_deref()).await?;
                tracing::info!(
                    source = ?server.source,
                    url = %redact(&server.maintenance_url),
                    "test databases will be created on this PostgreSQL server"
                );
                Ok(server)
            })
            .await
    }

    /// Finds a server as the module documentation describes, given the value
    /// of `DATABASE_URL` (`None` if unset).
    pub(crate) async fn locate(database_url: Option<&str>) -> Result<Server, HarnessError> {
        if let Some(url) = database_url {
            return Self::from_database_url(url).await;
        }
        let mut attempts = Vec::new();
        for url in local_urls() {
            match check_local(&url).await {
                Ok(()) => {
                    return Ok(Server {
                        maintenance_url: url,
                        source: Source::Local,
                    });
                }
                Err(reason) => attempts.push(format!("{url} ({reason})")),
            }
        }
        match shared_cluster().await {
            Ok(cluster) => Ok(Server {
                maintenance_url: cluster.url("postgres"),
                source: Source::TempCluster,
            }),
            Err(error) => {
                attempts.push(format!("a temporary cluster ({error})"));
                Err(HarnessError::NoServer {
                    attempts: attempts.join("; "),
                })
            }
        }
    }

    /// The server named by `DATABASE_URL`, checked to be a URL and
    /// reachable.
    async fn from_database_url(url: &str) -> Result<Server, HarnessError> {
        let invalid = |reason: String| HarnessError::InvalidDatabaseUrl {
            url: redact(url),
            reason,
        };
        tokio_postgres::Config::from_str(url).map_err(|e| invalid(pg_error_text(&e)))?;
        with_database(url, "postgres").map_err(invalid)?;
        connect_with_timeout(url)
            .await
            .map_err(|error| HarnessError::DatabaseUrlUnreachable {
                url: redact(url),
                error,
            })?;
        Ok(Server {
            maintenance_url: url.to_owned(),
            source: Source::DatabaseUrl,
        })
    }

    /// The URL of `database` on this server: the maintenance URL with the
    /// database name replaced.
    pub(crate) fn database_url(&self, database: &str) -> Result<String, HarnessError> {
        with_database(&self.maintenance_url, database).map_err(|reason| {
            HarnessError::InvalidDatabaseUrl {
                url: redact(&self.maintenance_url),
                reason,
            }
        })
    }
}

/// `DATABASE_URL`, unless unset or blank.
fn database_url_from_env() -> Result<Option<String>, HarnessError> {
    match std::env::var(DATABASE_URL_VAR) {
        Ok(url) if url.trim().is_empty() => Ok(None),
        Ok(url) => Ok(Some(url.trim().to_owned())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(url)) => Err(HarnessError::InvalidDatabaseUrl {
            url: url.to_string_lossy().into_owned(),
            reason: "it is not valid UTF-8".to_owned(),
        }),
    }
}

/// The maintenance URLs of a local server, in the order tried.
fn local_urls() -> Vec<String> {
    let mut urls = vec!["postgres://postgres@127.0.0.1:5432/postgres".to_owned()];
    if let Some(user) = crate::os_user::current_user_name() {
        urls.extend(LOCAL_SOCKET_DIRS.iter().map(|dir| {
            format!(
                "postgres://{}@{}/postgres",
                percent_encode(&user),
                percent_encode(dir)
            )
        }));
    }
    urls
}

/// Whether a local server at `url` answers and lets its user create
/// databases; if not, why.
async fn check_local(url: &str) -> Result<(), String> {
    let client = connect_with_timeout(url)
        .await
        .map_err(|e| pg_error_text(&e))?;
    let row = client
        .query_one(
            "SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .map_err(|e| format!("check the user's privileges: {}", pg_error_text(&e)))?;
    let may_create: bool = row.try_get(0).map_err(|e| pg_error_text(&e))?;
    if may_create {
        Ok(())
    } else {
        Err("the user may not create databases".to_owned())
    }
}

/// The temporary cluster shared by all tests of the process, started on
/// first use and never dropped: its guardian stops it when the process ends.
async fn shared_cluster() -> Result<&'static TempCluster, HarnessError> {
    static CLUSTER: OnceCell<TempCluster> = OnceCell::const_new();
    CLUSTER
        .get_or_try_init(|| async {
            let cluster = tokio::task::spawn_blocking(TempCluster::start)
                .await
                .map_err(|e| {
                    HarnessError::io("start a temporary cluster", std::io::Error::other(e))
                })??;
            tracing::info!(
                port = cluster.port(),
                "no PostgreSQL server found; started a temporary cluster for this test process"
            );
            Ok(cluster)
        })
        .await
}

/// Connects to `url`, giving up after [`CONNECT_TIMEOUT`] unless the URL
/// sets its own `connect_timeout`; the connection is driven by a task on the
/// current runtime.
pub(crate) async fn connect_with_timeout(
    url: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = tokio_postgres::Config::from_str(url)?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        // Tests stop servers and drop databases under open connections on
        // purpose; the client sees the error, so this is not a warning.
        if let Err(error) = connection.await {
            tracing::debug!(%error, "PostgreSQL connection ended with an error");
        }
    });
    Ok(client)
}

/// `url` with its database name (the path) replaced by `database`, keeping
/// user, password, hosts and query parameters. Only the URL form
/// (`postgres://` or `postgresql://`) is accepted: the key-value form cannot
/// be handed on to code that expects URLs.
pub(crate) fn with_database(url: &str, database: &str) -> Result<String, String> {
    let (scheme, rest) = split_scheme(url)?;
    // The authority ends at the first '/' or '?': neither may appear
    // unencoded in user, password or host.
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(authority_end);
    let query = after.find('?').map(|at| &after[at..]).unwrap_or("");
    Ok(format!(
        "{scheme}{authority}/{}{query}",
        percent_encode(database)
    ))
}

/// `url` with its password, if any, replaced by `***`, for messages and logs.
pub(crate) fn redact(url: &str) -> String {
    let Ok((scheme, rest)) = split_scheme(url) else {
        // Key-value form: hide the value of any password=… pair.
        return url
            .split_whitespace()
            .map(|pair| {
                if pair.starts_with("password=") {
                    "password=***"
                } else {
                    pair
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, hosts)) => match user_info.split_once(':') {
            Some((user, _password)) => format!("{scheme}{user}:***@{hosts}{after}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// The scheme (with `://`) and the rest of a `postgres://` URL.
fn split_scheme(url: &str) -> Result<(&str, &str), String> {
    ["postgres://", "postgresql://"]
        .into_iter()
        .find_map(|scheme| url.strip_prefix(scheme).map(|rest| (scheme, rest)))
        .ok_or_else(|| "expected a URL of the form postgres://user@host:port/database".to_owned())
}

/// Percent-encodes everything but unreserved URL characters.
fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_name_is_replaced_and_everything_else_kept() {
        let cases = [
            (
                "postgres://postgres@127.0.0.1:5432/postgres",
                "postgres://postgres@127.0.0.1:5432/t1",
            ),
            (
                "postgresql://u:p%40ss@db.example:6543/app?sslmode=disable&application_name=ci",
                "postgresql://u:p%40ss@db.example:6543/t1?sslmode=disable&application_name=ci",
            ),
            ("postgres://u@h", "postgres://u@h/t1"),
            ("postgres://u@h/", "postgres://u@h/t1"),
            (
                "postgres://u@h?connect_timeout=3",
                "postgres://u@h/t1?connect_timeout=3",
            ),
            (
                "postgres://root@%2Fvar%2Frun%2Fpostgresql/postgres",
                "postgres://root@%2Fvar%2Frun%2Fpostgresql/t1",
            ),
            (
                "postgres://a@h1:5432,h2:5433/x",
                "postgres://a@h1:5432,h2:5433/t1",
            ),
        ];
        for (url, expected) in cases {
            assert_eq!(with_database(url, "t1").as_deref(), Ok(expected), "{url}");
        }
    }

    #[test]
    fn the_key_value_form_is_rejected() {
        assert!(with_database("host=localhost dbname=postgres", "t1").is_err());
    }

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db?sslmode=disable"),
            "postgres://u:***@h:5432/db?sslmode=disable"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact("host=h password=secret dbname=db"),
            "host=h password=*** dbname=db"
        );
    }

    #[test]
    fn the_socket_directory_is_encoded_as_the_host() {
        let config = tokio_postgres::Config::from_str(&format!(
            "postgres://me@{}/postgres",
            percent_encode("/var/run/postgresql")
        ))
        .expect("parse");
        assert_eq!(
            config.get_hosts(),
            [tokio_postgres::config::Host::Unix(
                "/var/run/postgresql".into()
            )]
        );
    }

    #[tokio::test]
    async fn database_url_names_the_server_that_is_used() {
        // Whatever server this process found, named through DATABASE_URL.
        let found = Server::for_process().await.expect("a PostgreSQL server");

        let server = Server::locate(Some(&found.maintenance_url))
            .await
            .expect("the server named by DATABASE_URL");

        assert_eq!(server.source, Source::DatabaseUrl);
        assert_eq!(server.maintenance_url, found.maintenance_url);
        let database = crate::TestDatabase::create_on(&server)
            .await
            .expect("create a database through DATABASE_URL");
        assert_eq!(
            Ok(database.url().to_owned()),
            with_database(&found.maintenance_url, database.name())
        );
        let client = crate::connect(database.url()).await.expect("connect");
        let row = client
            .query_one("SELECT current_database()", &[])
            .await
            .expect("query");
        assert_eq!(row.get::<_, String>(0), database.name());
    }

    #[tokio::test]
    async fn an_unreachable_database_url_fails_naming_it_without_its_password() {
        // Port 1 on the loopback: nothing listens there.
        let url = "postgres://ci:secret@127.0.0.1:1/postgres";

        let error = Server::locate(Some(url))
            .await
            .expect_err("no server there");

        assert!(
            matches!(error, HarnessError::DatabaseUrlUnreachable { .. }),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains("postgres://ci:***@127.0.0.1:1/postgres"),
            "{message}"
        );
        assert!(!message.contains("secret"), "{message}");
    }

    #[tokio::test]
    async fn a_database_url_that_is_not_a_url_is_rejected() {
        let error = Server::locate(Some("host=127.0.0.1 dbname=postgres"))
            .await
            .expect_err("not a URL");
        assert!(
            matches!(error, HarnessError::InvalidDatabaseUrl { .. }),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn without_database_url_a_local_server_or_a_temporary_cluster_is_used() {
        let server = Server::locate(None).await.expect("a PostgreSQL server");
        assert_ne!(server.source, Source::DatabaseUrl);
        crate::connect(&server.maintenance_url)
            .await
            .expect("connect to the server found");
    }
}
