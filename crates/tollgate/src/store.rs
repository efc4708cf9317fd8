//! Where the server keeps its state: `--store` names an embedded store file
//! or a PostgreSQL database (`--in-memory` keeps it in memory), and
//! `tollgate migrate` prepares either.
//!
//! A new embedded store file is made only when the caller allows it
//! ([`Creation`]): a server pointed at a file that is not there would
//! otherwise serve an empty store, every tenant back at the default limits
//! and every total gone. The log names the file by its absolute path and
//! says whether it was opened or made, and why.
//! `serve` may make one when given `--create`, or for its default file on
//! the first run (no `--store` given); `import` makes the file it is to
//! fill. Anything else missing is an error naming the absolute path.
//!
//! `tollgate migrate` (and `export`, `import`) take `--store`, else
//! `TOLLGATE_STORE`, else `DATABASE_URL`; unlike `serve` they assume no
//! default file and refuse instead ([`StoreLocation::named`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::Serialize;
use tollgate_server::store::postgres::{self, PostgresTls};
use tollgate_server::store::{
    BucketSettings, EmbeddedStore, PostgresOptions, PostgresStore, Store,
};

use crate::output;

/// The embedded store file used when neither `--store`, `TOLLGATE_STORE`
/// nor `DATABASE_URL` says otherwise.
pub const DEFAULT_STORE_FILE: &str = "tollgate.redb";

/// Where state is kept.
#[derive(Clone, Debug, PartialEq)]
pub enum StoreLocation {
    /// An embedded store file (made if missing only as [`Creation`] allows).
    File(PathBuf),
    /// A PostgreSQL (or compatible) database URL.
    Postgres(String),
    /// Memory: everything is lost when the server stops.
    Memory,
}

impl StoreLocation {
    /// `postgres://…` and `postgresql://…` name a database; anything else is
    /// a file path.
    pub fn parse(location: &str) -> StoreLocation {
        if location.starts_with("postgres://") || location.starts_with("postgresql://") {
            StoreLocation::Postgres(location.to_owned())
        } else {
            StoreLocation::File(PathBuf::from(location))
        }
    }

    /// The `--store` flag (or `TOLLGATE_STORE`), else `DATABASE_URL`, else
    /// the default file.
    pub fn resolve(flag: Option<&str>) -> StoreLocation {
        match flag {
            Some(location) => StoreLocation::parse(location),
            None => match std::env::var("DATABASE_URL") {
                Ok(url) if !url.is_empty() => StoreLocation::parse(&url),
                _ => StoreLocation::default_file(),
            },
        }
    }

    /// Like [`resolve`](Self::resolve), but without the default file: for
    /// the commands that work on a store rather than serve it (`migrate`,
    /// `export`, `import`), where a store nobody named would be an empty
    /// one made in the working directory.
    pub fn named(flag: Option<&str>) -> anyhow::Result<StoreLocation> {
        match StoreLocation::resolve(flag) {
            StoreLocation::File(path) if flag.is_none() => anyhow::bail!(
                "which store? Give --store PATH|URL (or TOLLGATE_STORE or DATABASE_URL); {} was not assumed",
                path.display()
            ),
            location => Ok(location),
        }
    }

    /// `tollgate.redb` in the working directory.
    pub fn default_file() -> StoreLocation {
        StoreLocation::File(PathBuf::from(DEFAULT_STORE_FILE))
    }

    /// A description for logs and errors, without any password; a file by
    /// its absolute path.
    pub fn describe(&self) -> String {
        if let StoreLocation::File(path) = self {
            return format!("file {}", absolute(path).display());
        }
        match self.view() {
            Some(StoreView::Postgres { database, hosts }) => format!(
                "PostgreSQL database {} on {}",
                database.as_deref().unwrap_or("(default)"),
                hosts.join(",")
            ),
            Some(StoreView::Memory) => "memory".to_owned(),
            Some(StoreView::File { path }) => format!("file {path}"),
            None => "PostgreSQL database (unparsable URL)".to_owned(),
        }
    }

