//! Broker, job processes, input and verification for the end-to-end tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sluice::kafka::tools::{self, ReadRecord};

use super::guests;

/// The port of the broker these tests start when none is given.
const TEST_PORT: u16 = 19092;

/// The shared test broker's bootstrap servers.
pub fn brokers() -> String {
    static BROKERS: OnceLock<String> = OnceLock::new();
    BROKERS
        .get_or_init(|| {
            if let Ok(brokers) = std::env::var("SLUICE_TEST_BROKERS") {
                return brokers;
            }
            start_broker(TEST_PORT, None);
            format!("127.0.0.1:{TEST_PORT}")
        })
        .clone()
}

fn kafka_script() -> PathBuf {
    guests::workspace_root().join("scripts").join("kafka.sh")
}

/// Starts (or finds running) a broker with scripts/kafka.sh.
pub fn start_broker(port: u16, dir: Option<&Path>) {
    let mut command = Command::new(kafka_script());
    command.arg("start").arg("--port").arg(port.to_string());
    if let Some(dir) = dir {
        command.arg("--dir").arg(dir);
    }
    let status = command.status().expect("run scripts/kafka.sh");
    assert!(status.success(), "scripts/kafka.sh start --port {port} failed");
}

/// Stops a broker started with [`start_broker`].
pub fn stop_broker(port: u16, dir: Option<&Path>) {
    let mut command = Command::new(kafka_script());
    command.arg("stop").arg("--port").arg(port.to_string());
    if let Some(dir) = dir {
        command.arg("--dir").arg(dir);
    }
    let status = command.status().expect("run scripts/kafka.sh");
    assert!(status.success(), "scripts/kafka.sh stop --port {port} failed");
}

/// A name unique to this test run.
pub fn unique(prefix: &str) -> String {
    static START: OnceLock<u128> = OnceLock::new();
    let start = START.get_or_init(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0)
    });
    format!("{prefix}-{}-{start}", std::process::id())
}

/// A tenant name unique to this call: `prefix` and 12 lowercase letters or
/// digits (tenant names allow no `-` or `_`), 8 of the run and a count of
/// the calls. Two tests that pick the same prefix must not share a tenant:
/// its jobs' consumer groups, transactional ids and changelogs would be
/// one job's.
pub fn tenant_name(prefix: &str) -> String {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10_000;
    let run = unique(prefix).replace(['-', '_'], "").to_lowercase();
    format!("{prefix}{}{call:04}", &run[run.len().saturating_sub(8)..])
}

/// A job's files: its job file and state directory in a temp dir.
pub struct JobFiles {
    pub dir: tempfile::TempDir,
    pub job_file: PathBuf,
    pub id: String,
    pub input: String,
    pub output: String,
}

/// Options of a test job.
pub struct JobOptions<'a> {
    pub name: &'a str,
    pub module: &'a str,
    pub partitions: i32,
    pub parallelism: u32,
    pub interval: &'a str,
    pub config: &'a [(&'a str, &'a str)],
}

impl Default for JobOptions<'_> {
    fn default() -> Self {
        JobOptions {
            name: "job",
            module: "running-count",
            partitions: 4,
            parallelism: 2,
            interval: "200ms",
            config: &[],
        }
    }
}

/// Creates the job's topics and writes its job file.
pub fn job(brokers: &str, options: JobOptions<'_>) -> JobFiles {
    let id = unique(options.name);
    let input = format!("{id}-in");
    let output = format!("{id}-out");
    tools::create_topics(brokers, &[(&input, options.partitions), (&output, options.partitions)])
        .expect("create topics");
    let dir = tempfile::tempdir().expect("temp dir");
    let module = guests::guest(options.module);
    let mut text = format!(
        "id = \"{id}\"\nbrokers = \"{brokers}\"\nmodule = {module:?}\nparallelism = {}\nbatch-size = 256\n\n\
         [input]\ntopics = [\"{input}\"]\n\n[output]\ntopics = [\"{output}\"]\n\n[checkpoint]\ninterval = \"{}\"\n",
        options.parallelism, options.interval
    );
    if !options.config.is_empty() {
        text.push_str("\n[transform.config]\n");
        for (key, value) in options.config {
            text.push_str(&format!("{key:?} = {value:?}\n"));
        }
    }
    let job_file = dir.path().join("job.toml");
    std::fs::write(&job_file, text).expect("write job file");
    JobFiles { dir, job_file, id, input, output }
}

