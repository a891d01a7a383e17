//! The transactional Kafka sink of one task.

use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use std::collections::BTreeMap;
use std::sync::Arc;

use rdkafka::producer::{BaseRecord, Producer, PurgeConfig};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::batch::{Batch, TopicHandle};
use super::changelog::{ChangelogWriter, OUTPUT, SinkContext, SinkProducer, serve_or_nap};
use super::{ChangelogSpan, Error, Mark, Result, checkpoint_metadata};
use crate::checkpoint::PartitionOffset;
use crate::record::Output;

/// Queues what `batch` holds, if there is one.
fn queue(batch: Option<Batch<'_>>) -> Result<()> {
    let Some(batch) = batch else { return Ok(()) };
    let topic = batch.topic();
    batch.finish().map_err(writing_to(topic))
}

/// The error of a failed write to `topic`; its message is made only when
/// it fails, not for every record.
fn writing_to(topic: &TopicHandle) -> impl FnOnce(KafkaError) -> Error + '_ {
    move |e| Error::client(format!("writing to `{}`", topic.name()))(e)
}

/// One task's transactional producer.
///
/// A `BaseProducer` served by the task's own thread ([`serve`](Sink::serve)
/// each loop, and by `flush`), not rdkafka's `ThreadedProducer`: that one's
/// polling thread spins through the last millisecond of every 100 ms poll
/// (its timeout is truncated to whole milliseconds), which cost a third of a
/// core per 100 idle jobs.
pub struct Sink {
    producer: Arc<SinkProducer>,
    /// The topics outputs may go to; the first is where an output that
    /// names none goes.
    topics: Vec<TopicHandle>,
    /// The job's changelog topic, for the snapshot writer.
    changelog: Option<String>,
    timeout: Duration,
}

impl Sink {
    /// Creates the producer with `transactional_id` and calls
    /// `init_transactions`, which fences any older producer with the same id
    /// (a zombie of this task) and aborts its open transaction. `topics` are
    /// the topics outputs may go to; `changelog`, the job's changelog topic.
    pub fn connect(
        config: &ClientConfig,
        transactional_id: &str,
        topics: &[String],
        changelog: Option<&str>,
        timeout: Duration,
    ) -> Result<Self> {
        let producer: SinkProducer = config
            .clone()
            .set("transactional.id", transactional_id)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            // A topic the sink asks about must exist: a broker with
            // `auto.create.topics.enable` (Kafka's default) would otherwise
            // make a missing or deleted one, with its own defaults.
            .set("allow.auto.create.topics", "false")
            .create_with_context(SinkContext::default())
            .map_err(Error::client("creating the transactional producer"))?;
        producer
            .init_transactions(timeout)
            .map_err(Error::client(format!("initialising transactions for `{transactional_id}`")))?;
        let producer = Arc::new(producer);
        let topics = topics
            .iter()
            .map(|topic| TopicHandle::new(&producer, topic))
            .collect::<std::result::Result<_, _>>()
            .map_err(Error::client("opening the output topics"))?;
        Ok(Sink { producer, topics, changelog: changelog.map(str::to_owned), timeout })
    }

    /// A handle that sends deltas to the changelog in this producer's open
    /// transaction (from the snapshot writer's thread), if the job has one.
    ///
    /// Call it once the topic exists: [`super::changelog::ensure_topic`]
    /// creates it compacted, with a partition per shard.
    pub fn changelog_writer(&self) -> Result<Option<ChangelogWriter>> {
        let Some(topic) = &self.changelog else { return Ok(None) };
        let handle = TopicHandle::new(&self.producer, topic)
            .map_err(Error::client(format!("opening the changelog `{topic}`")))?;
        Ok(Some(ChangelogWriter::new(Arc::new(handle))))
    }

    /// One past the last changelog record delivered, per shard, since the
    /// last call: after [`flush`](Self::flush), where the epoch's changelog
    /// records end.
    pub fn take_changelog_ends(&self) -> BTreeMap<u32, i64> {
        self.producer
            .context()
            .take_ends()
            .into_iter()
            .filter_map(|(partition, end)| Some((u32::try_from(partition).ok()?, end)))
            .collect()
    }

    /// Aborts the transaction a producer with `transactional_id` left open
    /// (a task that failed, hangs or died) by fencing it: a new producer's
    /// `init_transactions` does both. The fenced producer, if it still
    /// runs, fails its next transactional call.
    pub fn fence(config: &ClientConfig, transactional_id: &str, timeout: Duration) -> Result<()> {
        Sink::connect(config, transactional_id, &[], None, timeout).map(drop)
    }

    /// Opens the transaction of the next epoch.
    pub fn begin(&self) -> Result<()> {
        self.producer.begin_transaction().map_err(Error::client("beginning a transaction"))
    }

    /// Queues `records` into the open transaction, in order: those without
    /// headers a chunk per librdkafka call (`kafka::batch`), the others one
    /// by one. Keys and values are read where they lie ([`Outputs`] or
    /// [`OutputRecord`]s); librdkafka copies them.
    ///
    /// [`Outputs`]: crate::record::Outputs
    pub fn send_all<'a, R: Output<'a>>(&self, records: impl IntoIterator<Item = R>) -> Result<()> {
        let records = records.into_iter();
        let expected = records.size_hint().0;
        let mut batch: Option<Batch<'_>> = None;
        for record in records {
            let topic = self.topic_of(record.topic())?;
            let headers = record.headers();
            let batched = headers.len() == 0;
            if batch.as_ref().is_some_and(|b| !batched || !std::ptr::eq(b.topic(), topic)) {
                // What came before is queued first: order holds.
                queue(batch.take())?;
            }
            if batched {
                batch
                    .get_or_insert_with(|| Batch::new(topic, None, OUTPUT, expected))
                    .push(record.key(), record.value())
                    .map_err(writing_to(topic))?;
            } else {
                self.send(topic, record.key(), record.value(), headers)?;
            }
        }
        queue(batch)
    }

