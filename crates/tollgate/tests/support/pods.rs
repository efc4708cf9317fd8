//! Watching pods (`tollgate-client` controllers) from outside: how long
//! they ran on their fallback rate and waited for an answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tollgate_client::Controller;

/// Per pod: the longest stretch spent on the fallback rate and the longest
/// stretch waiting for an answer, sampled every 10 ms until `stop`.
pub async fn watch(pods: Vec<Controller>, stop: Arc<AtomicBool>) -> Vec<(Duration, Duration)> {
    let step = Duration::from_millis(10);
    let mut longest = vec![(Duration::ZERO, Duration::ZERO); pods.len()];
    let mut since: Vec<(Option<Instant>, Option<Instant>)> = vec![(None, None); pods.len()];
    let track = |on: bool, started: &mut Option<Instant>, worst: &mut Duration, now: Instant| match (
        on, *started,
    ) {
        (true, None) => *started = Some(now),
        (true, Some(from)) => *worst = (*worst).max(now - from),
        (false, _) => *started = None,
    };
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        for (i, pod) in pods.iter().enumerate() {
            let status = pod.status();
            let (fallback, waiting) = &mut since[i];
            let (on_fallback, waited) = &mut longest[i];
            track(status.fallback_active, fallback, on_fallback, now);
            track(status.request_in_flight, waiting, waited, now);
        }
        tokio::time::sleep(step).await;
    }
    longest
}
