use super::*;

use tollgate_core::BucketName;
use tollgate_core::partition::TableLimits;

fn errors(text: &str) -> Vec<String> {
    match parse("tiers.toml", text) {
        Ok(file) => panic!("accepted: {file:?}"),
        Err(FileErrors(errors)) => errors.iter().map(ToString::to_string).collect(),
    }
}

/// The one error a file has.
fn error(text: &str) -> String {
    let errors = errors(text);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    errors.into_iter().next().unwrap_or_default()
}

fn limits(refill_rate: f64, burst_limit: f64, initial_tokens: Option<f64>) -> BucketLimits {
    BucketLimits {
        quota: None,
        refill_rate,
        burst_limit,
        initial_tokens,
        kind: BucketKind::Shared,
        enforce: true,
    }
}

fn tier(name: &str) -> TierName {
    TierName::parse("tier", name).expect("valid tier name")
}

fn bucket(name: &str) -> BucketName {
    BucketName::parse("bucket", name).expect("valid bucket name")
}

fn table(name: &str) -> TableName {
    TableName::parse("table", name).expect("valid table name")
}

fn buckets_only(buckets: Buckets) -> TierDefinition {
    TierDefinition {
        buckets,
        tables: Tables::new(),
        budgets: Budgets::new(),
        shadow: false,
    }
}

/// A file with one table of tier pro whose body is `body`.
fn one_table(body: &str) -> String {
    format!("[tiers.pro.tables.orders]\n{body}")
}

/// A file with one bucket whose body is `body`.
fn one_bucket(body: &str) -> String {
    format!("[tiers.pro.buckets.schedule-email]\n{body}")
}

#[test]
fn a_valid_file_gives_every_tier_with_integer_or_float_limits_and_optional_initial_tokens() {
    let file = parse(
        "tiers.toml",
        r#"
# Paid plans.
[tiers.pro.buckets.schedule-email]
refill_rate = 10        # tokens per second
burst_limit = 100
initial_tokens = 100

[tiers.pro.buckets.invoke-doc-summary-ai]
refill_rate = 0.5
burst_limit = 2e1

[tiers.free.buckets."schedule-email"]
refill_rate = 1
burst_limit = 10
initial_tokens = 0

[tiers.suspended]
"#,
    )
    .expect("valid");
    let pro = Buckets::from([
        (bucket("schedule-email"), limits(10.0, 100.0, Some(100.0))),
        (bucket("invoke-doc-summary-ai"), limits(0.5, 20.0, None)),
    ]);
    let free = Buckets::from([(bucket("schedule-email"), limits(1.0, 10.0, Some(0.0)))]);
    let expected = BTreeMap::from([
        (tier("free"), buckets_only(free)),
        (tier("pro"), buckets_only(pro)),
        (tier("suspended"), TierDefinition::default()),
    ]);
    assert_eq!(file.tiers, expected);
}

#[test]
fn inline_tables_and_dotted_keys_are_the_same_file() {
    let file = parse(
        "tiers.toml",
        "tiers.pro.buckets.a = { refill_rate = 1, burst_limit = 2 }\n",
    )
    .expect("valid");
    assert_eq!(
        file.tiers[&tier("pro")].buckets[&bucket("a")],
        limits(1.0, 2.0, None)
    );
}

#[test]
fn a_negative_rate_names_the_file_the_line_the_column_and_the_field() {
    let text = one_bucket("refill_rate = -1\nburst_limit = 100\n");
    assert_eq!(
        error(&text),
        "tiers.toml:2:15: tiers.pro.buckets.schedule-email.refill_rate: must be >= 0, got -1"
    );
}

#[test]
fn nan_and_infinities_are_refused_in_every_field() {
    assert_eq!(
        error(&one_bucket("refill_rate = nan\nburst_limit = 1\n")),
        "tiers.toml:2:15: tiers.pro.buckets.schedule-email.refill_rate: must be a number, got NaN"
    );
    assert_eq!(
        error(&one_bucket("refill_rate = 1\nburst_limit = inf\n")),
        "tiers.toml:3:15: tiers.pro.buckets.schedule-email.burst_limit: must be finite, got inf"
    );
    assert_eq!(
        error(&one_bucket(
            "refill_rate = 1\nburst_limit = 1\ninitial_tokens = -inf\n"
        )),
        "tiers.toml:4:18: tiers.pro.buckets.schedule-email.initial_tokens: must be finite, got -inf"
    );
    assert_eq!(
        error(&one_bucket("refill_rate = +inf\nburst_limit = 1\n")),
        "tiers.toml:2:15: tiers.pro.buckets.schedule-email.refill_rate: must be finite, got inf"
    );
}

