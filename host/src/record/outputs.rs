//! [`Outputs`]: the output records of one guest call, kept as the one
//! `packed-outputs` byte string a guest of WIT 0.1.5 returns, and read in
//! place. Turning each into an [`OutputRecord`] cost two host allocations
//! per record (its key and value), which the sink then copied into
//! librdkafka anyway; now the sink reads the keys and values where they are.
//!
//! Outputs that come as WIT records (older guests, `on-timers`, dead
//! letters) are packed into the same layout ([`Outputs::from_records`]), so
//! the task has one kind of output. [`Output`] is what the sink writes:
//! either an [`OutputRef`] into [`Outputs`] or an [`OutputRecord`].
//!
//! The layout is `wit/sluice.wit`'s `packed-outputs`: a `u32` count, then
//! per record a flags byte (1: key, 2: value, 4: topic), the topic, key and
//! value when present (each a `u32` length and its bytes), a `u32` header
//! count and the headers (key, then value, each a length and its bytes).
//! Little-endian. `runtime::packed::unpack_outputs` checks a guest's string
//! against it before an [`Outputs`] is made of it.

use super::{Header, OutputRecord};
use crate::runtime::packed::{HAS_KEY, HAS_TOPIC, HAS_VALUE, len32, put_bytes};

/// Where a part lies in [`Outputs::bytes`]: start and end.
pub(crate) type Span = (usize, usize);

/// Where one record's parts lie.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spans {
    pub(crate) topic: Option<Span>,
    pub(crate) key: Option<Span>,
    pub(crate) value: Option<Span>,
    /// Where the record's header count is.
    pub(crate) headers: usize,
}

/// The output records of one or more calls, in order.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    bytes: Vec<u8>,
    records: Vec<Spans>,
}

impl Outputs {
    /// Outputs over `bytes` whose records are at `records`. Every span and
    /// header count must lie within `bytes`, and topics and header keys must
    /// be UTF-8 (`runtime::packed::unpack_outputs` checks it).
    pub(crate) fn from_checked(bytes: Vec<u8>, records: Vec<Spans>) -> Self {
        Outputs { bytes, records }
    }

    /// `records`, packed.
    pub fn from_records(records: Vec<OutputRecord>) -> Self {
        let mut outputs = Outputs::default();
        outputs.extend(&records);
        outputs
    }

    /// Adds `record` at the end.
    pub fn push<'a>(&mut self, record: impl Output<'a>) {
        let out = &mut self.bytes;
        let (topic, key, value) = (record.topic(), record.key(), record.value());
        out.push(
            (u8::from(key.is_some()) * HAS_KEY)
                | (u8::from(value.is_some()) * HAS_VALUE)
                | (u8::from(topic.is_some()) * HAS_TOPIC),
        );
        let topic = topic.map(|topic| put(out, topic.as_bytes()));
        let key = key.map(|key| put(out, key));
        let value = value.map(|value| put(out, value));
        let headers = out.len();
        let list = record.headers();
        out.extend_from_slice(&len32(list.len()));
        for (key, value) in list {
            put(out, key.as_bytes());
            put(out, value);
        }
        self.records.push(Spans { topic, key, value, headers });
    }

    /// Moves `other`'s records to the end of these.
    pub fn append(&mut self, other: Outputs) {
        if self.records.is_empty() {
            *self = other;
            return;
        }
        let shift = self.bytes.len();
        let moved = |span: Option<Span>| span.map(|(start, end)| (start + shift, end + shift));
        self.bytes.extend_from_slice(&other.bytes);
        self.records.extend(other.records.into_iter().map(|r| Spans {
            topic: moved(r.topic),
            key: moved(r.key),
            value: moved(r.value),
            headers: r.headers + shift,
        }));
    }

    /// The number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// The bytes these outputs hold in memory: their keys, values, topics
    /// and headers, and the index of where each lies.
    pub fn bytes(&self) -> usize {
        self.bytes.len() + self.records.len() * std::mem::size_of::<Spans>()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The records, in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter { bytes: &self.bytes, records: self.records.iter() }
    }

    /// The records as WIT records (for `sluice exec` and tests).
    pub fn into_records(self) -> Vec<OutputRecord> {
        self.iter().map(OutputRef::to_record).collect()
    }
}

impl<'a, R: Output<'a>> Extend<R> for Outputs {
    fn extend<I: IntoIterator<Item = R>>(&mut self, records: I) {
        records.into_iter().for_each(|record| self.push(record));
    }
}

impl<'a> IntoIterator for &'a Outputs {
    type Item = OutputRef<'a>;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The records of [`Outputs`], in order.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    bytes: &'a [u8],
    records: std::slice::Iter<'a, Spans>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = OutputRef<'a>;

    fn next(&mut self) -> Option<OutputRef<'a>> {
        self.records.next().map(|spans| OutputRef { bytes: self.bytes, spans })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.records.size_hint()
    }
}

impl ExactSizeIterator for Iter<'_> {}

/// Appends `part` with its length in front; returns where it lies.
fn put(out: &mut Vec<u8>, part: &[u8]) -> Span {
    put_bytes(out, part);
    (out.len() - part.len(), out.len())
}

/// One record of [`Outputs`].
#[derive(Debug, Clone, Copy)]
pub struct OutputRef<'a> {
    bytes: &'a [u8],
    spans: &'a Spans,
}

