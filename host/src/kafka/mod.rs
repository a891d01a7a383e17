//! Kafka: the source that reads a task's input partitions and the
//! transactional sink that writes its outputs, both on rdkafka.
//!
//! - [`Source`]: a consumer reading with `isolation.level=read_committed`,
//!   tracking the next offset per partition: with a static assignment (on a
//!   lone host the job decides which task reads which partitions), or, in a
//!   cluster, as a member of the job's consumer group, which assigns them.
//! - [`Sink`]: one transactional producer per task with a stable
//!   `transactional.id`; commits outputs together with the input offsets and
//!   the checkpoint id (in each offset's metadata) in one Kafka transaction.
//! - [`tools`]: topic creation, producing and reading back, for the demo
//!   and the end-to-end tests.
//! - [`InputWatch`]: one consumer per host that watches the input of
//!   sleeping tasks and wakes each when a record is there for it.
//! - `Delivering`: sends outside any transaction (module chunks, `tools`)
//!   that count as done only once the broker acknowledged every record.
//!
//! Neither decides when to commit: that is the checkpoint protocol's job
//! ([`crate::checkpoint`]).

mod batch;
pub mod changelog;
mod clients;
mod deliver;
mod fetch;
mod headers;
mod sink;
mod source;
pub mod tools;
mod watch;

use std::collections::BTreeMap;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;

pub use clients::Clients;
pub(crate) use deliver::Delivering;
pub use sink::Sink;
pub use source::{Committed, PartitionLag, ResetTo, Source, StartPosition};
pub use watch::{Alarm, InputWatch, Watch};

/// Whether `error` says a topic or partition asked about does not exist.
fn is_unknown_topic(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode::{UnknownPartition, UnknownTopic, UnknownTopicOrPartition};
    matches!(error.rdkafka_error_code(), Some(UnknownTopicOrPartition | UnknownTopic | UnknownPartition))
}

/// The error code of `error`, an admin request's (which rdkafka's
/// `rdkafka_error_code` leaves out) included.
fn kafka_code(error: &KafkaError) -> Option<rdkafka::types::RDKafkaErrorCode> {
    match error {
        KafkaError::AdminOp(code) => Some(*code),
        other => other.rdkafka_error_code(),
    }
}

/// The codes of [`Error::is_unavailable`].
fn is_unavailable_code(code: rdkafka::types::RDKafkaErrorCode) -> bool {
    use rdkafka::types::RDKafkaErrorCode::{
        AllBrokersDown, BrokerNotAvailable, BrokerTransportFailure, CoordinatorLoadInProgress, CoordinatorNotAvailable,
        LeaderNotAvailable, NetworkException, NotCoordinator, OperationTimedOut, RequestTimedOut, Resolve,
        TimedOutQueue,
    };
    matches!(
        code,
        AllBrokersDown
            | BrokerNotAvailable
            | BrokerTransportFailure
            | CoordinatorLoadInProgress
            | CoordinatorNotAvailable
            | LeaderNotAvailable
            | NetworkException
            | NotCoordinator
            | OperationTimedOut
            | RequestTimedOut
            | Resolve
            | TimedOutQueue
    )
}

/// An error talking to Kafka, with what the host was doing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A client call failed.
    #[error("kafka: {context}: {error}")]
    Client {
        /// What the host was doing.
        context: String,
        /// rdkafka's error.
        error: KafkaError,
    },
    /// An input topic does not exist.
    #[error("kafka: topic `{topic}` does not exist on {brokers}")]
    MissingTopic {
        /// The topic.
        topic: String,
        /// The bootstrap servers asked.
        brokers: String,
    },
    /// A topic exists but cannot be used now (no leader yet, a broker
    /// restarting, no partitions yet); retrying may help.
    #[error("kafka: topic `{topic}` is not available now: {reason}")]
    TopicUnavailable {
        /// The topic.
        topic: String,
        /// The broker's error.
        reason: String,
    },
    /// The committed offsets of one shard's partitions disagree on its
    /// checkpoint; its state cannot be restored as is.
    #[error("kafka: {0}")]
    Assignment(String),
    /// Something around the client failed.
    #[error("kafka: {0}")]
    Other(String),
    /// The task stopped while this was under way (a changelog restore).
    #[error("stopped before it was done")]
    Stopped,
    /// A shard's changelog ends before the span its committed checkpoint
    /// recorded: its records were deleted, or the topic was recreated.
    #[error(
        "changelog {topic}/{shard} ends at offset {end}, before offset {to} that the committed checkpoint recorded: \
         its records were deleted or the topic was recreated, so the shard's state cannot be restored; reset the \
         job with its state cleared to reprocess"
    )]
    ChangelogTruncated {
        /// The changelog topic.
        topic: String,
        /// The shard (partition).
        shard: u32,
        /// Where the partition ends.
        end: i64,
        /// Where the span ends.
        to: i64,
    },
    /// An output to a topic the sink was not opened for. Outputs are
    /// checked before they reach the sink (see
    /// `checkpoint::OutputError`), so this is the host's bug, not the
    /// guest's mistake.
    #[error("the transform wrote to topic `{topic}`, which is not one of the job's output topics ({declared})")]
    UndeclaredTopic {
        /// The topic the guest named.
        topic: String,
        /// The declared output topics, comma-separated.
        declared: String,
    },
}

