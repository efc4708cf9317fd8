//! A whole store as a sequence of records: what `tollgate export` writes
//! and `tollgate import` reads, one JSON object per line.
//!
//! Records rather than a copy of the file or a database dump, so that an
//! export of either store loads into the other (moving from the embedded
//! store to PostgreSQL and back), and so that a file cut short or edited
//! into something inconsistent is refused whole, before the store is
//! touched, instead of half loaded.
//!
//! The lines, in order:
//! - `header`: the format and its version, the kind of store, and the
//!   store's clock when the snapshot was taken;
//! - `tier`: every tier; `tenant`: every tenant record (its tier and
//!   overrides); `tenant_state`: every tombstone of a deleted tenant and
//!   every suspension (since format version 2: a version 1 file has none,
//!   and still loads);
//! - `bucket`: every bucket's head row (limits, level, exact consumption
//!   totals), each followed by its `instance` rows: the pods' leases and
//!   sequence numbers, so that a pod's retry after the move is still
//!   answered once and counted once;
//! - `key`: per-key buckets below their burst; `check_request`: the
//!   records of checks kept for retries, for the same reason;
//! - `closed_bucket`: what is kept of every bucket retired or deleted
//!   (its last limits and exact totals), by tenant in the order they were
//!   closed (since format version 2; a version 1 file has none);
//! - `organisation`: the tree of organisations, a row per id that is an
//!   organisation or a member of one (since format version 4; a member
//!   bucket's draws ride in its `bucket` line);
//! - `history`: the usage history, a row per bucket, resolution (its step
//!   in seconds) and slot, each the bucket's totals as sampled in it
//!   (since format version 5; an earlier file has none);
//! - `check_history`: per-key buckets' checks in the usage history, a row
//!   per bucket, resolution, slot and server replica, each the replica's
//!   counts in the slot (since format version 6; an earlier file has
//!   none);
//! - `end`: how many records of each kind came before it, so that a file
//!   cut short is told from a whole one.
//!
//! Hot-partition reports are not exported: each lasts a few seconds and
//! pods send them again.

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::io::BufRead;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tollgate_core::budget::CycleRecord;
use tollgate_core::global_bucket::{BucketState, sums_agree};
use tollgate_core::key_bucket::{KeyId, KeyWrites, RequestRecord, StoredKey};
use tollgate_core::tenant_state::MAX_REASON_LEN;
use tollgate_core::tier::{ClosedBucket, TenantRecord, Tier};
use tollgate_core::validate::MAX_TOTAL;
use tollgate_core::{
    BucketKey, BucketName, BucketRow, InstanceState, TenantId, TenantState, TierName, Timestamp,
};

use tollgate_core::history::checks::CheckCounts;
use tollgate_core::history::{HistorySample, Resolution};
use tollgate_core::organisation::Node;

use super::{KeptEvent, StoreError};

/// The `format` of the header line.
pub const FORMAT: &str = "tollgate-store-export";
/// The newest format version this build writes and reads.
/// Version 2 added `closed_bucket` and `tenant_state` lines (and their
/// counts in `end`); version 3 `budget_cycle` and `budget_event` lines (a
/// head row's budget rides in its `bucket` line); version 4
/// `organisation` lines; version 5 `history` lines; version 6
/// `check_history` lines.
pub const FORMAT_VERSION: u32 = 6;

/// The first line of an export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub format: String,
    pub version: u32,
    /// `embedded` or `postgres`.
    pub store: String,
    /// The store's clock when the snapshot was taken.
    pub exported_at: Timestamp,
}

impl Header {
    pub fn new(store: &str, exported_at: Timestamp) -> Header {
        Header {
            format: FORMAT.to_owned(),
            version: FORMAT_VERSION,
            store: store.to_owned(),
            exported_at,
        }
    }
}

