//! Conversions of the `PartitionLimits` messages and the core's exchange,
//! written once for the server (which checks requests) and the client
//! (which checks answers).

use tollgate_core::partition::{
    Exchange, ExchangeAnswer, MAX_TABLES, Op, ReportedPartition, TableLimitSet, TableLimits,
};
use tollgate_core::validate::{self, DEFAULT_TARGET_REQUEST_PERIOD, InvalidInput};
use tollgate_core::{TableName, TenantId};

use crate::v1;

/// A pod's exchange with its tenant: what a `PartitionLoadRequest` means.
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionLoadCall {
    pub tenant: TenantId,
    pub exchange: Exchange,
}

impl From<Op> for v1::PartitionOp {
    fn from(op: Op) -> Self {
        match op {
            Op::Read => v1::PartitionOp::Read,
            Op::Write => v1::PartitionOp::Write,
        }
    }
}

/// The op of a wire enum value; `field` names it.
fn op(field: &str, value: i32) -> Result<Op, InvalidInput> {
    match v1::PartitionOp::try_from(value) {
        Ok(v1::PartitionOp::Read) => Ok(Op::Read),
        Ok(v1::PartitionOp::Write) => Ok(Op::Write),
        _ => Err(InvalidInput::new(
            field,
            format!("must be PARTITION_OP_READ or PARTITION_OP_WRITE, got {value}"),
        )),
    }
}

/// A request, checked, field names as the request's
/// (`hot_partitions[1].rate`).
impl TryFrom<v1::PartitionLoadRequest> for PartitionLoadCall {
    type Error = InvalidInput;

    fn try_from(req: v1::PartitionLoadRequest) -> Result<Self, InvalidInput> {
        let tenant = TenantId::parse("tenant_id", &req.tenant_id)?;
        if req.instance_id == 0 {
            return Err(InvalidInput::new("instance_id", "must not be 0 (reserved)"));
        }
        let period = match req.report_period {
            None => DEFAULT_TARGET_REQUEST_PERIOD,
            Some(d) => {
                let period = validate::wire_duration("report_period", d.seconds, d.nanos)?;
                validate::target_request_period("report_period", period)?;
                period
            }
        };
        let mut partitions = Vec::with_capacity(req.hot_partitions.len());
        for (i, p) in req.hot_partitions.into_iter().enumerate() {
            let field = |name: &str| format!("hot_partitions[{i}].{name}");
            partitions.push(ReportedPartition {
                table: TableName::parse(&field("table"), &p.table)?,
                op: op(&field("op"), p.op)?,
                partition: p.partition_hash,
                rate: p.rate,
            });
        }
        Exchange::validate_partitions("hot_partitions", &partitions)?;
        Ok(PartitionLoadCall {
            tenant,
            exchange: Exchange {
                pod: req.instance_id,
                partitions,
                period,
                known_version: req.known_limits_version,
            },
        })
    }
}

impl From<&PartitionLoadCall> for v1::PartitionLoadRequest {
    fn from(call: &PartitionLoadCall) -> Self {
        v1::PartitionLoadRequest {
            tenant_id: call.tenant.as_str().to_string(),
            instance_id: call.exchange.pod,
            known_limits_version: call.exchange.known_version,
            hot_partitions: call
                .exchange
                .partitions
                .iter()
                .map(|p| v1::HotPartition {
                    table: p.table.as_str().to_string(),
                    op: v1::PartitionOp::from(p.op).into(),
                    partition_hash: p.partition,
                    rate: p.rate,
                })
                .collect(),
            report_period: Some(crate::duration(call.exchange.period)),
        }
    }
}

impl From<&ExchangeAnswer> for v1::PartitionLoadResponse {
    fn from(answer: &ExchangeAnswer) -> Self {
        v1::PartitionLoadResponse {
            limits_version: answer.version,
            limits_changed: answer.limits.is_some(),
            tables: answer
                .limits
                .iter()
                .flatten()
                .map(|(table, limits)| v1::PartitionTableLimits {
                    table: table.as_str().to_string(),
                    max_reads_per_second: limits.max_reads_per_second,
                    max_writes_per_second: limits.max_writes_per_second,
                })
                .collect(),
            shares: answer
                .shares
                .iter()
                .map(|(p, share)| v1::PartitionShare {
                    table: p.table.as_str().to_string(),
                    op: v1::PartitionOp::from(p.op).into(),
                    partition_hash: p.partition,
                    share: *share,
                })
                .collect(),
        }
    }
}

/// An answer, checked as a request would be: a client applies nothing a
/// server could not have meant (field names as the response's).
impl TryFrom<v1::PartitionLoadResponse> for ExchangeAnswer {
    type Error = InvalidInput;

    fn try_from(resp: v1::PartitionLoadResponse) -> Result<Self, InvalidInput> {
        let limits = if resp.limits_changed {
            // A tenant's limits are its tier's tables and its own: up to
            // twice as many as either list holds.
            if resp.tables.len() > 2 * MAX_TABLES {
                return Err(InvalidInput::new(
                    "tables",
                    format!(
                        "at most {} tables, got {}",
                        2 * MAX_TABLES,
                        resp.tables.len()
                    ),
                ));
            }
            let mut set = TableLimitSet::new();
            for (i, t) in resp.tables.iter().enumerate() {
                let name = TableName::parse(&format!("tables[{i}].table"), &t.table)?;
                let limits = TableLimits {
                    max_reads_per_second: t.max_reads_per_second,
                    max_writes_per_second: t.max_writes_per_second,
                };
                limits.validate(&format!("tables[{i}]"))?;
                if set.insert(name, limits).is_some() {
                    return Err(InvalidInput::new(
                        format!("tables[{i}].table"),
                        format!("{} is listed twice", validate::quote(&t.table)),
                    ));
                }
            }
            Some(set)
        } else {
            None
        };
        let mut shares = Vec::with_capacity(resp.shares.len());
        for (i, s) in resp.shares.into_iter().enumerate() {
            let field = |name: &str| format!("shares[{i}].{name}");
            if !(s.share > 0.0 && s.share <= 1.0) {
                return Err(InvalidInput::new(
                    field("share"),
                    format!("must be above 0 and at most 1, got {}", s.share),
                ));
            }
            shares.push((
                ReportedPartition {
                    table: TableName::parse(&field("table"), &s.table)?,
                    op: op(&field("op"), s.op)?,
                    partition: s.partition_hash,
                    rate: 0.0,
                },
                s.share,
            ));
        }
        Ok(ExchangeAnswer {
            version: resp.limits_version,
            limits,
            shares,
        })
    }
}
