use super::*;
use crate::time::testing;

fn reset() {
    crate::state::tests::reset();
    testing::reset();
}

/// Moves the watermark to `at` and fires what is due through `fire`, as
/// the host would (round after round, while firing sets timers that are
/// due), collecting (key, start, end, value).
fn advance<A, W: IntoIterator<Item = Window<A>>>(
    at: i64,
    fire: impl Fn(&Timer) -> Result<W>,
) -> Vec<(String, i64, i64, A)> {
    testing::set_watermark(Some(at));
    let mut closed = Vec::new();
    loop {
        let due = testing::take_due();
        if due.is_empty() {
            return closed;
        }
        crate::time::new_call();
        for timer in due {
            for w in fire(&timer).unwrap() {
                closed.push((w.key_str().unwrap().to_owned(), w.start, w.end, w.value));
            }
        }
        finish_batch();
    }
}

/// What `windows` holds for `key` in the window starting at `start`.
fn stored<A: Serialize + DeserializeOwned>(windows: &Windows<A>, key: &str, start: i64) -> Option<A> {
    let entry = windows.state.entry_key(&window_id(start), key.as_bytes()).unwrap();
    crate::state::store::with(|s| Ok(s.read_with(&entry, |v| v.map(|v| serde_json::from_slice(v).unwrap())))).unwrap()
}

const TUMBLING: Windows<u64> = Windows::tumbling("t", Duration::from_millis(10));

#[test]
fn a_tumbling_window_fires_once_when_the_watermark_passes_its_end() {
    reset();
    for (key, ts) in [("a", 1), ("a", 9), ("b", 5), ("a", 10), ("a", -1)] {
        assert_eq!(TUMBLING.add(key, ts, |n| n.unwrap_or(0) + 1).unwrap(), 1);
    }
    assert_eq!(advance(-2, |t| TUMBLING.fire(t)), []);
    assert_eq!(advance(8, |t| TUMBLING.fire(t)), [("a".into(), -10, 0, 1)], "a window before 0 too");
    let mut closed = advance(9, |t| TUMBLING.fire(t));
    closed.sort();
    assert_eq!(closed, [("a".into(), 0, 10, 2), ("b".into(), 0, 10, 1)]);
    assert_eq!(TUMBLING.add("a", 3, |n| n.unwrap_or(0) + 1).unwrap(), 0, "its window has fired: too late");
    assert_eq!(testing::pending().len(), 1, "only [10, 20) is open");
    assert_eq!(advance(19, |t| TUMBLING.fire(t)), [("a".into(), 10, 20, 1)]);
    assert!(testing::pending().is_empty());
    assert_eq!(TUMBLING.fire(&Timer::event("t", 9)).unwrap(), [], "a fired window's state is gone");
    assert_eq!(TUMBLING.fire(&Timer::event("other", 9)).unwrap(), [], "another window's timer");
    assert_eq!(TUMBLING.fire(&Timer::processing("t", 19)).unwrap(), [], "a processing-time timer");
}

#[test]
fn allowed_lateness_keeps_a_window_open_and_still_fires_it_once() {
    reset();
    const LATE: Windows<u64> =
        Windows::tumbling("l", Duration::from_millis(10)).allowed_lateness(Duration::from_millis(5));
    LATE.add("k", 2, |n| n.unwrap_or(0) + 1).unwrap();
    assert_eq!(advance(12, |t| LATE.fire(t)), []);
    assert_eq!(LATE.add("k", 3, |n| n.unwrap_or(0) + 1).unwrap(), 1, "late, within the allowed lateness");
    assert_eq!(advance(14, |t| LATE.fire(t)), [("k".into(), 0, 10, 2)]);
}

