//! Event time, the watermark and timers (WIT interface `time`).
//!
//! Event time is a record's Kafka timestamp ([`Record::timestamp`]). The host
//! keeps each shard's *watermark*: "every record at or below this time has
//! arrived" (the slowest input partition's largest timestamp, less the job's
//! `time.max-out-of-orderness`, less 1 ms). It moves only between calls, so during a
//! call it is fixed, and a record at or below it is late
//! ([`Record::is_late`]).
//!
//! A [`Timer`] is a key and a time on one of two clocks: event time (it
//! fires once the watermark reaches it) or processing time (once the host's
//! clock does). Timers are state of the shard: setting one in a call that
//! fails sets nothing, and a firing commits exactly once with its epoch. When
//! timers are due the host calls the transform's
//! [`on_timer`](crate::Transform::on_timer) once per timer, in time order.
//!
//! The windows in [`crate::window`] are built on these.
//!
//! [`Record::timestamp`]: crate::Record::timestamp
//! [`Record::is_late`]: crate::Record::is_late
//!
//! Natively (`cargo test`), the host is simulated in memory: [`testing`]
//! sets the watermark and the clock and fires due timers.

use crate::error::Result;

/// The clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Clock {
    /// The shard's watermark.
    Event,
    /// The host's wall clock (the guest's own clock stays frozen).
    Processing,
}

/// A timer: `key` at `at` (ms since the Unix epoch) on `clock`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timer {
    /// Its clock.
    pub clock: Clock,
    /// When it is due, in ms since the Unix epoch.
    pub at: i64,
    /// The key it was set for.
    pub key: Vec<u8>,
}

impl Timer {
    /// An event-time timer.
    pub fn event(key: impl Into<Vec<u8>>, at: i64) -> Self {
        Timer { clock: Clock::Event, at, key: key.into() }
    }

    /// A processing-time timer.
    pub fn processing(key: impl Into<Vec<u8>>, at: i64) -> Self {
        Timer { clock: Clock::Processing, at, key: key.into() }
    }

    /// Sets it (setting a timer that is set already does nothing). An
    /// event-time timer at or below the watermark fires right after this
    /// call.
    pub fn set(&self) -> Result<()> {
        backend::set(self);
        Ok(())
    }

    /// Deletes it; deleting a timer that is not set does nothing.
    pub fn delete(&self) -> Result<()> {
        backend::delete(self);
        Ok(())
    }

    /// The key as UTF-8 text.
    pub fn key_str(&self) -> Result<&str> {
        Ok(std::str::from_utf8(&self.key)?)
    }
}

/// The shard's watermark (ms since the Unix epoch) as of the start of this
/// call; `None` until every input partition of the shard has sent a record
/// or gone idle. One boundary crossing per call into the transform, however
/// often it is asked (it does not change during a call).
pub fn watermark() -> Option<i64> {
    once_per_call(&CALL_WATERMARK, backend::watermark)
}

/// The host's clock (ms since the Unix epoch) as of the start of this call
/// (one boundary crossing per call, however often it is asked).
pub fn processing_time() -> i64 {
    once_per_call(&CALL_NOW, backend::processing_time)
}

type PerCall<T> = std::thread::LocalKey<std::cell::Cell<Option<T>>>;

