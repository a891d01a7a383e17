//! A transaction left open: the task hangs (a stalled flush, as a hung disk
//! or broker call would) right after it sent a record into the open
//! transaction. Readers with read_committed are stuck behind that
//! transaction until it ends; the host aborts it once it is open for three
//! quarters of the transaction timeout, without waiting for the task (still
//! stalled) or for the broker. A guest cannot hang that long: job
//! validation keeps interval + deadline + commit inside that bound.

use std::time::Duration;

use serde_json::json;
use sluice::kafka::tools;

use crate::host::Host;
use crate::support;

#[test]
fn the_host_aborts_a_transaction_left_open() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start_with_env(&brokers, dir.path(), &[("SLUICE_FAILPOINT", "before-flush@2:stall=40s")]);
    let tenant = support::tenant_name("linger");
    let token = host.tenant(&tenant, None);
    host.push_guest(&token, "probe");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, 1), (&output, 1)]).expect("topics");
    // `emit 1` puts a record into the open transaction; at its checkpoint
    // (the second: the first commits the job's start position) the task
    // stalls for 40 s before flushing it.
    let spec = json!({"id": "stuck", "module": "probe",
        "input": {"topics": [input]}, "output": {"topics": [output]},
        "checkpoint": {"interval": "1s"}, "limits": {"deadline": "2s"},
        "kafka": {"transaction.timeout.ms": "30000"}});
    let (status, body) = host.post("/v1/jobs", &token, spec);
    assert_eq!(status, 201, "{body}");
    host.wait_job(&token, "stuck", Duration::from_secs(60), |j| j["checkpoints"].as_u64() >= Some(1));
    tools::produce(&brokers, &input, [(b"k".to_vec(), b"emit 1".to_vec())]).expect("input");
    let job = host.wait_job(&token, "stuck", Duration::from_secs(60), |j| {
        j["tasks"][0]["transaction"].is_object() && j["records_in"].as_u64() >= Some(1)
    });
    assert_eq!(job["tasks"][0]["transaction"]["timeout_seconds"], 30.0, "{job}");

    // A record written after the job's: invisible to read_committed readers
    // until the job's transaction ends.
    tools::produce(&brokers, &output, [(b"marker".to_vec(), b"after".to_vec())]).expect("marker");
    let seen = tools::read_all(&brokers, &output, true, Duration::from_secs(120), |records| !records.is_empty())
        .expect("read committed");
    let (_, job) = host.get("/v1/jobs/stuck", &token);
    // The transaction was aborted (the job's record is not there) while the
    // task was still stalled (it has not failed yet).
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].key.as_deref(), Some(&b"marker"[..]));
    assert_eq!(job["restarts"], 0, "the task had already failed on its own: {job}");
    let log = host.log_text();
    assert!(log.contains("transaction open for more than 22.5s"), "no abort by the host; log:\n{log}");
}
