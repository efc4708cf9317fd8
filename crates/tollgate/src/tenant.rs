//! `tollgate tenant …`: operator commands that talk to a running server's
//! `Admin` service over gRPC. Tenants' limits bucket by bucket are here;
//! their tiers and overrides are in `tiering`, their per-key buckets
//! (shown by `show`, `list`, `describe` and `watch` beside the shared
//! ones) in `per_key`.
//!
//! `set-limits` on a bucket the tenant's tier or an override defines
//! warns on stderr that the next change of either sets it back.
//!
//! Human output is an aligned table; `--json` prints one JSON document for
//! scripts (see `output`). Errors from the server are shown with their gRPC
//! code and message.
//!
//! `set-limits --bucket NAME` sets (and creates) a named bucket, and sends
//! an `update_mask` of the values given when not all three are. `show
//! --tenant T` shows every bucket of the tenant (in JSON, a list), `--bucket
//! B` one; `list` has a `BUCKET` column. `delete` asks for the tenant id
//! again unless `--yes`, and refuses without a terminal to ask on.

pub(crate) mod history;
mod per_key;
mod tiering;
mod watch;

use std::time::SystemTime;

use clap::{Args, Subcommand};
use serde::Serialize;
use tollgate_proto::v1::{self, admin_client::AdminClient};

use crate::closing;
use crate::output::{self, Table, field, rfc3339, seconds};
use crate::preview::{self, PreviewArgs};
use crate::remote::{ActorArg, AdminConnection, AdminServerArg, rpc_error};

#[derive(Debug, Args)]
pub struct TenantArgs {
    #[command(flatten)]
    server: AdminServerArg,

    #[command(subcommand)]
    command: TenantCommand,
}