#[test]
fn a_hopping_window_takes_each_record_into_every_window_that_holds_it() {
    reset();
    const HOPPING: Windows<Vec<i64>> = Windows::hopping("h", Duration::from_millis(10), Duration::from_millis(5));
    let push = |ts| move |v: Option<Vec<i64>>| [v.unwrap_or_default(), vec![ts]].concat();
    assert_eq!(HOPPING.add("k", 7, push(7)).unwrap(), 2, "in [0, 10) and [5, 15)");
    assert_eq!(HOPPING.add("k", 12, push(12)).unwrap(), 2, "in [5, 15) and [10, 20)");
    let closed = advance(30, |t| HOPPING.fire(t));
    assert_eq!(
        closed,
        [("k".into(), 0, 10, vec![7]), ("k".into(), 5, 15, vec![7, 12]), ("k".into(), 10, 20, vec![12])]
    );
}

fn batch(records: &[(&str, i64)]) -> Batch {
    Batch::new(
        records
            .iter()
            .map(|&(key, ts)| {
                let mut record = crate::record::tests::input(Some(key), Some(b"v"));
                record.timestamp = Some(ts);
                record
            })
            .collect(),
    )
}

fn finish_batch() {
    crate::state::store::with(|s| {
        s.finish();
        Ok(())
    })
    .unwrap();
}

#[test]
fn prefetch_loads_a_batchs_windows_with_one_call() {
    reset();
    const HOPPING: Windows<u64> = Windows::hopping("h", Duration::from_millis(10), Duration::from_millis(5));
    let count = |n: Option<u64>| n.unwrap_or(0) + 1;
    for record in &batch(&[("a", 1), ("b", 7)]) {
        HOPPING.add_record(record, count).unwrap();
    }
    finish_batch();
    testing::set_watermark(Some(4)); // [-5, 5) has closed
    let next = batch(&[("a", 2), ("a", 6), ("b", 8), ("c", 12)]);
    let before = crate::state::tests::calls();
    HOPPING.prefetch(&next).unwrap();
    for record in &next {
        HOPPING.add_record(record, count).unwrap();
    }
    let calls = crate::state::tests::calls();
    assert_eq!(
        (calls.get_many - before.get_many, calls.get - before.get),
        (1, 0),
        "one crossing for the batch's reads"
    );
    finish_batch();
    assert_eq!(stored(&HOPPING, "a", 0), Some(3), "[0, 10) of a: 1, 2 and 6");
    assert_eq!(stored(&HOPPING, "a", -5), Some(1), "fired windows are not read or added to");
    assert_eq!(stored(&HOPPING, "b", 5), Some(2));
    assert_eq!(stored(&HOPPING, "c", 10), Some(1));
}

#[test]
fn one_timer_per_window_end_closes_every_keys_window_in_pages() {
    reset();
    const W: Windows<u64> = Windows::tumbling("w", Duration::from_millis(10));
    let keys: Vec<String> = (0..WINDOWS_PER_FIRING * 2 + 5).map(|i| format!("key-{i:04}")).collect();
    for key in &keys {
        W.add(key, 3, |n| n.unwrap_or(0) + 1).unwrap();
        W.add(key, 12, |n| n.unwrap_or(0) + 1).unwrap();
    }
    finish_batch();
    assert_eq!(
        testing::pending(),
        [Timer::event("w", 9), Timer::event("w", 19)],
        "one timer per window end, not per key"
    );
    testing::set_watermark(Some(9));
    let due = testing::take_due();
    assert_eq!(due, [Timer::event("w", 9)]);
    let first = W.fire(&due[0]).unwrap();
    finish_batch();
    assert_eq!(first.len(), WINDOWS_PER_FIRING);
    let last = &keys[WINDOWS_PER_FIRING - 1];
    assert_eq!(
        testing::pending(),
        [Timer::event([b"w\x01".as_slice(), last.as_bytes()].concat(), 9), Timer::event("w", 19)],
        "the rest go on after the last key fired"
    );
    let closed: Vec<(String, i64, i64, u64)> = first
        .into_iter()
        .map(|w| (w.key_str().unwrap().to_owned(), w.start, w.end, w.value))
        .chain(advance(9, |t| W.fire(t)))
        .collect();
    let expected: Vec<(String, i64, i64, u64)> = keys.iter().map(|k| (k.clone(), 0, 10, 1)).collect();
    assert_eq!(closed, expected, "every key's window once, in key order, over three firings");
    assert_eq!(testing::pending(), [Timer::event("w", 19)]);
    assert_eq!(advance(19, |t| W.fire(t)).len(), keys.len());
    assert!(testing::pending().is_empty());
}

