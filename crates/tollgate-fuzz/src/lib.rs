//! The checks behind Tollgate's fuzz targets, one function per target,
//! each taking the fuzzer's bytes. `fuzz_targets/` hands them to
//! libFuzzer (`cargo fuzz run <target>`); `tests/corpus.rs` replays the
//! checked-in corpus and random inputs through them on a stable toolchain,
//! which is the smoke `.ci/run` runs.
//!
//! - [`wire`]: calls of every gRPC method a client may send, raw bytes as
//!   they come, through the server's own service stack over an in-memory
//!   store: decoding, validation at the edge, the store and the answer.
//!   No answer may be INTERNAL or UNKNOWN (a bug of ours), whatever the
//!   bytes.
//! - [`bucket_sequences`]: requests, retries, reconfigurations and clock
//!   steps (forwards and back) against the global bucket's state machine,
//!   with its invariants checked after every step.
//! - [`key_sequences`]: checks of several items and clock steps against
//!   per-key buckets: all or nothing, and never more than burst plus
//!   refill from any key.
//! - [`workload`]: the simulator's workload parser (YAML).
//! - [`config`]: `tollgate serve`'s configuration (its TOML file and
//!   `TOLLGATE_*` variables) and both credentials files.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use http_body_util::{BodyExt, Full};
use prost::Message;
use tollgate_core::global_bucket::{
    BucketRow, BucketRows, GlobalBucketConfig, GrantPolicy, InstanceId, Limits, LimitsMask,
    LimitsUpdate, TokenBucketRequest, reconfigure, request,
};
use tollgate_core::{Consumption, Timestamp};
use tollgate_proto::v1::admin_server::AdminServer;
use tollgate_proto::v1::key_limits_server::KeyLimitsServer;
use tollgate_proto::v1::partition_limits_server::PartitionLimitsServer;
use tollgate_proto::v1::token_bucket_service_server::TokenBucketServiceServer;
use tollgate_server::service::edge::{Edge, EdgeLayer};
use tollgate_server::service::{
    AdminAuth, AdminService, EnvoyRateLimitService, KeyLimitsService, PartitionLimitsService,
    TokenBucketService,
};
use tollgate_server::store::{BucketSettings, EmbeddedStore, Store};
use tonic::service::Routes;
use tower::{Layer, Service};

/// The pod-facing methods; the `Admin` ones are read from the descriptor
/// the server publishes ([`methods`]).
const POD_METHODS: [&str; 4] = [
    "/tollgate.v1.TokenBucketService/TokenBucket",
    "/tollgate.v1.KeyLimits/Check",
    "/tollgate.v1.PartitionLimits/PartitionLoad",
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
];

/// Calls one input may make, on one fresh store.
const MAX_CALLS: usize = 16;

/// Every gRPC method a client may call, by path.
pub fn methods() -> &'static [String] {
    static METHODS: OnceLock<Vec<String>> = OnceLock::new();
    METHODS.get_or_init(|| {
        let set = prost_types_set();
        let mut methods: Vec<String> = POD_METHODS.iter().map(|m| (*m).to_owned()).collect();
        for file in &set.file {
            for service in &file.service {
                if service.name() == "Admin" {
                    for method in &service.method {
                        methods.push(format!(
                            "/{}.{}/{}",
                            file.package(),
                            service.name(),
                            method.name()
                        ));
                    }
                }
            }
        }
        methods
    })
}

fn prost_types_set() -> prost_types::FileDescriptorSet {
    prost_types::FileDescriptorSet::decode(tollgate_proto::FILE_DESCRIPTOR_SET)
        .expect("the server's descriptor set decodes")
}

/// One call of a [`wire`] input: a method (by its index in [`methods`],
/// modulo their number) and the message's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireCall {
    pub method: u8,
    pub message: Vec<u8>,
}

/// Splits a [`wire`] input into calls: each is a method byte, a
/// little-endian `u16` length and that many bytes (fewer at the end).
pub fn wire_calls(data: &[u8]) -> Vec<WireCall> {
    let mut calls = Vec::new();
    let mut rest = data;
    while let [method, lo, hi, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(tail.len());
        calls.push(WireCall {
            method: *method,
            message: tail[..len].to_vec(),
        });
        rest = &tail[len..];
        if calls.len() == MAX_CALLS {
            break;
        }
    }
    calls
}

