//! The web console on the HTTP port: `/console`, a page that shows the
//! tenants' buckets (limits, level, request units per second, throttled
//! and live pods, the budget's spend against its amount with the
//! forecast, a chart of the last minutes) and their per-key buckets
//! (definition, keys stored, this replica's checks and refusals per
//! second, the busiest keys), the tree of organisations (each member's
//! buckets with what they use, want, are guaranteed, draw and borrow),
//! and `/console/api/buckets`, the JSON it polls.
//!
//! The page is one static file with its script inline: no build step, and
//! nothing to serve but itself. The data comes from the store, read at most
//! every [`SAMPLE_INTERVAL`] whatever the number of open consoles, and only
//! while a console asks: with no console open, nothing is read. Each read
//! keeps the first [`MAX_BUCKETS`] buckets (in tenant-id order) and a
//! history of [`HISTORY`], from which rates are the differences of the
//! exact totals between reads. Per-key buckets (the first [`MAX_BUCKETS`]
//! too) are shown as the last read found them, with the check rates this
//! replica counted then (`check_rates`). Read-only: the console changes
//! nothing, and wants an admin token (any role) where the Admin service
//! does. Throttled pods are estimated from this replica's trickle grants.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;
use tollgate_core::key_bucket::KeyReading;
use tollgate_core::organisation::{MemberRates, Node};
use tollgate_core::tier::DefinedBy;
use tollgate_core::{BucketKey, TenantId, Timestamp};

use super::Metrics;
use super::metrics::read_buckets;
use crate::store::{NodeFilter, Store, StoreError};

/// The busiest keys shown per per-key bucket.
pub const BUSIEST_KEYS: usize = 3;

/// How often the store is read, at most, while a console is open.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// How many buckets a read keeps: the first, in tenant-id and bucket order.
pub const MAX_BUCKETS: usize = 1000;

/// How many organisations a read keeps: the first, in id order.
pub const MAX_ORGANISATIONS: usize = 100;

/// How far back the charts go.
pub const HISTORY: Duration = Duration::from_secs(10 * 60);

/// Pods renew about once per target period (10 s by default), so trickle
/// grants per second × this estimates the pods being throttled.
const RENEWALS_PER_POD_SECONDS: f64 = 10.0;

/// One bucket as one read found it.
#[derive(Clone, Debug)]
struct BucketSample {
    refill_rate: f64,
    burst_limit: f64,
    tokens: f64,
    live_instances: u32,
    request_unit_micros: u64,
    /// This replica's trickle grants to the bucket so far.
    trickles: u64,
    /// Tokens granted to its pods (or its members' draws) so far.
    granted_tokens: f64,
    /// A member's bucket: its standing with its organisation.
    member: Option<MemberRates>,
    budget: Option<BudgetColumn>,
}

/// One read of the store.
#[derive(Debug)]
struct Sample {
    taken: Instant,
    read_at: Timestamp,
    buckets: BTreeMap<BucketKey, BucketSample>,
    truncated: bool,
    /// The per-key buckets as read, with this replica's rates then.
    key_buckets: Vec<KeyBucketView>,
    key_buckets_truncated: bool,
    /// The organisations' rows and their members', by id.
    tree: BTreeMap<TenantId, Node>,
    organisations_truncated: bool,
}

/// The console's reads, newest last.
#[derive(Debug, Default)]
pub struct Console {
    samples: tokio::sync::Mutex<VecDeque<Sample>>,
}

/// What `/console/api/buckets` answers.
#[derive(Debug, Serialize)]
pub struct ConsoleView {
    /// When the store was last read, by its clock: seconds since the Unix
    /// epoch.
    pub read_at_unix: f64,
    pub sample_interval_seconds: f64,
    /// The time between the last two reads, which the rates cover; `null`
    /// until there are two.
    pub rate_window_seconds: Option<f64>,
    /// More buckets exist than [`MAX_BUCKETS`]; only the first are shown.
    pub truncated: bool,
    pub total_buckets: usize,
    pub total_tenants: usize,
    /// This replica's pod-facing requests in flight.
    pub pending_requests: i64,
    pub buckets: Vec<BucketView>,
    /// Per-key buckets in tenant and bucket order, as the last read found
    /// them.
    pub key_buckets: Vec<KeyBucketView>,
    /// More per-key buckets exist than [`MAX_BUCKETS`].
    pub key_buckets_truncated: bool,
    /// The tree of organisations, depth first: each organisation's
    /// buckets, then its members' (an organisation among them followed
    /// by its own members).
    pub organisations: Vec<TreeRowView>,
    /// More organisations exist than [`MAX_ORGANISATIONS`].
    pub organisations_truncated: bool,
}

