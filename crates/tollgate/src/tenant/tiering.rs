//! A tenant's place among the tiers: `tollgate tenant create` (onboarding
//! on a tier), `set-tier`, `override set | clear` and `describe`, and the
//! tier lines `tenant show` prints above the buckets, and the warning
//! `set-limits` gives for a bucket a tier or an override defines.
//!
//! Each answer is the tenant as tiers see it (`TenantTier`): its tier, its
//! overrides and its buckets; the buckets use the same view as `tenant
//! show`, without instances. `describe` adds its per-key buckets (the
//! answers of changes carry none).
//!
//! `set-tier` and `override clear` first ask the server for a dry run and,
//! when it would retire buckets, list them with their totals and go on
//! only when confirmed (`closing`).

use clap::{Args, Subcommand};
use serde::Serialize;
use tollgate_core::TierName;
use tollgate_proto::v1;

use super::per_key::{self, KeyBucketJson};
use super::{TenantJson, TenantStateJson, bucket_label, list_closed, tenant_json};
use crate::closing::{self, ClosedJson, RetireArgs};
use crate::output::{self, Table, field};
use crate::remote::{ActorArg, AdminConnection, rpc_error};
use crate::tier::{BucketJson, TableLimitsJson, parse_tier_name};

#[derive(Debug, Args)]
pub struct OnTierArgs {
    #[arg(long)]
    tenant: String,
    #[arg(long, value_parser = parse_tier_name)]
    tier: TierName,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    actor: ActorArg,
}

/// `tenant set-tier`: the tenant and tier, and what to do about buckets
/// the switch retires.
#[derive(Debug, Args)]
pub struct SetTierArgs {
    #[command(flatten)]
    on: OnTierArgs,
    #[command(flatten)]
    retire: RetireArgs,
}

#[derive(Debug, Args)]
pub struct OverrideArgs {
    #[command(subcommand)]
    command: OverrideCommand,
}

#[derive(Debug, Subcommand)]
enum OverrideCommand {
    /// Set one bucket's limits for this tenant, whatever its tier says,
    /// until cleared (the bucket is created if the tenant lacks it).
    Set(OverrideSetArgs),
    /// Remove the override: the bucket returns to its tier's definition,
    /// or is retired if the tier has none
    ///
    /// A bucket it would retire is listed with its totals first, and the
    /// bucket name must be typed again (or --yes given); its totals are
    /// kept as a closed record.
    Clear {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        bucket: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        retire: RetireArgs,
        #[command(flatten)]
        actor: ActorArg,
    },
}

#[derive(Debug, Args)]
struct OverrideSetArgs {
    #[arg(long)]
    tenant: String,
    #[arg(long)]
    bucket: String,
    /// Tokens added per second.
    #[arg(long, allow_negative_numbers = true)]
    refill_rate: f64,
    /// Refill pauses at this many tokens.
    #[arg(long, allow_negative_numbers = true)]
    burst_limit: f64,
    /// Tokens the bucket starts with if the override creates it [default:
    /// the burst limit].
    #[arg(long, allow_negative_numbers = true)]
    initial_tokens: Option<f64>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    actor: ActorArg,
}

#[derive(Debug, Args)]
pub struct TableLimitsArgs {
    #[command(subcommand)]
    command: TableLimitsCommand,
}

