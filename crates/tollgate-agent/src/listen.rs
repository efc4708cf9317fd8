//! Where the agent listens and what it holds on disk, made safe to start
//! twice by mistake.
//!
//! - The Unix socket ([`bind_socket`]): its directory is made if needed; a
//!   socket file left by an agent that died is replaced, but only once
//!   nothing answers on it: a second agent on the same path fails with a
//!   clear error instead of stealing the first one's callers. The socket
//!   is bound under a temporary name, given its mode, then renamed into
//!   place, so no caller ever sees it with the wrong permissions. The file
//!   is removed when the [`BoundSocket`] is dropped, if it is still ours.
//! - The TCP listener ([`check_loopback`]) is for callers on the same
//!   host only: anything else reaching it would act with the agent's pod
//!   token.
//! - The state directory ([`StateDir::lock`]): made if needed, and held
//!   with an exclusive lock on `<dir>/lock` for the agent's life, so two
//!   agents never share one (the journal lives there). The lock goes with
//!   the process, however it ends.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a listener or the state directory could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error(
        "--socket {path}: another tollgate agent is listening on it; stop it first, or give this one another --socket"
    )]
    SocketInUse { path: PathBuf },
    #[error("--socket {path}: it exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("--socket {path}: {action}: {source}")]
    Socket {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "--listen {address}: only a loopback address (127.0.0.1, ::1) is allowed: a TCP caller acts with the agent's pod token"
    )]
    NotLoopback { address: SocketAddr },
    #[error(
        "--state-dir {dir}: another tollgate agent holds it{holder} (one state directory per agent)"
    )]
    StateDirInUse { dir: PathBuf, holder: String },
    #[error("--state-dir {dir}: {action}: {source}")]
    StateDir {
        dir: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The socket file the agent made: removed when dropped, if the file at
/// its path is still the one it bound.
#[derive(Debug)]
pub struct BoundSocket {
    path: PathBuf,
    identity: (u64, u64),
}

impl BoundSocket {
    /// The socket's absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == self.identity);
        if ours && let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the agent's socket file");
        }
    }
}

/// Binds the Unix socket at `path` with file mode `mode` (see the module
/// docs). Must be called within a tokio runtime.
pub fn bind_socket(
    path: &Path,
    mode: u32,
) -> Result<(tokio::net::UnixListener, BoundSocket), ListenError> {
    let fail = |action: &'static str| {
        let path = path.to_owned();
        move |source| ListenError::Socket {
            path,
            action,
            source,
        }
    };
    let path = std::path::absolute(path).map_err(fail("make the path absolute"))?;
    let fail = |action: &'static str| {
        let path = path.clone();
        move |source| ListenError::Socket {
            path,
            action,
            source,
        }
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(fail("create its directory"))?;
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(&path) {
                Ok(_) => return Err(ListenError::SocketInUse { path }),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    tracing::info!(path = %path.display(), "replacing a stale socket file nothing listens on");
                }
                Err(e) => return Err(fail("check whether an agent listens on it")(e)),
            }
        }
        Ok(_) => return Err(ListenError::NotASocket { path }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail("read it")(e)),
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    match std::fs::remove_file(&temporary) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(fail("remove a temporary socket left by this process id")(e));
        }
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(&temporary).map_err(fail("bind"))?;
    let placed = std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode))
        .map_err(fail("set its mode"))
        .and_then(|()| std::fs::rename(&temporary, &path).map_err(fail("move it into place")));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&temporary);
        return Err(e);
    }
    let meta = std::fs::symlink_metadata(&path).map_err(fail("read it back"))?;
    Ok((
        listener,
        BoundSocket {
            path,
            identity: (meta.dev(), meta.ino()),
        },
    ))
}

/// Refuses a TCP address that is not loopback.
pub fn check_loopback(address: SocketAddr) -> Result<(), ListenError> {
    if address.ip().is_loopback() {
        Ok(())
    } else {
        Err(ListenError::NotLoopback { address })
    }
}

/// The agent's state directory, locked for its life.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    /// Holds the lock; closing the file lets it go.
    _lock: File,
}

impl StateDir {
    /// Makes `dir` if needed and takes the exclusive lock on `<dir>/lock`,
    /// writing this process's id in it (which a second agent's error
    /// names).
    pub fn lock(dir: &Path) -> Result<StateDir, ListenError> {
        let fail = |action: &'static str| {
            let dir = dir.to_owned();
            move |source| ListenError::StateDir {
                dir,
                action,
                source,
            }
        };
        let path = std::path::absolute(dir).map_err(fail("make the path absolute"))?;
        std::fs::create_dir_all(&path).map_err(fail("create it"))?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path.join("lock"))
            .map_err(fail("open its lock file"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() {
                    String::new()
                } else {
                    format!(" (process {holder})")
                };
                return Err(ListenError::StateDirInUse { dir: path, holder });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(fail("lock it")(e)),
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .map_err(fail("write its lock file"))?;
        Ok(StateDir { path, _lock: file })
    }

    /// The directory's absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_state_dir_fails_naming_the_holder() {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("state");
        let first = StateDir::lock(&state).expect("first");
        assert!(first.path().is_absolute());
        let second = StateDir::lock(&state).expect_err("held");
        let text = second.to_string();
        assert!(text.contains("another tollgate agent"), "{text}");
        assert!(text.contains(&std::process::id().to_string()), "{text}");
        drop(first);
        StateDir::lock(&state).expect("free again");
    }

    #[test]
    fn only_loopback_addresses_are_listened_on() {
        check_loopback("127.0.0.1:9000".parse().expect("address")).expect("v4");
        check_loopback("[::1]:9000".parse().expect("address")).expect("v6");
        let error = check_loopback("0.0.0.0:9000".parse().expect("address")).expect_err("any");
        assert!(error.to_string().contains("loopback"), "{error}");
    }

    #[tokio::test]
    async fn a_socket_is_replaced_only_when_nothing_answers_on_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("run/agent.sock");
        let (listener, bound) = bind_socket(&path, 0o640).expect("bound");
        let mode = std::fs::metadata(&path)
            .expect("exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        // Somebody listens: refused.
        let in_use = bind_socket(&path, 0o660).expect_err("in use");
        assert!(
            matches!(in_use, ListenError::SocketInUse { .. }),
            "{in_use}"
        );
        // The listener dies without removing the file: replaced.
        drop(listener);
        std::mem::forget(bound);
        let (_listener, bound) = bind_socket(&path, 0o660).expect("stale replaced");
        drop(bound);
        assert!(!path.exists(), "removed with its owner");
        // A file that is not a socket is never replaced.
        std::fs::write(&path, "data").expect("write");
        let not_socket = bind_socket(&path, 0o660).expect_err("not a socket");
        assert!(matches!(not_socket, ListenError::NotASocket { .. }));
        assert_eq!(std::fs::read_to_string(&path).expect("kept"), "data");
    }
}
