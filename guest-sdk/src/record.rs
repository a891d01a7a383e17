//! Input records and batches, as the transform sees them.
//!
//! [`Record`] gives typed access to one input record without copying it;
//! [`Batch`] is the slice of records of one `process` call, handed to
//! [`Transform::begin_batch`](crate::Transform::begin_batch) so a
//! transform can prefetch state for all of its keys at once.
//!
//! A batch arrives either as the WIT `list<input-record>` (`process`, from
//! hosts before 0.1.3) or as one `packed-batch` byte string
//! (`process-packed`): then every record points into that one buffer, and
//! [`Batch::from_packed`] only checks its layout and notes where each
//! record's parts are.

use std::rc::Rc;

use serde::Deserialize;

use crate::bindings::InputRecord;
use crate::error::{Error, Result};
use crate::packed::Reader;

/// One record read from an input topic.
///
/// Keys and values are bytes; `None` means the record has no key, or (for the
/// value) that it is a tombstone.
#[derive(Clone)]
pub struct Record {
    repr: Repr,
}

#[derive(Clone)]
enum Repr {
    Owned(InputRecord),
    Packed(PackedRecord),
}

/// A packed batch's bytes and topic names, shared by its records.
struct Packed {
    bytes: Vec<u8>,
    topics: Vec<String>,
    partition: i32,
}

/// Where one record's parts lie in its batch's bytes.
#[derive(Clone)]
struct PackedRecord {
    batch: Rc<Packed>,
    key: Option<(u32, u32)>,
    value: Option<(u32, u32)>,
    /// Where its headers' count is.
    headers: u32,
    topic: u32,
    offset: i64,
    timestamp: Option<i64>,
}

impl PackedRecord {
    fn slice(&self, (start, end): (u32, u32)) -> &[u8] {
        // In bounds: `Batch::from_packed` checked every span it noted.
        self.batch.bytes.get(start as usize..end as usize).unwrap_or_default()
    }
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("key", &self.key())
            .field("value", &self.value())
            .field("headers", &self.headers().collect::<Vec<_>>())
            .field("timestamp", &self.timestamp())
            .field("topic", &self.topic())
            .field("partition", &self.partition())
            .field("offset", &self.offset())
            .finish()
    }
}

impl Record {
    pub(crate) fn new(inner: InputRecord) -> Self {
        Record { repr: Repr::Owned(inner) }
    }

    /// The key, if the record has one.
    pub fn key(&self) -> Option<&[u8]> {
        match &self.repr {
            Repr::Owned(r) => r.key.as_deref(),
            Repr::Packed(p) => p.key.map(|span| p.slice(span)),
        }
    }

    /// The key, or the empty key for records produced without one.
    pub fn key_or_empty(&self) -> &[u8] {
        self.key().unwrap_or_default()
    }

    /// The key as UTF-8 text; an error if there is no key or it is not UTF-8.
    pub fn key_str(&self) -> Result<&str> {
        let key = self.key().ok_or_else(|| Error::new("record has no key"))?;
        Ok(std::str::from_utf8(key)?)
    }

    /// The value; `None` for a tombstone.
    pub fn value(&self) -> Option<&[u8]> {
        match &self.repr {
            Repr::Owned(r) => r.value.as_deref(),
            Repr::Packed(p) => p.value.map(|span| p.slice(span)),
        }
    }

    /// Whether the record is a tombstone (has no value).
    pub fn is_tombstone(&self) -> bool {
        self.value().is_none()
    }

    /// The value as UTF-8 text; an error for a tombstone or a value that is
    /// not UTF-8.
    pub fn value_str(&self) -> Result<&str> {
        Ok(std::str::from_utf8(self.value_or_error()?)?)
    }

    /// The value decoded from JSON; an error for a tombstone or invalid JSON.
    ///
    /// `T` may borrow from the record (e.g. `&str` fields).
    pub fn json<'a, T: Deserialize<'a>>(&'a self) -> Result<T> {
        Ok(serde_json::from_slice(self.value_or_error()?)?)
    }

    fn value_or_error(&self) -> Result<&[u8]> {
        self.value().ok_or_else(|| Error::new("record has no value (tombstone)"))
    }

