//! The per-batch state cache: the SDK's performance centre.
//!
//! A boundary crossing costs ~150-250 ns, a map lookup in the guest a few
//! dozen, so [`Store`] keeps every key it has touched during the batch:
//!
//! - a read is served from the cache; a miss costs one `state.get`, and
//!   [`Store::prefetch`] loads many keys with one `state.get-many`;
//! - a write or delete only updates the cache and marks the key dirty
//!   (writing back the value the cache already holds from the host is a
//!   no-op);
//! - [`Store::finish`], at the end of a batch, sends every dirty entry with
//!   one `state.write` and empties the cache;
//! - [`Store::scan`] first flushes pending writes (one `state.write`) so the
//!   host's `scan-prefix` sees them;
//! - [`Store::discard`], when a hook fails, drops the batch's unflushed
//!   writes: the host fails the batch anyway.
//!
//! It must never hold on to anything across batches: the host may roll state
//! back between them. The store is a thread-local, reached through
//! [`with`]; user code never runs while it is borrowed.
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

use super::backend::Backend;
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
    value: Option<Vec<u8>>,
    dirty: bool,
    /// False only inside [`Store::prefetch`], for a key it has yet to
    /// fetch.
    fetched: bool,
}

impl Slot {
    const fn clean(value: Option<Vec<u8>>) -> Slot {
        Slot { value, dirty: false, fetched: true }
    }

    /// Before writing `value` here: marks the slot dirty, counting it in
    /// `dirty` the first time, and says whether to write at all (not when a
    /// clean slot holds exactly `value`, which the host has already).
    fn make_dirty(&mut self, value: Option<&[u8]>, dirty: &mut usize) -> bool {
        if self.dirty {
            return true;
        }
        if self.value.as_deref() == value {
            return false;
        }
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
type Entries = HashTable<(Vec<u8>, Slot)>;

fn find<'a>(entries: &'a Entries, key: &[u8]) -> Option<&'a Slot> {
    entries.find(hash(key), |(k, _)| same_key(k, key)).map(|(_, slot)| slot)
}

fn find_mut<'a>(entries: &'a mut Entries, key: &[u8]) -> Option<&'a mut Slot> {
    entries.find_mut(hash(key), |(k, _)| same_key(k, key)).map(|(_, slot)| slot)
}

fn entry<'a>(entries: &'a mut Entries, key: &[u8]) -> Entry<'a, (Vec<u8>, Slot)> {
    entries.entry(hash(key), |(k, _)| same_key(k, key), |(k, _)| hash(k))
}

/// A backend with a write-back cache in front of it.
#[derive(Debug)]
pub(crate) struct Store<B> {
    backend: B,
    entries: Entries,
    dirty: usize,
}

impl<B: Backend> Store<B> {
    pub(crate) const fn new(backend: B) -> Self {
        Store { backend, entries: HashTable::new(), dirty: 0 }
    }

    #[cfg(test)]
    pub(crate) fn backend(&self) -> &B {
        &self.backend
    }

    /// Calls `f` with the value of `key` (`None` when absent), fetching it
    /// with one `state.get` if the cache does not know it.
    pub(crate) fn read_with<R>(&mut self, key: &[u8], f: impl FnOnce(Option<&[u8]>) -> R) -> R {
        if let Some(slot) = find(&self.entries, key) {
            return f(slot.value.as_deref());
        }
        let value = self.backend.get(key);
        let result = f(value.as_deref());
        self.entries.insert_unique(hash(key), (key.to_vec(), Slot::clean(value)), |(k, _)| hash(k));
        result
    }

    /// Loads every key the cache does not know yet with one `state.get-many`
    /// (none if it knows them all).
    pub(crate) fn prefetch(&mut self, keys: impl IntoIterator<Item = Vec<u8>>) -> Result<()> {
        // Each unknown key goes into the cache at once, marked unfetched:
        // one hash lookup per key, which also drops repeats (a set of the
        // missing keys, then the inserts, took three).
        let mut unfetched = 0;
        for key in keys {
            if let Entry::Vacant(vacant) = entry(&mut self.entries, &key) {
                vacant.insert((key, Slot { value: None, dirty: false, fetched: false }));
                unfetched += 1;
            }
        }
        if unfetched == 0 {
            return Ok(());
        }
        // The cache holds one batch's keys, and its order does not change
        // between this pass and the one that fills the values in.
        let wanted: Vec<&[u8]> =
            self.entries.iter().filter(|(_, slot)| !slot.fetched).map(|(key, _)| key.as_slice()).collect();
        let values = self.backend.get_many(&wanted);
        let values = match values {
            Ok(values) if values.len() == unfetched => values,
            // Nothing unfetched may stay behind to pass for absent.
            Ok(values) => {
                self.entries.retain(|(_, slot)| slot.fetched);
                return Err(Error::new(format!(
                    "host bug: state.get-many returned {} values for {unfetched} keys",
                    values.len()
                )));
            }
            Err(e) => {
                self.entries.retain(|(_, slot)| slot.fetched);
                return Err(e);
            }
        };
        for ((_, slot), value) in self.entries.iter_mut().filter(|(_, slot)| !slot.fetched).zip(values) {
            *slot = Slot::clean(value);
        }
        Ok(())
    }

