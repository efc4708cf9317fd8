//! `TestDatabase` against a real server: isolation between tests, and the
//! database gone once the value is dropped, from any kind of context.

use tokio_postgres::Client;
use tollgate_testdb::{TestDatabase, connect};

async fn database_exists(client: &Client, name: &str) -> bool {
    // pg_database is shared by all databases of a server, so any connection
    // to it can tell.
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .expect("query pg_database");
    row.get::<_, i64>(0) == 1
}

#[tokio::test]
async fn two_databases_are_distinct_and_do_not_see_each_others_tables() {
    let first = TestDatabase::create().await.expect("first database");
    let second = TestDatabase::create().await.expect("second database");
    assert_ne!(first.name(), second.name());
    assert_ne!(first.url(), second.url());

    let in_first = connect(first.url()).await.expect("connect to the first");
    let in_second = connect(second.url()).await.expect("connect to the second");
    in_first
        .batch_execute(
            "CREATE TABLE buckets (tenant text PRIMARY KEY); INSERT INTO buckets VALUES ('a')",
        )
        .await
        .expect("create a table in the first");

    let row = in_first
        .query_one("SELECT current_database(), count(*) FROM buckets", &[])
        .await
        .expect("read the table in the first");
    assert_eq!(row.get::<_, String>(0), first.name());
    assert_eq!(row.get::<_, i64>(1), 1);
    let row = in_second
        .query_one(
            "SELECT current_database(), to_regclass('buckets') IS NULL",
            &[],
        )
        .await
        .expect("look for the table in the second");
    assert_eq!(row.get::<_, String>(0), second.name());
    assert!(
        row.get::<_, bool>(1),
        "the second database sees the first's table"
    );
}

#[tokio::test]
async fn a_new_database_is_empty() {
    let database = TestDatabase::create().await.expect("database");
    let client = connect(database.url()).await.expect("connect");
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'public'",
            &[],
        )
        .await
        .expect("count relations");
    assert_eq!(row.get::<_, i64>(0), 0);
}

#[tokio::test]
async fn a_dropped_database_is_gone_even_with_a_connection_still_open() {
    let observer = TestDatabase::create().await.expect("observer database");
    let observer_client = connect(observer.url())
        .await
        .expect("connect to the observer");
    let database = TestDatabase::create().await.expect("database");
    let name = database.name().to_owned();
    let still_open = connect(database.url())
        .await
        .expect("connect to the database");
    assert!(database_exists(&observer_client, &name).await);

    drop(database);

    assert!(!database_exists(&observer_client, &name).await);
    assert!(
        still_open.simple_query("SELECT 1").await.is_err(),
        "the connection to the dropped database still works"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_dropped_on_a_multi_thread_runtime_is_gone() {
    let observer = TestDatabase::create().await.expect("observer database");
    let observer_client = connect(observer.url())
        .await
        .expect("connect to the observer");
    let database = TestDatabase::create().await.expect("database");
    let name = database.name().to_owned();

    drop(database);

    assert!(!database_exists(&observer_client, &name).await);
}

#[test]
fn a_database_dropped_outside_any_runtime_is_gone() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (database, observer) = runtime.block_on(async {
        (
            TestDatabase::create().await.expect("database"),
            TestDatabase::create().await.expect("observer database"),
        )
    });
    let name = database.name().to_owned();

    drop(database);

    let exists = runtime.block_on(async {
        let client = connect(observer.url())
            .await
            .expect("connect to the observer");
        database_exists(&client, &name).await
    });
    assert!(!exists);
    drop(runtime);
    // The observer too is dropped with no runtime around.
    drop(observer);
}

#[tokio::test]
async fn the_url_has_the_postgres_url_form() {
    let database = TestDatabase::create().await.expect("database");
    let url = database.url();
    assert!(
        url.starts_with("postgres://") || url.starts_with("postgresql://"),
        "{url}"
    );
    assert!(url.contains(&format!("/{}", database.name())), "{url}");
    let config: tokio_postgres::Config = url.parse().expect("tokio-postgres parses the URL");
    assert_eq!(config.get_dbname(), Some(database.name()));
}
