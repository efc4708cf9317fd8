//! Opening a file: its tables made, and older schema versions converted
//! in one transaction with the version change (see the store's module
//! docs for the versions).

use super::*;

pub(super) fn init_schema(db: &Database) -> Result<(), StoreError> {
    let txn = db
        .begin_write()
        .map_err(storage("begin schema transaction"))?;
    {
        let mut meta = txn.open_table(META).map_err(storage("open meta table"))?;
        let found = meta
            .get("schema_version")
            .map_err(storage("read schema version"))?
            .map(|v| v.value());
        match found {
            None | Some(SCHEMA_VERSION) => {}
            // Versions 3 → 4 → 5 only add tables (closed buckets, tenant
            // states), made below; 5 → 6 sums what each bucket's pods hold.
            Some(from @ (1..=5)) => {
                if from == 1 {
                    migrate_v1_totals(&txn)?;
                }
                if from <= 2 {
                    migrate_v2_keys(&txn)?;
                }
                migrate_v5_held_reported(&txn)?;
                tracing::info!(
                    from,
                    to = SCHEMA_VERSION,
                    "migrated the embedded store's schema"
                );
            }
            Some(other) => {
                return Err(StoreError::internal(
                    "check schema version",
                    format!(
                        "store file has schema version {other}; this server understands {SCHEMA_VERSION}"
                    ),
                ));
            }
        }
        meta.insert("schema_version", SCHEMA_VERSION)
            .map_err(storage("write schema version"))?;
        txn.open_table(BUCKETS)
            .map_err(storage("create buckets table"))?;
        txn.open_table(INSTANCES)
            .map_err(storage("create instances table"))?;
        txn.open_table(TIERS)
            .map_err(storage("create tiers table"))?;
        txn.open_table(TENANT_RECORDS)
            .map_err(storage("create tenant records table"))?;
        txn.open_table(CLOSED_BUCKETS)
            .map_err(storage("create closed buckets table"))?;
        txn.open_table(PARTITION_REPORTS)
            .map_err(storage("create partition reports table"))?;
        txn.open_table(states::TENANT_STATES)
            .map_err(storage("create tenant states table"))?;
        txn.open_table(tree::NODES)
            .map_err(storage("create organisation nodes table"))?;
        txn.open_table(keys::KEYS)
            .map_err(storage("create keys table"))?;
        txn.open_table(keys::KEY_REQUESTS)
            .map_err(storage("create key requests table"))?;
        txn.open_table(budgets::BUDGET_CYCLES)
            .map_err(storage("create budget cycles table"))?;
        txn.open_table(budgets::BUDGET_EVENTS)
            .map_err(storage("create budget events table"))?;
        txn.open_table(history::HISTORY)
            .map_err(storage("create history table"))?;
        txn.open_table(history::CHECK_HISTORY)
            .map_err(storage("create check history table"))?;
    }
    txn.commit().map_err(storage("commit schema"))
}

/// Schema 1 → 2: the consumption totals `request_units` and `cpu_seconds`
/// (floating point) become `request_unit_micros` and `cpu_micros`
/// (integers), rounded to the nearest micro-unit.
pub(super) fn migrate_v1_totals(txn: &WriteTransaction) -> Result<(), StoreError> {
    let mut tenants = txn
        .open_table(V2_TENANTS)
        .map_err(storage("open tenants"))?;
    let mut rows = Vec::new();
    for entry in tenants.iter().map_err(storage("read tenants"))? {
        let (id, bytes) = entry.map_err(storage("read a tenant row"))?;
        let mut row: serde_json::Value = decode("decode a version 1 tenant row", bytes.value())?;
        if let Some(consumption) = row
            .get_mut("consumption")
            .and_then(serde_json::Value::as_object_mut)
        {
            for (old, new) in [
                ("request_units", "request_unit_micros"),
                ("cpu_seconds", "cpu_micros"),
            ] {
                let units = consumption
                    .remove(old)
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.0);
                let micros = tollgate_core::validate::to_micros(units)
                    .min(tollgate_core::validate::MAX_TOTAL);
                consumption.insert(new.to_owned(), micros.into());
            }
        }
        rows.push((id.value().to_owned(), encode("encode a tenant row", &row)?));
    }
    for (id, bytes) in rows {
        tenants
            .insert(id.as_str(), bytes.as_slice())
            .map_err(storage("write a tenant row"))?;
    }
    Ok(())
}

