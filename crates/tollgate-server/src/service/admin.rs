//! The operator-facing `Admin` service.

use std::sync::Arc;

use tollgate_core::{InvalidInput, TenantId};
use tollgate_proto::v1::{self, admin_server};
use tonic::{Request, Response, Status};

use super::audit::{self, Caller};
use super::{convert, edge, invalid, status};
use crate::store::Store;

/// Tenants listed per page when the request does not say.
const DEFAULT_PAGE_SIZE: u32 = 100;
/// The most tenants listed per page.
const MAX_PAGE_SIZE: u32 = 1000;

/// Lets operators set limits and read tenants' state and consumption.
#[derive(Debug, Clone)]
pub struct AdminService {
    store: Arc<dyn Store>,
}

impl AdminService {
    pub fn new(store: Arc<dyn Store>) -> Self {
        AdminService { store }
    }
}

#[tonic::async_trait]
impl admin_server::Admin for AdminService {
    async fn update_tenant_resource_limits(
        &self,
        request: Request<v1::UpdateTenantResourceLimitsRequest>,
    ) -> Result<Response<v1::UpdateTenantResourceLimitsResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let (tenant, update) = convert::limits_update(request.into_inner()).map_err(invalid)?;
        let change = self
            .store
            .update_limits(&tenant, &update)
            .await
            .map_err(|e| status("update tenant limits", e))?;
        audit::limits_updated(&caller, &tenant, &update, &change);
        Ok(Response::new(v1::UpdateTenantResourceLimitsResponse {
            tenant: Some(convert::tenant_to_proto(&change.after)),
        }))
    }

    async fn get_tenant(
        &self,
        request: Request<v1::GetTenantRequest>,
    ) -> Result<Response<v1::GetTenantResponse>, Status> {
        edge::enter(&request)?;
        let req = request.into_inner();
        let tenant = convert::tenant_id(&req.tenant_id).map_err(invalid)?;
        tollgate_core::validate::bucket("bucket", &req.bucket).map_err(invalid)?;
        let snapshot = self
            .store
            .get_tenant(&tenant)
            .await
            .map_err(|e| status("get tenant", e))?;
        Ok(Response::new(v1::GetTenantResponse {
            tenant: Some(convert::tenant_to_proto(&snapshot)),
        }))
    }

    async fn list_tenants(
        &self,
        request: Request<v1::ListTenantsRequest>,
    ) -> Result<Response<v1::ListTenantsResponse>, Status> {
        edge::enter(&request)?;
        let req = request.into_inner();
        let page_size = match req.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n if n > MAX_PAGE_SIZE => {
                return Err(invalid(InvalidInput::new(
                    "page_size",
                    format!("must be at most {MAX_PAGE_SIZE}, got {n}"),
                )));
            }
            n => n,
        };
        let after = match req.page_token.as_str() {
            "" => None,
            token => Some(TenantId::parse("page_token", token).map_err(invalid)?),
        };
        let page_size = page_size as usize;
        // One more than asked tells whether another page follows.
        let mut tenants = self
            .store
            .list_tenants(after.as_ref(), page_size + 1)
            .await
            .map_err(|e| status("list tenants", e))?;
        let next_page_token = if tenants.len() > page_size {
            tenants.truncate(page_size);
            tenants
                .last()
                .map(|t| t.tenant_id.to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(v1::ListTenantsResponse {
            tenants: tenants.iter().map(convert::tenant_to_proto).collect(),
            next_page_token,
        }))
    }

    async fn delete_tenant(
        &self,
        request: Request<v1::DeleteTenantRequest>,
    ) -> Result<Response<v1::DeleteTenantResponse>, Status> {
        edge::enter(&request)?;
        let caller = Caller::of(&request);
        let tenant = convert::tenant_id(&request.into_inner().tenant_id).map_err(invalid)?;
        let deleted = self
            .store
            .delete_tenant(&tenant)
            .await
            .map_err(|e| status("delete tenant", e))?;
        audit::tenant_deleted(&caller, &deleted);
        Ok(Response::new(v1::DeleteTenantResponse {}))
    }
}