impl Error {
    pub(crate) fn client(context: impl Into<String>) -> impl FnOnce(KafkaError) -> Error {
        let context = context.into();
        move |error| Error::Client { context, error }
    }

    /// Whether trying again may succeed: a topic that does not exist, a
    /// shard whose partitions' offsets disagree, or a changelog cut short
    /// will not fix themselves; anything else (a broker that cannot be
    /// reached, a timeout, a leader moving) may.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Error::MissingTopic { .. } | Error::Assignment(_) | Error::ChangelogTruncated { .. })
    }

    /// Whether Kafka could not be reached or could not answer now (no
    /// broker up, a timeout, a coordinator or leader moving or loading):
    /// not the caller's mistake nor the host's, and likely to pass.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Client { error, .. } => kafka_code(error).is_some_and(is_unavailable_code),
            Error::TopicUnavailable { .. } => true,
            _ => false,
        }
    }

    /// Whether Kafka refused to delete a consumer group that still has
    /// members.
    pub fn is_group_in_use(&self) -> bool {
        matches!(self, Error::Client { error, .. }
            if kafka_code(error) == Some(rdkafka::types::RDKafkaErrorCode::NonEmptyGroup))
    }

    /// Whether Kafka said a topic or partition it was asked about does not
    /// exist (it may have been deleted).
    pub fn is_unknown_topic(&self) -> bool {
        match self {
            Error::Client { error, .. } => is_unknown_topic(error),
            _ => false,
        }
    }

    /// Whether another producer with our transactional id took over: this
    /// process is a zombie for that task and must not continue it.
    pub fn is_fenced(&self) -> bool {
        match self {
            Error::Client { error, .. } => {
                matches!(
                    error.rdkafka_error_code(),
                    Some(rdkafka::types::RDKafkaErrorCode::ProducerFenced)
                        | Some(rdkafka::types::RDKafkaErrorCode::InvalidProducerEpoch)
                )
            }
            _ => false,
        }
    }
}

/// Runs `call` with the time left until `deadline`, again while it fails
/// with an error a broker answers for a moment after a topic or group
/// first appears: a partition whose leader does not serve it yet, a group
/// whose coordinator has not loaded it yet. Any other error, or one still
/// there at the deadline, is returned.
pub(crate) fn until_served<T>(
    deadline: std::time::Instant,
    mut call: impl FnMut(std::time::Duration) -> Result<T, KafkaError>,
) -> Result<T, KafkaError> {
    use rdkafka::types::RDKafkaErrorCode as Code;
    let mut pause = std::time::Duration::from_millis(5);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match call(left) {
            Err(e)
                if matches!(
                    e.rdkafka_error_code(),
                    Some(
                        Code::NotLeaderForPartition
                            | Code::LeaderNotAvailable
                            | Code::UnknownTopicOrPartition
                            | Code::NotCoordinator
                            | Code::CoordinatorNotAvailable
                            | Code::CoordinatorLoadInProgress
                    )
                ) && left > pause =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(100));
            }
            result => return result,
        }
    }
}

/// Topics, groups and transactional ids the host names for itself: a job's
/// (`sluice.<tenant>.<job>...`, its changelog among them) and a cluster's
/// (`sluice-cluster.<name>...`). No tenant's job may name a topic under
/// them.
pub const RESERVED_PREFIXES: [&str; 2] = ["sluice.", CLUSTER_PREFIX];

/// What a cluster's own names start with.
pub const CLUSTER_PREFIX: &str = "sluice-cluster.";

