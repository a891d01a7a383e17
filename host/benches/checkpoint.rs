//! The state side of a checkpoint at 1k, 100k and 1M dirty keys: freezing
//! the delta at the barrier (the synchronous part: the only part on the
//! task's thread), writing it durably to redb as one pending blob (on the
//! snapshot writer thread, while the task goes on), and folding it into the
//! base after the Kafka commit (also on the writer thread).
//!
//! `cargo bench -p sluice --bench checkpoint`. Keys are 16 bytes, values 100
//! bytes. The Kafka side of a checkpoint (flush, send offsets, commit) does
//! not depend on the number of dirty keys; the pipeline bench measures it.

#![allow(missing_docs)]

use std::time::Instant;

use sluice::checkpoint::{CheckpointStore, PartitionOffset};
use sluice::state::TaskState;

fn main() {
    println!("| dirty keys | barrier (sync part) | write pending, durable (async) | blob MiB | fold (async) |");
    println!("|-----------:|--------------------:|-------------------------------:|---------:|-------------:|");
    for keys in [1_000usize, 100_000, 1_000_000] {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = CheckpointStore::open(&dir.path().join("task-0.redb")).expect("store");
        let mut state = TaskState::with_backend(store.backend());
        for i in 0..keys {
            state.set(format!("count\0key-{i:09}").into_bytes(), vec![b'v'; 100]);
        }
        let offsets = vec![PartitionOffset { topic: "in".into(), partition: 0, next_offset: keys as i64 }];

        let started = Instant::now();
        let delta = state.freeze(1);
        let sync = started.elapsed();
        let started = Instant::now();
        let bytes = store.write_pending(1, 0, &delta, &offsets, None).expect("write pending");
        let write = started.elapsed();
        let started = Instant::now();
        store.fold(1).expect("fold");
        let fold = started.elapsed();
        println!(
            "| {keys:>10} | {:>16.3} ms | {:>27.1} ms | {:>8.1} | {:>9.1} ms |",
            sync.as_secs_f64() * 1e3,
            write.as_secs_f64() * 1e3,
            bytes as f64 / (1 << 20) as f64,
            fold.as_secs_f64() * 1e3
        );
    }
}
