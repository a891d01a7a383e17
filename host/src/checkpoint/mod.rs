//! Checkpoints: the exactly-once protocol, barriers and recovery.
//!
//! One task owns a set of input partitions, one guest instance, one
//! transactional producer (`transactional.id` = job + task index) and one
//! redb [`CheckpointStore`], written by the task's snapshot [writer] thread.
//! The protocol, as [`recover`] and [`Pipeline`] implement it top to bottom,
//! with the failpoint named at each step (`SLUICE_FAILPOINT=<name>` aborts
//! the process there, see [`crate::failpoint`]):
//!
//! **Checkpoint N** ([`Pipeline::begin_checkpoint`], then
//! [`Pipeline::poll_checkpoint`]). The barrier: the task finished its last
//! batch before the coordinator asked for N; records after it belong to
//! epoch N+1.
//! 1. `before-snapshot`. Have the guest hand over the state writes it holds
//!    (world `cached`), then freeze the state written since N-1 (O(1), the only
//!    part of a checkpoint on the task thread that grows with state) and note
//!    the input offsets as of the barrier. The writer thread writes both to
//!    redb as *pending N* in one durable transaction (phase 1 for state);
//!    `after-snapshot` fires there. Meanwhile the task goes on processing
//!    epoch N+1, holding its outputs back: the producer's one transaction is
//!    still N's.
//! 2. Once pending N is durable: `before-flush`, flush every output of epoch N
//!    into the open Kafka transaction (phase 1 for outputs), `after-flush`.
//! 3. Add the input offsets, each with `N` in its metadata, to the
//!    transaction; `before-commit`; commit. **This is the single decision
//!    point**: outputs, input offsets and "checkpoint N happened" become
//!    visible together or not at all.
//! 4. `after-commit-before-fold`. The writer folds pending N into the base
//!    (`during-fold` fires inside that write, `after-fold` after it);
//!    idempotent, and not durable on its own: recovery redoes it if lost.
//! 5. Begin the transaction of epoch N+1 and send the outputs held back.
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

pub mod budget;
mod coordinator;
mod store;
mod writer;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use coordinator::Coordinator;
pub use store::{
    CheckpointStore, Discarded, Error as StoreError, PartitionOffset, Recovery, ShardCheckpoints, ShardSize,
};

use crate::failpoint;
use crate::kafka::{self, Sink, Source};
use crate::record::{Header, InputRecord, Output, OutputRecord, Outputs};
use crate::runtime::{self, Instance, InstanceLimits, Module, Runtime};
use crate::state::TaskState;
use writer::{Event, Writer};

/// Whether a task's guest may hold state across batches (world `cached`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    /// Yes, when the guest offers to.
    Allowed,
    /// No: an earlier attempt failed to collect what the guest held, and
    /// this one must show which record's write fails.
    Forbidden,
}

/// What a task's next attempt does differently, from what its earlier
/// attempts met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Precautions {
    /// Whether the guest may hold state across batches.
    pub holding: Holding,
    /// Whether `on-timers` gets one timer per call: after a call of timers
    /// failed, so that the next failure names the timer.
    pub one_timer_per_call: bool,
}

impl Default for Precautions {
    fn default() -> Self {
        Precautions { holding: Holding::Allowed, one_timer_per_call: false }
    }
}

/// A timer whose firing failed: its shard, clock, time and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedTimer {
    /// The shard (input partition).
    pub shard: u32,
    /// The timer.
    pub timer: crate::time::Timer,
}

impl std::fmt::Display for FailedTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let clock = match self.timer.clock {
            crate::time::Clock::Event => "event-time",
            crate::time::Clock::Processing => "processing-time",
        };
        let key: String = String::from_utf8_lossy(&self.timer.key).chars().take(100).collect();
        write!(f, "{clock} timer of key {key:?} at {} ms in shard {}", self.timer.at, self.shard)
    }
}

/// What one task needs to (re)start.
pub struct TaskSetup {
    /// `job/task` for logs.
    pub name: String,
    /// Client configuration (brokers and extra properties).
    pub kafka: rdkafka::ClientConfig,
    /// The job's consumer group.
    pub group: String,
    /// This task's transactional id.
    pub transactional_id: String,
    /// This task's input partitions; for a member of the job's group
    /// (`member`), all of the job's, of which it reads the whole shards
    /// Kafka assigns it.
    pub partitions: Vec<(String, i32)>,
    /// Whether the task is a member of the job's consumer group.
    pub member: bool,
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
    /// After an upgrade: the module that wrote the state. The new module's
    /// `migrate` hook runs at recovery until a checkpoint that holds its
    /// writes has committed.
    pub migrate_from: Option<Migration>,
    /// The longest a task goes without committing a checkpoint, even with
    /// no input: the group's offsets would expire otherwise.
    pub heartbeat: Duration,
    /// Where records the transform fails on every time go, if anywhere.
    pub dead_letter_topic: Option<String>,
    /// The job's changelog topic, if it keeps one.
    pub changelog: Option<String>,
    /// How many shards the job has: the changelog topic's partitions.
    pub shards: usize,
    /// The host's long-lived clients for one-off calls (creating the
    /// changelog topic), if they have this task's configuration.
    pub clients: Option<Arc<kafka::Clients>>,
    /// Event time, for a module that uses it.
    pub time: crate::time::TimeConfig,
    /// The job's incarnation: a new one at every create and every reset
    /// that clears the state (0: a job without incarnations, of an older
    /// host or of `sluice run`). The state of one incarnation is never
    /// taken for another's: a store of another incarnation is emptied at
    /// recovery (restored from the changelog or started afresh), and
    /// Kafka's committed checkpoints of another one are refused.
    pub incarnation: u64,
}

impl TaskSetup {
    /// The host memory the task may hold, from its guest's memory limit.
    pub fn budget(&self) -> budget::TaskBudget {
        budget::TaskBudget::new(self.limits.memory_bytes, &self.kafka)
    }

    /// The job's input topics, once each.
    pub fn input_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self.partitions.iter().map(|(topic, _)| topic.clone()).collect();
        topics.sort();
        topics.dedup();
        topics
    }

    /// The topics the task writes to: the outputs (the first is the
    /// default), then the dead-letter topic if there is one.
    pub fn sink_topics(&self) -> Vec<String> {
        self.output_topics.iter().chain(&self.dead_letter_topic).cloned().collect()
    }

    /// Fails with [`kafka::Error::MissingTopic`], naming it, if an input
    /// topic does not exist (any more), as `source` reads the metadata.
    pub fn check_input_topics(&self, source: &Source, timeout: Duration) -> Result<(), kafka::Error> {
        self.check_topics(source, &self.input_topics(), timeout)
    }

    /// As [`check_input_topics`](Self::check_input_topics), for the
    /// [`sink_topics`](Self::sink_topics).
    pub fn check_sink_topics(&self, source: &Source, timeout: Duration) -> Result<(), kafka::Error> {
        self.check_topics(source, &self.sink_topics(), timeout)
    }

    fn check_topics(&self, source: &Source, topics: &[String], timeout: Duration) -> Result<(), kafka::Error> {
        let brokers = self.kafka.get("bootstrap.servers").unwrap_or_default();
        source.check_topics(topics, brokers, timeout)
    }
}

