//! The changelog: a job's state changes in a compacted Kafka topic, one
//! partition per shard, so that a shard's state can be rebuilt anywhere.
//!
//! At each checkpoint the snapshot writer sends the epoch's delta here
//! ([`ChangelogWriter`]), into the task's open transaction: a changelog
//! record is visible exactly when its checkpoint's outputs and offsets are.
//! The key is the guest's key, the value the new value or none (a tombstone,
//! for a delete). The producer's delivery reports say where each shard's
//! records landed ([`SinkContext`]), and the checkpoint's offset metadata
//! records the shard's [`ChangelogSpan`]. A task that finds a shard's local
//! state missing or behind [`restore`]s exactly that span, read_committed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{NewPartitions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

use super::batch::{Batch, TopicHandle};
use super::{ChangelogSpan, Error, Result};
use crate::runtime::{SHARD_PREFIX_BYTES, shard_of};
use crate::state::Delta;

/// The transactional producer's context: notes, per changelog partition,
/// one past the last offset delivered since the last [`take_ends`](Self::take_ends).
#[derive(Debug, Default)]
pub struct SinkContext {
    ends: Mutex<BTreeMap<i32, i64>>,
}

/// The delivery opaque of a changelog record; outputs carry [`OUTPUT`].
/// A number, not the topic's name: comparing the name meant reading and
/// checking it as UTF-8 for every delivered record.
const CHANGELOG: usize = 1;

/// The delivery opaque of an output record.
pub(super) const OUTPUT: usize = 0;

impl SinkContext {
    /// The end of each changelog partition written to since the last call.
    pub fn take_ends(&self) -> BTreeMap<i32, i64> {
        std::mem::take(&mut *self.ends.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

impl ClientContext for SinkContext {}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        // A failed delivery fails the transaction's commit; nothing to note.
        let (CHANGELOG, Ok(message)) = (opaque, result) else { return };
        let mut ends = self.ends.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let end = ends.entry(message.partition()).or_insert(0);
        *end = (*end).max(message.offset() + 1);
    }
}

/// The transactional producer, shared by a task's thread (outputs) and its
/// snapshot writer (changelog records).
pub type SinkProducer = BaseProducer<SinkContext>;

/// How long a wait for deliveries sleeps when the producer had nothing new.
const DELIVERY_NAP: Duration = Duration::from_micros(250);

/// One step of a wait for `producer`'s deliveries: serves one pending event
/// (delivery reports come batched) without blocking, and naps if that
/// delivered nothing.
///
/// Not `poll(1 ms)`: rdkafka's `poll` loops until its deadline and hands
/// librdkafka the time left in whole milliseconds, which is 0 within the
/// last millisecond, so every `poll(1 ms)` was a 1 ms busy loop. The tasks'
/// waits for their checkpoints' deliveries spent 4% of the process's CPU in
/// it at 100 ms checkpoints (`perf`, bench/peers.sh).
pub(super) fn serve_or_nap(producer: &SinkProducer) {
    let before = producer.in_flight_count();
    producer.poll(Duration::ZERO);
    if before > 0 && producer.in_flight_count() == before {
        std::thread::sleep(DELIVERY_NAP);
    }
}

/// Sends deltas to the changelog, from the snapshot writer's thread.
#[derive(Clone)]
pub struct ChangelogWriter {
    topic: Arc<TopicHandle>,
}

impl ChangelogWriter {
    pub(super) fn new(topic: Arc<TopicHandle>) -> Self {
        ChangelogWriter { topic }
    }