/// One line of an export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    Header(Header),
    Tier {
        name: TierName,
        tier: Tier,
    },
    Tenant {
        tenant: TenantId,
        record: TenantRecord,
    },
    TenantState {
        tenant: TenantId,
        state: TenantState,
    },
    Bucket {
        tenant: TenantId,
        bucket: BucketName,
        head: BucketRow,
    },
    Instance {
        tenant: TenantId,
        bucket: BucketName,
        instance: InstanceState,
    },
    Key {
        tenant: TenantId,
        bucket: BucketName,
        key: String,
        stored: StoredKey,
    },
    CheckRequest {
        tenant: TenantId,
        bucket: BucketName,
        key: String,
        request_id: String,
        record: RequestRecord,
    },
    ClosedBucket(ClosedBucket),
    /// A closed budget cycle: a billing record.
    BudgetCycle {
        tenant: TenantId,
        bucket: BucketName,
        record: CycleRecord,
    },
    /// A budget threshold crossed, with its delivery so far.
    BudgetEvent {
        tenant: TenantId,
        bucket: BucketName,
        event: KeptEvent,
    },
    /// A row of the tree of organisations.
    Organisation {
        tenant: TenantId,
        node: Node,
    },
    /// A row of the usage history.
    History {
        tenant: TenantId,
        bucket: BucketName,
        step_secs: u64,
        slot: Timestamp,
        sample: HistorySample,
    },
    /// A row of a per-key bucket's checks in the usage history.
    CheckHistory {
        tenant: TenantId,
        bucket: BucketName,
        step_secs: u64,
        slot: Timestamp,
        replica: String,
        counts: CheckCounts,
    },
    End(Counts),
}

impl Record {
    pub fn bucket(key: &BucketKey, head: BucketRow) -> Record {
        Record::Bucket {
            tenant: key.tenant.clone(),
            bucket: key.bucket.clone(),
            head,
        }
    }

    pub fn instance(key: &BucketKey, instance: InstanceState) -> Record {
        Record::Instance {
            tenant: key.tenant.clone(),
            bucket: key.bucket.clone(),
            instance,
        }
    }

    pub fn key(id: KeyId, stored: StoredKey) -> Record {
        Record::Key {
            tenant: id.bucket.tenant,
            bucket: id.bucket.bucket,
            key: id.key,
            stored,
        }
    }

    pub fn check_request(id: KeyId, request_id: String, record: RequestRecord) -> Record {
        Record::CheckRequest {
            tenant: id.bucket.tenant,
            bucket: id.bucket.bucket,
            key: id.key,
            request_id,
            record,
        }
    }
}

/// How many records of each kind an export holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub tiers: u64,
    pub tenants: u64,
    /// Absent from a version 1 file's end line: none.
    #[serde(default)]
    pub tenant_states: u64,
    pub buckets: u64,
    pub instances: u64,
    pub keys: u64,
    pub check_requests: u64,
    /// Absent from the end line of a format version 1 file: none.
    #[serde(default)]
    pub closed_buckets: u64,
    /// Absent from the end line of a file before format version 3: none.
    #[serde(default)]
    pub budget_cycles: u64,
    #[serde(default)]
    pub budget_events: u64,
    /// Absent from the end line of a file before format version 4: none.
    #[serde(default)]
    pub organisation_nodes: u64,
    /// Absent from the end line of a file before format version 5: none.
    #[serde(default)]
    pub history_rows: u64,
    /// Absent from the end line of a file before format version 6: none.
    #[serde(default)]
    pub check_history_rows: u64,
}

