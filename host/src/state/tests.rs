use super::*;
use std::collections::BTreeMap;

/// Committed state held in a map, to test the working set's fall-through.
struct MapBackend(BTreeMap<Vec<u8>, Vec<u8>>);

impl StateBackend for MapBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.0.get(key).cloned())
    }
    fn scan(&self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let lower = scan_start(prefix, start_after);
        Ok(self
            .0
            .range::<[u8], _>((lower, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

fn kv(k: &str, v: &str) -> (Vec<u8>, Vec<u8>) {
    (k.as_bytes().to_vec(), v.as_bytes().to_vec())
}

fn backend(pairs: &[(&str, &str)]) -> Box<dyn StateBackend> {
    Box::new(MapBackend(pairs.iter().map(|(k, v)| kv(k, v)).collect()))
}

#[test]
fn set_get_delete() -> Result<()> {
    let mut state = TaskState::in_memory();
    assert_eq!(state.get(b"a")?, None);
    state.set(b"a".to_vec(), b"1".to_vec());
    assert_eq!(state.get(b"a")?, Some(&b"1"[..]));
    state.set(b"a".to_vec(), b"2".to_vec());
    assert_eq!(state.get(b"a")?, Some(&b"2"[..]));
    state.delete(b"a".to_vec());
    assert_eq!(state.get(b"a")?, None);
    Ok(())
}

#[test]
fn a_frozen_delta_holds_each_changed_key_once_sorted_with_deletions() -> Result<()> {
    let mut state = TaskState::with_backend(backend(&[("gone", "x"), ("kept", "y")]));
    state.set(b"b".to_vec(), b"1".to_vec());
    state.set(b"a".to_vec(), b"1".to_vec());
    state.set(b"b".to_vec(), b"2".to_vec());
    state.delete(b"gone".to_vec());
    assert_eq!(state.get(b"kept")?, Some(&b"y"[..]), "reads fall through to the backend");
    assert_eq!(state.open_len(), 3);
    let delta = state.freeze(1);
    assert_eq!(
        delta.to_vec(),
        vec![(b"a".to_vec(), Some(b"1".to_vec())), (b"b".to_vec(), Some(b"2".to_vec())), (b"gone".to_vec(), None),]
    );
    assert_eq!(state.open_len(), 0);
    assert!(state.freeze(2).is_empty(), "a second delta without writes is empty");
    // The frozen delta still answers reads: the deletion must not fall
    // through to the backend's stale value before it is folded.
    assert_eq!(state.get(b"gone")?, None);
    assert_eq!(state.get(b"b")?, Some(&b"2"[..]));
    state.set(b"a".to_vec(), b"3".to_vec());
    assert_eq!(state.get(b"a")?, Some(&b"3"[..]), "the open delta wins over frozen ones");
    assert_eq!(state.freeze(3).to_vec(), vec![(b"a".to_vec(), Some(b"3".to_vec()))]);
    assert_eq!(state.frozen_len(), 2);
    state.release_through(1);
    assert_eq!(state.frozen_len(), 1);
    assert_eq!(state.get(b"a")?, Some(&b"3"[..]));
    Ok(())
}

#[test]
fn a_released_delta_becomes_the_cache_not_the_stale_backend_value() -> Result<()> {
    // The backend stands for a base that has not been folded: if the
    // working set fell through to it for "k" it would read "old".
    let mut state = TaskState::with_backend(backend(&[("k", "old")]));
    assert_eq!(state.get(b"k")?, Some(&b"old"[..]));
    state.set(b"k".to_vec(), b"new".to_vec());
    state.delete(b"gone".to_vec());
    state.freeze(1);
    assert_eq!(state.get(b"k")?, Some(&b"new"[..]));
    state.release_through(1);
    assert_eq!(state.frozen_len(), 0);
    assert_eq!(state.get(b"k")?, Some(&b"new"[..]), "the released value, not the cached old one");
    assert_eq!(state.get(b"gone")?, None);
    Ok(())
}

#[test]
fn a_key_made_and_removed_within_an_epoch_leaves_nothing_to_checkpoint() -> Result<()> {
    let mut state = TaskState::with_backend(backend(&[("old", "x")]));
    state.keep_ordered(|k| k.starts_with(b"t"));
    // Read first (as the guest does for a new window): known absent.
    assert_eq!(state.get(b"window")?, None);
    state.set(b"window".to_vec(), b"1".to_vec());
    state.delete(b"window".to_vec());
    // Deleted in a frozen epoch, made again and removed in the open one.
    state.set(b"tgone".to_vec(), b"".to_vec());
    state.freeze(1);
    state.delete(b"tgone".to_vec());
    state.freeze(2);
    state.set(b"tgone".to_vec(), b"".to_vec());
    state.delete(b"tgone".to_vec());
    // Neither key is in the epoch's writes, the cache or the timers' order.
    assert_eq!((state.open_len(), state.open_bytes()), (0, 0));
    assert!(state.open_order.keys.is_empty());
    assert!(!state.clean.contains_key(&b"window"[..]), "no cached absence of a key that came and went");
    assert_eq!(state.scan_prefix(b"t", None, 10, usize::MAX)?, vec![]);
    // A key the backend holds, or may hold, still gets its deletion.
    assert_eq!(state.get(b"old")?, Some(&b"x"[..]));
    state.set(b"old".to_vec(), b"y".to_vec());
    state.delete(b"old".to_vec());
    state.set(b"unread".to_vec(), b"1".to_vec());
    state.delete(b"unread".to_vec());
    assert_eq!(state.freeze(3).to_vec(), vec![(b"old".to_vec(), None), (b"unread".to_vec(), None)]);
    assert_eq!(state.get(b"old")?, None);
    Ok(())
}

/// A backend that answers only `get_many`: a single `get` is an error.
struct ManyOnly(MapBackend);

impl StateBackend for ManyOnly {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Err(Error(format!("get({}) instead of get_many", String::from_utf8_lossy(key)).into()))
    }
    fn get_many(&self, keys: &[&[u8]], max_bytes: usize) -> Result<Option<Vec<Option<Vec<u8>>>>> {
        assert!(keys.is_sorted() && keys.windows(2).all(|w| w[0] != w[1]), "distinct, in key order: {keys:?}");
        let values: Vec<_> = keys.iter().map(|key| self.0.get(key)).collect::<Result<_>>()?;
        Ok((values.iter().flatten().map(Vec::len).sum::<usize>() <= max_bytes).then_some(values))
    }
    fn scan(&self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.0.scan(prefix, start_after, limit)
    }
}

#[test]
fn get_many_reads_the_unknown_keys_with_one_call() -> Result<()> {
    let committed = MapBackend([kv("a", "1"), kv("b", "2"), kv("big", "0123456789")].into_iter().collect());
    let mut state = TaskState::with_backend(Box::new(ManyOnly(committed)));
    state.set(b"b".to_vec(), b"new".to_vec());
    let values = state.get_many(&[b"c", b"b", b"a", b"c", b"a"], 100)?;
    let expected = [None, Some(&b"new"[..]), Some(b"1"), None, Some(b"1")].map(|v| v.map(<[u8]>::to_vec));
    assert_eq!(values.as_deref(), Some(&expected[..]));
    assert_eq!(state.clean.len(), 2, "b was known, so not fetched");
    assert_eq!(state.get(b"a")?, Some(&b"1"[..]), "cached: no get");
    assert!(state.get(b"d").is_err(), "an unknown key still goes to the backend");
    // Known keys before an unknown one are handed over in order too.
    let values = state.get_many(&[b"b", b"a", b"big", b"b"], 100)?;
    let expected = [Some(&b"new"[..]), Some(b"1"), Some(b"0123456789"), Some(b"new")].map(|v| v.map(<[u8]>::to_vec));
    assert_eq!(values.as_deref(), Some(&expected[..]));
    assert_eq!(state.clean.len(), 3, "big fetched, with the one call");
    // The bound holds for known and fetched values alike, repeats included.
    assert_eq!(state.get_many(&[b"a", b"a", b"a"], 2)?, None);
    assert_eq!(state.get_many(&[b"big"], 9)?, None);
    assert_eq!(state.get_many(&[b"big", b"big"], 10)?, None);
    Ok(())
}

#[test]
fn released_deletions_leave_the_cache() -> Result<()> {
    let mut state = TaskState::in_memory();
    for i in 0..100u32 {
        state.set(format!("k{i}").into_bytes(), b"v".to_vec());
    }
    state.freeze(1);
    state.release_through(1);
    assert_eq!(state.clean.len(), 100);
    for i in 0..100u32 {
        state.delete(format!("k{i}").into_bytes());
    }
    state.freeze(2);
    state.release_through(2);
    assert!(state.clean.is_empty(), "the cache holds {} deleted keys", state.clean.len());
    assert_eq!(state.clean_bytes, 0);
    assert_eq!(state.get(b"k1")?, None);
    Ok(())
}

#[test]
fn a_delta_released_into_a_smaller_cache_keeps_the_newest_of_each_key() -> Result<()> {
    let committed = MapBackend([kv("a", "base"), kv("gone", "base")].into_iter().collect());
    let mut state = TaskState::with_backend(Box::new(committed));
    // The cache: a (clean, from the backend), missing (known absent from
    // the backend), b and gone (released).
    assert_eq!(state.get(b"a")?, Some(&b"base"[..]));
    assert_eq!(state.get(b"missing")?, None);
    state.set(b"b".to_vec(), b"old".to_vec());
    state.set(b"gone".to_vec(), b"old".to_vec());
    state.freeze(1);
    state.release_through(1);
    assert_eq!(state.clean.len(), 4);
    // A bigger delta: b changes, gone is deleted, c..z are new.
    state.set(b"b".to_vec(), b"new".to_vec());
    state.delete(b"gone".to_vec());
    for c in b'c'..=b'z' {
        state.set(vec![c], b"v".to_vec());
    }
    state.freeze(2);
    state.release_through(2);
    assert_eq!(state.get(b"a")?, Some(&b"base"[..]), "an entry only the old cache had stays");
    assert_eq!(state.get(b"b")?, Some(&b"new"[..]), "the delta's value wins");
    assert_eq!(state.clean.get(&b"gone"[..]), None, "a deletion leaves the cache");
    assert_eq!(state.clean.get(&b"missing"[..]), Some(&None), "a key known absent stays known absent");
    assert_eq!(state.clean.len(), 3 + 24);
    assert_eq!(state.clean_bytes, "abase".len() + "missing".len() + "bnew".len() + 24 * 2);
    // The backend has not seen the fold in this test: a real fold removes
    // `gone` there, so the cache must not have kept the old value.
    assert_eq!(state.get(b"gone")?, Some(&b"base"[..]), "read through to the backend");
    Ok(())
}

#[test]
fn scan_merges_working_set_over_backend() -> Result<()> {
    let mut state = TaskState::with_backend(backend(&[("p/1", "b1"), ("p/2", "b2"), ("p/4", "b4"), ("q/1", "other")]));
    state.set(b"p/3".to_vec(), b"w3".to_vec());
    state.set(b"p/2".to_vec(), b"w2".to_vec());
    state.delete(b"p/4".to_vec());
    state.set(b"o".to_vec(), b"before the prefix".to_vec());
    let all = state.scan_prefix(b"p/", None, 100, usize::MAX)?;
    assert_eq!(all, vec![kv("p/1", "b1"), kv("p/2", "w2"), kv("p/3", "w3")]);
    // Writes after a scan, before and across a barrier, are seen by the next.
    state.set(b"p/0".to_vec(), b"w0".to_vec());
    state.freeze(1);
    state.delete(b"p/2".to_vec());
    state.set(b"p/5".to_vec(), b"w5".to_vec());
    let all = state.scan_prefix(b"p/", None, 100, usize::MAX)?;
    assert_eq!(all, vec![kv("p/0", "w0"), kv("p/1", "b1"), kv("p/3", "w3"), kv("p/5", "w5")]);
    Ok(())
}

#[test]
fn scan_pages_with_start_after() -> Result<()> {
    let pairs: Vec<(String, String)> = (0..100).map(|i| (format!("k/{i:03}"), format!("{i}"))).collect();
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut state = TaskState::with_backend(backend(&refs));
    for i in (0..100).step_by(3) {
        state.delete(format!("k/{i:03}").into_bytes());
    }
    state.set(b"k/050x".to_vec(), b"new".to_vec());
    let mut seen = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = state.scan_prefix(b"k/", after.as_deref(), 7, usize::MAX)?;
        if page.is_empty() {
            break;
        }
        after = page.last().map(|(k, _)| k.clone());
        seen.extend(page);
    }
    let mut expected: Vec<(Vec<u8>, Vec<u8>)> =
        (0..100).filter(|i| i % 3 != 0).map(|i| kv(&format!("k/{i:03}"), &format!("{i}"))).collect();
    expected.push(kv("k/050x", "new"));
    expected.sort();
    assert_eq!(seen, expected);
    Ok(())
}

/// Three layers over the backend (a delta frozen before anything scanned,
/// so without order; one frozen after, with it; the open writes) that
/// write and delete the same keys: every page of a scan sees the newest
/// write of each key, as a plain map of all the writes in order does.
#[test]
fn scan_pages_see_the_newest_write_across_frozen_deltas() -> Result<()> {
    let pairs: Vec<(String, String)> = (0..60).map(|i| (format!("t/{i:02}"), format!("b{i}"))).collect();
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut state = TaskState::with_backend(backend(&refs));
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> =
        pairs.iter().map(|(k, v)| (k.clone().into_bytes(), v.clone().into_bytes())).collect();
    let mut write = |state: &mut TaskState, i: usize, layer: &str| {
        let key = format!("t/{i:02}").into_bytes();
        if (i + layer.len()).is_multiple_of(4) {
            state.delete(key.clone());
            model.remove(&key);
        } else {
            let value = format!("{layer}{i}").into_bytes();
            state.set(key.clone(), value.clone());
            model.insert(key, value);
        }
    };
    for i in (0..80).step_by(2) {
        write(&mut state, i, "first");
    }
    state.freeze(1);
    assert_eq!(state.scan_prefix(b"t/", None, 1, usize::MAX)?.len(), 1, "a scan: `t/` keeps order this epoch");
    for i in (0..80).step_by(3) {
        write(&mut state, i, "second");
    }
    state.freeze(2);
    for i in (0..80).step_by(5) {
        write(&mut state, i, "open");
    }
    let expected: Vec<(Vec<u8>, Vec<u8>)> = model.into_iter().collect();
    for page in [1, 2, 7, 100] {
        let mut seen = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let got = state.scan_prefix(b"t/", after.as_deref(), page, usize::MAX)?;
            if got.is_empty() {
                break;
            }
            after = got.last().map(|(k, _)| k.clone());
            seen.extend(got);
        }
        assert_eq!(seen, expected, "pages of {page}");
    }
    Ok(())
}

/// With the host's keys (`h/`) kept in order and the guest's (`g/`) not,
/// scans of either see every layer's newest writes, and a frozen delta
/// that kept only the host's keys in order still hands the checkpoint
/// writer all of its keys, sorted.
#[test]
fn scans_see_every_write_when_only_the_hosts_keys_keep_order() -> Result<()> {
    let mut state = TaskState::with_backend(backend(&[("g/0", "b"), ("h/0", "b")]));
    state.keep_ordered(|key| key.starts_with(b"h/"));
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = [kv("g/0", "b"), kv("h/0", "b")].into_iter().collect();
    let mut set = |state: &mut TaskState, key: &str, value: &str| {
        state.set(key.as_bytes().to_vec(), value.as_bytes().to_vec());
        model.insert(key.as_bytes().to_vec(), value.as_bytes().to_vec());
    };
    for i in (1..20).rev() {
        set(&mut state, &format!("g/{i:02}"), "first");
        set(&mut state, &format!("h/{i:02}"), "first");
    }
    // A scan of the host's keys leaves the guest's unordered.
    assert_eq!(state.scan_prefix(b"h/", None, 1, usize::MAX)?, vec![kv("h/0", "b")]);
    let first = state.freeze(1);
    let sorted: Vec<&[u8]> = first.sorted().into_iter().map(|(k, _)| k).collect();
    assert_eq!(sorted.len(), 38, "every key of the delta, not only the ordered ones");
    assert!(sorted.is_sorted());
    for i in (5..25).step_by(2) {
        set(&mut state, &format!("g/{i:02}"), "open");
        set(&mut state, &format!("h/{i:02}"), "open");
    }
    let range = |prefix: &str| -> Vec<(Vec<u8>, Vec<u8>)> {
        model.iter().filter(|(k, _)| k.starts_with(prefix.as_bytes())).map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    assert_eq!(state.scan_prefix(b"h/", None, 100, usize::MAX)?, range("h/"));
    assert_eq!(state.scan_prefix(b"g/", None, 100, usize::MAX)?, range("g/"));
    // Once the guest scanned, later writes keep order too.
    state.set(b"g/000".to_vec(), b"late".to_vec());
    let mut expected = range("g/");
    expected.insert(1, kv("g/000", "late"));
    assert_eq!(state.scan_prefix(b"g/", None, 100, usize::MAX)?, expected);
    Ok(())
}

/// A scan keeps in order only the writes under its prefix, for the rest of
/// the epoch; writes elsewhere pay nothing for order; scans of other
/// prefixes, and of the next epoch, still see every write; past
/// `MAX_ORDERED_PREFIXES` prefixes the epoch keeps every key in order.
#[test]
fn scans_keep_order_under_their_prefixes_only() -> Result<()> {
    let mut state = TaskState::in_memory();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    fn set(state: &mut TaskState, model: &mut BTreeMap<Vec<u8>, Vec<u8>>, key: String) {
        state.set(key.clone().into_bytes(), b"v".to_vec());
        model.insert(key.into_bytes(), b"v".to_vec());
    }
    for i in (0..10).rev() {
        set(&mut state, &mut model, format!("w/1/{i}"));
        set(&mut state, &mut model, format!("w/2/{i}"));
    }
    assert_eq!(state.scan_prefix(b"w/1/", None, 100, usize::MAX)?.len(), 10);
    set(&mut state, &mut model, "w/1/5a".into());
    set(&mut state, &mut model, "w/2/5a".into());
    let ordered: Vec<&[u8]> = state.open_order.keys.iter().map(Vec::as_slice).collect();
    assert!(ordered.iter().all(|k| k.starts_with(b"w/1/")), "only the scanned range: {ordered:?}");
    assert_eq!(ordered.len(), 11);
    let range = |model: &BTreeMap<Vec<u8>, Vec<u8>>, prefix: &[u8]| -> Vec<(Vec<u8>, Vec<u8>)> {
        model.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    assert_eq!(state.scan_prefix(b"w/1/", None, 100, usize::MAX)?, range(&model, b"w/1/"));
    assert_eq!(state.scan_prefix(b"w/2/", None, 100, usize::MAX)?, range(&model, b"w/2/"));
    // The next epoch starts with no order; the frozen delta still scans.
    state.freeze(1);
    assert!(state.open_order.prefixes.is_empty() && !state.open_order.complete);
    set(&mut state, &mut model, "w/2/0a".into());
    assert!(state.open_order.keys.is_empty());
    assert_eq!(state.scan_prefix(b"w/2/", None, 100, usize::MAX)?, range(&model, b"w/2/"));
    // Many prefixes: every key kept in order from then on.
    for i in 0..=super::MAX_ORDERED_PREFIXES {
        set(&mut state, &mut model, format!("x/{i:02}/k"));
        state.scan_prefix(format!("x/{i:02}/").as_bytes(), None, 100, usize::MAX)?;
    }
    assert!(state.open_order.complete);
    assert_eq!(state.open_order.keys.len(), state.open_len());
    assert_eq!(state.scan_prefix(b"", None, 1000, usize::MAX)?, range(&model, b""));
    Ok(())
}

/// A backend that counts the keys it is asked to read (`get_many` is the
/// trait's, a `get` per key).
struct Counting(MapBackend, std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl StateBackend for Counting {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.get(key)
    }
    fn scan(&self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.0.scan(prefix, start_after, limit)
    }
}

/// A task that started on an empty backend knows every key it wrote: a key
/// no layer knows is absent without a backend read, through freezes, folds
/// and deletes, until the clean cache is evicted.
#[test]
fn a_state_started_empty_reads_its_backend_only_after_an_eviction() -> Result<()> {
    let reads = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // What the folds put in the backend: the task's own writes.
    let mut state = TaskState::with_backend(Box::new(Counting(MapBackend(BTreeMap::new()), reads.clone())));
    state.start_empty();
    state.set(b"a".to_vec(), b"1".to_vec());
    state.set(b"b".to_vec(), b"2".to_vec());
    state.freeze(1);
    state.release_through(1);
    state.delete(b"b".to_vec());
    state.freeze(2);
    state.release_through(2);
    assert_eq!(state.get(b"a")?, Some(&b"1"[..]));
    assert_eq!(state.get(b"b")?, None, "deleted");
    assert_eq!(state.get(b"never")?, None);
    let values = state.get_many(&[b"a", b"never", b"b"], 100)?;
    assert_eq!(values, Some(vec![Some(b"1".to_vec()), None, None]));
    assert_eq!(reads.load(std::sync::atomic::Ordering::Relaxed), 0, "no backend read");
    assert!(!state.clean.contains_key(&b"never"[..]), "an absent key takes no memory");

    state.evict_clean_over(0);
    assert_eq!(state.get(b"never")?, None);
    assert_eq!(reads.load(std::sync::atomic::Ordering::Relaxed), 1, "after an eviction the backend answers");
    Ok(())
}

/// `scan-prefix` with a `start-after` before the prefix starts at the
/// prefix, from the working set and the backend alike (before, it returned
/// nothing: its range began before the prefix and ended at once).
#[test]
fn a_start_after_before_the_prefix_scans_from_the_prefix() -> Result<()> {
    let mut state = TaskState::with_backend(backend(&[("a", "x"), ("p/1", "b1"), ("p/3", "b3")]));
    state.set(b"p/2".to_vec(), b"w2".to_vec());
    let all = vec![kv("p/1", "b1"), kv("p/2", "w2"), kv("p/3", "b3")];
    assert_eq!(state.scan_prefix(b"p/", Some(b"a"), 100, usize::MAX)?, all);
    assert_eq!(state.scan_prefix(b"p/", Some(b""), 100, usize::MAX)?, all);
    state.freeze(1);
    assert_eq!(state.scan_prefix(b"p/", Some(b"a"), 100, usize::MAX)?, all, "across a barrier");
    // After the prefix's keys, nothing.
    assert_eq!(state.scan_prefix(b"p/", Some(b"q"), 100, usize::MAX)?, vec![]);
    Ok(())
}