#[derive(Debug, Subcommand)]
enum TenantCommand {
    /// Set the limits of a tenant's bucket, creating it if needed.
    SetLimits(SetLimitsArgs),
    /// Show a tenant's buckets: limits, tokens, consumption and instances;
    /// per-key buckets with their keys stored, checks per second and
    /// busiest keys.
    Show {
        #[arg(long)]
        tenant: String,
        /// Only this bucket ("" for the request-unit bucket); every bucket
        /// of the tenant if not given.
        #[arg(long)]
        bucket: Option<String>,
        /// Print JSON instead of a table: one bucket with --bucket, else a
        /// list of the tenant's buckets (per-key ones with "kind":
        /// "per-key"; with --closed, of its closed buckets).
        #[arg(long)]
        json: bool,
        /// Show the tenant's closed buckets instead: those retired or
        /// deleted, with their last limits and exact totals, who closed
        /// them, when and why, in the order they were closed.
        #[arg(long, conflicts_with = "bucket")]
        closed: bool,
    },
    /// List all tenants' buckets, shared and per-key.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a tenant: its buckets, instances and keys
    ///
    /// Each bucket's last limits and exact totals are kept as a closed
    /// record (`show --closed`). It leaves a tombstone: its pods are refused
    /// (NotFound, saying when it was deleted) until it is created again
    /// (create, set-tier, override, table-limits or set-limits). Lists the
    /// closed records and asks for the tenant id to be typed again unless
    /// --yes is given; without a terminal to ask on, refuses without --yes.
    Delete {
        #[arg(long)]
        tenant: String,
        /// Delete without asking.
        #[arg(long, short = 'y')]
        yes: bool,
        /// Print JSON instead of a line of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
    /// Suspend a tenant: its pods are refused until it is resumed
    ///
    /// Its limits, buckets, pods' rows and totals are kept as they are.
    /// Suspending a suspended tenant changes nothing.
    Suspend {
        #[arg(long)]
        tenant: String,
        /// Why: shown to its pods in their refusals and to operators.
        #[arg(long, default_value = "")]
        reason: String,
        /// Print JSON instead of a line of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
    /// Resume a suspended tenant: its pods are served again at once.
    Resume {
        #[arg(long)]
        tenant: String,
        /// Print JSON instead of a line of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
    /// Onboard a tenant on a tier
    ///
    /// Every bucket of the tier is provisioned at once. Refused if the
    /// tenant exists (use set-tier).
    Create(tiering::OnTierArgs),
    /// Move a tenant to a tier (creating the tenant if needed)
    ///
    /// Its buckets take the tier's limits, tokens carried over (capped at
    /// the new burst); buckets the tier adds are created, those it drops
    /// retired. Overrides win over the tier. Buckets it would retire are
    /// listed with their totals first, and the tenant id must be typed
    /// again (or --yes given); their totals are kept as closed records.
    SetTier(tiering::SetTierArgs),
    /// Set or clear a tenant's override of one bucket's limits.
    Override(tiering::OverrideArgs),
    /// Set or clear the tenant's own per-partition limits of a table (the
    /// most reads and writes per second of any one partition, summed over
    /// its pods), replacing its tier's for that table.
    TableLimits(tiering::TableLimitsArgs),
    /// Watch the busiest buckets live, as `top` does processes
    ///
    /// Every --interval: limits, level, request units and granted tokens
    /// per second (from the exact totals), live pods; busiest first.
    Watch(watch::WatchArgs),
    /// A bucket's usage over time, from the usage history
    ///
    /// One row per step the bucket used anything in: request units and
    /// granted tokens per second, and their totals, exactly what billing
    /// counts. Deleted buckets keep their history.
    History(history::HistoryArgs),
    /// Show a tenant's tier, overrides and buckets.
    Describe {
        #[arg(long)]
        tenant: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
struct SetLimitsArgs {
    #[arg(long)]
    tenant: String,
    #[command(flatten)]
    values: LimitValues,
    #[command(flatten)]
    preview: PreviewArgs,
}

/// What `set-limits` sets, of a tenant's or an organisation's bucket.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("values")
        .args(["available", "refill_rate", "burst_limit"])
        .multiple(true)
        .required(true)
))]
pub(crate) struct LimitValues {
    /// The tenant's bucket (a rate-limited action); empty for its
    /// request-unit bucket.
    #[arg(long, default_value = "")]
    bucket: String,
    /// Tokens in the bucket (as of --as-of, if given). Left out: the
    /// bucket keeps its tokens.
    #[arg(long, allow_negative_numbers = true)]
    available: Option<f64>,
    /// Tokens added per second. Left out: the bucket keeps its rate.
    #[arg(long, allow_negative_numbers = true)]
    refill_rate: Option<f64>,
    /// Refill pauses at this many tokens; 0 means no burst. Left out: the
    /// bucket keeps its burst limit.
    #[arg(long, allow_negative_numbers = true)]
    burst_limit: Option<f64>,
    /// When the consumption --available is based on was read (RFC 3339,
    /// e.g. 2026-01-02T03:04:05Z); the server corrects for what happened
    /// since. Needs --as-of-consumed.
    #[arg(
        long,
        value_parser = humantime::parse_rfc3339,
        requires_all = ["available", "as_of_consumed"]
    )]
    as_of: Option<SystemTime>,
    /// The tenant's cumulative request units at --as-of (`tenant show`
    /// prints them); what was consumed after it is taken off --available.
    #[arg(long, requires = "as_of", allow_negative_numbers = true)]
    as_of_consumed: Option<f64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    actor: ActorArg,
}

impl LimitValues {
    /// The values given, as an update mask; none when all three are (the
    /// update replaces them all, as servers before masks understand).
    fn update_mask(&self) -> Option<prost_types::FieldMask> {
        let given = [
            ("available_tokens", self.available.is_some()),
            ("refill_rate", self.refill_rate.is_some()),
            ("burst_limit", self.burst_limit.is_some()),
        ];
        if given.iter().all(|(_, is)| *is) {
            return None;
        }
        Some(prost_types::FieldMask {
            paths: given
                .iter()
                .filter(|(_, is)| *is)
                .map(|(path, _)| (*path).to_owned())
                .collect(),
        })
    }
}

