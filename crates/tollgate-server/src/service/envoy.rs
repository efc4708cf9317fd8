//! Envoy's rate limit service API (`envoy.service.ratelimit.v3.RateLimitService`,
//! `ShouldRateLimit`), served as per-key checks.
//!
//! Envoy's `envoy.filters.http.ratelimit` filter (and Istio, which
//! configures it) asks a global rate limit service whether a request may
//! pass, describing it with *descriptors*: lists of key/value entries built
//! by the route's `rate_limits` actions. Serving that API on the gRPC port
//! lets a gateway limit with Tollgate's exact per-key buckets, defined in
//! tiers, without a client library or a service of its own.
//!
//! # The mapping rule
//!
//! - The request's `domain` is the tenant id.
//! - Each descriptor is one item of one check, and the check's items are
//!   taken all together or none ([`super::key_limits::run`], as
//!   `KeyLimits/Check`).
//! - If a descriptor's first entry has the key `generic_key` (Envoy's
//!   `generic_key` action), its value names the bucket and the values of
//!   the other entries, joined with `/`, make the key. Otherwise the first
//!   entry's key names the bucket, and the values of all entries, joined
//!   with `/`, make the key. So `[generic_key=api-calls-per-user,
//!   user=alice]` takes from key `alice` of bucket `api-calls-per-user`,
//!   and `[remote_address=10.0.0.7]` from key `10.0.0.7` of bucket
//!   `remote_address`.
//! - Tokens: the descriptor's own `hits_addend` if it is set (0 reads the
//!   key and takes nothing), else the request's `hits_addend`, where 0
//!   means 1 (Envoy's rule).
//!
//! A descriptor with no entries, or with nothing left for the key (a lone
//! `generic_key`), is refused naming `descriptors[i]`; so is an entry
//! with an empty value (`descriptors[i].entries[j].value`: Envoy sends
//! none, and `a/` would pass for `a` and an empty value), a `limit`
//! override (limits come from the tier) and `is_negative_hits` (a check
//! only takes). The rest is the native API's validation
//! (`CheckCall::try_from` a `CheckRequest`, in `tollgate-proto`) and the
//! store's, with the native field names
//! turned into the ones of this request ([`envoy_field`]): the bucket
//! (`descriptors[i].entries[0]`) must be a per-key bucket definition of
//! the tenant (NOT_FOUND if the tenant has none of that name,
//! INVALID_ARGUMENT for a shared bucket), the key at most 512 bytes
//! (`descriptors[i].entries`), the tokens at most 1e15
//! (`descriptors[i].hits_addend`). A deleted tenant gets NOT_FOUND and a
//! suspended one FAILED_PRECONDITION, as for `Check` (Envoy then lets the
//! request through or not as its `failure_mode_deny` says). A refused
//! request takes nothing.
//!
//! # The answer
//!
//! `overall_code` is OK if the check was allowed (every descriptor's tokens
//! were taken), OVER_LIMIT if not (none were: unlike Envoy's reference
//! service, which counts every descriptor's hits whatever the others
//! answer). Each descriptor's status says whether its own tokens were
//! there (OK or OVER_LIMIT), its key's remaining tokens (floored), when
//! the key will be full again (unset if never), and the bucket's refill
//! rate as a [`RateLimit`] ([`per_unit`]). Envoy builds its
//! `X-RateLimit-*` headers from those. An OVER_LIMIT answer also asks
//! Envoy to add a `retry-after` header ([`retry_after`]). When an item's
//! bucket has a calendar quota, the answer asks Envoy to add
//! `x-ratelimit-quota-remaining` (whole tokens left in the cycle) and
//! `x-ratelimit-quota-reset` (seconds until the cycle ends) for the
//! tightest quota of the check ([`tightest_quota`]).

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf;
use tollgate_core::InvalidInput;
use tollgate_core::budget::QuotaAnswer;
use tollgate_core::key_bucket::{CallAnswer, CheckCall, ItemResult};
use tollgate_proto::v1;
use tonic::{Request, Response, Status};

use super::{KeyLimitsService, key_limits, status};
use crate::store::StoreError;