#[derive(Debug, Subcommand)]
enum TableLimitsCommand {
    /// Set one table's per-partition limits for this tenant (at least one
    /// of the two), until cleared; pods apply them without a restart.
    Set(TableLimitsSetArgs),
    /// Remove the tenant's own limits of the table: its tier's apply
    /// again, or none.
    Clear {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        table: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
}

#[derive(Debug, Args)]
struct TableLimitsSetArgs {
    #[arg(long)]
    tenant: String,
    #[arg(long)]
    table: String,
    /// The most reads per second of any one partition [default: no limit].
    #[arg(long, allow_negative_numbers = true)]
    max_reads_per_second: Option<f64>,
    /// The most writes per second of any one partition [default: no limit].
    #[arg(long, allow_negative_numbers = true)]
    max_writes_per_second: Option<f64>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    actor: ActorArg,
}

/// `tenant table-limits set | clear`: `SetTableLimits`, `ClearTableLimits`.
/// The numbers are the server's to check, so the CLI refuses exactly what
/// the server does.
pub async fn table_limits(client: &mut AdminConnection, a: TableLimitsArgs) -> anyhow::Result<()> {
    match a.command {
        TableLimitsCommand::Set(a) => {
            let tenant = client
                .set_table_limits(a.actor.request(v1::SetTableLimitsRequest {
                    tenant_id: a.tenant,
                    limits: Some(v1::TableLimits {
                        table: a.table.clone(),
                        max_reads_per_second: a.max_reads_per_second,
                        max_writes_per_second: a.max_writes_per_second,
                    }),
                }))
                .await
                .map_err(rpc_error)?
                .into_inner()
                .tenant
                .unwrap_or_default();
            print_changed(
                a.json,
                &tenant,
                &format!("set the limits of table {}", a.table),
            )
        }
        TableLimitsCommand::Clear {
            tenant,
            table,
            json,
            actor,
        } => {
            let tenant = client
                .clear_table_limits(actor.request(v1::ClearTableLimitsRequest {
                    tenant_id: tenant,
                    table: table.clone(),
                }))
                .await
                .map_err(rpc_error)?
                .into_inner()
                .tenant
                .unwrap_or_default();
            print_changed(
                json,
                &tenant,
                &format!("cleared the limits of table {table}"),
            )
        }
    }
}

/// `tenant create`: `CreateTenant`, every bucket of the tier at once. A
/// tenant that exists is refused; the error names the command that moves
/// it to the tier.
pub async fn create(client: &mut AdminConnection, a: OnTierArgs) -> anyhow::Result<()> {
    let tenant = client
        .create_tenant(a.actor.request(v1::CreateTenantRequest {
            tenant_id: a.tenant.clone(),
            tier: a.tier.as_str().to_owned(),
        }))
        .await
        .map_err(|status| {
            if status.code() != tonic::Code::AlreadyExists {
                return rpc_error(status);
            }
            rpc_error(tonic::Status::already_exists(format!(
                "tenant {:?} already exists; move it to tier {} with `tollgate tenant set-tier \
                 --tenant {} --tier {}`",
                a.tenant,
                a.tier.as_str(),
                a.tenant,
                a.tier.as_str()
            )))
        })?
        .into_inner()
        .tenant
        .unwrap_or_default();
    let view = tenant_tier_json(&tenant);
    output::print(a.json, &view, |v| {
        format!(
            "created tenant {} on tier {}\n\n{}",
            v.tenant_id,
            v.tier.as_deref().unwrap_or_default(),
            tenant_tier_text(v)
        )
    })
}

/// `tenant set-tier`: `SetTenantTier` (a dry run first; with `--dry-run`
/// only that), and which buckets it created, changed and retired.
pub async fn set_tier(client: &mut AdminConnection, a: SetTierArgs) -> anyhow::Result<()> {
    let SetTierArgs { on: a, retire } = a;
    let request = |dry_run| {
        a.actor.request(v1::SetTenantTierRequest {
            tenant_id: a.tenant.clone(),
            tier: a.tier.as_str().to_owned(),
            dry_run,
        })
    };
    let mut response = client
        .set_tenant_tier(request(true))
        .await
        .map_err(rpc_error)?
        .into_inner();
    if !retire.dry_run {
        if !response.closed.is_empty() {
            closing::confirm(
                &format!("moving tenant {:?} to tier {}", a.tenant, a.tier),
                &closing::retiring_text("would retire", &closing::closed_json(&response.closed)),
                &a.tenant,
                retire.yes,
            )?;
        }
        response = client
            .set_tenant_tier(request(false))
            .await
            .map_err(rpc_error)?
            .into_inner();
    }
    let view = SetTierJson {
        tenant: tenant_tier_json(&response.tenant.unwrap_or_default()),
        dry_run: retire.dry_run,
        created: response.created,
        changed: response.changed,
        retired: response.retired,
        closed: closing::closed_json(&response.closed),
    };
    output::print(a.json, &view, set_tier_text)
}

/// `tenant override set | clear`.
pub async fn override_(client: &mut AdminConnection, a: OverrideArgs) -> anyhow::Result<()> {
    match a.command {
        OverrideCommand::Set(a) => {
            let tenant = client
                .set_bucket_override(a.actor.request(v1::SetBucketOverrideRequest {
                    tenant_id: a.tenant,
                    bucket: Some(v1::BucketDefinition {
                        bucket: a.bucket.clone(),
                        refill_rate: a.refill_rate,
                        burst_limit: a.burst_limit,
                        initial_tokens: a.initial_tokens,
                        kind: v1::BucketKind::Shared.into(),
                        quota: None,
                        enforce: None,
                    }),
                }))
                .await
                .map_err(rpc_error)?
                .into_inner()
                .tenant
                .unwrap_or_default();
            print_changed(
                a.json,
                &tenant,
                &format!("set the override of bucket {}", a.bucket),
            )
        }
        OverrideCommand::Clear {
            tenant,
            bucket,
            json,
            retire,
            actor,
        } => {
            let request = |dry_run| {
                actor.request(v1::ClearBucketOverrideRequest {
                    tenant_id: tenant.clone(),
                    bucket: bucket.clone(),
                    dry_run,
                })
            };
            let mut response = client
                .clear_bucket_override(request(true))
                .await
                .map_err(rpc_error)?
                .into_inner();
            if !retire.dry_run {
                if !response.closed.is_empty() {
                    closing::confirm(
                        &format!("clearing the override of bucket {bucket} of tenant {tenant:?}"),
                        &closing::retiring_text(
                            "would retire",
                            &closing::closed_json(&response.closed),
                        ),
                        &bucket,
                        retire.yes,
                    )?;
                }
                response = client
                    .clear_bucket_override(request(false))
                    .await
                    .map_err(rpc_error)?
                    .into_inner();
            }
            let view = ClearedJson {
                tenant: tenant_tier_json(&response.tenant.unwrap_or_default()),
                dry_run: retire.dry_run,
                closed: closing::closed_json(&response.closed),
            };
            output::print(json, &view, |v| {
                let done = if v.dry_run {
                    format!(
                        "would clear the override of bucket {bucket} (dry run: nothing changed)"
                    )
                } else {
                    format!("cleared the override of bucket {bucket}")
                };
                let verb = if v.dry_run { "would retire" } else { "retired" };
                let retired = if v.closed.is_empty() {
                    String::new()
                } else {
                    format!("\n{}", closing::retiring_text(verb, &v.closed))
                };
                format!(
                    "{done} for tenant {}{retired}\n\n{}",
                    v.tenant.tenant_id,
                    tenant_tier_text(&v.tenant)
                )
            })
        }
    }
}

/// Prints a tenant a change answered with: `{done} for tenant {id}`, then
/// the tenant as `describe` shows it (or the JSON view).
fn print_changed(json: bool, tenant: &v1::TenantTier, done: &str) -> anyhow::Result<()> {
    output::print(json, &tenant_tier_json(tenant), |v| {
        format!(
            "{done} for tenant {}\n\n{}",
            v.tenant_id,
            tenant_tier_text(v)
        )
    })
}

/// `tenant describe`: `DescribeTenant`, and how many closed buckets the
/// tenant has (`ListClosedBuckets`).
pub async fn describe(
    client: &mut AdminConnection,
    tenant: String,
    json: bool,
) -> anyhow::Result<()> {
    let closed = list_closed(client, &tenant).await?.len();
    let tenant = client
        .describe_tenant(v1::DescribeTenantRequest { tenant_id: tenant })
        .await
        .map_err(rpc_error)?
        .into_inner()
        .tenant
        .unwrap_or_default();
    let view = DescribeJson {
        tenant: tenant_tier_json(&tenant),
        closed_buckets: closed,
    };
    output::print(json, &view, |v| {
        let mut text = tenant_tier_text(&v.tenant);
        if v.closed_buckets > 0 {
            text.push_str(&format!(
                "\n\n{} closed bucket{} (retired or deleted, totals kept): `tollgate tenant show --tenant {} --closed`",
                v.closed_buckets,
                if v.closed_buckets == 1 { "" } else { "s" },
                v.tenant.tenant_id
            ));
        }
        text
    })
}

/// What `set-limits` warns of when `bucket` of `tenant` is one its
/// override or its tier defines: the limits set by hand last only until
/// the next change of the tier or of the tenant's tier or overrides, which
/// writes the definition's again. `None` for any other bucket, and when
/// the server cannot say (one without tiers, a read-only token): the
/// change itself went through, and the warning is only advice.
pub async fn managed_bucket_warning(
    client: &mut AdminConnection,
    tenant: &str,
    bucket: &str,
) -> Option<String> {
    // Tiers never define the request-unit bucket.
    if bucket.is_empty() {
        return None;
    }
    let described = client
        .describe_tenant(v1::DescribeTenantRequest {
            tenant_id: tenant.to_owned(),
        })
        .await
        .ok()?
        .into_inner()
        .tenant?;
    let advice = |by: &str, limits: &BucketJson| {
        format!(
            "bucket {bucket} of tenant {tenant} is defined by {by} ({}): the next change of \
             the tier, or of the tenant's tier or overrides, sets these limits back; to give \
             this tenant limits of its own, use `tollgate tenant override set --tenant {tenant} \
             --bucket {bucket} --refill-rate R --burst-limit B`",
            limits.limits_text()
        )
    };
    if let Some(o) = described.overrides.iter().find(|o| o.bucket == bucket) {
        return Some(advice("its override", &BucketJson::new(o)));
    }
    if described.tier.is_empty() {
        return None;
    }
    let tier = client
        .get_tier(v1::GetTierRequest {
            name: described.tier.clone(),
        })
        .await
        .ok()?
        .into_inner()
        .tier?;
    let definition = tier.buckets.iter().find(|b| b.bucket == bucket)?;
    Some(advice(
        &format!("tier {}", described.tier),
        &BucketJson::new(definition),
    ))
}

/// The tier and override lines `tenant show` prints above the buckets, or
/// `None` when the server cannot say: one without tiers answers
/// `UNIMPLEMENTED`, and a tenant it does not know is for the bucket
/// listing to report.
pub async fn show_header(
    client: &mut AdminConnection,
    tenant: &str,
) -> anyhow::Result<Option<String>> {
    let described = client
        .describe_tenant(v1::DescribeTenantRequest {
            tenant_id: tenant.to_owned(),
        })
        .await;
    match described {
        Ok(response) => {
            let view = tenant_tier_json(&response.into_inner().tenant.unwrap_or_default());
            Ok(Some(Table::new(tier_fields(&view)).to_string()))
        }
        Err(status)
            if matches!(
                status.code(),
                tonic::Code::Unimplemented | tonic::Code::NotFound
            ) =>
        {
            Ok(None)
        }
        Err(status) => Err(rpc_error(status)),
    }
}

/// A tenant as tiers see it, as `--json` prints it.
#[derive(Debug, Serialize)]
struct TenantTierJson {
    tenant_id: String,
    /// `null` if the tenant is on no tier.
    tier: Option<String>,
    /// Buckets whose limits the tenant has whatever its tier says.
    overrides: Vec<BucketJson>,
    /// Every shared bucket, as `tenant show` shows it (without instances).
    buckets: Vec<TenantJson>,
    /// Every per-key bucket, as `tenant show` shows it (`describe` only).
    key_buckets: Vec<KeyBucketJson>,
    /// The tenant's own per-partition limits, by table.
    table_limits: Vec<TableLimitsJson>,
    /// The tenant's suspension; `null` while it is served.
    state: Option<TenantStateJson>,
}

/// What `tenant describe` prints: the tenant as tiers see it, and how
/// many closed buckets it has.
#[derive(Debug, Serialize)]
struct DescribeJson {
    #[serde(flatten)]
    tenant: TenantTierJson,
    closed_buckets: usize,
}

/// What `tenant set-tier` prints.
#[derive(Debug, Serialize)]
struct SetTierJson {
    tenant: TenantTierJson,
    /// True if nothing changed: the rest is what a real run would do.
    dry_run: bool,
    /// Bucket names the switch created, changed and retired.
    created: Vec<String>,
    changed: Vec<String>,
    retired: Vec<String>,
    /// The closed record of each bucket retired: its totals.
    closed: Vec<ClosedJson>,
}

/// What `tenant override clear` prints.
#[derive(Debug, Serialize)]
struct ClearedJson {
    #[serde(flatten)]
    tenant: TenantTierJson,
    /// True if nothing changed.
    dry_run: bool,
    /// The closed record of the bucket, if clearing retired it.
    closed: Vec<ClosedJson>,
}

fn tenant_tier_json(t: &v1::TenantTier) -> TenantTierJson {
    TenantTierJson {
        tenant_id: t.tenant_id.clone(),
        tier: Some(t.tier.clone()).filter(|tier| !tier.is_empty()),
        overrides: t.overrides.iter().map(BucketJson::new).collect(),
        buckets: t.buckets.iter().map(|b| tenant_json(b, false)).collect(),
        key_buckets: t.key_buckets.iter().map(per_key::key_bucket_json).collect(),
        table_limits: t.table_overrides.iter().map(TableLimitsJson::new).collect(),
        state: t.state.as_ref().map(TenantStateJson::new),
    }
}

/// `tier` and `overrides` rows of a key-value table, one row per override.
fn tier_fields(view: &TenantTierJson) -> Vec<Vec<String>> {
    let mut rows = vec![field(
        "tier",
        view.tier.clone().unwrap_or_else(|| "(none)".to_owned()),
    )];
    if view.overrides.is_empty() {
        rows.push(field("overrides", "(none)".to_owned()));
    }
    for (i, o) in view.overrides.iter().enumerate() {
        let key = if i == 0 { "overrides" } else { "" };
        rows.push(field(key, format!("{}: {}", o.bucket, o.limits_text())));
    }
    for (i, t) in view.table_limits.iter().enumerate() {
        let key = if i == 0 { "table limits" } else { "" };
        rows.push(field(key, t.text()));
    }
    if let Some(state) = &view.state {
        rows.push(field("state", state.text()));
    }
    rows
}

/// The tenant, its tier and overrides, then a line per bucket, then a
/// line per per-key bucket.
fn tenant_tier_text(view: &TenantTierJson) -> String {
    let mut fields = vec![field("tenant", view.tenant_id.clone())];
    fields.extend(tier_fields(view));
    let fields = Table::new(fields);
    if view.buckets.is_empty() && view.key_buckets.is_empty() {
        return format!("{fields}\n\nno buckets");
    }
    let per_key_text = if view.key_buckets.is_empty() {
        String::new()
    } else {
        format!(
            "\n\n{}\n\n{}",
            per_key::table(&view.key_buckets, false),
            per_key::rates_note(&view.key_buckets)
        )
    };
    if view.buckets.is_empty() {
        return format!("{fields}{per_key_text}");
    }
    let mut buckets = Table::with_header(&["BUCKET", "REFILL/S", "BURST", "TOKENS", "OVERRIDDEN"]);
    for b in &view.buckets {
        let overridden = view.overrides.iter().any(|o| o.bucket == b.bucket);
        buckets.push(vec![
            bucket_label(&b.bucket).to_owned(),
            b.refill_rate.to_string(),
            b.burst_limit.to_string(),
            format!("{:.1}", b.current_tokens),
            if overridden { "yes" } else { "" }.to_owned(),
        ]);
    }
    format!("{fields}\n\n{buckets}{per_key_text}")
}

fn set_tier_text(view: &SetTierJson) -> String {
    let names = |names: &[String]| {
        if names.is_empty() {
            "(none)".to_owned()
        } else {
            names.join(", ")
        }
    };
    let changes = Table::new([
        field("created", names(&view.created)),
        field("changed", names(&view.changed)),
        field("retired", names(&view.retired)),
    ]);
    let (moved, verb) = if view.dry_run {
        ("would move", "would retire")
    } else {
        ("moved", "retired")
    };
    let retired = if view.closed.is_empty() {
        String::new()
    } else {
        format!("\n\n{}", closing::retiring_text(verb, &view.closed))
    };
    let note = if view.dry_run {
        " (dry run: nothing changed)"
    } else {
        ""
    };
    format!(
        "{moved} tenant {} to tier {}{note}\n{changes}{retired}\n\n{}",
        view.tenant.tenant_id,
        view.tenant.tier.as_deref().unwrap_or_default(),
        tenant_tier_text(&view.tenant)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant_tier() -> v1::TenantTier {
        let bucket = |name: &str, rate: f64, burst: f64| v1::Tenant {
            tenant_id: "t1234".into(),
            bucket: name.into(),
            limits: Some(v1::ResourceLimits {
                refill_rate: rate,
                burst_limit: burst,
            }),
            configured: true,
            current_tokens: burst,
            ..v1::Tenant::default()
        };
        v1::TenantTier {
            tenant_id: "t1234".into(),
            tier: "pro".into(),
            overrides: vec![v1::BucketDefinition {
                quota: None,
                bucket: "schedule-email".into(),
                refill_rate: 50.0,
                burst_limit: 500.0,
                initial_tokens: None,
                kind: v1::BucketKind::Shared.into(),
                enforce: None,
            }],
            buckets: vec![
                bucket("invoke-doc-summary-ai", 1.0, 20.0),
                bucket("schedule-email", 50.0, 500.0),
            ],
            table_overrides: vec![v1::TableLimits {
                table: "orders".into(),
                max_reads_per_second: Some(100.0),
                max_writes_per_second: None,
            }],
            key_buckets: vec![],
            state: None,
        }
    }

    #[test]
    fn a_tenant_reads_as_its_tier_its_overrides_and_its_buckets() {
        let text = tenant_tier_text(&tenant_tier_json(&tenant_tier()));
        assert_eq!(
            text,
            "tenant        t1234\n\
             tier          pro\n\
             overrides     schedule-email: refill_rate 50, burst_limit 500\n\
             table limits  orders: reads 100/s, writes unlimited per partition\n\
             \n\
             BUCKET                 REFILL/S  BURST  TOKENS  OVERRIDDEN\n\
             invoke-doc-summary-ai  1         20     20.0\n\
             schedule-email         50        500    500.0   yes"
        );
    }

    #[test]
    fn a_tenant_on_no_tier_has_a_null_tier_in_json() {
        let json = serde_json::to_value(tenant_tier_json(&v1::TenantTier {
            tenant_id: "t1".into(),
            ..v1::TenantTier::default()
        }))
        .expect("json");
        assert_eq!(json["tier"], serde_json::Value::Null);
        assert_eq!(json["overrides"], serde_json::json!([]));
        let text = tenant_tier_text(&tenant_tier_json(&v1::TenantTier {
            tenant_id: "t1".into(),
            ..v1::TenantTier::default()
        }));
        assert!(text.contains("tier       (none)"), "{text}");
        assert!(text.contains("overrides  (none)"), "{text}");
    }

    #[test]
    fn tenant_tier_json_lists_buckets_without_instances() {
        let json = serde_json::to_value(tenant_tier_json(&tenant_tier())).expect("json");
        assert_eq!(json["tier"], "pro");
        assert_eq!(json["overrides"][0]["bucket"], "schedule-email");
        assert_eq!(
            json["overrides"][0]["initial_tokens"],
            serde_json::Value::Null
        );
        assert_eq!(json["buckets"][1]["refill_rate"], 50.0);
        assert_eq!(json["table_limits"][0]["table"], "orders");
        assert_eq!(json["table_limits"][0]["max_reads_per_second"], 100.0);
        assert_eq!(
            json["table_limits"][0]["max_writes_per_second"],
            serde_json::Value::Null
        );
        let text = tenant_tier_text(&tenant_tier_json(&tenant_tier()));
        assert!(
            text.contains("table limits  orders: reads 100/s, writes unlimited per partition"),
            "{text}"
        );
        assert!(json["buckets"][0].get("instances").is_none(), "{json}");
    }

    #[test]
    fn set_tier_text_names_the_buckets_created_changed_and_retired() {
        let view = SetTierJson {
            tenant: tenant_tier_json(&tenant_tier()),
            created: vec![],
            dry_run: false,
            changed: vec!["invoke-doc-summary-ai".into(), "schedule-email".into()],
            retired: vec!["export".into()],
            closed: vec![],
        };
        let text = set_tier_text(&view);
        assert!(
            text.starts_with(
                "moved tenant t1234 to tier pro\n\
                 created  (none)\n\
                 changed  invoke-doc-summary-ai, schedule-email\n\
                 retired  export\n\n"
            ),
            "{text}"
        );
    }
}