pub async fn run(args: TenantArgs) -> anyhow::Result<()> {
    let mut client = args.server.admin().await?;
    match args.command {
        TenantCommand::Create(a) => tiering::create(&mut client, a).await,
        TenantCommand::SetTier(a) => tiering::set_tier(&mut client, a).await,
        TenantCommand::Override(a) => tiering::override_(&mut client, a).await,
        TenantCommand::TableLimits(a) => tiering::table_limits(&mut client, a).await,
        TenantCommand::Watch(a) => watch::watch(&mut client, a).await,
        TenantCommand::History(a) => history::history(&mut client, a).await,
        TenantCommand::Describe { tenant, json } => {
            tiering::describe(&mut client, tenant, json).await
        }
        TenantCommand::SetLimits(a) if a.preview.preview => {
            preview_limits(&mut client, &a.tenant, &a.values, &a.preview).await
        }
        TenantCommand::SetLimits(a) => set_limits(&mut client, &a.tenant, &a.values).await,
        TenantCommand::Show {
            tenant,
            json,
            closed: true,
            ..
        } => {
            let closed = list_closed(&mut client, &tenant).await?;
            output::print(json, &closing::closed_json(&closed), |c| {
                closing::closed_text(&tenant, c)
            })
        }
        TenantCommand::Show {
            tenant,
            bucket: Some(bucket),
            json,
            ..
        } => {
            let response = client
                .get_tenant(v1::GetTenantRequest {
                    tenant_id: tenant.clone(),
                    bucket: bucket.clone(),
                })
                .await;
            match response {
                Ok(response) => {
                    print_tenant(&response.into_inner().tenant.unwrap_or_default(), json)
                }
                // Not a shared bucket: perhaps a per-key one.
                Err(status) if status.code() == tonic::Code::NotFound => {
                    let found = per_key::list(&mut client, &tenant, 0)
                        .await?
                        .into_iter()
                        .find(|k| k.bucket == bucket);
                    match found {
                        Some(k) => output::print(
                            json,
                            &per_key::key_bucket_json(&k),
                            per_key::key_bucket_text,
                        ),
                        None => Err(rpc_error(status)),
                    }
                }
                Err(status) => Err(rpc_error(status)),
            }
        }
        TenantCommand::Show {
            tenant,
            bucket: None,
            json,
            ..
        } => {
            let listed = list(&mut client, &tenant).await?;
            let key_buckets = per_key::list(&mut client, &tenant, 0).await?;
            if listed.is_empty() && key_buckets.is_empty() {
                return Err(tenant_not_found(&tenant));
            }
            // Scripts read the tier with `tenant describe`: the JSON stays
            // a list of buckets.
            let header = if json {
                None
            } else {
                tiering::show_header(&mut client, &tenant).await?
            };
            // The listing leaves out instances; read each bucket whole.
            let mut buckets = Vec::with_capacity(listed.len());
            for b in listed {
                let response = client
                    .get_tenant(v1::GetTenantRequest {
                        tenant_id: b.tenant_id,
                        bucket: b.bucket,
                    })
                    .await
                    .map_err(rpc_error)?;
                buckets.push(response.into_inner().tenant.unwrap_or_default());
            }
            print_buckets(&buckets, &key_buckets, header, json)
        }
        TenantCommand::List { json } => {
            let shared = list(&mut client, "").await?;
            let key_buckets = per_key::list(&mut client, "", 0).await?;
            print_list(&shared, &key_buckets, json)
        }
        TenantCommand::Delete {
            tenant,
            yes,
            json,
            actor,
        } => {
            if !yes {
                let would = client
                    .delete_tenant(actor.request(v1::DeleteTenantRequest {
                        tenant_id: tenant.clone(),
                        dry_run: true,
                    }))
                    .await
                    .map_err(rpc_error)?
                    .into_inner()
                    .closed;
                let mut what = format!(
                    "deletes tenant {tenant:?}, its buckets, their instances and its keys: this cannot be undone."
                );
                if !would.is_empty() {
                    what.push_str(&format!(
                        " {}",
                        closing::retiring_text("It closes", &closing::closed_json(&would))
                    ));
                }
                closing::confirm(
                    &format!("deleting tenant {tenant:?}"),
                    &what,
                    &tenant,
                    false,
                )?;
            }
            let closed = client
                .delete_tenant(actor.request(v1::DeleteTenantRequest {
                    tenant_id: tenant.clone(),
                    dry_run: false,
                }))
                .await
                .map_err(rpc_error)?
                .into_inner()
                .closed;
            let deleted = DeletedTenantJson {
                tenant_id: tenant,
                deleted: true,
                closed: closing::closed_json(&closed),
            };
            output::print(json, &deleted, |d| {
                let deleted = format!(
                    "deleted tenant {}: its pods are refused until it is created again",
                    d.tenant_id
                );
                if d.closed.is_empty() {
                    deleted
                } else {
                    format!("{deleted}\n{}", closing::retiring_text("closed", &d.closed))
                }
            })
        }
        TenantCommand::Suspend {
            tenant,
            reason,
            json,
            actor,
        } => {
            let answer = client
                .suspend_tenant(actor.request(v1::SuspendTenantRequest {
                    tenant_id: tenant.clone(),
                    reason,
                }))
                .await
                .map_err(rpc_error)?
                .into_inner();
            let view = StateChangeJson {
                tenant_id: tenant,
                changed: answer.changed,
                state: answer.state.as_ref().map(TenantStateJson::new),
            };
            output::print(json, &view, |v| match (&v.state, v.changed) {
                (Some(state), true) => {
                    format!("suspended tenant {}: {}", v.tenant_id, state.text())
                }
                (Some(state), false) => format!(
                    "tenant {} was suspended already, nothing changed: {}",
                    v.tenant_id,
                    state.text()
                ),
                (None, _) => format!("tenant {} is not suspended", v.tenant_id),
            })
        }
        TenantCommand::Resume {
            tenant,
            json,
            actor,
        } => {
            let answer = client
                .resume_tenant(actor.request(v1::ResumeTenantRequest {
                    tenant_id: tenant.clone(),
                }))
                .await
                .map_err(rpc_error)?
                .into_inner();
            let view = StateChangeJson {
                tenant_id: tenant,
                changed: answer.changed,
                state: None,
            };
            output::print(json, &view, |v| {
                if v.changed {
                    format!("resumed tenant {}: its pods are served again", v.tenant_id)
                } else {
                    format!("tenant {} was not suspended, nothing changed", v.tenant_id)
                }
            })
        }
    }
}

