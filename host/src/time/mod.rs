//! Event time: each shard's watermark, and where a shard keeps its timers.
//!
//! Owns:
//! - the host's part of a shard's key space ([`RESERVED`]): keys beginning
//!   with `0xFF "sluice" 0x00` are the host's, never the guest's, so the
//!   shard's timers and watermark live in its state and move, checkpoint,
//!   go to the changelog and are restored with it, as one unit;
//! - the encoding of timers there ([`timer_key`]): by clock, then time, then
//!   key, so the due timers of a shard are the first entries of one range
//!   (O(log n + fired) to find in the store's B-tree);
//! - [`EventTime`]: per shard, the largest timestamp seen on each input
//!   partition and when the partition last sent anything, the watermark
//!   (which never goes back), and a lower bound on each clock's next timer,
//!   so that a batch with nothing due costs a comparison per shard.
//!
//! Never: calls the guest, Kafka or the store. The runtime drives it
//! (`Instance::process` observes records; `Instance::fire_timers` fires).
//!
//! ```
//! use std::time::{Duration, Instant};
//! use sluice::time::{EventTime, TimeConfig};
//!
//! let config = TimeConfig { max_out_of_orderness: Duration::from_secs(2), idle_timeout: None };
//! let start = Instant::now();
//! let mut time = EventTime::new(config, &[("clicks".into(), 0)], start);
//! time.observe(0, "clicks", Some(10_000), start);
//! time.advance(start);
//! assert_eq!(time.watermark(0), Some(7_999));
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The first bytes of every key of a shard that belongs to the host.
pub const RESERVED: &[u8] = b"\xffsluice\x00";

/// Whether a guest key lies in the host's part of the key space.
pub fn is_reserved(key: &[u8]) -> bool {
    key.starts_with(RESERVED)
}

/// A guest key greater than every reserved key that can exist (reserved
/// keys are the prefix, a few bytes and at most a guest key's length), and
/// smaller than every guest key after them (a guest key cannot begin with
/// the prefix): a scan that meets the reserved range goes on after this.
pub fn after_reserved() -> Vec<u8> {
    let mut key = RESERVED.to_vec();
    key.resize(RESERVED.len() + crate::runtime::MAX_KEY_BYTES + 16, 0xff);
    key
}

/// The key of a shard's watermark and per-partition event times.
pub fn watermark_key() -> Vec<u8> {
    [RESERVED, b"w"].concat()
}

/// The clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Clock {
    /// The shard's watermark.
    Event,
    /// The host's wall clock.
    Processing,
}

impl Clock {
    /// Both clocks, in the order timers fire within one call.
    pub const ALL: [Clock; 2] = [Clock::Event, Clock::Processing];