    /// Where the store is, without any password; `None` for a PostgreSQL
    /// URL that does not parse.
    pub fn view(&self) -> Option<StoreView> {
        Some(match self {
            StoreLocation::File(path) => StoreView::File {
                path: path.display().to_string(),
            },
            StoreLocation::Postgres(url) => {
                let config = url.parse::<tokio_postgres::Config>().ok()?;
                StoreView::Postgres {
                    database: config.get_dbname().map(str::to_owned),
                    hosts: config
                        .get_hosts()
                        .iter()
                        .map(|h| match h {
                            tokio_postgres::config::Host::Tcp(name) => name.clone(),
                            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                        })
                        .collect(),
                }
            }
            StoreLocation::Memory => StoreView::Memory,
        })
    }
}

/// Where a store is, without any password, as `migrate --json` prints it:
/// `{"kind": "file", "path": …}` or `{"kind": "postgres", "database": …,
/// "hosts": […]}`.
#[derive(Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StoreView {
    File {
        path: String,
    },
    Postgres {
        /// `None` when the URL names none (PostgreSQL then takes the user's
        /// name).
        database: Option<String>,
        /// Host names, or the directories of unix sockets.
        hosts: Vec<String>,
    },
    Memory,
}

/// How the PostgreSQL store uses its database (`--pg-*`).
#[derive(Clone, Debug, PartialEq)]
pub struct PostgresPool {
    /// Connections in the pool (transactions in flight at once).
    pub pool_size: usize,
    /// The most token-bucket requests served by one transaction (per-key
    /// checks: four times as many).
    pub max_batch: usize,
    /// How long to wait for a new or a free connection.
    pub connect_timeout: Duration,
    /// CA certificates to trust besides the system's; turns TLS on.
    pub ca_file: Option<PathBuf>,
}

impl PostgresPool {
    fn options(&self, url: &str) -> PostgresOptions {
        let mut options = PostgresOptions::new(url);
        options.pool_size = self.pool_size;
        options.max_batch = self.max_batch;
        options.connect_timeout = self.connect_timeout;
        options.tls = PostgresTls {
            ca_file: self.ca_file.clone(),
        };
        options
    }
}

/// `path` made absolute against the working directory (symbolic links
/// left as they are), or as it is if the working directory is unknown.
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// Whether opening an embedded store file may make a new, empty one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Creation {
    /// A missing file is an error; `hint` says how to go on.
    Refused { hint: &'static str },
    /// A missing file is made; `why` says for the log why that is right.
    Allowed { why: &'static str },
}

/// Opens the store at `location` (applying PostgreSQL migrations first);
/// an embedded store file that does not exist is made only as `creation`
/// allows.
pub async fn open(
    location: &StoreLocation,
    creation: Creation,
    postgres: &PostgresPool,
    settings: BucketSettings,
) -> anyhow::Result<Arc<dyn Store>> {
    let store: Arc<dyn Store> = match location {
        StoreLocation::Memory => {
            tracing::warn!("in-memory store: all state is lost when the server stops");
            Arc::new(EmbeddedStore::in_memory(settings)?)
        }
        StoreLocation::File(path) => {
            let exists = path
                .try_exists()
                .with_context(|| format!("look for the store {}", location.describe()))?;
            let store = match (exists, creation) {
                (false, Creation::Refused { hint }) => anyhow::bail!(
                    "no store file at {}: nothing was created; {hint}",
                    absolute(path).display()
                ),
                (true, _) | (false, Creation::Allowed { .. }) => {
                    EmbeddedStore::open(path, settings)
                        .with_context(|| format!("open the store {}", location.describe()))?
                }
            };
            match (exists, creation) {
                (false, Creation::Allowed { why }) => tracing::warn!(
                    store = %location.describe(),
                    created = true,
                    "store created: a new, empty embedded store ({why})"
                ),
                _ => tracing::info!(
                    store = %location.describe(),
                    created = false,
                    "store opened: an existing embedded store file"
                ),
            }
            Arc::new(store)
        }
        StoreLocation::Postgres(url) => {
            let store = PostgresStore::connect(postgres.options(url), settings)
                .await
                .with_context(|| format!("open the store {}", location.describe()))?;
            tracing::info!(store = %location.describe(), "store opened");
            Arc::new(store)
        }
    };
    Ok(store)
}

/// Arguments of `tollgate migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The store to prepare: a PostgreSQL URL or an embedded store file
    /// [default: $DATABASE_URL; one of them is required].
    #[arg(long, env = "TOLLGATE_STORE")]
    store: Option<String>,

    /// PostgreSQL: a PEM file of certificate authorities to trust besides
    /// the system's; turns TLS on (as `sslmode=require` in the URL does).
    #[arg(long, env = "TOLLGATE_PG_CA_FILE", value_name = "FILE")]
    pg_ca_file: Option<PathBuf>,

    /// Print JSON instead of a line of text.
    #[arg(long)]
    json: bool,
}

