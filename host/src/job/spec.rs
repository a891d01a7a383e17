//! Job files: what a user writes (TOML), parsed and then validated into a
//! [`JobConfig`] before anything starts, so a bad file fails with a message
//! that names the field.
//!
//! ```toml
//! id = "clicks-per-user"            # names the consumer group and transactional ids
//! brokers = "127.0.0.1:9092"
//! module = "running_count.wasm"     # relative to the job file
//! parallelism = 2                   # tasks; input partitions are spread over them (change it and
//!                                   # start again: each partition's state moves to its new task)
//!
//! [input]
//! topics = ["clicks"]
//! start = "earliest"                # or "latest", for partitions with no committed offset
//! sleep-after = "30s"               # default: a task with no input this long (and no timer due)
//!                                   # lets go of its Kafka clients and guest until a record
//!                                   # arrives (its first record then waits for a restart from
//!                                   # the last checkpoint, a fraction of a second); "off": never.
//!                                   # In a cluster, a task holding part of the job waits until
//!                                   # all of the job is idle (docs/cluster.md, "Idle jobs")
//!
//! [output]
//! topics = ["click-counts"]         # the first is the default
//!
//! [checkpoint]
//! interval = "1s"                   # also the latency floor of committed output
//! heartbeat = "1h"                  # commit at least this often, even with no input
//!
//! [state]
//! changelog = true                  # default: each checkpoint's state changes also go, in its
//!                                   # transaction, to a compacted topic, from which a lost state
//!                                   # directory is restored; false: a lost one refuses to start
//! changelog-topic = "clicks-state"  # default `sluice.<id>.changelog`, created by sluice
//!
//! [time]                            # event time (the records' Kafka timestamps), for timers
//! max-out-of-orderness = "2s"       # default 0s: how late a record may be and not count as late
//! idle-timeout = "10s"              # default none: a partition that sends nothing holds the
//!                                   # watermark back; with it, one idle this long stops doing so
//!
//! [transform.config]                # passed to the guest's init
//! some-key = "some value"
//!
//! [limits]
//! memory = "128MiB"
//! deadline = "5s"                   # CPU time per call into the guest
//! max-outputs-per-input = 100      # or per fired timer (the SDKs' windows close 64 per firing)
//! state = "1GiB"                    # keys plus values per task; default: no limit
//!
//! [errors]                          # a record the transform fails on every time:
//! policy = "dead-letter"            # "fail" (the default: the job fails) or "dead-letter"
//! dead-letter-topic = "clicks-dlq"  # with its error, job, topic, partition and offset in headers
//! attempts = 3                      # tries (each from the last checkpoint) before the policy
//!
//! [kafka]                           # extra librdkafka properties for every client
//! "transaction.timeout.ms" = "60000"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checkpoint::Migration;
use crate::kafka::StartPosition;
use crate::runtime::InstanceLimits;
use crate::units::{parse_duration, parse_size};

/// A job file as written.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct JobSpec {
    /// The job id: letters, digits, `.`, `_`, `-` (on a shared host, no `.`).
    #[schema(pattern = "^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}$")]
    pub id: String,
    /// Kafka bootstrap servers. Job files only: a shared host chooses them.
    #[serde(default = "default_brokers")]
    #[schema(ignore)]
    pub brokers: String,
    /// The transform component; relative paths are relative to the job file.
    /// On a shared host (`sluice serve`): an uploaded module's digest or name.
    #[schema(value_type = String, min_length = 1)]
    pub module: PathBuf,
    /// How many tasks.
    #[serde(default = "default_parallelism")]
    #[schema(minimum = 1, maximum = 256)]
    pub parallelism: u32,
    /// Records per call into the guest, at most.
    #[serde(default = "default_batch_size")]
    #[schema(minimum = 1, maximum = 100000)]
    pub batch_size: usize,
    /// Where the tasks' redb files go; default `.sluice/state/<id>` next to
    /// the job file. Job files only: a shared host chooses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub state_dir: Option<PathBuf>,
    /// Input topics.
    pub input: InputSpec,
    /// Output topics.
    pub output: OutputSpec,
    /// Checkpointing.
    #[serde(default)]
    pub checkpoint: CheckpointSpec,
    /// Where state is kept besides the local stores.
    #[serde(default)]
    pub state: StateSpec,
    /// Event time and watermarks.
    #[serde(default)]
    pub time: TimeSpec,
    /// The transform's configuration.
    #[serde(default)]
    pub transform: TransformSpec,
    /// The guest's limits.
    #[serde(default)]
    pub limits: LimitsSpec,
    /// What happens to a record the transform fails on every time.
    #[serde(default)]
    pub errors: ErrorsSpec,
    /// Extra librdkafka properties for every client of the job.
    #[serde(default)]
    pub kafka: BTreeMap<String, String>,
}

