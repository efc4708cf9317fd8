//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`,
//! `ShouldRateLimit`) on the agent's `--envoy-listen` port: a tenant's
//! shared buckets answered from the agent's local buckets, without a round
//! trip; per-key buckets passed to the server as before.
//!
//! # The mapping
//!
//! The request's `domain` is the tenant. A descriptor that is a lone
//! `generic_key` entry (`[generic_key=api-calls]`, Envoy's `generic_key`
//! action alone) names one of the tenant's **shared** buckets: it takes
//! its tokens from the agent's local bucket of that name at once, or is
//! over the limit, never waiting (the global limit is kept by the
//! protocol behind the local bucket). Every other descriptor is a per-key
//! check, mapped as the server maps it (docs/envoy.md), and all of them
//! go to the server's `ShouldRateLimit` in one call. Tokens: the
//! descriptor's own `hits_addend` if set, else the request's, where 0
//! means 1 (Envoy's rule).
//!
//! # All or none
//!
//! The local descriptors are taken first. If any of them is over its
//! limit, those taken are given back, the server is not asked (nothing is
//! taken there either) and the answer is OVER_LIMIT. If all were taken,
//! the per-key descriptors go to the server; if it answers OVER_LIMIT, or
//! fails, the local tokens are given back (unless the local bucket
//! reported them to the server meanwhile: then they stay charged, as the
//! server's totals never go back). Each local take and give-back is an
//! ordinary TryAcquire and Return ([`Agent::settle`]), so the journal sees
//! them as it sees any call.
//!
//! # The answer
//!
//! `overall_code` OK if every descriptor's tokens were taken, else
//! OVER_LIMIT. A local descriptor's status: OK if its tokens were there,
//! else OVER_LIMIT; `limit_remaining` the local bucket's tokens after the
//! check, rounded down; no `current_limit` or `duration_until_reset` (the
//! local bucket knows neither the global limit nor when it would be
//! full). A per-key descriptor's status is the server's; UNKNOWN when the
//! server was not asked.
//!
//! # Who may call
//!
//! Envoy is a TCP caller: it must send the tenant's token as
//! `authorization: Bearer <token>` (the gRPC service's `initial_metadata`
//! in Envoy's configuration), as the agent's `--access` file sets it.
//!
//! A descriptor the agent refuses is refused as the server refuses one,
//! naming the field in the request's terms: a lone `generic_key` with an
//! empty value (`descriptors[i].entries[0].value`), a bucket name that is
//! not valid (`descriptors[i].entries[0].value`), a `hits_addend` above
//! 1e15, a `limit` override or `is_negative_hits`. A lone `generic_key`
//! naming a bucket the tenant does not have answers from the initial
//! allowance until the server refuses the bucket, then NOT_FOUND.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_core::validate::{self, MAX_TOKENS};
use tollgate_core::{BucketName, InvalidInput, TenantId};
use tonic::{Request, Response, Status};

use crate::Agent;
use crate::access::Caller;
use crate::calls::{Answer, Call, CallRequest};
use crate::error::AgentError;

/// The entry key of Envoy's `generic_key` action.
pub const GENERIC_KEY: &str = "generic_key";

/// Serves `ShouldRateLimit` for an [`Agent`].
#[derive(Clone, Debug)]
pub struct EnvoyService {
    agent: Agent,
}

impl EnvoyService {
    pub fn new(agent: Agent) -> EnvoyService {
        EnvoyService { agent }
    }
}

/// A descriptor answered by a local bucket: its place in the request,
/// its bucket and tokens.
#[derive(Debug)]
struct Local {
    index: usize,
    bucket: BucketName,
    tokens: f64,
}

#[tonic::async_trait]
impl RateLimitService for EnvoyService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let caller = crate::grpc::caller(&request);
        let deadline = crate::grpc::deadline(&request);
        let result = self
            .agent
            .should_rate_limit(&caller, request.into_inner(), deadline)
            .await;
        let code = result
            .as_ref()
            .map_or_else(AgentError::code, |_| tonic::Code::Ok);
        self.agent.metrics().call("ShouldRateLimit", code);
        match result {
            Ok(answer) => Ok(Response::new(answer)),
            Err(AgentError::Internal(message)) => {
                tracing::error!(error = %message, "ShouldRateLimit failed inside the agent");
                Err(Status::internal(message))
            }
            Err(e) => Err(e.to_status()),
        }
    }
}