    /// The headers, in record order; a key may occur more than once.
    pub fn headers(&self) -> Headers<'_> {
        match &self.repr {
            Repr::Owned(r) => Headers(HeadersInner::Owned(r.headers.iter())),
            Repr::Packed(p) => {
                let mut reader = Reader::batch_at(&p.batch.bytes, p.headers as usize);
                let left = reader.u32().unwrap_or(0);
                Headers(HeadersInner::Packed { reader, left })
            }
        }
    }

    /// The value of the last header named `name` (as Kafka's
    /// `Headers.lastHeader` does), if any.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers().filter(|(key, _)| *key == name).last().map(|(_, value)| value)
    }

    /// Milliseconds since the Unix epoch, if the record carries a timestamp.
    pub fn timestamp(&self) -> Option<i64> {
        match &self.repr {
            Repr::Owned(r) => r.timestamp,
            Repr::Packed(p) => p.timestamp,
        }
    }

    /// Whether the record is late: its timestamp is at or below the
    /// shard's watermark ([`crate::time::watermark`]), so windows that
    /// would hold it may have closed. A record without a timestamp is never
    /// late. The host counts late records; nothing drops them but the
    /// transform.
    pub fn is_late(&self) -> bool {
        matches!((self.timestamp(), crate::time::watermark()), (Some(ts), Some(w)) if ts <= w)
    }

    /// The topic the record was read from.
    pub fn topic(&self) -> &str {
        match &self.repr {
            Repr::Owned(r) => &r.topic,
            Repr::Packed(p) => p.batch.topics.get(p.topic as usize).map_or("", String::as_str),
        }
    }

    /// The partition the record was read from.
    pub fn partition(&self) -> i32 {
        match &self.repr {
            Repr::Owned(r) => r.partition,
            Repr::Packed(p) => p.batch.partition,
        }
    }

    /// The record's offset in its partition.
    pub fn offset(&self) -> i64 {
        match &self.repr {
            Repr::Owned(r) => r.offset,
            Repr::Packed(p) => p.offset,
        }
    }
}

/// A record's headers: see [`Record::headers`].
#[derive(Debug, Clone)]
pub struct Headers<'a>(HeadersInner<'a>);

