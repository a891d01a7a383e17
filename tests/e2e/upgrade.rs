//! Upgrading a running job to another module keeps its state: the job runs
//! running-count, is upgraded to counter-v2 (another state layout, with a
//! `migrate` hook that converts the old one), and its counts continue
//! exactly, across a host crash right after the upgrade too.

use std::time::Duration;

use serde_json::json;
use sluice::kafka::tools;

use crate::host::Host;
use crate::support::{self, unique};

#[test]
fn an_upgraded_job_keeps_and_migrates_its_state() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut host = Host::start(&brokers, dir.path());
    let run = unique("u").replace(['-', '_'], "").to_lowercase();
    let tenant = format!("up{}", &run[run.len().saturating_sub(12)..]);
    let token = host.tenant(&tenant, None);
    host.push_guest(&token, "running-count");
    let v2 = host.push_guest(&token, "counter-v2");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, 2), (&output, 2)]).expect("topics");
    let spec = json!({"id": "counts", "module": "running-count", "parallelism": 2,
        "input": {"topics": [input]}, "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
    assert_eq!(host.post("/v1/jobs", &token, spec).0, 201);

    let mut inputs = support::produce_keyed(&brokers, &input, 0..5_000, 29);
    host.wait_job(&token, "counts", Duration::from_secs(120), |j| j["records_in"].as_u64() >= Some(5_000));
    let (status, operation) = host.post("/v1/jobs/counts/upgrade", &token, json!({"module": v2}));
    assert_eq!(status, 202, "{operation}");
    let done = host.wait_operation(&token, &operation);
    assert_eq!(done["state"], "succeeded", "{done}");
    let (_, job) = host.get("/v1/jobs/counts", &token);
    assert_eq!(job["module"], v2.as_str(), "{job}");

    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 5_000..8_000, 29));
    host.wait_job(&token, "counts", Duration::from_secs(120), |j| j["records_in"].as_u64() >= Some(3_000));
    let (_, logs) = host.get("/v1/jobs/counts/logs", &token);
    assert!(logs.to_string().contains("migrated"), "no migration in the job's log: {logs}");
    // A crash after the migrated state was checkpointed must not migrate again.
    host.crash_and_restart();
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 8_000..10_000, 29));
    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(180));
    support::verify_running_count(&committed, &inputs);
}
