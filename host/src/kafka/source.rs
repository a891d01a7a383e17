//! The Kafka source of one task.

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, ConsumerGroupMetadata, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

use super::fetch::ConsumerQueue;
use super::{Error, Result, parse_checkpoint_metadata};
use crate::checkpoint::PartitionOffset;
use crate::record::InputRecord;

/// Records not read yet in one input partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct PartitionLag {
    /// The input topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// Its high watermark minus the next offset the task reads.
    pub lag_records: u64,
}

/// Where a fresh job starts reading a partition that has no committed offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum StartPosition {
    /// The oldest record still in the partition.
    #[default]
    Earliest,
    /// Only records written after the job starts.
    Latest,
}

/// Where a reset moves a job's committed positions (`sluice job reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTo {
    /// The oldest record still in each partition.
    Earliest,
    /// The end of each partition: only records written from now on.
    Latest,
    /// The first record at or after this time (milliseconds since the Unix
    /// epoch, the records' Kafka timestamps); the end where there is none.
    Timestamp(i64),
}

/// What Kafka holds as committed for a task's partitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    /// Per shard (partition number), the checkpoint id in its partitions'
    /// offset metadata (one transaction commits every partition of a shard
    /// with the same one).
    pub checkpoints: BTreeMap<u32, u64>,
    /// Per shard, its changelog span, if its checkpoint wrote one.
    pub changelogs: BTreeMap<u32, super::ChangelogSpan>,
    /// Per shard, the migration generation its committed state holds.
    pub migrated: BTreeMap<u32, u64>,
    /// Per shard, the task run that committed its checkpoint (none for
    /// checkpoints of hosts before runs were noted).
    pub runs: BTreeMap<u32, u64>,
    /// Per shard, the job incarnation that committed its checkpoint (none
    /// for checkpoints of hosts before incarnations, and of `sluice run`).
    pub incarnations: BTreeMap<u32, u64>,
    /// The next offset to read, per partition that has one.
    pub offsets: BTreeMap<(String, i32), i64>,
}

impl Committed {
    /// What `shard`'s offsets carry.
    pub fn mark(&self, shard: u32) -> Option<super::Mark> {
        let checkpoint = *self.checkpoints.get(&shard)?;
        Some(super::Mark {
            checkpoint,
            changelog: self.changelogs.get(&shard).copied(),
            migrated: self.migrated.get(&shard).copied(),
            run: self.runs.get(&shard).copied(),
            incarnation: self.incarnations.get(&shard).copied(),
        })
    }

    /// The committed checkpoint of each of `shards`.
    pub fn for_shards(&self, shards: &[u32]) -> crate::checkpoint::ShardCheckpoints {
        shards.iter().map(|&shard| (shard, self.checkpoints.get(&shard).copied())).collect()
    }
}

/// Reads one task's input partitions: a fixed share it assigns itself
/// ([`Source::connect`], then [`Source::assign`]), or, as a member of the
/// job's consumer group, what Kafka assigns it ([`Source::join`], then
/// [`Source::assign`] of its whole shards).
pub struct Source {
    /// Declared before `consumer`: dropped first, as it must be. `None` for
    /// a member, whose reads must serve rebalances (see `fetch`).
    queue: Option<ConsumerQueue>,
    consumer: BaseConsumer<SourceContext>,
    /// topic -> partition -> next offset to read.
    positions: BTreeMap<String, BTreeMap<i32, i64>>,
    /// Where a partition without a committed offset starts.
    start: StartPosition,
}

/// What a member's consumer does when the group's assignment changes.
///
/// rdkafka's default handling gives or takes the partitions incrementally
/// (KIP-848's protocol always is). A partition given is paused at once: it
/// must not be read before the task recovered its shard and placed it at
/// its committed offset ([`Source::assign`]). Every change is counted, so
/// the task sees it after the read it happened in.
#[derive(Default)]
pub(super) struct SourceContext {
    changes: AtomicU64,
}

impl ClientContext for SourceContext {}

impl ConsumerContext for SourceContext {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance
            && let Err(e) = consumer.pause(partitions)
        {
            // `assign` pauses every partition again before it resumes any.
            tracing::warn!("pausing the partitions the group assigned: {e}");
        }
        self.changes.fetch_add(1, Ordering::SeqCst);
    }
}

