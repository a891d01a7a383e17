//! Jobs on the shared host: creating them from a tenant's spec, their life
//! (start, stop with a final checkpoint, resume, upgrade, delete), what
//! their status says, and the supervisor thread that watches them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Caller, Desired, JobRecord, Result, SUPERVISE_EVERY, Service, ServiceError, meta};
use crate::checkpoint::Migration;
use crate::cluster::log::Condition;
use crate::job::{Job, JobConfig, Placement, TaskPhase, TaskStatus, now_ms};
use crate::kafka;

/// A job that has threads in this process.
pub(super) struct Live {
    pub(super) scope: String,
    pub(super) job: Job,
    pub(super) started_ms: u64,
    /// A stop was asked for (the tasks are taking their final checkpoint).
    pub(super) stopping: bool,
    /// In a cluster: the job was stopped because it no longer belongs
    /// here (its slot moved, it was stopped, deleted or changed through
    /// another member); how it ends is not the job's failure.
    pub(super) released: bool,
    /// The record it was started from: a member restarts the job when the
    /// cluster's record changes under it.
    pub(super) record: Box<JobRecord>,
    /// The tasks it runs here (`None`: all).
    pub(super) tasks: Option<std::collections::BTreeSet<usize>>,
}

impl Live {
    /// In a cluster, when some of the job's slots moved: releases the tasks
    /// whose slots left this member and starts those whose slots came, while
    /// the tasks that stay run on untouched (their figures too). A task
    /// whose last run here is still taking its final checkpoint starts on a
    /// later pass.
    fn follow_slots(&mut self, here: Option<std::collections::BTreeSet<usize>>) {
        let (Some(was), Some(now)) = (&self.tasks, here) else { return };
        if *was == now {
            return;
        }
        for &index in was.difference(&now) {
            tracing::info!(job = %self.scope, task = index, "releasing the task: its slot moved to another member");
            self.job.release(index);
        }
        let mut running: std::collections::BTreeSet<usize> = was.intersection(&now).copied().collect();
        for &index in now.difference(was) {
            match self.job.take(index) {
                Ok(true) => {
                    tracing::info!(job = %self.scope, task = index, "starting the task: its slot moved here");
                    running.insert(index);
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(job = %self.scope, task = index, "cannot start the task: {e}"),
            }
        }
        self.tasks = Some(running);
    }
}

/// What this process is doing with a job: the job's state machine on the
/// host. A job with no slot has no threads here (stopped, failed, or not
/// started yet).
///
/// ```text
///   (none) --create/resume/restart--> Busy(Starting) --started--> Live
///   Busy(Starting) --failed, may pass--> (none, waiting in `start_retries`)
///   (none, waiting) --due, still to run (supervisor)--> Busy(Starting)
///   Live --stop--> Live{stopping} --tasks ended (supervisor)--> (none)
///   (none) --stop--> Busy(Stopping) --desired state stored--> (none)
///   Live | (none) --upgrade--> Busy(Upgrading) --done--> Live | (none)
///   Live | (none) --scale--> Busy(Rescaling) --done--> Live | (none)
///   (none) --reset--> Busy(Resetting) --done--> (none)
///   (none) --delete--> Busy(Deleting) --done--> (none)
///   (none) --create, checks passed--> Busy(Creating) --decided--> Busy(Starting)
///   (none) --stale state here (a member)--> Busy(Forgetting) --removed--> (none)
/// ```
///
/// Reset and delete take only a job whose record says it should not run
/// (stopped, or failed): one waiting in `start_retries` has no slot, but
/// should run, and gets 409 as a live one does.
///
/// A control call takes the slot under the jobs lock, does its slow work
/// (Kafka, the cluster's log, catching up with it, compiling, joining
/// threads, removing files) with the lock released, and puts the outcome
/// back under the lock. Under the lock only this host's own metadata is
/// read, never waited for. Exactly one control
/// operation owns a job at a time: any other call on it meanwhile gets 409,
/// so none can start a second copy, undo a stop, or delete state a running
/// copy still writes.
pub(super) enum Slot {
    /// The job's threads run.
    Live(Live),
    /// A control operation owns the job.
    Busy(Busy),
}

/// The control operation that owns a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Busy {
    /// Its threads are being started (create, resume, host restart).
    Starting,
    /// It is being stopped and started on another module.
    Upgrading,
    /// Its group, state and record are being deleted.
    Deleting,
    /// Its committed positions (and maybe state) are being reset.
    Resetting,
    /// It is being stopped and started with another parallelism.
    Rescaling,
    /// It has no threads here and a stop is storing its desired state.
    Stopping,
    /// Its record is being decided (a create, whose checks passed).
    Creating,
    /// A cluster member removes the state an earlier incarnation of it, or
    /// a deleted job of its id, left here.
    Forgetting,
}

/// How [`Service::stop_job`] took its job.
#[derive(Debug, Clone, Copy)]
enum Taken {
    /// Its threads run here; `was_stopping`: a stop was under way already.
    Live { was_stopping: bool },
    /// It had no threads here: its slot is `Busy(Stopping)`.
    Idle,
}

/// A change for which a job stops and starts again.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// Another module.
    Upgrade,
    /// Another parallelism.
    Scale,
}

impl Change {
    fn verb(self) -> &'static str {
        match self {
            Change::Upgrade => "upgrade",
            Change::Scale => "scale",
        }
    }

    fn busy(self) -> Busy {
        match self {
            Change::Upgrade => Busy::Upgrading,
            Change::Scale => Busy::Rescaling,
        }
    }
}

impl Busy {
    fn conflict(self, id: &str) -> ServiceError {
        let doing = match self {
            Busy::Starting => "starting",
            Busy::Upgrading => "being upgraded",
            Busy::Deleting => "being deleted",
            Busy::Resetting => "being reset",
            Busy::Rescaling => "being rescaled",
            Busy::Stopping => "being stopped",
            Busy::Creating => "being created",
            Busy::Forgetting => "having an earlier life's state removed",
        };
        ServiceError::Conflict(format!("job `{id}` is {doing}: try again when that has finished"))
    }
}

/// The key of a job in the slot map.
pub(super) fn key(tenant: &str, id: &str) -> (String, String) {
    (tenant.to_owned(), id.to_owned())
}

/// Refuses a control call that needs the job to have no threads and no
/// control operation under way; `live` says what is wrong when it runs.
fn require_idle(jobs: &HashMap<(String, String), Slot>, tenant: &str, id: &str, live: &str) -> Result<()> {
    match jobs.get(&key(tenant, id)) {
        Some(Slot::Busy(busy)) => Err(busy.conflict(id)),
        Some(Slot::Live(_)) => Err(ServiceError::Conflict(format!("job `{id}` {live}"))),
        None => Ok(()),
    }
}

/// A job's state as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Tasks are recovering from the last checkpoint.
    Starting,
    /// Every task is processing.
    Running,
    /// A task failed and waits out its backoff before restarting from the
    /// last checkpoint, or the job's start failed with an error that may
    /// pass (a broker that cannot be reached) and is tried again after a
    /// backoff; `reason` says why.
    Restarting,
    /// Taking the final checkpoint before stopping.
    Stopping,
    /// Being moved to another module (stopping, then starting).
    Upgrading,
    /// Changing its parallelism (stopping, then starting).
    Rescaling,
    /// Stopped; resuming continues from its last checkpoint.
    Stopped,
    /// Failed with an error restarting cannot fix; `reason` says why.
    Failed,
}

/// A task's open transaction against the broker's timeout.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TransactionView {
    /// How long the transaction has been open.
    pub open_seconds: f64,
    /// When the broker would abort it; the host aborts it itself at half.
    pub timeout_seconds: f64,
}

/// One task's figures.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskView {
    /// The task index.
    pub index: usize,
    /// The shards it holds: the numbers of its input partitions (partition
    /// p of every input topic is shard p).
    pub shards: Vec<u32>,
    /// What the task is doing.
    pub phase: TaskPhase,
    /// The last failure.
    pub last_error: Option<String>,
    /// Input records processed (replays after restarts included).
    pub records_in: u64,
    /// Output records sent (aborted ones included).
    pub records_out: u64,
    /// Input records not read yet.
    pub lag_records: u64,
    /// The last checkpoint committed.
    pub last_checkpoint: u64,
    /// Restarts after failures.
    pub restarts: u64,
    /// Records set aside to the dead-letter topic.
    pub dead_letters: u64,
    /// CPU time of the task's thread.
    pub cpu_seconds: f64,
    /// Bytes of keys and values in the task's state.
    pub state_bytes: u64,
    /// The open transaction, if one is.
    pub transaction: Option<TransactionView>,
    /// In a cluster: the member that runs the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The module digest the task runs: during an upgrade, tasks on other
    /// members may still run the old one.
    #[serde(default)]
    pub module: String,
    /// How the code it runs was compiled: `baseline` for a module's first
    /// seconds on a host, until its `optimized` code is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub code: Option<crate::runtime::Tier>,
    /// The job's parallelism the task was started with: during a rescale,
    /// tasks on other members may still run under the old one.
    #[serde(default)]
    pub parallelism: u32,
    /// How many tasks the job runs: its parallelism, or fewer when its input
    /// has fewer partitions (shards) than that.
    #[serde(default)]
    pub tasks: usize,
    /// Each of its input partitions' lag, as the task last read it (every
    /// few seconds).
    #[serde(default)]
    pub partitions: Vec<crate::kafka::PartitionLag>,
}

/// A job as the API shows it.
///
/// The figures are those of the job's tasks on this host (in a cluster,
/// merged with the other members'). A stopped or failed job shows what its
/// last run on this host ended with, since this host started (none after a
/// reset), with no tasks, no lag and no uptime.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobStatus {
    /// The job id.
    pub id: String,
    /// The module digest it runs.
    pub module: String,
    /// What the job is doing.
    pub state: JobState,
    /// Whether the job should run (and run again after a host restart).
    pub desired: Desired,
    /// Why it is failed or restarting.
    pub reason: Option<String>,
    /// Input records processed, all tasks.
    pub records_in: u64,
    /// Output records sent, all tasks.
    pub records_out: u64,
    /// Input records not read yet, all tasks.
    pub lag_records: u64,
    /// The lowest last-committed checkpoint over the tasks.
    pub last_checkpoint: u64,
    /// Duration of the slowest task's last checkpoint.
    pub last_checkpoint_seconds: f64,
    /// Time since the oldest task's last checkpoint, if any committed.
    pub last_checkpoint_age_seconds: Option<f64>,
    /// Checkpoints committed, all tasks.
    pub checkpoints: u64,
    /// Restarts, all tasks.
    pub restarts: u64,
    /// Records set aside to the dead-letter topic, all tasks.
    pub dead_letters: u64,
    /// CPU time of the task threads.
    pub cpu_seconds: f64,
    /// Bytes of state, all tasks.
    pub state_bytes: u64,
    /// Time since the job (re)started in this process.
    pub uptime_seconds: Option<f64>,
    /// Changelog records read to restore shards since the job started here.
    pub restored_records: u64,
    /// Bytes of their keys and values.
    pub restored_bytes: u64,
    /// Time spent restoring.
    pub restore_seconds: f64,
    /// Records at or below their shard's watermark when processed (replays
    /// count again), all tasks.
    pub late_records: u64,
    /// Timers fired (firings in aborted epochs count again), all tasks.
    pub timers_fired: u64,
    /// Per task.
    pub tasks: Vec<TaskView>,
    /// Per shard (input partition), in order.
    pub shards: Vec<ShardView>,
    /// In a cluster: the members that run the job's tasks (host ids); the
    /// figures of tasks another member runs are as it last published them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

/// One shard of a running job, as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ShardView {
    /// The shard: partition p of every input topic.
    pub shard: u32,
    /// The task that holds it.
    pub task: usize,
    /// Keys in its committed state.
    pub keys: u64,
    /// Bytes of those keys and their values.
    pub bytes: u64,
    /// Its last committed checkpoint.
    pub last_checkpoint: Option<u64>,
    /// Where its state came from when its task last started.
    pub origin: crate::checkpoint::ShardOrigin,
    /// Its watermark (ms since the Unix epoch), for a module that uses
    /// event time, once it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watermark: Option<i64>,
    /// Its records that were late (at or below its watermark) since its
    /// task started (replays count again).
    #[serde(default)]
    pub late_records: u64,
}

