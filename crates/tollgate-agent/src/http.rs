//! The agent's HTTP/JSON face, on the same listeners as gRPC, for shell
//! scripts and languages without gRPC; and `/metrics`, `/healthz` and
//! `/readyz`.
//!
//! | Method and path | Body or query | Answer |
//! |---|---|---|
//! | `POST /v1/acquire` | `tenant`, `bucket`, `tokens`, `max_wait_ms`, `request_id` | `admitted`, `waited_ms`, `fallback` |
//! | `POST /v1/try-acquire` | `tenant`, `bucket`, `tokens`, `request_id` | as acquire |
//! | `POST /v1/charge` | `tenant`, `bucket`, `tokens`, `request_id` | `{}` |
//! | `POST /v1/report` | `tenant`, `read_requests`, `read_bytes`, `write_requests`, `write_bytes`, `cpu_seconds`, `egress_bytes`, `request_id` | `request_units` |
//! | `POST /v1/return` | `tenant`, `bucket`, `tokens`, `request_id` | `returned` |
//! | `GET /v1/status?tenant=T&bucket=B` | | the proto's `StatusResponse` fields |
//!
//! Field names are the proto's (snake_case); a field left out has the
//! proto's default (empty, 0); durations are milliseconds, as numbers
//! (`max_wait_ms`, `waited_ms`), and a `max_wait_ms` left out (or `null`)
//! is an unset `max_wait`. A body must be a JSON object of these fields
//! only: an unknown field, or one of the wrong type, is refused naming it.
//! TCP callers send `Authorization: Bearer <token>` as gRPC callers do.
//!
//! Every call goes through [`crate::wire`], as gRPC calls do. An error is
//! `{"error":{"code":"INVALID_ARGUMENT","message":"tokens: …"}}` with the
//! HTTP status of its code ([`crate::error::http_status`]: 400, 401, 403,
//! 404, 409, 412, 503, …).

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Map, Value, json};
use tollgate_core::InvalidInput;
use tollgate_proto::agent::v1 as api;

use crate::Agent;
use crate::access::{Caller, Listener};
use crate::error::AgentError;

/// The JSON routes, `/metrics` and the health endpoints, for an agent
/// whose listeners are up while `ready` says so.
pub fn routes(agent: Agent, ready: tokio::sync::watch::Receiver<bool>) -> Router {
    Router::new()
        .route("/v1/acquire", post(acquire))
        .route("/v1/try-acquire", post(try_acquire))
        .route("/v1/charge", post(charge))
        .route("/v1/report", post(report))
        .route("/v1/return", post(give_back))
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = *ready.borrow();
                async move {
                    if ready {
                        (StatusCode::OK, "ready\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }
            }),
        )
        .with_state(agent)
}

/// Who the caller is: the listener (marked on the request by its router)
/// and its `Authorization` header.
fn caller(listener: Option<&Listener>, headers: &HeaderMap) -> Caller {
    let listener = listener.copied().unwrap_or(Listener::Tcp);
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(|value| value.as_bytes());
    Caller::new(listener, authorization)
}

/// The answer to a JSON call, counted as `method`.
fn answer(agent: &Agent, method: &str, result: Result<Value, AgentError>) -> Response {
    let code = result
        .as_ref()
        .map_or_else(AgentError::code, |_| tonic::Code::Ok);
    agent.metrics().call(method, code);
    match result {
        Ok(body) => (StatusCode::OK, axum::Json(body)).into_response(),
        Err(e) => {
            if let AgentError::Internal(message) = &e {
                tracing::error!(method, error = %message, "a call failed inside the agent");
            }
            (e.http_status(), axum::Json(e.to_json())).into_response()
        }
    }
}

/// The request's listener, as its router marked it.
type Marked = Option<axum::Extension<Listener>>;

fn listener_of(marked: &Marked) -> Option<&Listener> {
    marked.as_ref().map(|axum::Extension(listener)| listener)
}

async fn acquire(
    State(agent): State<Agent>,
    marked: Marked,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = caller(listener_of(&marked), &headers);
    let result = async {
        let fields = Fields::parse(
            &body,
            &["tenant", "bucket", "tokens", "max_wait_ms", "request_id"],
        )?;
        let request = api::AcquireRequest {
            tenant: fields.string("tenant")?,
            bucket: fields.string("bucket")?,
            tokens: fields.number("tokens")?,
            max_wait: fields.millis("max_wait_ms")?,
            request_id: fields.string("request_id")?,
        };
        let response = agent
            .acquire(&caller, request, None)
            .await
            .map_err(|e| renamed(e, "max_wait", "max_wait_ms"))?;
        Ok(acquire_json(&response))
    }
    .await;
    answer(&agent, "Acquire", result)
}

