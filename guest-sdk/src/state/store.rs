//! The state cache: the SDK's performance centre.
//!
//! A boundary crossing costs ~150-250 ns, a map lookup in the guest a few
//! dozen, so [`Store`] keeps every key it has touched during a call:
//!
//! - a read is served from the cache; a miss costs one `state.get`, and
//!   [`Store::want`] then [`Store::fetch_wanted`] load many keys with one
//!   `state.get-many`;
//! - a write or delete only updates the cache and marks the key dirty
//!   (writing back the value the cache already holds from the host is a
//!   no-op);
//! - [`Store::end`], at the end of a call, keeps the cache of a shard it
//!   holds (below), or [`Store::finish`]es it: sends every dirty entry with
//!   one `state.write` and empties the cache;
//! - [`Store::scan`] first writes pending writes back (one `state.write`) so
//!   the host's `scan-prefix` sees them;
//! - [`Store::discard`], when a hook fails, drops every unflushed write:
//!   the host fails the call and ends the instance anyway.
//!
//! It holds nothing across calls unless the host has said it will ask for
//! it back (world `cached`: `hold-state`, see [`Store::allow_holding`]):
//! then a shard's entries, dirty ones too, stay from one `process-packed`
//! call of the shard to the next, and the host's `flush-state` for the shard
//! writes them back ([`Store::give_back`]) before each checkpoint and before
//! the shard's timers fire. A shard's records mostly touch keys that an
//! earlier batch of the epoch touched (a window's count, a key's running
//! total): held, such a key crosses the boundary twice per checkpoint (one
//! read, one write) instead of twice per batch. What the store holds is
//! bounded by what `hold-state` says (an eighth of the guest's memory
//! limit); past that a call writes its shard's entries back at its end, as
//! without holding. Calls without a shard (`init`, `migrate`, `on-timers`)
//! never hold anything, and a failed call drops everything: the host ends
//! the instance and rolls its state back to the last checkpoint. The store
//! is a thread-local, reached through [`with`]; user code never runs while
//! it is borrowed.
//!
//! The cache is a hash table with [`FxHasher`], not a B-tree: state keys
//! share long prefixes (`name 0x00 ...`) and wasm's byte-at-a-time `memcmp`
//! made the B-tree's many comparisons per lookup the guest's hottest code.
//! For the same reason a lookup compares keys eight bytes at a time
//! ([`same_key`]) rather than through `==` on byte slices, which is that
//! `memcmp` (hashbrown's `HashTable` takes the comparison, where `HashMap`
//! takes `Eq`). The hasher is fixed (no random seed), so the guest imports
//! no `wasi:random`, and the order of a flush's entries, while unspecified,
//! is deterministic for the same inputs.

use std::cell::RefCell;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use super::backend::{Backend, Bytes, Write};
use crate::error::{Error, Result};

#[cfg(target_arch = "wasm32")]
pub(crate) type DefaultBackend = super::backend::Host;
#[cfg(not(target_arch = "wasm32"))]
pub(crate) type DefaultBackend = super::backend::Memory;

thread_local! {
    static STORE: RefCell<Store<DefaultBackend>> = const { RefCell::new(Store::new(DefaultBackend::new())) };
}

/// Runs `f` on this instance's store.
pub(crate) fn with<R>(f: impl FnOnce(&mut Store<DefaultBackend>) -> Result<R>) -> Result<R> {
    STORE.with(|store| {
        let mut store = store
            .try_borrow_mut()
            .map_err(|_| Error::new("state used re-entrantly (from a serde impl called by the state API?)"))?;
        f(&mut store)
    })
}

/// A cached entry: the value as the batch sees it (`None`: absent or
/// deleted), and whether the host has yet to hear about it.
#[derive(Debug)]
struct Slot {
    value: Option<Bytes>,
    dirty: bool,
    /// False only between [`Store::want`] and [`Store::fetch_wanted`], for
    /// a key yet to fetch.
    fetched: bool,
    /// The key's [`hash`]: the table grows without reading every key again
    /// (a held shard's table grows to thousands of entries).
    hash: u64,
}

impl Slot {
    const fn clean(value: Option<Bytes>, hash: u64) -> Slot {
        Slot { value, dirty: false, fetched: true, hash }
    }

    /// Before writing `value` here: marks the slot dirty, counting it in
    /// `dirty` the first time, and says whether to write at all (not when a
    /// clean slot holds exactly `value`, which the host has already; an
    /// unfetched slot knows nothing of the host's value, so it always
    /// writes, and is fetched from then on: the write is its value).
    #[inline]
    fn make_dirty(&mut self, value: Option<&[u8]>, dirty: &mut usize) -> bool {
        if self.dirty {
            return true;
        }
        if self.fetched && self.value.as_deref() == value {
            return false;
        }
        self.fetched = true;
        self.dirty = true;
        *dirty += 1;
        true
    }
}