impl Agent {
    /// Answers Envoy's check (see the module docs).
    pub async fn should_rate_limit(
        &self,
        caller: &Caller,
        request: RateLimitRequest,
        deadline: Option<std::time::Duration>,
    ) -> Result<RateLimitResponse, AgentError> {
        if self.is_closing() {
            return Err(AgentError::ShuttingDown);
        }
        self.access().admit(caller)?;
        let tenant = TenantId::parse("domain", &request.domain)?;
        self.access().authorize(caller, tenant.as_str())?;
        let request_tokens = match request.hits_addend {
            0 => 1,
            n => n,
        };
        let mut locals = Vec::new();
        let mut remote = Vec::new();
        let mut remote_index = Vec::new();
        for (index, descriptor) in request.descriptors.into_iter().enumerate() {
            match local(index, &descriptor, request_tokens)? {
                Some(found) => locals.push(found),
                None => {
                    remote_index.push(index);
                    remote.push(descriptor);
                }
            }
        }
        let count = locals.len() + remote.len();
        let mut statuses = vec![DescriptorStatus::default(); count];

        // The local ones first, each on its own; then all or none.
        let mut taken = Vec::new();
        for found in &locals {
            match self.take(&tenant, found).await {
                Ok((admitted, status)) => {
                    statuses[found.index] = status;
                    if admitted {
                        taken.push(found);
                    }
                }
                Err(e) => {
                    self.give_back_all(&tenant, &taken).await;
                    return Err(e);
                }
            }
        }
        if taken.len() < locals.len() {
            self.give_back_all(&tenant, &taken).await;
            for &index in &remote_index {
                statuses[index].code = Code::Unknown.into();
            }
            return Ok(RateLimitResponse {
                overall_code: Code::OverLimit.into(),
                statuses,
                ..RateLimitResponse::default()
            });
        }
        if remote.is_empty() {
            return Ok(RateLimitResponse {
                overall_code: Code::Ok.into(),
                statuses,
                ..RateLimitResponse::default()
            });
        }
        let sent = RateLimitRequest {
            domain: tenant.as_str().to_owned(),
            descriptors: remote,
            hits_addend: request.hits_addend,
        };
        let answer = match self.passthrough().should_rate_limit(sent, deadline).await {
            Ok(answer) => answer,
            Err(e) => {
                self.give_back_all(&tenant, &taken).await;
                return Err(renumbered(e, &remote_index));
            }
        };
        let allowed = answer.overall_code == i32::from(Code::Ok);
        if !allowed {
            self.give_back_all(&tenant, &taken).await;
        }
        for (status, &index) in answer.statuses.into_iter().zip(&remote_index) {
            statuses[index] = status;
        }
        Ok(RateLimitResponse {
            overall_code: answer.overall_code,
            statuses,
            response_headers_to_add: answer.response_headers_to_add,
            ..RateLimitResponse::default()
        })
    }

    /// Takes a local descriptor's tokens if they are there: whether they
    /// were, and its status.
    async fn take(
        &self,
        tenant: &TenantId,
        found: &Local,
    ) -> Result<(bool, DescriptorStatus), AgentError> {
        let answer = self
            .settle(CallRequest {
                tenant: tenant.clone(),
                request_id: None,
                call: Call::TryAcquire {
                    bucket: found.bucket.clone(),
                    tokens: found.tokens,
                },
                deadline: None,
            })
            .await
            .map_err(|e| named(e, found.index))?;
        let admitted = matches!(answer, Answer::Acquired { admitted: true, .. });
        let remaining = self
            .tenants()
            .bucket(tenant, &found.bucket)
            .map(|handle| handle.status().tokens)
            .unwrap_or(0.0);
        let status = DescriptorStatus {
            code: if admitted { Code::Ok } else { Code::OverLimit }.into(),
            limit_remaining: whole(remaining),
            ..DescriptorStatus::default()
        };
        Ok((admitted, status))
    }

    /// Gives back the tokens of local descriptors taken for a check that
    /// is not allowed. What a bucket already reported stays charged.
    async fn give_back_all(&self, tenant: &TenantId, taken: &[&Local]) {
        for found in taken {
            let returned = self
                .settle(CallRequest {
                    tenant: tenant.clone(),
                    request_id: None,
                    call: Call::Return {
                        bucket: found.bucket.clone(),
                        tokens: found.tokens,
                    },
                    deadline: None,
                })
                .await;
            match returned {
                Ok(Answer::Returned { returned }) if returned < found.tokens => {
                    self.metrics().envoy_kept(
                        tenant.as_str(),
                        found.bucket.as_str(),
                        found.tokens - returned,
                    );
                    tracing::debug!(
                        tenant = tenant.as_str(),
                        bucket = found.bucket.as_str(),
                        tokens = found.tokens,
                        returned,
                        "a refused Envoy check's local tokens were reported before they could come back"
                    );
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    tenant = tenant.as_str(),
                    bucket = found.bucket.as_str(),
                    error = %e,
                    "a refused Envoy check's local tokens could not be given back"
                ),
            }
        }
    }
}

