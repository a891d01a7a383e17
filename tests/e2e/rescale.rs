//! A job restarted with another parallelism is refused with a clear message
//! instead of restoring state into the wrong tasks.

use std::time::Duration;

use crate::support::{self, JobOptions, Running};

#[test]
fn changing_the_parallelism_of_a_job_with_state_is_refused() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "rescale", ..Default::default() });
    let inputs = support::produce_keyed(&brokers, &files.input, 0..2_000, 10);
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, 2_000, Duration::from_secs(60));
    assert!(job.terminate().success());
    support::verify_running_count(&committed, &inputs);

    let text = std::fs::read_to_string(&files.job_file).expect("job file");
    std::fs::write(&files.job_file, text.replace("parallelism = 2", "parallelism = 1")).expect("rewrite");
    let mut rescaled = Running::start(&files, &[]);
    let status = rescaled.wait_exit(Duration::from_secs(60)).expect("refused promptly");
    let log = rescaled.log_text();
    assert!(!status.success(), "log:\n{log}");
    assert!(log.contains("rescaling a job's state is not supported yet"), "log:\n{log}");
}