impl Counts {
    /// Counts `record` (the header and the end count for nothing).
    fn add(&mut self, record: &Record) {
        match record {
            Record::Tier { .. } => self.tiers += 1,
            Record::Tenant { .. } => self.tenants += 1,
            Record::TenantState { .. } => self.tenant_states += 1,
            Record::Bucket { .. } => self.buckets += 1,
            Record::Instance { .. } => self.instances += 1,
            Record::Key { .. } => self.keys += 1,
            Record::CheckRequest { .. } => self.check_requests += 1,
            Record::ClosedBucket(_) => self.closed_buckets += 1,
            Record::BudgetCycle { .. } => self.budget_cycles += 1,
            Record::BudgetEvent { .. } => self.budget_events += 1,
            Record::Organisation { .. } => self.organisation_nodes += 1,
            Record::History { .. } => self.history_rows += 1,
            Record::CheckHistory { .. } => self.check_history_rows += 1,
            Record::Header(_) | Record::End(_) => {}
        }
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counted =
            |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        write!(
            f,
            "{}, {}, {}, {}, {}, {}, {}",
            counted(self.tiers, "tier", "tiers"),
            counted(self.tenants, "tenant record", "tenant records"),
            counted(self.buckets, "bucket", "buckets"),
            counted(self.instances, "instance", "instances"),
            counted(self.keys, "key", "keys"),
            counted(self.check_requests, "check record", "check records"),
            counted(self.closed_buckets, "closed bucket", "closed buckets"),
        )?;
        if self.tenant_states > 0 {
            write!(
                f,
                ", {}",
                counted(self.tenant_states, "tenant state", "tenant states")
            )?;
        }
        if self.budget_cycles > 0 || self.budget_events > 0 {
            write!(
                f,
                ", {}, {}",
                counted(self.budget_cycles, "budget cycle", "budget cycles"),
                counted(self.budget_events, "budget event", "budget events")
            )?;
        }
        if self.history_rows > 0 {
            write!(
                f,
                ", {}",
                counted(self.history_rows, "history row", "history rows")
            )?;
        }
        if self.check_history_rows > 0 {
            write!(
                f,
                ", {}",
                counted(
                    self.check_history_rows,
                    "check history row",
                    "check history rows"
                )
            )?;
        }
        if self.organisation_nodes > 0 {
            write!(
                f,
                ", {}",
                counted(
                    self.organisation_nodes,
                    "organisation row",
                    "organisation rows"
                )
            )?;
        }
        Ok(())
    }
}

/// Where a store sends the records of its export, counting them so that it
/// can end with the counts.
#[derive(Debug)]
pub struct RecordSink {
    tx: mpsc::Sender<Record>,
    counts: Counts,
}

impl RecordSink {
    pub fn new(tx: mpsc::Sender<Record>) -> RecordSink {
        RecordSink {
            tx,
            counts: Counts::default(),
        }
    }

    /// Sends `record` from a blocking thread.
    pub fn send_blocking(&mut self, record: Record) -> Result<(), StoreError> {
        self.counts.add(&record);
        self.tx.blocking_send(record).map_err(|_| reader_gone())
    }

    /// Sends `record` from a task.
    pub async fn send(&mut self, record: Record) -> Result<(), StoreError> {
        self.counts.add(&record);
        self.tx.send(record).await.map_err(|_| reader_gone())
    }

    /// Sends the `end` record from a blocking thread; answers the counts.
    pub fn end_blocking(mut self) -> Result<Counts, StoreError> {
        let counts = self.counts;
        self.send_blocking(Record::End(counts))?;
        Ok(counts)
    }

    /// Sends the `end` record from a task; answers the counts.
    pub async fn end(mut self) -> Result<Counts, StoreError> {
        let counts = self.counts;
        self.send(Record::End(counts)).await?;
        Ok(counts)
    }
}

fn reader_gone() -> StoreError {
    StoreError::Unavailable("the export's reader stopped reading".into())
}

/// A bucket of an image, with its instances in list order.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageBucket {
    pub key: BucketKey,
    pub head: BucketRow,
    pub instances: Vec<InstanceState>,
}

impl ImageBucket {
    /// An image written before head rows kept `held_reported` reads it as
    /// 0: it is the sum of the instances' `held_tokens`, so it is set to
    /// that sum where it differs (beyond rounding, so that a current
    /// image imports exactly as it was exported).
    fn sum_what_pods_hold(&mut self) {
        let held = BucketState::reported_by(&self.instances);
        let state = &mut self.head.state;
        if !sums_agree(state.held_reported, held) {
            state.held_reported = held;
        }
    }
}

