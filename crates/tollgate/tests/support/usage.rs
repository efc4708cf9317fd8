//! Reads a PostgreSQL store's `tenant_usage` rows directly, to check what the
//! servers committed against what the pods (the load generator) saw.

use serde_json::Value;
use tokio_postgres::Client;

/// The consumption counters (all integers, request units and CPU in
/// micro-units), as the wire and the table name them.
pub const COUNTERS: [(&str, &str); 9] = [
    ("request_unit_micros", "total_request_unit_micros"),
    ("cpu_micros", "total_cpu_micros"),
    ("read_batches", "total_read_batches"),
    ("read_requests", "total_read_requests"),
    ("read_bytes", "total_read_bytes"),
    ("write_batches", "total_write_batches"),
    ("write_requests", "total_write_requests"),
    ("write_bytes", "total_write_bytes"),
    ("egress_bytes", "total_egress_bytes"),
];

/// One tenant as stored.
#[derive(Debug)]
pub struct Stored {
    pub counters: Vec<(String, i64)>,
    pub granted_tokens: f64,
    pub tokens: f64,
    pub refill_rate: f64,
    /// Seconds from creation to the last refill.
    pub lifetime_secs: f64,
    pub live_instances: i64,
}

/// Reads `tenant` and checks its instance list: every instance row is
/// reachable from the tenant row, in ascending order, and the walk ends at
/// the sentinel (so there is no other cycle).
pub async fn read_tenant(db: &Client, tenant: &str) -> Stored {
    let rows = db
        .query(
            "SELECT * FROM tenant_usage WHERE tenant_id = $1 ORDER BY instance_id",
            &[&tenant],
        )
        .await
        .expect("read tenant_usage");
    assert!(!rows.is_empty(), "tenant {tenant} is stored");
    let head = &rows[0];
    assert_eq!(head.get::<_, i64>("instance_id"), 0, "{tenant}: tenant row");
    let instances: Vec<(i64, i64)> = rows[1..]
        .iter()
        .map(|r| (r.get("instance_id"), r.get("next_instance_id")))
        .collect();
    let mut walked = Vec::new();
    let mut next: i64 = head.get("next_instance_id");
    while next != 0 {
        assert!(
            walked.len() < instances.len(),
            "{tenant}: the list does not come back to the sentinel: {instances:?}"
        );
        walked.push(next);
        next = instances
            .iter()
            .find(|(id, _)| *id == next)
            .unwrap_or_else(|| panic!("{tenant}: the list points at a missing row {next}"))
            .1;
    }
    let ids: Vec<i64> = instances.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        walked, ids,
        "{tenant}: every instance is reachable, in order"
    );
    let live: i64 = head.get("live_instances");
    assert_eq!(live as usize, ids.len(), "{tenant}: live_instances");
    let share_sum: f64 = head.get("share_sum");
    let shares: f64 = rows[1..].iter().map(|r| r.get::<_, f64>("shares")).sum();
    assert!(
        (share_sum - shares).abs() <= 1e-6 * shares.max(1.0),
        "{tenant}: share_sum {share_sum} vs {shares}"
    );
    let created: std::time::SystemTime = head.get("created_at");
    let last_refill: std::time::SystemTime = head.get("last_refill");
    Stored {
        counters: COUNTERS
            .iter()
            .map(|(name, column)| ((*name).to_owned(), head.get::<_, i64>(*column)))
            .collect(),
        granted_tokens: head.get("granted_tokens"),
        tokens: head.get("tokens"),
        refill_rate: head.get("refill_rate"),
        lifetime_secs: last_refill
            .duration_since(created)
            .unwrap_or_default()
            .as_secs_f64(),
        live_instances: live,
    }
}

fn counter(v: &Value, field: &str) -> u64 {
    v.get(field).and_then(Value::as_u64).unwrap_or(0)
}

/// Checks the stored consumption against the load generator's report for
/// the tenant: at least what the pods saw confirmed, at most that plus what
/// they sent without hearing back. With nothing unconfirmed, exactly equal.
pub fn check_consumption(tenant: &str, stored: &Stored, reports: &[&Value]) {
    let sum = |kind: &str, field: &str| -> u64 {
        reports
            .iter()
            .map(|r| counter(&r["tenants"][tenant][kind], field))
            .sum()
    };
    assert!(
        sum("consumption", "request_unit_micros") > 0,
        "{tenant}: the pods reported some consumption"
    );
    for (name, value) in &stored.counters {
        let confirmed = sum("consumption", name);
        let unconfirmed = sum("unconfirmed", name);
        let value = u64::try_from(*value).expect("a stored counter is not negative");
        assert!(
            value >= confirmed && value <= confirmed + unconfirmed,
            "{tenant}: stored {name} {value} outside [{confirmed}, {}]",
            confirmed + unconfirmed
        );
    }
}
