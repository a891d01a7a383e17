//! The shared host over real HTTP: tokens and tenants, module uploads and
//! their validation, a job's whole life (create, status, metrics, logs,
//! stop with a final checkpoint, resume, a host crash and restart, delete),
//! with its committed output verified exactly once across all of it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice::kafka::{self, tools};

use crate::guests;
use crate::host::{ADMIN, Host};
use crate::support::{self, unique};

/// A host with one tenant running running-count as job `j` over topics of
/// its own (`<tenant>.in`, `<tenant>.out`) of `partitions` partitions.
struct CountingJob {
    brokers: String,
    dir: tempfile::TempDir,
    host: Host,
    tenant: String,
    token: String,
    input: String,
    output: String,
}

fn counting_job(name: &str, partitions: i32, parallelism: u32) -> CountingJob {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let tenant = support::tenant_name(name);
    let token = host.tenant(&tenant, None);
    host.push_guest(&token, "running-count");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, partitions), (&output, partitions)]).expect("topics");
    let spec = json!({"id": "j", "module": "running-count", "parallelism": parallelism,
        "input": {"topics": [input]}, "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
    assert_eq!(host.post("/v1/jobs", &token, spec).0, 201);
    CountingJob { brokers, dir, host, tenant, token, input, output }
}

#[test]
fn tokens_tenants_and_modules() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());

    // Tokens.
    assert_eq!(host.request("GET", "/v1/jobs", None, None).0, 401);
    assert_eq!(host.get("/v1/jobs", "not-a-token").0, 401);
    let (status, body) = host.get("/v1/jobs", ADMIN);
    assert_eq!(status, 403, "the admin token is not a tenant's: {body}");
    let acme = host.tenant("acme", None);
    let globex = host.tenant("globex", None);
    assert_eq!(host.get("/v1/tenants", &acme).0, 403, "a tenant cannot list tenants");
    assert_eq!(host.post("/v1/tenants", ADMIN, json!({"name": "acme"})).0, 409);
    assert_eq!(host.post("/v1/tenants", ADMIN, json!({"name": "Bad.Name"})).0, 400);
    let (_, whoami) = host.get("/v1/whoami", &acme);
    assert_eq!(whoami["policy"]["topic-prefixes"], json!(["acme."]));
    assert!(whoami.get("token_sha256").is_none(), "the token's hash is not shown: {whoami}");
    let (_, tenants) = host.get("/v1/tenants", ADMIN);
    assert!(!tenants.to_string().contains("token_sha256"), "{tenants}");

    // Uploads: validated before they are accepted.
    let (status, body) = host.push(&acme, "junk", b"this is not WebAssembly at all");
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("magic bytes"), "{body}");
    let other_world = std::fs::read(guests::guest("other-world")).expect("other-world guest");
    let (status, body) = host.push(&acme, "other", &other_world);
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("not a sluice transform"), "{body}");
    let (status, body) = host.push(&acme, "huge", &vec![0u8; 9 << 20]);
    assert_eq!(status, 413, "{body}");
    let digest = host.push_guest(&acme, "running-count");
    let (_, modules) = host.get("/v1/modules", &acme);
    assert_eq!(modules.as_array().map(Vec::len), Some(1), "only the valid upload is kept: {modules}");

    // The same bytes under another name are not a silent rename.
    let (status, body) = host.push(&acme, "renamed", &std::fs::read(guests::guest("running-count")).expect("guest"));
    assert_eq!(status, 409, "{body}");
    // A tenant's modules are bounded in number (and bytes).
    let mut policy = serde_json::to_value(sluice::service::Policy::default_for("tiny")).expect("policy");
    policy["max-modules"] = json!(1);
    let tiny = host.tenant("tiny", Some(policy));
    host.push_guest(&tiny, "running-count");
    let (status, body) = host.push(&tiny, "uppercase", &std::fs::read(guests::guest("uppercase")).expect("guest"));
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("allows 1 modules"), "{body}");

    // Another tenant sees nothing of it.
    assert_eq!(host.get(&format!("/v1/modules/{digest}"), &globex).0, 404);
    assert_eq!(host.get("/v1/modules/running-count", &globex).0, 404);
    assert_eq!(host.get("/v1/modules", &globex).1, json!([]));
    assert_eq!(host.request("DELETE", &format!("/v1/modules/{digest}"), Some(&globex), None).0, 404);

    // A job may not use topics outside the tenant's prefixes, nor another tenant's module.
    let spec = |id: &str, module: &str, input: &str| json!({"id": id, "module": module, "input": {"topics": [input]}, "output": {"topics": [format!("{input}-out")]}});
    let (status, body) = host.post("/v1/jobs", &acme, spec("j", "running-count", "globex.clicks"));
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("prefix"), "{body}");
    assert_eq!(host.post("/v1/jobs", &globex, spec("j", &digest, "globex.clicks")).0, 404);
    let (status, body) = host.post("/v1/jobs", &acme, json!({"id": "j", "module": "running-count"}));
    assert_eq!(status, 400, "{body}");
    // A job on topics that do not exist is refused, not created to fail.
    let missing = format!("acme.missing-{}", unique("t"));
    let (status, body) = host.post("/v1/jobs", &acme, spec("j", "running-count", &missing));
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("does not exist"), "{body}");
    assert_eq!(host.get("/v1/jobs", &acme).1, json!([]), "nothing was created");

    // The OpenAPI document is served and names the routes.
    let (status, doc) = host.request("GET", "/openapi.json", None, None);
    assert_eq!(status, 200);
    assert!(doc["paths"]["/v1/jobs/{id}/stop"]["post"].is_object(), "{doc}");
}