#[test]
fn values_beyond_the_wire_bounds_are_refused() {
    assert_eq!(
        error(&one_bucket("refill_rate = 1e13\nburst_limit = 1\n")),
        "tiers.toml:2:15: tiers.pro.buckets.schedule-email.refill_rate: must be <= 1e12, got 1e13"
    );
    assert_eq!(
        error(&one_bucket("refill_rate = 1\nburst_limit = 2e15\n")),
        "tiers.toml:3:15: tiers.pro.buckets.schedule-email.burst_limit: must be <= 1e15, got 2e15"
    );
    assert_eq!(
        error(&one_bucket(
            "refill_rate = 1\nburst_limit = 1\ninitial_tokens = 1_000_000_000_000_001\n"
        )),
        "tiers.toml:4:18: tiers.pro.buckets.schedule-email.initial_tokens: must be <= 1e15, got 1.000000000000001e15"
    );
}

#[test]
fn every_bad_value_is_reported_in_the_order_of_the_file() {
    let text = "\
[tiers.pro.buckets.b]
refill_rate = -2
burst_limit = nan

[tiers.pro.buckets.a]
refill_rate = 1
burst_limit = -1
";
    assert_eq!(
        errors(text),
        [
            "tiers.toml:2:15: tiers.pro.buckets.b.refill_rate: must be >= 0, got -2",
            "tiers.toml:3:15: tiers.pro.buckets.b.burst_limit: must be a number, got NaN",
            "tiers.toml:7:15: tiers.pro.buckets.a.burst_limit: must be >= 0, got -1",
        ]
    );
}

#[test]
fn a_string_rate_is_a_type_error_naming_the_field() {
    assert_eq!(
        error(&one_bucket("refill_rate = \"10\"\nburst_limit = 100\n")),
        "tiers.toml:2:15: tiers.pro.buckets.schedule-email.refill_rate: invalid type: string \"10\", expected f64"
    );
}

#[test]
fn unknown_keys_are_refused_at_the_top_the_tier_and_the_bucket_level() {
    assert_eq!(
        error("version = 2\n[tiers.pro.buckets.a]\nrefill_rate = 1\nburst_limit = 1\n"),
        "tiers.toml:1:1: version: unknown field `version`, expected `tiers`"
    );
    assert_eq!(
        error("[tiers.pro]\nprice = 10\n[tiers.pro.buckets.a]\nrefill_rate = 1\nburst_limit = 1\n"),
        "tiers.toml:2:1: tiers.pro.price: unknown field `price`, expected one of `buckets`, `tables`, `budget`, `enforce`"
    );
    assert_eq!(
        error(&one_bucket("refill_rate = 1\nburst_limt = 1\n")),
        "tiers.toml:3:1: tiers.pro.buckets.schedule-email.burst_limt: unknown field `burst_limt`, \
         expected one of `refill_rate`, `burst_limit`, `initial_tokens`, `kind`, `budget`, `quota`, `enforce`"
    );
}

/// The free tier of the CockroachDB RFC and a pro tier with a budget on a
/// shared bucket.
const BUDGETS: &str = r#"
[tiers.free.budget]
amount = 50_000_000
cycle = "monthly"
at_limit = "throttle"
baseline_rate = 100

[tiers.pro.buckets.schedule-email]
refill_rate = 10
burst_limit = 100

[tiers.pro.buckets.schedule-email.budget]
amount = 100_000
cycle = "weekly"
anchor_weekday = "friday"
time_zone = "Europe/Paris"
at_limit = "stop"
thresholds = [90, "forecast:100", 50]
price_per_million_tokens = 0.2
currency = "EUR"
"#;