/// What `tenant suspend --json` and `tenant resume --json` print.
#[derive(Debug, Serialize)]
struct StateChangeJson {
    tenant_id: String,
    /// False if the tenant already was as asked.
    changed: bool,
    /// The suspension now; `null` once resumed.
    state: Option<TenantStateJson>,
}

/// A tenant's suspension (or tombstone) as `--json` prints it.
#[derive(Debug, Serialize)]
pub(crate) struct TenantStateJson {
    /// `suspended` (or `deleted`).
    kind: String,
    since: Option<String>,
    /// Who did it, as the server's audit log names them.
    actor: String,
    reason: String,
}

impl TenantStateJson {
    pub(crate) fn new(state: &v1::TenantState) -> Self {
        TenantStateJson {
            kind: state.kind.clone(),
            since: rfc3339(state.since),
            actor: state.actor.clone(),
            reason: state.reason.clone(),
        }
    }

    /// `suspended since 2026-…Z by alice at 10.0.0.7:51234: unpaid`.
    pub(crate) fn text(&self) -> String {
        let mut text = format!(
            "{} since {} by {}",
            self.kind,
            self.since.as_deref().unwrap_or("(unknown)"),
            self.actor
        );
        if !self.reason.is_empty() {
            text += &format!(": {}", self.reason);
        }
        text
    }
}

/// A refused `set-limits`, in the command's terms: a partial update of a
/// bucket that does not exist yet names the flags it needs rather than the
/// request's fields (`update_mask`, `available_tokens`).
/// `set-limits` of `tenant`'s bucket (a tenant's or an organisation's).
pub(crate) async fn set_limits(
    client: &mut AdminConnection,
    tenant: &str,
    a: &LimitValues,
) -> anyhow::Result<()> {
    let update_mask = a.update_mask();
    let response = client
        .update_tenant_resource_limits(a.actor.request(v1::UpdateTenantResourceLimitsRequest {
            tenant_id: tenant.to_owned(),
            bucket: a.bucket.clone(),
            available_tokens: a.available.unwrap_or_default(),
            refill_rate: a.refill_rate.unwrap_or_default(),
            burst_limit: a.burst_limit.unwrap_or_default(),
            as_of: a.as_of.map(prost_types::Timestamp::from),
            as_of_consumed_tokens: a.as_of_consumed.unwrap_or_default(),
            update_mask,
        }))
        .await
        .map_err(|status| set_limits_error(tenant, a, status))?;
    let answer = response.into_inner().tenant.unwrap_or_default();
    if let Some(warning) = tiering::managed_bucket_warning(client, tenant, &a.bucket).await {
        eprintln!("warning: {warning}");
    }
    print_tenant(&answer, a.json)
}

