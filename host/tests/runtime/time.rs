//! Event time and timers: the watermark per shard, timers stored as shard
//! state and fired once, and the host's part of the key space closed to
//! guests.

use super::*;
use sluice::runtime::shard_key;
use sluice::time::{self as time, TimeConfig};
use std::time::{Duration, Instant};

/// A record of `key` at event time `ts` on `partition` of topic `in`.
fn at(key: &str, ts: i64, partition: i32, offset: i64) -> InputRecord {
    InputRecord {
        key: Some(key.as_bytes().to_vec()),
        value: Some(b"click".to_vec()),
        headers: Vec::new(),
        timestamp: Some(ts),
        topic: "in".into(),
        partition,
        offset,
    }
}

/// The guest `name`, keeping time for `partitions` of topic `in` (none: as
/// `sluice exec` does, learning them from the records), initialised with
/// `config`.
fn timed(
    runtime: &Runtime,
    name: &str,
    state: TaskState,
    partitions: &[i32],
    config: &[(&str, &str)],
) -> (Instance, Module) {
    let module = load(runtime, name);
    assert!(module.uses_time(), "the SDK's modules are of world `timed`");
    let mut instance =
        runtime.instantiate(&module, &format!("test/{name}"), state, InstanceLimits::default()).expect("instantiates");
    let partitions: Vec<(String, i32)> = partitions.iter().map(|&p| ("in".to_string(), p)).collect();
    instance.start_time(&module, TimeConfig::default(), &partitions).expect("start time");
    let config: Vec<(String, String)> = config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    instance.init(&config).expect("init");
    (instance, module)
}

/// windowed-count with 10 ms windows, keeping time for partitions 0 and 1.
fn windowed_count(runtime: &Runtime, state: TaskState) -> (Instance, Module) {
    timed(runtime, "windowed-count", state, &[0, 1], &[("window", "10ms")])
}

fn fire(instance: &mut Instance) -> Vec<(String, String)> {
    let (outputs, _) = instance.fire_timers(Instant::now()).expect("fire");
    outputs
        .iter()
        .map(|o| {
            let text = |b: &Option<Vec<u8>>| String::from_utf8_lossy(b.as_deref().unwrap_or_default()).into_owned();
            (text(&o.key), text(&o.value))
        })
        .collect()
}

