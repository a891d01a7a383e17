//! Rescaling: a job restarted with another parallelism moves each shard's
//! state to its new task, locally, and goes on exactly once: through kill -9
//! between rescales and mid-epoch, and through crashes in the middle of a
//! rescale. A shard's checkpoint ids only grow, whichever task holds it.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice::kafka::{self, tools};

use crate::support::{self, JobFiles, JobOptions, Running};

/// Starts the job with a failpoint that aborts it in the middle of its
/// rescale; returns its log.
fn crash_at(files: &JobFiles, failpoint: &str) -> String {
    let mut job = Running::start(files, &[("SLUICE_FAILPOINT", failpoint)]);
    let status = job.wait_exit(Duration::from_secs(120)).expect("the failpoint aborts the run");
    let log = job.log_text();
    assert!(!status.success(), "the run should have aborted at {failpoint}; log:\n{log}");
    log
}

#[test]
fn rescaling_2_3_1_4_through_kill_9_is_exactly_once() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "rescale", partitions: 4, ..Default::default() });
    let mut inputs = support::produce_keyed(&brokers, &files.input, 0..6_000, 40);

    // Two tasks.
    support::run_then_kill(&files, 1_000);

    // Three: the first start dies after copying one of the two shards that
    // move; the next one finishes the rescale.
    support::set_parallelism(&files, 3);
    crash_at(&files, "rescale-during-copy");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 6_000..9_000, 40));
    let log = support::run_then_kill(&files, 4_000);
    assert!(log.contains("rescaled: the shards' state moved to their new tasks"), "log:\n{log}");

    // One: the first start dies once the new assignment is recorded, before
    // the old stores are cleaned up.
    support::set_parallelism(&files, 1);
    crash_at(&files, "rescale-before-sweep");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 9_000..11_000, 40));
    support::run_then_kill(&files, 7_000);
    let stores: Vec<_> = std::fs::read_dir(files.dir.path().join(".sluice").join("state").join(&files.id))
        .map(|dir| dir.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(!stores.iter().any(|name| name == "task-1.redb" || name == "task-2.redb"), "stores left: {stores:?}");

    // Four, to the end.
    support::set_parallelism(&files, 4);
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 11_000..13_000, 40));
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, 13_000, Duration::from_secs(180));
    let log = job.log_text();
    assert!(job.terminate().success(), "log:\n{log}");
    support::verify_running_count(&committed, &inputs);
}

/// The committed checkpoint id of each shard of `files`' job.
fn shard_checkpoints(files: &JobFiles, partitions: i32) -> BTreeMap<u32, u64> {
    let brokers = support::brokers();
    let client = kafka::client_config(&brokers, &Default::default());
    let source = kafka::Source::connect(&client, &format!("sluice.{}", files.id), kafka::StartPosition::Earliest)
        .expect("consumer");
    let all: Vec<(String, i32)> = (0..partitions).map(|p| (files.input.clone(), p)).collect();
    source.committed(&all, Duration::from_secs(30)).expect("committed offsets").checkpoints
}

/// Produces `records` keyed records per burst into `partition`, `bursts`
/// times half a second apart, so the task holding it checkpoints many times
/// (its ids climb with the coordinator's ticks) while idle tasks do not.
fn trickle(files: &JobFiles, partition: i32, bursts: usize, records: usize, inputs: &mut BTreeMap<String, u64>) {
    for burst in 0..bursts {
        let batch: Vec<(Vec<u8>, Vec<u8>)> = (0..records)
            .map(|i| {
                let key = format!("p{partition}-{}", i % 7);
                *inputs.entry(key.clone()).or_insert(0) += 1;
                (key.into_bytes(), format!("value {burst} {i}").into_bytes())
            })
            .collect();
        tools::produce_to(&support::brokers(), &files.input, Some(partition), batch).expect("produce");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Runs the job (its parallelism set first) while `input` produces, until
/// `total` outputs are committed, then stops it cleanly.
fn run_phase(files: &JobFiles, parallelism: usize, total: usize, input: impl FnOnce()) {
    support::set_parallelism(files, parallelism);
    let job = Running::start(files, &[]);
    input();
    support::read_committed(&support::brokers(), &files.output, total, Duration::from_secs(120));
    let log = job.log_text();
    assert!(job.terminate().success(), "log:\n{log}");
}

/// Shard 3 moves from task 1 (whose ids stay low: its partitions are idle)
/// to task 0 (whose ids climb) and back. Its ids never go back, and task 1,
/// holding it again, numbers its checkpoints above it, for its other shard
/// too. Without that, shard 3's next delta in task 1 would carry an id below
/// the one it already committed: mistaken for an old one, never folded.
#[test]
fn a_shard_moving_back_and_forth_keeps_its_checkpoint_ids_growing() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "pingpong", partitions: 4, ..Default::default() });
    let mut inputs = BTreeMap::new();
    let mut total = 0;

    // Two tasks: shards 0 and 2 in task 0, 1 and 3 in task 1.
    let mut first = BTreeMap::new();
    trickle(&files, 1, 1, 50, &mut first);
    trickle(&files, 3, 1, 50, &mut first);
    support::add_counts(&mut inputs, first);
    total += 100;
    let mut busy = BTreeMap::new();
    run_phase(&files, 2, total + 600, || trickle(&files, 0, 6, 100, &mut busy));
    support::add_counts(&mut inputs, busy);
    total += 600;
    let before = shard_checkpoints(&files, 4);

    // Three tasks: shard 3 moves to task 0 and commits there.
    let mut moved = BTreeMap::new();
    run_phase(&files, 3, total + 600, || trickle(&files, 3, 6, 100, &mut moved));
    support::add_counts(&mut inputs, moved);
    total += 600;
    let there = shard_checkpoints(&files, 4);

    // Two again: shard 3 back in task 1, next to shard 1.
    let mut back = BTreeMap::new();
    run_phase(&files, 2, total + 200, || {
        trickle(&files, 3, 1, 100, &mut back);
        trickle(&files, 1, 1, 100, &mut back);
    });
    support::add_counts(&mut inputs, back);
    total += 200;
    let after = shard_checkpoints(&files, 4);

    let id =
        |map: &BTreeMap<u32, u64>, shard: u32| *map.get(&shard).unwrap_or_else(|| panic!("shard {shard}: {map:?}"));
    assert!(id(&before, 1) < id(&before, 0), "task 1 was idle, so its ids stayed low: {before:?}");
    assert!(id(&there, 3) > id(&before, 0).max(id(&before, 3)), "before {before:?}, there {there:?}");
    assert!(id(&after, 3) > id(&there, 3), "back in task 1: there {there:?}, after {after:?}");
    assert!(id(&after, 1) > id(&there, 3), "task 1 numbers above every shard it holds: {after:?}");

    let committed = support::read_committed(&brokers, &files.output, total, Duration::from_secs(60));
    support::verify_running_count(&committed, &inputs);
}
