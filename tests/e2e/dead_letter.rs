//! Records the transform fails on every time: with `errors.policy =
//! "dead-letter"` each goes, after its tries, to the dead-letter topic with
//! headers that say why and where from, exactly once across a crash, and
//! the job goes on with exact output; with the default `fail` the job fails
//! as a whole, naming the record.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice::kafka::tools;

use crate::support::{self, JobFiles, JobOptions, Running};

/// Keyed counting input with records that always fail mixed in: `poison`
/// (the guest returns an error) and `bad-topic` (the guest writes to a
/// topic the job did not declare). Returns the per-key counts of the good
/// records and the poison records' (partition-independent) count.
fn produce_with_poison(brokers: &str, files: &JobFiles) -> (BTreeMap<String, u64>, usize) {
    let mut inputs = support::produce_keyed(brokers, &files.input, 0..1_500, 11);
    let poison: Vec<(Vec<u8>, Vec<u8>)> = (0..4)
        .map(|i| (format!("bad-{i}").into_bytes(), if i % 2 == 0 { b"poison".to_vec() } else { b"bad-topic".to_vec() }))
        .collect();
    tools::produce(brokers, &files.input, poison.clone()).expect("produce poison");
    support::add_counts(&mut inputs, support::produce_keyed(brokers, &files.input, 1_500..3_000, 11));
    (inputs, poison.len())
}

/// The job `options` describe, with `extra` appended to its job file.
fn job_with(brokers: &str, options: JobOptions<'_>, extra: &str) -> JobFiles {
    let files = support::job(brokers, options);
    let text = std::fs::read_to_string(&files.job_file).expect("job file");
    std::fs::write(&files.job_file, format!("{text}\n{extra}")).expect("job file");
    files
}

/// The probe guest counting its input, with the `[errors]` table `errors`.
fn job(brokers: &str, name: &str, errors: &str) -> JobFiles {
    let options = JobOptions { name, module: "probe", config: &[("count", "yes")], ..Default::default() };
    job_with(brokers, options, &format!("[errors]\n{errors}"))
}

/// A new dead-letter topic for the job `name`, and the `[errors]` lines
/// that send there after two tries.
fn dead_letter_topic(brokers: &str, name: &str) -> (String, String) {
    let dlq = format!("{}-dlq", support::unique(name));
    tools::create_topics(brokers, &[(&dlq, 1)]).expect("dead-letter topic");
    let errors = format!("policy = \"dead-letter\"\ndead-letter-topic = \"{dlq}\"\nattempts = 2\n");
    (dlq, errors)
}

#[test]
fn poison_records_go_to_the_dead_letter_topic_exactly_once_across_a_crash() {
    let brokers = support::brokers();
    let name = "dead-letter";
    let (dlq, errors) = dead_letter_topic(&brokers, name);
    let files = job(&brokers, name, &errors);
    let (inputs, poison) = produce_with_poison(&brokers, &files);

    // A crash at the third commit (the first with records: the first two
    // commit the tasks' start positions), then a clean run to the end.
    let mut crashing = Running::start(&files, &[("SLUICE_FAILPOINT", "before-commit@3")]);
    let status = crashing.wait_exit(Duration::from_secs(120));
    let status = status.unwrap_or_else(|| panic!("no crash; log:\n{}", crashing.log_text()));
    assert!(!status.success(), "log:\n{}", crashing.log_text());
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, 3_000, Duration::from_secs(180));
    let letters = support::read_committed(&brokers, &dlq, poison, Duration::from_secs(60));
    let log = job.log_text();
    assert!(job.terminate().success(), "log:\n{log}");
    support::verify_running_count(&committed, &inputs);
    assert_eq!(letters.len(), poison, "each poison record once; log:\n{log}");
    for letter in &letters {
        let header = |name: &str| {
            letter
                .headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_else(|| panic!("no `{name}` header in {letter:?}"))
        };
        assert_eq!(header("sluice.topic"), files.input);
        assert_eq!(header("sluice.job"), files.id);
        assert!(header("sluice.offset").parse::<i64>().is_ok());
        assert!(header("sluice.partition").parse::<i32>().is_ok());
        assert_eq!(header("sluice.attempts"), "2");
        let error = header("sluice.error");
        match letter.value.as_deref() {
            Some(b"poison") => assert!(error.contains("poison record at offset"), "{error}"),
            Some(b"bad-topic") => assert!(error.contains("not one of the job's output topics"), "{error}"),
            other => panic!("not a poison record: {other:?}"),
        }
    }
}

#[test]
fn with_the_fail_policy_a_poison_record_fails_the_job_naming_it() {
    let brokers = support::brokers();
    let files = job(&brokers, "poison-fails", "attempts = 2\n");
    produce_with_poison(&brokers, &files);
    let mut job = Running::start(&files, &[]);
    let status = job.wait_exit(Duration::from_secs(120));
    let log = job.log_text();
    let status = status.unwrap_or_else(|| panic!("the job did not fail; log:\n{log}"));
    assert!(!status.success(), "log:\n{log}");
    assert!(log.contains(&format!("record {}/", files.input)) && log.contains("failed 2 times"), "log:\n{log}");
    assert!(log.contains("errors.policy"), "the error says what to do; log:\n{log}");
}