/// A slow request (stop, upgrade) the caller polls. Kept in the metadata
/// store, so it outlives a host restart.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Operation {
    /// Poll `GET /v1/operations/{id}`.
    pub id: String,
    /// `stop` or `upgrade`.
    pub kind: String,
    /// The job.
    pub job: String,
    /// Where it stands.
    pub state: OperationState,
    /// Why it failed.
    pub error: Option<String>,
}

/// An [`Operation`] as the metadata store keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StoredOperation {
    #[serde(flatten)]
    pub(crate) operation: Operation,
    pub(crate) tenant: String,
    /// When it was asked for (milliseconds since the Unix epoch).
    pub(crate) created_ms: u64,
    /// An upgrade's new module digest.
    #[serde(default)]
    pub(crate) target: Option<String>,
    /// In a cluster, the member that took the call: the one that carries an
    /// upgrade or a rescale out, and settles it.
    #[serde(default)]
    pub(crate) host: Option<String>,
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OperationState {
    /// Still going.
    Pending,
    /// Done.
    Succeeded,
    /// Failed; `error` says why.
    Failed,
}

/// What a reset does with a job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ResetState {
    /// Keep it: the reprocessed records are applied over it. Each shard's
    /// event time (watermark, timers) is state and is kept too, so records
    /// older than the watermark arrive late.
    Keep,
    /// Clear it: the job starts from empty state and fresh event time at the
    /// new positions.
    Clear,
}

/// A new incarnation of a job ([`JobRecord::incarnation`]): random and never
/// 0, so two lives of one job id never share one.
fn new_incarnation() -> u64 {
    crate::checkpoint::random_id().max(1)
}

/// Checks a job id: it becomes part of Kafka ids and paths.
fn check_job_id(id: &str) -> Result<()> {
    let ok = (1..=100).contains(&id.len())
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        && !id.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(ServiceError::BadRequest(format!("job id {id:?}: use 1-100 letters, digits, `_` or `-`")))
    }
}

/// [`Service::check_task_quota`] over `records`, the tenant's jobs as just
/// read: refuses job `id` running `parallelism` tasks if the tenant's other
/// jobs that run, or are to run, hold too many for its policy's
/// `max-tasks`. A job counts if this host holds a slot of it (starting,
/// running, stopping) or if its record says it runs and has not failed: so
/// in a cluster, where the job may run on other members, the count is the
/// cluster's, not this host's (before, a tenant could run `max-tasks` on
/// every member).
fn check_task_quota_of(
    jobs: &HashMap<(String, String), Slot>,
    tenant: &str,
    records: &[JobRecord],
    policy: &super::Policy,
    id: &str,
    parallelism: u32,
) -> Result<()> {
    let counts = |r: &JobRecord| match jobs.get(&key(tenant, &r.id)) {
        Some(slot) => !matches!(slot, Slot::Busy(Busy::Deleting)),
        None => r.desired == Desired::Running && r.failure.is_none(),
    };
    let running: u32 = records.iter().filter(|r| r.id != id && counts(r)).map(|r| r.spec.parallelism).sum();
    if running.saturating_add(parallelism) > policy.max_tasks {
        return Err(ServiceError::Forbidden(format!(
            "your policy allows {} tasks at once and your other running jobs have {running}: this job's \
             {parallelism} would be over; stop a job first",
            policy.max_tasks
        )));
    }
    Ok(())
}

fn not_found(id: &str) -> ServiceError {
    ServiceError::NotFound(format!("no job `{id}`"))
}

impl Service {
    /// Creates a job from a tenant's JSON spec and starts it.
    pub fn create_job(&self, caller: &Caller, spec: serde_json::Value) -> Result<JobStatus> {
        let tenant = caller.tenant()?;
        let policy = self.tenant(tenant)?.policy;
        let mut spec = policy.job_spec(spec)?;
        check_job_id(&spec.id)?;
        let module = self.module(caller, &spec.module.to_string_lossy())?;
        spec.module = module.digest.clone().into();
        let record = JobRecord {
            tenant: tenant.to_owned(),
            id: spec.id.clone(),
            spec,
            desired: Desired::Running,
            created_ms: now_ms(),
            failure: None,
            migrate_from: None,
            upgrades: 0,
            resetting: false,
            incarnation: new_incarnation(),
        };
        let config = self.job_config(&record)?;
        // Before anything is stored: a job on a topic that does not exist
        // would only be created to fail, and count against the tenant's
        // job limit. (Kafka I/O, so before the jobs lock.)
        self.check_topics(&record.spec)?;
        let job_key = meta::job_key(tenant, &record.id);
        // The checks on what this host has applied, under the jobs lock, and
        // the job's slot taken (no other call on the id meanwhile); the
        // decision with the lock released: the record is stored only if no
        // job of the tenant changed since the checks' view (on any host).
        let view = {
            let mut jobs = lock(&self.jobs);
            require_idle(&jobs, tenant, &record.id, "exists")?;
            let view = self.meta.view()?;
            if self.meta.job(tenant, &record.id)?.is_some() {
                return Err(ServiceError::Conflict(format!("job `{}` exists", record.id)));
            }
            // Read once for both checks: decoding every job of the tenant is
            // most of a create's own work once it has hundreds.
            let existing = self.meta.jobs(tenant)?;
            let count = existing.len();
            if count >= policy.max_jobs as usize {
                return Err(ServiceError::Forbidden(format!(
                    "your policy allows {} jobs and you have {count}: delete one first",
                    policy.max_jobs
                )));
            }
            check_task_quota_of(&jobs, tenant, &existing, &policy, &record.id, record.spec.parallelism)?;
            jobs.insert(key(tenant, &record.id), Slot::Busy(Busy::Creating));
            view
        };
        let conditions = vec![
            Condition::Version { key: job_key.clone(), version: None },
            Condition::Quiet { prefix: meta::jobs_prefix(tenant), since: view },
        ];
        let decided = meta::change(job_key, Some(&record), conditions).and_then(|change| self.meta.commit(change));
        let decided = match decided {
            Ok(Ok(())) => Ok(()),
            Ok(Err(refused)) => Err(ServiceError::Conflict(match refused.condition {
                Condition::Version { .. } => format!("job `{}` exists", record.id),
                Condition::Quiet { .. } => "your jobs changed while this one was created: try again".into(),
            })),
            Err(e) => Err(e),
        };
        {
            let mut jobs = lock(&self.jobs);
            match decided {
                Ok(()) => jobs.insert(key(tenant, &record.id), Slot::Busy(Busy::Starting)),
                Err(e) => {
                    jobs.remove(&key(tenant, &record.id));
                    return Err(e);
                }
            };
        }
        self.start(&record, config);
        self.job_status(caller, &record.id)
    }

    /// Refuses to start `parallelism` more tasks for `tenant` if its running
    /// (or starting, or upgrading) jobs would then hold more than its
    /// policy's `max-tasks` slots of the host's shared instance pool.
    fn check_task_quota(
        &self,
        jobs: &HashMap<(String, String), Slot>,
        tenant: &str,
        policy: &super::Policy,
        id: &str,
        parallelism: u32,
    ) -> Result<()> {
        check_task_quota_of(jobs, tenant, &self.meta.jobs(tenant)?, policy, id, parallelism)
    }

    /// Refuses a spec whose input, output or dead-letter topics do not exist.
    fn check_topics(&self, spec: &crate::job::JobSpec) -> Result<()> {
        let topics: Vec<String> = spec
            .input
            .topics
            .iter()
            .chain(&spec.output.topics)
            .chain(&spec.errors.dead_letter_topic)
            .cloned()
            .collect();
        match self.kafka.partitions(&topics, &self.config.brokers, Duration::from_secs(15)) {
            Ok(_) => Ok(()),
            Err(e @ kafka::Error::MissingTopic { .. }) => {
                Err(ServiceError::Unprocessable(format!("{e}: create it first")))
            }
            Err(e) => Err(ServiceError::kafka("reading the topics' metadata", e)),
        }
    }

    /// What the job runs, where, under which names. The stored spec is
    /// checked against the tenant's policy as it is now: an admin who
    /// narrowed it (topics, memory, parallelism) is obeyed at the next
    /// start, resume or upgrade, not only at creation.
    fn job_config(&self, record: &JobRecord) -> Result<JobConfig> {
        // As this member knows it: the supervisor calls this for each job
        // it starts, and must not wait on the cluster's log for one.
        let tenant = self.meta.tenant(&record.tenant)?.ok_or_else(|| super::no_tenant(&record.tenant))?;
        tenant.policy.admit(&record.spec)?;
        if self.placement.is_some() && !record.spec.state.changelog {
            // A member that gains a shard has nothing but the changelog to
            // restore it from: the first move would fail the whole job.
            return Err(ServiceError::Unprocessable(
                "job spec: `state.changelog = false` cannot run in a cluster: a shard's state moves between hosts \
                 through its changelog, and every shard moves when hosts come and go; leave the changelog on"
                    .into(),
            ));
        }
        let scope = record.scope();
        let placement = Placement {
            module: self.module_path(&record.spec.module.to_string_lossy()),
            state_dir: self.config.data_dir.join("state").join(&record.tenant).join(&record.id),
            scope,
        };
        let mut config = record
            .spec
            .validate_at(std::path::Path::new("<spec>"), placement)
            // Well-formed (it parsed) but refused: a value out of range or
            // fields that do not fit together, which a schema cannot say.
            .map_err(|e| ServiceError::Unprocessable(format!("job spec: {}", e.message)))?;
        config.brokers = self.config.brokers.clone();
        config.incarnation = record.incarnation;
        config.run_tasks = self.tasks_here(record);
        config.group_members = self.placement.is_some();
        if let Some(from) = &record.migrate_from {
            config.migrate_from = Some(Migration { from: from.clone(), generation: record.upgrades });
        }
        Ok(config)
    }

    /// Starts a job's threads, with the jobs lock released: the caller has
    /// put `Busy::Starting` (or `Busy::Upgrading`) in its slot. The slot
    /// becomes `Live`, or empty with the failure recorded. A job that
    /// starts while the host shuts down is stopped again at once.
    fn start(&self, record: &JobRecord, config: JobConfig) {
        if !self.placed_here(record) || !self.module_here(record) {
            // The member that owns the job's slot starts it (this one, once
            // the module's bytes are here).
            lock(&self.jobs).remove(&key(&record.tenant, &record.id));
            return;
        }
        let scope = record.scope();
        self.logs.register(&scope);
        let started = Job::start_with(config, Arc::clone(&self.runtime), Some(Arc::clone(&self.kafka)));
        let mut jobs = lock(&self.jobs);
        let key = key(&record.tenant, &record.id);
        match started {
            Ok(job) if !self.shutdown.load(Ordering::Relaxed) => {
                self.start_retries.forget(&key);
                let record = Box::new(record.clone());
                let tasks = job.config().run_tasks.clone();
                let live = Live { tasks, scope, job, started_ms: now_ms(), stopping: false, released: false, record };
                jobs.insert(key, Slot::Live(live));
            }
            Ok(job) => {
                jobs.remove(&key);
                drop(jobs);
                job.stop();
                let _ = job.join();
            }
            Err(e) if e.is_retryable() && !self.shutdown.load(Ordering::Relaxed) => {
                // Noted before the slot is given up: a call that takes the
                // job next sees it waiting, and the supervisor decides from
                // the job's record, once due, whether it still should run.
                let delay = self.start_retries.failed(&key, format!("cannot start: {e}"));
                jobs.remove(&key);
                drop(jobs);
                tracing::warn!(job = %scope, "job cannot start; trying again in {delay:.1?}: {e}");
            }
            Err(e) => {
                self.start_retries.forget(&key);
                jobs.remove(&key);
                drop(jobs);
                tracing::warn!(job = %scope, "job cannot start: {e}");
                self.record_failure(&record.tenant, &record.id, e.to_string());
            }
        }
    }