/// What `migrate --json` prints.
#[derive(Debug, Serialize)]
struct MigrationJson {
    store: StoreView,
    /// Whether migrate created the embedded store file (false: the file was
    /// there and its schema was checked, and converted if old). `None` for
    /// PostgreSQL, whose applied migrations are logged on stderr instead.
    created: Option<bool>,
}

/// Brings the store's schema up to date; harmless when it already is.
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    let location = StoreLocation::named(args.store.as_deref())?;
    let mut created = None;
    match &location {
        StoreLocation::Postgres(url) => {
            url.parse::<tokio_postgres::Config>()
                .context("--store: not a valid PostgreSQL URL")?;
            let tls = PostgresTls {
                ca_file: args.pg_ca_file.clone(),
            };
            postgres::migrate(url, &tls)
                .await
                .with_context(|| format!("migrate {}", location.describe()))?;
        }
        StoreLocation::File(path) => {
            // Opening the file creates or checks its schema.
            created = Some(matches!(path.try_exists(), Ok(false)));
            let store = EmbeddedStore::open(path, BucketSettings::default())
                .with_context(|| format!("migrate {}", location.describe()))?;
            store.close().await?;
        }
        StoreLocation::Memory => {}
    }
    let migration = MigrationJson {
        store: location
            .view()
            .context("--store: not a valid PostgreSQL URL")?,
        created,
    };
    output::print(args.json, &migration, |m| {
        let what = if m.created == Some(true) {
            "created, schema is up to date"
        } else {
            "schema is up to date"
        };
        format!("{}: {what}", location.describe())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_databases_and_anything_else_a_file() {
        assert_eq!(
            StoreLocation::parse("postgres://u@h/db"),
            StoreLocation::Postgres("postgres://u@h/db".into())
        );
        assert_eq!(
            StoreLocation::parse("postgresql://h/db"),
            StoreLocation::Postgres("postgresql://h/db".into())
        );
        assert_eq!(
            StoreLocation::parse("data/tollgate.redb"),
            StoreLocation::File(PathBuf::from("data/tollgate.redb"))
        );
    }

    #[test]
    fn descriptions_leave_out_passwords() {
        let described =
            StoreLocation::parse("postgres://user:secret@db.internal:5432/usage").describe();
        assert!(!described.contains("secret"), "{described}");
        assert!(described.contains("usage") && described.contains("db.internal"));
    }

    #[test]
    fn views_name_database_and_hosts_without_passwords() {
        let view = StoreLocation::parse("postgres://user:secret@db.internal:5432/usage").view();
        assert_eq!(
            serde_json::to_value(view).expect("serialize"),
            serde_json::json!({"kind": "postgres", "database": "usage", "hosts": ["db.internal"]})
        );
        assert_eq!(
            StoreLocation::parse("postgres://h:notaport/db").view(),
            None
        );
    }
}
