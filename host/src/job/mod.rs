//! One job: its tasks, their threads, and their restarts.
//!
//! [`Job::start`] loads the module (refusing a bad one before anything runs),
//! reads the input topics' partitions, spreads them over `parallelism` tasks
//! and starts one thread per task, under the checkpoint [`Coordinator`]. Each
//! task runs source -> transform -> sink on its own thread and takes
//! checkpoints between batches ([`crate::checkpoint`]). A task that fails
//! (trap, limit, Kafka error, fenced producer) aborts its open transaction,
//! waits (a Kafka or host failure: jittered backoff from 0.25-0.5 s doubling
//! to 15-30 s, reset by a successful checkpoint; a failure of the records
//! themselves: not at all) and recovers from the last checkpoint committed in
//! Kafka. Records that fail every time are found by replaying their batch
//! one record at a time, and the job's `errors` policy decides (see
//! `Poison`). An error that cannot fix itself (a missing topic, state that
//! disagrees with Kafka, a failing `init`, a panic) fails the job as a
//! whole: the other tasks take a final checkpoint and stop, and
//! [`Job::join`] returns the reason.
//!
//! A process may run only some of the job's tasks (`JobConfig::run_tasks`:
//! in a cluster, those whose slots it owns), and a task can leave or join
//! it while the others run on ([`Job::release`], [`Job::take`]).

mod history;
mod quiet;
mod rescale;
mod spec;

use std::collections::{BTreeMap, HashMap, HashSet};

use backon::{BackoffBuilder as _, ExponentialBuilder};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use history::{CHECKPOINTS_KEPT, CheckpointEntry, FailureEntry, History, RecordRef};
pub use rescale::{Settled, settle};
pub use spec::{
    CheckpointSpec, ErrorPolicy, ErrorPolicyName, ErrorsSpec, InputSpec, JobConfig, JobSpec, LimitsSpec, OutputSpec,
    Placement, SpecError, StateSpec, TimeSpec, TransformSpec,
};

use crate::checkpoint::{self, Coordinator, TaskError, TaskSetup};
use crate::kafka;
use crate::record::{InputRecord, Outputs};
use crate::runtime::{self, Module, Runtime};

/// An error that keeps a job from starting, or ended it.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The module did not load.
    #[error("module {}: {error}", path.display())]
    Module {
        /// The module file.
        path: std::path::PathBuf,
        /// Why.
        error: runtime::Error,
    },
    /// Kafka refused or could not be reached at start.
    #[error(transparent)]
    Kafka(#[from] kafka::Error),
    /// The input cannot be spread over tasks (topics not co-partitioned),
    /// or the record of how it was spread is unreadable.
    #[error("{0}")]
    Assignment(String),
    /// The job's state could not be brought to its tasks.
    #[error(transparent)]
    State(#[from] checkpoint::StoreError),
    /// A task failed with an error that restarting cannot fix.
    #[error("task {task} failed: {error}")]
    Task {
        /// The task index.
        task: usize,
        /// Why.
        error: TaskError,
    },
    /// A task thread panicked (a host bug).
    #[error("task {0} panicked")]
    Panicked(usize),
}

impl JobError {
    /// Whether starting the job again may succeed: a broker that cannot be
    /// reached, or a module file the host cannot read now (too many open
    /// files), may come good; a module that does not compile, a missing
    /// topic or input that cannot be spread will not. The same rules as a
    /// task's restarts ([`TaskError::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        match self {
            JobError::Module { error, .. } => error.is_retryable(),
            JobError::Kafka(e) => e.is_retryable(),
            JobError::State(e) => e.is_retryable(),
            JobError::Task { error, .. } => error.is_retryable(),
            JobError::Assignment(_) | JobError::Panicked(_) => false,
        }
    }
}

/// What a task is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskPhase {
    /// Recovering from the last checkpoint (first start or a restart).
    Starting,
    /// Processing records.
    Running,
    /// Failed; waiting out its backoff before the next attempt.
    Restarting,
    /// Failed with an error that restarting cannot fix.
    Failed,
    /// Stopped after its final checkpoint.
    Stopped,
    /// No input for the job's `input.sleep-after`: it holds no Kafka client
    /// and no guest instance until a record arrives (or a heartbeat or a
    /// processing-time timer is due), then restarts from its last
    /// checkpoint. Its job is running.
    Sleeping,
}

impl TaskPhase {
    const ALL: [TaskPhase; 6] = [
        TaskPhase::Starting,
        TaskPhase::Running,
        TaskPhase::Restarting,
        TaskPhase::Failed,
        TaskPhase::Stopped,
        TaskPhase::Sleeping,
    ];
}

/// Live figures of one task, updated by its thread.
#[derive(Debug, Default)]
pub struct TaskStatus {
    /// The shards (input partition numbers) the task holds.
    shards: std::sync::Mutex<Vec<u32>>,
    /// Input records processed (including records replayed after a restart).
    pub records_in: AtomicU64,
    /// Output records sent (including ones in aborted transactions).
    pub records_out: AtomicU64,
    /// The last checkpoint committed in Kafka.
    pub last_checkpoint: AtomicU64,
    /// Checkpoints committed.
    pub checkpoints: AtomicU64,
    /// Restarts after a failure.
    pub restarts: AtomicU64,
    /// Records set aside to the dead-letter topic (counted when sent; an
    /// epoch that is then aborted sends them again).
    pub dead_letters: AtomicU64,
    /// Duration of the last checkpoint, in microseconds.
    pub last_checkpoint_micros: AtomicU64,
    /// When the last checkpoint committed, in ms since the Unix epoch.
    pub last_checkpoint_at_ms: AtomicU64,
    /// When the first record went into the open transaction, in ms since
    /// the Unix epoch; 0 while none holds records (an empty transaction
    /// exists only in the client and holds no reader back).
    pub transaction_since_ms: AtomicU64,
    /// The tier of the code the task's guest runs: 0 before it started,
    /// else 1 + [`runtime::Tier`] as `u8` (see [`TaskStatus::code`]).
    code: std::sync::atomic::AtomicU8,
    /// The `transaction_since_ms` of the last transaction the host fenced
    /// as stale, so the same transaction is not fenced twice.
    pub fenced_since_ms: AtomicU64,
    /// CPU time of the task's thread (guest and host work), in microseconds.
    pub cpu_micros: AtomicU64,
    /// Input records not read yet, as of the last reading.
    pub lag_records: AtomicU64,
    /// Bytes of state, when the job limits it.
    pub state_bytes: AtomicU64,
    /// Changelog records read to restore shards, since the job started.
    pub restored_records: AtomicU64,
    /// Bytes of their keys and values.
    pub restored_bytes: AtomicU64,
    /// Time spent restoring, in microseconds.
    pub restore_micros: AtomicU64,
    /// Records at or below their shard's watermark when they were processed
    /// (replays count again).
    pub late_records: AtomicU64,
    /// Timers fired (firings in aborted epochs count too).
    pub timers_fired: AtomicU64,
    /// Its recent checkpoints and failures.
    pub history: History,
    /// Late records per shard (their sum is `late_records`).
    late_by_shard: std::sync::Mutex<BTreeMap<u32, u64>>,
    /// Each input partition's lag, as last read (every few seconds).
    pub partition_lag: std::sync::Mutex<Vec<crate::kafka::PartitionLag>>,
    shard_figures: std::sync::Mutex<BTreeMap<u32, ShardFigures>>,
    phase: std::sync::atomic::AtomicU8,
    last_error: std::sync::Mutex<Option<String>>,
}

