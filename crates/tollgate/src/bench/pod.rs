//! One simulated pod: the requests it sends, how it retries, and what it
//! counts.
//!
//! A pod behaves as the client library does on the wire: a lease greater
//! than its previous incarnation's, `seq` counting up from 1, a retry keeps
//! the `seq` of the request it retries, and each request reports the
//! consumption since the previous one. Sums are kept in the core's exact
//! units, so they can be compared with the server's totals for equality.
//!
//! With `--restarts`, a pod sometimes crashes mid-request and comes back as
//! a new incarnation while its last attempt may still be in flight: the
//! case where a late copy from an older incarnation reaches the server
//! after the newer one. The attempt is left running in the background, as
//! the network would, and its fate is settled when the pod's run ends:
//! answered OK means applied (confirmed), refused as superseded means not
//! applied, anything else leaves it unconfirmed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate_core::Consumption;
use tollgate_core::pushback::pushback_wait;
use tollgate_proto::v1::{self, token_bucket_service_client::TokenBucketServiceClient};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::{Load, RunContext};

/// The target request period every request asks for.
const TARGET_REQUEST_PERIOD: Duration = Duration::from_secs(10);
/// The first retry waits about this long; each further one twice as long.
const INITIAL_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Requests answered, by kind.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Answers {
    /// New requests (a new seq) answered, each once however often it was sent.
    pub requests: u64,
    /// Duplicates answered.
    pub duplicates: u64,
}

/// What one pod counted over the run.
#[derive(Debug, Default)]
pub(super) struct PodReport {
    pub tenant: usize,
    /// Answers to requests started in the measured window.
    pub measured: Answers,
    /// Answers over the whole run, warmup and drain included.
    pub total: Answers,
    pub duplicate_mismatches: u64,
    /// Failed attempts that were retried, by gRPC code.
    pub retried: BTreeMap<String, u64>,
    /// Requests refused with a code that is not retried, by gRPC code.
    pub errors: BTreeMap<String, u64>,
    /// The first message seen for each code in `errors` and `retried`.
    pub error_messages: BTreeMap<String, String>,
    /// Requests still being retried when the run ended.
    pub abandoned: u64,
    /// Times the pod crashed and came back as a new incarnation.
    pub restarts: u64,
    /// Attempts of an older incarnation the server refused because a newer
    /// one had taken the instance over.
    pub superseded: u64,
    /// Tokens granted to new requests.
    pub granted_tokens: f64,
    /// Consumption reported in answered new requests.
    pub consumption: Consumption,
    /// Consumption reported in requests whose fate is unknown (abandoned,
    /// or lost with a crash): the server may or may not have applied it.
    pub unconfirmed: Consumption,
}

impl PodReport {
    /// Counts a request refused with a code that is not retried, and keeps
    /// the first message of each code.
    fn record_error(&mut self, status: &Status) {
        let code = code_name(status.code());
        self.error_messages
            .entry(code.clone())
            .or_insert_with(|| status.message().to_owned());
        *self.errors.entry(code).or_default() += 1;
    }
}

/// One attempt of `request`, given up after `timeout`, which the server is
/// told too (`grpc-timeout`), as the client library does.
async fn send_once(
    mut client: TokenBucketServiceClient<Channel>,
    request: v1::TokenBucketRequest,
    context: Arc<RunContext>,
) -> Result<v1::TokenBucketResponse, Status> {
    let timeout = context.timeout;
    let mut call = tonic::Request::new(request);
    call.set_timeout(timeout);
    if let Some(token) = &context.pod_token {
        token.attach(&mut call);
    }
    match tokio::time::timeout(timeout, client.token_bucket(call)).await {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded("no answer within --timeout")),
    }
}

/// The first attempt of a request the pod gave up on when it crashed, still
/// in flight.
#[derive(Debug)]
struct LateAttempt {
    request: v1::TokenBucketRequest,
    /// The answer the retry on another server got before the crash, if any.
    answered: Option<v1::TokenBucketResponse>,
    attempt: JoinHandle<Result<v1::TokenBucketResponse, Status>>,
}

