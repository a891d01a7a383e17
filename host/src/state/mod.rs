//! A task's keyed state: the working set the guest reads and writes, with the
//! incremental deltas that checkpoints snapshot.
//!
//! Key types:
//! - [`TaskState`]: layers, newest first: the *open* delta (writes since the
//!   last barrier), the *frozen* deltas of checkpoints that are being written
//!   or are not yet folded into the backend, a cache of clean values, and the
//!   [`StateBackend`] (the committed base). A read takes the first layer that
//!   knows the key; a write goes to the open delta.
//! - [`Delta`]: the writes of one epoch, `None` for deletions.
//!   [`TaskState::freeze`] turns the open delta into a frozen one in O(1), so
//!   the barrier costs the task thread nothing however many keys changed; a
//!   checkpoint writes the frozen delta out in the background, and
//!   [`TaskState::release_through`] drops it once it is folded into the base.
//! - [`StateBackend`]: where committed state lives. [`EmptyBackend`] for a
//!   task that starts from nothing (tests, `sluice exec`).
//!
//! The working set never decides what is committed: it only remembers what
//! changed. Guests reach it only through the `state` import of their own
//! task, never through a handle to the backend.

use std::collections::{BTreeSet, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, OnceLock};

use foldhash::fast::RandomState;

/// An error from the state backend (I/O, corruption), with its cause.
#[derive(Debug, thiserror::Error)]
#[error("state backend: {0}")]
pub struct Error(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// The bytes the host keeps for one open write: key, value, and the hash
/// map's per-entry overhead (a deletion costs its key and the overhead too).
pub fn entry_bytes(key_len: usize, value_len: Option<usize>) -> usize {
    const ENTRY_OVERHEAD: usize = 64;
    key_len + value_len.unwrap_or(0) + ENTRY_OVERHEAD
}

/// Results of state operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a scan of the keys starting with `prefix`, after `start_after`,
/// begins: after `start_after` if that is within or past the prefix's
/// keys, else at the prefix (a `start_after` before it skips nothing of
/// it).
pub fn scan_start<'a>(prefix: &'a [u8], start_after: Option<&'a [u8]>) -> Bound<&'a [u8]> {
    match start_after {
        Some(after) if after >= prefix => Bound::Excluded(after),
        _ => Bound::Included(prefix),
    }
}

/// Committed state that the working set falls through to.
pub trait StateBackend: Send {
    /// The committed value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// The committed values of `keys`, in order, or `None` once they would
    /// hold more than `max_bytes`: one read for many keys where the backend
    /// can do better than a read per key.
    fn get_many(&self, keys: &[&[u8]], max_bytes: usize) -> Result<Option<Vec<Option<Vec<u8>>>>> {
        read_bounded(keys, max_bytes, |key| self.get(key))
    }

    /// Up to `limit` committed entries whose keys start with `prefix` and are
    /// greater than `start_after` (when given), in key order.
    fn scan(&self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
}

/// The values `read` gives for `keys`, in order, or `None` as soon as they
/// would hold more than `max_bytes`: a [`StateBackend::get_many`] one read
/// at a time.
pub(crate) fn read_bounded<E>(
    keys: &[&[u8]],
    max_bytes: usize,
    mut read: impl FnMut(&[u8]) -> std::result::Result<Option<Vec<u8>>, E>,
) -> std::result::Result<Option<Vec<Option<Vec<u8>>>>, E> {
    let mut bytes = 0usize;
    let mut values = Vec::with_capacity(keys.len());
    for key in keys {
        let value = read(key)?;
        bytes = bytes.saturating_add(value.as_ref().map_or(0, Vec::len));
        if bytes > max_bytes {
            return Ok(None);
        }
        values.push(value);
    }
    Ok(Some(values))
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

/// The writes of one epoch: key -> `Some(value)` stored, `None` deleted.
///
/// Hash maps rather than B-trees on the per-record path: state keys share
/// long prefixes (`name 0x00 ...`), which made B-tree comparisons the largest
/// cost of a stateful task. The hasher is seeded per process, so a guest
/// cannot choose keys that collide. Order is recovered where it is needed:
/// scans keep a sorted index of the open writes, snapshots sort on the writer
/// thread.
type Writes = hashbrown::HashMap<Vec<u8>, Option<Vec<u8>>, RandomState>;

/// Drops `writes` on a short-lived thread of its own (on this one if no
/// thread can be started): a large map's entries are freed one by one.
fn free_elsewhere(writes: Writes) {
    if writes.len() < 10_000 {
        return;
    }
    // A failed spawn drops the closure, and the map with it, here.
    let _ = std::thread::Builder::new().name("sluice-free".into()).spawn(move || drop(writes));
}

/// Decides which keys a task keeps in key order from the start of every
/// epoch (see [`TaskState::keep_ordered`]). Must hold for every extension
/// of a key it holds for, so that it can answer for a scan's prefix too.
pub type OrderedKeys = fn(&[u8]) -> bool;

/// How many prefixes one epoch's [`Order`] keeps in order before it keeps
/// every key in order instead: each new prefix costs a pass over the
/// epoch's writes, each kept key an insert per write.
const MAX_ORDERED_PREFIXES: usize = 16;

/// The keys of one epoch's writes in key order: the ones [`OrderedKeys`]
/// picks, those under the prefixes the guest scanned this epoch, or, once
/// it scanned more than [`MAX_ORDERED_PREFIXES`] of them, all of them.
///
/// Per scanned prefix, not all keys once the guest scans: a windowed count
/// scans the closing window's key range a few times an epoch, while nearly
/// all its writes go to the open windows' ranges, which nothing scans
/// then. Keeping every write in a B-tree (a key copy and a dozen key
/// comparisons each) was a tenth of such a task's CPU.
#[derive(Debug, Default, Clone)]
struct Order {
    keys: BTreeSet<Vec<u8>>,
    prefixes: Vec<Vec<u8>>,
    complete: bool,
}

impl Order {
    /// Whether `key` belongs in this order; for a scan's prefix, whether the
    /// scan can take its keys from it (every key under the prefix does).
    fn wants(&self, key: &[u8], ordered: OrderedKeys) -> bool {
        self.complete || ordered(key) || self.prefixes.iter().any(|p| key.starts_with(p))
    }

    /// Makes the order cover `prefix`, taking the keys under it from
    /// `writes` (the epoch's writes so far); all keys once that would make
    /// too many prefixes.
    fn cover(&mut self, prefix: &[u8], writes: &Writes) {
        if self.prefixes.len() >= MAX_ORDERED_PREFIXES {
            *self = Order { keys: writes.keys().cloned().collect(), prefixes: Vec::new(), complete: true };
            return;
        }
        self.keys.extend(writes.keys().filter(|k| k.starts_with(prefix)).cloned());
        self.prefixes.push(prefix.to_vec());
    }

    /// The order the next epoch starts with: empty, and complete if this
    /// one is (a transform that scanned that much will again).
    fn next_epoch(&self) -> Order {
        Order { keys: BTreeSet::new(), prefixes: Vec::new(), complete: self.complete }
    }
}

/// One delta's writes in a key range, in key order (`None`: deleted).
type Source<'a> = Box<dyn Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a>;

/// Several deltas' writes in one key range, merged in key order; where
/// they share a key, the newest (last) source's write wins.
struct Overlay<'a> {
    sources: Vec<std::iter::Peekable<Source<'a>>>,
}

impl<'a> Iterator for Overlay<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        let key = self.sources.iter_mut().filter_map(|s| s.peek().map(|(k, _)| *k)).min()?;
        let mut newest = None;
        for source in &mut self.sources {
            if source.peek().is_some_and(|(k, _)| *k == key) {
                newest = source.next();
            }
        }
        newest
    }
}