/// Where a task's input partitions come from.
pub enum Input {
    /// Its fixed share, [`TaskSetup::partitions`], which it assigns itself.
    Fixed,
    /// It is a member of the job's consumer group ([`Source::join`]), and
    /// takes up `partitions`: the whole shards among those Kafka assigned it.
    Member {
        /// The member's consumer, which lives on across the task's attempts.
        source: Source,
        /// The partitions of its whole shards.
        partitions: Vec<(String, i32)>,
    },
}

/// Where a shard's state came from when its task last started.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(tag = "from", rename_all = "lowercase")]
pub enum ShardOrigin {
    /// The task's local store was current (or the shard is new).
    Local,
    /// The local store was missing or behind: read back from the changelog.
    Changelog {
        /// Changelog records read.
        records: u64,
        /// Bytes of their keys and values.
        bytes: u64,
        /// How long the restore took.
        seconds: f64,
    },
}

/// How long a restore waits for the next changelog record before failing
/// (the task then restarts and tries again).
const RESTORE_STALL: Duration = Duration::from_secs(60);

/// The shards of `partitions`: their partition numbers (partition p of every
/// input topic is shard p), in order, each once.
pub fn shard_numbers(partitions: &[(String, i32)]) -> Vec<u32> {
    let mut shards: Vec<u32> = partitions.iter().filter_map(|(_, partition)| u32::try_from(*partition).ok()).collect();
    shards.sort_unstable();
    shards.dedup();
    shards
}

impl TaskSetup {
    /// The shards this task holds.
    pub fn shards(&self) -> Vec<u32> {
        shard_numbers(&self.partitions)
    }

    /// The generation of the job's module: how many upgrades (rollbacks
    /// included) its record has had, 0 for a job never upgraded. A job
    /// upgraded once keeps `migrate_from` for good, so it is always there
    /// after one. Every commit carries it (`migrated=` in the mark), and a
    /// task refuses a shard a newer generation committed
    /// ([`TaskError::Superseded`]).
    pub fn generation(&self) -> u64 {
        self.migrate_from.as_ref().map_or(0, |m| m.generation)
    }
}

/// An upgrade whose `migrate` hook may still have to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The sha256 of the module that wrote the state.
    pub from: String,
    /// How many upgrades the job has had, this one included: a migration
    /// v1 -> v2 after a rollback v2 -> v1 is a new one, not the first again.
    pub generation: u64,
}

impl Migration {
    /// The note a checkpoint carries once it holds this migration's writes
    /// to `to`.
    fn note(&self, to: &str) -> String {
        format!("{}:{}>{to}", self.generation, self.from)
    }
}

/// A task that recovered and is ready to process records.
pub struct Pipeline {
    /// The input.
    pub source: Source,
    /// The guest.
    pub instance: Instance,
    /// The code it runs.
    module: Module,
    /// What its `init` was given.
    init_config: Vec<(String, String)>,
    sink: Sink,
    writer: Writer,
    last_committed: Option<u64>,
    in_flight: Option<InFlight>,
    /// Outputs of the epoch after an in-flight checkpoint, held back until
    /// that checkpoint's transaction is committed.
    held: Outputs,
    /// The bytes of `held` above which the task waits for the checkpoint:
    /// the guest's memory limit.
    max_held_bytes: usize,
    /// The clean values the task's state may cache: its share of host
    /// memory ([`budget::TaskBudget::clean_cache_bytes`]).
    max_clean_bytes: usize,
    /// The topics the guest may write.
    output_topics: Vec<String>,
    /// Where dead letters go.
    dead_letter_topic: Option<String>,
    /// The largest record the producer sends.
    max_message_bytes: usize,
    /// The largest record each output and dead-letter topic takes, where
    /// the broker said (a topic's `max.message.bytes` may be below the
    /// producer's).
    topic_max_bytes: std::collections::HashMap<String, usize>,
    /// Whether some partition's position is not committed in Kafka yet (a
    /// start position resolved at recovery): the task checkpoints before it
    /// reads anything.
    start_uncommitted: bool,
    /// When a checkpoint last committed (or the task recovered).
    last_commit: Instant,
    /// The input positions the last committed checkpoint holds.
    committed_offsets: Vec<PartitionOffset>,
    /// See [`TaskSetup::heartbeat`].
    heartbeat: Duration,
    /// The note of a migration whose writes the next checkpoint carries.
    migrated: Option<String>,
    /// When the first record went into the open transaction (ms since the
    /// Unix epoch); 0 while it holds none. Until then the broker knows
    /// nothing of it, so it holds no reader back.
    transaction_since_ms: u64,
    /// Each shard's changelog span as of the last commit (empty without a
    /// changelog).
    changelog: BTreeMap<u32, kafka::ChangelogSpan>,
    /// Where each shard's state came from at recovery.
    origins: BTreeMap<u32, ShardOrigin>,
    /// Keys and bytes of each shard's committed state, as of the last fold.
    shard_sizes: BTreeMap<u32, ShardSize>,
    /// Each shard's last committed checkpoint.
    shard_checkpoints: ShardCheckpoints,
    /// The upgrade migration every checkpoint's state holds (its writes go
    /// into the first checkpoint after recovery), recorded with the offsets
    /// for shards restored from the changelog.
    migration_generation: Option<u64>,
    /// This run of the task (see [`crate::kafka::Mark::run`]).
    run: u64,
    /// The job's incarnation (see [`TaskSetup::incarnation`]), as its
    /// checkpoints carry it.
    incarnation: Option<u64>,
    /// The source's [`Source::assignment_changes`] it recovered with.
    assignment_changes: u64,
}

/// A checkpoint between its barrier and its commit.
struct InFlight {
    id: u64,
    offsets: Vec<PartitionOffset>,
    dirty_keys: usize,
    barrier: Instant,
    sync: Duration,
}

/// What librdkafka adds to a record's key, value and headers on the wire,
/// at most: a record must fit `message.max.bytes` with it.
const MESSAGE_OVERHEAD: usize = 1024;

/// The longest error text a dead letter's `sluice.error` header carries.
const MAX_REASON: usize = 4096;

