//! The operator-facing `Admin` service.
//!
//! Per-key buckets have no bucket row, so `ListTenants` leaves them out;
//! `ListKeyBuckets` and `DescribeTenant` read them from the store (their
//! definitions and stored keys) and add this replica's check rates.
//!
//! `ListTenants` pages through buckets in key order, all of them or one
//! tenant's: 100 a page unless asked, at most 1 000; the page token is the
//! last key listed, `tenant` or `tenant/bucket`. `ListKeyBuckets` pages
//! per-key buckets with the same tokens. Each tier or override RPC
//! (`CreateTenant`, `SetTenantTier`, `SetBucketOverride`,
//! `ClearBucketOverride`, `SetTableLimits`, `ClearTableLimits`) is one
//! `TenantChange` through `Store::change_tenant`.

mod organisations;
mod scope;

use std::sync::Arc;
use std::time::SystemTime;

use tollgate_core::tenant_state::StateChange;
use tollgate_core::tier::TenantChange;
use tollgate_core::{BucketName, InvalidInput, TableName, TenantId, TierName};
use tollgate_proto::v1::{self, admin_server};
use tonic::{Request, Response, Status};

use tollgate_core::global_bucket::Limits;
use tollgate_core::time::Timestamp;

use super::audit::{self, Caller};
use super::{convert, edge, invalid, status};
use crate::preview;
use crate::store::{
    AdminCall, BucketSnapshot, KeyBucketSnapshot, Store, StoreError, TenantChangeOutcome,
};
use crate::telemetry::Metrics;
use crate::telemetry::check_rates::CheckRates;
use scope::Access;

/// Buckets (or closed records) listed per page when the request does
/// not say.
const DEFAULT_PAGE_SIZE: u32 = 100;
/// The most listed per page.
const MAX_PAGE_SIZE: u32 = 1000;

/// Busiest keys listed per per-key bucket when the request does not say,
/// and in `DescribeTenant`.
const DEFAULT_BUSIEST_KEYS: u32 = 5;
/// The most busiest keys listed per per-key bucket.
const MAX_BUSIEST_KEYS: u32 = 100;

/// Lets operators set limits and read tenants' state and consumption.
#[derive(Debug, Clone)]
pub struct AdminService {
    store: Arc<dyn Store>,
    /// Where this replica's check rates of per-key buckets come from;
    /// without metrics, the rates read zero.
    metrics: Option<Arc<Metrics>>,
}

impl AdminService {
    pub fn new(store: Arc<dyn Store>) -> Self {
        AdminService {
            store,
            metrics: None,
        }
    }

    /// Shows the check rates `metrics` counts.
    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        AdminService {
            metrics: Some(metrics),
            ..self
        }
    }

    /// Per-key buckets on the wire, with this replica's check rates.
    fn key_buckets_to_proto(&self, buckets: &[KeyBucketSnapshot]) -> Vec<v1::KeyBucket> {
        let none = CheckRates::new();
        buckets
            .iter()
            .map(|b| {
                let rates = match &self.metrics {
                    Some(metrics) => metrics.check_rates(&b.key),
                    None => none.rates(&b.key),
                };
                convert::key_bucket_to_proto(b, &rates)
            })
            .collect()
    }

    /// Sets the state (suspension) of each bucket's tenant in `tenants`.
    async fn add_states(
        &self,
        tenants: &mut [v1::Tenant],
        operation: &'static str,
    ) -> Result<(), Status> {
        let mut ids: Vec<TenantId> = tenants
            .iter()
            .filter_map(|t| convert::tenant_id(&t.tenant_id).ok())
            .collect();
        ids.dedup();
        if ids.is_empty() {
            return Ok(());
        }
        let states = self
            .store
            .tenant_states(&ids)
            .await
            .map_err(|e| status(operation, e))?;
        for tenant in tenants {
            tenant.state = convert::tenant_id(&tenant.tenant_id)
                .ok()
                .and_then(|id| states.get(&id))
                .map(convert::tenant_state_to_proto);
        }
        Ok(())
    }

    /// Applies a tenant change and logs it; a dry run changes nothing
    /// and is not logged.
    /// Bucket `key` as the store holds it; `operation` names the call in
    /// a refusal.
    async fn bucket(
        &self,
        key: &tollgate_core::BucketKey,
        operation: &'static str,
    ) -> Result<BucketSnapshot, Status> {
        self.store
            .get_bucket(key)
            .await
            .map_err(|e| status(operation, e))
    }

    async fn change(
        &self,
        caller: &Caller,
        operation: &'static str,
        tenant: &TenantId,
        change: TenantChange,
        dry_run: bool,
    ) -> Result<TenantChangeOutcome, Status> {
        self.permit(caller.scope(), tenant, Access::Change).await?;
        let call = AdminCall {
            by: caller.closed_by(),
            dry_run,
        };
        let outcome = self
            .store
            .change_tenant_by(tenant, &change, &call)
            .await
            .map_err(|e| status(operation, e))?;
        if !dry_run {
            audit::tenant_changed(caller, operation, &outcome);
        }
        Ok(outcome)
    }
}

