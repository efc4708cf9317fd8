//! `tollgate org …`: organisations on a running server, through its
//! `Admin` service (docs/organisations.md). An organisation's buckets are
//! set like a tenant's (`org set-limits` is `tenant set-limits` with the
//! organisation's id); `show` prints its buckets and, per member bucket,
//! what it wanted, drew, is guaranteed and borrows at its last draw.

use std::collections::BTreeMap;

use clap::{Args, Subcommand};
use serde::Serialize;
use tollgate_proto::v1;

use crate::output::{self, Table, amount, rfc3339};
use crate::remote::{ActorArg, AdminConnection, AdminServerArg, rpc_error};
use crate::tenant::{LimitValues, set_limits};

#[derive(Debug, Args)]
pub struct OrgArgs {
    #[command(flatten)]
    server: AdminServerArg,

    #[command(subcommand)]
    command: OrgCommand,
}

#[derive(Debug, Subcommand)]
enum OrgCommand {
    /// Make an id an organisation (no tenant may have buckets under it)
    ///
    /// It has no buckets until `set-limits` gives it some: for each
    /// bucket name it has, its members' buckets of that name draw their
    /// refill from it.
    Create {
        #[arg(long)]
        org: String,
        /// What operators call it.
        #[arg(long, default_value = "")]
        name: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
    /// Show an organisation: its buckets, and its members with what each
    /// bucket wanted, drew, is guaranteed and borrows.
    Show {
        #[arg(long)]
        org: String,
        #[arg(long)]
        json: bool,
    },
    /// List the organisations and their members.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Set the limits of one of an organisation's buckets (creating it):
    /// what its members' buckets of that name admit together.
    SetLimits(OrgLimitsArgs),
    /// Put a tenant (or an organisation) into an organisation, or set the
    /// guarantees of one already in it.
    AddTenant {
        #[arg(long)]
        org: String,
        /// The tenant's (or organisation's) id.
        #[arg(long)]
        tenant: String,
        /// A rate reserved for one of its buckets while it wants it:
        /// `BUCKET=RATE` (`=RATE` for the request-unit bucket); repeat
        /// for more buckets.
        #[arg(long = "guaranteed", value_parser = parse_guarantee)]
        guaranteed: Vec<(String, f64)>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
    /// Take a tenant out of its organisation: its buckets run on their own
    /// limits from their next request.
    RemoveTenant {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
    /// End an organisation that has no members (its buckets stay until
    /// `tenant delete`).
    Delete {
        #[arg(long)]
        org: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
}

#[derive(Debug, Args)]
struct OrgLimitsArgs {
    #[arg(long)]
    org: String,
    #[command(flatten)]
    values: LimitValues,
}

/// `BUCKET=RATE`.
fn parse_guarantee(text: &str) -> Result<(String, f64), String> {
    let (bucket, rate) = text.split_once('=').ok_or_else(|| {
        format!("{text:?} is not BUCKET=RATE (=RATE for the request-unit bucket)")
    })?;
    let rate: f64 = rate
        .parse()
        .map_err(|e| format!("{rate:?} in {text:?} is not a rate: {e}"))?;
    Ok((bucket.to_owned(), rate))
}

pub async fn run(args: OrgArgs) -> anyhow::Result<()> {
    let mut client = args.server.admin().await?;
    match args.command {
        OrgCommand::Create {
            org,
            name,
            json,
            actor,
        } => {
            let answer = client
                .create_organization(actor.request(v1::CreateOrganizationRequest {
                    organization_id: org,
                    display_name: name,
                }))
                .await
                .map_err(rpc_error)?
                .into_inner();
            print_org(answer.organization.unwrap_or_default(), json)
        }
        OrgCommand::Show { org, json } => {
            let org = get(&mut client, &org).await?;
            print_org(org, json)
        }
        OrgCommand::List { json } => {
            let answer = client
                .list_organizations(v1::ListOrganizationsRequest {})
                .await
                .map_err(rpc_error)?
                .into_inner();
            let views: Vec<OrgView> = answer.organizations.into_iter().map(OrgView::new).collect();
            output::print(json, &views, |views| {
                let mut table = Table::with_header(&["ORG", "NAME", "PARENT", "MEMBERS"]);
                for v in views {
                    table.push(vec![
                        v.organization_id.clone(),
                        v.display_name.clone(),
                        v.parent_organization_id.clone(),
                        v.members
                            .iter()
                            .map(|m| m.member_id.as_str())
                            .collect::<Vec<_>>()
                            .join(","),
                    ]);
                }
                table
            })
        }
        OrgCommand::SetLimits(a) => set_limits(&mut client, &a.org, &a.values).await,
        OrgCommand::AddTenant {
            org,
            tenant,
            guaranteed,
            json,
            actor,
        } => {
            let answer = client
                .add_organization_member(actor.request(v1::AddOrganizationMemberRequest {
                    organization_id: org,
                    member_id: tenant,
                    guaranteed_rates: guaranteed.into_iter().collect(),
                }))
                .await
                .map_err(rpc_error)?
                .into_inner();
            print_org(answer.organization.unwrap_or_default(), json)
        }
        OrgCommand::RemoveTenant {
            tenant,
            json,
            actor,
        } => {
            let answer = client
                .remove_organization_member(actor.request(v1::RemoveOrganizationMemberRequest {
                    member_id: tenant.clone(),
                }))
                .await
                .map_err(rpc_error)?
                .into_inner();
            #[derive(Serialize)]
            struct Left {
                tenant_id: String,
                organization_id: String,
            }
            let left = Left {
                tenant_id: tenant,
                organization_id: answer.organization_id,
            };
            output::print(json, &left, |l| {
                format!(
                    "took {} out of organisation {}: its buckets run on their own limits",
                    l.tenant_id, l.organization_id
                )
            })
        }
        OrgCommand::Delete { org, json, actor } => {
            client
                .delete_organization(actor.request(v1::DeleteOrganizationRequest {
                    organization_id: org.clone(),
                }))
                .await
                .map_err(rpc_error)?;
            #[derive(Serialize)]
            struct Deleted {
                organization_id: String,
            }
            output::print(
                json,
                &Deleted {
                    organization_id: org,
                },
                |d| format!("deleted organisation {}", d.organization_id),
            )
        }
    }
}

async fn get(client: &mut AdminConnection, org: &str) -> anyhow::Result<v1::Organization> {
    Ok(client
        .get_organization(v1::GetOrganizationRequest {
            organization_id: org.to_owned(),
        })
        .await
        .map_err(rpc_error)?
        .into_inner()
        .organization
        .unwrap_or_default())
}

/// An organisation as `--json` prints it.
#[derive(Debug, Serialize)]
struct OrgView {
    organization_id: String,
    display_name: String,
    created_at: Option<String>,
    parent_organization_id: String,
    buckets: Vec<OrgBucketView>,
    members: Vec<MemberView>,
}

#[derive(Debug, Serialize)]
struct OrgBucketView {
    bucket: String,
    refill_rate: f64,
    burst_limit: f64,
    current_tokens: f64,
    consumed_request_units: f64,
    granted_tokens: f64,
}

#[derive(Debug, Serialize)]
struct MemberView {
    member_id: String,
    is_organization: bool,
    guaranteed_rates: BTreeMap<String, f64>,
    since: Option<String>,
    buckets: Vec<MemberBucketView>,
}

#[derive(Debug, Serialize)]
struct MemberBucketView {
    bucket: String,
    refill_rate: f64,
    drawing: bool,
    wanted_rate: f64,
    drawn_rate: f64,
    drawn_tokens: f64,
    guaranteed_rate: f64,
    borrowed_rate: f64,
    next_draw: Option<String>,
    draws: u64,
    consumed_request_units: f64,
    granted_tokens: f64,
}

fn request_units(c: Option<&v1::Consumption>) -> f64 {
    c.map_or(0.0, |c| c.request_unit_micros as f64 / 1e6)
}

impl OrgView {
    fn new(org: v1::Organization) -> OrgView {
        OrgView {
            organization_id: org.organization_id,
            display_name: org.display_name,
            created_at: rfc3339(org.created_at),
            parent_organization_id: org.parent_organization_id,
            buckets: org
                .buckets
                .iter()
                .map(|b| OrgBucketView {
                    bucket: b.bucket.clone(),
                    refill_rate: b.limits.as_ref().map_or(0.0, |l| l.refill_rate),
                    burst_limit: b.limits.as_ref().map_or(0.0, |l| l.burst_limit),
                    current_tokens: b.current_tokens,
                    consumed_request_units: request_units(b.consumption.as_ref()),
                    granted_tokens: b.granted_tokens,
                })
                .collect(),
            members: org
                .members
                .into_iter()
                .map(|m| MemberView {
                    member_id: m.member_id,
                    is_organization: m.is_organization,
                    guaranteed_rates: m.guaranteed_rates.into_iter().collect(),
                    since: rfc3339(m.since),
                    buckets: m
                        .buckets
                        .iter()
                        .map(|b| MemberBucketView {
                            bucket: b.bucket.clone(),
                            refill_rate: b.limits.as_ref().map_or(0.0, |l| l.refill_rate),
                            drawing: b.drawing,
                            wanted_rate: b.wanted_rate,
                            drawn_rate: b.drawn_rate,
                            drawn_tokens: b.drawn_tokens,
                            guaranteed_rate: b.guaranteed_rate,
                            borrowed_rate: b.borrowed_rate,
                            next_draw: rfc3339(b.next_draw),
                            draws: b.draws,
                            consumed_request_units: request_units(b.consumption.as_ref()),
                            granted_tokens: b.granted_tokens,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

fn bucket_label(name: &str) -> String {
    if name.is_empty() {
        "(request units)".to_owned()
    } else {
        name.to_owned()
    }
}

fn print_org(org: v1::Organization, json: bool) -> anyhow::Result<()> {
    output::print(json, &OrgView::new(org), |v| {
        let mut text = format!("organisation {}", v.organization_id);
        if !v.display_name.is_empty() {
            text.push_str(&format!(" ({})", v.display_name));
        }
        if !v.parent_organization_id.is_empty() {
            text.push_str(&format!(", in {}", v.parent_organization_id));
        }
        text.push('\n');
        if v.buckets.is_empty() {
            text.push_str("no buckets: it limits nothing yet (org set-limits)\n");
        } else {
            let mut table =
                Table::with_header(&["BUCKET", "RATE/S", "BURST", "TOKENS", "CONSUMED RU"]);
            for b in &v.buckets {
                table.push(vec![
                    bucket_label(&b.bucket),
                    amount(b.refill_rate),
                    amount(b.burst_limit),
                    amount(b.current_tokens),
                    amount(b.consumed_request_units),
                ]);
            }
            text.push_str(&format!("{table}\n"));
        }
        if v.members.is_empty() {
            text.push_str("no members");
            return text;
        }
        let mut table = Table::with_header(&[
            "MEMBER",
            "BUCKET",
            "OWN RATE/S",
            "WANTS/S",
            "DRAWS/S",
            "GUARANTEED/S",
            "BORROWS/S",
            "DRAWS",
            "CONSUMED RU",
        ]);
        for m in &v.members {
            let id = if m.is_organization {
                format!("{} (org)", m.member_id)
            } else {
                m.member_id.clone()
            };
            if m.buckets.is_empty() {
                table.push(vec![id.clone(), "-".into()]);
            }
            for b in &m.buckets {
                let (wants, draws) = match (b.drawing, b.draws) {
                    (true, _) => (amount(b.wanted_rate), amount(b.drawn_rate)),
                    (false, 0) => ("-".to_owned(), "not yet".to_owned()),
                    // The organisation has no bucket of this name.
                    (false, _) => ("-".to_owned(), "own limits".to_owned()),
                };
                table.push(vec![
                    id.clone(),
                    bucket_label(&b.bucket),
                    amount(b.refill_rate),
                    wants,
                    draws,
                    amount(b.guaranteed_rate),
                    amount(b.borrowed_rate),
                    b.draws.to_string(),
                    amount(b.consumed_request_units),
                ]);
            }
        }
        text.push_str(&table.to_string());
        text
    })
}