    /// A lone host's part of the supervisor: starts again, one at a time
    /// on a thread of their own, the jobs whose start failed with an error
    /// that may pass ([`retry`](super::retry)) and whose wait is over, if
    /// they should still run. (A cluster member's `place` starts them.)
    fn retry_starts(self: &Arc<Self>) {
        if self.placement.is_some() || self.shutdown.load(Ordering::Relaxed) {
            return;
        }
        let due = self.start_retries.due(std::time::Instant::now());
        if due.is_empty() || self.retrying.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Lets the next pass start a thread again however this one ends
        /// (a panic in a start included).
        struct Done(Arc<Service>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.retrying.store(false, Ordering::Release);
            }
        }
        let done = Done(Arc::clone(self));
        let spawned = std::thread::Builder::new().name("sluice-retry".into()).spawn(move || {
            for (tenant, id) in due {
                if let Some((record, config)) = done.0.claim_for_retry(&tenant, &id) {
                    tracing::info!(job = %record.scope(), "starting the job again");
                    done.0.start(&record, config);
                }
            }
        });
        if let Err(e) = spawned {
            self.retrying.store(false, Ordering::Release);
            tracing::error!("cannot start jobs again: {e}");
        }
    }

    /// Takes a job waiting to be started again for its start (its slot
    /// becomes `Busy(Starting)`), if it should still run and nothing else
    /// owns it; forgets it if it should not run any more.
    fn claim_for_retry(&self, tenant: &str, id: &str) -> Option<(JobRecord, JobConfig)> {
        let key = key(tenant, id);
        let mut jobs = lock(&self.jobs);
        if self.shutdown.load(Ordering::Relaxed) || jobs.contains_key(&key) {
            // Another call owns it; once that is done it either runs, or
            // its record says below whether it should.
            return None;
        }
        let record = match self.meta.job(tenant, id) {
            Ok(Some(record)) if record.should_start() => record,
            Ok(_) => {
                self.start_retries.forget(&key);
                tracing::info!(job = %format!("{tenant}.{id}"), "not starting the job again: it was stopped, failed or deleted meanwhile");
                return None;
            }
            Err(e) => {
                let delay = self.start_retries.failed(&key, format!("cannot start: reading its record: {e}"));
                tracing::warn!(job = id, "reading the job to start it again failed; trying again in {delay:.1?}: {e}");
                return None;
            }
        };
        // The tenant's other jobs may have taken its tasks meanwhile: then
        // it waits on, as it would for the broker.
        let quota = self
            .tenant(tenant)
            .and_then(|t| self.check_task_quota(&jobs, tenant, &t.policy, id, record.spec.parallelism));
        if let Err(e) = quota {
            let delay = self.start_retries.failed(&key, format!("cannot start: {e}"));
            tracing::warn!(job = %record.scope(), "job cannot start; trying again in {delay:.1?}: {e}");
            return None;
        }
        match self.job_config(&record) {
            Ok(config) => {
                jobs.insert(key, Slot::Busy(Busy::Starting));
                Some((record, config))
            }
            Err(e) => {
                self.start_retries.forget(&key);
                drop(jobs);
                self.record_failure(tenant, id, e.to_string());
                None
            }
        }
    }

    fn record_failure(&self, tenant: &str, id: &str, reason: String) {
        let recorded = self.meta.update_job(tenant, id, |record| {
            record.failure = Some(reason.clone());
            Ok(())
        });
        if let Err(e) = recorded {
            tracing::error!(job = id, "recording a failure: {e}");
        }
    }

    /// At start-up: runs every job whose desired state is running, one at
    /// a time, while the API already serves (a call waits at most for the
    /// start of one job, not of all).
    pub(super) fn resume_after_restart(&self) {
        if self.placement.is_some() {
            // A member runs what placement gives it (`place`).
            return;
        }
        let records = match self.meta.all_jobs() {
            Ok(records) => records,
            Err(e) => {
                tracing::error!("cannot read the jobs to resume: {e}");
                return;
            }
        };
        for record in records {
            let claimed = {
                let mut jobs = lock(&self.jobs);
                if self.shutdown.load(Ordering::Relaxed) {
                    return;
                }
                // Read again: the caller may have stopped or resumed it meanwhile.
                let record = match self.meta.job(&record.tenant, &record.id) {
                    Ok(Some(record)) => record,
                    _ => continue,
                };
                let key = key(&record.tenant, &record.id);
                if jobs.contains_key(&key) || !record.should_start() {
                    continue;
                }
                match self.job_config(&record) {
                    Ok(config) => {
                        jobs.insert(key, Slot::Busy(Busy::Starting));
                        Ok((record, config))
                    }
                    Err(e) => Err((record, e)),
                }
            };
            match claimed {
                Ok((record, config)) => {
                    tracing::info!(job = %record.scope(), "resuming after a host restart");
                    self.start(&record, config);
                }
                Err((record, e)) => self.record_failure(&record.tenant, &record.id, e.to_string()),
            }
        }
    }

    fn record(&self, tenant: &str, id: &str) -> Result<JobRecord> {
        self.fresh(|| self.meta.job(tenant, id)?.ok_or_else(|| not_found(id)))
    }

    /// The caller's jobs.
    pub fn jobs(&self, caller: &Caller) -> Result<Vec<JobStatus>> {
        caller.tenant()?;
        Ok(self.visible_jobs(caller)?.into_iter().map(|(_, status)| status).collect())
    }

    /// One of the caller's jobs.
    pub fn job_status(&self, caller: &Caller, id: &str) -> Result<JobStatus> {
        let record = self.record(caller.tenant()?, id)?;
        let jobs = lock(&self.jobs);
        Ok(self.status_of(&record, jobs.get(&key(&record.tenant, &record.id))))
    }

    /// A job's status: this host's view; in a cluster, merged with the
    /// tasks other members run, as they last published them.
    pub(super) fn status_of(&self, record: &JobRecord, slot: Option<&Slot>) -> JobStatus {
        let status = self.local_status_of(record, slot);
        let Some(link) = self.meta.link().filter(|_| self.board.is_some()) else { return status };
        merge(status, &link.identity().host, self.other_statuses(record))
    }

    /// In a cluster: the other members' fresh published statuses of
    /// `record`'s job, by member.
    fn other_statuses(&self, record: &JobRecord) -> Vec<(String, JobStatus)> {
        let Some(board) = &self.board else { return Vec::new() };
        board
            .others(&record.scope_key(), now_ms())
            .into_iter()
            .filter_map(|p| serde_json::from_value::<JobStatus>(p.status).ok().map(|s| (p.host, s)))
            .collect()
    }

    /// Publishes the status of every job that runs here, for the other
    /// members' API, and withdraws the ones that left.
    fn publish_statuses(&self) {
        let Some(board) = &self.board else { return };
        let now = now_ms();
        let mut statuses = Vec::new();
        {
            let jobs = lock(&self.jobs);
            for slot in jobs.values() {
                if let Slot::Live(live) = slot {
                    let status = self.local_status_of(&live.record, Some(slot));
                    statuses.push((live.record.scope_key(), live.scope.clone(), status));
                }
            }
        }
        let running: std::collections::HashSet<String> = statuses.iter().map(|(key, _, _)| key.clone()).collect();
        for (key, scope, status) in statuses {
            let tail = || serde_json::to_value(self.logs.tail(&scope, LOG_TAIL)).unwrap_or_default();
            match serde_json::to_value(&status) {
                Ok(status) => board.publish(&key, status, tail, now),
                Err(e) => tracing::warn!(job = %scope, "encoding the job's status: {e}"),
            }
        }
        board.withdraw_others(&running);
    }

    /// The status of `record`'s job from what this process knows of it: its
    /// tasks here when it is live, else the figures of its last run here.
    fn local_status_of(&self, record: &JobRecord, slot: Option<&Slot>) -> JobStatus {
        let status = match slot {
            Some(Slot::Live(live)) => self.status_from(record, Some(live), None),
            Some(Slot::Busy(busy)) => self.status_from(record, None, Some(busy)),
            None => self.status_from(record, None, None),
        };
        match (slot, status.state) {
            (None, JobState::Stopped | JobState::Failed) => self.with_last_run(&record.tenant, status),
            _ => status,
        }
    }

    /// The status of `record`'s job from its threads here (`live`) or what
    /// this process is doing with it (`busy`) alone.
    pub(super) fn status_from(&self, record: &JobRecord, live: Option<&Live>, busy: Option<&Busy>) -> JobStatus {
        let timeout = kafka::transaction_timeout(&record.spec.kafka);
        let now = now_ms();
        // The tasks this process runs (in a cluster, others run the rest).
        let statuses: Vec<(usize, &TaskStatus)> = live.map(|l| l.job.local_status().collect()).unwrap_or_default();
        let tasks: Vec<TaskView> = live
            .map(|l| {
                let of = l.job.status().len();
                statuses.iter().map(|&(i, t)| task_view(i, t, (&l.record, of), now, timeout)).collect()
            })
            .unwrap_or_default();
        let (state, reason) = match live {
            None if matches!(busy, Some(Busy::Starting)) => (JobState::Starting, None),
            None if matches!(busy, Some(Busy::Upgrading)) => (JobState::Upgrading, None),
            None if matches!(busy, Some(Busy::Rescaling)) => (JobState::Rescaling, None),
            None if matches!(busy, Some(Busy::Stopping)) => (JobState::Stopping, None),
            None if record.failure.is_some() => (JobState::Failed, record.failure.clone()),
            None if record.desired == Desired::Running => {
                match self.start_retries.reason(&key(&record.tenant, &record.id)) {
                    // Its start failed with an error that may pass.
                    Some(reason) => (JobState::Restarting, Some(reason)),
                    // Not started yet (the host is starting its jobs after a restart).
                    None => (JobState::Starting, None),
                }
            }
            None => (JobState::Stopped, None),
            Some(live) if live.stopping => (JobState::Stopping, None),
            Some(_) => {
                let worst = |phase: TaskPhase| tasks.iter().find(|t| t.phase == phase);
                if let Some(t) = worst(TaskPhase::Failed) {
                    (JobState::Failed, t.last_error.clone())
                } else if let Some(t) = worst(TaskPhase::Restarting) {
                    (JobState::Restarting, t.last_error.clone())
                } else if worst(TaskPhase::Starting).is_some() {
                    (JobState::Starting, None)
                } else if tasks.iter().all(|t| t.phase == TaskPhase::Stopped) {
                    (JobState::Stopped, None)
                } else {
                    (JobState::Running, None)
                }
            }
        };
        let last_at =
            statuses.iter().map(|(_, t)| t.last_checkpoint_at_ms.load(Ordering::Relaxed)).min().filter(|&t| t > 0);
        JobStatus {
            id: record.id.clone(),
            module: record.spec.module.to_string_lossy().into_owned(),
            state,
            desired: record.desired,
            reason,
            records_in: tasks.iter().map(|t| t.records_in).sum(),
            records_out: tasks.iter().map(|t| t.records_out).sum(),
            lag_records: tasks.iter().map(|t| t.lag_records).sum(),
            last_checkpoint: tasks.iter().map(|t| t.last_checkpoint).min().unwrap_or(0),
            last_checkpoint_seconds: statuses
                .iter()
                .map(|(_, t)| t.last_checkpoint_micros.load(Ordering::Relaxed) as f64 / 1e6)
                .fold(0.0, f64::max),
            last_checkpoint_age_seconds: last_at.map(|at| now.saturating_sub(at) as f64 / 1e3),
            checkpoints: statuses.iter().map(|(_, t)| t.checkpoints.load(Ordering::Relaxed)).sum(),
            restarts: tasks.iter().map(|t| t.restarts).sum(),
            dead_letters: tasks.iter().map(|t| t.dead_letters).sum(),
            // A fold from +0.0: `sum` of no f64 is -0.0, shown as "-0.0".
            cpu_seconds: tasks.iter().map(|t| t.cpu_seconds).fold(0.0, |a, b| a + b),
            state_bytes: tasks.iter().map(|t| t.state_bytes).sum(),
            restored_records: statuses.iter().map(|(_, t)| t.restored_records.load(Ordering::Relaxed)).sum(),
            restored_bytes: statuses.iter().map(|(_, t)| t.restored_bytes.load(Ordering::Relaxed)).sum(),
            restore_seconds: statuses
                .iter()
                .map(|(_, t)| t.restore_micros.load(Ordering::Relaxed) as f64 / 1e6)
                .fold(0.0, |a, b| a + b),
            late_records: statuses.iter().map(|(_, t)| t.late_records.load(Ordering::Relaxed)).sum(),
            timers_fired: statuses.iter().map(|(_, t)| t.timers_fired.load(Ordering::Relaxed)).sum(),
            shards: {
                let mut shards: Vec<ShardView> = statuses
                    .iter()
                    .flat_map(|&(task, status)| {
                        status.shard_figures().into_iter().map(move |(shard, f)| ShardView {
                            shard,
                            task,
                            keys: f.size.keys,
                            bytes: f.size.bytes,
                            last_checkpoint: f.last_checkpoint,
                            origin: f.origin,
                            watermark: f.watermark,
                            late_records: f.late_records,
                        })
                    })
                    .collect();
                shards.sort_by_key(|s| s.shard);
                shards
            },
            uptime_seconds: live.map(|l| now.saturating_sub(l.started_ms) as f64 / 1e3),
            tasks,
            hosts: Vec::new(),
        }
    }

    /// Asks a job to stop after a final checkpoint; returns the operation
    /// to poll. The job stays stopped across host restarts until resumed.
    pub fn stop_job(self: &Arc<Self>, caller: &Caller, id: &str) -> Result<Operation> {
        let tenant = caller.tenant()?;
        let key = key(tenant, id);
        // Take the job under the lock: a live one is marked stopping (no
        // change may start on it), one with no threads here gets a busy slot
        // (no resume may start between its desired state and its operation).
        self.record(tenant, id)?;
        let taken = {
            let mut jobs = lock(&self.jobs);
            match jobs.get_mut(&key) {
                Some(Slot::Busy(busy)) => return Err(busy.conflict(id)),
                Some(Slot::Live(live)) => Taken::Live { was_stopping: std::mem::replace(&mut live.stopping, true) },
                None => {
                    jobs.insert(key.clone(), Slot::Busy(Busy::Stopping));
                    Taken::Idle
                }
            }
        };
        // With the lock released (in a cluster, round trips to the cluster's
        // log), so no other job's call waits on this one. The desired state
        // first: an operation, once stored, may be settled as done by a
        // restarted host (`settle_operations_after_restart`).
        crate::failpoint::hit("stop-before-desired");
        let stored = self
            .meta
            .update_job(tenant, id, |record| {
                record.desired = Desired::Stopped;
                Ok(())
            })
            .and_then(|stopped| stopped.map(drop).ok_or_else(|| not_found(id)));
        // Stored or not, the job is stopped once its desired state is.
        let operation = stored.and_then(|()| self.new_operation(tenant, id, "stop", None));
        // Whether threads here take the final checkpoint: the supervisor
        // finishes the operation when they end.
        let (operation, stopping_here) = {
            let mut jobs = lock(&self.jobs);
            let stopping_here = match (taken, jobs.get_mut(&key)) {
                (Taken::Idle, _) => {
                    jobs.remove(&key);
                    false
                }
                (Taken::Live { was_stopping }, Some(Slot::Live(live))) => match &operation {
                    // The desired state is not stored: the job runs on as before.
                    Err(_) if !self.desired_stopped(tenant, id) => {
                        live.stopping = was_stopping;
                        true
                    }
                    _ => {
                        live.job.stop();
                        true
                    }
                },
                // Its threads ended meanwhile (the supervisor reaped them).
                (Taken::Live { .. }, _) => false,
            };
            (operation?, stopping_here)
        };
        // With no threads here: in a cluster, another member may run the
        // job's tasks, and the stop is done once none shows them running
        // (`settle_remote_stops`).
        if !stopping_here && !self.running_elsewhere(&self.record(tenant, id)?) {
            self.finish_operation(tenant, &operation.id, Ok(()));
        }
        Ok(operation)
    }

    /// Whether `tenant`'s job `id` is stored as desired stopped.
    fn desired_stopped(&self, tenant: &str, id: &str) -> bool {
        self.meta.job(tenant, id).is_ok_and(|record| record.is_some_and(|r| r.desired == Desired::Stopped))
    }

    /// Starts a stopped or failed job again from its last checkpoint.
    pub fn resume_job(&self, caller: &Caller, id: &str) -> Result<JobStatus> {
        let tenant = caller.tenant()?;
        // Known here (caught up with the cluster if need be) before the
        // jobs lock is taken.
        self.record(tenant, id)?;
        let policy = self.tenant(tenant)?.policy;
        let mut record = {
            let mut jobs = lock(&self.jobs);
            require_idle(&jobs, tenant, id, "is running (or still stopping)")?;
            let record = self.meta.job(tenant, id)?.ok_or_else(|| not_found(id))?;
            if record.resetting {
                return Err(ServiceError::Conflict(format!(
                    "a reset of job `{id}` was cut short; run the reset again before resuming"
                )));
            }
            // Counted with this job's slot taken below: a resume of another
            // job of the tenant meanwhile, through this host, counts this
            // one; through another member, the record is stored only if no
            // job of the tenant changed since the count's view.
            let view = self.meta.view()?;
            self.check_task_quota(&jobs, tenant, &policy, id, record.spec.parallelism)?;
            jobs.insert(key(tenant, id), Slot::Busy(Busy::Starting));
            (record, view)
        };
        let stored = (|| {
            let (record, view) = &mut record;
            record.desired = Desired::Running;
            record.failure = None;
            let config = self.job_config(record)?;
            crate::failpoint::hit("resume-before-record");
            let resumed = self.meta.update_job_if_quiet(tenant, id, *view, |record| {
                record.desired = Desired::Running;
                record.failure = None;
            })?;
            Ok((resumed.ok_or_else(|| not_found(id))?, config))
        })();
        let (record, config) = match stored {
            Ok(stored) => stored,
            Err(e) => {
                lock(&self.jobs).remove(&key(tenant, id));
                return Err(e);
            }
        };
        self.start(&record, config);
        self.job_status(caller, id)
    }

    /// Moves a job to another module, keeping its state: stops it with a
    /// final checkpoint, then starts it on the new module, whose `migrate`
    /// hook (if it exports one) sees the old state first.
    pub fn upgrade_job(self: &Arc<Self>, caller: &Caller, id: &str, module: &str) -> Result<Operation> {
        let tenant = caller.tenant()?.to_owned();
        let module = self.module(caller, module)?;
        let record = self.record(&tenant, id)?;
        if record.spec.module.as_os_str() == module.digest.as_str() {
            return Err(ServiceError::Conflict(format!("job `{id}` already runs module {}", module.digest)));
        }
        let digest = module.digest.clone();
        self.restart_changed(&tenant, id, Change::Upgrade, &module.digest, move |record| {
            let from = std::mem::replace(&mut record.spec.module, digest.clone().into());
            record.migrate_from = Some(from.to_string_lossy().into_owned());
            record.upgrades += 1;
        })
    }

    /// Changes a job's parallelism, keeping its state: stops it with a final
    /// checkpoint (a clean boundary: every output before it is committed,
    /// none after it is), then starts it with `parallelism` tasks, which
    /// move each shard's state to its new task ([`crate::job::settle`]). A
    /// stopped job only has its parallelism changed, for its next start.
    pub fn scale_job(self: &Arc<Self>, caller: &Caller, id: &str, parallelism: u32) -> Result<Operation> {
        let tenant = caller.tenant()?.to_owned();
        let mut record = self.record(&tenant, id)?;
        let current = record.spec.parallelism;
        record.spec.parallelism = parallelism;
        // The spec's and the policy's limits, before anything stops.
        self.job_config(&record)?;
        if parallelism == current {
            let operation = self.new_operation(&tenant, id, "scale", Some(&parallelism.to_string()))?;
            self.finish_operation(&tenant, &operation.id, Ok(()));
            return self.operation(caller, &operation.id);
        }
        // A running job (here or on another member) takes its new tasks
        // at once; a stopped one is counted when it resumes.
        if parallelism > current && record.desired == Desired::Running && record.failure.is_none() {
            let policy = self.tenant(&tenant)?.policy;
            let jobs = lock(&self.jobs);
            self.check_task_quota(&jobs, &tenant, &policy, id, parallelism)?;
        }
        self.restart_changed(&tenant, id, Change::Scale, &parallelism.to_string(), move |record| {
            record.spec.parallelism = parallelism;
        })
    }

    /// The control operations that stop a job with a final checkpoint,
    /// change its record, and start it again (if it ran): takes the job's
    /// slot, and does the slow part on its own thread; returns the
    /// operation to poll.
    fn restart_changed(
        self: &Arc<Self>,
        tenant: &str,
        id: &str,
        change: Change,
        target: &str,
        apply: impl FnMut(&mut JobRecord) + Send + 'static,
    ) -> Result<Operation> {
        let key = key(tenant, id);
        let live = {
            let mut jobs = lock(&self.jobs);
            let live = match jobs.remove(&key) {
                Some(Slot::Busy(busy)) => {
                    jobs.insert(key, Slot::Busy(busy));
                    return Err(busy.conflict(id));
                }
                Some(Slot::Live(live)) if live.stopping => {
                    jobs.insert(key, Slot::Live(live));
                    return Err(ServiceError::Conflict(format!(
                        "job `{id}` is stopping: {} it once it has stopped",
                        change.verb()
                    )));
                }
                Some(Slot::Live(live)) => Some(live),
                None => None,
            };
            jobs.insert(key.clone(), Slot::Busy(change.busy()));
            live
        };
        // The slot is taken: the operation is stored without holding the
        // jobs lock (in a cluster, a round trip to the cluster's log), so
        // no other job's call waits on it.
        let operation = match self.new_operation(tenant, id, change.verb(), Some(target)) {
            Ok(operation) => operation,
            Err(e) => {
                let mut jobs = lock(&self.jobs);
                match live {
                    Some(live) => jobs.insert(key, Slot::Live(live)),
                    None => jobs.remove(&key),
                };
                return Err(e);
            }
        };
        let service = Arc::clone(self);
        let (op, tenant, id) = (operation.id.clone(), tenant.to_owned(), id.to_owned());
        let spawned = std::thread::Builder::new().name(format!("sluice-{}", change.verb())).spawn(move || {
            let result = service.finish_restart(&tenant, &id, &op, live, apply);
            // In a cluster the other members switch their tasks when they
            // see the changed record: the supervisor finishes the operation
            // once every task runs it (`settle_remote_changes`).
            if result.is_err() || service.board.is_none() {
                service.finish_operation(&tenant, &op, result);
            }
        });
        spawned.map_err(|e| ServiceError::internal(format!("starting the {}", change.verb()), e))?;
        Ok(operation)
    }

    /// The slow part of [`restart_changed`](Self::restart_changed), on its
    /// own thread while the job's slot is busy: stop the old threads, change
    /// the record (only while `operation` is pending: in a cluster another
    /// member may have given it up, see
    /// [`settle_remote_changes`](Self::settle_remote_changes)), start.
    fn finish_restart(
        &self,
        tenant: &str,
        id: &str,
        operation: &str,
        live: Option<Live>,
        mut apply: impl FnMut(&mut JobRecord),
    ) -> Result<()> {
        let was_running = live.is_some();
        if let Some(live) = live {
            live.job.stop();
            if let Err(e) = live.job.join() {
                // The state is as of its last committed checkpoint whatever
                // happened; the change goes on from there.
                tracing::warn!(job = %live.scope, "the job failed while stopping: {e}");
            }
        }
        crate::failpoint::hit("change-before-record");
        let switched = (|| {
            let mut config = None;
            let record = self.meta.update_job_for(tenant, id, operation, |record| {
                apply(record);
                record.failure = None;
                if was_running {
                    record.desired = Desired::Running;
                }
                config = if record.desired == Desired::Running { Some(self.job_config(record)?) } else { None };
                Ok(())
            })?;
            Ok((record.ok_or_else(|| not_found(id))?, config))
        })();
        if switched.is_ok() {
            crate::failpoint::hit("change-after-record");
        }
        match switched {
            Ok((record, Some(config))) => {
                self.start(&record, config);
                Ok(())
            }
            Ok((_, None)) => {
                lock(&self.jobs).remove(&key(tenant, id));
                Ok(())
            }
            Err(e) => {
                tracing::warn!(tenant, job = id, operation, "the job was not switched: {e}");
                lock(&self.jobs).remove(&key(tenant, id));
                Err(e)
            }
        }
    }

    /// Moves a stopped (or failed) job's committed positions to `to`,
    /// keeping or clearing its state, for reprocessing. The job is marked as
    /// resetting first, durably: a reset cut short by a crash leaves a job
    /// that refuses to start until a reset completes, never one that runs on
    /// half-reset positions; every step can be repeated.
    pub fn reset_job(&self, caller: &Caller, id: &str, to: kafka::ResetTo, state: ResetState) -> Result<JobStatus> {
        let tenant = caller.tenant()?;
        let record = self.record(tenant, id)?;
        {
            let mut jobs = lock(&self.jobs);
            require_idle(&jobs, tenant, id, "is running: stop it first")?;
            self.require_stopped_everywhere(&record)?;
            jobs.insert(key(tenant, id), Slot::Busy(Busy::Resetting));
        }
        let marked = self.meta.update_job(tenant, id, |record| {
            record.resetting = true;
            Ok(())
        });
        let record = match marked.and_then(|marked| marked.ok_or_else(|| not_found(id))) {
            Ok(record) => record,
            Err(e) => {
                lock(&self.jobs).remove(&key(tenant, id));
                return Err(e);
            }
        };
        let reset = self.reset_positions(&record, to, state);
        let result = reset.and_then(|()| {
            let done = self.meta.update_job(tenant, id, |record| {
                record.resetting = false;
                // The cleared state's checkpoints were this incarnation's:
                // what any member still holds of them is not the next's.
                if state == ResetState::Clear {
                    record.incarnation = new_incarnation();
                }
                Ok(())
            })?;
            done.map(drop).ok_or_else(|| not_found(id))
        });
        lock(&self.jobs).remove(&key(tenant, id));
        result?;
        self.forget_last_figures(tenant, id);
        tracing::info!(job = %record.scope(), ?to, ?state, "job reset");
        self.job_status(caller, id)
    }

    /// The reset's Kafka and disk work, with the jobs lock released: per
    /// task (as the job would assign its shards now), the positions `to`
    /// means, committed in one request. With the state kept, the stores are
    /// first brought to that assignment and in line with Kafka's
    /// checkpoints, and each partition is committed under its shard's
    /// checkpoint id again; with it cleared, the stores are removed first and
    /// the positions committed without a checkpoint, as for a fresh job.
    fn reset_positions(&self, record: &JobRecord, to: kafka::ResetTo, state: ResetState) -> Result<()> {
        let config = self.job_config(record)?;
        let client = kafka::client_config(&self.config.brokers, &config.kafka);
        let timeout = Duration::from_secs(15);
        let kafka_error = |e: kafka::Error| ServiceError::kafka("resetting the job's positions", e);
        let kept_state_error = |e: &dyn std::fmt::Display| {
            ServiceError::Unprocessable(format!("the state cannot be kept: {e}; reset with the state cleared"))
        };
        let source = kafka::Source::connect(&client, &config.group(), config.start).map_err(kafka_error)?;
        let partitions = source.partitions(&config.input_topics, &config.brokers, timeout).map_err(kafka_error)?;
        let assignment = crate::job::assign_shards(&config.input_topics, &partitions, config.parallelism)
            .map_err(|e| ServiceError::Unprocessable(e.to_string()))?;
        match state {
            ResetState::Keep => {
                crate::job::settle(&config, &client, &partitions, &assignment, timeout)
                    .map_err(|e| kept_state_error(&e))?;
            }
            ResetState::Clear => remove_state(&config.state_dir)?,
        }
        for (index, mine) in assignment.into_iter().enumerate() {
            let offsets = source.offsets_at(&mine, to, timeout).map_err(kafka_error)?;
            let committed = match state {
                ResetState::Keep => {
                    let committed = source.committed(&mine, timeout).map_err(kafka_error)?;
                    let path = crate::job::task_store_path(&config.state_dir, index);
                    let store = crate::checkpoint::CheckpointStore::open(&path)
                        .map_err(|e| ServiceError::internal("opening the job's state", e))?;
                    // A store another incarnation left here keeps nothing.
                    store
                        .adopt(config.incarnation)
                        .map_err(|e| ServiceError::internal("opening the job's state", e))?;
                    let recovery = store
                        .recover_runs(&committed.for_shards(&crate::checkpoint::shard_numbers(&mine)), &committed.runs)
                        .map_err(|e| kept_state_error(&e))?;
                    // With a changelog, a shard that is behind is restored
                    // from it at the next start.
                    if config.changelog.is_none() {
                        store.require_current(&recovery).map_err(|e| kept_state_error(&e))?;
                    }
                    committed
                }
                ResetState::Clear => Default::default(),
            };
            crate::failpoint::hit("reset-before-commit");
            source.commit_positions(&mine, &offsets, &committed).map_err(kafka_error)?;
        }
        Ok(())
    }

    /// Deletes a stopped job: its record, its state, its consumer group.
    pub fn delete_job(&self, caller: &Caller, id: &str) -> Result<()> {
        let tenant = caller.tenant()?;
        let record = self.record(tenant, id)?;
        {
            let mut jobs = lock(&self.jobs);
            require_idle(&jobs, tenant, id, "is running: stop it first")?;
            self.require_stopped_everywhere(&record)?;
            jobs.insert(key(tenant, id), Slot::Busy(Busy::Deleting));
        }
        let deleted = self.delete_stopped(&record);
        lock(&self.jobs).remove(&key(tenant, id));
        if deleted.is_ok() {
            self.throughput.forget(tenant, id);
            self.forget_last_run(tenant, id);
        }
        deleted
    }

    /// Deletes a job that has no threads, with the jobs lock released: its
    /// consumer group, its state, then its record (last, so a failure
    /// halfway leaves a job the caller can delete again).
    fn delete_stopped(&self, record: &JobRecord) -> Result<()> {
        // The group's committed offsets are the job's checkpoints: a new job
        // with this id must not resume from them with empty state.
        let group = format!("sluice.{}", record.scope());
        kafka::tools::delete_group(&self.config.brokers, &group)
            .map_err(|e| ServiceError::kafka(&format!("deleting the consumer group `{group}`"), e))?;
        // Then the changelog, whose spans only the group's offsets named.
        // (A shared host names it; a spec cannot.)
        if record.spec.state.changelog {
            let topic = format!("sluice.{}.changelog", record.scope());
            kafka::tools::delete_topic(&self.config.brokers, &topic)
                .map_err(|e| ServiceError::kafka(&format!("deleting the changelog `{topic}`"), e))?;
        }
        let dir = self.config.data_dir.join("state").join(&record.tenant).join(&record.id);
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(ServiceError::internal(format!("removing {}", dir.display()), e));
        }
        let key = meta::job_key(&record.tenant, &record.id);
        self.meta
            .commit(meta::change::<JobRecord>(key, None, Vec::new())?)?
            .map_err(|refused| ServiceError::internal("deleting the job's record", format!("{refused:?}")))?;
        self.logs.forget(&record.scope());
        Ok(())
    }

    /// Up to `limit` log lines of a job numbered above `after`.
    pub fn job_logs(&self, caller: &Caller, id: &str, after: u64, limit: usize) -> Result<Vec<super::LogLine>> {
        let record = self.record(caller.tenant()?, id)?;
        Ok(self.logs_of(&record, after, limit))
    }

    /// `record`'s log lines after `after`, at most `limit`: this host's, or
    /// the tail the member that runs it published.
    pub(super) fn logs_of(&self, record: &JobRecord, after: u64, limit: usize) -> Vec<super::LogLine> {
        let here = matches!(lock(&self.jobs).get(&key(&record.tenant, &record.id)), Some(Slot::Live(_)));
        if !here
            && let Some(board) = &self.board
            && let Some(theirs) = board.others(&record.scope_key(), now_ms()).into_iter().next()
        {
            // The member that runs it published the newest lines.
            let tail: Vec<super::LogLine> = serde_json::from_value(theirs.log_tail).unwrap_or_default();
            return tail.into_iter().filter(|line| line.seq > after).take(limit).collect();
        }
        self.logs.lines(&record.scope(), after, limit)
    }

    /// A new pending operation, stored. Its id is random, so it says
    /// nothing about other tenants' operations; the tenant's finished
    /// operations beyond the newest [`KEPT_OPERATIONS`] are forgotten.
    fn new_operation(&self, tenant: &str, job: &str, kind: &str, target: Option<&str>) -> Result<Operation> {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).map_err(|e| ServiceError::internal("drawing an operation id", e))?;
        let operation = Operation {
            id: format!("op-{}", hex::encode(bytes)),
            kind: kind.to_owned(),
            job: job.to_owned(),
            state: OperationState::Pending,
            error: None,
        };
        let mut finished: Vec<StoredOperation> = self
            .meta
            .operations(tenant)?
            .into_iter()
            .filter(|o| o.operation.state != OperationState::Pending)
            .collect();
        finished.sort_by_key(|o| o.created_ms);
        let excess = (finished.len() + 1).saturating_sub(KEPT_OPERATIONS);
        let forget: Vec<String> = finished.iter().take(excess).map(|o| o.operation.id.clone()).collect();
        let stored = StoredOperation {
            operation: operation.clone(),
            tenant: tenant.to_owned(),
            created_ms: now_ms(),
            target: target.map(str::to_owned),
            host: self.meta.link().map(|link| link.identity().host.clone()),
        };
        self.meta.put_operation(&stored, &forget)?;
        Ok(operation)
    }

    /// Records the end of a pending operation; one that has ended already
    /// (another member settled it first) is left as it is.
    fn finish_operation(&self, tenant: &str, id: &str, result: Result<()>) {
        let (state, error) = match result {
            Ok(()) => (OperationState::Succeeded, None),
            Err(e) => (OperationState::Failed, Some(e.to_string())),
        };
        let finished = self.meta.update_operation(tenant, id, |stored| {
            if stored.operation.state != OperationState::Pending {
                return false;
            }
            stored.operation.state = state;
            stored.operation.error = error.clone();
            true
        });
        if let Err(e) = finished {
            tracing::error!(tenant, operation = id, "cannot record the end of an operation: {e}");
        }
    }

    /// Settles the operations a previous run of the host left pending, before
    /// it serves: a stop is done (the job's desired state, stopped, was
    /// stored before the operation, so it is not started again); an upgrade
    /// or a rescale is done if the job's record holds the change (its module,
    /// its parallelism), and failed if the host stopped before it switched.
    ///
    /// In a cluster, only the operations this member took (another
    /// member's may be under way there), and only the changes it never
    /// made: the rest stay pending for the supervisor, which finishes a
    /// stop once no member runs the job, and a change once every member
    /// runs it.
    pub(super) fn settle_operations_after_restart(&self) -> Result<()> {
        let member = self.meta.link().is_some();
        for stored in self.meta.pending_operations()? {
            if !self.took(&stored) {
                continue;
            }
            let (tenant, id) = (&stored.tenant, &stored.operation.id);
            let record = self.meta.job(tenant, &stored.operation.job)?;
            let made = record.as_ref().is_some_and(|r| switched(r, &stored));
            let result = match stored.operation.kind.as_str() {
                "stop" if member => continue,
                "stop" => Ok(()),
                _ if made && member => continue,
                _ if made => Ok(()),
                "scale" => Err(ServiceError::Conflict(
                    "the host stopped before the rescale changed the parallelism; the job keeps its old \
                     parallelism and its desired state: scale it again"
                        .into(),
                )),
                _ => Err(ServiceError::Conflict(
                    "the host stopped before the upgrade switched the module; the job keeps its old module and \
                     its desired state: upgrade it again"
                        .into(),
                )),
            };
            self.finish_operation(tenant, id, result);
        }
        Ok(())
    }

    /// Whether this member may finish the pending stop `operation` now: its
    /// own, or another member's after [`TAKEN_OVER_AFTER`] (see
    /// [`settle_remote_stops`](Self::settle_remote_stops)).
    fn may_settle_stop(&self, operation: &StoredOperation, now_ms: u64) -> bool {
        self.took(operation) || overdue(operation, now_ms)
    }

    /// Whether this host took the call of `operation` (always, alone; an
    /// operation stored before members noted themselves counts as its own
    /// member's, the only one that had it).
    fn took(&self, operation: &StoredOperation) -> bool {
        match (&operation.host, self.meta.link()) {
            (Some(host), Some(link)) => *host == link.identity().host,
            _ => true,
        }
    }

    /// One of the caller's operations (in a cluster, also one another
    /// member has just stored: see [`fresh`](Self::fresh)).
    pub fn operation(&self, caller: &Caller, id: &str) -> Result<Operation> {
        let tenant = caller.tenant()?;
        self.fresh(|| match self.meta.operation(tenant, id)? {
            Some(stored) => Ok(stored.operation),
            None => Err(ServiceError::NotFound(format!("no operation `{id}`"))),
        })
    }

    /// Every live job's status with its tenant, for metrics.
    pub(super) fn all_statuses(&self) -> Vec<(String, JobStatus)> {
        let Ok(records) = self.meta.all_jobs() else { return Vec::new() };
        let jobs = lock(&self.jobs);
        records.iter().map(|r| (r.tenant.clone(), self.status_of(r, jobs.get(&key(&r.tenant, &r.id))))).collect()
    }

    /// One pass of the supervisor: reap jobs whose tasks all ended (stopped
    /// or failed; a job whose task failed for good stops as a whole by
    /// itself), and abort transactions held open longer than
    /// [`kafka::stale_transaction_after`]. Kafka calls happen after the jobs
    /// lock is released, so a slow broker stalls no other tenant's calls.
    fn supervise(&self) {
        let now = now_ms();
        let mut ended = Vec::new();
        let mut stale = Vec::new();
        {
            let mut jobs = lock(&self.jobs);
            let finished: Vec<(String, String)> = jobs
                .iter()
                .filter(|(_, slot)| matches!(slot, Slot::Live(live) if live.job.is_finished()))
                .map(|(key, _)| key.clone())
                .collect();
            for key in finished {
                if let Some(Slot::Live(live)) = jobs.remove(&key) {
                    ended.push((key, live));
                }
            }
            for live in jobs.values_mut().filter_map(|slot| match slot {
                Slot::Live(live) => Some(live),
                Slot::Busy(_) => None,
            }) {
                for (task, ended) in live.job.reap_released() {
                    match ended {
                        Ok(()) => tracing::info!(job = %live.scope, task, "the task left this host"),
                        Err(e) => tracing::info!(job = %live.scope, task, "the task left this host: {e}"),
                    }
                }
                let stale_after = kafka::stale_transaction_after(kafka::transaction_timeout(&live.job.config().kafka));
                for (index, task) in live.job.status().iter().enumerate() {
                    let since = task.transaction_since_ms.load(Ordering::Relaxed);
                    // A transaction is fenced once: its task may report the
                    // same `since` again until it notices it was fenced.
                    if since > 0
                        && Duration::from_millis(now.saturating_sub(since)) > stale_after
                        && task.fenced_since_ms.swap(since, Ordering::Relaxed) != since
                    {
                        stale.push((live.job.config().clone(), index, stale_after));
                    }
                }
            }
        }
        for (config, index, stale_after) in stale {
            abort_stale_transaction(&config, index, stale_after);
        }
        for ((tenant, id), live) in ended {
            self.keep_last_run(&tenant, &id, &live);
            let result = live.job.join().map_err(|e| e.to_string());
            if live.released {
                if let Err(reason) = &result {
                    tracing::info!(job = %live.scope, "the job left this host: {reason}");
                }
                continue;
            }
            if let Err(reason) = &result {
                tracing::warn!(job = %live.scope, "job failed: {reason}");
                self.record_failure(&tenant, &id, reason.clone());
            }
            self.finish_pending(
                &tenant,
                &id,
                result.map_err(|reason| ServiceError::internal("the job failed", reason)),
            );
        }
    }

    /// In a cluster: whether another member shows `record`'s tasks running
    /// (or starting, or taking their final checkpoint).
    fn running_elsewhere(&self, record: &JobRecord) -> bool {
        self.busy_elsewhere(record).is_some()
    }

    /// The other member, if any, that shows `record`'s tasks running (or
    /// starting, or taking their final checkpoint).
    fn busy_elsewhere(&self, record: &JobRecord) -> Option<String> {
        let board = self.board.as_ref()?;
        let stopped =
            |p: &crate::cluster::status::Published| matches!(p.status["state"].as_str(), Some("stopped" | "failed"));
        board.others(&record.scope_key(), now_ms()).into_iter().find(|p| !stopped(p)).map(|p| p.host)
    }

    /// In a cluster: finishes the pending stops of jobs this member does not
    /// run once no member shows them running: its own stops, and another
    /// member's once that one has had [`TAKEN_OVER_AFTER`] to finish
    /// it (a stop's desired state is stored before its operation, so the
    /// stop of a member that died is finished all the same). Not sooner:
    /// a member that has just started the job may not have published its
    /// status yet, and would look as if it ran nothing.
    fn settle_remote_stops(&self) {
        if self.board.is_none() {
            return;
        }
        let Ok(operations) = self.meta.pending_operations() else { return };
        let now = now_ms();
        let pending = operations.into_iter().filter(|o| o.operation.kind == "stop" && self.may_settle_stop(o, now));
        for stop in pending {
            let here = lock(&self.jobs).contains_key(&key(&stop.tenant, &stop.operation.job));
            let record = match self.meta.job(&stop.tenant, &stop.operation.job) {
                Ok(Some(record)) => record,
                Ok(None) => {
                    self.finish_operation(&stop.tenant, &stop.operation.id, Ok(()));
                    continue;
                }
                Err(_) => continue,
            };
            if record.desired == Desired::Running {
                let resumed = ServiceError::Conflict("the job was resumed before it had stopped".into());
                self.finish_operation(&stop.tenant, &stop.operation.id, Err(resumed));
                continue;
            }
            if here || self.running_elsewhere(&record) {
                continue;
            }
            self.finish_operation(&stop.tenant, &stop.operation.id, Ok(()));
        }
    }

    /// In a cluster: finishes the pending upgrades and rescales whose record
    /// changed (those of any member: the one that took the call may have
    /// died since) once the change runs everywhere: every task of the new
    /// parallelism running on exactly one member, each under the record's
    /// module and parallelism. One that fails there fails with its reason;
    /// one of a job that is not to run (stopped meanwhile, or deleted) is
    /// done, as on a lone host: the change applies at its next start; one
    /// that another member took and did not switch in time fails
    /// ([`give_up_unswitched`](Self::give_up_unswitched)).
    fn settle_remote_changes(&self) {
        if self.board.is_none() {
            return;
        }
        let Ok(operations) = self.meta.pending_operations() else { return };
        let pending = operations.into_iter().filter(|o| matches!(o.operation.kind.as_str(), "upgrade" | "scale"));
        for change in pending {
            let mine = self.took(&change);
            let (tenant, job) = (&change.tenant, &change.operation.job);
            // Still stopping or switching on this host.
            if matches!(lock(&self.jobs).get(&key(tenant, job)), Some(Slot::Busy(_))) {
                continue;
            }
            let record = match self.meta.job(tenant, job) {
                Ok(Some(record)) => record,
                Ok(None) => {
                    self.finish_operation(tenant, &change.operation.id, Ok(()));
                    continue;
                }
                Err(_) => continue,
            };
            if !switched(&record, &change) {
                // Until the member that took the call has changed the
                // record, only it can tell a change not made yet from one
                // made and changed again (or back) meanwhile. Once the
                // record shows the change, any member judges it alike, so a
                // change whose member died after switching is settled; one
                // whose member died (or stalls) before switching is given
                // up once that member has had its time.
                if !mine {
                    self.give_up_unswitched(&change, now_ms());
                    continue;
                }
                let superseded = ServiceError::Conflict("the job was changed again before this change ran".into());
                self.finish_operation(tenant, &change.operation.id, Err(superseded));
                continue;
            }
            if record.desired != Desired::Running {
                self.finish_operation(tenant, &change.operation.id, Ok(()));
                continue;
            }
            let (tasks, target) = (self.tasks_everywhere(&record), target_of(&record));
            if let Some(failed) = tasks.iter().find(|t| t.phase == TaskPhase::Failed && runs_target(t, &target)) {
                let reason = failed.last_error.clone().unwrap_or_else(|| "a task failed".into());
                let failed = ServiceError::Conflict(format!("task {} failed after the change: {reason}", failed.index));
                self.finish_operation(tenant, &change.operation.id, Err(failed));
                continue;
            }
            if runs_everywhere(&tasks, &target) {
                self.finish_operation(tenant, &change.operation.id, Ok(()));
            }
        }
    }

    /// In a cluster: fails another member's upgrade or rescale that it has
    /// not switched the job's record for within [`TAKEN_OVER_AFTER`]: that
    /// member died before it got there (and may never come back), or lost
    /// the cluster. Written only if neither the operation nor the job's
    /// record changed since this member read them, and the switch is
    /// written only under the same condition
    /// ([`MetaStore::update_job_for`]): if that member is merely slow,
    /// whichever of the two comes first in the cluster's log wins, and a
    /// refused switch leaves the job running as it was.
    ///
    /// [`MetaStore::update_job_for`]: super::meta::MetaStore::update_job_for
    fn give_up_unswitched(&self, change: &StoredOperation, now_ms: u64) {
        if !overdue(change, now_ms) {
            return;
        }
        let (kind, host) = (change.operation.kind.as_str(), change.host.as_deref().unwrap_or("?"));
        let kept = if kind == "scale" { "parallelism" } else { "module" };
        let error = format!(
            "the member that took this {kind} ({host}) did not switch the job within {}s (it stopped, or lost the \
             cluster): the job keeps its {kept} and its desired state; {kind} it again",
            TAKEN_OVER_AFTER.as_secs()
        );
        let (tenant, job, id) = (&change.tenant, &change.operation.job, &change.operation.id);
        let unswitched =
            |stored: &StoredOperation, record: Option<&JobRecord>| record.is_some_and(|r| !switched(r, stored));
        match self.meta.give_up_operation(tenant, job, id, &error, unswitched) {
            Ok(true) => tracing::warn!(tenant = %tenant, job = %job, operation = %id, "{error}"),
            Ok(false) => {}
            Err(e) => tracing::warn!(tenant = %tenant, job = %job, operation = %id, "cannot give up the {kind}: {e}"),
        }
    }

    /// Every task of `record`'s job that this member and the others (by
    /// their fresh published statuses) run.
    fn tasks_everywhere(&self, record: &JobRecord) -> Vec<TaskView> {
        let mut tasks = match lock(&self.jobs).get(&key(&record.tenant, &record.id)) {
            slot @ Some(Slot::Live(_)) => self.local_status_of(record, slot).tasks,
            _ => Vec::new(),
        };
        tasks.extend(self.other_statuses(record).into_iter().flat_map(|(_, status)| status.tasks));
        tasks
    }

    /// Refuses (409) to touch a job's group or state while the job should
    /// run, though it has no threads here: on a lone host it waits to be
    /// started (again, after a start that failed with an error that may
    /// pass), and a delete or reset meanwhile would race that start. In a
    /// cluster, also while another member still shows it running or taking
    /// its final checkpoint.
    fn require_stopped_everywhere(&self, record: &JobRecord) -> Result<()> {
        if record.desired == Desired::Running && record.failure.is_none() {
            return Err(ServiceError::Conflict(format!("job `{}` is running: stop it first", record.id)));
        }
        if self.board.is_none() {
            return Ok(());
        }
        if let Some(host) = self.busy_elsewhere(record) {
            return Err(ServiceError::Conflict(format!(
                "job `{}` is still stopping on host {host}: try again in a moment",
                record.id
            )));
        }
        Ok(())
    }

    /// A member's local state of jobs deleted through any member, or of an
    /// earlier incarnation of a job (created again with the same id, or
    /// reset with its state cleared, through another member): removed once
    /// the job's threads here have ended, before the job can start here
    /// again. At the first pass, every job directory without a job, or
    /// whose stores another incarnation wrote.
    fn forget_deleted_jobs(
        &self,
        jobs: &mut HashMap<(String, String), Slot>,
        records: &[JobRecord],
    ) -> Vec<((String, String), std::path::PathBuf)> {
        let current: HashMap<(String, String), u64> =
            records.iter().map(|r| (key(&r.tenant, &r.id), r.incarnation)).collect();
        let mut seen = lock(&self.seen_jobs);
        let mut doomed = lock(&self.doomed_state);
        match seen.as_ref() {
            None => {
                let state = self.config.data_dir.join("state");
                for tenant in std::fs::read_dir(&state).into_iter().flatten().flatten() {
                    for job in std::fs::read_dir(tenant.path()).into_iter().flatten().flatten() {
                        let key = key(&tenant.file_name().to_string_lossy(), &job.file_name().to_string_lossy());
                        let stale = match current.get(&key) {
                            None => true,
                            Some(&incarnation) => {
                                !jobs.contains_key(&key) && other_incarnation(&job.path(), incarnation)
                            }
                        };
                        if stale {
                            doomed.insert(key);
                        }
                    }
                }
            }
            Some(previous) => {
                for (key, incarnation) in previous {
                    if current.get(key) != Some(incarnation) {
                        doomed.insert(key.clone());
                    }
                }
            }
        }
        *seen = Some(current);
        // Removed by the caller with the jobs lock released, while the
        // job's slot is busy (no start, create or resume meanwhile); a job
        // whose threads still run here waits for a later pass.
        let idle: Vec<(String, String)> = doomed.iter().filter(|job| !jobs.contains_key(*job)).cloned().collect();
        idle.into_iter()
            .map(|(tenant, id)| {
                jobs.insert(key(&tenant, &id), Slot::Busy(Busy::Forgetting));
                let dir = self.config.data_dir.join("state").join(&tenant).join(&id);
                ((tenant, id), dir)
            })
            .collect()
    }

    /// Removes the job directories [`forget_deleted_jobs`](Self::forget_deleted_jobs)
    /// took, with the jobs lock released, and gives their slots back.
    fn remove_forgotten(&self, forgotten: Vec<((String, String), std::path::PathBuf)>) {
        for (job, dir) in forgotten {
            let removed = match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::info!(job = %format!("{}.{}", job.0, job.1), "removed the state of a deleted job, or of an earlier life of it");
                    true
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                Err(e) => {
                    tracing::warn!("removing {}: {e}", dir.display());
                    false
                }
            };
            if removed {
                lock(&self.doomed_state).remove(&job);
            }
            let mut jobs = lock(&self.jobs);
            if matches!(jobs.get(&job), Some(Slot::Busy(Busy::Forgetting))) {
                jobs.remove(&job);
            }
        }
    }

    /// The tasks of `record` this host runs: all of them for a host alone
    /// (`None`); for a cluster member, those whose slots it owns.
    fn tasks_here(&self, record: &JobRecord) -> Option<std::collections::BTreeSet<usize>> {
        let placement = self.placement.as_ref()?;
        let slot = |task| crate::cluster::placement::slot_of(&record.tenant, &record.id, task);
        Some((0..record.spec.parallelism as usize).filter(|&task| placement.owns(slot(task))).collect())
    }

    /// Whether `record`'s module bytes are on this host. A member that just
    /// joined may get a job's tasks before its module follower has the
    /// bytes: the job starts once they are here, rather than failing.
    fn module_here(&self, record: &JobRecord) -> bool {
        self.placement.is_none() || self.module_path(&record.spec.module.to_string_lossy()).is_file()
    }

    /// Whether this host runs any of `record`'s tasks.
    fn placed_here(&self, record: &JobRecord) -> bool {
        self.tasks_here(record).is_none_or(|tasks| !tasks.is_empty())
    }

    /// A cluster member's part of the supervisor: runs the jobs that should
    /// run in its slots and releases the others (stopped, deleted, changed
    /// through another member, or in a slot that moved away), so that each
    /// job runs where Kafka's placement says, as the cluster's record says.
    fn place(self: &Arc<Self>) {
        if self.placement.is_none() || self.shutdown.load(Ordering::Relaxed) {
            return;
        }
        let records = match self.meta.all_jobs() {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!("placing jobs: {e}");
                return;
            }
        };
        let mut starts = Vec::new();
        let mut failures = Vec::new();
        let forgotten = {
            let mut jobs = lock(&self.jobs);
            let forgotten = self.forget_deleted_jobs(&mut jobs, &records);
            let doomed = lock(&self.doomed_state);
            let mut known = std::collections::HashSet::new();
            for record in records {
                let key = key(&record.tenant, &record.id);
                known.insert(key.clone());
                let wanted = record.should_start()
                    && !doomed.contains(&key)
                    && self.placed_here(&record)
                    && self.module_here(&record);
                match jobs.get_mut(&key) {
                    None if wanted && !self.start_retries.is_waiting(&key, std::time::Instant::now()) => {
                        match self.job_config(&record) {
                            Ok(config) => {
                                jobs.insert(key, Slot::Busy(Busy::Starting));
                                starts.push((record, config));
                            }
                            Err(e) => failures.push((record, e.to_string())),
                        }
                    }
                    Some(Slot::Live(live)) if !live.stopping && (!wanted || changed(&live.record, &record)) => {
                        tracing::info!(job = %live.scope, "releasing the job: it runs elsewhere now, or changed");
                        live.stopping = true;
                        live.released = true;
                        live.job.stop();
                    }
                    Some(Slot::Live(live)) if !live.stopping => live.follow_slots(self.tasks_here(&record)),
                    _ => {}
                }
            }
            // A job deleted while it waited to be started again.
            self.start_retries.retain(|key| known.contains(key));
            // Deleted through another member.
            for (key, slot) in jobs.iter_mut() {
                if let Slot::Live(live) = slot
                    && !known.contains(key)
                    && !live.stopping
                {
                    live.stopping = true;
                    live.released = true;
                    live.job.stop();
                }
            }
            forgotten
        };
        self.remove_forgotten(forgotten);
        for (record, reason) in failures {
            self.record_failure(&record.tenant, &record.id, reason);
        }
        if starts.is_empty() {
            return;
        }
        let service = Arc::clone(self);
        let spawned = std::thread::Builder::new().name("sluice-place".into()).spawn(move || {
            for (record, config) in starts {
                tracing::info!(job = %record.scope(), "starting the job: placed on this host");
                service.start(&record, config);
            }
        });
        if let Err(e) = spawned {
            tracing::error!("cannot start placed jobs: {e}");
        }
    }

    /// Finishes the pending stops of a job whose threads ended: in a
    /// cluster, those this member may settle ([`Self::may_settle_stop`]).
    fn finish_pending(&self, tenant: &str, job: &str, result: Result<()>) {
        let pending = match self.meta.operations(tenant) {
            Ok(operations) => operations,
            Err(e) => {
                tracing::error!(tenant, job, "cannot read the job's operations: {e}");
                return;
            }
        };
        // In a cluster, a stop is done once every member's part stopped.
        if result.is_ok() && self.meta.job(tenant, job).ok().flatten().is_some_and(|r| self.running_elsewhere(&r)) {
            return;
        }
        let now = now_ms();
        let stops = pending.into_iter().filter(|o| {
            o.operation.job == job
                && o.operation.state == OperationState::Pending
                && o.operation.kind == "stop"
                && self.may_settle_stop(o, now)
        });
        for stop in stops {
            let result = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(ServiceError::internal("the job failed", e.to_string())),
            };
            self.finish_operation(tenant, &stop.operation.id, result);
        }
    }
}