/// One shard's figures, as its task last saw them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShardFigures {
    /// Where its state came from when the task last started.
    pub origin: checkpoint::ShardOrigin,
    /// Keys and bytes of its committed state.
    pub size: checkpoint::ShardSize,
    /// Its last committed checkpoint.
    pub last_checkpoint: Option<u64>,
    /// Its watermark (ms since the Unix epoch), for a module that uses event
    /// time and once it has one.
    pub watermark: Option<i64>,
    /// Its records that were late (at or below its watermark) since the
    /// task started here (replays count again).
    pub late_records: u64,
}

impl TaskStatus {
    /// The shards (input partition numbers) the task holds.
    pub fn shards(&self) -> Vec<u32> {
        self.shards.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The tier of the code the task's guest runs, once it started.
    pub fn code(&self) -> Option<crate::runtime::Tier> {
        match self.code.load(Ordering::Relaxed) {
            1 => Some(crate::runtime::Tier::Baseline),
            2 => Some(crate::runtime::Tier::Optimized),
            _ => None,
        }
    }

    fn set_code(&self, tier: crate::runtime::Tier) {
        let code = match tier {
            crate::runtime::Tier::Baseline => 1,
            crate::runtime::Tier::Optimized => 2,
        };
        self.code.store(code, Ordering::Relaxed);
    }

    /// Each of the task's shards' figures.
    pub fn shard_figures(&self) -> BTreeMap<u32, ShardFigures> {
        self.shard_figures.lock().map(|f| f.clone()).unwrap_or_default()
    }

    /// Counts late records, per shard.
    fn note_late(&self, late: &BTreeMap<u32, u64>) {
        self.late_records.fetch_add(late.values().sum(), Ordering::Relaxed);
        if let Ok(mut by_shard) = self.late_by_shard.lock() {
            for (&shard, &n) in late {
                *by_shard.entry(shard).or_default() += n;
            }
        }
    }

    /// Takes a pipeline's per-shard figures.
    fn note_shards(&self, p: &checkpoint::Pipeline) {
        let watermarks = p.instance.watermarks().unwrap_or_default();
        let late = self.late_by_shard.lock().map(|l| l.clone()).unwrap_or_default();
        let figures = p
            .origins()
            .iter()
            .map(|(&shard, &origin)| {
                let size = p.shard_sizes().get(&shard).copied().unwrap_or_default();
                let last_checkpoint = p.shard_checkpoints().get(&shard).copied().flatten();
                let watermark = watermarks.get(&shard).copied().flatten();
                let late_records = late.get(&shard).copied().unwrap_or(0);
                (shard, ShardFigures { origin, size, last_checkpoint, watermark, late_records })
            })
            .collect();
        if let Ok(mut mine) = self.shard_figures.lock() {
            *mine = figures;
        }
        if let Ok(mut shards) = self.shards.lock() {
            *shards = p.origins().keys().copied().collect();
        }
    }

    /// Shows no shards: the task left them to another member.
    fn forget_shards(&self) {
        if let Ok(mut mine) = self.shard_figures.lock() {
            mine.clear();
        }
        if let Ok(mut shards) = self.shards.lock() {
            shards.clear();
        }
    }

    /// What the task is doing.
    pub fn phase(&self) -> TaskPhase {
        TaskPhase::ALL.get(usize::from(self.phase.load(Ordering::Relaxed))).copied().unwrap_or(TaskPhase::Starting)
    }

    /// The last failure, if the task ever failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().map(|e| e.clone()).unwrap_or_default()
    }

