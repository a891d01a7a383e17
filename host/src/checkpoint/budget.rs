//! The host memory one task may hold, derived from its tenant's policy.
//!
//! Every buffer the host keeps for a task, besides the guest's own linear
//! memory, is a share of the guest's memory limit **M** (`limits.memory`),
//! with a floor so that one record of the largest size (**X**, the
//! producer's `message.max.bytes`) always fits. A tenant that wants bigger
//! buffers asks for more memory, which its policy bounds; no job setting
//! moves them. The shares, and who holds each:
//!
//! | buffer | bound | held by |
//! |---|---|---|
//! | data copied out of the guest in one call | M | wasmtime's hostcall fuel ([`crate::runtime`]) |
//! | writes since the last checkpoint | M | [`crate::runtime`] |
//! | outputs held behind the checkpoint in flight | M | [`crate::checkpoint`] |
//! | checkpoints waiting for their fold | F = max(M, 16 MiB) | [`TaskBudget::fold_bytes`] |
//! | clean values cached from the store | M/2 | [`TaskBudget::clean_cache_bytes`] |
//! | the store's page cache (redb) | max(M/8, 4 MiB) | [`TaskBudget::store_cache_bytes`] |
//! | the source's queue, and one fetch | each max(min(M/32, 32 MiB), X) | [`TaskBudget::consumer`] |
//! | the producer's queue (outputs, changelog) | max(min(M/16, 64 MiB), 2X) | [`TaskBudget::producer`] |
//!
//! [`TaskBudget::task_bytes`] adds them up, with what they imply (a delta
//! being snapshotted while the next fills, a fold's copies) and the fixed
//! costs, into the most memory one task can take; docs/memory.md turns it
//! into what a tenant can cost a host.

use rdkafka::ClientConfig;

/// The floor of [`TaskBudget::fold_bytes`]: folds of less cost more per
/// byte than they save.
const MIN_FOLD: usize = 16 << 20;

/// The floor of the store's page cache: redb's B-tree pages of one fold.
const MIN_STORE_CACHE: usize = 4 << 20;

/// The ceiling of either half of the source's buffer, and of the
/// producer's queue: more buys no throughput (a task reads and sends far
/// less than this in the time the broker takes to answer).
const MAX_CLIENT_QUEUE: usize = 64 << 20;

/// What one awake task holds whatever its policy: its instance's contexts
/// (wasmtime's `max_component_instance_size`, 16 MiB) and tables (8 of
/// 200,000 elements, 12.8 MB), the producer's per-message overhead (100,000
/// messages of about 250 bytes), its two Kafka clients and its threads.
pub const TASK_FIXED_BYTES: usize = 64 << 20;

/// What one job holds beside its tasks: its log ring (2,000 lines of at
/// most 4 KiB) and an hour of throughput figures.
pub const JOB_BYTES: usize = 9 << 20;

/// The host memory one task may hold, as shares of its guest's memory
/// limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskBudget {
    /// The guest's memory limit, M.
    memory: usize,
    /// The largest record a client sends or fetches, X.
    max_message: usize,
}

impl TaskBudget {
    /// The budget of a task whose guest may have `memory_bytes` of linear
    /// memory and whose clients carry `config` (its `message.max.bytes`).
    pub fn new(memory_bytes: usize, config: &ClientConfig) -> Self {
        TaskBudget { memory: memory_bytes, max_message: crate::kafka::max_message_bytes(config) }
    }

    /// Clean values a task keeps cached from its store, in bytes: above
    /// this, the cache is emptied after a fold and reads fetch again.
    pub fn clean_cache_bytes(&self) -> usize {
        self.memory / 2
    }

    /// Bytes of committed checkpoints the task holds in memory until they
    /// are folded into its store: a fold comes due once this many wait.
    pub fn fold_bytes(&self) -> usize {
        self.memory.max(MIN_FOLD)
    }

    /// The page cache of the task's store file.
    pub fn store_cache_bytes(&self) -> usize {
        (self.memory / 8).max(MIN_STORE_CACHE)
    }

    /// Bytes the source's consumer may queue, and fetch in one response:
    /// each this much, so the source holds at most twice it.
    pub fn consumer_queue_bytes(&self) -> usize {
        (self.memory / 32).min(MAX_CLIENT_QUEUE / 2).max(self.max_message)
    }