/// The inverse of [`wire_calls`], for writing seeds.
pub fn wire_input(calls: &[WireCall]) -> Vec<u8> {
    let mut data = Vec::new();
    for call in calls {
        let len = u16::try_from(call.message.len()).expect("a seed message under 64 KiB");
        data.push(call.method);
        data.extend_from_slice(&len.to_le_bytes());
        data.extend_from_slice(&call.message);
    }
    data
}

/// The index in [`methods`] of the method `path`.
pub fn method_index(path: &str) -> u8 {
    let index = methods()
        .iter()
        .position(|m| m == path)
        .unwrap_or_else(|| panic!("no method {path}"));
    u8::try_from(index).expect("fewer than 256 methods")
}

type Services = Edge<Routes>;

/// What `tollgate serve` answers with, stacked as it stacks it (the edge
/// layer outside every service), over `store`.
fn services(store: std::sync::Arc<dyn Store>) -> Services {
    let checks = KeyLimitsService::new(std::sync::Arc::clone(&store));
    let routes = Routes::new(TokenBucketServiceServer::new(TokenBucketService::new(
        std::sync::Arc::clone(&store),
    )))
    .add_service(KeyLimitsServer::new(checks.clone()))
    .add_service(PartitionLimitsServer::new(PartitionLimitsService::new(
        std::sync::Arc::clone(&store),
    )))
    .add_service(RateLimitServiceServer::new(EnvoyRateLimitService::new(
        checks,
    )))
    .add_service(AdminAuth::new(None).guard(AdminServer::new(AdminService::new(store))));
    EdgeLayer.layer(routes)
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a tokio runtime")
    })
}

