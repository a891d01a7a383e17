//! What each member's jobs are doing, for the API on every member: a member
//! publishes the status of each job it runs (its figures, tasks, shards and
//! the tail of its log) to the cluster's compacted status topic, keyed
//! `<tenant>/<job>/<host>`, and withdraws it (a tombstone) when the job
//! leaves; every member follows the topic. A status carries the time it
//! was published, and one older than [`FRESH_FOR`] is not shown: a member
//! killed with -9 withdraws nothing.
//!
//! Publishing costs a small message per running job when its figures
//! change (at most once per supervisor pass, every half second), and one every
//! [`REFRESH_EVERY`] when they do not: an idle job's cost does not grow with
//! the number of members, since only the member that runs it publishes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::{Identity, lock};
use crate::kafka::Error as KafkaErr;

/// How often it publishes figures that did not change.
pub const REFRESH_EVERY: Duration = Duration::from_secs(10);
/// How long a published status is shown without a newer one.
pub const FRESH_FOR: Duration = Duration::from_secs(30);

/// One member's status of one job, as published.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Published {
    /// The member.
    pub host: String,
    /// Milliseconds since the Unix epoch.
    pub published_ms: u64,
    /// The job's status on that member (the service's `JobStatus`).
    pub status: serde_json::Value,
    /// The newest lines of the job's log there (the service's `LogLine`s).
    pub log_tail: serde_json::Value,
}

/// The cluster's status topic, as this member sees and writes it.
pub struct Board {
    topic: String,
    host: String,
    producer: ThreadedProducer<DefaultProducerContext>,
    /// `<tenant>/<job>` -> host -> its latest status.
    seen: Mutex<HashMap<String, HashMap<String, Published>>>,
    /// What this member published last per job: the status, and when.
    mine: Mutex<HashMap<String, (serde_json::Value, u64)>>,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Board {
    /// Follows the status topic of `identity`'s cluster from its start.
    pub fn start(identity: &Identity, config: &ClientConfig) -> Result<Arc<Board>, KafkaErr> {
        let topic = super::Topics::of(&identity.cluster).status;
        let producer: ThreadedProducer<DefaultProducerContext> =
            config.clone().set("linger.ms", "20").create().map_err(KafkaErr::client("creating the status producer"))?;
        let consumer: BaseConsumer = config
            .clone()
            .set("group.id", format!("{}.status.{}", super::prefix(&identity.cluster), identity.host))
            .set("enable.auto.commit", "false")
            .create()
            .map_err(KafkaErr::client("creating the status reader"))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Beginning)
            .map_err(KafkaErr::client("assigning the status topic"))?;
        consumer.assign(&tpl).map_err(KafkaErr::client("assigning the status topic"))?;
        let board = Arc::new(Board {
            topic,
            host: identity.host.clone(),
            producer,
            seen: Mutex::default(),
            mine: Mutex::default(),
            stop: AtomicBool::new(false),
            thread: Mutex::default(),
        });
        let follower = Arc::clone(&board);
        let thread = std::thread::Builder::new()
            .name("sluice-status".into())
            .spawn(move || follower.follow(consumer))
            .map_err(|e| KafkaErr::Other(format!("starting the status thread: {e}")))?;
        *lock(&board.thread) = Some(thread);
        Ok(board)
    }

