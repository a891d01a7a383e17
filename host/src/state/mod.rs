//! A task's keyed state: the working set the guest reads and writes, with the
//! dirty-key tracking that checkpoints take incremental deltas from.
//!
//! Key types:
//! - [`TaskState`]: the working set. Reads that miss it fall through to the
//!   task's [`StateBackend`] (the committed state: the redb base plus deltas
//!   already folded into it) and are cached; writes and deletes stay in memory
//!   and are marked dirty until the next checkpoint takes them.
//! - [`Delta`]: every key written or deleted since the previous checkpoint,
//!   sorted by key, with `None` for deletions. A checkpoint writes it durably
//!   as one unit; recovery folds it into the base.
//! - [`StateBackend`]: where committed state lives. [`EmptyBackend`] for a
//!   task that starts from nothing (tests, `sluice exec`).
//!
//! The working set never decides what is committed: it only remembers what
//! changed. Guests reach it only through the `state` import of their own
//! task, never through a handle to the backend.

use std::collections::BTreeMap;
use std::ops::Bound;

/// An error from the state backend (I/O, corruption).
#[derive(Debug, thiserror::Error)]
#[error("state backend: {0}")]
pub struct Error(pub String);

/// Results of state operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Committed state that the working set falls through to.
pub trait StateBackend: Send {
    /// The committed value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Up to `limit` committed entries whose keys start with `prefix` and are
    /// greater than `start_after` (when given), in key order.
    fn scan(&self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
}

/// A backend with no committed state.
#[derive(Debug, Default, Clone, Copy)]
pub struct EmptyBackend;

impl StateBackend for EmptyBackend {
    fn get(&self, _key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
    fn scan(&self, _prefix: &[u8], _start_after: Option<&[u8]>, _limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(Vec::new())
    }
}

/// The writes of one checkpoint epoch, sorted by key; `None` deletes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// `(key, Some(value))` stores, `(key, None)` deletes.
    pub entries: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl Delta {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many keys changed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// One key of the working set.
#[derive(Debug, Clone)]
struct Slot {
    /// `None`: the key is known to be absent (deleted, or missing below).
    value: Option<Vec<u8>>,
    /// Changed since the last [`TaskState::take_delta`].
    dirty: bool,
}

/// The working set of one task.
pub struct TaskState {
    slots: BTreeMap<Vec<u8>, Slot>,
    /// Keys whose slot turned dirty since the last delta, each once.
    dirty: Vec<Vec<u8>>,
    backend: Box<dyn StateBackend>,
}

impl std::fmt::Debug for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskState").field("cached", &self.slots.len()).field("dirty", &self.dirty.len()).finish()
    }
}

impl TaskState {
    /// An empty state with nothing committed.
    pub fn in_memory() -> Self {
        TaskState::with_backend(Box::new(EmptyBackend))
    }

    /// A working set over committed state in `backend`.
    pub fn with_backend(backend: Box<dyn StateBackend>) -> Self {
        TaskState { slots: BTreeMap::new(), dirty: Vec::new(), backend }
    }

    /// The current value of `key`.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<&[u8]>> {
        if !self.slots.contains_key(key) {
            let value = self.backend.get(key)?;
            self.slots.insert(key.to_vec(), Slot { value, dirty: false });
        }
        Ok(self.slots.get(key).and_then(|slot| slot.value.as_deref()))
    }

    /// Stores `value` under `key`.
    pub fn set(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.write(key, Some(value));
    }

    /// Removes `key`.
    pub fn delete(&mut self, key: Vec<u8>) {
        self.write(key, None);
    }

    /// Stores (`Some`) or removes (`None`) the value of `key`.
    pub fn write(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        match self.slots.get_mut(&key) {
            Some(slot) => {
                if !slot.dirty {
                    slot.dirty = true;
                    self.dirty.push(key);
                }
                slot.value = value;
            }
            None => {
                self.dirty.push(key.clone());
                self.slots.insert(key, Slot { value, dirty: true });
            }
        }
    }

    /// Up to `limit` entries whose keys start with `prefix`, in key order,
    /// after `start_after` when given: the working set over the backend.
    pub fn scan_prefix(
        &mut self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        let mut cursor: Option<Vec<u8>> = start_after.map(<[u8]>::to_vec);
        // The backend is read in pages; keys the working set knows about are
        // answered from the working set (it may have changed or deleted them).
        let mut below_done = false;
        let mut below: std::vec::IntoIter<(Vec<u8>, Vec<u8>)> = Vec::new().into_iter();
        let mut below_next: Option<(Vec<u8>, Vec<u8>)> = None;
        let page = limit.clamp(16, 1024);
        while out.len() < limit {
            if below_next.is_none() {
                below_next = below.next();
                if below_next.is_none() && !below_done {
                    let from = cursor.as_deref();
                    let fetched = self.backend.scan(prefix, from, page)?;
                    below_done = fetched.len() < page;
                    below = fetched.into_iter();
                    below_next = below.next();
                }
            }
            let lower = match cursor.as_deref() {
                Some(after) => Bound::Excluded(after),
                None => Bound::Included(prefix),
            };
            let above = self
                .slots
                .range::<[u8], _>((lower, Bound::Unbounded))
                .take_while(|(key, _)| key.starts_with(prefix))
                .next();
            let take_above = match (&above, &below_next) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((a, _)), Some((b, _))) => a.as_slice() <= b.as_slice(),
            };
            if take_above {
                let Some((key, slot)) = above else { break };
                let key = key.clone();
                if let Some(value) = &slot.value {
                    out.push((key.clone(), value.clone()));
                }
                if below_next.as_ref().is_some_and(|(b, _)| *b == key) {
                    below_next = None;
                }
                cursor = Some(key);
            } else if let Some((key, value)) = below_next.take() {
                cursor = Some(key.clone());
                out.push((key, value));
            }
        }
        Ok(out)
    }

    /// Takes every change since the previous call as a delta, sorted by key,
    /// and marks the working set clean.
    pub fn take_delta(&mut self) -> Delta {
        let mut keys = std::mem::take(&mut self.dirty);
        keys.sort_unstable();
        let entries = keys
            .into_iter()
            .filter_map(|key| {
                let slot = self.slots.get_mut(&key)?;
                slot.dirty = false;
                let value = slot.value.clone();
                Some((key, value))
            })
            .collect();
        Delta { entries }
    }

    /// Drops every clean key from memory if more than `max_keys` are cached.
    /// Call only when everything clean is in the backend (after a fold):
    /// later reads fetch them from there again.
    pub fn evict_clean_over(&mut self, max_keys: usize) {
        if self.slots.len() > max_keys {
            self.slots.retain(|_, slot| slot.dirty);
        }
    }

    /// How many keys changed since the last delta.
    pub fn dirty_len(&self) -> usize {
        self.dirty.len()
    }

    /// How many keys the working set holds in memory.
    pub fn cached_len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests;