/// Whether a task store in the job directory `dir` holds the state of
/// another incarnation than `incarnation` (one that cannot be read, as one a
/// task has open, counts as this incarnation's: it is judged again at the
/// task's recovery).
fn other_incarnation(dir: &std::path::Path, incarnation: u64) -> bool {
    let stores = std::fs::read_dir(dir).into_iter().flatten().flatten().filter(|entry| {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        name.starts_with("task-") && name.ends_with(".redb")
    });
    stores.into_iter().any(|store| {
        matches!(crate::checkpoint::CheckpointStore::incarnation_at(&store.path()), Ok(Some(held)) if held != incarnation)
    })
}

/// One job's status from this member's and the other members' (newest
/// first): each task from the member that runs it (this one first), the
/// figures summed over the tasks and members, the state the worst of
/// theirs. The record's own fields (`desired`, `module`) are this member's.
fn merge(mine: JobStatus, me: &str, others: Vec<(String, JobStatus)>) -> JobStatus {
    let mut merged = mine;
    let mut members = Vec::new();
    if !merged.tasks.is_empty() {
        members.push(me.to_owned());
        for task in &mut merged.tasks {
            task.host = Some(me.to_owned());
        }
    }
    let mut seen: std::collections::BTreeSet<usize> = merged.tasks.iter().map(|t| t.index).collect();
    let mut shards: std::collections::BTreeSet<u32> = merged.shards.iter().map(|s| s.shard).collect();
    for (host, theirs) in others {
        let fresh: Vec<TaskView> = theirs.tasks.into_iter().filter(|t| !seen.contains(&t.index)).collect();
        if fresh.is_empty() {
            continue;
        }
        let indices: std::collections::BTreeSet<usize> = fresh.iter().map(|t| t.index).collect();
        for mut task in fresh {
            seen.insert(task.index);
            task.host = Some(host.clone());
            merged.tasks.push(task);
        }
        for shard in theirs.shards.into_iter().filter(|s| indices.contains(&s.task)) {
            if shards.insert(shard.shard) {
                merged.shards.push(shard);
            }
        }
        merged.checkpoints += theirs.checkpoints;
        merged.restored_records += theirs.restored_records;
        merged.restored_bytes += theirs.restored_bytes;
        merged.restore_seconds += theirs.restore_seconds;
        merged.late_records += theirs.late_records;
        merged.timers_fired += theirs.timers_fired;
        merged.last_checkpoint_seconds = merged.last_checkpoint_seconds.max(theirs.last_checkpoint_seconds);
        merged.last_checkpoint_age_seconds =
            match (merged.last_checkpoint_age_seconds, theirs.last_checkpoint_age_seconds) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        merged.uptime_seconds = match (merged.uptime_seconds, theirs.uptime_seconds) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if members.is_empty() || rank(theirs.state) > rank(merged.state) {
            merged.state = theirs.state;
            merged.reason = theirs.reason;
        }
        members.push(host);
    }
    if members.is_empty() {
        return merged;
    }
    merged.tasks.sort_by_key(|t| t.index);
    merged.shards.sort_by_key(|s| s.shard);
    let tasks = &merged.tasks;
    merged.records_in = tasks.iter().map(|t| t.records_in).sum();
    merged.records_out = tasks.iter().map(|t| t.records_out).sum();
    merged.lag_records = tasks.iter().map(|t| t.lag_records).sum();
    merged.last_checkpoint = tasks.iter().map(|t| t.last_checkpoint).min().unwrap_or(0);
    merged.restarts = tasks.iter().map(|t| t.restarts).sum();
    merged.dead_letters = tasks.iter().map(|t| t.dead_letters).sum();
    merged.cpu_seconds = tasks.iter().map(|t| t.cpu_seconds).fold(0.0, |a, b| a + b);
    merged.state_bytes = tasks.iter().map(|t| t.state_bytes).sum();
    merged.hosts = members;
    merged
}

