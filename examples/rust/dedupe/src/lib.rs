//! Passes each record on only the first time its key is seen within a
//! time-to-live (config `ttl-ms`, default one hour): a deduplication whose
//! memory of a key expires, so its state does not grow without bound (see
//! README.md).

use std::time::Duration;

use sluice_guest::{Config, Emitter, Record, Result, Transform, ValueState};

struct Dedupe {
    seen: ValueState<bool>,
}

impl Transform for Dedupe {
    fn init(config: &Config) -> Result<Self> {
        let ttl = Duration::from_millis(config.parse("ttl-ms")?.unwrap_or(3_600_000));
        Ok(Dedupe { seen: ValueState::new("seen").with_ttl(ttl) })
    }

    fn process(&mut self, record: &Record, out: &mut Emitter) -> Result<()> {
        if self.seen.get(record.key_or_empty())?.is_none() {
            self.seen.set(record.key_or_empty(), &true)?;
            out.forward(record);
        }
        Ok(())
    }
}

sluice_guest::export!(Dedupe);