async fn try_acquire(
    State(agent): State<Agent>,
    marked: Marked,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = caller(listener_of(&marked), &headers);
    let result = async {
        let fields = Fields::parse(&body, &["tenant", "bucket", "tokens", "request_id"])?;
        let request = api::TryAcquireRequest {
            tenant: fields.string("tenant")?,
            bucket: fields.string("bucket")?,
            tokens: fields.number("tokens")?,
            request_id: fields.string("request_id")?,
        };
        let response = agent.try_acquire(&caller, request).await?;
        Ok(acquire_json(&response))
    }
    .await;
    answer(&agent, "TryAcquire", result)
}

async fn charge(
    State(agent): State<Agent>,
    marked: Marked,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = caller(listener_of(&marked), &headers);
    let result = async {
        let fields = Fields::parse(&body, &["tenant", "bucket", "tokens", "request_id"])?;
        let request = api::ChargeRequest {
            tenant: fields.string("tenant")?,
            bucket: fields.string("bucket")?,
            tokens: fields.number("tokens")?,
            request_id: fields.string("request_id")?,
        };
        agent.charge(&caller, request).await?;
        Ok(json!({}))
    }
    .await;
    answer(&agent, "Charge", result)
}

async fn report(
    State(agent): State<Agent>,
    marked: Marked,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = caller(listener_of(&marked), &headers);
    let result = async {
        let fields = Fields::parse(
            &body,
            &[
                "tenant",
                "read_requests",
                "read_bytes",
                "write_requests",
                "write_bytes",
                "cpu_seconds",
                "egress_bytes",
                "request_id",
            ],
        )?;
        let request = api::ReportRequest {
            tenant: fields.string("tenant")?,
            read_requests: fields.count("read_requests")?,
            read_bytes: fields.count("read_bytes")?,
            write_requests: fields.count("write_requests")?,
            write_bytes: fields.count("write_bytes")?,
            cpu_seconds: fields.number("cpu_seconds")?,
            egress_bytes: fields.count("egress_bytes")?,
            request_id: fields.string("request_id")?,
        };
        let response = agent.report(&caller, request).await?;
        Ok(json!({ "request_units": response.request_units }))
    }
    .await;
    answer(&agent, "Report", result)
}

async fn give_back(
    State(agent): State<Agent>,
    marked: Marked,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = caller(listener_of(&marked), &headers);
    let result = async {
        let fields = Fields::parse(&body, &["tenant", "bucket", "tokens", "request_id"])?;
        let request = api::ReturnRequest {
            tenant: fields.string("tenant")?,
            bucket: fields.string("bucket")?,
            tokens: fields.number("tokens")?,
            request_id: fields.string("request_id")?,
        };
        let response = agent.give_back(&caller, request).await?;
        Ok(json!({ "returned": response.returned }))
    }
    .await;
    answer(&agent, "Return", result)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusQuery {
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    bucket: String,
}

async fn status(
    State(agent): State<Agent>,
    marked: Marked,
    headers: HeaderMap,
    query: Result<Query<StatusQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let caller = caller(listener_of(&marked), &headers);
    let result = (|| {
        let Query(query) = query
            .map_err(|e| AgentError::InvalidArgument(InvalidInput::new("query", e.body_text())))?;
        let request = api::StatusRequest {
            tenant: query.tenant,
            bucket: query.bucket,
        };
        let s = agent.status(&caller, request)?;
        Ok(json!({
            "tokens": s.tokens,
            "debt": s.debt,
            "trickle_rate": s.trickle_rate,
            "fallback_active": s.fallback_active,
            "fallback_rate": s.fallback_rate,
            "waiters": s.waiters,
            "queued_tokens": s.queued_tokens,
            "usage_rate": s.usage_rate,
            "instance_id": s.instance_id,
        }))
    })();
    answer(&agent, "Status", result)
}

async fn metrics(State(agent): State<Agent>) -> Response {
    use prometheus::Encoder;
    let mut text = Vec::new();
    match prometheus::TextEncoder::new().encode(&agent.registry().gather(), &mut text) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "cannot render metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
        }
    }
}

fn acquire_json(response: &api::AcquireResponse) -> Value {
    let waited = response
        .waited
        .map_or(0.0, |d| d.seconds as f64 * 1e3 + f64::from(d.nanos) / 1e6);
    json!({
        "admitted": response.admitted,
        "waited_ms": waited,
        "fallback": response.fallback,
    })
}

