//! Who the test process runs as.
//!
//! `initdb` refuses to run as root, so a temporary cluster started by root
//! must be run as `postgres`; and a local server is often reachable on its
//! unix socket only as the current OS user. Both are found without a libc
//! binding: `/proc/self/status` on Linux, `id` elsewhere.

use std::process::Command;

/// Whether the process's effective user is root.
pub(crate) fn is_root() -> bool {
    effective_uid() == Some(0)
}

/// The effective user id, from `/proc/self/status` or, where there is no
/// `/proc`, from `id -u`. `None` if neither answers.
fn effective_uid() -> Option<u32> {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        // "Uid:\t<real>\t<effective>\t<saved>\t<filesystem>"
        if let Some(uid) = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            .and_then(|id| id.parse().ok())
        {
            return Some(uid);
        }
    }
    command_output("id", &["-u"]).and_then(|id| id.parse().ok())
}

/// The name of the user the process runs as: `USER`, then `LOGNAME`, then
/// `id -un` (containers often set neither variable).
pub(crate) fn current_user_name() -> Option<String> {
    ["USER", "LOGNAME"]
        .into_iter()
        .filter_map(|var| std::env::var(var).ok())
        .find(|name| !name.is_empty())
        .or_else(|| command_output("id", &["-un"]))
}

/// The trimmed standard output of a command that succeeded, if it printed
/// anything.
pub(crate) fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_uid_agrees_with_id() {
        let from_id = command_output("id", &["-u"]).and_then(|id| id.parse::<u32>().ok());
        assert_eq!(effective_uid(), from_id);
    }

    #[test]
    fn the_current_user_has_a_name() {
        let name = current_user_name().expect("a user name");
        assert!(!name.is_empty());
    }
}