/// `set-limits --preview`: the bucket's limits with the values given
/// (the others as they are), previewed against its recorded usage; nothing
/// is changed.
async fn preview_limits(
    client: &mut AdminConnection,
    tenant: &str,
    a: &LimitValues,
    args: &PreviewArgs,
) -> anyhow::Result<()> {
    let now = client
        .get_tenant(v1::GetTenantRequest {
            tenant_id: tenant.to_owned(),
            bucket: a.bucket.clone(),
        })
        .await
        .map_err(rpc_error)?
        .into_inner()
        .tenant
        .and_then(|t| t.limits)
        .unwrap_or_default();
    let change = v1::preview_limits_request::Change::Bucket(v1::ProposedLimits {
        tenant_id: tenant.to_owned(),
        bucket: a.bucket.clone(),
        refill_rate: a.refill_rate.unwrap_or(now.refill_rate),
        burst_limit: a.burst_limit.unwrap_or(now.burst_limit),
    });
    let view = preview::preview(client, args, change).await?;
    preview::print(a.json, &[view])
}

fn set_limits_error(tenant: &str, a: &LimitValues, status: tonic::Status) -> anyhow::Error {
    let new_bucket_needs_all = status.code() == tonic::Code::InvalidArgument
        && status.message().starts_with("update_mask:")
        && status.message().contains("does not exist");
    if !new_bucket_needs_all {
        return rpc_error(status);
    }
    let given: Vec<&str> = [
        ("--available", a.available.is_some()),
        ("--refill-rate", a.refill_rate.is_some()),
        ("--burst-limit", a.burst_limit.is_some()),
    ]
    .into_iter()
    .filter_map(|(flag, is)| is.then_some(flag))
    .collect();
    let bucket = if a.bucket.is_empty() {
        "the request-unit bucket".to_owned()
    } else {
        format!("bucket {:?}", a.bucket)
    };
    rpc_error(tonic::Status::invalid_argument(format!(
        "{bucket} of tenant {:?} does not exist yet: creating it needs all of --available, \
         --refill-rate and --burst-limit (given: {})",
        tenant,
        given.join(", ")
    )))
}

/// A tenant with no bucket, worded as the server words it for one bucket.
fn tenant_not_found(tenant: &str) -> anyhow::Error {
    rpc_error(tonic::Status::not_found(format!(
        "tenant \"{tenant}\" not found"
    )))
}

/// Every closed bucket of `tenant`, in close order.
pub(crate) async fn list_closed(
    client: &mut crate::remote::AdminConnection,
    tenant: &str,
) -> anyhow::Result<Vec<v1::ClosedBucket>> {
    let mut closed = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_closed_buckets(v1::ListClosedBucketsRequest {
                tenant_id: tenant.to_owned(),
                page_size: 1000,
                page_token,
            })
            .await
            .map_err(rpc_error)?
            .into_inner();
        closed.extend(page.closed);
        if page.next_page_token.is_empty() {
            return Ok(closed);
        }
        page_token = page.next_page_token;
    }
}

/// Every bucket of every tenant, or of `tenant` if it is not empty.
async fn list<T>(client: &mut AdminClient<T>, tenant: &str) -> anyhow::Result<Vec<v1::Tenant>>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    list_or_status(client, tenant).await.map_err(rpc_error)
}

/// [`list`], failing with the server's status (for `watch` to tell an
/// unreachable server from a refusal).
async fn list_or_status<T>(
    client: &mut AdminClient<T>,
    tenant: &str,
) -> Result<Vec<v1::Tenant>, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut buckets = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_tenants(v1::ListTenantsRequest {
                page_size: 1000,
                page_token,
                tenant_id: tenant.to_owned(),
            })
            .await?
            .into_inner();
        buckets.extend(page.tenants);
        if page.next_page_token.is_empty() {
            return Ok(buckets);
        }
        page_token = page.next_page_token;
    }
}

