//! Conversions between `tenant_usage` rows and the core's state.
//!
//! Columns are read by name, so a query may return them in any order (the
//! queries select `*`). Every value the core keeps round-trips exactly:
//! FLOAT8 is an IEEE double, TIMESTAMPTZ has the core's microsecond
//! resolution, grant durations are kept in nanoseconds, and consumption
//! totals are BIGINT counters (request units and CPU in micro-units), which
//! the core keeps within the BIGINT range.

use std::time::{Duration, SystemTime};

use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, ToSql};
use tollgate_core::global_bucket::{BucketState, Membership, Totals};
use tollgate_core::{
    BucketKey, BucketName, BucketRow, Consumption, Grant, InstanceState, Limits, TenantId,
    Timestamp,
};

use crate::store::StoreError;

/// A core timestamp as PostgreSQL's TIMESTAMPTZ.
pub(super) fn to_system_time(t: Timestamp) -> SystemTime {
    let micros = t.unix_micros();
    let magnitude = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        SystemTime::UNIX_EPOCH + magnitude
    } else {
        SystemTime::UNIX_EPOCH - magnitude
    }
}

/// A TIMESTAMPTZ as a core timestamp.
pub(super) fn from_system_time(t: SystemTime) -> Timestamp {
    let micros = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_micros()).map_or(i64::MIN, |m| -m),
    };
    Timestamp::from_unix_micros(micros)
}

fn get<'a, T: FromSql<'a>>(row: &'a Row, column: &'static str) -> Result<T, StoreError> {
    row.try_get(column)
        .map_err(|e| StoreError::internal("read a stored row", e))
}

/// A BIGINT column as the narrower or unsigned type the core keeps it in.
fn bigint<T: TryFrom<i64>>(row: &Row, column: &'static str) -> Result<T, StoreError> {
    let value: i64 = get(row, column)?;
    T::try_from(value).map_err(|_| {
        StoreError::internal(
            "read a stored row",
            format!(
                "{column} is out of range for a {} ({value})",
                std::any::type_name::<T>()
            ),
        )
    })
}

fn counter(row: &Row, column: &'static str) -> Result<u64, StoreError> {
    bigint(row, column)
}

fn instance_id(row: &Row, column: &'static str) -> Result<u32, StoreError> {
    bigint(row, column)
}

fn timestamp(row: &Row, column: &'static str) -> Result<Timestamp, StoreError> {
    Ok(from_system_time(get(row, column)?))
}

/// The row's instance id (0 for a head row).
pub(super) fn row_instance_id(row: &Row) -> Result<u32, StoreError> {
    instance_id(row, "instance_id")
}

/// The row's tenant id.
pub(super) fn tenant_id(row: &Row) -> Result<TenantId, StoreError> {
    let tenant: &str = get(row, "tenant_id")?;
    TenantId::parse("tenant_id", tenant).map_err(|e| StoreError::internal("read tenant_id", e))
}

/// The row's bucket key.
pub(super) fn bucket_key(row: &Row) -> Result<BucketKey, StoreError> {
    let tenant: &str = get(row, "tenant_id")?;
    let bucket: &str = get(row, "bucket")?;
    Ok(BucketKey::new(
        TenantId::parse("tenant_id", tenant)
            .map_err(|e| StoreError::internal("read tenant_id", e))?,
        BucketName::parse("bucket", bucket).map_err(|e| StoreError::internal("read bucket", e))?,
    ))
}

/// The store's clock as returned by a query's `column`.
pub(super) fn clock(row: &Row, column: &'static str) -> Result<Timestamp, StoreError> {
    timestamp(row, column)
}

/// A bucket's head row (instance_id = 0).
pub(super) fn head_from_row(row: &Row) -> Result<BucketRow, StoreError> {
    Ok(BucketRow {
        state: BucketState {
            limits: Limits {
                refill_rate: get(row, "refill_rate")?,
                burst_limit: get(row, "burst_limit")?,
            },
            configured: get(row, "configured")?,
            tokens: get(row, "tokens")?,
            tokens_avg: get(row, "tokens_avg")?,
            last_refill: timestamp(row, "last_refill")?,
            committed_tokens: get(row, "committed_tokens")?,
            committed_rate: get(row, "committed_rate")?,
            capped_refill: get(row, "capped_refill")?,
            capped_from: timestamp(row, "capped_from")?,
            capped_until: timestamp(row, "capped_until")?,
            created_at: timestamp(row, "created_at")?,
            updated_at: timestamp(row, "updated_at")?,
        },
        members: Membership {
            share_sum: get(row, "share_sum")?,
            live_instances: instance_id(row, "live_instances")?,
            first_instance_id: instance_id(row, "next_instance_id")?,
        },
        totals: Totals {
            consumption: Consumption {
                request_unit_micros: counter(row, "total_request_unit_micros")?,
                read_batches: counter(row, "total_read_batches")?,
                read_requests: counter(row, "total_read_requests")?,
                read_bytes: counter(row, "total_read_bytes")?,
                write_batches: counter(row, "total_write_batches")?,
                write_requests: counter(row, "total_write_requests")?,
                write_bytes: counter(row, "total_write_bytes")?,
                cpu_micros: counter(row, "total_cpu_micros")?,
                egress_bytes: counter(row, "total_egress_bytes")?,
            },
            granted_tokens: get(row, "granted_tokens")?,
        },
    })
}