/// The writes of one checkpoint epoch. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Delta {
    writes: Arc<Writes>,
    /// The keys of `writes` the epoch kept in order (the due timers' range
    /// always, everything once the guest scanned): a scan of the frozen
    /// delta there costs O(log n + found), not a pass over every write, and
    /// with a complete order the checkpoint writer need not sort.
    order: Arc<Order>,
    /// All keys of `writes` in order, sorted by the first scan that `order`
    /// does not cover (a frozen delta never changes): later scans of it cost
    /// O(log n + found), not a pass over every write each. The SDKs' windows
    /// scan one window's range per firing, many times per epoch.
    sorted_keys: Arc<OnceLock<Vec<Vec<u8>>>>,
}

impl Delta {
    /// A delta of the given writes.
    pub fn new(entries: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>) -> Self {
        Delta { writes: Arc::new(entries.into_iter().collect()), order: Arc::default(), sorted_keys: Arc::default() }
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// How many keys changed.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// The writes in key order (sorted now: O(n log n)); `None` deletes.
    pub fn sorted(&self) -> Vec<(&[u8], Option<&[u8]>)> {
        if self.order.complete {
            return self
                .order
                .keys
                .iter()
                .filter_map(|k| self.writes.get(k).map(|v| (k.as_slice(), v.as_deref())))
                .collect();
        }
        let mut entries: Vec<(&[u8], Option<&[u8]>)> =
            self.writes.iter().map(|(k, v)| (k.as_slice(), v.as_deref())).collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        entries
    }

    /// The writes in no particular order; `None` deletes.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.writes.iter().map(|(k, v)| (k.as_slice(), v.as_deref()))
    }

