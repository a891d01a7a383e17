//! What the hardening issue fixed, each on the real broker: a lost state
//! directory is refused (and fails the whole job), a `latest` start is
//! committed before anything is read, idle jobs keep their offsets alive
//! past the broker's retention, a record with a non-UTF-8 header key is
//! processed rather than killing its task, and an output topic that is
//! missing or deleted fails the job rather than being made by the broker.

#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use sluice::kafka::{Source, StartPosition, client_config};

use crate::guests;
use crate::support::{self, JobFiles, JobOptions, Running};

/// Rewrites the job file, replacing `from` with `to`.
fn edit_job(files: &JobFiles, from: &str, to: &str) {
    let text = std::fs::read_to_string(&files.job_file).expect("job file");
    assert!(text.contains(from), "{from:?} not in the job file:\n{text}");
    std::fs::write(&files.job_file, text.replacen(from, to, 1)).expect("rewrite the job file");
}

/// Runs the job over `n` records and stops it cleanly.
fn run_once(brokers: &str, files: &JobFiles, n: usize) -> std::collections::BTreeMap<String, u64> {
    let inputs = support::produce_keyed(brokers, &files.input, 0..n, 13);
    let job = Running::start(files, &[]);
    let committed = support::read_committed(brokers, &files.output, n, Duration::from_secs(120));
    assert!(job.terminate().success());
    support::verify_running_count(&committed, &inputs);
    inputs
}

/// Waits for `job` to exit on its own and returns its log; it must fail.
fn expect_refusal(mut job: Running, why: &str) -> String {
    let status = job.wait_exit(Duration::from_secs(90));
    let log = job.log_text();
    let status = status.unwrap_or_else(|| panic!("the job did not stop ({why}); log:\n{log}"));
    assert!(!status.success(), "the job must fail ({why}); log:\n{log}");
    log
}

/// Turns the job's changelog off: a lost state directory can then only be
/// refused.
fn without_changelog(files: &JobFiles) {
    edit_job(files, "[checkpoint]\n", "[state]\nchangelog = false\n\n[checkpoint]\n");
}

#[test]
fn a_lost_state_directory_is_refused_not_run_with_empty_state() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "lost-state", ..Default::default() });
    without_changelog(&files);
    run_once(&brokers, &files, 2_000);
    std::fs::remove_dir_all(support::state_dir(&files)).expect("delete the state directory");
    let log = expect_refusal(Running::start(&files, &[]), "its state directory is gone");
    assert!(log.contains("was lost, emptied or replaced"), "log:\n{log}");
    assert!(!log.contains("delete the state directory"), "the advice must not lose data; log:\n{log}");
}

#[test]
fn one_task_that_cannot_start_fails_the_whole_job() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "half-lost", ..Default::default() });
    without_changelog(&files);
    run_once(&brokers, &files, 2_000);
    // Task 1's store is replaced by an empty one; task 0's is fine.
    std::fs::remove_file(support::state_dir(&files).join("task-1.redb")).expect("delete task 1's store");
    let log = expect_refusal(Running::start(&files, &[]), "one task refused to start");
    assert!(
        log.contains("task-1.redb holds state of shard 1 (input partition 1) up to checkpoint none"),
        "log:\n{log}"
    );
    assert!(log.contains("stopping the job"), "log:\n{log}");
}

/// Whether the job's group has a committed offset for every partition of
/// `topic`.
fn start_committed(brokers: &str, files: &JobFiles) -> bool {
    let config = client_config(brokers, &Default::default());
    let Ok(source) = Source::connect(&config, &format!("sluice.{}", files.id), StartPosition::Earliest) else {
        return false;
    };
    // One partition at a time: partitions of different tasks carry
    // different checkpoint ids, which one query would refuse to mix.
    (0..4).all(|p| {
        source.committed(&[(files.input.clone(), p)], Duration::from_secs(10)).is_ok_and(|c| c.offsets.len() == 1)
    })
}

#[test]
fn a_latest_start_is_committed_before_anything_is_read() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "latest", ..Default::default() });
    // Records from before the job: `latest` skips them.
    support::produce_keyed(&brokers, &files.input, 0..500, 7);
    edit_job(&files, "[input]\n", "[input]\nstart = \"latest\"\n");
    // Crash at the third commit: the first two are the two tasks' resolved
    // start positions, the third the first with records.
    let mut first = Running::start(&files, &[("SLUICE_FAILPOINT", "before-commit@3")]);
    let started = Instant::now();
    while !start_committed(&brokers, &files) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the start position was never committed; log:\n{}",
            first.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let inputs = support::produce_keyed(&brokers, &files.input, 500..2_500, 7);
    let status = first.wait_exit(Duration::from_secs(60)).expect("the job reached its failpoint");
    assert!(!status.success(), "log:\n{}", first.log_text());
    // The restart must not resolve `latest` again: that would skip what the
    // crashed run read but never committed.
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, 2_000, Duration::from_secs(120));
    let log = job.log_text();
    job.terminate();
    assert_eq!(committed.len(), 2_000, "log:\n{log}");
    support::verify_running_count(&committed, &inputs);
}

