//! The durable half of a task's checkpoints: one redb file per task.
//!
//! Tables:
//! - `base`: the committed state, key -> value.
//! - `pending`: checkpoint id -> one blob holding that epoch's state delta and
//!   the input offsets as of its barrier. Written at the barrier with
//!   immediate durability (phase 1). A blob, not per-key rows, because one
//!   sequential write is ~10x cheaper at the barrier than inserting every
//!   dirty key into a B-tree.
//! - `meta`: `folded` = the highest checkpoint id folded into `base`.
//!
//! The store never decides on its own which checkpoint is committed: that is
//! Kafka's answer (the checkpoint id in the committed offsets' metadata),
//! passed to [`CheckpointStore::recover`]. Folding is idempotent, so a crash
//! at any point between "Kafka committed N" and "N folded" is repaired by the
//! next recovery.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::state::{self, Delta, StateBackend};

const BASE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("base");
const PENDING: TableDefinition<u64, &[u8]> = TableDefinition::new("pending");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// A note travelling with a pending checkpoint, folded into `NOTES_FOLDED`
/// with it: so the note is there exactly when its checkpoint committed.
const PENDING_NOTES: TableDefinition<u64, &str> = TableDefinition::new("pending-notes");
const NOTES_FOLDED: TableDefinition<&str, &str> = TableDefinition::new("notes");
/// The note of the last migration whose state a committed checkpoint holds.
const MIGRATED: &str = "migrated";
const FOLDED: &str = "folded";
/// `meta` key: how `base` keys are laid out; [`SHARDED`] once they carry
/// their shard's number in front (absent in stores written before that).
const LAYOUT: &str = "layout";
/// Every key is [`crate::runtime::shard_key`]`(shard, guest key)`.
const SHARDED: u64 = 1;

/// An error of the checkpoint store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// redb failed (I/O, a full disk, corruption): the source says which.
    #[error("checkpoint store {}: {source}", path.display())]
    Storage {
        /// The redb file.
        path: PathBuf,
        /// redb's error.
        #[source]
        source: redb::Error,
    },
    /// The store's directory could not be created.
    #[error("checkpoint store {}: creating its directory: {source}", path.display())]
    Directory {
        /// The redb file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A pending blob could not be decoded.
    #[error("checkpoint store {}: pending checkpoint {checkpoint} is corrupt: {message}", path.display())]
    Corrupt {
        /// The redb file.
        path: PathBuf,
        /// The checkpoint.
        checkpoint: u64,
        /// What is wrong.
        message: String,
    },
    /// The snapshot writer thread is gone (it panicked).
    #[error("the snapshot writer thread stopped unexpectedly")]
    WriterGone,
    /// The store holds state that the committed checkpoint in Kafka does not
    /// account for (Kafka lost the group's offsets, or the state directory
    /// belongs to another job).
    #[error(
        "checkpoint store {} has folded checkpoint {folded} but Kafka's committed checkpoint is {}; \
         the state does not belong to what Kafka committed (did the group's offsets expire, or is this another \
         job's state directory?). Start the job under a new id, or delete both the state directory and the \
         consumer group to reprocess from the start",
        path.display(),
        committed.map_or_else(|| "none".to_string(), |c| c.to_string())
    )]
    AheadOfKafka {
        /// The redb file.
        path: PathBuf,
        /// What the store folded.
        folded: u64,
        /// What Kafka says is committed.
        committed: Option<u64>,
    },
    /// Kafka committed a checkpoint that the store does not hold: the state
    /// directory was lost, emptied or replaced by an older copy. Running on
    /// would commit output computed from the wrong state.
    #[error(
        "checkpoint store {} holds state up to checkpoint {} but Kafka's committed checkpoint is {committed}: \
         the job's state directory was lost, emptied or replaced (ephemeral storage, a job file moved together \
         with a relative `state-dir`, a deleted directory). Refusing to start, since the output would be \
         computed from the wrong state. Put the state directory back where it was, or start the job under a \
         new id to reprocess its input from the start",
        path.display(),
        folded.map_or_else(|| "none (empty)".to_string(), |f| f.to_string())
    )]
    StateLost {
        /// The redb file.
        path: PathBuf,
        /// What the store holds after folding every pending checkpoint it
        /// could.
        folded: Option<u64>,
        /// What Kafka says is committed.
        committed: u64,
    },
    /// The store was written before state was kept per shard, by a task
    /// that read several partitions: which keys belong to which partition
    /// is not known.
    #[error(
        "checkpoint store {} holds state written before sluice kept state per input partition, by a task that \
         read {shards} partitions, so its keys cannot be told apart by partition. Run the job with the sluice \
         version that wrote it, or start it under a new id to reprocess its input",
        path.display()
    )]
    Unsharded {
        /// The redb file.
        path: PathBuf,
        /// The shards of the task.
        shards: usize,
    },
}