/// An error naming the proto's `field`, renamed to the JSON body's `to`.
fn renamed(error: AgentError, field: &str, to: &str) -> AgentError {
    match error {
        AgentError::InvalidArgument(e) if e.field == field => {
            AgentError::InvalidArgument(e.renamed(|_| to.to_owned()))
        }
        other => other,
    }
}

/// A JSON body's fields, read one by one with their types checked.
struct Fields(Map<String, Value>);

impl Fields {
    /// `body` as a JSON object of `allowed` fields only.
    fn parse(body: &[u8], allowed: &[&str]) -> Result<Fields, InvalidInput> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| InvalidInput::new("body", format!("must be a JSON object: {e}")))?;
        let Value::Object(object) = value else {
            return Err(InvalidInput::new("body", "must be a JSON object"));
        };
        if let Some(unknown) = object.keys().find(|key| !allowed.contains(&key.as_str())) {
            return Err(InvalidInput::new(
                unknown.as_str(),
                format!("unknown field; expected one of {}", allowed.join(", ")),
            ));
        }
        Ok(Fields(object))
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|value| !value.is_null())
    }

    fn string(&self, name: &str) -> Result<String, InvalidInput> {
        match self.get(name) {
            None => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(wrong_type(name, "a string", other)),
        }
    }

    fn number(&self, name: &str) -> Result<f64, InvalidInput> {
        match self.get(name) {
            None => Ok(0.0),
            Some(Value::Number(n)) => n
                .as_f64()
                .ok_or_else(|| InvalidInput::new(name, "must be a number")),
            Some(other) => Err(wrong_type(name, "a number", other)),
        }
    }

    fn count(&self, name: &str) -> Result<u64, InvalidInput> {
        match self.get(name) {
            None => Ok(0),
            Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
                InvalidInput::new(
                    name,
                    format!("must be a whole number from 0 to 2^64 - 1, got {n}"),
                )
            }),
            Some(other) => Err(wrong_type(name, "a whole number", other)),
        }
    }

    /// Milliseconds as a wire duration; `None` if left out.
    fn millis(&self, name: &str) -> Result<Option<prost_types::Duration>, InvalidInput> {
        let Some(value) = self.get(name) else {
            return Ok(None);
        };
        let Value::Number(n) = value else {
            return Err(wrong_type(name, "a number of milliseconds", value));
        };
        let millis = n
            .as_f64()
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
            .ok_or_else(|| {
                InvalidInput::new(name, format!("must be a non-negative number, got {n}"))
            })?;
        // Beyond any limit (an hour), refused by the range check after.
        let duration = Duration::try_from_secs_f64(millis / 1e3).unwrap_or(Duration::MAX);
        Ok(Some(tollgate_proto::duration(duration)))
    }
}

fn wrong_type(name: &str, expected: &str, got: &Value) -> InvalidInput {
    let kind = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    InvalidInput::new(name, format!("must be {expected}, got {kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_checked_by_name_and_type() {
        let fields = Fields::parse(
            br#"{"tenant":"acme","tokens":2.5,"max_wait_ms":1500,"read_bytes":7}"#,
            &["tenant", "tokens", "max_wait_ms", "read_bytes", "bucket"],
        )
        .expect("valid");
        assert_eq!(fields.string("tenant").expect("string"), "acme");
        assert_eq!(fields.string("bucket").expect("default"), "");
        assert_eq!(fields.number("tokens").expect("number"), 2.5);
        assert_eq!(fields.count("read_bytes").expect("count"), 7);
        let wait = fields.millis("max_wait_ms").expect("millis").expect("set");
        assert_eq!((wait.seconds, wait.nanos), (1, 500_000_000));

        let unknown = Fields::parse(br#"{"tokenz":1}"#, &["tokens"]).err();
        assert_eq!(unknown.map(|e| e.field), Some("tokenz".to_owned()));
        let body = Fields::parse(b"[1]", &["tokens"]).err();
        assert_eq!(body.map(|e| e.field), Some("body".to_owned()));
        let typed = Fields::parse(br#"{"tokens":"5"}"#, &["tokens"]).expect("object");
        assert_eq!(typed.number("tokens").expect_err("string").field, "tokens");
        let negative = Fields::parse(br#"{"n":-1,"w":-5}"#, &["n", "w"]).expect("object");
        assert_eq!(negative.count("n").expect_err("negative").field, "n");
        assert_eq!(negative.millis("w").expect_err("negative").field, "w");
    }
}
