//! Checkpoints: the exactly-once protocol, barriers and recovery.
//!
//! One task owns a set of input partitions, one guest instance, one
//! transactional producer (`transactional.id` = job + task index) and one
//! redb [`CheckpointStore`]. The protocol, as [`recover`] and [`checkpoint`]
//! implement it top to bottom, with the failpoint named at each step
//! (`SLUICE_FAILPOINT=<name>` aborts the process there, see
//! [`crate::failpoint`]):
//!
//! **Checkpoint N** (the barrier: the task finished its last batch before the
//! coordinator asked for N; records after it belong to epoch N+1):
//! 1. `before-snapshot`. Take the state delta since N-1 from the working set
//!    and write it to redb as *pending N* with the input offsets as of the
//!    barrier, in one durable write transaction (phase 1 for state).
//! 2. `after-snapshot`, `before-flush`. Flush every output of epoch N into
//!    the open Kafka transaction (phase 1 for outputs).
//! 3. `after-flush`. Add the input offsets, each with `N` in its metadata, to
//!    the transaction; `before-commit`; commit. **This is the single decision
//!    point**: outputs, input offsets and "checkpoint N happened" become
//!    visible together or not at all.
//! 4. `after-commit-before-fold`. Fold pending N into the base state
//!    (`during-fold` fires inside that write); `after-fold`. Idempotent, and
//!    not durable on its own: recovery redoes it if it is lost.
//! 5. Begin the transaction of epoch N+1.
//!
//! **Recovery** (start, restart after any failure):
//! 1. `init_transactions` with the task's transactional id fences a zombie
//!    and resolves its open transaction (aborted, or completed if its commit
//!    had already been decided).
//! 2. Only then read the group's committed offsets: the checkpoint id in their
//!    metadata is the truth. Never decide "N is complete" from redb alone:
//!    librdkafka cannot resume another process's prepared transaction.
//! 3. Fold every pending delta up to that id into the base, in order; discard
//!    every one above it. No committed id: a fresh task, allowed only if the
//!    store never folded anything.
//! 4. Instantiate the guest over the restored state, seek the consumer to the
//!    committed offsets (or the start position), begin a transaction.

mod coordinator;
mod store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;

pub use coordinator::Coordinator;
pub use store::{CheckpointStore, Error as StoreError, PartitionOffset, Recovery};

use crate::failpoint;
use crate::kafka::{self, Sink, Source};
use crate::runtime::{self, Instance, InstanceLimits, Module, Runtime};
use crate::state::TaskState;

/// What one task needs to (re)start.
pub struct TaskSetup {
    /// `job/task` for logs.
    pub name: String,
    /// Client configuration (brokers and extra properties).
    pub kafka: rdkafka::ClientConfig,
    /// The bootstrap servers, for messages.
    pub brokers: String,
    /// The job's consumer group.
    pub group: String,
    /// This task's transactional id.
    pub transactional_id: String,
    /// This task's input partitions.
    pub partitions: Vec<(String, i32)>,
    /// Where a partition without a committed offset starts.
    pub start: kafka::StartPosition,
    /// The job's output topics; the first is the default.
    pub output_topics: Vec<String>,
    /// The redb file of this task.
    pub store_path: std::path::PathBuf,
    /// The transform.
    pub runtime: Arc<Runtime>,
    /// The compiled module.
    pub module: Module,
    /// The guest's limits.
    pub limits: InstanceLimits,
    /// The transform's config, as `init` receives it.
    pub config: Vec<(String, String)>,
    /// Timeout of Kafka calls.
    pub kafka_timeout: Duration,
}

/// A task that recovered and is ready to process records.
pub struct Pipeline {
    /// The input.
    pub source: Source,
    /// The output.
    pub sink: Sink,
    /// The checkpoint store.
    pub store: CheckpointStore,
    /// The guest.
    pub instance: Instance,
    /// The last checkpoint committed in Kafka for this task.
    pub last_committed: Option<u64>,
    group: ConsumerGroupMetadata,
}

/// An error that stops a task; its domain decides whether it restarts.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The guest or the runtime failed.
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    /// Kafka failed.
    #[error(transparent)]
    Kafka(#[from] kafka::Error),
    /// The checkpoint store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The consumer has no group metadata (no group.id).
    #[error("the consumer has no group metadata; the job needs a consumer group")]
    NoGroup,
}

