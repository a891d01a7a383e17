//! The host memory a tenant can cost (docs/memory.md): a tenant whose jobs
//! run at its policy's limits keeps the host's resident memory within
//! `max-tasks` times what one task can take
//! ([`TaskBudget::task_bytes`](sluice::checkpoint::budget::TaskBudget::task_bytes))
//! plus `max-jobs` times what one job holds.

use std::time::Duration;

use serde_json::json;
use sluice::checkpoint::budget::{JOB_BYTES, TaskBudget};
use sluice::kafka::tools;

use crate::host::Host;
use crate::support;

const MIB: usize = 1 << 20;

/// A field of `/proc/<pid>/status`, in bytes (the kernel gives kB).
fn status_bytes(pid: u32, field: &str) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the host's status");
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field} in {status}"));
    let kb: usize = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number of kB");
    kb * 1024
}

#[test]
fn a_tenant_at_its_limits_keeps_the_host_within_its_memory_formula() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    // Memory the allocator frees goes back to the system at once, so that
    // resident memory follows live memory; modules compile to optimized
    // code at upload, so no compile runs while the tenant is measured.
    let host =
        Host::start_with_env(&brokers, dir.path(), &[("MIMALLOC_PURGE_DELAY", "0"), ("SLUICE_NO_BASELINE", "true")]);
    let tenant = support::tenant_name("memory");
    let (memory, tasks, jobs, partitions) = (16 * MIB, 2, 1, 2);
    let token = host.tenant(
        &tenant,
        Some(json!({
            "topic-prefixes": [format!("{tenant}.")], "max-jobs": jobs, "max-parallelism": tasks,
            "max-tasks": tasks, "max-batch-size": 100,
            "limits": {"memory": "16MiB", "deadline": "2s", "max-outputs-per-input": 10, "state": "8MiB"},
        })),
    );
    host.push_guest(&token, "probe");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(input.as_str(), partitions as i32), (output.as_str(), partitions as i32)])
        .expect("topics");
    // Records near the largest a client fetches (their keys padded; the
    // probe reads its command from the value), each making the guest write
    // 200 kB of state, read 8 MB of it in one call, or emit its most
    // outputs.
    let records = 240;
    let commands: Vec<String> = (0..records)
        .map(|i| match i % 3 {
            0 => format!("fill k{} 200000", i % 24),
            1 => format!("getsame k{} 40", (i + 23) % 24),
            _ => "emit 10".to_owned(),
        })
        .collect();
    let expected: usize = commands.iter().map(|c| if c.starts_with("emit") { 10 } else { 1 }).sum();
    let padded_key = |i: usize| {
        let mut key = i.to_string().into_bytes();
        key.resize(400_000, b'.');
        key
    };
    tools::produce(&brokers, &input, commands.iter().enumerate().map(|(i, c)| (padded_key(i), c.clone().into_bytes())))
        .expect("input");

    let pid = host.pid().expect("the host runs");
    let baseline = status_bytes(pid, "VmRSS:");
    // From here VmHWM is the peak of this run.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak resident memory");
    let spec = json!({
        "id": "at-its-limits", "module": "probe", "parallelism": tasks, "batch-size": 100,
        "input": {"topics": [input]}, "output": {"topics": [output]}, "checkpoint": {"interval": "100ms"},
        "limits": {"memory": "16MiB", "max-outputs-per-input": 10, "state": "8MiB"},
    });
    let (status, body) = host.post("/v1/jobs", &token, spec);
    assert_eq!(status, 201, "{body}");
    let committed = support::read_committed(&brokers, &output, expected, Duration::from_secs(180));
    assert_eq!(committed.len(), expected, "every command's output, once");
    let peak = status_bytes(pid, "VmHWM:");

    let task = TaskBudget::new(memory, &rdkafka::ClientConfig::new()).task_bytes(partitions / tasks);
    let bound = tasks * task + jobs * JOB_BYTES;
    let grown = peak.saturating_sub(baseline);
    eprintln!(
        "memory: host at {} MiB before the job, peak {} MiB: grew {} MiB; the formula allows {} MiB ({tasks} tasks of {} \
         MiB, {jobs} job of {} MiB)",
        baseline / MIB,
        peak / MIB,
        grown / MIB,
        bound / MIB,
        task / MIB,
        JOB_BYTES / MIB
    );
    assert!(grown <= bound, "the tenant took {grown} bytes of host memory, over the {bound} its policy allows");
}
