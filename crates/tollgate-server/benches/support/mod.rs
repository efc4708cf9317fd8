//! What the benches that record usage history share: a pod's request and
//! a server's sampling round.

use std::time::Duration;

use tollgate_core::{Consumption, TokenBucketRequest};
use tollgate_server::store::Store;

/// Pod 1's request number `seq`, asking for `used` tokens and reporting
/// it used.
pub fn request(seq: u64, used: f64) -> TokenBucketRequest {
    TokenBucketRequest {
        instance_id: 1,
        lease: b"pod".to_vec(),
        seq,
        requested_tokens: used,
        shares: 1.0,
        target_request_period: Duration::from_secs(10),
        consumption: Consumption::from_request_units(used),
        next_live_instance_id: None,
        returned_tokens: 0.0,
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: Duration::ZERO,
    }
}

/// Samples every bucket into the usage history, as a server's round does.
pub async fn sample_all(store: &dyn Store) {
    let mut after = None;
    while let Some(last) = store
        .sample_history(after.as_ref(), 1_000)
        .await
        .expect("sample")
        .last
    {
        after = Some(last);
    }
}
