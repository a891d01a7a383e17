//! The cluster's replicated metadata: a key-value log in Kafka with
//! conditional writes, decided in log order by one host that Kafka picks.
//!
//! Every host runs three parts of it:
//! - the *requester* ([`Link::submit`]): the host that takes a write sends
//!   it as a request (a [`Change`]: conditions and writes) to the cluster's
//!   one-partition requests topic, and waits for its reply;
//! - the *decider*: every host's decider joins one consumer group over the
//!   requests topic, so Kafka gives its one partition to exactly one of
//!   them. That host checks each request's conditions against what it has
//!   applied (and what it accepted earlier in the same batch), and writes
//!   the accepted writes and a reply to the meta topic, together with the
//!   requests' offsets, in one transaction: the jobs' own exactly-once
//!   pattern, so each request is decided once, across a decider's crash
//!   too. Its transactional id is the cluster's, so a new decider fences
//!   the old one, and the group metadata in the transaction (KIP-447) stops
//!   a decider of an older group generation from committing;
//! - the *applier*: reads the compacted meta topic (read_committed) in
//!   order and applies each record to the [`Replica`] (the service's redb
//!   store), the record's offset + 1 being its version; a reply to one of
//!   this host's requests wakes its caller, after the writes it answers.
//!
//! Only decided writes reach the meta topic, so compaction keeps each key's
//! latest decided value, and a host that catches up from a compacted log
//! reaches the state of one that read every record. Conflicts are decided
//! by the order of the requests topic: of two requests that each create
//! the same key, the first wins and the second is refused with the
//! condition that failed.
//!
//! The topics trust their writers: whoever may write the cluster's topics
//! is an operator of the cluster (protect them with Kafka ACLs).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::admin::{NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::{Identity, Topics, lock};
use crate::kafka::Error as KafkaErr;

/// An error from the replica, with its source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A write to the replicated metadata: applied whole if every condition
/// holds, else not at all.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Change {
    /// What must hold when the change is decided.
    pub conditions: Vec<Condition>,
    /// What it writes.
    pub writes: Vec<Write>,
}

/// One key's new value (`None` deletes it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Write {
    /// The key.
    pub key: String,
    /// Its new value, a JSON record; `None` deletes the key.
    pub value: Option<serde_json::Value>,
}

/// What must hold for a [`Change`] to apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Condition {
    /// `key` is at `version` (`None`: `key` is absent).
    Version {
        /// The key.
        key: String,
        /// Its version when the writer read it.
        version: Option<u64>,
    },
    /// No key under `prefix` was written (or deleted) after version `since`
    /// (the writer's view when it read them: guards limits such as "at
    /// most 10 jobs").
    Quiet {
        /// The prefix.
        prefix: String,
        /// The writer's view.
        since: u64,
    },
}

/// A change was refused: this condition did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The condition.
    pub condition: Condition,
}

/// One applied record of the meta topic.
#[derive(Debug, Clone)]
pub struct Record {
    /// Its offset + 1: the version of `key` it makes.
    pub version: u64,
    /// The key.
    pub key: String,
    /// The value's JSON bytes; `None` deletes the key.
    pub value: Option<Vec<u8>>,
}

/// The state the log is applied to: the service's metadata store.
pub trait Replica: Send + Sync + 'static {
    /// The offset after the last record applied (0 for none).
    fn next_offset(&self) -> Result<u64, BoxError>;
    /// Applies `records` in order and records `next_offset`, in one
    /// durable transaction.
    fn apply(&self, records: &[Record], next_offset: u64) -> Result<(), BoxError>;
    /// The index of the first of `conditions` that does not hold, where a
    /// key in `written` counts as written after every version.
    fn first_failing(&self, conditions: &[Condition], written: &HashSet<String>) -> Result<Option<usize>, BoxError>;
}

/// An error of the replicated metadata.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Talking to Kafka failed.
    #[error("cluster metadata: {0}")]
    Kafka(#[from] KafkaErr),
    /// No reply came in time. The write may still be decided: read before
    /// trying again.
    #[error(
        "the cluster did not decide the write within {0:?} (is a host of the cluster running, and the broker up?); \
         it may still be applied: read before trying again"
    )]
    Timeout(Duration),
    /// The local store failed.
    #[error("cluster metadata: {what}: {source}")]
    Replica {
        /// What the host was doing.
        what: String,
        /// Why it failed.
        #[source]
        source: BoxError,
    },
    /// The host is stopping.
    #[error("the host is stopping")]
    Stopped,
}

