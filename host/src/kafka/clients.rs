//! Long-lived clients for a host's one-off Kafka calls: the partitions of a
//! job's topics, creating its changelog topic.
//!
//! Creating and destroying a librdkafka client costs 50-150 ms (its threads,
//! the connection to a bootstrap broker, the first metadata request): every
//! job created on the shared host paid that three times, most of its 0.45 s.
//! The service keeps one [`Clients`] for the host's client configuration and
//! every such call goes through it; a job with Kafka properties of its own
//! (its `kafka` table) gets clients of its own for its start
//! ([`Clients::serves`]), as before.
//!
//! They also hold the host's [`InputWatch`] over sleeping tasks' input,
//! started when the first task falls asleep.
//!
//! A topic's partitions, once read, answer again for [`RECENT`] without a
//! round trip to Kafka: creating a job reads its topics' partitions, and
//! starting it right after asks the same, as does every job of a burst
//! created on one topic. On a busy broker each ask is a round trip of
//! 5-30 ms, and they were two thirds of the time to create 500 jobs. An
//! answer that old is what a request that much earlier would have said
//! (nothing ties a start to the moment it reads the partitions, and added
//! partitions are not read until a restart anyway); errors, a missing
//! topic among them, are never kept.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::types::RDKafkaErrorCode;

use super::watch::InputWatch;
use super::{Error, Result};

/// A metadata client and an admin client for one client configuration.
pub struct Clients {
    /// The configuration they were made with.
    config: ClientConfig,
    metadata: BaseConsumer,
    /// Made at its first use: most users of a task's own clients (a job
    /// with Kafka properties of its own) only read metadata.
    admin: OnceLock<AdminClient<DefaultClientContext>>,
    /// Started at the first sleep; started again if its thread ended.
    watch: Mutex<Option<Arc<InputWatch>>>,
    /// Topics' partitions read in the last [`RECENT`].
    recent: RecentPartitions,
}

/// How long a topic's partitions, once read, answer without asking Kafka
/// again (see the module docs).
pub(super) const RECENT: Duration = Duration::from_secs(1);

/// Topics' partitions as read in the last [`RECENT`]: answers only, never
/// errors.
#[derive(Debug, Default)]
struct RecentPartitions(Mutex<HashMap<String, (Instant, Vec<i32>)>>);

impl RecentPartitions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Vec<i32>)>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `topic`'s partitions if they were read less than [`RECENT`] before `now`.
    fn get(&self, topic: &str, now: Instant) -> Option<Vec<i32>> {
        self.lock()
            .get(topic)
            .filter(|(read, _)| now.saturating_duration_since(*read) < RECENT)
            .map(|(_, partitions)| partitions.clone())
    }

    /// Keeps `topic`'s partitions as read at `read`, and forgets every
    /// answer too old to be used.
    fn put(&self, topic: &str, partitions: Vec<i32>, read: Instant) {
        let mut recent = self.lock();
        recent.retain(|_, (at, _)| read.saturating_duration_since(*at) < RECENT);
        recent.insert(topic.to_owned(), (read, partitions));
    }
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients").finish_non_exhaustive()
    }
}

impl Clients {
    /// Clients with `config` (no group: they read metadata and administer).
    pub fn new(config: &ClientConfig) -> Result<Clients> {
        let metadata: BaseConsumer = config.create().map_err(Error::client("creating a metadata client"))?;
        Ok(Clients {
            config: config.clone(),
            metadata,
            admin: OnceLock::new(),
            watch: Mutex::new(None),
            recent: RecentPartitions::default(),
        })
    }

    /// `shared` (which [`serves`](Self::serves) the caller's configuration),
    /// else clients of their own made with `config`.
    pub fn shared_or_new(shared: Option<&Arc<Clients>>, config: &ClientConfig) -> Result<Arc<Clients>> {
        match shared {
            Some(shared) => Ok(Arc::clone(shared)),
            None => Ok(Arc::new(Clients::new(config)?)),
        }
    }

