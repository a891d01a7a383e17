//! Event time on a real broker: each tumbling window's count appears exactly
//! once in the committed output, through kill -9, rescales and a lost state
//! directory (timers and watermarks are shard state: they move with the
//! shard and come back from the changelog); late records are not counted.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice::kafka::tools;

use crate::support::{self, JobFiles, JobOptions, Running};

/// Event time of the first record: a round minute, so windows line up.
const T0: i64 = 1_700_000_040_000;
/// Window size (ms), in event time.
const WINDOW: i64 = 1_000;
/// Event time between records.
const STEP: i64 = 5;
const KEYS: usize = 20;

/// Per (key, window start), how many records fall in it.
type Windows = BTreeMap<(String, i64), u64>;

/// Produces records `range` (record i: key `key-<i % KEYS>`, event time
/// `T0 + i * STEP`), each key always to the same partition, in event-time
/// order per partition; adds them to `expected`.
fn produce(files: &JobFiles, range: std::ops::Range<i64>, expected: &mut Windows) {
    let records: Vec<(Vec<u8>, Vec<u8>, Option<i64>)> = range
        .map(|i| {
            let key = format!("key-{}", i as usize % KEYS);
            let ts = T0 + i * STEP;
            *expected.entry((key.clone(), ts.div_euclid(WINDOW) * WINDOW)).or_insert(0) += 1;
            (key.into_bytes(), b"click".to_vec(), Some(ts))
        })
        .collect();
    tools::produce_timed(&support::brokers(), &files.input, None, records).expect("produce");
}

/// One record per partition far in event time, so every window of the
/// records before it closes (its own never does).
fn close_all_windows(files: &JobFiles, partitions: i32) {
    for partition in 0..partitions {
        let flush = vec![(b"flush".to_vec(), b"click".to_vec(), Some(T0 + 10_000_000))];
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

#[test]
fn each_window_is_counted_exactly_once_through_kill_9_rescales_and_a_lost_state_directory() {
    let brokers = support::brokers();
    let window = format!("{WINDOW}ms");
    let config = [("window", window.as_str())];
    let files = support::job(
        &brokers,
        JobOptions { name: "windows", module: "windowed-count", partitions: 4, config: &config, ..Default::default() },
    );
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
    close_all_windows(&files, 4);
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, expected.len(), Duration::from_secs(180));
    let log = job.log_text();
    assert!(job.terminate().success(), "log:\n{log}");
    assert!(log.contains("restored the shard's state from the changelog"), "log:\n{log}");

    let got = results(&committed);
    let doubled: Vec<_> = got.iter().filter(|(_, counts)| counts.len() > 1).take(5).collect();
    assert!(doubled.is_empty(), "windows emitted more than once: {doubled:?}");
    let got: Windows = got.into_iter().map(|(window, counts)| (window, counts[0])).collect();
    let missing: Vec<_> = expected.keys().filter(|w| !got.contains_key(*w)).take(5).collect();
    assert!(missing.is_empty(), "windows never emitted: {missing:?} ({} of {})", got.len(), expected.len());
    assert_eq!(got, expected, "each window's count");
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
    // [T0, T0 + 1s) gets two records, then the watermark passes its end.
    let first = vec![record("k", T0), record("k", T0 + 10), record("k", T0 + WINDOW + 500)];
    tools::produce_timed(&brokers, &files.input, Some(0), first).expect("produce");
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, 1, Duration::from_secs(60));
    assert_eq!(results(&committed), [(("k".to_string(), T0), vec![2])].into());
    // A late record for the closed window, then one that closes the next.
    let second = vec![record("k", T0 + 20), record("k", T0 + 3 * WINDOW)];
    tools::produce_timed(&brokers, &files.input, Some(0), second).expect("produce");
    let committed = support::read_committed(&brokers, &files.output, 2, Duration::from_secs(60));
    let log = job.log_text();
    assert!(job.terminate().success(), "log:\n{log}");
    assert_eq!(
        results(&committed),
        [(("k".to_string(), T0), vec![2]), (("k".to_string(), T0 + WINDOW), vec![1])].into(),
        "the late record reopened nothing; log:\n{log}"
    );
}
