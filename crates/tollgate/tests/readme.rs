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

/// The section on `tollgate agent`, run after [`SECTION`] (whose tenants
/// it uses) against the same server: its `tollgate agent` line in the
/// background (the README runs it "in a second terminal"), the other
/// lines once the socket answers. Two things differ from the README, as
/// they must on a machine shared with other tests: the server's URL is
/// the test server's, and `/tmp/tollgate-agent…` paths are in the test's
/// directory.
const AGENT_SECTION: &str = "## Gate work from any language";

fn agent_section(readme: &str, server: &Server, dir: &Path, path: &std::ffi::OsStr) {
    let start = readme
        .find(AGENT_SECTION)
        .expect("the agent's section in README.md");
    let body = &readme[start + AGENT_SECTION.len()..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    let local = |line: &str| {
        line.replace("http://127.0.0.1:50051", &server.url).replace(
            "/tmp/tollgate-agent",
            &dir.join("tollgate-agent").display().to_string(),
        )
    };
    let blocks = fenced(body, "sh");
    assert_eq!(blocks.len(), 1, "one sh block in the agent's section");
    let (agent_lines, commands): (Vec<&str>, Vec<&str>) = blocks[0]
        .lines()
        .filter(|line| !line.trim().is_empty())
        .partition(|line| line.starts_with("tollgate agent "));
    assert_eq!(agent_lines.len(), 1, "one `tollgate agent` line");
    let agent_line = local(agent_lines[0]);
    let agent_line = agent_line.split('#').next().unwrap_or_default();
    let mut agent = support::Served(
        std::process::Command::new("sh")
            .args(["-c", &format!("exec {agent_line}")])
            .current_dir(dir)
            .env("PATH", path)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the README's agent"),
    );
    let socket = dir.join("tollgate-agent.sock");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            agent.0.try_wait().expect("wait").is_none(),
            "the README's agent exited: {agent_line}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the README's agent did not come up"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for command in commands {
        let command = local(command);
        let out = std::process::Command::new("sh")
            .args(["-e", "-c", &command])
            .current_dir(dir)
            .env("PATH", path)
            .stdin(Stdio::null())
            .output()
            .expect("run sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && !stdout.contains("\"error\""),
            "a README command of the agent's section failed ({}):\n{command}\n--- stdout\n{stdout}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        if command.contains("/v1/acquire") {
            assert!(stdout.contains("\"admitted\":true"), "{command}: {stdout}");
        }
    }
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

    agent_section(&readme, &server, dir.path(), &path);

    // What the commands did, read back: acme ends on pro, t1234 was moved
    // there with set-tier, t5678 went to free.
    for (tenant, tier) in [("acme", "pro"), ("t1234", "pro"), ("t5678", "free")] {
        let described = server.json(&["tenant", "describe", "--tenant", tenant, "--json"]);
        assert_eq!(described["tier"], tier, "{described:#}");
    }
}
