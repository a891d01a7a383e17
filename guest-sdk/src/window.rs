//! Event-time windows, built on state and timers.
//!
//! - [`Windows::tumbling`]: fixed windows `[start, start + size)` that do not
//!   overlap; [`Windows::hopping`]: windows of `size` starting every `slide`,
//!   so a record falls in `size / slide` of them.
//! - [`SessionWindows`]: per key, runs of records less than `gap` apart; a
//!   record that bridges two sessions merges them.
//!
//! Each window of a key keeps one accumulator, which the transform folds
//! each record into (`add`). Each window *end* has one event-time timer at
//! `end - 1 + allowed lateness`, whatever the number of keys (Flink and
//! Kafka Streams keep one per key and window: here a window's keys cost no
//! timer each, to set, checkpoint, log and fire). When the watermark reaches
//! it the host calls [`Transform::on_timer`](crate::Transform::on_timer),
//! where `fire` turns the timer into the closed [`Window`]s of that end
//! (removing their state) for the transform to emit, [`WINDOWS_PER_FIRING`]
//! at a time. So each window's result is emitted once, with every
//! record at most `allowed_lateness` behind the watermark; a record for
//! windows that have all fired already is not added (`add` says so, and the
//! host has counted it late), never silently. [`Windows::prefetch`] in
//! [`begin_batch`](crate::Transform::begin_batch) loads the state of every
//! window the batch's records fall in with one boundary crossing.
//!
//! ```
//! use std::time::Duration;
//! use sluice_guest::{Config, Emitter, Record, Result, Timer, Transform, Windows};
//!
//! const PER_MINUTE: Windows<u64> = Windows::tumbling("per-minute", Duration::from_secs(60));
//!
//! struct CountPerMinute;
//!
//! impl Transform for CountPerMinute {
//!     fn init(_: &Config) -> Result<Self> {
//!         Ok(CountPerMinute)
//!     }
//!
//!     fn process(&mut self, record: &Record, _out: &mut Emitter) -> Result<()> {
//!         PER_MINUTE.add_record(record, |n| n.unwrap_or(0) + 1)?;
//!         Ok(())
//!     }
//!
//!     fn on_timer(&mut self, timer: &Timer, out: &mut Emitter) -> Result<()> {
//!         for window in PER_MINUTE.fire(timer)? {
//!             out.emit(window.key, format!("{} {}", window.start, window.value));
//!         }
//!         Ok(())
//!     }
//! }
//! # sluice_guest::export!(CountPerMinute);
//! ```
//!
//! State layout (for other SDKs): a [`Windows`] named `name` keeps window
//! `start` of key `k` as the [`MapState`] entry (`name`, `start` as an `i64`
//! map key's 8 bytes, `k` as the map key), that is `name 0x00 00 00 00 08
//! start k`, so one window's keys are one key range; its timers are
//! event-time timers with the key `name`, one per window end, at
//! `end - 1 + allowed lateness`. A firing takes the range's first
//! [`WINDOWS_PER_FIRING`] entries in key order and, if more remain, sets an
//! event-time timer `name 0x01 last-key` at the same time, whose firing goes
//! on after that key. (Earlier SDKs stored (`name`, `k`, `start`) with a timer
//! `name 0x00 k` per key; `fire` still closes such a window.) A
//! [`SessionWindows`] keeps a key's open sessions as one [`ValueState`] JSON
//! array of `{"start", "end", "value"}`, with an event-time timer `name
//! 0x00 k` at each session's `end - 1 + allowed lateness`.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::record::{Batch, Record};
use crate::state::{MapState, ValueState, keys, store};
use crate::time::{self, Clock, Timer};

/// A window that closed: its key, its bounds and what was folded into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window<A> {
    /// The record key the window belongs to.
    pub key: Vec<u8>,
    /// Its first millisecond.
    pub start: i64,
    /// Its end, exclusive.
    pub end: i64,
    /// The accumulator.
    pub value: A,
}

impl<A> Window<A> {
    /// The key as UTF-8 text.
    pub fn key_str(&self) -> Result<&str> {
        Ok(std::str::from_utf8(&self.key)?)
    }
}

