//! The resolver on its own: layers given as flags, a map for the
//! environment and file contents, so nothing depends on the process's
//! environment or the disk (except where `load` reads a file).

use std::collections::HashMap;

use super::*;

/// The environment `vars` describe, and nothing else.
fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |name| vars.get(name).cloned()
}

/// `ServeArgs` as the command line `args` gives them.
fn args(args: &[&str]) -> ServeArgs {
    let matches = ServeArgs::augment_args(Command::new("serve").no_binary_name(true))
        .try_get_matches_from(args)
        .expect("valid flags");
    ServeArgs::from_arg_matches(&matches).expect("valid flags")
}

fn flags(flags: &[&str]) -> ServeOptions {
    args(flags).options
}

fn file(text: &str) -> ConfigFile {
    ConfigFile {
        path: PathBuf::from("/etc/tollgate/tollgate.toml"),
        text: text.to_owned(),
    }
}

fn resolve(
    flag_args: &[&str],
    vars: &[(&str, &str)],
    file_text: Option<&str>,
) -> anyhow::Result<ServeConfig> {
    let file = file_text.map(file);
    ServeConfig::resolve(&flags(flag_args), &env(vars), file.as_ref())
}

fn error(flag_args: &[&str], vars: &[(&str, &str)], file_text: Option<&str>) -> String {
    match resolve(flag_args, vars, file_text) {
        Ok(config) => panic!("accepted: {config:?}"),
        Err(e) => format!("{e:#}"),
    }
}

fn defaults_of(config: &ServeConfig) -> DefaultLimits {
    match &config.settings.unconfigured_tenants {
        UnconfiguredTenants::UseDefaults(d) => *d,
        UnconfiguredTenants::Reject => panic!("unconfigured tenants are refused"),
    }
}

#[test]
fn flags_beat_environment_beats_file_beats_defaults() {
    let config = resolve(
        &["--default-burst-limit", "3"],
        &[
            ("TOLLGATE_DEFAULT_BURST_LIMIT", "2"),
            ("TOLLGATE_DEFAULT_REFILL_RATE", "20"),
        ],
        Some(
            r#"
            default-burst-limit = 1
            default-refill-rate = 10
            pg-pool-size = 4
            listen = "0.0.0.0:6000"
            "#,
        ),
    )
    .expect("valid");
    let defaults = defaults_of(&config);
    assert_eq!(defaults.limits.burst_limit, 3.0, "the flag wins");
    assert_eq!(
        defaults.limits.refill_rate, 20.0,
        "the environment beats the file"
    );
    assert_eq!(config.postgres.pool_size, 4, "the file beats the default");
    assert_eq!(config.listen, "0.0.0.0:6000".parse().expect("address"));
    assert_eq!(config.postgres.max_batch, 64, "the default stays");
    assert_eq!(
        config.sources.get("default-burst-limit"),
        Some(&Source::Flag)
    );
    assert_eq!(
        config.sources.get("default-refill-rate"),
        Some(&Source::Env("TOLLGATE_DEFAULT_REFILL_RATE".into()))
    );
    assert_eq!(
        config.sources.get("pg-pool-size"),
        Some(&Source::File("/etc/tollgate/tollgate.toml".into()))
    );
    assert_eq!(config.sources.get("pg-max-batch"), Some(&Source::Default));
    assert_eq!(
        config.describe_sources(),
        "file: listen, pg-pool-size; env: default-refill-rate; flags: default-burst-limit"
    );
}

#[test]
fn without_any_layer_every_option_has_its_default() {
    let config = resolve(&[], &[], None).expect("valid");
    assert_eq!(config.config_file, None);
    assert_eq!(config.listen, "127.0.0.1:50051".parse().expect("address"));
    assert_eq!(config.store, StoreLocation::File("tollgate.redb".into()));
    assert_eq!(
        config.postgres,
        PostgresPool {
            pool_size: 16,
            max_batch: 64,
            connect_timeout: Duration::from_secs(5),
            ca_file: None,
        }
    );
    assert_eq!(
        config.settings,
        BucketSettings {
            bucket: GlobalBucketConfig {
                policy: GrantPolicy::Shares,
                inactivity_timeout: Duration::from_secs(60),
                reported_dead_timeout: Duration::from_secs(10),
                ..GlobalBucketConfig::default()
            },
            unconfigured_tenants: UnconfiguredTenants::UseDefaults(DefaultLimits {
                limits: Limits {
                    refill_rate: 1000.0,
                    burst_limit: 10000.0,
                },
                initial_tokens: 10000.0,
            }),
            budget_record_retention: Duration::from_secs(396 * 86_400),
            history: tollgate_core::history::HistoryConfig::default(),
        }
    );
    assert_eq!(config.history_interval, Some(Duration::from_secs(10)));
    assert_eq!(config.log_format, LogFormat::Text);
    assert_eq!(
        config.metrics_listen,
        Some("127.0.0.1:9464".parse().expect("address"))
    );
    assert_eq!(config.describe_sources(), "defaults only");
}

