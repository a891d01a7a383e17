//! The peers bench's second workload (`--workload windowed-count`): a count
//! per key in tumbling event-time windows of [`WINDOW_MS`], the watermark
//! [`BOUND_MS`] behind the largest timestamp of each input partition, each
//! window emitted once, when the watermark passes its end, as
//! `{"start":S,"end":E,"count":N}` under the input key.
//!
//! This module owns what differs from the running count: the input's event
//! times (the backlog's lie in the past, with disorder inside the bound, so
//! no system sees a late record; the paced records carry their send time),
//! the flush records that close the last windows, the expected windows, the
//! check of the committed ones, the figures taken from them, and the native
//! pipeline's in-memory window operator.
//!
//! Throughput is read from the windows: the backlog is done when the last
//! of its windows (closed by the flush the harness sends after it) is
//! visible.
//! Latency is from a window's end (the wall-clock moment the paced records'
//! event time reached it: they are stamped with a clock that runs 10% fast,
//! see [`PacedClock`]) to its output's visibility to a read_committed
//! reader, so it includes the bound, which is the same for every system. It
//! is taken over the windows the paced records closed: the last ones wait
//! for the flush the harness sends a window after the paced records stop,
//! which would otherwise be everyone's p99.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use sluice::record::{InputRecord, OutputRecord};

/// The window size.
pub const WINDOW_MS: i64 = 1_000;
/// The bound on out-of-orderness (sluice's `max-out-of-orderness`, Flink's
/// `forBoundedOutOfOrderness`, Kafka Streams' grace).
pub const BOUND_MS: i64 = 200;
/// Backlog records per ms of event time: 2M records span 20 s, so each key
/// has 20 windows of about 10 records.
const PER_MS: usize = 100;
/// The backlog's disorder: record i is up to this much older than its
/// place in the sequence; less than the bound, so never late.
const JITTER_MS: usize = 151;

/// Where `at` falls: [start, end).
pub fn window_of(at: i64) -> (i64, i64) {
    let start = at - at.rem_euclid(WINDOW_MS);
    (start, start + WINDOW_MS)
}

/// The event times of a backlog of `records`, all in the past of `now` (so
/// that the paced records that follow, stamped with their send time, are
/// later still): 100 records per ms, each up to 150 ms out of order.
pub fn backlog_times(records: usize, now: i64) -> Vec<i64> {
    let span = (records / PER_MS) as i64;
    let t0 = now - span - WINDOW_MS - BOUND_MS - 5_000;
    (0..records).map(|i| t0 + (i / PER_MS) as i64 - ((i * 37) % JITTER_MS) as i64).collect()
}

/// The event times of a run's warm-up and backlog, each as
/// [`backlog_times`]: the warm-up's well before the backlog's, so that the
/// warm-up's flush closes its windows without making any backlog record
/// late.
pub fn run_times(warmup: usize, records: usize, now: i64) -> (Vec<i64>, Vec<i64>) {
    let backlog = backlog_times(records, now);
    let first = backlog.iter().copied().min().unwrap_or(now);
    (backlog_times(warmup, first - 2 * WINDOW_MS - BOUND_MS), backlog)
}

/// The timestamp of the flush records (one per partition) that close every
/// window holding a record up to `latest`: past the last window's end by
/// the bound and 1 ms. The flush records open windows of their own, which
/// the next run's records close.
pub fn flush_after(latest: i64) -> i64 {
    window_of(latest).1 + BOUND_MS + 1
}

/// The paced phase's event time, which runs [`PacedClock::RATE`] times as
/// fast as the wall clock.
///
/// With event time on the wall clock, the window ends (every 1 s) kept one
/// phase against a system's commits (every checkpoint interval: at 1 s the
/// same period), so every window of a run waited about as long for its
/// commit, and a run's p99 was luck: 0.3 s in one run, 1.3 s in the next,
/// for every system alike. Running 10% fast, consecutive window ends fall
/// about 90 ms further along the commit cycle, and ten seconds of them
/// sweep all of it.
#[derive(Clone, Copy, Debug)]
pub struct PacedClock {
    /// Wall-clock ms when the paced phase started.
    wall_start: i64,
    /// Event time ms then.
    event_start: i64,
}

impl PacedClock {
    /// Event ms per wall-clock ms.
    const RATE: f64 = 1.1;

    /// A clock starting now (`wall_ms`), at `event_ms` or later: never below
    /// the event time the input has reached, or the records would be late.
    pub fn start(wall_ms: i64, event_ms: i64) -> PacedClock {
        PacedClock { wall_start: wall_ms, event_start: event_ms.max(wall_ms) }
    }