/// How long a caller waits for its write to be decided.
const DECIDE_TIMEOUT: Duration = Duration::from_secs(30);
/// The decider's group session: how long a dead decider holds up writes.
const SESSION_TIMEOUT_MS: &str = "6000";
/// The decider's transactions: how long a dead decider's open transaction
/// can hold back the meta topic's readers before the broker aborts it.
const DECIDER_TRANSACTION_TIMEOUT_MS: &str = "10000";
/// Requests decided in one transaction at most.
const DECIDE_BATCH: usize = 200;

/// A request as it travels on the requests topic.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    id: String,
    host: String,
    change: Change,
}

/// The decider's answer to a request, under `reply/<host>` in the meta topic.
#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    request: String,
    /// The index of the condition that failed; none if applied.
    refused: Option<usize>,
}

const REPLY_PREFIX: &str = "reply/";
/// The last record of each decided batch, under `decided/<host>`: its
/// decider waits until it has applied it before deciding the next batch.
const DECIDED_PREFIX: &str = "decided/";

type Waiters = Mutex<HashMap<String, SyncSender<Result<Option<usize>, String>>>>;

/// Delivery reports of requests: a request that cannot be delivered fails
/// its caller at once instead of at the timeout.
struct RequestContext {
    waiters: Arc<Waiters>,
}

impl ClientContext for RequestContext {}

impl ProducerContext for RequestContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((error, message)) = result {
            let id = message.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default();
            if let Some(waiter) = lock(&self.waiters).remove(&id) {
                let _ = waiter.try_send(Err(format!("sending the request to Kafka: {error}")));
            }
        }
    }
}

/// How far the applier has read.
#[derive(Debug, Default)]
struct Progress {
    /// Every record before this offset is applied.
    reached: u64,
    /// The last batch this host's decider wrote that the applier applied.
    decided: Option<String>,
    /// The applier failed for good.
    failed: Option<String>,
}

/// One read of the meta topic's end for [`Link::catch_up_after`].
struct Probe {
    started: Instant,
    /// The end it read, or why it could not.
    high: Result<u64, String>,
}

