//! Crash at each step of the checkpoint protocol (the third time it is
//! reached), restart, and verify that the committed output is exact.

use std::time::Duration;

use sluice::failpoint;

use crate::support::{self, JobOptions, Running};

const RECORDS: usize = 20_000;
const KEYS: usize = 97;

fn crash_at(point: &str) {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: point, ..Default::default() });
    // The input arrives over a few seconds, as a stream does: the job takes
    // checkpoints while it flows, and folds the committed ones about once a
    // second, so every step of the protocol is reached three times.
    let producer = {
        let (brokers, input) = (brokers.clone(), files.input.clone());
        std::thread::spawn(move || {
            let mut inputs = std::collections::BTreeMap::new();
            for part in (0..RECORDS).step_by(RECORDS / 5) {
                support::add_counts(
                    &mut inputs,
                    support::produce_keyed(&brokers, &input, part..part + RECORDS / 5, KEYS),
                );
                std::thread::sleep(Duration::from_millis(800));
            }
            inputs
        })
    };

    let spec = format!("{point}@3");
    let mut crashing = Running::start(&files, &[("SLUICE_FAILPOINT", &spec)]);
    let status = crashing.wait_exit(Duration::from_secs(120));
    let inputs = producer.join().expect("the producer thread");
    let log = crashing.log_text();
    let status = status.unwrap_or_else(|| panic!("the job did not reach failpoint {point}; log:\n{log}"));
    assert!(!status.success(), "the process must have aborted at {point}: {status}; log:\n{log}");
    assert!(log.contains(&format!("failpoint `{point}` hit 3 time(s)")), "crashed elsewhere; log:\n{log}");
    // A task that failed and recovered on its own before the failpoint
    // would have counted its recovery's fold as a hit, and the crash would
    // test nothing.
    assert!(!log.contains("task failed"), "a task failed before the failpoint; log:\n{log}");

    let crash_log = log;
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, RECORDS, Duration::from_secs(120));
    let log = job.log_text();
    job.terminate();
    let recoveries = recoveries(&log);
    assert!(!recoveries.is_empty(), "no recovery in the restarted run; log:\n{log}");
    // What the crashed task must have left for its recovery to repair.
    let expected = match point {
        "before-snapshot" => |r: &Recovery| r.committed.is_some(),
        "after-snapshot" | "before-flush" | "after-flush" | "before-commit" => |r: &Recovery| !r.discarded.is_empty(),
        _ => |r: &Recovery| !r.folded.is_empty(),
    };
    assert!(
        recoveries.iter().any(expected),
        "no task recovered as a crash at {point} requires: {recoveries:?}; log of the run that crashed:\n{crash_log}\nlog of the restarted run:\n{log}"
    );
    assert_eq!(
        committed.len(),
        RECORDS,
        "committed outputs after the restart; log of the run that crashed:\n{crash_log}\nlog of the restarted run:\n{log}"
    );
    support::verify_running_count(&committed, &inputs);
}

/// One task's recovery, as its log line reports it.
#[derive(Debug)]
struct Recovery {
    committed: Option<u64>,
    folded: Vec<u64>,
    discarded: Vec<u64>,
}

/// The recoveries a run's log reports, from lines like
/// `recovered from the last committed checkpoint task=j/0 committed=Some(7) folded=[7] discarded=[8] attempt=0`.
fn recoveries(log: &str) -> Vec<Recovery> {
    let field = |line: &str, name: &str| -> String {
        let start = line.find(&format!(" {name}=")).map(|i| i + name.len() + 2).unwrap_or(line.len());
        let rest = &line[start..];
        let end = if rest.starts_with('[') {
            rest.find(']').map_or(rest.len(), |i| i + 1)
        } else {
            rest.find(' ').unwrap_or(rest.len())
        };
        rest[..end].to_string()
    };
    let ids = |text: String| -> Vec<u64> {
        text.trim_matches(|c| c == '[' || c == ']').split(", ").filter_map(|n| n.parse().ok()).collect()
    };
    log.lines()
        .filter(|line| line.contains("recovered from the last committed checkpoint"))
        .map(|line| Recovery {
            committed: field(line, "committed")
                .strip_prefix("Some(")
                .and_then(|n| n.trim_end_matches(')').parse().ok()),
            folded: ids(field(line, "folded")),
            discarded: ids(field(line, "discarded")),
        })
        .collect()
}