/// Outputs held back while a checkpoint is in flight, above which the task
/// waits for the checkpoint instead of processing more.
const MAX_HELD_OUTPUTS: usize = 100_000;

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
    /// The snapshot writer thread could not start.
    #[error("starting the snapshot writer thread: {0}")]
    Writer(std::io::Error),
    /// The consumer has no group metadata (no group.id).
    #[error("the consumer has no group metadata; the job needs a consumer group")]
    NoGroup,
    /// The task's thread panicked: a host bug, or a library that panics on
    /// hostile input.
    #[error("the task panicked: {0}")]
    Panicked(String),
    /// The guest's `init` failed: its config or its code is wrong, and
    /// trying again will not help.
    #[error("the transform's init failed: {0}")]
    Init(runtime::Error),
    /// The transform produced an output Kafka would refuse: the guest's
    /// mistake, not Kafka's.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// Firing timers failed: the guest's `on-timers` (a trap, an error, a
    /// limit) or an output of it Kafka would refuse. There is no record to
    /// set aside, so the task restarts from its last checkpoint with backoff
    /// and the timers fire again, one per call, until the same timer has
    /// failed `errors.attempts` times ([`TaskError::TimerFailed`]).
    #[error("firing timers{}: {source}", timer.as_ref().map(|t| format!(" (the first, the {t})")).unwrap_or_default())]
    Timers {
        /// What failed.
        #[source]
        source: Box<TaskError>,
        /// The first timer of the call that failed, if a call did.
        timer: Option<FailedTimer>,
    },
    /// The same timer failed its job's `errors.attempts` times: the job
    /// fails, naming it, rather than restarting for ever.
    #[error("the transform's on-timers failed {attempts} times on the {timer}: {reason}")]
    TimerFailed {
        /// The timer.
        timer: FailedTimer,
        /// Its failures.
        attempts: u32,
        /// The last one.
        reason: String,
    },
    /// Kafka's committed checkpoint of a shard belongs to another
    /// incarnation of the job than the one this task runs: a cluster
    /// member's copy of the job's record is behind the cluster's (retried:
    /// the member releases the job once it has caught up, and the task
    /// never runs the shard meanwhile), or the group's offsets were
    /// committed by something else, as another host using the same job
    /// names on the same brokers (not retried).
    #[error(
        "Kafka's committed checkpoint of shard {shard} (input partition {shard}) belongs to incarnation {committed:016x} \
         of the job, but this task runs incarnation {ours:016x}: this host's record of the job is behind the \
         cluster's, or something else committed to the job's consumer group (another host using the same job \
         names on the same brokers?); reset the job to run it anew"
    )]
    OtherIncarnation {
        /// The shard.
        shard: u32,
        /// The incarnation Kafka's checkpoint names (0: none).
        committed: u64,
        /// The task's.
        ours: u64,
        /// Whether the task is a member of a cluster's job group.
        member: bool,
    },
    /// A shard's committed checkpoint was written under a newer generation
    /// of the job's module (a later upgrade or rollback) than this task
    /// runs: in a cluster, this member has not applied the job's newer
    /// record yet, and running the shard would put old code on state the
    /// new module migrated (and erase the mark that says so). The task
    /// lets go of its shards and tries again until its member catches up
    /// and restarts it (retried for a cluster member only).
    #[error(
        "Kafka's committed checkpoint of shard {shard} (input partition {shard}) was written by generation \
         {committed} of the job's module, but this task runs generation {ours}: this host has not applied the \
         job's newer upgrade yet; leaving the shard to a task that has"
    )]
    Superseded {
        /// The shard.
        shard: u32,
        /// The generation Kafka's checkpoint names.
        committed: u64,
        /// The task's.
        ours: u64,
        /// Whether the task is a member of a cluster's job group.
        member: bool,
    },
    /// The task was asked to stop while it recovered (during a changelog
    /// restore): nothing of the attempt is kept, and the task stops.
    #[error("the task stopped while it recovered")]
    Stopped,
    /// A record failed every time it was tried, and the job's error policy
    /// is `fail`.
    #[error(
        "record {topic}/{partition}@{offset} failed {attempts} times: {reason} (set `errors.policy = \"dead-letter\"` \
         to set such records aside and go on)"
    )]
    Poison {
        /// Its topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Its offset.
        offset: i64,
        /// How often it was tried.
        attempts: u32,
        /// The last failure.
        reason: String,
    },
}

/// An output the host refuses before Kafka would.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// A topic the job did not declare.
    #[error("the transform wrote to topic `{topic}`, which is not one of the job's output topics ({declared})")]
    UndeclaredTopic {
        /// The topic the guest named.
        topic: String,
        /// The declared output topics, comma-separated.
        declared: String,
    },
    /// A record over the producer's `message.max.bytes`.
    #[error(
        "the transform wrote a record of {size} bytes; with Kafka's framing that is over the producer's \
         `message.max.bytes` of {max}"
    )]
    TooLarge {
        /// Its key, value and headers, in bytes.
        size: usize,
        /// The producer's `message.max.bytes`.
        max: usize,
    },
    /// A record was to be dead-lettered but the job has no such topic.
    #[error("the job has no dead-letter topic")]
    NoDeadLetterTopic,
}

impl TaskError {
    /// Whether restarting the task may help. A module that does not load or a
    /// store that disagrees with Kafka will not fix itself.
    pub fn is_retryable(&self) -> bool {
        match self {
            TaskError::Runtime(e) => e.is_retryable(),
            TaskError::Kafka(e) => e.is_retryable(),
            TaskError::Store(e) => e.is_retryable(),
            TaskError::Writer(_) | TaskError::Stopped => true,
            TaskError::OtherIncarnation { member, .. } | TaskError::Superseded { member, .. } => *member,
            TaskError::NoGroup | TaskError::Panicked(_) | TaskError::Init(_) | TaskError::Poison { .. } => false,
            TaskError::Output(_) => true,
            TaskError::Timers { source, .. } => source.is_retryable(),
            TaskError::TimerFailed { .. } => false,
        }
    }

    /// Whether handing over the state the guest held failed (see
    /// [`runtime::Error::HeldState`]): the next attempt should not hold.
    pub fn is_held_state_failure(&self) -> bool {
        match self {
            TaskError::Runtime(runtime::Error::HeldState(_)) => true,
            TaskError::Timers { source, .. } => source.is_held_state_failure(),
            _ => false,
        }
    }

    /// For a firing of timers that failed because of the guest (not the
    /// host): the first timer of the call that failed.
    pub fn failed_timer(&self) -> Option<&FailedTimer> {
        match self {
            TaskError::Timers { source, timer } if source.is_deterministic() => timer.as_ref(),
            _ => None,
        }
    }