/// One bucket of the tree of organisations: an organisation's own, or a
/// member's (an id with no bucket listed has one row, its bucket and
/// figures `null`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TreeRowView {
    /// 0 for an organisation at the top.
    pub depth: usize,
    pub id: String,
    pub is_organization: bool,
    /// An organisation's display name.
    pub display_name: String,
    pub bucket: Option<String>,
    /// The bucket's own limit: for a member, its ceiling.
    pub refill_rate: Option<f64>,
    /// Tokens per second granted (to its pods, or to its members' draws),
    /// over `rate_window_seconds`.
    pub granted_per_second: Option<f64>,
    /// A member's bucket as of its last draw ([`MemberRates`]).
    pub wanted_rate: Option<f64>,
    pub guaranteed_rate: Option<f64>,
    pub drawn_rate: Option<f64>,
    pub borrowed_rate: Option<f64>,
}

/// A per-key bucket: its definition, its stored keys, and this replica's
/// checks.
#[derive(Clone, Debug, Serialize)]
pub struct KeyBucketView {
    pub tenant_id: String,
    pub bucket: String,
    /// Per key.
    pub refill_rate: f64,
    pub burst_limit: f64,
    /// `tier` or `override`.
    pub defined_by: &'static str,
    /// Keys below their burst.
    pub keys_stored: u64,
    /// This replica's, over `rate_window_seconds`.
    pub checks_per_second: f64,
    pub refusals_per_second: f64,
    pub rate_window_seconds: f64,
    /// At most [`BUSIEST_KEYS`], the furthest from full first.
    pub busiest_keys: Vec<BusyKeyView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BusyKeyView {
    pub key: String,
    pub tokens: f64,
    /// `null`: never (no refill).
    pub full_in_seconds: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct BucketView {
    pub tenant_id: String,
    /// Empty for the tenant's request-unit bucket.
    pub bucket: String,
    pub refill_rate: f64,
    pub burst_limit: f64,
    /// The level when read; negative is debt.
    pub tokens: f64,
    pub live_instances: u32,
    /// Between the last two reads; `null` until there are two.
    pub request_units_per_second: Option<f64>,
    /// Trickle grants per 10 s from this replica between the last two
    /// reads: about the pods it throttles.
    pub throttled_pods: Option<f64>,
    /// `[unix seconds, request units per second]` between consecutive
    /// reads, oldest first.
    pub history: Vec<(f64, f64)>,
    /// The bucket's budget in its current cycle; `null` without one.
    pub budget: Option<BudgetColumn>,
}

/// A bucket's budget as the console shows it: a bar of the spend against
/// the amount, with the forecast.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetColumn {
    pub amount: f64,
    pub spend: f64,
    pub forecast: f64,
    /// `under`, `over`, `throttled` or `stopped`.
    pub state: &'static str,
    /// `monthly`, `weekly` or `daily`.
    pub period: &'static str,
    pub cycle_end_unix: f64,
    /// For display: the spend's price, and its currency.
    pub spend_price: Option<f64>,
    pub currency: Option<String>,
}

impl BudgetColumn {
    fn of(snapshot: &crate::store::BucketSnapshot) -> Option<BudgetColumn> {
        use tollgate_core::budget::Period;
        let budget = snapshot.head.budget.as_ref()?;
        let view = budget.view(&snapshot.head.state, snapshot.read_at);
        let spend = view.usage.spend();
        Some(BudgetColumn {
            amount: view.budget.amount,
            spend,
            forecast: view.forecast,
            state: view.standing.name(),
            period: match view.budget.cycle.period {
                Period::Monthly { .. } => "monthly",
                Period::Weekly { .. } => "weekly",
                Period::Daily => "daily",
            },
            cycle_end_unix: unix_seconds(view.cycle.end),
            spend_price: view.budget.price.as_ref().map(|p| p.of(spend)),
            currency: view.budget.price.as_ref().map(|p| p.currency.clone()),
        })
    }
}

impl Console {
    pub fn new() -> Console {
        Console::default()
    }

