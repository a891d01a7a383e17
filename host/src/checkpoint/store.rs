//! The durable half of a task's checkpoints: one redb file per task, holding
//! the state of the shards (input partitions) the task owns.
//!
//! Tables:
//! - `base`: the committed state, [`crate::runtime::shard_key`] -> value, so
//!   each shard's keys are one contiguous range.
//! - `pending`: checkpoint id -> one blob holding that epoch's state delta and
//!   the input offsets as of its barrier (which also say which shards the
//!   checkpoint covers). Written at the barrier with immediate durability
//!   (phase 1): one write per task per checkpoint, however many shards the
//!   task holds. A blob, not per-key rows, because one sequential write is
//!   ~10x cheaper at the barrier than inserting every dirty key into a B-tree.
//! - `shard-folded`: shard -> the highest checkpoint id folded into `base`
//!   for that shard. A shard's checkpoint ids only grow, also across moves
//!   between tasks: a task numbers its checkpoints above the committed ids of
//!   every shard it holds, and a pending delta is folded into a shard only if
//!   its id is above the shard's marker, so a stale delta of a shard that
//!   left a file and came back can never be applied.
//! - `pending-runs`: checkpoint id -> the task run that wrote it. Kafka's
//!   committed offsets name the run that committed each checkpoint, so a
//!   pending delta with the committed id but of another run (a zombie's on
//!   a host that was fenced, found when the shard comes back there after
//!   another host committed the same id) is never taken for the committed
//!   one.
//! - `shard-migrated`: shard -> the note of the last upgrade migration whose
//!   writes a committed checkpoint of the shard holds.
//! - `shard-size`: shard -> keys and bytes of its base state, kept with
//!   every write, for status without reading the keys.
//! - `meta`: the key layout, and the incarnation of the job whose state
//!   the store holds ([`CheckpointStore::adopt`]): a checkpoint id means
//!   something only within one incarnation (a job deleted and created
//!   again, or reset with its state cleared, numbers its checkpoints anew),
//!   so a store of another incarnation is emptied before it is recovered,
//!   never judged by its markers.
//!
//! A shard's keys, marker and note move together ([`CheckpointStore::take_shard`]).
//! The store never decides on its own which checkpoint is committed: that is
//! Kafka's answer (each partition's committed offset carries its checkpoint
//! id), passed per shard to [`CheckpointStore::recover`]. Folding is
//! idempotent, so a crash at any point between "Kafka committed N" and "N
//! folded" is repaired by the next recovery.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::runtime::{shard_key, shard_of};
use crate::state::{self, Delta, StateBackend};

const BASE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("base");
const PENDING: TableDefinition<u64, &[u8]> = TableDefinition::new("pending");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// A note travelling with a pending checkpoint, folded into `SHARD_MIGRATED`
/// with it: so the note is there exactly when its checkpoint committed.
const PENDING_NOTES: TableDefinition<u64, &str> = TableDefinition::new("pending-notes");
/// Checkpoint id -> the run that wrote the pending checkpoint.
const PENDING_RUNS: TableDefinition<u64, u64> = TableDefinition::new("pending-runs");
const SHARD_FOLDED: TableDefinition<u32, u64> = TableDefinition::new("shard-folded");
const SHARD_MIGRATED: TableDefinition<u32, &str> = TableDefinition::new("shard-migrated");
/// Per shard: keys and bytes (guest keys and values) of its base state,
/// kept with every write.
const SHARD_SIZE: TableDefinition<u32, (u64, u64)> = TableDefinition::new("shard-size");
/// `meta` key: how `base` keys are laid out; [`SHARDED`] once they carry
/// their shard's number in front and markers are kept per shard (absent in
/// stores written before that).
const LAYOUT: &str = "layout";
/// Every key is [`shard_key`]`(shard, guest key)`; markers are per shard.
const SHARDED: u64 = 2;
/// Stores from before per-shard markers: keys carried their shard, the
/// marker was the task's (`meta` `folded`).
const SHARDED_KEYS: u64 = 1;
/// `meta` key: the incarnation of the job whose state the store holds
/// (absent: 0, a job without incarnations).
const INCARNATION: &str = "incarnation";
/// Before shards: the task's marker and migration note.
const LEGACY_FOLDED: &str = "folded";
const LEGACY_NOTES: TableDefinition<&str, &str> = TableDefinition::new("notes");
const LEGACY_MIGRATED: &str = "migrated";