#[test]
fn a_job_lives_through_stop_resume_and_a_host_crash_exactly_once() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut host = Host::start(&brokers, dir.path());
    let tenant = unique("t").replace(['-', '_'], "").to_lowercase();
    let tenant = &tenant[..tenant.len().min(30)];
    let token = host.tenant(tenant, None);
    host.push_guest(&token, "running-count");
    let input = format!("{tenant}.clicks");
    let output = format!("{tenant}.counts");
    tools::create_topics(&brokers, &[(&input, 2), (&output, 2)]).expect("topics");
    let spec = json!({
        "id": "counts", "module": "running-count", "parallelism": 2,
        "input": {"topics": [input]}, "output": {"topics": [output]},
        "checkpoint": {"interval": "200ms"},
    });
    let (status, job) = host.post("/v1/jobs", &token, spec);
    assert_eq!(status, 201, "{job}");
    assert_eq!(host.post("/v1/jobs", &token, json!({"id": "counts"})).0, 400, "a bad spec is refused");

    // Run.
    let mut inputs = support::produce_keyed(&brokers, &input, 0..6_000, 37);
    let running = host.wait_job(&token, "counts", Duration::from_secs(120), |j| {
        j["state"] == "running" && j["records_in"].as_u64() >= Some(6_000) && j["last_checkpoint"].as_u64() > Some(0)
    });
    assert_eq!(running["tasks"].as_array().map(Vec::len), Some(2), "{running}");
    assert_eq!(running["tasks"][0]["shards"], json!([0]), "{running}");
    assert_eq!(running["tasks"][1]["shards"], json!([1]), "{running}");
    assert!(running["cpu_seconds"].as_f64() > Some(0.0) || running["records_in"].as_u64() > Some(0), "{running}");
    let metrics = host.metrics();
    let line = format!("sluice_records_in_total{{tenant=\"{tenant}\",job=\"counts\"}}");
    assert!(metrics.contains(&line), "no {line} in /metrics:\n{metrics}");
    assert!(metrics.contains("sluice_cpu_seconds_total"), "{metrics}");
    let (_, logs) = host.get("/v1/jobs/counts/logs", &token);
    let logs = logs.as_array().cloned().unwrap_or_default();
    assert!(
        logs.iter().any(|l| l["message"]
            .as_str()
            .unwrap_or_default()
            .contains("recovered from the last committed checkpoint")),
        "the job's log has its recovery line: {logs:?}"
    );

    // A module in use cannot be deleted.
    assert_eq!(host.request("DELETE", "/v1/modules/running-count", Some(&token), None).0, 409);
    // Nor a running job.
    assert_eq!(host.request("DELETE", "/v1/jobs/counts", Some(&token), None).0, 409);

    // Stop with a final checkpoint; input keeps arriving while it is stopped.
    let (status, operation) = host.post("/v1/jobs/counts/stop", &token, json!({}));
    assert_eq!(status, 202, "{operation}");
    let done = host.wait_operation(&token, &operation);
    assert_eq!(done["state"], "succeeded", "{done}");
    let stopped = host.wait_job(&token, "counts", Duration::from_secs(10), |j| j["state"] == "stopped");
    assert_eq!(stopped["desired"], "stopped");
    // It shows what its run ended with, not zeros; and runs no task.
    assert!(stopped["records_in"].as_u64() >= Some(6_000), "{stopped}");
    assert!(stopped["records_out"].as_u64() >= Some(6_000), "{stopped}");
    assert!(stopped["checkpoints"].as_u64() >= running["checkpoints"].as_u64(), "{stopped}");
    assert!(stopped["last_checkpoint"].as_u64() > Some(0), "{stopped}");
    assert!(stopped["state_bytes"].as_u64() > Some(0), "{stopped}");
    let keys: u64 = stopped["shards"].as_array().into_iter().flatten().filter_map(|s| s["keys"].as_u64()).sum();
    assert!(keys >= 37, "every key's count is in the shards' committed state: {stopped}");
    assert_eq!(stopped["tasks"], json!([]), "{stopped}");
    assert_eq!(stopped["uptime_seconds"], json!(null), "{stopped}");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 6_000..9_000, 37));

    // A stopped job stays stopped across a host restart; resumed, it continues from its checkpoint.
    host.crash_and_restart();
    host.wait_job(&token, "counts", Duration::from_secs(10), |j| j["state"] == "stopped");
    // Operations outlive the host.
    let (status, again) = host.get(&format!("/v1/operations/{}", operation["id"].as_str().unwrap_or_default()), &token);
    assert_eq!((status, &again), (200, &done), "the stop after the restart");
    let (status, resumed) = host.post("/v1/jobs/counts/resume", &token, json!({}));
    assert_eq!(status, 200, "{resumed}");
    host.wait_job(&token, "counts", Duration::from_secs(120), |j| j["records_in"].as_u64() >= Some(3_000));

    // kill -9 the host mid-stream: the job resumes by itself at the next start.
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 9_000..14_000, 37));
    std::thread::sleep(Duration::from_millis(300));
    host.crash_and_restart();
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 14_000..16_000, 37));
    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(180));
    support::verify_running_count(&committed, &inputs);

    // Stop and delete: the state and the consumer group go with it.
    let (_, operation) = host.post("/v1/jobs/counts/stop", &token, json!({}));
    assert_eq!(host.wait_operation(&token, &operation)["state"], "succeeded");
    assert_eq!(host.request("DELETE", "/v1/jobs/counts", Some(&token), None).0, 204);
    assert_eq!(host.get("/v1/jobs/counts", &token).0, 404);
    assert!(!dir.path().join("state").join(tenant).join("counts").exists(), "the job's state is gone");
    let changelog = format!("sluice.{tenant}.counts.changelog");
    let probe = kafka::Source::connect(
        &kafka::client_config(&brokers, &Default::default()),
        "probe",
        kafka::StartPosition::Earliest,
    )
    .expect("consumer");
    let started = std::time::Instant::now();
    // Kafka deletes a topic in the background; its metadata shows it a little longer.
    while probe.partitions(std::slice::from_ref(&changelog), &brokers, Duration::from_secs(10)).is_ok() {
        assert!(started.elapsed() < Duration::from_secs(60), "the changelog {changelog} outlived its job");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A request that once panicked inside the global jobs lock (a checkpoint
/// interval so large that doubling it overflowed) is refused naming the
/// field (422: it parses, but cannot fit the transaction timeout), and every
/// tenant's calls keep working after it.
#[test]
fn a_hostile_spec_is_refused_and_breaks_nothing_for_others() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let (evil_name, good_name) = (support::tenant_name("evil"), support::tenant_name("good"));
    let evil = host.tenant(&evil_name, None);
    let good = host.tenant(&good_name, None);
    host.push_guest(&evil, "running-count");
    host.push_guest(&good, "running-count");
    let spec = |tenant: &str, id: &str, interval: &str| {
        json!({"id": id, "module": "running-count", "input": {"topics": [format!("{tenant}.in")]},
            "output": {"topics": [format!("{tenant}.out")]}, "checkpoint": {"interval": interval}})
    };
    let (status, body) = host.post("/v1/jobs", &evil, spec(&evil_name, "boom", "500000000000y"));
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("checkpoint.interval"), "{body}");
    for token in [&good, &evil] {
        let (status, body) = host.get("/v1/jobs", token);
        assert_eq!(status, 200, "{body}");
    }
    let (input, output) = (format!("{good_name}.in"), format!("{good_name}.out"));
    tools::create_topics(&brokers, &[(&input, 1), (&output, 1)]).expect("topics");
    let (status, body) = host.post("/v1/jobs", &good, spec(&good_name, "fine", "1s"));
    assert_eq!(status, 201, "another tenant's job still starts: {body}");
}

