//! What a token scoped to an organisation may touch: the ids of its
//! subtree. The guard in front of the service let only
//! [`SCOPED_METHODS`](super::super::admin_auth::SCOPED_METHODS) through;
//! each of them names the tenant or organisation it acts on, and checks it
//! here before it reads or changes anything.
//!
//! The check reads the tree of organisations outside the call's own
//! transaction: a tenant an unscoped operator moves out of the
//! organisation at the same moment may still see one last call of the
//! scoped token. A scoped token itself cannot move tenants.

use tollgate_core::TenantId;
use tollgate_core::organisation::MAX_DEPTH;
use tonic::Status;

use super::super::Scope;
use super::super::status;
use super::AdminService;
use crate::store::NodeFilter;

/// What a call does to the id it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Access {
    /// Reads it: the scope's organisation itself, or anything below it.
    Read,
    /// Changes it: anything strictly below the scope's organisation (its
    /// own limits, budgets and tier are its provider's).
    Change,
}

impl AdminService {
    /// Whether a call with `scope` may act on `id` as `access` says: an
    /// unscoped call may act on everything. A refusal does not say whether
    /// `id` exists.
    pub(super) async fn permit(
        &self,
        scope: Option<&Scope>,
        id: &TenantId,
        access: Access,
    ) -> Result<(), Status> {
        let Some(Scope(org)) = scope else {
            return Ok(());
        };
        if self.may(scope, id, access).await? {
            return Ok(());
        }
        tracing::warn!(
            organization = %org,
            tenant = %id,
            ?access,
            "Admin call refused: the id is outside the token's organization"
        );
        let what = match access {
            Access::Read => format!("read {org} and the tenants below it"),
            Access::Change => format!("change the tenants below {org}"),
        };
        Err(Status::permission_denied(format!(
            "the token is scoped to organization {org}: it may only {what}, and \"{id}\" is not \
             one of them"
        )))
    }

    /// Whether a call with `scope` may act on `id` as `access` says.
    pub(super) async fn may(
        &self,
        scope: Option<&Scope>,
        id: &TenantId,
        access: Access,
    ) -> Result<bool, Status> {
        match scope {
            None => Ok(true),
            Some(Scope(org)) if access == Access::Read && id == org => Ok(true),
            Some(Scope(org)) => self.is_below(id, org).await,
        }
    }

    /// Whether `org` is one of the organisations above `id`.
    async fn is_below(&self, id: &TenantId, org: &TenantId) -> Result<bool, Status> {
        let mut at = id.clone();
        for _ in 0..=MAX_DEPTH {
            let node = self
                .store
                .tree_nodes(&NodeFilter::Ids(vec![at.clone()]))
                .await
                .map_err(|e| status("check the token's organization", e))?;
            let Some(up) = node.into_iter().next().and_then(|(_, n)| n.member_of) else {
                return Ok(false);
            };
            if &up.organisation == org {
                return Ok(true);
            }
            at = up.organisation;
        }
        Ok(false)
    }

    /// Refuses a listing of every tenant with `scope`: a scoped token lists
    /// one tenant at a time.
    pub(super) fn refuse_listing_all(scope: Option<&Scope>, field: &str) -> Result<(), Status> {
        match scope {
            None => Ok(()),
            Some(Scope(org)) => Err(Status::permission_denied(format!(
                "the token is scoped to organization {org}: it lists one tenant at a time; set \
                 {field} (GetOrganization lists {org}'s members)"
            ))),
        }
    }
}
