//! The `Admin` RPCs of organisations: changes of the tree go to the store
//! as one [`TreeChange`] each (the rules are
//! `tollgate_core::organisation`'s); views are composed from the tree's
//! rows and the buckets of the organisation and its members.

use std::collections::BTreeMap;

use tollgate_core::organisation::{Node, TreeChange};
use tollgate_core::{BucketName, InvalidInput, TenantId};
use tollgate_proto::v1;
use tonic::Status;

use super::super::audit::{self, Caller};
use super::super::convert::{self, timestamp_to_proto};
use super::super::{invalid, status};
use super::AdminService;
use super::scope::Access;
use crate::store::{BucketSnapshot, NodeFilter, StoreError};

/// Guaranteed rates as the wire names them, by bucket name.
fn guarantees(
    rates: &std::collections::HashMap<String, f64>,
) -> Result<BTreeMap<BucketName, f64>, InvalidInput> {
    let mut out = BTreeMap::new();
    for (bucket, rate) in rates {
        let name = BucketName::parse(&format!("guaranteed_rates[{bucket:?}]"), bucket)?;
        out.insert(name, *rate);
    }
    tollgate_core::organisation::validate_guarantees(&out)?;
    Ok(out)
}

impl AdminService {
    /// Applies a change of the tree, logging it.
    pub(super) async fn change_tree(
        &self,
        caller: &Caller,
        operation: &'static str,
        change: TreeChange,
    ) -> Result<Vec<(TenantId, Node)>, Status> {
        let written = self
            .store
            .change_tree(&change)
            .await
            .map_err(|e| status(operation, e))?;
        audit::tree_changed(caller, operation, &change);
        Ok(written)
    }

    pub(super) async fn create_organization(
        &self,
        caller: &Caller,
        req: v1::CreateOrganizationRequest,
    ) -> Result<v1::CreateOrganizationResponse, Status> {
        let id = TenantId::parse("organization_id", &req.organization_id).map_err(invalid)?;
        let change = TreeChange::Create {
            organisation: id.clone(),
            display_name: req.display_name,
        };
        self.change_tree(caller, "create organization", change)
            .await?;
        Ok(v1::CreateOrganizationResponse {
            organization: Some(self.organization(&id, true).await?),
        })
    }

    pub(super) async fn add_organization_member(
        &self,
        caller: &Caller,
        req: v1::AddOrganizationMemberRequest,
    ) -> Result<v1::AddOrganizationMemberResponse, Status> {
        let organisation =
            TenantId::parse("organization_id", &req.organization_id).map_err(invalid)?;
        let member = TenantId::parse("member_id", &req.member_id).map_err(invalid)?;
        let guaranteed = guarantees(&req.guaranteed_rates).map_err(invalid)?;
        let change = TreeChange::Join {
            organisation: organisation.clone(),
            member,
            guaranteed,
        };
        self.change_tree(caller, "add organization member", change)
            .await?;
        Ok(v1::AddOrganizationMemberResponse {
            organization: Some(self.organization(&organisation, true).await?),
        })
    }

    pub(super) async fn remove_organization_member(
        &self,
        caller: &Caller,
        req: v1::RemoveOrganizationMemberRequest,
    ) -> Result<v1::RemoveOrganizationMemberResponse, Status> {
        let member = TenantId::parse("member_id", &req.member_id).map_err(invalid)?;
        // The organisation it leaves, for the answer: read before the
        // change, which refuses if it belongs to none.
        let before = self.node(&member).await?;
        let change = TreeChange::Leave { member };
        self.change_tree(caller, "remove organization member", change)
            .await?;
        Ok(v1::RemoveOrganizationMemberResponse {
            organization_id: before
                .and_then(|n| n.member_of)
                .map(|m| m.organisation.to_string())
                .unwrap_or_default(),
        })
    }

    pub(super) async fn delete_organization(
        &self,
        caller: &Caller,
        req: v1::DeleteOrganizationRequest,
    ) -> Result<v1::DeleteOrganizationResponse, Status> {
        let organisation =
            TenantId::parse("organization_id", &req.organization_id).map_err(invalid)?;
        let change = TreeChange::Delete { organisation };
        self.change_tree(caller, "delete organization", change)
            .await?;
        Ok(v1::DeleteOrganizationResponse {})
    }

    pub(super) async fn get_organization(
        &self,
        caller: &Caller,
        req: v1::GetOrganizationRequest,
    ) -> Result<v1::GetOrganizationResponse, Status> {
        let id = TenantId::parse("organization_id", &req.organization_id).map_err(invalid)?;
        self.permit(caller.scope(), &id, Access::Read).await?;
        Ok(v1::GetOrganizationResponse {
            organization: Some(self.organization(&id, true).await?),
        })
    }

    /// Every organisation; with a scoped token, its own and those below
    /// it.
    pub(super) async fn list_organizations(
        &self,
        caller: &Caller,
    ) -> Result<v1::ListOrganizationsResponse, Status> {
        let orgs = self
            .store
            .tree_nodes(&NodeFilter::Organisations)
            .await
            .map_err(|e| status("list organizations", e))?;
        let mut out = Vec::with_capacity(orgs.len());
        for (id, _) in &orgs {
            if self.may(caller.scope(), id, Access::Read).await? {
                out.push(self.organization(id, false).await?);
            }
        }
        Ok(v1::ListOrganizationsResponse { organizations: out })
    }

    /// The tree row of `id`, if it has one.
    async fn node(&self, id: &TenantId) -> Result<Option<Node>, Status> {
        let found = self
            .store
            .tree_nodes(&NodeFilter::Ids(vec![id.clone()]))
            .await
            .map_err(|e| status("read organization", e))?;
        Ok(found.into_iter().next().map(|(_, n)| n))
    }

    /// The buckets of `id` (none if it has none).
    async fn buckets_of(&self, id: &TenantId) -> Result<Vec<BucketSnapshot>, Status> {
        match self.store.get_tenant(id).await {
            Ok(buckets) => Ok(buckets),
            Err(StoreError::TenantNotFound(_)) => Ok(Vec::new()),
            Err(e) => Err(status("read organization", e)),
        }
    }

    /// An organisation on the wire; with `buckets`, its buckets and its
    /// members' too.
    async fn organization(&self, id: &TenantId, buckets: bool) -> Result<v1::Organization, Status> {
        let not_found = || Status::not_found(format!("organisation \"{id}\" does not exist"));
        let node = self.node(id).await?.ok_or_else(not_found)?;
        let org = node.organisation.as_ref().ok_or_else(not_found)?;
        let members = self
            .store
            .tree_nodes(&NodeFilter::MembersOf(id.clone()))
            .await
            .map_err(|e| status("read organization", e))?;
        let mut wire_members = Vec::with_capacity(members.len());
        for (member_id, member) in &members {
            let snapshots = if buckets {
                self.buckets_of(member_id).await?
            } else {
                Vec::new()
            };
            wire_members.push(convert::member_to_proto(member_id, member, &snapshots));
        }
        let own = if buckets {
            self.buckets_of(id).await?
        } else {
            Vec::new()
        };
        Ok(v1::Organization {
            organization_id: id.to_string(),
            display_name: org.display_name.clone(),
            created_at: Some(timestamp_to_proto(org.created_at)),
            parent_organization_id: node
                .member_of
                .as_ref()
                .map(|m| m.organisation.to_string())
                .unwrap_or_default(),
            buckets: own.iter().map(convert::bucket_to_proto).collect(),
            members: wire_members,
        })
    }
}
