//! Emits, for each record, its key and the number of records seen so far
//! with that key (see README.md).

use sluice_guest::{Batch, Config, Emitter, Record, Result, Transform, ValueState};

const COUNTS: ValueState<u64> = ValueState::new("count");

struct RunningCount;

impl Transform for RunningCount {
    fn init(_config: &Config) -> Result<Self> {
        Ok(RunningCount)
    }

    fn begin_batch(&mut self, batch: &Batch) -> Result<()> {
        // One state.get-many call for the whole batch.
        COUNTS.prefetch(batch.keys())
    }

    fn process(&mut self, record: &Record, out: &mut Emitter) -> Result<()> {
        // Records without a key count under the empty key.
        let n = COUNTS.update(record.key_or_empty(), |n| n.unwrap_or(0) + 1)?;
        out.emit(record.key_or_empty(), n.to_string());
        Ok(())
    }
}

sluice_guest::export!(RunningCount);