/// A whole export, read and checked: what an import loads in one
/// transaction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreImage {
    pub tiers: Vec<(TierName, Tier)>,
    pub tenants: Vec<(TenantId, TenantRecord)>,
    /// Tombstones and suspensions, by tenant.
    pub states: Vec<(TenantId, TenantState)>,
    pub buckets: Vec<ImageBucket>,
    /// The keys (`upserts`) and check records (`records`); no deletes.
    pub keys: KeyWrites,
    /// Closed buckets, by tenant in the order they were closed.
    pub closed: Vec<ClosedBucket>,
    /// Closed budget cycles, by bucket in the order they were closed.
    pub cycles: Vec<(BucketKey, CycleRecord)>,
    /// Budget events, each once per bucket, cycle and threshold.
    pub events: Vec<(BucketKey, KeptEvent)>,
    /// The tree of organisations, by id.
    pub nodes: Vec<(TenantId, Node)>,
    /// The usage history, each row once.
    pub history: Vec<HistoryRow>,
    /// Per-key buckets' checks in the usage history, each row once.
    pub check_history: Vec<CheckHistoryRow>,
}

/// A row of the usage history, as a store keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryRow {
    pub key: BucketKey,
    pub step_secs: u64,
    pub slot: Timestamp,
    pub sample: HistorySample,
}

/// A replica's counts of a per-key bucket's checks in a slot, as a store
/// keeps them.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckHistoryRow {
    pub key: BucketKey,
    pub step_secs: u64,
    pub slot: Timestamp,
    pub replica: String,
    pub counts: CheckCounts,
}

/// Why an export cannot be loaded; nothing was.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
    #[error("reading the export: {0}")]
    Io(#[from] std::io::Error),
    #[error("the export is empty: no header line")]
    Empty,
    #[error(
        "the export ends after line {lines} without its \"end\" line: it was cut short, and nothing was loaded"
    )]
    Truncated { lines: usize },
}

impl StoreImage {
    /// How many records of each kind the image holds.
    pub fn counts(&self) -> Counts {
        Counts {
            tiers: self.tiers.len() as u64,
            tenants: self.tenants.len() as u64,
            tenant_states: self.states.len() as u64,
            buckets: self.buckets.len() as u64,
            instances: self.buckets.iter().map(|b| b.instances.len() as u64).sum(),
            keys: self.keys.upserts.len() as u64,
            check_requests: self.keys.records.len() as u64,
            closed_buckets: self.closed.len() as u64,
            budget_cycles: self.cycles.len() as u64,
            budget_events: self.events.len() as u64,
            organisation_nodes: self.nodes.len() as u64,
            history_rows: self.history.len() as u64,
            check_history_rows: self.check_history.len() as u64,
        }
    }

    /// Reads an export, checking that it is whole and consistent: a
    /// header this build reads, each thing once, instances right after
    /// their bucket and forming its pod list, tenants on tiers the export
    /// holds, and an end line whose counts match.
    pub fn read(input: impl BufRead) -> Result<StoreImage, ImageError> {
        let mut reader = ImageReader::default();
        let mut line_no = 0;
        for line in input.lines() {
            let line = line?;
            line_no += 1;
            if reader.ended {
                return Err(at(line_no, "a line after the \"end\" line".to_owned()));
            }
            if line.trim().is_empty() {
                return Err(at(line_no, "an empty line".to_owned()));
            }
            let record: Record =
                serde_json::from_str(&line).map_err(|e| at(line_no, e.to_string()))?;
            reader
                .take(record)
                .map_err(|message| at(line_no, message))?;
        }
        if line_no == 0 {
            return Err(ImageError::Empty);
        }
        if !reader.ended {
            return Err(ImageError::Truncated { lines: line_no });
        }
        let mut image = reader.image;
        for bucket in &mut image.buckets {
            bucket.sum_what_pods_hold();
        }
        Ok(image)
    }
}

fn at(line: usize, message: String) -> ImageError {
    ImageError::Line { line, message }
}