    /// The declared topic named `topic` (`None`: the first).
    fn topic_of(&self, topic: Option<&str>) -> Result<&TopicHandle> {
        let declared = || self.topics.iter().map(TopicHandle::name).collect::<Vec<_>>().join(", ");
        match topic {
            None => self
                .topics
                .first()
                .ok_or_else(|| Error::UndeclaredTopic { topic: "(none named)".into(), declared: declared() }),
            Some(topic) => self
                .topics
                .iter()
                .find(|t| t.name() == topic)
                .ok_or_else(|| Error::UndeclaredTopic { topic: topic.to_owned(), declared: declared() }),
        }
    }

    /// Queues one record into the open transaction, headers and all.
    fn send<'a>(
        &self,
        topic: &TopicHandle,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl ExactSizeIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<()> {
        let topic = topic.name();
        let mut kafka_record: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(topic, OUTPUT);
        // librdkafka allocates a header list even for none: skip it then.
        if headers.len() > 0 {
            let mut list = OwnedHeaders::new_with_capacity(headers.len());
            for (key, value) in headers {
                list = list.insert(KafkaHeader { key, value: Some(value) });
            }
            kafka_record = kafka_record.headers(list);
        }
        if let Some(key) = key {
            kafka_record = kafka_record.key(key);
        }
        if let Some(value) = value {
            kafka_record = kafka_record.payload(value);
        }
        loop {
            match self.producer.send(kafka_record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    // The local queue is full: serve the deliveries that drain it.
                    kafka_record = returned;
                    serve_or_nap(&self.producer);
                }
                Err((e, _)) => return Err(Error::client(format!("writing to `{topic}`"))(e)),
            }
        }
    }

    /// Serves the producer's events (delivery reports, which free the local
    /// queue) without waiting. Call it regularly.
    pub fn serve(&self) {
        self.producer.poll(Duration::ZERO);
    }

    /// Waits until every queued record is delivered into the transaction.
    ///
    /// Not `Producer::flush`: rdkafka's waits in slices of 100 ms (its
    /// `poll` returns only at its deadline), which added up to 100 ms to
    /// every checkpoint. Here the wait ends within a quarter of a
    /// millisecond of the last delivery report, and sleeps rather than spins
    /// (see [`serve_or_nap`]).
    pub fn flush(&self) -> Result<()> {
        if self.wait_for_deliveries() {
            return Ok(());
        }
        let pending = self.producer.in_flight_count();
        Err(Error::client(format!("flushing outputs ({pending} not delivered)"))(KafkaError::Flush(
            RDKafkaErrorCode::OperationTimedOut,
        )))
    }

    /// Serves delivery reports until nothing is in flight (true) or the
    /// producer's timeout has passed (false).
    fn wait_for_deliveries(&self) -> bool {
        let deadline = Instant::now() + self.timeout;
        while self.producer.in_flight_count() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            serve_or_nap(&self.producer);
        }
        true
    }

    /// Adds the input offsets to the open transaction, each carrying `mark`
    /// (the checkpoint, the migration generation the state holds, the
    /// task's run and the job's incarnation) with its shard's span of
    /// `changelog` in its metadata.
    pub fn send_offsets(
        &self,
        offsets: &[PartitionOffset],
        mark: Mark,
        changelog: &BTreeMap<u32, ChangelogSpan>,
        group: &ConsumerGroupMetadata,
    ) -> Result<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        let checkpoint = mark.checkpoint;
        let mut tpl = TopicPartitionList::new();
        for o in offsets {
            let span = u32::try_from(o.partition).ok().and_then(|shard| changelog.get(&shard)).copied();
            let metadata = checkpoint_metadata(Mark { changelog: span, ..mark });
            let mut elem = tpl.add_partition(&o.topic, o.partition);
            elem.set_offset(Offset::Offset(o.next_offset)).map_err(Error::client("building the offsets"))?;
            elem.set_metadata(metadata.as_str());
        }
        self.producer
            .send_offsets_to_transaction(&tpl, group, self.timeout)
            .map_err(Error::client(format!("adding the offsets of checkpoint {checkpoint} to the transaction")))
    }

    /// Commits the open transaction: the decision point of a checkpoint.
    pub fn commit(&self, checkpoint: u64) -> Result<()> {
        self.producer
            .commit_transaction(self.timeout)
            .map_err(Error::client(format!("committing the transaction of checkpoint {checkpoint}")))
    }

    /// Aborts the open transaction, so read_committed consumers are not held
    /// up by it until it times out.
    ///
    /// librdkafka's abort waits until no record is outstanding, which for a
    /// `BaseProducer` only happens while someone serves its delivery
    /// reports: without this, an abort with records still queued waited out
    /// the whole timeout (30 s) and then failed. So the queued records are
    /// purged first (they belong to the aborted epoch anyway) and their
    /// reports served here.
    pub fn abort(&self) -> Result<()> {
        self.producer.purge(PurgeConfig::default().queue());
        // Whether or not all are served in time, abort: it fails with the
        // reason if records are still outstanding.
        self.wait_for_deliveries();
        self.producer.abort_transaction(self.timeout).map_err(Error::client("aborting the transaction"))
    }
}
