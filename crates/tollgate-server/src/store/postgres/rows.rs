//! Conversions between `tenant_usage` rows and the core's state.
//!
//! Columns are read by name, so a query may return them in any order (the
//! queries select `*`). Every value the core keeps round-trips exactly:
//! FLOAT8 is an IEEE double, TIMESTAMPTZ has the core's microsecond
//! resolution, grant durations are kept in nanoseconds, and consumption
//! totals are BIGINT counters (request units and CPU in micro-units), which
//! the core keeps within the BIGINT range.
//!
//! The head row's columns are listed once, in `head_columns!`: each with
//! its SQL type and the field of `BucketRow` it keeps. The statements that
//! write head rows ([`INSERT_BUCKETS`], [`UPDATE_BUCKETS`]), their
//! parameters ([`HeadColumns`]) and the reading of a head row
//! ([`head_from_row`]) are derived from that list, so a new head-row field
//! costs a line there and its migration. (The head row is flat in
//! `tenant_usage`, a column per field, and every statement that writes it
//! names each column.)

use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, ToSql};
use tollgate_core::organisation::Draw;
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
    Ok(Timestamp::from_system_time(get(row, column)?))
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
            initial_allowance: get(row, "last_grant_initial_allowance")?,
        },
        committed_rate: get(row, "committed_rate")?,
        committed_until: timestamp(row, "committed_until")?,
        guaranteed: get(row, "guaranteed_rate")?,
        held_tokens: get(row, "held_tokens")?,
        held_use_rate: get(row, "held_use_rate")?,
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

/// The SQL types of head columns, spelled as in the schema. Each says what
/// a statement casts its parameter array to and, by its [`Encoding`]s, how
/// a value of the core goes into that array and comes back from a row.
#[allow(clippy::upper_case_acronyms)]
mod sql_type {
    pub(super) struct BIGINT;
    pub(super) struct BOOL;
    pub(super) struct FLOAT8;
    pub(super) struct TIMESTAMPTZ;
    pub(super) struct TEXT;
    /// A member's draw state: TEXT, as a JSON array (see [`CompactDraw`]).
    pub(super) struct DRAW;
}

/// A column type: its name in SQL and what its parameter arrays hold.
trait SqlType {
    const NAME: &'static str;
    type Param: ToSql + Sync;
}

