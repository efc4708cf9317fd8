//! The calls that change a bucket, settled in one place.
//!
//! Acquire, TryAcquire, Charge, Report and Return all come here, from gRPC
//! and from HTTP alike, as a validated [`CallRequest`]. [`Agent::settle`]
//! is the only code that applies a call's effect to a bucket and makes its
//! answer, and it does both before anything is sent back:
//!
//! 1. a request id already answered gets its answer back, and nothing else
//!    happens ([`crate::answers`]);
//! 2. the call is applied to the tenant's local bucket through
//!    `tollgate-client` ([`Agent::apply`]), which returns the [`Answer`] and
//!    the call's [`Effect`] on the bucket;
//! 3. the answer is kept for retries, as a [`Settled`] record: tenant,
//!    request id, call, answer and effect. That record is what makes a
//!    call durable: written before the reply, it is all a restarted agent
//!    needs to answer a retry and to know what was charged.
//!
//! A call whose caller goes away before step 3 (a waiting acquire whose
//! connection closed) is dropped with its future: the client gives the
//! claim back, the request id is forgotten, and nothing was taken.
//!
//! # Pricing reported work
//!
//! Report prices work by the controller's cost model (CockroachDB's
//! defaults), one batch of each kind the report holds: `read_requests`
//! are one read batch of that many requests, `write_requests` and
//! `write_bytes` one write batch, plus the read bytes, CPU seconds and
//! egress bytes. All of it is charged after the fact (it may put the
//! bucket in debt), to the tenant's request-unit bucket.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tollgate_client::BucketHandle;
use tollgate_core::validate::{self, MAX_CPU_SECONDS, MAX_REPORTED_REQUEST_UNITS, MAX_TOKENS};
use tollgate_core::{Batch, BucketName, Consumption, CostModel, InvalidInput, TenantId};

use crate::Agent;
use crate::answers::{Begin, MAX_REQUEST_ID_CHARS, Remembered};
use crate::error::AgentError;
use crate::metrics::Outcome;

/// How long before the caller's deadline an Acquire still waiting is
/// answered `admitted: false` (at most a twentieth of the deadline).
const DEADLINE_MARGIN: Duration = Duration::from_millis(50);

/// The longest `max_wait` an Acquire may ask for.
pub const MAX_WAIT_LIMIT: Duration = Duration::from_secs(3600);

/// What a caller asked of a bucket, validated. Equal calls are the same
/// call: a request id's retry must make an equal one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum Call {
    Acquire {
        bucket: BucketName,
        tokens: f64,
        /// `None`: until the call's deadline, at most the agent's
        /// `--max-wait`.
        max_wait: Option<Duration>,
    },
    TryAcquire {
        bucket: BucketName,
        tokens: f64,
    },
    Charge {
        bucket: BucketName,
        tokens: f64,
    },
    /// Work reported by kind, charged to the request-unit bucket.
    Report {
        work: Work,
    },
    Return {
        bucket: BucketName,
        tokens: f64,
    },
}

impl Call {
    /// The bucket the call changes.
    pub fn bucket(&self) -> BucketName {
        match self {
            Call::Acquire { bucket, .. }
            | Call::TryAcquire { bucket, .. }
            | Call::Charge { bucket, .. }
            | Call::Return { bucket, .. } => bucket.clone(),
            Call::Report { .. } => BucketName::REQUEST_UNITS,
        }
    }

    /// The method's name in the proto, for logs and metrics.
    pub fn method(&self) -> &'static str {
        match self {
            Call::Acquire { .. } => "Acquire",
            Call::TryAcquire { .. } => "TryAcquire",
            Call::Charge { .. } => "Charge",
            Call::Report { .. } => "Report",
            Call::Return { .. } => "Return",
        }
    }
}

/// Key-value work by kind, as a Report carries it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Work {
    pub read_requests: u64,
    pub read_bytes: u64,
    pub write_requests: u64,
    pub write_bytes: u64,
    pub cpu_seconds: f64,
    pub egress_bytes: u64,
}

