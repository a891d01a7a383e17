//! Reading many consumed messages with one librdkafka call.
//!
//! rdkafka's `BaseConsumer::poll` hands out one message per call, and every
//! call reads the clock up to three times (its own timeout loop and
//! librdkafka's `max.poll.interval.ms` bookkeeping) and takes the queue's
//! lock: at a few hundred thousand records a second, a tenth of a task
//! thread's time went there. [`ConsumerQueue::read`] serves up to a batch of
//! messages from the consumer's queue in one `rd_kafka_consume_batch_queue`.
//!
//! What else sits in the queue is served the way librdkafka serves it for a
//! batch read: log lines go to the client's log callback; a client-level
//! error (a broker unreachable) is logged and librdkafka keeps retrying, as
//! it does for the producer, rather than failing the read; a message-level
//! error (a partition's fetch failing) fails the read as before. Only a
//! source that assigns its partitions itself reads so: a rebalance in the
//! queue would be taken for a full unassignment (librdkafka's fallback when
//! no rebalance callback is set), so a member of a group reads through
//! rdkafka's poll instead.

use std::ffi::{CStr, c_int};
use std::ptr::NonNull;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;

/// A reference to a consumer's queue (see the module docs). Must be
/// dropped before the consumer: declare it before the consumer's field.
pub(super) struct ConsumerQueue {
    queue: NonNull<rd::rd_kafka_queue_t>,
    /// The messages of the read in progress, kept for the next read's
    /// allocation; empty between reads.
    taken: Vec<*mut rd::rd_kafka_message_t>,
}

// SAFETY: librdkafka's queues may be used from any thread; the message
// pointers in `taken` only live within one `read`, on the calling thread.
#[allow(unsafe_code)]
unsafe impl Send for ConsumerQueue {}

/// One consumed message, valid for the duration of the callback.
pub(super) struct Fetched(NonNull<rd::rd_kafka_message_t>);

impl ConsumerQueue {
    /// The queue `consumer` reads its assigned partitions through.
    #[allow(unsafe_code)]
    pub(super) fn of<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> Option<ConsumerQueue> {
        // SAFETY: the client pointer is live while `consumer` is; the
        // returned queue holds a reference of its own, released in Drop.
        let queue = unsafe { rd::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        Some(ConsumerQueue { queue: NonNull::new(queue)?, taken: Vec::new() })
    }

    /// Waits up to `timeout` for the first message, then takes what else is
    /// there, up to `max` in all, and calls `each` with every one in order.
    /// A message that carries an error ends the read with it.
    #[allow(unsafe_code)]
    pub(super) fn read(
        &mut self,
        max: usize,
        timeout: Duration,
        mut each: impl FnMut(&Fetched),
    ) -> Result<(), KafkaError> {
        let timeout_ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        self.taken.clear();
        self.taken.resize(max, std::ptr::null_mut());
        // SAFETY: `taken` has room for `max` pointers; librdkafka writes the
        // messages it returns into its first entries.
        let n =
            unsafe { rd::rd_kafka_consume_batch_queue(self.queue.as_ptr(), timeout_ms, self.taken.as_mut_ptr(), max) };
        let Ok(n) = usize::try_from(n) else {
            self.taken.clear();
            // SAFETY: reads this thread's last librdkafka error.
            return Err(KafkaError::MessageConsumption(unsafe { rd::rd_kafka_last_error() }.into()));
        };
        self.taken.truncate(n);
        let taken = Taken(&mut self.taken);
        for &message in taken.0.iter() {
            let Some(message) = NonNull::new(message) else { continue };
            // SAFETY: a message librdkafka returned, not yet destroyed.
            let err = unsafe { message.as_ref() }.err;
            if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                return Err(KafkaError::MessageConsumption(err.into()));
            }
            each(&Fetched(message));
        }
        Ok(())
    }
}

/// The messages of one read, destroyed when it ends however it ends.
struct Taken<'a>(&'a mut Vec<*mut rd::rd_kafka_message_t>);

impl Drop for Taken<'_> {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        for message in self.0.drain(..) {
            if !message.is_null() {
                // SAFETY: each was returned by the read and is destroyed
                // once, here; no `Fetched` outlives the read's callback.
                unsafe { rd::rd_kafka_message_destroy(message) };
            }
        }
    }
}

impl Drop for ConsumerQueue {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: releases the reference taken in `of`, once.
        unsafe { rd::rd_kafka_queue_destroy(self.queue.as_ptr()) };
    }
}

#[allow(unsafe_code)]
impl Fetched {
    fn message(&self) -> &rd::rd_kafka_message_t {
        // SAFETY: live for the callback (see `ConsumerQueue::read`).
        unsafe { self.0.as_ref() }
    }

    /// The raw message, for reading its headers.
    pub(super) fn ptr(&self) -> *const rd::rd_kafka_message_t {
        self.0.as_ptr()
    }

    /// The key, if it has one.
    pub(super) fn key(&self) -> Option<&[u8]> {
        let m = self.message();
        // SAFETY: librdkafka's key buffer of `key_len` bytes, owned by the message.
        (!m.key.is_null()).then(|| unsafe { std::slice::from_raw_parts(m.key.cast::<u8>(), m.key_len) })
    }

    /// The value; `None` for a tombstone.
    pub(super) fn payload(&self) -> Option<&[u8]> {
        let m = self.message();
        // SAFETY: librdkafka's payload buffer of `len` bytes, owned by the message.
        (!m.payload.is_null()).then(|| unsafe { std::slice::from_raw_parts(m.payload.cast::<u8>(), m.len) })
    }

    /// The handle of the message's topic: the same for every message of a
    /// topic while the client lives, so it tells whether two messages share
    /// one without reading names.
    pub(super) fn topic_handle(&self) -> *const rd::rd_kafka_topic_t {
        self.message().rkt
    }

    /// The topic's name (lossy if it were not UTF-8, which Kafka forbids).
    pub(super) fn topic(&self) -> String {
        let rkt = self.message().rkt;
        if rkt.is_null() {
            return String::new();
        }
        // SAFETY: a consumed message holds its topic handle, whose name is
        // a NUL-terminated string owned by it.
        let name = unsafe { rd::rd_kafka_topic_name(rkt) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: as above.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    }

    /// The partition.
    pub(super) fn partition(&self) -> i32 {
        self.message().partition
    }

    /// The offset.
    pub(super) fn offset(&self) -> i64 {
        self.message().offset
    }

    /// The timestamp in ms since the Unix epoch (create or log-append
    /// time), if it has one; as rdkafka's `Timestamp::to_millis`.
    pub(super) fn timestamp(&self) -> Option<i64> {
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: a live message; librdkafka writes the type into `kind`.
        let at = unsafe { rd::rd_kafka_message_timestamp(self.0.as_ptr(), &mut kind) };
        (at != -1 && kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE).then_some(at)
    }
}
