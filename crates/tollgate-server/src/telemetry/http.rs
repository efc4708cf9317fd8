//! The HTTP side: `/metrics` for Prometheus, `/healthz` (the process is
//! alive), `/readyz` (it can reach its store) and the web console
//! (`/console`, its data at `/console/api/buckets` and a tenant's page at
//! `/console/api/tenant`), on a port of their own.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use super::Telemetry;
use super::console::{Range, tenant_page};
use crate::service::AdminAuth;
use crate::store::{Store, StoreError};

/// The console page: one static file, its script inline.
const CONSOLE_PAGE: &str = include_str!("console.html");

#[derive(Clone)]
struct AppState {
    telemetry: Telemetry,
    store: Arc<dyn Store>,
    admin: AdminAuth,
}

/// Serves `/metrics`, `/healthz`, `/readyz` and the console on `listener`
/// until `shutdown` completes. The console's data needs what `admin`
/// requires of a call of `ListTenants` (an admin token of any role, where
/// tokens are configured).
pub async fn serve_http(
    listener: TcpListener,
    store: Arc<dyn Store>,
    telemetry: Telemetry,
    admin: AdminAuth,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    tracing::info!(address = %local, "metrics and health listening over HTTP");
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/", get(|| async { Redirect::to("/console") }))
        .route("/console", get(|| async { Html(CONSOLE_PAGE) }))
        .route("/console/api/buckets", get(console_buckets))
        .route("/console/api/tenant", get(console_tenant))
        .route("/console/api/preview", get(console_preview))
        .route("/console/api/preview-budget", get(console_preview_budget))
        .with_state(AppState {
            telemetry,
            store,
            admin,
        });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn metrics(State(state): State<AppState>) -> Response {
    match state.telemetry.metrics.render(state.store.as_ref()).await {
        Ok(text) => (
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

async fn ready(State(state): State<AppState>) -> Response {
    if state.telemetry.health.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the store is unreachable or the server is stopping\n",
        )
            .into_response()
    }
}

/// Why the console's data is refused to `headers`, if it is.
fn refuse_reader(state: &AppState, headers: &HeaderMap) -> Option<Response> {
    let status = state.admin.check_reader(headers).err()?;
    let code = match status.code() {
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        _ => StatusCode::UNAUTHORIZED,
    };
    Some((code, format!("{}\n", status.message())).into_response())
}

fn store_unavailable(e: &crate::store::StoreError) -> Response {
    tracing::warn!(error = %e, "console: cannot read the store");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("cannot read the store: {e}\n"),
    )
        .into_response()
}

/// 400, naming the parameter at fault.
fn bad_request(e: &tollgate_core::InvalidInput) -> Response {
    (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response()
}

/// A console answer: JSON, never cached.
fn fresh_json(view: impl serde::Serialize) -> Response {
    ([(header::CACHE_CONTROL, "no-store")], axum::Json(view)).into_response()
}

/// A preview's answer: its view; 404 for a tenant, bucket or tier the
/// store does not know; 503 if the store cannot be read.
fn preview_answer(answer: Result<impl serde::Serialize, StoreError>) -> Response {
    match answer {
        Ok(view) => fresh_json(view),
        Err(
            e @ (StoreError::TenantNotFound(_)
            | StoreError::BucketNotFound(_)
            | StoreError::Tier(tollgate_core::tier::TierError::TierNotFound(_))),
        ) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        Err(e) => store_unavailable(&e),
    }
}

/// The bucket a query names by `tenant` and `bucket` (empty: the
/// request-unit bucket).
fn query_bucket(
    tenant: Option<&str>,
    bucket: Option<&str>,
) -> Result<tollgate_core::BucketKey, tollgate_core::InvalidInput> {
    Ok(tollgate_core::BucketKey::new(
        tollgate_core::TenantId::parse("tenant", tenant.unwrap_or(""))?,
        tollgate_core::BucketName::parse("bucket", bucket.unwrap_or(""))?,
    ))
}

/// A query's number `field`.
fn query_number(field: &str, text: Option<&str>) -> Result<f64, tollgate_core::InvalidInput> {
    text.unwrap_or("")
        .trim()
        .parse::<f64>()
        .map_err(|_| tollgate_core::InvalidInput::new(field, "must be a number"))
}

/// The query of `/console/api/tenant`.
#[derive(Debug, serde::Deserialize)]
struct TenantQuery {
    tenant: Option<String>,
    range: Option<String>,
}

/// A tenant's page: `?tenant=ID&range=1h|24h|7d|30d` (24h if left out).
/// A bad parameter is 400 naming it; a tenant the store does not know,
/// 404.
async fn console_tenant(
    State(state): State<AppState>,
    headers: HeaderMap,
    axum::extract::Query(query): axum::extract::Query<TenantQuery>,
) -> Response {
    if let Some(refused) = refuse_reader(&state, &headers) {
        return refused;
    }
    let tenant =
        match tollgate_core::TenantId::parse("tenant", query.tenant.as_deref().unwrap_or("")) {
            Ok(tenant) => tenant,
            Err(e) => return bad_request(&e),
        };
    let range = match Range::parse("range", query.range.as_deref().unwrap_or("24h")) {
        Ok(range) => range,
        Err(e) => return bad_request(&e),
    };
    match tenant_page(
        state.store.as_ref(),
        &state.telemetry.metrics,
        &tenant,
        range,
    )
    .await
    {
        Ok(Some(page)) => fresh_json(page),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            format!("tenant {:?} is not known to this store\n", tenant.as_str()),
        )
            .into_response(),
        Err(e) => store_unavailable(&e),
    }
}

/// The query of `/console/api/preview`.
#[derive(Debug, serde::Deserialize)]
struct PreviewQuery {
    tenant: Option<String>,
    bucket: Option<String>,
    refill_rate: Option<String>,
    burst_limit: Option<String>,
    lookback: Option<String>,
    /// `tenant` (the default) or `tier`.
    scope: Option<String>,
}

/// A bucket's limits previewed against its recorded usage, as
/// `tollgate tenant set-limits --preview` shows them:
/// `?tenant=ID&bucket=B&refill_rate=R&burst_limit=L&lookback=1h|24h|7d|14d`
/// (24h if left out). Changes nothing; the answer carries the command
/// that would. With `&scope=tier`, the limits tried for the bucket in
/// the tenant's tier, for every tenant on it that does not override the
/// bucket, as `tollgate tier apply --preview` shows them. A bad parameter
/// is 400 naming it; an unknown bucket, 404.
async fn console_preview(
    State(state): State<AppState>,
    headers: HeaderMap,
    axum::extract::Query(query): axum::extract::Query<PreviewQuery>,
) -> Response {
    if let Some(refused) = refuse_reader(&state, &headers) {
        return refused;
    }
    let parsed = (|| {
        let key = query_bucket(query.tenant.as_deref(), query.bucket.as_deref())?;
        let limits = tollgate_core::Limits {
            refill_rate: query_number("refill_rate", query.refill_rate.as_deref())?,
            burst_limit: query_number("burst_limit", query.burst_limit.as_deref())?,
        };
        limits.validate()?;
        let lookback = preview_lookback(query.lookback.as_deref().unwrap_or("24h"))?;
        let tier = match query.scope.as_deref().unwrap_or("tenant") {
            "tenant" => false,
            "tier" => true,
            _ => {
                return Err(tollgate_core::InvalidInput::new(
                    "scope",
                    "tenant (this tenant's bucket) or tier (every tenant on its tier)",
                ));
            }
        };
        Ok((key, limits, lookback, tier))
    })();
    let (key, limits, lookback, tier) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return bad_request(&e),
    };
    let until = tollgate_core::Timestamp::from_system_time(std::time::SystemTime::now());
    let span = crate::preview::Span::back_from(until, lookback, crate::preview::DEFAULT_MAX_WAIT);
    let store = state.store.as_ref();
    if tier {
        use super::console::TierPreviewError;
        let answer =
            match super::console::tier_preview(store, &key.tenant, &key.bucket, limits, span).await
            {
                Ok(view) => Ok(view),
                Err(TierPreviewError::Invalid(e)) => return bad_request(&e),
                Err(TierPreviewError::Store(e)) => Err(e),
            };
        return preview_answer(answer);
    }
    preview_answer(
        crate::preview::bucket(store, &key, limits, span)
            .await
            .map(|p| super::console::PreviewView::of(&p, span)),
    )
}