/// How long after a failed probe misses fail without probing again.
const PROBE_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest a probe waits for the broker: every miss that came meanwhile
/// waits on it, each holding a thread of the API's blocking pool.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// This host's part of the replicated metadata.
pub struct Link {
    identity: Identity,
    topics: Topics,
    config: ClientConfig,
    replica: Arc<dyn Replica>,
    requests: ThreadedProducer<RequestContext>,
    /// Reads the meta topic's end for [`catch_up`](Self::catch_up), which the
    /// decider calls before every batch: one client, not one per call.
    probe: BaseConsumer,
    waiters: Arc<Waiters>,
    /// The latest probe of [`catch_up_after`](Self::catch_up_after), held
    /// while it runs: one at a time.
    last_probe: Mutex<Option<Probe>>,
    progress: Mutex<Progress>,
    advanced: Condvar,
    stop: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Link {
    /// Creates the cluster's topics if missing, starts the applier, and
    /// returns once this host has applied the whole meta topic as it was at
    /// the start. The host takes no part in deciding until
    /// [`start_deciding`](Self::start_deciding).
    pub fn start(
        identity: Identity,
        brokers: &str,
        replica: Arc<dyn Replica>,
        catch_up_within: Duration,
    ) -> Result<Arc<Link>, LinkError> {
        let topics = Topics::of(&identity.cluster);
        let config = crate::kafka::client_config(brokers, &Default::default());
        ensure_topics(&config, &topics)?;
        let waiters: Arc<Waiters> = Arc::default();
        let requests: ThreadedProducer<RequestContext> = config
            .clone()
            .set("enable.idempotence", "true")
            .set("linger.ms", "0")
            .create_with_context(RequestContext { waiters: Arc::clone(&waiters) })
            .map_err(KafkaErr::client("creating the requests producer"))?;
        let probe: BaseConsumer = config.create().map_err(KafkaErr::client("creating a metadata client"))?;
        let reached = replica
            .next_offset()
            .map_err(|source| LinkError::Replica { what: "reading the applied offset".into(), source })?;
        let link = Arc::new(Link {
            identity,
            topics,
            config,
            replica,
            requests,
            probe,
            waiters,
            last_probe: Mutex::new(None),
            progress: Mutex::new(Progress { reached, decided: None, failed: None }),
            advanced: Condvar::new(),
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
        });
        let applier = link.applier(reached)?;
        let apply = Arc::clone(&link);
        let applier = spawn_named("sluice-meta-apply", move || apply.apply_loop(applier))?;
        lock(&link.threads).push(applier);
        link.catch_up(catch_up_within)?;
        Ok(link)
    }

    /// Makes this host one of the hosts Kafka may pick to decide the
    /// cluster's writes (once it is known to belong to the cluster).
    pub fn start_deciding(self: &Arc<Self>) -> Result<(), LinkError> {
        let decide = Arc::clone(self);
        let decider = spawn_named("sluice-meta-decide", move || decide.decide_loop())?;
        lock(&self.threads).push(decider);
        Ok(())
    }

    /// The cluster's name and this host's id.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Sends `change` to be decided and waits until this host has applied
    /// the decision: `Ok(Ok(()))` when applied, `Ok(Err(_))` when refused.
    pub fn submit(&self, change: Change) -> Result<Result<(), Refused>, LinkError> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(LinkError::Stopped);
        }
        // A log that answers slowly (a broker or a decider under load).
        crate::failpoint::hit("log-submit");
        let id = random_id();
        let conditions = change.conditions.clone();
        let request = Request { id: id.clone(), host: self.identity.host.clone(), change };
        let payload = serde_json::to_vec(&request)
            .map_err(|e| LinkError::Replica { what: "encoding a request".into(), source: e.into() })?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        lock(&self.waiters).insert(id.clone(), tx);
        let sent = self.requests.send(BaseRecord::to(&self.topics.requests).key(&id).payload(&payload));
        if let Err((error, _)) = sent {
            lock(&self.waiters).remove(&id);
            return Err(KafkaErr::client("sending a request")(error).into());
        }
        let answer = rx.recv_timeout(DECIDE_TIMEOUT);
        lock(&self.waiters).remove(&id);
        match answer {
            Ok(Ok(None)) => Ok(Ok(())),
            Ok(Ok(Some(index))) => match conditions.get(index) {
                Some(condition) => Ok(Err(Refused { condition: condition.clone() })),
                None => Err(LinkError::Replica {
                    what: "reading a reply".into(),
                    source: format!("the decider refused condition {index} of {}", conditions.len()).into(),
                }),
            },
            Ok(Err(message)) => Err(LinkError::Kafka(KafkaErr::Other(message))),
            Err(RecvTimeoutError::Timeout) => Err(LinkError::Timeout(DECIDE_TIMEOUT)),
            Err(RecvTimeoutError::Disconnected) => Err(LinkError::Stopped),
        }
    }

    /// Waits until this host has applied the meta topic up to its end as of
    /// now.
    pub fn catch_up(&self, within: Duration) -> Result<(), LinkError> {
        let deadline = Instant::now() + within;
        // A topic just created has no leader for a moment (KRaft applies
        // its metadata asynchronously): retried until the deadline.
        let high = loop {
            match self.probe.fetch_watermarks(&self.topics.meta, 0, Duration::from_secs(10)) {
                Ok((_, high)) => break high,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("reading the end of {}: {e}; retrying", self.topics.meta);
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(KafkaErr::client(format!("reading the end of {}", self.topics.meta))(e).into()),
            }
        };
        self.wait_reached(high.max(0) as u64, deadline.saturating_duration_since(Instant::now()))
    }

    /// [`catch_up`](Self::catch_up) for a read that found nothing at
    /// `missed`: once this returns, whatever any member had applied (and
    /// answered its caller for) by then is applied here too. One probe of
    /// the meta topic's end runs at a time and serves every miss from
    /// before it started; a failed probe fails the misses waiting on it,
    /// and those of the next [`PROBE_RETRY_AFTER`], at once. So a flood of
    /// unknown names or tokens costs the broker one request at a time, and
    /// holds no thread for long while the broker is away.
    pub fn catch_up_after(&self, missed: Instant, within: Duration) -> Result<(), LinkError> {
        let high = {
            let mut last = lock(&self.last_probe);
            match &*last {
                Some(probe) if probe.started >= missed => probe.high.clone(),
                Some(probe) if probe.high.is_err() && probe.started.elapsed() < PROBE_RETRY_AFTER => probe.high.clone(),
                _ => {
                    let started = Instant::now();
                    let high = self
                        .probe
                        .fetch_watermarks(&self.topics.meta, 0, within.min(PROBE_TIMEOUT))
                        .map(|(_, high)| high.max(0) as u64)
                        .map_err(|e| format!("reading the end of {}: {e}", self.topics.meta));
                    *last = Some(Probe { started, high: high.clone() });
                    high
                }
            }
        };
        let high = high.map_err(|e| LinkError::Kafka(KafkaErr::Other(e)))?;
        self.wait_reached(high, within)
    }

    /// Waits until this host has applied batch `batch` of its decider.
    fn wait_decided(&self, batch: &str, within: Duration) -> Result<(), LinkError> {
        self.wait_for(within, |progress| progress.decided.as_deref() == Some(batch))
    }

    fn wait_reached(&self, target: u64, within: Duration) -> Result<(), LinkError> {
        self.wait_for(within, |progress| progress.reached >= target)
    }

    /// Waits until `done` holds of the applier's progress.
    fn wait_for(&self, within: Duration, done: impl Fn(&Progress) -> bool) -> Result<(), LinkError> {
        let deadline = Instant::now() + within;
        let mut progress = lock(&self.progress);
        loop {
            if let Some(failed) = &progress.failed {
                return Err(LinkError::Replica {
                    what: "applying the meta topic".into(),
                    source: failed.clone().into(),
                });
            }
            if done(&progress) {
                return Ok(());
            }
            if self.stop.load(Ordering::Relaxed) {
                return Err(LinkError::Stopped);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LinkError::Timeout(within));
            }
            let wait = (deadline - now).min(Duration::from_millis(200));
            progress = self.advanced.wait_timeout(progress, wait).map_or_else(|e| e.into_inner().0, |(p, _)| p);
        }
    }

    /// Stops the applier and the decider (a decider's open transaction, if
    /// any, is aborted by its successor or the broker).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let threads: Vec<JoinHandle<()>> = lock(&self.threads).drain(..).collect();
        for thread in threads {
            let _ = thread.join();
        }
    }

    // The applier.

    fn applier(&self, from: u64) -> Result<BaseConsumer, LinkError> {
        let consumer: BaseConsumer = self
            .config
            .clone()
            .set("group.id", format!("{}.apply.{}", super::prefix(&self.identity.cluster), self.identity.host))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("fetch.wait.max.ms", "50")
            .create()
            .map_err(KafkaErr::client("creating the meta reader"))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.topics.meta, 0, Offset::Offset(from as i64))
            .map_err(KafkaErr::client("assigning the meta topic"))?;
        consumer.assign(&tpl).map_err(KafkaErr::client("assigning the meta topic"))?;
        Ok(consumer)
    }

    fn apply_loop(&self, consumer: BaseConsumer) {
        let reply_key = format!("{REPLY_PREFIX}{}", self.identity.host);
        let decided_key = format!("{DECIDED_PREFIX}{}", self.identity.host);
        while !self.stop.load(Ordering::Relaxed) {
            let mut records = Vec::new();
            let mut replies = Vec::new();
            let mut decided = None;
            // The offset after the last message read, replies included.
            let mut next = None;
            let mut at_end = false;
            let mut wait = Duration::from_millis(100);
            while records.len() + replies.len() < 1000 {
                match consumer.poll(wait) {
                    Some(Ok(message)) => {
                        let version = message.offset() as u64 + 1;
                        next = Some(version);
                        let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
                        let value = message.payload().map(<[u8]>::to_vec);
                        if key == reply_key {
                            replies.push(value);
                        } else if key == decided_key {
                            decided = value.map(|v| String::from_utf8_lossy(&v).into_owned());
                        } else if !key.starts_with(REPLY_PREFIX) && !key.starts_with(DECIDED_PREFIX) {
                            records.push(Record { version, key, value });
                        }
                    }
                    Some(Err(KafkaError::PartitionEOF(_))) => {
                        at_end = true;
                        break;
                    }
                    Some(Err(e)) => {
                        tracing::warn!("reading the cluster's meta topic: {e}");
                        break;
                    }
                    None => break,
                }
                wait = Duration::ZERO;
            }
            if let Some(next) = next {
                // A store that cannot apply stops this host from following
                // the cluster: retried, never skipped.
                let mut failures = 0u32;
                while let Err(e) = self.replica.apply(&records, next) {
                    failures += 1;
                    tracing::error!("applying the cluster's metadata (attempt {failures}): {e}");
                    if failures >= 10 || self.stop.load(Ordering::Relaxed) {
                        lock(&self.progress).failed = Some(e.to_string());
                        self.advanced.notify_all();
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
            // At the end, the position is past the transactions' markers too.
            let position = if at_end {
                consumer
                    .position()
                    .ok()
                    .and_then(|p| p.find_partition(&self.topics.meta, 0).map(|e| e.offset()))
                    .and_then(|o| if let Offset::Offset(at) = o { u64::try_from(at).ok() } else { None })
            } else {
                None
            };
            if next.is_some() || position.is_some() {
                let mut progress = lock(&self.progress);
                progress.reached = progress.reached.max(next.unwrap_or(0)).max(position.unwrap_or(0));
                if decided.is_some() {
                    progress.decided = decided;
                }
                drop(progress);
                self.advanced.notify_all();
            }
            for reply in replies {
                let reply: Option<Reply> = reply.and_then(|r| serde_json::from_slice(&r).ok());
                if let Some(reply) = reply
                    && let Some(waiter) = lock(&self.waiters).remove(&reply.request)
                {
                    let _ = waiter.try_send(Ok(reply.refused));
                }
            }
        }
    }

    // The decider.

    fn decide_loop(&self) {
        while !self.stop.load(Ordering::Relaxed) {
            if let Err(e) = self.decide_session() {
                tracing::warn!(cluster = %self.identity.cluster, "the cluster's decider on this host restarts: {e}");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }

    /// One life of the decider: its own consumer and producer, so that any
    /// error (fenced, a lost assignment mid-batch, a broker away) restarts
    /// from the committed requests and a fresh producer epoch.
    fn decide_session(&self) -> Result<(), LinkError> {
        let cluster = &self.identity.cluster;
        let consumer: BaseConsumer = self
            .config
            .clone()
            .set("group.id", format!("{}.decider", super::prefix(cluster)))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", SESSION_TIMEOUT_MS)
            .set("heartbeat.interval.ms", "1000")
            .set("fetch.wait.max.ms", "50")
            .create()
            .map_err(KafkaErr::client("creating the decider's consumer"))?;
        consumer.subscribe(&[&self.topics.requests]).map_err(KafkaErr::client("joining the decider group"))?;
        let producer: BaseProducer = self
            .config
            .clone()
            .set("transactional.id", format!("{}.decider", super::prefix(cluster)))
            .set("transaction.timeout.ms", DECIDER_TRANSACTION_TIMEOUT_MS)
            .set("linger.ms", "0")
            .create()
            .map_err(KafkaErr::client("creating the decider's producer"))?;
        let timeout = Duration::from_secs(30);
        let mut ready = false;
        while !self.stop.load(Ordering::Relaxed) {
            let mut batch = Vec::new();
            let mut wait = Duration::from_millis(200);
            while batch.len() < DECIDE_BATCH {
                match consumer.poll(wait) {
                    Some(Ok(message)) => batch.push((message.offset(), message.payload().map(<[u8]>::to_vec))),
                    Some(Err(e)) => return Err(KafkaErr::client("reading requests")(e).into()),
                    None => break,
                }
                wait = Duration::ZERO;
            }
            let Some(&(last, _)) = batch.last() else { continue };
            if !ready {
                // Fences the previous decider and aborts its open transaction.
                producer.init_transactions(timeout).map_err(KafkaErr::client("becoming the decider"))?;
                ready = true;
                tracing::info!(cluster = %cluster, host = %self.identity.host, "this host decides the cluster's writes");
            }
            // Decide on everything earlier deciders committed.
            self.catch_up(timeout)?;
            producer.begin_transaction().map_err(KafkaErr::client("beginning a decision"))?;
            let mut written = HashSet::new();
            for (offset, payload) in batch {
                let request: Request = match payload.as_deref().map(serde_json::from_slice).transpose() {
                    Ok(Some(request)) => request,
                    Ok(None) | Err(_) => {
                        tracing::warn!(cluster = %cluster, offset, "skipping a request that does not parse");
                        continue;
                    }
                };
                let refused = self
                    .replica
                    .first_failing(&request.change.conditions, &written)
                    .map_err(|source| LinkError::Replica { what: "checking a request".into(), source })?;
                if refused.is_none() {
                    for write in &request.change.writes {
                        let value =
                            write.value.as_ref().map(serde_json::to_vec).transpose().map_err(|e| {
                                LinkError::Replica { what: "encoding a write".into(), source: e.into() }
                            })?;
                        let mut record = BaseRecord::<str, [u8]>::to(&self.topics.meta).key(write.key.as_str());
                        if let Some(value) = &value {
                            record = record.payload(value.as_slice());
                        }
                        producer.send(record).map_err(|(e, _)| KafkaErr::client("writing a decision")(e))?;
                        written.insert(write.key.clone());
                    }
                }
                let reply = serde_json::to_vec(&Reply { request: request.id, refused })
                    .map_err(|e| LinkError::Replica { what: "encoding a reply".into(), source: e.into() })?;
                let key = format!("{REPLY_PREFIX}{}", request.host);
                producer
                    .send(BaseRecord::to(&self.topics.meta).key(&key).payload(&reply))
                    .map_err(|(e, _)| KafkaErr::client("writing a reply")(e))?;
            }
            let mut offsets = TopicPartitionList::new();
            offsets
                .add_partition_offset(&self.topics.requests, 0, Offset::Offset(last + 1))
                .map_err(KafkaErr::client("noting the decided requests"))?;
            let group = consumer
                .group_metadata()
                .ok_or_else(|| KafkaErr::Other("the decider's consumer has no group metadata".into()))?;
            producer
                .send_offsets_to_transaction(&offsets, &group, timeout)
                .map_err(KafkaErr::client("committing the decided requests"))?;
            // Last in the batch: once this host has applied it, it has applied
            // the whole batch. The topic's end cannot tell: right after a
            // commit, the transaction's markers may not be written yet, and
            // read_committed readers (and the end they are told) stop
            // before the batch.
            let batch = random_id();
            let decided_key = format!("{DECIDED_PREFIX}{}", self.identity.host);
            producer
                .send(BaseRecord::to(&self.topics.meta).key(&decided_key).payload(batch.as_bytes()))
                .map_err(|(e, _)| KafkaErr::client("writing a decision")(e))?;
            producer.commit_transaction(timeout).map_err(KafkaErr::client("committing a decision"))?;
            self.wait_decided(&batch, timeout)?;
        }
        Ok(())
    }
}

fn spawn_named(name: &str, body: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, LinkError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(body)
        .map_err(|e| LinkError::Kafka(KafkaErr::Other(format!("starting the {name} thread: {e}"))))
}

/// A random request id.
fn random_id() -> String {
    let mut bytes = [0u8; 16];
    // Without randomness, the time and a counter are still unique per host.
    if getrandom::fill(&mut bytes).is_err() {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        bytes[..8].copy_from_slice(&crate::job::now_ms().to_be_bytes());
        bytes[8..].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    }
    hex::encode(bytes)
}

/// Creates the cluster's topics that are missing.
fn ensure_topics(config: &ClientConfig, topics: &Topics) -> Result<(), KafkaErr> {
    let day = (24 * 3600 * 1000).to_string();
    let new = [
        NewTopic::new(&topics.requests, 1, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "delete")
            .set("retention.ms", &day),
        NewTopic::new(&topics.meta, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact"),
        NewTopic::new(&topics.modules, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact"),
        NewTopic::new(&topics.placement, super::placement::SLOTS, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "delete"),
        NewTopic::new(&topics.status, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact"),
    ];
    crate::kafka::tools::admin_with(
        config,
        "creating the cluster's topics",
        RDKafkaErrorCode::TopicAlreadyExists,
        |a, o| a.create_topics(&new, o),
    )
}