    /// Whether the failure comes from the records being processed and will
    /// happen again on the same records: the guest failed (trap, error,
    /// limit, deadline) or produced an output Kafka would refuse. Such a
    /// failure counts against the records of the batch (see the job's
    /// `errors` policy); any other is the host's or Kafka's and is retried.
    pub fn is_deterministic(&self) -> bool {
        match self {
            TaskError::Runtime(e) => e.domain() == runtime::Domain::Guest && !matches!(e, runtime::Error::Poisoned),
            TaskError::Output(_) => true,
            _ => false,
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
    /// Time the barrier held up the task thread (freezing the delta, noting
    /// the offsets).
    pub sync: Duration,
    /// Time to write the pending delta durably (on the writer thread, while
    /// the task went on processing).
    pub snapshot: Duration,
    /// Time from the barrier to the Kafka commit.
    pub to_commit: Duration,
}

/// The first of `shards` whose committed checkpoint names a newer module
/// generation than `ours`, with that generation (absent: 0, never upgraded).
fn superseded(committed: &kafka::Committed, shards: &[u32], ours: u64) -> Option<(u32, u64)> {
    shards.iter().find_map(|&shard| {
        let theirs = committed.migrated.get(&shard).copied().unwrap_or(0);
        (theirs > ours).then_some((shard, theirs))
    })
}

/// Recovers a task from the last checkpoint committed in Kafka; `attempt` is
/// passed to the guest's `init` as `sluice.attempt`; `precautions` say what
/// earlier attempts taught (whether the guest may hold state across
/// batches, whether timers fire one per call).
pub fn recover(
    setup: &TaskSetup,
    input: Input,
    attempt: u64,
    precautions: Precautions,
    stopping: &dyn Fn() -> bool,
) -> Result<Pipeline, TaskError> {
    // 1. Fence zombies; resolve their open transaction.
    let budget = setup.budget();
    let sink = Sink::connect(
        &budget.producer(&setup.kafka),
        &setup.transactional_id,
        &setup.sink_topics(),
        setup.changelog.as_deref(),
        setup.kafka_timeout,
    )?;
    // 2. Kafka's committed checkpoints (one per shard) are the truth.
    let (mut source, partitions) = match input {
        Input::Fixed => {
            (Source::connect(&budget.consumer(&setup.kafka), &setup.group, setup.start)?, setup.partitions.clone())
        }
        Input::Member { source, partitions } => (source, partitions),
    };
    // An input topic deleted since the job started took its committed
    // offsets with it: say so, rather than meet the state as not Kafka's.
    setup.check_input_topics(&source, setup.kafka_timeout)?;
    // An output deleted since: its writes failed (the producer does not
    // have the broker create topics), and they would fail again.
    setup.check_sink_topics(&source, setup.kafka_timeout)?;
    let assignment_changes = source.assignment_changes();
    let committed = source.committed(&partitions, setup.kafka_timeout)?;
    let shards = shard_numbers(&partitions);
    let checkpoints = committed.for_shards(&shards);
    // A checkpoint id means something only within the incarnation that
    // committed it.
    for &shard in &shards {
        let theirs = committed.incarnations.get(&shard).copied().unwrap_or(0);
        if checkpoints.get(&shard).copied().flatten().is_some() && theirs != setup.incarnation {
            return Err(TaskError::OtherIncarnation {
                shard,
                committed: theirs,
                ours: setup.incarnation,
                member: setup.member,
            });
        }
    }
    // A shard a newer generation of the module committed is not this
    // task's to run, nor to restore (see `TaskError::Superseded`).
    if let Some((shard, committed)) = superseded(&committed, &shards, setup.generation()) {
        return Err(TaskError::Superseded { shard, committed, ours: setup.generation(), member: setup.member });
    }
    // 3. Bring each shard's state in line with it: a store another
    // incarnation of the job left here (on a member that did not take the
    // reset that cleared it, or that was down while the job was deleted and
    // created again) holds nothing of this one's.
    let store = CheckpointStore::open_with_cache(&setup.store_path, budget.store_cache_bytes())?;
    if let Some(discarded) = store.adopt(setup.incarnation)? {
        tracing::info!(
            task = %setup.name, incarnation = %format!("{:016x}", setup.incarnation), ?discarded,
            "discarded the state another incarnation of the job left here"
        );
    }
    let recovery = store.recover_runs(&checkpoints, &committed.runs)?;
    if let Some(keys) = recovery.upgraded_keys {
        tracing::info!(task = %setup.name, keys, "state upgraded to the per-partition layout");
    }
    // A shard whose local state is missing or behind comes back from the
    // changelog, exactly up to its committed checkpoint's span; without
    // one, the task refuses to run on the wrong state.
    let mut origins: BTreeMap<u32, ShardOrigin> = shards.iter().map(|&s| (s, ShardOrigin::Local)).collect();
    for (&shard, &(folded, id)) in &recovery.behind {
        let (Some(topic), Some(span)) = (&setup.changelog, committed.changelogs.get(&shard)) else {
            return Err(store.state_lost(shard, folded, id).into());
        };
        store.clear_shard(shard)?;
        tracing::info!(task = %setup.name, shard, checkpoint = id, "restoring the shard's state from the changelog");
        // A stop ends the restore (the shard is not current until its last
        // chunk: the next start restores it again).
        let restored = kafka::changelog::restore(
            &budget.consumer(&setup.kafka),
            topic,
            shard,
            *span,
            RESTORE_STALL,
            stopping,
            |chunk| store.restore_chunk(shard, &chunk).map_err(TaskError::from),
        )
        .map_err(|e| match e {
            TaskError::Kafka(kafka::Error::Stopped) => TaskError::Stopped,
            e => e,
        })?;
        store.finish_restore(shard, id)?;
        // The upgrade migration the restored state holds, if the current one.
        if let Some(migration) = &setup.migrate_from
            && committed.migrated.get(&shard) == Some(&migration.generation)
        {
            store.set_migrated(shard, &migration.note(setup.module.sha256()))?;
        }
        tracing::info!(
            task = %setup.name, shard, checkpoint = id, records = restored.records, bytes = restored.bytes,
            seconds = restored.seconds, "restored the shard's state from the changelog"
        );
        origins.insert(
            shard,
            ShardOrigin::Changelog { records: restored.records, bytes: restored.bytes, seconds: restored.seconds },
        );
    }
    // Each shard's changelog span: as committed; from the changelog's end
    // for a shard that starts afresh; and for a shard whose checkpoints
    // predate the changelog, from its end too, after all its state is
    // written there in the first epoch (below).
    let mut changelog = BTreeMap::new();
    let mut bootstrap = Vec::new();
    if let Some(topic) = &setup.changelog {
        let clients = kafka::Clients::shared_or_new(setup.clients.as_ref(), &setup.kafka)?;
        // A new job's changelog topic is created by its tasks (every task
        // makes sure of it; the first creation stands), as is a partition
        // the input gained. One metadata request when it is there.
        kafka::changelog::ensure_topic(&clients, topic, setup.shards, Duration::from_secs(30))?;
        let ends = kafka::changelog::ends(&clients, topic, &shards, setup.kafka_timeout)?;
        for (&shard, &end) in &ends {
            // A changelog that ends before the committed span was recreated
            // or truncated: the shard's state (current here, or the restore
            // above would have failed) is written to it again.
            let span = match committed.changelogs.get(&shard).filter(|span| span.to <= end) {
                Some(span) => *span,
                None => {
                    if checkpoints.get(&shard).copied().flatten().is_some() {
                        bootstrap.push(shard);
                    }
                    kafka::ChangelogSpan { from: end, to: end }
                }
            };
            changelog.insert(shard, span);
        }
    }
    // What each topic written takes: a record over it is refused before it
    // is sent (and a dead letter cut to fit), never left to fail the
    // transaction at every replay.
    let topic_max_bytes = match kafka::Clients::shared_or_new(setup.clients.as_ref(), &setup.kafka)
        .and_then(|clients| clients.max_message_bytes_of(&setup.sink_topics()))
    {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(task = %setup.name, "the topics' record size limits are unknown; the producer's is used: {e}");
            Default::default()
        }
    };
    // The task's ids go on above every id any of its shards committed, in
    // whichever task that was: each shard's ids only grow.
    let last_committed = checkpoints.values().flatten().max().copied();
    tracing::info!(
        task = %setup.name,
        committed = ?last_committed,
        shards = ?checkpoints,
        folded = ?recovery.folded,
        discarded = ?recovery.discarded,
        attempt,
        "recovered from the last committed checkpoints"
    );
    // 4. Guest over the restored state; seek; open the next transaction.
    let mut state = TaskState::with_backend(store.backend());
    if store.base_is_empty()? {
        state.start_empty();
    }
    if let Some(limit) = setup.limits.max_state_bytes {
        state.limit_size(limit, store.base_bytes()?);
    }
    if setup.changelog.is_some() {
        state.limit_entry(kafka::max_message_bytes(&setup.kafka).saturating_sub(MESSAGE_OVERHEAD));
    }
    // The optimized code if it is ready, else the baseline code until it is.
    let module = setup.module.best();
    let mut instance = setup.runtime.instantiate(&module, &setup.name, state, setup.limits)?;
    // Before `migrate`, whose timers must be noted like any others.
    instance.start_time(&module, setup.time, &partitions)?;
    if precautions.holding == Holding::Forbidden {
        instance.forbid_holding();
    }
    if precautions.one_timer_per_call {
        instance.fire_one_timer_per_call();
    }
    let mut config = setup.config.clone();
    config.push(("sluice.task".into(), setup.name.clone()));
    config.push(("sluice.attempt".into(), attempt.to_string()));
    instance.init(&config).map_err(TaskError::Init)?;
    // After an upgrade, the new module rewrites the old state of each shard
    // no committed checkpoint holds the rewrite of.
    let mut migrated = None;
    if let Some(migration) = &setup.migrate_from {
        let note = migration.note(setup.module.sha256());
        let mut behind = Vec::new();
        for &shard in &shards {
            if store.migrated(shard)?.as_deref() != Some(note.as_str()) {
                behind.push(shard);
            }
        }
        if !behind.is_empty() && instance.migrate(&migration.from, &behind)? {
            tracing::info!(task = %setup.name, from = %migration.from, shards = ?behind, "migrated the state of the previous module");
            migrated = Some(note);
        }
    }
    let resolved = source.assign(&partitions, &committed, setup.kafka_timeout)?;
    if resolved > 0 {
        tracing::info!(task = %setup.name, partitions = resolved, start = ?setup.start, "resolved the start position");
    }
    // Taken again for every commit: a member's generation moves on.
    source.group_metadata().ok_or(TaskError::NoGroup)?;
    // Only the shards held: a member's store may keep others it held before.
    let mut shard_sizes = store.shard_sizes()?;
    shard_sizes.retain(|shard, _| shards.contains(shard));
    let changelog_writer = sink.changelog_writer()?;
    sink.begin()?;
    if let Some(writer) = &changelog_writer {
        for &shard in &bootstrap {
            let records = bootstrap_changelog(&store, writer, shard)?;
            tracing::info!(task = %setup.name, shard, records, "wrote the shard's state to the new changelog");
        }
    }
    let run = random_id();
    let writer =
        Writer::start(store, changelog_writer, &setup.name, run, budget.fold_bytes()).map_err(TaskError::Writer)?;
    Ok(Pipeline {
        source,
        instance,
        module,
        init_config: config,
        sink,
        writer,
        last_committed,
        in_flight: None,
        held: Outputs::default(),
        max_held_bytes: setup.limits.memory_bytes,
        max_clean_bytes: budget.clean_cache_bytes(),
        output_topics: setup.output_topics.clone(),
        dead_letter_topic: setup.dead_letter_topic.clone(),
        max_message_bytes: kafka::max_message_bytes(&setup.kafka),
        topic_max_bytes,
        start_uncommitted: resolved > 0 || !bootstrap.is_empty(),
        last_commit: Instant::now(),
        committed_offsets: Vec::new(),
        heartbeat: setup.heartbeat,
        migrated,
        transaction_since_ms: 0,
        changelog,
        origins,
        shard_sizes,
        shard_checkpoints: checkpoints,
        migration_generation: Some(setup.generation()).filter(|&g| g > 0),
        run,
        incarnation: (setup.incarnation != 0).then_some(setup.incarnation),
        assignment_changes,
    })
}

/// Whether `held` outputs are as many as a task may hold back while a
/// checkpoint is in flight: [`MAX_HELD_OUTPUTS`] records, or `max_bytes`.
fn held_too_much(held: &Outputs, max_bytes: usize) -> bool {
    held.len() >= MAX_HELD_OUTPUTS || held.bytes() >= max_bytes
}

/// Cuts a dead letter to at most `room` bytes of key, value and headers:
/// the value first, then the key, then the record's own headers (the
/// `sluice.*` headers stay), and notes in `sluice.truncated` what was cut
/// (`value=ORIGINAL-BYTES`, `key=...`, `headers=COUNT`). A letter that fits
/// is left as it is.
fn fit_letter(letter: &mut OutputRecord, room: usize) {
    if letter_bytes(letter) <= room {
        return;
    }
    // Room for the note itself, which names at most three sizes.
    const NOTE: usize = "sluice.truncated".len() + 64;
    let mut cut = Vec::new();
    let mut over = (letter_bytes(letter) + NOTE).saturating_sub(room);
    for (name, field) in [("value", &mut letter.value), ("key", &mut letter.key)] {
        if over == 0 {
            break;
        }
        if let Some(bytes) = field.as_mut().filter(|b| !b.is_empty()) {
            let keep = bytes.len().saturating_sub(over);
            cut.push(format!("{name}={}", bytes.len()));
            over -= bytes.len() - keep;
            bytes.truncate(keep);
        }
    }
    if over > 0 {
        let theirs = letter.headers.iter().filter(|h| !h.key.starts_with("sluice.")).count();
        letter.headers.retain(|h| h.key.starts_with("sluice."));
        cut.push(format!("headers={theirs}"));
    }
    letter.headers.push(Header { key: "sluice.truncated".into(), value: cut.join(";").into_bytes() });
}

/// The bytes of a letter's key, value and headers: what counts against a
/// topic's record size.
fn letter_bytes(letter: &OutputRecord) -> usize {
    letter.key.as_ref().map_or(0, Vec::len)
        + letter.value.as_ref().map_or(0, Vec::len)
        + letter.headers.iter().map(|h| h.key.len() + h.value.len()).sum::<usize>()
}

/// A random id: a task run's, so two runs of one task (on two hosts, one
/// of them a fenced zombie) never share one; a job's incarnation.
pub(crate) fn random_id() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // Still unique per process and moment, if not across hosts.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        return (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32);
    }
    u64::from_le_bytes(bytes)
}

