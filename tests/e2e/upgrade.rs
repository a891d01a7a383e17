//! Upgrading a running job to another module keeps its state: the job runs
//! running-count, is upgraded to counter-v2 (another state layout, with a
//! `migrate` hook that converts the old one), and its counts continue
//! exactly, across a host crash right after the upgrade too.

use std::time::Duration;

use serde_json::json;
use sluice::kafka::tools;

use crate::host::Host;
use crate::support;

#[test]
fn an_upgraded_job_keeps_and_migrates_its_state() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut host = Host::start(&brokers, dir.path());
    let tenant = support::tenant_name("up");
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

    // The state directory lost after the upgrade: the state comes back from
    // the changelog already migrated, and `migrate` does not run again.
    let migrations = || {
        let (_, logs) = host.get("/v1/jobs/counts/logs", &token);
        logs.to_string().matches("migrated the state of the previous module").count()
    };
    let before = migrations();
    let (_, stop) = host.post("/v1/jobs/counts/stop", &token, json!({}));
    assert_eq!(host.wait_operation(&token, &stop)["state"], "succeeded");
    std::fs::remove_dir_all(dir.path().join("state").join(&tenant).join("counts")).expect("delete the job's state");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 10_000..11_000, 29));
    assert_eq!(host.post("/v1/jobs/counts/resume", &token, json!({})).0, 200);
    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(180));
    support::verify_running_count(&committed, &inputs);
    let (_, logs) = host.get("/v1/jobs/counts/logs", &token);
    assert!(logs.to_string().contains("restored the shard's state from the changelog"), "{logs}");
    assert_eq!(migrations(), before, "no second migration after the restore: {logs}");
}

/// v1 -> v2, back to v1, and to v2 again: the second move to v2 is a new
/// upgrade whose `migrate` must run, converting what v1 wrote meanwhile
/// (before the fix, the note of the first v1 -> v2 made it skip). v1 is the
/// probe counting in running-count's layout: it exports no `migrate`, so
/// the rollback leaves no note of its own.
#[test]
fn upgrading_again_after_a_rollback_migrates_again() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let tenant = support::tenant_name("rb");
    let token = host.tenant(&tenant, None);
    let v1 = host.push_guest(&token, "probe");
    let v2 = host.push_guest(&token, "counter-v2");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, 2), (&output, 2)]).expect("topics");
    let spec = json!({"id": "counts", "module": v1, "parallelism": 2, "transform": {"config": {"count": "yes"}},
        "input": {"topics": [input]}, "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
    assert_eq!(host.post("/v1/jobs", &token, spec).0, 201);
    let upgrade = |module: &str| {
        let (status, operation) = host.post("/v1/jobs/counts/upgrade", &token, json!({"module": module}));
        assert_eq!(status, 202, "{operation}");
        let done = host.wait_operation(&token, &operation);
        assert_eq!(done["state"], "succeeded", "{done}");
    };
    let mut inputs = support::produce_keyed(&brokers, &input, 0..2_000, 17);
    let mut total = 2_000;
    let wait_for = |total: usize| support::read_committed(&brokers, &output, total, Duration::from_secs(120));
    wait_for(total);
    upgrade(&v2);
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 2_000..3_000, 17));
    total += 1_000;
    wait_for(total);
    // The rollback: v1 counts only new keys, in its own layout.
    upgrade(&v1);
    support::add_counts(&mut inputs, support::produce_keyed_as(&brokers, &input, "fresh", 0..1_000, 7));
    total += 1_000;
    wait_for(total);
    // Forward again: v2 must take over v1's counts of the new keys.
    upgrade(&v2);
    support::add_counts(&mut inputs, support::produce_keyed_as(&brokers, &input, "fresh", 1_000..2_000, 7));
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 3_000..4_000, 17));
    total += 2_000;
    let committed = wait_for(total);
    let (_, logs) = host.get("/v1/jobs/counts/logs", &token);
    support::verify_running_count(&committed, &inputs);
    let migrations = logs.to_string().matches("migrated the state of the previous module").count();
    assert_eq!(migrations, 4, "v2's migrate runs once per task at each of the two upgrades to it: {logs}");
}