/// `[errors]`: what happens to a record the transform fails on every time
/// (a trap, an error it returns, a limit, an output to an undeclared topic
/// or over the broker's message size).
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ErrorsSpec {
    /// `fail` (the job fails with the reason) or `dead-letter` (the record
    /// goes to `dead-letter-topic`, in the same transaction as the rest of
    /// its checkpoint, and the job moves on).
    #[serde(default)]
    pub policy: ErrorPolicyName,
    /// Where dead letters go; required with `policy = "dead-letter"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_topic: Option<String>,
    /// How many times a failing record is tried (each try restarts the task
    /// from its last checkpoint) before the policy applies.
    #[serde(default = "default_attempts")]
    #[schema(minimum = 1, maximum = 100)]
    pub attempts: u32,
}

impl Default for ErrorsSpec {
    fn default() -> Self {
        ErrorsSpec { policy: ErrorPolicyName::Fail, dead_letter_topic: None, attempts: default_attempts() }
    }
}

/// `errors.policy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorPolicyName {
    /// The job fails with the reason.
    #[default]
    Fail,
    /// The record goes to the dead-letter topic.
    DeadLetter,
}

/// What a job does with a record that fails every time, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorPolicy {
    /// The job fails with the reason.
    Fail,
    /// The record goes to this topic, with headers naming the error, the
    /// job and where it came from.
    DeadLetter {
        /// The dead-letter topic.
        topic: String,
    },
}

impl ErrorPolicy {
    /// The dead-letter topic, if records go to one.
    pub fn dead_letter_topic(&self) -> Option<&str> {
        match self {
            ErrorPolicy::DeadLetter { topic } => Some(topic),
            ErrorPolicy::Fail => None,
        }
    }
}

/// `[input]`.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct InputSpec {
    /// Topics to read.
    #[schema(min_items = 1)]
    pub topics: Vec<String>,
    /// Where partitions without a committed offset start.
    #[serde(default)]
    pub start: StartPosition,
    /// How long a task goes without input (and with no timer due) before
    /// it sleeps, e.g. `"30s"`, or `"off"`. A sleeping task holds no Kafka
    /// client and no guest instance; a record wakes it, and it restarts
    /// from its last checkpoint. In a cluster, a task that holds only some
    /// of the job's shards sleeps once the whole job has been idle this
    /// long, and its shards go to the tasks that stay. Default `"30s"`; at
    /// least `"1s"`.
    #[serde(default = "default_sleep_after")]
    #[schema(pattern = "^(off|[0-9]{1,9} ?(ns|us|ms|s|m|h|d)( [0-9]{1,9} ?(ns|us|ms|s|m|h|d)){0,3})$")]
    pub sleep_after: String,
}

/// `[output]`.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct OutputSpec {
    /// Topics the transform may write; the first is the default. Each must
    /// exist: sluice never has the broker create one.
    #[schema(min_items = 1)]
    pub topics: Vec<String>,
}

/// `[checkpoint]`.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CheckpointSpec {
    /// How often, e.g. `"1s"` or `"100ms"`.
    #[serde(default = "default_interval")]
    #[schema(pattern = "^[0-9]{1,9} ?(ns|us|ms|s|m|h|d)( [0-9]{1,9} ?(ns|us|ms|s|m|h|d)){0,3}$")]
    pub interval: String,
    /// The longest a task goes without committing a checkpoint when no input
    /// arrives: Kafka expires a group's offsets after the broker's
    /// `offsets.retention.minutes` (7 days by default) without a commit, and
    /// a job whose offsets expired cannot restart. Keep it well under that.
    #[serde(default = "default_heartbeat")]
    #[schema(pattern = "^[0-9]{1,9} ?(ns|us|ms|s|m|h|d)( [0-9]{1,9} ?(ns|us|ms|s|m|h|d)){0,3}$")]
    pub heartbeat: String,
}