/// Kafka's committed checkpoint for each shard a task holds (`None`: the
/// shard never committed one).
pub type ShardCheckpoints = BTreeMap<u32, Option<u64>>;

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
    /// The store holds state of a shard that the committed checkpoint in
    /// Kafka does not account for (Kafka lost the group's offsets, or the
    /// state directory belongs to another job).
    #[error(
        "checkpoint store {} has folded checkpoint {folded} of shard {shard} (input partition {shard}) but Kafka's \
         committed checkpoint for it is {}; the state does not belong to what Kafka committed (did the group's \
         offsets expire, or is this another job's state directory?). Start the job under a new id, or reset it \
         with its state cleared",
        path.display(),
        committed.map_or_else(|| "none".to_string(), |c| c.to_string())
    )]
    AheadOfKafka {
        /// The redb file.
        path: PathBuf,
        /// The shard.
        shard: u32,
        /// What the store folded.
        folded: u64,
        /// What Kafka says is committed.
        committed: Option<u64>,
    },
    /// Kafka committed a checkpoint of a shard that the store does not hold:
    /// the state directory was lost, emptied or replaced by an older copy.
    /// Running on would commit output computed from the wrong state.
    #[error(
        "checkpoint store {} holds state of shard {shard} (input partition {shard}) up to checkpoint {} but \
         Kafka's committed checkpoint for it is {committed}: the job's state directory was lost, emptied or \
         replaced (ephemeral storage, a job file moved together with a relative `state-dir`, a deleted \
         directory). Refusing to start, since the output would be computed from the wrong state. Put the state \
         directory back where it was, or reset the job with its state cleared to reprocess its input",
        path.display(),
        folded.map_or_else(|| "none (empty)".to_string(), |f| f.to_string())
    )]
    StateLost {
        /// The redb file.
        path: PathBuf,
        /// The shard.
        shard: u32,
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

impl Error {
    /// Whether trying again may succeed: a store that disagrees with
    /// Kafka, or lost its state, will not fix itself.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Error::AheadOfKafka { .. } | Error::StateLost { .. } | Error::Unsharded { .. })
    }
}

/// Results of the store.
type Result<T, E = Error> = std::result::Result<T, E>;

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
    /// Pending checkpoints folded into the base (for at least one shard), in
    /// order.
    pub folded: Vec<u64>,
    /// Pending checkpoints discarded (never committed in Kafka).
    pub discarded: Vec<u64>,
    /// Keys moved under their shard, for a store written before state was
    /// kept per shard.
    pub upgraded_keys: Option<u64>,
    /// Shards whose state does not reach their committed checkpoint after
    /// the fold (the state directory was lost, emptied or replaced): what
    /// the store holds, and what Kafka committed. Restore them from the
    /// changelog, or refuse ([`CheckpointStore::require_current`]).
    pub behind: BTreeMap<u32, (Option<u64>, u64)>,
}

/// What [`CheckpointStore::adopt`] emptied: the state of another
/// incarnation of the job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discarded {
    /// The incarnation the store held (0: a job without incarnations).
    pub incarnation: u64,
    /// Its shards, each with its folded checkpoint.
    pub shards: BTreeMap<u32, u64>,
    /// Its pending checkpoints.
    pub pending: usize,
}

/// Keys and bytes of one shard's committed state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardSize {
    /// Keys.
    pub keys: u64,
    /// Bytes of keys (without the shard prefix) and values.
    pub bytes: u64,
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

/// The `base` range of `shard`'s keys.
fn shard_range(shard: u32) -> (Bound<[u8; 4]>, Bound<[u8; 4]>) {
    let upper = match shard.checked_add(1) {
        Some(next) => Bound::Excluded(next.to_be_bytes()),
        None => Bound::Unbounded,
    };
    (Bound::Included(shard.to_be_bytes()), upper)
}

/// Borrows a range of owned bounds as redb wants it.
fn as_slices(range: &(Bound<[u8; 4]>, Bound<[u8; 4]>)) -> (Bound<&[u8]>, Bound<&[u8]>) {
    (range.0.as_ref().map(|k| &k[..]), range.1.as_ref().map(|k| &k[..]))
}

/// Removes `shard`'s keys, marker, note and size.
fn clear_shard(tx: &redb::WriteTransaction, shard: u32) -> Result<(), redb::Error> {
    let range = shard_range(shard);
    tx.open_table(BASE)?.retain_in::<&[u8], _>(as_slices(&range), |_, _| false)?;
    tx.open_table(SHARD_FOLDED)?.remove(shard)?;
    tx.open_table(SHARD_MIGRATED)?.remove(shard)?;
    tx.open_table(SHARD_SIZE)?.remove(shard)?;
    Ok(())
}

