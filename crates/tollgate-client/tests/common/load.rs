//! Saturating pods and counting what they admitted and charged, shared by
//! the client's virtual-time test against the server's services and the
//! `tollgate` crate's real-socket `client_e2e` test (included by path, so
//! both drive pods the same way).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;
use tollgate_client::Controller;

/// Tokens per acquisition.
pub const STEP: f64 = 10.0;

/// Runs `workers` tasks per pod, each acquiring `STEP` tokens in a loop,
/// until `until`; returns the tokens admitted before `until`.
pub async fn saturate(pods: &[Controller], workers: usize, until: Instant) -> f64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for pod in pods {
        for _ in 0..workers {
            let pod = pod.clone();
            let admitted = Arc::clone(&admitted);
            tasks.push(tokio::spawn(async move {
                while let Ok(Ok(())) = tokio::time::timeout_at(until, pod.acquire(STEP)).await {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("worker ran");
    }
    admitted.load(Ordering::Relaxed) as f64 * STEP
}

/// Shuts the pods down and returns the tokens they charged in total.
pub async fn shutdown(pods: Vec<Controller>) -> f64 {
    let mut charged = 0.0;
    for pod in pods {
        let report = pod.shutdown().await;
        assert!(report.consumption_reported, "final report delivered");
        charged += report.status.charged_tokens;
    }
    charged
}

pub fn assert_same_consumption(stored: f64, charged: f64) {
    assert!(
        (stored - charged).abs() <= 1e-6 * charged.max(1.0),
        "server stored {stored} request units, pods charged {charged}"
    );
}
