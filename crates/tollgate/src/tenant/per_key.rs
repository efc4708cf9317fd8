//! Per-key buckets in the `tenant` commands: `show`, `list`, `describe`
//! and `watch` show them beside the shared buckets, from the server's
//! `ListKeyBuckets` (and `DescribeTenant`).
//!
//! A per-key bucket has no level of its own: it is a definition (rate and
//! burst per key, from the tenant's tier or an override), the keys the
//! store holds (those below their burst), the busiest of them, and the
//! checks and refusals per second of the replica that answered (each
//! replica counts its own; the text says "this replica"). In `--json` a
//! per-key bucket is an object with `"kind": "per-key"` among the shared
//! buckets (`"kind": "shared"`), in tenant and bucket order.

use serde::Serialize;
use tollgate_proto::v1;

use super::TenantJson;
use crate::output::{Table, field, rfc3339, seconds};
use crate::remote::{AdminConnection, rpc_error};

/// A per-key bucket as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct KeyBucketJson {
    pub tenant_id: String,
    pub bucket: String,
    /// Always `per-key`.
    pub kind: &'static str,
    /// Per key.
    pub refill_rate: f64,
    pub burst_limit: f64,
    /// `tier` or `override`.
    pub defined_by: &'static str,
    /// Keys below their burst (a full key is not stored).
    pub keys_stored: u64,
    /// This replica's, over `rate_window_seconds`.
    pub checks_per_second: f64,
    pub refusals_per_second: f64,
    pub rate_window_seconds: f64,
    pub read_at: Option<String>,
    /// Furthest from full first.
    pub busiest_keys: Vec<BusyKeyJson>,
}

#[derive(Debug, Serialize)]
pub struct BusyKeyJson {
    pub key: String,
    pub tokens: f64,
    /// `null`: never (no refill).
    pub full_in_seconds: Option<f64>,
}

/// A bucket of either kind, as the lists of `--json` hold them.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum AnyBucketJson {
    Shared(Box<TenantJson>),
    PerKey(KeyBucketJson),
}

impl AnyBucketJson {
    fn key(&self) -> (&str, &str) {
        match self {
            AnyBucketJson::Shared(t) => (&t.tenant_id, &t.bucket),
            AnyBucketJson::PerKey(k) => (&k.tenant_id, &k.bucket),
        }
    }
}

/// Shared and per-key buckets in one list, in tenant and bucket order.
pub fn merged(shared: Vec<TenantJson>, per_key: Vec<KeyBucketJson>) -> Vec<AnyBucketJson> {
    let mut all: Vec<AnyBucketJson> = shared
        .into_iter()
        .map(|t| AnyBucketJson::Shared(Box::new(t)))
        .chain(per_key.into_iter().map(AnyBucketJson::PerKey))
        .collect();
    all.sort_by(|a, b| a.key().cmp(&b.key()));
    all
}

pub fn key_bucket_json(b: &v1::KeyBucket) -> KeyBucketJson {
    let limits = b.limits.unwrap_or_default();
    KeyBucketJson {
        tenant_id: b.tenant_id.clone(),
        bucket: b.bucket.clone(),
        kind: "per-key",
        refill_rate: limits.refill_rate,
        burst_limit: limits.burst_limit,
        defined_by: if b.overridden { "override" } else { "tier" },
        keys_stored: b.keys_stored,
        checks_per_second: b.checks_per_second,
        refusals_per_second: b.refusals_per_second,
        rate_window_seconds: seconds(b.rate_window),
        read_at: rfc3339(b.read_at),
        busiest_keys: b
            .busiest_keys
            .iter()
            .map(|k| BusyKeyJson {
                key: k.key.clone(),
                tokens: k.tokens,
                full_in_seconds: k.full_in.map(|d| seconds(Some(d))),
            })
            .collect(),
    }
}

