//! Which member runs which job, decided by Kafka's group assignment.
//!
//! Every member joins one consumer group over the cluster's placement
//! topic, whose partitions are *slots* (the topic holds no records; only
//! its partitions matter). Kafka's cooperative-sticky assignor spreads the
//! slots over the live members, moves only what it must when one joins or
//! leaves, and gives a dead member's slots to the others once its session
//! times out. Each task of a job lives in the slot its job id and index
//! hash to ([`slot_of`]), and the member that owns the slot runs it: a
//! job's tasks (and so its shards) spread over the members, a task costs
//! one member however many the cluster has, and no member opens a task's
//! transactions unless it runs the task.
//!
//! Ownership can overlap for a moment when a slot moves (the old owner
//! stops the job with a final checkpoint while the new one starts it): the
//! tasks' transactional ids are the job's, so the newcomer fences the old
//! owner, and the output stays exactly once.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use sha2::{Digest as _, Sha256};

use super::{Identity, lock};
use crate::kafka::Error as KafkaErr;

/// Slots of a cluster: the placement topic's partitions. More slots spread
/// jobs more evenly; every member holds a share of them.
pub const SLOTS: i32 = 64;

/// How long a member that stopped answering keeps its slots (and the jobs
/// in them): the failover time's main part.
pub const SESSION_TIMEOUT_MS: u32 = 6000;

/// The slot of task `task` of a tenant's job.
pub fn slot_of(tenant: &str, job: &str, task: usize) -> i32 {
    let digest = Sha256::digest(format!("{tenant}/{job}/{task}").as_bytes());
    let word = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    (word % SLOTS as u32) as i32
}

/// This member's slots, as Kafka assigned them.
pub struct Placement {
    topic: String,
    owned: Mutex<BTreeSet<i32>>,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Placement {
    /// Joins the placement group of `identity`'s cluster.
    pub fn start(identity: &Identity, config: &ClientConfig) -> Result<Arc<Placement>, KafkaErr> {
        let topic = super::Topics::of(&identity.cluster).placement;
        let consumer: BaseConsumer = config
            .clone()
            .set("group.id", format!("{}.placement", super::prefix(&identity.cluster)))
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", SESSION_TIMEOUT_MS.to_string())
            .set("heartbeat.interval.ms", "1000")
            .set("enable.auto.commit", "false")
            .create()
            .map_err(KafkaErr::client("creating the placement member"))?;
        consumer.subscribe(&[&topic]).map_err(KafkaErr::client("joining the placement group"))?;
        let placement = Arc::new(Placement {
            topic,
            owned: Mutex::default(),
            stop: AtomicBool::new(false),
            thread: Mutex::default(),
        });
        let member = Arc::clone(&placement);
        let thread = std::thread::Builder::new()
            .name("sluice-placement".into())
            .spawn(move || member.follow(consumer))
            .map_err(|e| KafkaErr::Other(format!("starting the placement thread: {e}")))?;
        *lock(&placement.thread) = Some(thread);
        Ok(placement)
    }

    /// Polls the group (which keeps the membership alive and runs the
    /// rebalances) and notes the slots assigned after each poll.
    fn follow(&self, consumer: BaseConsumer) {
        while !self.stop.load(Ordering::Relaxed) {
            if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
                tracing::warn!("the placement group: {e}");
            }
            let owned: BTreeSet<i32> = match consumer.assignment() {
                Ok(assignment) => {
                    assignment.elements().iter().filter(|e| e.topic() == self.topic).map(|e| e.partition()).collect()
                }
                Err(e) => {
                    tracing::warn!("reading the placement assignment: {e}");
                    continue;
                }
            };
            let mut mine = lock(&self.owned);
            if *mine != owned {
                tracing::info!(slots = owned.len(), "this host's share of the cluster's jobs changed");
                *mine = owned;
            }
        }
        // Leaving the group at once hands the slots over now, not after
        // the session timeout.
        consumer.unsubscribe();
        lock(&self.owned).clear();
    }

    /// Whether this member runs the jobs of `slot`.
    pub fn owns(&self, slot: i32) -> bool {
        lock(&self.owned).contains(&slot)
    }

    /// How many slots this member holds.
    pub fn slots(&self) -> usize {
        lock(&self.owned).len()
    }

    /// Leaves the group.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_spread_over_the_slots() {
        let mut used = BTreeSet::new();
        for job in 0..1000 {
            let slot = slot_of("acme", &format!("job-{job}"), job % 3);
            assert!((0..SLOTS).contains(&slot));
            used.insert(slot);
        }
        assert_eq!(used.len(), SLOTS as usize, "some slot never gets a job");
        assert_eq!(slot_of("acme", "j", 1), slot_of("acme", "j", 1));
    }
}
