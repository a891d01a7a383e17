//! Passes each record whose value has not been seen for its key within a
//! time-to-live (config `ttl`, a duration, default `1h`), and drops the
//! repeats. The memory of a (key, value) expires, so the state holds only
//! what the last `ttl` brought (see README.md).

use std::time::Duration;

use sluice_guest::{Config, Emitter, MapState, Record, Result, Transform};

struct Dedup {
    seen: MapState<Vec<u8>, bool>,
}

impl Transform for Dedup {
    fn init(config: &Config) -> Result<Self> {
        let ttl = config.duration("ttl")?.unwrap_or(Duration::from_secs(3600));
        Ok(Dedup { seen: MapState::new("seen").with_ttl(ttl) })
    }

    fn process(&mut self, record: &Record, out: &mut Emitter) -> Result<()> {
        let value = record.value().unwrap_or_default();
        if self.seen.get(record.key_or_empty(), value)?.is_none() {
            self.seen.set(record.key_or_empty(), value, &true)?;
            out.forward(record);
        }
        Ok(())
    }
}

sluice_guest::export!(Dedup);
