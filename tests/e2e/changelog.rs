//! The changelog: a job whose state directory is gone comes back with its
//! full state from Kafka, exactly once, reading only each shard's committed
//! span; a store that is current reads nothing; a job that turns the
//! changelog on later gets its whole state written there first.

use std::time::Duration;

use crate::support::{self, JobFiles, JobOptions, Running};

/// Runs the job until `total` outputs are committed, stops it cleanly and
/// returns its log.
fn run_to(files: &JobFiles, total: usize) -> String {
    let job = Running::start(files, &[]);
    support::read_committed(&support::brokers(), &files.output, total, Duration::from_secs(180));
    let log = job.log_text();
    assert!(job.terminate().success(), "log:\n{log}");
    log
}

const RESTORED: &str = "restored the shard's state from the changelog";

#[test]
fn a_lost_state_directory_comes_back_from_the_changelog_exactly_once() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "changelog", ..Default::default() });
    let mut inputs = support::produce_keyed(&brokers, &files.input, 0..6_000, 40);
    // Killed mid-stream: the changelog then holds records of an aborted
    // epoch too, which a restore must not apply.
    let mut job = Running::start(&files, &[]);
    support::read_committed(&brokers, &files.output, 2_000, Duration::from_secs(120));
    job.kill9();
    run_to(&files, 6_000);

    std::fs::remove_dir_all(support::state_dir(&files)).expect("delete the state directory");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 6_000..8_000, 40));
    let log = run_to(&files, 8_000);
    let restores = log.lines().filter(|line| line.contains(RESTORED)).count();
    assert_eq!(restores, 4, "every shard restored once; log:\n{log}");

    // Now the local stores are current: nothing is read back.
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 8_000..8_500, 40));
    let log = run_to(&files, 8_500);
    assert!(!log.contains(RESTORED), "a current store restores nothing; log:\n{log}");

    let committed = support::read_committed(&brokers, &files.output, 8_500, Duration::from_secs(60));
    support::verify_running_count(&committed, &inputs);
}

/// A job that ran without a changelog and turns it on: its first start
/// writes each shard's whole state to the changelog in its first epoch, so
/// a later loss of the state directory loses nothing.
#[test]
fn turning_the_changelog_on_writes_the_whole_state_first() {
    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "changelog-later", ..Default::default() });
    let text = std::fs::read_to_string(&files.job_file).expect("job file");
    std::fs::write(&files.job_file, text.replacen("[checkpoint]\n", "[state]\nchangelog = false\n\n[checkpoint]\n", 1))
        .expect("job file without changelog");
    let mut inputs = support::produce_keyed(&brokers, &files.input, 0..3_000, 30);
    run_to(&files, 3_000);

    std::fs::write(&files.job_file, text).expect("job file with the changelog");
    let log = run_to(&files, 3_000);
    assert!(log.contains("wrote the shard's state to the new changelog"), "log:\n{log}");

    std::fs::remove_dir_all(support::state_dir(&files)).expect("delete the state directory");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 3_000..4_000, 30));
    let log = run_to(&files, 4_000);
    assert!(log.contains(RESTORED), "log:\n{log}");
    let committed = support::read_committed(&brokers, &files.output, 4_000, Duration::from_secs(60));
    support::verify_running_count(&committed, &inputs);
}

/// A new job's changelog topic is compacted and has a partition per shard:
/// the task makes it before anything of its own asks the broker about it.
/// (A producer's topic handle opened first asked for the topic's metadata,
/// which a broker with `auto.create.topics.enable`, Kafka's default and
/// the test broker's, answers by creating the topic with one partition and
/// the delete policy: records past the retention would then be lost to a
/// restore, and the first checkpoint failed on its partitions.)
#[test]
fn a_new_jobs_changelog_topic_is_compacted_with_a_partition_per_shard() {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::consumer::{BaseConsumer, Consumer};

    let brokers = support::brokers();
    let files = support::job(&brokers, JobOptions { name: "changelog-topic", ..Default::default() });
    let inputs = support::produce_keyed(&brokers, &files.input, 0..2_000, 20);
    let log = run_to(&files, 2_000);
    assert!(!log.contains("task failed"), "a task failed; log:\n{log}");

    let topic = format!("sluice.{}.changelog", files.id);
    let config = sluice::kafka::client_config(&brokers, &Default::default());
    let consumer: BaseConsumer = config.create().expect("metadata client");
    let metadata = consumer.fetch_metadata(Some(&topic), Duration::from_secs(10)).expect("metadata");
    let partitions = metadata.topics().iter().find(|t| t.name() == topic).map(|t| t.partitions().len());
    assert_eq!(partitions, Some(4), "partitions of `{topic}`");

    let admin: AdminClient<DefaultClientContext> = config.create().expect("admin client");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let described = runtime
        .block_on(admin.describe_configs([&ResourceSpecifier::Topic(&topic)], &AdminOptions::new()))
        .expect("describe the changelog topic");
    let resource = described.into_iter().next().expect("one resource").expect("the topic's configuration");
    let policy = resource.get("cleanup.policy").and_then(|entry| entry.value.clone());
    assert_eq!(policy.as_deref(), Some("compact"), "cleanup.policy of `{topic}`");

    let committed = support::read_committed(&brokers, &files.output, 2_000, Duration::from_secs(60));
    support::verify_running_count(&committed, &inputs);
}

/// A stop during a changelog restore ends it at once, rather than after the
/// whole span is read: the process exits before the restore is done (its
/// log says it began, not that it ended), and the next start restores the
/// shard again from the start, exactly once. Before, the stop waited for
/// the restore, however long.
#[test]
fn a_stop_ends_a_changelog_restore_at_once() {
    const KEYS: usize = 1_000_000;
    let brokers = support::brokers();
    let files = support::job(
        &brokers,
        JobOptions { name: "restore-stop", partitions: 1, parallelism: 1, ..Default::default() },
    );
    // A large state: a million keys, each counted once.
    for start in (0..KEYS).step_by(200_000) {
        let records = (start..start + 200_000).map(|i| (format!("k{i}").into_bytes(), b"v".to_vec()));
        sluice::kafka::tools::produce(&brokers, &files.input, records).expect("produce");
    }
    run_to(&files, KEYS);
    std::fs::remove_dir_all(support::state_dir(&files)).expect("delete the state directory");

    // Stopped as soon as the restore began.
    let job = Running::start(&files, &[]);
    let started = std::time::Instant::now();
    while !job.log_text().contains("restoring the shard's state from the changelog") {
        assert!(started.elapsed() < Duration::from_secs(120), "no restore began; log:\n{}", job.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, log) = job.terminate_logged();
    assert!(status.success(), "log:\n{log}");
    assert!(!log.contains(RESTORED), "the restore ran to its end before the stop took effect; log:\n{log}");

    // The next start restores the whole shard, and counts go on from it.
    let again: Vec<(Vec<u8>, Vec<u8>)> = (0..1_000).map(|i| (format!("k{i}").into_bytes(), b"v".to_vec())).collect();
    sluice::kafka::tools::produce(&brokers, &files.input, again).expect("produce");
    let log = run_to(&files, KEYS + 1_000);
    assert!(log.contains(RESTORED), "the shard was restored; log:\n{log}");
    let committed = support::read_committed(&brokers, &files.output, KEYS + 1_000, Duration::from_secs(120));
    assert_eq!(committed.len(), KEYS + 1_000, "exactly once");
    let counts = support::counts_per_key(&committed);
    for i in 0..1_000 {
        assert_eq!(counts[&format!("k{i}")], vec![1, 2], "key k{i}");
    }
}
