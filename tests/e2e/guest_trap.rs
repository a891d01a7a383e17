//! A guest that traps on one record (on the task's first attempt only): the
//! task restarts from its last checkpoint and the output is exact.

use std::time::Duration;

use crate::support::{self, JobOptions, Running};

#[test]
fn trap_on_one_record_once() {
    let brokers = support::brokers();
    let files = support::job(
        &brokers,
        JobOptions {
            name: "guest-trap",
            module: "probe",
            partitions: 1,
            parallelism: 1,
            config: &[("count", "yes"), ("trap-at-offset", "7000")],
            ..Default::default()
        },
    );
    let inputs = support::produce_keyed(&brokers, &files.input, 0..15_000, 53);
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, 15_000, Duration::from_secs(120));
    let log = job.log_text();
    job.terminate();
    assert!(log.contains("trapping on offset 7000"), "the guest never trapped; log:\n{log}");
    assert!(log.contains("restarting from the last committed checkpoint"), "no restart; log:\n{log}");
    support::verify_running_count(&committed, &inputs);
}