#[test]
fn budgets_are_read_with_the_servers_defaults_and_rules() {
    use tollgate_core::budget::{AtLimit, Period, Threshold, Weekday};
    let file = parse("tiers.toml", BUDGETS).expect("valid");
    let free = &file.tiers[&tier("free")].budgets[&BucketName::REQUEST_UNITS];
    assert_eq!(free.amount, 50_000_000.0);
    assert_eq!(free.cycle.period, Period::Monthly { anchor_day: 1 });
    assert_eq!(free.cycle.time_zone, "UTC");
    match free.at_limit {
        AtLimit::Throttle { baseline } => {
            assert_eq!(
                (baseline.refill_rate, baseline.burst_limit),
                (100.0, 1_000.0)
            );
        }
        other => panic!("throttle expected, got {other:?}"),
    }
    assert_eq!(
        free.thresholds,
        [50, 75, 90, 100].map(Threshold::spend).to_vec(),
        "the default thresholds"
    );
    let pro = &file.tiers[&tier("pro")].budgets[&bucket("schedule-email")];
    assert_eq!(
        pro.cycle.period,
        Period::Weekly {
            anchor_weekday: Weekday::Friday
        }
    );
    assert_eq!(
        pro.thresholds
            .iter()
            .map(Threshold::label)
            .collect::<Vec<_>>(),
        ["50", "90", "forecast:100"],
        "sorted as the server keeps them"
    );
    assert_eq!(pro.price.as_ref().map(|p| p.currency.as_str()), Some("EUR"));
}

/// A file with one request-unit budget whose body is `body`.
fn one_budget(body: &str) -> String {
    format!("[tiers.free.budget]\n{body}")
}

#[test]
fn a_bad_budget_names_the_line_and_the_key_at_fault() {
    let base = "amount = 1000\ncycle = \"monthly\"\nat_limit = \"stop\"\n";
    assert_eq!(
        error(&one_budget(&format!(
            "{base}time_zone = \"Mars/Olympus\"\n"
        ))),
        "tiers.toml:5:13: tiers.free.budget.time_zone: \"Mars/Olympus\" is not an IANA time zone name (e.g. UTC, Europe/Paris, America/New_York)"
    );
    assert_eq!(
        error(&one_budget(
            "amount = 1000\ncycle = \"yearly\"\nat_limit = \"stop\"\n"
        )),
        "tiers.toml:3:9: tiers.free.budget.cycle: must be \"monthly\", \"weekly\" or \"daily\", got \"yearly\""
    );
    assert_eq!(
        error(&one_budget(
            "amount = 1000\ncycle = \"daily\"\nat_limit = \"throttle\"\n"
        )),
        "tiers.toml:4:12: tiers.free.budget.at_limit: \"throttle\" needs baseline_rate: the tokens per second past the amount"
    );
    assert_eq!(
        error(&one_budget(&format!("{base}baseline_rate = 5\n"))),
        "tiers.toml:5:17: tiers.free.budget.baseline_rate: is only for at_limit = \"throttle\""
    );
    let amount = error(&one_budget(
        "amount = -5\ncycle = \"daily\"\nat_limit = \"stop\"\n",
    ));
    assert!(
        amount.starts_with("tiers.toml:2:10: tiers.free.budget.amount: "),
        "{amount}"
    );
    let day = error(&one_budget(&format!("{base}anchor_day = 32\n")));
    assert!(
        day.starts_with("tiers.toml:5:14: tiers.free.budget.anchor_day: "),
        "{day}"
    );
    let threshold = error(&one_budget(&format!("{base}thresholds = [\"lots\"]\n")));
    assert!(
        threshold.starts_with("tiers.toml:5:14: tiers.free.budget.thresholds: "),
        "{threshold}"
    );
    let unknown = error(&one_budget(&format!("{base}amonut = 5\n")));
    assert!(
        unknown.contains("tiers.free.budget.amonut: unknown field"),
        "{unknown}"
    );
}

#[test]
fn a_per_key_bucket_has_no_budget() {
    let text = "[tiers.pro.buckets.api]\nrefill_rate = 1\nburst_limit = 1\nkind = \"per-key\"\n\
                [tiers.pro.buckets.api.budget]\namount = 1\ncycle = \"daily\"\nat_limit = \"stop\"\n";
    let e = error(text);
    assert!(
        e.starts_with(
            "tiers.toml:5:1: tiers.pro.buckets.api.budget: must not be set for a per-key bucket"
        ),
        "{e}"
    );
}

