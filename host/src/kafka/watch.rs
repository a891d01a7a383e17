//! Watching the input of sleeping tasks, for a whole host.
//!
//! A task that had no input for its job's `input.sleep-after` lets go of its
//! consumer, its transactional producer, its guest instance and its snapshot
//! thread, and sleeps until a record is readable where it stopped reading
//! (see `crate::job`). One [`InputWatch`] per host watches for all of them:
//! a consumer that assigns itself each watched partition at the lowest
//! position watched there and fetches `read_committed`, so transaction
//! markers and aborted records wake nobody. A record at offset `o` rings
//! every watcher of its partition at or below `o`, and those watchers are
//! done; a partition nobody watches any more is unassigned. Records are
//! fetched only to be seen (the woken task reads them itself), so fetches
//! are kept small.
//!
//! An idle host's watch costs one consumer's threads and its fetch
//! sessions, whatever the number of sleeping tasks; a task awake costs a
//! consumer, a producer, a snapshot thread and its own thread each.
//!
//! If the watch's thread ends (it panics, or its consumer fails), it rings
//! every alarm and refuses new watches: the tasks stay awake instead.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::{Error, Result};
use crate::checkpoint::PartitionOffset;

/// What a sleeping task waits on: rung by the watch when its input has a
/// record, by a stop of its job, or by its release. A ring is kept until
/// [`clear`](Self::clear), so a ring before the wait is not lost.
#[derive(Debug, Default)]
pub struct Alarm {
    rung: Mutex<bool>,
    bell: Condvar,
}

impl Alarm {
    /// Wakes whoever waits, or the next wait.
    pub fn ring(&self) {
        *lock(&self.rung) = true;
        self.bell.notify_all();
    }

    /// Forgets earlier rings.
    pub fn clear(&self) {
        *lock(&self.rung) = false;
    }

    /// Waits until rung, or until `deadline` if there is one; whether it
    /// was rung.
    pub fn wait_until(&self, deadline: Option<Instant>) -> bool {
        let mut rung = lock(&self.rung);
        while !*rung {
            rung = match deadline {
                None => self.bell.wait(rung).unwrap_or_else(|poisoned| poisoned.into_inner()),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    match self.bell.wait_timeout(rung, left) {
                        Ok((guard, _)) => guard,
                        Err(poisoned) => poisoned.into_inner().0,
                    }
                }
            };
        }
        true
    }
}

/// A mutex whose holder panicked still guards consistent data here: every
/// critical section below leaves it whole before anything can panic.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A topic and partition.
type Partition = (String, i32);

/// The host's watch over sleeping tasks' input.
pub struct InputWatch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for InputWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputWatch").finish_non_exhaustive()
    }
}

struct Shared {
    watched: Mutex<Watched>,
    /// Set to end the thread.
    stop: AtomicBool,
    /// Set once the thread ended: nothing is watched any more.
    ended: AtomicBool,
}

#[derive(Default)]
struct Watched {
    next_id: u64,
    /// The watchers of each partition.
    watchers: HashMap<Partition, Vec<Watcher>>,
    /// Partitions whose watchers changed since the thread last looked.
    changed: HashSet<Partition>,
}

struct Watcher {
    id: u64,
    /// The offset from which a record wakes it.
    from: i64,
    alarm: Arc<Alarm>,
}

/// One task's watch; dropping it stops watching.
pub struct Watch {
    id: u64,
    partitions: Vec<Partition>,
    shared: Arc<Shared>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut watched = lock(&self.shared.watched);
        for partition in &self.partitions {
            if let Some(watchers) = watched.watchers.get_mut(partition) {
                watchers.retain(|w| w.id != self.id);
                watched.changed.insert(partition.clone());
            }
        }
    }
}

/// How long the thread waits for a record before it applies new watches.
const POLL: Duration = Duration::from_millis(200);