/// Writes all of `shard`'s committed state to the changelog, into the open
/// transaction, for a shard whose checkpoints predate the changelog: its
/// span must hold its whole state. Returns the records sent.
fn bootstrap_changelog(
    store: &CheckpointStore,
    writer: &kafka::changelog::ChangelogWriter,
    shard: u32,
) -> Result<usize, TaskError> {
    use crate::state::StateBackend as _;
    let prefix = runtime::shard_key(shard, b"");
    let mut after: Option<Vec<u8>> = None;
    let mut sent = 0;
    loop {
        let page = store
            .scan(&prefix, after.as_deref(), 10_000)
            .map_err(|e| TaskError::Runtime(runtime::Error::internal("reading the state to write the changelog", e)))?;
        let Some((last, _)) = page.last() else { return Ok(sent) };
        after = Some(last.clone());
        sent += writer.send(&crate::state::Delta::new(page.into_iter().map(|(k, v)| (k, Some(v)))))?;
    }
}

impl Pipeline {
    /// Whether the job's group changed a member's partitions since it
    /// recovered: it must recover anew, from its last checkpoint.
    pub fn reassigned(&self) -> bool {
        self.source.assignment_changes() != self.assignment_changes
    }

    /// The task's source, to live on after the pipeline: a member's
    /// consumer stays in the group while its task recovers anew.
    pub fn into_source(self) -> Source {
        self.source
    }

