//! State belongs to input partitions (shards): partition p of every input
//! topic is one shard, so co-partitioned topics meet in one shard's state,
//! and input topics that are not co-partitioned are refused.

use std::time::Duration;

use sluice::kafka::tools;

use crate::support::{self, JobOptions, Running};

/// A running-count job over two input topics: its own, of 3 partitions,
/// and another of `other_partitions`; returns the other's name too.
fn two_inputs(name: &str, other_partitions: i32) -> (support::JobFiles, String) {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name, partitions: 3, ..Default::default() });
    let other = format!("{}-other", files.input);
    tools::create_topics(&brokers, &[(&other, other_partitions)]).expect("second input topic");
    let text = std::fs::read_to_string(&files.job_file).expect("job file");
    let text =
        text.replace(&format!("topics = [\"{}\"]", files.input), &format!("topics = [{:?}, {other:?}]", files.input));
    std::fs::write(&files.job_file, text).expect("rewrite job file");
    (files, other)
}

/// Two topics with the same partition count, and records of one key on
/// both: a producer puts a key in the same partition number of each, so the
/// key's records of both topics land in one shard, and running-count counts
/// them together, exactly once, through a kill -9. Three partitions over
/// two tasks: spreading (topic, partition) pairs round-robin would put
/// partition 0 of one topic and of the other in different tasks.
#[test]
fn co_partitioned_inputs_meet_in_one_shard() {
    let brokers = support::brokers();
    let (files, other) = two_inputs("copart", 3);

    let mut inputs = support::produce_keyed(&brokers, &files.input, 0..3_000, 50);
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &other, 0..2_000, 50));
    let mut job = Running::start(&files, &[]);
    support::read_committed(&brokers, &files.output, 2_000, Duration::from_secs(120));
    job.kill9();
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &other, 2_000..4_000, 50));
    let job = Running::start(&files, &[]);
    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &files.output, total as usize, Duration::from_secs(120));
    job.terminate();
    // Per key: 1..n over both topics' records of that key.
    support::verify_running_count(&committed, &inputs);
}

#[test]
fn input_topics_of_different_partition_counts_are_refused() {
    let (files, other) = two_inputs("notcopart", 2);
    let mut job = Running::start(&files, &[]);
    let status = job.wait_exit(Duration::from_secs(60)).expect("refused promptly");
    let log = job.log_text();
    assert!(!status.success(), "log:\n{log}");
    assert!(log.contains("the input topics must have the same number of partitions"), "log:\n{log}");
    assert!(log.contains(&format!("`{other}` has 2")), "log:\n{log}");
}
