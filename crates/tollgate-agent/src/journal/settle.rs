//! The journal's two ways to the server: every bucket's requests, written
//! before they go ([`JournalTransport`]), and the settling of what dead
//! incarnations owe ([`Journal::settle`]), which must reach the server
//! before the new incarnation of the same bucket does.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tollgate_client::{Failure, Transport, TransportError, classify};
use tollgate_core::partition::ExchangeAnswer;
use tollgate_core::{BucketName, Grant, TenantId, TokenBucketRequest};
use tollgate_proto::partition::PartitionLoadCall;

use super::Journal;
use super::record::Record;

/// How long a request of a bucket whose earlier incarnation still owes
/// waits for the settling before it fails as an outage (the bucket then
/// runs on its allowance and fallback rate, and retries).
const SETTLING_WAIT: Duration = Duration::from_secs(1);

/// Backoff between attempts to settle while the server cannot be reached.
const SETTLE_BACKOFF_INITIAL: Duration = Duration::from_millis(200);
const SETTLE_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// A tenant's transport with the journal in front: each request is
/// written before it is sent (and not sent if it cannot be), each answer
/// after it comes, and a bucket's requests wait until its earlier
/// incarnations are settled.
pub struct JournalTransport {
    journal: Arc<Journal>,
    tenant: TenantId,
    inner: Arc<dyn Transport>,
}

impl std::fmt::Debug for JournalTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalTransport")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

impl JournalTransport {
    pub fn new(journal: Arc<Journal>, tenant: TenantId, inner: Arc<dyn Transport>) -> Self {
        JournalTransport {
            journal,
            tenant,
            inner,
        }
    }
}

#[async_trait]
impl Transport for JournalTransport {
    async fn token_bucket(
        &self,
        bucket: &BucketName,
        request: TokenBucketRequest,
    ) -> Result<Grant, TransportError> {
        if !self.journal.wait_settled(&self.tenant, bucket).await {
            return Err(TransportError::new(format!(
                "bucket {bucket:?} of tenant {}: an earlier incarnation's report is still being settled",
                self.tenant
            )));
        }
        if let Err(e) = self.journal.sent(&self.tenant, bucket, &request) {
            tracing::error!(tenant = %self.tenant, bucket = %bucket, error = %e, "journal: cannot record a request; not sending it");
            return Err(TransportError::new(format!("journal: {e}")));
        }
        let seq = request.seq;
        let grant = self.inner.token_bucket(bucket, request).await?;
        self.journal
            .answered(&self.tenant, bucket, seq, grant.initial_allowance);
        Ok(grant)
    }

    async fn partition_load(
        &self,
        call: &PartitionLoadCall,
    ) -> Result<ExchangeAnswer, TransportError> {
        self.inner.partition_load(call).await
    }
}

impl Journal {
    /// Waits (a little) until no earlier incarnation of `bucket` owes a
    /// report. False if one still does.
    async fn wait_settled(&self, tenant: &TenantId, bucket: &BucketName) -> bool {
        let mut changes = self.settled.subscribe();
        let deadline = tokio::time::Instant::now() + SETTLING_WAIT;
        loop {
            if !self.owes(tenant, bucket) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                // Timed out, or the journal is going away.
                _ => return !self.owes(tenant, bucket),
            }
        }
    }

    /// Settles every orphan, oldest first, each through its tenant's
    /// transport (from `transport_for`, without the journal in front):
    /// each request is sent until it is answered, retrying outages with a
    /// backoff for as long as it takes. A refusal (the bucket or tenant
    /// deleted, the lease superseded) settles the orphan too, with an
    /// error saying what was not counted. Returns when none is left.
    pub async fn settle(
        self: Arc<Self>,
        transport_for: impl Fn(&TenantId) -> Arc<dyn Transport> + Send,
    ) {
        loop {
            let next = self.lock().orphans.values().next().cloned();
            let Some(pending) = next else {
                return;
            };
            let transport = transport_for(&pending.tenant);
            let requests = pending.orphan.settling_requests();
            let mut refused = None;
            for request in requests {
                let mut backoff = SETTLE_BACKOFF_INITIAL;
                loop {
                    match transport
                        .token_bucket(&pending.bucket, request.clone())
                        .await
                    {
                        Ok(_) => break,
                        Err(e) => match e.code.map(classify) {
                            Some(Failure::Refusal) => {
                                refused = Some(e);
                                break;
                            }
                            _ => {
                                tracing::debug!(tenant = %pending.tenant, bucket = %pending.bucket, error = %e, "journal: settling waits for the server");
                                tokio::time::sleep(backoff).await;
                                backoff = (backoff * 2).min(SETTLE_BACKOFF_MAX);
                            }
                        },
                    }
                }
                if refused.is_some() {
                    break;
                }
            }
            match refused {
                None => tracing::info!(
                    tenant = %pending.tenant,
                    bucket = %pending.bucket,
                    unsent_request_units = pending.orphan.unsent.request_units(),
                    "journal: settled what an earlier incarnation owed"
                ),
                Some(e) => tracing::error!(
                    tenant = %pending.tenant,
                    bucket = %pending.bucket,
                    error = %e,
                    not_counted_request_units = pending.orphan.unsent.request_units(),
                    "journal: the server refused an earlier incarnation's report; what it held is not counted"
                ),
            }
            let settled = super::line(&Record::Settled { id: pending.id }).and_then(|line| {
                let mut inner = self.lock();
                self.write(&mut inner, &line)?;
                inner.orphans.remove(&pending.id);
                Ok(())
            });
            if let Err(e) = settled {
                // The orphan stays: a later start settles it again, which
                // the server answers as duplicates.
                tracing::error!(error = %e, "journal: cannot record a settled report");
                self.lock().orphans.remove(&pending.id);
            }
            self.settled.send_modify(|n| *n += 1);
        }
    }
}