    fn tag(self) -> u8 {
        match self {
            Clock::Event => b'e',
            Clock::Processing => b'p',
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A timer: at `at` (ms since the Unix epoch) on `clock`, for `key`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timer {
    /// Its clock.
    pub clock: Clock,
    /// When it is due.
    pub at: i64,
    /// The guest's key.
    pub key: Vec<u8>,
}

/// The guest key under which every timer of `clock` begins.
pub fn timer_prefix(clock: Clock) -> Vec<u8> {
    [RESERVED, &[b't', clock.tag()]].concat()
}

/// The guest key of a timer: its clock's prefix, the time (big-endian with
/// the sign bit flipped, so byte order is time order, negative times
/// included), then the guest's key.
pub fn timer_key(timer: &Timer) -> Vec<u8> {
    let mut key = timer_prefix(timer.clock);
    key.extend_from_slice(&((timer.at as u64) ^ (1 << 63)).to_be_bytes());
    key.extend_from_slice(&timer.key);
    key
}

/// A key after every timer key of `clock` at or before `at`, to start a
/// scan after them: the key of a timer at `at` whose guest key is 32 bytes
/// of 0xFF. (Only a timer at `at` with a longer key of 0xFF bytes sorts
/// after it.)
pub fn after_timers_at(clock: Clock, at: i64) -> Vec<u8> {
    timer_key(&Timer { clock, at, key: vec![0xFF; 32] })
}

/// The timer a guest key of `clock`'s prefix holds; `None` for a key that
/// is not one.
pub fn decode_timer(clock: Clock, key: &[u8]) -> Option<Timer> {
    let rest = key.strip_prefix(timer_prefix(clock).as_slice())?;
    let (at, key) = rest.split_at_checked(8)?;
    let at = u64::from_be_bytes(at.try_into().ok()?) ^ (1 << 63);
    Some(Timer { clock, at: at as i64, key: key.to_vec() })
}

/// A job's `[time]` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TimeConfig {
    /// How far behind the largest timestamp seen on a partition the
    /// watermark stays: records up to this much out of order are not late.
    pub max_out_of_orderness: Duration,
    /// A partition that sends nothing for this long stops holding the
    /// watermark back; `None`: an idle partition holds it.
    pub idle_timeout: Option<Duration>,
}

/// What a shard remembers of event time across restarts: stored as JSON
/// under [`watermark_key`], written at the barrier when it changed.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Persisted {
    watermark: Option<i64>,
    /// The largest timestamp seen per input topic (of this shard's
    /// partition).
    largest: BTreeMap<String, i64>,
}

/// One input partition of a shard.
#[derive(Debug, Clone)]
struct PartitionTime {
    largest: Option<i64>,
    /// When it last sent a record (or the task started).
    last_seen: Instant,
}

/// One shard's event time.
#[derive(Debug, Clone)]
struct ShardTime {
    /// By input topic.
    partitions: BTreeMap<String, PartitionTime>,
    watermark: Option<i64>,
    /// Changed since the last [`EventTime::take_changed`].
    changed: bool,
    /// Per clock, at or below the time of the shard's next timer; `None`:
    /// it has none.
    next_timer: [Option<i64>; 2],
}

impl ShardTime {
    fn new() -> Self {
        ShardTime { partitions: BTreeMap::new(), watermark: None, changed: false, next_timer: [None, None] }
    }
}

/// The event time of a task's shards.
#[derive(Debug, Clone)]
pub struct EventTime {
    config: TimeConfig,
    shards: BTreeMap<u32, ShardTime>,
}

impl EventTime {
    /// The event time of a task reading `partitions` (topic, partition;
    /// partition p of every topic is shard p), before anything is restored:
    /// no watermark, no timers, every partition last seen at `now`.
    pub fn new(config: TimeConfig, partitions: &[(String, i32)], now: Instant) -> Self {
        let mut shards: BTreeMap<u32, ShardTime> = BTreeMap::new();
        for (topic, partition) in partitions {
            let Ok(shard) = u32::try_from(*partition) else { continue };
            let entry = shards.entry(shard).or_insert_with(ShardTime::new);
            entry.partitions.insert(topic.clone(), PartitionTime { largest: None, last_seen: now });
        }
        EventTime { config, shards }
    }

    /// The shards it keeps time for.
    pub fn shards(&self) -> impl Iterator<Item = u32> + '_ {
        self.shards.keys().copied()
    }

    /// Takes what `shard` stored under [`watermark_key`] at its last
    /// checkpoint. A value that does not parse is an error: it is the
    /// host's own.
    pub fn restore(&mut self, shard: u32, stored: &[u8]) -> Result<(), serde_json::Error> {
        let persisted: Persisted = serde_json::from_slice(stored)?;
        if let Some(time) = self.shards.get_mut(&shard) {
            time.watermark = persisted.watermark;
            for (topic, largest) in persisted.largest {
                if let Some(partition) = time.partitions.get_mut(&topic) {
                    partition.largest = Some(largest);
                }
            }
        }
        Ok(())
    }

    /// Notes the lower bound of `shard`'s next timer of `clock` found in the
    /// store (`None`: it has none).
    pub fn set_next_timer(&mut self, shard: u32, clock: Clock, at: Option<i64>) {
        if let Some(time) = self.shards.get_mut(&shard) {
            time.next_timer[clock.index()] = at;
        }
    }

    /// No timer of `clock` in `shard` is earlier than this (`None`: it has
    /// none).
    pub fn next_timer(&self, shard: u32, clock: Clock) -> Option<i64> {
        self.shards.get(&shard).and_then(|t| t.next_timer[clock.index()])
    }

    /// Notes that a timer of `clock` at `at` was set in `shard` (which
    /// `sluice exec` may not know yet: it learns a shard from its first
    /// records, after the guest has seen them).
    pub fn note_timer(&mut self, shard: u32, clock: Clock, at: i64) {
        let time = self.shards.entry(shard).or_insert_with(ShardTime::new);
        let next = &mut time.next_timer[clock.index()];
        *next = Some(next.map_or(at, |n| n.min(at)));
    }

    /// Whether `shard` may have a timer of `clock` due at `now` (the
    /// watermark for event time, the host's clock for processing time).
    pub fn may_be_due(&self, shard: u32, clock: Clock, now: Option<i64>) -> bool {
        let Some(time) = self.shards.get(&shard) else { return false };
        matches!((time.next_timer[clock.index()], now), (Some(next), Some(now)) if next <= now)
    }

    /// `shard`'s watermark.
    pub fn watermark(&self, shard: u32) -> Option<i64> {
        self.shards.get(&shard).and_then(|t| t.watermark)
    }

    /// Each shard's watermark.
    pub fn watermarks(&self) -> BTreeMap<u32, Option<i64>> {
        self.shards.iter().map(|(&shard, time)| (shard, time.watermark)).collect()
    }

