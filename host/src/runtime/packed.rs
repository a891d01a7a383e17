//! The packed byte strings of WIT 0.1.3 and 0.1.5: [`pack`] makes the
//! `packed-batch` that a module's optional `process-packed` export takes
//! (world `packed`), [`Unpacker`] reads what a guest hands
//! `state.get-many-packed` and `state.write-packed`, and [`unpack_outputs`]
//! the `packed-outputs` that `process-packed-out` returns (world
//! `packed-out`).
//!
//! Lowering a `list<input-record>` calls the guest's allocator for every
//! key, value and topic, and the guest frees each again; lifting a list of
//! keys allocates each on the host. A packed string is one allocation,
//! which the other side reads in place. The layouts are documented in
//! `wit/sluice.wit`; the Rust SDK reads and writes the guest's side.

use crate::record::{InputRecord, Outputs, Span, Spans};

/// Flag bits of a packed record, input or output (`record::Outputs` writes
/// the outputs' layout).
pub(crate) const HAS_KEY: u8 = 1;
pub(crate) const HAS_VALUE: u8 = 2;
/// An input record's third bit.
const HAS_TIMESTAMP: u8 = 4;
/// An output record's third bit: it names its topic.
pub(crate) const HAS_TOPIC: u8 = 4;

/// A packed argument from the guest that does not follow its layout: the
/// call traps, naming where.
#[derive(Debug, thiserror::Error)]
#[error("malformed {what}: {detail}")]
pub(super) struct Malformed {
    what: &'static str,
    detail: String,
}

/// Reads a packed argument front to back: little-endian, `u32` counts and
/// lengths.
pub(super) struct Unpacker<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Unpacker<'a> {
    /// Reads `bytes`, which the errors call `what` (the argument's name).
    pub(super) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Unpacker { bytes, at: 0, what }
    }

    // Out of line, so the readers below inline into the decode loops.
    #[cold]
    #[inline(never)]
    fn malformed(&self, detail: String) -> Malformed {
        Malformed { what: self.what, detail }
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        match self.at.checked_add(n).and_then(|end| self.bytes.get(self.at..end)) {
            Some(part) => {
                self.at += n;
                Ok(part)
            }
            None => Err(self.short(n)),
        }
    }

    #[cold]
    #[inline(never)]
    fn short(&self, n: usize) -> Malformed {
        self.malformed(format!("{n} bytes wanted at byte {} of {}", self.at, self.bytes.len()))
    }

    #[inline]
    pub(super) fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    pub(super) fn u32(&mut self) -> Result<usize, Malformed> {
        let mut word = [0; 4];
        word.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(word) as usize)
    }

    /// A length and that many bytes.
    #[inline]
    pub(super) fn bytes(&mut self) -> Result<&'a [u8], Malformed> {
        let n = self.u32()?;
        self.take(n)
    }

    /// A byte `0` (none) or `1` and a length and bytes (some).
    #[inline]
    pub(super) fn optional_bytes(&mut self) -> Result<Option<&'a [u8]>, Malformed> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.bytes().map(Some),
            other => Err(self.malformed(format!("{other} at byte {} where 0 or 1 was due", self.at - 1))),
        }
    }

    /// A length and that many bytes, as where they lie.
    #[inline]
    fn span(&mut self) -> Result<Span, Malformed> {
        let n = self.u32()?;
        let start = self.at;
        self.take(n)?;
        Ok((start, self.at))
    }

    /// [`Self::span`] of UTF-8 text.
    fn text_span(&mut self) -> Result<Span, Malformed> {
        let start = self.at + 4;
        self.text()?;
        Ok((start, self.at))
    }

    /// A length and that many bytes of UTF-8.
    pub(super) fn text(&mut self) -> Result<&'a str, Malformed> {
        let at = self.at;
        let bytes = self.bytes()?;
        std::str::from_utf8(bytes).map_err(|e| self.malformed(format!("text at byte {at} is not UTF-8: {e}")))
    }

    /// Checks that nothing follows what was read.
    pub(super) fn finish(&self) -> Result<(), Malformed> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            left => Err(self.malformed(format!("{left} bytes left over"))),
        }
    }
}

/// A length or count as the format's `u32`. Every part of a record read
/// from Kafka is far below 4 GiB (`message.max.bytes` is an `i32`), so this
/// only saturates for input that could not have come from a broker.
pub(crate) fn len32(n: usize) -> [u8; 4] {
    u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes()
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&len32(bytes.len()));
    out.extend_from_slice(bytes);
}

