//! The state side of a checkpoint at 1k, 100k and 1M dirty keys: freezing
//! the delta at the barrier (on the task's thread), writing it durably to
//! redb as one pending blob (on the snapshot writer thread, while the task
//! goes on), folding it into the base after the Kafka commit (also on the
//! writer thread), then the task thread's share once the fold is done:
//! releasing the delta into the clean cache, and emptying that cache when
//! it is over its bound (here forced, with every key in it).
//!
//! Then the writer's folds at short intervals: 20 checkpoints, each
//! rewriting the same 5,000 of 50,000 keys (as a 100 ms checkpoint of a
//! keyed count does), folded one by one or ten at a time (as the writer does at most
//! once a second); the figure is the fold time per checkpoint, median of
//! five rounds.
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
        "| dirty keys | barrier (task thread) | write pending, durable (writer) | blob MiB | fold (writer) | release (task thread) | evict (task thread) |"
    );
    println!(
        "|-----------:|----------------------:|--------------------------------:|---------:|--------------:|----------------------:|--------------------:|"
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
        let delta = state.freeze(1);
        let sync = started.elapsed();
        let started = Instant::now();
        let bytes = store.write_pending(1, 0, &delta, &offsets, None).expect("write pending");
        let write = started.elapsed();
        // The writer drops its handle once the delta is written, as here.
        drop(delta);
        let started = Instant::now();
        store.fold(1).expect("fold");
        let fold = started.elapsed();
        let started = Instant::now();
        state.release_through(1);
        let release = started.elapsed();
        let started = Instant::now();
        state.evict_clean_over(0);
        let evict = started.elapsed();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {keys:>10} | {:>18.3} ms | {:>28.1} ms | {:>8.1} | {:>10.1} ms | {:>18.1} ms | {:>16.1} ms |",
            ms(sync),
            ms(write),
            bytes as f64 / (1 << 20) as f64,
            ms(fold),
            ms(release),
            ms(evict)
        );
    }
    println!();
    println!("| checkpoints per fold | fold per checkpoint (writer), 5,000 of 50,000 keys rewritten each time |");
    println!("|---------------------:|-----------------------------------------------------------------------:|");
    let once = fold_per_checkpoint(1);
    let ten = fold_per_checkpoint(10);
    println!("| {:>20} | {:>67.3} ms |", 1, once * 1e3);
    println!("| {:>20} | {:>67.3} ms ({:.1}x less) |", 10, ten * 1e3, once / ten);
}

/// Seconds of folding per checkpoint when `every` checkpoints are folded
/// at once: the median of five rounds of 20 checkpoints.
fn fold_per_checkpoint(every: u64) -> f64 {
    const CHECKPOINTS: u64 = 20;
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = CheckpointStore::open(&dir.path().join("task-0.redb")).expect("store");
            let mut state = TaskState::with_backend(store.backend());
            // A base of 50,000 keys, of which every tenth is rewritten.
            for i in 0..50_000 {
                state.set(format!("count\0key-{i:09}").into_bytes(), vec![b'v'; 100]);
            }
            let delta = state.freeze(1);
            let offsets = vec![PartitionOffset { topic: "in".into(), partition: 0, next_offset: 0 }];
            store.write_pending(1, 0, &delta, &offsets, None).expect("write pending");
            drop(delta);
            store.fold(1).expect("fold");
            state.release_through(1);
            let mut folding = std::time::Duration::ZERO;
            for id in 2..=CHECKPOINTS + 1 {
                for i in (0..50_000).step_by(10) {
                    state.set(format!("count\0key-{i:09}").into_bytes(), format!("{id:>100}").into_bytes());
                }
                let delta = state.freeze(id);
                let offsets = vec![PartitionOffset { topic: "in".into(), partition: 0, next_offset: id as i64 }];
                store.write_pending(id, 0, &delta, &offsets, None).expect("write pending");
                drop(delta);
                if (id - 1) % every == 0 {
                    let started = Instant::now();
                    store.fold(id).expect("fold");
                    folding += started.elapsed();
                    state.release_through(id);
                }
            }
            folding.as_secs_f64() / CHECKPOINTS as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}
