//! Counts records per key in tumbling event-time windows (config `window`,
//! a duration, default `1m`), and emits each window's count once, when the
//! watermark has passed its end (see README.md).

use std::time::Duration;

use sluice_guest::{Batch, Config, Emitter, Record, Result, Timer, Transform, Windows};

struct WindowedCount {
    windows: Windows<u64>,
}

impl Transform for WindowedCount {
    fn init(config: &Config) -> Result<Self> {
        let size = config.duration("window")?.unwrap_or(Duration::from_secs(60));
        let lateness = config.duration("allowed-lateness")?.unwrap_or(Duration::ZERO);
        let windows = Windows::tumbling("count", size).allowed_lateness(lateness);
        Ok(WindowedCount { windows })
    }

    fn begin_batch(&mut self, batch: &Batch) -> Result<()> {
        // One crossing for the batch's windows instead of one per record.
        self.windows.prefetch(batch)
    }

    fn process(&mut self, record: &Record, _out: &mut Emitter) -> Result<()> {
        // A record for windows that have all closed is not counted; the host
        // counts it as late.
        self.windows.add_record(record, |n| n.unwrap_or(0) + 1)?;
        Ok(())
    }

    fn on_timer(&mut self, timer: &Timer, out: &mut Emitter) -> Result<()> {
        for window in self.windows.fire(timer)? {
            let value = format!(r#"{{"start":{},"end":{},"count":{}}}"#, window.start, window.end, window.value);
            out.emit(window.key, value);
        }
        Ok(())
    }
}

sluice_guest::export!(WindowedCount);