/// Authentication comes before anything else is read, and the scheme is
/// case-insensitive.
#[test]
fn authentication_comes_first() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let token = host.tenant("first", None);
    // A malformed query, body or upload without a token: 401, not a parser's 400/415/422.
    assert_eq!(host.request("GET", "/v1/jobs/x/logs?after=not-a-number", None, None).0, 401);
    assert_eq!(host.request("POST", "/v1/jobs", None, Some(json!("not a spec"))).0, 401);
    assert_eq!(host.request("PUT", "/v1/tenants/first/policy", None, Some(json!([1, 2]))).0, 401);
    assert_eq!(host.get_with_authorization("/v1/whoami", &format!("bearer {token}")).0, 200);
    assert_eq!(host.get_with_authorization("/v1/whoami", &format!("BEARER {token}")).0, 200);
    assert_eq!(host.get_with_authorization("/v1/whoami", &format!("Basic {token}")).0, 401);

    // An upload declared larger than the limit is refused before any of it
    // is read: the answer comes although no byte of the body follows.
    let (status, response) = host.raw(
        &format!("POST /v1/modules HTTP/1.1\r\nAuthorization: Bearer {token}\r\nContent-Length: 10737418240"),
        b"",
    );
    assert_eq!(status, 413, "{response}");
    assert!(response.contains("accepts at most"), "{response}");
    // Without a length (chunked), it is cut off where it passes the limit.
    let chunk = vec![b'x'; 1 << 20];
    let mut chunked = Vec::new();
    for _ in 0..9 {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(&chunk);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (status, response) = host.raw(
        &format!("POST /v1/modules HTTP/1.1\r\nAuthorization: Bearer {token}\r\nTransfer-Encoding: chunked"),
        &chunked,
    );
    assert_eq!(status, 413, "{response}");
    // Nothing of either is left in the data directory.
    let left: Vec<_> =
        std::fs::read_dir(dir.path().join("modules")).expect("modules dir").flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "{left:?}");
}