    fn set_phase(&self, phase: TaskPhase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    fn fail(&self, phase: TaskPhase, error: &TaskError) {
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(error.to_string());
        }
        self.history.failure(now_ms(), phase == TaskPhase::Restarting, error.to_string());
        self.transaction_since_ms.store(0, Ordering::Relaxed);
        self.set_phase(phase);
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A running job.
pub struct Job {
    config: Arc<JobConfig>,
    /// Set to stop every task of the job (a stop, or a task's permanent
    /// failure).
    stop: Arc<JobStop>,
    coordinator: Arc<Coordinator>,
    /// What starting one of its tasks takes besides the index.
    kit: Box<TaskKit>,
    /// The threads of the tasks this process runs, or is releasing.
    tasks: Vec<TaskThread>,
    /// One per task of the job, run here or not.
    status: Arc<Vec<TaskStatus>>,
}

/// A job's stop: a flag its tasks look at between batches, and an alarm
/// per task, which also wakes a sleeping task (see [`TaskRunner::sleep_until_input`]).
struct JobStop {
    flag: AtomicBool,
    alarms: Vec<Arc<kafka::Alarm>>,
}

impl JobStop {
    fn new(tasks: usize) -> JobStop {
        JobStop { flag: AtomicBool::new(false), alarms: (0..tasks).map(|_| Arc::default()).collect() }
    }

    /// Stops every task, asleep or awake.
    fn set(&self) {
        self.flag.store(true, Ordering::SeqCst);
        for alarm in &self.alarms {
            alarm.ring();
        }
    }

    fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// What task `index` sleeps on.
    fn alarm(&self, index: usize) -> Option<&Arc<kafka::Alarm>> {
        self.alarms.get(index)
    }
}

/// What every task of a job is started from.
struct TaskKit {
    kafka: rdkafka::ClientConfig,
    runtime: Arc<Runtime>,
    module: Module,
    /// Each task's input partitions.
    assignment: Vec<Vec<(String, i32)>>,
    /// All of the job's input partitions.
    partitions: Vec<(String, i32)>,
    /// The host's shared clients, when they have the job's configuration.
    clients: Option<Arc<kafka::Clients>>,
    /// How many shards the job has.
    shards: usize,
}

/// One task's thread in this process.
struct TaskThread {
    index: usize,
    /// Set when the task leaves this process while the job runs on (in a
    /// cluster, its slot moved to another member): it takes a final
    /// checkpoint and ends, and how it ends is not the job's failure.
    released: Arc<AtomicBool>,
    handle: JoinHandle<Result<(), TaskError>>,
}

impl TaskThread {
    fn is_released(&self) -> bool {
        self.released.load(Ordering::Relaxed)
    }
}

/// Timeout of Kafka calls made by tasks.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a task waits for input before checking for a barrier or a stop.
const POLL_WAIT: Duration = Duration::from_millis(20);
/// The longest wait for input of a task that has nothing to checkpoint: an
/// idle task wakes twice a second, not fifty times, so a host holds many
/// idle jobs cheaply. Input that arrives ends the wait at once.
const IDLE_POLL_WAIT: Duration = Duration::from_millis(500);
/// How often a task reads its CPU time and lag.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

impl Job {
    /// Loads the module, reads the partitions and starts the tasks.
    pub fn start(config: JobConfig, runtime: Arc<Runtime>) -> Result<Job, JobError> {
        Job::start_with(config, runtime, None)
    }

    /// [`start`](Self::start), reading the topics' metadata (and, in the
    /// tasks, creating the changelog topic) through `clients` when they have
    /// the job's client configuration, instead of through clients made for
    /// the purpose.
    pub fn start_with(
        config: JobConfig,
        runtime: Arc<Runtime>,
        clients: Option<Arc<kafka::Clients>>,
    ) -> Result<Job, JobError> {
        let module = load_module(&runtime, &config)?;
        let kafka_config = kafka::client_config(&config.brokers, &config.kafka);
        let shared = clients.filter(|shared| shared.serves(&kafka_config));
        let clients = kafka::Clients::shared_or_new(shared.as_ref(), &kafka_config)?;
        let partitions = clients.partitions(&config.input_topics, &config.brokers, Duration::from_secs(15))?;
        // An output or dead-letter topic that does not exist would only
        // show at the first write there, and a broker that creates topics
        // on demand (Kafka's default) would make it with its own defaults.
        clients.partitions(&config.sink_topics(), &config.brokers, Duration::from_secs(15))?;
        let assignment = assign_shards(&config.input_topics, &partitions, config.parallelism)?;
        let tasks = assignment.len();
        if tasks < config.parallelism {
            tracing::warn!(
                job = %config.scope,
                "parallelism {} is more than the {tasks} shards (input partitions); running {tasks} tasks",
                config.parallelism,
            );
        }
        // The changelog topic, if new, is created by the tasks as they
        // recover: its creation is a round trip to the controller, which
        // the call that starts the job does not wait for.
        let shards = partitions.iter().filter(|(t, _)| Some(t) == config.input_topics.first()).count();
        rescale::settle(&config, &kafka_config, &partitions, &assignment, KAFKA_TIMEOUT)?;
        let config = Arc::new(config);
        let stop = Arc::new(JobStop::new(tasks));
        let coordinator = Arc::new(Coordinator::new(config.checkpoint_interval));
        let status: Arc<Vec<TaskStatus>> = Arc::new(
            assignment
                .iter()
                .map(|mine| TaskStatus {
                    // A member learns its shards from the group.
                    shards: std::sync::Mutex::new(match config.group_members {
                        true => Vec::new(),
                        false => checkpoint::shard_numbers(mine),
                    }),
                    ..TaskStatus::default()
                })
                .collect(),
        );
        let kit =
            Box::new(TaskKit { kafka: kafka_config, runtime, module, assignment, partitions, clients: shared, shards });
        let mut job = Job { config, stop, coordinator, kit, tasks: Vec::with_capacity(tasks), status };
        for index in 0..tasks {
            if job.config.run_tasks.as_ref().is_none_or(|here| here.contains(&index)) {
                match job.spawn(index) {
                    Ok(thread) => job.tasks.push(thread),
                    Err(e) => {
                        // The tasks started so far must not run on unowned.
                        job.stop();
                        let _ = job.join();
                        return Err(e);
                    }
                }
            }
        }
        tracing::info!(job = %job.config.scope, tasks, partitions = job.kit.partitions.len(), "job started");
        Ok(job)
    }

    /// Starts task `index`'s thread.
    fn spawn(&self, index: usize) -> Result<TaskThread, JobError> {
        let config = &self.config;
        let setup = TaskSetup {
            name: config.task_name(index),
            kafka: self.kit.kafka.clone(),
            group: config.group(),
            transactional_id: config.transactional_id(index),
            partitions: match config.group_members {
                true => self.kit.partitions.clone(),
                false => self.kit.assignment[index].clone(),
            },
            member: config.group_members,
            start: config.start,
            output_topics: config.output_topics.clone(),
            store_path: task_store_path(&config.state_dir, index),
            runtime: Arc::clone(&self.kit.runtime),
            module: self.kit.module.clone(),
            limits: config.limits,
            config: config.transform_config.clone(),
            kafka_timeout: KAFKA_TIMEOUT,
            migrate_from: config.migrate_from.clone(),
            heartbeat: config.heartbeat,
            dead_letter_topic: config.errors.dead_letter_topic().map(str::to_owned),
            changelog: config.changelog.clone(),
            shards: self.kit.shards,
            clients: self.kit.clients.clone(),
            time: config.time,
            incarnation: config.incarnation,
        };
        let released = Arc::new(AtomicBool::new(false));
        let task = TaskRunner {
            setup,
            job: config.scope.clone(),
            errors: config.errors.clone(),
            attempts: config.attempts,
            index,
            batch_size: config.batch_size,
            sleep_after: config.sleep_after,
            coordinator: Arc::clone(&self.coordinator),
            stop: Arc::clone(&self.stop),
            released: Arc::clone(&released),
            status: Arc::clone(&self.status),
        };
        let handle = std::thread::Builder::new()
            .name(format!("sluice-task-{index}"))
            .spawn(move || task.run_catching_panics())
            .map_err(|e| JobError::Task {
                task: index,
                error: TaskError::Runtime(runtime::Error::internal("starting the task's thread", e)),
            })?;
        Ok(TaskThread { index, released, handle })
    }

    /// Starts task `index` in this process while the job runs (in a
    /// cluster, its slot moved here); the tasks already running go on
    /// untouched. `Ok(false)` while an earlier thread of the task here is
    /// still taking its final checkpoint: ask again once
    /// [`reap_released`](Self::reap_released) returned it. A task beyond the
    /// job's shards has nothing to run.
    pub fn take(&mut self, index: usize) -> Result<bool, JobError> {
        if let Some(thread) = self.tasks.iter().find(|t| t.index == index) {
            return Ok(!thread.is_released());
        }
        if index >= self.kit.assignment.len() || self.stop.is_set() {
            return Ok(true);
        }
        let thread = self.spawn(index)?;
        self.tasks.push(thread);
        Ok(true)
    }

    /// Asks task `index` to take a final checkpoint and leave this process
    /// while the job's other tasks here run on (in a cluster, its slot
    /// moved away). It shows in the status until it ended.
    pub fn release(&mut self, index: usize) {
        for thread in self.tasks.iter().filter(|t| t.index == index) {
            thread.released.store(true, Ordering::Relaxed);
        }
        if let Some(alarm) = self.stop.alarm(index) {
            alarm.ring();
        }
    }

    /// Joins the released tasks that ended; returns how each ended.
    pub fn reap_released(&mut self) -> Vec<(usize, Result<(), JobError>)> {
        let (ended, running): (Vec<TaskThread>, Vec<TaskThread>) =
            std::mem::take(&mut self.tasks).into_iter().partition(|t| t.is_released() && t.handle.is_finished());
        self.tasks = running;
        ended.into_iter().map(|thread| (thread.index, thread.join())).collect()
    }

    /// The job's configuration.
    pub fn config(&self) -> &JobConfig {
        &self.config
    }

    /// Live figures per task of the job (those of tasks run elsewhere stay
    /// at their defaults: see [`runs`](Self::runs)).
    pub fn status(&self) -> &[TaskStatus] {
        &self.status
    }

    /// Whether this process runs task `index`.
    pub fn runs(&self, index: usize) -> bool {
        self.tasks.iter().any(|t| t.index == index)
    }

    /// The figures of the tasks this process runs, with their indexes.
    pub fn local_status(&self) -> impl Iterator<Item = (usize, &TaskStatus)> {
        self.status.iter().enumerate().filter(|(i, _)| self.runs(*i))
    }

    /// Asks every task to take a final checkpoint and stop.
    pub fn stop(&self) {
        self.stop.set();
    }

    /// Whether every task thread has ended.
    pub fn is_finished(&self) -> bool {
        // A process that runs none of the job's tasks (a member whose slots
        // hold only tasks beyond the job's shards, or whose tasks were all
        // released) holds it until stopped.
        self.tasks.iter().all(|t| t.handle.is_finished())
            && (self.stop.is_set() || self.tasks.iter().any(|t| !t.is_released()))
    }

    /// Waits for every task to end; the first permanent failure, if any (a
    /// released task's is not the job's).
    pub fn join(self) -> Result<(), JobError> {
        let mut first = Ok(());
        for thread in self.tasks {
            let (index, released) = (thread.index, thread.is_released());
            let result = thread.join();
            match result {
                Err(e) if released => {
                    tracing::info!(job = %self.config.scope, task = index, "released task ended: {e}")
                }
                Err(e) if first.is_ok() => first = Err(e),
                _ => {}
            }
        }
        first
    }
}

impl TaskThread {
    fn join(self) -> Result<(), JobError> {
        match self.handle.join() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(JobError::Task { task: self.index, error }),
            Err(_) => Err(JobError::Panicked(self.index)),
        }
    }
}

/// One task's thread: attempts with restarts.
struct TaskRunner {
    setup: TaskSetup,
    /// The job's scope, for dead letters' headers.
    job: String,
    /// What happens to a record that fails every time.
    errors: ErrorPolicy,
    /// Tries of a failing record before `errors` applies.
    attempts: u32,
    index: usize,
    batch_size: usize,
    /// How long the task goes without input before it sleeps (`None`: never).
    sleep_after: Option<Duration>,
    coordinator: Arc<Coordinator>,
    /// The job's stop: set by a stop, and by this task when it fails for
    /// good (the job stops as a whole).
    stop: Arc<JobStop>,
    /// This task's own stop: it leaves this process, the job runs on.
    released: Arc<AtomicBool>,
    status: Arc<Vec<TaskStatus>>,
}

impl TaskRunner {
    fn stopping(&self) -> bool {
        self.stop.is_set() || self.released.load(Ordering::Relaxed)
    }

