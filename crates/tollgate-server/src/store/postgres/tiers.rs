//! Tiers and tenant records: the rows a tier or tenant change locks,
//! reads and writes, by the rules of `tollgate_core::tier`.

use super::*;

pub(super) async fn change_tenant_by(
    store: &PostgresStore,
    tenant: &TenantId,
    change: &TenantChange,
    call: &AdminCall,
) -> Result<TenantChangeOutcome, StoreError> {
    let inner = &*store.inner;
    inner
        .run("change tenant", call.dry_run, || async move {
            let mut client = inner.pool.get().await?;
            let txn = client.transaction().await?;
            let outcome = change_in(inner, &txn, tenant, change, &call.by).await?;
            let outcome = outcome.map_err(TxError::Store)?;
            finish(txn, call.dry_run).await?;
            Ok(outcome)
        })
        .await
}

pub(super) async fn describe_tenant(
    store: &PostgresStore,
    tenant: &TenantId,
) -> Result<TenantView, StoreError> {
    let inner = &*store.inner;
    inner
        .run("describe tenant", true, || async move {
            let mut client = inner.pool.get().await?;
            let read_record = client.prepare_cached(sql::READ_TENANT_RECORD).await?;
            let list = client.prepare_cached(sql::LIST_TENANT_BUCKETS).await?;
            // One snapshot for the record and the buckets.
            let txn = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await?;
            let tenant_id = tenant.as_str();
            let params: [&(dyn ToSql + Sync); 1] = [&tenant_id];
            let (record, heads) = tokio::join!(
                txn.query_opt(&read_record, &params),
                txn.query(&list, &params),
            );
            let record = match record? {
                Some(row) => record_of(&row)?,
                None => None,
            };
            let heads = heads?;
            txn.commit().await.map_err(TxError::Commit)?;
            let mut buckets = snapshots_from_rows(inner, &heads, "read_at")?;
            buckets.sort_by(|a, b| a.key.cmp(&b.key));
            if record.is_none() && buckets.is_empty() {
                return Err(TxError::Store(StoreError::TenantNotFound(tenant.clone())));
            }
            Ok(TenantView {
                tenant: tenant.clone(),
                record,
                buckets,
            })
        })
        .await
}

/// The records of `tenants` (those that have one).
pub(super) async fn read_records(
    inner: &Inner,
    tenants: &[TenantId],
) -> Result<BTreeMap<TenantId, TenantRecord>, TxError> {
    let client = inner.pool.get().await?;
    let read = client.prepare_cached(sql::READ_TENANT_RECORDS).await?;
    let ids: Vec<&str> = tenants.iter().map(TenantId::as_str).collect();
    let mut records = BTreeMap::new();
    for row in client.query(&read, &[&ids]).await? {
        let id: &str = row
            .try_get("tenant_id")
            .map_err(|e| StoreError::internal("read a stored row", e))?;
        let tenant = TenantId::parse("tenant_id", id)
            .map_err(|e| StoreError::internal("read a stored tenant id", e))?;
        if let Some(record) = record_of(&row)? {
            records.insert(tenant, record);
        }
    }
    Ok(records)
}

pub(super) async fn put_tier_by(
    store: &PostgresStore,
    name: &TierName,
    tier: &Tier,
    call: &AdminCall,
) -> Result<PutTierOutcome, StoreError> {
    let inner = &*store.inner;
    tier::may_put_tier(name, tier, inner.settings.unconfigured_tenants.defaults())?;
    inner
        .run("put tier", call.dry_run, || async move {
            let mut client = inner.pool.get().await?;
            let lock = client.prepare_cached(sql::LOCK_TIER).await?;
            let clock = client.prepare_cached(sql::CLOCK).await?;
            let upsert = client.prepare_cached(sql::UPSERT_TIER).await?;
            let on_tier = client.prepare_cached(sql::TENANTS_ON_TIER).await?;
            let txn = client.transaction().await?;
            let before: Option<Tier> = txn
                .query_opt(&lock, &[&name.as_str()])
                .await?
                .as_ref()
                .map(tier_of)
                .transpose()?;
            let now = {
                let row = txn.query_one(&clock, &[]).await?;
                inner.now(rows::clock(&row, "now")?)
            };
            let stored = tier::stamp_tier(tier, before.as_ref(), now);
            let definition = to_json("encode tier", &stored)?;
            txn.execute(&upsert, &[&name.as_str(), &definition]).await?;
            let tenants = txn.query(&on_tier, &[&name.as_str()]).await?;
            let mut changed = Vec::new();
            for row in &tenants {
                let tenant = rows::tenant_id(row)?;
                let reapply = TenantChange::Reapply {
                    previous: before.clone(),
                };
                let outcome = change_in(inner, &txn, &tenant, &reapply, &call.by)
                    .await?
                    .map_err(TxError::Store)?;
                if !outcome.is_unchanged() {
                    changed.push(outcome);
                }
            }
            finish(txn, call.dry_run).await?;
            Ok(PutTierOutcome {
                tier: stored,
                created: before.is_none(),
                tenants: changed,
            })
        })
        .await
}

