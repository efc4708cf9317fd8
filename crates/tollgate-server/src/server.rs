//! Serving the gRPC services on a listener.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tollgate_proto::v1::admin_server::AdminServer;
use tollgate_proto::v1::token_bucket_service_server::TokenBucketServiceServer;
use tonic::transport::server::TcpIncoming;

use crate::service::{AdminService, TokenBucketService};
use crate::store::Store;

/// Serves the pod-facing and operator-facing services on `listener` until
/// `shutdown` completes, then stops accepting connections and waits for
/// in-flight requests to finish.
///
/// Takes an already-bound listener so tests can bind `127.0.0.1:0`. The store
/// is not closed; its owner does that once `run` returns.
pub async fn run(
    listener: TcpListener,
    store: Arc<dyn Store>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let local = listener.local_addr().ok();
    tracing::info!(address = ?local, "tollgate server listening");
    tonic::transport::Server::builder()
        .add_service(TokenBucketServiceServer::new(TokenBucketService::new(
            Arc::clone(&store),
        )))
        .add_service(AdminServer::new(AdminService::new(store)))
        // No Nagle delay: answers are small and latency is what pods wait on.
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await?;
    tracing::info!(address = ?local, "tollgate server stopped");
    Ok(())
}
