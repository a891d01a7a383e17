//! End-to-end throughput on a real Kafka broker, in one run: sluice with the
//! running-count guest (stateful), sluice with the uppercase guest
//! (stateless), and a native rdkafka copier with the same transactional
//! settings and no Wasm (the practical limit). Then the time from a restart
//! (after kill -9) to the first newly committed output.
//!
//! `cargo bench -p sluice --bench pipeline [-- --records N] [--keys N]`. The broker is
//! `SLUICE_BENCH_BROKERS`, else one started with scripts/kafka.sh on port
//! 19292. Every system reads the same input topic (4 partitions, 100-byte
//! values, 10,000 keys unless `--keys` says) with 2 tasks and 1 s checkpoints; its time runs
//! from start until its committed offsets cover the whole input.

#![allow(missing_docs, unreachable_pub)]

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "peers/native.rs"]
mod native;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use sluice::checkpoint::Coordinator;
use sluice::job::{CheckpointSpec, InputSpec, Job, JobSpec, OutputSpec, StateSpec};
use sluice::kafka::{self, StartPosition, tools};
use sluice::record::OutputRecord;
use sluice::runtime::{Runtime, RuntimeConfig};

const PARTITIONS: i32 = 4;
const TASKS: usize = 2;
/// Distinct keys in the input, by default (`--keys N`).
const KEYS: usize = 10_000;

/// Sum over the input partitions of the group's committed offsets.
fn committed_total(consumer: &BaseConsumer, input: &str) -> i64 {
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(input, p);
    }
    match consumer.committed_offsets(tpl, Duration::from_secs(5)) {
        Ok(tpl) => tpl.elements().iter().map(|e| if let Offset::Offset(o) = e.offset() { o } else { 0 }).sum(),
        Err(_) => 0,
    }
}

