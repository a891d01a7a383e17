//! The snapshot writer: one thread per task that writes frozen deltas to
//! redb and folds committed ones, so the task thread never waits on redb at
//! a barrier.
//!
//! It runs requests in order: `Snapshot(N)` sends N's delta to the job's
//! changelog (into the task's open transaction, if the job has one) and
//! writes pending N durably, `Fold(N)` folds it after Kafka committed N. Each result comes back as an
//! [`Event`]. Dropping the [`Writer`] finishes the request in progress and
//! joins the thread, so the redb file is closed before a restarted task opens
//! it again.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::TaskError;
use super::store::{CheckpointStore, Error as StoreError, PartitionOffset, ShardSize};
use crate::failpoint;
use crate::kafka::changelog::ChangelogWriter;
use crate::state::Delta;

enum Request {
    Snapshot { id: u64, delta: Delta, offsets: Vec<PartitionOffset>, migrated: Option<String> },
    Fold { id: u64 },
}

/// What the writer finished.
#[derive(Debug)]
pub(crate) enum Event {
    /// Pending `id` is durable.
    Snapshotted { id: u64, bytes: usize, elapsed: Duration },
    /// Everything up to `id` is folded into the base, whose shards now have
    /// these sizes.
    Folded { id: u64, sizes: BTreeMap<u32, ShardSize> },
    /// A write failed; the task must restart.
    Failed(TaskError),
}

/// The handle the task thread holds.
pub(crate) struct Writer {
    requests: Option<Sender<Request>>,
    events: Receiver<Event>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts the thread for `store`, sending deltas to `changelog` too.
    pub(crate) fn start(
        store: CheckpointStore,
        changelog: Option<ChangelogWriter>,
        name: &str,
        run: u64,
    ) -> std::io::Result<Writer> {
        let (requests, inbox) = mpsc::channel::<Request>();
        let (outbox, events) = mpsc::channel::<Event>();
        let thread = std::thread::Builder::new().name(format!("sluice-snapshot-{name}")).spawn(move || {
            for request in inbox {
                let event = match request {
                    Request::Snapshot { id, delta, offsets, migrated } => {
                        let started = Instant::now();
                        // Queued first: the producer ships the records
                        // while redb syncs.
                        let logged = changelog.as_ref().map(|c| c.send(&delta)).transpose();
                        match logged.map_err(TaskError::from).and_then(|_| {
                            store.write_pending(id, run, &delta, &offsets, migrated.as_deref()).map_err(TaskError::from)
                        }) {
                            Ok(bytes) => {
                                failpoint::hit("after-snapshot");
                                Event::Snapshotted { id, bytes, elapsed: started.elapsed() }
                            }
                            Err(e) => Event::Failed(e),
                        }
                    }
                    Request::Fold { id } => match store.fold(id).and_then(|_| store.shard_sizes()) {
                        Ok(sizes) => {
                            failpoint::hit("after-fold");
                            Event::Folded { id, sizes }
                        }
                        Err(e) => Event::Failed(e.into()),
                    },
                };
                if outbox.send(event).is_err() {
                    return;
                }
            }
        })?;
        Ok(Writer { requests: Some(requests), events, thread: Some(thread) })
    }

    /// Writes pending `id` in the background, with the note of the
    /// migration whose writes it holds, if any.
    pub(crate) fn snapshot(&self, id: u64, delta: Delta, offsets: Vec<PartitionOffset>, migrated: Option<String>) {
        self.send(Request::Snapshot { id, delta, offsets, migrated });
    }

    /// Folds everything up to `id` in the background.
    pub(crate) fn fold(&self, id: u64) {
        self.send(Request::Fold { id });
    }

    fn send(&self, request: Request) {
        // The thread only stops when this handle drops; if it died anyway,
        // the missing event surfaces as `Failed` from `next_event`.
        if let Some(requests) = &self.requests {
            let _ = requests.send(request);
        }
    }

    /// The next finished request, waiting for it if `block`.
    pub(crate) fn next_event(&self, block: bool) -> Option<Event> {
        if block {
            match self.events.recv() {
                Ok(event) => Some(event),
                Err(_) => Some(Event::Failed(StoreError::WriterGone.into())),
            }
        } else {
            match self.events.try_recv() {
                Ok(event) => Some(event),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => Some(Event::Failed(StoreError::WriterGone.into())),
            }
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.requests.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
