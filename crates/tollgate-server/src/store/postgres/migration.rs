//! The schema: `sql/migrations`, applied at start by [`migrate`] (or up to
//! a version by [`migrate_to`]), safely from several replicas at once.

use super::*;

mod embedded_migrations {
    refinery::embed_migrations!("../../sql/migrations");
}

/// The session advisory lock migrations hold (any constant of our own;
/// "tollgate" in ASCII).
const MIGRATION_LOCK: i64 = 0x746f_6c6c_6761_7465;

/// Applies the schema migrations in `sql/migrations` to the database at
/// `url`, over TLS as `tls` and the URL say. Applying them again is
/// harmless; several replicas starting at once are fine too: each takes
/// the migrations' advisory lock first, so they apply them one after
/// another, the later ones finding them applied (and a failed attempt is
/// retried).
pub async fn migrate(url: &str, tls: &PostgresTls) -> Result<(), StoreError> {
    let config = parse_url(url)?;
    let connector = tls::connector(&config, tls)?;
    migrate_with(&config, connector.as_ref(), None).await
}

/// Like [`migrate`], but stops at schema `version`: what a server of that
/// version would have made of the database (for upgrade tests, and to
/// stage an upgrade).
pub async fn migrate_to(url: &str, tls: &PostgresTls, version: u32) -> Result<(), StoreError> {
    let config = parse_url(url)?;
    let connector = tls::connector(&config, tls)?;
    migrate_with(&config, connector.as_ref(), Some(version)).await
}

/// [`migrate`] with the URL parsed and the TLS connector (if any) built.
pub(super) async fn migrate_with(
    config: &tokio_postgres::Config,
    connector: Option<&MakeRustlsConnect>,
    version: Option<u32>,
) -> Result<(), StoreError> {
    let policy = RetryPolicy::default();
    let mut attempt = 1;
    loop {
        let outcome = match connector {
            Some(tls) => migrate_once(config, tls.clone(), version).await,
            None => migrate_once(config, NoTls, version).await,
        };
        match outcome {
            Ok(applied) => {
                for name in applied {
                    tracing::info!(migration = %name, "applied schema migration");
                }
                return Ok(());
            }
            Err(e) if attempt < 5 => {
                tracing::warn!(error = %e, attempt, "schema migration failed; retrying");
                tokio::time::sleep(policy.delay(attempt).max(Duration::from_millis(50))).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

pub(super) async fn migrate_once<T>(
    config: &tokio_postgres::Config,
    tls: T,
    version: Option<u32>,
) -> Result<Vec<String>, StoreError>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (mut client, connection) = config
        .connect(tls)
        .await
        .map_err(|e| StoreError::Unavailable(format!("connect to PostgreSQL: {}", chain(&e))))?;
    let connection = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "migration connection closed");
        }
    });
    // Held until the connection closes, below: replicas starting at once
    // migrate one after another instead of racing for the same versions.
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| StoreError::internal("take the migrations' lock", e))?;
    let target = version.map_or(refinery::Target::Latest, |v| {
        refinery::Target::Version(v.try_into().unwrap_or(refinery::SchemaVersion::MAX))
    });
    let report = embedded_migrations::migrations::runner()
        .set_target(target)
        .run_async(&mut client)
        .await
        .map_err(|e| StoreError::internal("apply schema migrations", e));
    drop(client);
    let _ = connection.await;
    Ok(report?
        .applied_migrations()
        .iter()
        .map(ToString::to_string)
        .collect())
}
