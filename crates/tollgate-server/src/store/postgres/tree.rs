//! The tree of organisations in PostgreSQL (`tollgate_organisation_nodes`):
//! its rows read, locked and written; the rules are
//! `tollgate_core::organisation`'s.

use std::collections::BTreeMap;

use tokio_postgres::Row;
use tollgate_core::TenantId;
use tollgate_core::organisation::{self, Node, TreeChange, TreeRows};

use super::retry::TxError;
use super::{Inner, rows, sql};
use crate::store::{NodeFilter, StoreError};

/// A tree row as the core's.
fn from_row(row: &Row) -> Result<(TenantId, Node), StoreError> {
    let text: &str = row
        .try_get("node")
        .map_err(|e| StoreError::internal("read an organisation node", e))?;
    let node = serde_json::from_str(text)
        .map_err(|e| StoreError::internal("decode an organisation node", e))?;
    Ok((rows::tenant_id(row)?, node))
}

/// The tree rows in `rows`, by tenant.
pub(super) fn from_rows(rows: &[Row]) -> Result<BTreeMap<TenantId, Node>, StoreError> {
    rows.iter().map(from_row).collect()
}

/// Applies `change` in a transaction of its own: the rows it reads locked
/// (in id order), the rules applied, the rows written.
pub(super) async fn change(
    inner: &Inner,
    change: &TreeChange,
) -> Result<Vec<(TenantId, Node)>, TxError> {
    let mut client = inner.pool.get().await?;
    let lock = client.prepare_cached(sql::LOCK_TREE).await?;
    let count = client.prepare_cached(sql::COUNT_MEMBERS).await?;
    let has_buckets = client.prepare_cached(sql::HAS_BUCKETS).await?;
    let upsert = client.prepare_cached(sql::UPSERT_NODE).await?;
    let delete = client.prepare_cached(sql::DELETE_NODE).await?;
    let clock = client.prepare_cached(sql::CLOCK).await?;
    let txn = client.transaction().await?;
    let (first, second) = change.reads();
    let second = second.map(TenantId::as_str);
    let locked = txn.query(&lock, &[&first.as_str(), &second]).await?;
    let nodes = from_rows(&locked)?;
    let members: i64 = txn
        .query_one(&count, &[&first.as_str()])
        .await?
        .try_get("members")
        .map_err(|e| StoreError::internal("count members", e))?;
    let has_buckets: bool = txn
        .query_one(&has_buckets, &[&first.as_str()])
        .await?
        .try_get("has_buckets")
        .map_err(|e| StoreError::internal("read whether a tenant has buckets", e))?;
    let now = inner.now(rows::clock(&txn.query_one(&clock, &[]).await?, "now")?);
    let rows = TreeRows {
        nodes,
        has_buckets,
        members: usize::try_from(members).unwrap_or(usize::MAX),
    };
    let written =
        organisation::apply(change, &rows, now).map_err(|e| TxError::Store(StoreError::Tree(e)))?;
    for (id, node) in &written {
        if node.is_empty() {
            txn.execute(&delete, &[&id.as_str()]).await?;
        } else {
            let text = serde_json::to_string(node)
                .map_err(|e| StoreError::internal("encode an organisation node", e))?;
            let member_of = node.member_of.as_ref().map(|m| m.organisation.as_str());
            txn.execute(
                &upsert,
                &[
                    &id.as_str(),
                    &node.organisation.is_some(),
                    &member_of,
                    &text,
                ],
            )
            .await?;
        }
    }
    txn.commit().await.map_err(TxError::Commit)?;
    Ok(written)
}

/// The rows `filter` asks for, in id order.
pub(super) async fn read(
    inner: &Inner,
    filter: &NodeFilter,
) -> Result<Vec<(TenantId, Node)>, TxError> {
    let client = inner.pool.get().await?;
    let list = client.prepare_cached(sql::LIST_NODES).await?;
    let none: Vec<&str> = Vec::new();
    let found = match filter {
        NodeFilter::Organisations => {
            client
                .query(&list, &[&"organisations", &None::<&str>, &none])
                .await?
        }
        NodeFilter::MembersOf(org) => {
            client
                .query(&list, &[&"members", &Some(org.as_str()), &none])
                .await?
        }
        NodeFilter::Ids(ids) => {
            let ids: Vec<&str> = ids.iter().map(TenantId::as_str).collect();
            client.query(&list, &[&"ids", &None::<&str>, &ids]).await?
        }
    };
    Ok(from_rows(&found)?.into_iter().collect())
}

/// Writes the tree's rows of an import, `chunk` rows per statement.
pub(super) async fn import(
    txn: &deadpool_postgres::Transaction<'_>,
    nodes: &[(TenantId, Node)],
    chunk: usize,
) -> Result<(), TxError> {
    let insert = txn.prepare_cached(sql::INSERT_NODES).await?;
    for part in nodes.chunks(chunk.max(1)) {
        let ids: Vec<&str> = part.iter().map(|(id, _)| id.as_str()).collect();
        let orgs: Vec<bool> = part.iter().map(|(_, n)| n.organisation.is_some()).collect();
        let member_of: Vec<Option<&str>> = part
            .iter()
            .map(|(_, n)| n.member_of.as_ref().map(|m| m.organisation.as_str()))
            .collect();
        let texts = part
            .iter()
            .map(|(_, n)| {
                serde_json::to_string(n)
                    .map_err(|e| StoreError::internal("encode an organisation node", e))
            })
            .collect::<Result<Vec<String>, StoreError>>()?;
        txn.execute(&insert, &[&ids, &orgs, &member_of, &texts])
            .await?;
    }
    Ok(())
}