/// FxHash (as in rustc) over 8-byte words, with MurmurHash3's finalizer.
/// Fast and deterministic; not DoS-resistant, which is acceptable for a cache
/// that holds one batch's keys.
#[derive(Clone, Copy, Default)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(Self::SEED);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.add(u64::from_le_bytes(word.try_into().unwrap_or_default()));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        // The multiply only mixes upwards: keys that differ only in a word's
        // high bytes (`count\0user-1`, `count\0user-2`, ...) would share their
        // low bits, which pick the bucket. MurmurHash3's finalizer spreads
        // every bit over the whole word.
        let mut h = self.hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

type FxBuild = BuildHasherDefault<FxHasher>;

fn hash(key: &[u8]) -> u64 {
    FxBuild::new().hash_one(key)
}

/// Whether two keys are equal, compared eight bytes at a time: wasm has
/// no `memcmp` instruction, and the C library's compares a byte per loop
/// iteration, which made a cache lookup several times the cost of hashing
/// the key.
#[inline]
fn same_key(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut a_words, mut b_words) = (a.chunks_exact(8), b.chunks_exact(8));
    let word = |w: &[u8]| u64::from_le_bytes(w.try_into().unwrap_or_default());
    if !(&mut a_words).zip(&mut b_words).all(|(x, y)| word(x) == word(y)) {
        return false;
    }
    a_words.remainder().iter().zip(b_words.remainder()).all(|(x, y)| x == y)
}

/// The cached entries: (key, slot) in a hash table keyed by [`hash`] and
/// compared by [`same_key`].
type Entries = HashTable<(Bytes, Slot)>;

/// The entry of `key`, whose [`hash`] is `hash`.
fn entry<'a>(entries: &'a mut Entries, hash: u64, key: &[u8]) -> Entry<'a, (Bytes, Slot)> {
    entries.entry(hash, |(k, _)| same_key(k, key), |(_, slot)| slot.hash)
}

/// `state.get-many` of `keys`: as many values as keys, or an error.
fn ask<B: Backend>(backend: &mut B, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
    let values = backend.get_many(keys)?;
    if values.len() != keys.len() {
        return Err(Error::new(format!(
            "host bug: state.get-many returned {} values for {} keys",
            values.len(),
            keys.len()
        )));
    }
    Ok(values)
}

/// Fills an unfetched slot with the host's `value`; the bytes it adds.
fn fill(slot: &mut Slot, value: Option<Bytes>) -> usize {
    let bytes = value.as_ref().map_or(0, |v| v.len());
    *slot = Slot::clean(value, slot.hash);
    bytes
}

/// What an entry costs beyond its key's and value's bytes, counted against
/// the bytes the store may hold: its place in the table (the key, the slot
/// and a control byte), with room for the allocator's rounding of a key or
/// value too long to stay inline.
const ENTRY_OVERHEAD: usize = std::mem::size_of::<(Bytes, Slot)>() + 16;

/// The held entries of a parked shard, as [`Store`] keeps its current ones.
#[derive(Debug, Default)]
struct Cache {
    entries: Entries,
    dirty: usize,
    bytes: usize,
}

/// A backend with a write-back cache in front of it.
#[derive(Debug)]
pub(crate) struct Store<B> {
    backend: B,
    entries: Entries,
    dirty: usize,
    /// How many bytes of entries the store may hold across calls, over all
    /// shards ([`ENTRY_OVERHEAD`] each, plus their keys and values): 0 until
    /// the host says it will ask for held state back (`hold-state`).
    max_held: usize,
    /// The shard whose entries `entries` holds across calls; `None`: they
    /// last one call.
    holding: Option<u32>,
    /// Bytes of keys and values in `entries`.
    bytes: usize,
    /// The held entries of the other shards.
    parked: Vec<(u32, Cache)>,
    /// The hashes of the keys [`want`](Store::want) put in `entries` since
    /// the last [`fetch_wanted`](Store::fetch_wanted), which finds them by
    /// these rather than by passing over the table: a held shard's holds
    /// thousands of entries, and a batch brings only a few new keys.
    wanted: Vec<u64>,
}

fn slot_bytes(key: &[u8], value: Option<&[u8]>) -> usize {
    key.len() + value.map_or(0, <[u8]>::len)
}

/// `bytes` after a value of `old` bytes became one of `new`.
fn resized(bytes: usize, old: Option<&[u8]>, new: Option<&[u8]>) -> usize {
    (bytes + new.map_or(0, <[u8]>::len)).saturating_sub(old.map_or(0, <[u8]>::len))
}

impl<B: Backend> Store<B> {
    pub(crate) const fn new(backend: B) -> Self {
        Store {
            backend,
            entries: HashTable::new(),
            dirty: 0,
            bytes: 0,
            max_held: 0,
            holding: None,
            parked: Vec::new(),
            wanted: Vec::new(),
        }
    }

    /// The host's `hold-state`: it will ask for what the store holds, so
    /// from now on calls for a shard may leave up to `max_bytes` here.
    pub(crate) fn allow_holding(&mut self, max_bytes: usize) {
        self.max_held = max_bytes;
    }

