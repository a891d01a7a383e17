//! The checkpoint coordinator: asks every task of a job for checkpoint N, one
//! more every interval.
//!
//! It does not wait for tasks: each task takes the barrier between two
//! batches (its source, transform and sink run on one thread, so the barrier
//! needs no alignment) and commits its own Kafka transaction. Checkpoint ids
//! only grow; a task that was restarting simply skips ids.
//!
//! The count is read off the clock (intervals since the job started, plus
//! the checkpoints requested at once), not kept by a thread of its own: a
//! task looks at it between batches and when its idle wait ends, so a
//! ticking thread would only have cost each job a thread and a wake-up per
//! interval (on a host with many idle jobs, a thread in eleven).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Hands out checkpoint requests to the tasks of one job.
#[derive(Debug)]
pub struct Coordinator {
    started: Instant,
    interval: Duration,
    /// Checkpoints requested at once ([`request_now`](Self::request_now)).
    extra: AtomicU64,
}

impl Coordinator {
    /// A coordinator that requests a checkpoint every `interval` from now.
    /// Each task numbers its checkpoints above its own last committed one
    /// whatever the coordinator's count.
    pub fn new(interval: Duration) -> Coordinator {
        Coordinator { started: Instant::now(), interval, extra: AtomicU64::new(0) }
    }

    /// The latest checkpoint id requested.
    pub fn requested(&self) -> u64 {
        self.ticks() + self.extra.load(Ordering::Relaxed)
    }

    /// Requests a checkpoint now (for a final checkpoint at stop) and returns
    /// its id.
    pub fn request_now(&self) -> u64 {
        let extra = self.extra.fetch_add(1, Ordering::Relaxed) + 1;
        self.ticks() + extra
    }

    /// Whole intervals since the start.
    fn ticks(&self) -> u64 {
        let interval = self.interval.as_nanos().max(1);
        u64::try_from(self.started.elapsed().as_nanos() / interval).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_request_per_interval_and_one_more_per_request_now() {
        let coordinator = Coordinator::new(Duration::from_millis(20));
        let first = coordinator.requested();
        let now = coordinator.request_now();
        assert!(now > first, "a request now is a new id: {first} then {now}");
        assert!(coordinator.requested() >= now, "the count went back after a request now");
        std::thread::sleep(Duration::from_millis(50));
        let later = coordinator.requested();
        assert!(later >= now + 2, "two intervals passed and the count is {later} (was {now})");
    }
}