/// The state of a read: what came so far and what it allows next.
#[derive(Default)]
struct ImageReader {
    header: bool,
    ended: bool,
    image: StoreImage,
    tiers: BTreeSet<TierName>,
    tenants: HashSet<TenantId>,
    states: HashSet<TenantId>,
    buckets: HashSet<BucketKey>,
    keys: HashSet<KeyId>,
    check_requests: HashSet<(KeyId, String)>,
    budget_events: HashSet<(BucketKey, i64, String)>,
    nodes: HashSet<TenantId>,
    history: HashSet<(BucketKey, u64, Timestamp)>,
    check_history: HashSet<(BucketKey, u64, Timestamp, String)>,
}

impl ImageReader {
    fn take(&mut self, record: Record) -> Result<(), String> {
        if !self.header {
            let Record::Header(header) = record else {
                return Err("the first line must be the \"header\" line".to_owned());
            };
            if header.format != FORMAT {
                return Err(format!(
                    "not a Tollgate export: format {:?}, expected {FORMAT:?}",
                    header.format
                ));
            }
            if header.version > FORMAT_VERSION {
                return Err(format!(
                    "written in format version {} by a newer Tollgate; this one reads up to version {FORMAT_VERSION}",
                    header.version
                ));
            }
            self.header = true;
            return Ok(());
        }
        // An instance belongs to the bucket right before it.
        if !matches!(record, Record::Instance { .. }) {
            self.close_bucket()?;
        }
        match record {
            Record::Header(_) => return Err("a second \"header\" line".to_owned()),
            Record::Tier { name, tier } => {
                if !self.tiers.insert(name.clone()) {
                    return Err(format!("tier {name} appears twice"));
                }
                self.image.tiers.push((name, tier));
            }
            Record::Tenant { tenant, record } => {
                if !self.tenants.insert(tenant.clone()) {
                    return Err(format!("tenant {tenant} has two records"));
                }
                self.image.tenants.push((tenant, record));
            }
            Record::TenantState { tenant, state } => {
                if !self.states.insert(tenant.clone()) {
                    return Err(format!("tenant {tenant} has two states"));
                }
                if state.reason.len() > MAX_REASON_LEN {
                    return Err(format!(
                        "tenant {tenant}: a reason of more than {MAX_REASON_LEN} bytes"
                    ));
                }
                self.image.states.push((tenant, state));
            }
            Record::Bucket {
                tenant,
                bucket,
                head,
            } => {
                let key = BucketKey::new(tenant, bucket);
                check_head(&key, &head)?;
                if !self.buckets.insert(key.clone()) {
                    return Err(format!("bucket {key} appears twice"));
                }
                self.image.buckets.push(ImageBucket {
                    key,
                    head,
                    instances: Vec::new(),
                });
            }
            Record::Instance {
                tenant,
                bucket,
                instance,
            } => {
                let key = BucketKey::new(tenant, bucket);
                let Some(last) = self.image.buckets.last_mut().filter(|b| b.key == key) else {
                    return Err(format!(
                        "an instance of bucket {key} that is not right after that bucket's line"
                    ));
                };
                if last
                    .instances
                    .last()
                    .is_some_and(|before| before.instance_id >= instance.instance_id)
                {
                    return Err(format!(
                        "instance {} of bucket {key} is out of order or appears twice",
                        instance.instance_id
                    ));
                }
                if instance.seq > MAX_TOTAL {
                    return Err(format!(
                        "instance {} of bucket {key}: seq {} is beyond {MAX_TOTAL}",
                        instance.instance_id, instance.seq
                    ));
                }
                if instance.instance_id == 0 {
                    return Err(format!(
                        "instance 0 of bucket {key}: instance ids start at 1"
                    ));
                }
                last.instances.push(instance);
            }
            Record::Key {
                tenant,
                bucket,
                key,
                stored,
            } => {
                let id = KeyId::new(tenant, bucket, key);
                if !self.keys.insert(id.clone()) {
                    return Err(format!(
                        "key {:?} of bucket {} appears twice",
                        id.key, id.bucket
                    ));
                }
                self.image.keys.upserts.push((id, stored));
            }
            Record::CheckRequest {
                tenant,
                bucket,
                key,
                request_id,
                record,
            } => {
                let id = KeyId::new(tenant, bucket, key);
                if !self.check_requests.insert((id.clone(), request_id.clone())) {
                    return Err(format!(
                        "check request {request_id:?} of key {:?} appears twice",
                        id.key
                    ));
                }
                self.image.keys.records.push((id, request_id, record));
            }
            Record::ClosedBucket(closed) => {
                check_closed(&closed)?;
                self.image.closed.push(closed);
            }
            Record::BudgetCycle {
                tenant,
                bucket,
                record,
            } => {
                let key = BucketKey::new(tenant, bucket);
                check_cycle(&key, &record)?;
                self.image.cycles.push((key, record));
            }
            Record::BudgetEvent {
                tenant,
                bucket,
                event,
            } => {
                let key = BucketKey::new(tenant, bucket);
                let at = (
                    key.clone(),
                    event.event.cycle.start.unix_micros(),
                    event.event.threshold.label(),
                );
                if !self.budget_events.insert(at) {
                    return Err(format!(
                        "budget event {} of bucket {key} in the cycle from {} appears twice",
                        event.event.threshold.label(),
                        event.event.cycle.start.unix_micros()
                    ));
                }
                self.image.events.push((key, event));
            }
            Record::History {
                tenant,
                bucket,
                step_secs,
                slot,
                sample,
            } => {
                let key = BucketKey::new(tenant, bucket);
                check_history(&key, step_secs, slot, &sample)?;
                if !self.history.insert((key.clone(), step_secs, slot)) {
                    return Err(format!(
                        "the history row of bucket {key}, step {step_secs} s, slot {} appears twice",
                        slot.unix_micros()
                    ));
                }
                self.image.history.push(HistoryRow {
                    key,
                    step_secs,
                    slot,
                    sample,
                });
            }
            Record::CheckHistory {
                tenant,
                bucket,
                step_secs,
                slot,
                replica,
                counts,
            } => {
                let key = BucketKey::new(tenant, bucket);
                check_check_history(&key, step_secs, slot, &replica, &counts)?;
                if !self
                    .check_history
                    .insert((key.clone(), step_secs, slot, replica.clone()))
                {
                    return Err(format!(
                        "the check history row of bucket {key}, step {step_secs} s, slot {}, replica {replica:?} appears twice",
                        slot.unix_micros()
                    ));
                }
                self.image.check_history.push(CheckHistoryRow {
                    key,
                    step_secs,
                    slot,
                    replica,
                    counts,
                });
            }
            Record::Organisation { tenant, node } => {
                if !self.nodes.insert(tenant.clone()) {
                    return Err(format!("organisation row {tenant} appears twice"));
                }
                if node.is_empty() {
                    return Err(format!(
                        "organisation row {tenant} is neither an organisation nor a member"
                    ));
                }
                if let Some(member) = &node.member_of {
                    tollgate_core::organisation::validate_guarantees(&member.guaranteed)
                        .map_err(|e| format!("organisation row {tenant}: {e}"))?;
                }
                self.image.nodes.push((tenant, node));
            }
            Record::End(counts) => {
                self.check_tree()?;
                for (tenant, record) in &self.image.tenants {
                    if let Some(tier) = record.tier.as_ref().filter(|t| !self.tiers.contains(*t)) {
                        return Err(format!(
                            "tenant {tenant} is on tier {tier}, which the export does not hold"
                        ));
                    }
                }
                let found = self.image.counts();
                if counts != found {
                    return Err(format!(
                        "the end line counts {counts}, but the export holds {found}"
                    ));
                }
                self.ended = true;
            }
        }
        Ok(())
    }