    /// Starts a call for `shard` (`None`: a call without one, or a host that
    /// does not ask for held state back): the shard's held entries, if any,
    /// become the cache; another shard's are parked.
    pub(crate) fn begin(&mut self, shard: Option<u32>) {
        let shard = shard.filter(|_| self.max_held > 0);
        // The same shard's held entries, or a call's own cache after one
        // (empty, as the last call ended it, but with its table's
        // allocation: growing it again every batch was a good part of the
        // guest's time).
        if shard == self.holding {
            return;
        }
        let entries = std::mem::take(&mut self.entries);
        let dirty = std::mem::take(&mut self.dirty);
        let bytes = std::mem::take(&mut self.bytes);
        // An empty table keeps its allocation for the next cache: a held
        // shard's grows to thousands of entries, and growing it again after
        // every write-back would rehash them each time.
        let mut spare = None;
        match self.holding.take() {
            Some(held) if !entries.is_empty() => self.parked.push((held, Cache { entries, dirty, bytes })),
            _ if entries.is_empty() => spare = Some(entries),
            // A call's own cache ends with the call: nothing is left but
            // what a failed call dropped already.
            _ => {}
        }
        let parked = shard.and_then(|shard| self.parked.iter().position(|(s, _)| *s == shard));
        match parked {
            Some(at) => {
                let (_, cache) = self.parked.swap_remove(at);
                self.entries = cache.entries;
                self.dirty = cache.dirty;
                self.bytes = cache.bytes;
            }
            // Not for a call's own cache, which stays small: a scan's flush
            // looks at every bucket of it.
            None if shard.is_some() => self.entries = spare.unwrap_or_default(),
            None => {}
        }
        self.holding = shard;
    }

    /// Ends a call that succeeded: a shard's entries stay held while the
    /// store is within its bounds; anything else is written back
    /// ([`finish`](Self::finish)).
    pub(crate) fn end(&mut self) {
        let held = |entries: &Entries, bytes: usize| bytes + entries.len() * ENTRY_OVERHEAD;
        let held =
            self.parked.iter().map(|(_, c)| held(&c.entries, c.bytes)).sum::<usize>() + held(&self.entries, self.bytes);
        if self.holding.is_some() && held <= self.max_held {
            return;
        }
        self.finish();
        self.holding = None;
    }

    /// The host's `flush-state` for `shard`: writes back what the store
    /// holds of it and forgets it.
    pub(crate) fn give_back(&mut self, shard: u32) {
        self.begin(Some(shard));
        self.finish();
        self.holding = None;
    }

    #[cfg(test)]
    pub(crate) fn backend(&self) -> &B {
        &self.backend
    }

    /// Calls `f` with the value of `key` (`None` when absent), fetching it
    /// with one `state.get` if the cache does not know it.
    pub(crate) fn read_with<R>(&mut self, key: &[u8], f: impl FnOnce(Option<&[u8]>) -> R) -> R {
        self.read_at(key, f).0
    }

    /// [`read_with`](Self::read_with), also returning where in the cache
    /// `key` is, for a [`write_from`](Self::write_from) of it that follows
    /// (a read-modify-write then looks the key up once).
    pub(crate) fn read_at<R>(&mut self, key: &[u8], f: impl FnOnce(Option<&[u8]>) -> R) -> (R, Option<usize>) {
        let hash = hash(key);
        if let Some(at) = self.entries.find_bucket_index(hash, |(k, _)| same_key(k, key))
            && let Some((_, slot)) = self.entries.get_bucket_mut(at)
        {
            if !slot.fetched {
                // Wanted, never fetched (a prefetch that stopped halfway):
                // its `None` is no answer, so ask the host now.
                let value = self.backend.get(key).map(Bytes::from_vec);
                self.bytes += value.as_ref().map_or(0, |v| v.len());
                *slot = Slot::clean(value, hash);
            }
            return (f(slot.value.as_deref()), Some(at));
        }
        let value = self.backend.get(key).map(Bytes::from_vec);
        let result = f(value.as_deref());
        self.bytes += slot_bytes(key, value.as_deref());
        self.entries.insert_unique(hash, (Bytes::from_slice(key), Slot::clean(value, hash)), |(_, slot)| slot.hash);
        (result, None)
    }

    /// Puts `key` in the cache, to be loaded by
    /// [`fetch_wanted`](Self::fetch_wanted) with the other new keys in one
    /// `state.get-many`, if the cache does not know it. From a borrowed
    /// buffer: a key the cache knows (most, when it holds the shard's
    /// state) costs a lookup and no allocation.
    pub(crate) fn want(&mut self, key: &[u8]) {
        let hash = hash(key);
        if let Entry::Vacant(vacant) = entry(&mut self.entries, hash, key) {
            self.bytes += key.len();
            vacant.insert((Bytes::from_slice(key), Slot { value: None, dirty: false, fetched: false, hash }));
            self.wanted.push(hash);
        }
    }

