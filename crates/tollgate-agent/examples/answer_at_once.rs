//! The floor under an agent call: the agent's gRPC service on the same
//! stack as `tollgate agent` (tonic's routes in an axum router, served by
//! `axum::serve` on a Unix socket, one runtime thread), whose `Acquire`
//! answers `admitted` at once, touching no bucket and no journal.
//!
//! `scripts/benchmark-agent.sh` measures it beside the agent in the same
//! run: what is left between the two is what the agent's own work costs a
//! call; what the floor measures is the transport's, which no change to
//! the agent can remove.
//!
//! Usage: `answer_at_once SOCKET` (serves until killed).

use tollgate_proto::agent::v1 as api;
use tollgate_proto::agent::v1::agent_server::{Agent, AgentServer};
use tollgate_proto::v1;
use tonic::{Request, Response, Status};

struct AtOnce;

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("only Acquire is answered here"))
}

#[tonic::async_trait]
impl Agent for AtOnce {
    async fn acquire(
        &self,
        _request: Request<api::AcquireRequest>,
    ) -> Result<Response<api::AcquireResponse>, Status> {
        Ok(Response::new(api::AcquireResponse {
            admitted: true,
            waited: None,
            fallback: false,
        }))
    }

    async fn try_acquire(
        &self,
        _request: Request<api::TryAcquireRequest>,
    ) -> Result<Response<api::AcquireResponse>, Status> {
        unimplemented()
    }

    async fn charge(
        &self,
        _request: Request<api::ChargeRequest>,
    ) -> Result<Response<api::ChargeResponse>, Status> {
        unimplemented()
    }

    async fn report(
        &self,
        _request: Request<api::ReportRequest>,
    ) -> Result<Response<api::ReportResponse>, Status> {
        unimplemented()
    }

    async fn r#return(
        &self,
        _request: Request<api::ReturnRequest>,
    ) -> Result<Response<api::ReturnResponse>, Status> {
        unimplemented()
    }

    async fn status(
        &self,
        _request: Request<api::StatusRequest>,
    ) -> Result<Response<api::StatusResponse>, Status> {
        unimplemented()
    }

    async fn check_keys(
        &self,
        _request: Request<v1::CheckRequest>,
    ) -> Result<Response<v1::CheckResponse>, Status> {
        unimplemented()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(path) = std::env::args_os().nth(1) else {
        return Err("usage: answer_at_once SOCKET".into());
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(async move {
            let listener = tokio::net::UnixListener::bind(&path)?;
            let app = tonic::service::Routes::new(AgentServer::new(AtOnce)).into_axum_router();
            axum::serve(listener, app).await?;
            Ok(())
        })
}
