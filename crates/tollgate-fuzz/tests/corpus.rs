//! The fuzz smoke: every input of the checked-in corpus (`corpus/<target>/`,
//! what `cargo fuzz` found worth keeping), of the findings fixed
//! (`regressions/<target>/`), the seeds below, and random
//! inputs and mutations of the corpus drawn from a fixed seed, through the
//! same checks the fuzz targets run. A stable toolchain suffices, and
//! every finding fixed so far stays fixed: its input is in the corpus.
//!
//! `TOLLGATE_FUZZ_WRITE_SEEDS=1 cargo test` writes the seeds into the
//! corpus directories (`seed-*` files), for `cargo fuzz` to start from.

use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tollgate_fuzz::{WireCall, method_index, wire_input};
use tollgate_proto::v1;

/// Random inputs and mutations per target.
const RANDOM_INPUTS: usize = 300;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `fuzz/`, where `cargo fuzz` keeps the corpus and the regressions.
fn fuzz_dir() -> PathBuf {
    root().join("fuzz")
}

fn corpus_dir(target: &str) -> PathBuf {
    fuzz_dir().join("corpus").join(target)
}

fn call(path: &str, message: &impl Message) -> WireCall {
    WireCall {
        method: method_index(path),
        message: message.encode_to_vec(),
    }
}

fn admin(method: &str, message: &impl Message) -> WireCall {
    call(&format!("/tollgate.v1.Admin/{method}"), message)
}