/// Every per-key bucket of every tenant, or of `tenant` if it is not
/// empty, with `busiest` keys each (0: the server's default). A server
/// without `ListKeyBuckets` has none to show.
pub async fn list(
    client: &mut AdminConnection,
    tenant: &str,
    busiest: u32,
) -> anyhow::Result<Vec<v1::KeyBucket>> {
    let mut buckets = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = match client
            .list_key_buckets(v1::ListKeyBucketsRequest {
                page_size: 1000,
                page_token,
                tenant_id: tenant.to_owned(),
                busiest_keys: busiest,
            })
            .await
        {
            Ok(page) => page.into_inner(),
            Err(status) if status.code() == tonic::Code::Unimplemented => return Ok(Vec::new()),
            Err(status) => return Err(rpc_error(status)),
        };
        buckets.extend(page.key_buckets);
        if page.next_page_token.is_empty() {
            return Ok(buckets);
        }
        page_token = page.next_page_token;
    }
}

/// A key and its tokens as a line of text: `u42 (2.0 tokens, full in 4.0s)`.
fn busy_key_text(k: &BusyKeyJson) -> String {
    let full = k
        .full_in_seconds
        .map_or_else(|| "never full".to_owned(), |s| format!("full in {s:.1}s"));
    format!("{} ({:.1} tokens, {full})", k.key, k.tokens)
}

/// The rates as text, saying whose they are.
pub fn rates_text(k: &KeyBucketJson) -> String {
    format!(
        "{:.1} checks/s, {:.1} refused/s (this replica, last {:.1} s)",
        k.checks_per_second, k.refusals_per_second, k.rate_window_seconds
    )
}

/// One per-key bucket as `tenant show` shows it: a key-value table, then
/// its busiest keys.
pub fn key_bucket_text(k: &KeyBucketJson) -> String {
    let text = Table::new([
        field("tenant", k.tenant_id.clone()),
        field("bucket", k.bucket.clone()),
        field("kind", format!("per-key (from the {})", k.defined_by)),
        field("refill rate", format!("{} tokens/s per key", k.refill_rate)),
        field("burst limit", format!("{} tokens per key", k.burst_limit)),
        field(
            "keys stored",
            format!("{} (below their burst)", k.keys_stored),
        ),
        field("checks", rates_text(k)),
    ])
    .to_string();
    if k.busiest_keys.is_empty() {
        return format!("{text}\n\nno keys below their burst");
    }
    let mut table = Table::with_header(&["BUSIEST KEY", "TOKENS", "FULL IN"]);
    for key in &k.busiest_keys {
        table.push(vec![
            key.key.clone(),
            format!("{:.1}", key.tokens),
            key.full_in_seconds
                .map_or_else(|| "never".to_owned(), |s| format!("{s:.1}s")),
        ]);
    }
    format!("{text}\n\n{table}")
}

/// Per-key buckets as rows of a table (`tenant list`, `describe`): one
/// line each, the busiest key first in the last column.
pub fn table(buckets: &[KeyBucketJson], with_tenant: bool) -> Table {
    let mut header = vec![
        "PER-KEY BUCKET",
        "FROM",
        "REFILL/S",
        "BURST",
        "KEYS STORED",
        "CHECKS/S",
        "REFUSED/S",
        "BUSIEST KEYS",
    ];
    if with_tenant {
        header.insert(0, "TENANT");
    }
    let mut table = Table::with_header(&header);
    for k in buckets {
        let mut row = vec![
            k.bucket.clone(),
            k.defined_by.to_owned(),
            k.refill_rate.to_string(),
            k.burst_limit.to_string(),
            k.keys_stored.to_string(),
            format!("{:.1}", k.checks_per_second),
            format!("{:.1}", k.refusals_per_second),
            busiest_text(k),
        ];
        if with_tenant {
            row.insert(0, k.tenant_id.clone());
        }
        table.push(row);
    }
    table
}

/// The busiest keys on one line, or a dash.
pub fn busiest_text(k: &KeyBucketJson) -> String {
    if k.busiest_keys.is_empty() {
        "–".to_owned()
    } else {
        k.busiest_keys
            .iter()
            .map(busy_key_text)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The note under a table of per-key buckets: whose rates they are.
pub fn rates_note(buckets: &[KeyBucketJson]) -> String {
    let window = buckets.first().map_or(0.0, |k| k.rate_window_seconds);
    format!(
        "checks and refusals per second: this replica's, over the last {window:.1} s; keys stored: below their burst"
    )
}