/// The consumer configuration of a task's source.
fn consumer_config(config: &ClientConfig, group: &str, start: StartPosition) -> ClientConfig {
    let mut config = config.clone();
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false")
        .set(
            "auto.offset.reset",
            match start {
                StartPosition::Earliest => "earliest",
                StartPosition::Latest => "latest",
            },
        );
    // librdkafka stops fetching a partition for `fetch.queue.backoff.ms`
    // (1 s by default) whenever its queue holds `queued.min.messages`
    // (100,000): a task that reads a backlog faster than that a second then
    // waited for input most of each second (80% of it, measured, at about
    // 125,000 records/s per task). Its own value, if the job sets one.
    if config.get("fetch.queue.backoff.ms").is_none() {
        config.set("fetch.queue.backoff.ms", "10");
    }
    config
}

impl Source {
    /// A consumer in the job's group, reading committed data only. Nothing is
    /// assigned yet.
    pub fn connect(config: &ClientConfig, group: &str, start: StartPosition) -> Result<Self> {
        let consumer: BaseConsumer<SourceContext> = consumer_config(config, group, start)
            .create_with_context(SourceContext::default())
            .map_err(Error::client("creating the consumer"))?;
        let queue = ConsumerQueue::of(&consumer).ok_or_else(|| {
            Error::client("creating the consumer")(KafkaError::ClientCreation("it has no consumer queue".into()))
        })?;
        Ok(Source { queue: Some(queue), consumer, positions: BTreeMap::new(), start })
    }

