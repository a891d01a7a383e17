//! Uppercases record values, keeping keys and headers (see README.md).

use sluice_guest::{Config, Emitter, Output, Record, Result, Transform};

struct Uppercase;

impl Transform for Uppercase {
    fn init(_config: &Config) -> Result<Self> {
        Ok(Uppercase)
    }

    fn process(&mut self, record: &Record, out: &mut Emitter) -> Result<()> {
        match record.value_str() {
            Ok(text) => out.emit_record(Output::from_record(record).value(text.to_uppercase())),
            // Tombstones and values that are not UTF-8 pass through unchanged.
            Err(_) => out.forward(record),
        }
        Ok(())
    }
}

sluice_guest::export!(Uppercase);