    /// The last checkpoint committed in Kafka for this task (at recovery:
    /// the highest any of its shards committed).
    pub fn last_committed(&self) -> Option<u64> {
        self.last_committed
    }

    /// When the task last committed a checkpoint (at recovery: then).
    pub fn last_commit(&self) -> Instant {
        self.last_commit
    }

    /// Counts the heartbeat from `at` rather than from the recovery: a task
    /// that woke from sleep has not committed since it fell asleep.
    pub fn committed_at(&mut self, at: Instant) {
        self.last_commit = at;
    }

    /// Where each shard's state came from at recovery.
    pub fn origins(&self) -> &BTreeMap<u32, ShardOrigin> {
        &self.origins
    }

    /// Keys and bytes of each shard's committed state, as of the last fold.
    pub fn shard_sizes(&self) -> &BTreeMap<u32, ShardSize> {
        &self.shard_sizes
    }

    /// Each shard's last committed checkpoint.
    pub fn shard_checkpoints(&self) -> &ShardCheckpoints {
        &self.shard_checkpoints
    }

    /// The input positions of the last checkpoint this task committed (empty
    /// before its first commit): every record before them is in Kafka's
    /// committed past and is never replayed.
    pub fn committed_offsets(&self) -> &[PartitionOffset] {
        &self.committed_offsets
    }

    /// Whether a checkpoint is between its barrier and its commit.
    pub fn checkpoint_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The id of the checkpoint between its barrier and its commit, if one is.
    pub fn checkpoint_in_flight_id(&self) -> Option<u64> {
        self.in_flight.as_ref().map(|f| f.id)
    }

    /// Whether a checkpoint is due even if no record came in since the last
    /// one: the start positions resolved at recovery are not committed yet,
    /// a migration's writes are not, or nothing committed for longer than
    /// the heartbeat (offsets a group does not commit expire on the broker,
    /// after `offsets.retention.minutes`, 7 days by default).
    pub fn wants_checkpoint(&self) -> bool {
        self.in_flight.is_none()
            && (self.start_uncommitted || self.migrated.is_some() || self.last_commit.elapsed() >= self.heartbeat)
    }

    /// Whether the task must commit a checkpoint before it reads anything:
    /// positions resolved at recovery (a `latest` or `earliest` start), or a
    /// changelog bootstrap, are not committed yet. A restart would resolve
    /// `latest` again, so nothing may be read on positions that are not.
    pub fn start_pending(&self) -> bool {
        self.start_uncommitted
    }

    /// Whether the task should wait for the in-flight checkpoint before
    /// processing more: too many outputs held back, by count or by bytes
    /// (as many as the guest's memory limit: a guest cannot make the host
    /// hold more of its outputs than its own memory, plus one batch's).
    pub fn must_wait(&self) -> bool {
        self.in_flight.is_some() && held_too_much(&self.held, self.max_held_bytes)
    }

    /// Refuses outputs Kafka would refuse, before any is sent or held back:
    /// a topic the job did not declare, a record over the producer's
    /// `message.max.bytes`. The failure is the batch's, so the job's error
    /// policy deals with it rather than a restart loop.
    pub fn check_outputs(&self, outputs: &Outputs) -> Result<(), TaskError> {
        for output in outputs {
            if let Some(topic) = output.topic()
                && !self.output_topics.iter().any(|declared| declared == topic)
            {
                return Err(OutputError::UndeclaredTopic {
                    topic: topic.to_owned(),
                    declared: self.output_topics.join(", "),
                }
                .into());
            }
            let size = output.key().map_or(0, <[u8]>::len)
                + output.value().map_or(0, <[u8]>::len)
                + output.headers().map(|(key, value)| key.len() + value.len()).sum::<usize>();
            // librdkafka adds its own framing to what the record holds.
            let topic = output.topic().or(self.output_topics.first().map(String::as_str)).unwrap_or_default();
            let max = self.max_bytes_of(topic);
            if size.saturating_add(MESSAGE_OVERHEAD) > max {
                return Err(OutputError::TooLarge { size, max }.into());
            }
        }
        Ok(())
    }