    /// The event time at wall-clock `wall_ms`.
    pub fn event_at(&self, wall_ms: i64) -> i64 {
        self.event_start + ((wall_ms - self.wall_start) as f64 * Self::RATE) as i64
    }

    /// The wall-clock ms at which the event time reached `event_ms`.
    pub fn wall_at(&self, event_ms: i64) -> i64 {
        self.wall_start + ((event_ms - self.event_start) as f64 / Self::RATE) as i64
    }
}

/// A window: (key, start).
pub type WindowId = (String, i64);

/// Every window of `inputs` (key, event time) that the watermark has closed
/// once each partition has seen `flushed_at`, with its count.
pub fn expected<'a>(inputs: impl IntoIterator<Item = (&'a str, i64)>, flushed_at: i64) -> HashMap<WindowId, u64> {
    let mut windows = HashMap::new();
    for (key, at) in inputs {
        let (start, end) = window_of(at);
        if end + BOUND_MS <= flushed_at {
            *windows.entry((key.to_string(), start)).or_insert(0) += 1;
        }
    }
    windows
}

/// One committed window, as a read_committed reader saw it.
pub struct Seen {
    pub key: String,
    pub start: i64,
    pub end: i64,
    pub count: u64,
    pub at_ms: i64,
}

/// Parses an output value `{"start":S,"end":E,"count":N}` of `key`.
pub fn parse(key: &str, value: &str, at_ms: i64) -> Result<Seen, String> {
    #[derive(Deserialize)]
    struct Value {
        start: i64,
        end: i64,
        count: u64,
    }
    let v: Value = serde_json::from_str(value)
        .map_err(|e| format!("output value {value:?} of key {key} is not a window ({e})"))?;
    Ok(Seen { key: key.to_string(), start: v.start, end: v.end, count: v.count, at_ms })
}

/// Every expected window exactly once with its count, and nothing else.
pub fn verify(seen: &[Seen], expected: &HashMap<WindowId, u64>) -> Result<(), String> {
    let mut found: HashMap<(&str, i64), u64> = HashMap::with_capacity(seen.len());
    for w in seen {
        if w.end != w.start + WINDOW_MS {
            return Err(format!("key {}: window [{}, {}) is not {WINDOW_MS} ms", w.key, w.start, w.end));
        }
        if found.insert((w.key.as_str(), w.start), w.count).is_some() {
            return Err(format!("key {}: window [{}, {}) committed twice", w.key, w.start, w.end));
        }
        match expected.get(&(w.key.clone(), w.start)) {
            None => return Err(format!("key {}: window [{}, {}) was not due", w.key, w.start, w.end)),
            Some(n) if *n != w.count => {
                return Err(format!("key {}: window [{}, {}) counted {} of {n}", w.key, w.start, w.end, w.count));
            }
            Some(_) => {}
        }
    }
    if found.len() != expected.len() {
        return Err(format!("{} of {} windows committed", found.len(), expected.len()));
    }
    Ok(())
}

/// The native pipeline's window operator: per input partition, the open
/// windows by (end, key) and the largest timestamp seen.
#[derive(Default)]
pub struct Operator {
    partitions: HashMap<i32, Partition>,
}

struct Partition {
    largest: i64,
    open: BTreeMap<(i64, Vec<u8>), u64>,
}

impl Operator {
    /// Counts `record` into its window (unless that window has closed: a
    /// late record, which this input never has), then emits every window
    /// the watermark has passed.
    pub fn process(&mut self, record: &InputRecord, out: &mut Vec<OutputRecord>) {
        let Some(at) = record.timestamp else { return };
        let p =
            self.partitions.entry(record.partition).or_insert(Partition { largest: i64::MIN, open: BTreeMap::new() });
        let (_, end) = window_of(at);
        if end - 1 > p.largest.saturating_sub(BOUND_MS + 1) {
            *p.open.entry((end, record.key.clone().unwrap_or_default())).or_insert(0) += 1;
        }
        if at <= p.largest {
            return;
        }
        p.largest = at;
        let watermark = at - BOUND_MS - 1;
        while let Some(entry) = p.open.first_entry() {
            if entry.key().0 - 1 > watermark {
                break;
            }
            let ((end, key), count) = entry.remove_entry();
            let value = format!(r#"{{"start":{},"end":{end},"count":{count}}}"#, end - WINDOW_MS);
            out.push(OutputRecord {
                key: Some(key),
                value: Some(value.into_bytes()),
                headers: Vec::new(),
                topic: None,
            });
        }
    }
}