    /// Sets (`Some`) or deletes (`None`) `key` in the cache and marks it dirty.
    pub(crate) fn write(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        match entry(&mut self.entries, &key) {
            Entry::Occupied(mut occupied) => {
                let (_, slot) = occupied.get_mut();
                if slot.make_dirty(value.as_deref(), &mut self.dirty) {
                    slot.value = value;
                }
            }
            Entry::Vacant(vacant) => {
                vacant.insert((key, Slot { value, dirty: true, fetched: true }));
                self.dirty += 1;
            }
        }
    }

    /// [`write`](Self::write) from borrowed bytes: copies them over the
    /// cached value's buffer when the cache holds `key`, so a
    /// read-modify-write of a prefetched key allocates nothing.
    pub(crate) fn write_from(&mut self, key: &[u8], value: Option<&[u8]>) {
        let Some(slot) = find_mut(&mut self.entries, key) else {
            self.write(key.to_vec(), value.map(<[u8]>::to_vec));
            return;
        };
        if !slot.make_dirty(value, &mut self.dirty) {
            return;
        }
        match (&mut slot.value, value) {
            (Some(old), Some(new)) => {
                old.clear();
                old.extend_from_slice(new);
            }
            (old, new) => *old = new.map(<[u8]>::to_vec),
        }
    }

    /// Sends pending writes with one `state.write` and keeps the cache.
    pub(crate) fn flush(&mut self) {
        if self.dirty == 0 {
            return;
        }
        let mut writes = Vec::with_capacity(self.dirty);
        for (key, slot) in self.entries.iter_mut().filter(|(_, slot)| slot.dirty) {
            slot.dirty = false;
            writes.push((key.clone(), slot.value.clone()));
        }
        self.dirty = 0;
        self.backend.write(&writes);
    }

    /// Ends a batch: sends pending writes with one `state.write` (none if
    /// nothing is dirty) and empties the cache.
    pub(crate) fn finish(&mut self) {
        if self.dirty == 0 {
            self.entries.clear();
            return;
        }
        self.dirty = 0;
        // `drain` keeps the map's capacity for the next batch.
        let writes: Vec<_> =
            self.entries.drain().filter(|(_, slot)| slot.dirty).map(|(key, slot)| (key, slot.value)).collect();
        self.backend.write(&writes);
    }

    /// Ends a failed batch: forgets the cache and its unflushed writes.
    pub(crate) fn discard(&mut self) {
        self.entries.clear();
        self.dirty = 0;
    }

    /// One page of `state.scan-prefix`, after flushing pending writes so the
    /// host sees them.
    pub(crate) fn scan(&mut self, prefix: &[u8], start_after: Option<&[u8]>, limit: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.flush();
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
        s.write_from(b"a", Some(b"1")); // what the host has: nothing to send
        s.write_from(b"c", Some(b"3")); // not cached: written, as `write` does
        assert_eq!(s.dirty, 1);
        s.write_from(b"a", Some(b"22"));
        assert_eq!(read(&mut s, "a").as_deref(), Some("22"));
        s.write_from(b"b", Some(b"new"));
        s.write_from(b"a", None);
        s.finish();
        assert_eq!(s.backend().calls, Calls { get: 1, write: 1, ..Calls::default() });
        let map = &s.backend().map;
        assert!(!map.contains_key(&b"a"[..]));
        assert_eq!(map.get(&b"b"[..]).map(Vec::as_slice), Some(&b"new"[..]));
        assert_eq!(map.get(&b"c"[..]).map(Vec::as_slice), Some(&b"3"[..]));
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
        let keys = ["a", "b", "c", "b", "c"].map(|k| k.as_bytes().to_vec());
        s.prefetch(keys).unwrap();
        s.prefetch([b"a".to_vec(), b"c".to_vec()]).unwrap();
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

    #[derive(Default)]
    struct ShortHost;
    impl Backend for ShortHost {
        fn get(&mut self, _: &[u8]) -> Option<Vec<u8>> {
            None
        }
        fn get_many(&mut self, _: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
            Ok(Vec::new())
        }
        fn write(&mut self, _: &[(Vec<u8>, Option<Vec<u8>>)]) {}
        fn scan_prefix(&mut self, _: &[u8], _: Option<&[u8]>, _: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
            Vec::new()
        }
    }

    #[test]
    fn a_misbehaving_host_is_an_error() {
        let mut s = Store::new(ShortHost);
        let e = s.prefetch([b"a".to_vec()]).unwrap_err();
        assert_eq!(e.message(), "host bug: state.get-many returned 0 values for 1 keys");
        assert!(s.entries.is_empty(), "no unfetched key is left to pass for absent");
    }
}