impl Work {
    /// What the work costs by `model`: one batch of each kind (see the
    /// module docs), with its counters.
    pub fn price(&self, model: &CostModel) -> Consumption {
        let mut cost = Consumption::default();
        if self.read_requests > 0 {
            cost.add(&model.before(Batch::Read {
                requests: self.read_requests,
            }));
        }
        if self.read_bytes > 0 {
            cost.add(&model.after_read(self.read_bytes));
        }
        if self.write_requests > 0 || self.write_bytes > 0 {
            cost.add(&model.before(Batch::Write {
                requests: self.write_requests,
                bytes: self.write_bytes,
            }));
        }
        if self.cpu_seconds > 0.0 {
            cost.add(&model.cpu(self.cpu_seconds));
        }
        if self.egress_bytes > 0 {
            cost.add(&model.egress(self.egress_bytes));
        }
        cost
    }
}

/// The answer to a call, as its retries get it too.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    /// Acquire and TryAcquire.
    Acquired {
        admitted: bool,
        waited: Duration,
        fallback: bool,
    },
    Charged,
    Reported {
        request_units: f64,
    },
    Returned {
        returned: f64,
    },
}

/// What a call did to its bucket: the consumption it charged (tokens taken
/// count as request units) and the tokens it gave back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    pub bucket: BucketName,
    pub charged: Consumption,
    pub returned: f64,
}

/// A settled call: everything needed to answer its retries and to know
/// what it charged, made before its reply is sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settled {
    pub tenant: TenantId,
    pub request_id: Option<String>,
    pub call: Call,
    pub answer: Answer,
    pub effect: Effect,
    /// When it was answered, Unix milliseconds.
    pub answered_at_ms: u64,
}

/// A call as a caller made it, validated.
#[derive(Clone, Debug)]
pub struct CallRequest {
    pub tenant: TenantId,
    /// Empty in the wire's form: none.
    pub request_id: Option<String>,
    pub call: Call,
    /// How long the caller waits for the answer (gRPC's `grpc-timeout`),
    /// if it said.
    pub deadline: Option<Duration>,
}

/// Checks a request id: empty is none, else 1 to 128 characters.
pub fn request_id(id: &str) -> Result<Option<String>, InvalidInput> {
    if id.is_empty() {
        return Ok(None);
    }
    let chars = id.chars().count();
    if chars > MAX_REQUEST_ID_CHARS {
        return Err(InvalidInput::new(
            "request_id",
            format!("must be at most {MAX_REQUEST_ID_CHARS} characters, got {chars}"),
        ));
    }
    Ok(Some(id.to_owned()))
}

/// Checks the tokens of an Acquire, TryAcquire or Return: finite, 0 to 1e15.
pub fn tokens(value: f64) -> Result<f64, InvalidInput> {
    validate::non_negative("tokens", value, MAX_TOKENS)?;
    Ok(value)
}

/// Checks a Charge's tokens: finite, 0 to 1e12, the most one report to
/// the server may carry.
pub fn charged_tokens(value: f64) -> Result<f64, InvalidInput> {
    validate::non_negative("tokens", value, MAX_REPORTED_REQUEST_UNITS)?;
    Ok(value)
}

/// Checks an Acquire's `max_wait`: 0 to 1 hour.
pub fn max_wait(wait: Duration) -> Result<Duration, InvalidInput> {
    if wait > MAX_WAIT_LIMIT {
        return Err(InvalidInput::new(
            "max_wait",
            format!("must be at most 1 hour, got {wait:?}"),
        ));
    }
    Ok(wait)
}

