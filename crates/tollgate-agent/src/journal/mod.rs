//! The agent's journal: what it answered and what it sent, on disk, so
//! that a killed agent loses nothing and counts nothing twice.
//!
//! A pod that dies takes its unreported consumption with it, and so do its
//! callers: nobody was told more than the pod knew. An agent answers many
//! pods; once it told a caller "admitted", billing must count it even if
//! the agent is killed a moment later. So every answered call that takes,
//! charges or gives back tokens is written here before its answer leaves,
//! and every request to the server before it is sent, with its answer when
//! it comes. On the next start the journal is read back into one
//! [`BucketLedger`] per bucket, and whatever a dead incarnation still owes
//! becomes an [`Orphan`](tollgate_core::recovery::Orphan), settled by
//! [`Journal::settle`] before the new incarnation's first request for that
//! bucket ([`JournalTransport`] holds it back meanwhile; the bucket runs on
//! its allowance and fallback rate). The arithmetic is the core's
//! ([`tollgate_core::recovery`]); this module only writes and reads lines.
//!
//! A call's answer is kept with its request id, so that a caller who lost
//! the answer to a crash and retries with the same id is answered from the
//! journal, not admitted again.
//!
//! Writes are plain `write(2)`s, not synced: they survive the agent's
//! process being killed, not the host losing power.
//!
//! Layout: `<state dir>/journal-<number>.log`, segments of JSON lines. A
//! segment begins with a header carrying everything still needed from the
//! segments before it, so only the last one is read for state; older ones
//! are read for request ids only, and removed once older than the answers'
//! time to live or beyond the number kept.
//! A segment is made its full size at once and lines are written in place,
//! zeros after the last one, so no write changes the file's size.

mod record;
mod settle;

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::watch;
use tollgate_core::recovery::BucketLedger;
use tollgate_core::{BucketName, Consumption, InstanceId, TenantId, TokenBucketRequest};

use record::{
    AllowanceEntry, LedgerEntry, PendingOrphan, Record, list_segments, read_segment, segment_path,
};
pub use settle::JournalTransport;

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "journal {path}, line {line}: {reason} (the file is not a journal this agent can read; move it away to start without it, losing what it held)"
    )]
    Corrupt {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("journal: {0}")]
    Encode(#[from] serde_json::Error),
}

impl JournalError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        JournalError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// How the journal keeps its files.
#[derive(Clone, Debug)]
pub struct JournalOptions {
    /// The agent's instance id, for the buckets of a dead incarnation that
    /// never sent a request.
    pub instance_id: InstanceId,
    /// A new segment starts once the current one holds this many bytes.
    pub segment_bytes: u64,
    /// Segments kept at most (the current one included): the journal's
    /// disk use is about `segment_bytes * keep_segments`.
    pub keep_segments: usize,
    /// How long an answer to a request id is kept.
    pub answer_ttl: Duration,
}

impl JournalOptions {
    pub fn new(instance_id: InstanceId) -> Self {
        JournalOptions {
            instance_id,
            segment_bytes: 64 << 20,
            keep_segments: 4,
            answer_ttl: Duration::from_secs(600),
        }
    }
}

/// An answer the journal remembers, for a repeat of its request id.
#[derive(Clone, Debug)]
pub struct Remembered {
    pub request_id: String,
    pub tenant: TenantId,
    pub bucket: BucketName,
    /// What the agent wrote with the call ([`Journal::call`]).
    pub payload: serde_json::Value,
    pub at: SystemTime,
}

/// What [`Journal::open`] found.
#[derive(Clone, Debug)]
pub struct Opened {
    pub journal: Arc<Journal>,
    /// Answers to request ids within their time to live, oldest first.
    pub remembered: Vec<Remembered>,
    /// Buckets of earlier incarnations that still owe the server a report
    /// ([`Journal::settle`] pays them).
    pub orphans: usize,
    /// This start's generation (1 for a journal that did not exist).
    pub generation: u64,
}

/// Initial allowances by tenant and bucket.
pub type Allowances = HashMap<TenantId, HashMap<BucketName, f64>>;

/// The journal. Shared by every call and every bucket's transport.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    options: JournalOptions,
    inner: Mutex<Inner>,
    /// Bumped whenever an orphan is settled: transports waiting for their
    /// bucket's orphans look again.
    settled: watch::Sender<u64>,
}

#[derive(Debug)]
struct Inner {
    file: File,
    segment: u64,
    written: u64,
    generation: u64,
    ledgers: HashMap<TenantId, HashMap<BucketName, BucketLedger>>,
    orphans: BTreeMap<u64, PendingOrphan>,
    allowances: Allowances,
}

