//! The transform stage's cost per record through the batch ABI: the
//! running-count example as a Wasm component, against the same logic compiled
//! natively over the same host state, in the same run (two native ways: a
//! get and a set per record, and the SDK's per-batch cache; the ratio is to
//! the faster).
//!
//! `cargo bench -p sluice --bench transform` (add `-- --records N` to change
//! the record count, `-- --batch N` to measure one batch size alone, and
//! `-- --rounds N` to change the rounds, e.g. `--batch 64 --rounds 1` under a
//! profiler). Records carry 100-byte values over 10,000 keys; the figures
//! are ns per record at batch sizes 1, 64 and 1024, and the ratio Wasm /
//! native. Each batch size runs 3 rounds of all three, one right after the
//! other, since this machine's speed drifts by up to 1.5x within minutes:
//! each figure is the median of its rounds, and the ratio the median of
//! the rounds' ratios. Only the transform stage is measured: no Kafka, no
//! checkpoints. Each side ends with its outputs in the form a task hands
//! the sink: the native code's `OutputRecord`s, the Wasm stage's `Outputs`
//! (`Instance::transform`, the guest's packed outputs read in place).

#![allow(unreachable_pub, missing_docs)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::Instant;

use sluice::record::{InputRecord, OutputRecord};
use sluice::runtime::{InstanceLimits, Runtime, RuntimeConfig};
use sluice::state::TaskState;

const KEYS: usize = 10_000;
const VALUE_BYTES: usize = 100;

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
            let stored = state.get(slot.key()).ok().flatten().and_then(|v| serde_json::from_slice::<u64>(v).ok());
            slot.insert(stored.unwrap_or(0));
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
        out.push(OutputRecord {
            key: Some(key),
            value: Some(n.to_string().into_bytes()),
            headers: Vec::new(),
            topic: None,
        });
    }
    for (state_key, n) in cache {
        state.set(state_key, serde_json::to_vec(&n).unwrap_or_default());
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
        let n =
            state.get(&state_key).ok().flatten().and_then(|v| serde_json::from_slice::<u64>(v).ok()).unwrap_or(0) + 1;
        state.set(state_key, serde_json::to_vec(&n).unwrap_or_default());
        out.push(OutputRecord {
            key: Some(key),
            value: Some(n.to_string().into_bytes()),
            headers: Vec::new(),
            topic: None,
        });
    }
    out
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
    println!("running-count, {n} records, {KEYS} keys, {VALUE_BYTES}-byte values; medians of {rounds} rounds");
    println!(
        "| batch | native ns/record (get+set per record) | native ns/record (per-batch cache, as the SDK) | wasm ns/record | wasm / faster native |"
    );
    println!("|------:|------:|------:|------:|------:|");
    let sizes = match support::arg_value("--batch") {
        Some(size) => vec![size.parse::<usize>().ok().filter(|&n| n > 0).expect("--batch takes a positive number")],
        None => vec![1, 64, 1024],
    };
    for batch_size in sizes {
        let time_native = |run: fn(&mut TaskState, &[InputRecord]) -> Vec<OutputRecord>| {
            let mut state = TaskState::in_memory();
            let started = Instant::now();
            let mut emitted = 0usize;
            for batch in input.chunks(batch_size) {
                emitted += run(&mut state, batch).len();
            }
            assert_eq!(emitted, n);
            started.elapsed().as_nanos() as f64 / n as f64
        };
        let time_wasm = || {
            let mut instance = runtime
                .instantiate(&module, "bench", TaskState::in_memory(), InstanceLimits::default())
                .expect("instance");
            // The state work of the baselines: written back after every batch.
            // (In a job the guest holds a shard's state from batch to batch and
            // writes it back at each checkpoint: less work than this.)
            instance.forbid_holding();
            instance.init(&[]).expect("init");
            let started = Instant::now();
            let mut emitted = 0usize;
            for batch in input.chunks(batch_size) {
                emitted += instance.transform(batch).expect("process").len();
            }
            let wasm = started.elapsed().as_nanos() as f64 / n as f64;
            assert_eq!(emitted, n);
            wasm
        };
        // Each round: [direct, cached, wasm, wasm / the faster native].
        let measured: Vec<[f64; 4]> = (0..rounds)
            .map(|_| {
                let (direct, cached, wasm) = (time_native(native_direct), time_native(native_cached), time_wasm());
                [direct, cached, wasm, wasm / direct.min(cached)]
            })
            .collect();
        let [direct, cached, wasm, ratio] =
            std::array::from_fn(|column| support::median(measured.iter().map(|round| round[column]).collect()));
        println!("| {batch_size:>5} | {direct:.0} | {cached:.0} | {wasm:.0} | {ratio:.2} |");
    }
}