const fn millis(d: Duration) -> i64 {
    let ms = d.as_millis();
    if ms > i64::MAX as u128 { i64::MAX } else { ms as i64 }
}

/// The timer key of windows named `name` for `key` (sessions, and
/// tumbling or hopping windows stored by an earlier SDK).
fn timer_key(name: &str, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len() + 1 + key.len());
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.extend_from_slice(key);
    out
}

/// The record key a timer of windows named `name` is for, if it is one of
/// theirs.
fn timer_record_key<'t>(name: &str, timer: &'t Timer) -> Option<&'t [u8]> {
    if timer.clock != Clock::Event {
        return None;
    }
    timer.key.strip_prefix(name.as_bytes())?.strip_prefix(&[0])
}

/// How many windows one firing of a window end's timer closes at most (below
/// the host's default limit of 100 outputs per fired timer); it sets a timer
/// for the rest (`name 0x01 last-key`, at the same time), which fire in the
/// host's next round.
pub const WINDOWS_PER_FIRING: usize = 64;

/// The byte after the name in the key of the timer that goes on with a
/// window end's windows after the last key a firing closed (`name 0x01
/// key`); distinct from the `name 0x00 key` of per-key timers.
const CONTINUED: u8 = 1;

fn timestamp_of(record: &Record) -> Result<i64> {
    record.timestamp().ok_or_else(|| {
        Error::new(format!(
            "record {}-{}@{} has no timestamp, so it falls in no event-time window",
            record.topic(),
            record.partition(),
            record.offset()
        ))
    })
}

/// Tumbling or hopping event-time windows per record key, with an
/// accumulator `A` (stored as JSON).
#[derive(Debug)]
pub struct Windows<A> {
    /// Per window (its start's `i64` map-key bytes, [`window_id`]), the
    /// accumulator of each record key (the map key).
    state: MapState<Vec<u8>, A>,
    /// The layout of earlier SDKs, read only to close their windows: per
    /// record key, the accumulator of each window start.
    per_key: MapState<i64, A>,
    name: &'static str,
    size: i64,
    slide: i64,
    lateness: i64,
}

impl<A> Clone for Windows<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Windows<A> {}

impl<A> Windows<A> {
    /// Windows `[k * size, (k + 1) * size)` named `name` (unique among the
    /// transform's states and windows).
    pub const fn tumbling(name: &'static str, size: Duration) -> Self {
        Windows::hopping(name, size, size)
    }

    /// Windows of `size` starting every `slide`: a record falls in `size /
    /// slide` of them (rounded up).
    pub const fn hopping(name: &'static str, size: Duration, slide: Duration) -> Self {
        Windows {
            state: MapState::new(name),
            per_key: MapState::new(name),
            name,
            size: millis(size),
            slide: millis(slide),
            lateness: 0,
        }
    }

    /// How long after the watermark passes a window's end it stays open for
    /// late records (default zero). Its result is emitted once, when this
    /// has passed too.
    pub const fn allowed_lateness(self, lateness: Duration) -> Self {
        Windows { lateness: millis(lateness), ..self }
    }

    /// The time the timer of the window starting at `start` is set for.
    fn fires_at(&self, start: i64) -> i64 {
        start.saturating_add(self.size).saturating_sub(1).saturating_add(self.lateness)
    }

    /// The start of the window whose timer is set for `at`.
    fn start_of(&self, at: i64) -> i64 {
        at.saturating_sub(self.lateness).saturating_add(1).saturating_sub(self.size)
    }
}

/// The "record key" of the window starting at `start` in a [`Windows`]'
/// map state: `start` as an `i64` map key, so that the window's
/// accumulators are the entries `name 0x00 u32-be(8) i64-key(start) key`,
/// one key range.
fn window_id(start: i64) -> [u8; 8] {
    // The i64 `MapKey` encoding (big-endian, sign bit flipped), on the
    // stack: it is built for every record.
    (start ^ i64::MIN).to_be_bytes()
}

