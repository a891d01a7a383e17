//! Output records: the [`Emitter`] a hook writes to and the [`Output`] builder.
//!
//! Everything emitted during a batch is returned to the host when the batch
//! ends, in emission order; if any hook fails, nothing of the batch is
//! written. Emitting never crosses the component boundary.

use serde::Serialize;

use crate::bindings::OutputRecord;
use crate::bindings::sluice::transform::types::Header;
use crate::error::Result;
use crate::record::Record;

/// Collects the output records of one batch.
#[derive(Debug, Default)]
pub struct Emitter {
    records: Vec<OutputRecord>,
}

impl Emitter {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Emitter { records: Vec::with_capacity(capacity) }
    }

    pub(crate) fn into_records(self) -> Vec<OutputRecord> {
        self.records
    }

    /// The records as one `packed-outputs` string (WIT 0.1.5).
    pub(crate) fn into_packed(self) -> Vec<u8> {
        crate::packed::pack_outputs(&self.records)
    }

    /// Writes a record with this key and value, no headers, to the job's
    /// default output topic.
    pub fn emit(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.records.push(OutputRecord {
            key: Some(key.into()),
            value: Some(value.into()),
            headers: Vec::new(),
            topic: None,
        });
    }

    /// Writes a record built with [`Output`].
    pub fn emit_record(&mut self, output: Output) {
        self.records.push(output.inner);
    }

    /// Writes `record` unchanged (key, value, headers) to the default output
    /// topic.
    pub fn forward(&mut self, record: &Record) {
        self.emit_record(Output::from_record(record));
    }

    /// The number of records emitted so far in this batch.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether nothing has been emitted yet in this batch.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// A record to emit, built step by step.
///
/// [`Output::new`] starts with no key, no value (a tombstone), no headers and
/// the default topic.
///
/// ```
/// # fn main() -> sluice_guest::Result<()> {
/// use sluice_guest::Output;
///
/// let out = Output::new()
///     .key("user-1")
///     .json(&serde_json::json!({"clicks": 3}))?
///     .header("source", "sluice")
///     .topic("clicks-per-user");
/// assert_eq!(out.get_value(), Some(&br#"{"clicks":3}"#[..]));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Output {
    inner: OutputRecord,
}

impl Default for Output {
    fn default() -> Self {
        Output::new()
    }
}

impl Output {
    /// An output with no key, no value, no headers, for the default topic.
    pub fn new() -> Self {
        Output { inner: OutputRecord { key: None, value: None, headers: Vec::new(), topic: None } }
    }

    /// An output with `record`'s key, value and headers, for the default topic.
    pub fn from_record(record: &Record) -> Self {
        Output {
            inner: OutputRecord {
                key: record.key().map(<[u8]>::to_vec),
                value: record.value().map(<[u8]>::to_vec),
                headers: record
                    .headers()
                    .map(|(key, value)| Header { key: key.to_owned(), value: value.to_vec() })
                    .collect(),
                topic: None,
            },
        }
    }

    /// Sets the key.
    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.inner.key = Some(key.into());
        self
    }

    /// Removes the key.
    pub fn no_key(mut self) -> Self {
        self.inner.key = None;
        self
    }

    /// Sets the value.
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.inner.value = Some(value.into());
        self
    }

    /// Sets the value to `value` encoded as JSON.
    pub fn json<T: Serialize + ?Sized>(self, value: &T) -> Result<Self> {
        Ok(self.value(serde_json::to_vec(value)?))
    }

    /// Removes the value: the output is a tombstone.
    pub fn tombstone(mut self) -> Self {
        self.inner.value = None;
        self
    }

    /// Adds a header (keeping any existing header of the same name).
    pub fn header(mut self, key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.inner.headers.push(Header { key: key.into(), value: value.into() });
        self
    }

    /// Sends the output to `topic`, which must be one of the job's declared
    /// output topics (otherwise the host fails the batch).
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.inner.topic = Some(topic.into());
        self
    }

    /// The key set so far.
    pub fn get_key(&self) -> Option<&[u8]> {
        self.inner.key.as_deref()
    }

    /// The value set so far.
    pub fn get_value(&self) -> Option<&[u8]> {
        self.inner.value.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::input;

    #[test]
    fn emit_and_build() {
        let mut out = Emitter::default();
        assert!(out.is_empty());
        out.emit("k", "v");
        out.emit(b"k2".to_vec(), String::from("v2"));
        out.emit_record(Output::new().key("a").json(&[1, 2]).unwrap().header("h", "1").topic("t"));
        out.emit_record(Output::new().value("x").tombstone().key("z").no_key());
        let record = Record::new(input(Some("rk"), Some(b"rv")));
        out.forward(&record);
        assert_eq!(out.len(), 5);
        let r = out.into_records();
        assert_eq!((r[0].key.as_deref(), r[0].value.as_deref()), (Some(&b"k"[..]), Some(&b"v"[..])));
        assert_eq!(r[2].value.as_deref(), Some(&b"[1,2]"[..]));
        assert_eq!(r[2].topic.as_deref(), Some("t"));
        assert_eq!(r[2].headers.len(), 1);
        assert_eq!((r[3].key.as_deref(), r[3].value.as_deref()), (None, None));
        assert_eq!(r[4].key.as_deref(), Some(&b"rk"[..]));
        assert_eq!(r[4].headers.len(), 3);
        assert_eq!(r[4].topic, None);
    }
}