/// One control operation at a time per job: a resume or delete during an
/// upgrade, and an upgrade during a stop, are 409 instead of a hidden second
/// copy, an undone stop, or state removed under a running copy; after stop
/// and delete, nothing of the job runs any more.
#[test]
fn control_calls_on_one_job_take_turns() {
    let CountingJob { brokers, dir: _dir, host, token, input, output, .. } = counting_job("turns", 2, 2);
    let v2 = host.push_guest(&token, "counter-v2");
    let inputs = support::produce_keyed(&brokers, &input, 0..1_000, 13);
    support::read_committed(&brokers, &output, 1_000, Duration::from_secs(120));

    let (status, upgrade) = host.post("/v1/jobs/j/upgrade", &token, json!({"module": v2}));
    assert_eq!(status, 202, "{upgrade}");
    let (status, body) = host.post("/v1/jobs/j/resume", &token, json!({}));
    assert_eq!(status, 409, "a resume during an upgrade: {body}");
    let (status, body) = host.request("DELETE", "/v1/jobs/j", Some(&token), None);
    assert_eq!(status, 409, "a delete during an upgrade: {body}");
    assert_eq!(host.wait_operation(&token, &upgrade)["state"], "succeeded");

    let (status, stop) = host.post("/v1/jobs/j/stop", &token, json!({}));
    assert_eq!(status, 202, "{stop}");
    let (status, body) = host.post("/v1/jobs/j/upgrade", &token, json!({"module": "running-count"}));
    assert!(status == 409 || status == 202, "{status} {body}");
    let stopped = host.wait_operation(&token, &stop);
    assert_eq!(stopped["state"], "succeeded", "{stopped}");
    if status == 202 {
        // The stop had already finished when the upgrade came: the upgrade
        // of a stopped job switches the module and leaves it stopped.
        assert_eq!(host.wait_operation(&token, &body)["state"], "succeeded");
        let (_, job) = host.get("/v1/jobs/j", &token);
        assert_eq!(job["desired"], "stopped", "{job}");
    }
    let job = host.wait_job(&token, "j", Duration::from_secs(60), |j| j["state"] == "stopped");
    let (status, body) = host.request("DELETE", "/v1/jobs/j", Some(&token), None);
    assert_eq!(status, 204, "{body} {job}");

    // Nothing processes the input any more.
    support::produce_keyed(&brokers, &input, 1_000..1_500, 13);
    std::thread::sleep(Duration::from_secs(5));
    let committed = support::read_committed(&brokers, &output, 1_000, Duration::from_secs(30));
    support::verify_running_count(&committed, &inputs);
}

/// A stop that waits on its store (a slow disk; in a cluster, the cluster's
/// log) holds up no other call: it takes the job, not the host's jobs lock.
#[test]
fn a_stop_waiting_on_its_store_holds_up_no_other_tenant() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start_with_env(&brokers, dir.path(), &[("SLUICE_FAILPOINT", "stop-before-desired:stall=10s")]);
    let (slow, other) = (support::tenant_name("slowstop"), support::tenant_name("bystander"));
    let (slow_token, other_token) = (host.tenant(&slow, None), host.tenant(&other, None));
    for (tenant, token) in [(&slow, &slow_token), (&other, &other_token)] {
        host.push_guest(token, "running-count");
        let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
        tools::create_topics(&brokers, &[(&input, 1), (&output, 1)]).expect("topics");
        let spec = json!({"id": "j", "module": "running-count",
            "input": {"topics": [input]}, "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
        assert_eq!(host.post("/v1/jobs", token, spec).0, 201);
        host.wait_job(token, "j", Duration::from_secs(60), |j| j["state"] == "running");
    }

    std::thread::scope(|scope| {
        let stop = scope.spawn(|| host.post("/v1/jobs/j/stop", &slow_token, json!({})));
        let stalled = Instant::now();
        while !host.log_text().contains("failpoint `stop-before-desired`") {
            assert!(stalled.elapsed() < Duration::from_secs(60), "the stop never reached its store");
            std::thread::sleep(Duration::from_millis(50));
        }
        // While the stop waits: the other tenant lists, reads and stops its
        // job, and the stopping job reads as stopping and refuses changes.
        let (status, jobs) = host.get("/v1/jobs", &other_token);
        assert_eq!(status, 200, "{jobs}");
        let (_, job) = host.get("/v1/jobs/j", &slow_token);
        assert_eq!(job["state"], "stopping", "{job}");
        let (status, body) = host.post("/v1/jobs/j/scale", &slow_token, json!({"parallelism": 2}));
        assert_eq!(status, 409, "a scale during the stop: {body}");
        assert!(!stop.is_finished(), "the other calls waited for the stop");
        let (status, other_stop) = host.post("/v1/jobs/j/stop", &other_token, json!({}));
        assert_eq!(status, 202, "{other_stop}");
        assert!(!stop.is_finished(), "the other tenant's stop waited for the first");
        assert_eq!(host.wait_operation(&other_token, &other_stop)["state"], "succeeded");

        let (status, operation) = stop.join().expect("the stop call");
        assert_eq!(status, 202, "{operation}");
        assert_eq!(host.wait_operation(&slow_token, &operation)["state"], "succeeded");
    });
    let job = host.wait_job(&slow_token, "j", Duration::from_secs(60), |j| j["state"] == "stopped");
    assert_eq!(job["desired"], "stopped", "{job}");
}

/// A host killed inside a stop, before it stored the desired state: the
/// job comes back running (the stop never happened), and a stop after the
/// restart takes it down with its operation done.
#[test]
fn a_stop_cut_short_before_its_store_leaves_the_job_running() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut host = Host::start_with_env(&brokers, dir.path(), &[("SLUICE_FAILPOINT", "stop-before-desired")]);
    let tenant = support::tenant_name("cutstop");
    let token = host.tenant(&tenant, None);
    host.push_guest(&token, "running-count");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, 1), (&output, 1)]).expect("topics");
    let spec = json!({"id": "j", "module": "running-count",
        "input": {"topics": [input]}, "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
    assert_eq!(host.post("/v1/jobs", &token, spec).0, 201);
    let mut inputs = support::produce_keyed(&brokers, &input, 0..1_000, 11);
    host.wait_job(&token, "j", Duration::from_secs(60), |j| j["records_in"].as_u64() >= Some(1_000));

    assert!(host.request_dies("/v1/jobs/j/stop", &token, json!({})), "the host died in the stop");
    host.crash_and_restart_with_env(&[]);
    let job = host.wait_job(&token, "j", Duration::from_secs(60), |j| j["state"] == "running");
    assert_eq!(job["desired"], "running", "{job}");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 1_000..2_000, 11));
    let committed = support::read_committed(&brokers, &output, 2_000, Duration::from_secs(120));
    support::verify_running_count(&committed, &inputs);

    let (status, stop) = host.post("/v1/jobs/j/stop", &token, json!({}));
    assert_eq!(status, 202, "{stop}");
    assert_eq!(host.wait_operation(&token, &stop)["state"], "succeeded");
    let job = host.wait_job(&token, "j", Duration::from_secs(60), |j| j["state"] == "stopped");
    assert_eq!(job["desired"], "stopped", "{job}");
}