    /// Checks that the tree is one: every member's organisation is an
    /// organisation of the export, no chain loops or runs deeper than the
    /// rules allow, and member ids are below their organisation's next.
    fn check_tree(&self) -> Result<(), String> {
        use tollgate_core::organisation::{self, MAX_DEPTH};
        let nodes: std::collections::BTreeMap<TenantId, Node> =
            self.image.nodes.iter().cloned().collect();
        for (id, node) in &nodes {
            let Some(member) = &node.member_of else {
                continue;
            };
            let org = nodes
                .get(&member.organisation)
                .and_then(|n| n.organisation.as_ref())
                .ok_or_else(|| {
                    format!(
                        "{id} belongs to {}, which the export does not hold as an organisation",
                        member.organisation
                    )
                })?;
            if member.member_id == 0 || member.member_id >= org.next_member_id {
                return Err(format!(
                    "{id} has member id {} in {}, whose next member id is {}",
                    member.member_id, member.organisation, org.next_member_id
                ));
            }
            let chain = organisation::chain(&nodes, id);
            if chain.len() > MAX_DEPTH + 1 || chain[1..].contains(id) {
                return Err(format!(
                    "{id} lies under more than {MAX_DEPTH} organisations, or under itself"
                ));
            }
        }
        Ok(())
    }

