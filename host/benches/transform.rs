//! The transform stage's cost per record through the batch ABI: the
//! running-count example as a Wasm component, against the same logic compiled
//! natively over the same host state, in the same run.
//!
//! `cargo bench -p sluice --bench transform` (add `-- --records N` to change
//! the record count, `-- --batch N` to measure one batch size alone,
//! `-- --rounds N` to change the rounds, e.g. `--batch 64 --rounds 1` under a
//! profiler, and `-- --checkpoint-records N` to change how often held state
//! is written back). Records carry 100-byte values over 10,000 keys; the
//! figures are ns per record at batch sizes 1, 64 and 1024.
//!
//! Two ways of keeping the state, each with its own ratio Wasm / the
//! fastest native code doing the same work:
//!
//! - **Written back after every batch.** The guest's SDK caches a batch's
//!   keys and writes the changed ones back at the batch's end (what it does
//!   for a host that does not take held state back). Native: a get and a
//!   set per record on the host state, or the SDK's per-batch cache.
//! - **Held as in a job.** A job's task lets the guest hold a shard's cache
//!   from batch to batch and takes it back (`flush-state`) before each
//!   checkpoint; here a checkpoint comes every 20,000 records (a 100 ms
//!   checkpoint interval at 200,000 records/s, shorter than the pipeline
//!   runs at). Native: a get and a set per record, or the same cache held
//!   natively and written back at the same checkpoints.
//!
//! Each batch size runs rounds of all five one right after the other, since
//! this machine's speed drifts by up to 1.5x within minutes: each figure is
//! the median of its rounds, and each ratio the median of the rounds'
//! ratios. Only the transform stage is measured: no Kafka, and of a
//! checkpoint only the write-back of held state. Each side ends with its
//! outputs in the form a task hands the sink: the native code's
//! `OutputRecord`s, the Wasm stage's `Outputs` (`Instance::transform`, the
//! guest's packed outputs read in place).

#![allow(unreachable_pub, missing_docs)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::Instant;

use sluice::record::{InputRecord, OutputRecord};
use sluice::runtime::{Instance, InstanceLimits, Runtime, RuntimeConfig};
use sluice::state::TaskState;

const KEYS: usize = 10_000;
const VALUE_BYTES: usize = 100;
/// Records between two checkpoints of the held measurements, by default.
const CHECKPOINT_RECORDS: usize = 20_000;

fn records(n: usize) -> Vec<InputRecord> {
    // A fixed LCG so every run sees the same key sequence.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n)
        .map(|i| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let key = format!("user-{:05}", (x >> 33) as usize % KEYS);
            InputRecord {
                key: Some(key.into_bytes()),
                value: Some(vec![b'v'; VALUE_BYTES]),
                headers: Vec::new(),
                timestamp: Some(1_700_000_000_000 + i as i64),
                topic: "input".into(),
                partition: 0,
                offset: i as i64,
            }
        })
        .collect()
}

/// The count `state` holds under `state_key` in the SDK's encoding (a JSON
/// number); 0 for none.
fn stored_count(state: &mut TaskState, state_key: &[u8]) -> u64 {
    state.get(state_key).ok().flatten().and_then(|v| serde_json::from_slice::<u64>(v).ok()).unwrap_or(0)
}

/// `n` in the SDK's state encoding.
fn encoded(n: u64) -> Vec<u8> {
    serde_json::to_vec(&n).unwrap_or_default()
}

/// running-count's output for a record of `key`: the key and its count.
fn count_output(key: Vec<u8>, n: u64) -> OutputRecord {
    OutputRecord { key: Some(key), value: Some(n.to_string().into_bytes()), headers: Vec::new(), topic: None }
}