/// Descriptor `index` if it is a lone `generic_key` (a shared bucket),
/// validated; `None` for a per-key descriptor (the server validates it).
fn local(
    index: usize,
    descriptor: &RateLimitDescriptor,
    request_tokens: u32,
) -> Result<Option<Local>, InvalidInput> {
    let [entry] = descriptor.entries.as_slice() else {
        return Ok(None);
    };
    if entry.key != GENERIC_KEY {
        return Ok(None);
    }
    let field = |name: &str| format!("descriptors[{index}]{name}");
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
    let value_field = field(".entries[0].value");
    if entry.value.is_empty() {
        return Err(InvalidInput::new(
            value_field,
            "must not be empty: it names a shared bucket of the tenant",
        ));
    }
    let bucket = BucketName::parse(&value_field, &entry.value)?;
    let tokens = match &descriptor.hits_addend {
        // Exact up to 2^53; anything that large is refused below.
        Some(hits) => hits.value as f64,
        None => f64::from(request_tokens),
    };
    validate::non_negative(&field(".hits_addend"), tokens, MAX_TOKENS)?;
    Ok(Some(Local {
        index,
        bucket,
        tokens,
    }))
}

/// A local descriptor's error in the request's terms: a refused bucket
/// names the descriptor's value.
fn named(error: AgentError, index: usize) -> AgentError {
    match error {
        AgentError::Refused(refusal) => AgentError::Server {
            code: refusal.code,
            message: format!(
                "descriptors[{index}].entries[0].value: tenant \"{}\", bucket \"{}\": refused \
                 by the tollgate server ({:?}): {}",
                refusal.tenant.as_str(),
                refusal.bucket.as_str(),
                refusal.code,
                refusal.message
            ),
        },
        other => other,
    }
}

/// The server's error on the per-key descriptors sent to it, its
/// `descriptors[j]` renumbered to their places in Envoy's request.
fn renumbered(error: AgentError, remote_index: &[usize]) -> AgentError {
    let AgentError::Server { code, message } = error else {
        return error;
    };
    let message = match message
        .strip_prefix("descriptors[")
        .and_then(|rest| rest.split_once(']'))
        .and_then(|(j, rest)| Some((remote_index.get(j.parse::<usize>().ok()?)?, rest)))
    {
        Some((index, rest)) => format!("descriptors[{index}]{rest}"),
        None => message,
    };
    AgentError::Server { code, message }
}

/// Tokens as Envoy's whole `limit_remaining`.
fn whole(tokens: f64) -> u32 {
    if tokens.is_nan() || tokens <= 0.0 {
        0
    } else if tokens >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        tokens.floor() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| Entry {
                    key: (*key).into(),
                    value: (*value).into(),
                })
                .collect(),
            ..RateLimitDescriptor::default()
        }
    }

    #[test]
    fn only_a_lone_generic_key_is_a_shared_bucket() {
        let shared = local(0, &descriptor(&[("generic_key", "api-calls")]), 3)
            .expect("valid")
            .expect("local");
        assert_eq!(shared.bucket.as_str(), "api-calls");
        assert_eq!(shared.tokens, 3.0);
        for per_key in [
            descriptor(&[("generic_key", "per-user"), ("user", "alice")]),
            descriptor(&[("remote_address", "10.0.0.7")]),
            descriptor(&[]),
        ] {
            assert!(local(0, &per_key, 1).expect("valid").is_none());
        }
        let mut own = descriptor(&[("generic_key", "api-calls")]);
        own.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
        assert_eq!(
            local(0, &own, 5).expect("valid").expect("local").tokens,
            0.0
        );
    }

    #[test]
    fn a_bad_shared_descriptor_is_refused_by_its_field() {
        let empty = local(2, &descriptor(&[("generic_key", "")]), 1).expect_err("empty");
        assert_eq!(empty.field, "descriptors[2].entries[0].value");
        let bad = local(1, &descriptor(&[("generic_key", "a b")]), 1).expect_err("bad name");
        assert_eq!(bad.field, "descriptors[1].entries[0].value");
        let mut negative = descriptor(&[("generic_key", "api")]);
        negative.is_negative_hits = true;
        assert_eq!(
            local(0, &negative, 1).expect_err("negative").field,
            "descriptors[0].is_negative_hits"
        );
        let mut huge = descriptor(&[("generic_key", "api")]);
        huge.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: u64::MAX });
        assert_eq!(
            local(0, &huge, 1).expect_err("huge").field,
            "descriptors[0].hits_addend"
        );
    }

    #[test]
    fn the_servers_field_names_are_renumbered_to_envoys_request() {
        let error = AgentError::Server {
            code: tonic::Code::NotFound,
            message: "descriptors[1].entries[0]: no per-key bucket".into(),
        };
        let AgentError::Server { message, .. } = renumbered(error, &[0, 3]) else {
            panic!("a server error");
        };
        assert_eq!(message, "descriptors[3].entries[0]: no per-key bucket");
        assert_eq!(whole(2.9), 2);
        assert_eq!(whole(-4.0), 0);
    }
}