/// Whether `record` holds the change `operation` asked for (its module, or
/// its parallelism).
fn switched(record: &JobRecord, operation: &StoredOperation) -> bool {
    let now = match operation.operation.kind.as_str() {
        "scale" => record.spec.parallelism.to_string(),
        _ => record.spec.module.to_string_lossy().into_owned(),
    };
    operation.target.as_deref() == Some(now.as_str())
}

/// What a job's record says its tasks run: the module digest and the
/// parallelism.
fn target_of(record: &JobRecord) -> (String, u32) {
    (record.spec.module.to_string_lossy().into_owned(), record.spec.parallelism)
}

/// Whether `task` runs under `target`'s module and parallelism.
fn runs_target(task: &TaskView, target: &(String, u32)) -> bool {
    task.module == target.0 && task.parallelism == target.1
}

/// Whether `tasks` (from every member) are exactly `target`'s: each of the
/// job's tasks once (as many as its parallelism, or as its shards when
/// fewer), running (or asleep, after running) under its module and
/// parallelism, and nothing else (no task of an old parallelism or module
/// left).
fn runs_everywhere(tasks: &[TaskView], target: &(String, u32)) -> bool {
    let Some(count) = tasks.first().map(|t| t.tasks) else { return false };
    let mut indices: Vec<usize> = tasks.iter().map(|t| t.index).collect();
    indices.sort_unstable();
    indices == (0..count).collect::<Vec<usize>>()
        && tasks.iter().all(|t| {
            t.tasks == count && matches!(t.phase, TaskPhase::Running | TaskPhase::Sleeping) && runs_target(t, target)
        })
}