/// running-count in native Rust, doing what the SDK does for the Wasm
/// guest: the batch's distinct keys read from the host state once each (the
/// guest's one `state.get-many`), counts updated in a per-batch cache, and
/// each changed key written back once at the batch's end (its one
/// `state.write`), with the SDK's state encoding (`count\0<key>` -> JSON
/// number). The same state work as the guest, measured beside the direct
/// way so that neither baseline flatters the ratio.
fn native_cached(state: &mut TaskState, batch: &[InputRecord]) -> Vec<OutputRecord> {
    let mut cache: HashMap<Vec<u8>, u64> = HashMap::with_capacity(batch.len());
    for record in batch {
        let state_key = [b"count\0".as_slice(), record.key.as_deref().unwrap_or_default()].concat();
        if let Entry::Vacant(slot) = cache.entry(state_key) {
            let stored = stored_count(state, slot.key());
            slot.insert(stored);
        }
    }
    let mut out = Vec::with_capacity(batch.len());
    for record in batch {
        let key = record.key.clone().unwrap_or_default();
        let state_key = [b"count\0".as_slice(), &key].concat();
        let n = cache.get_mut(&state_key).map_or(1, |n| {
            *n += 1;
            *n
        });
        out.push(count_output(key, n));
    }
    for (state_key, n) in cache {
        state.set(state_key, encoded(n));
    }
    out
}

/// running-count in native Rust, the direct way: a get and a set on the
/// host state per record, with the SDK's state encoding (`count\0<key>` ->
/// JSON number). Natively this is the cheaper of the two (a cache over a
/// hash map is one more hash map), so it is the baseline the ratio uses.
fn native_direct(state: &mut TaskState, batch: &[InputRecord]) -> Vec<OutputRecord> {
    let mut out = Vec::with_capacity(batch.len());
    for record in batch {
        let key = record.key.clone().unwrap_or_default();
        let mut state_key = b"count\0".to_vec();
        state_key.extend_from_slice(&key);
        let n = stored_count(state, &state_key) + 1;
        state.set(state_key, encoded(n));
        out.push(count_output(key, n));
    }
    out
}

/// running-count in native Rust with the cache a job lets the Wasm guest
/// hold: a shard's counts kept from batch to batch (a key read from the
/// host state the first time the epoch sees it), and all of them (each
/// was counted since) written back at each checkpoint, with the SDK's state
/// encoding.
#[derive(Default)]
struct NativeHeld {
    /// State key -> count, for the keys counted since the last checkpoint.
    cache: HashMap<Vec<u8>, u64>,
    state_key: Vec<u8>,
}

impl NativeHeld {
    fn process(&mut self, state: &mut TaskState, batch: &[InputRecord]) -> Vec<OutputRecord> {
        let mut out = Vec::with_capacity(batch.len());
        for record in batch {
            let key = record.key.clone().unwrap_or_default();
            self.state_key.clear();
            self.state_key.extend_from_slice(b"count\0");
            self.state_key.extend_from_slice(&key);
            let n = match self.cache.get_mut(&self.state_key) {
                Some(n) => {
                    *n += 1;
                    *n
                }
                None => {
                    let n = stored_count(state, &self.state_key) + 1;
                    self.cache.insert(self.state_key.clone(), n);
                    n
                }
            };
            out.push(count_output(key, n));
        }
        out
    }

    /// A checkpoint: the counts written back, the cache emptied.
    fn checkpoint(&mut self, state: &mut TaskState) {
        for (state_key, n) in self.cache.drain() {
            state.set(state_key, encoded(n));
        }
    }
}

/// Calls `checkpoint` after each batch that ends `every` records or more
/// since the last, and once at the end; the records `process` emitted.
fn in_epochs<C>(
    on: &mut C,
    input: &[InputRecord],
    (batch_size, every): (usize, usize),
    process: impl Fn(&mut C, &[InputRecord]) -> usize,
    checkpoint: impl Fn(&mut C),
) -> usize {
    let (mut emitted, mut since) = (0, 0);
    for batch in input.chunks(batch_size) {
        emitted += process(on, batch);
        since += batch.len();
        if since >= every {
            checkpoint(on);
            since = 0;
        }
    }
    checkpoint(on);
    emitted
}

/// The held native run (a function of its own, for profilers' toggles).
#[inline(never)]
fn native_held(state: &mut TaskState, input: &[InputRecord], batch_size: usize, every: usize) -> usize {
    in_epochs(
        &mut (NativeHeld::default(), state),
        input,
        (batch_size, every),
        |(held, state), batch| held.process(state, batch).len(),
        |(held, state)| held.checkpoint(state),
    )
}