/// Whether `name` may be part of Kafka group, transactional and topic ids
/// that sluice builds (tenant and cluster names): 1-40 lowercase letters,
/// digits or `-`, not starting with `-`. No `.`, so one name's ids never
/// look like another's.
pub fn is_id_part(name: &str) -> bool {
    (1..=40).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
}

/// Results of Kafka calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A client configuration for `brokers` with the job's extra properties.
pub fn client_config(brokers: &str, extra: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (key, value) in extra {
        config.set(key, value);
    }
    config
}

/// The producers' transaction timeout: the job's `transaction.timeout.ms`,
/// else librdkafka's default of 60 s. A transaction open longer than this is
/// aborted by the broker; until then it holds back read_committed consumers.
pub fn transaction_timeout(extra: &BTreeMap<String, String>) -> std::time::Duration {
    let ms = extra.get("transaction.timeout.ms").and_then(|v| v.parse().ok()).unwrap_or(60_000);
    std::time::Duration::from_millis(ms)
}

/// The largest record a producer with the job's properties sends: its
/// `message.max.bytes`, else librdkafka's default of 1,000,000.
pub fn max_message_bytes(config: &ClientConfig) -> usize {
    config.get("message.max.bytes").and_then(|v| v.parse().ok()).unwrap_or(1_000_000)
}

/// How long a transaction may hold records before the host deems its task
/// hung and fences it, so read_committed readers are not held up until the
/// broker's own abort: three quarters of the transaction timeout. Job
/// validation keeps every healthy checkpoint well inside it.
pub fn stale_transaction_after(timeout: std::time::Duration) -> std::time::Duration {
    timeout / 4 * 3
}

/// What a checkpoint may take past its interval and the last guest call: the
/// durable snapshot, the flush and the commit.
pub const COMMIT_MARGIN: std::time::Duration = std::time::Duration::from_secs(5);

/// What a committed offset's metadata says about its shard: the checkpoint
/// that committed it and, with a changelog, the shard's span of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The checkpoint id.
    pub checkpoint: u64,
    /// The shard's changelog records as of that checkpoint.
    pub changelog: Option<ChangelogSpan>,
    /// The generation of the upgrade migration whose writes the shard's
    /// committed state holds, for a shard restored from the changelog (its
    /// local note is gone with its store).
    pub migrated: Option<u64>,
    /// The task run that committed it (random per recovery): a store's
    /// pending checkpoint with the committed id but of another run (a
    /// fenced zombie's, on a host the shard has since come back to) is
    /// not the committed one.
    pub run: Option<u64>,
    /// The incarnation of the job that committed it (a new one at every
    /// create and every reset that clears the state; none for a job of a
    /// host before incarnations, or of `sluice run`): a checkpoint id is
    /// only meaningful within one incarnation.
    pub incarnation: Option<u64>,
}

/// The offsets of a shard's changelog partition that hold its state: its
/// state is every record from `from` (where the shard's changelog began:
/// its first checkpoint, or its last reset) up to `to` (exclusive), applied
/// in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangelogSpan {
    /// The first offset of the shard's state.
    pub from: i64,
    /// One past the last record a committed checkpoint wrote.
    pub to: i64,
}

/// The offset-metadata string that carries a [`Mark`]:
/// `sluice:checkpoint=N`, then `;changelog=FROM-TO`, `;migrated=G`,
/// `;run=R` and `;incarnation=I` (16 hex digits each) if it has them.
pub fn checkpoint_metadata(mark: Mark) -> String {
    let mut text = format!("sluice:checkpoint={}", mark.checkpoint);
    if let Some(span) = mark.changelog {
        text.push_str(&format!(";changelog={}-{}", span.from, span.to));
    }
    if let Some(generation) = mark.migrated {
        text.push_str(&format!(";migrated={generation}"));
    }
    if let Some(run) = mark.run {
        text.push_str(&format!(";run={run:016x}"));
    }
    if let Some(incarnation) = mark.incarnation {
        text.push_str(&format!(";incarnation={incarnation:016x}"));
    }
    text
}

/// Offset metadata that starts as sluice's but that this version cannot
/// read: a field it does not know (written by a newer version, whose
/// meaning it cannot honour) or a value it cannot parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the committed offset's metadata {metadata:?} is sluice's but not readable by this version (a field of a newer \
     version, or written by hand): upgrade this host, or reset the job"
)]
pub struct UnreadableMark {
    /// The metadata string.
    pub metadata: String,
}