    /// Notes `records` ((topic, timestamp) each) of `shard`, read at `now`:
    /// as [`observe`](Self::observe) for each, but once per run of records
    /// of one topic (a batch is mostly one), with the run's largest
    /// timestamp.
    pub fn observe_all<'r>(
        &mut self,
        shard: u32,
        records: impl IntoIterator<Item = (&'r str, Option<i64>)>,
        now: Instant,
    ) {
        let mut run: Option<(&str, Option<i64>)> = None;
        for (topic, timestamp) in records {
            match &mut run {
                Some((current, largest)) if *current == topic => *largest = (*largest).max(timestamp),
                _ => {
                    if let Some((topic, largest)) = run.replace((topic, timestamp)) {
                        self.observe(shard, topic, largest, now);
                    }
                }
            }
        }
        if let Some((topic, largest)) = run {
            self.observe(shard, topic, largest, now);
        }
    }

    /// Notes a record of `topic` in `shard` with `timestamp`, read at `now`.
    pub fn observe(&mut self, shard: u32, topic: &str, timestamp: Option<i64>, now: Instant) {
        // A job knows its partitions from the start (one that has sent
        // nothing holds the watermark back); `sluice exec` learns them here.
        let time = self.shards.entry(shard).or_insert_with(ShardTime::new);
        if !time.partitions.contains_key(topic) {
            time.partitions.insert(topic.to_owned(), PartitionTime { largest: None, last_seen: now });
        }
        let Some(partition) = time.partitions.get_mut(topic) else { return };
        partition.last_seen = now;
        if let Some(ts) = timestamp
            && partition.largest.is_none_or(|largest| ts > largest)
        {
            partition.largest = Some(ts);
            time.changed = true;
        }
    }

    /// Moves every shard's watermark to what its partitions say at `now`:
    /// the smallest (largest seen - out-of-orderness - 1 ms) over partitions that
    /// are not idle; with all idle, the largest; never back. A partition
    /// that has sent nothing and is not idle holds the watermark at none.
    pub fn advance(&mut self, now: Instant) {
        let lag = i64::try_from(self.config.max_out_of_orderness.as_millis()).unwrap_or(i64::MAX);
        let idle_timeout = self.config.idle_timeout;
        for time in self.shards.values_mut() {
            let idle =
                |p: &PartitionTime| idle_timeout.is_some_and(|t| now.saturating_duration_since(p.last_seen) >= t);
            // As Flink's bounded out-of-orderness watermarks: 1 ms below
            // (largest - lag), so that records at the largest timestamp
            // seen (many share a millisecond) are never late.
            let bound = |p: &PartitionTime| p.largest.map(|l| l.saturating_sub(lag).saturating_sub(1));
            let active: Vec<Option<i64>> = time.partitions.values().filter(|p| !idle(p)).map(bound).collect();
            let candidate = if active.is_empty() {
                time.partitions.values().filter_map(bound).max()
            } else if active.iter().any(Option::is_none) {
                None
            } else {
                active.into_iter().flatten().min()
            };
            if let Some(candidate) = candidate
                && time.watermark.is_none_or(|w| candidate > w)
            {
                time.watermark = Some(candidate);
                time.changed = true;
            }
        }
    }

    /// Raises every shard's watermark to at least `at` (`sluice exec`'s
    /// `{"watermark": ...}` lines: an author's test of what happens when time
    /// passes).
    pub fn force_watermark(&mut self, at: i64) {
        for time in self.shards.values_mut() {
            if time.watermark.is_none_or(|w| at > w) {
                time.watermark = Some(at);
                time.changed = true;
            }
        }
    }

    /// The stored form of every shard whose event time changed since the
    /// last call, as (shard, value under [`watermark_key`]); called at the
    /// barrier, so the checkpoint holds the event time its records made.
    pub fn take_changed(&mut self) -> Vec<(u32, Vec<u8>)> {
        let mut changed = Vec::new();
        for (&shard, time) in &mut self.shards {
            if !std::mem::take(&mut time.changed) {
                continue;
            }
            let persisted = Persisted {
                watermark: time.watermark,
                largest: time.partitions.iter().filter_map(|(t, p)| Some((t.clone(), p.largest?))).collect(),
            };
            // A map of strings to integers always serializes.
            if let Ok(bytes) = serde_json::to_vec(&persisted) {
                changed.push((shard, bytes));
            }
        }
        changed
    }
}

/// Whether a record with `timestamp` is late against `watermark`: at or
/// below it.
pub fn is_late(timestamp: Option<i64>, watermark: Option<i64>) -> bool {
    matches!((timestamp, watermark), (Some(ts), Some(w)) if ts <= w)
}

#[cfg(test)]
mod tests;