    /// Loads the keys [`want`](Self::want) added with one `state.get-many`.
    ///
    /// Each unknown key went into the cache at once, marked unfetched: one
    /// hash lookup per key, which also drops repeats (a set of the missing
    /// keys, then the inserts, took three). A call's own cache holds little
    /// but the wanted keys, and one pass over it finds them for less than a
    /// lookup each; a held shard's holds thousands of entries where a batch
    /// brings a few new keys, and those are found by their hashes, without
    /// comparing keys. Two wanted keys of one hash (FxHash is not
    /// DoS-resistant) then find the same slot, and the other stays
    /// unfetched, for a read to fetch alone.
    pub(crate) fn fetch_wanted(&mut self) -> Result<()> {
        if self.wanted.is_empty() {
            return Ok(());
        }
        if self.entries.len() <= 2 * self.wanted.len() {
            self.wanted.clear();
            // The table's order does not change between the two passes.
            let keys: Vec<&[u8]> =
                self.entries.iter().filter(|(_, slot)| !slot.fetched).map(|(key, _)| key.as_slice()).collect();
            let values = ask(&mut self.backend, &keys);
            let values = self.fetched_or_forget(values)?;
            for ((_, slot), value) in self.entries.iter_mut().filter(|(_, slot)| !slot.fetched).zip(values) {
                self.bytes += fill(slot, value);
            }
        } else {
            let entries = &self.entries;
            let found: Vec<(usize, &[u8])> = self
                .wanted
                .drain(..)
                .filter_map(|hash| {
                    let at = entries.find_bucket_index(hash, |(_, slot)| !slot.fetched && slot.hash == hash)?;
                    entries.get_bucket(at).map(|(key, _)| (at, key.as_slice()))
                })
                .collect();
            let keys: Vec<&[u8]> = found.iter().map(|&(_, key)| key).collect();
            let at: Vec<usize> = found.iter().map(|&(at, _)| at).collect();
            let values = ask(&mut self.backend, &keys);
            let values = self.fetched_or_forget(values)?;
            // Nothing changed the table since the slots were found.
            for (at, value) in at.into_iter().zip(values) {
                if let Some((_, slot)) = self.entries.get_bucket_mut(at)
                    && !slot.fetched
                {
                    self.bytes += fill(slot, value);
                }
            }
        }
        Ok(())
    }

    /// The values a `get-many` returned, or its error after dropping every
    /// unfetched key: none may stay behind to pass for absent.
    fn fetched_or_forget(&mut self, values: Result<Vec<Option<Bytes>>>) -> Result<Vec<Option<Bytes>>> {
        values.inspect_err(|_| self.entries.retain(|(_, slot)| slot.fetched))
    }

    /// Sets (`Some`) or deletes (`None`) `key` in the cache and marks it dirty.
    pub(crate) fn write(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        let (key, value) = (Bytes::from_vec(key), value.map(Bytes::from_vec));
        let hash = hash(&key);
        match entry(&mut self.entries, hash, &key) {
            Entry::Occupied(mut occupied) => {
                let (_, slot) = occupied.get_mut();
                if slot.make_dirty(value.as_deref(), &mut self.dirty) {
                    self.bytes = resized(self.bytes, slot.value.as_deref(), value.as_deref());
                    slot.value = value;
                }
            }
            Entry::Vacant(vacant) => {
                self.bytes += slot_bytes(&key, value.as_deref());
                vacant.insert((key, Slot { value, dirty: true, fetched: true, hash }));
                self.dirty += 1;
            }
        }
    }

    /// [`write`](Self::write) from borrowed bytes: copies them over the
    /// cached value's buffer when the cache holds `key`, so a
    /// read-modify-write of a prefetched key allocates nothing.
    ///
    /// `at` is where [`read_at`](Self::read_at) found the key, if it did;
    /// checked, since anything may have happened to the cache in between.
    pub(crate) fn write_from(&mut self, at: Option<usize>, key: &[u8], value: Option<&[u8]>) {
        let at = at
            .filter(|&at| self.entries.get_bucket(at).is_some_and(|(k, _)| same_key(k, key)))
            .or_else(|| self.entries.find_bucket_index(hash(key), |(k, _)| same_key(k, key)));
        let Some((_, slot)) = at.and_then(|at| self.entries.get_bucket_mut(at)) else {
            self.write(key.to_vec(), value.map(<[u8]>::to_vec));
            return;
        };
        if !slot.make_dirty(value, &mut self.dirty) {
            return;
        }
        self.bytes = resized(self.bytes, slot.value.as_deref(), value);
        match (&mut slot.value, value) {
            (Some(old), Some(new)) => {
                old.clear();
                old.extend_from_slice(new);
            }
            (old, new) => *old = new.map(Bytes::from_slice),
        }
    }

    /// Sends pending writes with one `state.write` and keeps the cache.
    pub(crate) fn flush(&mut self) {
        if self.dirty == 0 {
            return;
        }
        let mut writes: Vec<Write<'_>> = Vec::with_capacity(self.dirty);
        for (key, slot) in self.entries.iter_mut().filter(|(_, slot)| slot.dirty) {
            slot.dirty = false;
            let slot: &Slot = slot;
            writes.push((key, slot.value.as_deref()));
        }
        self.dirty = 0;
        self.backend.write(&writes);
    }

