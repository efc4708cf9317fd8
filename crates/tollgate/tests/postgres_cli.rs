//! The binary with a PostgreSQL store: `tollgate migrate`, `DATABASE_URL`,
//! and clear failures for a database that cannot be used.

mod support;

use tollgate_testdb::TestDatabase;

fn tollgate(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = support::command()
        .args(args)
        .env_remove("DATABASE_URL")
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tollgate");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn migrate_is_harmless_to_repeat_and_reads_database_url() {
    let db = TestDatabase::create().await.expect("test database");
    for _ in 0..2 {
        let (ok, out, err) = tollgate(&["migrate", "--store", db.url()], &[]);
        assert!(ok, "{err}");
        assert!(out.contains("schema is up to date"), "{out}");
        assert!(out.contains(db.name()), "{out}");
    }
    let (ok, out, err) = tollgate(&["migrate", "--store", db.url(), "--json"], &[]);
    assert!(ok, "{err}");
    let migration: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    assert_eq!(migration["store"]["kind"], "postgres", "{out}");
    assert_eq!(migration["store"]["database"], db.name(), "{out}");
    assert_eq!(migration["created"], serde_json::Value::Null, "{out}");
    let (ok, out, err) = tollgate(&["migrate"], &[("DATABASE_URL", db.url())]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("PostgreSQL database {}", db.name())),
        "{out}"
    );
}

#[test]
fn serve_refuses_a_database_it_cannot_use() {
    let (ok, _, err) = tollgate(
        &[
            "serve",
            "--store",
            "postgres://postgres:secret@127.0.0.1:1/nowhere",
            "--pg-connect-timeout",
            "1s",
        ],
        &[],
    );
    assert!(!ok);
    assert!(err.contains("PostgreSQL database nowhere"), "{err}");
    assert!(
        !err.contains("secret"),
        "the password stays out of errors: {err}"
    );

    let (ok, _, err) = tollgate(
        &[
            "serve",
            "--store",
            "postgres://postgres@127.0.0.1/db",
            "--pg-pool-size",
            "0",
        ],
        &[],
    );
    assert!(!ok);
    assert!(err.contains("--pg-pool-size"), "{err}");
}
