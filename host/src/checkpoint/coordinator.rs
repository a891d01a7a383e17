//! The checkpoint coordinator: asks every task of a job for checkpoint N on a
//! timer.
//!
//! It does not wait for tasks: each task takes the barrier between two
//! batches (its source, transform and sink run on one thread, so the barrier
//! needs no alignment) and commits its own Kafka transaction. Checkpoint ids
//! only grow; a task that was restarting simply skips ids.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Hands out checkpoint requests to the tasks of one job.
#[derive(Debug)]
pub struct Coordinator {
    requested: AtomicU64,
    stop: AtomicBool,
}

impl Coordinator {
    /// Starts a coordinator that requests a checkpoint every `interval`.
    /// Each task numbers its checkpoints above its own last committed one
    /// whatever the coordinator's count.
    pub fn start(interval: Duration) -> Arc<Coordinator> {
        let coordinator = Arc::new(Coordinator { requested: AtomicU64::new(0), stop: AtomicBool::new(false) });
        let ticking = Arc::clone(&coordinator);
        let spawned = std::thread::Builder::new().name("sluice-coordinator".into()).spawn(move || {
            while !ticking.stop.load(Ordering::Relaxed) {
                std::thread::sleep(interval);
                ticking.requested.fetch_add(1, Ordering::Relaxed);
            }
        });
        if let Err(e) = spawned {
            tracing::error!("cannot start the checkpoint coordinator thread: {e}");
        }
        coordinator
    }

    /// The latest checkpoint id requested.
    pub fn requested(&self) -> u64 {
        self.requested.load(Ordering::Relaxed)
    }

    /// Requests a checkpoint now (for a final checkpoint at stop) and returns
    /// its id.
    pub fn request_now(&self) -> u64 {
        self.requested.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Stops the timer.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