pub(super) async fn get_tier(store: &PostgresStore, name: &TierName) -> Result<Tier, StoreError> {
    let inner = &*store.inner;
    inner
        .run("read tier", true, || async move {
            let client = inner.pool.get().await?;
            let read = client.prepare_cached(sql::READ_TIER).await?;
            match client.query_opt(&read, &[&name.as_str()]).await? {
                Some(row) => Ok(tier_of(&row)?),
                None => Err(TxError::Store(TierError::TierNotFound(name.clone()).into())),
            }
        })
        .await
}

pub(super) async fn list_tiers(store: &PostgresStore) -> Result<Vec<(TierName, Tier)>, StoreError> {
    let inner = &*store.inner;
    inner
        .run("list tiers", true, || async move {
            let client = inner.pool.get().await?;
            let list = client.prepare_cached(sql::LIST_TIERS).await?;
            let mut tiers = client
                .query(&list, &[])
                .await?
                .iter()
                .map(named_tier)
                .collect::<Result<Vec<(TierName, Tier)>, StoreError>>()?;
            tiers.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(tiers)
        })
        .await
}

pub(super) async fn delete_tier(store: &PostgresStore, name: &TierName) -> Result<(), StoreError> {
    let inner = &*store.inner;
    inner
        .run("delete tier", false, || async move {
            let mut client = inner.pool.get().await?;
            let lock = client.prepare_cached(sql::LOCK_TIER).await?;
            let count = client.prepare_cached(sql::COUNT_TENANTS_ON_TIER).await?;
            let delete = client.prepare_cached(sql::DELETE_TIER).await?;
            let txn = client.transaction().await?;
            let exists = txn.query_opt(&lock, &[&name.as_str()]).await?.is_some();
            let users = txn.query(&count, &[&name.as_str()]).await?;
            let total: i64 = match users.first() {
                Some(first) => first
                    .try_get("total")
                    .map_err(|e| StoreError::internal("read a stored row", e))?,
                None => 0,
            };
            let examples = users
                .iter()
                .map(rows::tenant_id)
                .collect::<Result<Vec<_>, _>>()?;
            tier::may_delete_tier(name, exists, total.unsigned_abs(), examples)
                .map_err(|e| TxError::Store(e.into()))?;
            txn.execute(&delete, &[&name.as_str()]).await?;
            txn.commit().await.map_err(TxError::Commit)?;
            Ok(())
        })
        .await
}

/// A tenant record, or `None` for the row a first change of the tenant
/// inserts to lock (`ensure_tenant_record.sql`).
pub(super) fn record_of(row: &tokio_postgres::Row) -> Result<Option<TenantRecord>, StoreError> {
    let text: Option<&str> = row
        .try_get("record")
        .map_err(|e| StoreError::internal("read a stored row", e))?;
    text.map(|text| {
        serde_json::from_str(text).map_err(|e| StoreError::internal("decode a stored document", e))
    })
    .transpose()
}

/// A tier as `tollgate_tiers.definition` keeps it.
pub(super) fn tier_of(row: &tokio_postgres::Row) -> Result<Tier, StoreError> {
    json_column(row, "definition")
}

/// A row of `tollgate_tiers`: the tier's name and definition.
pub(super) fn named_tier(row: &tokio_postgres::Row) -> Result<(TierName, Tier), StoreError> {
    let name: &str = row
        .try_get("name")
        .map_err(|e| StoreError::internal("read a stored row", e))?;
    let name =
        TierName::parse("tier", name).map_err(|e| StoreError::internal("decode tier name", e))?;
    Ok((name, tier_of(row)?))
}

pub(super) fn to_json<T: serde::Serialize>(
    what: &'static str,
    value: &T,
) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::internal(what, e))
}