/// A tenant's running jobs hold at most its policy's `max-tasks` slots of
/// the host's shared instance pool.
#[test]
fn a_tenant_runs_at_most_its_share_of_tasks() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let tenant = support::tenant_name("slots");
    let mut policy = serde_json::to_value(sluice::service::Policy::default_for(&tenant)).expect("policy");
    policy["max-tasks"] = json!(2);
    let token = host.tenant(&tenant, Some(policy));
    host.push_guest(&token, "running-count");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, 2), (&output, 2)]).expect("topics");
    let spec = |id: &str, parallelism: u32| {
        json!({"id": id, "module": "running-count", "parallelism": parallelism,
            "input": {"topics": [input]}, "output": {"topics": [output]}})
    };
    assert_eq!(host.post("/v1/jobs", &token, spec("a", 2)).0, 201);
    let (status, body) = host.post("/v1/jobs", &token, spec("b", 1));
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("allows 2 tasks"), "{body}");
    let (_, stop) = host.post("/v1/jobs/a/stop", &token, json!({}));
    assert_eq!(host.wait_operation(&token, &stop)["state"], "succeeded");
    host.wait_job(&token, "a", Duration::from_secs(60), |j| j["state"] == "stopped");
    assert_eq!(host.post("/v1/jobs", &token, spec("b", 1)).0, 201, "a's slots are free again");
    let (status, body) = host.post("/v1/jobs/a/resume", &token, json!({}));
    assert_eq!(status, 403, "resuming a would be over: {body}");
}

/// `reset` moves a stopped job's positions for reprocessing: keeping the
/// state, the replayed records count on from where the job was; clearing
/// it, they count from 1; to `latest`, only new records are read. Each
/// exactly once in the committed output. A running job cannot be reset.
#[test]
fn a_stopped_job_is_reset_to_reprocess_with_or_without_its_state() {
    let CountingJob { brokers, dir: _dir, host, token, input, output, .. } = counting_job("reset", 2, 2);
    let first = support::produce_keyed(&brokers, &input, 0..1_000, 10);
    support::read_committed(&brokers, &output, 1_000, Duration::from_secs(120));
    let (status, body) = host.post("/v1/jobs/j/reset", &token, json!({"to": "earliest", "state": "keep"}));
    assert_eq!(status, 409, "a running job: {body}");

    let stop_reset_resume = |to: &str, state: &str| {
        let (_, stop) = host.post("/v1/jobs/j/stop", &token, json!({}));
        assert_eq!(host.wait_operation(&token, &stop)["state"], "succeeded");
        let (status, body) = host.post("/v1/jobs/j/reset", &token, json!({"to": to, "state": state}));
        assert_eq!(status, 200, "reset to {to}, {state} state: {body}");
        let (status, body) = host.post("/v1/jobs/j/resume", &token, json!({}));
        assert_eq!(status, 200, "{body}");
    };
    // Keep the state: the same 1,000 records again, counting on.
    stop_reset_resume("earliest", "keep");
    let committed = support::read_committed(&brokers, &output, 2_000, Duration::from_secs(120));
    for (key, counts) in support::counts_per_key(&committed) {
        let n = first[&key];
        assert_eq!(counts, (1..=2 * n).collect::<Vec<_>>(), "key {key} after a reset keeping the state");
    }
    // Clear it: they count from 1 again.
    stop_reset_resume("earliest", "clear");
    let committed = support::read_committed(&brokers, &output, 3_000, Duration::from_secs(120));
    for (key, counts) in support::counts_per_key(&committed) {
        let n = first[&key];
        let expected: Vec<u64> = (1..=2 * n).chain(1..=n).collect();
        assert_eq!(counts, expected, "key {key} after a reset clearing the state");
    }
    // To the end, cleared: only what is written afterwards, from 1.
    let (status, body) = host.post("/v1/jobs/j/reset", &token, json!({"to": "2026-13-45T00:00:00Z", "state": "keep"}));
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("`to = "), "{body}");
    stop_reset_resume("latest", "clear");
    host.wait_job(&token, "j", Duration::from_secs(60), |j| j["state"] == "running");
    let later = support::produce_keyed(&brokers, &input, 1_000..1_500, 10);
    let committed = support::read_committed(&brokers, &output, 3_500, Duration::from_secs(120));
    for (key, counts) in support::counts_per_key(&committed) {
        let (n, m) = (first[&key], later[&key]);
        let expected: Vec<u64> = (1..=2 * n).chain(1..=n).chain(1..=m).collect();
        assert_eq!(counts, expected, "key {key} after a reset to latest");
    }
    let (status, body) = host.post("/v1/jobs/j/reset", &token, json!({"to": "1700000000000", "state": "clear"}));
    assert_eq!(status, 409, "still running: {body}");
}

