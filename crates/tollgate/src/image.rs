//! `tollgate export` and `tollgate import`: a whole store as JSON lines,
//! for backups and for moving between the embedded store and PostgreSQL.
//!
//! Both work on a store directly, as `migrate` does, not through a server.
//! The embedded store is one process's file, so a server on it must be
//! stopped first; a PostgreSQL store exports while servers run (one
//! snapshot), and an import holds off their writes until it commits.
//! An export file is checked whole before an import touches the store,
//! and an import is one transaction: a store gets all of it or nothing.
//! Export never makes a store file (a mistyped path is an error, not an
//! empty export); import makes the file it is to fill when it is missing.
//!
//! `export --out FILE` writes `FILE.partial`, synced and renamed over
//! `FILE` once the end line is written, so `FILE` is never a partial
//! export; without `--out` the export goes to stdout. `import FILE` (or
//! `-` for stdin) refuses a store that holds anything unless `--replace`.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::Serialize;
use tokio::sync::mpsc;
use tollgate_server::store::image::write_line;
use tollgate_server::store::{
    BucketSettings, Counts, Record, RecordSink, Store, StoreError, StoreImage,
};

use crate::output;
use crate::store::{self, Creation, PostgresPool, StoreLocation};

/// Where `export` and `import` find their store.
#[derive(Debug, Args)]
pub struct StoreArg {
    /// The store: a PostgreSQL URL or an embedded store file [default:
    /// $DATABASE_URL; one of them is required].
    #[arg(long, env = "TOLLGATE_STORE")]
    store: Option<String>,

    /// PostgreSQL: a PEM file of certificate authorities to trust besides
    /// the system's; turns TLS on (as `sslmode=require` in the URL does).
    #[arg(long, env = "TOLLGATE_PG_CA_FILE", value_name = "FILE")]
    pg_ca_file: Option<PathBuf>,
}

impl StoreArg {
    async fn open(&self, creation: Creation) -> anyhow::Result<(StoreLocation, Arc<dyn Store>)> {
        let location = StoreLocation::named(self.store.as_deref())?;
        let pool = PostgresPool {
            pool_size: 2,
            max_batch: 1,
            connect_timeout: Duration::from_secs(5),
            ca_file: self.pg_ca_file.clone(),
        };
        let store = store::open(&location, creation, &pool, BucketSettings::default()).await?;
        Ok((location, store))
    }
}

/// Arguments of `tollgate export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    store: StoreArg,

    /// Write the export to FILE (whole or not at all: it is written beside
    /// it and renamed when complete) instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// Arguments of `tollgate import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(flatten)]
    store: StoreArg,

    /// The export to load, or `-` for stdin.
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Replace everything the store holds. Without it, a store that holds
    /// any tier, tenant, bucket or key is left as it is and the import
    /// refused.
    #[arg(long)]
    replace: bool,

    /// Print JSON instead of a line of text.
    #[arg(long)]
    json: bool,
}

/// What `export` says on stderr and `import --json` prints.
#[derive(Debug, Serialize)]
struct Summary {
    store: store::StoreView,
    #[serde(flatten)]
    counts: Counts,
}

/// Writes a consistent snapshot of the store as JSON lines.
pub async fn export(args: ExportArgs) -> anyhow::Result<()> {
    let (location, store) = args
        .store
        .open(Creation::Refused {
            hint: "export reads an existing store: check the path",
        })
        .await?;
    let (tx, rx) = mpsc::channel(1024);
    let out = args.out.clone();
    let writer = tokio::task::spawn_blocking(move || write_records(rx, out.as_deref()));
    let exported = store.export(RecordSink::new(tx)).await;
    // The writer's failure (a full disk, a closed pipe) explains the
    // store's, which only saw its reader go.
    let written = writer.await.context("the export's writer failed")?;
    store.close().await?;
    written?;
    let counts = exported.with_context(|| format!("export {}", location.describe()))?;
    let to = args
        .out
        .as_ref()
        .map_or("stdout".to_owned(), |p| p.display().to_string());
    eprintln!("exported {counts} from {} to {to}", location.describe());
    Ok(())
}

/// Writes the records from `rx` to `out` (stdout if `None`): to a file
/// beside `out` first, renamed over it once the end line is written and
/// synced, so that `out` is never a partial export.
fn write_records(mut rx: mpsc::Receiver<Record>, out: Option<&Path>) -> anyhow::Result<()> {
    let Some(out) = out else {
        let mut stdout = BufWriter::new(std::io::stdout().lock());
        return write_through(&mut rx, &mut stdout).context("write the export to stdout");
    };
    let partial = partial_path(out);
    let file = File::create(&partial).with_context(|| format!("create {}", partial.display()))?;
    let mut writer = BufWriter::new(file);
    let written =
        write_through(&mut rx, &mut writer).and_then(|()| Ok(writer.get_ref().sync_all()?));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e.context(format!("write {}", out.display())));
    }
    std::fs::rename(&partial, out)
        .with_context(|| format!("rename {} to {}", partial.display(), out.display()))
}

/// Writes every record from `rx` to `out` as a line and flushes it; an
/// error if the records stop before the end line.
fn write_through(rx: &mut mpsc::Receiver<Record>, out: &mut impl Write) -> anyhow::Result<()> {
    let mut ended = false;
    while let Some(record) = rx.blocking_recv() {
        ended = matches!(record, Record::End(_));
        write_line(out, &record)?;
    }
    out.flush()?;
    anyhow::ensure!(ended, "the export stopped before its end");
    Ok(())
}

/// `out` with `.partial` added to its name.
fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_owned();
    name.push(".partial");
    out.with_file_name(name)
}

/// Loads an export into a store, in one transaction.
pub async fn import(args: ImportArgs) -> anyhow::Result<()> {
    let file = args.file.clone();
    let image = tokio::task::spawn_blocking(move || read_image(&file))
        .await
        .context("the export's reader failed")??;
    let (location, store) = args
        .store
        .open(Creation::Allowed {
            why: "import fills a new store",
        })
        .await?;
    let imported = store.import(image, args.replace).await;
    store.close().await?;
    let counts = match imported {
        Err(e @ StoreError::NotEmpty(_)) => anyhow::bail!(
            "{} was not imported into {}: {e}; pass --replace to replace what it holds",
            args.file.display(),
            location.describe()
        ),
        imported => imported.with_context(|| {
            format!(
                "import {} into {}",
                args.file.display(),
                location.describe()
            )
        })?,
    };
    let summary = Summary {
        store: location
            .view()
            .context("--store: not a valid PostgreSQL URL")?,
        counts,
    };
    output::print(args.json, &summary, |s| {
        format!("imported {} into {}", s.counts, location.describe())
    })
}

fn read_image(file: &Path) -> anyhow::Result<StoreImage> {
    let read = if file == Path::new("-") {
        StoreImage::read(std::io::stdin().lock())
    } else {
        let opened = File::open(file).with_context(|| format!("open {}", file.display()))?;
        StoreImage::read(BufReader::new(opened))
    };
    read.with_context(|| format!("{} was not loaded", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_files_sit_beside_the_export() {
        assert_eq!(
            partial_path(Path::new("/backups/tollgate.jsonl")),
            PathBuf::from("/backups/tollgate.jsonl.partial")
        );
        assert_eq!(partial_path(Path::new("out")), PathBuf::from("out.partial"));
    }
}