/// How a value of the core's type `T` is kept in a column of this type.
trait Encoding<T>: SqlType {
    fn encode(column: &'static str, value: &T) -> Result<Self::Param, StoreError>;
    fn decode(row: &Row, column: &'static str) -> Result<T, StoreError>;
}

impl SqlType for sql_type::FLOAT8 {
    const NAME: &'static str = "FLOAT8";
    type Param = f64;
}

impl Encoding<f64> for sql_type::FLOAT8 {
    fn encode(_: &'static str, value: &f64) -> Result<f64, StoreError> {
        Ok(*value)
    }
    fn decode(row: &Row, column: &'static str) -> Result<f64, StoreError> {
        get(row, column)
    }
}

impl SqlType for sql_type::BOOL {
    const NAME: &'static str = "BOOL";
    type Param = bool;
}

impl Encoding<bool> for sql_type::BOOL {
    fn encode(_: &'static str, value: &bool) -> Result<bool, StoreError> {
        Ok(*value)
    }
    fn decode(row: &Row, column: &'static str) -> Result<bool, StoreError> {
        get(row, column)
    }
}

impl SqlType for sql_type::TIMESTAMPTZ {
    const NAME: &'static str = "TIMESTAMPTZ";
    type Param = SystemTime;
}

impl Encoding<Timestamp> for sql_type::TIMESTAMPTZ {
    fn encode(_: &'static str, value: &Timestamp) -> Result<SystemTime, StoreError> {
        Ok(to_system_time(*value))
    }
    fn decode(row: &Row, column: &'static str) -> Result<Timestamp, StoreError> {
        timestamp(row, column)
    }
}

impl SqlType for sql_type::BIGINT {
    const NAME: &'static str = "BIGINT";
    type Param = i64;
}

/// Counters (see [`to_i64`]).
impl Encoding<u64> for sql_type::BIGINT {
    fn encode(column: &'static str, value: &u64) -> Result<i64, StoreError> {
        to_i64(column, *value)
    }
    fn decode(row: &Row, column: &'static str) -> Result<u64, StoreError> {
        counter(row, column)
    }
}

/// Instance ids and counts of instances.
impl Encoding<u32> for sql_type::BIGINT {
    fn encode(_: &'static str, value: &u32) -> Result<i64, StoreError> {
        Ok(i64::from(*value))
    }
    fn decode(row: &Row, column: &'static str) -> Result<u32, StoreError> {
        instance_id(row, column)
    }
}

impl SqlType for sql_type::TEXT {
    const NAME: &'static str = "TEXT";
    type Param = Option<String>;
}

/// Parts of the head row kept as a JSON document (NULL when absent): the
/// budget, an organisation member's draws; read and written only by the
/// server.
impl<T: serde::Serialize + serde::de::DeserializeOwned> Encoding<Option<T>> for sql_type::TEXT {
    fn encode(column: &'static str, value: &Option<T>) -> Result<Option<String>, StoreError> {
        value
            .as_ref()
            .map(|v| {
                serde_json::to_string(v).map_err(|e| {
                    StoreError::internal("write a stored row", format!("{column}: {e}"))
                })
            })
            .transpose()
    }
    fn decode(row: &Row, column: &'static str) -> Result<Option<T>, StoreError> {
        let text: Option<String> = get(row, column)?;
        text.map(|t| {
            serde_json::from_str(&t)
                .map_err(|e| StoreError::internal("read a stored row", format!("{column}: {e}")))
        })
        .transpose()
    }
}

/// A member bucket's draw state as the head row keeps it: a JSON array
/// of its fields in [`Draw`]'s order, the consumption reported as an array
/// of its counters. The head row is rewritten with every request of a
/// member's pods (the draw counts what they ask), and field names were
/// most of the draw state (148 bytes without them, 407 with); rows
/// written with them are still read.
type CompactDraw = (
    TenantId,
    tollgate_core::InstanceId,
    u64,
    Timestamp,
    f64,
    Timestamp,
    [u64; 9],
    u64,
    f64,
    f64,
    f64,
);

fn compact_draw(d: &Draw) -> CompactDraw {
    (
        d.organisation.clone(),
        d.member_id,
        d.seq,
        d.next,
        d.asked,
        d.asked_since,
        d.reported.counters().map(|(_, value)| value),
        d.draws,
        d.last_rate,
        d.last_granted,
        d.wants,
    )
}

fn draw_of(compact: CompactDraw) -> Draw {
    let (
        organisation,
        member_id,
        seq,
        next,
        asked,
        asked_since,
        reported,
        draws,
        last_rate,
        last_granted,
        wants,
    ) = compact;
    Draw {
        organisation,
        member_id,
        seq,
        next,
        asked,
        asked_since,
        reported: Consumption::from_counters(reported),
        draws,
        last_rate,
        last_granted,
        wants,
    }
}

impl SqlType for sql_type::DRAW {
    const NAME: &'static str = "TEXT";
    type Param = Option<String>;
}

impl Encoding<Option<Box<Draw>>> for sql_type::DRAW {
    fn encode(
        column: &'static str,
        value: &Option<Box<Draw>>,
    ) -> Result<Option<String>, StoreError> {
        let compact = value.as_deref().map(compact_draw);
        <sql_type::TEXT as Encoding<Option<CompactDraw>>>::encode(column, &compact)
    }
    fn decode(row: &Row, column: &'static str) -> Result<Option<Box<Draw>>, StoreError> {
        let text: Option<String> = get(row, column)?;
        text.map(|t| {
            serde_json::from_str::<CompactDraw>(&t)
                .map(draw_of)
                // Written before the compact form.
                .or_else(|_| serde_json::from_str::<Draw>(&t))
                .map(Box::new)
                .map_err(|e| StoreError::internal("read a stored row", format!("{column}: {e}")))
        })
        .transpose()
    }
}

/// A head row's key: the columns the head-row statements match rows on,
/// first in their parameters; the values of [`BucketKey`].
const KEY_COLUMNS: [(&str, &str); 2] = [("tenant_id", "TEXT"), ("bucket", "TEXT")];

/// Derives, from the list of head columns, everything that names them:
/// [`HEAD_COLUMNS`], [`HeadColumns`] (the parameters of the head-row
/// statements, in their order) and [`head_from_row`].
macro_rules! head_columns {
    ($($column:ident: $type:ident = $($field:ident).+,)+) => {
        /// The columns of a head row after its key, in the order of the
        /// statements' parameters, with their SQL types.
        const HEAD_COLUMNS: &[(&str, &str)] = &[
            $((stringify!($column), <sql_type::$type as SqlType>::NAME),)+
        ];

        /// The parameters of [`INSERT_BUCKETS`] and [`UPDATE_BUCKETS`]: an
        /// array per column, a head row per index, so one statement writes
        /// every head row of a transaction.
        #[derive(Default)]
        pub(super) struct HeadColumns<'a> {
            tenant_id: Vec<&'a str>,
            bucket: Vec<&'a str>,
            $($column: Vec<<sql_type::$type as SqlType>::Param>,)+
        }

        impl<'a> HeadColumns<'a> {
            /// Adds bucket `key`'s head row.
            pub(super) fn push(
                &mut self,
                key: &'a BucketKey,
                head: &BucketRow,
            ) -> Result<(), StoreError> {
                // Every fallible conversion first, so a failure adds nothing.
                $(
                    let $column = <sql_type::$type as Encoding<_>>::encode(
                        stringify!($column),
                        &head.$($field).+,
                    )?;
                )+
                self.tenant_id.push(key.tenant.as_str());
                self.bucket.push(key.bucket.as_str());
                $(self.$column.push($column);)+
                Ok(())
            }

            /// The arrays in the statements' order: the key's
            /// ([`KEY_COLUMNS`]), then [`HEAD_COLUMNS`].
            pub(super) fn as_params(&self) -> [&(dyn ToSql + Sync); HEAD_PARAMS] {
                [&self.tenant_id, &self.bucket, $(&self.$column,)+]
            }
        }

        /// A bucket's head row (instance_id = 0). Every field of the row
        /// is read from its column; the row it starts from only gives the
        /// fields their types.
        pub(super) fn head_from_row(row: &Row) -> Result<BucketRow, StoreError> {
            let no_limits = Limits {
                refill_rate: 0.0,
                burst_limit: 0.0,
            };
            let mut head = BucketRow::new(no_limits, 0.0, false, Timestamp::EPOCH);
            $(
                head.$($field).+ =
                    <sql_type::$type as Encoding<_>>::decode(row, stringify!($column))?;
            )+
            Ok(head)
        }
    };
}

// The head row's columns after its key, each with its SQL type and the
// field of `BucketRow` it keeps: the one list of them in this store. A new
// head-row field is a line here (and its migration); the statements, their
// parameters and the reading of a row follow. The tests below fail while
// this list and the table differ, or a field of `BucketRow` is not kept.
head_columns! {
    next_instance_id: BIGINT = members.first_instance_id,
    refill_rate: FLOAT8 = state.limits.refill_rate,
    burst_limit: FLOAT8 = state.limits.burst_limit,
    configured: BOOL = state.configured,
    tokens: FLOAT8 = state.tokens,
    tokens_avg: FLOAT8 = state.tokens_avg,
    last_refill: TIMESTAMPTZ = state.last_refill,
    share_sum: FLOAT8 = members.share_sum,
    live_instances: BIGINT = members.live_instances,
    granted_tokens: FLOAT8 = totals.granted_tokens,
    committed_tokens: FLOAT8 = state.committed_tokens,
    committed_rate: FLOAT8 = state.committed_rate,
    total_request_unit_micros: BIGINT = totals.consumption.request_unit_micros,
    total_read_batches: BIGINT = totals.consumption.read_batches,
    total_read_requests: BIGINT = totals.consumption.read_requests,
    total_read_bytes: BIGINT = totals.consumption.read_bytes,
    total_write_batches: BIGINT = totals.consumption.write_batches,
    total_write_requests: BIGINT = totals.consumption.write_requests,
    total_write_bytes: BIGINT = totals.consumption.write_bytes,
    total_cpu_micros: BIGINT = totals.consumption.cpu_micros,
    total_egress_bytes: BIGINT = totals.consumption.egress_bytes,
    total_throttled_micros: BIGINT = totals.throttled_micros,
    created_at: TIMESTAMPTZ = state.created_at,
    updated_at: TIMESTAMPTZ = state.updated_at,
    capped_refill: FLOAT8 = state.capped_refill,
    capped_from: TIMESTAMPTZ = state.capped_from,
    capped_until: TIMESTAMPTZ = state.capped_until,
    held_tokens: FLOAT8 = state.held_tokens,
    held_use_rate: FLOAT8 = state.held_use_rate,
    held_reported: FLOAT8 = state.held_reported,
    budget: TEXT = budget,
    guarantee_sum: FLOAT8 = members.guarantee_sum,
    drawn: TEXT = state.drawn,
    draw: DRAW = draw,
    enforce: BOOL = enforce,
    shadow_throttled_tokens: FLOAT8 = shadow.throttled_tokens,
    shadow_throttled_micros: BIGINT = shadow.throttled_micros,
}

/// How many parameters the head-row statements take.
const HEAD_PARAMS: usize = KEY_COLUMNS.len() + HEAD_COLUMNS.len();

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

