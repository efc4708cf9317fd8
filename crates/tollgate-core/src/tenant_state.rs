//! Whether a tenant is served: the rules of tombstones and suspensions.
//!
//! A deleted tenant leaves a tombstone, and an operator may suspend a
//! tenant; either is a [`TenantState`], one row per tenant. While a tenant
//! has one, every pod-facing call for it is refused ([`admit`]): a deleted
//! tenant is not found (its request-unit bucket is not created again with
//! the unconfigured-tenant defaults), a suspended one is refused until it
//! is resumed, its limits, buckets and totals kept as they were. An
//! operator creating the tenant again explicitly removes its tombstone
//! ([`after_operator_change`]); a suspension stays until `resume`.
//! [`change`] decides what delete, suspend and resume write.
//!
//! Stores only read the state rows of the tenants a transaction touches
//! and write what these functions decide.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;
use crate::validate::{InvalidInput, TenantId};

/// The longest suspension reason, in bytes.
pub const MAX_REASON_LEN: usize = 512;

/// Why a tenant is not served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TenantStateKind {
    /// Deleted: a tombstone.
    Deleted,
    /// Suspended by an operator: everything kept, nothing served.
    Suspended,
}

impl TenantStateKind {
    /// The kind's name in the store, on the wire and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TenantStateKind::Deleted => "deleted",
            TenantStateKind::Suspended => "suspended",
        }
    }

    /// The kind of a stored name.
    pub fn parse(field: &str, name: &str) -> Result<Self, InvalidInput> {
        match name {
            "deleted" => Ok(TenantStateKind::Deleted),
            "suspended" => Ok(TenantStateKind::Suspended),
            other => Err(InvalidInput::new(
                field,
                format!("must be \"deleted\" or \"suspended\", got {other:?}"),
            )),
        }
    }
}

/// A tenant's tombstone or suspension.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantState {
    pub kind: TenantStateKind,
    /// When it was deleted or suspended.
    pub since: Timestamp,
    /// Who did it, as the audit log names them (`alice at 10.0.0.7:51234`).
    pub actor: String,
    /// Why, as the operator said (suspensions only; may be empty).
    pub reason: String,
}

/// Why a pod-facing call for a tenant was refused; nothing changed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TenantRefused {
    /// The tenant was deleted: not found until created again.
    #[error("tenant \"{tenant}\" was deleted at {}; an operator must create it again before it is served", rfc3339(*since))]
    Deleted { tenant: TenantId, since: Timestamp },
    /// The tenant is suspended.
    #[error("tenant \"{tenant}\" is suspended since {}{}", rfc3339(*since), Reason(reason))]
    Suspended {
        tenant: TenantId,
        since: Timestamp,
        reason: String,
    },
    /// The id is an organisation's: its buckets are drawn on by its
    /// members' buckets, not by pods.
    #[error("\"{tenant}\" is an organisation: pods draw on its members' buckets, never on its own")]
    Organisation { tenant: TenantId },
}

struct Reason<'a>(&'a str);

impl fmt::Display for Reason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, ": {}", self.0)
        }
    }
}

/// `2026-11-26T17:16:00Z` (whole seconds, UTC).
pub fn rfc3339(t: Timestamp) -> String {
    let micros = t.unix_micros();
    let time = if micros >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_micros(micros.unsigned_abs())
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
    };
    humantime::format_rfc3339_seconds(time).to_string()
}

/// Whether a pod-facing call for `tenant`, whose state row is `state`, is
/// served. Refused calls change nothing.
pub fn admit(tenant: &TenantId, state: Option<&TenantState>) -> Result<(), TenantRefused> {
    match state {
        None => Ok(()),
        Some(state) => Err(refusal(tenant, state)),
    }
}

fn refusal(tenant: &TenantId, state: &TenantState) -> TenantRefused {
    match state.kind {
        TenantStateKind::Deleted => TenantRefused::Deleted {
            tenant: tenant.clone(),
            since: state.since,
        },
        TenantStateKind::Suspended => TenantRefused::Suspended {
            tenant: tenant.clone(),
            since: state.since,
            reason: state.reason.clone(),
        },
    }
}

/// What a store writes to a tenant's state row.
#[derive(Clone, Debug, PartialEq)]
pub enum StateWrite {
    /// Leave it as it is.
    Keep,
    /// Write this state.
    Put(TenantState),
    /// Remove the row.
    Remove,
}

