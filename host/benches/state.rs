//! Elastic state on a real Kafka broker: how fast a shard comes back from
//! its changelog, and how long a job pauses when it is rescaled.
//!
//! `cargo bench -p sluice --bench state [-- --records N]`. The broker is
//! `SLUICE_BENCH_BROKERS`, else one started with scripts/kafka.sh on port
//! 19292.
//!
//! - Restore: one changelog partition holding N keys (default 1,000,000)
//!   with 100-byte values, written in a scattered key order as a job writes
//!   them, read back into a redb store exactly as a task
//!   restores a shard. The baseline, in the same run, reads the same records
//!   with the same consumer settings and writes nothing.
//! - Rescale pause: running-count over a backlog, 100 ms checkpoints; the
//!   job stops with a final checkpoint and starts with another parallelism
//!   (2 -> 3 -> 1 -> 4), its shards moving between the tasks' stores. The
//!   pause runs from the stop's final commit to the first output committed
//!   after the start.

#![allow(missing_docs, unreachable_pub)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use sluice::checkpoint::{CheckpointStore, TaskError};
use sluice::job::{CheckpointSpec, InputSpec, Job, JobSpec, OutputSpec};
use sluice::kafka::{self, ChangelogSpan, StartPosition, changelog, tools};
use sluice::runtime::{Runtime, RuntimeConfig};

const PARTITIONS: i32 = 4;

/// Rounds of the restore measurement; the figures are their medians.
const RESTORE_ROUNDS: usize = 3;

/// Restores `keys` keys from a fresh changelog, [`RESTORE_ROUNDS`] times,
/// each round timing the read-only baseline and then the restore; returns
/// the (restore, baseline) pairs.
fn restore(brokers: &str, run: &str, keys: usize) -> Vec<(Duration, Duration)> {
    let topic = format!("bench-changelog-{run}");
    let client = kafka::client_config(brokers, &BTreeMap::new());
    let clients = kafka::Clients::new(&client).expect("clients");
    changelog::ensure_topic(&clients, &topic, 1, Duration::from_secs(30)).expect("changelog topic");
    let produced = Instant::now();
    tools::produce_to(
        brokers,
        &topic,
        Some(0),
        // In a scattered order, as a job writes them (7919 is prime, so
        // this visits every key once).
        (0..keys).map(|i| (format!("key-{:08}", i * 7919 % keys).into_bytes(), vec![b'v'; 100])),
    )
    .expect("produce the changelog");
    eprintln!("wrote {keys} changelog records in {:.1}s", produced.elapsed().as_secs_f64());
    let reader: BaseConsumer = client.clone().set("group.id", "bench").create().expect("reader");
    let (_, end) = reader.fetch_watermarks(&topic, 0, Duration::from_secs(10)).expect("watermarks");
    let span = ChangelogSpan { from: 0, to: end };

    (0..RESTORE_ROUNDS)
        .map(|_| {
            // Baseline: the same read, nothing written.
            let started = Instant::now();
            let mut read = 0usize;
            changelog::restore(&client, &topic, 0, span, Duration::from_secs(60), &|| false, |chunk| {
                read += chunk.len();
                Ok::<_, TaskError>(())
            })
            .expect("read");
            let baseline = started.elapsed();
            assert_eq!(read, keys);

            let dir = tempfile::tempdir().expect("dir");
            let store = CheckpointStore::open(&dir.path().join("task-0.redb")).expect("store");
            let started = Instant::now();
            let restored = changelog::restore(&client, &topic, 0, span, Duration::from_secs(60), &|| false, |chunk| {
                store.restore_chunk(0, &chunk).map_err(TaskError::from)
            })
            .expect("restore");
            store.finish_restore(0, 1).expect("finish");
            let elapsed = started.elapsed();
            assert_eq!(restored.records, keys as u64);
            assert_eq!(store.shard_size(0).expect("size").keys, keys as u64);
            (elapsed, baseline)
        })
        .collect()
}

/// The job's config with `parallelism` tasks.
fn config(
    brokers: &str,
    id: &str,
    input: &str,
    output: &str,
    state: &std::path::Path,
    parallelism: u32,
) -> sluice::job::JobConfig {
    let spec = JobSpec {
        id: id.into(),
        brokers: brokers.into(),
        module: support::guest("running-count"),
        parallelism,
        batch_size: 512,
        state_dir: Some(state.to_path_buf()),
        input: InputSpec { topics: vec![input.into()], start: StartPosition::Earliest, sleep_after: "off".into() },
        output: OutputSpec { topics: vec![output.into()] },
        checkpoint: CheckpointSpec { interval: "100ms".into(), ..Default::default() },
        state: Default::default(),
        time: Default::default(),
        transform: Default::default(),
        limits: Default::default(),
        errors: Default::default(),
        kafka: BTreeMap::new(),
    };
    spec.validate("<bench>".as_ref(), std::path::Path::new(".")).expect("job config")
}

