//! The tree of organisations in the embedded store: its rows read and
//! written; the rules are `tollgate_core::organisation`'s.
//!
//! Table `organisation_nodes` (added without a schema version: a file
//! without it gets it, empty, when opened): tenant id → JSON [`Node`].

use std::collections::BTreeMap;

use redb::{ReadableTable, TableDefinition, WriteTransaction};
use tollgate_core::organisation::{self, Node, TreeChange, TreeRows};
use tollgate_core::{TenantId, Timestamp};

use super::{BUCKETS, decode, encode, storage, tenant_heads};
use crate::store::{NodeFilter, StoreError};

pub(super) const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("organisation_nodes");

/// Writes rows (an import's).
pub(super) fn write_all(
    txn: &WriteTransaction,
    nodes: &[(TenantId, Node)],
) -> Result<(), StoreError> {
    let mut table = txn
        .open_table(NODES)
        .map_err(storage("open organisation nodes"))?;
    for (id, node) in nodes {
        let bytes = encode("encode an organisation node", node)?;
        table
            .insert(id.as_str(), bytes.as_slice())
            .map_err(storage("write an organisation node"))?;
    }
    Ok(())
}

/// Every row of the table.
pub(super) fn read_every(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<BTreeMap<TenantId, Node>, StoreError> {
    let mut out = BTreeMap::new();
    for entry in table.iter().map_err(storage("read organisation nodes"))? {
        let (id, value) = entry.map_err(storage("read organisation nodes"))?;
        let id = TenantId::parse("tenant_id", id.value())
            .map_err(|e| StoreError::internal("read an organisation node", e))?;
        out.insert(id, decode("decode an organisation node", value.value())?);
    }
    Ok(out)
}

/// The rows of `tenants`; a tenant without one is left out.
pub(super) fn read_in<'a>(
    txn: &WriteTransaction,
    tenants: impl IntoIterator<Item = &'a TenantId>,
) -> Result<BTreeMap<TenantId, Node>, StoreError> {
    let table = txn
        .open_table(NODES)
        .map_err(storage("open organisation nodes"))?;
    let mut out = BTreeMap::new();
    for tenant in tenants {
        if let Some(row) = table
            .get(tenant.as_str())
            .map_err(storage("read an organisation node"))?
        {
            out.insert(
                tenant.clone(),
                decode("decode an organisation node", row.value())?,
            );
        }
    }
    Ok(out)
}

/// The rows `filter` asks for, in id order.
pub(super) fn read(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    filter: &NodeFilter,
) -> Result<Vec<(TenantId, Node)>, StoreError> {
    Ok(read_every(table)?
        .into_iter()
        .filter(|(id, node)| filter.matches(id, node))
        .collect())
}

/// Applies `change` in the writer's transaction. The tree is small enough
/// here to read whole: the rules find the chain and the subtree in it.
pub(super) fn change(
    txn: &WriteTransaction,
    change: &TreeChange,
    now: Timestamp,
) -> Result<Result<Vec<(TenantId, Node)>, StoreError>, StoreError> {
    let mut table = txn
        .open_table(NODES)
        .map_err(storage("open organisation nodes"))?;
    let nodes = read_every(&table)?;
    let (first, _) = change.reads();
    let has_buckets = {
        let buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
        !tenant_heads(&buckets, first)?.is_empty()
    };
    let members = nodes
        .values()
        .filter(|n| {
            n.member_of
                .as_ref()
                .is_some_and(|m| &m.organisation == first)
        })
        .count();
    let rows = TreeRows {
        nodes,
        has_buckets,
        members,
    };
    let written = match organisation::apply(change, &rows, now) {
        Ok(written) => written,
        Err(e) => return Ok(Err(e.into())),
    };
    for (id, node) in &written {
        if node.is_empty() {
            table
                .remove(id.as_str())
                .map_err(storage("delete an organisation node"))?;
        } else {
            let bytes = encode("encode an organisation node", node)?;
            table
                .insert(id.as_str(), bytes.as_slice())
                .map_err(storage("write an organisation node"))?;
        }
    }
    Ok(Ok(written))
}
