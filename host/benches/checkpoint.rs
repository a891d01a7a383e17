//! The state side of a checkpoint at 1k, 100k and 1M dirty keys: taking the
//! delta from the working set, writing it durably to redb as one pending blob
//! (the synchronous part of a checkpoint, on the task's thread), and folding
//! it into the base afterwards.
//!
//! `cargo bench -p sluice --bench checkpoint`. Keys are 16 bytes, values 100
//! bytes. The Kafka side of a checkpoint (flush, send offsets, commit) does
//! not depend on the number of dirty keys; the pipeline bench measures it.

#![allow(missing_docs)]

use std::time::Instant;

use sluice::checkpoint::{CheckpointStore, PartitionOffset};
use sluice::state::TaskState;

fn main() {
    println!(
        "| dirty keys | take delta | write pending (durable) | sync part total | blob MiB | fold (after commit) |"
    );
    println!(
        "|-----------:|-----------:|------------------------:|----------------:|---------:|--------------------:|"
    );
    for keys in [1_000usize, 100_000, 1_000_000] {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = CheckpointStore::open(&dir.path().join("task-0.redb")).expect("store");
        let mut state = TaskState::with_backend(store.backend());
        for i in 0..keys {
            state.set(format!("count\0key-{i:09}").into_bytes(), vec![b'v'; 100]);
        }
        let offsets = vec![PartitionOffset { topic: "in".into(), partition: 0, next_offset: keys as i64 }];

        let started = Instant::now();
        let delta = state.take_delta();
        let take = started.elapsed();
        let bytes = store.write_pending(1, &delta, &offsets).expect("write pending");
        let sync = started.elapsed();
        let write = sync - take;
        let started = Instant::now();
        store.fold(1).expect("fold");
        let fold = started.elapsed();
        println!(
            "| {keys:>10} | {:>8.1} ms | {:>21.1} ms | {:>13.1} ms | {:>8.1} | {:>17.1} ms |",
            take.as_secs_f64() * 1e3,
            write.as_secs_f64() * 1e3,
            sync.as_secs_f64() * 1e3,
            bytes as f64 / (1 << 20) as f64,
            fold.as_secs_f64() * 1e3
        );
    }
}