/// A whole minute of event time (ms since the Unix epoch) just before this
/// test run started, for records with their own timestamps. Near now on
/// purpose: the broker deletes records whose timestamps are older than the
/// topic's retention (7 days by default) at its next retention check, so
/// fixed old timestamps make a test's input vanish mid-test.
pub fn event_time_origin() -> i64 {
    static ORIGIN: OnceLock<i64> = OnceLock::new();
    *ORIGIN.get_or_init(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        now - now % 60_000
    })
}

/// Rewrites the job file's parallelism.
pub fn set_parallelism(files: &JobFiles, parallelism: usize) {
    let text = std::fs::read_to_string(&files.job_file).expect("job file");
    let text: Vec<String> = text
        .lines()
        .map(|line| match line.starts_with("parallelism = ") {
            true => format!("parallelism = {parallelism}"),
            false => line.to_owned(),
        })
        .collect();
    std::fs::write(&files.job_file, text.join("\n") + "\n").expect("rewrite job file");
}

/// Runs the job until at least `outputs` records are committed, then kills
/// it with -9, mid-epoch (input is still arriving or being processed);
/// returns its log.
pub fn run_then_kill(files: &JobFiles, outputs: usize) -> String {
    let mut job = Running::start(files, &[]);
    read_committed(&brokers(), &files.output, outputs, Duration::from_secs(120));
    job.kill9();
    job.log_text()
}

/// The job's state directory (the default one, beside the job file).
pub fn state_dir(files: &JobFiles) -> PathBuf {
    files.dir.path().join(".sluice").join("state").join(&files.id)
}

/// A `sluice run` child process.
pub struct Running {
    child: Child,
    pub log: PathBuf,
}

impl Running {
    /// Starts `sluice run` on `files`, with extra environment variables.
    pub fn start(files: &JobFiles, env: &[(&str, &str)]) -> Running {
        Self::start_with_brokers(files, env, None)
    }