/// Schema 2 → 3: a tenant's one bucket, keyed by tenant id, becomes its
/// request-unit bucket, keyed by (tenant id, ""). The rows' contents are
/// unchanged; the old tables are dropped.
pub(super) fn migrate_v2_keys(txn: &WriteTransaction) -> Result<(), StoreError> {
    let ru = BucketName::REQUEST_UNITS;
    {
        let old = txn
            .open_table(V2_TENANTS)
            .map_err(storage("open tenants"))?;
        let mut new = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
        for entry in old.iter().map_err(storage("read tenants"))? {
            let (id, bytes) = entry.map_err(storage("read a tenant row"))?;
            new.insert((id.value(), ru.as_str()), bytes.value())
                .map_err(storage("write a bucket row"))?;
        }
        let old = txn
            .open_table(V2_INSTANCES)
            .map_err(storage("open instances"))?;
        let mut new = txn
            .open_table(INSTANCES)
            .map_err(storage("open bucket instances"))?;
        for entry in old.iter().map_err(storage("read instances"))? {
            let (key, bytes) = entry.map_err(storage("read an instance row"))?;
            let (tenant, id) = key.value();
            new.insert((tenant, ru.as_str(), id), bytes.value())
                .map_err(storage("write an instance row"))?;
        }
    }
    txn.delete_table(V2_TENANTS)
        .map_err(storage("drop the version 2 tenants table"))?;
    txn.delete_table(V2_INSTANCES)
        .map_err(storage("drop the version 2 instances table"))?;
    Ok(())
}