    pub(super) fn is_empty(&self) -> bool {
        self.tenant_id.is_empty()
    }
}

/// Every column the head-row statements write, in their parameters' order.
fn statement_columns() -> impl Iterator<Item = (&'static str, &'static str)> {
    KEY_COLUMNS.into_iter().chain(HEAD_COLUMNS.iter().copied())
}

/// The names of [`statement_columns`], comma-separated.
fn column_names() -> String {
    let names: Vec<&str> = statement_columns().map(|(name, _)| name).collect();
    names.join(", ")
}

/// `unnest($1::TEXT[], $2::TEXT[], …)`: the rows of the parameter arrays.
fn unnest_parameters() -> String {
    let arrays: Vec<String> = statement_columns()
        .enumerate()
        .map(|(i, (_, sql_type))| format!("${}::{sql_type}[]", i + 1))
        .collect();
    format!("unnest({})", arrays.join(", "))
}

/// Creates buckets' head rows, one per index of the arrays of
/// [`HeadColumns`]; the head row's instance id is 0. Two transactions
/// creating the same bucket collide on the primary key; the loser is
/// retried and then sees the row.
///
/// ```sql
/// INSERT INTO tenant_usage (tenant_id, bucket, next_instance_id, …, instance_id)
/// SELECT *, 0 FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], …)
/// ```
///
/// Built once from the column list, so the text, and with it the
/// connections' cache of prepared statements, is the same for the life
/// of the process.
pub(super) static INSERT_BUCKETS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO tenant_usage ({}, instance_id)\nSELECT *, 0 FROM {}",
        column_names(),
        unnest_parameters(),
    )
});

