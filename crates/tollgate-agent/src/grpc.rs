//! The `Agent` gRPC service: each method reads who the caller is (the
//! listener the call came through, its `authorization` metadata) and its
//! deadline (`grpc-timeout`), hands the message to [`crate::wire`], and
//! counts the call by method and code.

use std::time::Duration;

use tollgate_proto::agent::v1 as api;
use tollgate_proto::agent::v1::agent_server::Agent as AgentApi;
use tollgate_proto::v1;
use tonic::{Request, Response, Status};

use crate::Agent;
use crate::access::{Caller, Listener};
use crate::error::AgentError;

/// The gRPC face of an [`Agent`].
#[derive(Clone, Debug)]
pub struct AgentService {
    agent: Agent,
}

impl AgentService {
    pub fn new(agent: Agent) -> AgentService {
        AgentService { agent }
    }

    /// Counts the call and turns its error into a status.
    fn answer<T>(
        &self,
        method: &str,
        result: Result<T, AgentError>,
    ) -> Result<Response<T>, Status> {
        let code = result
            .as_ref()
            .map_or_else(AgentError::code, |_| tonic::Code::Ok);
        self.agent.metrics().call(method, code);
        match result {
            Ok(message) => Ok(Response::new(message)),
            Err(AgentError::Internal(message)) => {
                tracing::error!(method, error = %message, "a call failed inside the agent");
                Err(Status::internal(message))
            }
            Err(e) => Err(e.to_status()),
        }
    }
}

/// Who made the call: the listener it came through (the router marks
/// every request) and the bearer token it sent.
pub fn caller<T>(request: &Request<T>) -> Caller {
    let listener = request
        .extensions()
        .get::<Listener>()
        .copied()
        // A request no listener marked came from an unknown place: it gets
        // a TCP caller's rules, the strict ones.
        .unwrap_or(Listener::Tcp);
    let authorization = request
        .metadata()
        .get("authorization")
        .map(|value| value.as_bytes());
    Caller::new(listener, authorization)
}

/// The call's deadline, from its `grpc-timeout` header (`100m`: 100
/// milliseconds; units H, M, S, m, u, n), if it has a valid one.
pub fn deadline<T>(request: &Request<T>) -> Option<Duration> {
    let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    parse_grpc_timeout(value)
}

fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let split = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(split);
    // At most 8 digits, by the gRPC spec.
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[tonic::async_trait]
impl AgentApi for AgentService {
    async fn acquire(
        &self,
        request: Request<api::AcquireRequest>,
    ) -> Result<Response<api::AcquireResponse>, Status> {
        let (caller, deadline) = (caller(&request), deadline(&request));
        let result = self
            .agent
            .acquire(&caller, request.into_inner(), deadline)
            .await;
        self.answer("Acquire", result)
    }

    async fn try_acquire(
        &self,
        request: Request<api::TryAcquireRequest>,
    ) -> Result<Response<api::AcquireResponse>, Status> {
        let caller = caller(&request);
        let result = self.agent.try_acquire(&caller, request.into_inner()).await;
        self.answer("TryAcquire", result)
    }

    async fn charge(
        &self,
        request: Request<api::ChargeRequest>,
    ) -> Result<Response<api::ChargeResponse>, Status> {
        let caller = caller(&request);
        let result = self.agent.charge(&caller, request.into_inner()).await;
        self.answer("Charge", result)
    }

    async fn report(
        &self,
        request: Request<api::ReportRequest>,
    ) -> Result<Response<api::ReportResponse>, Status> {
        let caller = caller(&request);
        let result = self.agent.report(&caller, request.into_inner()).await;
        self.answer("Report", result)
    }

    async fn r#return(
        &self,
        request: Request<api::ReturnRequest>,
    ) -> Result<Response<api::ReturnResponse>, Status> {
        let caller = caller(&request);
        let result = self.agent.give_back(&caller, request.into_inner()).await;
        self.answer("Return", result)
    }

    async fn status(
        &self,
        request: Request<api::StatusRequest>,
    ) -> Result<Response<api::StatusResponse>, Status> {
        let caller = caller(&request);
        let result = self.agent.status(&caller, request.into_inner());
        self.answer("Status", result)
    }

    async fn check_keys(
        &self,
        request: Request<v1::CheckRequest>,
    ) -> Result<Response<v1::CheckResponse>, Status> {
        let (caller, deadline) = (caller(&request), deadline(&request));
        let result = self
            .agent
            .check_keys(&caller, request.into_inner(), deadline)
            .await;
        self.answer("CheckKeys", result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5u"), Some(Duration::from_micros(5)));
        for bad in ["", "m", "100", "123456789m", "10x", "-1S", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