#[test]
fn a_missing_dead_letter_topic_is_refused_at_start() {
    let brokers = support::brokers();
    let missing = format!("{}-no-such-dlq", support::unique("dlq"));
    let files = job(&brokers, "missing-dlq", &format!("policy = \"dead-letter\"\ndead-letter-topic = \"{missing}\"\n"));
    let mut job = Running::start(&files, &[]);
    let status = job.wait_exit(Duration::from_secs(60));
    let log = job.log_text();
    let status = status.unwrap_or_else(|| panic!("the job started anyway; log:\n{log}"));
    assert!(!status.success(), "log:\n{log}");
    assert!(log.contains(&format!("topic `{missing}` does not exist")), "log:\n{log}");
}

/// A state write the host refuses (here: over `limits.state`) while it
/// takes back what the guest held across batches cannot be pinned on its
/// record. The task's next attempt writes state back after every batch, so
/// the record whose write is refused fails in its own batch and goes to the
/// dead-letter topic, and the job goes on with exact output (instead of
/// failing at every checkpoint, as it did before that fallback).
#[test]
fn a_held_state_write_over_the_limit_is_dead_lettered() {
    let brokers = support::brokers();
    let name = "held-state-limit";
    let (dlq, errors) = dead_letter_topic(&brokers, name);
    let files = job_with(
        &brokers,
        JobOptions { name, ..Default::default() },
        &format!("[limits]\nstate = \"16KiB\"\n\n[errors]\n{errors}"),
    );
    let mut inputs = support::produce_keyed(&brokers, &files.input, 0..1_500, 11);
    // Its key alone is twice the state limit.
    let big = vec![b'k'; 32 << 10];
    tools::produce(&brokers, &files.input, vec![(big.clone(), b"v".to_vec())]).expect("produce the big key");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 1_500..3_000, 11));

    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, 3_000, Duration::from_secs(180));
    let letters = support::read_committed(&brokers, &dlq, 1, Duration::from_secs(60));
    let log = job.log_text();
    assert!(job.terminate().success(), "log:\n{log}");
    support::verify_running_count(&committed, &inputs);
    assert_eq!(letters.len(), 1, "log:\n{log}");
    assert_eq!(letters[0].key.as_deref(), Some(&big[..]));
    let error = letters[0].headers.iter().find(|(k, _)| k == "sluice.error").map(|(_, v)| String::from_utf8_lossy(v));
    assert!(error.as_deref().is_some_and(|e| e.contains("limit")), "{error:?}");
}

/// A record whose dead letter is larger than the dead-letter topic's
/// producer takes (the input topic takes records of 3 MB, the job's
/// producer 1 MB): the letter is cut to fit, `sluice.truncated` says what
/// was cut, and the job goes on with exact output. Before, its write failed
/// at every replay: the job restarted for ever, nothing reached the
/// dead-letter topic and the partition was stuck.
#[test]
fn a_dead_letter_too_large_for_its_topic_is_cut_to_fit_and_the_job_goes_on() {
    let brokers = support::brokers();
    let name = "big-letter";
    let (dlq, errors) = dead_letter_topic(&brokers, name);
    let files = job(&brokers, name, &errors);
    tools::set_topic_config(&brokers, &files.input, "max.message.bytes", "3000000").expect("a larger input limit");
    let mut inputs = support::produce_keyed(&brokers, &files.input, 0..1_000, 11);
    let mut big = b"poison".to_vec();
    big.resize(1_100_000, b'x');
    let big_len = big.len();
    tools::produce(&brokers, &files.input, vec![(b"big".to_vec(), big)]).expect("produce the big poison record");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 1_000..2_000, 11));

    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, 2_000, Duration::from_secs(120));
    let letters = support::read_committed(&brokers, &dlq, 1, Duration::from_secs(60));
    let log = job.log_text();
    assert!(job.terminate().success(), "log:\n{log}");
    support::verify_running_count(&committed, &inputs);
    assert_eq!(letters.len(), 1, "log:\n{log}");
    let letter = &letters[0];
    let header = |name: &str| {
        letter.headers.iter().find(|(k, _)| k == name).map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header("sluice.truncated"), Some(format!("value={big_len}")), "{:?}", letter.headers);
    let value = letter.value.as_deref().expect("a value");
    assert!(value.len() < 1_000_000 && value.starts_with(b"poison"), "the value's first {} bytes", value.len());
    assert!(header("sluice.error").is_some_and(|e| e.contains("poison record")), "{:?}", letter.headers);
}

/// A transform whose `on-timers` fails every time on one timer: the job
/// fails after `errors.attempts` tries, naming the timer's key and time,
/// rather than restarting for ever (as it did before).
#[test]
fn a_timer_that_always_fails_fails_the_job_naming_it() {
    let brokers = support::brokers();
    let files = job_with(
        &brokers,
        JobOptions { name: "bad-timer", module: "bad-timer", partitions: 1, parallelism: 1, ..Default::default() },
        "[errors]\nattempts = 3\n",
    );
    let records = ["good-1", "good-2", "bad-1"].map(|key| (key.as_bytes().to_vec(), b"v".to_vec()));
    tools::produce(&brokers, &files.input, records).expect("produce");
    let mut job = Running::start(&files, &[]);
    let status = job.wait_exit(Duration::from_secs(120));
    let log = job.log_text();
    let status = status.unwrap_or_else(|| panic!("the job did not fail; log:\n{log}"));
    assert!(!status.success(), "log:\n{log}");
    assert!(
        log.contains("on-timers failed 3 times on the processing-time timer of key \"bad-1\""),
        "the error names the timer; log:\n{log}"
    );
    assert!(log.contains("fails on purpose"), "and why; log:\n{log}");
}
