//! Queuing many records into the transactional producer with one
//! librdkafka call.
//!
//! rdkafka's `BaseProducer::send` goes through `rd_kafka_producev`, which
//! for every record allocates the topic's name as a C string, looks the
//! topic up under the client's lock, reads the clock twice and takes the
//! topic's lock. For a task at 100 ms checkpoints (outputs plus changelog
//! records) that was a fifth of the process's CPU (`perf`, bench/peers).
//! `rd_kafka_produce_batch` does the lookup, the clock and the topic lock
//! once per call, through a topic handle held for the producer's life. It
//! takes no headers: a record with headers goes through `send`.
//!
//! The partitioner is the producer's own in both routes, so a key lands in
//! the same partition either way.

use std::ffi::{CString, c_int, c_void};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use rdkafka::bindings as rd;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::util::IntoOpaque;

use super::changelog::{SinkProducer, serve_or_nap};

/// librdkafka's `RD_KAFKA_PARTITION_UA`: the partitioner picks.
const UNASSIGNED: i32 = -1;

/// Records per `rd_kafka_produce_batch` call: the array is built per call,
/// so a delta of a million keys never becomes one array of a million.
const CHUNK: usize = 4096;

/// A librdkafka handle on one topic of the producer, kept while the
/// producer lives (the handle holds the producer).
pub(super) struct TopicHandle {
    producer: Arc<SinkProducer>,
    topic: NonNull<rd::rd_kafka_topic_t>,
    name: String,
}

// SAFETY: librdkafka's topic handles are reference counted and every call
// on them takes the locks it needs: they may be used and dropped from any
// thread.
#[allow(unsafe_code)]
unsafe impl Send for TopicHandle {}
// SAFETY: as above; `rd_kafka_produce_batch` may run concurrently on one
// handle.
#[allow(unsafe_code)]
unsafe impl Sync for TopicHandle {}

impl TopicHandle {
    /// A handle on `topic` of `producer`, with the producer's topic
    /// configuration (as `send` would use).
    #[allow(unsafe_code)]
    pub(super) fn new(producer: &Arc<SinkProducer>, topic: &str) -> Result<Self, KafkaError> {
        let name = CString::new(topic).map_err(KafkaError::from)?;
        // SAFETY: the client pointer is live while `producer` is, which the
        // handle keeps; a null configuration means the client's default
        // topic configuration; librdkafka copies the name.
        let handle =
            unsafe { rd::rd_kafka_topic_new(producer.client().native_ptr(), name.as_ptr(), std::ptr::null_mut()) };
        // It refuses only a name that is empty or too long.
        let topic_ptr = NonNull::new(handle).ok_or(KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTopic))?;
        Ok(TopicHandle { producer: Arc::clone(producer), topic: topic_ptr, name: topic.to_owned() })
    }

    /// The topic's name.
    pub(super) fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TopicHandle {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: the handle came from rd_kafka_topic_new and is released
        // once, before the producer it holds.
        unsafe { rd::rd_kafka_topic_destroy(self.topic.as_ptr()) }
    }
}

/// Records for one topic, queued [`CHUNK`] at a time and at [`finish`].
/// It borrows the keys and values it points to until then; librdkafka
/// copies them when it queues.
///
/// [`finish`]: Batch::finish
pub(super) struct Batch<'a> {
    topic: &'a TopicHandle,
    /// The partition of every record, or [`UNASSIGNED`].
    partition: i32,
    opaque: usize,
    messages: Vec<rd::rd_kafka_message_t>,
    borrows: PhantomData<&'a [u8]>,
}