    /// Whether these clients were made with exactly `config`.
    pub fn serves(&self, config: &ClientConfig) -> bool {
        self.config.config_map() == config.config_map()
    }

    /// The configuration they were made with.
    pub(crate) fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The metadata client.
    pub(crate) fn metadata(&self) -> &BaseConsumer {
        &self.metadata
    }

    /// The host's watch over sleeping tasks' input, started if need be.
    pub fn input_watch(&self) -> Result<Arc<InputWatch>> {
        let mut watch = self.watch.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(running) = watch.as_ref().filter(|w| !w.has_ended()) {
            return Ok(Arc::clone(running));
        }
        let started = Arc::new(InputWatch::start(&self.config)?);
        *watch = Some(Arc::clone(&started));
        Ok(started)
    }

    /// The partitions of `topics`, sorted; an error names a missing topic.
    /// A topic read in the last [`RECENT`] is not asked for again.
    pub fn partitions(&self, topics: &[String], brokers: &str, timeout: Duration) -> Result<Vec<(String, i32)>> {
        let now = Instant::now();
        let mut out = Vec::new();
        let mut ask = Vec::new();
        for topic in topics {
            match self.recent.get(topic, now) {
                Some(partitions) => out.extend(partitions.into_iter().map(|p| (topic.clone(), p))),
                None => ask.push(topic.clone()),
            }
        }
        if !ask.is_empty() {
            let read = partitions_of(&self.metadata, &ask, brokers, timeout)?;
            let at = Instant::now();
            for topic in &ask {
                let partitions = read.iter().filter(|(t, _)| t == topic).map(|(_, p)| *p).collect();
                self.recent.put(topic, partitions, at);
            }
            out.extend(read);
        }
        out.sort();
        Ok(out)
    }

    /// The largest record each of `topics` takes, as the broker says:
    /// the topic's `max.message.bytes` (which may be below the producer's).
    /// A topic the broker says nothing of is left out.
    pub fn max_message_bytes_of(&self, topics: &[String]) -> Result<HashMap<String, usize>> {
        use rdkafka::admin::ResourceSpecifier;
        let admin = self.admin_client()?;
        let specifiers: Vec<ResourceSpecifier<'_>> = topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
        let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(15)));
        let described = block_on(admin.describe_configs(&specifiers, &options))?
            .map_err(Error::client("reading the topics' configuration"))?;
        let mut out = HashMap::new();
        for (topic, resource) in topics.iter().zip(described) {
            let value = resource.ok().and_then(|r| r.get("max.message.bytes").and_then(|e| e.value.clone()));
            if let Some(bytes) = value.and_then(|v| v.parse().ok()) {
                out.insert(topic.clone(), bytes);
            }
        }
        Ok(out)
    }

    /// The admin client, made at its first use.
    fn admin_client(&self) -> Result<&AdminClient<DefaultClientContext>> {
        match self.admin.get() {
            Some(admin) => Ok(admin),
            None => {
                let made = self.config.create().map_err(Error::client("creating the admin client"))?;
                // Two first uses at once make two; one is kept.
                Ok(self.admin.get_or_init(|| made))
            }
        }
    }

    /// Runs one admin request; `done_already` is the error code that means
    /// the request's effect is already there.
    pub(crate) fn admin<F, Fut>(&self, what: &str, done_already: RDKafkaErrorCode, request: F) -> Result<()>
    where
        F: FnOnce(&AdminClient<DefaultClientContext>, &AdminOptions) -> Fut,
        Fut: Future<Output = AdminResults>,
    {
        run_admin(self.admin_client()?, what, done_already, request)
    }
}

/// What an admin request answers: per object, its name or its error.
pub(crate) type AdminResults =
    rdkafka::error::KafkaResult<Vec<std::result::Result<String, (String, RDKafkaErrorCode)>>>;