/// An instance row (instance_id >= 1).
pub(super) fn instance_from_row(row: &Row) -> Result<InstanceState, StoreError> {
    let trickle_nanos = counter(row, "last_grant_trickle_nanos")?;
    Ok(InstanceState {
        instance_id: instance_id(row, "instance_id")?,
        next_instance_id: instance_id(row, "next_instance_id")?,
        lease: get(row, "lease")?,
        seq: counter(row, "seq")?,
        shares: get(row, "shares")?,
        last_update: timestamp(row, "last_update")?,
        last_grant: Grant {
            granted_tokens: get(row, "last_grant_tokens")?,
            trickle_duration: Duration::from_nanos(trickle_nanos),
            max_burst_tokens: get(row, "last_grant_max_burst")?,
            fallback_rate: get(row, "last_grant_fallback_rate")?,
            fallback_charged: get(row, "last_grant_fallback_charged")?,
        },
        committed_rate: get(row, "committed_rate")?,
        committed_until: timestamp(row, "committed_until")?,
    })
}

/// A counter as a BIGINT. The core keeps every counter it hands a store
/// within that range (totals saturate at `MAX_TOTAL`, sequence numbers are
/// validated), so a value beyond it is a bug of ours.
fn to_i64(what: &'static str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| {
        StoreError::internal(
            "write a stored row",
            format!("{what} ({value}) is beyond the range the core keeps counters in"),
        )
    })
}

/// The parameters of `insert_buckets.sql` and `update_buckets.sql`: an
/// array per column, a head row per index, so one statement writes every
/// head row of a transaction.
#[derive(Default)]
pub(super) struct HeadColumns<'a> {
    tenant_id: Vec<&'a str>,
    bucket: Vec<&'a str>,
    next_instance_id: Vec<i64>,
    refill_rate: Vec<f64>,
    burst_limit: Vec<f64>,
    configured: Vec<bool>,
    tokens: Vec<f64>,
    tokens_avg: Vec<f64>,
    last_refill: Vec<SystemTime>,
    share_sum: Vec<f64>,
    live_instances: Vec<i64>,
    granted_tokens: Vec<f64>,
    committed_tokens: Vec<f64>,
    committed_rate: Vec<f64>,
    request_unit_micros: Vec<i64>,
    read_batches: Vec<i64>,
    read_requests: Vec<i64>,
    read_bytes: Vec<i64>,
    write_batches: Vec<i64>,
    write_requests: Vec<i64>,
    write_bytes: Vec<i64>,
    cpu_micros: Vec<i64>,
    egress_bytes: Vec<i64>,
    created_at: Vec<SystemTime>,
    updated_at: Vec<SystemTime>,
    capped_refill: Vec<f64>,
    capped_from: Vec<SystemTime>,
    capped_until: Vec<SystemTime>,
}