/// A bucket of a tenant as `--json` prints it.
#[derive(Debug, Serialize)]
struct TenantJson {
    tenant_id: String,
    /// Empty for the tenant's request-unit bucket.
    bucket: String,
    /// Always `shared` (per-key buckets are `per_key::KeyBucketJson`).
    kind: &'static str,
    configured: bool,
    refill_rate: f64,
    burst_limit: f64,
    current_tokens: f64,
    share_sum: f64,
    granted_tokens: f64,
    /// Time the pods spent throttled, summed over them.
    throttled_seconds: f64,
    /// Shadow mode: decided as if enforced, granting what pods ask.
    shadow: bool,
    /// What enforcing would have held back (shadow mode): tokens not
    /// given at once, and pod time on trickles.
    shadow_throttled_tokens: f64,
    shadow_throttled_seconds: f64,
    live_instances: u32,
    consumption: v1::Consumption,
    created_at: Option<String>,
    updated_at: Option<String>,
    /// The tenant's suspension; `null` while it is served.
    state: Option<TenantStateJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    instances: Option<Vec<InstanceJson>>,
}

#[derive(Debug, Serialize)]
struct InstanceJson {
    instance_id: u32,
    next_instance_id: u32,
    seq: u64,
    shares: f64,
    last_update: Option<String>,
    silent_for_seconds: f64,
}

/// What `tenant delete --json` prints: the tenant, and the closed record
/// of each bucket deleted (its last limits and exact totals).
#[derive(Debug, Serialize)]
struct DeletedTenantJson {
    tenant_id: String,
    /// Always true: a failed delete prints nothing on stdout.
    deleted: bool,
    closed: Vec<closing::ClosedJson>,
}

fn tenant_json(t: &v1::Tenant, with_instances: bool) -> TenantJson {
    let limits = t.limits.unwrap_or_default();
    TenantJson {
        tenant_id: t.tenant_id.clone(),
        bucket: t.bucket.clone(),
        kind: "shared",
        configured: t.configured,
        refill_rate: limits.refill_rate,
        burst_limit: limits.burst_limit,
        current_tokens: t.current_tokens,
        share_sum: t.share_sum,
        granted_tokens: t.granted_tokens,
        throttled_seconds: t.throttled_micros as f64 / 1e6,
        shadow: t.shadow,
        shadow_throttled_tokens: t.shadow_throttled_tokens,
        shadow_throttled_seconds: t.shadow_throttled_micros as f64 / 1e6,
        live_instances: t.live_instances,
        consumption: t.consumption.unwrap_or_default(),
        created_at: rfc3339(t.created_at),
        updated_at: rfc3339(t.updated_at),
        state: t.state.as_ref().map(TenantStateJson::new),
        instances: with_instances.then(|| {
            t.instances
                .iter()
                .map(|i| InstanceJson {
                    instance_id: i.instance_id,
                    next_instance_id: i.next_instance_id,
                    seq: i.seq,
                    shares: i.shares,
                    last_update: rfc3339(i.last_update),
                    silent_for_seconds: seconds(i.silent_for),
                })
                .collect()
        }),
    }
}

fn print_tenant(t: &v1::Tenant, json: bool) -> anyhow::Result<()> {
    output::print(json, &tenant_json(t, true), tenant_text)
}

/// A tenant's buckets, shared and per-key, each as `tenant show
/// --bucket` shows it, under `header` (the tenant's tier and overrides)
/// in text.
fn print_buckets(
    buckets: &[v1::Tenant],
    key_buckets: &[v1::KeyBucket],
    header: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let views = per_key::merged(
        buckets.iter().map(|t| tenant_json(t, true)).collect(),
        key_buckets.iter().map(per_key::key_bucket_json).collect(),
    );
    output::print(json, &views, |views| {
        header
            .into_iter()
            .chain(views.iter().map(|v| match v {
                per_key::AnyBucketJson::Shared(t) => tenant_text(t),
                per_key::AnyBucketJson::PerKey(k) => per_key::key_bucket_text(k),
            }))
            .collect::<Vec<_>>()
            .join("\n\n")
    })
}

/// How a bucket name reads in text: the request-unit bucket has none.
fn bucket_label(bucket: &str) -> &str {
    if bucket.is_empty() {
        "(request units)"
    } else {
        bucket
    }
}