impl Default for CheckpointSpec {
    fn default() -> Self {
        CheckpointSpec { interval: default_interval(), heartbeat: default_heartbeat() }
    }
}

/// `[state]`.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct StateSpec {
    /// Whether each checkpoint's state changes also go, in the checkpoint's
    /// transaction, to a compacted changelog topic (one partition per
    /// shard), from which a task restores a shard whose local state is
    /// missing or behind. Without it, a lost state directory refuses to
    /// start.
    #[serde(default = "default_changelog")]
    pub changelog: bool,
    /// The changelog topic; default `sluice.<scope>.changelog`, created
    /// with `cleanup.policy=compact` if missing. Job files only: a shared
    /// host names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub changelog_topic: Option<String>,
}

impl Default for StateSpec {
    fn default() -> Self {
        StateSpec { changelog: default_changelog(), changelog_topic: None }
    }
}

fn default_changelog() -> bool {
    true
}

/// `[time]`: how the watermark follows the records' Kafka timestamps.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TimeSpec {
    /// How far behind the largest timestamp seen on a partition the
    /// watermark stays, e.g. `"2s"`: a record at most this much out of order
    /// is not late. Default `0s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]{1,9} ?(ns|us|ms|s|m|h|d)( [0-9]{1,9} ?(ns|us|ms|s|m|h|d)){0,3}$")]
    pub max_out_of_orderness: Option<String>,
    /// A partition that sends nothing for this long stops holding the
    /// watermark back, e.g. `"10s"`. Default: none (an idle partition holds
    /// it, so a window over it closes only when it sends again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]{1,9} ?(ns|us|ms|s|m|h|d)( [0-9]{1,9} ?(ns|us|ms|s|m|h|d)){0,3}$")]
    pub idle_timeout: Option<String>,
}

/// `[transform]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TransformSpec {
    /// Passed to the guest's `init`.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
}

/// `[limits]`.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LimitsSpec {
    /// Guest memory, e.g. `"128MiB"`.
    #[serde(default = "default_memory")]
    #[schema(pattern = "^[0-9]{1,9} ?([bB]|[kKmMgG]([iI]?[bB])?)?$")]
    pub memory: String,
    /// CPU time per call into the guest, e.g. `"5s"` (the thread's: the
    /// guest's code and its state calls; waiting for a core does not count).
    #[serde(default = "default_deadline")]
    #[schema(pattern = "^[0-9]{1,9} ?(ns|us|ms|s|m|h|d)( [0-9]{1,9} ?(ns|us|ms|s|m|h|d)){0,3}$")]
    pub deadline: String,
    /// Output records per input record or fired timer. The SDKs' windows
    /// close up to 64 windows per firing of a window end's timer, so a job
    /// with windows needs at least 64.
    #[serde(default = "default_max_outputs")]
    #[schema(minimum = 1)]
    pub max_outputs_per_input: u32,
    /// Bytes of keys and values each task's state may hold, e.g. `"1GiB"`;
    /// absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]{1,9} ?([bB]|[kKmMgG]([iI]?[bB])?)?$")]
    pub state: Option<String>,
}

impl Default for LimitsSpec {
    fn default() -> Self {
        LimitsSpec {
            memory: default_memory(),
            deadline: default_deadline(),
            max_outputs_per_input: default_max_outputs(),
            state: None,
        }
    }
}

fn default_brokers() -> String {
    "127.0.0.1:9092".into()
}
fn default_parallelism() -> u32 {
    1
}
fn default_batch_size() -> usize {
    512
}
fn default_interval() -> String {
    "1s".into()
}
fn default_attempts() -> u32 {
    3
}
fn default_sleep_after() -> String {
    "30s".into()
}

