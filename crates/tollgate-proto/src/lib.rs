//! Tollgate's wire contract (`proto/tollgate/v1`), compiled at build time.
//!
//! The `.proto` files are the source of truth; this crate only exposes the
//! generated prost messages and tonic clients/servers so that every other crate
//! (and every user) agrees on one definition.

/// Package `tollgate.v1`: the pod-facing `TokenBucketService` and the
/// operator-facing `Admin` service.
#[allow(missing_debug_implementations, clippy::all)]
pub mod v1 {
    tonic::include_proto!("tollgate.v1");
}

/// The encoded `FileDescriptorSet` of `tollgate.v1`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tollgate_descriptor.bin"));

pub use prost_types::{Duration, Timestamp};