/// The query of `/console/api/preview-budget`.
#[derive(Debug, serde::Deserialize)]
struct BudgetPreviewQuery {
    tenant: Option<String>,
    bucket: Option<String>,
    amount: Option<String>,
    period: Option<String>,
    at_limit: Option<String>,
}

/// A budget previewed on a bucket's recorded usage over the budget's
/// cycle so far, as `tollgate budget set --preview` shows it:
/// `?tenant=ID&bucket=B&amount=A&period=daily|weekly|monthly&at_limit=stop|notify`
/// (a weekly cycle starts on Monday, a monthly one on the 1st, in UTC).
/// Changes nothing; the answer carries the command that would. A bad
/// parameter is 400 naming it; an unknown bucket, 404.
async fn console_preview_budget(
    State(state): State<AppState>,
    headers: HeaderMap,
    axum::extract::Query(query): axum::extract::Query<BudgetPreviewQuery>,
) -> Response {
    use tollgate_core::budget::{AtLimit, Budget, CycleRule, Period, Weekday};
    if let Some(refused) = refuse_reader(&state, &headers) {
        return refused;
    }
    let until = tollgate_core::Timestamp::from_system_time(std::time::SystemTime::now());
    let parsed = (|| {
        let key = query_bucket(query.tenant.as_deref(), query.bucket.as_deref())?;
        let amount = query_number("amount", query.amount.as_deref())?;
        let period = match query.period.as_deref().unwrap_or("") {
            "daily" => Period::Daily,
            "weekly" => Period::Weekly {
                anchor_weekday: Weekday::Monday,
            },
            "monthly" => Period::Monthly { anchor_day: 1 },
            _ => {
                return Err(tollgate_core::InvalidInput::new(
                    "period",
                    "daily, weekly or monthly",
                ));
            }
        };
        let at_limit = match query.at_limit.as_deref().unwrap_or("") {
            "stop" => AtLimit::Stop,
            "notify" => AtLimit::Notify,
            _ => {
                return Err(tollgate_core::InvalidInput::new(
                    "at_limit",
                    "stop or notify (a throttle to a baseline is previewed with tollgate budget set --preview)",
                ));
            }
        };
        let cycle = CycleRule {
            period,
            time_zone: "UTC".to_owned(),
        };
        let budget = Budget::new(amount, cycle, at_limit).validated()?;
        let span = crate::preview::budget_span(&budget, until, crate::preview::DEFAULT_MAX_WAIT)?;
        Ok((key, budget, span))
    })();
    let (key, budget, span) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return bad_request(&e),
    };
    preview_answer(
        crate::preview::budget(state.store.as_ref(), &key, &budget, span)
            .await
            .map(|p| super::console::PreviewView::of_budget(&p, span, &budget)),
    )
}

/// The look-backs the console offers.
fn preview_lookback(text: &str) -> Result<std::time::Duration, tollgate_core::InvalidInput> {
    let hours = match text {
        "1h" => 1,
        "24h" => 24,
        "7d" => 7 * 24,
        "14d" => 14 * 24,
        _ => {
            return Err(tollgate_core::InvalidInput::new(
                "lookback",
                "one of 1h, 24h, 7d, 14d",
            ));
        }
    };
    Ok(std::time::Duration::from_secs(hours * 3_600))
}

async fn console_buckets(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(refused) = refuse_reader(&state, &headers) {
        return refused;
    }
    match state
        .telemetry
        .console
        .view(state.store.as_ref(), &state.telemetry.metrics)
        .await
    {
        Ok(view) => fresh_json(view),
        Err(e) => store_unavailable(&e),
    }
}