impl InputWatch {
    /// Starts the watch with the host's client configuration.
    pub fn start(config: &ClientConfig) -> Result<InputWatch> {
        let mut config = config.clone();
        config
            // librdkafka assigns only in a consumer with a group; this one
            // never joins it nor commits.
            .set("group.id", "sluice.host.input-watch")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "false")
            // A position beyond the end (the topic was made anew) wakes its
            // task, whose recovery reports it.
            .set("auto.offset.reset", "earliest")
            // One record per partition is all it needs to see.
            .set("max.partition.fetch.bytes", "1024")
            .set("fetch.max.bytes", "1048576")
            .set("queued.min.messages", "1")
            // Not the default 1 s: a partition over those bounds would
            // hold back the next fetch, and so another partition's wake.
            .set("fetch.queue.backoff.ms", "20")
            .set("queued.max.messages.kbytes", "1024");
        let consumer: BaseConsumer = config.create().map_err(Error::client("creating the input watch's consumer"))?;
        let shared = Arc::new(Shared {
            watched: Mutex::new(Watched::default()),
            stop: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("sluice-input-watch".into())
            .spawn(move || {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&consumer, &thread_shared)));
                match outcome {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!("the input watch ended; sleeping tasks wake and stay awake: {e}"),
                    Err(_) => tracing::error!("the input watch panicked; sleeping tasks wake and stay awake"),
                }
                thread_shared.ended.store(true, Ordering::SeqCst);
                let mut watched = lock(&thread_shared.watched);
                for watcher in watched.watchers.drain().flat_map(|(_, w)| w) {
                    watcher.alarm.ring();
                }
            })
            .map_err(|e| Error::Other(format!("starting the input watch's thread: {e}")))?;
        Ok(InputWatch { shared, thread: Some(thread) })
    }

    /// Rings `alarm` once any of `positions`' partitions has a record at or
    /// after its offset, until the returned [`Watch`] is dropped.
    pub fn watch(&self, positions: &[PartitionOffset], alarm: &Arc<Alarm>) -> Result<Watch> {
        let mut watched = lock(&self.shared.watched);
        // Under the lock: the thread's last act is to ring every watcher it
        // finds there, so a watch added before that is rung, and one after
        // it is refused here.
        if self.shared.ended.load(Ordering::SeqCst) {
            return Err(Error::Other("the host's input watch has ended".into()));
        }
        watched.next_id += 1;
        let id = watched.next_id;
        let mut partitions = Vec::with_capacity(positions.len());
        for position in positions {
            let partition = (position.topic.clone(), position.partition);
            let watcher = Watcher { id, from: position.next_offset, alarm: Arc::clone(alarm) };
            watched.watchers.entry(partition.clone()).or_default().push(watcher);
            watched.changed.insert(partition.clone());
            partitions.push(partition);
        }
        Ok(Watch { id, partitions, shared: Arc::clone(&self.shared) })
    }

    /// Whether its thread ended: it watches nothing any more.
    pub fn has_ended(&self) -> bool {
        self.shared.ended.load(Ordering::SeqCst)
    }
}

impl Drop for InputWatch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The watch's thread: assigns what is watched, rings the alarms of
/// the records it sees.
fn run(consumer: &BaseConsumer, shared: &Shared) -> Result<()> {
    // Where the consumer reads each assigned partition from next.
    let mut reading: HashMap<Partition, i64> = HashMap::new();
    while !shared.stop.load(Ordering::SeqCst) {
        reassign(consumer, shared, &mut reading)?;
        match consumer.poll(POLL) {
            None => {}
            Some(Ok(record)) => {
                let partition = (record.topic().to_owned(), record.partition());
                let offset = record.offset();
                drop(record);
                // A record fetched before its partition was unassigned
                // does not assign it again.
                let mut went_back = false;
                if let Some(next) = reading.get_mut(&partition) {
                    // Below where it was placed: the consumer's offset
                    // reset, the partition was made anew. Its sleeping
                    // tasks wake and meet that as they would awake.
                    went_back = offset < *next;
                    *next = offset + 1;
                }
                let mut watched = lock(&shared.watched);
                if let Some(watchers) = watched.watchers.get_mut(&partition) {
                    watchers.retain(|w| {
                        let due = went_back || w.from <= offset;
                        if due {
                            tracing::debug!(topic = %partition.0, partition = partition.1, offset, "input for a sleeping task");
                            w.alarm.ring();
                        }
                        !due
                    });
                }
                // Unassigned if nobody watches it any more.
                watched.changed.insert(partition);
            }
            Some(Err(e)) => failed_read(consumer, shared, e),
        }
    }
    Ok(())
}

