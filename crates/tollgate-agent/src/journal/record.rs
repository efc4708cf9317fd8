//! The journal's records, one JSON object per line, and reading them back.
//!
//! JSON lines because a journal is read by people too (`tail -f`, `jq`)
//! when something went wrong, and because a line cut short by a crash is
//! told from a whole one by its missing newline: the reader drops it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tollgate_core::recovery::{BucketLedger, Orphan};
use tollgate_core::{BucketName, Consumption, InstanceId, TenantId, TokenBucketRequest};

use super::JournalError;

/// One line of a segment.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub enum Record {
    /// The first line of every segment: whose it is, and everything the
    /// lines before it (in earlier segments) established and that is still
    /// needed: orphans not yet settled, and this generation's ledgers.
    Segment {
        generation: u64,
        instance_id: InstanceId,
        orphans: Vec<PendingOrphan>,
        ledgers: Vec<LedgerEntry>,
        /// What the server last said each bucket's new pod may start on,
        /// whichever generation heard it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        allowances: Vec<AllowanceEntry>,
    },
    /// An answered call: what it took or charged, what it gave back, and,
    /// with a request id, its answer for a repeat.
    Call {
        tenant: TenantId,
        bucket: BucketName,
        #[serde(default, skip_serializing_if = "is_nothing")]
        took: Consumption,
        #[serde(default, skip_serializing_if = "is_zero")]
        returned_micros: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<serde_json::Value>,
        /// Milliseconds since the Unix epoch.
        at: u64,
    },
    /// A request about to be sent to the server.
    Sent {
        tenant: TenantId,
        bucket: BucketName,
        request: TokenBucketRequest,
    },
    /// The server answered request `seq` of the bucket.
    Answered {
        tenant: TenantId,
        bucket: BucketName,
        seq: u64,
        /// The answer's `initial_allowance`, where it said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        initial_allowance: Option<f64>,
    },
    /// Orphan `id` is settled (or given up, which the log says).
    Settled { id: u64 },
}

fn is_nothing(consumption: &Consumption) -> bool {
    *consumption == Consumption::default()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// An earlier generation's debt to the server, not yet paid.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PendingOrphan {
    pub id: u64,
    pub tenant: TenantId,
    pub bucket: BucketName,
    pub orphan: Orphan,
}

/// One bucket's ledger in a segment's header.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub tenant: TenantId,
    pub bucket: BucketName,
    pub ledger: BucketLedger,
}

/// A bucket's initial allowance in a segment's header.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AllowanceEntry {
    pub tenant: TenantId,
    pub bucket: BucketName,
    pub initial_allowance: f64,
}

/// A segment file: `journal-<number>.log`, numbers in order of writing.
#[derive(Debug)]
pub struct SegmentFile {
    pub number: u64,
    pub path: PathBuf,
}

pub const PREFIX: &str = "journal-";
pub const SUFFIX: &str = ".log";

pub fn segment_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{PREFIX}{number:012}{SUFFIX}"))
}

/// The segments in `dir`, oldest first.
pub fn list_segments(dir: &Path) -> Result<Vec<SegmentFile>, JournalError> {
    let mut segments = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| JournalError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| JournalError::io(dir, e))?;
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|n| n.strip_suffix(SUFFIX))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        segments.push(SegmentFile {
            number,
            path: entry.path(),
        });
    }
    segments.sort_by_key(|s| s.number);
    Ok(segments)
}

/// Every whole record of a segment, up to the zeros that fill the rest of
/// it. A last line without its newline (cut short by a crash mid-write)
/// is dropped; any other line that does not
/// parse is an error, naming the file and line: a journal that says
/// something unreadable is not guessed at.
pub fn read_segment(path: &Path) -> Result<Vec<Record>, JournalError> {
    let file = std::fs::File::open(path).map_err(|e| JournalError::io(path, e))?;
    let mut reader = BufReader::new(file);
    let mut records = Vec::new();
    let mut line = String::new();
    let mut number = 0usize;
    loop {
        line.clear();
        // The end of what was written: zeros fill the rest of a segment.
        let next = reader.fill_buf().map_err(|e| JournalError::io(path, e))?;
        if next.first() == Some(&0) {
            break;
        }
        let read = reader
            .read_line(&mut line)
            .map_err(|e| JournalError::io(path, e))?;
        if read == 0 {
            break;
        }
        number += 1;
        if !line.ends_with('\n') {
            tracing::warn!(
                file = %path.display(),
                line = number,
                "journal: dropping a last line cut short by a crash"
            );
            break;
        }
        let record = serde_json::from_str(line.trim_end()).map_err(|e| JournalError::Corrupt {
            path: path.to_path_buf(),
            line: number,
            reason: e.to_string(),
        })?;
        records.push(record);
    }
    Ok(records)
}