#[test]
fn a_missing_limit_names_the_bucket_and_the_field() {
    assert_eq!(
        error(&one_bucket("refill_rate = 1\n")),
        "tiers.toml:1:1: tiers.pro.buckets.schedule-email: missing field `burst_limit`"
    );
}

#[test]
fn a_file_without_tiers_is_refused() {
    assert_eq!(error(""), "tiers.toml:1:1: missing field `tiers`");
    assert_eq!(
        error("\n\ntiers = 5\n"),
        "tiers.toml:3:9: tiers: invalid type: integer `5`, expected a map"
    );
}

#[test]
fn the_request_unit_bucket_cannot_be_in_a_tier() {
    assert_eq!(
        error("[tiers.pro.buckets.\"\"]\nrefill_rate = 1\nburst_limit = 1\n"),
        "tiers.toml:1:20: tiers.pro.buckets.\"\": must not be empty \
         (tiers do not define the request-unit bucket)"
    );
}

#[test]
fn names_too_long_or_with_other_characters_are_refused() {
    let long = "x".repeat(65);
    assert_eq!(
        error(&format!(
            "[tiers.{long}.buckets.a]\nrefill_rate = 1\nburst_limit = 1\n"
        )),
        format!("tiers.toml:1:8: tiers.{long}: must be at most 64 characters, got 65")
    );
    assert_eq!(
        error(&format!(
            "[tiers.pro.buckets.{long}]\nrefill_rate = 1\nburst_limit = 1\n"
        )),
        format!("tiers.toml:1:20: tiers.pro.buckets.{long}: must be at most 64 characters, got 65")
    );
    assert_eq!(
        error("[tiers.pro.buckets.\"send email\"]\nrefill_rate = 1\nburst_limit = 1\n"),
        "tiers.toml:1:20: tiers.pro.buckets.\"send email\": may contain only A-Z a-z 0-9 . _ : -, found ' '"
    );
    // Dots are allowed in names, quoted in TOML, and quoted in the path.
    assert_eq!(
        error("[tiers.\"pro.v2\".buckets.\"a.b\"]\nrefill_rate = -1\nburst_limit = 1\n"),
        "tiers.toml:2:15: tiers.\"pro.v2\".buckets.\"a.b\".refill_rate: must be >= 0, got -1"
    );
}

#[test]
fn a_bucket_defined_twice_is_refused_with_its_line() {
    let text = "\
[tiers.pro.buckets.a]
refill_rate = 1
burst_limit = 1

[tiers.pro.buckets.a]
refill_rate = 2
burst_limit = 2
";
    assert_eq!(
        error(text),
        "tiers.toml:5:20: duplicate key: `[tiers.pro.buckets.a]`"
    );
    assert_eq!(
        error(&one_bucket(
            "refill_rate = 1\nrefill_rate = 2\nburst_limit = 1\n"
        )),
        "tiers.toml:3:1: duplicate key: `refill_rate = 2`"
    );
}

#[test]
fn a_syntax_error_names_its_line() {
    assert_eq!(
        error("[tiers.pro.buckets.a\nrefill_rate = 1\n"),
        "tiers.toml:1:21: unclosed table, expected `]`: `[tiers.pro.buckets.a`"
    );
}

#[test]
fn more_than_a_thousand_buckets_in_a_tier_are_refused() {
    let mut text = String::from("[tiers.big.buckets]\n");
    for i in 0..=MAX_TIER_BUCKETS {
        text.push_str(&format!("b{i} = {{ refill_rate = 1, burst_limit = 1 }}\n"));
    }
    assert_eq!(
        error(&text),
        "tiers.toml:1:8: tiers.big.buckets: at most 1000 buckets per tier, got 1001"
    );
    // A thousand is fine.
    let last = text.lines().count() - 1;
    let thousand: Vec<&str> = text.lines().take(last).collect();
    let file = parse("tiers.toml", &thousand.join("\n")).expect("a thousand buckets");
    assert_eq!(file.tiers[&tier("big")].buckets.len(), MAX_TIER_BUCKETS);
}