    /// The writes as owned pairs, in key order.
    pub fn to_vec(&self) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        self.sorted().into_iter().map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec))).collect()
    }

    fn get(&self, key: &[u8]) -> Option<&Option<Vec<u8>>> {
        self.writes.get(key)
    }
}

/// The write to `key` in the newest frozen delta that has one (`Some(None)`:
/// deleted). A function of the deltas alone, so that a caller may go on to
/// borrow the task state's other layers.
fn newest_frozen<'a>(frozen: &'a VecDeque<(u64, Delta)>, key: &[u8]) -> Option<Option<&'a [u8]>> {
    frozen.iter().rev().find_map(|(_, delta)| delta.get(key)).map(Option::as_deref)
}

/// The working set of one task.
pub struct TaskState {
    /// Writes since the last barrier.
    open: Writes,
    /// Host memory `open` takes, by [`entry_bytes`].
    open_bytes: usize,
    /// The keys of `open` in order: those `ordered` picks (the host's
    /// timers), and all of them once a scan elsewhere asked for it. Most
    /// guests never scan, and then their writes pay nothing for order.
    open_order: Order,
    /// Which keys every epoch keeps in order.
    ordered: OrderedKeys,
    /// Deltas frozen at a barrier and not yet folded into the backend, oldest
    /// first, with their checkpoint ids.
    frozen: VecDeque<(u64, Delta)>,
    /// Committed values (`None`: known absent): read from the backend, or
    /// taken over from a frozen delta when it is released after its fold. A
    /// key here may be stale only while a newer write to it sits in the open
    /// or a frozen delta, which shadow it.
    clean: Writes,
    /// Bytes of keys and values in `clean` (an upper bound: a replaced
    /// entry's old bytes are counted until the next eviction).
    clean_bytes: usize,
    backend: Box<dyn StateBackend>,
    /// Every key the backend holds is in a layer above it, so a key that no
    /// layer knows is absent without asking the backend: true from a start
    /// on an empty backend (a fresh task) until the clean cache is evicted.
    whole: bool,
    /// The state-size limit, when the task has one.
    quota: Option<Quota>,
    /// The largest entry (key plus value, as stored) a write may make: one
    /// changelog record must hold it.
    max_entry_bytes: Option<usize>,
}

/// A limit on the bytes (keys plus values) a task's state may hold, and what
/// it holds now.
#[derive(Debug, Clone, Copy)]
struct Quota {
    limit: u64,
    used: u64,
}

/// A write refused because the state would exceed its size limit.
#[derive(Debug, thiserror::Error)]
#[error(
    "state size limit exceeded: this write would make the task's state {would_be} bytes, over its limit of {limit} bytes"
)]
pub struct QuotaExceeded {
    /// The limit.
    pub limit: u64,
    /// The size the write would have led to.
    pub would_be: u64,
}

impl std::fmt::Debug for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskState")
            .field("open", &self.open.len())
            .field("frozen", &self.frozen.iter().map(|(id, d)| (*id, d.len())).collect::<Vec<_>>())
            .field("clean", &self.clean.len())
            .finish()
    }
}

impl TaskState {
    /// An empty state with nothing committed.
    pub fn in_memory() -> Self {
        TaskState::with_backend(Box::new(EmptyBackend))
    }

