//! Tollgate's wire contract (`proto/tollgate/v1`), compiled at build time.
//!
//! The `.proto` files are the source of truth; this crate only exposes the
//! generated prost messages and tonic clients/servers so that every other crate
//! (and every user) agrees on one definition.
//!
//! `build.rs` compiles the files with protox, a protobuf compiler written in
//! Rust, so no system `protoc` is needed; [`FILE_DESCRIPTOR_SET`] and
//! [`AGENT_FILE_DESCRIPTOR_SET`] carry the descriptors for gRPC reflection.
//! The conversions the server and the client share live here once:
//! [`Consumption`](tollgate_core::consumption::Consumption) both ways,
//! [`duration`], and `CheckCall::try_from` a `CheckRequest` (every item
//! validated, fields named `items[i].…`), by which the server accepts a
//! check and the client checks one before sending it; [`partition`] does
//! the same for the `PartitionLimits` messages, and [`pushback`] reads and
//! writes an overloaded server's retry hint.

/// Package `tollgate.v1`: the pod-facing `TokenBucketService`,
/// `KeyLimits` and `PartitionLimits`, and the operator-facing `Admin`
/// service.
#[allow(missing_debug_implementations, clippy::all)]
pub mod v1 {
    tonic::include_proto!("tollgate.v1");
}

/// Package `tollgate.agent.v1`: the `Agent` service `tollgate agent` serves
/// to the pods beside it.
pub mod agent {
    #[allow(missing_debug_implementations, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("tollgate.agent.v1");
    }
}

/// The encoded `FileDescriptorSet` of `tollgate.v1`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tollgate_descriptor.bin"));

/// The encoded `FileDescriptorSet` of `tollgate.agent.v1` (with the
/// `tollgate.v1` file it imports), for the agent's gRPC reflection.
pub const AGENT_FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/agent_descriptor.bin"));

pub use prost_types::{Duration, Timestamp};

pub mod partition;
pub mod pushback;

/// The gRPC metadata key naming who asks for an `Admin` change (an
/// operator's user name, say). The server only logs it: it authenticates
/// nothing, and a value that is not printable ASCII of at most
/// [`MAX_ACTOR_LEN`] characters is left out of the log.
pub const ACTOR_METADATA: &str = "x-tollgate-actor";

/// The longest `x-tollgate-actor` value the server logs.
pub const MAX_ACTOR_LEN: usize = 128;

mod convert {
    //! Conversions between the wire's messages and the core's types,
    //! written once for the server and the client.

    use tollgate_core::consumption::Consumption;
    use tollgate_core::key_bucket::{CheckCall, KeyId, RequestItem, validate_item_count};
    use tollgate_core::validate::{
        self, InvalidInput, MAX_CPU_SECONDS, MAX_REPORTED_REQUEST_UNITS,
    };
    use tollgate_core::{BucketName, TenantId};

    use crate::v1;

    /// A reported delta: request units and CPU time as doubles or exact
    /// micro-units (or both, if they agree), converted to micro-units and
    /// checked.
    /// Field names in errors are the message's own; a caller adds the path.
    impl TryFrom<v1::Consumption> for Consumption {
        type Error = InvalidInput;

        fn try_from(c: v1::Consumption) -> Result<Self, InvalidInput> {
            let consumption = Consumption {
                request_unit_micros: validate::micros(
                    "request_units",
                    c.request_units,
                    "request_unit_micros",
                    c.request_unit_micros,
                    MAX_REPORTED_REQUEST_UNITS,
                )?,
                read_batches: c.read_batches,
                read_requests: c.read_requests,
                read_bytes: c.read_bytes,
                write_batches: c.write_batches,
                write_requests: c.write_requests,
                write_bytes: c.write_bytes,
                cpu_micros: validate::micros(
                    "cpu_seconds",
                    c.cpu_seconds,
                    "cpu_micros",
                    c.cpu_micros,
                    MAX_CPU_SECONDS,
                )?,
                egress_bytes: c.egress_bytes,
            };
            consumption.validate()?;
            Ok(consumption)
        }
    }

    /// A check call, every item validated, field names as the request's
    /// (`items[1].key`): what the server accepts, and what the client
    /// checks before sending.
    impl TryFrom<v1::CheckRequest> for CheckCall {
        type Error = InvalidInput;

        fn try_from(req: v1::CheckRequest) -> Result<Self, InvalidInput> {
            validate_item_count(req.items.len())?;
            let mut items = Vec::with_capacity(req.items.len());
            for (i, item) in req.items.into_iter().enumerate() {
                let field = |name: &str| format!("items[{i}].{name}");
                let tenant = TenantId::parse(&field("tenant_id"), &item.tenant_id)?;
                let bucket = BucketName::parse(&field("bucket"), &item.bucket)?;
                if bucket.is_request_units() {
                    return Err(InvalidInput::new(
                        field("bucket"),
                        "must name a per-key bucket definition, not be empty",
                    ));
                }
                items.push(RequestItem {
                    key: KeyId::new(tenant, bucket, item.key),
                    tokens: item.tokens,
                    request_id: Some(item.request_id).filter(|id| !id.is_empty()),
                });
            }
            CheckCall::new(items)
        }
    }

    /// Both forms of the fractional quantities: the exact micro-units, and
    /// the double (which agrees with them) for readers that want units.
    impl From<&Consumption> for v1::Consumption {
        fn from(c: &Consumption) -> Self {
            v1::Consumption {
                request_units: c.request_units(),
                read_batches: c.read_batches,
                read_requests: c.read_requests,
                read_bytes: c.read_bytes,
                write_batches: c.write_batches,
                write_requests: c.write_requests,
                write_bytes: c.write_bytes,
                cpu_seconds: c.cpu_seconds(),
                egress_bytes: c.egress_bytes,
                request_unit_micros: c.request_unit_micros,
                cpu_micros: c.cpu_micros,
            }
        }
    }
}

/// A duration as the wire carries it; saturates at the largest representable.
pub fn duration(d: std::time::Duration) -> Duration {
    Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// An `enforce` field (`BucketDefinition`, `Budget`) as the wire carries
/// it: unset while enforced, as clients from before shadow mode send it.
pub fn enforce_to_wire(enforce: bool) -> Option<bool> {
    (!enforce).then_some(false)
}

/// An `enforce` field read from the wire: unset is enforced.
pub fn enforce_from_wire(enforce: Option<bool>) -> bool {
    enforce.unwrap_or(true)
}
