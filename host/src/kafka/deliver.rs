//! Records sent outside any task's transaction (module chunks, the demo's
//! and the tests' input), each acknowledged by the broker before the send
//! counts as done: a delivery that failed is an error, never a record lost
//! in silence.

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::ToBytes;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;

use super::{Error, Result};

/// Notes the first failed delivery.
#[derive(Default)]
struct Deliveries {
    failed: Mutex<Option<KafkaError>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((error, _)) = result {
            let mut failed = self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            failed.get_or_insert_with(|| error.clone());
        }
    }
}

/// An idempotent producer whose sends [`finish`](Self::finish) confirms.
pub(crate) struct Delivering {
    producer: ThreadedProducer<Deliveries>,
    /// What the records are, for errors.
    what: String,
}

impl Delivering {
    /// A producer from `config`, idempotent (a retried send is written
    /// once); `what` names the records in errors.
    pub(crate) fn new(config: &ClientConfig, what: impl Into<String>) -> Result<Self> {
        let what = what.into();
        let producer = config
            .clone()
            .set("enable.idempotence", "true")
            .create_with_context(Deliveries::default())
            .map_err(Error::client(format!("creating the producer for {what}")))?;
        Ok(Delivering { producer, what })
    }

    /// Queues `record`, waiting while the producer's queue is full.
    pub(crate) fn send<K, P>(&self, mut record: BaseRecord<'_, K, P>) -> Result<()>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(Error::client(format!("sending {}", self.what))(e)),
            }
        }
    }

    /// Waits until every record sent is acknowledged; the first failed
    /// delivery, if any, is the error.
    pub(crate) fn finish(self, timeout: Duration) -> Result<()> {
        let what = &self.what;
        self.producer.flush(timeout).map_err(Error::client(format!("flushing {what}")))?;
        let failed = self.producer.context().failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        match failed {
            Some(error) => Err(Error::client(format!("delivering {what}"))(error)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_the_broker_never_acknowledged_is_an_error() {
        // Nothing listens on port 1: the record times out undelivered, and
        // the flush itself still succeeds (the queue is empty then).
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", "127.0.0.1:1").set("message.timeout.ms", "300");
        let producer = Delivering::new(&config, "a test record").expect("a producer");
        producer.send(BaseRecord::<[u8], [u8]>::to("nowhere").payload(&b"lost"[..])).expect("queued");
        match producer.finish(Duration::from_secs(10)) {
            Err(Error::Client { context, error }) => {
                assert_eq!(context, "delivering a test record");
                assert_eq!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::MessageTimedOut), "{error}");
            }
            other => panic!("an undelivered record passed: {other:?}"),
        }
    }
}