    fn status(&self) -> &TaskStatus {
        &self.status[self.index]
    }

    /// [`run`](Self::run), with a panic (a host bug, or a library that
    /// panics on hostile input) turned into a failure of the whole job with
    /// the panic's message, rather than a thread that silently vanished.
    fn run_catching_panics(self) -> Result<(), TaskError> {
        let (status, stop) = (Arc::clone(&self.status), Arc::clone(&self.stop));
        let (index, name) = (self.index, self.setup.name.clone());
        let (kafka, transactional_id) = (self.setup.kafka.clone(), self.setup.transactional_id.clone());
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run())) {
            Ok(result) => result,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                let error = TaskError::Panicked(message);
                tracing::error!(task = %name, "task failed and will not restart: {error}");
                status[index].fail(TaskPhase::Failed, &error);
                stop.set();
                // Whatever transaction the task had open must not hold
                // read_committed readers back until it times out.
                if let Err(e) = kafka::Sink::fence(&kafka, &transactional_id, KAFKA_TIMEOUT) {
                    tracing::warn!(task = %name, "cannot abort the failed epoch's transaction: {e}");
                }
                Err(error)
            }
        }
    }

    fn run(self) -> Result<(), TaskError> {
        // Jittered, so that the tasks of many jobs do not all come back at
        // once after a broker outage. backon adds up to the delay again as
        // jitter: 0.25-0.5 s at first, doubling to 15-30 s.
        let backoffs = || {
            ExponentialBuilder::new()
                .with_min_delay(Duration::from_millis(250))
                .with_max_delay(Duration::from_secs(15))
                .with_factor(2.0)
                .with_jitter()
                .without_max_times()
                .build()
        };
        let mut backoff = backoffs();
        // Replays of records that failed (to find and set aside the one that
        // fails) back off too, from the last checkpoint that committed: each
        // is a whole recovery, which loads the shared broker.
        let mut replays = replay_backoff();
        let mut attempt = 0u64;
        let mut poison = Poison::default();
        let mut precautions = checkpoint::Precautions::default();
        // The timer whose firing failed last, and how often in a row.
        let mut timer_failures: Option<(checkpoint::FailedTimer, u32)> = None;
        // A member's consumer stays in the job's group across attempts: a
        // restart here must not move the job's partitions elsewhere.
        let mut member = None;
        // After a sleep: when the task last committed, which the next
        // attempt's heartbeat counts from.
        let mut woke: Option<Instant> = None;
        loop {
            if self.stopping() {
                return Ok(());
            }
            let mut progressed = false;
            // A task that wakes stays `sleeping` until it runs: its job
            // never looked stopped or starting.
            if woke.is_none() {
                self.status().set_phase(TaskPhase::Starting);
            }
            let result = self.attempt(attempt, precautions, &mut member, &mut progressed, &mut poison, woke.take());
            if progressed {
                replays = replay_backoff();
            }
            let result = result.map_err(|e| self.bound_timer_failures(e, &mut timer_failures, &mut precautions));
            match result {
                Ok(Ended::Stopped) => {
                    self.status().set_phase(TaskPhase::Stopped);
                    return Ok(());
                }
                Ok(Ended::Asleep(rest)) => {
                    self.status().set_phase(TaskPhase::Sleeping);
                    if !self.sleep_until_input(&rest) {
                        tracing::info!(task = %self.setup.name, "task stopped while asleep, after its last checkpoint");
                        self.status().set_phase(TaskPhase::Stopped);
                        return Ok(());
                    }
                    woke = Some(rest.committed_at);
                    attempt += 1;
                }
                Err(TaskError::Stopped) => {
                    tracing::info!(task = %self.setup.name, "task stopped while it recovered");
                    self.status().set_phase(TaskPhase::Stopped);
                    return Ok(());
                }
                Ok(Ended::Reassigned) => {
                    tracing::info!(task = %self.setup.name, "the group changed the task's partitions; it recovers its shards anew");
                    attempt += 1;
                }
                Err(e) if !e.is_retryable() => {
                    // The job fails as a whole, as Flink's does: the other
                    // tasks take a final checkpoint and stop, rather than
                    // running on with part of the input stalled.
                    tracing::error!(task = %self.setup.name, "task failed and will not restart; stopping the job: {e}");
                    self.status().fail(TaskPhase::Failed, &e);
                    self.stop.set();
                    return Err(e);
                }
                Err(e) => {
                    if progressed {
                        backoff = backoffs();
                    }
                    if e.is_held_state_failure() {
                        // The write that failed cannot be pinned on its
                        // record; without holding it fails in that record's
                        // batch, where the errors policy finds it. For the
                        // rest of the task's life: it costs some speed, not
                        // correctness.
                        tracing::warn!(
                            task = %self.setup.name,
                            "the guest's held state could not be handed over; the task's next attempts write state back after every batch"
                        );
                        precautions.holding = checkpoint::Holding::Forbidden;
                    }
                    // A failure of the records themselves (see `Poison`) is
                    // replayed at once: waiting would not change it, and the
                    // replay is what finds and sets aside the bad record.
                    let delay = match e.is_deterministic() {
                        true => replays.next().unwrap_or(REPLAY_BACKOFF_MOST),
                        false => backoff.next().unwrap_or(Duration::from_secs(30)),
                    };
                    let hint = match &e {
                        TaskError::Kafka(k) if k.is_fenced() => {
                            " (another producer took over this task's transactional id: is a second process running this job?)"
                        }
                        _ => "",
                    };
                    tracing::warn!(
                        task = %self.setup.name,
                        attempt,
                        "task failed; restarting from the last committed checkpoint in {delay:.1?}: {e}{hint}"
                    );
                    self.status().restarts.fetch_add(1, Ordering::Relaxed);
                    self.status().fail(TaskPhase::Restarting, &e);
                    self.sleep(delay);
                    attempt += 1;
                }
            }
        }
    }

    /// Counts a failure of firing timers against the timer that failed
    /// (timers then fire one per call, so the next failure names it); once
    /// the same timer has failed `attempts` times in a row, the failure is
    /// [`TaskError::TimerFailed`], which fails the job naming it, rather than
    /// a restart for ever. Other failures pass unchanged.
    fn bound_timer_failures(
        &self,
        e: TaskError,
        failures: &mut Option<(checkpoint::FailedTimer, u32)>,
        precautions: &mut checkpoint::Precautions,
    ) -> TaskError {
        let Some(timer) = e.failed_timer().cloned() else { return e };
        precautions.one_timer_per_call = true;
        let count = match failures.take() {
            Some((last, count)) if last == timer => count + 1,
            _ => 1,
        };
        if count < self.attempts {
            *failures = Some((timer, count));
            return e;
        }
        let reason = match &e {
            TaskError::Timers { source, .. } => source.to_string(),
            other => other.to_string(),
        };
        TaskError::TimerFailed { timer, attempts: count, reason }
    }

    fn sleep(&self, duration: Duration) {
        let step = Duration::from_millis(50);
        let mut slept = Duration::ZERO;
        while slept < duration && !self.stopping() {
            std::thread::sleep(step);
            slept += step;
        }
    }

    /// One life of the task: recover, then process and checkpoint until
    /// stopped or failed. On failure the open transaction is aborted.
    fn attempt(
        &self,
        attempt: u64,
        precautions: checkpoint::Precautions,
        member: &mut Option<kafka::Source>,
        progressed: &mut bool,
        poison: &mut Poison,
        woke: Option<Instant>,
    ) -> Result<Ended, TaskError> {
        let input = match self.setup.member {
            false => checkpoint::Input::Fixed,
            true => match self.join_with_whole_shards(member.take())? {
                Some(input) => input,
                None => return Ok(Ended::Stopped),
            },
        };
        let stopping = || self.stopping();
        let mut pipeline = checkpoint::recover(&self.setup, input, attempt, precautions, &stopping)?;
        if let Some(committed_at) = woke {
            pipeline.committed_at(committed_at);
        }
        let status = self.status();
        for origin in pipeline.origins().values() {
            if let checkpoint::ShardOrigin::Changelog { records, bytes, seconds } = *origin {
                status.restored_records.fetch_add(records, Ordering::Relaxed);
                status.restored_bytes.fetch_add(bytes, Ordering::Relaxed);
                status.restore_micros.fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
            }
        }
        status.note_shards(&pipeline);
        status.set_code(pipeline.code());
        status.set_phase(TaskPhase::Running);
        let result = self.process(&mut pipeline, progressed, poison);
        status.transaction_since_ms.store(0, Ordering::Relaxed);
        if let (Err(e), Some(id)) = (&result, pipeline.checkpoint_in_flight_id()) {
            status.history.checkpoint(CheckpointEntry::failed(id, now_ms(), e.to_string()));
        }
        // A member that lost or gained a shard goes back to its last
        // checkpoint too: a clean epoch boundary for every shard. A task
        // that stopped or fell asleep has committed all it did.
        let stopped = matches!(result, Ok(Ended::Stopped | Ended::Asleep(_)));
        if !stopped && let Err(e) = pipeline.abort() {
            tracing::debug!(task = %self.setup.name, "aborting the failed epoch's transaction: {e}");
            // The next attempt's recovery aborts it too, but a task that will
            // not restart soon must not leave read_committed readers waiting.
            if let Err(e) = kafka::Sink::fence(&self.setup.kafka, &self.setup.transactional_id, KAFKA_TIMEOUT) {
                tracing::warn!(task = %self.setup.name, "cannot abort the failed epoch's transaction: {e}");
            }
        }
        if self.setup.member && !stopped {
            *member = Some(pipeline.into_source());
        }
        result
    }

    /// For a member of the job's group: its consumer (joining the group if
    /// `source` is none), once Kafka assigned it at least one whole shard,
    /// with the partitions of its whole shards; none if the task stops
    /// first. A shard assigned in part waits: the group is moving it, and
    /// its other partitions are still read elsewhere.
    fn join_with_whole_shards(&self, source: Option<kafka::Source>) -> Result<Option<checkpoint::Input>, TaskError> {
        let source = match source {
            Some(source) => source,
            None => {
                let config = self.setup.budget().consumer(&self.setup.kafka);
                kafka::Source::join(&config, &self.setup.group, self.setup.start, &self.setup.input_topics())?
            }
        };
        loop {
            if self.stopping() {
                return Ok(None);
            }
            let whole = whole_shards(&source.assigned()?, &self.setup.partitions);
            if !whole.is_empty() {
                return Ok(Some(checkpoint::Input::Member { source, partitions: whole }));
            }
            source.serve_group(MEMBER_WAIT)?;
        }
    }

    /// Whether the task may sleep now, after `after` without input: with
    /// the host's input watch, until when at the latest, and what else it
    /// watches. Not without the host's clients (a job with Kafka properties
    /// of its own, or `sluice run`), not while an event-time timer waits
    /// (the watermark of an idle partition moves without input). It wakes
    /// for its heartbeat or its first processing-time timer.
    ///
    /// A member of the job's group (in a cluster) that holds every shard of
    /// the job hands nothing to another member by leaving the group; when it
    /// wakes it joins again and recovers as a member that starts does. One
    /// that holds less would hand its shards to the others: it sleeps only
    /// once the rest of the job has been idle for `after` too (`others`,
    /// see [`quiet`]), never while it holds the job's first shard, and
    /// never without a changelog to move its shards' state by. It
    /// then watches the others' partitions as well, from their committed
    /// offsets, so that a record anywhere in the job wakes it, and wakes for
    /// nothing else: the member that takes its shards holds more, and sleeps
    /// in its turn, and the one that holds the first shard ends up holding
    /// them all. That one sleeps as above and wakes for the whole job's
    /// heartbeat and timers; a member that left its shards would only move
    /// them back and forth (from the changelog) if it woke for them.
    fn may_sleep(
        &self,
        p: &checkpoint::Pipeline,
        after: Duration,
        others: &mut quiet::OthersQuiet,
    ) -> Result<Option<Nap>, kafka::Error> {
        let Some(clients) = self.setup.clients.as_ref() else { return Ok(None) };
        if p.instance.next_timer(crate::time::Clock::Event).is_some() {
            return Ok(None);
        }
        let held = p.source.offsets();
        let rest = if self.setup.member { not_held(&held, &self.setup.partitions) } else { Vec::new() };
        if !rest.is_empty() {
            // Without a changelog the members that stay could not recover
            // the shards it leaves them.
            if self.setup.changelog.is_none() {
                return Ok(None);
            }
            let first = self.setup.partitions.iter().map(|(_, shard)| *shard).min();
            if held.iter().any(|at| Some(at.partition) == first) {
                return Ok(None);
            }
            let now = Instant::now();
            if !others.due(now, after) {
                return Ok(None);
            }
            let committed = p.source.committed(&rest, quiet::LOOK_TIMEOUT)?;
            let offsets = rest.into_iter().map(|at| {
                let offset = committed.offsets.get(&at).copied();
                (at, offset)
            });
            let Some(also) = others.note(offsets.collect(), now, after) else { return Ok(None) };
            // Unchanged offsets may also be a member stuck on its input: not
            // idle while records wait past them.
            let partitions: Vec<(String, i32)> = also.iter().map(|at| (at.topic.clone(), at.partition)).collect();
            let ends = p.source.offsets_at(&partitions, kafka::ResetTo::Latest, quiet::LOOK_TIMEOUT)?;
            if also.iter().zip(&ends).any(|(at, &end)| !quiet::read_to(at.next_offset, end)) {
                return Ok(None);
            }
            return Ok(Some(Nap { until: None, watch: clients.input_watch()?, also }));
        }
        let mut until = p.last_commit() + self.setup.heartbeat;
        if let Some(at) = p.instance.next_timer(crate::time::Clock::Processing) {
            let in_ms = u64::try_from(at.saturating_sub(now_ms() as i64)).unwrap_or(0);
            until = until.min(Instant::now() + Duration::from_millis(in_ms));
        }
        Ok(Some(Nap { until: Some(until), watch: clients.input_watch()?, also: Vec::new() }))
    }

    /// Sleeps until a record is readable at `rest`'s positions, or until
    /// `rest.until`; false if the task is to stop instead.
    fn sleep_until_input(&self, rest: &Rest) -> bool {
        let Some(alarm) = self.stop.alarm(self.index) else { return !self.stopping() };
        // A ring from here on (input, a stop, a release) ends the wait.
        alarm.clear();
        let watch = match rest.watch.watch(&rest.positions, alarm) {
            Ok(watch) => watch,
            Err(e) => {
                // The watch ended since the task chose to sleep: it wakes.
                tracing::warn!(task = %self.setup.name, "the task wakes at once: {e}");
                return !self.stopping();
            }
        };
        if self.stopping() {
            return false;
        }
        let rung = alarm.wait_until(rest.until);
        drop(watch);
        if self.stopping() {
            return false;
        }
        let why = if rung { "a record arrived, or its input changed" } else { "its heartbeat or a timer is due" };
        tracing::info!(task = %self.setup.name, "task wakes: {why}");
        true
    }

    /// Readings that need a system call or a Kafka request: taken every few
    /// seconds, not per batch. An input partition Kafka no longer knows
    /// fails the attempt: librdkafka only logs it, and the task would wait
    /// on a deleted topic for ever; its recovery then says which is gone.
    fn sample(&self, p: &checkpoint::Pipeline) -> Result<(), TaskError> {
        let status = self.status();
        if let Ok(cpu) = cpu_time::ThreadTime::try_now() {
            status.cpu_micros.store(cpu.as_duration().as_micros() as u64, Ordering::Relaxed);
        }
        match p.source.lag(Duration::from_secs(1)) {
            Ok(lags) => {
                status.lag_records.store(lags.iter().map(|l| l.lag_records).sum(), Ordering::Relaxed);
                if let Ok(mut partitions) = status.partition_lag.lock() {
                    *partitions = lags;
                }
            }
            // Only when the topic's metadata agrees: a partition may be
            // unknown for a moment while its leader moves.
            Err(e) if e.is_unknown_topic() => match self.setup.check_input_topics(&p.source, Duration::from_secs(5)) {
                Err(gone @ kafka::Error::MissingTopic { .. }) => return Err(gone.into()),
                _ => tracing::debug!(task = %self.setup.name, "reading the lag: {e}"),
            },
            Err(e) => tracing::debug!(task = %self.setup.name, "reading the lag: {e}"),
        }
        if let Some(bytes) = p.instance.state_size() {
            status.state_bytes.store(bytes, Ordering::Relaxed);
        }
        status.note_shards(p);
        Ok(())
    }

    /// The task loop: commit a checkpoint whose snapshot is durable, process
    /// a batch, take a barrier when the coordinator asks for one. On stop, a
    /// final checkpoint covers everything processed.
    fn process(
        &self,
        p: &mut checkpoint::Pipeline,
        progressed: &mut bool,
        poison: &mut Poison,
    ) -> Result<Ended, TaskError> {
        // Checkpoint ids only grow, per task, across restarts of the task
        // and of the process. The coordinator's count starts again at 0 in
        // a new process, so "a checkpoint is due" compares its count with
        // the last count this task acted on, never with the last id: after
        // a restart at checkpoint 57 the next one is due at the next tick,
        // not 57 ticks later.
        let mut last_id = p.last_committed().unwrap_or(0);
        let mut requests_seen = 0u64;
        let mut records_in_epoch = 0usize;
        let mut next_sample = Instant::now();
        let mut idle_wait = POLL_WAIT;
        // The last input, timer or commit: what `sleep_after` counts from.
        let mut last_activity = Instant::now();
        // For a member holding part of its job: whether the rest is idle too.
        let mut others = quiet::OthersQuiet::default();
        loop {
            let stopping = self.stopping();
            if Instant::now() >= next_sample {
                self.sample(p)?;
                next_sample = Instant::now() + SAMPLE_EVERY;
            }
            if let Some(stats) = p.poll_checkpoint(stopping || p.must_wait() || p.start_pending())? {
                *progressed = true;
                poison.forget_committed(p.committed_offsets());
                let status = self.status();
                status.last_checkpoint.store(stats.id, Ordering::Relaxed);
                status.checkpoints.fetch_add(1, Ordering::Relaxed);
                status.last_checkpoint_micros.store(stats.to_commit.as_micros() as u64, Ordering::Relaxed);
                status.last_checkpoint_at_ms.store(now_ms(), Ordering::Relaxed);
                status.history.checkpoint(CheckpointEntry {
                    id: stats.id,
                    at_ms: now_ms(),
                    sync_seconds: stats.sync.as_secs_f64(),
                    snapshot_seconds: stats.snapshot.as_secs_f64(),
                    commit_seconds: stats.to_commit.as_secs_f64(),
                    bytes: stats.bytes as u64,
                    dirty_keys: stats.dirty_keys as u64,
                    failed: None,
                });
                tracing::debug!(task = %self.setup.name, ?stats, "checkpoint committed");
                last_activity = Instant::now();
            }
            // A module's first minutes on this host: its optimized code may
            // have become ready (between batches, idle or not).
            if p.code() == runtime::Tier::Baseline && p.adopt_optimized_code(&self.setup.runtime)? {
                self.status().set_code(p.code());
                tracing::info!(task = %self.setup.name, "the task runs the module's optimized code now");
            }
            // Nothing is read before the start positions are committed.
            if !stopping && !p.must_wait() && !p.start_pending() {
                // Waiting long is safe only while no barrier can be due.
                let idle = records_in_epoch == 0 && !p.checkpoint_in_flight();
                let batch = p.source.poll_batch(self.batch_size, if idle { idle_wait } else { POLL_WAIT })?;
                if p.reassigned() {
                    // The batch may hold records of a partition gone.
                    return Ok(Ended::Reassigned);
                }
                idle_wait = if batch.is_empty() { (idle_wait * 2).min(IDLE_POLL_WAIT) } else { POLL_WAIT };
                if !batch.is_empty() {
                    last_activity = Instant::now();
                    if poison.touches(&batch) {
                        // A batch that failed before: one record at a time,
                        // to find the record that fails.
                        for record in &batch {
                            self.process_alone(p, record, poison)?;
                        }
                    } else {
                        match transform(p, &batch) {
                            Ok(outputs) => self.emit(p, batch.len(), outputs)?,
                            Err(e) if e.is_deterministic() => {
                                poison.suspect(&batch);
                                return Err(e);
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    records_in_epoch += batch.len();
                    let late = p.instance.take_late_records();
                    if !late.is_empty() {
                        self.status().note_late(&late);
                    }
                }
                // After every batch, and on idle turns (processing time and
                // idle partitions move the clocks too). A firing is work of
                // the epoch like a record: its checkpoint becomes due.
                let fired = p.fire_timers()?;
                if fired > 0 {
                    self.status().timers_fired.fetch_add(fired as u64, Ordering::Relaxed);
                    records_in_epoch += fired;
                    last_activity = Instant::now();
                }
            }
            if !p.checkpoint_in_flight() && (records_in_epoch > 0 || p.wants_checkpoint()) {
                let requested = if stopping { self.coordinator.request_now() } else { self.coordinator.requested() };
                let due = records_in_epoch > 0 && requested > requests_seen;
                if due || p.wants_checkpoint() {
                    let id = requested.max(last_id + 1);
                    p.begin_checkpoint(id)?;
                    last_id = id;
                    if due {
                        requests_seen = requested;
                    }
                    records_in_epoch = 0;
                }
            }
            self.status().transaction_since_ms.store(p.transaction_since_ms(), Ordering::Relaxed);
            if !stopping
                && records_in_epoch == 0
                && let Some(after) = self.sleep_after.filter(|after| last_activity.elapsed() >= *after)
                && !p.checkpoint_in_flight()
                && !p.wants_checkpoint()
                && let Some(nap) = match self.may_sleep(p, after, &mut others) {
                    Ok(sleep) => sleep,
                    Err(e) => {
                        // Tried again after another `sleep_after`.
                        tracing::warn!(task = %self.setup.name, "the task stays awake: {e}");
                        last_activity = Instant::now();
                        None
                    }
                }
            {
                // Everything it did is committed: what it holds can go.
                p.fold_now()?;
                // Not asleep on a topic that is gone.
                self.sample(p)?;
                let mut positions = p.source.offsets();
                if nap.also.is_empty() {
                    tracing::info!(
                        task = %self.setup.name,
                        last_checkpoint = ?p.last_committed(),
                        "task sleeps: no input for {after:?}; a record wakes it"
                    );
                } else {
                    // Its shards go to the members that stay.
                    self.status().forget_shards();
                    tracing::info!(
                        task = %self.setup.name,
                        last_checkpoint = ?p.last_committed(),
                        "task sleeps: no input for {after:?}, nor to the rest of its job; it leaves its shards to \
                         the job's other members, and only a record anywhere in the job wakes it"
                    );
                }
                positions.extend(nap.also);
                return Ok(Ended::Asleep(Rest {
                    positions,
                    until: nap.until,
                    committed_at: p.last_commit(),
                    watch: nap.watch,
                }));
            }
            if stopping && !p.checkpoint_in_flight() && records_in_epoch == 0 {
                tracing::info!(task = %self.setup.name, last_checkpoint = ?p.last_committed(), "task stopped after its final checkpoint");
                // What the status of the stopped job shows (its last run),
                // with the shards' sizes of what it committed.
                p.fold_now()?;
                self.status().note_shards(p);
                // It stops either way; a topic gone is for its next start.
                if let Err(e) = self.sample(p) {
                    tracing::debug!(task = %self.setup.name, "the last reading: {e}");
                }
                return Ok(Ended::Stopped);
            }
        }
    }
}

/// The partitions among `all` that `positions` (a pipeline's) leave out.
fn not_held(positions: &[checkpoint::PartitionOffset], all: &[(String, i32)]) -> Vec<(String, i32)> {
    let held: HashSet<(&str, i32)> = positions.iter().map(|p| (p.topic.as_str(), p.partition)).collect();
    all.iter().filter(|(topic, partition)| !held.contains(&(topic.as_str(), *partition))).cloned().collect()
}

/// The partitions of the shards (partition numbers) of which `assigned`
/// holds every partition among `all`, sorted.
fn whole_shards(assigned: &[(String, i32)], all: &[(String, i32)]) -> Vec<(String, i32)> {
    let held: HashSet<&(String, i32)> = assigned.iter().collect();
    let mut whole: BTreeMap<i32, bool> = BTreeMap::new();
    for partition in all {
        *whole.entry(partition.1).or_insert(true) &= held.contains(partition);
    }
    let mut out: Vec<(String, i32)> = all.iter().filter(|(_, p)| whole.get(p) == Some(&true)).cloned().collect();
    out.sort();
    out
}

/// How long a member with no whole shard waits on the group between looks.
const MEMBER_WAIT: Duration = Duration::from_millis(200);

/// How one life of a task ended, short of failing.
enum Ended {
    /// It stopped (after its final checkpoint).
    Stopped,
    /// The group changed its partitions: it recovers anew.
    Reassigned,
    /// It had no input for a while and committed all it did: it sleeps
    /// until input arrives, then recovers anew.
    Asleep(Rest),
}

/// What a task may sleep with (see [`TaskRunner::may_sleep`]).
struct Nap {
    /// When it wakes anyway, if ever.
    until: Option<Instant>,
    /// The host's input watch.
    watch: Arc<kafka::InputWatch>,
    /// The partitions of the job's other members, from their committed
    /// offsets, for a member that holds only part of its job.
    also: Vec<checkpoint::PartitionOffset>,
}

/// What a sleeping task wakes for.
struct Rest {
    /// Its input partitions and where it stopped reading them (and, for a
    /// member that held part of its job, the others' partitions from their
    /// committed offsets): a record at or after these wakes it.
    positions: Vec<checkpoint::PartitionOffset>,
    /// When it wakes anyway: its heartbeat, or its first processing-time
    /// timer (never, for a member that left its shards to the others).
    until: Option<Instant>,
    /// When it last committed.
    committed_at: Instant,
    /// The host's input watch.
    watch: Arc<kafka::InputWatch>,
}

/// Runs the guest over `batch` and checks its outputs.
fn transform(p: &mut checkpoint::Pipeline, batch: &[InputRecord]) -> Result<Outputs, TaskError> {
    let outputs = p.instance.transform(batch)?;
    p.check_outputs(&outputs)?;
    Ok(outputs)
}

impl TaskRunner {
    /// Counts a batch's records and outputs, and sends the outputs.
    fn emit(&self, p: &mut checkpoint::Pipeline, records: usize, outputs: Outputs) -> Result<(), TaskError> {
        let status = self.status();
        status.records_in.fetch_add(records as u64, Ordering::Relaxed);
        status.records_out.fetch_add(outputs.len() as u64, Ordering::Relaxed);
        p.emit(outputs)
    }

    /// One record of a batch that failed before, on its own. A record that
    /// has failed `attempts` times on its own goes to the dead-letter topic
    /// or fails the job, as the job's `errors` policy says.
    fn process_alone(
        &self,
        p: &mut checkpoint::Pipeline,
        record: &InputRecord,
        poison: &mut Poison,
    ) -> Result<(), TaskError> {
        let id = Poison::id(record);
        if let Some((tries, reason)) = poison.failed.get(&id)
            && *tries >= self.attempts
        {
            // Only `dead-letter` gets here: `fail` failed the job already.
            tracing::warn!(
                task = %self.setup.name,
                topic = %record.topic, partition = record.partition, offset = record.offset,
                "record failed {tries} times; sending it to the dead-letter topic: {reason}"
            );
            // Remembered until a checkpoint past it commits: if this epoch
            // is aborted (say, by the next poison record), the replay sets
            // the record aside again at once rather than retrying it.
            p.dead_letter(record, &self.job, reason, *tries)?;
            self.status().dead_letters.fetch_add(1, Ordering::Relaxed);
            self.status().records_in.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        match transform(p, std::slice::from_ref(record)) {
            Ok(outputs) => {
                poison.suspects.remove(&id);
                self.emit(p, 1, outputs)
            }
            Err(e) if e.is_deterministic() => {
                self.status().history.failed_record(RecordRef {
                    topic: record.topic.clone(),
                    partition: record.partition,
                    offset: record.offset,
                });
                let tries = poison.failed(id, e.to_string());
                match &self.errors {
                    ErrorPolicy::Fail if tries >= self.attempts => Err(TaskError::Poison {
                        topic: record.topic.clone(),
                        partition: record.partition,
                        offset: record.offset,
                        attempts: tries,
                        reason: e.to_string(),
                    }),
                    _ => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }
}

/// The longest wait between replays of records that failed on their own.
const REPLAY_BACKOFF_MOST: Duration = Duration::from_secs(2);

/// The delays between replays of records that failed on their own: from
/// 50 ms, doubling to [`REPLAY_BACKOFF_MOST`], until a checkpoint commits
/// (then a new one starts). No jitter: a replay is the task's own affair.
fn replay_backoff() -> backon::ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(REPLAY_BACKOFF_MOST)
        .with_factor(2.0)
        .without_max_times()
        .build()
}

/// Records whose processing failed, kept across a task's restarts (not
/// across the process's: after a crash a record gets its tries again, and
/// exactly-once holds either way, since a dead letter commits with its
/// epoch or not at all).
#[derive(Default)]
struct Poison {
    /// Records of batches that failed as a whole: replayed one at a time.
    suspects: HashSet<RecordId>,
    /// Records that failed on their own: tries, and the last failure.
    failed: HashMap<RecordId, (u32, String)>,
}

/// Where a record is: topic, partition, offset.
type RecordId = (String, i32, i64);

/// Records remembered as suspect or failed, at most; past it the memory is
/// dropped (a record then just gets its tries again).
const MAX_POISON_RECORDS: usize = 100_000;

impl Poison {
    fn id(record: &InputRecord) -> RecordId {
        (record.topic.clone(), record.partition, record.offset)
    }

    /// Whether `batch` holds a record that failed before.
    fn touches(&self, batch: &[InputRecord]) -> bool {
        (!self.suspects.is_empty() || !self.failed.is_empty())
            && batch.iter().any(|r| {
                let id = Poison::id(r);
                self.suspects.contains(&id) || self.failed.contains_key(&id)
            })
    }

    /// Every record of `batch` becomes a suspect.
    fn suspect(&mut self, batch: &[InputRecord]) {
        if self.suspects.len() + batch.len() > MAX_POISON_RECORDS {
            self.suspects.clear();
        }
        self.suspects.extend(batch.iter().map(Poison::id));
    }

    /// Forgets the records before `committed`, the positions of a checkpoint
    /// that committed: they are never replayed, and while nothing is
    /// remembered, whole batches take the fast path again.
    fn forget_committed(&mut self, committed: &[crate::checkpoint::PartitionOffset]) {
        if self.suspects.is_empty() && self.failed.is_empty() {
            return;
        }
        let replayable = |(topic, partition, offset): &RecordId| {
            committed
                .iter()
                .find(|c| c.partition == *partition && c.topic == *topic)
                .is_none_or(|c| *offset >= c.next_offset)
        };
        self.suspects.retain(|id| replayable(id));
        self.failed.retain(|id, _| replayable(id));
    }

    /// Notes that `id` failed on its own with `reason`; returns its tries.
    fn failed(&mut self, id: RecordId, reason: String) -> u32 {
        if self.failed.len() >= MAX_POISON_RECORDS {
            self.failed.clear();
        }
        let entry = self.failed.entry(id).or_insert((0, String::new()));
        entry.0 += 1;
        entry.1 = reason;
        entry.0
    }
}

/// The redb file of task `index` in `state_dir`.
pub fn task_store_path(state_dir: &std::path::Path, index: usize) -> std::path::PathBuf {
    state_dir.join(format!("task-{index}.redb"))
}

/// The input partitions of each task of a job reading `partitions` of
/// `topics` with at most `parallelism` tasks (fewer if there are fewer
/// shards). Partition p of every input topic is shard p, so the input topics
/// must have the same number of partitions (co-partitioned, as a join of two
/// topics needs them anyway); shard p goes to task p mod tasks.
pub fn assign_shards(
    topics: &[String],
    partitions: &[(String, i32)],
    parallelism: usize,
) -> Result<Vec<Vec<(String, i32)>>, JobError> {
    let count = |topic: &String| partitions.iter().filter(|(t, _)| t == topic).count();
    let counts: Vec<(&String, usize)> = topics.iter().map(|topic| (topic, count(topic))).collect();
    let shards = counts.first().map_or(0, |(_, n)| *n);
    if counts.iter().any(|(_, n)| *n != shards) {
        let listed: Vec<String> = counts.iter().map(|(topic, n)| format!("`{topic}` has {n}")).collect();
        return Err(JobError::Assignment(format!(
            "the input topics must have the same number of partitions, since partition p of every input topic \
             is one shard of the job's state; {}. Repartition them, or run one job per topic",
            listed.join(", ")
        )));
    }
    let tasks = parallelism.min(shards).max(1);
    Ok((0..tasks)
        .map(|index| partitions.iter().filter(|(_, partition)| *partition as usize % tasks == index).cloned().collect())
        .collect())
}

/// Loads a job's module, naming the file in the error.
fn load_module(runtime: &Runtime, config: &JobConfig) -> Result<Module, JobError> {
    runtime.load_file(&config.module).map_err(|error| JobError::Module { path: config.module.clone(), error })
}

#[cfg(test)]
mod tests {
    use super::{checkpoint, not_held, replay_backoff, whole_shards};

    #[test]
    fn replays_back_off_from_50_ms_doubling_to_2_s() {
        let mut replays = replay_backoff();
        let delays: Vec<Option<u128>> = (0..8).map(|_| replays.next().map(|d| d.as_millis())).collect();
        let expected = [50, 100, 200, 400, 800, 1600, 2000, 2000].map(Some);
        assert_eq!(delays, expected);
        // A checkpoint that commits starts them again (a new backoff).
        assert_eq!(replay_backoff().next().map(|d| d.as_millis()), Some(50));
    }

    #[test]
    fn a_member_holds_its_whole_job_only_with_every_partition() {
        let at =
            |topic: &str, partition| checkpoint::PartitionOffset { topic: topic.into(), partition, next_offset: 7 };
        let all = [("a".to_owned(), 0), ("a".to_owned(), 1), ("b".to_owned(), 0)];
        assert_eq!(not_held(&[at("a", 0), at("a", 1), at("b", 0)], &all), []);
        assert_eq!(
            not_held(&[at("a", 0), at("b", 0)], &all),
            partitions(&[("a", 1)]),
            "a shard's partition of one topic"
        );
        assert_eq!(not_held(&[at("a", 0), at("a", 1), at("c", 0)], &all), partitions(&[("b", 0)]), "another topic");
        assert_eq!(not_held(&[], &all), all);
    }

    fn partitions(list: &[(&str, i32)]) -> Vec<(String, i32)> {
        list.iter().map(|(t, p)| ((*t).to_owned(), *p)).collect()
    }

    #[test]
    fn a_member_takes_up_only_the_shards_it_holds_every_partition_of() {
        let all = partitions(&[("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]);
        // Shard 1 is whole; shard 0 is half here while the group moves it;
        // shard 2 is elsewhere.
        let assigned = partitions(&[("b", 0), ("a", 1), ("b", 1)]);
        assert_eq!(whole_shards(&assigned, &all), partitions(&[("a", 1), ("b", 1)]));
        assert_eq!(whole_shards(&partitions(&[("a", 0)]), &all), partitions(&[]));
        assert_eq!(whole_shards(&all, &all), {
            let mut sorted = all.clone();
            sorted.sort();
            sorted
        });
    }

    #[test]
    fn a_partition_the_job_does_not_read_makes_no_shard() {
        let all = partitions(&[("a", 0), ("a", 1)]);
        assert_eq!(whole_shards(&partitions(&[("a", 1), ("c", 0)]), &all), partitions(&[("a", 1)]));
    }
}