/// The Wasm stage with its state written back after every batch.
#[inline(never)]
fn wasm_written_back(instance: &mut Instance, input: &[InputRecord], batch_size: usize) -> usize {
    input.chunks(batch_size).map(|batch| instance.transform(batch).expect("process").len()).sum()
}

/// The Wasm stage holding its state as in a job, taken back at each
/// checkpoint.
#[inline(never)]
fn wasm_held(instance: &mut Instance, input: &[InputRecord], batch_size: usize, every: usize) -> usize {
    in_epochs(
        instance,
        input,
        (batch_size, every),
        |instance, batch| instance.transform(batch).expect("process").len(),
        |instance| instance.flush_state().expect("flush-state"),
    )
}

fn main() {
    let n = support::records_arg(200_000);
    let input = records(n);
    // One instance at a time: a small pool, which also lets it run under valgrind.
    let runtime =
        Runtime::new(RuntimeConfig { max_instances: 2, baseline: false, ..RuntimeConfig::default() }).expect("runtime");
    let module = runtime.load_file(&support::guest("running-count")).expect("module");

    let rounds = support::arg_value("--rounds")
        .map(|r| r.parse::<usize>().ok().filter(|&n| n > 0).expect("--rounds takes a positive number"))
        .unwrap_or(3);
    let every = support::arg_value("--checkpoint-records")
        .map(|r| r.parse::<usize>().ok().filter(|&n| n > 0).expect("--checkpoint-records takes a positive number"))
        .unwrap_or(CHECKPOINT_RECORDS);
    println!(
        "running-count, {n} records, {KEYS} keys, {VALUE_BYTES}-byte values; held state written back every {every} records; medians of {rounds} rounds; ns per record"
    );
    println!(
        "| batch | native get+set per record | native, per-batch cache | wasm, per-batch write-back | wasm / faster native | native, held cache | wasm, held | wasm held / fastest native |"
    );
    println!("|------:|------:|------:|------:|------:|------:|------:|------:|");
    let sizes = match support::arg_value("--batch") {
        Some(size) => vec![size.parse::<usize>().ok().filter(|&n| n > 0).expect("--batch takes a positive number")],
        None => vec![1, 64, 1024],
    };
    let timed = |run: &mut dyn FnMut() -> usize| {
        let started = Instant::now();
        let emitted = run();
        let ns = started.elapsed().as_nanos() as f64 / n as f64;
        assert_eq!(emitted, n);
        ns
    };
    let instance = |hold: bool| {
        let mut instance =
            runtime.instantiate(&module, "bench", TaskState::in_memory(), InstanceLimits::default()).expect("instance");
        if !hold {
            instance.forbid_holding();
        }
        instance.init(&[]).expect("init");
        instance
    };
    for batch_size in sizes {
        let native = |run: fn(&mut TaskState, &[InputRecord]) -> Vec<OutputRecord>| {
            let mut state = TaskState::in_memory();
            timed(&mut || input.chunks(batch_size).map(|batch| run(&mut state, batch).len()).sum())
        };
        // Each round: [direct, cached, wasm, its ratio, native held, wasm held, its ratio].
        let measured: Vec<[f64; 7]> = (0..rounds)
            .map(|_| {
                let (direct, cached) = (native(native_direct), native(native_cached));
                let mut written_back = instance(false);
                let wasm = timed(&mut || wasm_written_back(&mut written_back, &input, batch_size));
                let mut state = TaskState::in_memory();
                let held_native = timed(&mut || native_held(&mut state, &input, batch_size, every));
                let mut held = instance(true);
                let held_wasm = timed(&mut || wasm_held(&mut held, &input, batch_size, every));
                let fastest = direct.min(cached);
                [direct, cached, wasm, wasm / fastest, held_native, held_wasm, held_wasm / fastest.min(held_native)]
            })
            .collect();
        let [direct, cached, wasm, ratio, held_native, held_wasm, held_ratio] =
            std::array::from_fn(|column| support::median(measured.iter().map(|round| round[column]).collect()));
        println!(
            "| {batch_size:>5} | {direct:.0} | {cached:.0} | {wasm:.0} | {ratio:.2} | {held_native:.0} | {held_wasm:.0} | {held_ratio:.2} |"
        );
    }
}