/// A tier with a per-key and a shared bucket, a tenant on it, and one call
/// of every pod-facing method for that tenant.
fn wire_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let tier = admin(
        "PutTier",
        &v1::PutTierRequest {
            tier: Some(v1::Tier {
                name: "pro".into(),
                buckets: vec![
                    v1::BucketDefinition {
                        bucket: "per-user".into(),
                        refill_rate: 1.0,
                        burst_limit: 10.0,
                        initial_tokens: None,
                        kind: v1::BucketKind::PerKey as i32,
                        quota: None,
                        enforce: None,
                    },
                    v1::BucketDefinition {
                        bucket: "emails".into(),
                        refill_rate: 5.0,
                        burst_limit: 50.0,
                        initial_tokens: Some(20.0),
                        kind: v1::BucketKind::Shared as i32,
                        quota: None,
                        enforce: None,
                    },
                ],
                ..v1::Tier::default()
            }),
            dry_run: false,
        },
    );
    let tenant = admin(
        "CreateTenant",
        &v1::CreateTenantRequest {
            tenant_id: "acme".into(),
            tier: "pro".into(),
        },
    );
    let limits = admin(
        "UpdateTenantResourceLimits",
        &v1::UpdateTenantResourceLimitsRequest {
            tenant_id: "acme".into(),
            available_tokens: 100.0,
            refill_rate: 10.0,
            burst_limit: 1000.0,
            ..v1::UpdateTenantResourceLimitsRequest::default()
        },
    );
    let token_bucket = call(
        "/tollgate.v1.TokenBucketService/TokenBucket",
        &v1::TokenBucketRequest {
            tenant_id: "acme".into(),
            instance_id: 1,
            instance_lease: b"lease".to_vec(),
            seq: 1,
            requested_tokens: 50.0,
            shares: 1.0,
            target_request_period: Some(tollgate_proto::duration(Duration::from_secs(10))),
            consumption_since_last_request: Some(v1::Consumption {
                request_units: 5.0,
                ..v1::Consumption::default()
            }),
            next_live_instance_id: Some(1),
            returned_tokens: 1.0,
            held_tokens: 0.0,
            fallback_tokens: 2.0,
            fallback_duration: Some(tollgate_proto::duration(Duration::from_secs(1))),
            ..v1::TokenBucketRequest::default()
        },
    );
    let check = call(
        "/tollgate.v1.KeyLimits/Check",
        &v1::CheckRequest {
            items: vec![v1::CheckItem {
                tenant_id: "acme".into(),
                bucket: "per-user".into(),
                key: "alice".into(),
                tokens: 1.0,
                request_id: "r1".into(),
            }],
        },
    );
    let envoy = call(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        &RateLimitRequest {
            domain: "acme".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![
                    Entry {
                        key: "generic_key".into(),
                        value: "per-user".into(),
                    },
                    Entry {
                        key: "user".into(),
                        value: "bob".into(),
                    },
                ],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 2,
        },
    );
    let partitions = call(
        "/tollgate.v1.PartitionLimits/PartitionLoad",
        &v1::PartitionLoadRequest {
            tenant_id: "acme".into(),
            instance_id: 1,
            known_limits_version: 0,
            hot_partitions: vec![v1::HotPartition {
                table: "orders".into(),
                op: v1::PartitionOp::Write.into(),
                partition_hash: 7,
                rate: 100.0,
            }],
            report_period: Some(tollgate_proto::duration(Duration::from_secs(10))),
        },
    );
    let table_limits = admin(
        "SetTableLimits",
        &v1::SetTableLimitsRequest {
            tenant_id: "acme".into(),
            limits: Some(v1::TableLimits {
                table: "orders".into(),
                max_writes_per_second: Some(50.0),
                ..v1::TableLimits::default()
            }),
        },
    );
    let reads = [
        admin(
            "GetTenant",
            &v1::GetTenantRequest {
                tenant_id: "acme".into(),
                bucket: String::new(),
            },
        ),
        admin("ListTenants", &v1::ListTenantsRequest::default()),
        admin(
            "DescribeTenant",
            &v1::DescribeTenantRequest {
                tenant_id: "acme".into(),
            },
        ),
    ];
    let delete = admin(
        "DeleteTenant",
        &v1::DeleteTenantRequest {
            tenant_id: "acme".into(),
            dry_run: false,
        },
    );
    let mut everything = vec![
        tier.clone(),
        tenant.clone(),
        limits,
        token_bucket.clone(),
        check.clone(),
        envoy.clone(),
        table_limits,
        partitions.clone(),
    ];
    everything.extend(reads);
    everything.push(delete);
    vec![
        ("seed-everything", wire_input(&everything)),
        ("seed-token-bucket", wire_input(&[token_bucket])),
        (
            "seed-check",
            wire_input(&[tier.clone(), tenant.clone(), check]),
        ),
        ("seed-envoy", wire_input(&[tier, tenant, envoy])),
        ("seed-partitions", wire_input(&[partitions])),
    ]
}

fn text_seeds(target: &str) -> Vec<(&'static str, Vec<u8>)> {
    let root = root();
    let read = |path: &str| std::fs::read(root.join(path)).expect("a seed file");
    match target {
        "workload" => vec![
            ("seed-steps", read("sim/workloads/steps.yaml")),
            ("seed-outage", read("sim/workloads/outage.yaml")),
            ("seed-spikes", read("sim/workloads/spikes.yaml")),
        ],
        "config" => vec![(
            "seed-all",
            [
                "listen = \"127.0.0.1:50051\"\nstore = \"postgres://db/tollgate\"\npg-pool-size = 8\ninactivity-timeout = \"60s\"\ngrant-policy = \"shares\"\n",
                "TOLLGATE_LOG_FORMAT=json\nTOLLGATE_MAX_PENDING_REQUESTS=64\n",
                "alice 0123456789abcdef-alice\nbob 0123456789abcdef-bob read-only\n",
                "acme 0123456789abcdef-acme acme,globex\nall 0123456789abcdef-all *\n",
            ]
            .join("\0")
            .into_bytes(),
        )],
        _ => Vec::new(),
    }
}

/// Bytes that make a well-formed `bucket_sequences` input often enough.
fn bucket_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut rng = StdRng::seed_from_u64(7);
    (0..4)
        .map(|i| {
            let names = ["seed-0", "seed-1", "seed-2", "seed-3"];
            let bytes: Vec<u8> = (0..2048).map(|_| rng.random()).collect();
            (names[i], bytes)
        })
        .collect()
}