/// A tenant as a key-value table, then its instances, if any, as a table.
fn tenant_text(view: &TenantJson) -> String {
    let c = &view.consumption;
    let mut text = Table::new([
        field("tenant", view.tenant_id.clone()),
        field("bucket", bucket_label(&view.bucket).to_owned()),
        field(
            "configured",
            if view.configured {
                "yes"
            } else {
                "no (server defaults)"
            }
            .to_owned(),
        ),
        field("refill rate", format!("{} tokens/s", view.refill_rate)),
        field("burst limit", format!("{} tokens", view.burst_limit)),
        field("current tokens", format!("{:.1}", view.current_tokens)),
        field("granted tokens", format!("{:.1}", view.granted_tokens)),
        field(
            "throttled",
            format!("{:.1} pod-seconds", view.throttled_seconds),
        ),
        field("share sum", format!("{:.3}", view.share_sum)),
        field("request units", format!("{:.1}", c.request_units)),
        field(
            "reads",
            format!(
                "{} batches, {} requests, {} bytes",
                c.read_batches, c.read_requests, c.read_bytes
            ),
        ),
        field(
            "writes",
            format!(
                "{} batches, {} requests, {} bytes",
                c.write_batches, c.write_requests, c.write_bytes
            ),
        ),
        field("cpu", format!("{:.3} s", c.cpu_seconds)),
        field("egress", format!("{} bytes", c.egress_bytes)),
        field("live instances", view.live_instances.to_string()),
    ])
    .to_string();
    if view.shadow || view.shadow_throttled_tokens > 0.0 || view.shadow_throttled_seconds > 0.0 {
        let mode = if view.shadow {
            "shadow (grants what pods ask; decided as if enforced)"
        } else {
            "enforced (was in shadow mode)"
        };
        text = format!(
            "{text}\n{}",
            Table::new([
                field("mode", mode.to_owned()),
                field(
                    "would have throttled",
                    format!(
                        "{:.1} tokens, {:.1} pod-seconds",
                        view.shadow_throttled_tokens, view.shadow_throttled_seconds
                    ),
                ),
            ])
        );
    }
    if let Some(state) = &view.state {
        text = format!("{}\n{text}", Table::new([field("state", state.text())]));
    }
    if let Some(instances) = view.instances.as_ref().filter(|i| !i.is_empty()) {
        let mut table = Table::with_header(&["INSTANCE", "NEXT", "SEQ", "SHARES", "SILENT FOR"]);
        for i in instances {
            table.push(vec![
                i.instance_id.to_string(),
                i.next_instance_id.to_string(),
                i.seq.to_string(),
                format!("{:.3}", i.shares),
                format!("{:.1}s", i.silent_for_seconds),
            ]);
        }
        text = format!("{text}\n\n{table}");
    }
    text
}

/// Every bucket: in JSON one list, shared and per-key; in text a table of
/// the shared buckets, then one of the per-key buckets if there are any.
fn print_list(
    tenants: &[v1::Tenant],
    key_buckets: &[v1::KeyBucket],
    json: bool,
) -> anyhow::Result<()> {
    let shared: Vec<TenantJson> = tenants.iter().map(|t| tenant_json(t, false)).collect();
    let per_key: Vec<per_key::KeyBucketJson> =
        key_buckets.iter().map(per_key::key_bucket_json).collect();
    if json {
        return output::print(true, &per_key::merged(shared, per_key), |_| "");
    }
    let per_key_text = (!per_key.is_empty()).then(|| {
        format!(
            "\n\n{}\n\n{}",
            per_key::table(&per_key, true),
            per_key::rates_note(&per_key)
        )
    });
    if shared.is_empty()
        && let Some(text) = per_key_text
    {
        // Only per-key buckets: no empty table of shared ones above.
        return output::print(false, &shared, |_| text.trim_start().to_owned());
    }
    output::print(false, &shared, |views| {
        let mut table = Table::with_header(&[
            "TENANT",
            "BUCKET",
            "CONFIGURED",
            "REFILL/S",
            "BURST",
            "TOKENS",
            "INSTANCES",
            "REQUEST UNITS",
            "STATE",
        ]);
        for v in views {
            table.push(vec![
                v.tenant_id.clone(),
                bucket_label(&v.bucket).to_owned(),
                if v.configured { "yes" } else { "no" }.to_owned(),
                v.refill_rate.to_string(),
                v.burst_limit.to_string(),
                format!("{:.1}", v.current_tokens),
                v.live_instances.to_string(),
                format!("{:.1}", v.consumption.request_units),
                v.state
                    .as_ref()
                    .map_or_else(|| "served".to_owned(), |s| s.kind.clone()),
            ]);
        }
        format!("{table}{}", per_key_text.unwrap_or_default())
    })
}
