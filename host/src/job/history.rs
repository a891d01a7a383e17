//! What a task did lately, for people watching it: its last
//! [`CHECKPOINTS_KEPT`] checkpoints (committed or failed) and its last
//! [`FAILURES_KEPT`] failures, each with its reason and, for a record that
//! failed on its own, where that record is.
//!
//! The task thread pushes an entry per checkpoint (a few per second at
//! most) under a mutex nobody holds for long; readers copy the rings. Both
//! rings are bounded, so a job that runs for months holds no more than a
//! job that ran for an hour.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Checkpoints kept per task.
pub const CHECKPOINTS_KEPT: usize = 100;
/// Failures kept per task.
pub(crate) const FAILURES_KEPT: usize = 20;

/// One checkpoint of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointEntry {
    /// The checkpoint id.
    pub id: u64,
    /// When it committed or failed, in ms since the Unix epoch.
    pub at_ms: u64,
    /// Time the barrier held the task thread up (freezing the delta, noting
    /// the offsets), in seconds.
    pub sync_seconds: f64,
    /// Time to write the delta durably (on the writer thread), in seconds.
    pub snapshot_seconds: f64,
    /// Time from the barrier to the Kafka commit, in seconds: the whole
    /// checkpoint, of which the two above are parts.
    pub commit_seconds: f64,
    /// Bytes of the delta written to redb.
    pub bytes: u64,
    /// Keys in the delta.
    pub dirty_keys: u64,
    /// Why it failed; `None`: committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

impl CheckpointEntry {
    /// A checkpoint that failed between its barrier and its commit: it
    /// wrote nothing that counts, so it has no durations or sizes.
    pub fn failed(id: u64, at_ms: u64, reason: String) -> CheckpointEntry {
        CheckpointEntry {
            id,
            at_ms,
            sync_seconds: 0.0,
            snapshot_seconds: 0.0,
            commit_seconds: 0.0,
            bytes: 0,
            dirty_keys: 0,
            failed: Some(reason),
        }
    }
}

/// Where a record is in Kafka.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RecordRef {
    /// Its topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
}

/// One failure of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FailureEntry {
    /// When, in ms since the Unix epoch.
    pub at_ms: u64,
    /// Whether the task restarts after it (`true`) or failed for good.
    pub restarting: bool,
    /// Why.
    pub reason: String,
    /// The record that failed, when the guest failed on one record alone
    /// (a batch that fails is replayed one record at a time to find it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordRef>,
}

/// A task's recent checkpoints and failures.
#[derive(Debug, Default)]
pub struct History {
    checkpoints: Mutex<VecDeque<CheckpointEntry>>,
    failures: Mutex<VecDeque<FailureEntry>>,
    /// The record the guest last failed on alone, for the next failure.
    failed_record: Mutex<Option<RecordRef>>,
}

impl History {
    /// Notes a checkpoint, committed or failed.
    pub fn checkpoint(&self, entry: CheckpointEntry) {
        push_bounded(&self.checkpoints, entry, CHECKPOINTS_KEPT);
    }

    /// Notes the record the guest failed on, for the failure that follows.
    pub fn failed_record(&self, record: RecordRef) {
        if let Ok(mut slot) = self.failed_record.lock() {
            *slot = Some(record);
        }
    }

    /// Notes a failure; it takes the record noted by
    /// [`failed_record`](Self::failed_record), if one was.
    pub fn failure(&self, at_ms: u64, restarting: bool, reason: String) {
        let record = self.failed_record.lock().ok().and_then(|mut slot| slot.take());
        push_bounded(&self.failures, FailureEntry { at_ms, restarting, reason, record }, FAILURES_KEPT);
    }

    /// The checkpoints kept, oldest first.
    pub fn checkpoints(&self) -> Vec<CheckpointEntry> {
        self.checkpoints.lock().map(|c| c.iter().cloned().collect()).unwrap_or_default()
    }

    /// The failures kept, oldest first.
    pub fn failures(&self) -> Vec<FailureEntry> {
        self.failures.lock().map(|f| f.iter().cloned().collect()).unwrap_or_default()
    }
}

fn push_bounded<T>(ring: &Mutex<VecDeque<T>>, entry: T, kept: usize) {
    if let Ok(mut ring) = ring.lock() {
        if ring.len() == kept {
            ring.pop_front();
        }
        ring.push_back(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64) -> CheckpointEntry {
        CheckpointEntry {
            id,
            at_ms: id,
            sync_seconds: 0.0,
            snapshot_seconds: 0.0,
            commit_seconds: 0.0,
            bytes: 0,
            dirty_keys: 0,
            failed: None,
        }
    }

    #[test]
    fn the_rings_keep_the_newest_entries() {
        let history = History::default();
        for id in 1..=250 {
            history.checkpoint(entry(id));
        }
        let ids: Vec<u64> = history.checkpoints().iter().map(|c| c.id).collect();
        assert_eq!(ids, (151..=250).collect::<Vec<_>>());
        for n in 0..30 {
            history.failure(n, true, format!("failure {n}"));
        }
        let failures = history.failures();
        assert_eq!(failures.len(), FAILURES_KEPT);
        assert_eq!(failures[0].reason, "failure 10");
    }

    #[test]
    fn a_failure_takes_the_record_noted_before_it_once() {
        let history = History::default();
        history.failed_record(RecordRef { topic: "in".into(), partition: 2, offset: 7 });
        history.failure(1, true, "the guest trapped".into());
        history.failure(2, true, "the broker went away".into());
        let failures = history.failures();
        assert_eq!(failures[0].record, Some(RecordRef { topic: "in".into(), partition: 2, offset: 7 }));
        assert_eq!(failures[1].record, None, "the record belongs to the first failure only");
    }
}