    /// Starts `sluice run`, overriding the brokers.
    pub fn start_with_brokers(files: &JobFiles, env: &[(&str, &str)], brokers: Option<&str>) -> Running {
        let log = files.dir.path().join(format!("run-{}.log", unique("log")));
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .arg("run")
            .arg(&files.job_file)
            .env("SLUICE_LOG", "info,sluice=info")
            .env("SLUICE_CACHE_DIR", guests::workspace_root().join("target").join("test-cache"))
            .env_remove("SLUICE_FAILPOINT")
            .stdout(Stdio::null())
            .stderr(log_file);
        if let Some(brokers) = brokers {
            command.arg("--brokers").arg(brokers);
        }
        for (key, value) in env {
            command.env(key, value);
        }
        Running { child: command.spawn().expect("spawn sluice run"), log }
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// kill -9.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM: a final checkpoint and a clean exit.
    pub fn terminate(mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        match self.wait_exit(Duration::from_secs(60)) {
            Some(status) => status,
            None => {
                self.kill9();
                panic!("sluice run did not stop within 60 s of SIGTERM; log: {}", self.log_text());
            }
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// [`terminate`](Self::terminate), with the whole log the process wrote.
    pub fn terminate_logged(self) -> (ExitStatus, String) {
        let log = self.log.clone();
        let status = self.terminate();
        (status, std::fs::read_to_string(&log).unwrap_or_default())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Produces `n` records over `keys` keys (`key-<i % keys>`), returning how
/// many inputs each key got.
pub fn produce_keyed(brokers: &str, topic: &str, range: std::ops::Range<usize>, keys: usize) -> BTreeMap<String, u64> {
    produce_keyed_as(brokers, topic, "key", range, keys)
}

/// [`produce_keyed`] with keys `<prefix>-<i % keys>`.
pub fn produce_keyed_as(
    brokers: &str,
    topic: &str,
    prefix: &str,
    range: std::ops::Range<usize>,
    keys: usize,
) -> BTreeMap<String, u64> {
    let mut per_key = BTreeMap::new();
    let records: Vec<(Vec<u8>, Vec<u8>)> = range
        .map(|i| {
            let key = format!("{prefix}-{}", i % keys);
            *per_key.entry(key.clone()).or_insert(0) += 1;
            (key.into_bytes(), format!("value {i} {}", "x".repeat(80)).into_bytes())
        })
        .collect();
    tools::produce(brokers, topic, records).expect("produce");
    per_key
}

/// Merges per-key input counts.
pub fn add_counts(total: &mut BTreeMap<String, u64>, more: BTreeMap<String, u64>) {
    for (key, n) in more {
        *total.entry(key).or_insert(0) += n;
    }
}

/// Reads committed output until at least `expected` records arrived, then a
/// little longer so that duplicates would show up too.
pub fn read_committed(brokers: &str, topic: &str, expected: usize, timeout: Duration) -> Vec<ReadRecord> {
    let mut reached: Option<Instant> = None;
    tools::read_all(brokers, topic, true, timeout, |records| {
        if records.len() >= expected {
            let at = *reached.get_or_insert_with(Instant::now);
            return at.elapsed() > Duration::from_secs(2);
        }
        false
    })
    .expect("read committed output")
}

/// Reads everything in the topic, committed or not.
pub fn read_uncommitted_count(brokers: &str, topic: &str, at_least: usize) -> usize {
    tools::read_all(brokers, topic, false, Duration::from_secs(10), |records| records.len() > at_least)
        .expect("read uncommitted")
        .len()
}

/// Each key's running counts in running-count output, in the order they
/// were committed (by partition and offset).
pub fn counts_per_key(outputs: &[ReadRecord]) -> BTreeMap<String, Vec<u64>> {
    let mut sorted: Vec<&ReadRecord> = outputs.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for record in sorted {
        let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        let value = String::from_utf8_lossy(record.value.as_deref().unwrap_or_default()).into_owned();
        let count: u64 = value.parse().unwrap_or_else(|_| panic!("output value {value:?} of key {key} is not a count"));
        seen.entry(key).or_default().push(count);
    }
    seen
}

/// Checks running-count output: per key, exactly 1..=n in order.
pub fn verify_running_count(outputs: &[ReadRecord], inputs: &BTreeMap<String, u64>) {
    let mut seen = counts_per_key(outputs);
    let expected_total: u64 = inputs.values().sum();
    assert_eq!(outputs.len() as u64, expected_total, "committed outputs vs inputs");
    for (key, n) in inputs {
        let counts = seen.remove(key).unwrap_or_default();
        let expected: Vec<u64> = (1..=*n).collect();
        if counts != expected {
            let first_bad =
                counts.iter().zip(&expected).position(|(a, b)| a != b).unwrap_or(counts.len().min(expected.len()));
            panic!(
                "key {key}: {} outputs for {n} inputs; first difference at position {first_bad}: got {:?}, expected {:?}",
                counts.len(),
                &counts[first_bad.saturating_sub(2)..(first_bad + 3).min(counts.len())],
                &expected[first_bad.saturating_sub(2)..(first_bad + 3).min(expected.len())]
            );
        }
    }
    assert!(seen.is_empty(), "outputs for keys that had no input: {:?}", seen.keys().collect::<Vec<_>>());
}
