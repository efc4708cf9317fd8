//! The agent's API as the proto defines it, whichever way it came: each
//! method takes the proto's request message and gives its response
//! message. [`crate::grpc`] serves these over gRPC, [`crate::http`] over
//! HTTP/JSON; neither validates or answers anything itself.
//!
//! Every method first asks the access rules about the caller (a TCP caller
//! without a token is refused before anything else is read), then reads
//! the tenant and asks about it, then validates the other fields in the
//! proto's order, each refusal naming its field. Only then does a call
//! reach a bucket ([`Agent::settle`]).

use std::time::Duration;

use tollgate_core::{BucketName, TenantId};
use tollgate_proto::agent::v1 as api;
use tollgate_proto::v1;

use crate::Agent;
use crate::access::Caller;
use crate::calls::{self, Answer, Call, CallRequest, Work};
use crate::error::AgentError;

impl Agent {
    /// The tenant a call names, once the caller may use it.
    fn tenant_for(&self, caller: &Caller, tenant: &str) -> Result<TenantId, AgentError> {
        if self.is_closing() {
            return Err(AgentError::ShuttingDown);
        }
        self.access().admit(caller)?;
        let tenant = TenantId::parse("tenant", tenant)?;
        self.access().authorize(caller, tenant.as_str())?;
        Ok(tenant)
    }

    pub async fn acquire(
        &self,
        caller: &Caller,
        request: api::AcquireRequest,
        deadline: Option<Duration>,
    ) -> Result<api::AcquireResponse, AgentError> {
        let tenant = self.tenant_for(caller, &request.tenant)?;
        let call = Call::Acquire {
            bucket: BucketName::parse("bucket", &request.bucket)?,
            tokens: calls::tokens(request.tokens)?,
            max_wait: request
                .max_wait
                .map(|wait| {
                    tollgate_core::validate::wire_duration("max_wait", wait.seconds, wait.nanos)
                        .and_then(calls::max_wait)
                })
                .transpose()?,
        };
        let request_id = calls::request_id(&request.request_id)?;
        let answer = self
            .settle(CallRequest {
                tenant,
                request_id,
                call,
                deadline,
            })
            .await?;
        acquire_response(answer)
    }

    pub async fn try_acquire(
        &self,
        caller: &Caller,
        request: api::TryAcquireRequest,
    ) -> Result<api::AcquireResponse, AgentError> {
        let tenant = self.tenant_for(caller, &request.tenant)?;
        let call = Call::TryAcquire {
            bucket: BucketName::parse("bucket", &request.bucket)?,
            tokens: calls::tokens(request.tokens)?,
        };
        let request_id = calls::request_id(&request.request_id)?;
        let answer = self.settle(call_request(tenant, request_id, call)).await?;
        acquire_response(answer)
    }

    pub async fn charge(
        &self,
        caller: &Caller,
        request: api::ChargeRequest,
    ) -> Result<api::ChargeResponse, AgentError> {
        let tenant = self.tenant_for(caller, &request.tenant)?;
        let call = Call::Charge {
            bucket: BucketName::parse("bucket", &request.bucket)?,
            tokens: calls::charged_tokens(request.tokens)?,
        };
        let request_id = calls::request_id(&request.request_id)?;
        match self.settle(call_request(tenant, request_id, call)).await? {
            Answer::Charged => Ok(api::ChargeResponse {}),
            other => Err(mismatched(&other)),
        }
    }

    pub async fn report(
        &self,
        caller: &Caller,
        request: api::ReportRequest,
    ) -> Result<api::ReportResponse, AgentError> {
        let tenant = self.tenant_for(caller, &request.tenant)?;
        let work = Work {
            read_requests: request.read_requests,
            read_bytes: request.read_bytes,
            write_requests: request.write_requests,
            write_bytes: request.write_bytes,
            cpu_seconds: request.cpu_seconds,
            egress_bytes: request.egress_bytes,
        };
        let call = Call::Report {
            work: calls::work(work, self.cost_model())?,
        };
        let request_id = calls::request_id(&request.request_id)?;
        match self.settle(call_request(tenant, request_id, call)).await? {
            Answer::Reported { request_units } => Ok(api::ReportResponse { request_units }),
            other => Err(mismatched(&other)),
        }
    }

    pub async fn give_back(
        &self,
        caller: &Caller,
        request: api::ReturnRequest,
    ) -> Result<api::ReturnResponse, AgentError> {
        let tenant = self.tenant_for(caller, &request.tenant)?;
        let call = Call::Return {
            bucket: BucketName::parse("bucket", &request.bucket)?,
            tokens: calls::tokens(request.tokens)?,
        };
        let request_id = calls::request_id(&request.request_id)?;
        match self.settle(call_request(tenant, request_id, call)).await? {
            Answer::Returned { returned } => Ok(api::ReturnResponse { returned }),
            other => Err(mismatched(&other)),
        }
    }

    /// The local bucket as it is now (started if new). Changes nothing.
    pub fn status(
        &self,
        caller: &Caller,
        request: api::StatusRequest,
    ) -> Result<api::StatusResponse, AgentError> {
        let tenant = self.tenant_for(caller, &request.tenant)?;
        let bucket = BucketName::parse("bucket", &request.bucket)?;
        let status = self.tenants().checked_bucket(&tenant, &bucket)?.status();
        Ok(api::StatusResponse {
            tokens: status.tokens,
            debt: status.debt,
            trickle_rate: status.trickle_rate,
            fallback_active: status.fallback_active,
            fallback_rate: status.fallback_rate,
            waiters: u64::try_from(status.waiters).unwrap_or(u64::MAX),
            queued_tokens: status.queued_tokens,
            usage_rate: status.usage_rate,
            instance_id: self.instance_id(),
        })
    }

    /// A per-key check, passed to the server (see [`crate::passthrough`]) once the
    /// caller may use every tenant it names.
    pub async fn check_keys(
        &self,
        caller: &Caller,
        request: v1::CheckRequest,
        deadline: Option<Duration>,
    ) -> Result<v1::CheckResponse, AgentError> {
        if self.is_closing() {
            return Err(AgentError::ShuttingDown);
        }
        self.access().admit(caller)?;
        for (i, item) in request.items.iter().enumerate() {
            let field = format!("items[{i}].tenant_id");
            let tenant = TenantId::parse(&field, &item.tenant_id)?;
            self.access().authorize(caller, tenant.as_str())?;
        }
        self.passthrough().check(request, deadline).await
    }
}

fn call_request(tenant: TenantId, request_id: Option<String>, call: Call) -> CallRequest {
    CallRequest {
        tenant,
        request_id,
        call,
        deadline: None,
    }
}

fn acquire_response(answer: Answer) -> Result<api::AcquireResponse, AgentError> {
    match answer {
        Answer::Acquired {
            admitted,
            waited,
            fallback,
        } => Ok(api::AcquireResponse {
            admitted,
            waited: Some(tollgate_proto::duration(waited)),
            fallback,
        }),
        other => Err(mismatched(&other)),
    }
}

/// An answer of another kind than its call's: cannot happen, as a request
/// id's answer is only replayed to an equal call.
fn mismatched(answer: &Answer) -> AgentError {
    AgentError::Internal(format!("an answer of the wrong kind: {answer:?}"))
}