/// A call line, written from borrowed parts (read back as
/// [`Record::Call`]).
#[derive(Serialize)]
struct CallLine<'a, P: Serialize> {
    k: &'static str,
    tenant: &'a TenantId,
    bucket: &'a BucketName,
    #[serde(skip_serializing_if = "is_nothing")]
    took: &'a Consumption,
    #[serde(skip_serializing_if = "is_zero")]
    returned_micros: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a P>,
    at: u64,
}

fn is_nothing(consumption: &&Consumption) -> bool {
    **consumption == Consumption::default()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Journal {
    /// Opens the journal in `dir` (created if missing): reads what earlier
    /// incarnations wrote, works out what they still owe, and starts this
    /// incarnation's segment. Call it before any bucket starts: the leases
    /// it makes for orphans that never sent a request must be smaller than
    /// the new incarnation's.
    pub fn open(dir: &Path, options: JournalOptions) -> Result<Opened, JournalError> {
        std::fs::create_dir_all(dir).map_err(|e| JournalError::io(dir, e))?;
        let now = SystemTime::now();
        let ttl_ms = u64::try_from(options.answer_ttl.as_millis()).unwrap_or(u64::MAX);
        let oldest_kept = millis(now).saturating_sub(ttl_ms);
        let segments = list_segments(dir)?;
        let mut remembered = Vec::new();
        let mut state = Replay::default();
        for (i, segment) in segments.iter().enumerate() {
            let last = i + 1 == segments.len();
            for record in read_segment(&segment.path)? {
                if let Record::Call {
                    tenant,
                    bucket,
                    id: Some(request_id),
                    payload: Some(payload),
                    at,
                    ..
                } = &record
                    && *at >= oldest_kept
                {
                    remembered.push(Remembered {
                        request_id: request_id.clone(),
                        tenant: tenant.clone(),
                        bucket: bucket.clone(),
                        payload: payload.clone(),
                        at: SystemTime::UNIX_EPOCH + Duration::from_millis(*at),
                    });
                }
                if last {
                    state.apply(record);
                }
            }
        }
        // The last incarnation's buckets become orphans where they owe.
        let mut orphans = state.orphans;
        let mut next_id = orphans.keys().next_back().map_or(1, |id| id + 1);
        for (tenant, buckets) in state.ledgers {
            for (bucket, ledger) in buckets {
                let instance = state.instance_id.unwrap_or(options.instance_id);
                if let Some(orphan) =
                    ledger.orphan(instance, || tollgate_client::lease::new_lease(None))
                {
                    orphans.insert(
                        next_id,
                        PendingOrphan {
                            id: next_id,
                            tenant: tenant.clone(),
                            bucket,
                            orphan,
                        },
                    );
                    next_id += 1;
                }
            }
        }
        let generation = state.generation + 1;
        let number = segments.last().map_or(1, |s| s.number + 1);
        let header = Record::Segment {
            generation,
            instance_id: options.instance_id,
            orphans: orphans.values().cloned().collect(),
            ledgers: Vec::new(),
            allowances: allowance_entries(&state.allowances),
        };
        let (file, written) = start_segment(dir, number, &header, options.segment_bytes)?;
        let count = orphans.len();
        for pending in orphans.values() {
            tracing::info!(
                tenant = %pending.tenant,
                bucket = %pending.bucket,
                replay = pending.orphan.replay.is_some(),
                unsent_request_units = pending.orphan.unsent.request_units(),
                "journal: an earlier incarnation of this bucket still owes the server a report; settling it before this one's first request"
            );
        }
        let journal = Arc::new(Journal {
            dir: dir.to_path_buf(),
            options,
            inner: Mutex::new(Inner {
                file,
                segment: number,
                written,
                generation,
                ledgers: HashMap::new(),
                orphans,
                allowances: state.allowances,
            }),
            settled: watch::channel(0).0,
        });
        journal.remove_old_segments(number);
        Ok(Opened {
            journal,
            remembered,
            orphans: count,
            generation,
        })
    }

    /// The directory the journal is in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes an answered call on `bucket` of `tenant` before its answer
    /// is sent: the consumption it took or charged, the request units it
    /// gave back, and, under `request_id`, `payload` (what a repeat needs
    /// to be answered).
    pub fn call<P: Serialize>(
        &self,
        tenant: &TenantId,
        bucket: &BucketName,
        took: &Consumption,
        returned_micros: u64,
        request_id: Option<&str>,
        payload: Option<&P>,
    ) -> Result<(), JournalError> {
        let mut line = serde_json::to_vec(&CallLine {
            k: "call",
            tenant,
            bucket,
            took,
            returned_micros,
            id: request_id,
            payload: request_id.and(payload),
            at: millis(SystemTime::now()),
        })?;
        line.push(b'\n');
        let mut inner = self.lock();
        self.write(&mut inner, &line)?;
        let ledger = inner.ledger(tenant, bucket);
        ledger.acknowledge(took);
        ledger.give_back(returned_micros);
        Ok(())
    }

    /// Writes `request`, about to be sent for `bucket`. An error means it
    /// must not be sent: a request the journal does not know of could be
    /// counted again after a crash.
    fn sent(
        &self,
        tenant: &TenantId,
        bucket: &BucketName,
        request: &TokenBucketRequest,
    ) -> Result<(), JournalError> {
        let line = line(&Record::Sent {
            tenant: tenant.clone(),
            bucket: bucket.clone(),
            request: request.clone(),
        })?;
        let mut inner = self.lock();
        self.write(&mut inner, &line)?;
        inner.ledger(tenant, bucket).sending(request);
        Ok(())
    }

    /// Writes that the server answered request `seq` of `bucket`, and the
    /// initial allowance it said. Failing costs nothing but a duplicate
    /// after a crash (answered from the server's record) or a restart on
    /// an older allowance, so it is only logged.
    fn answered(
        &self,
        tenant: &TenantId,
        bucket: &BucketName,
        seq: u64,
        initial_allowance: Option<f64>,
    ) {
        let written = line(&Record::Answered {
            tenant: tenant.clone(),
            bucket: bucket.clone(),
            seq,
            initial_allowance,
        })
        .and_then(|line| {
            let mut inner = self.lock();
            self.write(&mut inner, &line)?;
            inner.ledger(tenant, bucket).answered(seq);
            if let Some(allowance) = initial_allowance {
                remember(&mut inner.allowances, tenant, bucket, allowance);
            }
            Ok(())
        });
        if let Err(e) = written {
            tracing::warn!(error = %e, "journal: could not record an answer (harmless: a crash now would only send that request again)");
        }
    }

    /// What the server last said a new pod of each of `tenant`'s buckets
    /// may start on, as far as this journal heard (in this life or an
    /// earlier one).
    pub fn allowances(&self, tenant: &TenantId) -> HashMap<BucketName, f64> {
        self.lock()
            .allowances
            .get(tenant)
            .cloned()
            .unwrap_or_default()
    }

    /// True while an earlier incarnation of `bucket` still owes a report.
    fn owes(&self, tenant: &TenantId, bucket: &BucketName) -> bool {
        self.lock()
            .orphans
            .values()
            .any(|o| &o.tenant == tenant && &o.bucket == bucket)
    }

    /// Orphans not yet settled.
    pub fn orphans_left(&self) -> usize {
        self.lock().orphans.len()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves whole lines only (a line
        // is one write): the state is still good.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends `line` to the current segment, starting a new one first
    /// when the current one is full.
    fn write(&self, inner: &mut Inner, line: &[u8]) -> Result<(), JournalError> {
        if inner.written >= self.options.segment_bytes {
            self.rotate(inner)?;
        }
        let path = segment_path(&self.dir, inner.segment);
        inner
            .file
            .write_all_at(line, inner.written)
            .map_err(|e| JournalError::io(&path, e))?;
        inner.written += line.len() as u64;
        Ok(())
    }

    /// Starts the next segment, its header carrying the ledgers and the
    /// orphans left, and removes the segments no longer kept.
    fn rotate(&self, inner: &mut Inner) -> Result<(), JournalError> {
        let number = inner.segment + 1;
        let header = Record::Segment {
            generation: inner.generation,
            instance_id: self.options.instance_id,
            orphans: inner.orphans.values().cloned().collect(),
            ledgers: inner
                .ledgers
                .iter()
                .flat_map(|(tenant, buckets)| {
                    buckets.iter().map(|(bucket, ledger)| LedgerEntry {
                        tenant: tenant.clone(),
                        bucket: bucket.clone(),
                        ledger: ledger.clone(),
                    })
                })
                .collect(),
            allowances: allowance_entries(&inner.allowances),
        };
        let (file, written) =
            start_segment(&self.dir, number, &header, self.options.segment_bytes)?;
        inner.file = file;
        inner.segment = number;
        inner.written = written;
        self.remove_old_segments(number);
        Ok(())
    }

    /// Removes segments before `current` beyond the number kept or older
    /// than the answers' time to live. Failing is logged: old segments
    /// cost disk, not correctness.
    fn remove_old_segments(&self, current: u64) {
        let Ok(segments) = list_segments(&self.dir) else {
            return;
        };
        let keep_from = current.saturating_sub(self.options.keep_segments.max(1) as u64 - 1);
        for segment in segments.iter().filter(|s| s.number < current) {
            let expired = std::fs::metadata(&segment.path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age > self.options.answer_ttl);
            if (segment.number < keep_from || expired)
                && let Err(e) = std::fs::remove_file(&segment.path)
            {
                tracing::warn!(file = %segment.path.display(), error = %e, "journal: could not remove an old segment");
            }
        }
    }
}

impl Inner {
    fn ledger(&mut self, tenant: &TenantId, bucket: &BucketName) -> &mut BucketLedger {
        self.ledgers
            .entry(tenant.clone())
            .or_default()
            .entry(bucket.clone())
            .or_default()
    }
}

fn line(record: &Record) -> Result<Vec<u8>, JournalError> {
    let mut line = serde_json::to_vec(record)?;
    line.push(b'\n');
    Ok(line)
}

/// Writes segment `number` with its header (to a temporary file, renamed
/// into place, so that every segment has one) and opens it for appending.
///
/// The file is made its full size at once (a sparse file, zeros after the
/// header), and lines are written in place: an append that grew the file
/// would change its size, a metadata update that ext4 makes wait now and
/// then for its own journal's commit, for milliseconds, with every call
/// queued behind it. Readers stop at the zeros.
fn start_segment(
    dir: &Path,
    number: u64,
    header: &Record,
    size: u64,
) -> Result<(File, u64), JournalError> {
    let path = segment_path(dir, number);
    let temporary = path.with_extension("log.new");
    let header = line(header)?;
    let file = File::create(&temporary).map_err(|e| JournalError::io(&temporary, e))?;
    file.write_all_at(&header, 0)
        .and_then(|()| file.set_len(size.max(header.len() as u64)))
        .map_err(|e| JournalError::io(&temporary, e))?;
    drop(file);
    std::fs::rename(&temporary, &path).map_err(|e| JournalError::io(&path, e))?;
    let file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| JournalError::io(&path, e))?;
    Ok((file, header.len() as u64))
}

/// The state the last segment establishes, replayed line by line.
#[derive(Default)]
struct Replay {
    generation: u64,
    instance_id: Option<InstanceId>,
    ledgers: HashMap<TenantId, HashMap<BucketName, BucketLedger>>,
    orphans: BTreeMap<u64, PendingOrphan>,
    allowances: Allowances,
}

/// Keeps `allowance` as the last said for `bucket` of `tenant`.
fn remember(allowances: &mut Allowances, tenant: &TenantId, bucket: &BucketName, allowance: f64) {
    allowances
        .entry(tenant.clone())
        .or_default()
        .insert(bucket.clone(), allowance);
}

fn allowance_entries(allowances: &Allowances) -> Vec<AllowanceEntry> {
    allowances
        .iter()
        .flat_map(|(tenant, buckets)| {
            buckets.iter().map(|(bucket, allowance)| AllowanceEntry {
                tenant: tenant.clone(),
                bucket: bucket.clone(),
                initial_allowance: *allowance,
            })
        })
        .collect()
}

impl Replay {
    fn ledger(&mut self, tenant: TenantId, bucket: BucketName) -> &mut BucketLedger {
        self.ledgers
            .entry(tenant)
            .or_default()
            .entry(bucket)
            .or_default()
    }

    fn apply(&mut self, record: Record) {
        match record {
            Record::Segment {
                generation,
                instance_id,
                orphans,
                ledgers,
                allowances,
            } => {
                self.allowances.clear();
                for entry in allowances {
                    remember(
                        &mut self.allowances,
                        &entry.tenant,
                        &entry.bucket,
                        entry.initial_allowance,
                    );
                }
                self.generation = generation;
                self.instance_id = Some(instance_id);
                self.orphans = orphans.into_iter().map(|o| (o.id, o)).collect();
                self.ledgers.clear();
                for entry in ledgers {
                    *self.ledger(entry.tenant, entry.bucket) = entry.ledger;
                }
            }
            Record::Call {
                tenant,
                bucket,
                took,
                returned_micros,
                ..
            } => {
                let ledger = self.ledger(tenant, bucket);
                ledger.acknowledge(&took);
                ledger.give_back(returned_micros);
            }
            Record::Sent {
                tenant,
                bucket,
                request,
            } => self.ledger(tenant, bucket).sending(&request),
            Record::Answered {
                tenant,
                bucket,
                seq,
                initial_allowance,
            } => {
                if let Some(allowance) = initial_allowance {
                    remember(&mut self.allowances, &tenant, &bucket, allowance);
                }
                self.ledger(tenant, bucket).answered(seq);
            }
            Record::Settled { id } => {
                self.orphans.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests;