/// Writes back head rows the transaction has locked, one per index of the
/// arrays of [`HeadColumns`]: bucket (`$1[i]`, `$2[i]`) gets the values at
/// `i` of the others. Built once, as [`INSERT_BUCKETS`].
///
/// ```sql
/// UPDATE tenant_usage AS t SET next_instance_id = v.next_instance_id, …
/// FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], …) AS v(tenant_id, bucket, next_instance_id, …)
/// WHERE t.tenant_id = v.tenant_id AND t.bucket = v.bucket AND t.instance_id = 0
/// ```
pub(super) static UPDATE_BUCKETS: LazyLock<String> = LazyLock::new(|| {
    let set: Vec<String> = HEAD_COLUMNS
        .iter()
        .map(|(name, _)| format!("{name} = v.{name}"))
        .collect();
    let key: Vec<String> = KEY_COLUMNS
        .iter()
        .map(|(name, _)| format!("t.{name} = v.{name}"))
        .collect();
    format!(
        "UPDATE tenant_usage AS t SET {}\nFROM {} AS v({})\nWHERE {} AND t.instance_id = 0",
        set.join(", "),
        unnest_parameters(),
        column_names(),
        key.join(" AND "),
    )
});

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
    guaranteed: Vec<f64>,
    grant_initial_allowance: Vec<Option<f64>>,
    held_tokens: Vec<f64>,
    held_use_rate: Vec<f64>,
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
        self.guaranteed.push(row.guaranteed);
        self.grant_initial_allowance
            .push(row.last_grant.initial_allowance);
        self.held_tokens.push(row.held_tokens);
        self.held_use_rate.push(row.held_use_rate);
        Ok(())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.tenant_id.is_empty()
    }

    pub(super) fn as_params(&self) -> [&(dyn ToSql + Sync); 19] {
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
            &self.guaranteed,
            &self.grant_initial_allowance,
            &self.held_tokens,
            &self.held_use_rate,
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use tollgate_core::Consumption;
    use tollgate_core::budget::BucketBudget;
    use tollgate_core::global_bucket::{BucketState, Membership, ShadowTotals, Totals};
    use tollgate_core::organisation::{Draw, Drawn};
    use tollgate_testdb::TestDatabase;

    use super::*;
    use crate::store::postgres::{PostgresTls, migrate};

    /// The columns only instance rows (instance_id >= 1) use, and the
    /// instance id the statements set themselves.
    const INSTANCE_ROW_COLUMNS: [&str; 13] = [
        "instance_id",
        "lease",
        "seq",
        "shares",
        "last_update",
        "committed_until",
        "last_grant_tokens",
        "last_grant_trickle_nanos",
        "last_grant_max_burst",
        "last_grant_fallback_rate",
        "last_grant_fallback_charged",
        "guaranteed_rate",
        "last_grant_initial_allowance",
    ];

    async fn migrated_database() -> (TestDatabase, tokio_postgres::Client) {
        let db = TestDatabase::create().await.expect("test database");
        migrate(db.url(), &PostgresTls::default())
            .await
            .expect("migrate");
        let client = tollgate_testdb::connect(db.url()).await.expect("connect");
        (db, client)
    }

    /// A head row whose every field is set, to a value no other field of it
    /// has, that differs from the field's default and from the same field
    /// of the row for any other `n`. Written out field by field, without
    /// `..`: a new field of `BucketRow` does not compile here until it is
    /// given a value, and then the round trip below fails until the column
    /// list keeps it.
    fn head_with_every_field_set(n: u32) -> BucketRow {
        let x = f64::from(n) * 100.0;
        let at = |k: i64| {
            Timestamp::from_unix_micros(1_700_000_000_000_000 + i64::from(n) * 1_000_000_000 + k)
        };
        let count = |k: u64| u64::from(n) * 100 + k;
        BucketRow {
            state: BucketState {
                limits: Limits {
                    refill_rate: x + 1.5,
                    burst_limit: x + 2.5,
                },
                configured: n % 2 == 1,
                tokens: x + 3.5,
                tokens_avg: x + 4.5,
                last_refill: at(1),
                committed_tokens: x + 5.5,
                committed_rate: x + 6.5,
                capped_refill: x + 7.5,
                held_tokens: x + 16.5,
                held_use_rate: x + 17.5,
                held_reported: x + 18.5,
                capped_from: at(2),
                capped_until: at(3),
                drawn: Some(Drawn {
                    rate: x + 10.5,
                    until: at(7),
                }),
                created_at: at(4),
                updated_at: at(5),
            },
            members: Membership {
                share_sum: x + 8.5,
                live_instances: n * 100 + 1,
                first_instance_id: n * 100 + 2,
                guarantee_sum: x + 11.5,
            },
            totals: Totals {
                consumption: Consumption {
                    request_unit_micros: count(1),
                    read_batches: count(2),
                    read_requests: count(3),
                    read_bytes: count(4),
                    write_batches: count(5),
                    write_requests: count(6),
                    write_bytes: count(7),
                    cpu_micros: count(8),
                    egress_bytes: count(9),
                },
                granted_tokens: x + 9.5,
                throttled_micros: count(10),
            },
            budget: Some(Box::new(budget_with_every_field_set(n, x, at(6)))),
            draw: Some(Box::new(Draw {
                organisation: TenantId::parse("t", &format!("org-{n}")).expect("id"),
                member_id: n * 100 + 3,
                seq: count(10),
                next: at(8),
                asked: x + 12.5,
                asked_since: at(9),
                reported: Consumption {
                    request_unit_micros: count(11),
                    ..Consumption::default()
                },
                draws: count(12),
                last_rate: x + 13.5,
                last_granted: x + 14.5,
                wants: x + 15.5,
            })),
            enforce: n.is_multiple_of(2),
            shadow: ShadowTotals {
                throttled_tokens: x + 19.5,
                throttled_micros: count(13),
            },
        }
    }

    fn budget_with_every_field_set(n: u32, x: f64, at: Timestamp) -> BucketBudget {
        use tollgate_core::budget::{AtLimit, Budget, CycleRule, Period, Threshold};
        let rule = CycleRule {
            period: Period::Monthly {
                anchor_day: (n % 28 + 1) as u8,
            },
            time_zone: "Europe/Paris".to_owned(),
        };
        let mut budget = Budget::new(
            x + 10.5,
            rule,
            AtLimit::Throttle {
                baseline: Limits {
                    refill_rate: x + 11.5,
                    burst_limit: x + 12.5,
                },
            },
        );
        budget.thresholds.push(Threshold {
            on: tollgate_core::budget::Measure::Forecast,
            percent: n + 1,
        });
        let mut state = BucketBudget::start(budget, at).expect("in the calendar");
        state.state.usage.granted_tokens = x + 13.5;
        state.state.rate = x + 14.5;
        state
    }

    /// The head rows stored, by key.
    async fn stored_heads(client: &tokio_postgres::Client) -> Vec<(BucketKey, BucketRow)> {
        let rows = client
            .query(
                "SELECT * FROM tenant_usage ORDER BY tenant_id, bucket, instance_id",
                &[],
            )
            .await
            .expect("read head rows");
        rows.iter()
            .map(|row| {
                assert_eq!(row_instance_id(row).expect("instance_id"), 0);
                let key = bucket_key(row).expect("key");
                (key, head_from_row(row).expect("head row"))
            })
            .collect()
    }

    #[tokio::test]
    async fn the_head_columns_are_the_head_row_columns_of_tenant_usage() {
        let (_db, client) = migrated_database().await;
        let table: BTreeSet<(String, String)> = client
            .query(
                "SELECT column_name::TEXT, data_type::TEXT FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = 'tenant_usage'",
                &[],
            )
            .await
            .expect("the columns of tenant_usage")
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .filter(|(name, _): &(String, String)| !INSTANCE_ROW_COLUMNS.contains(&name.as_str()))
            .collect();
        let (names, types): (Vec<&str>, Vec<&str>) = statement_columns().unzip();
        // The server spells the listed types as information_schema does.
        let listed: Vec<(String, String)> = client
            .query(
                "SELECT name, format_type(type::regtype, NULL) \
                 FROM unnest($1::TEXT[], $2::TEXT[]) AS c(name, type)",
                &[&names, &types],
            )
            .await
            .expect("the listed columns' types")
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        assert_eq!(
            listed.iter().cloned().collect::<BTreeSet<_>>(),
            table,
            "the key and head columns of rows.rs, against tenant_usage's columns \
             but those of instance rows"
        );
        assert_eq!(listed.len(), table.len(), "a column listed twice");
    }

    #[tokio::test]
    async fn every_head_field_round_trips_through_insert_and_update() {
        let (_db, client) = migrated_database().await;
        let key = |tenant: &str, bucket: &str| {
            BucketKey::new(
                TenantId::parse("tenant_id", tenant).expect("tenant"),
                BucketName::parse("bucket", bucket).expect("bucket"),
            )
        };
        let (acme, beta) = (key("acme", ""), key("beta", "emails"));
        let created = [
            (acme.clone(), head_with_every_field_set(1)),
            (beta.clone(), head_with_every_field_set(2)),
        ];
        let insert =
            HeadColumns::of(created.iter().map(|(key, head)| (key, head))).expect("head columns");
        let inserted = client
            .execute(INSERT_BUCKETS.as_str(), &insert.as_params())
            .await
            .expect("insert head rows");
        assert_eq!(inserted, 2);
        assert_eq!(stored_heads(&client).await, created);

        // Every field of every row changes (n = 3 and 4 set other values
        // than 1 and 2); rows are matched by key, not by position.
        let changed = [
            (beta.clone(), head_with_every_field_set(3)),
            (acme.clone(), head_with_every_field_set(4)),
        ];
        let update =
            HeadColumns::of(changed.iter().map(|(key, head)| (key, head))).expect("head columns");
        let updated = client
            .execute(UPDATE_BUCKETS.as_str(), &update.as_params())
            .await
            .expect("update head rows");
        assert_eq!(updated, 2);
        let [beta_after, acme_after] = changed;
        assert_eq!(stored_heads(&client).await, vec![acme_after, beta_after]);
    }

    #[tokio::test]
    async fn draws_written_with_field_names_are_read_and_rewritten_compact() {
        let (_db, client) = migrated_database().await;
        let key = BucketKey::new(
            TenantId::parse("tenant_id", "acme").expect("tenant"),
            BucketName::REQUEST_UNITS,
        );
        let head = head_with_every_field_set(5);
        let insert = HeadColumns::of([(&key, &head)]).expect("head columns");
        client
            .execute(INSERT_BUCKETS.as_str(), &insert.as_params())
            .await
            .expect("insert a head row");
        let named = serde_json::to_string(&head.draw).expect("a draw with its field names");
        let compact: String = client
            .query_one("SELECT draw FROM tenant_usage", &[])
            .await
            .expect("the compact draw")
            .get(0);
        assert!(
            compact.len() * 2 < named.len(),
            "compact {} bytes, named {} bytes",
            compact.len(),
            named.len()
        );
        client
            .execute("UPDATE tenant_usage SET draw = $1", &[&named])
            .await
            .expect("an older row");
        assert_eq!(stored_heads(&client).await, vec![(key, head)]);
    }

    #[test]
    fn timestamps_round_trip_through_system_time() {
        for micros in [0, 1, -1, 1_700_000_000_123_456, -86_400_000_001] {
            let t = Timestamp::from_unix_micros(micros);
            assert_eq!(Timestamp::from_system_time(to_system_time(t)), t);
        }
    }
}