/// A read_committed reader of `topic`, positioned at its end now.
fn reader_at_end(brokers: &str, topic: &str) -> BaseConsumer {
    let reader: BaseConsumer = kafka::client_config(brokers, &BTreeMap::new())
        .set("group.id", "bench-reader")
        .set("isolation.level", "read_committed")
        .create()
        .expect("reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        let (_, high) = reader.fetch_watermarks(topic, p, Duration::from_secs(5)).expect("watermarks");
        tpl.add_partition_offset(topic, p, Offset::Offset(high)).expect("tpl");
    }
    reader.assign(&tpl).expect("assign");
    reader
}

/// Waits for the first record `reader` gets.
fn first_output(reader: &BaseConsumer) {
    let started = Instant::now();
    loop {
        if let Some(Ok(message)) = reader.poll(Duration::from_millis(5)) {
            let _ = message.offset();
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "no output within 2 minutes");
    }
}

/// Rescales a running job through `steps`; returns each step's pause.
fn rescale_pauses(brokers: &str, run: &str, records: usize, steps: &[u32]) -> Vec<(u32, u32, Duration)> {
    let id = format!("bench-rescale-{run}");
    let (input, output) = (format!("{id}-in"), format!("{id}-out"));
    tools::create_topics(brokers, &[(&input, PARTITIONS), (&output, PARTITIONS)]).expect("topics");
    tools::produce(
        brokers,
        &input,
        (0..records).map(|i| (format!("user-{:05}", i % 10_000).into_bytes(), vec![b'v'; 100])),
    )
    .expect("produce");
    let state = tempfile::tempdir().expect("state");
    let runtime = Arc::new(
        Runtime::new(RuntimeConfig { max_instances: 8, baseline: false, ..RuntimeConfig::default() }).expect("runtime"),
    );
    let mut pauses = Vec::new();
    let mut job =
        Job::start(config(brokers, &id, &input, &output, state.path(), steps[0]), Arc::clone(&runtime)).expect("job");
    for pair in steps.windows(2) {
        // Let it run a little, then rescale while the backlog lasts.
        std::thread::sleep(Duration::from_millis(1500));
        job.stop();
        job.join().expect("job");
        let reader = reader_at_end(brokers, &output);
        let stopped = Instant::now();
        job = Job::start(config(brokers, &id, &input, &output, state.path(), pair[1]), Arc::clone(&runtime))
            .expect("job");
        first_output(&reader);
        pauses.push((pair[0], pair[1], stopped.elapsed()));
    }
    job.stop();
    job.join().expect("job");
    pauses
}

fn main() {
    // `SLUICE_LOG=info` shows what the jobs do, with times.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    }
    let keys = support::records_arg(1_000_000);
    let brokers = support::bench_brokers();
    let run = support::run_id();
    support::guest("running-count");

    let rounds = restore(&brokers, &run, keys);
    let rate = |d: Duration| keys as f64 / d.as_secs_f64();
    println!("restore of {keys} keys with 100-byte values from one changelog partition:");
    println!("| round | read only (baseline) s | keys/s | restore into redb s | keys/s | restore / read |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for (round, (restore, baseline)) in rounds.iter().enumerate() {
        println!(
            "| {} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2}x |",
            round + 1,
            baseline.as_secs_f64(),
            rate(*baseline),
            restore.as_secs_f64(),
            rate(*restore),
            restore.as_secs_f64() / baseline.as_secs_f64()
        );
    }
    let median = |mut times: Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let restore = median(rounds.iter().map(|r| r.0).collect());
    let baseline = median(rounds.iter().map(|r| r.1).collect());
    println!(
        "median: read only {:.0} keys/s, restore {:.0} keys/s ({:.2}x the read time)",
        rate(baseline),
        rate(restore),
        restore.as_secs_f64() / baseline.as_secs_f64()
    );

    let pauses = rescale_pauses(&brokers, &run, 3_000_000, &[2, 3, 1, 4]);
    println!("\nrescale pause (final checkpoint committed -> first output after the restart), 100 ms checkpoints:");
    println!("| from | to | pause s |");
    println!("|---:|---:|---:|");
    for (from, to, pause) in pauses {
        println!("| {from} | {to} | {:.2} |", pause.as_secs_f64());
    }
}