    /// The largest record `topic` takes: the producer's `message.max.bytes`,
    /// or the topic's `max.message.bytes` where that is smaller.
    fn max_bytes_of(&self, topic: &str) -> usize {
        self.topic_max_bytes.get(topic).map_or(self.max_message_bytes, |&topic| topic.min(self.max_message_bytes))
    }

    /// Sets `record` aside: it goes to the dead-letter topic, in the open
    /// epoch (so exactly once, with the rest of its checkpoint), with its
    /// headers plus `sluice.error`, `sluice.job`, `sluice.topic`,
    /// `sluice.partition`, `sluice.offset` and `sluice.attempts`. A letter
    /// the topic would not take is cut to fit ([`fit_letter`]): a letter
    /// that cannot be written would stop the partition for ever.
    pub fn dead_letter(
        &mut self,
        record: &InputRecord,
        job: &str,
        reason: &str,
        attempts: u32,
    ) -> Result<(), TaskError> {
        let Some(topic) = self.dead_letter_topic.clone() else {
            return Err(OutputError::NoDeadLetterTopic.into());
        };
        let mut headers = record.headers.clone();
        let mut note = |key: &str, value: String| headers.push(Header { key: key.into(), value: value.into_bytes() });
        note("sluice.error", reason.chars().take(MAX_REASON).collect());
        note("sluice.job", job.to_owned());
        note("sluice.topic", record.topic.clone());
        note("sluice.partition", record.partition.to_string());
        note("sluice.offset", record.offset.to_string());
        note("sluice.attempts", attempts.to_string());
        let mut letter =
            OutputRecord { key: record.key.clone(), value: record.value.clone(), headers, topic: Some(topic) };
        let room = self.max_bytes_of(letter.topic.as_deref().unwrap_or_default()).saturating_sub(MESSAGE_OVERHEAD);
        fit_letter(&mut letter, room);
        self.emit(Outputs::from_records(vec![letter]))
    }

    /// Fires the due timers of the task's shards (see
    /// [`Instance::fire_timers`]) and sends their outputs into the open
    /// epoch; returns how many fired.
    pub fn fire_timers(&mut self) -> Result<usize, TaskError> {
        let fired = self.instance.fire_timers(Instant::now());
        let (outputs, fired) = fired.map_err(|e| {
            let timer = self.instance.take_failed_timer().map(|(shard, timer)| FailedTimer { shard, timer });
            TaskError::Timers { source: Box::new(e.into()), timer }
        })?;
        if fired == 0 {
            return Ok(0);
        }
        let outputs = Outputs::from_records(outputs);
        self.check_outputs(&outputs).map_err(|e| TaskError::Timers { source: Box::new(e), timer: None })?;
        self.emit(outputs)?;
        Ok(fired)
    }

    /// Sends a batch's outputs into the open transaction, or holds them back
    /// while a checkpoint is in flight.
    pub fn emit(&mut self, outputs: Outputs) -> Result<(), TaskError> {
        if self.in_flight.is_some() {
            self.held.append(outputs);
            return Ok(());
        }
        if self.transaction_since_ms == 0 && !outputs.is_empty() {
            self.transaction_since_ms = crate::job::now_ms();
        }
        Ok(self.sink.send_all(&outputs)?)
    }

    /// Step 1: the barrier of checkpoint `id`.
    pub fn begin_checkpoint(&mut self, id: u64) -> Result<(), TaskError> {
        let barrier = Instant::now();
        failpoint::hit("before-snapshot");
        // The writes a guest holds belong to this epoch.
        self.instance.end_epoch()?;
        let delta = self.instance.state_mut().freeze(id);
        let offsets = self.source.offsets();
        let dirty_keys = delta.len();
        self.writer.snapshot(id, delta, offsets.clone(), self.migrated.take());
        self.in_flight = Some(InFlight { id, offsets, dirty_keys, barrier, sync: barrier.elapsed() });
        Ok(())
    }

    /// Steps 2-5 for the in-flight checkpoint once its snapshot is durable,
    /// waiting for it if `block`; returns its figures when it committed.
    /// Also releases state the writer has folded.
    pub fn poll_checkpoint(&mut self, block: bool) -> Result<Option<CheckpointStats>, TaskError> {
        // Called once per loop of the task: the producer's events too.
        self.sink.serve();
        loop {
            let wait = block && self.in_flight.is_some();
            let Some(event) = self.writer.next_event(wait) else { return Ok(None) };
            match event {
                Event::Folded { id, sizes, .. } => {
                    self.folded(id, sizes);
                    self.instance.state_mut().evict_clean_over(self.max_clean_bytes);
                }
                Event::Failed(e) => return Err(e),
                Event::Snapshotted { id, bytes, elapsed } => {
                    let Some(in_flight) = self.in_flight.take_if(|f| f.id == id) else { continue };
                    return self.commit(in_flight, bytes, elapsed).map(Some);
                }
            }
        }
    }

    /// Folds every committed checkpoint now and waits for it, so that the
    /// shards' sizes are the committed state's: for a task that stops.
    pub fn fold_now(&mut self) -> Result<(), TaskError> {
        self.writer.fold_now();
        loop {
            match self.writer.next_event(true) {
                // A fold that came due before ours may answer first: take
                // each in order, and stop at ours, which folded all.
                Some(Event::Folded { id, sizes, answers_fold_now }) => {
                    self.folded(id, sizes);
                    if answers_fold_now {
                        return Ok(());
                    }
                }
                Some(Event::Failed(e)) => return Err(e),
                Some(Event::Snapshotted { .. }) | None => {}
            }
        }
    }

    /// The writer folded the checkpoints through `id`: the shards now have
    /// `sizes`, and the base answers for the frozen deltas.
    fn folded(&mut self, id: u64, sizes: BTreeMap<u32, ShardSize>) {
        self.shard_sizes = sizes;
        self.instance.state_mut().release_through(id);
    }