/// Brings the consumer's assignment to what is watched: each partition
/// from its lowest watched offset, none that nobody watches.
fn reassign(consumer: &BaseConsumer, shared: &Shared, reading: &mut HashMap<Partition, i64>) -> Result<()> {
    let wanted: Vec<(Partition, Option<i64>)> = {
        let mut watched = lock(&shared.watched);
        let Watched { watchers, changed, .. } = &mut *watched;
        let wanted = changed
            .drain()
            .map(|p| {
                let from = watchers.get(&p).and_then(|w| w.iter().map(|w| w.from).min());
                (p, from)
            })
            .collect();
        watchers.retain(|_, w| !w.is_empty());
        wanted
    };
    let (mut unwatch, mut watch) = (TopicPartitionList::new(), TopicPartitionList::new());
    for ((topic, partition), from) in wanted {
        let key = (topic, partition);
        match (reading.get(&key).copied(), from) {
            (None, None) => {}
            (Some(_), None) => {
                unwatch.add_partition(&key.0, key.1);
                reading.remove(&key);
            }
            (None, Some(from)) => {
                watch
                    .add_partition_offset(&key.0, key.1, Offset::Offset(from))
                    .map_err(Error::client("watching a partition"))?;
                reading.insert(key, from);
            }
            // A watcher below where the consumer reads: read again from it.
            (Some(at), Some(from)) if from < at => {
                unwatch.add_partition(&key.0, key.1);
                watch
                    .add_partition_offset(&key.0, key.1, Offset::Offset(from))
                    .map_err(Error::client("watching a partition"))?;
                reading.insert(key, from);
            }
            (Some(_), Some(_)) => {}
        }
    }
    if unwatch.count() > 0 {
        consumer.incremental_unassign(&unwatch).map_err(Error::client("unwatching partitions"))?;
    }
    if watch.count() > 0 {
        consumer.incremental_assign(&watch).map_err(Error::client("watching partitions"))?;
    }
    Ok(())
}

/// A read failed. librdkafka retries what can be retried; a topic that
/// is gone (by its metadata, as a task's recovery would find it) wakes its
/// watchers, whose tasks then fail as they would awake. Any other error is
/// only logged.
fn failed_read(consumer: &BaseConsumer, shared: &Shared, error: KafkaError) {
    let unauthorized = error.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed);
    if !super::is_unknown_topic(&error) && !unauthorized {
        tracing::debug!("the input watch's read: {error}");
        return;
    }
    let topics: HashSet<String> = lock(&shared.watched).watchers.keys().map(|(t, _)| t.clone()).collect();
    let missing: HashSet<String> = topics
        .into_iter()
        .filter(|topic| {
            let asked =
                super::clients::partitions_of(consumer, std::slice::from_ref(topic), "", Duration::from_secs(5));
            matches!(asked, Err(Error::MissingTopic { .. }))
        })
        .collect();
    let mut watched = lock(&shared.watched);
    let Watched { watchers, changed, .. } = &mut *watched;
    for (partition, watchers) in watchers.iter_mut().filter(|(p, _)| missing.contains(&p.0)) {
        tracing::info!(topic = %partition.0, "a watched topic is gone; its sleeping tasks wake");
        for watcher in watchers.drain(..) {
            watcher.alarm.ring();
        }
        changed.insert(partition.clone());
    }
}