/// Runs one admin request with `admin`; `done_already` is the error code
/// that means the request's effect is already there.
pub(crate) fn run_admin<F, Fut>(
    admin: &AdminClient<DefaultClientContext>,
    what: &str,
    done_already: RDKafkaErrorCode,
    request: F,
) -> Result<()>
where
    F: FnOnce(&AdminClient<DefaultClientContext>, &AdminOptions) -> Fut,
    Fut: Future<Output = AdminResults>,
{
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = block_on(request(admin, &options))?.map_err(Error::client(what.to_string()))?;
    for result in results {
        match result {
            Ok(_) => {}
            Err((_, code)) if code == done_already => {}
            Err((name, code)) => {
                return Err(Error::client(format!("{what} `{name}`"))(rdkafka::error::KafkaError::AdminOp(code)));
            }
        }
    }
    Ok(())
}

/// Runs an admin client's `future` to its end on this thread (the admin
/// client's futures need a Tokio runtime for their timeouts).
fn block_on<F: Future>(future: F) -> Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("starting a runtime for the admin client: {e}")))?;
    Ok(runtime.block_on(future))
}

/// The partitions of `topics` as `consumer` reads them, sorted; an error
/// names a missing topic.
pub(crate) fn partitions_of<X: ConsumerContext, C: Consumer<X>>(
    consumer: &C,
    topics: &[String],
    brokers: &str,
    timeout: Duration,
) -> Result<Vec<(String, i32)>> {
    let mut out = Vec::new();
    for topic in topics {
        let metadata = consumer.fetch_metadata(Some(topic), timeout).map_err(Error::client(format!(
            "reading the metadata of topic `{topic}` from {brokers} (is Kafka running there? set `brokers` in the job \
             file or pass --brokers)"
        )))?;
        let Some(meta) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Err(Error::MissingTopic { topic: topic.clone(), brokers: brokers.to_string() });
        };
        // Only "unknown topic" says the topic is not there; any other error
        // (no leader yet, a broker restarting) or no partitions yet (a topic
        // being created) passes, and the task retries.
        match meta.error().map(RDKafkaErrorCode::from) {
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => {
                return Err(Error::MissingTopic { topic: topic.clone(), brokers: brokers.to_string() });
            }
            Some(code) => return Err(Error::TopicUnavailable { topic: topic.clone(), reason: code.to_string() }),
            None if meta.partitions().is_empty() => {
                return Err(Error::TopicUnavailable {
                    topic: topic.clone(),
                    reason: "it has no partitions yet".into(),
                });
            }
            None => {}
        }
        out.extend(meta.partitions().iter().map(|p| (topic.clone(), p.id())));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topics_partitions_answer_for_a_second_and_errors_are_not_kept() {
        let recent = RecentPartitions::default();
        let t0 = Instant::now();
        assert_eq!(recent.get("in", t0), None);
        recent.put("in", vec![0, 1, 2], t0);
        assert_eq!(recent.get("in", t0), Some(vec![0, 1, 2]));
        assert_eq!(recent.get("in", t0 + RECENT - Duration::from_millis(1)), Some(vec![0, 1, 2]));
        assert_eq!(recent.get("in", t0 + RECENT), None, "an answer as old as RECENT is not used");
        assert_eq!(recent.get("out", t0), None, "a topic never read");
        // A later read replaces it, and drops every answer too old to use.
        recent.put("out", vec![0], t0 + Duration::from_millis(10));
        recent.put("in", vec![0, 1, 2, 3], t0 + RECENT + Duration::from_millis(5));
        assert_eq!(recent.get("in", t0 + RECENT + Duration::from_millis(5)), Some(vec![0, 1, 2, 3]));
        assert_eq!(recent.lock().len(), 2, "`out`, read 10 ms after `in` was, is still young enough to keep");
        recent.put("other", vec![0], t0 + RECENT * 2);
        let mut kept: Vec<String> = recent.lock().keys().cloned().collect();
        kept.sort();
        assert_eq!(kept, ["in", "other"], "`out` was too old to keep");
    }
}