    /// Steps 2-5: pending `id` is durable; commit the epoch in Kafka.
    fn commit(&mut self, in_flight: InFlight, bytes: usize, snapshot: Duration) -> Result<CheckpointStats, TaskError> {
        let id = in_flight.id;

        // 2. Pre-commit the outputs: everything of this epoch is in the transaction.
        failpoint::hit("before-flush");
        self.sink.flush()?;
        failpoint::hit("after-flush");

        // 3. Offsets with the checkpoint id and each shard's changelog span
        // (extended to the records this epoch delivered), then the single
        // decision point.
        let mut changelog = self.changelog.clone();
        for (shard, end) in self.sink.take_changelog_ends() {
            if let Some(span) = changelog.get_mut(&shard) {
                span.to = span.to.max(end);
            }
        }
        let group = self.source.group_metadata().ok_or(TaskError::NoGroup)?;
        let mark = kafka::Mark {
            checkpoint: id,
            changelog: None,
            migrated: self.migration_generation,
            run: Some(self.run),
            incarnation: self.incarnation,
        };
        self.sink.send_offsets(&in_flight.offsets, mark, &changelog, &group)?;
        failpoint::hit("before-commit");
        self.sink.commit(id)?;
        self.changelog = changelog;
        self.shard_checkpoints.values_mut().for_each(|c| *c = Some(id));
        self.last_committed = Some(id);
        self.last_commit = Instant::now();
        self.start_uncommitted = false;
        self.committed_offsets = in_flight.offsets;
        self.transaction_since_ms = 0;
        let to_commit = in_flight.barrier.elapsed();

        // 4. Fold pending `id` into the base, in the background.
        failpoint::hit("after-commit-before-fold");
        self.writer.fold(id);

        // 5. The next epoch, with the outputs held back for it.
        self.sink.begin()?;
        if !self.held.is_empty() {
            self.transaction_since_ms = crate::job::now_ms();
        }
        self.sink.send_all(&std::mem::take(&mut self.held))?;
        Ok(CheckpointStats { id, dirty_keys: in_flight.dirty_keys, bytes, sync: in_flight.sync, snapshot, to_commit })
    }

    /// The tier of the code the guest runs.
    pub fn code(&self) -> runtime::Tier {
        self.module.tier()
    }

    /// Moves the guest to its module's optimized code once that is ready
    /// ([`crate::runtime::Tier`]); returns whether it moved. Between
    /// batches, so the guest holds nothing its state does not.
    pub fn adopt_optimized_code(&mut self, runtime: &Runtime) -> Result<bool, TaskError> {
        let module = runtime.upgrade_tier(&mut self.instance, &self.module, &self.init_config)?;
        let moved = !module.same_as(&self.module);
        self.module = module;
        Ok(moved)
    }

    /// When the first record went into the open transaction, in ms since the
    /// Unix epoch; 0 while it holds none.
    pub fn transaction_since_ms(&self) -> u64 {
        self.transaction_since_ms
    }

    /// Aborts the open transaction, so read_committed consumers are not held
    /// up by it until it times out.
    pub fn abort(&self) -> Result<(), TaskError> {
        Ok(self.sink.abort()?)
    }
}

#[cfg(test)]
mod tests {
    use super::{Header, OutputRecord, Outputs, TaskError, fit_letter, held_too_much, letter_bytes, superseded};

    /// A shard committed by a newer module generation is refused, naming
    /// the shard; an older or equal one (or none: never upgraded) is not.
    #[test]
    fn only_a_newer_generations_shard_is_superseded() {
        let mut committed = crate::kafka::Committed::default();
        committed.migrated.insert(1, 1);
        committed.migrated.insert(2, 3);
        assert_eq!(superseded(&committed, &[0, 1], 0), Some((1, 1)), "generation 1 over a task of 0");
        assert_eq!(superseded(&committed, &[0, 1], 1), None, "the same generation");
        assert_eq!(superseded(&committed, &[0, 1, 2], 2), Some((2, 3)), "a rollback's generation over 2");
        assert_eq!(superseded(&committed, &[0], 0), None, "never upgraded");
        let error = TaskError::Superseded { shard: 2, committed: 3, ours: 2, member: true };
        assert!(error.is_retryable(), "a member waits to catch up");
        assert!(error.to_string().contains("shard 2"), "{error}");
        assert!(
            !TaskError::Superseded { shard: 2, committed: 3, ours: 2, member: false }.is_retryable(),
            "a lone host does not"
        );
    }

    /// Outputs held back while a checkpoint is in flight are bounded by
    /// their bytes as well as their number: a few large records stop the
    /// task as surely as many small ones.
    #[test]
    fn held_outputs_are_bounded_by_bytes_too() {
        let record =
            |bytes: usize| OutputRecord { key: None, value: Some(vec![0; bytes]), headers: vec![], topic: None };
        let few_large = Outputs::from_records((0..4).map(|_| record(1 << 20)).collect());
        assert!(few_large.bytes() >= 4 << 20);
        assert!(held_too_much(&few_large, 4 << 20), "4 MiB held under a 4 MiB bound");
        assert!(!held_too_much(&few_large, 8 << 20));
        let many_small = Outputs::from_records((0..100_000).map(|_| record(0)).collect());
        assert!(held_too_much(&many_small, usize::MAX), "the count still bounds");
    }

    fn letter(key: usize, value: usize, theirs: usize) -> OutputRecord {
        let mut headers: Vec<Header> =
            (0..theirs).map(|i| Header { key: format!("h{i}"), value: vec![b'h'; 100] }).collect();
        headers.push(Header { key: "sluice.error".into(), value: b"poison record at offset 7".to_vec() });
        OutputRecord { key: Some(vec![b'k'; key]), value: Some(vec![b'v'; value]), headers, topic: Some("dlq".into()) }
    }

    fn note(letter: &OutputRecord) -> Option<String> {
        letter.headers.iter().find(|h| h.key == "sluice.truncated").map(|h| String::from_utf8_lossy(&h.value).into())
    }

    /// A dead letter over its room loses what it must, value first, then
    /// key, then the record's own headers, keeps the `sluice.*` headers,
    /// and says what was cut; one that fits is left alone.
    #[test]
    fn a_dead_letter_is_cut_to_its_room_value_first() {
        let mut fits = letter(10, 100, 2);
        fit_letter(&mut fits, 10_000);
        assert_eq!((fits.value.as_ref().map(Vec::len), note(&fits)), (Some(100), None));

        let mut big = letter(10, 5_000, 2);
        fit_letter(&mut big, 1_000);
        assert!(letter_bytes(&big) <= 1_000, "{}", letter_bytes(&big));
        assert_eq!(big.key.as_ref().map(Vec::len), Some(10), "the key stays while the value can give");
        assert_eq!(note(&big).as_deref(), Some("value=5000"));
        assert_eq!(big.headers.iter().filter(|h| h.key.starts_with('h')).count(), 2);

        let mut huge_key = letter(3_000, 5_000, 2);
        fit_letter(&mut huge_key, 1_000);
        assert!(letter_bytes(&huge_key) <= 1_000, "{}", letter_bytes(&huge_key));
        assert_eq!(huge_key.value.as_ref().map(Vec::len), Some(0));
        assert_eq!(note(&huge_key).as_deref(), Some("value=5000;key=3000"));

        let mut many_headers = letter(10, 10, 50);
        fit_letter(&mut many_headers, 1_000);
        assert!(letter_bytes(&many_headers) <= 1_000, "{}", letter_bytes(&many_headers));
        assert_eq!(note(&many_headers).as_deref(), Some("value=10;key=10;headers=50"));
        assert!(many_headers.headers.iter().any(|h| h.key == "sluice.error"), "the error stays");
    }
}