fn default_heartbeat() -> String {
    "1h".into()
}
fn default_memory() -> String {
    "128MiB".into()
}
fn default_deadline() -> String {
    "5s".into()
}
fn default_max_outputs() -> u32 {
    100
}

/// A job file that failed to parse or validate.
#[derive(Debug, thiserror::Error)]
#[error("job file {}: {message}", path.display())]
pub struct SpecError {
    /// The file (or `<spec>` for a spec that came from elsewhere).
    pub path: PathBuf,
    /// What is wrong.
    pub message: String,
}

/// Where a validated job lives on the host: which module file it runs, where
/// its state goes, and the scope that names its Kafka consumer group,
/// transactional ids and log lines.
#[derive(Debug, Clone)]
pub struct Placement {
    /// Unique among the jobs sharing a Kafka cluster: the job id for a job
    /// file, `<tenant>.<job>` on a shared host.
    pub scope: String,
    /// The module file.
    pub module: PathBuf,
    /// Where the tasks' redb files go.
    pub state_dir: PathBuf,
}

/// A validated job.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// The job id.
    pub id: String,
    /// Names the consumer group, transactional ids and log lines (see
    /// [`Placement::scope`]).
    pub scope: String,
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// The module file.
    pub module: PathBuf,
    /// Tasks.
    pub parallelism: usize,
    /// Records per guest call.
    pub batch_size: usize,
    /// Where the tasks' redb files go.
    pub state_dir: PathBuf,
    /// Input topics.
    pub input_topics: Vec<String>,
    /// Start position for partitions without a committed offset.
    pub start: StartPosition,
    /// How long a task goes without input before it sleeps (`None`: never).
    pub sleep_after: Option<Duration>,
    /// Output topics.
    pub output_topics: Vec<String>,
    /// Checkpoint interval.
    pub checkpoint_interval: Duration,
    /// The transform's config.
    pub transform_config: Vec<(String, String)>,
    /// The guest's limits.
    pub limits: InstanceLimits,
    /// Extra librdkafka properties.
    pub kafka: BTreeMap<String, String>,
    /// After an upgrade: the module that wrote the state, for the new
    /// module's `migrate` hook.
    pub migrate_from: Option<Migration>,
    /// The longest a task goes without committing, even with no input.
    pub heartbeat: Duration,
    /// What happens to a record that fails every time.
    pub errors: ErrorPolicy,
    /// Tries of a failing record before `errors` applies.
    pub attempts: u32,
    /// The changelog topic, unless the job turned it off.
    pub changelog: Option<String>,
    /// Event time.
    pub time: crate::time::TimeConfig,
    /// The tasks this process runs, by index (`None`: all of them). In a
    /// cluster, each member runs the tasks placed on it.
    pub run_tasks: Option<std::collections::BTreeSet<usize>>,
    /// Whether the tasks are members of the job's consumer group and read
    /// the whole shards Kafka assigns them (in a cluster, where a shard
    /// moves between hosts through its changelog), rather than a fixed
    /// share of the partitions each.
    pub group_members: bool,
    /// The job's incarnation (see [`crate::checkpoint::TaskSetup::incarnation`]):
    /// on the shared host, the job record's; 0 for `sluice run`.
    pub incarnation: u64,
}

impl JobConfig {
    /// The consumer group whose committed offsets are the job's checkpoints.
    pub fn group(&self) -> String {
        format!("sluice.{}", self.scope)
    }

    /// The transactional id of task `index`.
    pub fn transactional_id(&self, index: usize) -> String {
        format!("sluice.{}.{index}", self.scope)
    }

    /// The name of task `index` in logs: `<scope>/<index>`.
    pub fn task_name(&self, index: usize) -> String {
        format!("{}/{index}", self.scope)
    }

    /// The topics the job writes to: the outputs (the first is the
    /// default), then the dead-letter topic if there is one.
    pub fn sink_topics(&self) -> Vec<String> {
        self.output_topics
            .iter()
            .map(String::as_str)
            .chain(self.errors.dead_letter_topic())
            .map(str::to_owned)
            .collect()
    }
}