#[test]
fn flags_not_given_are_none_so_other_layers_can_set_them() {
    let given = args(&[]);
    assert_eq!(given.config, None);
    assert_eq!(given.options, ServeOptions::default());
    // A switch alone means true; with a value it takes the value.
    assert_eq!(flags(&["--in-memory"]).in_memory, Some(true));
    assert_eq!(flags(&["--in-memory=false"]).in_memory, Some(false));
}

#[test]
fn the_file_sets_every_kind_of_value() {
    let config = resolve(
        &[],
        &[],
        Some(
            r#"
            listen = "0.0.0.0:50051"
            store = "postgres://tollgate:secret@db.internal/tollgate"
            default-refill-rate = 250.5
            default-burst-limit = 500
            default-initial-tokens = 0
            grant-policy = "bucket-level-ema"
            inactivity-timeout = "2m"
            reported-dead-timeout = "1500ms"
            pg-pool-size = 32
            pg-max-batch = 1
            pg-connect-timeout = "1s"
            log-format = "json"
            metrics-listen = "off"
            "#,
        ),
    )
    .expect("valid");
    assert_eq!(
        config.store,
        StoreLocation::Postgres("postgres://tollgate:secret@db.internal/tollgate".into())
    );
    let defaults = defaults_of(&config);
    assert_eq!(defaults.limits.refill_rate, 250.5);
    assert_eq!(defaults.limits.burst_limit, 500.0, "an integer is a number");
    assert_eq!(defaults.initial_tokens, 0.0);
    let bucket = &config.settings.bucket;
    assert_eq!(bucket.policy, GrantPolicy::BucketLevelEma);
    assert_eq!(bucket.inactivity_timeout, Duration::from_secs(120));
    assert_eq!(bucket.reported_dead_timeout, Duration::from_millis(1500));
    assert_eq!(config.postgres.pool_size, 32);
    assert_eq!(config.postgres.max_batch, 1);
    assert_eq!(config.postgres.connect_timeout, Duration::from_secs(1));
    assert_eq!(config.log_format, LogFormat::Json);
    assert_eq!(config.metrics_listen, None);
}

#[test]
fn environment_values_are_read_like_flags() {
    let config = resolve(
        &[],
        &[
            ("TOLLGATE_IN_MEMORY", "1"),
            ("TOLLGATE_REQUIRE_CONFIGURED_TENANTS", "yes"),
            ("TOLLGATE_GRANT_POLICY", "greedy"),
            ("TOLLGATE_INACTIVITY_TIMEOUT", "90s"),
            ("TOLLGATE_LOG_FORMAT", "json"),
            ("TOLLGATE_METRICS_LISTEN", "0.0.0.0:9000"),
            ("TOLLGATE_LISTEN", "[::1]:7000"),
            // Empty is unset.
            ("TOLLGATE_PG_POOL_SIZE", ""),
        ],
        None,
    )
    .expect("valid");
    assert_eq!(config.store, StoreLocation::Memory);
    assert_eq!(
        config.settings.unconfigured_tenants,
        UnconfiguredTenants::Reject
    );
    assert_eq!(config.settings.bucket.policy, GrantPolicy::Greedy);
    assert_eq!(
        config.settings.bucket.inactivity_timeout,
        Duration::from_secs(90)
    );
    assert_eq!(config.log_format, LogFormat::Json);
    assert_eq!(
        config.metrics_listen,
        Some("0.0.0.0:9000".parse().expect("address"))
    );
    assert_eq!(config.listen, "[::1]:7000".parse().expect("address"));
    assert_eq!(config.postgres.pool_size, 16);
}