impl<'a> OutputRef<'a> {
    fn part(&self, span: Option<Span>) -> Option<&'a [u8]> {
        // In bounds: checked when the outputs were made.
        span.map(|(start, end)| self.bytes.get(start..end).unwrap_or_default())
    }

    /// The record as a WIT record.
    pub fn to_record(self) -> OutputRecord {
        OutputRecord {
            key: self.key().map(<[u8]>::to_vec),
            value: self.value().map(<[u8]>::to_vec),
            headers: self.headers().map(|(key, value)| Header { key: key.to_owned(), value: value.to_vec() }).collect(),
            topic: self.topic().map(str::to_owned),
        }
    }
}

/// An output record as the sink writes it.
pub trait Output<'a>: Copy {
    /// The key, if any.
    fn key(self) -> Option<&'a [u8]>;
    /// The value; `None` for a tombstone.
    fn value(self) -> Option<&'a [u8]>;
    /// The declared output topic it goes to; `None`: the first.
    fn topic(self) -> Option<&'a str>;
    /// The headers, in order.
    fn headers(self) -> impl ExactSizeIterator<Item = (&'a str, &'a [u8])>;
}

impl<'a> Output<'a> for OutputRef<'a> {
    fn key(self) -> Option<&'a [u8]> {
        self.part(self.spans.key)
    }

    fn value(self) -> Option<&'a [u8]> {
        self.part(self.spans.value)
    }

    fn topic(self) -> Option<&'a str> {
        // UTF-8: checked when the outputs were made.
        self.part(self.spans.topic).map(|topic| std::str::from_utf8(topic).unwrap_or_default())
    }

    fn headers(self) -> impl ExactSizeIterator<Item = (&'a str, &'a [u8])> {
        let mut at = self.spans.headers;
        let count = read_u32(self.bytes, &mut at);
        (0..count).map(move |_| {
            let key = read_part(self.bytes, &mut at);
            let value = read_part(self.bytes, &mut at);
            (std::str::from_utf8(key).unwrap_or_default(), value)
        })
    }
}

impl<'a> Output<'a> for &'a OutputRecord {
    fn key(self) -> Option<&'a [u8]> {
        self.key.as_deref()
    }

    fn value(self) -> Option<&'a [u8]> {
        self.value.as_deref()
    }

    fn topic(self) -> Option<&'a str> {
        self.topic.as_deref()
    }

    fn headers(self) -> impl ExactSizeIterator<Item = (&'a str, &'a [u8])> {
        self.headers.iter().map(|h| (h.key.as_str(), h.value.as_slice()))
    }
}

/// The `u32` at `*at` (0 past the end: the layout was checked), moving past it.
fn read_u32(bytes: &[u8], at: &mut usize) -> usize {
    let word = bytes.get(*at..*at + 4).and_then(|w| <[u8; 4]>::try_from(w).ok()).unwrap_or_default();
    *at += 4;
    u32::from_le_bytes(word) as usize
}

/// The length-prefixed part at `*at`, moving past it.
fn read_part<'a>(bytes: &'a [u8], at: &mut usize) -> &'a [u8] {
    let len = read_u32(bytes, at);
    let part = bytes.get(*at..*at + len).unwrap_or_default();
    *at += len;
    part
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: Option<&str>, value: Option<&str>, headers: &[(&str, &str)], topic: Option<&str>) -> OutputRecord {
        OutputRecord {
            key: key.map(|k| k.as_bytes().to_vec()),
            value: value.map(|v| v.as_bytes().to_vec()),
            headers: headers.iter().map(|(k, v)| Header { key: (*k).into(), value: v.as_bytes().to_vec() }).collect(),
            topic: topic.map(str::to_owned),
        }
    }

    fn same(a: &[OutputRecord], b: &[OutputRecord]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(a, b)| {
                (a.key == b.key && a.value == b.value && a.topic == b.topic)
                    && a.headers.iter().map(|h| (&h.key, &h.value)).eq(b.headers.iter().map(|h| (&h.key, &h.value)))
            })
    }

    #[test]
    fn records_pack_and_read_back() {
        let records = vec![
            record(Some("k"), Some("v"), &[], None),
            record(None, None, &[("h", "1"), ("h", "2")], Some("other")),
            record(Some(""), Some(""), &[("", "")], None),
        ];
        let outputs = Outputs::from_records(records.clone());
        assert_eq!(outputs.len(), 3);
        let first = outputs.iter().next().expect("a first record");
        assert_eq!((first.key(), first.value(), first.topic()), (Some(&b"k"[..]), Some(&b"v"[..]), None));
        let second = outputs.iter().nth(1).expect("a second record");
        assert_eq!(second.headers().collect::<Vec<_>>(), [("h", &b"1"[..]), ("h", &b"2"[..])]);
        assert_eq!(second.headers().len(), 2);
        assert!(same(&outputs.into_records(), &records));
    }

    #[test]
    fn appended_outputs_keep_their_order_and_parts() {
        let a = vec![record(Some("a"), Some("1"), &[("x", "y")], None)];
        let b = vec![record(Some("b"), None, &[], Some("t")), record(None, Some("3"), &[("z", "")], None)];
        let mut outputs = Outputs::default();
        outputs.append(Outputs::from_records(a.clone()));
        outputs.append(Outputs::from_records(b.clone()));
        outputs.append(Outputs::default());
        let all: Vec<OutputRecord> = a.into_iter().chain(b).collect();
        assert!(same(&outputs.clone().into_records(), &all));
        // And through the trait, as the sink reads them.
        let mut again = Outputs::default();
        for record in &all {
            again.push(record);
        }
        for record in &outputs {
            again.push(record);
        }
        assert_eq!(again.len(), 6);
        assert!(same(&again.into_records()[3..], &all));
    }
}