#[derive(Debug, Clone)]
enum HeadersInner<'a> {
    Owned(std::slice::Iter<'a, crate::bindings::sluice::transform::types::Header>),
    Packed { reader: Reader<'a>, left: u32 },
}

impl<'a> Iterator for Headers<'a> {
    type Item = (&'a str, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.0 {
            HeadersInner::Owned(headers) => headers.next().map(|h| (h.key.as_str(), h.value.as_slice())),
            HeadersInner::Packed { reader, left } => {
                *left = left.checked_sub(1)?;
                // `Batch::from_packed` checked every header's bounds and
                // that its key is UTF-8.
                let key = std::str::from_utf8(reader.bytes().ok()?).ok()?;
                Some((key, reader.bytes().ok()?))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match &self.0 {
            HeadersInner::Owned(headers) => headers.len(),
            HeadersInner::Packed { left, .. } => *left as usize,
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Headers<'_> {}

/// Flag bits of a packed record (see `packed-batch` in the WIT).
const HAS_KEY: u8 = 1;
const HAS_VALUE: u8 = 2;
const HAS_TIMESTAMP: u8 = 4;

/// The records of one `process` call, in input order.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    records: Vec<Record>,
}

impl Batch {
    pub(crate) fn new(records: Vec<InputRecord>) -> Self {
        Batch { records: records.into_iter().map(Record::new).collect() }
    }

    /// The records of a WIT `packed-batch`, which they point into. An error
    /// if its layout is broken (a host bug: the host packs every batch).
    pub(crate) fn from_packed(bytes: Vec<u8>) -> Result<Self> {
        let mut reader = Reader::batch_at(&bytes, 0);
        let partition = i32::from_le_bytes(reader.array()?);
        let topic_count = reader.u32()?;
        let mut topics = Vec::with_capacity(topic_count.min(64) as usize);
        for _ in 0..topic_count {
            topics.push(reader.text("a topic name")?.to_owned());
        }
        let count = reader.u32()?;
        let records_at = reader.position();
        // The records are read in one pass from the shared buffer they
        // point into.
        let batch = Rc::new(Packed { bytes, topics, partition });
        let mut reader = Reader::batch_at(&batch.bytes, records_at);
        let mut records = Vec::with_capacity((count as usize).min(batch.bytes.len() / 17));
        for _ in 0..count {
            let flags = reader.u8()?;
            let topic = reader.u32()?;
            if topic >= topic_count {
                return Err(Error::new(format!("malformed packed batch: topic {topic} of {topic_count}")));
            }
            let offset = reader.i64()?;
            let timestamp = if flags & HAS_TIMESTAMP != 0 { Some(reader.i64()?) } else { None };
            let key = if flags & HAS_KEY != 0 { Some(reader.span()?) } else { None };
            let value = if flags & HAS_VALUE != 0 { Some(reader.span()?) } else { None };
            let headers = reader.position() as u32;
            for _ in 0..reader.u32()? {
                reader.text("a header key")?;
                reader.bytes()?;
            }
            records.push(Record {
                repr: Repr::Packed(PackedRecord {
                    batch: Rc::clone(&batch),
                    key,
                    value,
                    headers,
                    topic,
                    offset,
                    timestamp,
                }),
            });
        }
        reader.finish()?;
        Ok(Batch { records })
    }

    /// The records.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// An iterator over the records.
    pub fn iter(&self) -> std::slice::Iter<'_, Record> {
        self.records.iter()
    }

    /// The number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the batch has no records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Every record's key ([`Record::key_or_empty`]), in input order, repeats
    /// included: the argument `prefetch` expects.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &[u8]> + Clone + '_ {
        self.records.iter().map(Record::key_or_empty)
    }
}

impl<'a> IntoIterator for &'a Batch {
    type Item = &'a Record;
    type IntoIter = std::slice::Iter<'a, Record>;

    fn into_iter(self) -> Self::IntoIter {
        self.records.iter()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bindings::sluice::transform::types::Header;

    /// An input record for tests.
    pub(crate) fn input(key: Option<&str>, value: Option<&[u8]>) -> InputRecord {
        InputRecord {
            key: key.map(|k| k.as_bytes().to_vec()),
            value: value.map(<[u8]>::to_vec),
            headers: vec![
                Header { key: "h".into(), value: b"1".to_vec() },
                Header { key: "x".into(), value: b"y".to_vec() },
                Header { key: "h".into(), value: b"2".to_vec() },
            ],
            timestamp: Some(1_700_000_000_000),
            topic: "events".into(),
            partition: 3,
            offset: 41,
        }
    }

    #[test]
    fn accessors() {
        let r = Record::new(input(Some("k"), Some(br#"{"n": 5, "s": "hi"}"#)));
        assert_eq!(r.key(), Some(&b"k"[..]));
        assert_eq!(r.key_str(), Ok("k"));
        assert_eq!(r.key_or_empty(), b"k");
        assert_eq!(r.value_str(), Ok(r#"{"n": 5, "s": "hi"}"#));
        #[derive(serde::Deserialize)]
        struct V<'a> {
            n: u32,
            s: &'a str,
        }
        let v: V<'_> = r.json().unwrap();
        assert_eq!((v.n, v.s), (5, "hi"));
        assert_eq!(r.json::<serde_json::Value>().unwrap()["n"], 5);
        assert_eq!(r.header("h"), Some(&b"2"[..]), "last header wins");
        assert_eq!(r.header("nope"), None);
        assert_eq!(r.headers().len(), 3);
        assert_eq!(r.headers().next(), Some(("h", &b"1"[..])));
        assert_eq!((r.timestamp(), r.topic(), r.partition(), r.offset()), (Some(1_700_000_000_000), "events", 3, 41));
        assert!(!r.is_tombstone());
    }

    #[test]
    fn missing_parts_are_errors_not_panics() {
        let r = Record::new(input(None, None));
        assert_eq!(r.key(), None);
        assert_eq!(r.key_or_empty(), b"");
        assert!(r.is_tombstone());
        assert_eq!(r.key_str().unwrap_err().message(), "record has no key");
        assert_eq!(r.value_str().unwrap_err().message(), "record has no value (tombstone)");
        assert!(r.json::<u32>().is_err());
        let r = Record::new(input(Some("k"), Some(&[0xff, 0xfe])));
        assert!(r.value_str().unwrap_err().message().starts_with("invalid UTF-8"));
        assert!(r.json::<u32>().unwrap_err().message().starts_with("invalid JSON"));
    }

    /// `records` (of one partition) as a WIT `packed-batch`, as the host
    /// packs them.
    pub(crate) fn pack(records: &[InputRecord]) -> Vec<u8> {
        fn put(out: &mut Vec<u8>, bytes: &[u8]) {
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
        }
        let mut topics: Vec<&str> = Vec::new();
        for r in records {
            if !topics.contains(&r.topic.as_str()) {
                topics.push(&r.topic);
            }
        }
        let mut out = records.first().map_or(-1, |r| r.partition).to_le_bytes().to_vec();
        out.extend_from_slice(&(topics.len() as u32).to_le_bytes());
        topics.iter().for_each(|t| put(&mut out, t.as_bytes()));
        out.extend_from_slice(&(records.len() as u32).to_le_bytes());
        for r in records {
            let flags =
                u8::from(r.key.is_some()) | u8::from(r.value.is_some()) << 1 | u8::from(r.timestamp.is_some()) << 2;
            out.push(flags);
            let topic = topics.iter().position(|t| *t == r.topic).unwrap() as u32;
            out.extend_from_slice(&topic.to_le_bytes());
            out.extend_from_slice(&r.offset.to_le_bytes());
            r.timestamp.iter().for_each(|ts| out.extend_from_slice(&ts.to_le_bytes()));
            r.key.iter().for_each(|k| put(&mut out, k));
            r.value.iter().for_each(|v| put(&mut out, v));
            out.extend_from_slice(&(r.headers.len() as u32).to_le_bytes());
            for h in &r.headers {
                put(&mut out, h.key.as_bytes());
                put(&mut out, &h.value);
            }
        }
        out
    }

    /// Everything a record says, through its accessors.
    fn seen(r: &Record) -> String {
        format!("{r:?} late={} tombstone={} h={:?}", r.is_late(), r.is_tombstone(), r.header("h"))
    }

    #[test]
    fn a_packed_batch_reads_as_the_list_it_packs() {
        let mut other = input(None, None);
        (other.topic, other.offset, other.timestamp, other.headers) = ("other".into(), 42, None, Vec::new());
        let mut empty = input(Some(""), Some(b""));
        empty.offset = 43;
        let records = vec![input(Some("k"), Some(b"v")), other, empty, input(Some("k2"), None)];
        let packed = Batch::from_packed(pack(&records)).unwrap();
        let owned = Batch::new(records);
        assert_eq!(packed.len(), 4);
        for (p, o) in packed.iter().zip(&owned) {
            assert_eq!(seen(p), seen(o));
            assert_eq!(p.headers().len(), o.headers().len());
            assert_eq!(p.headers().collect::<Vec<_>>(), o.headers().collect::<Vec<_>>());
        }
        assert_eq!(packed.records()[1].topic(), "other");
        assert_eq!(packed.records()[2].key(), Some(&b""[..]), "an empty key is a key");
        assert_eq!(packed.keys().collect::<Vec<_>>(), owned.keys().collect::<Vec<_>>());
        assert!(Batch::from_packed(pack(&[])).unwrap().is_empty());
    }

    #[test]
    fn a_malformed_packed_batch_is_an_error_not_a_panic() {
        let good = pack(&[input(Some("k"), Some(b"v")), input(None, None)]);
        // Cut anywhere, it is refused.
        for end in 0..good.len() {
            let e = Batch::from_packed(good[..end].to_vec()).unwrap_err();
            assert!(e.message().starts_with("malformed packed batch"), "{end}: {e}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(Batch::from_packed(long).unwrap_err().message().contains("1 bytes left"));
        // A topic index past the table, a length past the end.
        let topic_at = 4 + 4 + 4 + 6 + 4 + 1;
        let mut bad = good.clone();
        bad[topic_at] = 9;
        assert!(Batch::from_packed(bad).unwrap_err().message().contains("topic 9 of 1"));
        let mut bad = good.clone();
        bad[topic_at + 4 + 8 + 8] = 0xff;
        assert!(Batch::from_packed(bad).unwrap_err().message().contains("wanted"));
        // A header key that is not UTF-8.
        let mut bad = good;
        let h = bad.windows(5).position(|w| w == [1, 0, 0, 0, b'h']).unwrap();
        bad[h + 4] = 0xff;
        assert!(Batch::from_packed(bad).unwrap_err().message().contains("header key is not UTF-8"));
    }

    #[test]
    fn batch_keys() {
        let b = Batch::new(vec![input(Some("a"), None), input(None, None), input(Some("a"), None)]);
        assert_eq!(b.len(), 3);
        assert!(!b.is_empty());
        let keys: Vec<&[u8]> = b.keys().collect();
        assert_eq!(keys, [&b"a"[..], b"", b"a"]);
        assert_eq!((&b).into_iter().count(), 3);
        assert_eq!(b.records().len(), b.iter().len());
    }
}