/// Checks a report's work: CPU seconds finite, 0 to 1e9; counters at most
/// 2^53; and all of it priced at most 1e12 request units (what one report
/// to the server may carry).
pub fn work(work: Work, model: &CostModel) -> Result<Work, InvalidInput> {
    validate::non_negative("cpu_seconds", work.cpu_seconds, MAX_CPU_SECONDS)?;
    for (field, value) in [
        ("read_requests", work.read_requests),
        ("read_bytes", work.read_bytes),
        ("write_requests", work.write_requests),
        ("write_bytes", work.write_bytes),
        ("egress_bytes", work.egress_bytes),
    ] {
        validate::counter(field, value, validate::MAX_COUNTER)?;
    }
    let units = work.price(model).request_units();
    if units > MAX_REPORTED_REQUEST_UNITS {
        return Err(InvalidInput::new(
            "request_units",
            format!(
                "the work reported costs {} request units, more than the {} one report may \
                 carry: report it in parts",
                validate::number(units),
                validate::number(MAX_REPORTED_REQUEST_UNITS)
            ),
        ));
    }
    Ok(work)
}

/// Marks a request id's call in progress until it is answered; dropped
/// unanswered (failed, or its caller gone), it forgets the id.
struct Pending<'a> {
    agent: &'a Agent,
    tenant: &'a TenantId,
    request_id: Option<&'a str>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.request_id {
            self.agent.answers().abandon(self.tenant, id);
        }
    }
}

impl Agent {
    /// Settles a call (see the module docs): its stored answer for a
    /// repeated request id, else its effect applied and its answer kept.
    pub async fn settle(&self, request: CallRequest) -> Result<Answer, AgentError> {
        if self.is_closing() {
            return Err(AgentError::ShuttingDown);
        }
        let CallRequest {
            tenant,
            request_id,
            call,
            deadline,
        } = request;
        if let Some(id) = &request_id {
            match self.answers().begin(&tenant, id, &call, unix_ms()) {
                Begin::Fresh => {}
                Begin::Replay(answer) => return Ok(answer),
                Begin::InProgress => return Err(AgentError::InProgress),
                Begin::Mismatch => {
                    return Err(InvalidInput::new(
                        "request_id",
                        format!(
                            "{id:?} was used for another call (another bucket, amount or \
                             method) in the last 10 minutes; use a new request id"
                        ),
                    )
                    .into());
                }
            }
        }
        let mut pending = Pending {
            agent: self,
            tenant: &tenant,
            request_id: request_id.as_deref(),
        };
        let (answer, effect) = self.apply(&tenant, &call, deadline).await?;
        let settled = Settled {
            tenant: tenant.clone(),
            request_id: request_id.clone(),
            call,
            answer,
            effect,
            answered_at_ms: unix_ms(),
        };
        // Answered: the request id is no longer in progress, whatever
        // happens to the reply.
        pending.request_id = None;
        self.keep(&settled);
        Ok(settled.answer)
    }

    /// Keeps a settled call, before its reply is sent: its answer for the
    /// retries of its request id. Every call that changed a bucket passes
    /// here, and only here: the one place to make it durable (the crash
    /// journal writes `settled` here).
    fn keep(&self, settled: &Settled) {
        let remembered = settled.request_id.as_ref().map(|request_id| Remembered {
            tenant: settled.tenant.clone(),
            request_id: request_id.clone(),
            call: settled.call.clone(),
            answer: settled.answer.clone(),
            answered_at_ms: settled.answered_at_ms,
        });
        let effect = &settled.effect;
        let returned_micros = validate::to_micros(effect.returned);
        let changed = effect.charged != Consumption::default() || returned_micros > 0;
        if let Some(journal) = self.journal()
            && (changed || remembered.is_some())
            && let Err(e) = journal.call(
                &settled.tenant,
                &effect.bucket,
                &effect.charged,
                returned_micros,
                settled.request_id.as_deref(),
                remembered.as_ref(),
            )
        {
            // The call stands (its effect is in the bucket, reported as
            // usual); only a crash before that report would lose it.
            self.metrics().journal_errors.inc();
            tracing::error!(tenant = %settled.tenant, bucket = %effect.bucket, error = %e, "journal: cannot record an answered call");
        }
        let Some(remembered) = remembered else {
            return;
        };
        let mut answers = self.answers();
        answers.finish(remembered);
        self.metrics()
            .request_ids
            .set(i64::try_from(answers.len()).unwrap_or(i64::MAX));
    }