#[test]
fn a_latest_start_reads_nothing_until_it_is_committed() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "latest-first", ..Default::default() });
    edit_job(&files, "[input]\n", "[input]\nstart = \"latest\"\n");
    // Records arrive all the time while the job starts.
    let producing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let producer = {
        let (brokers, input, producing) = (brokers.clone(), files.input.clone(), producing.clone());
        std::thread::spawn(move || {
            let mut next = 0;
            while producing.load(std::sync::atomic::Ordering::Relaxed) {
                support::produce_keyed(&brokers, &input, next..next + 50, 7);
                next += 50;
            }
        })
    };
    // Crash right after the first commit.
    let mut job = Running::start(&files, &[("SLUICE_FAILPOINT", "after-commit-before-fold@1")]);
    let status = job.wait_exit(Duration::from_secs(120));
    producing.store(false, std::sync::atomic::Ordering::Relaxed);
    producer.join().expect("the producer thread");
    let log = job.log_text();
    assert!(status.is_some_and(|s| !s.success()), "the job did not reach its failpoint; log:\n{log}");
    // That commit holds the resolved start positions and nothing else: had
    // the task read before it, a crash just before it would have lost what
    // was read, as the restart resolves `latest` anew.
    let committed = sluice::kafka::tools::read_all(&brokers, &files.output, true, Duration::from_secs(5), |_| false)
        .expect("read the committed output");
    assert!(committed.is_empty(), "{} outputs in the first commit; log:\n{log}", committed.len());
    assert!(log.contains("after-commit-before-fold"), "log:\n{log}");
}

/// The retention test's own broker. scripts/kafka.sh takes the port after a
/// broker's for its controller, so each broker holds two: 19092-19093 are
/// the shared test broker's, 19192-19193 broker_restart's (this broker once
/// took 19193, and whichever of the two tests started second failed).
const RETENTION_PORT: u16 = 19194;

#[test]
fn an_idle_job_keeps_its_offsets_past_the_brokers_retention() {
    // A broker of its own that expires a group's offsets a minute after
    // their last commit, checking every second.
    let dir = guests::workspace_root().join(".kafka").join("e2e-offset-retention");
    let _ = std::fs::remove_dir_all(&dir);
    let status = std::process::Command::new(guests::workspace_root().join("scripts").join("kafka.sh"))
        .args(["start", "--port", &RETENTION_PORT.to_string(), "--dir"])
        .arg(&dir)
        .args(["--set", "offsets.retention.minutes=1", "--set", "offsets.retention.check.interval.ms=1000"])
        .status()
        .expect("run scripts/kafka.sh");
    assert!(status.success(), "the retention broker did not start");
    let brokers = format!("127.0.0.1:{RETENTION_PORT}");
    let files = support::job(&brokers, JobOptions { name: "idle", ..Default::default() });
    edit_job(&files, "interval = \"200ms\"\n", "interval = \"200ms\"\nheartbeat = \"5s\"\n");
    let mut inputs = support::produce_keyed(&brokers, &files.input, 0..1_000, 11);
    let mut job = Running::start(&files, &[]);
    support::read_committed(&brokers, &files.output, 1_000, Duration::from_secs(120));
    // Idle for longer than the retention, then a crash.
    std::thread::sleep(Duration::from_secs(100));
    job.kill9();
    let job = Running::start(&files, &[]);
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 1_000..2_000, 11));
    let committed = support::read_committed(&brokers, &files.output, 2_000, Duration::from_secs(120));
    let log = job.log_text();
    job.terminate();
    support::stop_broker(RETENTION_PORT, Some(&dir));
    assert_eq!(committed.len(), 2_000, "log:\n{log}");
    support::verify_running_count(&committed, &inputs);
}

