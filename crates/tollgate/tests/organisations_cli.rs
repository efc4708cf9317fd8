//! Organisations from the command line against a served store, as an
//! operator follows docs/organisations.md: `org create`, `org set-limits`,
//! `tenant set-limits` for the members, `org add-tenant` (with a
//! guarantee), `pod request` on the members drawing from the
//! organisation, `org show` (text and JSON) and `org list`, `org
//! remove-tenant`, `org delete`; a pod of the organisation refused, and
//! bad input refused with the field named and nothing on stdout.

mod support;

use std::process::Output;

use support::Server;

fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn granted(server: &Server, tenant: &str, tokens: &str) -> f64 {
    let grant = server.json(&[
        "pod", "request", "--tenant", tenant, "--tokens", tokens, "--json",
    ]);
    grant["granted_tokens"].as_f64().expect("granted tokens")
}

#[test]
fn an_organisation_limits_its_members_together_from_the_command_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("tollgate.redb"));
    let created = server.json(&[
        "org",
        "create",
        "--org",
        "acme",
        "--name",
        "Acme Corp",
        "--json",
    ]);
    assert_eq!(created["organization_id"], "acme");
    assert_eq!(created["display_name"], "Acme Corp");
    // The organisation holds 100 tokens and refills slowly; its members
    // may have 10 000/s each of their own.
    server.ok(&[
        "org",
        "set-limits",
        "--org",
        "acme",
        "--available",
        "100",
        "--refill-rate",
        "0.001",
        "--burst-limit",
        "100",
    ]);
    for member in ["a", "b"] {
        server.set_limits(member, 0.0, 10_000.0, 10_000.0);
    }
    server.ok(&["org", "add-tenant", "--org", "acme", "--tenant", "a"]);
    let added = server.json(&[
        "org",
        "add-tenant",
        "--org",
        "acme",
        "--tenant",
        "b",
        "--guaranteed",
        "=5",
        "--json",
    ]);
    assert_eq!(added["members"][1]["guaranteed_rates"][""], 5.0);

    // a's first request draws what the organisation holds; b then finds
    // it empty. Together they never get more than the organisation held
    // (and its trickle of refill).
    let a = granted(&server, "a", "80");
    let b = granted(&server, "b", "80");
    assert!(a > 0.0, "a got nothing");
    assert!(
        a + b <= 100.0 + 1.0,
        "a {a} + b {b} beyond the organisation's 100"
    );

    let show = server.ok(&["org", "show", "--org", "acme"]);
    assert!(show.contains("organisation acme (Acme Corp)"), "{show}");
    assert!(
        show.contains("WANTS/S") && show.contains("BORROWS/S"),
        "{show}"
    );
    let json = server.json(&["org", "show", "--org", "acme", "--json"]);
    let members = json["members"].as_array().expect("members");
    assert_eq!(members.len(), 2);
    assert_eq!(members[0]["buckets"][0]["drawing"], true, "{json}");
    assert_eq!(members[0]["buckets"][0]["draws"], 1, "{json}");
    let list = server.ok(&["org", "list"]);
    assert!(list.contains("acme") && list.contains("a,b"), "{list}");

    // The organisation's own pods are refused.
    let out = server.tollgate(&["pod", "request", "--tenant", "acme", "--tokens", "1"]);
    assert!(refused(&out).contains("is an organisation"));

    // Bad input names its field and changes nothing.
    let out = server.tollgate(&[
        "org",
        "add-tenant",
        "--org",
        "acme",
        "--tenant",
        "b",
        "--guaranteed",
        "=-1",
    ]);
    assert!(refused(&out).contains("guaranteed_rates[\"\"]"));
    let out = server.tollgate(&["org", "add-tenant", "--org", "nope", "--tenant", "c"]);
    assert!(refused(&out).contains("NotFound"));
    let out = server.tollgate(&["org", "delete", "--org", "acme"]);
    assert!(refused(&out).contains("has 2 members"));

    // a leaves: it runs on its own 10 000/s at once.
    let left = server.ok(&["org", "remove-tenant", "--tenant", "a"]);
    assert!(left.contains("took a out of organisation acme"), "{left}");
    assert!(granted(&server, "a", "5000") >= 5_000.0);
    server.ok(&["org", "remove-tenant", "--tenant", "b"]);
    server.ok(&["org", "delete", "--org", "acme"]);
    let out = server.tollgate(&["org", "show", "--org", "acme"]);
    assert!(refused(&out).contains("NotFound"));
    server.stop();
}