/// Schema 5 → 6: each head row gets `held_reported`, the sum of its
/// instances' `held_tokens` (a file without it read every sum as 0).
pub(super) fn migrate_v5_held_reported(txn: &WriteTransaction) -> Result<(), StoreError> {
    let mut sums = std::collections::BTreeMap::<(String, String), f64>::new();
    {
        let instances = txn
            .open_table(INSTANCES)
            .map_err(storage("open bucket instances"))?;
        for entry in instances.iter().map_err(storage("read instances"))? {
            let (key, bytes) = entry.map_err(storage("read an instance row"))?;
            let (tenant, bucket, _) = key.value();
            let instance: InstanceState = decode("decode an instance row", bytes.value())?;
            *sums
                .entry((tenant.to_owned(), bucket.to_owned()))
                .or_default() += instance.held_tokens;
        }
    }
    let mut buckets = txn.open_table(BUCKETS).map_err(storage("open buckets"))?;
    for ((tenant, bucket), held) in sums {
        let bytes = match buckets
            .get((tenant.as_str(), bucket.as_str()))
            .map_err(storage("read a bucket row"))?
        {
            Some(bytes) => bytes.value().to_vec(),
            None => continue,
        };
        let mut head: BucketRow = decode("decode a bucket row", &bytes)?;
        head.state.held_reported = held;
        let bytes = encode("encode a bucket row", &head)?;
        buckets
            .insert((tenant.as_str(), bucket.as_str()), bytes.as_slice())
            .map_err(storage("write a bucket row"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store file as a schema 1 or 2 server left it.
    fn write_old_file(
        path: &Path,
        version: u64,
        tenants: &[(&str, serde_json::Value)],
        instances: &[(&str, u32, serde_json::Value)],
    ) {
        let db = Database::create(path).expect("create");
        let txn = db.begin_write().expect("write");
        {
            let mut meta = txn.open_table(META).expect("meta");
            meta.insert("schema_version", version).expect("version");
            let mut table = txn.open_table(V2_TENANTS).expect("tenants");
            for (id, row) in tenants {
                let bytes = serde_json::to_vec(row).expect("encode");
                table.insert(*id, bytes.as_slice()).expect("row");
            }
            let mut table = txn.open_table(V2_INSTANCES).expect("instances");
            for (id, instance, row) in instances {
                let bytes = serde_json::to_vec(row).expect("encode");
                table
                    .insert((*id, *instance), bytes.as_slice())
                    .expect("row");
            }
        }
        txn.commit().expect("commit");
    }

    fn tenant_row() -> BucketRow {
        let mut head = BucketRow::new(
            tollgate_core::Limits {
                refill_rate: 5.0,
                burst_limit: 50.0,
            },
            20.0,
            true,
            Timestamp::from_unix_micros(1_700_000_000_000_000),
        );
        head.totals.consumption.read_bytes = 4096;
        head.members.live_instances = 1;
        head.members.first_instance_id = 4;
        head
    }

    fn instance_row() -> InstanceState {
        InstanceState {
            instance_id: 4,
            next_instance_id: 0,
            lease: b"lease".to_vec(),
            seq: 9,
            shares: 1.0,
            last_update: Timestamp::from_unix_micros(1_700_000_000_000_000),
            guaranteed: 0.0,
            last_grant: Grant {
                granted_tokens: 7.5,
                ..Grant::default()
            },
            committed_rate: 0.0,
            committed_until: Timestamp::from_unix_micros(1_700_000_000_000_000),
            held_tokens: 0.0,
            held_use_rate: 0.0,
        }
    }

    /// A file written by schema version 1 (floating-point totals, one
    /// bucket per tenant) opens with its totals converted to micro-units
    /// and each tenant's rows as its request-unit bucket, nothing else
    /// changed.
    #[tokio::test]
    async fn a_version_1_file_is_migrated_to_exact_totals_and_bucket_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v1.redb");
        let head = tenant_row();
        let mut v1 = serde_json::to_value(&head).expect("JSON");
        let consumption = v1["consumption"].as_object_mut().expect("consumption");
        consumption.remove("request_unit_micros");
        consumption.remove("cpu_micros");
        consumption.insert("request_units".into(), 199.99999999999292.into());
        consumption.insert("cpu_seconds".into(), 0.25.into());
        let instance = serde_json::to_value(instance_row()).expect("JSON");
        write_old_file(&path, 1, &[("old", v1)], &[("old", 4, instance)]);

        let store = EmbeddedStore::open(&path, BucketSettings::default()).expect("open");
        let tenant = TenantId::parse("tenant_id", "old").expect("id");
        let buckets = store.get_tenant(&tenant).await.expect("tenant");
        assert_eq!(buckets.len(), 1);
        let migrated = &buckets[0];
        assert_eq!(migrated.key, BucketKey::request_units(tenant.clone()));
        let totals = &migrated.head.totals.consumption;
        assert_eq!(totals.request_unit_micros, 200_000_000);
        assert_eq!(totals.cpu_micros, 250_000);
        assert_eq!(totals.read_bytes, 4096);
        assert_eq!(migrated.head.state, head.state);
        assert_eq!(migrated.instances, vec![instance_row()]);
        store.close().await.expect("close");
        drop(store);
        // Opening again finds the current version and changes nothing.
        let store = EmbeddedStore::open(&path, BucketSettings::default()).expect("reopen");
        let again = store.get_tenant(&tenant).await.expect("tenant");
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].head, migrated.head);
        assert_eq!(again[0].instances, migrated.instances);
        store.close().await.expect("close");
    }

    /// A file written by schema version 3 (no closed buckets) opens as
    /// version 4: its buckets as they were, and deleting a tenant keeps
    /// their closed records.
    #[tokio::test]
    async fn a_version_3_file_gets_closed_buckets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v3.redb");
        {
            let db = Database::create(&path).expect("create");
            let txn = db.begin_write().expect("write");
            {
                let mut meta = txn.open_table(META).expect("meta");
                meta.insert("schema_version", 3).expect("version");
                let mut buckets = txn.open_table(BUCKETS).expect("buckets");
                let bytes = serde_json::to_vec(&tenant_row()).expect("encode");
                buckets
                    .insert(("old", "export"), bytes.as_slice())
                    .expect("row");
            }
            txn.commit().expect("commit");
        }
        let store = EmbeddedStore::open(&path, BucketSettings::default()).expect("open");
        let tenant = TenantId::parse("tenant_id", "old").expect("id");
        let deleted = store.delete_tenant(&tenant).await.expect("delete");
        assert_eq!(deleted.len(), 1);
        let closed = store.list_closed(&tenant, 0, 10).await.expect("closed");
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].closed.totals, tenant_row().totals);
        assert_eq!(closed[0].closed.reason, CloseReason::TenantDeleted);
        store.close().await.expect("close");
        drop(store);
        let db = Database::create(&path).expect("reopen");
        let txn = db.begin_read().expect("read");
        let meta = txn.open_table(META).expect("meta");
        let version = meta.get("schema_version").expect("read").map(|v| v.value());
        assert_eq!(version, Some(SCHEMA_VERSION));
    }

    /// A file written by schema version 5 opens with each head row's
    /// `held_reported` the sum of what its instances hold.
    #[tokio::test]
    async fn a_version_5_file_gets_the_sums_of_what_pods_hold() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v5.redb");
        let mut head = tenant_row();
        head.state.held_tokens = 30.0;
        head.state.held_use_rate = 2.0;
        {
            let db = Database::create(&path).expect("create");
            let txn = db.begin_write().expect("write");
            {
                let mut meta = txn.open_table(META).expect("meta");
                meta.insert("schema_version", 5).expect("version");
                let mut buckets = txn.open_table(BUCKETS).expect("buckets");
                let mut v5 = serde_json::to_value(&head).expect("JSON");
                let fields = v5.as_object_mut().expect("a flat row");
                assert!(fields.remove("held_reported").is_some());
                let bytes = serde_json::to_vec(&v5).expect("encode");
                buckets.insert(("old", ""), bytes.as_slice()).expect("row");
                let mut instances = txn.open_table(INSTANCES).expect("instances");
                for (id, held) in [(4, 20.0), (7, 22.5)] {
                    let instance = InstanceState {
                        instance_id: id,
                        held_tokens: held,
                        held_use_rate: 1.0,
                        ..instance_row()
                    };
                    let bytes = serde_json::to_vec(&instance).expect("encode");
                    instances
                        .insert(("old", "", id), bytes.as_slice())
                        .expect("row");
                }
            }
            txn.commit().expect("commit");
        }
        let store = EmbeddedStore::open(&path, BucketSettings::default()).expect("open");
        store.close().await.expect("close");
        drop(store);
        let db = Database::create(&path).expect("reopen");
        let txn = db.begin_read().expect("read");
        let buckets = txn.open_table(BUCKETS).expect("buckets");
        let bytes = buckets.get(("old", "")).expect("read").expect("the row");
        let migrated: BucketRow = serde_json::from_slice(bytes.value()).expect("decode");
        assert_eq!(migrated.state.held_reported, 42.5);
        assert_eq!(migrated.state.held_tokens, 30.0, "the rest as it was");
        let meta = txn.open_table(META).expect("meta");
        let version = meta.get("schema_version").expect("read").map(|v| v.value());
        assert_eq!(version, Some(SCHEMA_VERSION));
    }

    /// A file written by schema version 2 serves on: a pod's retry of its
    /// last request gets the recorded answer and counts nothing again.
    #[tokio::test]
    async fn a_version_2_file_keeps_its_pods_and_their_idempotency() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v2.redb");
        let head = serde_json::to_value(tenant_row()).expect("JSON");
        let instance = serde_json::to_value(instance_row()).expect("JSON");
        write_old_file(&path, 2, &[("old", head)], &[("old", 4, instance)]);
        let store = EmbeddedStore::open(&path, BucketSettings::default()).expect("open");
        let key = BucketKey::request_units(TenantId::parse("tenant_id", "old").expect("id"));
        let retry = TokenBucketRequest {
            instance_id: 4,
            lease: b"lease".to_vec(),
            seq: 9,
            requested_tokens: 1000.0,
            shares: 1.0,
            target_request_period: std::time::Duration::from_secs(10),
            consumption: tollgate_core::Consumption::from_request_units(5.0),
            next_live_instance_id: None,
            returned_tokens: 0.0,
            held_tokens: 0.0,
            fallback_tokens: 0.0,
            fallback_duration: std::time::Duration::ZERO,
        };
        let grant = store.token_bucket(&key, &retry).await.expect("retry");
        assert_eq!(grant.granted_tokens, 7.5);
        let bucket = store.get_bucket(&key).await.expect("bucket");
        assert_eq!(bucket.head.totals.consumption.request_unit_micros, 0);
        store.close().await.expect("close");
    }
}
