//! Hot-partition reports: one tenant's reports row, read and written
//! around `tollgate_core::tier::partition_load`.

use super::*;

/// One pod's partition-load exchange: the tenant's limits read, its
/// reports updated (removed once none is fresh); refused for a deleted or
/// suspended tenant.
pub(super) fn partition_load(
    txn: &WriteTransaction,
    tenant: &TenantId,
    exchange: &Exchange,
    now: Timestamp,
) -> Result<Result<ExchangeAnswer, StoreError>, StoreError> {
    let state = states::read_in(txn, [tenant])?.remove(tenant);
    let record = {
        let records = txn
            .open_table(TENANT_RECORDS)
            .map_err(storage("open tenant records"))?;
        read_record(&records, tenant)?
    };
    let tier = match record.as_ref().and_then(|r| r.tier.as_ref()) {
        Some(name) => read_tier(&txn.open_table(TIERS).map_err(storage("open tiers"))?, name)?,
        None => None,
    };
    let mut table = txn
        .open_table(PARTITION_REPORTS)
        .map_err(storage("open partition reports"))?;
    let mut reports: PartitionReports = table
        .get(tenant.as_str())
        .map_err(storage("read partition reports"))?
        .map(|row| decode("decode partition reports", row.value()))
        .transpose()?
        .unwrap_or_default();
    let had_reports = !reports.is_empty();
    let answer = match tier::partition_load(
        tenant,
        state.as_ref(),
        record.as_ref(),
        tier.as_ref(),
        &mut reports,
        exchange,
        now,
    ) {
        Ok(answer) => answer,
        Err(refused) => return Ok(Err(refused.into())),
    };
    if !reports.is_empty() {
        let bytes = encode("encode partition reports", &reports)?;
        table
            .insert(tenant.as_str(), bytes.as_slice())
            .map_err(storage("write partition reports"))?;
    } else if had_reports {
        table
            .remove(tenant.as_str())
            .map_err(storage("delete partition reports"))?;
    }
    Ok(Ok(answer))
}