    /// Checks that the last bucket's instances form its pod list: as many
    /// as it counts, the first the one it names, each naming the next.
    fn close_bucket(&self) -> Result<(), String> {
        let Some(bucket) = self.image.buckets.last() else {
            return Ok(());
        };
        let members = &bucket.head.members;
        let ids: Vec<u32> = bucket.instances.iter().map(|i| i.instance_id).collect();
        let first = ids.first().copied().unwrap_or(0);
        let linked = bucket
            .instances
            .iter()
            .zip(ids.iter().skip(1).copied().chain([0]))
            .all(|(instance, next)| instance.next_instance_id == next);
        if members.live_instances as usize != ids.len()
            || members.first_instance_id != first
            || !linked
        {
            return Err(format!(
                "bucket {} counts {} live instances from instance {}, but its instance lines ({:?}) do not form that list",
                bucket.key, members.live_instances, members.first_instance_id, ids
            ));
        }
        Ok(())
    }
}

/// What a store cannot hold, or the core would not have written: limits
/// out of their range, totals beyond a BIGINT.
fn check_head(key: &BucketKey, head: &BucketRow) -> Result<(), String> {
    head.state
        .limits
        .validate()
        .map_err(|e| format!("bucket {key}: {e}"))?;
    for (name, value) in head.totals.consumption.counters() {
        if value > MAX_TOTAL {
            return Err(format!(
                "bucket {key}: {name} total {value} is beyond {MAX_TOTAL}"
            ));
        }
    }
    Ok(())
}

/// What a closed record must hold: limits in range, totals within a
/// BIGINT, closed no earlier than created.
fn check_closed(closed: &ClosedBucket) -> Result<(), String> {
    let key = BucketKey::new(closed.tenant.clone(), closed.bucket.clone());
    closed
        .limits
        .validate()
        .map_err(|e| format!("closed bucket {key}: {e}"))?;
    for (name, value) in closed.totals.consumption.counters() {
        if value > MAX_TOTAL {
            return Err(format!(
                "closed bucket {key}: {name} total {value} is beyond {MAX_TOTAL}"
            ));
        }
    }
    let granted = closed.totals.granted_tokens;
    if !granted.is_finite() || granted < 0.0 {
        return Err(format!(
            "closed bucket {key}: granted tokens {granted} must be finite and not negative"
        ));
    }
    if closed.closed_at < closed.created_at {
        return Err(format!(
            "closed bucket {key}: closed at {} before it was created at {}",
            closed.closed_at.unix_micros(),
            closed.created_at.unix_micros()
        ));
    }
    Ok(())
}

/// A history row that a store could have written: a slot at a multiple
/// of its step, sampled within it, with totals a bucket can hold.
fn check_history(
    key: &BucketKey,
    step_secs: u64,
    slot: Timestamp,
    sample: &HistorySample,
) -> Result<(), String> {
    let what = || {
        format!(
            "the history row of bucket {key} at slot {}",
            slot.unix_micros()
        )
    };
    let resolution = check_slot(step_secs, slot).map_err(|e| format!("{}: {e}", what()))?;
    if resolution.slot(sample.at) != slot {
        return Err(format!("{}: sampled outside its slot", what()));
    }
    let granted = sample.totals.granted_tokens;
    if !granted.is_finite() || granted < 0.0 {
        return Err(format!(
            "{}: granted_tokens must be finite and not negative",
            what()
        ));
    }
    Ok(())
}