/// `POST /v1/jobs/{id}/scale` on a running job while input keeps arriving:
/// the job stops with a final checkpoint, its shards' state moves to the new
/// tasks, and it goes on, with every output exactly once. A control call
/// during the scale waits its turn (409); a scale over the tenant's policy
/// is refused before anything stops; a stopped job keeps the new
/// parallelism for its next start.
#[test]
fn a_running_job_scales_up_and_down_exactly_once() {
    let CountingJob { brokers, dir: _dir, host, token, input, output, .. } = counting_job("scale", 4, 1);

    // Input arrives all along, in bursts, while the job is scaled.
    let producing = {
        let (brokers, input) = (brokers.clone(), input.clone());
        std::thread::spawn(move || {
            let mut inputs = BTreeMap::new();
            for burst in 0..30 {
                support::add_counts(
                    &mut inputs,
                    support::produce_keyed(&brokers, &input, burst * 300..(burst + 1) * 300, 23),
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            inputs
        })
    };
    let shards = |job: &Value| -> Vec<Value> {
        job["tasks"].as_array().map(|tasks| tasks.iter().map(|t| t["shards"].clone()).collect()).unwrap_or_default()
    };
    host.wait_job(&token, "j", Duration::from_secs(120), |j| j["records_in"].as_u64() > Some(0));

    let (status, body) = host.post("/v1/jobs/j/scale", &token, json!({"parallelism": 5}));
    assert_eq!(status, 403, "over the policy's max-parallelism of 4: {body}");
    let (status, scale) = host.post("/v1/jobs/j/scale", &token, json!({"parallelism": 3}));
    assert_eq!(status, 202, "{scale}");
    let (status, body) = host.post("/v1/jobs/j/stop", &token, json!({}));
    assert_eq!(status, 409, "a stop during the scale: {body}");
    assert_eq!(host.wait_operation(&token, &scale)["state"], "succeeded");
    let job = host.wait_job(&token, "j", Duration::from_secs(60), |j| j["state"] == "running");
    assert_eq!(shards(&job), vec![json!([0, 3]), json!([1]), json!([2])], "{job}");

    let (status, scale) = host.post("/v1/jobs/j/scale", &token, json!({"parallelism": 2}));
    assert_eq!(status, 202, "{scale}");
    assert_eq!(host.wait_operation(&token, &scale)["state"], "succeeded");
    let job = host.wait_job(&token, "j", Duration::from_secs(60), |j| j["state"] == "running");
    assert_eq!(shards(&job), vec![json!([0, 2]), json!([1, 3])], "{job}");

    let inputs = producing.join().expect("producer thread");
    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(180));
    support::verify_running_count(&committed, &inputs);

    // Stopped: the new parallelism is for the next start.
    let (_, stop) = host.post("/v1/jobs/j/stop", &token, json!({}));
    assert_eq!(host.wait_operation(&token, &stop)["state"], "succeeded");
    let (status, scale) = host.post("/v1/jobs/j/scale", &token, json!({"parallelism": 4}));
    assert_eq!(status, 202, "{scale}");
    assert_eq!(host.wait_operation(&token, &scale)["state"], "succeeded");
    assert_eq!(host.get("/v1/jobs/j", &token).1["state"], "stopped");
    assert_eq!(host.post("/v1/jobs/j/resume", &token, json!({})).0, 200);
    let job = host.wait_job(&token, "j", Duration::from_secs(60), |j| j["state"] == "running");
    assert_eq!(shards(&job), vec![json!([0]), json!([1]), json!([2]), json!([3])], "{job}");
}

/// A stopped job whose state directory is deleted: resumed, each shard's
/// state comes back from the changelog, the status says so per shard (with
/// the records read), the metrics count it, and the counts go on exactly.
#[test]
fn a_lost_state_directory_is_restored_and_the_status_shows_it() {
    let CountingJob { brokers, dir, host, tenant, token, input, output } = counting_job("restore", 2, 2);
    let mut inputs = support::produce_keyed(&brokers, &input, 0..2_000, 17);
    support::read_committed(&brokers, &output, 2_000, Duration::from_secs(120));
    let job = host.wait_job(&token, "j", Duration::from_secs(60), |j| {
        j["shards"].as_array().is_some_and(|s| s.len() == 2 && s.iter().all(|s| s["keys"].as_u64() > Some(0)))
    });
    assert_eq!(job["shards"][0]["origin"], json!({"from": "local"}), "{job}");
    assert_eq!(job["shards"][1]["task"], 1, "{job}");
    // Each shard also holds the host's entry of its event time (the
    // running-count of the Rust SDK is of world `packed`, which has time).
    let keys: u64 = job["shards"].as_array().into_iter().flatten().filter_map(|s| s["keys"].as_u64()).sum();
    assert_eq!(keys, 17 + 2, "every key once, in its shard, and each shard's watermark: {job}");

    let (_, stop) = host.post("/v1/jobs/j/stop", &token, json!({}));
    assert_eq!(host.wait_operation(&token, &stop)["state"], "succeeded");
    std::fs::remove_dir_all(dir.path().join("state").join(&tenant).join("j")).expect("delete the job's state");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 2_000..3_000, 17));
    assert_eq!(host.post("/v1/jobs/j/resume", &token, json!({})).0, 200);
    let job = host.wait_job(&token, "j", Duration::from_secs(120), |j| j["state"] == "running");
    for shard in job["shards"].as_array().into_iter().flatten() {
        assert_eq!(shard["origin"]["from"], "changelog", "{job}");
        assert!(shard["origin"]["records"].as_u64() > Some(0), "{job}");
    }
    assert!(job["restored_records"].as_u64() >= Some(17), "{job}");
    let metrics = host.metrics();
    assert!(metrics.contains("sluice_restore_records_total{"), "{metrics}");

    let committed = support::read_committed(&brokers, &output, 3_000, Duration::from_secs(120));
    support::verify_running_count(&committed, &inputs);
}