/// Packs `batch` (records of `partition`, in order) into `out`, replacing
/// what it held; `out` is kept by the caller so its allocation is reused.
pub(super) fn pack(partition: i32, batch: &[InputRecord], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&partition.to_le_bytes());
    // The topics in order of first appearance; a batch has one or a few.
    let mut topics: Vec<&str> = Vec::new();
    let mut topic_of = Vec::with_capacity(batch.len());
    for record in batch {
        let index = match topics.iter().rposition(|t| *t == record.topic) {
            Some(index) => index,
            None => {
                topics.push(&record.topic);
                topics.len() - 1
            }
        };
        topic_of.push(len32(index));
    }
    out.extend_from_slice(&len32(topics.len()));
    for topic in &topics {
        put_bytes(out, topic.as_bytes());
    }
    let payload: usize =
        batch.iter().map(|r| 40 + r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len)).sum();
    out.reserve(payload);
    out.extend_from_slice(&len32(batch.len()));
    for (record, topic) in batch.iter().zip(topic_of) {
        let flags = if record.key.is_some() { HAS_KEY } else { 0 }
            | if record.value.is_some() { HAS_VALUE } else { 0 }
            | if record.timestamp.is_some() { HAS_TIMESTAMP } else { 0 };
        out.push(flags);
        out.extend_from_slice(&topic);
        out.extend_from_slice(&record.offset.to_le_bytes());
        if let Some(timestamp) = record.timestamp {
            out.extend_from_slice(&timestamp.to_le_bytes());
        }
        if let Some(key) = &record.key {
            put_bytes(out, key);
        }
        if let Some(value) = &record.value {
            put_bytes(out, value);
        }
        out.extend_from_slice(&len32(record.headers.len()));
        for header in &record.headers {
            put_bytes(out, header.key.as_bytes());
            put_bytes(out, &header.value);
        }
    }
}

/// The record count a `packed-outputs` string starts with (0 if it is too
/// short to hold one: [`unpack_outputs`] then says what is wrong).
pub(super) fn output_count(bytes: &[u8]) -> usize {
    Unpacker::new(bytes, "packed-outputs").u32().unwrap_or(0)
}

