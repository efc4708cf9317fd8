//! Token buckets' rows: head and instance rows read and written for the
//! transaction script of `tollgate_core::transaction`, operators' limits,
//! a tenant's deletion and the closed records that outlive its buckets.

use super::*;

/// Writes back what a transaction script changed, the closed budget
/// cycles and crossed thresholds with it.
pub(super) fn write_back(
    txn: &WriteTransaction,
    buckets: &mut BucketsTable<'_>,
    instances: &mut InstancesTable<'_>,
    batch: &Batch,
) -> Result<(), StoreError> {
    for write in batch.writes() {
        budgets::keep(txn, write.key, write.closed_cycles, write.budget_events)?;
        let (t, b) = (write.key.tenant.as_str(), write.key.bucket.as_str());
        if write.insert {
            delete_instances(instances, write.key)?;
        }
        write_head(buckets, write.key, write.head)?;
        for row in &write.upsert {
            let bytes = encode("encode instance row", row)?;
            instances
                .insert((t, b, row.instance_id), bytes.as_slice())
                .map_err(storage("write instance row"))?;
        }
        for id in &write.delete {
            instances
                .remove((t, b, *id))
                .map_err(storage("delete instance row"))?;
        }
    }
    Ok(())
}

/// A tenant's buckets' head rows, in key order, read in one range scan.
pub(super) fn tenant_heads(
    buckets: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    tenant: &TenantId,
) -> Result<Vec<(BucketKey, BucketRow)>, StoreError> {
    let t = tenant.as_str();
    let mut heads = Vec::new();
    for entry in buckets
        .range((t, "")..)
        .map_err(storage("read bucket rows"))?
    {
        let (key, value) = entry.map_err(storage("read bucket rows"))?;
        let (row_tenant, bucket) = key.value();
        if row_tenant != t {
            break;
        }
        heads.push((
            BucketKey::new(tenant.clone(), bucket_name(bucket)?),
            decode("decode bucket row", value.value())?,
        ));
    }
    Ok(heads)
}

/// A head row as a snapshot without instances.
pub(super) fn head_snapshot(
    (key, head): (BucketKey, BucketRow),
    now: Timestamp,
    inactivity_timeout: Duration,
) -> BucketSnapshot {
    BucketSnapshot {
        key,
        head,
        instances: Vec::new(),
        read_at: now,
        inactivity_timeout,
    }
}

/// Deletes every instance row of a bucket.
pub(super) fn delete_instances(
    instances: &mut InstancesTable<'_>,
    key: &BucketKey,
) -> Result<(), StoreError> {
    let (t, b) = (key.tenant.as_str(), key.bucket.as_str());
    instances
        .retain_in((t, b, 0)..=(t, b, u32::MAX), |_, _| false)
        .map_err(storage("delete instance rows"))
}

pub(super) fn delete(
    txn: &WriteTransaction,
    tenant: &TenantId,
    by: &ClosedBy,
    now: Timestamp,
    inactivity_timeout: Duration,
) -> Result<Result<DeletedTenant, StoreError>, StoreError> {
    let mut buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
    let mut instances = txn
        .open_table(INSTANCES)
        .map_err(storage("open instances"))?;
    let mut records = txn
        .open_table(TENANT_RECORDS)
        .map_err(storage("open tenant records"))?;
    let had_record = records
        .remove(tenant.as_str())
        .map_err(storage("delete tenant record"))?
        .is_some();
    let heads = tenant_heads(&buckets, tenant)?;
    let delete = StateChange::Delete {
        actor: by.to_string(),
    };
    match states::change_of(txn, tenant, !heads.is_empty() || had_record, &delete, now)? {
        Ok(_) => {}
        Err(e) => return Ok(Err(e)),
    }
    keys::delete_tenant(txn, tenant)?;
    txn.open_table(PARTITION_REPORTS)
        .map_err(storage("open partition reports"))?
        .remove(tenant.as_str())
        .map_err(storage("delete partition reports"))?;
    let mut closed = Vec::with_capacity(heads.len());
    for (key, head) in &heads {
        buckets
            .remove((key.tenant.as_str(), key.bucket.as_str()))
            .map_err(storage("delete bucket row"))?;
        delete_instances(&mut instances, key)?;
        budgets::keep(txn, key, &tier::closed_cycles(head, now), &[])?;
        closed.push(tier::close_bucket(
            key,
            head,
            CloseReason::TenantDeleted,
            by,
            now,
        ));
    }
    write_closed(txn, &closed)?;
    Ok(Ok(DeletedTenant {
        buckets: heads
            .into_iter()
            .map(|head| head_snapshot(head, now, inactivity_timeout))
            .collect(),
        closed,
    }))
}