#[test]
fn a_flag_turns_off_what_a_lower_layer_turned_on() {
    let config = resolve(
        &[
            "--require-configured-tenants=false",
            "--metrics-listen",
            "off",
        ],
        &[("TOLLGATE_REQUIRE_CONFIGURED_TENANTS", "true")],
        Some(r#"metrics-listen = "127.0.0.1:1""#),
    )
    .expect("valid");
    assert!(matches!(
        config.settings.unconfigured_tenants,
        UnconfiguredTenants::UseDefaults(_)
    ));
    assert_eq!(config.metrics_listen, None);
}

#[test]
fn the_default_initial_tokens_follow_the_burst_limit_whichever_layer_sets_it() {
    let config = resolve(&[], &[], Some("default-burst-limit = 42")).expect("valid");
    assert_eq!(defaults_of(&config).initial_tokens, 42.0);
    let config = resolve(
        &["--default-initial-tokens", "7"],
        &[],
        Some("default-burst-limit = 42"),
    )
    .expect("valid");
    assert_eq!(defaults_of(&config).initial_tokens, 7.0);
}

#[test]
fn unknown_keys_in_the_file_are_refused_naming_key_and_file() {
    for text in [
        "listen = \"127.0.0.1:1\"\nlisten-address = \"127.0.0.1:2\"",
        "[listen-address]\nport = 2",
    ] {
        let message = error(&[], &[], Some(text));
        assert!(message.contains("listen-address"), "{message}");
        assert!(message.contains("/etc/tollgate/tollgate.toml"), "{message}");
        assert!(message.contains("unknown field"), "{message}");
    }
    // `config` names the file; a file cannot name another.
    let message = error(&[], &[], Some("config = \"other.toml\""));
    assert!(message.contains("`config`"), "{message}");
}

#[test]
fn wrong_types_in_the_file_name_the_key() {
    for (text, key, expected) in [
        ("pg-pool-size = \"16\"", "pg-pool-size", "expected usize"),
        ("pg-pool-size = -1", "pg-pool-size", "expected usize"),
        ("pg-max-batch = 1.5", "pg-max-batch", "expected usize"),
        (
            "inactivity-timeout = 60",
            "inactivity-timeout",
            "expected a string",
        ),
        (
            "inactivity-timeout = \"60\"",
            "inactivity-timeout",
            "time unit",
        ),
        (
            "default-refill-rate = \"fast\"",
            "default-refill-rate",
            "f64",
        ),
        ("in-memory = \"yes\"", "in-memory", "expected a boolean"),
        (
            "log-format = \"xml\"",
            "log-format",
            "unknown variant `xml`",
        ),
        ("listen = \"localhost\"", "listen", "socket address"),
        ("metrics-listen = \"on\"", "metrics-listen", "or off"),
    ] {
        let message = error(&[], &[], Some(text));
        assert!(message.contains(&format!("`{key}`")), "{text}: {message}");
        assert!(message.contains(expected), "{text}: {message}");
        assert!(message.contains("/etc/tollgate/tollgate.toml"), "{message}");
    }
    let message = error(&[], &[], Some("listen = "));
    assert!(
        message.contains("line 1"),
        "a syntax error has its place: {message}"
    );
}

#[test]
fn bad_values_name_the_option_and_where_it_was_set() {
    for (flag_args, vars, text, expected) in [
        (
            &["--pg-pool-size", "0"][..],
            &[][..],
            None,
            "--pg-pool-size: must be at least 1 (from the command line)",
        ),
        (
            &["--max-pending-requests", "0"][..],
            &[][..],
            None,
            "--max-pending-requests: must be at least 1 (from the command line)",
        ),
        (
            &[],
            &[("TOLLGATE_PG_MAX_BATCH", "0")],
            None,
            "--pg-max-batch: must be at least 1 (from environment variable TOLLGATE_PG_MAX_BATCH)",
        ),
        (
            &[],
            &[],
            Some("pg-connect-timeout = \"0s\""),
            "--pg-connect-timeout: must be more than zero (from config file /etc/tollgate/tollgate.toml)",
        ),
        (
            &["--default-refill-rate", "NaN"],
            &[],
            None,
            "--default-refill-rate: must be a number, got NaN",
        ),
        (
            &["--default-burst-limit=-1"],
            &[],
            None,
            "--default-burst-limit: must be >= 0, got -1",
        ),
        (
            &[],
            &[],
            Some("default-initial-tokens = 1e300"),
            "--default-initial-tokens: must be <= 1e15, got 1e300",
        ),
        (
            &[],
            &[("TOLLGATE_INACTIVITY_TIMEOUT", "0s")],
            None,
            "--inactivity-timeout: must be more than zero (from environment variable TOLLGATE_INACTIVITY_TIMEOUT)",
        ),
        (&["--store", ""], &[], None, "--store: must not be empty"),
        (
            &[],
            &[],
            Some("store = \"postgres://h:notaport/db\""),
            "--store: not a valid PostgreSQL URL",
        ),
    ] {
        let message = error(flag_args, vars, text);
        assert!(
            message.contains(expected),
            "expected {expected:?} in {message:?}"
        );
    }
}

#[test]
fn environment_values_that_do_not_parse_name_the_variable() {
    for (var, value, expected) in [
        ("TOLLGATE_PG_POOL_SIZE", "many", "invalid digit"),
        ("TOLLGATE_GRANT_POLICY", "fair", "possible values: shares"),
        ("TOLLGATE_IN_MEMORY", "perhaps", "not a boolean"),
        ("TOLLGATE_LISTEN", "somewhere", "invalid socket address"),
    ] {
        let message = error(&[], &[(var, value)], None);
        assert!(
            message.starts_with(&format!("environment variable {var}: ")),
            "{message}"
        );
        assert!(message.contains(expected), "{message}");
        assert!(!message.contains("--help"), "no clap hints: {message}");
    }
}

#[test]
fn database_url_is_the_store_only_when_no_layer_sets_one() {
    let url = "postgres://tollgate@db/usage";
    let config = resolve(&[], &[("DATABASE_URL", url)], None).expect("valid");
    assert_eq!(config.store, StoreLocation::Postgres(url.into()));
    assert_eq!(
        config.sources.get("store"),
        Some(&Source::Env("DATABASE_URL".into()))
    );
    assert_eq!(config.describe_sources(), "env: store (DATABASE_URL)");

    let empty = resolve(&[], &[("DATABASE_URL", "")], None).expect("valid");
    assert_eq!(empty.store, StoreLocation::File("tollgate.redb".into()));

    for (flag_args, vars, text) in [
        (&["--store", "a.redb"][..], &[][..], None),
        (&[], &[("TOLLGATE_STORE", "a.redb")], None),
        (&[], &[], Some("store = \"a.redb\"")),
    ] {
        let vars: Vec<(&str, &str)> = vars
            .iter()
            .copied()
            .chain([("DATABASE_URL", url)])
            .collect();
        let config = resolve(flag_args, &vars, text).expect("valid");
        assert_eq!(config.store, StoreLocation::File("a.redb".into()));
    }

    let memory = resolve(&["--in-memory"], &[("DATABASE_URL", url)], None).expect("valid");
    assert_eq!(memory.store, StoreLocation::Memory);
}

#[test]
fn in_memory_with_a_store_is_refused_naming_both_layers() {
    let message = error(&["--in-memory"], &[], Some("store = \"a.redb\""));
    assert!(
        message.contains("--in-memory (from the command line)"),
        "{message}"
    );
    assert!(
        message.contains("--store (from config file /etc/tollgate/tollgate.toml)"),
        "{message}"
    );
    // Saying no to memory is fine.
    resolve(&["--in-memory=false"], &[], Some("store = \"a.redb\"")).expect("valid");
}

#[test]
fn load_reads_the_file_the_flag_or_the_environment_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let by_flag = dir.path().join("flag.toml");
    let by_env = dir.path().join("env.toml");
    std::fs::write(&by_flag, "default-refill-rate = 1").expect("write");
    std::fs::write(&by_env, "default-refill-rate = 2").expect("write");
    let env_path = by_env.display().to_string();
    let vars = env(&[("TOLLGATE_CONFIG", &env_path)]);
    let flag_path = by_flag.display().to_string();

    let config = ServeConfig::load(&args(&["--config", &flag_path]), &vars).expect("valid");
    assert_eq!(
        defaults_of(&config).limits.refill_rate,
        1.0,
        "the flag wins"
    );
    assert_eq!(config.config_file.as_deref(), Some(by_flag.as_path()));

    let config = ServeConfig::load(&args(&[]), &vars).expect("valid");
    assert_eq!(defaults_of(&config).limits.refill_rate, 2.0);

    let missing = dir.path().join("missing.toml");
    let e = ServeConfig::load(&args(&["--config", &missing.display().to_string()]), &vars)
        .expect_err("a missing file is an error");
    assert!(
        format!("{e:#}").contains("missing.toml"),
        "names the file: {e:#}"
    );
}