/// Waits until `group` committed offsets covering `total` input records.
fn wait_committed(brokers: &str, group: &str, input: &str, total: i64) -> Duration {
    let started = Instant::now();
    let consumer: BaseConsumer =
        kafka::client_config(brokers, &BTreeMap::new()).set("group.id", group).create().expect("consumer");
    while committed_total(&consumer, input) < total {
        assert!(started.elapsed() < Duration::from_secs(600), "{group} did not finish within 10 minutes");
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

/// How a sluice run is set up.
#[derive(Clone, Copy)]
struct Setup {
    /// The checkpoint interval.
    interval: &'static str,
    /// Whether the job keeps a changelog.
    changelog: bool,
}

/// A run's wall time and the process's CPU time over it.
#[derive(Clone, Copy)]
struct Measured {
    wall: Duration,
    cpu: Duration,
}

/// CPU time (user + system) of this process so far.
fn process_cpu() -> Duration {
    support::process_cpu("self").unwrap_or_default()
}

fn run_sluice(brokers: &str, input: &str, guest: &str, total: i64, run: &str, setup: Setup) -> Measured {
    let id = format!("bench-{guest}-{}-{}-{run}", setup.interval, if setup.changelog { "log" } else { "nolog" });
    let output = format!("{id}-out");
    tools::create_topics(brokers, &[(&output, PARTITIONS)]).expect("topics");
    let state_dir = tempfile::tempdir().expect("state dir");
    let spec = JobSpec {
        id: id.clone(),
        brokers: brokers.into(),
        module: support::guest(guest),
        parallelism: TASKS as u32,
        batch_size: 512,
        state_dir: Some(state_dir.path().to_path_buf()),
        input: InputSpec { topics: vec![input.into()], start: StartPosition::Earliest, sleep_after: "off".into() },
        output: OutputSpec { topics: vec![output] },
        checkpoint: CheckpointSpec { interval: setup.interval.into(), ..Default::default() },
        state: StateSpec { changelog: setup.changelog, changelog_topic: None },
        time: Default::default(),
        transform: Default::default(),
        limits: Default::default(),
        errors: Default::default(),
        kafka: BTreeMap::new(),
    };
    let config = spec.validate("<bench>".as_ref(), std::path::Path::new(".")).expect("job config");
    let runtime = Arc::new(
        Runtime::new(RuntimeConfig { max_instances: 8, baseline: false, ..RuntimeConfig::default() }).expect("runtime"),
    );
    // Compile (optimized, or load from the cache) before the clock starts.
    runtime.load_file(&config.module).expect("module");
    let group = config.group();
    let (started, cpu) = (Instant::now(), process_cpu());
    let job = Job::start(config, runtime).expect("job");
    wait_committed(brokers, &group, input, total);
    let measured = Measured { wall: started.elapsed(), cpu: process_cpu().saturating_sub(cpu) };
    job.stop();
    job.join().expect("job");
    measured
}

/// The practical limit: the same source, sink and transactions, no Wasm.
fn run_copier(brokers: &str, input: &str, total: i64, run: &str) -> Measured {
    let id = format!("bench-copier-{run}");
    let output = format!("{id}-out");
    tools::create_topics(brokers, &[(&output, PARTITIONS)]).expect("topics");
    let group = format!("sluice.{id}");
    let config = kafka::client_config(brokers, &BTreeMap::new());
    let stop = AtomicBool::new(false);
    let coordinator = Coordinator::new(Duration::from_secs(1));
    let (started, cpu) = (Instant::now(), process_cpu());
    std::thread::scope(|scope| {
        let tasks: Vec<_> = (0..TASKS)
            .map(|index| {
                let (config, group, output, id, coordinator, stop) =
                    (&config, &group, &output, &id, &coordinator, &stop);
                scope.spawn(move || {
                    let transactional_id = format!("sluice.{id}.{index}");
                    let task = native::Task {
                        config,
                        group,
                        transactional_id: &transactional_id,
                        input,
                        partitions: native::partitions_of(index, TASKS, PARTITIONS),
                        output,
                    };
                    native::run(&task, coordinator, stop, |record| OutputRecord {
                        key: record.key.clone(),
                        value: record.value.clone(),
                        headers: Vec::new(),
                        topic: None,
                    })
                })
            })
            .collect();
        wait_committed(brokers, &group, input, total);
        let measured = Measured { wall: started.elapsed(), cpu: process_cpu().saturating_sub(cpu) };
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.join().expect("copier thread").expect("copier");
        }
        measured
    })
}

/// kill -9 a running `sluice run`, produce more input, restart it, and time
/// until the first newly committed output is readable.
fn restart_to_first_output(brokers: &str, run: &str) -> Duration {
    let id = format!("bench-restart-{run}");
    let (input, output) = (format!("{id}-in"), format!("{id}-out"));
    tools::create_topics(brokers, &[(&input, PARTITIONS), (&output, PARTITIONS)]).expect("topics");
    let dir = tempfile::tempdir().expect("dir");
    let job_file = dir.path().join("job.toml");
    std::fs::write(
        &job_file,
        format!(
            "id = \"{id}\"\nbrokers = \"{brokers}\"\nmodule = {:?}\nparallelism = 2\n[input]\ntopics = [\"{input}\"]\n\
             [output]\ntopics = [\"{output}\"]\n[checkpoint]\ninterval = \"100ms\"\n",
            support::guest("running-count")
        ),
    )
    .expect("job file");
    let spawn = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("run")
            .arg(&job_file)
            .env("SLUICE_LOG", "error")
            .env("SLUICE_CACHE_DIR", support::workspace_root().join("target").join("test-cache"))
            .spawn()
            .expect("spawn sluice run")
    };
    tools::produce(brokers, &input, (0..10_000).map(|i| (format!("k{}", i % 100).into_bytes(), b"v".to_vec())))
        .expect("produce");
    let mut first = spawn();
    wait_committed(brokers, &format!("sluice.{id}"), &input, 10_000);
    first.kill().expect("kill -9");
    first.wait().expect("wait");

    // A reader positioned at the end of the committed output.
    let reader: BaseConsumer = kafka::client_config(brokers, &BTreeMap::new())
        .set("group.id", format!("{id}-reader"))
        .set("isolation.level", "read_committed")
        .create()
        .expect("reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        let (_, high) = reader.fetch_watermarks(&output, p, Duration::from_secs(5)).expect("watermarks");
        tpl.add_partition_offset(&output, p, Offset::Offset(high)).expect("tpl");
    }
    reader.assign(&tpl).expect("assign");
    tools::produce(brokers, &input, (0..1_000).map(|i| (format!("k{}", i % 100).into_bytes(), b"v".to_vec())))
        .expect("produce");

    let started = Instant::now();
    let mut second = spawn();
    loop {
        if let Some(Ok(_)) = reader.poll(Duration::from_millis(10)) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "no output within 2 minutes of the restart");
    }
    let elapsed = started.elapsed();
    let _ = second.kill();
    let _ = second.wait();
    elapsed
}