    /// Applies `call` to `tenant`'s bucket: its answer and its effect.
    async fn apply(
        &self,
        tenant: &TenantId,
        call: &Call,
        deadline: Option<Duration>,
    ) -> Result<(Answer, Effect), AgentError> {
        let bucket = call.bucket();
        let effect = |charged: Consumption, returned: f64| Effect {
            bucket: bucket.clone(),
            charged,
            returned,
        };
        match call {
            Call::Acquire {
                bucket,
                tokens,
                max_wait,
            } => {
                let handle = self.tenants().bucket(tenant, bucket)?;
                let wait = max_wait.unwrap_or(self.max_wait());
                // Answered a little before the caller's deadline, so that
                // it hears "not admitted" rather than its own timeout.
                let wait = deadline.map_or(wait, |deadline| {
                    wait.min(deadline.saturating_sub(DEADLINE_MARGIN.min(deadline / 20)))
                });
                let answer = self.wait_for_tokens(tenant, &handle, *tokens, wait).await?;
                let taken = match answer {
                    Answer::Acquired { admitted: true, .. } => *tokens,
                    _ => 0.0,
                };
                Ok((answer, effect(Consumption::from_request_units(taken), 0.0)))
            }
            Call::TryAcquire { bucket, tokens } => {
                let handle = self.tenants().bucket(tenant, bucket)?;
                let admitted = handle.try_acquire(*tokens).inspect_err(|_| {
                    self.metrics()
                        .acquisition(tenant.as_str(), bucket.as_str(), Outcome::Error);
                })?;
                let outcome = if admitted {
                    Outcome::Admitted
                } else {
                    Outcome::NotAdmitted
                };
                self.metrics()
                    .acquisition(tenant.as_str(), bucket.as_str(), outcome);
                let answer = Answer::Acquired {
                    admitted,
                    waited: Duration::ZERO,
                    fallback: admitted && handle.status().fallback_active,
                };
                let taken = if admitted { *tokens } else { 0.0 };
                Ok((answer, effect(Consumption::from_request_units(taken), 0.0)))
            }
            Call::Charge { bucket, tokens } => {
                let handle = self.tenants().bucket(tenant, bucket)?;
                let charged = Consumption::from_request_units(*tokens);
                handle.charge_after(charged)?;
                Ok((Answer::Charged, effect(charged, 0.0)))
            }
            Call::Report { work } => {
                let controller = self.tenants().controller(tenant)?;
                let charged = work.price(controller.cost_model());
                controller.charge_after(charged)?;
                let answer = Answer::Reported {
                    request_units: charged.request_units(),
                };
                Ok((answer, effect(charged, 0.0)))
            }
            Call::Return { bucket, tokens } => {
                let handle = self.tenants().bucket(tenant, bucket)?;
                let returned = handle.give_back(*tokens)?;
                Ok((
                    Answer::Returned { returned },
                    effect(Consumption::default(), returned),
                ))
            }
        }
    }

