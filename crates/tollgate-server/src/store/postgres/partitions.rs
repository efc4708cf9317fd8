//! Hot-partition reports: one tenant's reports row, locked (made if
//! need be), read and written back around `tollgate_core::tier::partition_load`.

use super::*;

/// One pod's partition-load exchange: the tenant's reports row locked
/// (created if need be), its table limits read, the exchange run and
/// the row written back (or removed once no report is fresh).
pub(super) async fn partition_load(
    store: &PostgresStore,
    tenant: &TenantId,
    exchange: &Exchange,
) -> Result<ExchangeAnswer, StoreError> {
    let inner = &*store.inner;
    inner
        .run("partition load", false, || async move {
            let mut client = inner.pool.get().await?;
            let ensure = client.prepare_cached(sql::ENSURE_PARTITION_REPORTS).await?;
            let lock = client.prepare_cached(sql::LOCK_PARTITION_REPORTS).await?;
            let read_limits = client.prepare_cached(sql::READ_TABLE_LIMITS).await?;
            let clock = client.prepare_cached(sql::CLOCK).await?;
            let upsert = client.prepare_cached(sql::UPSERT_PARTITION_REPORTS).await?;
            let delete = client.prepare_cached(sql::DELETE_PARTITION_REPORTS).await?;
            let read_states = client.prepare_cached(sql::READ_TENANT_STATES).await?;
            let txn = client.transaction().await?;
            let tenant_id = tenant.as_str();
            let params: [&(dyn ToSql + Sync); 1] = [&tenant_id];
            let tenant_ids = [tenant_id];
            let tenants_param = tenant_ids.as_slice();
            let states_params: [&(dyn ToSql + Sync); 1] = [&tenants_param];
            // One round trip: the row made sure of and locked, then the
            // limits, the clock and the tenant's state, read under the
            // lock.
            let no_params: [&(dyn ToSql + Sync); 0] = [];
            let mut results = settle(
                join_all([
                    txn.query(&ensure, &params[..]),
                    txn.query(&lock, &params[..]),
                    txn.query(&read_limits, &params[..]),
                    txn.query(&clock, &no_params[..]),
                    txn.query(&read_states, &states_params[..]),
                ])
                .await,
            )?
            .into_iter()
            .skip(1);
            let locked = results.next().unwrap_or_default();
            let limits_rows = results.next().unwrap_or_default();
            let clock_rows = results.next().unwrap_or_default();
            let state = states::from_rows(&results.next().unwrap_or_default())?.remove(tenant);
            let mut reports: PartitionReports = match locked.first() {
                Some(row) => json_column(row, "reports")?,
                None => PartitionReports::default(),
            };
            let (record, tier) = match limits_rows.first() {
                Some(row) => {
                    let definition: Option<&str> = row
                        .try_get("definition")
                        .map_err(|e| StoreError::internal("read a stored row", e))?;
                    let tier: Option<Tier> = definition
                        .map(serde_json::from_str)
                        .transpose()
                        .map_err(|e| StoreError::internal("decode a stored document", e))?;
                    (record_of(row)?, tier)
                }
                None => (None, None),
            };
            let now = match clock_rows.first() {
                Some(row) => inner.now(rows::clock(row, "now")?),
                None => {
                    return Err(TxError::Store(StoreError::internal(
                        "read the clock",
                        "no row",
                    )));
                }
            };
            // Refused: the row ensure made is rolled back with the
            // transaction.
            let answer = tier::partition_load(
                tenant,
                state.as_ref(),
                record.as_ref(),
                tier.as_ref(),
                &mut reports,
                exchange,
                now,
            )
            .map_err(|e| TxError::Store(e.into()))?;
            if reports.is_empty() {
                txn.execute(&delete, &params).await?;
            } else {
                let json = to_json("encode partition reports", &reports)?;
                txn.execute(&upsert, &[&tenant_id, &json]).await?;
            }
            txn.commit().await.map_err(TxError::Commit)?;
            Ok(answer)
        })
        .await
}