/// Refuses a change that needs the tenant to exist (a budget) for a
/// deleted tenant: setting a budget does not create a tenant again, and
/// would otherwise bring it back with the server's default limits.
pub fn refuse_deleted(tenant: &TenantId, state: Option<&TenantState>) -> Result<(), TenantRefused> {
    match state {
        Some(s) if s.kind == TenantStateKind::Deleted => Err(refusal(tenant, s)),
        _ => Ok(()),
    }
}

/// What an operator's explicit change to a tenant (creating it, setting its
/// tier, an override, table limits or a bucket's limits) does to its state:
/// a tombstone goes, since the tenant is created again; a suspension stays.
pub fn after_operator_change(state: Option<&TenantState>) -> StateWrite {
    match state.map(|s| s.kind) {
        Some(TenantStateKind::Deleted) => StateWrite::Remove,
        Some(TenantStateKind::Suspended) | None => StateWrite::Keep,
    }
}

/// An operator's change of a tenant's state.
#[derive(Clone, Debug, PartialEq)]
pub enum StateChange {
    /// The tenant is deleted (its rows are removed by the store): leave a
    /// tombstone.
    Delete {
        actor: String,
    },
    Suspend {
        actor: String,
        reason: String,
    },
    Resume,
}

impl StateChange {
    /// Checks what the operator gave: a reason of at most
    /// [`MAX_REASON_LEN`] bytes without control characters.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if let StateChange::Suspend { reason, .. } = self {
            if reason.len() > MAX_REASON_LEN {
                return Err(InvalidInput::new(
                    "reason",
                    format!(
                        "must be at most {MAX_REASON_LEN} bytes, got {}",
                        reason.len()
                    ),
                ));
            }
            if reason.chars().any(char::is_control) {
                return Err(InvalidInput::new(
                    "reason",
                    "must not hold control characters",
                ));
            }
        }
        Ok(())
    }
}

/// What a state change did.
#[derive(Clone, Debug, PartialEq)]
pub struct StateEdit {
    pub write: StateWrite,
    /// The tenant's state after the change.
    pub state: Option<TenantState>,
    /// False if the tenant already was as asked (a repeated suspend or
    /// resume): nothing is written.
    pub changed: bool,
}

/// Why a state change was refused; nothing changed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum StateChangeError {
    #[error("tenant \"{0}\" not found")]
    TenantNotFound(TenantId),
    #[error(transparent)]
    Refused(#[from] TenantRefused),
}

/// Decides a state change for `tenant`, which `exists` (has buckets or a
/// tier record) and whose state row is `state`, at `now`.
///
/// - Delete: a tenant that exists gets a tombstone (replacing a
///   suspension); one that does not is not found.
/// - Suspend: a tenant that exists is suspended; one already suspended
///   stays as it was (the first reason and time kept); a deleted or
///   unknown one is not found.
/// - Resume: a suspended tenant is served again; one not suspended stays
///   as it is; a deleted or unknown one is not found.
pub fn change(
    tenant: &TenantId,
    exists: bool,
    state: Option<&TenantState>,
    change: &StateChange,
    now: Timestamp,
) -> Result<StateEdit, StateChangeError> {
    let kind = state.map(|s| s.kind);
    if let Some(state) = state.filter(|s| s.kind == TenantStateKind::Deleted && !exists) {
        return Err(refusal(tenant, state).into());
    }
    if !exists {
        return Err(StateChangeError::TenantNotFound(tenant.clone()));
    }
    let unchanged = || StateEdit {
        write: StateWrite::Keep,
        state: state.cloned(),
        changed: false,
    };
    let put = |state: TenantState| StateEdit {
        write: StateWrite::Put(state.clone()),
        state: Some(state),
        changed: true,
    };
    Ok(match change {
        StateChange::Delete { actor } => put(TenantState {
            kind: TenantStateKind::Deleted,
            since: now,
            actor: actor.clone(),
            reason: String::new(),
        }),
        StateChange::Suspend { .. } if kind == Some(TenantStateKind::Suspended) => unchanged(),
        StateChange::Suspend { actor, reason } => put(TenantState {
            kind: TenantStateKind::Suspended,
            since: now,
            actor: actor.clone(),
            reason: reason.clone(),
        }),
        StateChange::Resume if kind == Some(TenantStateKind::Suspended) => StateEdit {
            write: StateWrite::Remove,
            state: None,
            changed: true,
        },
        StateChange::Resume => unchanged(),
    })
}

#[cfg(test)]
mod tests;