#[test]
fn columns_count_characters_not_bytes() {
    assert_eq!(line_and_column("é = 1\nab", 9), (2, 3));
    assert_eq!(line_and_column("é = 1", 2), (1, 2));
    assert_eq!(line_and_column("", 5), (1, 1));
}

#[test]
fn a_bucket_may_be_per_key_without_initial_tokens() {
    let file = parse(
        "tiers.toml",
        "[tiers.pro.buckets.api-calls-per-user]\nkind = \"per-key\"\nrefill_rate = 5\nburst_limit = 50\n",
    )
    .expect("valid");
    let defined = &file.tiers[&tier("pro")].buckets[&bucket("api-calls-per-user")];
    assert_eq!(defined.kind, BucketKind::PerKey);
    assert_eq!((defined.refill_rate, defined.burst_limit), (5.0, 50.0));

    let wrong = error(&one_bucket(
        "kind = \"per-user\"\nrefill_rate = 1\nburst_limit = 1\n",
    ));
    assert!(
        wrong.starts_with("tiers.toml:2:8: tiers.pro.buckets.schedule-email.kind: must be \"shared\" or \"per-key\""),
        "{wrong}"
    );
    let initial = error(&one_bucket(
        "kind = \"per-key\"\nrefill_rate = 1\nburst_limit = 1\ninitial_tokens = 1\n",
    ));
    assert!(
        initial.starts_with("tiers.toml:5:18: tiers.pro.buckets.schedule-email.initial_tokens: must be unset for a per-key bucket"),
        "{initial}"
    );
}

/// The tiers file the Envoy example checks against (docs/envoy.md) is
/// valid, and its buckets are per key.
#[test]
fn the_envoy_example_tiers_file_is_valid() {
    let text = include_str!("../../../../../deploy/envoy/tiers.toml");
    let file = parse("deploy/envoy/tiers.toml", text).expect("valid");
    let gateway = &file.tiers[&tier("gateway")];
    for name in ["api-calls-per-user", "remote_address"] {
        assert_eq!(
            gateway.buckets[&bucket(name)].kind,
            BucketKind::PerKey,
            "{name}"
        );
    }
}

#[test]
fn a_tier_may_limit_its_tables_reads_writes_or_both() {
    let file = parse(
        "tiers.toml",
        r#"
[tiers.pro.buckets.schedule-email]
refill_rate = 10
burst_limit = 100

[tiers.pro.tables.orders]
max_reads_per_second = 500
max_writes_per_second = 100.5

[tiers.pro.tables."audit.log"]
max_writes_per_second = 1

[tiers.free.tables]
users = { max_reads_per_second = 5 }
"#,
    )
    .expect("valid");
    let pro = &file.tiers[&tier("pro")];
    assert_eq!(pro.buckets.len(), 1);
    assert_eq!(
        pro.tables,
        Tables::from([
            (
                table("orders"),
                TableLimits {
                    max_reads_per_second: Some(500.0),
                    max_writes_per_second: Some(100.5),
                },
            ),
            (
                table("audit.log"),
                TableLimits {
                    max_reads_per_second: None,
                    max_writes_per_second: Some(1.0),
                },
            ),
        ])
    );
    let free = &file.tiers[&tier("free")];
    assert!(free.buckets.is_empty());
    assert_eq!(
        free.tables[&table("users")],
        TableLimits {
            max_reads_per_second: Some(5.0),
            max_writes_per_second: None,
        }
    );
}