/// Reads the `packed-outputs` a guest returned, in place: at most `max`
/// records (a count above it is refused before anything is read).
pub(super) fn unpack_outputs(bytes: Vec<u8>, max: usize) -> Result<Outputs, Malformed> {
    let mut packed = Unpacker::new(&bytes, "packed-outputs");
    let count = packed.u32()?;
    if count > max {
        return Err(packed.malformed(format!("{count} records, more than the {max} this batch may have")));
    }
    // A record takes at least five bytes: the count cannot claim room the
    // string does not have.
    let mut records = Vec::with_capacity(count.min(bytes.len() / 5));
    for _ in 0..count {
        let flags = packed.u8()?;
        if flags & !(HAS_KEY | HAS_VALUE | HAS_TOPIC) != 0 {
            return Err(packed.malformed(format!("flags {flags:#04x} at byte {}", packed.at - 1)));
        }
        let topic = match flags & HAS_TOPIC {
            0 => None,
            _ => Some(packed.text_span()?),
        };
        let key = match flags & HAS_KEY {
            0 => None,
            _ => Some(packed.span()?),
        };
        let value = match flags & HAS_VALUE {
            0 => None,
            _ => Some(packed.span()?),
        };
        let headers = packed.at;
        for _ in 0..packed.u32()? {
            packed.text()?;
            packed.bytes()?;
        }
        records.push(Spans { topic, key, value, headers });
    }
    packed.finish()?;
    Ok(Outputs::from_checked(bytes, records))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Header;

    fn record(topic: &str, key: Option<&[u8]>, value: Option<&[u8]>, timestamp: Option<i64>) -> InputRecord {
        InputRecord {
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            headers: Vec::new(),
            timestamp,
            topic: topic.to_owned(),
            partition: 7,
            offset: 0,
        }
    }

    /// The layout, byte by byte, as `packed-batch` documents it.
    #[test]
    fn packs_the_documented_layout() {
        let mut first = record("in", Some(b"k"), Some(b"vv"), Some(-2));
        first.offset = 5;
        first.headers = vec![Header { key: "h".into(), value: b"x".to_vec() }];
        let mut second = record("other", None, None, None);
        second.offset = 6;
        let mut third = record("in", Some(b""), None, Some(1));
        third.offset = 7;
        let mut out = vec![0xAA; 3];
        pack(7, &[first, second, third], &mut out);

        let mut want = Vec::new();
        want.extend_from_slice(&7i32.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(b"in");
        want.extend_from_slice(&5u32.to_le_bytes());
        want.extend_from_slice(b"other");
        want.extend_from_slice(&3u32.to_le_bytes());
        // in-5: key, value, timestamp, one header.
        want.push(1 | 2 | 4);
        want.extend_from_slice(&0u32.to_le_bytes());
        want.extend_from_slice(&5i64.to_le_bytes());
        want.extend_from_slice(&(-2i64).to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(b"k");
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(b"vv");
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(b"h");
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(b"x");
        // other-6: nothing but its coordinates.
        want.push(0);
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&6i64.to_le_bytes());
        want.extend_from_slice(&0u32.to_le_bytes());
        // in-7: an empty key (present), a tombstone.
        want.push(1 | 4);
        want.extend_from_slice(&0u32.to_le_bytes());
        want.extend_from_slice(&7i64.to_le_bytes());
        want.extend_from_slice(&1i64.to_le_bytes());
        want.extend_from_slice(&0u32.to_le_bytes());
        want.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(out, want);
    }

    #[test]
    fn unpacks_what_it_is_given_and_names_what_is_wrong() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&len32(2));
        put_bytes(&mut bytes, b"key");
        bytes.push(1);
        put_bytes(&mut bytes, b"");
        bytes.push(0);
        let mut reader = Unpacker::new(&bytes, "entries");
        assert_eq!(reader.u32().expect("count"), 2);
        assert_eq!(reader.bytes().expect("key"), b"key");
        assert_eq!(reader.optional_bytes().expect("value"), Some(&b""[..]));
        assert_eq!(reader.optional_bytes().expect("none"), None);
        reader.finish().expect("all read");

        let mut reader = Unpacker::new(&bytes[..10], "entries");
        reader.u32().expect("count");
        assert_eq!(reader.bytes().expect_err("cut").to_string(), "malformed entries: 3 bytes wanted at byte 8 of 10");
        let mut reader = Unpacker::new(&[2, 0xff], "keys");
        assert_eq!(
            reader.optional_bytes().expect_err("2").to_string(),
            "malformed keys: 2 at byte 0 where 0 or 1 was due"
        );
        assert_eq!(reader.finish().expect_err("left over").to_string(), "malformed keys: 1 bytes left over");
        let huge = [0xff, 0xff, 0xff, 0xff];
        assert!(Unpacker::new(&huge, "keys").bytes().is_err(), "a length past the end");
    }

    #[test]
    fn an_empty_batch_is_its_header() {
        let mut out = Vec::new();
        pack(0, &[], &mut out);
        assert_eq!(out, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    /// `packed-outputs` as the WIT documents it: one record of each shape.
    #[test]
    fn unpacks_the_documented_outputs() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&3u32.to_le_bytes());
        // Key and value, default topic, one header.
        bytes.push(1 | 2);
        put_bytes(&mut bytes, b"k");
        put_bytes(&mut bytes, b"vv");
        bytes.extend_from_slice(&1u32.to_le_bytes());
        put_bytes(&mut bytes, b"h");
        put_bytes(&mut bytes, b"x");
        // A tombstone with an empty key, to a named topic.
        bytes.push(1 | 4);
        put_bytes(&mut bytes, b"other");
        put_bytes(&mut bytes, b"");
        bytes.extend_from_slice(&0u32.to_le_bytes());
        // Nothing at all.
        bytes.push(0);
        bytes.extend_from_slice(&0u32.to_le_bytes());

        let outputs = unpack_outputs(bytes, 3).expect("well formed").into_records();
        assert_eq!(outputs.len(), 3);
        assert_eq!(outputs[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(outputs[0].value.as_deref(), Some(&b"vv"[..]));
        assert_eq!(outputs[0].topic, None);
        assert_eq!(outputs[0].headers.len(), 1);
        assert_eq!((outputs[0].headers[0].key.as_str(), &outputs[0].headers[0].value[..]), ("h", &b"x"[..]));
        assert_eq!(outputs[1].key.as_deref(), Some(&b""[..]));
        assert_eq!(outputs[1].value, None);
        assert_eq!(outputs[1].topic.as_deref(), Some("other"));
        assert_eq!((outputs[2].key.as_ref(), outputs[2].value.as_ref(), outputs[2].headers.len()), (None, None, 0));
        assert!(unpack_outputs(0u32.to_le_bytes().to_vec(), 0).expect("none").is_empty());
    }

    /// What a guest gets wrong fails the batch, named; nothing is read past
    /// the end or allocated for a count the string cannot hold.
    #[test]
    fn refuses_malformed_outputs() {
        let error = |bytes: &[u8], max: usize| unpack_outputs(bytes.to_vec(), max).expect_err("malformed").to_string();
        let mut one = 1u32.to_le_bytes().to_vec();
        one.push(2);
        put_bytes(&mut one, b"v");
        one.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(unpack_outputs(one.clone(), 1).expect("one").len(), 1);
        assert_eq!(error(&one, 0), "malformed packed-outputs: 1 records, more than the 0 this batch may have");
        let mut trailing = one.clone();
        trailing.push(0);
        assert_eq!(error(&trailing, 1), "malformed packed-outputs: 1 bytes left over");
        assert_eq!(error(&one[..6], 1), "malformed packed-outputs: 4 bytes wanted at byte 5 of 6");
        let mut flags = one.clone();
        flags[4] = 8;
        assert_eq!(error(&flags, 1), "malformed packed-outputs: flags 0x08 at byte 4");
        let mut topic = 1u32.to_le_bytes().to_vec();
        topic.push(4);
        put_bytes(&mut topic, &[0xff]);
        topic.extend_from_slice(&0u32.to_le_bytes());
        assert!(error(&topic, 1).starts_with("malformed packed-outputs: text at byte 5 is not UTF-8"));
        // A count of four billion in a string of four bytes.
        assert_eq!(
            error(&u32::MAX.to_le_bytes(), usize::MAX),
            "malformed packed-outputs: 1 bytes wanted at byte 4 of 4"
        );
    }
}