    /// Ends a batch: sends pending writes with one `state.write` (none if
    /// nothing is dirty) and empties the cache, keeping its table's
    /// allocation for the next batch.
    pub(crate) fn finish(&mut self) {
        self.flush();
        self.entries.clear();
        self.bytes = 0;
        self.wanted.clear();
    }

    /// Ends a failed call: forgets the cache and every shard's unflushed
    /// writes (the host ends the instance and rolls the epoch back).
    pub(crate) fn discard(&mut self) {
        self.wanted.clear();
        self.entries.clear();
        self.dirty = 0;
        self.bytes = 0;
        self.parked.clear();
        self.holding = None;
    }

    /// One page of `state.scan-prefix`, after writing pending writes back so
    /// the host sees them.
    pub(crate) fn scan(&mut self, prefix: &[u8], start_after: Option<&[u8]>, limit: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
        if self.holding.is_some() {
            // Flushing looks at every entry, and a held shard's may be many:
            // write them back and start over, so that a transform that scans
            // per record costs what it did with a per-batch cache.
            self.finish();
        } else {
            self.flush();
        }
        self.backend.scan_prefix(prefix, start_after, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::super::backend::{Calls, Memory};
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn similar_keys_spread_over_buckets() {
        use std::hash::BuildHasher;
        // Keys that differ only in the high bytes of their last word.
        let buckets: HashSet<u64> =
            (0..1000).map(|i| FxBuild::new().hash_one(format!("count\0user-{i}").as_bytes()) & 1023).collect();
        assert!(buckets.len() > 500, "only {} of 1024 buckets used", buckets.len());
    }

    #[test]
    fn keys_compare_equal_exactly_when_their_bytes_do() {
        let base: Vec<u8> = (0..40u8).collect();
        for len in [0, 1, 7, 8, 9, 16, 28, 40] {
            let a = &base[..len];
            let copy: Vec<u8> = (0..len as u8).collect(); // equal bytes, another allocation
            assert!(same_key(a, &copy));
            for at in 0..len {
                let mut b = a.to_vec();
                b[at] ^= 0x80;
                assert!(!same_key(a, &b), "length {len}, differing at {at}");
            }
            if len > 0 {
                assert!(!same_key(a, &a[..len - 1]), "a prefix is another key");
            }
        }
    }

    /// Loads `keys` as the SDK's `prefetch` does.
    fn prefetch<B: Backend>(store: &mut Store<B>, keys: &[&str]) -> Result<()> {
        for key in keys {
            store.want(key.as_bytes());
        }
        store.fetch_wanted()
    }

    fn store_with(pairs: &[(&str, &str)]) -> Store<Memory> {
        let mut backend = Memory::new();
        for (k, v) in pairs {
            backend.map.insert(k.as_bytes().to_vec(), v.as_bytes().to_vec());
        }
        Store::new(backend)
    }

    fn read(store: &mut Store<Memory>, key: &str) -> Option<String> {
        store.read_with(key.as_bytes(), |v| v.map(|v| String::from_utf8_lossy(v).into_owned()))
    }

    #[test]
    fn reads_hit_the_host_once_per_key() {
        let mut s = store_with(&[("a", "1")]);
        assert_eq!(read(&mut s, "a").as_deref(), Some("1"));
        assert_eq!(read(&mut s, "a").as_deref(), Some("1"));
        assert_eq!(read(&mut s, "b"), None);
        assert_eq!(read(&mut s, "b"), None, "absence is cached too");
        assert_eq!(s.backend().calls, Calls { get: 2, ..Calls::default() });
    }

    #[test]
    fn a_wanted_key_never_fetched_is_not_taken_for_absent() {
        // A prefetch that stopped between `want` and `fetch_wanted` (an
        // error building a later key) leaves keys in the cache unfetched.
        let mut s = store_with(&[("a", "1"), ("b", "2")]);
        s.want(b"a");
        s.want(b"b");
        assert_eq!(read(&mut s, "a").as_deref(), Some("1"), "read from the host, not the placeholder");
        s.write(b"b".to_vec(), None);
        s.finish();
        assert!(!s.backend().map.contains_key(&b"b"[..]), "the delete of an unfetched key reaches the host");
        assert_eq!(s.backend().map.get(&b"a"[..]).map(Vec::as_slice), Some(&b"1"[..]));
    }

    #[test]
    fn writes_are_batched_into_one_call_at_the_end() {
        let mut s = store_with(&[("a", "1"), ("d", "x")]);
        for i in 0..100 {
            let n = read(&mut s, "a").map_or(0, |v| v.parse::<u32>().unwrap_or(0));
            s.write(b"a".to_vec(), Some((n + 1).to_string().into_bytes()));
            s.write(format!("k{i}").into_bytes(), Some(b"v".to_vec()));
        }
        s.write(b"d".to_vec(), None);
        assert_eq!(s.backend().calls.write, 0, "nothing is sent before the batch ends");
        s.finish();
        let calls = s.backend().calls;
        assert_eq!(calls, Calls { get: 1, write: 1, ..Calls::default() });
        assert_eq!(s.backend().map.get(&b"a"[..]).map(Vec::as_slice), Some(&b"101"[..]));
        assert!(!s.backend().map.contains_key(&b"d"[..]));
        assert_eq!(s.backend().map.len(), 101);
        // The cache is empty again: the next batch reads from the host.
        assert_eq!(read(&mut s, "a").as_deref(), Some("101"));
        assert_eq!(s.backend().calls.get, 2);
    }

    #[test]
    fn write_from_copies_over_the_cached_value() {
        let mut s = store_with(&[("a", "1"), ("c", "3")]);
        read(&mut s, "a");
        s.write_from(None, b"a", Some(b"1")); // what the host has: nothing to send
        s.write_from(None, b"c", Some(b"3")); // not cached: written, as `write` does
        assert_eq!(s.dirty, 1);
        s.write_from(None, b"a", Some(b"22"));
        assert_eq!(read(&mut s, "a").as_deref(), Some("22"));
        s.write_from(None, b"b", Some(b"new"));
        s.write_from(None, b"a", None);
        s.finish();
        assert_eq!(s.backend().calls, Calls { get: 1, write: 1, ..Calls::default() });
        let map = &s.backend().map;
        assert!(!map.contains_key(&b"a"[..]));
        assert_eq!(map.get(&b"b"[..]).map(Vec::as_slice), Some(&b"new"[..]));
        assert_eq!(map.get(&b"c"[..]).map(Vec::as_slice), Some(&b"3"[..]));
    }

    #[test]
    fn a_write_where_a_read_found_the_key_checks_it_is_still_there() {
        let mut s = store_with(&[("a", "1")]);
        let (_, at) = s.read_at(b"a", |_| ());
        assert_eq!(at, None, "a miss: fetched, not found in the cache");
        let (_, at) = s.read_at(b"a", |_| ());
        assert!(at.is_some());
        // The table grows meanwhile: `at` may now hold another key or none.
        for i in 0..1000 {
            s.write(format!("k{i}").into_bytes(), Some(b"x".to_vec()));
        }
        s.write_from(at, b"a", Some(b"2"));
        let (_, missing) = s.read_at(b"new", |_| ());
        s.write_from(missing, b"new", Some(b"3"));
        assert_eq!((read(&mut s, "a").as_deref(), read(&mut s, "new").as_deref()), (Some("2"), Some("3")));
        s.finish();
        let map = &s.backend().map;
        assert_eq!((map.get(&b"a"[..]).map(Vec::as_slice), map.len()), (Some(&b"2"[..]), 1002));
    }

    #[test]
    fn clean_batches_send_nothing() {
        let mut s = store_with(&[("a", "1")]);
        read(&mut s, "a");
        s.write(b"a".to_vec(), Some(b"1".to_vec())); // same as the host's value
        s.finish();
        assert_eq!(s.backend().calls.write, 0);
    }

    #[test]
    fn prefetch_is_one_call_for_the_batch() {
        let mut s = store_with(&[("a", "1"), ("b", "2")]);
        read(&mut s, "a");
        prefetch(&mut s, &["a", "b", "c", "b", "c"]).unwrap();
        prefetch(&mut s, &["a", "c"]).unwrap();
        assert_eq!(s.backend().calls, Calls { get: 1, get_many: 1, ..Calls::default() });
        assert_eq!(read(&mut s, "b").as_deref(), Some("2"));
        assert_eq!(read(&mut s, "c"), None);
        assert_eq!(s.backend().calls.total(), 2);
    }

    #[test]
    fn scans_see_pending_writes() {
        let mut s = store_with(&[("p1", "old"), ("p2", "gone"), ("q", "z")]);
        s.write(b"p1".to_vec(), Some(b"new".to_vec()));
        s.write(b"p2".to_vec(), None);
        s.write(b"p3".to_vec(), Some(b"added".to_vec()));
        let page = s.scan(b"p", None, 10);
        let keys: Vec<_> = page.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
        assert_eq!(keys, [(&b"p1"[..], &b"new"[..]), (b"p3", b"added")]);
        assert_eq!(s.backend().calls.write, 1);
        // Flushed entries stay cached and clean: nothing more to send.
        assert_eq!(read(&mut s, "p1").as_deref(), Some("new"));
        s.finish();
        assert_eq!(s.backend().calls, Calls { write: 1, scan_prefix: 1, ..Calls::default() });
    }

    #[test]
    fn discard_drops_unflushed_writes() {
        let mut s = store_with(&[("a", "1")]);
        s.write(b"a".to_vec(), Some(b"2".to_vec()));
        s.discard();
        s.finish();
        assert_eq!(s.backend().calls.write, 0);
        assert_eq!(read(&mut s, "a").as_deref(), Some("1"));
    }

    fn value(store: &Store<Memory>, key: &str) -> Option<String> {
        store.backend().map.get(key.as_bytes()).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// One call of `shard`'s: `f`, then the call's end.
    fn call(store: &mut Store<Memory>, shard: Option<u32>, f: impl FnOnce(&mut Store<Memory>)) {
        store.begin(shard);
        f(store);
        store.end();
    }

    #[test]
    fn a_shards_state_is_held_across_calls_until_the_host_asks_for_it() {
        let mut s = store_with(&[("a", "1")]);
        s.allow_holding(1 << 20);
        for n in 2..=4 {
            call(&mut s, Some(0), |s| {
                assert_eq!(read(s, "a"), Some((n - 1).to_string()));
                s.write(b"a".to_vec(), Some(n.to_string().into_bytes()));
            });
        }
        call(&mut s, Some(1), |s| s.write(b"b".to_vec(), Some(b"x".to_vec())));
        assert_eq!(s.backend().calls, Calls { get: 1, ..Calls::default() }, "one read, nothing written yet");
        assert_eq!(value(&s, "a").as_deref(), Some("1"));

        // Shard 0's again, after shard 1's: its held value, not the host's.
        call(&mut s, Some(0), |s| assert_eq!(read(s, "a").as_deref(), Some("4")));
        s.give_back(0);
        assert_eq!((value(&s, "a").as_deref(), value(&s, "b")), (Some("4"), None), "shard 0's only");
        s.give_back(1);
        assert_eq!(value(&s, "b").as_deref(), Some("x"));
        assert_eq!(s.backend().calls, Calls { get: 1, write: 2, ..Calls::default() });

        // Given back means forgotten: the next call reads from the host.
        call(&mut s, Some(0), |s| assert_eq!(read(s, "a").as_deref(), Some("4")));
        assert_eq!(s.backend().calls.get, 2);
    }

    /// Two 16-byte keys of one [`hash`]: the second's last word makes up
    /// for its first.
    fn keys_of_one_hash() -> (Vec<u8>, Vec<u8>) {
        let after_first_word = |word: u64| {
            let mut h = FxHasher::default();
            h.write_usize(16); // `[u8]`'s length prefix
            h.add(word);
            h.hash
        };
        let word = |w: &[u8; 8]| u64::from_le_bytes(*w);
        let (a1, a2, b1) = (word(b"wanted-k"), word(b"ey-one.."), word(b"another-"));
        let b2 = after_first_word(a1).rotate_left(5) ^ a2 ^ after_first_word(b1).rotate_left(5);
        let a = [a1.to_le_bytes(), a2.to_le_bytes()].concat();
        let b = [b1.to_le_bytes(), b2.to_le_bytes()].concat();
        (a, b)
    }

    #[test]
    fn a_held_table_finds_a_batchs_new_keys_by_their_hashes() {
        let (a, b) = keys_of_one_hash();
        assert_eq!((hash(&a), a == b), (hash(&b), false), "two keys of one hash");
        let mut s = store_with(&[("new", "n"), ("k1", "v1")]);
        s.backend.map.insert(a.clone(), b"A".to_vec());
        s.backend.map.insert(b.clone(), b"B".to_vec());
        s.allow_holding(1 << 20);
        let held: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
        call(&mut s, Some(0), |s| prefetch(s, &held.iter().map(String::as_str).collect::<Vec<_>>()).unwrap());
        call(&mut s, Some(0), |s| {
            for key in [&a[..], &b[..], b"new", b"k1"] {
                s.want(key);
            }
            s.fetch_wanted().unwrap();
            assert_eq!(s.backend().calls, Calls { get_many: 2, ..Calls::default() });
            let read_bytes = |s: &mut Store<Memory>, key: &[u8]| s.read_with(key, |v| v.map(<[u8]>::to_vec));
            assert_eq!(read_bytes(s, &a).as_deref(), Some(&b"A"[..]));
            assert_eq!(read_bytes(s, &b).as_deref(), Some(&b"B"[..]));
            assert_eq!((read(s, "new").as_deref(), read(s, "k1").as_deref()), (Some("n"), Some("v1")));
            // One of the two keys of one hash was left unfetched, not taken
            // for absent: a read asked for it alone.
            assert_eq!(s.backend().calls, Calls { get_many: 2, get: 1, ..Calls::default() });
        });
    }

    #[test]
    fn held_calls_read_what_a_plain_map_of_the_same_writes_holds() {
        // Calls of 64 counter updates over 3,000 keys, each prefetched, held
        // from call to call (so the table soon holds thousands of entries
        // and a call's new keys are found by their hashes) and given back
        // now and then, as a job's checkpoints do.
        let mut s = store_with(&[]);
        s.allow_holding(1 << 24);
        let mut model: std::collections::HashMap<Vec<u8>, u64> = std::collections::HashMap::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let (mut calls, mut given_back) = (0, 0);
        for round in 0..400 {
            let keys: Vec<Vec<u8>> = (0..64)
                .map(|_| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    format!("count\0user-{}", (x >> 33) % 3000).into_bytes()
                })
                .collect();
            call(&mut s, Some(0), |s| {
                for key in &keys {
                    s.want(key);
                }
                s.fetch_wanted().unwrap();
                for key in &keys {
                    let n = s.read_with(key, |v| v.map_or(0, |v| String::from_utf8_lossy(v).parse::<u64>().unwrap()));
                    assert_eq!(n, model.get(key).copied().unwrap_or(0), "call {round}");
                    s.write(key.clone(), Some((n + 1).to_string().into_bytes()));
                    *model.entry(key.clone()).or_default() += 1;
                }
            });
            calls += 1;
            if round % 97 == 96 {
                s.give_back(0);
                given_back += 1;
            }
        }
        s.give_back(0);
        assert_eq!(s.backend().map.len(), model.len());
        for (key, n) in &model {
            assert_eq!(s.backend().map.get(key).map(Vec::as_slice), Some(n.to_string().as_bytes()));
        }
        // Every read was served from the cache: each call's new keys were
        // found and fetched with its one get-many, never one at a time.
        let Calls { get, get_many, write, .. } = s.backend().calls;
        assert_eq!((get, write), (0, given_back + 1));
        assert!(get_many <= calls, "{get_many} get-many calls for {calls} calls");
    }

    #[test]
    fn nothing_is_held_unless_the_host_asks_for_it_back() {
        let mut s = store_with(&[]);
        call(&mut s, Some(0), |s| s.write(b"a".to_vec(), Some(b"1".to_vec())));
        assert_eq!(value(&s, "a").as_deref(), Some("1"), "an older host: written back at the call's end");
        s.allow_holding(1 << 20);
        call(&mut s, Some(0), |s| s.write(b"held".to_vec(), Some(b"1".to_vec())));
        // A call without a shard (on-timers, migrate) parks the held shard
        // and writes its own writes back at its end.
        call(&mut s, None, |s| s.write(b"own".to_vec(), Some(b"2".to_vec())));
        assert_eq!((value(&s, "own").as_deref(), value(&s, "held")), (Some("2"), None));
        s.give_back(0);
        assert_eq!(value(&s, "held").as_deref(), Some("1"));
    }

    #[test]
    fn a_scan_sees_the_held_writes_and_starts_the_cache_over() {
        let mut s = store_with(&[("p1", "old")]);
        s.allow_holding(1 << 20);
        call(&mut s, Some(0), |s| s.write(b"p1".to_vec(), Some(b"new".to_vec())));
        call(&mut s, Some(0), |s| {
            s.write(b"p2".to_vec(), Some(b"2".to_vec()));
            let page = s.scan(b"p", None, 10);
            assert_eq!(page.len(), 2);
            assert_eq!(page[0].1, b"new");
            assert!(s.entries.is_empty(), "a scan does not look through a whole epoch's entries each time");
            s.write(b"p3".to_vec(), Some(b"3".to_vec()));
        });
        assert_eq!(value(&s, "p3"), None, "still held");
        s.give_back(0);
        assert_eq!(value(&s, "p3").as_deref(), Some("3"));
    }

    #[test]
    fn past_its_bound_the_store_writes_back_at_the_calls_end() {
        let mut s = store_with(&[]);
        // Room for 100 entries of 8-byte keys and 28-byte values.
        s.allow_holding(100 * (ENTRY_OVERHEAD + 36));
        let fill = |s: &mut Store<Memory>, from: usize, to: usize| {
            for i in from..to {
                s.write(format!("key{i:05}").into_bytes(), Some(vec![0; 28]));
            }
        };
        call(&mut s, Some(0), |s| fill(s, 0, 60));
        call(&mut s, Some(1), |s| fill(s, 60, 100));
        assert_eq!(s.backend().calls.write, 0, "100 entries fit");
        call(&mut s, Some(1), |s| fill(s, 100, 101));
        assert_eq!(s.backend().calls.write, 1, "shard 1's 41st took the store past its bound");
        assert_eq!(s.backend().map.len(), 41);
        assert_eq!(s.parked.len(), 1, "shard 0's stay parked");
        call(&mut s, Some(1), |s| fill(s, 101, 102));
        assert_eq!(s.backend().calls.write, 1, "room again");
        s.give_back(0);
        s.give_back(1);
        assert_eq!(s.backend().map.len(), 102);
    }

    #[test]
    fn a_failed_call_drops_every_held_shard() {
        let mut s = store_with(&[]);
        s.allow_holding(1 << 20);
        call(&mut s, Some(0), |s| s.write(b"a".to_vec(), Some(b"1".to_vec())));
        s.begin(Some(1));
        s.write(b"b".to_vec(), Some(b"2".to_vec()));
        s.discard();
        s.give_back(0);
        s.give_back(1);
        assert_eq!(s.backend().calls.total(), 0);
    }

    #[derive(Default)]
    struct ShortHost;
    impl Backend for ShortHost {
        fn get(&mut self, _: &[u8]) -> Option<Vec<u8>> {
            None
        }
        fn get_many(&mut self, _: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
            Ok(Vec::new())
        }
        fn write(&mut self, _: &[Write<'_>]) {}
        fn scan_prefix(&mut self, _: &[u8], _: Option<&[u8]>, _: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
            Vec::new()
        }
    }

    #[test]
    fn a_misbehaving_host_is_an_error() {
        let mut s = Store::new(ShortHost);
        let e = prefetch(&mut s, &["a"]).unwrap_err();
        assert_eq!(e.message(), "host bug: state.get-many returned 0 values for 1 keys");
        assert!(s.entries.is_empty(), "no unfetched key is left to pass for absent");
    }
}