/// Appends closed records, each numbered after its tenant's last.
pub(super) fn write_closed(
    txn: &WriteTransaction,
    closed: &[ClosedBucket],
) -> Result<(), StoreError> {
    let mut table = txn
        .open_table(CLOSED_BUCKETS)
        .map_err(storage("open closed buckets"))?;
    for record in closed {
        let t = record.tenant.as_str();
        let last = table
            .range((t, 0)..=(t, u64::MAX))
            .map_err(storage("read closed buckets"))?
            .next_back()
            .transpose()
            .map_err(storage("read closed buckets"))?
            .map_or(0, |(key, _)| key.value().1);
        let bytes = encode("encode closed bucket", record)?;
        table
            .insert((t, last + 1), bytes.as_slice())
            .map_err(storage("write closed bucket"))?;
    }
    Ok(())
}

/// A tenant's closed records numbered above `after`, at most `limit`.
pub(super) fn read_closed(
    table: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
    tenant: &TenantId,
    after: u64,
    limit: usize,
) -> Result<Vec<ClosedEntry>, StoreError> {
    let t = tenant.as_str();
    let Some(from) = after.checked_add(1) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for entry in table
        .range((t, from)..=(t, u64::MAX))
        .map_err(storage("read closed buckets"))?
        .take(limit)
    {
        let (key, bytes) = entry.map_err(storage("read closed buckets"))?;
        out.push(ClosedEntry {
            seq: key.value().1,
            closed: decode("decode closed bucket", bytes.value())?,
        });
    }
    Ok(out)
}

pub(super) fn read_head(
    buckets: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    key: &BucketKey,
) -> Result<Option<BucketRow>, StoreError> {
    buckets
        .get((key.tenant.as_str(), key.bucket.as_str()))
        .map_err(storage("read bucket row"))?
        .map(|row| decode("decode bucket row", row.value()))
        .transpose()
}

pub(super) fn write_head(
    buckets: &mut BucketsTable<'_>,
    key: &BucketKey,
    head: &BucketRow,
) -> Result<(), StoreError> {
    let bytes = encode("encode bucket row", head)?;
    buckets
        .insert((key.tenant.as_str(), key.bucket.as_str()), bytes.as_slice())
        .map_err(storage("write bucket row"))?;
    Ok(())
}