#[test]
fn every_failpoint_is_tested() {
    let tested = [
        "before-snapshot",
        "after-snapshot",
        "before-flush",
        "after-flush",
        "before-commit",
        "after-commit-before-fold",
        "during-fold",
        "after-fold",
        // In `rescale::rescaling_2_3_1_4_through_kill_9_is_exactly_once`.
        "rescale-during-copy",
        "rescale-before-sweep",
        // In `failpoints::reset_before_commit`, below.
        "reset-before-commit",
        // In `serve::a_stop_waiting_on_its_store_holds_up_no_other_tenant` and
        // `serve::a_stop_cut_short_before_its_store_leaves_the_job_running`.
        "stop-before-desired",
        // In `cluster::two_resumes_through_two_members_cannot_both_pass_the_task_limit`.
        "resume-before-record",
        // In `cluster::an_upgrade_whose_member_stops_before_switching_is_given_up_and_the_job_runs_on`.
        "change-before-record",
        // In `cluster::an_upgrade_or_rescale_through_one_host_is_done_once_every_host_runs_it`.
        "change-after-record",
        // In `module_bytes::a_refused_or_interrupted_upload_leaves_nothing_on_any_member`.
        "upload-before-decide",
        "upload-before-activate",
        // In `slow_log::a_slow_cluster_log_holds_up_no_other_call_nor_the_placement_loop`.
        "log-submit",
        // In `cluster::a_member_behind_on_an_upgrade_does_not_run_the_shards_it_migrated`.
        "apply-upgrade",
    ];
    assert_eq!(failpoint::ALL, tested, "add a test below for each new failpoint");
}

#[test]
fn before_snapshot() {
    crash_at("before-snapshot");
}

#[test]
fn after_snapshot() {
    crash_at("after-snapshot");
}

#[test]
fn before_flush() {
    crash_at("before-flush");
}

#[test]
fn after_flush() {
    crash_at("after-flush");
}

#[test]
fn before_commit() {
    crash_at("before-commit");
}

#[test]
fn after_commit_before_fold() {
    crash_at("after-commit-before-fold");
}

#[test]
fn during_fold() {
    crash_at("during-fold");
}

#[test]
fn after_fold() {
    crash_at("after-fold");
}

/// A reset cut short by a crash after the state was cleared and before the
/// positions were committed: the job refuses to resume (it would run on an
/// empty state at its old positions), and a second reset completes it.
#[test]
fn reset_before_commit() {
    use crate::host::Host;
    use serde_json::json;
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut host = Host::start_with_env(&brokers, dir.path(), &[("SLUICE_FAILPOINT", "reset-before-commit")]);
    let tenant = support::tenant_name("resetcrash");
    let token = host.tenant(&tenant, None);
    host.push_guest(&token, "running-count");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    sluice::kafka::tools::create_topics(&brokers, &[(&input, 2), (&output, 2)]).expect("topics");
    let spec = json!({"id": "j", "module": "running-count", "parallelism": 2,
        "input": {"topics": [input]}, "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
    assert_eq!(host.post("/v1/jobs", &token, spec).0, 201);
    let inputs = support::produce_keyed(&brokers, &input, 0..500, 10);
    support::read_committed(&brokers, &output, 500, Duration::from_secs(120));
    let (_, stop) = host.post("/v1/jobs/j/stop", &token, json!({}));
    assert_eq!(host.wait_operation(&token, &stop)["state"], "succeeded");

    let reset = json!({"to": "earliest", "state": "clear"});
    assert!(host.request_dies("/v1/jobs/j/reset", &token, reset.clone()), "the failpoint did not fire");
    host.crash_and_restart_with_env(&[]);
    let (status, body) = host.post("/v1/jobs/j/resume", &token, json!({}));
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("reset"), "{body}");
    let (status, body) = host.post("/v1/jobs/j/reset", &token, reset);
    assert_eq!(status, 200, "{body}");
    assert_eq!(host.post("/v1/jobs/j/resume", &token, json!({})).0, 200);
    // The 500 records once more, from empty state: each key counts 1..n twice.
    let committed = support::read_committed(&brokers, &output, 1_000, Duration::from_secs(120));
    assert_eq!(committed.len(), 1_000);
    let per_key = support::counts_per_key(&committed);
    for (key, n) in &inputs {
        let expected: Vec<u64> = (1..=*n).chain(1..=*n).collect();
        assert_eq!(per_key.get(key), Some(&expected), "key {key}");
    }
}
