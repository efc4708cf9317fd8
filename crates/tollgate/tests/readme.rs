//! The README's commands, run as pasted: every fenced `sh` block of the
//! section "Configure a tenant and watch its usage" (with "Tiers" and
//! "Per-key limits"), in README order, as one shell script each, against a
//! server the test starts as the quick start does, in a directory holding
//! the README's `tiers.toml`. A command of the README that fails is a
//! failing test.

mod support;

use std::path::Path;
use std::process::Stdio;

use support::Server;

/// The section whose commands must run as pasted, up to the next `## `.
const SECTION: &str = "## Configure a tenant and watch its usage";

/// Lines the test leaves out, and why: each must match a line of the
/// section, so the list cannot outlive what it excuses.
const SKIPPED: &[(&str, &str)] = &[
    (
        "watch -n 1 ",
        "refreshes in a second terminal until stopped",
    ),
    ("cargo run ", "builds and runs programs of its own"),
];

/// The fenced blocks of `language` in `text`, in order.
fn fenced<'a>(text: &'a str, language: &str) -> Vec<&'a str> {
    let open = format!("```{language}\n");
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&open) {
        let body = &rest[start + open.len()..];
        let end = body.find("```").expect("a closed fence");
        blocks.push(&body[..end]);
        rest = &body[end + 3..];
    }
    blocks
}

/// The README's text of [`SECTION`], subsections included.
fn section(readme: &str) -> &str {
    let start = readme.find(SECTION).expect("the section in README.md");
    let body = &readme[start + SECTION.len()..];
    let end = body.find("\n## ").unwrap_or(body.len());
    &body[..end]
}

#[test]
fn readme_commands_run_as_pasted_in_order() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let section = section(&readme);

    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    // The tiers file the commands apply is the README's own.
    let tiers: Vec<&str> = fenced(section, "toml")
        .into_iter()
        .filter(|block| block.starts_with("# tiers.toml\n"))
        .collect();
    assert_eq!(tiers.len(), 1, "one `# tiers.toml` block in the section");
    std::fs::write(dir.path().join("tiers.toml"), tiers[0]).expect("write tiers.toml");

    let bin_dir = Path::new(support::BIN)
        .parent()
        .expect("the binary's directory");
    let path = std::env::join_paths(std::iter::once(bin_dir.to_owned()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH");

    let mut skipped = vec![0usize; SKIPPED.len()];
    let mut ran = 0;
    for block in fenced(section, "sh") {
        let script: Vec<&str> = block
            .lines()
            .filter(|line| {
                match SKIPPED
                    .iter()
                    .position(|(start, _)| line.trim_start().starts_with(start))
                {
                    Some(i) => {
                        skipped[i] += 1;
                        false
                    }
                    None => true,
                }
            })
            .collect();
        let commands = script
            .iter()
            .filter(|line| {
                let line = line.trim();
                !line.is_empty() && !line.starts_with('#')
            })
            .count();
        if commands == 0 {
            continue;
        }
        ran += commands;
        let script = script.join("\n");
        // -e: the first failing command fails the block; -x: stderr
        // says which command it was.
        let mut sh = std::process::Command::new("sh");
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("TOLLGATE_") {
                sh.env_remove(name);
            }
        }
        let out = sh
            .args(["-e", "-x", "-c", &script])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("TOLLGATE_SERVER", &server.url)
            .stdin(Stdio::null())
            .output()
            .expect("run sh");
        assert!(
            out.status.success(),
            "a README command failed ({}):\n{script}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for ((start, why), count) in SKIPPED.iter().zip(&skipped) {
        assert!(*count > 0, "no README line starts with {start:?} ({why})");
    }
    assert!(ran >= 20, "only {ran} commands found in the section");

    // What the commands did, read back: acme ends on pro, t1234 was moved
    // there with set-tier, t5678 went to free.
    for (tenant, tier) in [("acme", "pro"), ("t1234", "pro"), ("t5678", "free")] {
        let described = server.json(&["tenant", "describe", "--tenant", tenant, "--json"]);
        assert_eq!(described["tier"], tier, "{described:#}");
    }
}
