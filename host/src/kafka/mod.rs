//! Kafka: the source that reads a task's input partitions and the
//! transactional sink that writes its outputs, both on rdkafka.
//!
//! - [`Source`]: a consumer with a static assignment (no group rebalancing:
//!   the job decides which task reads which partitions), reading with
//!   `isolation.level=read_committed`, tracking the next offset per partition.
//! - [`Sink`]: one transactional producer per task with a stable
//!   `transactional.id`; commits outputs together with the input offsets and
//!   the checkpoint id (in each offset's metadata) in one Kafka transaction.
//! - [`tools`]: topic creation, producing and reading back, for the demo
//!   and the end-to-end tests.
//!
//! Neither decides when to commit: that is the checkpoint protocol's job
//! ([`crate::checkpoint`]).

mod headers;
mod sink;
mod source;
pub mod tools;

use std::collections::BTreeMap;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;

pub use sink::Sink;
pub use source::{Committed, ResetTo, Source, StartPosition};

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
    /// The job's partitions were spread over tasks differently when its
    /// checkpoints were written; its state cannot be restored as is.
    #[error("kafka: {0}")]
    Assignment(String),
    /// Something around the client failed.
    #[error("kafka: {0}")]
    Other(String),
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

/// The offset-metadata string that carries a checkpoint id.
pub fn checkpoint_metadata(checkpoint: u64) -> String {
    format!("sluice:checkpoint={checkpoint}")
}

/// The checkpoint id in an offset's metadata, if it carries one.
pub fn parse_checkpoint_metadata(metadata: &str) -> Option<u64> {
    metadata.strip_prefix("sluice:checkpoint=")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_metadata_round_trips() {
        assert_eq!(parse_checkpoint_metadata(&checkpoint_metadata(42)), Some(42));
        assert_eq!(parse_checkpoint_metadata(""), None);
        assert_eq!(parse_checkpoint_metadata("something else"), None);
    }
}