/// How one request (with its retries) ended.
enum Outcome {
    /// Answered; counted, and its latencies recorded if measured.
    Answered(v1::TokenBucketResponse),
    /// Refused with a code that is not retried; counted in `errors`.
    Refused,
    /// Still being retried when the run ended.
    Abandoned,
}

#[derive(Debug)]
pub(super) struct Pod {
    index: usize,
    tenant_id: String,
    bucket: String,
    instance_id: u32,
    lease: Vec<u8>,
    seq: u64,
    /// Tokens granted by the previous answer: what the pod reports as
    /// consumed (rounded) in its next request.
    last_granted: f64,
    /// One client per server; the pod talks to `server` and moves to the
    /// next one when it restarts or a request fails.
    clients: Vec<TokenBucketServiceClient<Channel>>,
    server: usize,
    late: Vec<LateAttempt>,
    rng: SmallRng,
    context: Arc<RunContext>,
    report: PodReport,
}

/// Who a simulated pod is.
#[derive(Debug)]
pub(super) struct PodIdentity {
    /// The tenant's number in the run.
    pub tenant: usize,
    pub tenant_id: String,
    pub bucket: String,
    pub instance_id: u32,
}

impl Pod {
    pub fn new(
        index: usize,
        identity: PodIdentity,
        channels: Vec<Channel>,
        server: usize,
        context: Arc<RunContext>,
    ) -> Self {
        let PodIdentity {
            tenant,
            tenant_id,
            bucket,
            instance_id,
        } = identity;
        Pod {
            index,
            tenant_id,
            bucket,
            instance_id,
            lease: tollgate_client::lease::new_lease(None),
            seq: 0,
            last_granted: 0.0,
            clients: channels
                .into_iter()
                .map(TokenBucketServiceClient::new)
                .collect(),
            server,
            late: Vec::new(),
            rng: SmallRng::from_rng(&mut rand::rng()),
            context,
            report: PodReport {
                tenant,
                ..PodReport::default()
            },
        }
    }

    /// Sends requests until the run ends, then returns what it counted.
    pub async fn run(mut self) -> PodReport {
        let context = Arc::clone(&self.context);
        for k in 0.. {
            let due = match context.load {
                Load::Closed => None,
                Load::Open { .. } => match context.due(self.index, k) {
                    Some(due) => {
                        tokio::time::sleep_until(due).await;
                        Some(due)
                    }
                    None => break,
                },
            };
            let started = Instant::now();
            if started >= context.end {
                break;
            }
            let measured = context.measured(due.unwrap_or(started));
            self.seq += 1;
            let request = self.next_request();
            let crash = context.mix.restarts > 0.0 && self.rng.random_bool(context.mix.restarts);
            if crash {
                self.crash_and_restart(request, due, measured).await;
                continue;
            }
            match self.call(&request, due, measured).await {
                Outcome::Answered(response) => {
                    self.confirm(&request, &response, measured);
                    self.last_granted = response.granted_tokens;
                    self.maybe_duplicate(&request, &response).await;
                }
                Outcome::Refused => {}
                Outcome::Abandoned => {
                    self.report.unconfirmed.add(&consumption(&request));
                    break;
                }
            }
        }
        self.settle_late_attempts().await;
        self.report
    }

    /// Counts the answer to a new request: its grant and its consumption.
    fn confirm(
        &mut self,
        request: &v1::TokenBucketRequest,
        response: &v1::TokenBucketResponse,
        measured: bool,
    ) {
        self.report.total.requests += 1;
        self.context.count_goodput();
        if measured {
            self.report.measured.requests += 1;
        }
        self.report.granted_tokens += response.granted_tokens;
        self.report.consumption.add(&consumption(request));
    }

