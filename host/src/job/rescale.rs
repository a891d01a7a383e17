//! Moving shards between a job's task stores when its tasks change.
//!
//! Each task's redb file holds the state of the shards it owns (see
//! [`crate::checkpoint::CheckpointStore`]). `assignment.json` in the job's
//! state directory records which partitions each task read when the stores
//! were last written, and it is the commit point of a rescale. At every
//! start, [`settle`] brings the stores to the assignment the job will run
//! with:
//!
//! 1. If the assignment changed: fence the transactional ids of the recorded
//!    tasks (a crashed task's open transaction would keep the committed
//!    offsets unstable), read every shard's committed checkpoint from Kafka,
//!    and recover each recorded task's store against it, so nothing is
//!    pending and every shard is at its committed checkpoint.
//! 2. Copy every shard whose owner changes into its new owner's store: keys,
//!    marker and migration note in one durable transaction, replacing any
//!    copy there. The old owners keep theirs.
//! 3. Record the new assignment (written atomically): the rescale happened.
//! 4. Drop every shard from the stores that do not own it now, and remove
//!    the stores of tasks that no longer exist.
//!
//! A crash before 3 leaves the recorded assignment and its stores whole, and
//! the next start does 1-2 again (for whatever parallelism it then has); a
//! crash after 3 leaves copies that step 4 of the next start drops. Nothing
//! goes through Kafka but the committed ids: the stores are local files.
//! Checkpoint ids stay monotonic per shard because a task numbers its
//! checkpoints above the committed id of every shard it holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{JobConfig, JobError, task_store_path};
use crate::checkpoint::{CheckpointStore, shard_numbers};
use crate::kafka::{self, Source};

/// The input partitions of each task, by task index.
type Assignment = Vec<Vec<(String, i32)>>;

/// What [`settle`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The tasks of the recorded assignment, if it changed.
    pub rescaled_from: Option<usize>,
    /// Shards copied to a new owner.
    pub moved: Vec<u32>,
    /// Keys copied with them.
    pub keys: u64,
}

/// The file recording the assignment the stores were written under.
fn assignment_path(state_dir: &Path) -> PathBuf {
    state_dir.join("assignment.json")
}

/// The partitions each task read, as recorded in the state directory.
fn recorded(config: &JobConfig) -> Result<Option<Assignment>, JobError> {
    let path = assignment_path(&config.state_dir);
    let fail = |message: String| JobError::Assignment(format!("job {}: {message}", config.id));
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| fail(format!("{} is not a partition assignment: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !task_stores(&config.state_dir).is_empty() {
                return Err(fail(format!(
                    "{} holds task stores but no assignment.json saying which task held which partitions; put it \
                     back, or reset the job with its state cleared",
                    config.state_dir.display()
                )));
            }
            Ok(None)
        }
        Err(e) => Err(fail(format!("reading {}: {e}", path.display()))),
    }
}

/// The task stores in `state_dir`, by task index.
fn task_stores(state_dir: &Path) -> BTreeMap<usize, PathBuf> {
    let Ok(entries) = std::fs::read_dir(state_dir) else { return BTreeMap::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let index = name.to_str()?.strip_prefix("task-")?.strip_suffix(".redb")?.parse().ok()?;
            Some((index, entry.path()))
        })
        .collect()
}

/// The owner of each shard under `assignment`.
fn owners(assignment: &[Vec<(String, i32)>]) -> BTreeMap<u32, usize> {
    assignment
        .iter()
        .enumerate()
        .flat_map(|(task, mine)| shard_numbers(mine).into_iter().map(move |s| (s, task)))
        .collect()
}