/// Changes of shards' sizes within one write transaction.
#[derive(Default)]
struct SizeChanges(BTreeMap<u32, (i64, i64)>);

impl SizeChanges {
    /// Writes (`Some`) or deletes `stored` (a shard key) in `base`, noting
    /// how its shard's size changes.
    fn apply(
        &mut self,
        base: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
        stored: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), redb::Error> {
        let Some(shard) = shard_of(stored) else { return Ok(()) };
        let key_len = (stored.len() - crate::runtime::SHARD_PREFIX_BYTES) as i64;
        let old = match value {
            Some(value) => base.insert(stored, value)?.map(|v| v.value().len()),
            None => base.remove(stored)?.map(|v| v.value().len()),
        };
        let change = self.0.entry(shard).or_default();
        if let Some(old) = old {
            change.0 -= 1;
            change.1 -= key_len + old as i64;
        }
        if let Some(value) = value {
            change.0 += 1;
            change.1 += key_len + value.len() as i64;
        }
        Ok(())
    }

    /// Adds the changes to the `shard-size` table.
    fn commit(self, tx: &redb::WriteTransaction) -> Result<(), redb::Error> {
        let mut sizes = tx.open_table(SHARD_SIZE)?;
        for (shard, (keys, bytes)) in self.0 {
            let (old_keys, old_bytes) = sizes.get(shard)?.map(|v| v.value()).unwrap_or_default();
            let new = (old_keys.saturating_add_signed(keys), old_bytes.saturating_add_signed(bytes));
            sizes.insert(shard, new)?;
        }
        Ok(())
    }
}

/// The page cache of a store opened for a few transactions.
const DEFAULT_CACHE_BYTES: usize = 4 << 20;

impl CheckpointStore {
    /// Opens (or creates) the store at `path`, creating its directory, with
    /// a page cache of [`DEFAULT_CACHE_BYTES`]: for tools and rescales,
    /// which open a store for a few transactions.
    pub fn open(path: &Path) -> Result<Self> {
        CheckpointStore::open_with_cache(path, DEFAULT_CACHE_BYTES)
    }