/// The entry key of a window's accumulator for a record key, `name 0x00
/// u32-be(8) i64-key(start) key`, kept with its prefix up to the key:
/// consecutive records mostly fall in the same window, and building the
/// prefix anew for each (a name check and three copies, twice per record)
/// was a tenth of the windowed count's guest time.
#[derive(Default)]
struct EntryKey {
    name: &'static str,
    start: i64,
    /// Bytes of `buf` that are the prefix of (`name`, `start`); 0: none.
    prefix: usize,
    buf: Vec<u8>,
}

thread_local! {
    static ENTRY_KEY: std::cell::Cell<EntryKey> = std::cell::Cell::new(EntryKey::default());
}

/// Calls `f` with the entry key of windows `name`'s window at `start` for
/// the record key `key`. (Nested calls get a buffer of their own.)
fn with_entry_key<R>(name: &'static str, start: i64, key: &[u8], f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
    ENTRY_KEY.with(|cell| {
        let mut k = cell.take();
        let same = k.prefix > 0 && k.start == start && (std::ptr::eq(k.name, name) || k.name == name);
        if !same {
            k.buf.clear();
            keys::map_prefix_into(name, &window_id(start), &mut k.buf)?;
            (k.name, k.start, k.prefix) = (name, start, k.buf.len());
        }
        k.buf.truncate(k.prefix);
        k.buf.extend_from_slice(key);
        let result = f(&k.buf);
        cell.set(k);
        result
    })
}

impl<A: Serialize + DeserializeOwned> Windows<A> {
    /// Folds a record at `timestamp` of `key` into every open window that
    /// holds it (`fold` gets the window's accumulator, `None` for a new
    /// one); returns how many took it: 0 when all of them have fired
    /// already (the record is too late for them).
    pub fn add(&self, key: impl AsRef<[u8]>, timestamp: i64, mut fold: impl FnMut(Option<A>) -> A) -> Result<usize> {
        self.check()?;
        let key = key.as_ref();
        let mut added = 0;
        for start in self.open_starts(timestamp, time::watermark()) {
            // One timer per window end, whatever the keys: set with a
            // window's first accumulator (once per call), and firing it
            // closes every key's window of that start.
            let mut new_window = false;
            with_entry_key(self.name, start, key, |entry| {
                self.state.update_entry(entry, |old| {
                    new_window = old.is_none();
                    fold(old)
                })
            })?;
            if new_window {
                time::set_once_per_call(Timer::event(self.name, self.fires_at(start)))?;
            }
            added += 1;
        }
        Ok(added)
    }

    /// Checks the size and slide.
    fn check(&self) -> Result<()> {
        if self.size <= 0 || self.slide <= 0 || self.slide > self.size {
            return Err(Error::new(format!(
                "windows `{}`: the size and slide must be positive, and the slide at most the size",
                self.name
            )));
        }
        Ok(())
    }

