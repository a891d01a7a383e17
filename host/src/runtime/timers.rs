//! The host side of the `time` import: the shard's watermark, the host's
//! clock, and setting and deleting the shard's timers.
//!
//! A timer is a state entry of the running call's shard, in the host's part
//! of its key space ([`crate::time::timer_key`]), so it is checkpointed,
//! written to the changelog, restored and moved with the shard, exactly like
//! the guest's own state; setting or deleting one is charged against the
//! state limits like any write. The task's [`EventTime`] only remembers a
//! lower bound of each shard's next timer, so that a call with nothing due
//! scans nothing.
//!
//! [`EventTime`]: crate::time::EventTime

use super::bindings::timed::sluice::transform::time::{self, Clock as WitClock};
use super::host::NoShard;
use super::sandbox::HostState;
use crate::time::{Clock, Timer};

/// A timer set by a module that does not export `on-timers`, which could
/// never fire.
#[derive(Debug, thiserror::Error)]
#[error(
    "set-timer: this module does not export `on-timers` (world `sluice:transform/timed`), so its timers could never \
     fire"
)]
pub struct NoTimerExport;

impl From<WitClock> for Clock {
    fn from(clock: WitClock) -> Self {
        match clock {
            WitClock::Event => Clock::Event,
            WitClock::Processing => Clock::Processing,
        }
    }
}

impl From<Clock> for WitClock {
    fn from(clock: Clock) -> Self {
        match clock {
            Clock::Event => WitClock::Event,
            Clock::Processing => WitClock::Processing,
        }
    }
}

impl From<time::Timer> for Timer {
    fn from(timer: time::Timer) -> Self {
        Timer { clock: timer.clock.into(), at: timer.at, key: timer.key }
    }
}

impl From<Timer> for time::Timer {
    fn from(timer: Timer) -> Self {
        time::Timer { clock: timer.clock.into(), key: timer.key, at: timer.at }
    }
}

impl HostState {
    /// The stored key of `timer` in the running call's shard, checked like
    /// a state key.
    fn timer_entry(&self, timer: &Timer) -> wasmtime::Result<(u32, Vec<u8>)> {
        super::host::check_key(&timer.key)?;
        let shard = self.shard.ok_or_else(|| wasmtime::Error::new(NoShard))?;
        Ok((shard, super::shard_key(shard, &crate::time::timer_key(timer))))
    }
}

impl time::Host for HostState {
    fn watermark(&mut self) -> wasmtime::Result<Option<i64>> {
        let shard = self.shard.ok_or_else(|| wasmtime::Error::new(NoShard))?;
        Ok(self.time.as_ref().and_then(|t| t.watermark(shard)))
    }

    fn processing_time(&mut self) -> wasmtime::Result<i64> {
        Ok(self.call_started_ms)
    }

    fn set_timer(&mut self, timer: time::Timer) -> wasmtime::Result<()> {
        if !self.fires_timers {
            return Err(wasmtime::Error::new(NoTimerExport));
        }
        let timer = Timer::from(timer);
        let (shard, key) = self.timer_entry(&timer)?;
        self.charge(&key, Some(0))?;
        self.state.set(key, Vec::new());
        if let Some(time) = &mut self.time {
            time.note_timer(shard, timer.clock, timer.at);
        }
        Ok(())
    }

    fn delete_timer(&mut self, timer: time::Timer) -> wasmtime::Result<()> {
        let (_, key) = self.timer_entry(&Timer::from(timer))?;
        self.charge(&key, None)?;
        self.state.delete(key);
        Ok(())
    }
}