/// Produces one record to `topic` whose header key is not UTF-8, through
/// librdkafka's C API (rdkafka's safe API only takes `&str` keys).
fn produce_with_binary_header_key(brokers: &str, topic: &str, key: &[u8], value: &[u8]) {
    use rdkafka::bindings as rd;
    use rdkafka::producer::{BaseProducer, Producer};
    use rdkafka::util::Timeout;
    let producer: BaseProducer = client_config(brokers, &Default::default()).create().expect("a producer");
    let topic = std::ffi::CString::new(topic).expect("topic name");
    let header_key: &[u8] = &[0xff, 0xfe, b'k'];
    // SAFETY: every pointer handed to librdkafka outlives the call; the
    // headers object is owned by the message once produceva succeeds.
    unsafe {
        let headers = rd::rd_kafka_headers_new(1);
        let err = rd::rd_kafka_header_add(
            headers,
            header_key.as_ptr().cast(),
            header_key.len() as isize,
            b"v".as_ptr().cast(),
            1,
        );
        assert_eq!(err, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
        let mut vus: [rd::rd_kafka_vu_t; 4] = std::mem::zeroed();
        vus[0].vtype = rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_TOPIC;
        vus[0].u.cstr = topic.as_ptr();
        vus[1].vtype = rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_KEY;
        vus[1].u.mem = rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 { ptr: key.as_ptr() as *mut _, size: key.len() };
        vus[2].vtype = rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE;
        vus[2].u.mem =
            rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 { ptr: value.as_ptr() as *mut _, size: value.len() };
        vus[3].vtype = rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADERS;
        vus[3].u.headers = headers;
        let error = rd::rd_kafka_produceva(producer.client().native_ptr(), vus.as_ptr(), vus.len());
        assert!(error.is_null(), "producing the record failed");
    }
    producer.flush(Timeout::After(Duration::from_secs(30))).expect("flush");
}

#[test]
fn a_header_key_that_is_not_utf8_does_not_kill_the_task() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "binary-header", ..Default::default() });
    let mut inputs = support::produce_keyed(&brokers, &files.input, 0..1_000, 5);
    produce_with_binary_header_key(&brokers, &files.input, b"key-0", b"with a binary header key");
    *inputs.entry("key-0".into()).or_insert(0) += 1;
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 1_000..2_000, 5));
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, 2_001, Duration::from_secs(120));
    let log = job.log_text();
    assert!(job.terminate().success(), "log:\n{log}");
    assert_eq!(committed.len(), 2_001, "log:\n{log}");
    support::verify_running_count(&committed, &inputs);
}

/// Whether `topic` exists on the broker, asked by a consumer (which never
/// has the broker create what it asks about).
fn topic_exists(brokers: &str, topic: &str) -> bool {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::RDKafkaErrorCode;
    let consumer: BaseConsumer = client_config(brokers, &Default::default())
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("a consumer");
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(15)).expect("the topic's metadata");
    metadata.topics().iter().any(|t| {
        t.name() == topic && t.error().map(RDKafkaErrorCode::from) != Some(RDKafkaErrorCode::UnknownTopicOrPartition)
    })
}

/// Points the job's output at a topic nobody created; returns its name.
fn output_to_a_missing_topic(files: &JobFiles) -> String {
    let missing = format!("{}-no-such-output", files.id);
    edit_job(files, &format!("topics = [\"{}\"]", files.output), &format!("topics = [\"{missing}\"]"));
    missing
}

/// An output topic that does not exist stops the job at its start, naming
/// it; and the broker, which creates topics on demand (Kafka's default, and
/// the test broker's), is never asked to make it with its own defaults.
#[test]
fn a_missing_output_topic_is_refused_at_start_and_not_created() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "missing-output", ..Default::default() });
    let missing = output_to_a_missing_topic(&files);
    support::produce_keyed(&brokers, &files.input, 0..100, 7);
    let log = expect_refusal(Running::start(&files, &[]), "its output topic does not exist");
    assert!(log.contains(&format!("topic `{missing}` does not exist")), "log:\n{log}");
    assert!(!topic_exists(&brokers, &missing), "`{missing}` was created; log:\n{log}");
}

/// An output topic deleted under a running job fails the job, naming it,
/// rather than having the broker make a new one with its own defaults
/// (partitions, retention) for the job's next writes.
#[test]
fn an_output_topic_deleted_under_a_job_fails_it_and_is_not_recreated() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "deleted-output", ..Default::default() });
    let inputs = support::produce_keyed(&brokers, &files.input, 0..500, 7);
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, 500, Duration::from_secs(120));
    support::verify_running_count(&committed, &inputs);
    sluice::kafka::tools::delete_topic(&brokers, &files.output).expect("delete the output topic");
    support::produce_keyed(&brokers, &files.input, 500..1_000, 7);
    let mut job = job;
    let status = job.wait_exit(Duration::from_secs(180));
    let log = job.log_text();
    let status = status.unwrap_or_else(|| panic!("the job went on without its output topic; log:\n{log}"));
    assert!(!status.success(), "log:\n{log}");
    assert!(log.contains(&format!("topic `{}` does not exist", files.output)), "log:\n{log}");
    assert!(!topic_exists(&brokers, &files.output), "`{}` was created again; log:\n{log}", files.output);
}