#[test]
fn a_table_without_limits_or_with_bad_ones_is_refused_naming_the_field() {
    assert_eq!(
        error("[tiers.pro.tables.orders]\n"),
        "tiers.toml:1:19: tiers.pro.tables.orders: set max_reads_per_second, \
         max_writes_per_second or both (to remove the table's limits, leave the table out)"
    );
    assert_eq!(
        error(&one_table("max_reads_per_second = 0\n")),
        "tiers.toml:2:24: tiers.pro.tables.orders.max_reads_per_second: must be a number \
         above 0 and at most 1e9 operations per second, got 0"
    );
    // Every bad value, each at its own place.
    assert_eq!(
        errors(&one_table(
            "max_reads_per_second = nan\nmax_writes_per_second = 2e9\n"
        )),
        [
            "tiers.toml:2:24: tiers.pro.tables.orders.max_reads_per_second: must be a number \
             above 0 and at most 1e9 operations per second, got NaN",
            "tiers.toml:3:25: tiers.pro.tables.orders.max_writes_per_second: must be a number \
             above 0 and at most 1e9 operations per second, got 2000000000",
        ]
    );
    assert_eq!(
        error(&one_table("max_reads_per_second = \"5\"\n")),
        "tiers.toml:2:24: tiers.pro.tables.orders.max_reads_per_second: \
         invalid type: string \"5\", expected f64"
    );
    assert_eq!(
        error("[tiers.pro.tables.\"a b\"]\nmax_reads_per_second = 1\n"),
        "tiers.toml:1:19: tiers.pro.tables.\"a b\": may contain only A-Z a-z 0-9 . _ : -, found ' '"
    );
    assert_eq!(
        error("[tiers.pro.tables.\"\"]\nmax_reads_per_second = 1\n"),
        "tiers.toml:1:19: tiers.pro.tables.\"\": must not be empty"
    );
}

#[test]
fn unknown_keys_in_a_table_are_refused() {
    assert_eq!(
        error(&one_table("max_reads_per_second = 1\nmax_reads = 2\n")),
        "tiers.toml:3:1: tiers.pro.tables.orders.max_reads: unknown field `max_reads`, \
         expected `max_reads_per_second` or `max_writes_per_second`"
    );
    assert_eq!(
        error("[tiers.pro]\ntables = 5\n"),
        "tiers.toml:2:10: tiers.pro.tables: invalid type: integer `5`, expected a map"
    );
}

#[test]
fn a_table_listed_twice_is_a_duplicate_key() {
    let text = "\
[tiers.pro.tables.orders]
max_reads_per_second = 1

[tiers.pro.tables.orders]
max_reads_per_second = 2
";
    assert_eq!(
        error(text),
        "tiers.toml:4:19: duplicate key: `[tiers.pro.tables.orders]`"
    );
}

#[test]
fn more_than_a_thousand_tables_in_a_tier_are_refused() {
    let mut text = String::from("[tiers.big.tables]\n");
    for i in 0..=MAX_TABLES {
        text.push_str(&format!("t{i} = {{ max_reads_per_second = 1 }}\n"));
    }
    assert_eq!(
        error(&text),
        "tiers.toml:1:8: tiers.big.tables: at most 1000 tables per tier, got 1001"
    );
    let last = text.lines().count() - 1;
    let thousand: Vec<&str> = text.lines().take(last).collect();
    let file = parse("tiers.toml", &thousand.join("\n")).expect("a thousand tables");
    assert_eq!(file.tiers[&tier("big")].tables.len(), MAX_TABLES);
}

#[test]
fn a_bucket_may_carry_a_quota_per_key_or_shared() {
    use tollgate_core::budget::Period;
    let text = "[tiers.pro.buckets.api]\nkind = \"per-key\"\nrefill_rate = 10\nburst_limit = 20\n\
                [tiers.pro.buckets.api.quota]\namount = 10_000\ncycle = \"monthly\"\nanchor_day = 31\n\
                time_zone = \"America/New_York\"\n\
                [tiers.pro.buckets.mail]\nrefill_rate = 10\nburst_limit = 20\n\
                [tiers.pro.buckets.mail.quota]\namount = 100_000\ncycle = \"daily\"\n";
    let file = parse("tiers.toml", text).expect("valid");
    let pro = &file.tiers[&tier("pro")];
    let api = pro.buckets[&bucket("api")].quota.as_ref().expect("a quota");
    assert_eq!(api.amount, 10_000.0);
    assert_eq!(api.cycle.period, Period::Monthly { anchor_day: 31 });
    assert_eq!(api.cycle.time_zone, "America/New_York");
    let mail = pro.buckets[&bucket("mail")]
        .quota
        .as_ref()
        .expect("a quota");
    assert_eq!(mail.cycle.period, Period::Daily);
    assert_eq!(mail.cycle.time_zone, "UTC", "the default zone");
    assert!(
        pro.buckets[&bucket("mail")]
            .text()
            .contains("quota 100000 daily (UTC)")
    );
}

