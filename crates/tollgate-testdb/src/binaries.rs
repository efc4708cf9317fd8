//! Finding PostgreSQL's server programs (`initdb`, `pg_ctl`).
//!
//! Distributions put them in different places and rarely on `PATH` (Debian:
//! `/usr/lib/postgresql/<version>/bin`). The search order, first match wins:
//! `TOLLGATE_PG_BINDIR`, `pg_config --bindir`, the highest version under
//! `/usr/lib/postgresql`, `/usr/local/pgsql/bin`, then `PATH`. A directory
//! counts only if it holds both `initdb` and `pg_ctl` (Debian's `pg_config`
//! from libpq-dev answers `/usr/bin`, which holds neither).

use std::path::{Path, PathBuf};

use crate::HarnessError;
use crate::os_user::command_output;

/// The environment variable naming the directory of the server programs.
pub(crate) const BINDIR_VAR: &str = "TOLLGATE_PG_BINDIR";

/// A directory holding `initdb` and `pg_ctl`.
#[derive(Debug, Clone)]
pub(crate) struct PgBinaries {
    /// The directory.
    dir: PathBuf,
}

impl PgBinaries {
    /// Searches the usual places, in the order of the module documentation.
    /// If `TOLLGATE_PG_BINDIR` is set it is the only place looked at: a
    /// developer who set it wants those programs, not whichever come next.
    pub(crate) fn find() -> Result<Self, HarnessError> {
        if let Some(dir) = std::env::var_os(BINDIR_VAR).filter(|dir| !dir.is_empty()) {
            let dir = PathBuf::from(dir);
            return if holds_server_programs(&dir) {
                Ok(Self { dir })
            } else {
                Err(HarnessError::BinariesNotFound {
                    searched: format!("{BINDIR_VAR}={}", dir.display()),
                })
            };
        }
        let candidates = candidates();
        match candidates.iter().find(|dir| holds_server_programs(dir)) {
            Some(dir) => Ok(Self { dir: dir.clone() }),
            None => Err(HarnessError::BinariesNotFound {
                searched: candidates
                    .iter()
                    .map(|dir| dir.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The path of one of the programs, e.g. `program("pg_ctl")`.
    pub(crate) fn program(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// The directories to search when `TOLLGATE_PG_BINDIR` is unset, in order.
fn candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = command_output("pg_config", &["--bindir"]) {
        dirs.push(PathBuf::from(dir));
    }
    dirs.extend(versioned_dirs(Path::new("/usr/lib/postgresql")));
    dirs.push(PathBuf::from("/usr/local/pgsql/bin"));
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs
}

/// `<root>/<version>/bin` for every version directory under `root`, highest
/// version first ("15" before "9.6").
fn versioned_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut versions: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = parse_version(entry.file_name().to_str()?)?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    versions.sort_by(|a, b| b.0.cmp(&a.0));
    versions.into_iter().map(|(_, dir)| dir).collect()
}

/// "9.6" → [9, 6]; `None` for anything that is not a version.
fn parse_version(name: &str) -> Option<Vec<u32>> {
    name.split('.').map(|part| part.parse().ok()).collect()
}

/// Whether `dir` has both programs the harness runs.
fn holds_server_programs(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_numerically_highest_first() {
        let root = tempfile::tempdir().expect("temp dir");
        for version in ["9.6", "15", "13", "not-a-version"] {
            std::fs::create_dir(root.path().join(version)).expect("version dir");
        }
        let found = versioned_dirs(root.path());
        let names: Vec<_> = found
            .iter()
            .map(|dir| dir.parent().and_then(Path::file_name).map(|n| n.to_owned()))
            .collect();
        assert_eq!(
            names,
            [Some("15".into()), Some("13".into()), Some("9.6".into())]
        );
    }

    #[test]
    fn a_directory_without_initdb_does_not_count() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("pg_ctl"), "").expect("pg_ctl");
        assert!(!holds_server_programs(dir.path()));
        std::fs::write(dir.path().join("initdb"), "").expect("initdb");
        assert!(holds_server_programs(dir.path()));
    }
}