impl<'a> Batch<'a> {
    /// An empty batch for `partition` of `topic` (`None`: where the
    /// partitioner puts each record's key), whose records' delivery reports
    /// carry `opaque`, with room for `expected` records (up to a chunk).
    ///
    /// One partition per batch, not one per record: librdkafka's batch call
    /// with a partition per record (`RD_KAFKA_MSG_F_PARTITION`) adds the
    /// placeholder partition to the transaction while it has no metadata
    /// for the topic yet, and the broker then fails the transaction (seen
    /// on a job's first checkpoint, whose changelog topic was new). With
    /// one partition for the call it waits for the metadata, as `send` does.
    pub(super) fn new(topic: &'a TopicHandle, partition: Option<i32>, opaque: usize, expected: usize) -> Self {
        Batch {
            topic,
            partition: partition.unwrap_or(UNASSIGNED),
            opaque,
            messages: Vec::with_capacity(expected.min(CHUNK)),
            borrows: PhantomData,
        }
    }

    /// The topic the batch is for.
    pub(super) fn topic(&self) -> &'a TopicHandle {
        self.topic
    }

    /// Adds a record; no `payload` is a tombstone. Queues the batch once it
    /// holds [`CHUNK`] records.
    pub(super) fn push(&mut self, key: Option<&'a [u8]>, payload: Option<&'a [u8]>) -> Result<(), KafkaError> {
        let (key, key_len) =
            key.map_or((std::ptr::null_mut(), 0), |k| (k.as_ptr().cast_mut().cast::<c_void>(), k.len()));
        let (payload, len) =
            payload.map_or((std::ptr::null_mut(), 0), |p| (p.as_ptr().cast_mut().cast::<c_void>(), p.len()));
        self.messages.push(rd::rd_kafka_message_t {
            err: RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
            rkt: std::ptr::null_mut(),
            partition: self.partition,
            payload,
            len,
            key,
            key_len,
            offset: 0,
            _private: self.opaque.into_ptr(),
        });
        if self.messages.len() >= CHUNK { self.queue() } else { Ok(()) }
    }

    /// Queues what the batch holds.
    pub(super) fn finish(mut self) -> Result<(), KafkaError> {
        self.queue()
    }

    /// Queues the records held, in order. While the producer's local queue
    /// is full, serves its delivery reports (which drain it; here too, as
    /// the task's thread may be waiting for this snapshot, not serving) and
    /// queues the rest: librdkafka fails every record from the first one that did not
    /// fit, so the rest is a suffix and order within a partition holds.
    #[allow(unsafe_code)]
    fn queue(&mut self) -> Result<(), KafkaError> {
        let mut start = 0;
        while start < self.messages.len() {
            let pending = &mut self.messages[start..];
            let count = c_int::try_from(pending.len()).unwrap_or(c_int::MAX);
            // SAFETY: `pending` is a live array of `count` messages whose
            // keys and payloads the batch borrows for 'a; with F_COPY
            // librdkafka copies them before returning and writes only each
            // message's `err`; the topic handle is live.
            let queued = unsafe {
                rd::rd_kafka_produce_batch(
                    self.topic.topic.as_ptr(),
                    self.partition,
                    rd::RD_KAFKA_MSG_F_COPY,
                    pending.as_mut_ptr(),
                    count,
                )
            };
            if usize::try_from(queued).is_ok_and(|q| q == pending.len()) {
                break;
            }
            let failed = |m: &rd::rd_kafka_message_t| m.err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR;
            let queue_full = RDKafkaRespErr::RD_KAFKA_RESP_ERR__QUEUE_FULL;
            if let Some(refused) = pending.iter().find(|m| failed(m) && m.err != queue_full) {
                return Err(KafkaError::MessageProduction(refused.err.into()));
            }
            let Some(first_full) = pending.iter().position(failed) else { break };
            start += first_full;
            serve_or_nap(&self.topic.producer);
        }
        self.messages.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::BaseRecord;
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    use super::*;
    use crate::kafka::changelog::{OUTPUT, SinkContext};

    const PARTITIONS: i32 = 4;

    fn producer(
        cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
        queue: usize,
    ) -> Arc<SinkProducer> {
        let producer: SinkProducer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("queue.buffering.max.messages", queue.to_string())
            .set("linger.ms", "0")
            .create_with_context(SinkContext::default())
            .expect("producer");
        Arc::new(producer)
    }

    /// A record read back: partition, key, value.
    type ReadBack = (i32, Option<Vec<u8>>, Option<Vec<u8>>);

    /// Every record of `topic`, in each partition's order.
    fn read_all(
        cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
        topic: &str,
        expected: usize,
    ) -> Vec<ReadBack> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("group.id", "batch-test")
            .create()
            .expect("consumer");
        let mut partitions = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            partitions.add_partition_offset(topic, p, Offset::Beginning).expect("offset");
        }
        consumer.assign(&partitions).expect("assign");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut records = Vec::new();
        while records.len() < expected && Instant::now() < deadline {
            if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                let m = message.expect("a record");
                records.push((m.partition(), m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec)));
            }
        }
        records
    }

    /// A batch many times the producer's local queue is queued whole: the
    /// records refused as the queue filled are queued again after the
    /// deliveries drained it, none lost, none doubled, in order.
    #[test]
    fn a_batch_larger_than_the_local_queue_arrives_whole_and_in_order() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("t", PARTITIONS, 1).expect("topic");
        let producer = producer(&cluster, 100);
        let topic = TopicHandle::new(&producer, "t").expect("handle");
        let values: Vec<Vec<u8>> = (0..(CHUNK + 500)).map(|i| i.to_string().into_bytes()).collect();
        let mut batch = Batch::new(&topic, Some(2), OUTPUT, values.len());
        for value in &values {
            batch.push(Some(b"k"), Some(value)).expect("push");
        }
        // A tombstone: no value at all, not an empty one.
        batch.push(Some(b"gone"), None).expect("push");
        batch.finish().expect("queued");
        producer.flush(Duration::from_secs(30)).expect("delivered");

        let read = read_all(&cluster, "t", values.len() + 1);
        let mut expected: Vec<_> = values.iter().map(|v| (2, Some(b"k".to_vec()), Some(v.clone()))).collect();
        expected.push((2, Some(b"gone".to_vec()), None));
        assert_eq!(read.len(), expected.len(), "records read back");
        assert!(read == expected, "the records came back reordered, changed or on the wrong partition");
    }

    /// With no partition given, a key goes where rdkafka's `send` (which
    /// the batch replaces for outputs) puts it.
    #[test]
    fn the_partitioner_places_a_key_as_send_does() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        for topic in ["sent", "batched"] {
            cluster.create_topic(topic, PARTITIONS, 1).expect("topic");
        }
        let producer = producer(&cluster, 100_000);
        let keys: Vec<Vec<u8>> = (0..200).map(|i| format!("user-{i}").into_bytes()).collect();
        for key in &keys {
            let record: BaseRecord<'_, [u8], [u8], usize> =
                BaseRecord::with_opaque_to("sent", OUTPUT).key(key.as_slice()).payload(b"v");
            producer.send(record).map_err(|(e, _)| e).expect("send");
        }
        let topic = TopicHandle::new(&producer, "batched").expect("handle");
        let mut batch = Batch::new(&topic, None, OUTPUT, keys.len());
        for key in &keys {
            batch.push(Some(key), Some(b"v")).expect("push");
        }
        batch.finish().expect("queued");
        producer.flush(Duration::from_secs(30)).expect("delivered");

        let placed = |topic| -> BTreeMap<Vec<u8>, i32> {
            read_all(&cluster, topic, keys.len()).into_iter().filter_map(|(p, k, _)| Some((k?, p))).collect()
        };
        let (sent, batched) = (placed("sent"), placed("batched"));
        assert_eq!(sent.len(), keys.len(), "every key sent was read back");
        assert!(sent.values().collect::<std::collections::BTreeSet<_>>().len() > 1, "keys spread over partitions");
        assert_eq!(batched, sent, "a key landed on another partition than `send` puts it");
    }
}
