//! Output records: the [`Emitter`] a hook writes to and the [`Output`] builder.
//!
//! Everything emitted during a batch is returned to the host when the batch
//! ends, in emission order; if any hook fails, nothing of the batch is
//! written. Emitting never crosses the component boundary.

use serde::Serialize;

use crate::bindings::OutputRecord;
use crate::bindings::sluice::transform::types::Header;
use crate::error::Result;
use crate::packed::{Reader, len32, put};
use crate::record::Record;

/// Collects the output records of one batch.
///
/// They are written at once in the `packed-outputs` layout of the WIT (a
/// count, then per record a flags byte, the topic, key and value when
/// present, and the headers), which is what a host of 0.1.5 takes: emitting
/// copies the key and value once, into one growing buffer, and allocates
/// nothing per record. For older hosts, and for `on-timers`, the buffer is
/// read back into WIT records when the call ends.
pub struct Emitter {
    /// `packed-outputs`, its count (the first four bytes) written when the
    /// call ends.
    packed: Vec<u8>,
    len: usize,
}

/// Flag bits of a packed output (see `packed-outputs` in the WIT).
const HAS_KEY: u8 = 1;
const HAS_VALUE: u8 = 2;
const HAS_TOPIC: u8 = 4;

impl Emitter {
    /// Room for `capacity` records of a small key and value without growing.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let mut packed = Vec::with_capacity(4 + capacity.saturating_mul(48));
        packed.extend_from_slice(&[0; 4]);
        Emitter { packed, len: 0 }
    }

    /// The records as WIT records (hosts before 0.1.5, and `on-timers`).
    pub(crate) fn into_records(self) -> Result<Vec<OutputRecord>> {
        let packed = self.into_packed();
        unpack(&packed).map_err(|e| e.context("sluice-guest bug: reading back the outputs"))
    }

    /// The records as one `packed-outputs` string (WIT 0.1.5).
    pub(crate) fn into_packed(mut self) -> Vec<u8> {
        self.packed[..4].copy_from_slice(&len32(self.len).to_le_bytes());
        self.packed
    }

    /// Writes a record with this key and value, no headers, to the job's
    /// default output topic.
    pub fn emit(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.push(None, Some(key.as_ref()), Some(value.as_ref()), std::iter::empty());
    }

    /// Writes a record built with [`Output`].
    pub fn emit_record(&mut self, output: Output) {
        let OutputRecord { key, value, headers, topic } = &output.inner;
        let headers = headers.iter().map(|h| (h.key.as_str(), h.value.as_slice()));
        self.push(topic.as_deref(), key.as_deref(), value.as_deref(), headers);
    }

    /// Writes `record` unchanged (key, value, headers) to the default output
    /// topic.
    pub fn forward(&mut self, record: &Record) {
        self.push(None, record.key(), record.value(), record.headers());
    }

    /// The number of records emitted so far in this batch.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been emitted yet in this batch.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn push<'a>(
        &mut self,
        topic: Option<&str>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl ExactSizeIterator<Item = (&'a str, &'a [u8])>,
    ) {
        let out = &mut self.packed;
        out.push(
            (u8::from(key.is_some()) * HAS_KEY)
                | (u8::from(value.is_some()) * HAS_VALUE)
                | (u8::from(topic.is_some()) * HAS_TOPIC),
        );
        if let Some(topic) = topic {
            put(out, topic.as_bytes());
        }
        if let Some(key) = key {
            put(out, key);
        }
        if let Some(value) = value {
            put(out, value);
        }
        out.extend_from_slice(&len32(headers.len()).to_le_bytes());
        for (key, value) in headers {
            put(out, key.as_bytes());
            put(out, value);
        }
        self.len += 1;
    }
}

impl Default for Emitter {
    fn default() -> Self {
        Emitter::with_capacity(0)
    }
}

impl std::fmt::Debug for Emitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emitter").field("len", &self.len).field("bytes", &self.packed.len()).finish()
    }
}

/// Reads `packed-outputs` back into WIT records.
fn unpack(packed: &[u8]) -> Result<Vec<OutputRecord>> {
    let mut reader = Reader::new(packed, "packed outputs");
    let count = reader.u32()?;
    let mut records = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let flags = reader.u8()?;
        let topic = if flags & HAS_TOPIC != 0 { Some(reader.text("a topic")?.to_owned()) } else { None };
        let key = if flags & HAS_KEY != 0 { Some(reader.bytes()?.to_vec()) } else { None };
        let value = if flags & HAS_VALUE != 0 { Some(reader.bytes()?.to_vec()) } else { None };
        let headers = (0..reader.u32()?)
            .map(|_| Ok(Header { key: reader.text("a header key")?.to_owned(), value: reader.bytes()?.to_vec() }))
            .collect::<Result<Vec<_>>>()?;
        records.push(OutputRecord { key, value, headers, topic });
    }
    reader.finish()?;
    Ok(records)
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

    /// `packed-outputs` byte by byte, as `wit/sluice.wit` documents it and
    /// the host's `runtime::packed::unpack_outputs` reads it.
    #[test]
    fn outputs_pack_to_the_documented_layout() {
        let mut out = Emitter::default();
        out.emit_record(Output::new().key("k").value("vv").header("h", "x"));
        out.emit_record(Output::new().key("").topic("other"));
        out.emit_record(Output::new());
        let mut want = 3u32.to_le_bytes().to_vec();
        want.push(1 | 2);
        put(&mut want, b"k");
        put(&mut want, b"vv");
        want.extend_from_slice(&1u32.to_le_bytes());
        put(&mut want, b"h");
        put(&mut want, b"x");
        want.push(1 | 4);
        put(&mut want, b"other");
        put(&mut want, b"");
        want.extend_from_slice(&0u32.to_le_bytes());
        want.push(0);
        want.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(out.into_packed(), want);
        assert_eq!(Emitter::default().into_packed(), 0u32.to_le_bytes());
    }

    #[test]
    fn emit_and_build() {
        let mut out = Emitter::default();
        assert!(out.is_empty());
        out.emit("k", "v");
        // Anything that is bytes: owned or borrowed, text or not.
        let owned_key: Vec<u8> = b"k2".into();
        out.emit(owned_key, String::from("v2"));
        out.emit_record(Output::new().key("a").json(&[1, 2]).unwrap().header("h", "1").topic("t"));
        out.emit_record(Output::new().value("x").tombstone().key("z").no_key());
        let record = Record::new(input(Some("rk"), Some(b"rv")));
        out.forward(&record);
        assert_eq!(out.len(), 5);
        let r = out.into_records().unwrap();
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