/// Results of the store.
type Result<T, E = Error> = std::result::Result<T, E>;

/// What [`CheckpointStore::adopt_shard_layout`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The keys already carried their shard.
    Sharded,
    /// The store was empty.
    Fresh,
    /// A store of a task with one shard, written before state was kept per
    /// shard: its keys now carry that shard.
    Upgraded {
        /// Keys rewritten.
        keys: u64,
    },
}

/// The next offset to read of one input partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionOffset {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset of the next record to read.
    pub next_offset: i64,
}

/// What [`CheckpointStore::recover`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Pending checkpoints folded into the base, in order.
    pub folded: Vec<u64>,
    /// Pending checkpoints discarded (never committed in Kafka).
    pub discarded: Vec<u64>,
}

/// One task's checkpoint store.
#[derive(Clone)]
pub struct CheckpointStore {
    db: Arc<Database>,
    path: Arc<Path>,
}

impl std::fmt::Debug for CheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointStore").field("path", &self.path).finish()
    }
}

impl CheckpointStore {
    /// Opens (or creates) the store at `path`, creating its directory.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| Error::Directory { path: path.to_owned(), source })?;
        }
        let db = Database::create(path).map_err(|e| Error::Storage { path: path.to_owned(), source: e.into() })?;
        let store = CheckpointStore { db: Arc::new(db), path: Arc::from(path) };
        // Create the tables so readers never see them missing.
        store.write(Durability::Immediate, |tx| {
            tx.open_table(BASE)?;
            tx.open_table(PENDING)?;
            tx.open_table(META)?;
            tx.open_table(PENDING_NOTES)?;
            tx.open_table(NOTES_FOLDED)?;
            Ok(())
        })?;
        Ok(store)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Phase 1: durably records checkpoint `checkpoint`'s state delta and
    /// input offsets, and the migration whose writes the delta holds, if it
    /// does. Returns the blob's size in bytes.
    pub fn write_pending(
        &self,
        checkpoint: u64,
        delta: &Delta,
        offsets: &[PartitionOffset],
        migrated: Option<&str>,
    ) -> Result<usize> {
        let blob = encode(delta, offsets);
        self.write(Durability::Immediate, |tx| {
            tx.open_table(PENDING)?.insert(checkpoint, blob.as_slice())?;
            if let Some(note) = migrated {
                tx.open_table(PENDING_NOTES)?.insert(checkpoint, note)?;
            }
            Ok(())
        })?;
        Ok(blob.len())
    }

    /// Folds every pending checkpoint up to and including `checkpoint` into
    /// the base, in order, after Kafka committed `checkpoint`. Not durable on
    /// its own: a crash before the next durable write loses the fold, and the
    /// next recovery folds again (folding is idempotent).
    pub fn fold(&self, checkpoint: u64) -> Result<Vec<u64>> {
        self.fold_with(checkpoint, Durability::None)
    }

    /// Brings the store in line with Kafka's committed checkpoint: folds every
    /// pending checkpoint up to `committed` and discards the rest. `None`
    /// means Kafka has no checkpoint for this task: a fresh start, allowed
    /// only if nothing was ever folded. A store that does not reach
    /// `committed` after the fold was lost or replaced: [`Error::StateLost`].
    pub fn recover(&self, committed: Option<u64>) -> Result<Recovery> {
        let folded_before = self.folded()?;
        if let Some(folded) = folded_before
            && committed.is_none_or(|c| folded > c)
        {
            return Err(Error::AheadOfKafka { path: self.path.to_path_buf(), folded, committed });
        }
        let folded = match committed {
            Some(c) => self.fold_with(c, Durability::Immediate)?,
            None => Vec::new(),
        };
        // Every checkpoint Kafka committed was written here as pending first,
        // so after the fold the store must be exactly at Kafka's checkpoint.
        if let Some(committed) = committed {
            let now = self.folded()?;
            if now != Some(committed) {
                return Err(Error::StateLost { path: self.path.to_path_buf(), folded: now, committed });
            }
        }
        let mut discarded = Vec::new();
        self.write(Durability::Immediate, |tx| {
            let mut pending = tx.open_table(PENDING)?;
            let mut notes = tx.open_table(PENDING_NOTES)?;
            let above: Vec<u64> = match committed {
                Some(c) => pending.range((c + 1)..)?.map(|e| e.map(|(k, _)| k.value())).collect::<Result<_, _>>()?,
                None => pending.iter()?.map(|e| e.map(|(k, _)| k.value())).collect::<Result<_, _>>()?,
            };
            for id in above {
                pending.remove(id)?;
                notes.remove(id)?;
                discarded.push(id);
            }
            Ok(())
        })?;
        Ok(Recovery { folded, discarded })
    }

    /// Makes sure every key of `base` carries its shard (see
    /// [`crate::runtime::shard_key`]), once, after [`recover`](Self::recover)
    /// left nothing pending. A store written before state was kept per shard
    /// is upgraded in one transaction if its task read one shard (all its
    /// keys are that shard's), and refused otherwise ([`Error::Unsharded`]).
    pub fn adopt_shard_layout(&self, shards: &[u32]) -> Result<Layout> {
        let mut layout = Layout::Sharded;
        let mut refused = false;
        self.write(Durability::Immediate, |tx| {
            let mut meta = tx.open_table(META)?;
            if meta.get(LAYOUT)?.map(|v| v.value()) == Some(SHARDED) {
                return Ok(());
            }
            let mut base = tx.open_table(BASE)?;
            layout = if base.is_empty()? {
                Layout::Fresh
            } else if let [shard] = shards {
                let entries: Vec<(Vec<u8>, Vec<u8>)> = base
                    .iter()?
                    .map(|e| e.map(|(k, v)| (k.value().to_vec(), v.value().to_vec())))
                    .collect::<Result<_, _>>()?;
                base.retain(|_, _| false)?;
                for (key, value) in &entries {
                    base.insert(crate::runtime::shard_key(*shard, key).as_slice(), value.as_slice())?;
                }
                Layout::Upgraded { keys: entries.len() as u64 }
            } else {
                refused = true;
                return Ok(());
            };
            meta.insert(LAYOUT, SHARDED)?;
            Ok(())
        })?;
        if refused {
            return Err(Error::Unsharded { path: self.path.to_path_buf(), shards: shards.len() });
        }
        Ok(layout)
    }

    /// The note of the last migration a committed checkpoint holds the
    /// writes of (see [`write_pending`](Self::write_pending)).
    pub fn migrated(&self) -> Result<Option<String>> {
        self.read(|tx| Ok(tx.open_table(NOTES_FOLDED)?.get(MIGRATED)?.map(|v| v.value().to_owned())))
    }

    /// The highest checkpoint folded into the base.
    pub fn folded(&self) -> Result<Option<u64>> {
        self.read(|tx| Ok(tx.open_table(META)?.get(FOLDED)?.map(|v| v.value())))
    }

    /// The ids of pending (unfolded) checkpoints, in order.
    pub fn pending(&self) -> Result<Vec<u64>> {
        self.read(|tx| {
            tx.open_table(PENDING)?
                .iter()?
                .map(|e| e.map(|(k, _)| k.value()))
                .collect::<Result<_, _>>()
                .map_err(Into::into)
        })
    }

    /// The input offsets recorded with pending checkpoint `checkpoint`.
    pub fn pending_offsets(&self, checkpoint: u64) -> Result<Option<Vec<PartitionOffset>>> {
        let blob = self.read(|tx| Ok(tx.open_table(PENDING)?.get(checkpoint)?.map(|v| v.value().to_vec())))?;
        blob.map(|blob| decode(&blob).map(|(_, offsets)| offsets).map_err(|message| self.corrupt(checkpoint, message)))
            .transpose()
    }

    /// Bytes of keys and values in the base (the committed state).
    pub fn base_bytes(&self) -> Result<u64> {
        self.read(|tx| Ok(tx.open_table(BASE)?.stats()?.stored_bytes()))
    }

    /// A [`StateBackend`] over the base, for a task's working set.
    pub fn backend(&self) -> Box<dyn StateBackend> {
        Box::new(self.clone())
    }

    fn fold_with(&self, checkpoint: u64, durability: Durability) -> Result<Vec<u64>> {
        let mut folded = Vec::new();
        let mut corrupt = None;
        self.write(durability, |tx| {
            let mut pending = tx.open_table(PENDING)?;
            let mut base = tx.open_table(BASE)?;
            let mut meta = tx.open_table(META)?;
            let mut notes = tx.open_table(PENDING_NOTES)?;
            let mut folded_notes = tx.open_table(NOTES_FOLDED)?;
            let ids: Vec<u64> =
                pending.range(..=checkpoint)?.map(|e| e.map(|(k, _)| k.value())).collect::<Result<_, _>>()?;
            for id in ids {
                let Some(blob) = pending.remove(id)?.map(|v| v.value().to_vec()) else { continue };
                let entries = match decode(&blob) {
                    Ok((entries, _)) => entries,
                    Err(message) => {
                        corrupt = Some((id, message));
                        return Err(redb::Error::Corrupted(format!("pending checkpoint {id}")));
                    }
                };
                for (key, value) in &entries {
                    match value {
                        Some(value) => {
                            base.insert(key.as_slice(), value.as_slice())?;
                        }
                        None => {
                            base.remove(key.as_slice())?;
                        }
                    }
                }
                if let Some(note) = notes.remove(id)?.map(|v| v.value().to_owned()) {
                    folded_notes.insert(MIGRATED, note.as_str())?;
                }
                folded.push(id);
            }
            crate::failpoint::hit("during-fold");
            let previous = meta.get(FOLDED)?.map(|v| v.value());
            if let Some(&last) = folded.last()
                && previous.is_none_or(|p| last > p)
            {
                meta.insert(FOLDED, last)?;
            }
            Ok(())
        })
        .map_err(|e| match corrupt.take() {
            Some((id, message)) => self.corrupt(id, message),
            None => e,
        })?;
        Ok(folded)
    }

    fn corrupt(&self, checkpoint: u64, message: String) -> Error {
        Error::Corrupt { path: self.path.to_path_buf(), checkpoint, message }
    }

    fn write(
        &self,
        durability: Durability,
        body: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<()> {
        let run = || -> Result<(), redb::Error> {
            let mut tx = self.db.begin_write()?;
            tx.set_durability(durability)
                .map_err(|e| redb::Error::from(redb::StorageError::Io(std::io::Error::other(e))))?;
            body(&tx)?;
            tx.commit()?;
            Ok(())
        };
        run().map_err(|source| Error::Storage { path: self.path.to_path_buf(), source })
    }

    fn read<T>(&self, body: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>) -> Result<T> {
        let run = || -> Result<T, redb::Error> {
            let tx = self.db.begin_read()?;
            body(&tx)
        };
        run().map_err(|source| Error::Storage { path: self.path.to_path_buf(), source })
    }
}