/// Brings the job's task stores to `assignment` (see the module docs).
pub fn settle(
    config: &JobConfig,
    client: &rdkafka::ClientConfig,
    partitions: &[(String, i32)],
    assignment: &[Vec<(String, i32)>],
    timeout: Duration,
) -> Result<Settled, JobError> {
    let mut settled = Settled::default();
    let recorded = recorded(config)?;
    if let Some(recorded) = recorded.as_deref().filter(|r| *r != assignment) {
        settled = rescale(config, client, partitions, recorded, assignment, timeout)?;
    }
    if recorded.as_deref() != Some(assignment) {
        let path = assignment_path(&config.state_dir);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&config.state_dir)?;
            let json = serde_json::to_vec_pretty(assignment).map_err(std::io::Error::other)?;
            crate::fsutil::write_atomically(&path, &json)
        };
        write().map_err(|e| {
            JobError::Assignment(format!(
                "job {}: recording the partition assignment in {}: {e}",
                config.id,
                path.display()
            ))
        })?;
    }
    crate::failpoint::hit("rescale-before-sweep");
    sweep(&config.state_dir, assignment)?;
    Ok(settled)
}

/// Steps 1 and 2: recover the recorded stores and copy the shards that
/// change owner to their new owners.
fn rescale(
    config: &JobConfig,
    client: &rdkafka::ClientConfig,
    partitions: &[(String, i32)],
    recorded: &[Vec<(String, i32)>],
    assignment: &[Vec<(String, i32)>],
    timeout: Duration,
) -> Result<Settled, JobError> {
    // Fencing waits on the transaction coordinator and a producer's
    // shutdown: fence the tasks together, not one after another.
    std::thread::scope(|scope| {
        let fences: Vec<_> = (0..recorded.len())
            .map(|index| scope.spawn(move || kafka::Sink::fence(client, &config.transactional_id(index), timeout)))
            .collect();
        fences.into_iter().try_for_each(|fence| {
            fence.join().unwrap_or_else(|_| Err(kafka::Error::Other("fencing a recorded task panicked".into())))
        })
    })?;
    let committed = Source::connect(client, &config.group(), config.start)?.committed(partitions, timeout)?;
    let mut old = Vec::with_capacity(recorded.len());
    for (index, mine) in recorded.iter().enumerate() {
        let store = CheckpointStore::open(&task_store_path(&config.state_dir, index))?;
        // Another incarnation's shards are absent: they move as nothing.
        store.adopt(config.incarnation)?;
        store.recover_runs(&committed.for_shards(&shard_numbers(mine)), &committed.runs)?;
        old.push(store);
    }
    let (before, after) = (owners(recorded), owners(assignment));
    let mut new: BTreeMap<usize, CheckpointStore> = BTreeMap::new();
    let mut settled = Settled { rescaled_from: Some(recorded.len()), ..Settled::default() };
    for (&shard, &to) in &after {
        let from = before.get(&shard).copied();
        if from == Some(to) {
            continue;
        }
        let target = match new.entry(to) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => match old.get(to) {
                Some(store) => entry.insert(store.clone()),
                None => {
                    let store = CheckpointStore::open(&task_store_path(&config.state_dir, to))?;
                    store.adopt(config.incarnation)?;
                    entry.insert(store)
                }
            },
        };
        match from.and_then(|task| old.get(task)) {
            Some(source) => settled.keys += target.take_shard(shard, source)?,
            // A shard nobody held (a partition added since) starts empty,
            // whatever an interrupted rescale may have left here.
            None => target.clear_shard(shard)?,
        }
        settled.moved.push(shard);
        crate::failpoint::hit("rescale-during-copy");
    }
    tracing::info!(
        job = %config.scope,
        from = recorded.len(),
        to = assignment.len(),
        shards = ?settled.moved,
        keys = settled.keys,
        "rescaled: the shards' state moved to their new tasks"
    );
    Ok(settled)
}

/// Step 4: every store keeps only the shards its task owns now; stores of
/// tasks beyond the assignment are removed.
fn sweep(state_dir: &Path, assignment: &[Vec<(String, i32)>]) -> Result<(), JobError> {
    for (index, path) in task_stores(state_dir) {
        match assignment.get(index) {
            Some(mine) => {
                let dropped = CheckpointStore::open(&path)?.retain_shards(&shard_numbers(mine))?;
                if !dropped.is_empty() {
                    tracing::debug!(store = %path.display(), shards = ?dropped, "dropped the copies of moved shards");
                }
            }
            None => std::fs::remove_file(&path).map_err(|e| {
                JobError::Assignment(format!(
                    "removing {}, the store of a task that no longer exists: {e}",
                    path.display()
                ))
            })?,
        }
    }
    Ok(())
}