#[test]
fn every_option_has_one_name_for_flag_file_key_and_variable() {
    for arg in declared().get_arguments() {
        let long = arg.get_long().expect("every option is a long flag");
        assert_eq!(arg.get_id().as_str().replace('_', "-"), long);
        // The file knows the key: a value of the wrong type is refused as
        // such, not as an unknown key.
        let single =
            toml::Table::from_iter([(long.to_owned(), toml::Value::Table(toml::Table::new()))]);
        let e = toml::Value::Table(single)
            .try_into::<ServeOptions>()
            .expect_err("a table is no option's type");
        assert!(!e.message().contains("unknown field"), "{long}: {e}");
        assert_eq!(
            env_var(long),
            format!("TOLLGATE_{}", arg.get_id().as_str().to_uppercase())
        );
    }
}

#[test]
fn every_flag_shows_its_default_and_environment_variable_in_help() {
    let command = ServeArgs::augment_args(Command::new("serve"));
    let mut documented = 0;
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        for help in [arg.get_help(), arg.get_long_help()].into_iter().flatten() {
            let help = help.to_string();
            assert!(help.contains("[default: "), "--{long}: {help}");
            assert!(
                help.contains(&format!("[env: {}]", env_var(long))),
                "--{long}: {help}"
            );
        }
        assert!(
            arg.get_default_values().is_empty(),
            "--{long} has no default of its own"
        );
        documented += 1;
    }
    // --config and every option.
    assert_eq!(documented, 1 + declared().get_arguments().count());
}