impl TaskError {
    /// Whether restarting the task may help. A module that does not load or a
    /// store that disagrees with Kafka will not fix itself.
    pub fn is_retryable(&self) -> bool {
        match self {
            TaskError::Runtime(e) => e.is_retryable(),
            TaskError::Kafka(kafka::Error::MissingTopic { .. }) => false,
            TaskError::Kafka(_) => true,
            TaskError::Store(StoreError::AheadOfKafka { .. }) => false,
            TaskError::Store(_) => true,
            TaskError::NoGroup => false,
        }
    }
}

/// What a checkpoint did, for logs and metrics.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointStats {
    /// The checkpoint id.
    pub id: u64,
    /// Keys in the state delta.
    pub dirty_keys: usize,
    /// Bytes of the pending blob written to redb.
    pub bytes: usize,
    /// Time to take the delta and write it durably (step 1).
    pub snapshot: Duration,
    /// Time from the barrier to the Kafka commit (steps 1-3).
    pub to_commit: Duration,
    /// Time of the whole checkpoint, fold included.
    pub total: Duration,
}

/// Recovers a task from the last checkpoint committed in Kafka; `attempt` is
/// passed to the guest's `init` as `sluice.attempt`.
pub fn recover(setup: &TaskSetup, attempt: u64) -> Result<Pipeline, TaskError> {
    // 1. Fence zombies; resolve their open transaction.
    let sink = Sink::connect(&setup.kafka, &setup.transactional_id, &setup.output_topics, setup.kafka_timeout)?;
    // 2. Kafka's committed checkpoint is the truth.
    let mut source = Source::connect(&setup.kafka, &setup.group, setup.start)?;
    let committed = source.committed(&setup.partitions, setup.kafka_timeout)?;
    // 3. Bring the state in line with it.
    let store = CheckpointStore::open(&setup.store_path)?;
    let recovery = store.recover(committed.checkpoint)?;
    tracing::info!(
        task = %setup.name,
        committed = ?committed.checkpoint,
        folded = ?recovery.folded,
        discarded = ?recovery.discarded,
        attempt,
        "recovered from the last committed checkpoint"
    );
    // 4. Guest over the restored state; seek; open the next transaction.
    let mut instance = setup.runtime.instantiate(
        &setup.module,
        &setup.name,
        TaskState::with_backend(store.backend()),
        setup.limits,
    )?;
    let mut config = setup.config.clone();
    config.push(("sluice.task".into(), setup.name.clone()));
    config.push(("sluice.attempt".into(), attempt.to_string()));
    instance.init(&config)?;
    source.assign(&setup.partitions, &committed)?;
    let group = source.group_metadata().ok_or(TaskError::NoGroup)?;
    sink.begin()?;
    Ok(Pipeline { source, sink, store, instance, last_committed: committed.checkpoint, group })
}

/// Runs checkpoint `id` for the epoch that just ended (see the module docs).
pub fn checkpoint(p: &mut Pipeline, id: u64) -> Result<CheckpointStats, TaskError> {
    let started = Instant::now();

    // 1. Snapshot: state delta + input offsets, durably, as pending `id`.
    failpoint::hit("before-snapshot");
    let delta = p.instance.state_mut().take_delta();
    let offsets = p.source.offsets();
    let bytes = p.store.write_pending(id, &delta, &offsets)?;
    let snapshot = started.elapsed();
    failpoint::hit("after-snapshot");

    // 2. Pre-commit the outputs: everything of this epoch is in the transaction.
    failpoint::hit("before-flush");
    p.sink.flush()?;
    failpoint::hit("after-flush");

    // 3. Offsets with the checkpoint id, then the single decision point.
    p.sink.send_offsets(&offsets, id, &p.group)?;
    failpoint::hit("before-commit");
    p.sink.commit(id)?;
    let to_commit = started.elapsed();
    p.last_committed = Some(id);

    // 4. Fold pending `id` into the base (redone by recovery if lost).
    failpoint::hit("after-commit-before-fold");
    p.store.fold(id)?;
    failpoint::hit("after-fold");
    p.instance.state_mut().evict_clean_over(EVICT_ABOVE_KEYS);

    // 5. The next epoch.
    p.sink.begin()?;
    Ok(CheckpointStats { id, dirty_keys: delta.len(), bytes, snapshot, to_commit, total: started.elapsed() })
}

/// Above this many cached keys, a task drops the clean ones from memory after
/// a fold (they are in the base now), so state can exceed memory.
const EVICT_ABOVE_KEYS: usize = 1_000_000;