impl<'a> HeadColumns<'a> {
    /// The columns of these buckets' head rows.
    pub(super) fn of<'h>(
        heads: impl IntoIterator<Item = (&'a BucketKey, &'h BucketRow)>,
    ) -> Result<Self, StoreError> {
        let mut columns = Self::default();
        for (key, head) in heads {
            columns.push(key, head)?;
        }
        Ok(columns)
    }

    /// Adds bucket `key`'s head row.
    pub(super) fn push(&mut self, key: &'a BucketKey, head: &BucketRow) -> Result<(), StoreError> {
        let (state, members) = (&head.state, &head.members);
        let c = &head.totals.consumption;
        // Every fallible conversion first, so a failure adds nothing.
        let totals = [
            to_i64("total_request_unit_micros", c.request_unit_micros)?,
            to_i64("total_read_batches", c.read_batches)?,
            to_i64("total_read_requests", c.read_requests)?,
            to_i64("total_read_bytes", c.read_bytes)?,
            to_i64("total_write_batches", c.write_batches)?,
            to_i64("total_write_requests", c.write_requests)?,
            to_i64("total_write_bytes", c.write_bytes)?,
            to_i64("total_cpu_micros", c.cpu_micros)?,
            to_i64("total_egress_bytes", c.egress_bytes)?,
        ];
        self.tenant_id.push(key.tenant.as_str());
        self.bucket.push(key.bucket.as_str());
        self.next_instance_id
            .push(i64::from(members.first_instance_id));
        self.refill_rate.push(state.limits.refill_rate);
        self.burst_limit.push(state.limits.burst_limit);
        self.configured.push(state.configured);
        self.tokens.push(state.tokens);
        self.tokens_avg.push(state.tokens_avg);
        self.last_refill.push(to_system_time(state.last_refill));
        self.share_sum.push(members.share_sum);
        self.live_instances.push(i64::from(members.live_instances));
        self.granted_tokens.push(head.totals.granted_tokens);
        self.committed_tokens.push(state.committed_tokens);
        self.committed_rate.push(state.committed_rate);
        let [ru, rb, rr, rby, wb, wr, wby, cpu, egress] = totals;
        self.request_unit_micros.push(ru);
        self.read_batches.push(rb);
        self.read_requests.push(rr);
        self.read_bytes.push(rby);
        self.write_batches.push(wb);
        self.write_requests.push(wr);
        self.write_bytes.push(wby);
        self.cpu_micros.push(cpu);
        self.egress_bytes.push(egress);
        self.created_at.push(to_system_time(state.created_at));
        self.updated_at.push(to_system_time(state.updated_at));
        self.capped_refill.push(state.capped_refill);
        self.capped_from.push(to_system_time(state.capped_from));
        self.capped_until.push(to_system_time(state.capped_until));
        Ok(())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.tenant_id.is_empty()
    }

    pub(super) fn as_params(&self) -> [&(dyn ToSql + Sync); 28] {
        [
            &self.tenant_id,
            &self.bucket,
            &self.next_instance_id,
            &self.refill_rate,
            &self.burst_limit,
            &self.configured,
            &self.tokens,
            &self.tokens_avg,
            &self.last_refill,
            &self.share_sum,
            &self.live_instances,
            &self.granted_tokens,
            &self.committed_tokens,
            &self.committed_rate,
            &self.request_unit_micros,
            &self.read_batches,
            &self.read_requests,
            &self.read_bytes,
            &self.write_batches,
            &self.write_requests,
            &self.write_bytes,
            &self.cpu_micros,
            &self.egress_bytes,
            &self.created_at,
            &self.updated_at,
            &self.capped_refill,
            &self.capped_from,
            &self.capped_until,
        ]
    }
}

/// The parameters of `upsert_instances.sql`: an array per column, an
/// instance row per index.
#[derive(Default)]
pub(super) struct InstanceColumns<'a> {
    tenant_id: Vec<&'a str>,
    bucket: Vec<&'a str>,
    instance_id: Vec<i64>,
    next_instance_id: Vec<i64>,
    lease: Vec<&'a [u8]>,
    seq: Vec<i64>,
    shares: Vec<f64>,
    last_update: Vec<SystemTime>,
    committed_rate: Vec<f64>,
    committed_until: Vec<SystemTime>,
    grant_tokens: Vec<f64>,
    grant_trickle_nanos: Vec<i64>,
    grant_max_burst: Vec<f64>,
    grant_fallback_rate: Vec<f64>,
    grant_fallback_charged: Vec<Option<f64>>,
}

impl<'a> InstanceColumns<'a> {
    /// Adds an instance row of bucket `key`.
    pub(super) fn push(
        &mut self,
        key: &'a BucketKey,
        row: &'a InstanceState,
    ) -> Result<(), StoreError> {
        let trickle_nanos =
            u64::try_from(row.last_grant.trickle_duration.as_nanos()).unwrap_or(u64::MAX);
        let seq = to_i64("seq", row.seq)?;
        let trickle_nanos = to_i64("last_grant_trickle_nanos", trickle_nanos)?;
        self.tenant_id.push(key.tenant.as_str());
        self.bucket.push(key.bucket.as_str());
        self.instance_id.push(i64::from(row.instance_id));
        self.next_instance_id.push(i64::from(row.next_instance_id));
        self.lease.push(&row.lease);
        self.seq.push(seq);
        self.shares.push(row.shares);
        self.last_update.push(to_system_time(row.last_update));
        self.committed_rate.push(row.committed_rate);
        self.committed_until
            .push(to_system_time(row.committed_until));
        self.grant_tokens.push(row.last_grant.granted_tokens);
        self.grant_trickle_nanos.push(trickle_nanos);
        self.grant_max_burst.push(row.last_grant.max_burst_tokens);
        self.grant_fallback_rate.push(row.last_grant.fallback_rate);
        self.grant_fallback_charged
            .push(row.last_grant.fallback_charged);
        Ok(())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.tenant_id.is_empty()
    }

    pub(super) fn as_params(&self) -> [&(dyn ToSql + Sync); 15] {
        [
            &self.tenant_id,
            &self.bucket,
            &self.instance_id,
            &self.next_instance_id,
            &self.lease,
            &self.seq,
            &self.shares,
            &self.last_update,
            &self.committed_rate,
            &self.committed_until,
            &self.grant_tokens,
            &self.grant_trickle_nanos,
            &self.grant_max_burst,
            &self.grant_fallback_rate,
            &self.grant_fallback_charged,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_through_system_time() {
        for micros in [0, 1, -1, 1_700_000_000_123_456, -86_400_000_001] {
            let t = Timestamp::from_unix_micros(micros);
            assert_eq!(from_system_time(to_system_time(t)), t);
        }
    }
}