/// The instance rows of one run of a request's window.
pub(super) fn read_range(
    instances: &impl ReadableTable<(&'static str, &'static str, u32), &'static [u8]>,
    key: &BucketKey,
    range: IdRange,
) -> Result<Vec<InstanceState>, StoreError> {
    if range.is_empty() {
        return Ok(Vec::new());
    }
    let (t, b) = (key.tenant.as_str(), key.bucket.as_str());
    let entries = instances
        .range((t, b, range.first)..=(t, b, range.last))
        .map_err(storage("read instance rows"))?;
    let decode_row = |entry: Result<_, redb::StorageError>| -> Result<InstanceState, StoreError> {
        let (_, value): (_, redb::AccessGuard<'_, &[u8]>) =
            entry.map_err(storage("read instance rows"))?;
        decode("decode instance row", value.value())
    };
    if range.descending {
        entries.rev().take(range.limit).map(decode_row).collect()
    } else {
        entries.take(range.limit).map(decode_row).collect()
    }
}

pub(super) fn read_all_instances(
    instances: &impl ReadableTable<(&'static str, &'static str, u32), &'static [u8]>,
    key: &BucketKey,
) -> Result<Vec<InstanceState>, StoreError> {
    let (t, b) = (key.tenant.as_str(), key.bucket.as_str());
    let mut rows = Vec::new();
    for entry in instances
        .range((t, b, 0)..=(t, b, u32::MAX))
        .map_err(storage("read instance rows"))?
    {
        let (_, value) = entry.map_err(storage("read instance rows"))?;
        rows.push(decode("decode instance row", value.value())?);
    }
    Ok(rows)
}

impl Writer {
    /// One request, by the script of `tollgate_core::transaction`.
    pub(super) fn token_bucket(
        &self,
        txn: &WriteTransaction,
        key: &BucketKey,
        request: &TokenBucketRequest,
        now: Timestamp,
    ) -> Result<Result<Served, StoreError>, StoreError> {
        let mut buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
        let mut instances = txn
            .open_table(INSTANCES)
            .map_err(storage("open instances"))?;
        let plan = Batch::plan(
            [(key, request.instance_id)],
            self.settings.bucket.cleanup_window,
        );
        let heads = read_head(&buckets, key)?
            .map(|head| (key.clone(), head))
            .into_iter()
            .collect();
        let tenant_states = states::read_in(txn, plan.tenants())?;
        let mut batch = Batch::open(
            plan.lock.iter().cloned(),
            heads,
            &tenant_states,
            &self.settings.unconfigured_tenants,
            now,
        );
        for window in &plan.windows {
            for range in window.ranges() {
                batch.load(key, read_range(&instances, key, range)?);
            }
        }
        let config = &self.settings.bucket;
        batch.join_tree(&super::tree::read_in(txn, plan.tenants())?);
        loop {
            let parents = batch.parents_due(now, config);
            if parents.is_empty() {
                break;
            }
            let mut heads = BTreeMap::new();
            for parent in &parents.lock {
                if let Some(head) = read_head(&buckets, parent)? {
                    heads.insert(parent.clone(), head);
                }
            }
            let states = states::read_in(txn, parents.tenants())?;
            let nodes = super::tree::read_in(txn, parents.tenants())?;
            // One writer: no organisation row is ever held by another.
            let busy = std::collections::BTreeSet::new();
            batch.open_parents(parents.lock.iter().cloned(), heads, &busy, &states, &nodes);
            for (parent, window) in &parents.windows {
                for range in window.ranges() {
                    batch.load(parent, read_range(&instances, parent, range)?);
                }
            }
        }
        batch.draw([(key, request.requested_tokens)], now, config);
        let answer = batch.serve(key, request, now, config);
        write_back(txn, &mut buckets, &mut instances, &batch)?;
        Ok(match answer {
            Answer::Granted(grant) => Ok(Served { grant, batch, now }),
            Answer::Refused(e) => Err(e.into()),
            Answer::NotFound => Err(StoreError::not_found(key)),
            Answer::TenantRefused(e) => Err(e.into()),
            Answer::Deferred => Err(StoreError::internal(
                "token bucket request",
                "a lone request was deferred",
            )),
        })
    }

    pub(super) fn update_limits(
        &self,
        txn: &WriteTransaction,
        key: &BucketKey,
        update: &LimitsUpdate,
        now: Timestamp,
    ) -> Result<Result<LimitsChange, StoreError>, StoreError> {
        let mut buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
        let before = read_head(&buckets, key)?;
        let head = match global_bucket::configure(before.as_ref(), update, now) {
            Ok(head) => head,
            Err(e) => return Ok(Err(e.into())),
        };
        write_head(&mut buckets, key, &head)?;
        let revived = states::revive(txn, &key.tenant)?;
        let instances = txn
            .open_table(INSTANCES)
            .map_err(storage("open instances"))?;
        Ok(Ok(LimitsChange {
            revived,
            before,
            after: BucketSnapshot {
                key: key.clone(),
                head,
                instances: read_all_instances(&instances, key)?,
                read_at: now,
                inactivity_timeout: self.inactivity_timeout(),
            },
        }))
    }
}
