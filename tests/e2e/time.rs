//! Event time on a real broker: each tumbling window's count appears exactly
//! once in the committed output, with input out of order within the job's
//! bound, through kill -9, a crash at every step of the checkpoint protocol,
//! rescales and a lost state directory (timers and watermarks are shard
//! state: they move with the shard and come back from the changelog); late
//! records are not counted.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice::kafka::tools;

use crate::support::{self, JobFiles, JobOptions, Running};

/// Event time of the first record: a round minute, so windows line up
/// (see [`support::event_time_origin`]).
fn t0() -> i64 {
    support::event_time_origin()
}
/// Window size (ms), in event time.
const WINDOW: i64 = 1_000;
/// Event time between records.
const STEP: i64 = 5;
const KEYS: usize = 20;
/// How far out of order the input is (at most), and the job's bound.
const DISORDER: i64 = 40;
const BOUND: &str = "50ms";

/// Per (key, window start), how many records fall in it.
type Windows = BTreeMap<(String, i64), u64>;

/// Produces records `range` (record i: key `key-<i % KEYS>`, event time
/// `t0 + i * STEP` less up to [`DISORDER`] ms, so out of order within the
/// job's bound), each key always to the same partition; adds them to
/// `expected`.
fn produce(files: &JobFiles, range: std::ops::Range<i64>, expected: &mut Windows) {
    let records: Vec<(Vec<u8>, Vec<u8>, Option<i64>)> = range
        .map(|i| {
            let key = format!("key-{}", i as usize % KEYS);
            let ts = t0() + i * STEP - (i * 7_919) % (DISORDER + 1);
            *expected.entry((key.clone(), ts.div_euclid(WINDOW) * WINDOW)).or_insert(0) += 1;
            (key.into_bytes(), b"click".to_vec(), Some(ts))
        })
        .collect();
    tools::produce_timed(&support::brokers(), &files.input, None, records).expect("produce");
}

/// One record per partition half an hour ahead in event time, so every
/// window of the records before it closes (its own never does).
fn close_all_windows(files: &JobFiles, partitions: i32) {
    for partition in 0..partitions {
        let flush = vec![(b"flush".to_vec(), b"click".to_vec(), Some(t0() + 1_800_000))];
        tools::produce_timed(&support::brokers(), &files.input, Some(partition), flush).expect("produce");
    }
}

/// The committed window results, each (key, start) with every count it got.
fn results(records: &[tools::ReadRecord]) -> BTreeMap<(String, i64), Vec<u64>> {
    let mut seen: BTreeMap<(String, i64), Vec<u64>> = BTreeMap::new();
    for record in records {
        let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        let value: serde_json::Value =
            serde_json::from_slice(record.value.as_deref().unwrap_or_default()).expect("a window result is JSON");
        let (start, end, count) = (value["start"].as_i64(), value["end"].as_i64(), value["count"].as_u64());
        let (Some(start), Some(end), Some(count)) = (start, end, count) else { panic!("bad result {value}") };
        assert_eq!(end - start, WINDOW, "{value}");
        seen.entry((key, start)).or_default().push(count);
    }
    seen
}

/// A windowed-count job over 4 partitions whose watermark allows
/// [`BOUND`] of disorder.
fn windows_job(name: &str) -> JobFiles {
    let window = format!("{WINDOW}ms");
    let config = [("window", window.as_str())];
    let files = support::job(
        &support::brokers(),
        JobOptions { name, module: "windowed-count", partitions: 4, config: &config, ..Default::default() },
    );
    let text = std::fs::read_to_string(&files.job_file).expect("job file");
    std::fs::write(&files.job_file, format!("{text}\n[time]\nmax-out-of-orderness = \"{BOUND}\"\n")).expect("job file");
    files
}

/// Closes every window, runs the job until all of `expected` is committed
/// and checks that each window was emitted once, with its count; returns
/// the log.
fn finish_and_verify(files: &JobFiles, expected: &Windows) -> String {
    close_all_windows(files, 4);
    let job = Running::start(files, &[]);
    let committed =
        support::read_committed(&support::brokers(), &files.output, expected.len(), Duration::from_secs(180));
    let log = job.log_text();
    assert!(job.terminate().success(), "log:\n{log}");
    let got = results(&committed);
    let doubled: Vec<_> = got.iter().filter(|(_, counts)| counts.len() > 1).take(5).collect();
    assert!(doubled.is_empty(), "windows emitted more than once: {doubled:?}; log:\n{log}");
    let got: Windows = got.into_iter().map(|(window, counts)| (window, counts[0])).collect();
    let missing: Vec<_> = expected.keys().filter(|w| !got.contains_key(*w)).take(5).collect();
    assert!(missing.is_empty(), "windows never emitted: {missing:?} ({} of {})", got.len(), expected.len());
    assert_eq!(&got, expected, "each window's count");
    log
}