/// Four valid keys' limits (refill rate, burst limit), then bytes for the
/// steps.
fn key_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut rng = StdRng::seed_from_u64(11);
    let limits: [f64; 8] = [1.0, 10.0, 0.5, 3.0, 0.0, 4.0, 100.0, 1000.0];
    ["seed-0", "seed-1", "seed-2", "seed-3"]
        .into_iter()
        .map(|name| {
            let mut bytes: Vec<u8> = limits.iter().flat_map(|v| v.to_le_bytes()).collect();
            bytes.extend((0..1024).map(|_| rng.random::<u8>()));
            (name, bytes)
        })
        .collect()
}

fn seeds(target: &str) -> Vec<(&'static str, Vec<u8>)> {
    match target {
        "wire" => wire_seeds(),
        "bucket_sequences" => bucket_seeds(),
        "key_sequences" => key_seeds(),
        _ => text_seeds(target),
    }
}

/// Runs `check` on the seeds, the corpus and random inputs of `target`.
fn replay(target: &str, check: fn(&[u8])) {
    let dir = corpus_dir(target);
    let seeds = seeds(target);
    if std::env::var_os("TOLLGATE_FUZZ_WRITE_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).expect("corpus directory");
        for (name, bytes) in &seeds {
            std::fs::write(dir.join(name), bytes).expect("write a seed");
        }
    }
    let mut inputs: Vec<Vec<u8>> = seeds.into_iter().map(|(_, bytes)| bytes).collect();
    // The corpus, and the inputs of findings fixed (kept apart, so that
    // minimising the corpus never drops them).
    // Every target has a checked-in corpus; a target may have no
    // regressions yet.
    let regressions = fuzz_dir().join("regressions").join(target);
    for (dir, required) in [(&dir, true), (&regressions, false)] {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if required => panic!("the corpus of {target} at {}: {e}", dir.display()),
            Err(_) => continue,
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
        paths.sort();
        assert!(
            !required || !paths.is_empty(),
            "the corpus of {target} at {} is empty",
            dir.display()
        );
        for path in paths {
            inputs.push(std::fs::read(&path).expect("a corpus file"));
        }
    }
    let mut rng = StdRng::seed_from_u64(0x7011_6a7e);
    let known = inputs.len();
    for _ in 0..RANDOM_INPUTS {
        let mut input = inputs[rng.random_range(0..known)].clone();
        if input.is_empty() || rng.random_bool(0.3) {
            let len = rng.random_range(0..512);
            input = (0..len).map(|_| rng.random()).collect();
        } else {
            for _ in 0..rng.random_range(1..8) {
                let at = rng.random_range(0..input.len());
                input[at] ^= 1 << rng.random_range(0..8);
            }
        }
        inputs.push(input);
    }
    for input in &inputs {
        check(input);
    }
}

#[test]
fn wire() {
    replay("wire", tollgate_fuzz::wire);
}

#[test]
fn bucket_sequences() {
    replay("bucket_sequences", tollgate_fuzz::bucket_sequences);
}

#[test]
fn key_sequences() {
    replay("key_sequences", tollgate_fuzz::key_sequences);
}

#[test]
fn workload() {
    replay("workload", tollgate_fuzz::workload);
}

#[test]
fn config() {
    replay("config", tollgate_fuzz::config);
}

/// The seeds really exercise the server: every call of the full sequence is
/// answered OK.
#[test]
fn the_wire_seeds_are_served() {
    let (_, everything) = wire_seeds().remove(0);
    let calls = tollgate_fuzz::wire_calls(&everything);
    assert_eq!(calls.len(), 12);
    assert_eq!(wire_input(&calls), everything);
    for (path, code, message) in tollgate_fuzz::wire_answers(&everything) {
        assert_eq!(code, 0, "{path}: {message}");
    }
}