/// Event time on the shared host: a window job with a `[time]` section;
/// its status shows each shard's watermark and the late records, and the
/// metrics count them.
#[test]
fn status_shows_each_shards_watermark_and_the_late_records() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let tenant = support::tenant_name("time");
    let token = host.tenant(&tenant, None);
    host.push_guest(&token, "windowed-count");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, 2), (&output, 1)]).expect("topics");
    let spec = json!({"id": "w", "module": "windowed-count", "input": {"topics": [input]},
        "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"},
        "time": {"max-out-of-orderness": "100ms"}, "transform": {"config": {"window": "1s"}}});
    let (status, body) = host.post("/v1/jobs", &token, spec);
    assert_eq!(status, 201, "{body}");
    let (status, body) = host.post(
        "/v1/jobs",
        &token,
        json!({"id": "bad", "module": "windowed-count", "input": {"topics": [input]},
            "output": {"topics": [output]}, "time": {"idle-timeout": "soon"}}),
    );
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("time.idle-timeout"), "names the field: {body}");

    let t0 = support::event_time_origin();
    let record = |ts: i64| (b"k".to_vec(), b"click".to_vec(), Some(ts));
    // Partition 0 reaches t0 + 2s (watermark t0 + 2s - 100ms - 1ms), then a
    // record 1.1 s behind it arrives: late. Partition 1 reaches t0 + 500ms.
    tools::produce_timed(&brokers, &input, Some(0), vec![record(t0), record(t0 + 2_000)]).expect("produce");
    tools::produce_timed(&brokers, &input, Some(1), vec![record(t0 + 500)]).expect("produce");
    support::read_committed(&brokers, &output, 1, Duration::from_secs(60));
    tools::produce_timed(&brokers, &input, Some(0), vec![record(t0 + 900)]).expect("produce");
    let status = host.wait_job(&token, "w", Duration::from_secs(60), |j| {
        j["late_records"].as_u64() >= Some(1) && j["shards"][1]["watermark"].is_i64()
    });
    assert_eq!(status["late_records"], 1, "{status}");
    assert_eq!(status["shards"][0]["watermark"], t0 + 1_899, "{status}");
    assert_eq!(status["shards"][1]["watermark"], t0 + 399, "{status}");
    assert!(status["timers_fired"].as_u64() >= Some(1), "the window [t0, t0 + 1s) fired: {status}");
    let metrics = host.metrics();
    assert!(metrics.contains(&format!("sluice_late_records_total{{tenant=\"{tenant}\",job=\"w\"}} 1")), "{metrics}");
    // Per shard, the late record is shard 0's; per input partition, the
    // lag is read to the end.
    let status = host.wait_job(&token, "w", Duration::from_secs(60), |j| {
        j["shards"][0]["late_records"] == 1 && j["tasks"][0]["partitions"].as_array().is_some_and(|p| p.len() == 2)
    });
    assert_eq!(status["shards"][1]["late_records"], 0, "{status}");
    let partitions = status["tasks"][0]["partitions"].as_array().cloned().unwrap_or_default();
    let mut seen: Vec<(String, i64)> = partitions
        .iter()
        .map(|p| (p["topic"].as_str().unwrap_or_default().to_owned(), p["partition"].as_i64().unwrap_or(-1)))
        .collect();
    seen.sort();
    assert_eq!(seen, [(input.clone(), 0), (input.clone(), 1)], "{status}");
}