    /// The starts of the windows holding `timestamp` that have not fired
    /// at `watermark`, newest first.
    fn open_starts(&self, timestamp: i64, watermark: Option<i64>) -> impl Iterator<Item = i64> + '_ {
        let first = timestamp.div_euclid(self.slide).saturating_mul(self.slide);
        let oldest = timestamp.saturating_sub(self.size);
        std::iter::successors(Some(first), move |start| Some(start.saturating_sub(self.slide)))
            .take_while(move |&start| start > oldest)
            .filter(move |&start| watermark.is_none_or(|w| self.fires_at(start) > w))
    }

    /// Loads the state of every open window the batch's records fall in
    /// with one `state.get-many`, so that [`add_record`](Self::add_record)
    /// for each of them crosses to the host only for a new window end's
    /// timer. Call it from [`begin_batch`](crate::Transform::begin_batch);
    /// records without a timestamp are left for `add_record` to report.
    pub fn prefetch(&self, batch: &Batch) -> Result<()> {
        self.check()?;
        let watermark = time::watermark();
        // Each key built in one reused buffer: most are in the cache already
        // when it holds the shard's state from batch to batch.
        store::with(|s| {
            for record in batch {
                let Some(timestamp) = record.timestamp() else { continue };
                for start in self.open_starts(timestamp, watermark) {
                    with_entry_key(self.name, start, record.key_or_empty(), |entry| {
                        s.want(entry);
                        Ok(())
                    })?;
                }
            }
            s.fetch_wanted()
        })
    }

    /// [`add`](Self::add) for a record: its key ([`Record::key_or_empty`])
    /// and timestamp (an error if it has none).
    pub fn add_record(&self, record: &Record, fold: impl FnMut(Option<A>) -> A) -> Result<usize> {
        self.add(record.key_or_empty(), timestamp_of(record)?, fold)
    }

    /// If `timer` is one of these windows' timers, the windows it closes,
    /// whose state is removed, in key byte order: at most
    /// [`WINDOWS_PER_FIRING`]; the rest come from a timer this sets at the
    /// same time (`name 0x01 last-key`), in the host's next round. Empty for
    /// any other timer (another window's, or one the transform set itself).
    pub fn fire(&self, timer: &Timer) -> Result<Vec<Window<A>>> {
        if timer.clock != Clock::Event {
            return Ok(Vec::new());
        }
        // The window end's timer, or the one that goes on after the key
        // the previous firing of that end stopped at.
        let resume_after = match timer.key.strip_prefix(self.name.as_bytes()) {
            Some([]) => None,
            Some([CONTINUED, last @ ..]) => Some(last),
            _ => return self.fire_stored_per_key(timer),
        };
        let start = self.start_of(timer.at);
        let end = start.saturating_add(self.size);
        let prefix = self.state.entry_key(&window_id(start), &[][..])?;
        // From after the last key fired, not from the range's start: the
        // windows fired before are deletions there until the checkpoint
        // folds them, and passing over them again, page after page, would
        // cost a window end with n keys O(n^2 / 64).
        let after = resume_after.map(|last| [prefix.as_slice(), last].concat());
        let page = store::with(|s| Ok(s.scan(&prefix, after.as_deref(), WINDOWS_PER_FIRING as u32 + 1)))?;
        let more = page.len() > WINDOWS_PER_FIRING;
        let mut closed = Vec::with_capacity(page.len().min(WINDOWS_PER_FIRING));
        for (entry, value) in page.into_iter().take(WINDOWS_PER_FIRING) {
            let Some(key) = entry.strip_prefix(prefix.as_slice()) else {
                return Err(Error::new(format!(
                    "host bug: state.scan-prefix returned a key outside the prefix (windows `{}`)",
                    self.name
                )));
            };
            let window = Window { key: key.to_vec(), start, end, value: crate::state::decode(self.name, &value)? };
            store::with(|s| {
                s.write(entry, None);
                Ok(())
            })?;
            closed.push(window);
        }
        if let Some(last) = closed.last().filter(|_| more) {
            let key = [self.name.as_bytes(), &[CONTINUED], &last.key].concat();
            Timer::event(key, timer.at).set()?;
        }
        Ok(closed)
    }

    /// A timer `name 0x00 key` of a window that an earlier SDK stored
    /// per key (`name`, key, start): closes that window alone, so that
    /// windows open across an upgrade are not lost.
    fn fire_stored_per_key(&self, timer: &Timer) -> Result<Vec<Window<A>>> {
        let Some(key) = timer_record_key(self.name, timer) else { return Ok(Vec::new()) };
        let start = self.start_of(timer.at);
        let Some(value) = self.per_key.get(key, &start)? else { return Ok(Vec::new()) };
        self.per_key.remove(key, &start)?;
        Ok(vec![Window { key: key.to_vec(), start, end: start.saturating_add(self.size), value }])
    }
}

/// One open session of a key, as stored.
#[derive(Debug, Serialize, Deserialize)]
struct Session<A> {
    start: i64,
    /// The last record's time plus the gap (exclusive).
    end: i64,
    value: A,
}

/// Session windows per record key: records less than `gap` apart form one
/// session `[first, last + gap)`, closed when the watermark passes its end
/// (plus the allowed lateness). The accumulator `A` is stored as JSON.
#[derive(Debug)]
pub struct SessionWindows<A> {
    state: ValueState<Vec<Session<A>>>,
    name: &'static str,
    gap: i64,
    lateness: i64,
}