#[test]
fn a_bad_quota_names_the_line_and_the_key_at_fault() {
    let quota = |body: &str| {
        format!(
            "{}[tiers.pro.buckets.schedule-email.quota]\n{body}",
            one_bucket("refill_rate = 1\nburst_limit = 1\n")
        )
    };
    assert_eq!(
        error(&quota("amount = 0\ncycle = \"daily\"\n")),
        "tiers.toml:5:10: tiers.pro.buckets.schedule-email.quota.amount: must be more than 0 tokens per cycle"
    );
    assert_eq!(
        error(&quota("amount = 5\ncycle = \"hourly\"\n")),
        "tiers.toml:6:9: tiers.pro.buckets.schedule-email.quota.cycle: must be \"monthly\", \"weekly\" or \"daily\", got \"hourly\""
    );
    let weekday = error(&quota(
        "amount = 5\ncycle = \"weekly\"\nanchor_weekday = \"someday\"\n",
    ));
    assert!(
        weekday.starts_with(
            "tiers.toml:7:18: tiers.pro.buckets.schedule-email.quota.anchor_weekday: "
        ),
        "{weekday}"
    );
    let unknown = error(&quota("amount = 5\ncycle = \"daily\"\nper = \"month\"\n"));
    assert!(unknown.contains("quota.per: unknown field"), "{unknown}");
}

#[test]
fn enforce_false_puts_a_per_key_bucket_in_shadow_mode_and_goes_on_the_wire() {
    let file = parse(
        "tiers.toml",
        "[tiers.api.buckets.per-user]\nkind = \"per-key\"\nrefill_rate = 1\nburst_limit = 10\nenforce = false\n\
         [tiers.api.buckets.per-ip]\nkind = \"per-key\"\nrefill_rate = 1\nburst_limit = 10\n",
    )
    .expect("valid");
    let buckets = &file.tiers[&tier("api")].buckets;
    let shadow = &buckets[&bucket("per-user")];
    assert!(!shadow.enforce);
    assert!(
        shadow.text().ends_with("enforce false (shadow mode)"),
        "{}",
        shadow.text()
    );
    let wire = crate::tier::definition::to_proto(&bucket("per-user"), shadow);
    assert_eq!(wire.enforce, Some(false));
    // Left out: enforced, and unset on the wire as before shadow mode.
    let enforced = &buckets[&bucket("per-ip")];
    assert!(enforced.enforce);
    let wire = crate::tier::definition::to_proto(&bucket("per-ip"), enforced);
    assert_eq!(wire.enforce, None);
    // Not a boolean: refused, by name.
    let e = error(&one_bucket(
        "refill_rate = 1\nburst_limit = 10\nenforce = \"no\"\n",
    ));
    assert!(e.contains("enforce") || e.contains("boolean"), "{e}");
}

#[test]
fn enforce_false_on_a_tier_puts_the_whole_tier_in_shadow_mode_and_the_plan_says_so() {
    let file = parse(
        "tiers.toml",
        "[tiers.trial]\nenforce = false\n[tiers.trial.buckets.api]\nrefill_rate = 1\nburst_limit = 10\n\
         [tiers.pro.buckets.api]\nrefill_rate = 1\nburst_limit = 10\n",
    )
    .expect("valid");
    let trial = &file.tiers[&tier("trial")];
    assert!(trial.shadow);
    assert!(!file.tiers[&tier("pro")].shadow);
    let wire = crate::tier::definition::tier_to_proto(&tier("trial"), trial);
    assert_eq!(wire.enforce, Some(false));
    // Against the same tiers enforced: only the mode changes.
    let mut enforced = file.tiers.clone();
    if let Some(t) = enforced.get_mut(&tier("trial")) {
        t.shadow = false;
    }
    let plan = crate::tier::plan::Plan::new(&enforced, &file.tiers, false);
    let trial_change = plan
        .tiers
        .iter()
        .find(|t| t.name == tier("trial"))
        .expect("trial");
    assert_eq!(trial_change.action, crate::tier::plan::Action::Changed);
    assert_eq!(
        trial_change.lines(),
        ["  ~ the whole tier in shadow mode (enforce = false)"]
    );
    assert_eq!(plan.changes(), 1);
}