/// Runs one tenant change inside `txn`: lock the record, the tier (shared)
/// and the buckets, decide by the core's rules, write. `Ok(Err(_))` is a
/// refusal: nothing was written.
pub(super) async fn change_in(
    inner: &Inner,
    txn: &deadpool_postgres::Transaction<'_>,
    tenant: &TenantId,
    change: &TenantChange,
    by: &ClosedBy,
) -> Result<Result<TenantChangeOutcome, StoreError>, TxError> {
    let ensure_record = txn.prepare_cached(sql::ENSURE_TENANT_RECORD).await?;
    let lock_record = txn.prepare_cached(sql::LOCK_TENANT_RECORD).await?;
    let share_tier = txn.prepare_cached(sql::SHARE_TIER).await?;
    let read_tier = txn.prepare_cached(sql::READ_TIER).await?;
    let lock_buckets = txn.prepare_cached(sql::LOCK_TENANT).await?;
    let clock = txn.prepare_cached(sql::CLOCK).await?;
    let upsert_record = txn.prepare_cached(sql::UPSERT_TENANT_RECORD).await?;
    let delete_strays = txn.prepare_cached(sql::DELETE_STRAY_INSTANCES).await?;
    let insert_heads = txn.prepare_cached(&sql::INSERT_BUCKETS).await?;
    let update_heads = txn.prepare_cached(&sql::UPDATE_BUCKETS).await?;
    let delete_bucket = txn.prepare_cached(sql::DELETE_BUCKET).await?;

    let tenant_id = tenant.as_str();
    // A row to lock even for a tenant without a record yet: two first
    // changes of a tenant serialize on it (the second waits for the first
    // to commit). A change that is refused rolls it back.
    txn.execute(&ensure_record, &[&tenant_id]).await?;
    let record = record_of(&txn.query_one(&lock_record, &[&tenant_id]).await?)?;
    if !change.recreates()
        && let Err(refused) = tollgate_core::tenant_state::refuse_deleted(
            tenant,
            states::locked(txn, tenant).await?.as_ref(),
        )
    {
        return Ok(Err(refused.into()));
    }
    // The tier a tier query found, if it did.
    let tier_by = async |statement, name: Option<TierName>| -> Result<Option<Tier>, TxError> {
        let Some(name) = name else {
            return Ok(None);
        };
        let row = txn.query_opt(statement, &[&name.as_str()]).await?;
        Ok(row.as_ref().map(tier_of).transpose()?)
    };
    let tier = tier_by(&share_tier, change.tier_to_load(record.as_ref())).await?;
    let previous_tier = tier_by(&read_tier, change.previous_tier_to_load(record.as_ref())).await?;
    let heads = txn.query(&lock_buckets, &[&tenant_id]).await?;
    let now = {
        let row = txn.query_one(&clock, &[]).await?;
        inner.now(rows::clock(&row, "now")?)
    };
    let mut buckets = BTreeMap::new();
    for row in &heads {
        buckets.insert(rows::bucket_key(row)?.bucket, rows::head_from_row(row)?);
    }
    let loaded = LoadedTenant {
        record,
        buckets,
        tier,
        previous_tier,
        request_units: inner.settings.unconfigured_tenants.defaults(),
    };
    let edit = match tier::change_tenant(tenant, change, &loaded, now) {
        Ok(edit) => edit,
        Err(e) => return Ok(Err(e.into())),
    };

    let record_json = to_json("encode tenant record", &edit.record)?;
    let tier_name = edit.record.tier.as_ref().map(TierName::as_str);
    txn.execute(&upsert_record, &[&tenant_id, &tier_name, &record_json])
        .await?;
    let created: Vec<_> = edit
        .created
        .iter()
        .map(|(name, head)| (BucketKey::new(tenant.clone(), name.clone()), head))
        .collect();
    let changed: Vec<_> = edit
        .changed
        .iter()
        .map(|(name, head)| (BucketKey::new(tenant.clone(), name.clone()), head))
        .collect();
    if !created.is_empty() {
        let tenants = vec![tenant_id; created.len()];
        let buckets: Vec<&str> = created.iter().map(|(key, _)| key.bucket.as_str()).collect();
        txn.execute(&delete_strays, &[&tenants, &buckets]).await?;
        let columns = HeadColumns::of(created.iter().map(|(key, head)| (key, *head)))?;
        txn.execute(&insert_heads, &columns.as_params()).await?;
    }
    if !changed.is_empty() {
        let columns = HeadColumns::of(changed.iter().map(|(key, head)| (key, *head)))?;
        txn.execute(&update_heads, &columns.as_params()).await?;
    }
    for name in &edit.retired {
        txn.execute(&delete_bucket, &[&tenant_id, &name.as_str()])
            .await?;
    }
    let keys: Vec<_> = edit
        .closed_cycles
        .iter()
        .map(|(name, _)| BucketKey::new(tenant.clone(), name.clone()))
        .collect();
    budgets::insert_cycles(
        txn,
        keys.iter().zip(edit.closed_cycles.iter().map(|(_, r)| r)),
    )
    .await?;
    let retirements = edit.retirements(tenant, &loaded, change.close_reason(), by, now);
    let closed: Vec<ClosedBucket> = retirements.iter().map(|r| r.closed.clone()).collect();
    insert_closed(txn, &closed).await?;
    let revived = states::revive(txn, tenant).await?;
    Ok(Ok(TenantChangeOutcome::new(
        tenant,
        &loaded,
        edit,
        retirements,
        revived,
        now,
        inner.settings.bucket.inactivity_timeout,
    )))
}