    /// Waits up to `wait` for `tokens` of `handle`'s bucket, first come,
    /// first served; refused with UNAVAILABLE if the agent starts shutting
    /// down meanwhile. Dropped while it waits, it leaves the queue and takes
    /// nothing (the client's acquire is cancellation-safe).
    async fn wait_for_tokens(
        &self,
        tenant: &TenantId,
        handle: &BucketHandle,
        tokens: f64,
        wait: Duration,
    ) -> Result<Answer, AgentError> {
        let bucket = handle.name().as_str();
        let started = Instant::now();
        let mut watch = Watch {
            agent: self,
            tenant: tenant.as_str(),
            bucket,
            started,
            outcome: None,
        };
        let mut closing = self.closing_signal();
        let outcome = tokio::select! {
            biased;
            outcome = tokio::time::timeout(wait, handle.acquire(tokens)) => outcome,
            _ = closing.wait_for(|closing| *closing) => {
                watch.outcome = Some(Outcome::Error);
                return Err(AgentError::ShuttingDown);
            }
        };
        let waited = started.elapsed();
        match outcome {
            Ok(Ok(())) => {
                watch.outcome = Some(Outcome::Admitted);
                Ok(Answer::Acquired {
                    admitted: true,
                    waited,
                    fallback: handle.status().fallback_active,
                })
            }
            Ok(Err(e)) => {
                watch.outcome = Some(Outcome::Error);
                Err(e.into())
            }
            Err(_elapsed) => {
                watch.outcome = Some(Outcome::NotAdmitted);
                Ok(Answer::Acquired {
                    admitted: false,
                    waited,
                    fallback: false,
                })
            }
        }
    }
}

/// Counts an acquire's outcome and wait when it ends, however it ends: one
/// dropped before it knew is `cancelled`.
struct Watch<'a> {
    agent: &'a Agent,
    tenant: &'a str,
    bucket: &'a str,
    started: Instant,
    outcome: Option<Outcome>,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let metrics = self.agent.metrics();
        let outcome = self.outcome.unwrap_or(Outcome::Cancelled);
        metrics.acquisition(self.tenant, self.bucket, outcome);
        metrics.waited(
            self.tenant,
            self.bucket,
            self.started.elapsed().as_secs_f64(),
        );
    }
}

/// Now, in Unix milliseconds (0 before 1970: a clock that far off keeps
/// answers no shorter than it would otherwise).
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_one_batch_of_each_kind_it_holds() {
        let model = CostModel::default();
        let work = Work {
            read_requests: 4,
            read_bytes: 1 << 20,
            write_requests: 2,
            write_bytes: 1 << 10,
            cpu_seconds: 0.5,
            egress_bytes: 1 << 20,
        };
        let cost = work.price(&model);
        // Reads 0.5 + 4 × 0.125 and 16 for the MiB read; writes 1 + 2 × 1
        // and 1 for the KiB written; CPU 333.3 × 0.5; egress 1024.
        let expected = 1.0 + 16.0 + 3.0 + 1.0 + 166.65 + 1024.0;
        assert!((cost.request_units() - expected).abs() < 1e-6, "{cost:?}");
        assert_eq!((cost.read_batches, cost.read_requests), (1, 4));
        assert_eq!((cost.write_batches, cost.write_requests), (1, 2));
        assert_eq!(cost.cpu_micros, 500_000);
        assert_eq!(Work::default().price(&model), Consumption::default());
    }

    #[test]
    fn each_bad_field_is_named() {
        let model = CostModel::default();
        assert_eq!(tokens(f64::NAN).expect_err("NaN").field, "tokens");
        assert_eq!(tokens(-1.0).expect_err("negative").field, "tokens");
        assert_eq!(tokens(1e16).expect_err("too many").field, "tokens");
        assert_eq!(charged_tokens(2e12).expect_err("too many").field, "tokens");
        assert_eq!(
            max_wait(Duration::from_secs(3601))
                .expect_err("too long")
                .field,
            "max_wait"
        );
        assert_eq!(
            request_id(&"x".repeat(129)).expect_err("too long").field,
            "request_id"
        );
        assert_eq!(request_id("").expect("none"), None);
        let cpu = Work {
            cpu_seconds: f64::INFINITY,
            ..Work::default()
        };
        assert_eq!(work(cpu, &model).expect_err("cpu").field, "cpu_seconds");
        let reads = Work {
            read_bytes: u64::MAX,
            ..Work::default()
        };
        assert_eq!(work(reads, &model).expect_err("bytes").field, "read_bytes");
        let costly = Work {
            write_bytes: 1 << 52,
            ..Work::default()
        };
        assert_eq!(
            work(costly, &model).expect_err("too costly").field,
            "request_units"
        );
    }
}
