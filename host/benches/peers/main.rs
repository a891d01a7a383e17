//! sluice beside the systems people would otherwise pick, through the same
//! exactly-once job on the same broker and machine, in one run.
//!
//! The job is a keyed running count: for each input record, emit
//! (key, number of records of that key so far) with exactly-once output.
//! The systems: sluice with the Rust and the Python running-count guests
//! (`sluice run`), a native rdkafka pipeline with the same transactions and
//! an in-memory count (no Wasm, no state snapshots: the practical limit),
//! Apache Flink 2.2 (local MiniCluster, KafkaSource, KafkaSink
//! EXACTLY_ONCE; bench/flink) and Kafka Streams 4.4 (exactly_once_v2;
//! bench/kstreams). Every system is its own process, with parallelism 2.
//!
//! Per checkpoint (commit) interval and system, each run on an input topic
//! of its own:
//! 1. Warm-up: the system starts on a warm-up of a twentieth of `--records`
//!    input records (4 partitions, 100-byte values, 10,000 keys) and runs
//!    until a read_committed reader has seen all of their output (startup,
//!    connections, compiles and a JIT's first work done; the time to the
//!    first output is reported as startup).
//! 2. Throughput: the harness stops the process (SIGSTOP), produces the
//!    backlog of `--records` records, and continues it (SIGCONT). records/s
//!    is the backlog over the time from SIGCONT until its last output became
//!    visible; records per CPU-second the backlog over the process's
//!    user+system time in that same time (from /proc: exact at SIGCONT, as a
//!    stopped process spends none, and interpolated between samples every
//!    100 ms at the end). Every record of the backlog is read, transformed
//!    and committed inside that span and nothing else is, so no prefetch or
//!    commit lag can move work out of it (measuring between the commits that
//!    showed 10% and 90% of a backlog present from the start did: a
//!    system that fetched ahead did part of the span's work before it).
//!    Peak memory is the process's VmHWM once the backlog is done.
//! 3. Latency: the harness then produces `--latency-rate` records/s for
//!    `--latency-seconds`, each stamped with its send time, and takes
//!    p50/p99 of (visible to read_committed - send time) over them.
//! 4. Correctness: all output is read back; per key, the counts must be
//!    exactly 1..n in order, with nothing missing or doubled. A system that
//!    fails this is reported as failed, not timed.
//!
//! With `--workload windowed-count` the job is a count per key in 1 s
//! tumbling event-time windows with a 200 ms bound on out-of-orderness
//! (sluice's examples/rust/windowed-count and its Python twin, Flink's
//! TumblingEventTimeWindows, Kafka Streams' windowed count with a grace);
//! what changes in the input, the check and the figures is in `windows`.
//!
//! Output: a markdown table in docs/peers.md, a chart in docs/peers.svg and
//! the raw numbers in docs/peers.json (docs/peers-windows.* for the
//! windowed count). Ratios to the native pipeline measured in the same run
//! are the headline.
//!
//! `bench/peers.sh` builds the Java jobs and runs this; directly:
//! `cargo bench -p sluice --bench peers -- [--workload count|windowed-count]
//! [--records N] [--systems a,b] [--intervals 1000,100] [--latency-rate R]
//! [--latency-seconds S] [--changelog on|off] [--repeat N]`. With
//! `--repeat N` every system runs N times at each interval (round after
//! round over the systems) and the run with the median records per
//! CPU-second is reported. With `PEERS_DEBUG` set, each run prints the CPU
//! its kinds of threads spent over the backlog, and the
//! windowed count also prints each paced window end's count of windows and
//! slowest latency, to tell a tail from a steady delay.
//! The broker is `SLUICE_BENCH_BROKERS`, else scripts/kafka.sh's on 19292.

#![allow(missing_docs, unreachable_pub)]

#[path = "../../tests/support/mod.rs"]
mod support;

mod native;
mod report;
mod windows;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use sluice::checkpoint::Coordinator;
use sluice::kafka::{self, tools};
use sluice::record::OutputRecord;
use sluice::runtime::{Runtime, RuntimeConfig};

use report::{Latency, Row, Setup};

const PARTITIONS: i32 = 4;
const PARALLELISM: usize = 2;
const KEYS: usize = 10_000;
const VALUE_BYTES: usize = 100;
/// Longest a system may take for the backlog before it counts as failed.
const PHASE_TIMEOUT: Duration = Duration::from_secs(20 * 60);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum System {
    Native,
    SluiceRust,
    SluicePython,
    Flink,
    KafkaStreams,
}

impl System {
    const ALL: [System; 5] =
        [System::Native, System::SluiceRust, System::SluicePython, System::Flink, System::KafkaStreams];

    fn id(self) -> &'static str {
        match self {
            System::Native => "native",
            System::SluiceRust => "sluice-rust",
            System::SluicePython => "sluice-python",
            System::Flink => "flink",
            System::KafkaStreams => "kafka-streams",
        }
    }

    fn label(self) -> &'static str {
        match self {
            System::Native => "native rdkafka (in-memory count)",
            System::SluiceRust => "sluice, Rust guest",
            System::SluicePython => "sluice, Python guest",
            System::Flink => "Flink 2.2 MiniCluster",
            System::KafkaStreams => "Kafka Streams 4.4",
        }
    }
}

/// The job every system runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    /// For each record, its key and the count of its key so far.
    Count,
    /// Per key, the count in each tumbling event-time window (`windows`).
    WindowedCount,
}

impl Workload {
    fn id(self) -> &'static str {
        match self {
            Workload::Count => "count",
            Workload::WindowedCount => "windowed-count",
        }
    }

    /// The sluice example that runs it.
    fn example(self) -> &'static str {
        match self {
            Workload::Count => "running-count",
            Workload::WindowedCount => "windowed-count",
        }
    }
}