#[test]
fn each_shard_keeps_its_own_watermark_and_fires_its_windows_once() {
    let (runtime, _cache) = runtime();
    let (mut instance, _) = windowed_count(&runtime, TaskState::in_memory());
    instance.process(&[at("a", 1, 0, 0), at("a", 5, 0, 1), at("b", 3, 1, 0)]).expect("process");
    assert_eq!(fire(&mut instance), [], "no window has ended");
    // The largest timestamp less 1 ms (and no allowed disorder here).
    assert_eq!(instance.watermarks(), Some([(0, Some(4)), (1, Some(2))].into()));

    instance.process(&[at("a", 12, 0, 2)]).expect("process");
    assert_eq!(fire(&mut instance), [("a".into(), r#"{"start":0,"end":10,"count":2}"#.into())]);
    assert_eq!(fire(&mut instance), [], "a timer fires once");
    assert_eq!(instance.watermarks(), Some([(0, Some(11)), (1, Some(2))].into()), "shard 1 did not move");

    // Late on shard 0 (its window fired), on time on shard 1.
    instance.process(&[at("a", 4, 0, 3), at("b", 9, 1, 1)]).expect("process");
    assert_eq!(instance.take_late_records().values().sum::<u64>(), 1);
    instance.process(&[at("b", 10, 1, 2)]).expect("process");
    assert_eq!(fire(&mut instance), [("b".into(), r#"{"start":0,"end":10,"count":2}"#.into())]);
}

/// As `sluice exec` runs a module: no partitions known up front, so the
/// first record's shard is learned after the guest has set its timer. That
/// timer fires all the same (it was once lost, so a one-record test of a
/// window printed nothing).
#[test]
fn a_timer_set_before_its_shard_is_known_fires() {
    let (runtime, _cache) = runtime();
    let (mut instance, _) = timed(&runtime, "windowed-count", TaskState::in_memory(), &[], &[("window", "10ms")]);
    instance.process(&[at("a", 1, 0, 0)]).expect("process");
    instance.force_watermark(i64::MAX);
    assert_eq!(fire(&mut instance), [("a".into(), r#"{"start":0,"end":10,"count":1}"#.into())]);
}

/// A `migrate` hook sees the host's processing time, as every call does: a
/// value it writes with a one-minute time-to-live is alive a second later.
#[test]
fn a_migrate_hook_sees_the_processing_time() {
    let (runtime, _cache) = runtime();
    let (mut instance, _) = timed(&runtime, "ttl-migrate", TaskState::in_memory(), &[0], &[]);
    let now = 1_800_000_000_000;
    instance.set_virtual_clock(now);
    assert!(instance.migrate("old", &[0]).expect("migrate"), "the fixture has a migrate hook");
    instance.set_virtual_clock(now + 1_000);
    let outputs = instance.process(&[at("a", now, 0, 0)]).expect("process");
    let values: Vec<&[u8]> = outputs.iter().map(|o| o.value.as_deref().unwrap_or_default()).collect();
    assert_eq!(values, [b"alive".as_slice()], "the migrated value's time-to-live ran from the hook's clock");
}

#[test]
fn timers_and_the_watermark_are_state_of_the_checkpoint() {
    let (runtime, _cache) = runtime();
    let (mut instance, _) = windowed_count(&runtime, TaskState::in_memory());
    instance.process(&[at("a", 1, 0, 0), at("b", 2, 1, 0)]).expect("process");
    instance.fire_timers(Instant::now()).expect("fire");
    instance.end_epoch().expect("end of epoch");
    let delta = instance.state_mut().freeze(1);
    // The SDK's windows keep one timer per window end, keyed by their name.
    let timer = |shard: u32| {
        let timer = time::Timer { clock: time::Clock::Event, at: 9, key: b"count".to_vec() };
        shard_key(shard, &time::timer_key(&timer))
    };
    let entries = delta.to_vec();
    let keys: Vec<&Vec<u8>> = entries.iter().map(|(k, _)| k).collect();
    assert!(keys.contains(&&timer(0)) && keys.contains(&&timer(1)), "each shard's timer: {keys:?}");
    for shard in [0, 1] {
        assert!(keys.contains(&&shard_key(shard, &time::watermark_key())), "shard {shard}'s watermark is stored");
    }

    // Firing removes the timer in the same epoch as its output.
    instance.process(&[at("a", 10, 0, 1)]).expect("process");
    assert_eq!(fire(&mut instance).len(), 1);
    instance.end_epoch().expect("end of epoch");
    let delta = instance.state_mut().freeze(2).to_vec();
    assert!(delta.contains(&(timer(0), None)), "the fired timer is deleted in the firing's epoch");
}

#[test]
fn a_restarted_instance_takes_the_watermark_and_timers_from_the_state() {
    let (runtime, _cache) = runtime();
    let (mut first, _) = windowed_count(&runtime, TaskState::in_memory());
    first.process(&[at("a", 1, 0, 0), at("a", 7, 0, 1)]).expect("process");
    first.fire_timers(Instant::now()).expect("fire");
    first.end_epoch().expect("end of epoch");
    let delta = first.state_mut().freeze(1);

    // A new instance over that state, as recovery builds one.
    let mut state = TaskState::in_memory();
    for (key, value) in delta.to_vec() {
        state.write(key, value);
    }
    let (mut second, _) = windowed_count(&runtime, state);
    assert_eq!(second.watermarks(), Some([(0, Some(6)), (1, None)].into()));
    second.process(&[at("a", 3, 0, 2)]).expect("process");
    assert_eq!(second.take_late_records().values().sum::<u64>(), 1, "late against the restored watermark");
    second.process(&[at("a", 20, 0, 3)]).expect("process");
    assert_eq!(fire(&mut second), [("a".into(), r#"{"start":0,"end":10,"count":3}"#.into())]);
}

#[test]
fn an_idle_partition_stops_holding_the_watermark_back() {
    let (runtime, _cache) = runtime();
    let module = load(&runtime, "windowed-count");
    let mut instance =
        runtime.instantiate(&module, "test/idle", TaskState::in_memory(), InstanceLimits::default()).expect("new");
    let partitions = [("in".to_string(), 0), ("other".to_string(), 0)];
    let config = TimeConfig { max_out_of_orderness: Duration::ZERO, idle_timeout: Some(Duration::from_millis(50)) };
    instance.start_time(&module, config, &partitions).expect("start time");
    instance.init(&[("window".into(), "10ms".into())]).expect("init");
    instance.process(&[at("a", 15, 0, 0), at("a", 20, 0, 1)]).expect("process");
    assert_eq!(fire(&mut instance), [], "topic `other` has sent nothing and is not idle yet");
    let later = Instant::now() + Duration::from_millis(60);
    let (outputs, fired) = instance.fire_timers(later).expect("fire");
    assert_eq!((outputs.len(), fired), (1, 1), "`other` went idle: the window [10, 20) closes");
}

#[test]
fn a_guest_cannot_write_the_hosts_keys_nor_see_them_in_scans() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits::default());
    let error = instance.process(&batch(&["reserved"])).expect_err("refused");
    assert!(error.to_string().contains("are the host's"), "{error}");

    let mut state = TaskState::in_memory();
    state.set(shard_key(0, &time::watermark_key()), b"{}".to_vec());
    state.set(shard_key(0, b"\xff\xff"), b"after".to_vec());
    state.set(shard_key(0, b"a"), b"before".to_vec());
    let module = load(&runtime, "probe");
    let mut instance = runtime.instantiate(&module, "test/probe", state, InstanceLimits::default()).expect("new");
    instance.init(&[]).expect("init");
    let outputs = instance.process(&batch(&["scan  10", "scan  1", "scan \u{0} 10"])).expect("scans");
    assert_eq!(values(&outputs)[0], "a=before;\u{fffd}\u{fffd}=after", "the host's key is skipped, the rest is not");
    assert_eq!(values(&outputs)[1], "a=before");
}

/// Counts the entries a backend hands out in scans.
struct CountingScans {
    inner: Box<dyn sluice::state::StateBackend>,
    scanned: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl sluice::state::StateBackend for CountingScans {
    fn get(&self, key: &[u8]) -> sluice::state::Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> sluice::state::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let page = self.inner.scan(prefix, start_after, limit)?;
        self.scanned.fetch_add(page.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(page)
    }
}

/// A shard with a million pending timers in its committed state (a redb
/// store): firing the few that are due reads those and a handful more,
/// not the million, nor a page of a thousand.
#[test]
fn a_million_pending_timers_cost_only_the_due_ones_to_fire() {
    let (runtime, _cache) = runtime();
    let dir = tempfile::tempdir().expect("dir");
    let store = sluice::checkpoint::CheckpointStore::open(&dir.path().join("task-0.redb")).expect("store");
    // Window timers of windowed-count (1 s windows) for a million keys, due
    // at 999 ms for 10 of them and at 60 s for the rest.
    let timer = |i: u32, at: i64| -> (Vec<u8>, Option<Vec<u8>>) {
        let timer = time::Timer { clock: time::Clock::Event, at, key: format!("count\0key-{i}").into_bytes() };
        (time::timer_key(&timer), Some(Vec::new()))
    };
    let entries: Vec<_> = (0..1_000_000u32).map(|i| timer(i, if i < 10 { 999 } else { 59_999 })).collect();
    for chunk in entries.chunks(250_000) {
        store.restore_chunk(0, chunk).expect("write timers");
    }
    let scanned = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let backend = CountingScans { inner: store.backend(), scanned: std::sync::Arc::clone(&scanned) };
    let state = TaskState::with_backend(Box::new(backend));
    let (mut instance, _) = timed(&runtime, "windowed-count", state, &[0], &[("window", "1s")]);

    instance.process(&[at("late-comer", 1_500, 0, 0)]).expect("process");
    scanned.store(0, std::sync::atomic::Ordering::Relaxed);
    let (_, fired) = instance.fire_timers(Instant::now()).expect("fire");
    assert_eq!(fired, 10, "the ten timers at or below the watermark (1,499) fire");
    let read = scanned.load(std::sync::atomic::Ordering::Relaxed);
    assert!(read <= 2 * 16, "firing 10 of 1,000,000 timers read {read} entries from the store");
    let (_, fired) = instance.fire_timers(Instant::now()).expect("fire");
    assert_eq!(fired, 0, "none is due until the watermark moves");
    assert!(scanned.load(std::sync::atomic::Ordering::Relaxed) <= 2 * 16, "a turn with nothing due reads nothing");
}