/// What a closed cycle must hold: an end no earlier than its start, and
/// counters a store can keep.
fn check_cycle(key: &BucketKey, record: &CycleRecord) -> Result<(), String> {
    if record.cycle.end < record.cycle.start {
        return Err(format!(
            "budget cycle of bucket {key}: ends at {} before it starts at {}",
            record.cycle.end.unix_micros(),
            record.cycle.start.unix_micros()
        ));
    }
    for (name, value) in record.usage.consumption.counters() {
        if value > MAX_TOTAL {
            return Err(format!(
                "budget cycle of bucket {key}: {name} {value} is beyond {MAX_TOTAL}"
            ));
        }
    }
    for (name, value) in [
        ("granted tokens", record.usage.granted_tokens),
        ("fallback tokens", record.usage.fallback_tokens),
        ("amount", record.amount),
    ] {
        if !value.is_finite() || value < 0.0 {
            return Err(format!(
                "budget cycle of bucket {key}: {name} {value} must be finite and not negative"
            ));
        }
    }
    Ok(())
}

/// Writes `record` as one line of JSON.
pub fn write_line(out: &mut impl std::io::Write, record: &Record) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, record)?;
    out.write_all(b"\n")
}

/// What an import into a store holding the kinds of rows marked true
/// answers: `NotEmpty` naming them, if any is.
pub(crate) fn refuse_unless_empty(held: &[(&str, bool)]) -> Result<(), StoreError> {
    let held: Vec<&str> = held
        .iter()
        .filter(|(_, any)| *any)
        .map(|(what, _)| *what)
        .collect();
    if held.is_empty() {
        Ok(())
    } else {
        Err(StoreError::NotEmpty(held.join(", ")))
    }
}

/// The resolution of a row of `step_secs` at `slot`, if a store could
/// have written it: a step of at least a second, a slot at a multiple of
/// it.
fn check_slot(step_secs: u64, slot: Timestamp) -> Result<Resolution, String> {
    if step_secs == 0 {
        return Err("step_secs must be at least 1".to_owned());
    }
    let resolution = Resolution {
        step: std::time::Duration::from_secs(step_secs),
        retention: std::time::Duration::from_secs(step_secs),
    };
    if resolution.slot(slot) != slot {
        return Err("the slot is not a multiple of its step".to_owned());
    }
    Ok(resolution)
}

/// A check history row that a store could have written: a slot at a
/// multiple of its step, a replica named, refusals and the busiest keys'
/// counts within the checks.
fn check_check_history(
    key: &BucketKey,
    step_secs: u64,
    slot: Timestamp,
    replica: &str,
    counts: &CheckCounts,
) -> Result<(), String> {
    let what = || {
        format!(
            "the check history row of bucket {key} at slot {}",
            slot.unix_micros()
        )
    };
    check_slot(step_secs, slot).map_err(|e| format!("{}: {e}", what()))?;
    if replica.is_empty() || replica.len() > MAX_REPLICA_LEN {
        return Err(format!(
            "{}: replica must be 1 to {MAX_REPLICA_LEN} bytes",
            what()
        ));
    }
    let refused = counts.refusals.checked_add(counts.shadow_refusals);
    if refused.is_none_or(|r| r > counts.checks) {
        return Err(format!(
            "{}: refusals and shadow_refusals must add up to at most checks",
            what()
        ));
    }
    if counts
        .busiest
        .iter()
        .any(|k| k.checks > counts.checks || k.over > k.checks)
    {
        return Err(format!(
            "{}: a busiest key's checks must be at most the row's, and its over-count at most its checks",
            what()
        ));
    }
    Ok(())
}

/// The longest replica name an export may hold.
pub const MAX_REPLICA_LEN: usize = 128;