    /// A member of the job's consumer group over `topics`, under KIP-848's
    /// protocol with the broker's `range` assignor: it spreads partitions
    /// over the members incrementally and stickily, and gives partition p
    /// of every topic to one member when the topics have as many partitions
    /// (a job's do: shard p is partition p of each), so shards stay whole.
    /// Kafka assigns partitions as the task polls; each waits, paused, for
    /// [`assign`](Self::assign).
    pub fn join(config: &ClientConfig, group: &str, start: StartPosition, topics: &[String]) -> Result<Self> {
        let consumer: BaseConsumer<SourceContext> = consumer_config(config, group, start)
            .set("group.protocol", "consumer")
            .set("group.remote.assignor", "range")
            .create_with_context(SourceContext::default())
            .map_err(Error::client("creating the group member"))?;
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics).map_err(Error::client(format!("joining group {group}")))?;
        Ok(Source { queue: None, consumer, positions: BTreeMap::new(), start })
    }

    /// How many times the group changed this member's partitions so far.
    pub fn assignment_changes(&self) -> u64 {
        self.consumer.context().changes.load(Ordering::SeqCst)
    }

    /// The partitions the group assigns this member now, sorted.
    pub fn assigned(&self) -> Result<Vec<(String, i32)>> {
        let assignment = self.consumer.assignment().map_err(Error::client("reading the assignment"))?;
        let mut partitions: Vec<(String, i32)> =
            assignment.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect();
        partitions.sort();
        Ok(partitions)
    }

    /// For a member that reads nothing now: serves the group for up to
    /// `wait`. Its partitions are all paused; a record fetched before its
    /// pause is dropped (a partition is placed anew before it is read).
    pub fn serve_group(&self, wait: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if let Some(Err(e)) = self.consumer.poll(left) {
                return Err(Error::client("serving the group")(e));
            }
            if left.is_zero() {
                return Ok(());
            }
        }
    }

    /// Whether the group assigns this source's partitions ([`join`](Self::join)).
    fn is_member(&self) -> bool {
        self.queue.is_none()
    }

    /// The partitions of `topics`, sorted; an error names a missing topic.
    pub fn partitions(&self, topics: &[String], brokers: &str, timeout: Duration) -> Result<Vec<(String, i32)>> {
        super::clients::partitions_of(&self.consumer, topics, brokers, timeout)
    }

    /// The group's committed offsets and checkpoint id for `partitions`.
    pub fn committed(&self, partitions: &[(String, i32)], timeout: Duration) -> Result<Committed> {
        let mut tpl = TopicPartitionList::new();
        for (topic, partition) in partitions {
            tpl.add_partition(topic, *partition);
        }
        // A new job's group has no coordinator for a moment on a broker
        // that has not served a group before.
        let deadline = std::time::Instant::now() + timeout;
        let committed = super::until_served(deadline, |left| self.consumer.committed_offsets(tpl.clone(), left))
            .map_err(Error::client("reading the committed offsets"))?;
        let mut out = Committed::default();
        for elem in committed.elements() {
            if let Offset::Offset(offset) = elem.offset() {
                out.offsets.insert((elem.topic().to_string(), elem.partition()), offset);
                let mark = parse_checkpoint_metadata(elem.metadata()).map_err(|e| {
                    Error::Assignment(format!("partition {} of `{}`: {e}", elem.partition(), elem.topic()))
                })?;
                let Some(mark) = mark else { continue };
                let Ok(shard) = u32::try_from(elem.partition()) else { continue };
                let id = mark.checkpoint;
                if let Some(span) = mark.changelog {
                    out.changelogs.insert(shard, span);
                }
                if let Some(generation) = mark.migrated {
                    out.migrated.insert(shard, generation);
                }
                if let Some(run) = mark.run {
                    out.runs.insert(shard, run);
                }
                if let Some(incarnation) = mark.incarnation {
                    out.incarnations.insert(shard, incarnation);
                }
                // A shard's partitions always commit in one transaction;
                // different ids mean its offsets were changed by hand.
                match out.checkpoints.insert(shard, id) {
                    Some(seen) if seen != id => {
                        return Err(Error::Assignment(format!(
                            "the committed offsets of partition {shard} of the input topics carry different \
                             checkpoint ids ({seen} and {id}): they were committed apart from sluice; reset the job"
                        )));
                    }
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    /// Reads `partitions`, each from its committed offset if it has one. A
    /// partition without one starts at the job's start position, resolved
    /// here to a concrete offset (its low or high watermark) so that the
    /// first checkpoint commits it: a restart must never resolve "latest"
    /// again and skip what was read before. Returns how many partitions were
    /// resolved so (the caller commits them before anything else).
    ///
    /// A source that assigns its partitions itself assigns exactly these. A
    /// member reads these (the whole shards the group gave it) and holds
    /// every other partition it was assigned back: a shard assigned in part,
    /// while the group moves it, stays paused.
    pub fn assign(&mut self, partitions: &[(String, i32)], committed: &Committed, timeout: Duration) -> Result<usize> {
        let (tpl, resolved) = self.positioned(partitions, committed, timeout)?;
        if !self.is_member() {
            self.consumer.assign(&tpl).map_err(Error::client("assigning partitions"))?;
            return Ok(resolved);
        }
        let assigned = self.consumer.assignment().map_err(Error::client("reading the assignment"))?;
        self.consumer.pause(&assigned).map_err(Error::client("holding the assigned partitions back"))?;
        if tpl.count() > 0 {
            self.consumer.seek_partitions(tpl.clone(), timeout).map_err(Error::client("placing the partitions"))?;
            self.consumer.resume(&tpl).map_err(Error::client("resuming the partitions"))?;
        }
        Ok(resolved)
    }

    /// Notes where each of `partitions` goes on (as [`assign`](Self::assign)
    /// says) as the only positions; returns them, and how many were
    /// resolved to the start position.
    fn positioned(
        &mut self,
        partitions: &[(String, i32)],
        committed: &Committed,
        timeout: Duration,
    ) -> Result<(TopicPartitionList, usize)> {
        let mut tpl = TopicPartitionList::new();
        self.positions.clear();
        let mut resolved = 0;
        for (topic, partition) in partitions {
            let next = match committed.offsets.get(&(topic.clone(), *partition)) {
                Some(&next) => next,
                None => {
                    resolved += 1;
                    self.start_offset(topic, *partition, timeout)?
                }
            };
            self.positions.entry(topic.clone()).or_default().insert(*partition, next);
            tpl.add_partition_offset(topic, *partition, Offset::Offset(next))
                .map_err(Error::client(format!("placing {topic}/{partition}")))?;
        }
        Ok((tpl, resolved))
    }

    /// The offset of every one of `partitions` that `to` means now.
    pub fn offsets_at(&self, partitions: &[(String, i32)], to: ResetTo, timeout: Duration) -> Result<Vec<i64>> {
        let watermarks = |topic: &str, partition: i32| {
            self.consumer
                .fetch_watermarks(topic, partition, timeout)
                .map_err(Error::client(format!("reading the offsets of {topic}/{partition}")))
        };
        let ResetTo::Timestamp(at) = to else {
            return partitions
                .iter()
                .map(|(topic, partition)| {
                    let (low, high) = watermarks(topic, *partition)?;
                    Ok(if to == ResetTo::Earliest { low } else { high })
                })
                .collect();
        };
        let mut query = TopicPartitionList::new();
        for (topic, partition) in partitions {
            query
                .add_partition_offset(topic, *partition, Offset::Offset(at))
                .map_err(Error::client(format!("asking for the offset of {topic}/{partition} at {at}")))?;
        }
        let found = self
            .consumer
            .offsets_for_times(query, timeout)
            .map_err(Error::client(format!("finding the offsets at {at} ms")))?;
        partitions
            .iter()
            .map(|(topic, partition)| match found.find_partition(topic, *partition).map(|e| e.offset()) {
                Some(Offset::Offset(offset)) => Ok(offset),
                // No record at or after that time: the end.
                _ => Ok(watermarks(topic, *partition)?.1),
            })
            .collect()
    }

    /// Commits `offsets` of `partitions` as the group's positions, outside any
    /// transaction, in one request, each carrying its shard's checkpoint id
    /// and changelog span from `committed` in its metadata (or none): for a
    /// reset of a stopped job, whose tasks are not running.
    pub fn commit_positions(&self, partitions: &[(String, i32)], offsets: &[i64], committed: &Committed) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in partitions.iter().zip(offsets) {
            let metadata = u32::try_from(*partition)
                .ok()
                .and_then(|shard| committed.mark(shard))
                .map(super::checkpoint_metadata)
                .unwrap_or_default();
            let mut element = tpl.add_partition(topic, *partition);
            element
                .set_offset(Offset::Offset(*offset))
                .map_err(Error::client(format!("setting the position of {topic}/{partition}")))?;
            element.set_metadata(metadata);
        }
        self.consumer.commit(&tpl, rdkafka::consumer::CommitMode::Sync).map_err(Error::client("committing positions"))
    }

    /// The offset the start position means for `topic`/`partition` now.
    fn start_offset(&self, topic: &str, partition: i32, timeout: Duration) -> Result<i64> {
        let (low, high) = self
            .consumer
            .fetch_watermarks(topic, partition, timeout)
            .map_err(Error::client(format!("resolving the start offset of {topic}/{partition}")))?;
        Ok(match self.start {
            StartPosition::Earliest => low,
            StartPosition::Latest => high,
        })
    }

    /// Reads up to `max` records, waiting at most `wait` for the first one.
    /// A member's read ends early when the group changed its partitions:
    /// see [`assignment_changes`](Self::assignment_changes).
    pub fn poll_batch(&mut self, max: usize, wait: Duration) -> Result<Vec<InputRecord>> {
        let mut batch: Vec<InputRecord> = Vec::with_capacity(max);
        let Some(queue) = &mut self.queue else {
            self.poll_as_member(&mut batch, max, wait)?;
            return Ok(batch);
        };
        // A read's messages come in runs of one topic: its name is read
        // (and checked for UTF-8) once per run, not per message.
        let mut topic: Option<(*const rdkafka::bindings::rd_kafka_topic_t, String)> = None;
        queue
            .read(max, wait, |message| {
                let name = match &topic {
                    Some((handle, name)) if *handle == message.topic_handle() => name.clone(),
                    _ => {
                        let name = message.topic();
                        topic = Some((message.topic_handle(), name.clone()));
                        name
                    }
                };
                batch.push(InputRecord {
                    key: message.key().map(<[u8]>::to_vec),
                    value: message.payload().map(<[u8]>::to_vec),
                    headers: super::headers::read_from(message.ptr()),
                    timestamp: message.timestamp(),
                    topic: name,
                    partition: message.partition(),
                    offset: message.offset(),
                });
            })
            .map_err(Error::client("reading input"))?;
        // Offsets grow within a partition: the last record of each run of
        // one partition's records is where it goes on.
        for run in batch.chunk_by(|a, b| a.partition == b.partition && a.topic == b.topic) {
            if let Some(last) = run.last() {
                advance(&mut self.positions, &last.topic, last.partition, last.offset + 1);
            }
        }
        Ok(batch)
    }

    /// A member's read: message by message through rdkafka's poll, which
    /// serves the group's changes as they come (a batch read of the
    /// consumer's queue would take a rebalance for a full unassignment).
    /// Only partitions taken up are read, each from its position on.
    fn poll_as_member(&mut self, batch: &mut Vec<InputRecord>, max: usize, wait: Duration) -> Result<()> {
        use rdkafka::Message as _;
        let changes = self.assignment_changes();
        let mut wait = wait;
        while batch.len() < max && self.assignment_changes() == changes {
            let message = match self.consumer.poll(wait) {
                None => break,
                Some(message) => message.map_err(Error::client("reading input"))?,
            };
            wait = Duration::ZERO;
            let (topic, partition, offset) = (message.topic(), message.partition(), message.offset());
            let Some(next) = self.positions.get_mut(topic).and_then(|p| p.get_mut(&partition)) else { continue };
            if offset < *next {
                continue;
            }
            *next = offset + 1;
            batch.push(InputRecord {
                key: message.key().map(<[u8]>::to_vec),
                value: message.payload().map(<[u8]>::to_vec),
                headers: super::headers::read_from(message.ptr()),
                timestamp: message.timestamp().to_millis(),
                topic: topic.to_owned(),
                partition,
                offset,
            });
        }
        Ok(())
    }

    /// The next offset to read of every partition read from so far (or
    /// restored from a checkpoint): what a checkpoint commits.
    pub fn offsets(&self) -> Vec<PartitionOffset> {
        self.positions
            .iter()
            .flat_map(|(topic, partitions)| {
                partitions.iter().map(|(&partition, &next_offset)| PartitionOffset {
                    topic: topic.clone(),
                    partition,
                    next_offset,
                })
            })
            .collect()
    }

    /// Records in each assigned partition not read yet: its high watermark
    /// minus the next offset to read (from its low watermark when nothing
    /// was read). One metadata request per partition; call it seldom.
    pub fn lag(&self, timeout: Duration) -> Result<Vec<PartitionLag>> {
        let assignment = self.consumer.assignment().map_err(Error::client("reading the assignment"))?;
        let mut lags = Vec::with_capacity(assignment.count());
        for element in assignment.elements() {
            let (topic, partition) = (element.topic(), element.partition());
            let taken_up = self.positions.get(topic).is_some_and(|p| p.contains_key(&partition));
            if self.is_member() && !taken_up {
                // A member's partition of a shard it holds only in part:
                // another member reads it.
                continue;
            }
            let (low, high) = self
                .consumer
                .fetch_watermarks(topic, partition, timeout)
                .map_err(Error::client(format!("reading the watermarks of {topic}/{partition}")))?;
            let next = self.positions.get(topic).and_then(|p| p.get(&partition)).copied().unwrap_or(low);
            lags.push(PartitionLag {
                topic: topic.to_owned(),
                partition,
                lag_records: u64::try_from(high - next).unwrap_or(0),
            });
        }
        Ok(lags)
    }

    /// Fails with [`Error::MissingTopic`] if any of `topics` does not exist
    /// (any more).
    pub fn check_topics(&self, topics: &[String], brokers: &str, timeout: Duration) -> Result<()> {
        super::clients::partitions_of(&self.consumer, topics, brokers, timeout).map(|_| ())
    }

    /// The consumer group metadata the sink's transaction commits offsets for.
    pub fn group_metadata(&self) -> Option<ConsumerGroupMetadata> {
        self.consumer.group_metadata()
    }
}

/// Notes that `next` is the next offset to read of `topic`/`partition`;
/// allocates only the first time a topic is seen.
fn advance(positions: &mut BTreeMap<String, BTreeMap<i32, i64>>, topic: &str, partition: i32, next: i64) {
    match positions.get_mut(topic) {
        Some(partitions) => {
            partitions.insert(partition, next);
        }
        None => {
            positions.insert(topic.to_string(), BTreeMap::from([(partition, next)]));
        }
    }
}