    /// [`open`](Self::open), with a page cache of `cache_bytes` (redb's
    /// own default is 1 GiB per file): a task's share of host memory
    /// ([`super::budget::TaskBudget::store_cache_bytes`]).
    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| Error::Directory { path: path.to_owned(), source })?;
        }
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(|e| Error::Storage { path: path.to_owned(), source: e.into() })?;
        let store = CheckpointStore { db: Arc::new(db), path: Arc::from(path) };
        // Create the tables so readers never see them missing; a new store
        // starts in the current layout.
        store.write(Durability::Immediate, |tx| {
            let fresh = tx.open_table(BASE)?.is_empty()? && tx.open_table(PENDING)?.is_empty()?;
            let mut meta = tx.open_table(META)?;
            if fresh && meta.is_empty()? {
                meta.insert(LAYOUT, SHARDED)?;
            }
            tx.open_table(PENDING_NOTES)?;
            tx.open_table(PENDING_RUNS)?;
            tx.open_table(SHARD_FOLDED)?;
            tx.open_table(SHARD_MIGRATED)?;
            tx.open_table(SHARD_SIZE)?;
            Ok(())
        })?;
        Ok(store)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the store the state of `incarnation` of its job (0: a job
    /// without incarnations). A store that holds another incarnation's state
    /// is emptied first (keys, pending checkpoints, markers and notes, in one
    /// durable transaction): that state is not this incarnation's whatever
    /// its markers say, so its shards are then absent, restored from the
    /// changelog or started afresh. Returns what was emptied, if anything.
    pub fn adopt(&self, incarnation: u64) -> Result<Option<Discarded>> {
        let held = self.read(|tx| Ok(tx.open_table(META)?.get(INCARNATION)?.map_or(0, |v| v.value())))?;
        if held == incarnation {
            return Ok(None);
        }
        let shards = self.shards()?;
        let pending = self.pending()?.len();
        let empty = shards.is_empty() && pending == 0 && self.base_is_empty()?;
        self.write(Durability::Immediate, |tx| {
            if !empty {
                tx.delete_table(BASE)?;
                tx.delete_table(PENDING)?;
                tx.delete_table(PENDING_NOTES)?;
                tx.delete_table(PENDING_RUNS)?;
                tx.delete_table(SHARD_FOLDED)?;
                tx.delete_table(SHARD_MIGRATED)?;
                tx.delete_table(SHARD_SIZE)?;
                tx.delete_table(LEGACY_NOTES)?;
                tx.delete_table(META)?;
                tx.open_table(BASE)?;
                tx.open_table(PENDING)?;
                tx.open_table(PENDING_NOTES)?;
                tx.open_table(PENDING_RUNS)?;
                tx.open_table(SHARD_FOLDED)?;
                tx.open_table(SHARD_MIGRATED)?;
                tx.open_table(SHARD_SIZE)?;
                tx.open_table(META)?.insert(LAYOUT, SHARDED)?;
            }
            tx.open_table(META)?.insert(INCARNATION, incarnation)?;
            Ok(())
        })?;
        Ok((!empty).then_some(Discarded { incarnation: held, shards, pending }))
    }

    /// The incarnation of the job whose state the store at `path` holds (0:
    /// a job without incarnations), read without changing the file; `None`
    /// if there is no store there. Fails while a task has the store open.
    pub fn incarnation_at(path: &Path) -> Result<Option<u64>> {
        let storage = |source: redb::Error| Error::Storage { path: path.to_owned(), source };
        if !path.exists() {
            return Ok(None);
        }
        let db = Database::open(path).map_err(|e| storage(e.into()))?;
        let tx = db.begin_read().map_err(|e| storage(e.into()))?;
        let meta = match tx.open_table(META) {
            Ok(meta) => meta,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Some(0)),
            Err(e) => return Err(storage(e.into())),
        };
        let incarnation = meta.get(INCARNATION).map_err(|e| storage(e.into()))?;
        Ok(Some(incarnation.map_or(0, |v| v.value())))
    }

    /// Phase 1: durably records checkpoint `checkpoint`'s state delta and
    /// input offsets, the task run that wrote it, and the migration whose
    /// writes the delta holds, if it does. Returns the blob's size in bytes.
    pub fn write_pending(
        &self,
        checkpoint: u64,
        run: u64,
        delta: &Delta,
        offsets: &[PartitionOffset],
        migrated: Option<&str>,
    ) -> Result<usize> {
        let blob = encode(delta, offsets);
        self.write(Durability::Immediate, |tx| {
            tx.open_table(PENDING)?.insert(checkpoint, blob.as_slice())?;
            tx.open_table(PENDING_RUNS)?.insert(checkpoint, run)?;
            if let Some(note) = migrated {
                tx.open_table(PENDING_NOTES)?.insert(checkpoint, note)?;
            }
            Ok(())
        })?;
        Ok(blob.len())
    }

    /// Folds every pending checkpoint up to and including `checkpoint` into
    /// the base, in order, after Kafka committed `checkpoint` for every
    /// shard of the task. Not durable on its own: a crash before the next
    /// durable write loses the fold, and the next recovery folds again
    /// (folding is idempotent).
    pub fn fold(&self, checkpoint: u64) -> Result<Vec<u64>> {
        Ok(self.fold_shards(checkpoint, |_, id, _| id <= checkpoint, Durability::None)?.0)
    }

    /// Brings the store in line with Kafka's committed checkpoint of each
    /// shard in `committed` (the shards the task holds): folds every pending
    /// checkpoint up to the shard's committed id into it and discards the
    /// rest, leaving nothing pending. A shard Kafka never committed must
    /// have nothing folded ([`Error::AheadOfKafka`]); a shard that does not
    /// reach its committed id after the fold was lost or replaced
    /// ([`Error::StateLost`]). A store written before state was kept per
    /// shard is upgraded first.
    pub fn recover(&self, committed: &ShardCheckpoints) -> Result<Recovery> {
        self.recover_runs(committed, &BTreeMap::new())
    }

    /// [`recover`](Self::recover), where `runs` names the task run that
    /// committed each shard's checkpoint (Kafka's offset metadata): a
    /// pending checkpoint with a shard's committed id is folded into it only
    /// if the same run wrote it (or Kafka names no run: a checkpoint of a
    /// host before runs were noted).
    pub fn recover_runs(&self, committed: &ShardCheckpoints, runs: &BTreeMap<u32, u64>) -> Result<Recovery> {
        let upgraded_keys = match self.layout()? {
            Some(SHARDED) => None,
            layout => Some(self.upgrade(layout, committed)?),
        };
        let folded_before = self.shards()?;
        for (&shard, &committed) in committed {
            if let Some(&folded) = folded_before.get(&shard)
                && committed.is_none_or(|c| folded > c)
            {
                return Err(Error::AheadOfKafka { path: self.path.to_path_buf(), shard, folded, committed });
            }
        }
        let folds = |shard: u32, id: u64, run: Option<u64>| match committed.get(&shard).copied().flatten() {
            Some(c) if id < c => true,
            Some(c) if id == c => runs.get(&shard).is_none_or(|&committed_run| run == Some(committed_run)),
            _ => false,
        };
        let (folded, discarded) = self.fold_shards(u64::MAX, folds, Durability::Immediate)?;
        // Every checkpoint Kafka committed was written here as pending first
        // (or came with the shard from another task's store), so after the
        // fold each shard should be exactly at its committed checkpoint.
        let now = self.shards()?;
        let behind = committed
            .iter()
            .filter_map(|(&shard, &committed)| {
                let committed = committed?;
                let folded = now.get(&shard).copied();
                (folded != Some(committed)).then_some((shard, (folded, committed)))
            })
            .collect();
        Ok(Recovery { folded, discarded, upgraded_keys, behind })
    }

    /// The error for `shard` being behind Kafka's committed checkpoint.
    pub fn state_lost(&self, shard: u32, folded: Option<u64>, committed: u64) -> Error {
        Error::StateLost { path: self.path.to_path_buf(), shard, folded, committed }
    }

    /// Refuses a recovery that left a shard behind its committed checkpoint
    /// ([`Error::StateLost`]), for a job without a changelog to restore it
    /// from.
    pub fn require_current(&self, recovery: &Recovery) -> Result<()> {
        match recovery.behind.iter().next() {
            Some((&shard, &(folded, committed))) => {
                Err(Error::StateLost { path: self.path.to_path_buf(), shard, folded, committed })
            }
            None => Ok(()),
        }
    }

    /// Writes a chunk of `shard`'s state read back from its changelog (guest
    /// keys; `None` deletes), after [`clear_shard`](Self::clear_shard). Not
    /// durable on its own: [`finish_restore`](Self::finish_restore) is.
    pub fn restore_chunk(&self, shard: u32, entries: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<()> {
        // Changelog order is write order; the B-tree takes keys faster in
        // key order. A stable sort keeps a key's later writes after its
        // earlier ones, so the last still wins.
        let mut sorted: Vec<_> = entries.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        self.write(Durability::None, |tx| {
            let mut base = tx.open_table(BASE)?;
            let mut sizes = SizeChanges::default();
            for (key, value) in sorted {
                sizes.apply(&mut base, &shard_key(shard, key), value.as_deref())?;
            }
            drop(base);
            sizes.commit(tx)
        })
    }

    /// Marks `shard`'s restored state as that of `checkpoint`, durably with
    /// every chunk before it. Until then the shard is behind, and a crash
    /// makes the next recovery restore it again from scratch.
    pub fn finish_restore(&self, shard: u32, checkpoint: u64) -> Result<()> {
        self.write(Durability::Immediate, |tx| {
            tx.open_table(SHARD_FOLDED)?.insert(shard, checkpoint)?;
            Ok(())
        })
    }

    /// Notes that `shard`'s committed state holds the writes of the
    /// migration `note` (for a shard restored from the changelog, whose
    /// checkpoint said so).
    pub fn set_migrated(&self, shard: u32, note: &str) -> Result<()> {
        self.write(Durability::Immediate, |tx| {
            tx.open_table(SHARD_MIGRATED)?.insert(shard, note)?;
            Ok(())
        })
    }

    /// The shards whose state this store holds, each with its folded
    /// checkpoint.
    pub fn shards(&self) -> Result<BTreeMap<u32, u64>> {
        self.read(|tx| {
            tx.open_table(SHARD_FOLDED)?
                .iter()?
                .map(|e| e.map(|(k, v)| (k.value(), v.value())))
                .collect::<Result<_, _>>()
                .map_err(Into::into)
        })
    }

    /// The highest checkpoint folded into `shard`'s state.
    pub fn folded(&self, shard: u32) -> Result<Option<u64>> {
        self.read(|tx| Ok(tx.open_table(SHARD_FOLDED)?.get(shard)?.map(|v| v.value())))
    }

    /// The note of the last migration a committed checkpoint of `shard`
    /// holds the writes of (see [`write_pending`](Self::write_pending)).
    pub fn migrated(&self, shard: u32) -> Result<Option<String>> {
        self.read(|tx| Ok(tx.open_table(SHARD_MIGRATED)?.get(shard)?.map(|v| v.value().to_owned())))
    }

    /// Makes this store's copy of `shard` exactly `from`'s: its keys, marker
    /// and note, replacing whatever this store held of it, in one durable
    /// transaction. `from` must have recovered (nothing pending). Returns
    /// the keys copied. Repeating it is harmless; `from` is left as it was.
    pub fn take_shard(&self, shard: u32, from: &CheckpointStore) -> Result<u64> {
        let source = from.db.begin_read().map_err(|e| from.storage(e.into()))?;
        let mut copied = 0u64;
        let mut source_failed = None;
        self.write(Durability::Immediate, |tx| {
            clear_shard(tx, shard)?;
            let mut base = tx.open_table(BASE)?;
            let copy = || -> Result<_, redb::Error> {
                let range = shard_range(shard);
                let entries = source.open_table(BASE)?.range::<&[u8]>(as_slices(&range))?;
                let folded = source.open_table(SHARD_FOLDED)?.get(shard)?.map(|v| v.value());
                let migrated = source.open_table(SHARD_MIGRATED)?.get(shard)?.map(|v| v.value().to_owned());
                Ok((entries, folded, migrated))
            };
            let (entries, folded, migrated) = copy().inspect_err(|_| source_failed = Some(()))?;
            let mut bytes = 0u64;
            for entry in entries {
                let (key, value) = entry.inspect_err(|_| source_failed = Some(()))?;
                base.insert(key.value(), value.value())?;
                copied += 1;
                bytes += (key.value().len() - crate::runtime::SHARD_PREFIX_BYTES + value.value().len()) as u64;
            }
            if copied > 0 {
                tx.open_table(SHARD_SIZE)?.insert(shard, (copied, bytes))?;
            }
            if let Some(folded) = folded {
                tx.open_table(SHARD_FOLDED)?.insert(shard, folded)?;
            }
            if let Some(note) = migrated {
                tx.open_table(SHARD_MIGRATED)?.insert(shard, note.as_str())?;
            }
            Ok(())
        })
        .map_err(|e| match (source_failed, e) {
            (Some(()), Error::Storage { source, .. }) => from.storage(source),
            (_, e) => e,
        })?;
        Ok(copied)
    }

    /// Drops `shard`'s state from this store.
    pub fn clear_shard(&self, shard: u32) -> Result<()> {
        self.write(Durability::Immediate, |tx| clear_shard(tx, shard))
    }

    /// Drops the state of every shard not in `owned` (after its new owner
    /// took a copy). Returns the shards dropped.
    pub fn retain_shards(&self, owned: &[u32]) -> Result<Vec<u32>> {
        let gone: Vec<u32> = self.shards()?.into_keys().filter(|s| !owned.contains(s)).collect();
        if !gone.is_empty() {
            self.write(Durability::Immediate, |tx| gone.iter().try_for_each(|&shard| clear_shard(tx, shard)))?;
        }
        Ok(gone)
    }

    /// Keys and bytes of each shard's committed state.
    pub fn shard_sizes(&self) -> Result<BTreeMap<u32, ShardSize>> {
        self.read(|tx| {
            tx.open_table(SHARD_SIZE)?
                .iter()?
                .map(|e| e.map(|(k, v)| (k.value(), ShardSize { keys: v.value().0, bytes: v.value().1 })))
                .collect::<Result<_, _>>()
                .map_err(Into::into)
        })
    }

    /// Keys and bytes of `shard`'s committed state.
    pub fn shard_size(&self, shard: u32) -> Result<ShardSize> {
        Ok(self.shard_sizes()?.remove(&shard).unwrap_or_default())
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

    /// Whether the base holds no key at all (nothing is pending either,
    /// after a recovery).
    pub fn base_is_empty(&self) -> Result<bool> {
        self.read(|tx| Ok(tx.open_table(BASE)?.first()?.is_none()))
    }

    /// A [`StateBackend`] over the base, for a task's working set.
    pub fn backend(&self) -> Box<dyn StateBackend> {
        Box::new(self.clone())
    }

    fn layout(&self) -> Result<Option<u64>> {
        self.read(|tx| Ok(tx.open_table(META)?.get(LAYOUT)?.map(|v| v.value())))
    }

    /// Folds pending checkpoints up to `through`, each into the shards its
    /// offsets name whose marker is below its id and for which
    /// `folds(shard, id, run that wrote it)` holds, and removes them.
    /// Returns the ids folded into some shard and the ids discarded.
    fn fold_shards(
        &self,
        through: u64,
        folds: impl Fn(u32, u64, Option<u64>) -> bool,
        durability: Durability,
    ) -> Result<(Vec<u64>, Vec<u64>)> {
        let (mut folded, mut discarded) = (Vec::new(), Vec::new());
        let mut corrupt = None;
        self.write(durability, |tx| {
            let mut pending = tx.open_table(PENDING)?;
            let mut base = tx.open_table(BASE)?;
            let mut markers = tx.open_table(SHARD_FOLDED)?;
            let mut notes = tx.open_table(PENDING_NOTES)?;
            let mut runs = tx.open_table(PENDING_RUNS)?;
            let mut migrated = tx.open_table(SHARD_MIGRATED)?;
            let mut sizes = SizeChanges::default();
            let ids: Vec<u64> =
                pending.range(..=through)?.map(|e| e.map(|(k, _)| k.value())).collect::<Result<_, _>>()?;
            let mut taken = Vec::with_capacity(ids.len());
            for id in ids {
                let Some(blob) = pending.remove(id)?.map(|v| v.value().to_vec()) else { continue };
                let note = notes.remove(id)?.map(|v| v.value().to_owned());
                let run = runs.remove(id)?.map(|v| v.value());
                taken.push((id, blob, note, run));
            }
            // Every checkpoint's entries that apply, in checkpoint order,
            // borrowed from the blobs.
            let mut applying: Entries<'_> = Vec::new();
            for (id, blob, note, run) in &taken {
                let (id, run) = (*id, *run);
                let (entries, offsets) = match decode(blob) {
                    Ok(decoded) => decoded,
                    Err(message) => {
                        corrupt = Some((id, message));
                        return Err(redb::Error::Corrupted(format!("pending checkpoint {id}")));
                    }
                };
                let mut applies = BTreeMap::new();
                for offset in &offsets {
                    let Ok(shard) = u32::try_from(offset.partition) else { continue };
                    let above_marker = markers.get(shard)?.is_none_or(|m| m.value() < id);
                    applies.insert(shard, above_marker && folds(shard, id, run));
                }
                applying.extend(
                    entries
                        .into_iter()
                        .filter(|(key, _)| shard_of(key).is_some_and(|s| applies.get(&s) == Some(&true))),
                );
                let shards: Vec<u32> = applies.into_iter().filter_map(|(s, yes)| yes.then_some(s)).collect();
                for &shard in &shards {
                    markers.insert(shard, id)?;
                    if let Some(note) = note {
                        migrated.insert(shard, note.as_str())?;
                    }
                }
                if shards.is_empty() { discarded.push(id) } else { folded.push(id) }
            }
            // Each key once, with its last write, in key order: a key that
            // several checkpoints wrote costs one B-tree update, and the
            // updates walk the tree from left to right. The sort is stable,
            // so of a key's writes the last checkpoint's comes last.
            applying.sort_by(|a, b| a.0.cmp(b.0));
            let mut entries = applying.iter().peekable();
            while let Some(&(key, value)) = entries.next() {
                if entries.peek().is_none_or(|(next, _)| *next != key) {
                    sizes.apply(&mut base, key, value)?;
                }
            }
            drop((pending, base, markers, notes, runs, migrated));
            sizes.commit(tx)?;
            crate::failpoint::hit("during-fold");
            Ok(())
        })
        .map_err(|e| match corrupt.take() {
            Some((id, message)) => self.corrupt(id, message),
            None => e,
        })?;
        Ok((folded, discarded))
    }

    /// Brings a store written before per-shard markers (`layout`) to the
    /// current layout, in one transaction, for a task holding the shards of
    /// `committed`: folds the pending checkpoints Kafka committed the old way
    /// (a task committed all its partitions under one id), discards the
    /// rest, puts every key under its shard if it did not carry one (only
    /// possible if the task held one shard: [`Error::Unsharded`] otherwise),
    /// and gives every shard the task's marker and migration note. Returns
    /// the keys put under their shard.
    fn upgrade(&self, layout: Option<u64>, committed: &ShardCheckpoints) -> Result<u64> {
        let through = committed.values().flatten().max().copied();
        let shards: Vec<u32> = committed.keys().copied().collect();
        let mut refused = false;
        let mut moved = 0u64;
        let mut corrupt = None;
        self.write(Durability::Immediate, |tx| {
            let mut pending = tx.open_table(PENDING)?;
            let mut base = tx.open_table(BASE)?;
            let mut meta = tx.open_table(META)?;
            let mut notes = tx.open_table(PENDING_NOTES)?;
            let mut legacy_notes = tx.open_table(LEGACY_NOTES)?;
            let mut folded = meta.get(LEGACY_FOLDED)?.map(|v| v.value());
            let mut note = legacy_notes.get(LEGACY_MIGRATED)?.map(|v| v.value().to_owned());
            let ids: Vec<u64> = pending.iter()?.map(|e| e.map(|(k, _)| k.value())).collect::<Result<_, _>>()?;
            for id in ids {
                let Some(blob) = pending.remove(id)?.map(|v| v.value().to_vec()) else { continue };
                let pending_note = notes.remove(id)?.map(|v| v.value().to_owned());
                if through.is_none_or(|c| id > c) || folded.is_some_and(|f| id <= f) {
                    continue;
                }
                let (entries, _) = decode(&blob).map_err(|message| {
                    corrupt = Some((id, message));
                    redb::Error::Corrupted(format!("pending checkpoint {id}"))
                })?;
                for (key, value) in entries {
                    match value {
                        Some(value) => base.insert(key, value)?,
                        None => base.remove(key)?,
                    };
                }
                folded = Some(id);
                note = pending_note.or(note);
            }
            if layout != Some(SHARDED_KEYS) && !base.is_empty()? {
                let [shard] = shards[..] else {
                    refused = true;
                    return Ok(());
                };
                let entries: Vec<(Vec<u8>, Vec<u8>)> = base
                    .iter()?
                    .map(|e| e.map(|(k, v)| (k.value().to_vec(), v.value().to_vec())))
                    .collect::<Result<_, _>>()?;
                base.retain(|_, _| false)?;
                for (key, value) in &entries {
                    base.insert(shard_key(shard, key).as_slice(), value.as_slice())?;
                }
                moved = entries.len() as u64;
            }
            let mut counted: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
            for entry in base.iter()? {
                let (key, value) = entry?;
                let Some(shard) = shard_of(key.value()) else { continue };
                let size = counted.entry(shard).or_default();
                size.0 += 1;
                size.1 += (key.value().len() - crate::runtime::SHARD_PREFIX_BYTES + value.value().len()) as u64;
            }
            let mut sizes = tx.open_table(SHARD_SIZE)?;
            for (shard, size) in counted {
                sizes.insert(shard, size)?;
            }
            let mut markers = tx.open_table(SHARD_FOLDED)?;
            let mut migrated = tx.open_table(SHARD_MIGRATED)?;
            for &shard in &shards {
                if let Some(folded) = folded {
                    markers.insert(shard, folded)?;
                }
                if let Some(note) = &note {
                    migrated.insert(shard, note.as_str())?;
                }
            }
            meta.remove(LEGACY_FOLDED)?;
            legacy_notes.remove(LEGACY_MIGRATED)?;
            meta.insert(LAYOUT, SHARDED)?;
            Ok(())
        })
        .map_err(|e| match corrupt.take() {
            Some((id, message)) => self.corrupt(id, message),
            None => e,
        })?;
        if refused {
            return Err(Error::Unsharded { path: self.path.to_path_buf(), shards: shards.len() });
        }
        Ok(moved)
    }

    fn corrupt(&self, checkpoint: u64, message: String) -> Error {
        Error::Corrupt { path: self.path.to_path_buf(), checkpoint, message }
    }

    fn storage(&self, source: redb::Error) -> Error {
        Error::Storage { path: self.path.to_path_buf(), source }
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
        run().map_err(|source| self.storage(source))
    }

    fn read<T>(&self, body: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>) -> Result<T> {
        let run = || -> Result<T, redb::Error> {
            let tx = self.db.begin_read()?;
            body(&tx)
        };
        run().map_err(|source| self.storage(source))
    }
}

impl StateBackend for CheckpointStore {
    fn get(&self, key: &[u8]) -> state::Result<Option<Vec<u8>>> {
        self.read(|tx| Ok(tx.open_table(BASE)?.get(key)?.map(|v| v.value().to_vec())))
            .map_err(|e| state::Error(Box::new(e)))
    }

    fn get_many(&self, keys: &[&[u8]], max_bytes: usize) -> state::Result<Option<Vec<Option<Vec<u8>>>>> {
        self.read(|tx| {
            let base = tx.open_table(BASE)?;
            state::read_bounded(keys, max_bytes, |key| Ok(base.get(key)?.map(|v| v.value().to_vec())))
        })
        .map_err(|e| state::Error(Box::new(e)))
    }

    fn scan(&self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> state::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.read(|tx| {
            let base = tx.open_table(BASE)?;
            let lower = state::scan_start(prefix, start_after);
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

/// The writes of a pending blob, borrowed from it.
type Entries<'b> = Vec<(&'b [u8], Option<&'b [u8]>)>;

fn decode(blob: &[u8]) -> Result<(Entries<'_>, Vec<PartitionOffset>), String> {
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
        let key = r.take(len)?;
        let value = match r.take(1)?[0] {
            0 => None,
            1 => {
                let len = r.u32()?;
                Some(r.take(len)?)
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