    /// The view, reading the store first if the last read is older than
    /// [`SAMPLE_INTERVAL`]. Concurrent callers share one read.
    pub async fn view(
        &self,
        store: &dyn Store,
        metrics: &Metrics,
    ) -> Result<ConsoleView, StoreError> {
        let mut samples = self.samples.lock().await;
        let stale = samples
            .back()
            .is_none_or(|last| last.taken.elapsed() >= SAMPLE_INTERVAL);
        if stale {
            let sample = read(store, metrics).await?;
            samples.push_back(sample);
            while samples
                .front()
                .is_some_and(|first| first.taken.elapsed() > HISTORY)
            {
                samples.pop_front();
            }
        }
        Ok(view_of(&samples, metrics))
    }
}

async fn read(store: &dyn Store, metrics: &Metrics) -> Result<Sample, StoreError> {
    let taken = Instant::now();
    let (tree, organisations_truncated) = read_tree(store).await?;
    // One more than kept, to know whether there are more.
    let mut listed = read_buckets(store, MAX_BUCKETS + 1).await?;
    let truncated = listed.len() > MAX_BUCKETS;
    listed.truncate(MAX_BUCKETS);
    let trickles = metrics.trickle_grants();
    let mut per_key = store
        .list_key_buckets(None, None, MAX_BUCKETS + 1, BUSIEST_KEYS)
        .await?;
    let key_buckets_truncated = per_key.len() > MAX_BUCKETS;
    per_key.truncate(MAX_BUCKETS);
    let key_buckets = per_key
        .iter()
        .map(|b| {
            let rates = metrics.check_rates(&b.key);
            let limits = b.definition.limits;
            KeyBucketView {
                tenant_id: b.key.tenant.as_str().to_owned(),
                bucket: b.key.bucket.as_str().to_owned(),
                refill_rate: limits.refill_rate,
                burst_limit: limits.burst_limit,
                defined_by: match b.defined_by {
                    DefinedBy::Tier => "tier",
                    DefinedBy::Override => "override",
                },
                keys_stored: b.keys_stored,
                checks_per_second: rates.events_per_second,
                refusals_per_second: rates.refusals_per_second,
                rate_window_seconds: rates.window.as_secs_f64(),
                busiest_keys: b
                    .busiest
                    .iter()
                    .map(|(key, stored)| {
                        let reading = KeyReading::new(key.clone(), stored, &limits, b.read_at);
                        BusyKeyView {
                            key: reading.key,
                            tokens: reading.tokens,
                            full_in_seconds: reading.full_in.map(|d| d.as_secs_f64()),
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    let read_at = listed
        .first()
        .map(|b| b.read_at)
        .or_else(|| per_key.first().map(|b| b.read_at))
        .unwrap_or(Timestamp::EPOCH);
    let buckets = listed
        .into_iter()
        .map(|b| {
            let sample = BucketSample {
                refill_rate: b.head.state.limits.refill_rate,
                burst_limit: b.head.state.limits.burst_limit,
                tokens: b.current_tokens(),
                live_instances: b.live_instances(),
                request_unit_micros: b.head.totals.consumption.request_unit_micros,
                trickles: trickles.get(&b.key).copied().unwrap_or(0),
                granted_tokens: b.head.totals.granted_tokens,
                member: b.head.draw.as_ref().map(|_| {
                    let member = tree.get(&b.key.tenant).and_then(|n| n.member_of.as_ref());
                    MemberRates::of(&b.head, member, &b.key.bucket, b.read_at)
                }),
                budget: BudgetColumn::of(&b),
            };
            (b.key, sample)
        })
        .collect();
    Ok(Sample {
        taken,
        read_at,
        buckets,
        truncated,
        key_buckets,
        key_buckets_truncated,
        tree,
        organisations_truncated,
    })
}

/// The first [`MAX_ORGANISATIONS`] organisations' rows and their members',
/// and whether there were more.
async fn read_tree(store: &dyn Store) -> Result<(BTreeMap<TenantId, Node>, bool), StoreError> {
    let mut organisations = store.tree_nodes(&NodeFilter::Organisations).await?;
    organisations.sort_by(|a, b| a.0.cmp(&b.0));
    let truncated = organisations.len() > MAX_ORGANISATIONS;
    organisations.truncate(MAX_ORGANISATIONS);
    let mut tree = BTreeMap::new();
    for (id, node) in organisations {
        for (member, row) in store.tree_nodes(&NodeFilter::MembersOf(id.clone())).await? {
            tree.insert(member, row);
        }
        tree.insert(id, node);
    }
    Ok((tree, truncated))
}

/// The tree rows of `last`, depth first from the organisations at the top
/// (those below none the read kept); rates over the pair `latest`.
fn tree_rows(last: &Sample, latest: Option<(&Sample, f64)>) -> Vec<TreeRowView> {
    let mut rows = Vec::new();
    let tops = last.tree.iter().filter(|(_, n)| {
        n.organisation.is_some()
            && n.member_of
                .as_ref()
                .is_none_or(|m| !last.tree.contains_key(&m.organisation))
    });
    for (id, _) in tops {
        tree_walk(id, 0, last, latest, &mut rows);
    }
    rows
}

/// The rows of `id` and, if it is an organisation, of its members.
fn tree_walk(
    id: &TenantId,
    depth: usize,
    last: &Sample,
    latest: Option<(&Sample, f64)>,
    rows: &mut Vec<TreeRowView>,
) {
    let organisation = last.tree.get(id).and_then(|n| n.organisation.as_ref());
    let row = |bucket: Option<(&BucketKey, &BucketSample)>| TreeRowView {
        depth,
        id: id.as_str().to_owned(),
        is_organization: organisation.is_some(),
        display_name: organisation
            .map(|o| o.display_name.clone())
            .unwrap_or_default(),
        bucket: bucket.map(|(k, _)| k.bucket.as_str().to_owned()),
        refill_rate: bucket.map(|(_, b)| b.refill_rate),
        granted_per_second: bucket.and_then(|(key, now)| {
            let (before, seconds) = latest?;
            let before = before.buckets.get(key)?;
            Some((now.granted_tokens - before.granted_tokens).max(0.0) / seconds)
        }),
        wanted_rate: bucket.and_then(|(_, b)| b.member.map(|m| m.wanted)),
        guaranteed_rate: bucket.and_then(|(_, b)| b.member.map(|m| m.guaranteed)),
        drawn_rate: bucket.and_then(|(_, b)| b.member.map(|m| m.drawn)),
        borrowed_rate: bucket.and_then(|(_, b)| b.member.map(|m| m.borrowed)),
    };
    let own: Vec<_> = last
        .buckets
        .iter()
        .filter(|(key, _)| &key.tenant == id)
        .collect();
    if own.is_empty() {
        rows.push(row(None));
    }
    rows.extend(own.into_iter().map(|b| row(Some(b))));
    if organisation.is_none() || depth > tollgate_core::organisation::MAX_DEPTH {
        return;
    }
    let members = last
        .tree
        .iter()
        .filter(|(_, n)| n.member_of.as_ref().is_some_and(|m| &m.organisation == id));
    for (member, _) in members {
        tree_walk(member, depth + 1, last, latest, rows);
    }
}

fn unix_seconds(t: Timestamp) -> f64 {
    t.unix_micros() as f64 / 1e6
}

/// Units per second between two cumulative readings `seconds` apart.
fn per_second(earlier: u64, later: u64, seconds: f64) -> f64 {
    later.saturating_sub(earlier) as f64 / seconds
}

fn view_of(samples: &VecDeque<Sample>, metrics: &Metrics) -> ConsoleView {
    let Some(last) = samples.back() else {
        return ConsoleView {
            read_at_unix: 0.0,
            sample_interval_seconds: SAMPLE_INTERVAL.as_secs_f64(),
            rate_window_seconds: None,
            truncated: false,
            total_buckets: 0,
            total_tenants: 0,
            pending_requests: metrics.pending_requests(),
            buckets: Vec::new(),
            key_buckets: Vec::new(),
            key_buckets_truncated: false,
            organisations: Vec::new(),
            organisations_truncated: false,
        };
    };
    let pairs: Vec<(&Sample, &Sample)> = samples.iter().zip(samples.iter().skip(1)).collect();
    // The last two reads, and the seconds between them: what rates cover.
    let latest = pairs
        .last()
        .map(|(before, after)| {
            (
                *before,
                after.taken.duration_since(before.taken).as_secs_f64(),
            )
        })
        .filter(|(_, seconds)| *seconds > 0.0);
    let buckets = last
        .buckets
        .iter()
        .map(|(key, now)| {
            let mut history = Vec::new();
            for (before, after) in &pairs {
                let (Some(b), Some(a)) = (before.buckets.get(key), after.buckets.get(key)) else {
                    continue;
                };
                let seconds = after.taken.duration_since(before.taken).as_secs_f64();
                if seconds > 0.0 {
                    let at = unix_seconds(after.read_at);
                    history.push((
                        at,
                        per_second(b.request_unit_micros, a.request_unit_micros, seconds) / 1e6,
                    ));
                }
            }
            let latest_pair =
                latest.and_then(|(before, seconds)| before.buckets.get(key).map(|b| (b, seconds)));
            BucketView {
                tenant_id: key.tenant.as_str().to_owned(),
                bucket: key.bucket.as_str().to_owned(),
                refill_rate: now.refill_rate,
                burst_limit: now.burst_limit,
                tokens: now.tokens,
                live_instances: now.live_instances,
                request_units_per_second: latest_pair.map(|(b, seconds)| {
                    per_second(b.request_unit_micros, now.request_unit_micros, seconds) / 1e6
                }),
                throttled_pods: latest_pair.map(|(b, seconds)| {
                    per_second(b.trickles, now.trickles, seconds) * RENEWALS_PER_POD_SECONDS
                }),
                history,
                budget: now.budget.clone(),
            }
        })
        .collect::<Vec<_>>();
    // Tenants with shared buckets, per-key buckets or both.
    let mut tenants: Vec<&str> = buckets
        .iter()
        .map(|b| b.tenant_id.as_str())
        .chain(last.key_buckets.iter().map(|b| b.tenant_id.as_str()))
        .collect();
    tenants.sort_unstable();
    tenants.dedup();
    ConsoleView {
        read_at_unix: unix_seconds(last.read_at),
        sample_interval_seconds: SAMPLE_INTERVAL.as_secs_f64(),
        rate_window_seconds: latest.map(|(_, seconds)| seconds),
        truncated: last.truncated,
        total_buckets: buckets.len(),
        total_tenants: tenants.len(),
        pending_requests: metrics.pending_requests(),
        buckets,
        key_buckets: last.key_buckets.clone(),
        key_buckets_truncated: last.key_buckets_truncated,
        organisations: tree_rows(last, latest),
        organisations_truncated: last.organisations_truncated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{BucketName, TenantId};

    fn key(tenant: &str) -> BucketKey {
        BucketKey::new(
            TenantId::parse("tenant_id", tenant).expect("tenant"),
            BucketName::REQUEST_UNITS,
        )
    }

    fn sample(taken: Instant, secs: f64, buckets: &[(&str, u64, u64)]) -> Sample {
        Sample {
            taken,
            read_at: Timestamp::from_secs_f64(secs),
            buckets: buckets
                .iter()
                .map(|&(tenant, micros, trickles)| {
                    (
                        key(tenant),
                        BucketSample {
                            refill_rate: 10.0,
                            burst_limit: 100.0,
                            tokens: 5.0,
                            live_instances: 2,
                            request_unit_micros: micros,
                            trickles,
                            granted_tokens: micros as f64 / 1e6,
                            member: None,
                            budget: None,
                        },
                    )
                })
                .collect(),
            truncated: false,
            key_buckets: Vec::new(),
            key_buckets_truncated: false,
            tree: BTreeMap::new(),
            organisations_truncated: false,
        }
    }

    #[test]
    fn the_view_has_rates_from_the_last_two_reads_and_a_point_per_pair() {
        let metrics = Metrics::new().expect("metrics");
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let samples: VecDeque<Sample> = [
            sample(at(0), 100.0, &[("acme", 0, 0)]),
            // 50 request units in 5 s; two trickles.
            sample(
                at(5),
                105.0,
                &[("acme", 50_000_000, 2), ("new", 7_000_000, 0)],
            ),
            // 10 more in 5 s; one more trickle.
            sample(
                at(10),
                110.0,
                &[("acme", 60_000_000, 3), ("new", 7_000_000, 0)],
            ),
        ]
        .into();
        let view = view_of(&samples, &metrics);
        assert_eq!(view.total_buckets, 2);
        assert_eq!(view.read_at_unix, 110.0);
        assert_eq!(view.rate_window_seconds, Some(5.0));
        let acme = &view.buckets[0];
        assert_eq!(acme.tenant_id, "acme");
        assert_eq!(acme.request_units_per_second, Some(2.0));
        // One trickle in 5 s: two pods renewing every 10 s.
        assert_eq!(acme.throttled_pods, Some(2.0));
        assert_eq!(acme.history, vec![(105.0, 10.0), (110.0, 2.0)]);
        // A bucket first seen in the middle read: one pair so far.
        let new = &view.buckets[1];
        assert_eq!(new.request_units_per_second, Some(0.0));
        assert_eq!(new.history, vec![(110.0, 0.0)]);
        // One read: levels, no rates yet.
        let first: VecDeque<Sample> = [sample(at(0), 100.0, &[("acme", 0, 0)])].into();
        let view = view_of(&first, &metrics);
        assert_eq!(view.buckets[0].request_units_per_second, None);
        assert_eq!(view.rate_window_seconds, None);
        assert!(view.buckets[0].history.is_empty());
    }

    #[test]
    fn the_tree_lists_each_organisation_then_its_members_depth_first() {
        use tollgate_core::organisation::{Member, Organisation};
        let id = |s: &str| TenantId::parse("id", s).expect("id");
        let organisation = |name: &str| Organisation {
            display_name: name.into(),
            created_at: Timestamp::EPOCH,
            next_member_id: 3,
        };
        let member = |of: &str, member_id, guaranteed: f64| Member {
            organisation: id(of),
            member_id,
            guaranteed: [(BucketName::REQUEST_UNITS, guaranteed)].into(),
            since: Timestamp::EPOCH,
        };
        let t0 = Instant::now();
        let mut before = sample(t0, 100.0, &[("acme", 0, 0), ("db1", 0, 0)]);
        let mut after = sample(
            t0 + Duration::from_secs(5),
            105.0,
            &[
                ("acme", 50_000_000, 0),
                ("db1", 40_000_000, 0),
                ("db2", 0, 0),
            ],
        );
        let rates = MemberRates {
            wanted: 12.0,
            drawn: 9.0,
            guaranteed: 4.0,
            borrowed: 5.0,
            draws: 3,
        };
        for sample in [&mut before, &mut after] {
            if let Some(db1) = sample.buckets.get_mut(&key("db1")) {
                db1.member = Some(rates);
            }
            sample.tree = [
                (
                    id("acme"),
                    Node {
                        organisation: Some(organisation("Acme")),
                        member_of: None,
                    },
                ),
                (
                    id("acme-eu"),
                    Node {
                        organisation: Some(organisation("")),
                        member_of: Some(member("acme", 2, 0.0)),
                    },
                ),
                (
                    id("db1"),
                    Node {
                        organisation: None,
                        member_of: Some(member("acme-eu", 1, 4.0)),
                    },
                ),
                (
                    id("db2"),
                    Node {
                        organisation: None,
                        member_of: Some(member("acme", 1, 0.0)),
                    },
                ),
            ]
            .into();
        }
        let rows = tree_rows(&after, Some((&before, 5.0)));
        let order: Vec<(&str, usize, Option<&str>)> = rows
            .iter()
            .map(|r| (r.id.as_str(), r.depth, r.bucket.as_deref()))
            .collect();
        assert_eq!(
            order,
            [
                ("acme", 0, Some("")),
                ("acme-eu", 1, None),
                ("db1", 2, Some("")),
                ("db2", 1, Some("")),
            ]
        );
        assert_eq!(rows[0].display_name, "Acme");
        assert!(rows[0].is_organization && rows[1].is_organization && !rows[2].is_organization);
        // 50 tokens in 5 s to the organisation's members; 40 to db1's pods.
        assert_eq!(rows[0].granted_per_second, Some(10.0));
        assert_eq!(rows[2].granted_per_second, Some(8.0));
        assert_eq!(rows[2].wanted_rate, Some(12.0));
        assert_eq!(rows[2].guaranteed_rate, Some(4.0));
        assert_eq!(rows[2].drawn_rate, Some(9.0));
        assert_eq!(rows[2].borrowed_rate, Some(5.0));
        // No bucket listed: figures unknown; first seen: no rate yet.
        assert_eq!(rows[1].refill_rate, None);
        assert_eq!(rows[3].granted_per_second, None);
        assert_eq!(rows[3].wanted_rate, None);
    }

    #[test]
    fn rates_are_differences_of_totals_over_the_time_between_reads() {
        assert_eq!(per_second(1_000_000, 6_000_000, 5.0), 1_000_000.0);
        // A total never decreases; a smaller later reading (a bucket
        // deleted and made again) gives zero, not a negative rate.
        assert_eq!(per_second(6_000_000, 1_000_000, 5.0), 0.0);
    }
}
