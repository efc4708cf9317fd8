//! Writes this replica's counts of per-key checks into the usage history
//! (`tollgate_core::history::checks`).
//!
//! Only the replica that answered a check knows of it: the checks of a
//! per-key bucket are counted in memory ([`Metrics::observe_check`]), so
//! every server writes its own, whether or not it samples the shared
//! buckets' totals, every sample interval and once more when it stops. A
//! write that fails gives its rows back to be written with the next: a
//! server that stops without writing loses at most an interval of counts.

use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;

use super::Metrics;

/// Writes what was counted (since [`Metrics::count_checks_for_history`])
/// every `interval`, until the task is dropped, logging failures as the
/// store's other rounds do (`store::every`). Call [`flush`] after dropping
/// it to write the last counts.
pub async fn keep(store: Arc<dyn Store>, metrics: Arc<Metrics>, interval: Duration) {
    crate::store::every(
        interval,
        "writing per-key checks to the usage history",
        || async { write(store.as_ref(), &metrics).await.map(|()| false) },
    )
    .await;
}

/// Writes what was counted since the last write, once; logs a failure.
pub async fn flush(store: &dyn Store, metrics: &Metrics) {
    if let Err(e) = write(store, metrics).await {
        tracing::warn!(error = %e, "writing the last per-key checks to the usage history failed: this replica's checks since its last write are not in it");
    }
}

async fn write(store: &dyn Store, metrics: &Metrics) -> Result<(), crate::store::StoreError> {
    let rows = metrics.take_check_rows();
    if rows.is_empty() {
        return Ok(());
    }
    match store.record_checks(metrics.replica(), &rows).await {
        Ok(()) => Ok(()),
        Err(e) => {
            metrics.unwritten_check_rows(rows);
            Err(e)
        }
    }
}