impl StateBackend for CheckpointStore {
    fn get(&self, key: &[u8]) -> state::Result<Option<Vec<u8>>> {
        self.read(|tx| Ok(tx.open_table(BASE)?.get(key)?.map(|v| v.value().to_vec())))
            .map_err(|e| state::Error(Box::new(e)))
    }

    fn scan(&self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> state::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        use std::ops::Bound;
        self.read(|tx| {
            let base = tx.open_table(BASE)?;
            let lower = match start_after {
                Some(after) => Bound::Excluded(after),
                None => Bound::Included(prefix),
            };
            let mut out = Vec::new();
            for entry in base.range::<&[u8]>((lower, Bound::Unbounded))? {
                let (k, v) = entry?;
                if !k.value().starts_with(prefix) || out.len() >= limit {
                    break;
                }
                out.push((k.value().to_vec(), v.value().to_vec()));
            }
            Ok(out)
        })
        .map_err(|e| state::Error(Box::new(e)))
    }
}

// The pending blob: offsets, then delta entries, all little-endian.
//   u32 n_offsets, n x { u32 topic_len, topic, i32 partition, i64 next_offset }
//   u64 n_entries, n x { u32 key_len, key, u8 present, [u32 value_len, value] }

fn encode(delta: &Delta, offsets: &[PartitionOffset]) -> Vec<u8> {
    let entries = delta.sorted();
    let size: usize = offsets.iter().map(|o| 16 + o.topic.len()).sum::<usize>()
        + entries.iter().map(|(k, v)| 9 + k.len() + v.map_or(0, <[u8]>::len)).sum::<usize>()
        + 12;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(offsets.len() as u32).to_le_bytes());
    for o in offsets {
        out.extend_from_slice(&(o.topic.len() as u32).to_le_bytes());
        out.extend_from_slice(o.topic.as_bytes());
        out.extend_from_slice(&o.partition.to_le_bytes());
        out.extend_from_slice(&o.next_offset.to_le_bytes());
    }
    out.extend_from_slice(&(delta.len() as u64).to_le_bytes());
    for (key, value) in entries {
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
        match value {
            Some(value) => {
                out.push(1);
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
            None => out.push(0),
        }
    }
    out
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("truncated: wanted {n} more bytes, {} left", self.0.len()));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        self.take(N)?.try_into().map_err(|_| "length mismatch".to_string())
    }
    fn u32(&mut self) -> Result<usize, String> {
        Ok(u32::from_le_bytes(self.array()?) as usize)
    }
}