/// How much a member's state of a job says about the whole job: the worst
/// one wins.
fn rank(state: JobState) -> u8 {
    match state {
        JobState::Stopped => 0,
        JobState::Running => 1,
        JobState::Stopping => 2,
        JobState::Starting | JobState::Upgrading | JobState::Rescaling => 3,
        JobState::Restarting => 4,
        JobState::Failed => 5,
    }
}

/// Log lines of each running job a member publishes for the others.
const LOG_TAIL: usize = 100;

/// Whether a running job's record changed in a way its threads must be
/// restarted for (its spec, or an upgrade).
fn changed(running: &JobRecord, now: &JobRecord) -> bool {
    let spec = |r: &JobRecord| serde_json::to_value(&r.spec).ok();
    spec(running) != spec(now) || running.upgrades != now.upgrades || running.migrate_from != now.migrate_from
}

/// Removes a job's task stores and the record of their assignment, for a
/// reset that clears the state: the job then starts as a fresh one.
fn remove_state(state_dir: &std::path::Path) -> Result<()> {
    let entries = match std::fs::read_dir(state_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ServiceError::internal(format!("reading {}", state_dir.display()), e)),
    };
    for entry in entries {
        let path = entry.map_err(|e| ServiceError::internal(format!("reading {}", state_dir.display()), e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        // The assignment last: while it is there, so are the stores it names.
        if name.starts_with("task-") && name.ends_with(".redb") {
            std::fs::remove_file(&path)
                .map_err(|e| ServiceError::internal(format!("removing {}", path.display()), e))?;
        }
    }
    match std::fs::remove_file(state_dir.join("assignment.json")) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ServiceError::internal("removing the job's assignment record", e)),
    }
}