impl JobSpec {
    /// Reads and parses a job file.
    pub fn from_file(path: &Path) -> Result<JobSpec, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SpecError { path: path.to_owned(), message: format!("cannot read it: {e}") })?;
        toml::from_str(&text).map_err(|e| SpecError { path: path.to_owned(), message: e.to_string() })
    }

    /// Checks every field of a job file and resolves its paths against
    /// `base_dir`.
    pub fn validate(&self, path: &Path, base_dir: &Path) -> Result<JobConfig, SpecError> {
        let module = base_dir.join(&self.module);
        if !module.is_file() {
            return Err(SpecError {
                path: path.to_owned(),
                message: format!("`module`: no file at {}", module.display()),
            });
        }
        let state_dir = match &self.state_dir {
            Some(dir) => base_dir.join(dir),
            None => base_dir.join(".sluice").join("state").join(&self.id),
        };
        self.validate_at(path, Placement { scope: self.id.clone(), module, state_dir })
    }

    /// Checks every field; the job runs the module and keeps its state where
    /// `placement` says (`module` and `state-dir` are not looked at).
    pub fn validate_at(&self, path: &Path, placement: Placement) -> Result<JobConfig, SpecError> {
        let fail = |message: String| SpecError { path: path.to_owned(), message };
        if self.id.is_empty()
            || self.id.len() > 100
            || !self.id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(fail(format!(
                "`id = {:?}`: use 1-100 letters, digits, `.`, `_` or `-` (it names the consumer group and transactional ids)",
                self.id
            )));
        }
        if self.brokers.trim().is_empty() {
            return Err(fail("`brokers` is empty".into()));
        }
        if self.input.topics.is_empty() {
            return Err(fail("`input.topics` names no topic".into()));
        }
        if self.output.topics.is_empty() {
            return Err(fail("`output.topics` names no topic".into()));
        }
        for topic in self.input.topics.iter().chain(&self.output.topics).chain(&self.errors.dead_letter_topic) {
            if topic.is_empty() || !topic.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
                return Err(fail(format!("topic name {topic:?} is not a valid Kafka topic name")));
            }
        }
        if let Some(topic) = self.output.topics.iter().find(|t| self.input.topics.contains(t)) {
            return Err(fail(format!(
                "topic `{topic}` is both an input and an output; the job would read its own output"
            )));
        }
        if !(1..=256).contains(&self.parallelism) {
            return Err(fail(format!("`parallelism = {}`: use 1 to 256", self.parallelism)));
        }
        if !(1..=100_000).contains(&self.batch_size) {
            return Err(fail(format!("`batch-size = {}`: use 1 to 100000", self.batch_size)));
        }
        let interval =
            parse_duration(&self.checkpoint.interval).map_err(|e| fail(format!("`checkpoint.interval`: {e}")))?;
        if interval < Duration::from_millis(10) {
            return Err(fail(format!("`checkpoint.interval = {:?}` is below 10ms", self.checkpoint.interval)));
        }
        let memory = parse_size(&self.limits.memory).map_err(|e| fail(format!("`limits.memory`: {e}")))?;
        if memory < (1 << 20) {
            return Err(fail(format!("`limits.memory = {:?}` is below 1MiB", self.limits.memory)));
        }
        let deadline = parse_duration(&self.limits.deadline).map_err(|e| fail(format!("`limits.deadline`: {e}")))?;
        if deadline.is_zero() {
            return Err(fail("`limits.deadline` is zero".into()));
        }
        // A checkpoint's transaction holds records for up to one interval,
        // plus the last batch's guest call, plus the snapshot, flush and
        // commit; the host fences a transaction open longer than
        // `stale_transaction_after` as hung. The two must agree.
        let transaction_timeout = crate::kafka::transaction_timeout(&self.kafka);
        let stale_after = crate::kafka::stale_transaction_after(transaction_timeout);
        let longest = interval.checked_add(deadline).and_then(|d| d.checked_add(crate::kafka::COMMIT_MARGIN));
        if longest.is_none_or(|longest| longest > stale_after) {
            return Err(fail(format!(
                "`checkpoint.interval = {:?}` plus `limits.deadline = {:?}` plus {}s for the commit must be at most \
                 {} ms, three quarters of the producers' `transaction.timeout.ms` ({} ms): each checkpoint's \
                 transaction must commit well before the host or the broker would abort it",
                self.checkpoint.interval,
                self.limits.deadline,
                crate::kafka::COMMIT_MARGIN.as_secs(),
                stale_after.as_millis(),
                transaction_timeout.as_millis()
            )));
        }
        let heartbeat =
            parse_duration(&self.checkpoint.heartbeat).map_err(|e| fail(format!("`checkpoint.heartbeat`: {e}")))?;
        if heartbeat < interval || heartbeat > Duration::from_secs(24 * 3600) {
            return Err(fail(format!(
                "`checkpoint.heartbeat = {:?}`: use at least the interval and at most 24h (well under the broker's \
                 offsets retention)",
                self.checkpoint.heartbeat
            )));
        }
        let sleep_after = match self.input.sleep_after.as_str() {
            "off" => None,
            text => {
                let after = parse_duration(text).map_err(|e| fail(format!("`input.sleep-after`: {e}")))?;
                if after < Duration::from_secs(1) {
                    return Err(fail(format!("`input.sleep-after = {text:?}` is below 1s (or say \"off\")")));
                }
                Some(after)
            }
        };
        let errors = match (self.errors.policy, &self.errors.dead_letter_topic) {
            (ErrorPolicyName::Fail, None) => ErrorPolicy::Fail,
            (ErrorPolicyName::Fail, Some(_)) => {
                return Err(fail(
                    "`errors.dead-letter-topic` is set but `errors.policy` is not \"dead-letter\"".into(),
                ));
            }
            (ErrorPolicyName::DeadLetter, None) => {
                return Err(fail("`errors.policy = \"dead-letter\"` needs `errors.dead-letter-topic`".into()));
            }
            (ErrorPolicyName::DeadLetter, Some(topic)) => {
                if self.input.topics.contains(topic) || self.output.topics.contains(topic) {
                    return Err(fail(format!(
                        "`errors.dead-letter-topic = {topic:?}` is one of the job's input or output topics"
                    )));
                }
                ErrorPolicy::DeadLetter { topic: topic.clone() }
            }
        };
        if !(1..=100).contains(&self.errors.attempts) {
            return Err(fail(format!("`errors.attempts = {}`: use 1 to 100", self.errors.attempts)));
        }
        if self.limits.max_outputs_per_input == 0 {
            return Err(fail("`limits.max-outputs-per-input` is zero".into()));
        }
        for key in self.kafka.keys() {
            if matches!(
                key.as_str(),
                "bootstrap.servers" | "group.id" | "transactional.id" | "isolation.level" | "enable.auto.commit"
            ) {
                return Err(fail(format!("`kafka.\"{key}\"` is set by sluice itself and cannot be overridden")));
            }
        }
        if let Some(key) = self.transform.config.keys().find(|k| k.starts_with("sluice.")) {
            return Err(fail(format!(
                "`transform.config.{key}`: keys starting with `sluice.` are reserved for the host"
            )));
        }
        let max_state_bytes = match &self.limits.state {
            Some(text) => Some(parse_size(text).map_err(|e| fail(format!("`limits.state`: {e}")))? as u64),
            None => None,
        };
        let max_out_of_orderness = match &self.time.max_out_of_orderness {
            Some(text) => parse_duration(text).map_err(|e| fail(format!("`time.max-out-of-orderness`: {e}")))?,
            None => Duration::ZERO,
        };
        let idle_timeout = match &self.time.idle_timeout {
            Some(text) => {
                let timeout = parse_duration(text).map_err(|e| fail(format!("`time.idle-timeout`: {e}")))?;
                if timeout < Duration::from_millis(1) {
                    return Err(fail(format!("`time.idle-timeout = {text:?}` is below 1ms")));
                }
                Some(timeout)
            }
            None => None,
        };
        let changelog = match (self.state.changelog, &self.state.changelog_topic) {
            (false, _) => None,
            (true, Some(topic)) => Some(topic.clone()),
            (true, None) => Some(format!("sluice.{}.changelog", placement.scope)),
        };
        Ok(JobConfig {
            id: self.id.clone(),
            scope: placement.scope,
            brokers: self.brokers.clone(),
            module: placement.module,
            parallelism: self.parallelism as usize,
            batch_size: self.batch_size,
            state_dir: placement.state_dir,
            input_topics: self.input.topics.clone(),
            start: self.input.start,
            sleep_after,
            output_topics: self.output.topics.clone(),
            checkpoint_interval: interval,
            transform_config: self.transform.config.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            limits: InstanceLimits {
                memory_bytes: memory,
                deadline,
                max_outputs_per_input: self.limits.max_outputs_per_input,
                max_state_bytes,
            },
            kafka: self.kafka.clone(),
            migrate_from: None,
            heartbeat,
            errors,
            attempts: self.errors.attempts,
            changelog,
            time: crate::time::TimeConfig { max_out_of_orderness, idle_timeout },
            run_tasks: None,
            group_members: false,
            incarnation: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<JobConfig, SpecError> {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("t.wasm"), b"x").expect("module file");
        let spec: JobSpec =
            toml::from_str(text).map_err(|e| SpecError { path: "job.toml".into(), message: e.to_string() })?;
        spec.validate(Path::new("job.toml"), dir.path())
    }

    const MINIMAL: &str = "id = \"j\"\nmodule = \"t.wasm\"\n[input]\ntopics = [\"in\"]\n[output]\ntopics = [\"out\"]\n";

    #[test]
    fn a_minimal_file_gets_the_defaults() {
        let config = parse(MINIMAL).expect("valid");
        assert_eq!(config.checkpoint_interval, Duration::from_secs(1));
        assert_eq!(config.parallelism, 1);
        assert_eq!(config.start, StartPosition::Earliest);
        assert_eq!(config.sleep_after, Some(Duration::from_secs(30)));
        assert_eq!(config.group(), "sluice.j");
        assert_eq!(config.transactional_id(3), "sluice.j.3");
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            (MINIMAL.replace("id = \"j\"", "id = \"no spaces\""), "`id"),
            (format!("{MINIMAL}[checkpoint]\ninterval = \"soon\"\n"), "checkpoint.interval"),
            (format!("{MINIMAL}[checkpoint]\ninterval = \"1ms\"\n"), "below 10ms"),
            (
                format!("{MINIMAL}[checkpoint]\ninterval = \"45s\"\n"),
                "three quarters of the producers' `transaction.timeout.ms`",
            ),
            (format!("{MINIMAL}[checkpoint]\ninterval = \"36s\"\n"), "plus `limits.deadline"),
            (format!("{MINIMAL}[checkpoint]\ninterval = \"99999999999999999h\"\n"), "checkpoint.interval"),
            (format!("{MINIMAL}[checkpoint]\nheartbeat = \"30d\"\n"), "checkpoint.heartbeat"),
            (format!("{MINIMAL}[limits]\nmemory = \"lots\"\n"), "limits.memory"),
            (MINIMAL.replace("topics = [\"in\"]", "topics = [\"in\"]\nsleep-after = \"never\""), "input.sleep-after"),
            (MINIMAL.replace("topics = [\"in\"]", "topics = [\"in\"]\nsleep-after = \"10ms\""), "below 1s"),
            (MINIMAL.replace("topics = [\"out\"]", "topics = [\"in\"]"), "both an input and an output"),
            (MINIMAL.replace("t.wasm", "missing.wasm"), "no file at"),
            (format!("{MINIMAL}[kafka]\n\"group.id\" = \"x\"\n"), "cannot be overridden"),
            (format!("{MINIMAL}unknown = 1\n"), "unknown field"),
            (MINIMAL.replace("[output]\ntopics = [\"out\"]\n", ""), "missing field `output`"),
            (format!("{MINIMAL}[transform.config]\n\"sluice.attempt\" = \"1\"\n"), "reserved"),
        ];
        for (text, expected) in cases {
            let err = parse(&text).expect_err(&text);
            assert!(err.to_string().contains(expected), "{text}\n=> {err}");
        }
    }
}
