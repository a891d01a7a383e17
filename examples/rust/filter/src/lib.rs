//! Keeps (or drops) records whose value contains a substring (see README.md).

use sluice_guest::{Config, Emitter, Error, Record, Result, Transform};

struct Filter {
    needle: Vec<u8>,
    keep: bool,
}

impl Transform for Filter {
    fn init(config: &Config) -> Result<Self> {
        let needle = config.require("contains")?;
        if needle.is_empty() {
            return Err(Error::new("config key `contains` must not be empty"));
        }
        let keep = config.choice("mode", &["keep", "drop"])?.unwrap_or("keep") == "keep";
        Ok(Filter { needle: needle.as_bytes().to_vec(), keep })
    }

    fn process(&mut self, record: &Record, out: &mut Emitter) -> Result<()> {
        // Bytes, not text: works for any value; a tombstone contains nothing.
        let value = record.value().unwrap_or_default();
        if value.windows(self.needle.len()).any(|w| w == self.needle) == self.keep {
            out.forward(record);
        }
        Ok(())
    }
}

sluice_guest::export!(Filter);
