//! Stop the broker mid-job and start it again; the job rides it out
//! (restarting its tasks as needed) and the output is exact. And a shared
//! host that comes back before its broker does keeps its jobs: they start
//! once the broker is there. Each test uses a broker of its own so the
//! other tests keep theirs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use sluice::kafka::tools::{self, ReadRecord};

use crate::guests;
use crate::host::Host;
use crate::support::{self, JobOptions, Running};

/// This test's own broker, which it stops and starts; with its controller
/// it holds 19192 and 19193 (see hardening's `RETENTION_PORT`).
const PORT: u16 = 19192;

/// `a_host_back_before_its_broker_starts_its_jobs_when_the_broker_is`'s
/// own broker: 19196 and its controller 19197.
const HOST_FIRST_PORT: u16 = 19196;

#[test]
fn broker_stops_and_starts_mid_job() {
    let dir = guests::workspace_root().join(".kafka").join("e2e-broker-restart");
    support::start_broker(PORT, Some(&dir));
    let brokers = format!("127.0.0.1:{PORT}");
    let files = support::job(&brokers, JobOptions { name: "broker-restart", ..Default::default() });
    let mut inputs = support::produce_keyed(&brokers, &files.input, 0..10_000, 101);

    let job = Running::start(&files, &[]);
    let first = support::read_committed(&brokers, &files.output, 10_000, Duration::from_secs(120));
    assert_eq!(first.len(), 10_000, "log:\n{}", job.log_text());

    // More input, then the broker goes away for a while mid-stream.
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 10_000..20_000, 101));
    std::thread::sleep(Duration::from_millis(300));
    support::stop_broker(PORT, Some(&dir));
    std::thread::sleep(Duration::from_secs(5));
    support::start_broker(PORT, Some(&dir));
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 20_000..30_000, 101));

    let committed = support::read_committed(&brokers, &files.output, 30_000, Duration::from_secs(240));
    let log = job.log_text();
    // A shortfall names where it is: the job stalled (an output partition
    // holds no more records than were committed, beside aborted ones) or
    // an output partition's committed end did (it holds them, uncommitted).
    let shortfall = (committed.len() < 30_000).then(|| {
        let per_partition = |records: &[ReadRecord]| {
            let mut counts = BTreeMap::<i32, usize>::new();
            records.iter().for_each(|r| *counts.entry(r.partition).or_default() += 1);
            counts
        };
        // Everything the topic holds: no stop condition, so all of its 10 s.
        let in_topic = tools::read_all(&brokers, &files.output, false, Duration::from_secs(10), |_| false)
            .expect("read the output, uncommitted records too");
        format!(
            "committed per output partition {:?}; in the topic, uncommitted and aborted ones too, {:?}",
            per_partition(&committed),
            per_partition(&in_topic)
        )
    });
    job.terminate();
    support::stop_broker(PORT, Some(&dir));
    if let Some(shortfall) = shortfall {
        panic!(
            "{} of 30000 outputs committed once the broker was back: {shortfall}; the job's log:\n{log}",
            committed.len()
        );
    }
    assert!(
        log.contains(&format!("Connect to ipv4#127.0.0.1:{PORT} failed")),
        "the job never noticed the broker was gone:\n{log}"
    );
    support::verify_running_count(&committed, &inputs);
}

