//! Idle tasks sleep on the shared host: with no input for `sleep-after`
//! they let go of their Kafka clients and guest, a record wakes them, a
//! heartbeat still commits, a stop ends them at once, and the output stays
//! exactly once through all of it, also for two jobs reading one topic.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice::kafka::tools;

use crate::host::Host;
use crate::support;

/// The Kafka clients the host holds: librdkafka runs one `rdk:main`
/// thread per client.
fn kafka_clients(host: &Host) -> usize {
    host.thread_names().iter().filter(|name| name.as_str() == "rdk:main").count()
}

fn phases(job: &Value) -> Vec<String> {
    job["tasks"].as_array().into_iter().flatten().map(|t| t["phase"].as_str().unwrap_or("?").to_owned()).collect()
}

fn all_asleep(job: &Value) -> bool {
    job["state"] == "running" && !phases(job).is_empty() && phases(job).iter().all(|p| p == "sleeping")
}

#[test]
fn idle_tasks_sleep_without_kafka_clients_and_wake_for_input_exactly_once() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let tenant = support::tenant_name("sleep");
    let token = host.tenant(&tenant, None);
    host.push_guest(&token, "running-count");
    let (input, first_out, second_out) = (format!("{tenant}.in"), format!("{tenant}.out1"), format!("{tenant}.out2"));
    tools::create_topics(&brokers, &[(&input, 2), (&first_out, 2), (&second_out, 2)]).expect("topics");
    let spec = |id: &str, output: &str| {
        json!({"id": id, "module": "running-count", "parallelism": 2,
            "input": {"topics": [input], "sleep-after": "1s"}, "output": {"topics": [output]},
            "checkpoint": {"interval": "200ms", "heartbeat": "4s"}})
    };
    let idle_clients = kafka_clients(&host);

    // The first job reads 1,000 records and falls asleep.
    let mut inputs = support::produce_keyed(&brokers, &input, 0..1_000, 23);
    assert_eq!(host.post("/v1/jobs", &token, spec("first", &first_out)).0, 201);
    let asleep = host.wait_job(&token, "first", Duration::from_secs(60), |j| {
        j["records_in"].as_u64() >= Some(1_000) && all_asleep(j)
    });
    assert!(host.log_text().contains("task sleeps: no input for 1s"), "{}", host.log_text());
    // Asleep, its two tasks hold no consumer and no producer: beside the
    // host's metadata client there are only its admin client (which made
    // the changelog topic) and the one watch over all sleeping input.
    assert_eq!(kafka_clients(&host), idle_clients + 2, "threads: {:?}", host.thread_names());

    // Its heartbeat still commits while nothing arrives, and it sleeps again.
    let checkpoints = asleep["checkpoints"].as_u64().unwrap_or(0);
    host.wait_job(&token, "first", Duration::from_secs(30), |j| {
        j["checkpoints"].as_u64() > Some(checkpoints) && all_asleep(j)
    });

    // A second job over the same partitions starts from the beginning: the
    // watch follows both jobs' positions on one partition.
    assert_eq!(host.post("/v1/jobs", &token, spec("second", &second_out)).0, 201);
    host.wait_job(&token, "second", Duration::from_secs(60), |j| {
        j["records_in"].as_u64() >= Some(1_000) && all_asleep(j)
    });

    // Input wakes both; each record is counted exactly once by each job.
    for round in 0..3 {
        let from = 1_000 + round * 500;
        let woken = Instant::now();
        support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, from..from + 500, 23));
        let total: u64 = inputs.values().sum();
        for job in ["first", "second"] {
            host.wait_job(&token, job, Duration::from_secs(60), |j| j["records_in"].as_u64() >= Some(total));
        }
        eprintln!(
            "round {round}: both jobs read the new records {:.2?} after the test began to write them",
            woken.elapsed()
        );
        for job in ["first", "second"] {
            host.wait_job(&token, job, Duration::from_secs(60), all_asleep);
        }
    }
    let total: u64 = inputs.values().sum();
    for output in [&first_out, &second_out] {
        let outputs = support::read_committed(&brokers, output, total as usize, Duration::from_secs(60));
        support::verify_running_count(&outputs, &inputs);
    }
    let (_, first) = host.get("/v1/jobs/first", &token);
    assert_eq!(first["restarts"], json!(0), "a wake is not a restart: {first}");

    // A stop ends a sleeping job at once, with nothing left to commit.
    let stopping = Instant::now();
    let (status, operation) = host.post("/v1/jobs/first/stop", &token, json!({}));
    assert_eq!(status, 202, "{operation}");
    assert_eq!(host.wait_operation(&token, &operation)["state"], "succeeded");
    host.wait_job(&token, "first", Duration::from_secs(10), |j| j["state"] == "stopped");
    eprintln!("a sleeping job stopped in {:.2?}", stopping.elapsed());
    assert!(host.log_text().contains("task stopped while asleep"), "{}", host.log_text());
}

#[test]
fn a_sleeping_job_whose_input_topic_is_deleted_fails_as_an_awake_one_does() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let tenant = support::tenant_name("gone");
    let token = host.tenant(&tenant, None);
    host.push_guest(&token, "running-count");
    for (job, sleep_after) in [("asleep", "1s"), ("awake", "off")] {
        let (input, output) = (format!("{tenant}.{job}-in"), format!("{tenant}.{job}-out"));
        tools::create_topics(&brokers, &[(&input, 1), (&output, 1)]).expect("topics");
        support::produce_keyed(&brokers, &input, 0..100, 7);
        // The heartbeat is an hour away: only the watch can wake it.
        let spec = json!({"id": job, "module": "running-count",
            "input": {"topics": [input], "sleep-after": sleep_after}, "output": {"topics": [output]},
            "checkpoint": {"interval": "200ms"}});
        assert_eq!(host.post("/v1/jobs", &token, spec).0, 201);
    }
    host.wait_job(&token, "asleep", Duration::from_secs(60), |j| {
        j["records_in"].as_u64() >= Some(100) && all_asleep(j)
    });
    host.wait_job(&token, "awake", Duration::from_secs(60), |j| j["records_in"].as_u64() >= Some(100));

    // The input topics go: the awake job fails; the sleeping one must not
    // sleep on as if nothing happened, but wake and fail too.
    for job in ["asleep", "awake"] {
        tools::delete_topic(&brokers, &format!("{tenant}.{job}-in")).expect("delete the input topic");
    }
    let mut reasons = Vec::new();
    for job in ["awake", "asleep"] {
        let failed = host.wait_job(&token, job, Duration::from_secs(60), |j| j["state"] == "failed");
        reasons.push(failed["reason"].as_str().unwrap_or_default().to_owned());
    }
    for (job, reason) in ["awake", "asleep"].iter().zip(&reasons) {
        let topic = format!("{tenant}.{job}-in");
        assert!(reason.contains(&format!("topic `{topic}` does not exist")), "{job}: {reason}");
    }
}
