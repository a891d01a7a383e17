//! Kafka chores for the demo and the end-to-end tests: creating topics,
//! producing input, reading committed output. Not used by jobs.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::BaseRecord;
use rdkafka::types::RDKafkaErrorCode;

use rdkafka::ClientConfig;

use super::{Error, Result, client_config};

/// Creates each `(topic, partitions)` that does not exist yet.
pub fn create_topics(brokers: &str, topics: &[(&str, i32)]) -> Result<()> {
    let new: Vec<NewTopic<'_>> =
        topics.iter().map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1))).collect();
    admin(brokers, "creating topic", RDKafkaErrorCode::TopicAlreadyExists, |admin, options| {
        admin.create_topics(&new, options)
    })?;
    wait_for_metadata(brokers, topics)
}

/// Sets `topic`'s configuration `key` to `value` (the others keep theirs).
pub fn set_topic_config(brokers: &str, topic: &str, key: &str, value: &str) -> Result<()> {
    use rdkafka::admin::{AlterConfig, ResourceSpecifier};
    let alter = [AlterConfig::new(ResourceSpecifier::Topic(topic)).set(key, value)];
    admin(brokers, "configuring topic", RDKafkaErrorCode::NoError, |admin, options| {
        let altered = admin.alter_configs(&alter, options);
        async move {
            Ok(altered
                .await?
                .into_iter()
                .map(|r| r.map(|_| topic.to_owned()).map_err(|(_, code)| (topic.to_owned(), code)))
                .collect())
        }
    })
}

/// Waits until a broker's metadata shows every topic with its partitions:
/// the controller answers CreateTopics before the brokers have applied it
/// (KRaft applies the metadata log asynchronously), and a client that asks
/// right away may be told the topic does not exist.
fn wait_for_metadata(brokers: &str, topics: &[(&str, i32)]) -> Result<()> {
    let consumer: BaseConsumer =
        client_config(brokers, &Default::default()).create().map_err(Error::client("creating a metadata client"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    for (topic, partitions) in topics {
        loop {
            let ready = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)).is_ok_and(|metadata| {
                metadata
                    .topics()
                    .iter()
                    .any(|t| t.name() == *topic && t.error().is_none() && t.partitions().len() >= *partitions as usize)
            });
            if ready {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::Other(format!("topic `{topic}` was created but its metadata never showed")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// Deletes consumer group `group` and its committed offsets; a group that
/// does not exist is not an error.
pub fn delete_group(brokers: &str, group: &str) -> Result<()> {
    admin(brokers, "deleting group", RDKafkaErrorCode::GroupIdNotFound, |admin, options| {
        admin.delete_groups(&[group], options)
    })
}

/// Deletes `topic`; a topic that does not exist is not an error.
pub fn delete_topic(brokers: &str, topic: &str) -> Result<()> {
    admin(brokers, "deleting topic", RDKafkaErrorCode::UnknownTopicOrPartition, |admin, options| {
        admin.delete_topics(&[topic], options)
    })
}

/// Runs one admin request on `brokers` and checks each item's result;
/// `done_already` is the error code that means the item is as wanted.
fn admin<F, Fut>(brokers: &str, what: &str, done_already: RDKafkaErrorCode, request: F) -> Result<()>
where
    F: FnOnce(&AdminClient<DefaultClientContext>, &AdminOptions) -> Fut,
    Fut: std::future::Future<Output = super::clients::AdminResults>,
{
    admin_with(&client_config(brokers, &Default::default()), what, done_already, request)
}

/// Runs one admin request with `config`'s client; `done_already` is the
/// error code that means the request's effect is already there.
pub(crate) fn admin_with<F, Fut>(
    config: &ClientConfig,
    what: &str,
    done_already: RDKafkaErrorCode,
    request: F,
) -> Result<()>
where
    F: FnOnce(&AdminClient<DefaultClientContext>, &AdminOptions) -> Fut,
    Fut: std::future::Future<Output = super::clients::AdminResults>,
{
    let admin: AdminClient<DefaultClientContext> =
        config.create().map_err(Error::client("creating the admin client"))?;
    super::clients::run_admin(&admin, what, done_already, request)
}

/// Produces `(key, value)` records to `topic` (idempotent, acks=all) and
/// waits until all are acknowledged.
pub fn produce(brokers: &str, topic: &str, records: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) -> Result<usize> {
    produce_to(brokers, topic, None, records)
}

/// [`produce`] into one partition, or where the key hashes to (`None`).
pub fn produce_to(
    brokers: &str,
    topic: &str,
    partition: Option<i32>,
    records: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
) -> Result<usize> {
    produce_timed(brokers, topic, partition, records.into_iter().map(|(key, value)| (key, value, None)))
}

/// [`produce_to`], each record with its own timestamp (ms since the Unix
/// epoch; `None`: the producer's clock).
pub fn produce_timed(
    brokers: &str,
    topic: &str,
    partition: Option<i32>,
    records: impl IntoIterator<Item = (Vec<u8>, Vec<u8>, Option<i64>)>,
) -> Result<usize> {
    let mut config = client_config(brokers, &Default::default());
    config.set("linger.ms", "20");
    // Records as large as a topic may be made to take (the tests' largest
    // is a few MB); the broker still holds each topic to its own limit.
    config.set("message.max.bytes", "10000000");
    let producer = super::Delivering::new(&config, format!("records to `{topic}`"))?;
    let mut count = 0;
    for (key, value, timestamp) in records {
        let mut record = BaseRecord::<[u8], [u8]>::to(topic).key(&key).payload(&value);
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        if let Some(timestamp) = timestamp {
            record = record.timestamp(timestamp);
        }
        producer.send(record)?;
        count += 1;
    }
    producer.finish(Duration::from_secs(60))?;
    Ok(count)
}

/// One record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key.
    pub key: Option<Vec<u8>>,
    /// Value.
    pub value: Option<Vec<u8>>,
    /// Headers, key and value.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Reads `topic` from the beginning with the given isolation level until
/// `until` says it has enough or `timeout` passes; returns what it read, in
/// per-partition order.
pub fn read_all(
    brokers: &str,
    topic: &str,
    read_committed: bool,
    timeout: Duration,
    mut until: impl FnMut(&[ReadRecord]) -> bool,
) -> Result<Vec<ReadRecord>> {
    let consumer: BaseConsumer = client_config(brokers, &Default::default())
        .set("group.id", format!("sluice-reader-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", if read_committed { "read_committed" } else { "read_uncommitted" })
        .create()
        .map_err(Error::client("creating a reader"))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(Error::client(format!("reading metadata of `{topic}`")))?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    for t in metadata.topics() {
        for p in t.partitions() {
            tpl.add_partition_offset(topic, p.id(), rdkafka::Offset::Beginning)
                .map_err(Error::client("building an assignment"))?;
        }
    }
    consumer.assign(&tpl).map_err(Error::client("assigning the reader"))?;
    let started = Instant::now();
    let mut out = Vec::new();
    while started.elapsed() < timeout && !until(&out) {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => return Err(Error::client(format!("reading `{topic}`"))(e)),
            Some(Ok(m)) => out.push(ReadRecord {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers: super::headers::read(&m).into_iter().map(|h| (h.key, h.value)).collect(),
            }),
        }
    }
    Ok(out)
}