    /// Sends `request` and crashes a moment later, maybe after a retry on
    /// the next server was answered; then starts a new incarnation there.
    async fn crash_and_restart(
        &mut self,
        request: v1::TokenBucketRequest,
        due: Option<Instant>,
        measured: bool,
    ) {
        let attempt = tokio::spawn(send_once(
            self.clients[self.server].clone(),
            request.clone(),
            Arc::clone(&self.context),
        ));
        let pause = Duration::from_micros(self.rng.random_range(0..=2_000));
        tokio::time::sleep(pause).await;
        self.server = (self.server + 1) % self.clients.len();
        let mut answered = None;
        if self.rng.random_bool(0.5) {
            match self.call(&request, due, measured).await {
                Outcome::Answered(response) => {
                    self.confirm(&request, &response, measured);
                    answered = Some(response);
                }
                Outcome::Refused | Outcome::Abandoned => {}
            }
        }
        self.late.push(LateAttempt {
            request,
            answered,
            attempt,
        });
        self.report.restarts += 1;
        self.lease = tollgate_client::lease::new_lease(Some(&self.lease));
        self.seq = 0;
        self.last_granted = 0.0;
    }

    /// Waits for the attempts left in flight by crashes and counts what
    /// became of them.
    async fn settle_late_attempts(&mut self) {
        for late in std::mem::take(&mut self.late) {
            let outcome = match late.attempt.await {
                Ok(outcome) => outcome,
                Err(e) => Err(Status::unknown(format!("attempt task failed: {e}"))),
            };
            match (outcome, &late.answered) {
                (Ok(response), None) => {
                    // Applied, and this is its only answer.
                    let measured = false;
                    self.confirm(&late.request, &response, measured);
                }
                (Ok(response), Some(first)) => {
                    self.report.total.duplicates += 1;
                    if response != *first {
                        self.report.duplicate_mismatches += 1;
                    }
                }
                (Err(status), _) if status.code() == Code::FailedPrecondition => {
                    self.report.superseded += 1;
                }
                (Err(status), answered) => {
                    if answered.is_none() {
                        self.report.unconfirmed.add(&consumption(&late.request));
                    }
                    self.report.record_error(&status);
                }
            }
        }
    }

    /// With probability `--duplicates`, sends `request` again and checks
    /// that the answer is `first`.
    async fn maybe_duplicate(
        &mut self,
        request: &v1::TokenBucketRequest,
        first: &v1::TokenBucketResponse,
    ) {
        let probability = self.context.mix.duplicates;
        if probability == 0.0 || !self.rng.random_bool(probability) {
            return;
        }
        let started = Instant::now();
        if started >= self.context.end {
            return;
        }
        let measured = self.context.measured(started);
        if let Outcome::Answered(response) = self.call(request, None, measured).await {
            self.report.total.duplicates += 1;
            if measured {
                self.report.measured.duplicates += 1;
            }
            if response != *first {
                self.report.duplicate_mismatches += 1;
                // The first of each pod is enough to investigate.
                if self.report.duplicate_mismatches > 1 {
                    return;
                }
                tracing::warn!(
                    tenant = %self.tenant_id,
                    instance = self.instance_id,
                    seq = self.seq,
                    ?first,
                    duplicate = ?response,
                    "a duplicate got a different answer"
                );
            }
        }
    }

    /// Counts an answer for the progress bar and records its latency if its
    /// request was started in the measured window.
    fn answered(&self, latency: Duration, attempt: Duration, measured: bool) {
        self.context.answers.fetch_add(1, Ordering::Relaxed);
        if measured {
            self.context.latency.record(self.index, latency);
            self.context.attempt_latency.record(self.index, attempt);
        }
    }

