//! The [`Transform`] trait: what a transform implements.

use crate::config::Config;
use crate::emit::Emitter;
use crate::error::Result;
use crate::record::{Batch, Record};
use crate::time::Timer;

/// A transform: created once per instance by [`init`](Transform::init),
/// then called batch by batch.
///
/// For every batch the SDK calls [`begin_batch`](Transform::begin_batch),
/// [`process`](Transform::process) for each record in input order, then
/// [`end_batch`](Transform::end_batch); then it writes the batch's state
/// changes back to the host in one call and returns everything emitted. If
/// any hook returns an error, the batch fails as a whole: no output, no
/// state change, and the host replays it from the last checkpoint, possibly
/// in a fresh instance. So fields of `Self` must not hold anything that the
/// replay would need (use [state](crate::state) for that); caches that can be
/// rebuilt are fine.
///
/// Register the type with [`export!`](crate::export).
pub trait Transform: Sized + 'static {
    /// Creates the instance from the job's configuration. An error fails the
    /// job with its message; check every setting here. State belongs to an
    /// input partition and `init` runs before any, so it cannot read or
    /// write state (the host refuses).
    fn init(config: &Config) -> Result<Self>;

    /// Called before the batch's first record; the place to
    /// [`prefetch`](crate::ValueState::prefetch) state for all of the batch's
    /// keys in one boundary crossing. Does nothing by default.
    fn begin_batch(&mut self, batch: &Batch) -> Result<()> {
        let _ = batch;
        Ok(())
    }

    /// Transforms one record, emitting any number of outputs.
    fn process(&mut self, record: &Record, out: &mut Emitter) -> Result<()>;

    /// Called after the batch's last record, before its state changes are
    /// written back; may emit more outputs. Does nothing by default.
    fn end_batch(&mut self, out: &mut Emitter) -> Result<()> {
        let _ = out;
        Ok(())
    }

    /// Called for each due timer of the shard, in time order (see
    /// [`crate::time`]): an event-time timer once the watermark reaches its
    /// time, a processing-time one once the host's clock does. The timer is
    /// already removed; set it again to fire again. State calls go to the
    /// timer's shard, and are written back after the call's last timer, as
    /// for a batch; an error fails the call (the host restarts the task from
    /// its last checkpoint, with backoff, and the timers fire again). Does
    /// nothing by default.
    fn on_timer(&mut self, timer: &Timer, out: &mut Emitter) -> Result<()> {
        let _ = (timer, out);
        Ok(())
    }

    /// Called once after the job was upgraded to this module, after `init`
    /// and before the first batch, with the sha256 of the module that wrote
    /// the state: the place to convert the old state to this module's
    /// layout (read it with the typed states or page through it with
    /// `scan-prefix`). Its writes are part of the next checkpoint; if the
    /// task restarts before that checkpoint commits, it runs again over the
    /// old state. Keeps the state as it is by default.
    fn migrate(&mut self, from_module: &str) -> Result<()> {
        let _ = from_module;
        Ok(())
    }
}