fn main() {
    let records = support::records_arg(300_000);
    let keys = support::arg_value("--keys")
        .map(|k| k.parse::<usize>().ok().filter(|&n| n > 0).expect("--keys takes a positive number"))
        .unwrap_or(KEYS);
    let brokers = support::bench_brokers();
    let run = support::run_id();
    let input = format!("bench-in-{run}");
    tools::create_topics(&brokers, &[(&input, PARTITIONS)]).expect("topics");
    let produced = Instant::now();
    tools::produce(
        &brokers,
        &input,
        (0..records).map(|i| (format!("user-{:05}", (i * 7919) % keys).into_bytes(), vec![b'v'; 100])),
    )
    .expect("produce input");
    eprintln!("produced {records} records in {:.1}s", produced.elapsed().as_secs_f64());
    // Build the guests before any clock starts.
    support::guest("running-count");

    let total = records as i64;
    let copier = run_copier(&brokers, &input, total, &run);
    let second = Setup { interval: "1s", changelog: true };
    let stateless = run_sluice(&brokers, &input, "uppercase", total, &run, second);
    let mut runs =
        vec![("native rdkafka copier, 1s".to_string(), copier), ("sluice uppercase (stateless), 1s".into(), stateless)];
    for interval in ["1s", "100ms"] {
        for changelog in [false, true] {
            let measured = run_sluice(&brokers, &input, "running-count", total, &run, Setup { interval, changelog });
            let name = format!("sluice running-count, {interval}, changelog {}", if changelog { "on" } else { "off" });
            runs.push((name, measured));
        }
    }
    let rate = |m: &Measured| records as f64 / m.wall.as_secs_f64();
    let per_cpu = |m: &Measured| records as f64 / m.cpu.as_secs_f64().max(1e-9);
    println!("{records} records, {PARTITIONS} partitions, {TASKS} tasks, exactly-once");
    println!("| system, checkpoints | seconds | records/s | vs native copier | CPU s | records per CPU-second |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, m) in &runs {
        println!(
            "| {name} | {:.2} | {:.0} | {:.2} | {:.2} | {:.0} |",
            m.wall.as_secs_f64(),
            rate(m),
            rate(m) / rate(&copier),
            m.cpu.as_secs_f64(),
            per_cpu(m)
        );
    }
    for interval in ["1s", "100ms"] {
        let find = |on: bool| {
            let suffix = format!("{interval}, changelog {}", if on { "on" } else { "off" });
            runs.iter().find(|(name, _)| name.ends_with(&suffix)).map(|(_, m)| *m)
        };
        if let (Some(off), Some(on)) = (find(false), find(true)) {
            println!(
                "changelog cost at {interval} checkpoints: records/s {:.2}x, records per CPU-second {:.2}x (on / off)",
                rate(&on) / rate(&off),
                per_cpu(&on) / per_cpu(&off)
            );
        }
    }
    let restart = restart_to_first_output(&brokers, &run);
    println!("\nrestart (after kill -9) to first committed output: {:.2} s (100ms checkpoints)", restart.as_secs_f64());
}