/// One input record, as the harness produced it.
struct Input {
    key: String,
    /// Its timestamp (ms since the Unix epoch).
    at: i64,
}

/// What every run shares.
struct Bench {
    brokers: String,
    /// The broker's process, when the bench started it (scripts/kafka.sh's
    /// pid file): its CPU is reported beside the system's.
    broker_pid: Option<String>,
    run: String,
    /// The backlog's records (`--records`).
    records: usize,
    /// Whether sluice's jobs keep a changelog (its default; `--changelog
    /// off` leaves state on the local disk only, as Flink's heap state with
    /// checkpoints on the JobManager is).
    changelog: bool,
    workload: Workload,
    latency_rate: usize,
    latency_seconds: u64,
    /// Compile cache shared by the `sluice run` processes, filled before
    /// any clock starts.
    cache_dir: PathBuf,
    rust_guest: PathBuf,
    /// Built only when the Python guest is among the systems.
    python_guest: Option<PathBuf>,
    work: tempfile::TempDir,
}

/// The pid of the bench's own broker (port 19292), from scripts/kafka.sh's
/// pid file.
fn broker_pid() -> Option<String> {
    let home =
        std::env::var_os("SLUICE_KAFKA_HOME").map_or_else(|| support::workspace_root().join(".kafka"), PathBuf::from);
    let file = home.join("run-19292").join("kafka.pid");
    let pid = std::fs::read_to_string(file).ok()?.trim().to_string();
    support::process_cpu(&pid).is_some().then_some(pid)
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The key of input record `i`: 10,000 keys, spread over the partitions.
fn key_of(i: usize) -> String {
    format!("user-{:05}", (i * 7919) % KEYS)
}

fn main() {
    if support::arg_value("--native-child").is_some() {
        return run_native_child();
    }
    let docs = support::workspace_root().join("docs");
    let workload = match support::arg_value("--workload").as_deref() {
        None | Some("count") => Workload::Count,
        Some("windowed-count") => Workload::WindowedCount,
        Some(other) => panic!("unknown workload `{other}`; known: count, windowed-count"),
    };
    let stem = report::stem(workload.id());
    if std::env::args().any(|a| a == "--report-only") {
        // Render docs/<stem>.md and .svg again from docs/<stem>.json.
        let (setup, rows) = report::read(&docs.join(format!("{stem}.json"))).expect("read the report's json");
        report::write(&docs, &setup, &rows).expect("write the report");
        return;
    }
    let records = support::records_arg(2_000_000);
    let systems: Vec<System> = match support::arg_value("--systems") {
        None => System::ALL.to_vec(),
        Some(list) => list
            .split(',')
            .map(|s| {
                System::ALL.into_iter().find(|x| x.id() == s.trim()).unwrap_or_else(|| {
                    panic!("unknown system `{s}`; known: native, sluice-rust, sluice-python, flink, kafka-streams")
                })
            })
            .collect(),
    };
    let intervals: Vec<u64> = support::arg_value("--intervals")
        .unwrap_or_else(|| "1000,100".into())
        .split(',')
        .map(|v| v.trim().parse().expect("--intervals takes milliseconds, e.g. 1000,100"))
        .collect();
    for system in &systems {
        if let Some(jar) = java_jar(*system) {
            assert!(jar.exists(), "{} is missing: run bench/peers.sh, which builds it", jar.display());
        }
    }

    let root = support::workspace_root();
    let bench = Bench {
        brokers: support::bench_brokers(),
        broker_pid: std::env::var_os("SLUICE_BENCH_BROKERS").is_none().then(broker_pid).flatten(),
        run: format!("{}", now_ms() / 1000),
        records,
        changelog: match support::arg_value("--changelog").as_deref() {
            None | Some("on") => true,
            Some("off") => false,
            Some(other) => panic!("--changelog takes on or off, not `{other}`"),
        },
        workload,
        latency_rate: support::arg_value("--latency-rate").and_then(|v| v.parse().ok()).unwrap_or(5_000),
        latency_seconds: support::arg_value("--latency-seconds").and_then(|v| v.parse().ok()).unwrap_or(10),
        cache_dir: root.join("target").join("bench-cache"),
        rust_guest: support::example("rust", workload.example()),
        python_guest: systems.contains(&System::SluicePython).then(|| support::example("python", workload.example())),
        work: tempfile::tempdir().expect("work dir"),
    };
    // Compile the guests (optimized) into the shared cache before any clock
    // starts, as the Java jobs are built before theirs.
    let runtime = Runtime::new(RuntimeConfig {
        cache_dir: Some(bench.cache_dir.clone()),
        baseline: false,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    for guest in std::iter::once(&bench.rust_guest).chain(&bench.python_guest) {
        runtime.load_file(guest).expect("compile guest");
    }
    drop(runtime);

    let repeat: usize =
        support::arg_value("--repeat").map_or(1, |v| v.parse().expect("--repeat takes a count, e.g. 3"));
    assert!(repeat > 0, "--repeat takes a count of at least 1");
    let mut rows = Vec::new();
    for &interval in &intervals {
        // Round after round over the systems, so that a drift of the
        // machine or the broker during the runs falls on all of them.
        let mut runs: Vec<Vec<Row>> = systems.iter().map(|_| Vec::with_capacity(repeat)).collect();
        for round in 1..=repeat {
            for (&system, runs) in systems.iter().zip(&mut runs) {
                eprintln!("peers: {} at {interval} ms checkpoints (run {round} of {repeat}) ...", system.id());
                let row = run_one(&bench, system, interval, round);
                match &row.failure {
                    None => eprintln!(
                        "peers: {}: {:.0} records/s, {:.0} records per CPU-second, p99 {} ms",
                        system.id(),
                        row.records_per_second,
                        row.records_per_cpu_second,
                        row.latency.as_ref().map_or("-".into(), |l| l.p99_ms.to_string())
                    ),
                    Some(failure) => eprintln!("peers: {} FAILED: {failure}", system.id()),
                }
                runs.push(row);
            }
        }
        rows.extend(runs.into_iter().map(median_run));
    }
    let setup = Setup {
        workload: workload.id().to_string(),
        changelog: bench.changelog,
        records,
        partitions: PARTITIONS as u32,
        parallelism: PARALLELISM as u32,
        keys: KEYS as u32,
        value_bytes: VALUE_BYTES as u32,
        latency_rate: bench.latency_rate as u32,
        latency_seconds: bench.latency_seconds,
        repeat,
        cores: std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(0),
        date: report::today(),
    };
    report::write(&docs, &setup, &rows).expect("write the report");
    println!("{}", report::markdown(&setup, &rows));
    eprintln!("peers: wrote docs/{stem}.md, docs/{stem}.svg and docs/{stem}.json");
}

/// Of one system's runs at one interval, the one to report: the first
/// failed run if any failed, else the run with the median records per
/// CPU-second (of an even count, the lower middle).
fn median_run(mut runs: Vec<Row>) -> Row {
    if let Some(failed) = runs.iter().position(|r| r.failure.is_some()) {
        return runs.swap_remove(failed);
    }
    runs.sort_by(|a, b| a.records_per_cpu_second.total_cmp(&b.records_per_cpu_second));
    let middle = (runs.len() - 1) / 2;
    runs.swap_remove(middle)
}

/// The fat jar of a Java system, if it is one.
fn java_jar(system: System) -> Option<PathBuf> {
    let bench = support::workspace_root().join("bench");
    match system {
        System::Flink => Some(bench.join("flink").join("target").join("sluice-bench-flink.jar")),
        System::KafkaStreams => Some(bench.join("kstreams").join("target").join("sluice-bench-kstreams.jar")),
        _ => None,
    }
}

/// The command that runs `system` on `input` with `interval` ms
/// checkpoints, writing to `output`.
fn command(bench: &Bench, system: System, interval: u64, id: &str, input: &str, output: &str) -> Command {
    let root = support::workspace_root();
    let dir = bench.work.path().join(id);
    std::fs::create_dir_all(&dir).expect("run dir");
    let java = |script: &str| {
        let mut c = Command::new(root.join("bench").join(script).join("run.sh"));
        c.args(["--brokers", &bench.brokers, "--input", input, "--output", output, "--id", id]);
        c.args(["--checkpoint-ms", &interval.to_string(), "--parallelism", &PARALLELISM.to_string()]);
        c.args(["--workload", bench.workload.id()]);
        if bench.workload == Workload::WindowedCount {
            c.args(["--window-ms", &windows::WINDOW_MS.to_string()]);
            c.args(["--out-of-orderness-ms", &windows::BOUND_MS.to_string()]);
        }
        c
    };
    match system {
        System::Native => {
            let mut c = Command::new(std::env::current_exe().expect("own path"));
            c.args(["--native-child", "1", "--brokers", &bench.brokers, "--input", input, "--output", output]);
            c.args(["--id", id, "--checkpoint-ms", &interval.to_string(), "--workload", bench.workload.id()]);
            c
        }
        System::SluiceRust | System::SluicePython => {
            let module = match system {
                System::SluiceRust => &bench.rust_guest,
                _ => bench.python_guest.as_ref().expect("the Python guest is built when it is a system"),
            };
            let job_file = dir.join("job.toml");
            let mut job = format!(
                "id = \"{id}\"\nbrokers = \"{}\"\nmodule = {:?}\nparallelism = {PARALLELISM}\nstate-dir = {:?}\n\
                 [input]\ntopics = [\"{input}\"]\nsleep-after = \"off\"\n[output]\ntopics = [\"{output}\"]\n[checkpoint]\ninterval = \"{interval}ms\"\n",
                bench.brokers,
                module,
                dir.join("state"),
            );
            if !bench.changelog {
                job += "[state]\nchangelog = false\n";
            }
            if bench.workload == Workload::WindowedCount {
                job += &format!(
                    "[time]\nmax-out-of-orderness = \"{}ms\"\n[transform.config]\nwindow = \"{}ms\"\n",
                    windows::BOUND_MS,
                    windows::WINDOW_MS
                );
            }
            // (sleep-after: the other systems never let go of their clients
            // either, and the harness's pause must not look like idleness.)
            std::fs::write(&job_file, job).expect("job file");
            let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
            c.arg("run").arg(&job_file).env("SLUICE_LOG", "warn").env("SLUICE_CACHE_DIR", &bench.cache_dir);
            c
        }
        System::Flink => java("flink"),
        System::KafkaStreams => {
            let mut c = java("kstreams");
            c.arg("--state-dir").arg(dir.join("state"));
            c
        }
    }
}

/// One output record as the read_committed reader saw it.
struct Visible {
    partition: i32,
    offset: i64,
    key: String,
    value: String,
    at_ms: i64,
}

/// Reads `topic` with read_committed from the beginning on its own thread,
/// noting when each record became visible.
struct Reader {
    seen: Arc<Mutex<Vec<Visible>>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<(), String>>,
}

impl Reader {
    fn start(brokers: &str, topic: &str) -> Reader {
        let consumer: BaseConsumer = kafka::client_config(brokers, &BTreeMap::new())
            .set("group.id", format!("peers-reader-{topic}"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            // Visibility is noted when a fetch returns: keep the broker's
            // wait for more data short so it does not add to the latency.
            .set("fetch.wait.max.ms", "10")
            // librdkafka stops fetching a partition for fetch.queue.backoff.ms
            // (1 s by default) whenever its queue holds queued.min.messages
            // (100,000): a reader that far behind a burst of commits saw
            // nothing new for a second, and the records/s of every system
            // stopped near 175k, the reader's pace, not theirs.
            .set("fetch.queue.backoff.ms", "1")
            .set("queued.min.messages", "10000000")
            .set("queued.max.messages.kbytes", "2097151")
            .create()
            .expect("reader");
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(topic, p, Offset::Beginning).expect("assignment");
        }
        consumer.assign(&tpl).expect("assign the reader");
        let (seen, stop) = (Arc::default(), Arc::new(AtomicBool::new(false)));
        let (s, st) = (Arc::clone(&seen), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let seen: Arc<Mutex<Vec<Visible>>> = s;
            while !st.load(Ordering::Relaxed) {
                match consumer.poll(Duration::from_millis(50)) {
                    None => {}
                    Some(Err(e)) => return Err(format!("reading the output: {e}")),
                    Some(Ok(m)) => {
                        let v = Visible {
                            partition: m.partition(),
                            offset: m.offset(),
                            key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                            value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                            at_ms: now_ms(),
                        };
                        seen.lock().expect("reader lock").push(v);
                    }
                }
            }
            Ok(())
        });
        Reader { seen, stop, thread }
    }

    fn count(&self) -> usize {
        self.seen.lock().expect("reader lock").len()
    }

    fn finish(self) -> Result<Vec<Visible>, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| "the reader panicked".to_string())??;
        Ok(std::mem::take(&mut *self.seen.lock().expect("reader lock")))
    }
}

/// CPU samples of a process, every 100 ms.
struct Sampler {
    samples: Arc<Mutex<Vec<(i64, Duration)>>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Sampler {
    fn start(pid: String) -> Sampler {
        let (samples, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let (s, st) = (Arc::clone(&samples), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                if let Some(cpu) = support::process_cpu(&pid) {
                    s.lock().expect("sampler lock").push((now_ms(), cpu));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Sampler { samples, stop, thread }
    }

    /// CPU time at `at_ms`, interpolated between the samples around it.
    fn cpu_at(&self, at_ms: i64) -> Duration {
        let samples = self.samples.lock().expect("sampler lock");
        let after = samples.partition_point(|(t, _)| *t <= at_ms);
        match (after.checked_sub(1).and_then(|i| samples.get(i)), samples.get(after)) {
            (Some(&(t0, c0)), Some(&(t1, c1))) if t1 > t0 => {
                let f = (at_ms - t0) as f64 / (t1 - t0) as f64;
                c0 + (c1.saturating_sub(c0)).mul_f64(f)
            }
            (Some(&(_, c)), _) | (None, Some(&(_, c))) => c,
            (None, None) => Duration::ZERO,
        }
    }

    fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// One run's input topic and what the harness has put in it. Each run has
/// its own, so that every system reads the same warm-up and backlog, and
/// nothing of the runs before it.
struct RunInput {
    topic: String,
    /// Every record in `topic`, in order: the warm-up, the backlog, the paced
    /// records (for the windowed count, each followed by its flush).
    records: Vec<Input>,
    /// The windowed count's latest flush time: every partition has a record
    /// this late, so the windows `windows::expected` lists have closed.
    flushed_at: i64,
    /// The windowed count's event time during the paced phase.
    paced_clock: Option<windows::PacedClock>,
}

impl RunInput {
    fn new(topic: String) -> RunInput {
        RunInput { topic, records: Vec::new(), flushed_at: 0, paced_clock: None }
    }

    /// How many outputs the input so far is due to give: one per record, or
    /// one per window its flushes have closed.
    fn outputs_due(&self, workload: Workload) -> usize {
        match workload {
            Workload::Count => self.records.len(),
            Workload::WindowedCount => {
                windows::expected(self.records.iter().map(|i| (i.key.as_str(), i.at)), self.flushed_at).len()
            }
        }
    }

    /// Produces one record per entry of `times` (the windowed count's event
    /// times; `None`: the producer's clock) and, for the windowed count, the
    /// flush that closes their windows.
    fn produce(&mut self, bench: &Bench, times: &[Option<i64>]) -> Result<(), String> {
        let first = self.records.len();
        let batch =
            times.iter().enumerate().map(|(i, at)| (key_of(first + i).into_bytes(), vec![b'v'; VALUE_BYTES], *at));
        tools::produce_timed(&bench.brokers, &self.topic, None, batch).map_err(|e| format!("producing input: {e}"))?;
        self.records
            .extend(times.iter().enumerate().map(|(i, at)| Input { key: key_of(first + i), at: at.unwrap_or(0) }));
        if let Some(latest) = times.iter().flatten().max() {
            let (brokers, topic) = (bench.brokers.clone(), self.topic.clone());
            flush(self, windows::flush_after(*latest), |partition, key, value, at| {
                let record = (key.to_vec(), value.to_vec(), Some(at));
                tools::produce_timed(&brokers, &topic, Some(partition), [record])
                    .map(drop)
                    .map_err(|e| format!("producing a flush record: {e}"))
            })?;
        }
        Ok(())
    }
}

/// Runs one system at one interval (the `round`th time, for `--repeat`)
/// through every phase and checks its output.
fn run_one(bench: &Bench, system: System, interval: u64, round: usize) -> Row {
    // Each run its own job: input and output topics, consumer group,
    // transactional ids and state.
    let id = format!("peers-{}-{interval}-{}-{round}", system.id(), bench.run);
    let output = format!("{id}-out");
    let label = match (system, bench.workload) {
        (System::Native, Workload::WindowedCount) => "native rdkafka (in-memory windows)",
        _ => system.label(),
    };
    let mut row = Row::new(system.id(), label, interval);
    let mut input = RunInput::new(format!("{id}-in"));
    tools::create_topics(&bench.brokers, &[(&input.topic, PARTITIONS), (&output, PARTITIONS)]).expect("topics");
    let warmup = (bench.records / 20).max(1_000);
    let (warmup_times, backlog_times): (Vec<Option<i64>>, Vec<Option<i64>>) = match bench.workload {
        Workload::Count => (vec![None; warmup], vec![None; bench.records]),
        Workload::WindowedCount => {
            let (w, b) = windows::run_times(warmup, bench.records, now_ms());
            (w.into_iter().map(Some).collect(), b.into_iter().map(Some).collect())
        }
    };
    if let Err(e) = input.produce(bench, &warmup_times) {
        row.failure = Some(format!("the warm-up: {e}"));
        return row;
    }
    let reader = Reader::start(&bench.brokers, &output);
    let log_path = bench.work.path().join(format!("{id}.log"));
    let log = File::create(&log_path).expect("log file");
    let spawned_ms = now_ms();
    let child = command(bench, system, interval, &id, &input.topic, &output)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", system.id()));
    let mut child = Running { child, log: log_path };
    let pid = child.child.id();
    let sampler = Sampler::start(pid.to_string());
    let broker = bench.broker_pid.clone().map(Sampler::start);

    let mut sent = Vec::new();
    let mut backlog_end = 0;
    let mut timing = Timing {
        spawned_ms,
        resumed_ms: 0,
        cpu_resumed: Duration::ZERO,
        broker_cpu_resumed: None,
        backlog: bench.records,
    };
    let debug = std::env::var_os("PEERS_DEBUG").is_some();
    let outcome = (|| -> Result<(), String> {
        // 1. The warm-up.
        let due = input.outputs_due(bench.workload);
        child.wait_for(|| reader.count() >= due, PHASE_TIMEOUT, "the warm-up's output")?;

        // 2. The backlog, produced while the process is stopped.
        child.pause()?;
        let paused = Instant::now();
        input.produce(bench, &backlog_times)?;
        eprintln!(
            "peers: produced the backlog in {:.1} s while the process was stopped",
            paused.elapsed().as_secs_f64()
        );
        backlog_end = input.records.len();
        let due = input.outputs_due(bench.workload);
        let cpu = support::process_cpu(&pid.to_string()).ok_or("the process's CPU time is not readable")?;
        let broker_cpu = bench.broker_pid.as_deref().and_then(support::process_cpu);
        let threads_resumed = debug.then(|| thread_cpu(&pid.to_string()));
        (timing.resumed_ms, timing.cpu_resumed, timing.broker_cpu_resumed) = (now_ms(), cpu, broker_cpu);
        child.resume()?;
        child.wait_for(|| reader.count() >= due, PHASE_TIMEOUT, "the backlog's output")?;
        if let Some(before) = threads_resumed {
            print_thread_cpu(system.id(), &before, &thread_cpu(&pid.to_string()));
        }
        row.cpu_seconds_total = support::process_cpu(&pid.to_string()).unwrap_or_default().as_secs_f64();
        row.peak_rss_mib = support::proc_status(&pid.to_string(), "VmHWM") as f64 / 1024.0;

        // 3. Latency at a steady rate.
        sent = produce_paced(bench, &mut input)?;
        let expected = input.outputs_due(bench.workload);
        child.wait_for(
            || reader.count() >= expected,
            Duration::from_secs(bench.latency_seconds + 120),
            "the paced output",
        )?;
        // A little longer, so that duplicates would show up.
        std::thread::sleep(Duration::from_secs(2));
        Ok(())
    })();
    child.terminate();
    let seen = reader.finish();
    let samplers = Samplers { system: sampler, broker };
    let result = outcome.and(seen).and_then(|seen| match bench.workload {
        Workload::Count => analyse(&input, &seen, &sent, &samplers, &timing, &mut row),
        Workload::WindowedCount => analyse_windows(&input, &seen, backlog_end, &samplers, &timing, &mut row),
    });
    samplers.system.finish();
    if let Some(broker) = samplers.broker {
        broker.finish();
    }
    if let Err(e) = result {
        row.failure = Some(format!("{e}; the last lines of its log:\n{}", child.log_tail(20)));
    }
    delete_run_topics(&bench.brokers, &id);
    row
}

/// Deletes the topics of run `id` once its output is checked: its input,
/// output and warm-up, and the systems' own (sluice's changelog, Kafka
/// Streams' changelog and repartition topics), which all have `id` in their
/// names. The bench's broker keeps what it is given, and a run writes about
/// a gigabyte; kept, they filled this machine's disk after a few dozen
/// runs, and the broker failed halfway through a run. A failure here is
/// reported, not fatal: the figures are taken.
fn delete_run_topics(brokers: &str, id: &str) {
    let listed = kafka::client_config(brokers, &Default::default())
        .create::<BaseConsumer>()
        .and_then(|client| client.fetch_metadata(None, Duration::from_secs(10)));
    let topics: Vec<String> = match listed {
        Ok(metadata) => metadata.topics().iter().map(|t| t.name().to_owned()).filter(|t| t.contains(id)).collect(),
        Err(e) => {
            eprintln!("peers: listing the topics of {id} to delete them: {e}");
            return;
        }
    };
    for topic in &topics {
        if let Err(e) = tools::delete_topic(brokers, topic) {
            eprintln!("peers: deleting {topic}: {e}");
        }
    }
}

/// CPU time per kind of thread of a process: threads grouped by name with
/// the digits dropped (`rdk:broker1` and `rdk:broker2` are `rdk:broker`).
/// A thread that ended is missing. For `PEERS_DEBUG`.
fn thread_cpu(pid: &str) -> BTreeMap<String, Duration> {
    let mut by_kind = BTreeMap::new();
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return by_kind };
    for thread in threads.flatten() {
        let Ok(stat) = std::fs::read_to_string(thread.path().join("stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let kind: String = stat[open + 1..close].chars().filter(|c| !c.is_ascii_digit()).collect();
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let ticks: u64 = [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<u64>().ok()).sum();
        *by_kind.entry(kind).or_insert(Duration::ZERO) += Duration::from_millis(ticks * 10);
    }
    by_kind
}

/// Prints the CPU each kind of thread spent between two [`thread_cpu`]s.
fn print_thread_cpu(system: &str, before: &BTreeMap<String, Duration>, after: &BTreeMap<String, Duration>) {
    let mut spent: Vec<(String, Duration)> = after
        .iter()
        .map(|(kind, &cpu)| (kind.clone(), cpu.saturating_sub(before.get(kind).copied().unwrap_or_default())))
        .filter(|(_, cpu)| !cpu.is_zero())
        .collect();
    spent.sort_by_key(|(_, cpu)| std::cmp::Reverse(*cpu));
    let list: Vec<String> = spent.iter().map(|(kind, cpu)| format!("{kind} {:.2} s", cpu.as_secs_f64())).collect();
    eprintln!("peers: {system}: CPU by thread over the backlog: {}", list.join(", "));
}

/// The CPU samples of a run: the system's, and the broker's if the bench
/// started it (`SLUICE_BENCH_BROKERS` names a broker it cannot see).
struct Samplers {
    system: Sampler,
    broker: Option<Sampler>,
}

/// When a run's process started and when it was continued on the backlog.
struct Timing {
    spawned_ms: i64,
    resumed_ms: i64,
    /// The process's CPU time when it was continued.
    cpu_resumed: Duration,
    /// The broker's then, if the bench knows its process.
    broker_cpu_resumed: Option<Duration>,
    /// The backlog's records.
    backlog: usize,
}

/// Throughput, CPU and latency from what the reader saw; and the check that
/// the output is exactly the running count of the input.
fn analyse(
    input: &RunInput,
    seen: &[Visible],
    sent: &[(String, i64)],
    samplers: &Samplers,
    timing: &Timing,
    row: &mut Row,
) -> Result<(), String> {
    let mut expected: HashMap<String, u64> = HashMap::new();
    let inputs = &input.records;
    // The paced records are the last `sent.len()`.
    for input in &inputs[..inputs.len() - sent.len()] {
        *expected.entry(input.key.clone()).or_default() += 1;
    }
    // (key, count) of each paced record, to its send time.
    let mut sent_at: HashMap<(&str, u64), i64> = HashMap::with_capacity(sent.len());
    for (key, at) in sent {
        let n = expected.entry(key.clone()).or_default();
        *n += 1;
        sent_at.insert((key.as_str(), *n), *at);
    }
    verify_running_count(seen, &expected)?;

    // Each output is a paced record's (its latency) or the backlog's (its
    // visibility time). The counts parse: verify_running_count checked them.
    let (mut backlog, mut latencies) = (Vec::with_capacity(seen.len()), Vec::with_capacity(sent.len()));
    for v in seen {
        match sent_at.get(&(v.key.as_str(), v.value.parse().unwrap_or(0))) {
            Some(at) => latencies.push(v.at_ms - at),
            None => backlog.push(v.at_ms),
        }
    }

    // Throughput from the moment the process was continued on the backlog
    // to its last output's visibility.
    row.startup_seconds =
        (backlog.iter().min().copied().unwrap_or(timing.spawned_ms) - timing.spawned_ms) as f64 / 1000.0;
    let done_ms = backlog.iter().max().copied().unwrap_or(timing.resumed_ms);
    throughput(row, samplers, timing, done_ms);

    if latencies.len() != sent_at.len() {
        return Err(format!("{} paced records sent, {} of their outputs seen", sent_at.len(), latencies.len()));
    }
    latency(row, latencies);
    Ok(())
}

/// The backlog's records over the time from `timing.resumed_ms` to
/// `done_ms`: records/s, and per CPU-second of the process in that time;
/// and the broker's CPU time in it.
fn throughput(row: &mut Row, samplers: &Samplers, timing: &Timing, done_ms: i64) {
    let span = ((done_ms - timing.resumed_ms) as f64 / 1000.0).max(0.001);
    let cpu = samplers.system.cpu_at(done_ms).saturating_sub(timing.cpu_resumed).as_secs_f64().max(0.001);
    row.broker_cpu_seconds_backlog = samplers
        .broker
        .as_ref()
        .zip(timing.broker_cpu_resumed)
        .map(|(broker, resumed)| broker.cpu_at(done_ms).saturating_sub(resumed).as_secs_f64());
    row.records_per_second = timing.backlog as f64 / span;
    row.records_per_cpu_second = timing.backlog as f64 / cpu;
    row.backlog_seconds = span;
    row.cpu_seconds_backlog = cpu;
}

/// p50, p99 and the largest of `latencies` (ms).
fn latency(row: &mut Row, mut latencies: Vec<i64>) {
    latencies.sort_unstable();
    let pct =
        |p: f64| latencies.get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1))).copied();
    row.latency = match (pct(0.5), pct(0.99)) {
        (Some(p50), Some(p99)) => {
            Some(Latency { p50_ms: p50, p99_ms: p99, max_ms: latencies.last().copied().unwrap_or(0) })
        }
        _ => None,
    };
}

/// The windowed count's figures and check: every window due exactly once
/// with its count (`windows::verify`); throughput from the backlog's window
/// ends; latency from each later window's end.
fn analyse_windows(
    input: &RunInput,
    seen: &[Visible],
    backlog: usize,
    samplers: &Samplers,
    timing: &Timing,
    row: &mut Row,
) -> Result<(), String> {
    let inputs = &input.records;
    let expected = windows::expected(inputs.iter().map(|i| (i.key.as_str(), i.at)), input.flushed_at);
    let seen: Vec<windows::Seen> =
        seen.iter().map(|v| windows::parse(&v.key, &v.value, v.at_ms)).collect::<Result<_, _>>()?;
    windows::verify(&seen, &expected)?;

    // The warm-up's and the backlog's windows: those of their records,
    // closed before the paced records came (their own flushes closed them
    // all). The last of them to become visible ends the backlog's span.
    let backlog_end = inputs[..backlog].iter().map(|i| i.at).max().unwrap_or(0);
    let (old, new): (Vec<&windows::Seen>, Vec<&windows::Seen>) = seen.iter().partition(|w| w.start <= backlog_end);
    row.startup_seconds =
        (old.iter().map(|w| w.at_ms).min().unwrap_or(timing.spawned_ms) - timing.spawned_ms) as f64 / 1000.0;
    throughput(row, samplers, timing, old.iter().map(|w| w.at_ms).max().unwrap_or(timing.resumed_ms));
    // Latency is taken over the windows the paced records closed. The last
    // ones (about a tenth of the samples, so they would be the p99) are
    // closed by the flush, which the harness sends a whole window after the
    // paced records stop: their wait is the harness's, not the system's.
    let paced_latest =
        inputs[backlog..].iter().filter(|i| !i.key.starts_with("flush-")).map(|i| i.at).max().unwrap_or(i64::MIN);
    // A window closes once every partition has a record past its end plus
    // the bound; 50 ms more covers the partitions whose last paced record
    // came a little before the overall last one.
    let closed_by_traffic: Vec<&&windows::Seen> =
        new.iter().filter(|w| w.end.saturating_add(windows::BOUND_MS + 50) <= paced_latest).collect();
    if closed_by_traffic.is_empty() {
        return Err("no window that the paced records closed was committed".into());
    }
    let clock = input.paced_clock.ok_or("no paced phase ran")?;
    latency(row, closed_by_traffic.iter().map(|w| w.at_ms - clock.wall_at(w.end)).collect());
    if std::env::var_os("PEERS_DEBUG").is_some() {
        let mut by_end: BTreeMap<i64, (usize, i64)> = BTreeMap::new();
        for w in &new {
            let e = by_end.entry(w.end).or_default();
            e.0 += 1;
            e.1 = e.1.max(w.at_ms - clock.wall_at(w.end));
        }
        eprintln!("peers: by window end (count, max latency): {by_end:?}");
    }
    Ok(())
}

/// Per key, in partition order, the counts must be exactly 1..=n.
fn verify_running_count(seen: &[Visible], expected: &HashMap<String, u64>) -> Result<(), String> {
    let total: u64 = expected.values().sum();
    if seen.len() as u64 != total {
        return Err(format!("{} committed outputs for {total} inputs", seen.len()));
    }
    let mut order: Vec<&Visible> = seen.iter().collect();
    order.sort_by_key(|v| (v.partition, v.offset));
    let mut next: HashMap<&str, u64> = HashMap::new();
    for v in order {
        let count: u64 =
            v.value.parse().map_err(|_| format!("output value {:?} of key {} is not a count", v.value, v.key))?;
        let n = next.entry(v.key.as_str()).or_insert(0);
        *n += 1;
        if count != *n {
            return Err(format!(
                "key {}: output {} where {} was due (partition {}, offset {})",
                v.key, count, n, v.partition, v.offset
            ));
        }
    }
    for (key, n) in expected {
        if next.get(key.as_str()).copied().unwrap_or(0) != *n {
            return Err(format!("key {key}: {} outputs for {n} inputs", next.get(key.as_str()).copied().unwrap_or(0)));
        }
    }
    Ok(())
}

/// The windowed count's flush: a record stamped `at` to every partition
/// (sent by `send(partition, key, value, at)`), so that every partition's
/// watermark passes `at` less the bound. Each partition's has a key of its
/// own: as with any Kafka producer, one key lives in one partition.
fn flush(
    input: &mut RunInput,
    at: i64,
    mut send: impl FnMut(i32, &[u8], &[u8], i64) -> Result<(), String>,
) -> Result<(), String> {
    let value = vec![b'v'; VALUE_BYTES];
    for partition in 0..PARTITIONS {
        let key = format!("flush-{partition}");
        send(partition, key.as_bytes(), &value, at)?;
        input.records.push(Input { key, at });
    }
    input.flushed_at = at;
    Ok(())
}

/// Produces `latency_rate` records/s for `latency_seconds`, each stamped
/// with its send time (the windowed count: with [`windows::PacedClock`]);
/// returns (key, that time in ms) in send order.
fn produce_paced(bench: &Bench, input: &mut RunInput) -> Result<Vec<(String, i64)>, String> {
    let producer: BaseProducer = kafka::client_config(&bench.brokers, &BTreeMap::new())
        .set("enable.idempotence", "true")
        .set("linger.ms", "0")
        .create()
        .map_err(|e| format!("creating the paced producer: {e}"))?;
    // A new idempotent producer needs a connection, metadata and a producer
    // id before its first record leaves; records sent meanwhile waited about
    // half a second and made up the p99 of every system alike. So first one
    // record on a topic of its own, delivered.
    let warmup = format!("{}-warmup", input.topic);
    tools::create_topics(&bench.brokers, &[(&warmup, 1)]).map_err(|e| format!("creating {warmup}: {e}"))?;
    producer
        .send(BaseRecord::to(&warmup).key("warm-up").payload("warm-up"))
        .map_err(|(e, _)| format!("warming up: {e}"))?;
    producer.flush(Duration::from_secs(30)).map_err(|e| format!("warming up: {e}"))?;
    producer
        .client()
        .fetch_metadata(Some(&input.topic), Duration::from_secs(10))
        .map_err(|e| format!("metadata: {e}"))?;
    let tick = Duration::from_millis(10);
    let per_tick = (bench.latency_rate / 100).max(1);
    let ticks = bench.latency_seconds * 100;
    let mut sent = Vec::with_capacity(per_tick * ticks as usize);
    let started = Instant::now();
    let value = vec![b'v'; VALUE_BYTES];
    // The running count's records carry their send time (its latency is
    // from it); the windowed count's, a clock that runs fast.
    let clock = (bench.workload == Workload::WindowedCount).then(|| {
        let reached = input.records.iter().map(|i| i.at).max().unwrap_or(i64::MIN);
        windows::PacedClock::start(now_ms(), reached.saturating_add(1))
    });
    input.paced_clock = clock;
    for t in 0..ticks {
        let due = started + tick * t as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        for _ in 0..per_tick {
            let key = key_of(input.records.len());
            let at = clock.map_or_else(now_ms, |c| c.event_at(now_ms()));
            let record = BaseRecord::to(&input.topic).key(key.as_bytes()).payload(&value).timestamp(at);
            producer.send(record).map_err(|(e, _)| format!("sending a paced record: {e}"))?;
            input.records.push(Input { key: key.clone(), at });
            sent.push((key, at));
        }
        producer.poll(Duration::ZERO);
    }
    if bench.workload == Workload::WindowedCount {
        // The windowed count's last windows are closed by a flush once the
        // clock has passed them, as the next records would; through this
        // producer, which is warm (a new one waits half a second or more).
        let event_now = || clock.map_or_else(now_ms, |c| c.event_at(now_ms()));
        let latest = sent.last().map_or_else(event_now, |(_, at)| *at);
        let at = windows::flush_after(latest);
        let wall_at = clock.map_or(at, |c| c.wall_at(at));
        if let Ok(wait) = u64::try_from(wall_at - now_ms()) {
            std::thread::sleep(Duration::from_millis(wait));
        }
        let topic = input.topic.clone();
        flush(input, at.max(event_now()), |partition, key, value, at| {
            let record = BaseRecord::to(&topic).partition(partition).key(key).payload(value).timestamp(at);
            producer.send(record).map_err(|(e, _)| format!("sending a flush record: {e}"))
        })?;
    }
    producer.flush(Duration::from_secs(30)).map_err(|e| format!("flushing the paced records: {e}"))?;
    Ok(sent)
}

/// A system's process.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    /// Waits until `done`, failing if the process exits or `timeout` passes.
    fn wait_for(&mut self, done: impl Fn() -> bool, timeout: Duration, what: &str) -> Result<(), String> {
        let started = Instant::now();
        while !done() {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("the process exited ({status}) before {what} was committed"));
            }
            if started.elapsed() > timeout {
                return Err(format!("{what} was not committed within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Stops the process (SIGSTOP) and waits until every thread of it has
    /// stopped, so that it spends no CPU until [`Running::resume`].
    fn pause(&mut self) -> Result<(), String> {
        self.signal("-STOP")?;
        let tasks = format!("/proc/{}/task", self.child.id());
        let started = Instant::now();
        loop {
            let stopped = std::fs::read_dir(&tasks)
                .map_err(|e| format!("reading {tasks}: {e}"))?
                .filter_map(Result::ok)
                .all(|task| thread_state(&task.path().join("stat")).is_none_or(|state| state == 'T'));
            if stopped {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(10) {
                return Err("the process did not stop within 10 s of SIGSTOP".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Continues the process stopped by [`Running::pause`] (SIGCONT).
    fn resume(&mut self) -> Result<(), String> {
        self.signal("-CONT")
    }

    fn signal(&self, signal: &str) -> Result<(), String> {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .map_err(|e| format!("kill {signal}: {e}"))?;
        if status.success() { Ok(()) } else { Err(format!("kill {signal} failed ({status})")) }
    }

    /// SIGTERM (and SIGCONT, should it be stopped), then SIGKILL after 30 s.
    fn terminate(&mut self) {
        let _ = self.signal("-TERM");
        let _ = self.resume();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// A thread's state letter from its /proc stat file (`T`: stopped), or
/// `None` if the thread has gone.
fn thread_state(stat: &std::path::Path) -> Option<char> {
    let text = std::fs::read_to_string(stat).ok()?;
    text.rsplit_once(')')?.1.trim_start().chars().next()
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The native pipeline with a running count in a `HashMap` (or the
/// windowed count's `windows::Operator`), in a child
/// process of this bench (so its CPU and memory are measured like the
/// others') until killed.
fn run_native_child() {
    let need = |name: &str| support::arg_value(name).unwrap_or_else(|| panic!("the native child needs {name}"));
    let (brokers, input, output, id) = (need("--brokers"), need("--input"), need("--output"), need("--id"));
    let interval: u64 = need("--checkpoint-ms").parse().expect("--checkpoint-ms");
    let windowed = need("--workload") == Workload::WindowedCount.id();
    let config = kafka::client_config(&brokers, &BTreeMap::new());
    let coordinator = Coordinator::new(Duration::from_millis(interval));
    let never = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let tasks: Vec<_> = (0..PARALLELISM)
            .map(|index| {
                let (config, input, output, id, coordinator, never) =
                    (&config, &input, &output, &id, &coordinator, &never);
                scope.spawn(move || {
                    let transactional_id = format!("{id}.{index}");
                    let task = native::Task {
                        config,
                        group: id,
                        transactional_id: &transactional_id,
                        input,
                        partitions: native::partitions_of(index, PARALLELISM, PARTITIONS),
                        output,
                    };
                    if windowed {
                        let mut operator = windows::Operator::default();
                        return native::run_many(&task, coordinator, never, |record, out| {
                            operator.process(record, out)
                        });
                    }
                    let mut counts: HashMap<Vec<u8>, u64> = HashMap::new();
                    native::run(&task, coordinator, never, |record| {
                        let key = record.key.clone().unwrap_or_default();
                        let n = counts.entry(key.clone()).or_insert(0);
                        *n += 1;
                        OutputRecord {
                            key: Some(key),
                            value: Some(n.to_string().into_bytes()),
                            headers: Vec::new(),
                            topic: None,
                        }
                    })
                })
            })
            .collect();
        for task in tasks {
            if let Ok(Err(e)) = task.join() {
                eprintln!("native task failed: {e}");
                std::process::exit(1);
            }
        }
    });
}