#[test]
fn a_window_stored_per_key_by_an_older_sdk_still_fires_once() {
    reset();
    const W: Windows<u64> = Windows::tumbling("w", Duration::from_millis(10));
    // The layout of earlier SDKs: (`w`, key, start) and a timer per key.
    const OLD: MapState<i64, u64> = MapState::new("w");
    OLD.set("k", &0, &4).unwrap();
    Timer::event("w\0k", 9).set().unwrap();
    finish_batch();
    assert_eq!(advance(9, |t| W.fire(t)), [("k".into(), 0, 10, 4)]);
    assert_eq!(OLD.get("k", &0).unwrap(), None, "its state is removed");
}

#[test]
fn sessions_grow_merge_and_close_after_the_gap() {
    reset();
    const SESSIONS: SessionWindows<u64> = SessionWindows::new("s", Duration::from_millis(10));
    let add = |ts| SESSIONS.add("k", ts, |n| n.unwrap_or(0) + 1, |a, b| a + b).unwrap();
    assert!(add(0));
    assert!(add(5), "extends [0, 10) to [0, 15)");
    assert!(add(22), "a new session [22, 32)");
    assert_eq!(testing::pending().len(), 2);
    assert!(add(13), "bridges [0, 15) and [22, 32): one session [0, 32)");
    assert_eq!(testing::pending().len(), 1, "the merged sessions' timers are replaced by one");
    assert_eq!(advance(30, |t| SESSIONS.fire(t)), []);
    assert_eq!(advance(31, |t| SESSIONS.fire(t)), [("k".into(), 0, 32, 4)]);
    assert!(!add(21), "its session would have closed already");
    assert!(add(45));
    assert_eq!(advance(100, |t| SESSIONS.fire(t)), [("k".into(), 45, 55, 1)]);
}

#[test]
fn a_window_id_is_its_start_as_an_i64_map_key() {
    use crate::state::MapKey;
    for start in [i64::MIN, -1_000, -1, 0, 1, 1_796_160_000_000, i64::MAX] {
        let mut encoded = Vec::new();
        start.encode_map_key(&mut encoded);
        assert_eq!(window_id(start).as_slice(), encoded, "start {start}");
    }
}

#[test]
fn entry_keys_built_from_a_kept_prefix_are_the_map_states_keys() {
    let state: MapState<Vec<u8>, u64> = MapState::new("w");
    let other: MapState<Vec<u8>, u64> = MapState::new("other");
    // Same window, another window, another name, back, nested: each as
    // the map state lays it out.
    for (name, map, start, key) in [
        ("w", &state, 0, &b"a"[..]),
        ("w", &state, 0, b"longer key"),
        ("w", &state, -60_000, b"a"),
        ("other", &other, -60_000, b""),
        ("w", &state, 0, b"a"),
    ] {
        let built = with_entry_key(name, start, key, |entry| {
            let nested = with_entry_key("other", 7, b"x", |inner| Ok(inner.to_vec())).unwrap();
            assert_eq!(nested, other.entry_key(&window_id(7), &b"x"[..]).unwrap());
            Ok(entry.to_vec())
        });
        assert_eq!(built.unwrap(), map.entry_key(&window_id(start), key).unwrap(), "{name} {start} {key:?}");
    }
    assert!(with_entry_key("bad\0name", 0, b"k", |_| Ok(())).is_err());
}