/// A task has held a transaction open for longer than `stale_after` (it
/// hangs, or checkpoints take far too long). Read_committed consumers of its
/// output topics are stuck behind it until it ends, so the host ends it now:
/// fencing the transactional id aborts the transaction, and the task, on its
/// next Kafka call, fails and restarts from its last checkpoint.
fn abort_stale_transaction(config: &JobConfig, index: usize, stale_after: Duration) {
    let id = config.transactional_id(index);
    tracing::warn!(task = %config.task_name(index), "transaction open for more than {stale_after:?}; aborting it");
    let client = kafka::client_config(&config.brokers, &config.kafka);
    if let Err(e) = kafka::Sink::fence(&client, &id, Duration::from_secs(10)) {
        tracing::warn!(task = %config.task_name(index), "cannot abort the stale transaction: {e}");
    }
}

/// How many finished operations the host remembers per tenant.
const KEPT_OPERATIONS: usize = 100;

/// How long a member leaves another member's pending operation to it
/// before it settles it itself: a stop it finishes (once nothing runs), an
/// upgrade or a rescale not switched yet it fails. Well past the time a
/// live member takes to publish a status change or to stop its part of a
/// job, and past the [`FRESH_FOR`] after which a dead member's last status
/// no longer shows.
///
/// [`FRESH_FOR`]: crate::cluster::status::FRESH_FOR
const TAKEN_OVER_AFTER: Duration = Duration::from_secs(60);