/// The entry key of Envoy's `generic_key` action: its value names the
/// bucket.
pub const GENERIC_KEY: &str = "generic_key";

/// What joins a descriptor's values into a key.
pub const KEY_SEPARATOR: &str = "/";

/// Serves `ShouldRateLimit` through the same checks as `KeyLimits/Check`.
#[derive(Debug, Clone)]
pub struct EnvoyRateLimitService {
    checks: KeyLimitsService,
}

impl EnvoyRateLimitService {
    pub fn new(checks: KeyLimitsService) -> Self {
        EnvoyRateLimitService { checks }
    }
}

#[tonic::async_trait]
impl RateLimitService for EnvoyRateLimitService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let admitted = self
            .checks
            .gate()
            .enter("ShouldRateLimit", request, check_call)?;
        let answer = key_limits::run(&admitted)
            .await
            .map_err(|e| status("should_rate_limit", envoy_error(e)))?;
        let call = admitted.call();
        Ok(Response::new(response(call, &answer)))
    }
}

/// The check a request asks for, validated: the rules of this API here,
/// the native API's through `CheckCall::try_from` a `CheckRequest`.
fn check_call(request: RateLimitRequest) -> Result<CheckCall, InvalidInput> {
    let request_tokens = match request.hits_addend {
        0 => 1,
        n => n,
    };
    let items = request
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, descriptor)| check_item(&request.domain, i, descriptor, request_tokens))
        .collect::<Result<_, _>>()?;
    CheckCall::try_from(v1::CheckRequest { items }).map_err(|e| e.renamed(envoy_field))
}

/// Descriptor `i` as a native check item (on tenant `domain`).
fn check_item(
    domain: &str,
    i: usize,
    descriptor: RateLimitDescriptor,
    request_tokens: u32,
) -> Result<v1::CheckItem, InvalidInput> {
    let field = |name: &str| format!("descriptors[{i}]{name}");
    if descriptor.limit.is_some() {
        return Err(InvalidInput::new(
            field(".limit"),
            "limit overrides are not supported: limits come from the tenant's tier",
        ));
    }
    if descriptor.is_negative_hits {
        return Err(InvalidInput::new(
            field(".is_negative_hits"),
            "is not supported: a check only takes tokens",
        ));
    }
    if let Some(j) = descriptor.entries.iter().position(|e| e.value.is_empty()) {
        return Err(InvalidInput::new(
            field(&format!(".entries[{j}].value")),
            "must not be empty",
        ));
    }
    let (bucket, key) = bucket_and_key(&descriptor.entries).ok_or_else(|| {
        let reason = if descriptor.entries.is_empty() {
            "must have at least one entry"
        } else {
            "must have an entry after generic_key: its value makes the key"
        };
        InvalidInput::new(field(""), reason)
    })?;
    let tokens = match descriptor.hits_addend {
        // Exact up to 2^53; anything that large is refused anyway (more
        // than 1e15 tokens).
        Some(hits) => hits.value as f64,
        None => f64::from(request_tokens),
    };
    Ok(v1::CheckItem {
        tenant_id: domain.to_owned(),
        bucket: bucket.to_owned(),
        key,
        tokens,
        request_id: String::new(),
    })
}

/// The bucket a descriptor's entries name and the key they make (see the
/// module docs), or `None` if there is no entry or nothing left for the
/// key.
fn bucket_and_key(entries: &[Entry]) -> Option<(&str, String)> {
    let first = entries.first()?;
    let (bucket, key_entries) = if first.key == GENERIC_KEY {
        (first.value.as_str(), entries.get(1..)?)
    } else {
        (first.key.as_str(), entries)
    };
    if key_entries.is_empty() {
        return None;
    }
    let values: Vec<&str> = key_entries.iter().map(|e| e.value.as_str()).collect();
    Some((bucket, values.join(KEY_SEPARATOR)))
}