    /// A working set over committed state in `backend`.
    pub fn with_backend(backend: Box<dyn StateBackend>) -> Self {
        TaskState {
            open: Writes::default(),
            open_bytes: 0,
            open_order: Order::default(),
            ordered: |_| false,
            frozen: VecDeque::new(),
            clean: Writes::default(),
            clean_bytes: 0,
            backend,
            whole: false,
            quota: None,
            max_entry_bytes: None,
        }
    }

    /// Notes that the backend holds nothing now: every key the task reads
    /// from here on is one it wrote, or absent, and a read of a key no
    /// layer knows asks the backend nothing (until an eviction). Call it
    /// only before the first write.
    pub fn start_empty(&mut self) {
        self.whole = true;
    }

    /// Keeps the keys `ordered` picks in key order from the start of every
    /// epoch, so that scans of them (a shard's due timers) cost O(log n +
    /// found) without every other write paying for order.
    pub fn keep_ordered(&mut self, ordered: OrderedKeys) {
        self.ordered = ordered;
        let (open, order) = (&self.open, &mut self.open_order);
        if !order.complete {
            order.keys = open.keys().filter(|k| order.wants(k, ordered)).cloned().collect();
        }
    }

    /// Limits the state to `limit` bytes of keys and values, given that the
    /// committed state holds `used` bytes now. Writes must then be
    /// [`charge`](Self::charge)d before they are made.
    pub fn limit_size(&mut self, limit: u64, used: u64) {
        self.quota = Some(Quota { limit, used });
    }

    /// Limits each entry (key plus value) to `max` bytes: with a changelog,
    /// a write must fit one Kafka record.
    pub fn limit_entry(&mut self, max: usize) {
        self.max_entry_bytes = Some(max);
    }

    /// The largest entry a write may make, if limited.
    pub fn max_entry_bytes(&self) -> Option<usize> {
        self.max_entry_bytes
    }

    /// Bytes of keys and values the state holds, when it is size-limited.
    pub fn size(&self) -> Option<u64> {
        self.quota.map(|q| q.used)
    }

    /// Accounts for storing a value of `value_len` bytes (`None`: removing)
    /// under `key`, refusing a write that would take the state over its
    /// limit. Costs one lookup of the old value; free without a limit.
    pub fn charge(&mut self, key: &[u8], value_len: Option<usize>) -> Result<Result<(), QuotaExceeded>> {
        let Some(quota) = self.quota else { return Ok(Ok(())) };
        let entry = |value: usize| (key.len() + value) as u64;
        let old = self.get(key)?.map(|v| entry(v.len())).unwrap_or(0);
        let new = value_len.map(entry).unwrap_or(0);
        let would_be = quota.used.saturating_sub(old).saturating_add(new);
        if new > old && would_be > quota.limit {
            return Ok(Err(QuotaExceeded { limit: quota.limit, would_be }));
        }
        self.quota = Some(Quota { used: would_be, ..quota });
        Ok(Ok(()))
    }

