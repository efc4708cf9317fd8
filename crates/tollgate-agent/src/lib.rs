//! `tollgate agent`: a tenant's local buckets, held beside the pods that
//! use them, for pods written in any language.
//!
//! A Rust pod embeds `tollgate-client`; a pod in any other language talks
//! to an agent over a Unix socket (or loopback TCP), with the small API of
//! `proto/tollgate/agent/v1/agent.proto`, and the agent drives
//! `tollgate-client` for it. The algorithms stay in `tollgate-core`: the
//! agent adds listeners, access rules and a journal, nothing else.

pub mod journal;