#[test]
fn each_window_is_counted_exactly_once_through_kill_9_rescales_and_a_lost_state_directory() {
    let files = windows_job("windows");
    let mut expected = Windows::new();

    // Two tasks, killed with windows open and an epoch in flight.
    produce(&files, 0..4_000, &mut expected);
    support::run_then_kill(&files, 100);

    // Three tasks: the shards (their windows' state, timers and watermarks)
    // move.
    support::set_parallelism(&files, 3);
    produce(&files, 4_000..8_000, &mut expected);
    let log = support::run_then_kill(&files, 300);
    assert!(log.contains("rescaled"), "log:\n{log}");

    // The state directory is lost: timers and watermarks come back from
    // the changelog with the rest of the state, on one task.
    std::fs::remove_dir_all(support::state_dir(&files)).expect("delete the state directory");
    support::set_parallelism(&files, 1);
    produce(&files, 8_000..12_000, &mut expected);
    let log = finish_and_verify(&files, &expected);
    assert!(log.contains("restored the shard's state from the changelog"), "log:\n{log}");
}

#[test]
fn each_window_is_counted_exactly_once_through_a_crash_at_every_step_of_the_protocol() {
    let files = windows_job("window-crashes");
    let mut expected = Windows::new();
    let protocol = sluice::failpoint::ALL.iter().take_while(|point| !point.starts_with("rescale"));
    for (n, point) in protocol.enumerate() {
        let n = n as i64;
        produce(&files, n * 1_000..(n + 1) * 1_000, &mut expected);
        let spec = format!("{point}@2");
        let mut crashing = Running::start(&files, &[("SLUICE_FAILPOINT", &spec)]);
        let status = crashing.wait_exit(Duration::from_secs(120));
        let log = crashing.log_text();
        let status = status.unwrap_or_else(|| panic!("the job did not reach failpoint {point}; log:\n{log}"));
        assert!(!status.success(), "the process must have aborted at {point}: {status}; log:\n{log}");
        assert!(log.contains(&format!("failpoint `{point}` hit 2 time(s)")), "crashed elsewhere; log:\n{log}");
    }
    finish_and_verify(&files, &expected);
}

#[test]
fn a_record_behind_the_watermark_is_late_and_its_closed_window_is_not_reopened() {
    let brokers = support::brokers();
    let window = format!("{WINDOW}ms");
    let config = [("window", window.as_str())];
    let files = support::job(
        &brokers,
        JobOptions {
            name: "late",
            module: "windowed-count",
            partitions: 1,
            parallelism: 1,
            config: &config,
            ..Default::default()
        },
    );
    let record = |key: &str, ts: i64| (key.as_bytes().to_vec(), b"click".to_vec(), Some(ts));
    // [t0, t0 + 1s) gets two records, then the watermark passes its end.
    let first = vec![record("k", t0()), record("k", t0() + 10), record("k", t0() + WINDOW + 500)];
    tools::produce_timed(&brokers, &files.input, Some(0), first).expect("produce");
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, 1, Duration::from_secs(60));
    assert_eq!(results(&committed), [(("k".to_string(), t0()), vec![2])].into());
    // A late record for the closed window, then one that closes the next.
    let second = vec![record("k", t0() + 20), record("k", t0() + 3 * WINDOW)];
    tools::produce_timed(&brokers, &files.input, Some(0), second).expect("produce");
    let committed = support::read_committed(&brokers, &files.output, 2, Duration::from_secs(60));
    let log = job.log_text();
    assert!(job.terminate().success(), "log:\n{log}");
    assert_eq!(
        results(&committed),
        [(("k".to_string(), t0()), vec![2]), (("k".to_string(), t0() + WINDOW), vec![1])].into(),
        "the late record reopened nothing; log:\n{log}"
    );
}