/// A time-to-live lowers state bytes: dedup remembers each (key, value)
/// for its `ttl` of processing time, then its expiry timer removes the
/// entry, and the shard's committed state shrinks; a repeat after that
/// passes again.
#[test]
fn expired_state_is_removed_and_the_shards_bytes_go_down() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let tenant = support::tenant_name("ttl");
    let token = host.tenant(&tenant, None);
    host.push_guest(&token, "dedup");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, 1), (&output, 1)]).expect("topics");
    let spec = json!({"id": "d", "module": "dedup", "input": {"topics": [input]},
        "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"},
        "transform": {"config": {"ttl": "30s"}}});
    let (status, body) = host.post("/v1/jobs", &token, spec);
    assert_eq!(status, 201, "{body}");
    let values = |n: usize| -> Vec<(Vec<u8>, Vec<u8>)> {
        (0..n).map(|i| (b"k".to_vec(), format!("value {i} {}", "x".repeat(100)).into_bytes())).collect()
    };
    // 500 distinct values, then the same again: all repeats, dropped.
    tools::produce(&brokers, &input, values(500)).expect("produce");
    tools::produce(&brokers, &input, values(500)).expect("produce");
    support::read_committed(&brokers, &output, 500, Duration::from_secs(60));
    let full = host.wait_job(&token, "d", Duration::from_secs(30), |j| j["shards"][0]["bytes"].as_u64() > Some(50_000));
    let full_bytes = full["shards"][0]["bytes"].as_u64().unwrap_or_default();
    assert_eq!(full["records_out"], 500, "the repeats were dropped: {full}");

    // After the TTL (long enough that the full state shows in a status
    // first: shard figures are sampled every 5 s) the entries are removed.
    let drained = host.wait_job(&token, "d", Duration::from_secs(60), |j| {
        j["shards"][0]["bytes"].as_u64().is_some_and(|b| b < full_bytes / 10)
    });
    assert!(drained["timers_fired"].as_u64() >= Some(500), "one expiry timer per entry: {drained}");
    // And the values pass again.
    tools::produce(&brokers, &input, values(500)).expect("produce");
    let committed = support::read_committed(&brokers, &output, 1_000, Duration::from_secs(60));
    assert_eq!(committed.len(), 1_000, "after expiry each value passes once more");
}

/// Idle partitions: a shard reading two topics (partition 0 of each) holds
/// its watermark while one topic sends nothing, so its windows stay open;
/// with `time.idle-timeout`, the silent topic stops holding it back once it
/// has been idle that long, and the window closes.
#[test]
fn an_idle_partition_holds_the_watermark_until_its_timeout() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let tenant = support::tenant_name("idle");
    let token = host.tenant(&tenant, None);
    host.push_guest(&token, "windowed-count");
    let (busy, silent) = (format!("{tenant}.busy"), format!("{tenant}.silent"));
    let (held, freed) = (format!("{tenant}.held"), format!("{tenant}.freed"));
    tools::create_topics(&brokers, &[(&busy, 1), (&silent, 1), (&held, 1), (&freed, 1)]).expect("topics");
    for (id, output, time) in [("held", &held, json!({})), ("freed", &freed, json!({"idle-timeout": "2s"}))] {
        let spec = json!({"id": id, "module": "windowed-count", "input": {"topics": [busy, silent]},
            "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}, "time": time,
            "transform": {"config": {"window": "1s"}}});
        let (status, body) = host.post("/v1/jobs", &token, spec);
        assert_eq!(status, 201, "{body}");
    }
    let t0 = support::event_time_origin();
    let record = |ts: i64| (b"k".to_vec(), b"click".to_vec(), Some(ts));
    tools::produce_timed(&brokers, &busy, Some(0), vec![record(t0), record(t0 + 1_500)]).expect("produce");

    // With the idle timeout the silent topic stops counting: [t0, t0 + 1s) closes.
    let committed = support::read_committed(&brokers, &freed, 1, Duration::from_secs(60));
    let value: Value = serde_json::from_slice(committed[0].value.as_deref().unwrap_or_default()).expect("json");
    assert_eq!(value, json!({"start": t0, "end": t0 + 1_000, "count": 1}));
    // Without it the silent topic holds the watermark: both records read,
    // no watermark, nothing fired, however long it waits.
    // (Shard figures are sampled: keys in the committed state show that this
    // sample came after both records were processed and checkpointed.)
    let held_status = host.wait_job(&token, "held", Duration::from_secs(60), |j| {
        j["records_in"] == 2 && j["shards"][0]["keys"].as_u64() > Some(0)
    });
    assert!(held_status["shards"][0].get("watermark").is_none(), "{held_status}");
    assert_eq!(held_status["timers_fired"], 0, "{held_status}");
    // Once the silent topic sends, the watermark is its record less 1 ms.
    tools::produce_timed(&brokers, &silent, Some(0), vec![record(t0 + 1_200)]).expect("produce");
    let committed = support::read_committed(&brokers, &held, 1, Duration::from_secs(60));
    let value: Value = serde_json::from_slice(committed[0].value.as_deref().unwrap_or_default()).expect("json");
    assert_eq!(value, json!({"start": t0, "end": t0 + 1_000, "count": 1}), "closed once the silent topic spoke");
}