/// Whether the member that took `operation` has had [`TAKEN_OVER_AFTER`]
/// to settle it by `now_ms`.
fn overdue(operation: &StoredOperation, now_ms: u64) -> bool {
    now_ms.saturating_sub(operation.created_ms) >= TAKEN_OVER_AFTER.as_millis() as u64
}

/// Locks `mutex`, also after a panic in another holder: every critical
/// section here leaves the data whole (single inserts and removals), so one
/// failed call must not turn every later call, of every tenant, into an
/// error.
pub(super) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The view of task `index` of a job started from `running`'s record, with
/// `running`'s number of tasks.
fn task_view(index: usize, task: &TaskStatus, running: (&JobRecord, usize), now: u64, timeout: Duration) -> TaskView {
    let (record, tasks) = running;
    let since = task.transaction_since_ms.load(Ordering::Relaxed);
    TaskView {
        index,
        shards: task.shards(),
        phase: task.phase(),
        last_error: task.last_error(),
        records_in: task.records_in.load(Ordering::Relaxed),
        records_out: task.records_out.load(Ordering::Relaxed),
        lag_records: task.lag_records.load(Ordering::Relaxed),
        last_checkpoint: task.last_checkpoint.load(Ordering::Relaxed),
        restarts: task.restarts.load(Ordering::Relaxed),
        dead_letters: task.dead_letters.load(Ordering::Relaxed),
        cpu_seconds: task.cpu_micros.load(Ordering::Relaxed) as f64 / 1e6,
        state_bytes: task.state_bytes.load(Ordering::Relaxed),
        transaction: (since > 0).then(|| TransactionView {
            open_seconds: now.saturating_sub(since) as f64 / 1e3,
            timeout_seconds: timeout.as_secs_f64(),
        }),
        host: None,
        module: record.spec.module.to_string_lossy().into_owned(),
        code: task.code(),
        parallelism: record.spec.parallelism,
        tasks,
        partitions: task.partition_lag.lock().map(|p| p.clone()).unwrap_or_default(),
    }
}

/// Starts the supervisor thread; it ends when the service shuts down.
pub(super) fn spawn_supervisor(service: &Arc<Service>) {
    let weak = Arc::downgrade(service);
    let spawned = std::thread::Builder::new().name("sluice-supervisor".into()).spawn(move || {
        loop {
            std::thread::sleep(SUPERVISE_EVERY);
            let Some(service) = weak.upgrade() else { return };
            if service.shutdown.load(Ordering::Relaxed) {
                return;
            }
            service.supervise();
            service.retry_starts();
            service.sample_throughput();
            service.place();
            service.publish_statuses();
            service.settle_remote_stops();
            service.settle_remote_changes();
            service.sweep_modules();
        }
    });
    if let Err(e) = spawned {
        tracing::error!("cannot start the supervisor thread: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member's status of a job with `tasks` (index, records in).
    fn status(state: &str, tasks: &[(usize, u64)]) -> JobStatus {
        let tasks: Vec<serde_json::Value> = tasks
            .iter()
            .map(|&(index, records)| {
                serde_json::json!({"index": index, "shards": [index], "phase": "running", "last_error": null,
                    "records_in": records, "records_out": records, "lag_records": 1, "last_checkpoint": 7,
                    "restarts": 0, "dead_letters": 0, "cpu_seconds": 0.5, "state_bytes": 10, "transaction": null})
            })
            .collect();
        let shards: Vec<serde_json::Value> = tasks
            .iter()
            .map(|t| {
                serde_json::json!({"shard": t["index"], "task": t["index"], "keys": 1, "bytes": 10,
                    "last_checkpoint": 7, "origin": {"from": "local"}, "watermark": null})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "id": "j", "module": "m", "state": state, "desired": "running", "reason": null,
            "records_in": 0, "records_out": 0, "lag_records": 0, "last_checkpoint": 0,
            "last_checkpoint_seconds": 0.1, "last_checkpoint_age_seconds": 1.0, "checkpoints": 3, "restarts": 0,
            "dead_letters": 0, "cpu_seconds": 0.0, "state_bytes": 0, "uptime_seconds": 5.0, "restored_records": 0,
            "restored_bytes": 0, "restore_seconds": 0.0, "late_records": 2, "timers_fired": 0,
            "tasks": tasks, "shards": shards,
        }))
        .expect("a status")
    }

    #[test]
    fn a_jobs_status_merges_the_tasks_of_every_member() {
        let mine = status("running", &[(0, 100)]);
        // Another member runs task 1; a stale status of a third still shows
        // task 0, which this member runs now.
        let others = vec![
            ("b".to_owned(), status("restarting", &[(1, 50)])),
            ("c".to_owned(), status("running", &[(0, 10), (2, 5)])),
        ];
        let merged = merge(mine, "a", others);
        let owners: Vec<(usize, Option<&str>)> = merged.tasks.iter().map(|t| (t.index, t.host.as_deref())).collect();
        assert_eq!(owners, [(0, Some("a")), (1, Some("b")), (2, Some("c"))]);
        assert_eq!(merged.records_in, 155, "task 0 counted once, from the member that runs it");
        assert_eq!(merged.hosts, ["a", "b", "c"]);
        assert_eq!(merged.state, JobState::Restarting, "the worst member's state");
        assert_eq!(merged.late_records, 6);
        assert_eq!(merged.shards.iter().map(|s| s.shard).collect::<Vec<_>>(), [0, 1, 2]);
    }

    /// Task `index` of `tasks`, running `module` under `parallelism`.
    fn task(index: usize, tasks: usize, module: &str, parallelism: u32) -> TaskView {
        let mut view = status("running", &[(index, 1)]).tasks.remove(0);
        (view.tasks, view.module, view.parallelism) = (tasks, module.to_owned(), parallelism);
        view
    }

    #[test]
    fn a_change_runs_everywhere_once_every_task_runs_it_and_nothing_old_does() {
        let target = ("new".to_owned(), 2);
        let both = [task(0, 2, "new", 2), task(1, 2, "new", 2)];
        assert!(runs_everywhere(&both, &target));
        // Task 1 of another member still runs the old module.
        assert!(!runs_everywhere(&[task(0, 2, "new", 2), task(1, 2, "old", 2)], &target));
        // Task 1 has not started anywhere yet.
        assert!(!runs_everywhere(&[task(0, 2, "new", 2)], &target));
        // Task 2 of the old parallelism still runs.
        assert!(!runs_everywhere(&[task(0, 2, "new", 2), task(1, 2, "new", 2), task(2, 3, "new", 3)], &target));
        // Task 1 is starting.
        let mut starting = both.clone();
        starting[1].phase = TaskPhase::Starting;
        assert!(!runs_everywhere(&starting, &target));
        // Nothing runs at all.
        assert!(!runs_everywhere(&[], &target));
    }

    #[test]
    fn a_parallelism_above_the_shards_runs_everywhere_with_as_many_tasks_as_shards() {
        // Parallelism 8 over 4 input partitions: 4 tasks.
        let target = ("m".to_owned(), 8);
        let four: Vec<TaskView> = (0..4).map(|i| task(i, 4, "m", 8)).collect();
        assert!(runs_everywhere(&four, &target));
        assert!(!runs_everywhere(&four[..3], &target));
    }

    #[test]
    fn a_job_no_member_runs_keeps_its_own_status() {
        let mine = status("stopped", &[]);
        let merged = merge(mine, "a", vec![("b".to_owned(), status("stopped", &[]))]);
        assert_eq!(merged.state, JobState::Stopped);
        assert!(merged.hosts.is_empty() && merged.tasks.is_empty());
    }
}