/// Closed cycles `GetUsage` returns unless asked, and at most.
const DEFAULT_USAGE_CYCLES: usize = 12;
const MAX_USAGE_CYCLES: usize = 1_000;

/// A bucket's budget as it stands at the snapshot's clock, if it has one.
fn budget_status(snapshot: &BucketSnapshot) -> Option<v1::BudgetStatus> {
    let budget = snapshot.head.budget.as_ref()?;
    let view = budget.view(&snapshot.head.state, snapshot.read_at);
    Some(convert::status_to_proto(
        snapshot.key.tenant.as_str(),
        &snapshot.key.bucket,
        &view,
        snapshot.read_at,
    ))
}

#[tonic::async_trait]
impl admin_server::Admin for AdminService {
    async fn update_tenant_resource_limits(
        &self,
        request: Request<v1::UpdateTenantResourceLimitsRequest>,
    ) -> Result<Response<v1::UpdateTenantResourceLimitsResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let (key, update) = convert::limits_update(request.into_inner()).map_err(invalid)?;
        self.permit(caller.scope(), &key.tenant, Access::Change)
            .await?;
        let change = self
            .store
            .update_limits(&key, &update)
            .await
            .map_err(|e| status("update tenant limits", e))?;
        audit::limits_updated(&caller, &key, &update, &change);
        Ok(Response::new(v1::UpdateTenantResourceLimitsResponse {
            tenant: Some(convert::bucket_to_proto(&change.after)),
        }))
    }

    async fn get_tenant(
        &self,
        request: Request<v1::GetTenantRequest>,
    ) -> Result<Response<v1::GetTenantResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let key = convert::bucket_key(&req.tenant_id, &req.bucket).map_err(invalid)?;
        self.permit(caller.scope(), &key.tenant, Access::Read)
            .await?;
        let snapshot = self.bucket(&key, "get tenant").await?;
        let mut tenants = vec![convert::bucket_to_proto(&snapshot)];
        self.add_states(&mut tenants, "get tenant").await?;
        Ok(Response::new(v1::GetTenantResponse {
            tenant: tenants.pop(),
        }))
    }

    async fn list_tenants(
        &self,
        request: Request<v1::ListTenantsRequest>,
    ) -> Result<Response<v1::ListTenantsResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let page_size = page_size(req.page_size)?;
        let after = page_token::after(&req.page_token)?;
        // One more than asked tells whether another page follows.
        let mut buckets = if req.tenant_id.is_empty() {
            AdminService::refuse_listing_all(caller.scope(), "tenant_id")?;
            self.store
                .list_buckets(after.as_ref(), page_size + 1)
                .await
                .map_err(|e| status("list tenants", e))?
        } else {
            let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
            self.permit(caller.scope(), &tenant, Access::Read).await?;
            match self.store.get_tenant(&tenant).await {
                Ok(mut buckets) => {
                    // In the order page tokens compare in.
                    buckets.sort_by(|a, b| a.key.cmp(&b.key));
                    buckets
                        .into_iter()
                        .filter(|b| after.as_ref().is_none_or(|a| b.key > *a))
                        .take(page_size + 1)
                        .map(|b| BucketSnapshot {
                            instances: Vec::new(),
                            ..b
                        })
                        .collect()
                }
                Err(StoreError::TenantNotFound(_)) => Vec::new(),
                Err(e) => return Err(status("list tenants", e)),
            }
        };
        let next_page_token = page_token::next(&mut buckets, page_size, |b| &b.key);
        let mut tenants: Vec<v1::Tenant> = buckets.iter().map(convert::bucket_to_proto).collect();
        self.add_states(&mut tenants, "list tenants").await?;
        Ok(Response::new(v1::ListTenantsResponse {
            tenants,
            next_page_token,
        }))
    }

    async fn list_key_buckets(
        &self,
        request: Request<v1::ListKeyBucketsRequest>,
    ) -> Result<Response<v1::ListKeyBucketsResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let page_size = page_size(req.page_size)?;
        let busiest = bounded(
            "busiest_keys",
            req.busiest_keys,
            DEFAULT_BUSIEST_KEYS,
            MAX_BUSIEST_KEYS,
        )?;
        let after = page_token::after(&req.page_token)?;
        let tenant = match req.tenant_id.as_str() {
            "" => {
                AdminService::refuse_listing_all(caller.scope(), "tenant_id")?;
                None
            }
            id => {
                let tenant = convert::tenant_id(id).map_err(invalid)?;
                self.permit(caller.scope(), &tenant, Access::Read).await?;
                Some(tenant)
            }
        };
        // One more than asked tells whether another page follows.
        let mut buckets = self
            .store
            .list_key_buckets(tenant.as_ref(), after.as_ref(), page_size + 1, busiest)
            .await
            .map_err(|e| status("list per-key buckets", e))?;
        let next_page_token = page_token::next(&mut buckets, page_size, |b| &b.key);
        Ok(Response::new(v1::ListKeyBucketsResponse {
            key_buckets: self.key_buckets_to_proto(&buckets),
            next_page_token,
        }))
    }

    async fn delete_tenant(
        &self,
        request: Request<v1::DeleteTenantRequest>,
    ) -> Result<Response<v1::DeleteTenantResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
        let call = AdminCall {
            by: caller.closed_by(),
            dry_run: req.dry_run,
        };
        let deleted = self
            .store
            .delete_tenant_by(&tenant, &call)
            .await
            .map_err(|e| status("delete tenant", e))?;
        if !req.dry_run {
            audit::tenant_deleted(&caller, &tenant, &deleted.buckets);
        }
        Ok(Response::new(v1::DeleteTenantResponse {
            closed: deleted
                .closed
                .iter()
                .map(convert::closed_to_proto)
                .collect(),
        }))
    }

    async fn list_closed_buckets(
        &self,
        request: Request<v1::ListClosedBucketsRequest>,
    ) -> Result<Response<v1::ListClosedBucketsResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
        self.permit(caller.scope(), &tenant, Access::Read).await?;
        let page_size = page_size(req.page_size)?;
        let after = match req.page_token.as_str() {
            "" => 0,
            token => token.parse::<u64>().map_err(|_| {
                invalid(InvalidInput::new(
                    "page_token",
                    "must be a token from a previous response",
                ))
            })?,
        };
        // One more than asked tells whether another page follows.
        let mut closed = self
            .store
            .list_closed(&tenant, after, page_size + 1)
            .await
            .map_err(|e| status("list closed buckets", e))?;
        let next_page_token = if closed.len() > page_size {
            closed.truncate(page_size);
            closed.last().map(|c| c.seq.to_string()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(v1::ListClosedBucketsResponse {
            closed: closed
                .iter()
                .map(|c| convert::closed_to_proto(&c.closed))
                .collect(),
            next_page_token,
        }))
    }

    async fn suspend_tenant(
        &self,
        request: Request<v1::SuspendTenantRequest>,
    ) -> Result<Response<v1::SuspendTenantResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
        self.permit(caller.scope(), &tenant, Access::Change).await?;
        let change = StateChange::Suspend {
            actor: caller.to_string(),
            reason: req.reason,
        };
        change.validate().map_err(invalid)?;
        let edit = self
            .store
            .change_tenant_state(&tenant, &change)
            .await
            .map_err(|e| status("suspend tenant", e))?;
        audit::tenant_state_changed(&caller, "suspend_tenant", &tenant, &edit);
        Ok(Response::new(v1::SuspendTenantResponse {
            state: edit.state.as_ref().map(convert::tenant_state_to_proto),
            changed: edit.changed,
        }))
    }

    async fn resume_tenant(
        &self,
        request: Request<v1::ResumeTenantRequest>,
    ) -> Result<Response<v1::ResumeTenantResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let tenant = convert::tenant_id(&request.into_inner().tenant_id).map_err(invalid)?;
        self.permit(caller.scope(), &tenant, Access::Change).await?;
        let edit = self
            .store
            .change_tenant_state(&tenant, &StateChange::Resume)
            .await
            .map_err(|e| status("resume tenant", e))?;
        audit::tenant_state_changed(&caller, "resume_tenant", &tenant, &edit);
        Ok(Response::new(v1::ResumeTenantResponse {
            changed: edit.changed,
        }))
    }

    async fn put_tier(
        &self,
        request: Request<v1::PutTierRequest>,
    ) -> Result<Response<v1::PutTierResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let (name, tier) = convert::tier_from_proto(req.tier).map_err(invalid)?;
        let call = AdminCall {
            by: caller.closed_by(),
            dry_run: req.dry_run,
        };
        let outcome = self
            .store
            .put_tier_by(&name, &tier, &call)
            .await
            .map_err(|e| status("put tier", e))?;
        if !req.dry_run {
            audit::tier_put(&caller, &name, &outcome);
        }
        Ok(Response::new(v1::PutTierResponse {
            tier: Some(convert::tier_to_proto(&name, &outcome.tier)),
            created: outcome.created,
            tenants_updated: u32::try_from(outcome.tenants.len()).unwrap_or(u32::MAX),
            closed: outcome
                .tenants
                .iter()
                .flat_map(|t| t.closed.iter().map(convert::closed_to_proto))
                .collect(),
        }))
    }

    async fn get_tier(
        &self,
        request: Request<v1::GetTierRequest>,
    ) -> Result<Response<v1::GetTierResponse>, Status> {
        edge::enter(&request)?;
        let name = TierName::parse("name", &request.into_inner().name).map_err(invalid)?;
        let tier = self
            .store
            .get_tier(&name)
            .await
            .map_err(|e| status("get tier", e))?;
        Ok(Response::new(v1::GetTierResponse {
            tier: Some(convert::tier_to_proto(&name, &tier)),
        }))
    }

    async fn list_tiers(
        &self,
        request: Request<v1::ListTiersRequest>,
    ) -> Result<Response<v1::ListTiersResponse>, Status> {
        edge::enter(&request)?;
        let tiers = self
            .store
            .list_tiers()
            .await
            .map_err(|e| status("list tiers", e))?;
        Ok(Response::new(v1::ListTiersResponse {
            tiers: tiers
                .iter()
                .map(|(name, tier)| convert::tier_to_proto(name, tier))
                .collect(),
        }))
    }

    async fn delete_tier(
        &self,
        request: Request<v1::DeleteTierRequest>,
    ) -> Result<Response<v1::DeleteTierResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let name = TierName::parse("name", &request.into_inner().name).map_err(invalid)?;
        self.store
            .delete_tier(&name)
            .await
            .map_err(|e| status("delete tier", e))?;
        audit::tier_deleted(&caller, &name);
        Ok(Response::new(v1::DeleteTierResponse {}))
    }

    async fn create_tenant(
        &self,
        request: Request<v1::CreateTenantRequest>,
    ) -> Result<Response<v1::CreateTenantResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
        let tier = TierName::parse("tier", &req.tier).map_err(invalid)?;
        let outcome = self
            .change(
                &caller,
                "create_tenant",
                &tenant,
                TenantChange::Create { tier },
                false,
            )
            .await?;
        Ok(Response::new(v1::CreateTenantResponse {
            tenant: Some(convert::tenant_view_to_proto(&outcome.view)),
        }))
    }

    async fn set_tenant_tier(
        &self,
        request: Request<v1::SetTenantTierRequest>,
    ) -> Result<Response<v1::SetTenantTierResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
        let tier = TierName::parse("tier", &req.tier).map_err(invalid)?;
        let outcome = self
            .change(
                &caller,
                "set_tenant_tier",
                &tenant,
                TenantChange::SetTier { tier },
                req.dry_run,
            )
            .await?;
        let names = |names: &[BucketName]| names.iter().map(ToString::to_string).collect();
        Ok(Response::new(v1::SetTenantTierResponse {
            tenant: Some(convert::tenant_view_to_proto(&outcome.view)),
            created: names(&outcome.created),
            changed: names(&outcome.changed),
            retired: outcome
                .retired
                .iter()
                .map(|b| b.key.bucket.to_string())
                .collect(),
            closed: outcome
                .closed
                .iter()
                .map(convert::closed_to_proto)
                .collect(),
        }))
    }

    async fn set_bucket_override(
        &self,
        request: Request<v1::SetBucketOverrideRequest>,
    ) -> Result<Response<v1::SetBucketOverrideResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
        let definition = req
            .bucket
            .ok_or_else(|| invalid(InvalidInput::new("bucket", "must be set")))?;
        let change = TenantChange::SetOverride {
            bucket: BucketName::parse("bucket.bucket", &definition.bucket).map_err(invalid)?,
            definition: convert::definition_from_proto("bucket", &definition).map_err(invalid)?,
        };
        change.validate().map_err(invalid)?;
        let outcome = self
            .change(&caller, "set_bucket_override", &tenant, change, false)
            .await?;
        Ok(Response::new(v1::SetBucketOverrideResponse {
            tenant: Some(convert::tenant_view_to_proto(&outcome.view)),
        }))
    }

    async fn clear_bucket_override(
        &self,
        request: Request<v1::ClearBucketOverrideRequest>,
    ) -> Result<Response<v1::ClearBucketOverrideResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
        let change = TenantChange::ClearOverride {
            bucket: BucketName::parse("bucket", &req.bucket).map_err(invalid)?,
        };
        change.validate().map_err(invalid)?;
        let outcome = self
            .change(
                &caller,
                "clear_bucket_override",
                &tenant,
                change,
                req.dry_run,
            )
            .await?;
        Ok(Response::new(v1::ClearBucketOverrideResponse {
            tenant: Some(convert::tenant_view_to_proto(&outcome.view)),
            closed: outcome
                .closed
                .iter()
                .map(convert::closed_to_proto)
                .collect(),
        }))
    }

    async fn set_table_limits(
        &self,
        request: Request<v1::SetTableLimitsRequest>,
    ) -> Result<Response<v1::SetTableLimitsResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
        let wire = req
            .limits
            .ok_or_else(|| invalid(InvalidInput::new("limits", "must be set")))?;
        let table = TableName::parse("limits.table", &wire.table).map_err(invalid)?;
        let limits = convert::table_limits_from_proto(&wire);
        limits.validate("limits").map_err(invalid)?;
        let change = TenantChange::SetTableLimits { table, limits };
        let outcome = self
            .change(&caller, "set_table_limits", &tenant, change, false)
            .await?;
        Ok(Response::new(v1::SetTableLimitsResponse {
            tenant: Some(convert::tenant_view_to_proto(&outcome.view)),
        }))
    }

    async fn clear_table_limits(
        &self,
        request: Request<v1::ClearTableLimitsRequest>,
    ) -> Result<Response<v1::ClearTableLimitsResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
        let change = TenantChange::ClearTableLimits {
            table: TableName::parse("table", &req.table).map_err(invalid)?,
        };
        let outcome = self
            .change(&caller, "clear_table_limits", &tenant, change, false)
            .await?;
        Ok(Response::new(v1::ClearTableLimitsResponse {
            tenant: Some(convert::tenant_view_to_proto(&outcome.view)),
        }))
    }

    async fn set_budget(
        &self,
        request: Request<v1::SetBudgetRequest>,
    ) -> Result<Response<v1::SetBudgetResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
        let (bucket, budget) = convert::budget_from_proto(req.budget.as_ref()).map_err(invalid)?;
        let change = TenantChange::SetBudget {
            bucket: bucket.clone(),
            budget,
        };
        let outcome = self
            .change(&caller, "set_budget", &tenant, change, false)
            .await?;
        let status = outcome
            .view
            .buckets
            .iter()
            .find(|b| b.key.bucket == bucket)
            .and_then(budget_status);
        Ok(Response::new(v1::SetBudgetResponse { status }))
    }

    async fn clear_budget(
        &self,
        request: Request<v1::ClearBudgetRequest>,
    ) -> Result<Response<v1::ClearBudgetResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let key = convert::bucket_key(&req.tenant_id, &req.bucket).map_err(invalid)?;
        let change = TenantChange::ClearBudget {
            bucket: key.bucket.clone(),
        };
        self.change(&caller, "clear_budget", &key.tenant, change, false)
            .await?;
        let closed = self
            .store
            .budget_cycles(&key, 1)
            .await
            .map_err(|e| status("clear budget", e))?
            .first()
            .map(convert::cycle_record_to_proto);
        Ok(Response::new(v1::ClearBudgetResponse { closed }))
    }

    async fn get_budget(
        &self,
        request: Request<v1::GetBudgetRequest>,
    ) -> Result<Response<v1::GetBudgetResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let key = convert::bucket_key(&req.tenant_id, &req.bucket).map_err(invalid)?;
        self.permit(caller.scope(), &key.tenant, Access::Read)
            .await?;
        let snapshot = self.bucket(&key, "get budget").await?;
        Ok(Response::new(v1::GetBudgetResponse {
            status: budget_status(&snapshot),
        }))
    }

    async fn get_history(
        &self,
        request: Request<v1::GetHistoryRequest>,
    ) -> Result<Response<v1::GetHistoryResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let key = convert::bucket_key(&req.tenant_id, &req.bucket).map_err(invalid)?;
        let span = convert::history_span(&req).map_err(invalid)?;
        self.permit(caller.scope(), &key.tenant, Access::Read)
            .await?;
        let rows = self
            .store
            .history(&key, span.since, span.until, span.step)
            .await
            .map_err(|e| status("get history", e))?;
        let checks = self
            .store
            .check_history(&key, span.since, span.until, span.step)
            .await
            .map_err(|e| status("get history", e))?;
        Ok(Response::new(convert::history_to_proto(
            &rows,
            &checks,
            span.read_at,
        )))
    }

    async fn preview_limits(
        &self,
        request: Request<v1::PreviewLimitsRequest>,
    ) -> Result<Response<v1::PreviewLimitsResponse>, Status> {
        use v1::preview_limits_request::Change;
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let mut span = convert::preview_span(&req, Timestamp::from_system_time(SystemTime::now()))
            .map_err(invalid)?;
        let previews = match req.change {
            None => {
                return Err(invalid(InvalidInput::new(
                    "change",
                    "set bucket (one bucket's limits) or tier (a tier's definition)",
                )));
            }
            Some(Change::Bucket(proposed)) => {
                let key = convert::bucket_key(&proposed.tenant_id, &proposed.bucket)
                    .map_err(|e| invalid(e.within("bucket")))?;
                let limits = Limits {
                    refill_rate: proposed.refill_rate,
                    burst_limit: proposed.burst_limit,
                };
                limits.validate().map_err(|e| invalid(e.within("bucket")))?;
                self.permit(caller.scope(), &key.tenant, Access::Read)
                    .await?;
                vec![
                    preview::bucket(self.store.as_ref(), &key, limits, span)
                        .await
                        .map_err(|e| status("preview limits", e))?,
                ]
            }
            Some(Change::Budget(set)) => {
                if req.lookback.is_some() {
                    return Err(invalid(InvalidInput::new(
                        "lookback",
                        "must be unset for a budget: its preview replays the budget's cycle so far",
                    )));
                }
                let (bucket, budget) =
                    convert::budget_from_proto(set.budget.as_ref()).map_err(invalid)?;
                let tenant =
                    convert::tenant_id(&set.tenant_id).map_err(|e| invalid(e.within("budget")))?;
                span = preview::budget_span(&budget, span.until, span.max_wait).map_err(invalid)?;
                self.permit(caller.scope(), &tenant, Access::Read).await?;
                let key = tollgate_core::BucketKey::new(tenant, bucket);
                vec![
                    preview::budget(self.store.as_ref(), &key, &budget, span)
                        .await
                        .map_err(|e| status("preview limits", e))?,
                ]
            }
            Some(Change::Tier(tier)) => {
                AdminService::refuse_listing_all(caller.scope(), "bucket")?;
                let (name, tier) = convert::tier_from_proto(Some(tier)).map_err(invalid)?;
                preview::tier(self.store.as_ref(), &name, &tier, span)
                    .await
                    .map_err(|e| status("preview limits", e))?
            }
        };
        Ok(Response::new(v1::PreviewLimitsResponse {
            impacts: previews
                .iter()
                .map(convert::bucket_impact_to_proto)
                .collect(),
            since: Some(convert::timestamp_to_proto(span.since)),
            until: Some(convert::timestamp_to_proto(span.until)),
            max_wait: Some(tollgate_proto::duration(span.max_wait)),
        }))
    }

    async fn get_usage(
        &self,
        request: Request<v1::GetUsageRequest>,
    ) -> Result<Response<v1::GetUsageResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let key = convert::bucket_key(&req.tenant_id, &req.bucket).map_err(invalid)?;
        self.permit(caller.scope(), &key.tenant, Access::Read)
            .await?;
        let cycles = match req.cycles {
            0 => DEFAULT_USAGE_CYCLES,
            n if n as usize <= MAX_USAGE_CYCLES => n as usize,
            n => {
                return Err(invalid(InvalidInput::new(
                    "cycles",
                    format!("at most {MAX_USAGE_CYCLES} closed cycles, got {n}"),
                )));
            }
        };
        let snapshot = self.bucket(&key, "get usage").await?;
        let mut out = Vec::new();
        let view = snapshot
            .head
            .budget
            .as_ref()
            .map(|b| b.view(&snapshot.head.state, snapshot.read_at));
        if let Some(view) = &view {
            out.push(convert::cycle_usage_to_proto(
                &view.cycle,
                view.budget.amount,
                &view.usage,
                view.limit_reached_at,
                false,
            ));
            if let Some(record) = &view.unwritten {
                out.push(convert::cycle_record_to_proto(record));
            }
        }
        let closed = self
            .store
            .budget_cycles(&key, cycles)
            .await
            .map_err(|e| status("get usage", e))?;
        let room = (cycles + 1).saturating_sub(out.len());
        out.extend(closed.iter().take(room).map(convert::cycle_record_to_proto));
        Ok(Response::new(v1::GetUsageResponse { cycles: out }))
    }

    async fn describe_tenant(
        &self,
        request: Request<v1::DescribeTenantRequest>,
    ) -> Result<Response<v1::DescribeTenantResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let tenant = convert::tenant_id(&request.into_inner().tenant_id).map_err(invalid)?;
        self.permit(caller.scope(), &tenant, Access::Read).await?;
        let view = self
            .store
            .describe_tenant(&tenant)
            .await
            .map_err(|e| status("describe tenant", e))?;
        let key_buckets = self
            .store
            .list_key_buckets(
                Some(&tenant),
                None,
                usize::MAX,
                DEFAULT_BUSIEST_KEYS as usize,
            )
            .await
            .map_err(|e| status("describe tenant", e))?;
        let state = self
            .store
            .tenant_states(std::slice::from_ref(&tenant))
            .await
            .map_err(|e| status("describe tenant", e))?
            .remove(&tenant);
        let mut described = convert::tenant_view_to_proto(&view);
        described.key_buckets = self.key_buckets_to_proto(&key_buckets);
        described.state = state.as_ref().map(convert::tenant_state_to_proto);
        Ok(Response::new(v1::DescribeTenantResponse {
            tenant: Some(described),
        }))
    }

    async fn create_organization(
        &self,
        request: Request<v1::CreateOrganizationRequest>,
    ) -> Result<Response<v1::CreateOrganizationResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let answer = AdminService::create_organization(self, &caller, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn get_organization(
        &self,
        request: Request<v1::GetOrganizationRequest>,
    ) -> Result<Response<v1::GetOrganizationResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let answer = AdminService::get_organization(self, &caller, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn list_organizations(
        &self,
        request: Request<v1::ListOrganizationsRequest>,
    ) -> Result<Response<v1::ListOrganizationsResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let answer = AdminService::list_organizations(self, &caller).await?;
        Ok(Response::new(answer))
    }

    async fn add_organization_member(
        &self,
        request: Request<v1::AddOrganizationMemberRequest>,
    ) -> Result<Response<v1::AddOrganizationMemberResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let answer =
            AdminService::add_organization_member(self, &caller, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn remove_organization_member(
        &self,
        request: Request<v1::RemoveOrganizationMemberRequest>,
    ) -> Result<Response<v1::RemoveOrganizationMemberResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let answer =
            AdminService::remove_organization_member(self, &caller, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn delete_organization(
        &self,
        request: Request<v1::DeleteOrganizationRequest>,
    ) -> Result<Response<v1::DeleteOrganizationResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let answer = AdminService::delete_organization(self, &caller, request.into_inner()).await?;
        Ok(Response::new(answer))
    }
}

/// A request's page size: 0 means [`DEFAULT_PAGE_SIZE`], more than
/// [`MAX_PAGE_SIZE`] is refused.
fn page_size(asked: u32) -> Result<usize, Status> {
    bounded("page_size", asked, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
}

/// A count `field` asks for: 0 means `default`, more than `max` is
/// refused.
fn bounded(field: &'static str, asked: u32, default: u32, max: u32) -> Result<usize, Status> {
    match asked {
        0 => Ok(default as usize),
        n if n > max => Err(invalid(InvalidInput::new(
            field,
            format!("must be at most {max}, got {n}"),
        ))),
        n => Ok(n as usize),
    }
}

/// Page tokens of `ListTenants` and `ListKeyBuckets`: the key of the last
/// bucket listed,
/// `tenant` or `tenant/bucket` (neither name may hold a `/`).
mod page_token {
    use tollgate_core::{BucketKey, BucketName, InvalidInput, TenantId};
    use tonic::Status;

    use super::invalid;

    pub(super) fn of(key: &BucketKey) -> String {
        key.to_string()
    }

    /// The key a request's `page_token` says to list after: none for the
    /// first page.
    pub(super) fn after(token: &str) -> Result<Option<BucketKey>, Status> {
        match token {
            "" => Ok(None),
            token => parse(token).map(Some).map_err(invalid),
        }
    }

    /// Cuts `listed` (read one longer than `page_size`, to tell whether
    /// another page follows) to the page, and answers the token of the
    /// next page: empty on the last.
    pub(super) fn next<T>(
        listed: &mut Vec<T>,
        page_size: usize,
        key: impl Fn(&T) -> &BucketKey,
    ) -> String {
        if listed.len() <= page_size {
            return String::new();
        }
        listed.truncate(page_size);
        listed.last().map(|b| of(key(b))).unwrap_or_default()
    }

    pub(super) fn parse(token: &str) -> Result<BucketKey, InvalidInput> {
        let (tenant, bucket) = token.split_once('/').unwrap_or((token, ""));
        let bucket = BucketName::parse("page_token", bucket)?;
        if bucket.is_request_units() && token.ends_with('/') {
            return Err(InvalidInput::new(
                "page_token",
                "must be a token from a previous response",
            ));
        }
        Ok(BucketKey::new(
            TenantId::parse("page_token", tenant)?,
            bucket,
        ))
    }
}