/// The writes of a pending blob.
type Entries = Vec<(Vec<u8>, Option<Vec<u8>>)>;

fn decode(blob: &[u8]) -> Result<(Entries, Vec<PartitionOffset>), String> {
    let mut r = Reader(blob);
    let n_offsets = r.u32()?;
    let mut offsets = Vec::with_capacity(n_offsets.min(1 << 16));
    for _ in 0..n_offsets {
        let len = r.u32()?;
        let topic = String::from_utf8(r.take(len)?.to_vec()).map_err(|e| e.to_string())?;
        let partition = i32::from_le_bytes(r.array()?);
        let next_offset = i64::from_le_bytes(r.array()?);
        offsets.push(PartitionOffset { topic, partition, next_offset });
    }
    let n_entries = u64::from_le_bytes(r.array()?);
    let mut entries = Vec::with_capacity(usize::try_from(n_entries).unwrap_or(0).min(1 << 20));
    for _ in 0..n_entries {
        let len = r.u32()?;
        let key = r.take(len)?.to_vec();
        let value = match r.take(1)?[0] {
            0 => None,
            1 => {
                let len = r.u32()?;
                Some(r.take(len)?.to_vec())
            }
            other => return Err(format!("bad presence byte {other}")),
        };
        entries.push((key, value));
    }
    if !r.0.is_empty() {
        return Err(format!("{} trailing bytes", r.0.len()));
    }
    Ok((entries, offsets))
}

#[cfg(test)]
mod tests;