    /// Sends `request` until it is answered, refused with a code that is not
    /// retried, or the run ends while it is being retried. An answer is
    /// counted, and if `measured` its latencies are recorded: from when it
    /// was due (open loop) or its answered attempt was sent (closed loop),
    /// and from when that attempt was sent.
    async fn call(
        &mut self,
        request: &v1::TokenBucketRequest,
        due: Option<Instant>,
        measured: bool,
    ) -> Outcome {
        let mut backoff = INITIAL_BACKOFF;
        loop {
            let sent = Instant::now();
            let client = self.clients[self.server].clone();
            let status = match send_once(client, request.clone(), Arc::clone(&self.context)).await {
                Ok(response) => {
                    self.answered(due.unwrap_or(sent).elapsed(), sent.elapsed(), measured);
                    return Outcome::Answered(response);
                }
                Err(status) => status,
            };
            if !retryable(&status) {
                self.report.record_error(&status);
                return Outcome::Refused;
            }
            let code = code_name(status.code());
            if !self.report.error_messages.contains_key(&code) {
                self.report
                    .error_messages
                    .insert(code.clone(), describe(&status));
            }
            *self.report.retried.entry(code).or_default() += 1;
            // The retry goes to the next server, as a pod's client moves on
            // from a replica that failed it; the same `seq` makes it count
            // once wherever it lands.
            self.server = (self.server + 1) % self.clients.len();
            // Between half and all of the backoff, so pods that failed
            // together do not retry together; and never sooner than an
            // overloaded server asked, as a pod's client waits.
            let pushback = tollgate_proto::pushback::pushback(&status).unwrap_or_default();
            let delay = backoff
                .mul_f64(self.rng.random_range(0.5..=1.0))
                .max(pushback_wait(pushback, self.rng.random_range(0.0..1.0)));
            if Instant::now() + delay >= self.context.end {
                self.report.abandoned += 1;
                return Outcome::Abandoned;
            }
            tokio::time::sleep(delay).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// The next new request: random tokens and the consumption since the
    /// previous request.
    fn next_request(&mut self) -> v1::TokenBucketRequest {
        let mix = self.context.mix;
        let rng = &mut self.rng;
        let requested = if rng.random_bool(mix.report_only) {
            0
        } else {
            rng.random_range(0..=2 * mix.tokens)
        };
        let read_batches = rng.random_range(0..=4);
        let read_requests = read_batches * rng.random_range(1..=8);
        let write_batches = rng.random_range(0..=2);
        let write_requests = write_batches * rng.random_range(1..=4);
        let consumption = v1::Consumption {
            request_units: self.last_granted.round(),
            read_batches,
            read_requests,
            read_bytes: read_requests * rng.random_range(0..=4096),
            write_batches,
            write_requests,
            write_bytes: write_requests * rng.random_range(0..=1024),
            cpu_seconds: 0.0,
            egress_bytes: rng.random_range(0..=8192),
            request_unit_micros: 0,
            cpu_micros: 0,
        };
        v1::TokenBucketRequest {
            tenant_id: self.tenant_id.clone(),
            bucket: self.bucket.clone(),
            instance_id: self.instance_id,
            instance_lease: self.lease.clone(),
            seq: self.seq,
            // Below 2^53 (validated against MAX_TOKENS), so exact.
            requested_tokens: requested as f64,
            shares: requested.max(1) as f64,
            target_request_period: Some(tollgate_proto::duration(TARGET_REQUEST_PERIOD)),
            consumption_since_last_request: Some(consumption),
            next_live_instance_id: None,
            returned_tokens: 0.0,
            held_tokens: 0.0,
            fallback_tokens: 0.0,
            fallback_duration: None,
        }
    }
}

/// Codes after which the same request is sent again: the server may not
/// have seen it, or may answer it next time. A transport failure (a reset
/// connection, an HTTP/2 GOAWAY from a server shutting down) shows as
/// `Unknown` or `Internal` with the local error as its source; a status the
/// server sent has none.
fn retryable(status: &Status) -> bool {
    use std::error::Error;
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::ResourceExhausted
        | Code::Aborted => true,
        Code::Unknown | Code::Internal => status.source().is_some(),
        _ => false,
    }
}

/// A status's message, with the local error behind it if there is one
/// (a transport failure has no message of the server's).
fn describe(status: &Status) -> String {
    use std::error::Error;
    match status.source() {
        Some(source) => format!("{} ({source})", status.message()),
        None => status.message().to_owned(),
    }
}

/// A gRPC code as the report names it, e.g. `Unavailable`.
pub(super) fn code_name(code: Code) -> String {
    format!("{code:?}")
}

/// The consumption `request` reports, in the core's exact units (the bench
/// only sends valid reports).
fn consumption(request: &v1::TokenBucketRequest) -> Consumption {
    request
        .consumption_since_last_request
        .map(Consumption::try_from)
        .and_then(Result::ok)
        .unwrap_or_default()
}