    /// Bytes the producer may queue (outputs and changelog records) before
    /// a send waits.
    pub fn producer_queue_bytes(&self) -> usize {
        (self.memory / 16).min(MAX_CLIENT_QUEUE).max(2 * self.max_message)
    }

    /// The most host memory the task can take, its guest's memory
    /// included, when it reads `partitions` input partitions (a batch calls
    /// the guest once per partition it holds records of).
    pub fn task_bytes(&self, partitions: usize) -> usize {
        let (m, fold) = (self.memory, self.fold_bytes());
        let guest = m;
        // One call's copy of what the guest hands over, then a batch's
        // outputs (a call each, the last one over the bound) beside those
        // held behind the checkpoint in flight.
        let outputs = m + partitions.max(1) * m + m;
        // Open writes; the delta being snapshotted; those committed and
        // waiting for their fold, with one more that commits before it
        // runs; and the fold's copy of them.
        let state = m + m + (fold + m) + (fold + m);
        let caches = self.clean_cache_bytes() + self.store_cache_bytes();
        let clients = 2 * self.consumer_queue_bytes() + self.producer_queue_bytes();
        guest + outputs + state + caches + clients + TASK_FIXED_BYTES
    }

    /// `config` for a consumer that reads within this budget: the
    /// source's, and the changelog restore's.
    pub fn consumer(&self, config: &ClientConfig) -> ClientConfig {
        let bytes = self.consumer_queue_bytes();
        let mut config = config.clone();
        config
            .set("queued.max.messages.kbytes", (bytes >> 10).max(1).to_string())
            .set("fetch.max.bytes", bytes.to_string());
        config
    }

    /// `config` for the task's transactional producer.
    pub fn producer(&self, config: &ClientConfig) -> ClientConfig {
        let mut config = config.clone();
        config.set("queue.buffering.max.kbytes", (self.producer_queue_bytes() >> 10).max(1).to_string());
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn budget(memory: usize) -> TaskBudget {
        TaskBudget::new(memory, &ClientConfig::new())
    }

    #[test]
    fn shares_follow_the_memory_limit() {
        let b = budget(128 * MIB);
        assert_eq!(b.clean_cache_bytes(), 64 * MIB);
        assert_eq!(b.store_cache_bytes(), 16 * MIB);
        assert_eq!(b.consumer_queue_bytes(), 4 * MIB);
        assert_eq!(b.producer_queue_bytes(), 8 * MIB);
    }

    #[test]
    fn a_record_of_the_largest_size_always_fits() {
        let b = budget(4 * MIB);
        assert_eq!(b.consumer_queue_bytes(), 1_000_000);
        assert_eq!(b.producer_queue_bytes(), 2_000_000);
        assert_eq!(b.store_cache_bytes(), MIN_STORE_CACHE);
        let mut big = ClientConfig::new();
        big.set("message.max.bytes", "100000000");
        let b = TaskBudget::new(128 * MIB, &big);
        assert_eq!(b.consumer_queue_bytes(), 100_000_000, "above the ceiling, for one record");
        assert_eq!(b.producer_queue_bytes(), 200_000_000);
    }

    #[test]
    fn large_memory_does_not_grow_client_queues_without_end() {
        let b = budget(1 << 30);
        assert_eq!(b.consumer_queue_bytes(), 32 * MIB);
        assert_eq!(b.producer_queue_bytes(), 64 * MIB);
    }

    #[test]
    fn a_task_costs_its_shares_and_the_fixed_part() {
        let mib = |bytes: usize| bytes / MIB;
        // 16 MiB: guest 16, outputs 16 + 2 x 16 + 16, state 16 + 16 + 32 + 32,
        // caches 8 + 4, clients 2 x 1 MB + 2 MB, fixed 64.
        assert_eq!(mib(budget(16 * MIB).task_bytes(2)), 16 + 64 + 96 + 12 + 3 + 64);
        assert!(budget(16 * MIB).task_bytes(0) == budget(16 * MIB).task_bytes(1));
    }

    #[test]
    fn clients_get_the_budget_as_librdkafka_properties() {
        let b = budget(128 * MIB);
        let consumer = b.consumer(&ClientConfig::new());
        assert_eq!(consumer.get("queued.max.messages.kbytes"), Some("4096"));
        assert_eq!(consumer.get("fetch.max.bytes"), Some("4194304"));
        assert_eq!(b.producer(&ClientConfig::new()).get("queue.buffering.max.kbytes"), Some("8192"));
    }
}