thread_local! {
    /// The watermark of the running call, once asked for.
    static CALL_WATERMARK: std::cell::Cell<Option<Option<i64>>> = const { std::cell::Cell::new(None) };
    /// The processing time of the running call, once asked for.
    static CALL_NOW: std::cell::Cell<Option<i64>> = const { std::cell::Cell::new(None) };
    /// The timers [`set_once_per_call`] has set in the running call.
    static CALL_SET: std::cell::RefCell<Vec<Timer>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Sets `timer` unless the running call has set it through here already:
/// windows set the same timer for every key's first record, and one
/// crossing per call does (setting a set timer does nothing).
pub(crate) fn set_once_per_call(timer: Timer) -> Result<()> {
    let new = CALL_SET.with(|set| {
        let mut set = set.borrow_mut();
        if set.contains(&timer) {
            return false;
        }
        set.push(timer.clone());
        true
    });
    if new { timer.set() } else { Ok(()) }
}

/// `cached`'s value for the running call, asking `fetch` (the host) the
/// first time.
fn once_per_call<T: Copy>(cached: &'static PerCall<T>, fetch: fn() -> T) -> T {
    cached.with(|cached| match cached.get() {
        Some(value) => value,
        None => {
            let value = fetch();
            cached.set(Some(value));
            value
        }
    })
}

/// Forgets what the running call asked the host: called as each call into
/// the transform begins.
pub(crate) fn new_call() {
    CALL_WATERMARK.with(|cached| cached.set(None));
    CALL_NOW.with(|cached| cached.set(None));
    CALL_SET.with(|set| set.borrow_mut().clear());
}

#[cfg(target_arch = "wasm32")]
mod backend {
    use super::{Clock, Timer};
    use crate::bindings::sluice::transform::time as host;

    fn wit(timer: &Timer) -> host::Timer {
        let clock = match timer.clock {
            Clock::Event => host::Clock::Event,
            Clock::Processing => host::Clock::Processing,
        };
        host::Timer { clock, key: timer.key.clone(), at: timer.at }
    }

    pub(super) fn set(timer: &Timer) {
        host::set_timer(&wit(timer));
    }

    pub(super) fn delete(timer: &Timer) {
        host::delete_timer(&wit(timer));
    }

    pub(super) fn watermark() -> Option<i64> {
        host::watermark()
    }

    pub(super) fn processing_time() -> i64 {
        host::processing_time()
    }
}

/// A timer as the generated bindings hand it over. Not a stable API.
#[doc(hidden)]
pub fn from_wit(timer: crate::bindings::sluice::transform::time::Timer) -> Timer {
    use crate::bindings::sluice::transform::time::Clock as Wit;
    let clock = match timer.clock {
        Wit::Event => Clock::Event,
        Wit::Processing => Clock::Processing,
    };
    Timer { clock, at: timer.at, key: timer.key }
}

#[cfg(not(target_arch = "wasm32"))]
mod backend {
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    use super::{Clock, Timer};

    /// The host, simulated for native tests.
    #[derive(Default)]
    pub(super) struct Simulated {
        pub(super) watermark: Option<i64>,
        pub(super) now: i64,
        pub(super) timers: BTreeSet<(Clock, i64, Vec<u8>)>,
    }

    thread_local! {
        pub(super) static HOST: RefCell<Simulated> = RefCell::new(Simulated::default());
    }

    pub(super) fn set(timer: &Timer) {
        HOST.with(|h| h.borrow_mut().timers.insert((timer.clock, timer.at, timer.key.clone())));
    }

    pub(super) fn delete(timer: &Timer) {
        HOST.with(|h| h.borrow_mut().timers.remove(&(timer.clock, timer.at, timer.key.clone())));
    }

    pub(super) fn watermark() -> Option<i64> {
        HOST.with(|h| h.borrow().watermark)
    }

    pub(super) fn processing_time() -> i64 {
        HOST.with(|h| h.borrow().now)
    }
}

/// A simulated host for native unit tests: set the watermark and the clock,
/// and take the timers that are due, as the host would fire them.
#[cfg(not(target_arch = "wasm32"))]
pub mod testing {
    use super::backend::HOST;
    use super::{Clock, Timer};

    /// Sets the watermark (tests may move it back; the host never does).
    pub fn set_watermark(at: Option<i64>) {
        HOST.with(|h| h.borrow_mut().watermark = at);
        super::new_call();
    }

    /// Sets the host's clock.
    pub fn set_processing_time(at: i64) {
        HOST.with(|h| h.borrow_mut().now = at);
        super::new_call();
    }

    /// Removes and returns the due timers, in the order the host fires them.
    pub fn take_due() -> Vec<Timer> {
        HOST.with(|h| {
            let mut host = h.borrow_mut();
            let (watermark, now) = (host.watermark, host.now);
            let due: Vec<(Clock, i64, Vec<u8>)> = host
                .timers
                .iter()
                .filter(|(clock, at, _)| match clock {
                    Clock::Event => watermark.is_some_and(|w| *at <= w),
                    Clock::Processing => *at <= now,
                })
                .cloned()
                .collect();
            for timer in &due {
                host.timers.remove(timer);
            }
            due.into_iter().map(|(clock, at, key)| Timer { clock, at, key }).collect()
        })
    }

    /// The timers set, in order.
    pub fn pending() -> Vec<Timer> {
        HOST.with(|h| {
            h.borrow()
                .timers
                .iter()
                .map(|(clock, at, key)| Timer { clock: *clock, at: *at, key: key.clone() })
                .collect()
        })
    }

    /// Forgets every timer and resets the watermark and clock.
    pub fn reset() {
        HOST.with(|h| *h.borrow_mut() = Default::default());
        super::new_call();
    }
}