/// The [`Mark`] in an offset's metadata: none for metadata that is not
/// sluice's (no `sluice:checkpoint=` in front), an error for metadata that
/// is, but that this version cannot read whole. Never a mark with a field
/// left out: a field this version skipped could be one that says the
/// checkpoint is not what it looks like (as `incarnation` does).
pub fn parse_checkpoint_metadata(metadata: &str) -> Result<Option<Mark>, UnreadableMark> {
    let Some(rest) = metadata.strip_prefix("sluice:checkpoint=") else { return Ok(None) };
    let unreadable = || UnreadableMark { metadata: metadata.chars().take(200).collect() };
    let hex = |text: &str| u64::from_str_radix(text, 16).ok();
    let mut fields = rest.split(';');
    let checkpoint = fields.next().and_then(|id| id.parse().ok()).ok_or_else(unreadable)?;
    let mut mark = Mark { checkpoint, changelog: None, migrated: None, run: None, incarnation: None };
    for field in fields {
        let parsed = match field.split_once('=').ok_or_else(unreadable)? {
            ("changelog", span) => span.split_once('-').and_then(|(from, to)| {
                mark.changelog = Some(ChangelogSpan { from: from.parse().ok()?, to: to.parse().ok()? });
                Some(())
            }),
            ("migrated", generation) => generation.parse().ok().map(|g| mark.migrated = Some(g)),
            ("run", run) => hex(run).map(|r| mark.run = Some(r)),
            ("incarnation", incarnation) => hex(incarnation).map(|i| mark.incarnation = Some(i)),
            _ => None,
        };
        parsed.ok_or_else(unreadable)?;
    }
    Ok(Some(mark))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_that_pass_are_told_from_the_rest() {
        use rdkafka::types::RDKafkaErrorCode as Code;
        let admin = |code| Error::client("deleting group `g`")(KafkaError::AdminOp(code));
        // An admin request's code is read too (rdkafka's own accessor has none for it).
        for code in
            [Code::OperationTimedOut, Code::AllBrokersDown, Code::CoordinatorLoadInProgress, Code::NotCoordinator]
        {
            assert!(admin(code).is_unavailable(), "{code:?}");
            assert!(!admin(code).is_group_in_use(), "{code:?}");
        }
        assert!(
            Error::client("fetching metadata")(KafkaError::MetadataFetch(Code::BrokerTransportFailure))
                .is_unavailable()
        );
        assert!(Error::TopicUnavailable { topic: "t".into(), reason: "no leader".into() }.is_unavailable());
        assert!(admin(Code::NonEmptyGroup).is_group_in_use());
        for e in [
            admin(Code::NonEmptyGroup),
            admin(Code::GroupAuthorizationFailed),
            Error::MissingTopic { topic: "t".into(), brokers: "b".into() },
            Error::Other("x".into()),
        ] {
            assert!(!e.is_unavailable(), "{e}");
        }
    }

    #[test]
    fn checkpoint_metadata_round_trips() {
        let plain = Mark { checkpoint: 42, changelog: None, migrated: None, run: None, incarnation: None };
        assert_eq!(checkpoint_metadata(plain), "sluice:checkpoint=42", "what earlier versions wrote");
        assert_eq!(parse_checkpoint_metadata(&checkpoint_metadata(plain)), Ok(Some(plain)));
        let logged = Mark {
            checkpoint: 7,
            changelog: Some(ChangelogSpan { from: 10, to: 1234 }),
            migrated: Some(3),
            run: Some(0xabc),
            incarnation: Some(0x1234_5678_9abc_def0),
        };
        assert_eq!(
            checkpoint_metadata(logged),
            "sluice:checkpoint=7;changelog=10-1234;migrated=3;run=0000000000000abc;incarnation=123456789abcdef0"
        );
        assert_eq!(parse_checkpoint_metadata(&checkpoint_metadata(logged)), Ok(Some(logged)));
        assert_eq!(parse_checkpoint_metadata(""), Ok(None));
        assert_eq!(parse_checkpoint_metadata("something else"), Ok(None));
        // Sluice's, but not readable whole: never a mark with a field left out.
        for unreadable in [
            "sluice:checkpoint=7;changelog=x-1",
            "sluice:checkpoint=x",
            "sluice:checkpoint=7;future=1",
            "sluice:checkpoint=7;run",
        ] {
            assert!(parse_checkpoint_metadata(unreadable).is_err(), "{unreadable}");
        }
    }
}