/// A host and its broker go down together (a machine restarts), and the
/// host comes back first: starting its jobs fails while the broker cannot
/// be reached. That must not fail them for good: they wait, shown as
/// `restarting` with the reason, and start once the broker is back, with
/// their output exactly once. A job stopped while it waits stays stopped.
#[test]
fn a_host_back_before_its_broker_starts_its_jobs_when_the_broker_is() {
    let broker_dir = guests::workspace_root().join(".kafka").join("e2e-host-first");
    let _ = std::fs::remove_dir_all(&broker_dir);
    support::start_broker(HOST_FIRST_PORT, Some(&broker_dir));
    let brokers = format!("127.0.0.1:{HOST_FIRST_PORT}");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut host = Host::start(&brokers, dir.path());
    let tenant = support::tenant_name("hostfirst");
    let token = host.tenant(&tenant, None);
    host.push_guest(&token, "running-count");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    let (halted_input, halted_output) = (format!("{tenant}.halted-in"), format!("{tenant}.halted-out"));
    tools::create_topics(&brokers, &[(&input, 2), (&output, 2), (&halted_input, 1), (&halted_output, 1)])
        .expect("topics");
    let mut inputs = support::produce_keyed(&brokers, &input, 0..1_000, 31);
    let spec = json!({"id": "counts", "module": "running-count", "parallelism": 2,
        "input": {"topics": [input]}, "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
    assert_eq!(host.post("/v1/jobs", &token, spec).0, 201);
    host.wait_job(&token, "counts", Duration::from_secs(60), |j| j["records_in"].as_u64() >= Some(1_000));
    let spec = json!({"id": "halted", "module": "running-count",
        "input": {"topics": [halted_input]}, "output": {"topics": [halted_output]}});
    assert_eq!(host.post("/v1/jobs", &token, spec).0, 201);
    host.wait_job(&token, "halted", Duration::from_secs(60), |j| j["state"] == "running");

    host.kill9();
    support::stop_broker(HOST_FIRST_PORT, Some(&broker_dir));
    host.restart();
    // Its start cannot reach the broker (a 15 s metadata timeout).
    let waiting = host.wait_job(&token, "counts", Duration::from_secs(90), |j| j["state"] != "starting");
    let reason = waiting["reason"].as_str().unwrap_or_default().to_owned();
    assert_eq!(waiting["state"], "restarting", "{waiting}\nlog:\n{}", host.log_text());
    assert!(reason.starts_with("cannot start: kafka"), "{reason}");
    assert!(host.log_text().contains("job cannot start; trying again in"), "{}", host.log_text());
    // A job that waits to start should still run: deleting (or resetting)
    // it is refused as for a running one, and it keeps its state and its
    // checkpoints. (It was let through, and failed with a 500 once the
    // group's deletion could not reach the broker.)
    let (status, refused) = host.request("DELETE", "/v1/jobs/counts", Some(&token), None);
    assert_eq!(status, 409, "deleting a job that waits to start: {refused}");
    let (status, refused) = host.post("/v1/jobs/counts/reset", &token, json!({"to": "earliest", "state": "clear"}));
    assert_eq!(status, 409, "resetting a job that waits to start: {refused}");

    // The other job is stopped while it waits. (While a retry is starting
    // it, the stop is refused as a conflict: it is tried again.)
    host.wait_job(&token, "halted", Duration::from_secs(90), |j| j["state"] == "restarting");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let stop = loop {
        let (status, operation) = host.post("/v1/jobs/halted/stop", &token, json!({}));
        match status {
            202 => break operation,
            409 if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            _ => panic!("stopping a job that waits to start: {status} {operation}\nlog:\n{}", host.log_text()),
        }
    };
    assert_eq!(host.wait_operation(&token, &stop)["state"], "succeeded", "{stop}");
    // Deleting it needs the broker (its consumer group goes too): while the
    // broker is down that is a 503 to try again, and the job stays.
    let (status, unavailable) = host.request("DELETE", "/v1/jobs/halted", Some(&token), None);
    assert_eq!(status, 503, "deleting a job while its broker is down: {unavailable}");
    assert!(unavailable["error"].as_str().is_some_and(|e| e.contains("try again")), "{unavailable}");
    assert_eq!(host.get("/v1/jobs/halted", &token).0, 200);
    let stopped_at = host.log_text().len();

    support::start_broker(HOST_FIRST_PORT, Some(&broker_dir));
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 1_000..2_000, 31));
    host.wait_job(&token, "counts", Duration::from_secs(180), |j| {
        j["state"] == "running" && j["records_in"].as_u64() >= Some(1_000)
    });
    // Once its retry comes due, the supervisor finds it stopped and leaves
    // it (or, were it to ignore the stop, starts it again).
    let halted_scope = format!("{tenant}.halted");
    // The halted job's lines since its stop that say `what`.
    let since_stop = |log: &str, what: &dyn Fn(&str) -> bool| {
        log[stopped_at..].lines().find(|l| l.contains(&halted_scope) && what(l)).map(str::to_owned)
    };
    let left = |l: &str| l.contains("not starting the job again");
    let started = |l: &str| l.contains("starting the job again") && !l.contains("not starting");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let restarted = loop {
        let log = host.log_text();
        if let Some(line) = since_stop(&log, &started) {
            break Some(line);
        }
        if since_stop(&log, &left).is_some() {
            break None;
        }
        assert!(std::time::Instant::now() < deadline, "the stopped job's retry never came due:\n{log}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = host.log_text();
    for line in log.lines().filter(|l| l.contains("cannot start") || l.contains("the job again")) {
        eprintln!("{line}");
    }
    assert_eq!(restarted, None, "a job stopped while it waited was started again");
    let halted = host.wait_job(&token, "halted", Duration::from_secs(10), |j| j["state"] == "stopped");
    assert_eq!(halted["tasks"], json!([]), "{halted}");
    // With the broker back, the delete goes through.
    let (status, deleted) = host.request("DELETE", "/v1/jobs/halted", Some(&token), None);
    assert_eq!(status, 204, "deleting the stopped job: {deleted}");
    assert_eq!(host.get("/v1/jobs/halted", &token).0, 404);
    let total: u64 = inputs.values().sum();
    let outputs = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(120));
    host.kill9();
    support::stop_broker(HOST_FIRST_PORT, Some(&broker_dir));
    support::verify_running_count(&outputs, &inputs);
}