    fn follow(&self, consumer: BaseConsumer) {
        while !self.stop.load(Ordering::Relaxed) {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(message)) => {
                    let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
                    let Some((job, host)) = key.rsplit_once('/') else { continue };
                    let mut seen = lock(&self.seen);
                    match message.payload().map(serde_json::from_slice::<Published>) {
                        Some(Ok(published)) => {
                            seen.entry(job.to_owned()).or_default().insert(host.to_owned(), published);
                        }
                        Some(Err(e)) => tracing::warn!("a status of {key} that does not parse: {e}"),
                        None => {
                            if let Some(hosts) = seen.get_mut(job) {
                                hosts.remove(host);
                                if hosts.is_empty() {
                                    seen.remove(job);
                                }
                            }
                        }
                    }
                }
                Some(Err(e)) => tracing::warn!("reading the cluster's status topic: {e}"),
                None => {}
            }
        }
    }

    /// Publishes this member's status of `job` (`<tenant>/<job>`) with the
    /// job's log tail (built only then) if the status changed, or if the
    /// last one is [`REFRESH_EVERY`] old.
    pub fn publish(
        &self,
        job: &str,
        status: serde_json::Value,
        log_tail: impl FnOnce() -> serde_json::Value,
        now_ms: u64,
    ) {
        let mut mine = lock(&self.mine);
        let fresh = |at: u64| now_ms.saturating_sub(at) < REFRESH_EVERY.as_millis() as u64;
        // Uptime and checkpoint ages change every second; they do not make a
        // status new on their own.
        let figures = without_clocks(&status);
        if let Some((last, at)) = mine.get(job)
            && *last == figures
            && fresh(*at)
        {
            return;
        }
        let published = Published { host: self.host.clone(), published_ms: now_ms, status, log_tail: log_tail() };
        let Ok(payload) = serde_json::to_vec(&published) else { return };
        let key = format!("{job}/{}", self.host);
        if let Err((e, _)) = self.producer.send(BaseRecord::to(&self.topic).key(&key).payload(&payload)) {
            tracing::warn!("publishing the status of {job}: {e}");
            return;
        }
        mine.insert(job.to_owned(), (figures, now_ms));
    }

    /// Withdraws this member's status of every job not in `running`.
    pub fn withdraw_others(&self, running: &std::collections::HashSet<String>) {
        let mut mine = lock(&self.mine);
        let gone: Vec<String> = mine.keys().filter(|job| !running.contains(*job)).cloned().collect();
        for job in gone {
            let key = format!("{job}/{}", self.host);
            match self.producer.send(BaseRecord::<String, [u8]>::to(&self.topic).key(&key)) {
                Ok(()) => {
                    mine.remove(&job);
                }
                Err((e, _)) => tracing::warn!("withdrawing the status of {job}: {e}"),
            }
        }
    }

    /// Other members' fresh statuses of `job`, newest first.
    pub fn others(&self, job: &str, now_ms: u64) -> Vec<Published> {
        let seen = lock(&self.seen);
        seen.get(job).map(|hosts| self.fresh_others(hosts, now_ms).into_iter().cloned().collect()).unwrap_or_default()
    }

    /// Calls `visit` with every other member's fresh status of every job
    /// (`<tenant>/<job>`), newest first per job, under the board's lock.
    pub fn each_other(&self, now_ms: u64, mut visit: impl FnMut(&str, &Published)) {
        let seen = lock(&self.seen);
        for (job, hosts) in seen.iter() {
            for published in self.fresh_others(hosts, now_ms) {
                visit(job, published);
            }
        }
    }

    /// Of one job's statuses by member, the other members' that are fresh
    /// at `now_ms`, newest first.
    fn fresh_others<'a>(&self, hosts: &'a HashMap<String, Published>, now_ms: u64) -> Vec<&'a Published> {
        let mut fresh: Vec<&Published> = hosts
            .values()
            .filter(|p| p.host != self.host && now_ms.saturating_sub(p.published_ms) < FRESH_FOR.as_millis() as u64)
            .collect();
        fresh.sort_by_key(|p| std::cmp::Reverse(p.published_ms));
        fresh
    }

    /// Withdraws what this member published and stops following.
    pub fn stop(&self) {
        self.withdraw_others(&Default::default());
        let _ = self.producer.flush(Duration::from_secs(5));
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

/// `status` without the fields that move with the clock alone (ages, CPU
/// time, the open transaction's age), so an idle job's status is not new
/// every second.
fn without_clocks(status: &serde_json::Value) -> serde_json::Value {
    let clock = |name: &str| name.ends_with("_seconds") || name == "transaction";
    let mut status = status.clone();
    if let Some(fields) = status.as_object_mut() {
        fields.retain(|name, _| !clock(name));
        if let Some(tasks) = fields.get_mut("tasks").and_then(|t| t.as_array_mut()) {
            for task in tasks.iter_mut().filter_map(|t| t.as_object_mut()) {
                task.retain(|name, _| !clock(name));
            }
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_alone_does_not_make_a_status_new() {
        let at = |seconds: f64, records: u64| {
            serde_json::json!({"records_in": records, "uptime_seconds": seconds, "cpu_seconds": seconds,
                "tasks": [{"records_in": records, "cpu_seconds": seconds, "transaction": {"open_seconds": seconds}}]})
        };
        assert_eq!(without_clocks(&at(1.0, 5)), without_clocks(&at(2.0, 5)));
        assert_ne!(without_clocks(&at(1.0, 5)), without_clocks(&at(1.0, 6)));
    }
}