/// A native field name (`items[2].bucket`) as this API's request carries
/// the value (`descriptors[2].entries[0]`).
fn envoy_field(native: &str) -> String {
    if native == "items" {
        return "descriptors".to_owned();
    }
    let Some((index, rest)) = native
        .strip_prefix("items[")
        .and_then(|s| s.split_once(']'))
    else {
        return native.to_owned();
    };
    match rest {
        ".tenant_id" => "domain".to_owned(),
        ".bucket" => format!("descriptors[{index}].entries[0]"),
        ".key" => format!("descriptors[{index}].entries"),
        // Only a descriptor's own hits_addend can be out of range.
        ".tokens" => format!("descriptors[{index}].hits_addend"),
        _ => format!("descriptors[{index}]{rest}"),
    }
}

/// A store's error, the fields it names in this API's terms.
fn envoy_error(err: StoreError) -> StoreError {
    match err {
        StoreError::Check(e) => StoreError::Check(e.renamed(envoy_field)),
        other => other,
    }
}

/// The answer to an answered check; `call` is the check (an item per
/// descriptor, in order).
fn response(call: &CheckCall, answer: &CallAnswer) -> RateLimitResponse {
    let statuses = call
        .items
        .iter()
        .zip(&answer.items)
        .map(|(item, result)| descriptor_status(item.key.bucket.bucket.as_str(), result))
        .collect();
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    };
    let mut response_headers_to_add: Vec<HeaderValue> = if answer.allowed {
        Vec::new()
    } else {
        retry_after(answer)
            .map(|seconds| header("retry-after", seconds.to_string()))
            .into_iter()
            .collect()
    };
    if let Some(quota) = tightest_quota(answer) {
        response_headers_to_add.push(header(
            QUOTA_REMAINING_HEADER,
            saturating_u32(quota.remaining.floor()).to_string(),
        ));
        response_headers_to_add.push(header(
            QUOTA_RESET_HEADER,
            whole_seconds(quota.reset_after).to_string(),
        ));
    }
    RateLimitResponse {
        overall_code: code(answer.allowed).into(),
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

fn code(ok: bool) -> Code {
    if ok { Code::Ok } else { Code::OverLimit }
}

/// One descriptor's status: OK if its own tokens were there (taken if the
/// whole check was allowed), OVER_LIMIT if not.
fn descriptor_status(bucket: &str, result: &ItemResult) -> DescriptorStatus {
    let answer = &result.answer;
    let own_tokens_there = answer.allowed || answer.retry_after == Some(Duration::ZERO);
    let (requests_per_unit, unit) = per_unit(result.limits.refill_rate);
    DescriptorStatus {
        code: code(own_tokens_there).into(),
        current_limit: Some(RateLimit {
            name: bucket.to_owned(),
            requests_per_unit,
            unit: unit.into(),
        }),
        limit_remaining: saturating_u32(answer.remaining.floor()),
        duration_until_reset: answer.reset_after.map(duration),
        quota: None,
    }
}

/// Units of Envoy's `RateLimit`, smallest first, with their seconds.
const UNITS: [(Unit, f64); 4] = [
    (Unit::Second, 1.0),
    (Unit::Minute, 60.0),
    (Unit::Hour, 3_600.0),
    (Unit::Day, 86_400.0),
];

/// A refill rate (tokens per second) as Envoy's whole requests per unit:
/// in the smallest unit in which it is a whole number of at least 1
/// (1.5/s is 90 per MINUTE), else in the smallest in which it is at least
/// 1, rounded (π/s is 3 per SECOND); a rate below one a day is given
/// per DAY, rounded (0 for a bucket that does not refill). Saturates at
/// `u32::MAX`.
fn per_unit(refill_rate: f64) -> (u32, Unit) {
    let in_unit = |seconds: f64| refill_rate * seconds;
    let whole = |n: f64| n >= 1.0 && (n - n.round()).abs() <= n * 1e-9;
    let (unit, seconds) = UNITS
        .iter()
        .find(|(_, s)| whole(in_unit(*s)))
        .or_else(|| UNITS.iter().find(|(_, s)| in_unit(*s) >= 1.0))
        .copied()
        .unwrap_or((Unit::Day, 86_400.0));
    (saturating_u32(in_unit(seconds).round()), unit)
}

/// The `retry-after` value (whole seconds, rounded up) of a refused check:
/// the longest wait among its items whose tokens will be there, or `None`
/// if no such item has to wait (those refused will never have them).
fn retry_after(answer: &CallAnswer) -> Option<u64> {
    answer
        .items
        .iter()
        .filter_map(|item| item.answer.retry_after)
        .filter(|wait| !wait.is_zero())
        .max()
        .map(whole_seconds)
}

/// The header with what is left of the tightest quota among a check's
/// items (whole tokens, floored).
pub const QUOTA_REMAINING_HEADER: &str = "x-ratelimit-quota-remaining";
/// The header with the seconds (rounded up) until that quota's cycle ends.
pub const QUOTA_RESET_HEADER: &str = "x-ratelimit-quota-reset";

/// Of the quotas of a check's items, the one with the least left (the
/// earliest reset among equals).
fn tightest_quota(answer: &CallAnswer) -> Option<QuotaAnswer> {
    answer
        .items
        .iter()
        .filter_map(|item| item.answer.quota)
        .min_by(|a, b| {
            a.remaining
                .total_cmp(&b.remaining)
                .then(a.reset_after.cmp(&b.reset_after))
        })
}

/// A wait in whole seconds, rounded up.
fn whole_seconds(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// `value` (whole and not negative, or clamped so) as a `u32`.
fn saturating_u32(value: f64) -> u32 {
    if value.is_nan() || value <= 0.0 {
        0
    } else if value >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        value as u32
    }
}

fn duration(d: Duration) -> protobuf::Duration {
    let proto = tollgate_proto::duration(d);
    protobuf::Duration {
        seconds: proto.seconds,
        nanos: proto.nanos,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: &str) -> Entry {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn generic_key_names_the_bucket_and_the_other_values_make_the_key() {
        let entries = [
            entry("generic_key", "api-calls-per-user"),
            entry("user", "alice"),
            entry("method", "GET"),
        ];
        assert_eq!(
            bucket_and_key(&entries),
            Some(("api-calls-per-user", "alice/GET".to_owned()))
        );
        assert_eq!(bucket_and_key(&entries[..1]), None, "nothing for the key");
    }

    #[test]
    fn otherwise_the_first_key_names_the_bucket_and_every_value_makes_the_key() {
        let entries = [entry("remote_address", "10.0.0.7"), entry("path", "/a")];
        assert_eq!(
            bucket_and_key(&entries),
            Some(("remote_address", "10.0.0.7//a".to_owned()))
        );
        assert_eq!(bucket_and_key(&[]), None);
    }

    #[test]
    fn native_field_names_become_the_descriptors_fields() {
        let cases = [
            ("items", "descriptors"),
            ("items[0].tenant_id", "domain"),
            ("items[3].bucket", "descriptors[3].entries[0]"),
            ("items[12].key", "descriptors[12].entries"),
            ("items[1].tokens", "descriptors[1].hits_addend"),
            ("items[1].request_id", "descriptors[1].request_id"),
            ("domain", "domain"),
        ];
        for (native, envoy) in cases {
            assert_eq!(envoy_field(native), envoy, "{native}");
        }
    }

    #[test]
    fn refill_rates_are_whole_requests_per_the_smallest_fitting_unit() {
        let cases = [
            (10.0, 10, Unit::Second),
            (1.5, 90, Unit::Minute),
            (0.1, 6, Unit::Minute),
            (1.0 / 60.0, 1, Unit::Minute),
            (2.0 / 3.0, 40, Unit::Minute),
            (1.01, 3636, Unit::Hour),
            (std::f64::consts::PI, 3, Unit::Second),
            (1.0 / 3600.0, 1, Unit::Hour),
            (1.0 / 86_400.0, 1, Unit::Day),
            (1.0 / 200_000.0, 0, Unit::Day),
            (0.0, 0, Unit::Day),
            (1e15, u32::MAX, Unit::Second),
        ];
        for (rate, requests, unit) in cases {
            assert_eq!(per_unit(rate), (requests, unit), "{rate}/s");
        }
    }

    #[test]
    fn counts_saturate_into_u32() {
        assert_eq!(saturating_u32(-0.0), 0);
        assert_eq!(saturating_u32(f64::NAN), 0);
        assert_eq!(saturating_u32(7.0), 7);
        assert_eq!(saturating_u32(1e12), u32::MAX);
    }
}
