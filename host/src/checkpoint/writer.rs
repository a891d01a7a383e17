//! The snapshot writer: one thread per task that writes frozen deltas to
//! redb and folds committed ones, so the task thread never waits on redb at
//! a barrier.
//!
//! It runs requests in order: `Snapshot(N)` sends N's delta to the job's
//! changelog (into the task's open transaction, if the job has one) and
//! writes pending N durably, `Fold(N)` folds it after Kafka committed N (at
//! most once a second, several checkpoints at once: see `FoldPolicy`). Each
//! result comes back as an [`Event`]. Dropping the [`Writer`] finishes the
//! request in progress, folds what was committed and joins the thread, so
//! the redb file is closed before a restarted task opens it again.

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
    Snapshot {
        id: u64,
        delta: Delta,
        offsets: Vec<PartitionOffset>,
        migrated: Option<String>,
    },
    Fold {
        id: u64,
    },
    /// Fold what Kafka committed now, and answer even with nothing to fold.
    FoldNow,
}

/// What the writer finished.
#[derive(Debug)]
pub(crate) enum Event {
    /// Pending `id` is durable.
    Snapshotted { id: u64, bytes: usize, elapsed: Duration },
    /// Everything up to `id` is folded into the base, whose shards now have
    /// these sizes; `answers_fold_now` for the one answer to
    /// [`Writer::fold_now`] (a due fold's event may come before it).
    Folded { id: u64, sizes: BTreeMap<u32, ShardSize>, answers_fold_now: bool },
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
    /// Starts the thread for `store`, sending deltas to `changelog` too;
    /// a fold comes due once `fold_bytes` of checkpoints wait for it.
    pub(crate) fn start(
        store: CheckpointStore,
        changelog: Option<ChangelogWriter>,
        name: &str,
        run: u64,
        fold_bytes: usize,
    ) -> std::io::Result<Writer> {
        let (requests, inbox) = mpsc::channel::<Request>();
        let (outbox, events) = mpsc::channel::<Event>();
        let thread = std::thread::Builder::new().name(format!("sluice-snapshot-{name}")).spawn(move || {
            let mut folds = FoldPolicy::new(fold_bytes);
            loop {
                let request = match folds.wait() {
                    None => inbox.recv().ok(),
                    Some(wait) => match inbox.recv_timeout(wait) {
                        Ok(request) => Some(request),
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            if !fold(&store, &mut folds, &outbox) {
                                return;
                            }
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => None,
                    },
                };
                let Some(request) = request else {
                    // The task is done with this writer: what Kafka
                    // committed is folded now rather than at the next start.
                    fold(&store, &mut folds, &outbox);
                    return;
                };
                match request {
                    Request::Snapshot { id, delta, offsets, migrated } => {
                        let started = Instant::now();
                        // Queued first: the producer ships the records
                        // while redb syncs.
                        let logged = changelog.as_ref().map(|c| c.send(&delta)).transpose();
                        let event = match logged.map_err(TaskError::from).and_then(|_| {
                            store.write_pending(id, run, &delta, &offsets, migrated.as_deref()).map_err(TaskError::from)
                        }) {
                            Ok(bytes) => {
                                failpoint::hit("after-snapshot");
                                folds.written(bytes);
                                Event::Snapshotted { id, bytes, elapsed: started.elapsed() }
                            }
                            Err(e) => Event::Failed(e),
                        };
                        if outbox.send(event).is_err() {
                            return;
                        }
                    }
                    Request::Fold { id } => {
                        folds.committed(id);
                        if folds.due() && !fold(&store, &mut folds, &outbox) {
                            return;
                        }
                    }
                    Request::FoldNow => {
                        if !fold_through(&store, folds.take(), true, &outbox) {
                            return;
                        }
                    }
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

    /// Folds everything up to `id` in the background, once a fold is due.
    pub(crate) fn fold(&self, id: u64) {
        self.send(Request::Fold { id });
    }

    /// Folds what Kafka committed at once; a `Folded` event marked
    /// `answers_fold_now` answers, with id 0 if there was nothing to fold.
    pub(crate) fn fold_now(&self) {
        self.send(Request::FoldNow);
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

/// Folds what Kafka committed, if anything; `false` once the task stopped
/// listening.
fn fold(store: &CheckpointStore, folds: &mut FoldPolicy, outbox: &Sender<Event>) -> bool {
    let Some(id) = folds.take() else { return true };
    fold_through(store, Some(id), false, outbox)
}

/// Folds the committed checkpoints through `id` (none: nothing to fold)
/// and answers with the shards' sizes, marked as the answer to `FoldNow`
/// if it is; `false` once the task stopped listening.
fn fold_through(store: &CheckpointStore, id: Option<u64>, answers_fold_now: bool, outbox: &Sender<Event>) -> bool {
    let folded = id.map_or(Ok(()), |id| store.fold(id).map(drop));
    let event = match folded.and_then(|()| store.shard_sizes()) {
        Ok(sizes) => {
            if id.is_some() {
                failpoint::hit("after-fold");
            }
            Event::Folded { id: id.unwrap_or(0), sizes, answers_fold_now }
        }
        Err(e) => Event::Failed(e.into()),
    };
    outbox.send(event).is_ok()
}

/// When committed checkpoints are folded into the base. Not after every
/// commit: at short intervals a key is written in checkpoint after
/// checkpoint, and one fold of several updates it once, and copies each
/// B-tree page it touches once, instead of once per checkpoint (2.4x less
/// fold time per checkpoint in `cargo bench --bench checkpoint`). A
/// committed checkpoint waits at most [`FOLD_AT_MOST_EVERY`], or until
/// the task's share of pending checkpoints is waiting (the task holds their
/// deltas in memory until the fold: [`super::budget::TaskBudget::fold_bytes`]).
/// Waiting costs no safety: a pending checkpoint is durable, and recovery
/// folds whatever Kafka committed.
struct FoldPolicy {
    /// The last checkpoint Kafka committed and not folded yet.
    committed: Option<u64>,
    /// When the last fold ended.
    last: Instant,
    /// Bytes of pending checkpoints written since.
    written: usize,
    /// Written bytes that make a fold due at once.
    due_at: usize,
}

/// The longest a committed checkpoint waits to be folded.
const FOLD_AT_MOST_EVERY: Duration = Duration::from_secs(1);
impl FoldPolicy {
    fn new(due_at: usize) -> Self {
        FoldPolicy { committed: None, last: Instant::now(), written: 0, due_at }
    }

    fn written(&mut self, bytes: usize) {
        self.written = self.written.saturating_add(bytes);
    }

    fn committed(&mut self, id: u64) {
        self.committed = Some(self.committed.map_or(id, |c| c.max(id)));
    }

    fn due(&self) -> bool {
        self.committed.is_some() && (self.last.elapsed() >= FOLD_AT_MOST_EVERY || self.written >= self.due_at)
    }

    /// How long to wait for the next request before a fold is due; `None`
    /// with nothing to fold.
    fn wait(&self) -> Option<Duration> {
        self.committed.map(|_| FOLD_AT_MOST_EVERY.saturating_sub(self.last.elapsed()))
    }

    /// The checkpoint to fold through, now.
    fn take(&mut self) -> Option<u64> {
        let id = self.committed.take()?;
        self.last = Instant::now();
        self.written = 0;
        Some(id)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::shard_key;

    fn snapshot(writer: &Writer, id: u64) {
        let delta = Delta::new([(shard_key(0, format!("k{id}").as_bytes()), Some(b"v".to_vec()))]);
        let offsets = vec![PartitionOffset { topic: "in".into(), partition: 0, next_offset: id as i64 }];
        writer.snapshot(id, delta, offsets, None);
    }

    /// A fold that came due before `fold_now` answers first; the answer to
    /// `fold_now` is the one marked, and it folded everything committed.
    #[test]
    fn the_answer_to_fold_now_is_marked_and_comes_after_any_due_fold() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = CheckpointStore::open(&dir.path().join("t.redb")).expect("store");
        let writer = Writer::start(store, None, "test", 1, 64 << 20).expect("writer");
        snapshot(&writer, 1);
        // Past the fold period, so that committing 1 makes a fold due.
        std::thread::sleep(FOLD_AT_MOST_EVERY + Duration::from_millis(100));
        writer.fold(1);
        snapshot(&writer, 2);
        writer.fold(2); // within the period: it waits
        writer.fold_now();
        let mut events = Vec::new();
        loop {
            match writer.next_event(true) {
                Some(Event::Snapshotted { id, .. }) => events.push(format!("snapshotted {id}")),
                Some(Event::Folded { id, answers_fold_now, .. }) => {
                    events.push(format!("folded {id}{}", if answers_fold_now { ", answering" } else { "" }));
                    if answers_fold_now {
                        break;
                    }
                }
                Some(Event::Failed(e)) => panic!("the writer failed: {e}"),
                None => panic!("the writer stopped answering"),
            }
        }
        assert_eq!(events, ["snapshotted 1", "folded 1", "snapshotted 2", "folded 2, answering"]);
    }
}
