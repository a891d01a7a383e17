//! Input records and batches, as the transform sees them.
//!
//! [`Record`] wraps one WIT `input-record` without copying it and offers
//! typed accessors; [`Batch`] is the slice of records of one `process` call,
//! handed to [`Transform::begin_batch`](crate::Transform::begin_batch) so a
//! transform can prefetch state for all of its keys at once.

use serde::Deserialize;

use crate::bindings::InputRecord;
use crate::error::{Error, Result};

/// One record read from an input topic.
///
/// Keys and values are bytes; `None` means the record has no key, or (for the
/// value) that it is a tombstone.
#[derive(Clone, Debug)]
pub struct Record {
    inner: InputRecord,
}

impl Record {
    pub(crate) fn new(inner: InputRecord) -> Self {
        Record { inner }
    }

    pub(crate) fn inner(&self) -> &InputRecord {
        &self.inner
    }

    /// The key, if the record has one.
    pub fn key(&self) -> Option<&[u8]> {
        self.inner.key.as_deref()
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
        self.inner.value.as_deref()
    }

    /// Whether the record is a tombstone (has no value).
    pub fn is_tombstone(&self) -> bool {
        self.inner.value.is_none()
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
    pub fn headers(&self) -> impl ExactSizeIterator<Item = (&str, &[u8])> + '_ {
        self.inner.headers.iter().map(|h| (h.key.as_str(), h.value.as_slice()))
    }

    /// The value of the last header named `name` (as Kafka's
    /// `Headers.lastHeader` does), if any.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.inner.headers.iter().rev().find(|h| h.key == name).map(|h| h.value.as_slice())
    }

    /// Milliseconds since the Unix epoch, if the record carries a timestamp.
    pub fn timestamp(&self) -> Option<i64> {
        self.inner.timestamp
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
        &self.inner.topic
    }

    /// The partition the record was read from.
    pub fn partition(&self) -> i32 {
        self.inner.partition
    }

    /// The record's offset in its partition.
    pub fn offset(&self) -> i64 {
        self.inner.offset
    }
}

/// The records of one `process` call, in input order.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    records: Vec<Record>,
}

impl Batch {
    pub(crate) fn new(records: Vec<InputRecord>) -> Self {
        Batch { records: records.into_iter().map(Record::new).collect() }
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