    /// The current value of `key`.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<&[u8]>> {
        if let Some(value) = self.open.get(key) {
            return Ok(value.as_deref());
        }
        if let Some(value) = newest_frozen(&self.frozen, key) {
            return Ok(value);
        }
        let value = match self.clean.entry_ref(key) {
            hashbrown::hash_map::EntryRef::Occupied(known) => known.into_mut(),
            hashbrown::hash_map::EntryRef::Vacant(_) if self.whole => return Ok(None),
            hashbrown::hash_map::EntryRef::Vacant(unknown) => {
                let value = self.backend.get(key)?;
                self.clean_bytes += key.len() + value.as_ref().map_or(0, Vec::len);
                unknown.insert(value)
            }
        };
        Ok(value.as_deref())
    }

    /// The current values of `keys`, in order, or `None` once they would
    /// hold more than `max_bytes`. The keys no layer knows are read from the
    /// backend with one [`StateBackend::get_many`], in key order, into the
    /// clean cache.
    pub fn get_many(&mut self, keys: &[&[u8]], max_bytes: usize) -> Result<Option<Vec<Option<Vec<u8>>>>> {
        let mut values = Vec::with_capacity(keys.len());
        let whole = self.get_many_with(keys, max_bytes, |value| values.push(value.map(<[u8]>::to_vec)))?;
        Ok(whole.then_some(values))
    }

    /// [`get_many`](Self::get_many), handing each value to `each` in order
    /// instead of copying it out: `false` (having handed over some) once the
    /// values would hold more than `max_bytes`. A key is looked up once
    /// while every key so far is known; from the first unknown one on, the
    /// rest are fetched and looked up again.
    pub fn get_many_with(
        &mut self,
        keys: &[&[u8]],
        max_bytes: usize,
        mut each: impl FnMut(Option<&[u8]>),
    ) -> Result<bool> {
        let mut bytes = 0usize;
        let mut hand = |value: Option<&[u8]>| {
            bytes = bytes.saturating_add(value.map_or(0, <[u8]>::len));
            let fits = bytes <= max_bytes;
            if fits {
                each(value);
            }
            fits
        };
        let mut done = 0;
        for key in keys {
            let value = match self.known(key) {
                Some(value) => value,
                None if self.whole => None,
                None => break,
            };
            if !hand(value) {
                return Ok(false);
            }
            done += 1;
        }
        let rest = &keys[done..];
        if rest.is_empty() {
            return Ok(true);
        }
        let mut wanted: Vec<&[u8]> = rest.iter().copied().filter(|key| self.known(key).is_none()).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let Some(fetched) = self.backend.get_many(&wanted, max_bytes)? else { return Ok(false) };
        for (key, value) in wanted.into_iter().zip(fetched) {
            self.clean_bytes += key.len() + value.as_ref().map_or(0, Vec::len);
            self.clean.insert(key.to_vec(), value);
        }
        for key in rest {
            if !hand(self.known(key).flatten()) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The value of `key` if a layer above the backend knows it: the open
    /// writes, the frozen deltas newest first, the clean cache.
    fn known(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        match self.open.get(key) {
            Some(value) => Some(value.as_deref()),
            None => newest_frozen(&self.frozen, key).or_else(|| self.clean.get(key).map(Option::as_deref)),
        }
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
    ///
    /// Removing a key that the layers below the open writes are known not to
    /// hold (a window or timer made and closed within one epoch) drops its
    /// open write instead of recording a deletion: the epoch then never
    /// changed it, so the checkpoint writes, logs and folds nothing for it.
    pub fn write(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        if value.is_none() && self.absent_below_open(&key) {
            if let Some(old) = self.open.remove(&key) {
                self.open_bytes -= entry_bytes(key.len(), old.as_ref().map(Vec::len));
                self.open_order.keys.remove(&key);
            }
            // The cache keeps live keys, not the absence of every key that
            // came and went (a later read asks the backend again).
            if let hashbrown::hash_map::EntryRef::Occupied(known) = self.clean.entry_ref(key.as_slice())
                && known.get().is_none()
            {
                known.remove();
                self.clean_bytes = self.clean_bytes.saturating_sub(key.len());
            }
            return;
        }
        if self.open_order.wants(&key, self.ordered) && !self.open.contains_key(&key) {
            self.open_order.keys.insert(key.clone());
        }
        let key_len = key.len();
        self.open_bytes += entry_bytes(key_len, value.as_ref().map(Vec::len));
        if let Some(old) = self.open.insert(key, value) {
            self.open_bytes -= entry_bytes(key_len, old.as_ref().map(Vec::len));
        }
    }

    /// Whether the frozen deltas and the clean cache, newest first, know that
    /// `key` is absent (without asking the backend).
    fn absent_below_open(&self, key: &[u8]) -> bool {
        match newest_frozen(&self.frozen, key) {
            Some(value) => value.is_none(),
            None => matches!(self.clean.get(key), Some(None)),
        }
    }

    /// Host memory the writes since the last barrier take, by
    /// [`entry_bytes`].
    pub fn open_bytes(&self) -> usize {
        self.open_bytes
    }

    /// Up to `limit` entries whose keys start with `prefix`, in key order,
    /// after `start_after` when given: the deltas over the backend.
    ///
    /// Stops early once the entries hold more than `max_bytes` bytes, so a
    /// caller can tell the page was too large without the host having built
    /// all of it.
    pub fn scan_prefix(
        &mut self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        // The deltas' writes in this range, merged lazily in key order,
        // newest wins: a page costs O(log n + what it reads), however many
        // writes (due timers, say) lie further on in the range.
        let lower = scan_start(prefix, start_after);
        let mut sources: Vec<Source<'_>> = Vec::with_capacity(self.frozen.len() + 1);
        // Frozen deltas oldest first, then the open writes: later sources win.
        let ordered = self.ordered;
        for (_, delta) in &self.frozen {
            let writes = &delta.writes;
            sources.push(match delta.order.wants(prefix, ordered) {
                true => Box::new(
                    delta
                        .order
                        .keys
                        .range::<[u8], _>((lower, Bound::Unbounded))
                        .take_while(move |k| k.starts_with(prefix))
                        .filter_map(move |k| writes.get(k).map(|v| (k.as_slice(), v.as_deref()))),
                ),
                // A delta frozen before the guest first scanned keeps only
                // the host's keys in order: sort all its keys, once.
                false => {
                    let keys = delta.sorted_keys.get_or_init(|| {
                        let mut keys: Vec<Vec<u8>> = writes.keys().cloned().collect();
                        keys.sort_unstable();
                        keys
                    });
                    // Keys before the range, then the range's keys in order.
                    let first = keys.partition_point(|k| {
                        k.as_slice() < prefix || start_after.is_some_and(|after| k.as_slice() <= after)
                    });
                    Box::new(
                        keys[first..]
                            .iter()
                            .take_while(move |k| k.starts_with(prefix))
                            .filter_map(move |k| writes.get(k).map(|v| (k.as_slice(), v.as_deref()))),
                    )
                }
            });
        }
        // The open writes through their order, made to cover this prefix
        // on the first scan of it.
        let open = &self.open;
        if !self.open_order.wants(prefix, ordered) {
            self.open_order.cover(prefix, open);
        }
        sources.push(Box::new(
            self.open_order
                .keys
                .range::<[u8], _>((lower, Bound::Unbounded))
                .take_while(move |k| k.starts_with(prefix))
                .filter_map(move |k| open.get(k).map(|v| (k.as_slice(), v.as_deref()))),
        ));
        let overlay = Overlay { sources: sources.into_iter().map(Iterator::peekable).collect() };
        // Merge the overlay with the backend, paging through the backend;
        // keys the overlay knows are answered from it.
        let mut out = Vec::new();
        let mut overlay = overlay.peekable();
        let mut cursor: Option<Vec<u8>> = start_after.map(<[u8]>::to_vec);
        let page = limit.clamp(16, 1024);
        let mut below: std::vec::IntoIter<(Vec<u8>, Vec<u8>)> = Vec::new().into_iter();
        let mut below_done = false;
        let mut below_next: Option<(Vec<u8>, Vec<u8>)> = None;
        let mut bytes = 0usize;
        while out.len() < limit && bytes <= max_bytes {
            if below_next.is_none() {
                below_next = below.next();
                if below_next.is_none() && !below_done {
                    let fetched = self.backend.scan(prefix, cursor.as_deref(), page)?;
                    below_done = fetched.len() < page;
                    below = fetched.into_iter();
                    below_next = below.next();
                }
            }
            let take_overlay = match (overlay.peek(), &below_next) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((a, _)), Some((b, _))) => *a <= b.as_slice(),
            };
            if take_overlay {
                let Some((key, value)) = overlay.next() else { break };
                if let Some(value) = value {
                    bytes += key.len() + value.len();
                    out.push((key.to_vec(), value.to_vec()));
                }
                if below_next.as_ref().is_some_and(|(b, _)| b.as_slice() == key) {
                    below_next = None;
                }
                cursor = Some(key.to_vec());
            } else if let Some((key, value)) = below_next.take() {
                cursor = Some(key.clone());
                bytes += key.len() + value.len();
                out.push((key, value));
            }
        }
        Ok(out)
    }

    /// The barrier of checkpoint `id`: the writes since the previous barrier
    /// become a frozen delta, in O(1). Reads keep seeing it until
    /// [`release_through`](Self::release_through) drops it.
    pub fn freeze(&mut self, id: u64) -> Delta {
        // The open order goes with the writes.
        let next = self.open_order.next_epoch();
        let order = Arc::new(std::mem::replace(&mut self.open_order, next));
        // The next epoch's map starts at this one's size: an epoch's writes
        // are much like the last one's, and growing from empty rehashed
        // every key several times and touched fresh memory each time.
        let next = Writes::with_capacity_and_hasher(self.open.len(), RandomState::default());
        let delta =
            Delta { writes: Arc::new(std::mem::replace(&mut self.open, next)), order, sorted_keys: Arc::default() };
        self.open_bytes = 0;
        if !delta.is_empty() {
            self.frozen.push_back((id, delta.clone()));
        }
        delta
    }

    /// Releases the frozen deltas up to checkpoint `id`: call only once they
    /// are folded into the backend, which then answers for the keys they
    /// deleted. Their values become the clean cache's, so the next epoch
    /// reads them from memory rather than from the backend.
    pub fn release_through(&mut self, id: u64) {
        while self.frozen.front().is_some_and(|(frozen, _)| *frozen <= id) {
            let Some((_, delta)) = self.frozen.pop_front() else { break };
            // The writer dropped its handle once the delta was written, so
            // this is normally a move, not a copy.
            let writes = Arc::try_unwrap(delta.writes).unwrap_or_else(|shared| (*shared).clone());
            if writes.len() > self.clean.len() {
                self.release_by_swap(writes);
            } else {
                self.release_by_insert(writes);
            }
        }
    }

    /// Releases `writes` into a clean cache at least as big: each write is
    /// hashed into the cache.
    fn release_by_insert(&mut self, writes: Writes) {
        for (key, value) in writes {
            match value {
                Some(value) => {
                    self.clean_bytes += key.len() + value.len();
                    self.clean.insert(key, Some(value));
                }
                // A deleted key leaves the cache rather than staying in
                // it as absent: deleted keys (closed windows, fired
                // timers, expired entries) are rarely read again, and
                // keeping each one would grow the cache without bound.
                // The backend, folded already, answers if one is.
                None => {
                    if let Some(old) = self.clean.remove(&key) {
                        let old_bytes = key.len() + old.as_ref().map_or(0, Vec::len);
                        self.clean_bytes = self.clean_bytes.saturating_sub(old_bytes);
                    }
                }
            }
        }
    }

    /// Releases `writes` into a smaller clean cache: `writes` becomes the
    /// cache (a move) and its deletions leave it, taking the old cache's
    /// entry for the same key with them, in one pass that hashes only into
    /// the old cache; then the old cache's other entries (known-absent keys
    /// included) are hashed in. The result is what
    /// [`release_by_insert`](Self::release_by_insert) leaves, but a million
    /// dirty keys released into an empty cache cost the task thread a pass
    /// over them, not a million inserts.
    fn release_by_swap(&mut self, writes: Writes) {
        let mut older = std::mem::replace(&mut self.clean, writes);
        let mut bytes = 0;
        self.clean.retain(|key, value| match value {
            Some(value) => {
                bytes += key.len() + value.len();
                true
            }
            None => {
                older.remove(key.as_slice());
                false
            }
        });
        for (key, value) in older {
            // The delta's entry is newer.
            if let hashbrown::hash_map::Entry::Vacant(vacant) = self.clean.entry(key) {
                bytes += vacant.key().len() + value.as_ref().map_or(0, Vec::len);
                vacant.insert(value);
            }
        }
        self.clean_bytes = bytes;
    }

    /// Empties the clean cache if it holds more than `max_bytes` bytes of
    /// keys and values; later reads fetch from the backend again. Safe at
    /// any time. The cache's memory is freed on a thread of its own: a
    /// cache over its bound holds hundreds of thousands of entries, and
    /// freeing them one by one would hold up the task.
    pub fn evict_clean_over(&mut self, max_bytes: usize) {
        if self.clean_bytes > max_bytes {
            let evicted = std::mem::take(&mut self.clean);
            self.clean_bytes = 0;
            self.whole = false;
            free_elsewhere(evicted);
        }
    }

    /// How many keys changed since the last barrier.
    pub fn open_len(&self) -> usize {
        self.open.len()
    }

    /// How many frozen deltas await their fold.
    pub fn frozen_len(&self) -> usize {
        self.frozen.len()
    }
}

#[cfg(test)]
mod tests;
