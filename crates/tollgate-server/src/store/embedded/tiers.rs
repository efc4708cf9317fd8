//! Tiers and tenant records: the rows a tier or tenant change loads and
//! writes, by the rules of `tollgate_core::tier`.

use super::*;

/// A tenant's record, if it has one.
pub(super) fn read_record(
    records: &impl ReadableTable<&'static str, &'static [u8]>,
    tenant: &TenantId,
) -> Result<Option<TenantRecord>, StoreError> {
    records
        .get(tenant.as_str())
        .map_err(storage("read tenant record"))?
        .map(|row| decode("decode tenant record", row.value()))
        .transpose()
}

pub(super) fn write_record(
    records: &mut redb::Table<'_, &'static str, &'static [u8]>,
    tenant: &TenantId,
    record: &TenantRecord,
) -> Result<(), StoreError> {
    let bytes = encode("encode tenant record", record)?;
    records
        .insert(tenant.as_str(), bytes.as_slice())
        .map_err(storage("write tenant record"))?;
    Ok(())
}

/// Every tier, in name order.
pub(super) fn read_tiers(
    tiers: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Vec<(TierName, Tier)>, StoreError> {
    let mut out = Vec::new();
    for entry in tiers.iter().map_err(storage("list tiers"))? {
        let (name, bytes) = entry.map_err(storage("list tiers"))?;
        let name = TierName::parse("tier", name.value())
            .map_err(|e| StoreError::internal("decode tier name", e))?;
        out.push((name, decode("decode tier", bytes.value())?));
    }
    Ok(out)
}

/// Everything a tenant change reads, under the writer's transaction.
pub(super) fn load_tenant(
    txn: &WriteTransaction,
    tenant: &TenantId,
    change: &TenantChange,
) -> Result<LoadedTenant, StoreError> {
    let records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    let record = read_record(&records, tenant)?;
    let tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
    let tier = match change.tier_to_load(record.as_ref()) {
        Some(name) => read_tier(&tiers, &name)?,
        None => None,
    };
    let previous_tier = match change.previous_tier_to_load(record.as_ref()) {
        Some(name) => read_tier(&tiers, &name)?,
        None => None,
    };
    let buckets_table = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
    let buckets = tenant_heads(&buckets_table, tenant)?
        .into_iter()
        .map(|(key, head)| (key.bucket, head))
        .collect();
    Ok(LoadedTenant {
        record,
        buckets,
        tier,
        previous_tier,
        request_units: None,
    })
}

/// Runs one tenant change: load, decide by the core's rules, write.
pub(super) fn change_one(
    txn: &WriteTransaction,
    tenant: &TenantId,
    change: &TenantChange,
    by: &ClosedBy,
    now: Timestamp,
    settings: &BucketSettings,
) -> Result<Result<TenantChangeOutcome, StoreError>, StoreError> {
    if !change.recreates() {
        let state = states::read_in(txn, [tenant])?.remove(tenant);
        if let Err(refused) = tollgate_core::tenant_state::refuse_deleted(tenant, state.as_ref()) {
            return Ok(Err(refused.into()));
        }
    }
    let mut loaded = load_tenant(txn, tenant, change)?;
    loaded.request_units = settings.unconfigured_tenants.defaults();
    let edit = match tier::change_tenant(tenant, change, &loaded, now) {
        Ok(edit) => edit,
        Err(e) => return Ok(Err(e.into())),
    };
    let mut records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    write_record(&mut records, tenant, &edit.record)?;
    let mut buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
    let mut instances = txn
        .open_table(INSTANCES)
        .map_err(storage("open instances"))?;
    let key = |name: &BucketName| BucketKey::new(tenant.clone(), name.clone());
    for (name, head) in &edit.created {
        delete_instances(&mut instances, &key(name))?;
        write_head(&mut buckets, &key(name), head)?;
    }
    for (name, head) in &edit.changed {
        write_head(&mut buckets, &key(name), head)?;
    }
    for (name, record) in &edit.closed_cycles {
        budgets::keep(txn, &key(name), std::slice::from_ref(record), &[])?;
    }
    let retirements = edit.retirements(tenant, &loaded, change.close_reason(), by, now);
    for name in &edit.retired {
        if loaded.buckets.contains_key(name) {
            buckets
                .remove((tenant.as_str(), name.as_str()))
                .map_err(storage("delete bucket row"))?;
            delete_instances(&mut instances, &key(name))?;
        }
    }
    let closed: Vec<ClosedBucket> = retirements.iter().map(|r| r.closed.clone()).collect();
    write_closed(txn, &closed)?;
    let revived = states::revive(txn, tenant)?;
    Ok(Ok(TenantChangeOutcome::new(
        tenant,
        &loaded,
        edit,
        retirements,
        revived,
        now,
        settings.bucket.inactivity_timeout,
    )))
}

pub(super) fn read_tier(
    tiers: &impl ReadableTable<&'static str, &'static [u8]>,
    name: &TierName,
) -> Result<Option<Tier>, StoreError> {
    tiers
        .get(name.as_str())
        .map_err(storage("read tier"))?
        .map(|row| decode("decode tier", row.value()))
        .transpose()
}

/// The tenants whose record names `tier`, in id order.
pub(super) fn tenants_on(
    records: &impl ReadableTable<&'static str, &'static [u8]>,
    tier: &TierName,
) -> Result<Vec<TenantId>, StoreError> {
    let mut tenants = Vec::new();
    for entry in records.iter().map_err(storage("read tenant records"))? {
        let (id, bytes) = entry.map_err(storage("read tenant records"))?;
        let record: TenantRecord = decode("decode tenant record", bytes.value())?;
        if record.tier.as_ref() == Some(tier) {
            tenants.push(tenant_id(id.value())?);
        }
    }
    Ok(tenants)
}

pub(super) fn put_tier(
    txn: &WriteTransaction,
    name: &TierName,
    tier: &Tier,
    by: &ClosedBy,
    now: Timestamp,
    settings: &BucketSettings,
) -> Result<Result<PutTierOutcome, StoreError>, StoreError> {
    if let Err(refused) = tier::may_put_tier(name, tier, settings.unconfigured_tenants.defaults()) {
        return Ok(Err(refused.into()));
    }
    let mut tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
    let before = read_tier(&tiers, name)?;
    let stored = tier::stamp_tier(tier, before.as_ref(), now);
    let bytes = encode("encode tier", &stored)?;
    tiers
        .insert(name.as_str(), bytes.as_slice())
        .map_err(storage("write tier"))?;
    drop(tiers);
    let records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    let on_tier = tenants_on(&records, name)?;
    drop(records);
    let mut tenants = Vec::new();
    let reapply = TenantChange::Reapply {
        previous: before.clone(),
    };
    for tenant in on_tier {
        match change_one(txn, &tenant, &reapply, by, now, settings)? {
            Ok(outcome) => {
                if !outcome.is_unchanged() {
                    tenants.push(outcome);
                }
            }
            // A tenant with a record is never refused a re-application;
            // should one be, fail the whole write batch, so that no part of
            // the tier's change (written in this transaction) is kept.
            Err(e) => return Err(StoreError::internal("re-apply a tier", e.to_string())),
        }
    }
    Ok(Ok(PutTierOutcome {
        tier: stored,
        created: before.is_none(),
        tenants,
    }))
}

pub(super) fn delete_tier(
    txn: &WriteTransaction,
    name: &TierName,
) -> Result<Result<(), StoreError>, StoreError> {
    let mut tiers = txn.open_table(TIERS).map_err(storage("open tiers"))?;
    let exists = read_tier(&tiers, name)?.is_some();
    let records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    let on_tier = tenants_on(&records, name)?;
    if let Err(e) = tier::may_delete_tier(name, exists, on_tier.len() as u64, on_tier) {
        return Ok(Err(e.into()));
    }
    tiers
        .remove(name.as_str())
        .map_err(storage("delete tier"))?;
    Ok(Ok(()))
}