/// Sends `message` as one unary call to `path` and returns the answer's
/// `grpc-status` and `grpc-message`.
async fn call(services: &Services, path: &str, message: &[u8]) -> (i32, String) {
    let mut frame = Vec::with_capacity(message.len() + 5);
    frame.push(0);
    frame.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    frame.extend_from_slice(message);
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("http://tollgate{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(Full::new(Bytes::from(frame))))
        .expect("a valid request");
    let mut service = services.clone();
    std::future::poll_fn(|cx| {
        <Services as Service<http::Request<tonic::body::Body>>>::poll_ready(&mut service, cx)
    })
    .await
    .unwrap_or_else(|e: Infallible| match e {});
    let response = match service.call(request).await {
        Ok(response) => response,
        Err(e) => match e {},
    };
    let status = |headers: &http::HeaderMap| {
        let code = headers
            .get("grpc-status")?
            .to_str()
            .ok()?
            .parse::<i32>()
            .ok()?;
        let message = headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        Some((code, message))
    };
    if let Some(found) = status(response.headers()) {
        return found;
    }
    let collected = response
        .into_body()
        .collect()
        .await
        .expect("the answer's body is read in full");
    collected
        .trailers()
        .and_then(status)
        .expect("every answer carries a grpc-status")
}

/// gRPC's INTERNAL and UNKNOWN: what alerts treat as a bug of ours.
const SERVER_BUGS: [i32; 2] = [13, 2];

/// Every call of a [`wire`] input, made in turn on a fresh in-memory
/// store: the method's path and the answer's code and message.
pub fn wire_answers(data: &[u8]) -> Vec<(String, i32, String)> {
    let calls = wire_calls(data);
    if calls.is_empty() {
        return Vec::new();
    }
    runtime().block_on(async {
        let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(
            EmbeddedStore::in_memory(BucketSettings::default()).expect("an in-memory store"),
        );
        let services = services(std::sync::Arc::clone(&store));
        let methods = methods();
        let mut answers = Vec::new();
        for one in &calls {
            let path = &methods[usize::from(one.method) % methods.len()];
            let (code, message) = call(&services, path, &one.message).await;
            answers.push((path.clone(), code, message));
        }
        store.close().await.expect("the store closes");
        answers
    })
}

/// The [`wire`] check: every call of the input is answered with a status
/// a client may cause, never INTERNAL or UNKNOWN.
pub fn wire(data: &[u8]) {
    for (path, code, message) in wire_answers(data) {
        assert!(
            !SERVER_BUGS.contains(&code),
            "{path} answered code {code}: {message}\ninput: {data:?}"
        );
    }
}

/// What the global bucket starts as in a [`bucket_sequences`] input.
#[derive(Arbitrary, Debug)]
struct Setup {
    refill_rate: f64,
    burst_limit: f64,
    initial_tokens: f64,
    policy: u8,
}

/// Which sequence number a request carries.
#[derive(Arbitrary, Debug)]
enum Seq {
    Next,
    Same,
    Older,
    Any(u64),
}

/// One step of a [`bucket_sequences`] input.
#[derive(Arbitrary, Debug)]
enum Step {
    Request {
        instance: u8,
        incarnation: u8,
        seq: Seq,
        requested_tokens: f64,
        shares: f64,
        period_ms: u32,
        request_unit_micros: u64,
        read_bytes: u64,
        next_live: Option<u8>,
        returned_tokens: f64,
        held_tokens: f64,
        fallback_tokens: f64,
        fallback_ms: u32,
    },
    Reconfigure {
        refill_rate: f64,
        burst_limit: f64,
        available_tokens: f64,
        as_of_ago_ms: Option<u32>,
        as_of_consumed_tokens: f64,
    },
    Advance {
        ms: i32,
    },
}

/// The [`bucket_sequences`] check: after every step, a refused request,
/// a refused reconfiguration and a duplicate changed nothing; the
/// instance list is consistent; totals never decreased; tokens are finite;
/// a grant is finite, not negative, trickled over at most the period, and
/// takes the bucket no lower than two periods of refill into debt (or
/// where it already was), less the fallback tokens the request reports;
/// and no request lifts the bucket above its burst limit (or where it
/// already was).
pub fn bucket_sequences(data: &[u8]) {
    let mut input = Unstructured::new(data);
    let Ok(setup) = Setup::arbitrary(&mut input) else {
        return;
    };
    let limits = Limits {
        refill_rate: setup.refill_rate,
        burst_limit: setup.burst_limit,
    };
    if limits.validate().is_err() || !(0.0..=1e12).contains(&setup.initial_tokens) {
        return;
    }
    let config = GlobalBucketConfig {
        policy: match setup.policy % 3 {
            0 => GrantPolicy::Shares,
            1 => GrantPolicy::BucketLevelEma,
            _ => GrantPolicy::Greedy,
        },
        ..GlobalBucketConfig::default()
    };
    let mut now_ms: i64 = 1_000_000;
    let at = |ms: i64| Timestamp::from_unix_micros(ms.saturating_mul(1000));
    let mut rows = BucketRows {
        head: BucketRow::new(limits, setup.initial_tokens, true, at(now_ms)),
        instances: BTreeMap::new(),
    };
    let mut seqs: HashMap<(InstanceId, u8), u64> = HashMap::new();
    for _ in 0..64 {
        let Ok(step) = Step::arbitrary(&mut input) else {
            break;
        };
        let before = rows.clone();
        match step {
            Step::Advance { ms } => now_ms = now_ms.saturating_add(i64::from(ms)).max(0),
            Step::Reconfigure {
                refill_rate,
                burst_limit,
                available_tokens,
                as_of_ago_ms,
                as_of_consumed_tokens,
            } => {
                let update = LimitsUpdate {
                    available_tokens,
                    limits: Limits {
                        refill_rate,
                        burst_limit,
                    },
                    as_of: as_of_ago_ms.map(|ago| at(now_ms - i64::from(ago))),
                    as_of_consumed_tokens,
                    mask: LimitsMask::ALL,
                };
                if reconfigure(&mut rows.head, &update, at(now_ms)).is_err() {
                    assert_eq!(rows, before, "a refused reconfiguration changed the bucket");
                }
            }
            Step::Request {
                instance,
                incarnation,
                seq,
                requested_tokens,
                shares,
                period_ms,
                request_unit_micros,
                read_bytes,
                next_live,
                returned_tokens,
                held_tokens,
                fallback_tokens,
                fallback_ms,
            } => {
                let instance_id = InstanceId::from(instance % 8);
                let last = seqs.entry((instance_id, incarnation % 3)).or_insert(0);
                let seq = match seq {
                    Seq::Next => last.saturating_add(1),
                    Seq::Same => *last,
                    Seq::Older => last.saturating_sub(1),
                    Seq::Any(n) => n,
                };
                *last = (*last).max(seq);
                let period = Duration::from_millis(u64::from(period_ms));
                let req = TokenBucketRequest {
                    instance_id,
                    lease: vec![b'l', incarnation % 3],
                    seq,
                    requested_tokens,
                    shares,
                    target_request_period: period,
                    consumption: Consumption {
                        request_unit_micros,
                        read_bytes,
                        ..Consumption::default()
                    },
                    next_live_instance_id: next_live.map(|n| InstanceId::from(n % 8)),
                    returned_tokens,
                    held_tokens,
                    fallback_tokens,
                    fallback_duration: Duration::from_millis(u64::from(fallback_ms)),
                };
                let tokens_before = rows.head.state.tokens;
                match request(&mut rows, &req, at(now_ms), &config) {
                    Err(_) => assert_eq!(rows, before, "a refused request changed the bucket"),
                    Ok(outcome) if outcome.duplicate => {
                        assert_eq!(rows, before, "a duplicate changed the bucket");
                    }
                    Ok(outcome) => {
                        let grant = outcome.grant;
                        assert!(
                            grant.granted_tokens.is_finite() && grant.granted_tokens >= 0.0,
                            "granted {}",
                            grant.granted_tokens
                        );
                        assert!(grant.fallback_rate.is_finite() && grant.fallback_rate >= 0.0);
                        assert!(grant.trickle_duration <= period, "trickled past the period");
                        let rate = rows.head.state.limits.refill_rate;
                        // What the pod used on its fallback rate while
                        // it could not reach the server is charged as it
                        // is, on top of the debt grants may make.
                        let floor = tokens_before.min(-2.0 * rate * period.as_secs_f64())
                            - req.fallback_tokens;
                        // Rounding: a few units in the last place of the
                        // largest amount the step added or took.
                        let scale = floor
                            .abs()
                            .max(tokens_before.abs())
                            .max(grant.granted_tokens)
                            .max(req.returned_tokens.abs())
                            .max(req.fallback_tokens.abs())
                            .max(1.0);
                        let slack = 1e-12 * scale;
                        assert!(
                            rows.head.state.tokens >= floor - slack,
                            "tokens {} below {floor} (before {tokens_before}, granted {})",
                            rows.head.state.tokens,
                            grant.granted_tokens
                        );
                        // Refill and returned tokens stop at the burst
                        // limit (a level an operator set above it is kept).
                        let ceiling = rows.head.state.limits.burst_limit.max(tokens_before);
                        assert!(
                            rows.head.state.tokens <= ceiling + slack,
                            "tokens {} above {ceiling}",
                            rows.head.state.tokens
                        );
                    }
                }
            }
        }
        assert!(rows.head.state.tokens.is_finite(), "tokens not finite");
        assert!(
            rows.head
                .totals
                .consumption
                .dominates(&before.head.totals.consumption),
            "consumption decreased"
        );
        assert!(
            rows.head.totals.granted_tokens >= before.head.totals.granted_tokens,
            "granted tokens decreased"
        );
        if let Err(e) = rows.check_whole_list() {
            panic!("{e}");
        }
    }
}

/// One step of a [`key_sequences`] input.
#[derive(Arbitrary, Debug)]
enum KeyStep {
    Check { items: Vec<(u8, f64)> },
    Advance { ms: i32 },
}

/// The [`key_sequences`] check, on up to four keys of per-key buckets
/// (`key_bucket::check`, the rule behind `KeyLimits/Check` and Envoy's
/// `ShouldRateLimit`), after every step: a check takes all its items'
/// tokens or none; a refused check leaves every key as it was; a key holds
/// between 0 and its burst; a refused item's `retry_after` is when its
/// tokens will be there; and over the whole run no key has given more
/// than its burst plus its refill over the time elapsed: per-key limits
/// are exact. Keys 2 and 3 also have a daily quota (half their burst, at
/// least one token): every answer's remaining quota lies between none and
/// the quota, and, while the clock moves on, no cycle gives a key more
/// than its quota. Key 3 is in shadow mode in half the runs (when its
/// refill rate's lowest bit is set, so that inputs decode as before): a
/// check is refused only for the enforcing keys' items; an allowed check
/// takes every enforcing key's items, and a shadow key's too or none
/// (none exactly when one of its items is marked `shadow_refused`); the
/// bounds hold for every key.
pub fn key_sequences(data: &[u8]) {
    use tollgate_core::budget::{CycleRule, Period, Quota};
    use tollgate_core::key_bucket::{CheckItem, KeySlot, KeyState, check, validate_tokens};
    let mut input = Unstructured::new(data);
    let Ok(raw_limits) = <[(f64, f64); 4]>::arbitrary(&mut input) else {
        return;
    };
    let limits: Vec<Limits> = raw_limits
        .iter()
        .map(|&(refill_rate, burst_limit)| Limits {
            refill_rate,
            burst_limit,
        })
        .collect();
    if limits.iter().any(|l| l.validate().is_err()) {
        return;
    }
    let shadow = |slot: usize| slot == 3 && raw_limits[3].0.to_bits() & 1 == 1;
    let start_ms: i64 = 1_000_000;
    let mut now_ms = start_ms;
    // The window the run spans, whichever way the clock stepped.
    let (mut earliest_ms, mut latest_ms) = (start_ms, start_ms);
    let at = |ms: i64| Timestamp::from_unix_micros(ms.saturating_mul(1000));
    let quotas: Vec<Option<Quota>> = limits
        .iter()
        .enumerate()
        .map(|(i, l)| {
            (i >= 2).then(|| Quota {
                amount: (l.burst_limit / 2.0).max(1.0),
                cycle: CycleRule::utc(Period::Daily),
            })
        })
        .collect();
    let mut per_cycle: HashMap<(usize, i64), f64> = HashMap::new();
    let mut states: Vec<Option<KeyState>> = vec![None; limits.len()];
    let mut taken = vec![0.0_f64; limits.len()];
    for _ in 0..64 {
        let Ok(step) = KeyStep::arbitrary(&mut input) else {
            break;
        };
        let items = match step {
            KeyStep::Advance { ms } => {
                now_ms = now_ms.saturating_add(i64::from(ms)).max(0);
                earliest_ms = earliest_ms.min(now_ms);
                latest_ms = latest_ms.max(now_ms);
                continue;
            }
            KeyStep::Check { items } => items,
        };
        let items: Vec<CheckItem> = items
            .into_iter()
            .take(8)
            .map(|(slot, tokens)| CheckItem {
                slot: usize::from(slot) % limits.len(),
                tokens,
            })
            .collect();
        // What the edge refuses never reaches the rule.
        if items.is_empty()
            || items
                .iter()
                .any(|i| validate_tokens("tokens", i.tokens).is_err())
        {
            continue;
        }
        let now = at(now_ms);
        let slots: Vec<KeySlot> = limits
            .iter()
            .zip(&states)
            .zip(&quotas)
            .enumerate()
            .map(|(i, ((&limits, &state), quota))| KeySlot {
                limits,
                quota: quota.clone(),
                state,
                enforce: !shadow(i),
            })
            .collect();
        let before: Vec<f64> = slots
            .iter()
            .map(|s| KeyState::level(s.state.as_ref(), &s.limits, now))
            .collect();
        let outcome = check(&slots, &items, now);
        let mut asked = vec![0.0_f64; limits.len()];
        for item in &items {
            asked[item.slot] += item.tokens;
        }
        // Whether each key took its items: every key of an allowed check
        // but a shadow key whose items were short.
        let mut took = vec![outcome.allowed; limits.len()];
        for (i, slot) in slots.iter().enumerate() {
            let after = KeyState::level(outcome.states[i].as_ref(), &slot.limits, now);
            let burst = slot.limits.burst_limit;
            let slack = 1e-9 * burst.max(asked[i]).max(1.0);
            assert!(
                after >= -slack && after <= burst + slack,
                "key {i} holds {after}, burst {burst}"
            );
            let marked = items
                .iter()
                .zip(&outcome.answers)
                .any(|(item, answer)| item.slot == i && answer.shadow_refused);
            assert!(
                !marked || shadow(i),
                "key {i} enforces: none of its items is shadow_refused"
            );
            took[i] &= !marked;
            if took[i] {
                assert!(
                    (before[i] - asked[i] - after).abs() <= slack,
                    "key {i}: {} - {} != {after}",
                    before[i],
                    asked[i]
                );
                taken[i] += asked[i];
            } else {
                // A key that refilled to full may lose its row (full is
                // no row); its level is what it was.
                assert_eq!(after, before[i], "a refused check changed key {i}");
                if after < burst {
                    assert_eq!(outcome.states[i], slot.state, "key {i}");
                }
            }
        }
        if !outcome.allowed {
            assert!(
                items
                    .iter()
                    .zip(&outcome.answers)
                    .all(|(_, answer)| !answer.shadow_refused),
                "a refused check marks nothing shadow_refused"
            );
            for (item, answer) in items.iter().zip(&outcome.answers) {
                assert!(!answer.allowed);
                // Within the range of a timestamp (about 290 000 years).
                if let Some(wait) = answer
                    .retry_after
                    .filter(|w| w.as_secs() < 1_000_000_000_000)
                {
                    let slot = &slots[item.slot];
                    let later = at(now_ms.saturating_add(
                        i64::try_from(wait.as_millis()).unwrap_or(i64::MAX / 2) + 1,
                    ));
                    let level = KeyState::level(slot.state.as_ref(), &slot.limits, later);
                    let slack = 1e-9 * item.tokens.max(1.0);
                    assert!(
                        level >= item.tokens - slack || wait.is_zero(),
                        "after {wait:?} key {} holds {level}, not {}",
                        item.slot,
                        item.tokens
                    );
                }
            }
        }
        // Quotas: what is left is between none and the quota; and while
        // the clock has not stepped back, no cycle gives a key more than its
        // quota. (A clock that steps back across a boundary after a key's
        // row went meets a cycle the store no longer remembers: the bound
        // is stated for the store's clock, which only moves on.)
        let monotonic = now_ms == latest_ms;
        let mut counted = vec![false; limits.len()];
        for (item, answer) in items.iter().zip(&outcome.answers) {
            let Some(quota) = &quotas[item.slot] else {
                continue;
            };
            let Some(q) = answer.quota else {
                continue;
            };
            let slack = 1e-9 * quota.amount.max(1.0);
            assert!(
                q.remaining >= -slack && q.remaining <= quota.amount + slack,
                "key {}: {} left of {}",
                item.slot,
                q.remaining,
                quota.amount
            );
            if !monotonic || !took[item.slot] || counted[item.slot] {
                continue;
            }
            counted[item.slot] = true;
            let given = per_cycle
                .entry((item.slot, q.resets_at.unix_micros()))
                .or_insert(0.0);
            *given += asked[item.slot];
            assert!(
                *given <= quota.amount + slack,
                "key {} was given {given} in a cycle, quota {}",
                item.slot,
                quota.amount
            );
        }
        states = outcome.states;
        let elapsed = (latest_ms - earliest_ms) as f64 / 1000.0;
        for (i, l) in limits.iter().enumerate() {
            let bound = l.burst_limit + l.refill_rate * elapsed;
            assert!(
                taken[i] <= bound + 1e-9 * bound.max(1.0),
                "key {i} gave {} > burst {} + refill {}",
                taken[i],
                l.burst_limit,
                l.refill_rate * elapsed
            );
        }
    }
}

/// The [`workload`] check: any text parses or is refused, and a workload
/// that parses expands into its pods.
pub fn workload(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(workload) = tollgate_sim::workload::Workload::parse(text) {
        let _ = workload.pod_specs();
    }
}

/// The [`config`] check: a serve configuration file, `TOLLGATE_*`
/// variables (`NAME=VALUE` lines) and both credentials files, separated
/// by NUL bytes, are each accepted or refused with an error; nothing
/// panics.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.split('\0');
    let file = parts.next().unwrap_or_default();
    let variables: HashMap<String, String> = parts
        .next()
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    let env = |name: &str| variables.get(name).cloned();
    let file = tollgate::config::ConfigFile {
        path: "fuzz.toml".into(),
        text: file.to_owned(),
    };
    let _ = tollgate::config::ServeConfig::resolve(
        &tollgate::config::ServeOptions::default(),
        &env,
        Some(&file),
    );
    let _ = tollgate_server::service::AdminTokens::parse(parts.next().unwrap_or_default());
    let _ = tollgate_server::service::PodTokens::parse(parts.next().unwrap_or_default());
}