impl<A> Clone for SessionWindows<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for SessionWindows<A> {}

impl<A> SessionWindows<A> {
    /// Sessions named `name` (unique among the transform's states and
    /// windows) that close after `gap` without a record.
    pub const fn new(name: &'static str, gap: Duration) -> Self {
        SessionWindows { state: ValueState::new(name), name, gap: millis(gap), lateness: 0 }
    }

    /// How long after the watermark passes a session's end it stays open for
    /// late records (default zero).
    pub const fn allowed_lateness(self, lateness: Duration) -> Self {
        SessionWindows { lateness: millis(lateness), ..self }
    }

    fn fires_at(&self, end: i64) -> i64 {
        end.saturating_sub(1).saturating_add(self.lateness)
    }
}

impl<A: Serialize + DeserializeOwned> SessionWindows<A> {
    /// Folds a record at `timestamp` of `key` into its session: a new one,
    /// or the one it extends, or (when it bridges several) their merge,
    /// combined with `merge`. Returns `false` if the session it would open
    /// has fired already (the record is too late).
    pub fn add(
        &self,
        key: impl AsRef<[u8]>,
        timestamp: i64,
        fold: impl FnOnce(Option<A>) -> A,
        merge: impl Fn(A, A) -> A,
    ) -> Result<bool> {
        if self.gap <= 0 {
            return Err(Error::new(format!("sessions `{}`: the gap must be positive", self.name)));
        }
        let key = key.as_ref();
        let (start, end) = (timestamp, timestamp.saturating_add(self.gap));
        if time::watermark().is_some_and(|w| self.fires_at(end) <= w) {
            return Ok(false);
        }
        let sessions = self.state.get(key)?.unwrap_or_default();
        let timer_key = timer_key(self.name, key);
        let (touching, mut rest): (Vec<Session<A>>, Vec<Session<A>>) =
            sessions.into_iter().partition(|s| s.start < end && start < s.end);
        let mut merged: Option<Session<A>> = None;
        for session in touching {
            Timer::event(timer_key.clone(), self.fires_at(session.end)).delete()?;
            merged = Some(match merged {
                None => session,
                Some(m) => Session {
                    start: m.start.min(session.start),
                    end: m.end.max(session.end),
                    value: merge(m.value, session.value),
                },
            });
        }
        let session = match merged {
            None => Session { start, end, value: fold(None) },
            Some(m) => Session { start: m.start.min(start), end: m.end.max(end), value: fold(Some(m.value)) },
        };
        Timer::event(timer_key, self.fires_at(session.end)).set()?;
        rest.push(session);
        rest.sort_by_key(|s| s.start);
        self.state.set(key, &rest)?;
        Ok(true)
    }

    /// [`add`](Self::add) for a record: its key ([`Record::key_or_empty`])
    /// and timestamp (an error if it has none).
    pub fn add_record(
        &self,
        record: &Record,
        fold: impl FnOnce(Option<A>) -> A,
        merge: impl Fn(A, A) -> A,
    ) -> Result<bool> {
        self.add(record.key_or_empty(), timestamp_of(record)?, fold, merge)
    }

    /// If `timer` is one of these sessions' timers, the session it closes,
    /// whose state is removed; `None` for any other timer.
    pub fn fire(&self, timer: &Timer) -> Result<Option<Window<A>>> {
        let Some(key) = timer_record_key(self.name, timer) else { return Ok(None) };
        let sessions = self.state.get(key)?.unwrap_or_default();
        let (closed, open): (Vec<Session<A>>, Vec<Session<A>>) =
            sessions.into_iter().partition(|s| self.fires_at(s.end) == timer.at);
        let Some(session) = closed.into_iter().next() else { return Ok(None) };
        if open.is_empty() {
            self.state.clear(key)?;
        } else {
            self.state.set(key, &open)?;
        }
        Ok(Some(Window { key: key.to_vec(), start: session.start, end: session.end, value: session.value }))
    }
}

#[cfg(test)]
mod tests;
