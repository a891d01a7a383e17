//! Isolation on the shared host: a hostile job runs beside a well-behaved
//! one, each test one kind of hostility. The hostile job must end up
//! restarting (or failed) with a reason that names what it did, and the
//! other job must still give its exact output. Each hostile job belongs to
//! another tenant, whose policy sets tight limits.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice::kafka::tools;

use crate::host::Host;
use crate::support::{self, unique};

/// Runs `good` (running-count) and a probe job fed `hostile_input` side by
/// side, calls `meanwhile` with the host and the hostile tenant's token, and
/// checks both jobs.
fn beside_a_hostile_job(
    case: &str,
    hostile_input: Vec<String>,
    expected_reason: &str,
    meanwhile: impl FnOnce(&Host, &str),
) {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    // Tenant names become topic prefixes: unique per test and per run.
    let run = unique(case).replace(['-', '_'], "").to_lowercase();
    let run = &run[run.len().saturating_sub(10)..];
    let (good, evil) = (format!("good-{case}{run}"), format!("evil-{case}{run}"));
    let good_token = host.tenant(&good, None);
    let evil_token = host.tenant(
        &evil,
        Some(json!({
            "topic-prefixes": [format!("{evil}.")], "max-jobs": 2, "max-parallelism": 1,
            "limits": {"memory": "32MiB", "deadline": "500ms", "max-outputs-per-input": 10, "state": "256KiB"},
        })),
    );
    host.push_guest(&good_token, "running-count");
    host.push_guest(&evil_token, "probe");
    let topics = [format!("{good}.in"), format!("{good}.out"), format!("{evil}.in"), format!("{evil}.out")];
    tools::create_topics(&brokers, &topics.iter().map(|t| (t.as_str(), 1)).collect::<Vec<_>>()).expect("topics");
    tools::produce(&brokers, &topics[2], hostile_input.into_iter().map(|v| (b"k".to_vec(), v.into_bytes())))
        .expect("hostile input");
    let spec = |id: &str, module: &str, prefix: &str| {
        json!({"id": id, "module": module, "input": {"topics": [format!("{prefix}.in")]},
               "output": {"topics": [format!("{prefix}.out")]}, "checkpoint": {"interval": "200ms"}})
    };
    let (status, body) = host.post("/v1/jobs", &evil_token, spec("hostile", "probe", &evil));
    assert_eq!(status, 201, "{body}");
    let (status, body) = host.post("/v1/jobs", &good_token, spec("good", "running-count", &good));
    assert_eq!(status, 201, "{body}");

    let started = Instant::now();
    let inputs = support::produce_keyed(&brokers, &topics[0], 0..20_000, 41);
    meanwhile(&host, &evil_token);
    let committed = support::read_committed(&brokers, &topics[1], 20_000, Duration::from_secs(180));
    let elapsed = started.elapsed();
    support::verify_running_count(&committed, &inputs);
    eprintln!("isolation/{case}: the good job committed 20,000 records in {elapsed:?} beside the hostile job");

    let hostile = host.wait_job(&evil_token, "hostile", Duration::from_secs(60), |j| {
        (j["state"] == "restarting" || j["state"] == "failed")
            && j["reason"].as_str().is_some_and(|r| r.contains(expected_reason))
    });
    assert!(hostile["restarts"].as_u64() >= Some(1) || hostile["state"] == "failed", "{hostile}");
    // The good job never restarted.
    let (_, good_job) = host.get("/v1/jobs/good", &good_token);
    assert_eq!(good_job["state"], "running", "{good_job}");
    assert_eq!(good_job["restarts"], 0, "{good_job}");
}

#[test]
fn a_guest_that_loops_forever() {
    beside_a_hostile_job("spin", vec!["spin".into()], "deadline", |_, _| {});
}

#[test]
fn a_guest_that_allocates_without_bound() {
    beside_a_hostile_job("alloc", vec!["alloc".into()], "memory limit", |_, _| {});
}

#[test]
fn a_guest_that_emits_without_bound() {
    beside_a_hostile_job("emit", vec!["emit 1000".into()], "output records", |_, _| {});
}

#[test]
fn a_guest_that_grows_its_state_without_bound() {
    let value = "x".repeat(4000);
    let input = (0..200).map(|i| format!("set grow-{i} {value}")).collect();
    beside_a_hostile_job("state", input, "state size limit", |_, _| {});
}

#[test]
fn a_guest_that_traps_on_every_record() {
    beside_a_hostile_job("trap", (0..100).map(|_| "trap".to_string()).collect(), "trapped", |_, _| {});
}

#[test]
fn a_malformed_upload_beside_a_running_job() {
    // Uploaded while both jobs run: refused with the reason, nothing kept,
    // and neither the host nor the good job notices.
    beside_a_hostile_job("upload", vec!["trap".into()], "trapped", |host, token| {
        let mut truncated = std::fs::read(crate::guests::guest("running-count")).expect("guest");
        truncated.truncate(truncated.len() / 2);
        let (status, body) = host.push(token, "truncated", &truncated);
        assert_eq!(status, 422, "{body}");
        assert!(body["error"].as_str().unwrap_or_default().contains("not a valid WebAssembly component"), "{body}");
        let (_, modules) = host.get("/v1/modules", token);
        assert_eq!(modules.as_array().map(Vec::len), Some(1), "only the probe is kept: {modules}");
    });
}