    /// Sends every write of `delta` (its keys carry their shard) to the
    /// shard's partition, into the open transaction, a batch per shard.
    /// Returns the records sent.
    pub fn send(&self, delta: &Delta) -> Result<usize> {
        // The message is made only when a write fails, not for every key.
        let failed = |e| Error::client(format!("writing to the changelog `{}`", self.topic.name()))(e);
        // In no order within a shard: a delta holds each key once, and
        // compaction keeps the last record per key whatever the order
        // within one epoch. A batch per shard: see `Batch::new`.
        let mut batches: BTreeMap<i32, Batch<'_>> = BTreeMap::new();
        let mut sent = 0;
        for (key, value) in delta.iter() {
            let Some(shard) = shard_of(key).and_then(|s| i32::try_from(s).ok()) else { continue };
            batches
                .entry(shard)
                .or_insert_with(|| Batch::new(&self.topic, Some(shard), CHANGELOG, delta.len()))
                .push(Some(&key[SHARD_PREFIX_BYTES..]), value)
                .map_err(failed)?;
            sent += 1;
        }
        for batch in batches.into_values() {
            batch.finish().map_err(failed)?;
        }
        Ok(sent)
    }
}

/// Creates the changelog topic with `partitions` partitions (one per shard)
/// and `cleanup.policy=compact` if it is missing, and adds partitions if it
/// has fewer (the input gained partitions); returns once the metadata shows
/// them. A topic that is there already costs one metadata request.
pub fn ensure_topic(clients: &super::Clients, topic: &str, partitions: usize, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut created = false;
    // A topic just created shows in a broker's metadata a moment later
    // (KRaft applies it asynchronously): asked again soon, then less often.
    let mut pause = Duration::from_millis(5);
    loop {
        let metadata = clients
            .metadata()
            .fetch_metadata(Some(topic), timeout)
            .map_err(Error::client(format!("reading the metadata of the changelog `{topic}`")))?;
        let have =
            metadata.topics().iter().find(|t| t.name() == topic && t.error().is_none()).map(|t| t.partitions().len());
        match have {
            Some(have) if have >= partitions => return Ok(()),
            Some(have) if have > 0 => {
                let more = NewPartitions::new(topic, partitions);
                clients.admin(
                    "adding partitions to the changelog topic",
                    RDKafkaErrorCode::InvalidPartitions,
                    |a, o| a.create_partitions([&more], o),
                )?;
            }
            _ if !created => {
                let max_message = (super::max_message_bytes(clients.config()) + 1024).max(1_048_588).to_string();
                let new = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(-1))
                    .set("cleanup.policy", "compact")
                    .set("max.message.bytes", &max_message);
                clients.admin("creating the changelog topic", RDKafkaErrorCode::TopicAlreadyExists, |a, o| {
                    a.create_topics([&new], o)
                })?;
                created = true;
                continue;
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(Error::TopicUnavailable {
                topic: topic.to_owned(),
                reason: format!("it does not show {partitions} partitions"),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// The end (high watermark) of each of `shards`' changelog partitions now:
/// where a shard that starts afresh begins its span. A topic
/// [`ensure_topic`] has just created shows in the metadata a moment before
/// its broker serves the partitions: [`super::until_served`] asks again.
pub fn ends(clients: &super::Clients, topic: &str, shards: &[u32], timeout: Duration) -> Result<BTreeMap<u32, i64>> {
    let deadline = Instant::now() + timeout;
    shards
        .iter()
        .map(|&shard| {
            let (_, high) =
                super::until_served(deadline, |left| clients.metadata().fetch_watermarks(topic, shard as i32, left))
                    .map_err(Error::client(format!("reading the end of changelog {topic}/{shard}")))?;
            Ok((shard, high))
        })
        .collect()
}

/// What a [`restore`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Restored {
    /// Records read (compaction leaves one per key, plus recent updates).
    pub records: u64,
    /// Bytes of their keys and values.
    pub bytes: u64,
    /// Wall time.
    pub seconds: f64,
}

/// Records per chunk handed to `apply` at most: the store takes a chunk in
/// one transaction, in key order, so big chunks write faster.
const RESTORE_CHUNK: usize = 250_000;

/// Bytes (keys and values) per chunk at most, which bounds a restore's
/// memory: one chunk read ahead, one being read, one being written (96 MiB
/// at most). Fewer, larger transactions rewrite fewer B-tree pages: 32 MiB
/// chunks restore 1M scattered keys ~10% faster than 8 MiB ones.
const RESTORE_CHUNK_BYTES: usize = 32 << 20;

/// Chunks read ahead of `apply`: reading the next one overlaps writing
/// this one.
const RESTORE_READ_AHEAD: usize = 1;

/// One chunk of a shard's changelog: (key, value or none for a delete).
pub type Chunk = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// How often a restore looks whether its task is stopping.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// Reads `shard`'s changelog span, read_committed, in offset order, and
/// hands its records to `apply` in chunks (key, value or none for a
/// delete). Fails if the changelog ends before the span does (records were
/// deleted, or the topic was recreated), or if no record comes for
/// `timeout`.
///
/// A reader thread fetches while `apply` (the caller's thread) writes, so a
/// restore takes about as long as the slower of the two, not their sum.
pub fn restore<E: From<Error>>(
    config: &ClientConfig,
    topic: &str,
    shard: u32,
    span: ChangelogSpan,
    timeout: Duration,
    stopping: &dyn Fn() -> bool,
    mut apply: impl FnMut(Chunk) -> std::result::Result<(), E>,
) -> std::result::Result<Restored, E> {
    let started = Instant::now();
    if span.to <= span.from {
        return Ok(Restored::default());
    }
    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", "sluice.changelog-restore")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        // Once its local queue is full, librdkafka waits this long before
        // fetching again (default 1 s): a restore drains the queue far
        // faster than that.
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .map_err(Error::client("creating a changelog reader"))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, shard as i32, Offset::Offset(span.from))
        .map_err(Error::client(format!("assigning changelog {topic}/{shard}")))?;
    consumer.assign(&tpl).map_err(Error::client(format!("assigning changelog {topic}/{shard}")))?;
    let (chunks, received) = std::sync::mpsc::sync_channel::<Chunk>(RESTORE_READ_AHEAD);
    // Set when the caller stops: the reader ends at its next record.
    let cancelled = std::sync::atomic::AtomicBool::new(false);
    let (read, applied) = std::thread::scope(|scope| {
        let reader = std::thread::Builder::new()
            .name(format!("restore-{shard}"))
            .spawn_scoped(scope, || read_span(&consumer, topic, shard, span, timeout, &cancelled, chunks));
        let reader = match reader {
            Ok(reader) => reader,
            Err(e) => return (Err(Error::Other(format!("starting the changelog reader: {e}"))), Ok(())),
        };
        let mut applied = Ok(());
        loop {
            if stopping() {
                applied = Err(Error::Stopped.into());
                break;
            }
            match received.recv_timeout(STOP_CHECK) {
                Ok(chunk) => {
                    if let Err(e) = apply(chunk) {
                        applied = Err(e);
                        break;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        // A failed apply, or a stop, ends the reader at its next send or
        // record.
        cancelled.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(received);
        let read = reader
            .join()
            .unwrap_or_else(|_| Err(Error::Other(format!("the reader of changelog {topic}/{shard} panicked"))));
        (read, applied)
    });
    applied?;
    let mut restored = read?;
    restored.seconds = started.elapsed().as_secs_f64();
    Ok(restored)
}

/// The reader thread of [`restore`]: sends the span's records in chunks
/// until the span is read, `chunks` is closed, or reading fails.
fn read_span(
    consumer: &BaseConsumer,
    topic: &str,
    shard: u32,
    span: ChangelogSpan,
    timeout: Duration,
    cancelled: &std::sync::atomic::AtomicBool,
    chunks: std::sync::mpsc::SyncSender<Chunk>,
) -> Result<Restored> {
    let mut restored = Restored::default();
    let short = |end: i64| Error::ChangelogTruncated { topic: topic.to_owned(), shard, end, to: span.to };
    let mut chunk = Vec::new();
    let mut chunk_bytes = 0;
    let mut last_progress = Instant::now();
    'read: loop {
        if cancelled.load(std::sync::atomic::Ordering::Relaxed) {
            // The caller's error (or stop) is the one to report.
            return Ok(restored);
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                last_progress = Instant::now();
                if message.offset() >= span.to {
                    break 'read;
                }
                let key = message.key().unwrap_or_default().to_vec();
                let value = message.payload().map(<[u8]>::to_vec);
                let bytes = key.len() + value.as_ref().map_or(0, Vec::len);
                restored.records += 1;
                restored.bytes += bytes as u64;
                chunk_bytes += bytes;
                chunk.push((key, value));
                if chunk.len() >= RESTORE_CHUNK || chunk_bytes >= RESTORE_CHUNK_BYTES {
                    chunk_bytes = 0;
                    if chunks.send(std::mem::take(&mut chunk)).is_err() {
                        // The caller stopped applying; its error is the one to report.
                        return Ok(restored);
                    }
                }
                if message.offset() + 1 >= span.to {
                    break 'read;
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {
                // Compaction may have removed the span's last records: at
                // the end, the position says whether the span was read.
                let position =
                    consumer.position().ok().and_then(|p| p.find_partition(topic, shard as i32).map(|e| e.offset()));
                match position {
                    Some(Offset::Offset(at)) if at >= span.to => break 'read,
                    Some(Offset::Offset(at)) => {
                        let (_, high) = consumer
                            .fetch_watermarks(topic, shard as i32, Duration::from_secs(10))
                            .map_err(Error::client(format!("reading the end of changelog {topic}/{shard}")))?;
                        if high < span.to {
                            return Err(short(high.max(at)));
                        }
                    }
                    _ => {}
                }
            }
            Some(Err(e)) => return Err(Error::client(format!("reading changelog {topic}/{shard}"))(e)),
            None => {}
        }
        if last_progress.elapsed() > timeout {
            return Err(Error::Other(format!(
                "restoring shard {shard} from changelog {topic}: no record for {timeout:?}"
            )));
        }
    }
    if !chunk.is_empty() {
        // Ignored if the caller stopped: then its error is reported.
        let _ = chunks.send(chunk);
    }
    Ok(restored)
}
