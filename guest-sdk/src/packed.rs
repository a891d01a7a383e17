//! The packed byte strings of WIT 0.1.3 and 0.1.5 (layouts in
//! `wit/sluice.wit`): [`Reader`] reads a `packed-batch` or a
//! `get-many-packed` result in place, [`put`] writes the length-prefixed
//! parts of `get-many-packed` keys and `write-packed` entries, and
//! [`pack_outputs`] a batch's `packed-outputs`. Little-endian, `u32` counts
//! and lengths.

use crate::bindings::OutputRecord;
use crate::error::{Error, Result};

/// Packs output records as `packed-outputs`: a count, then per record a
/// flags byte (1: key, 2: value, 4: topic), the topic, key and value when
/// present, and the headers.
pub(crate) fn pack_outputs(records: &[OutputRecord]) -> Vec<u8> {
    let size: usize = records
        .iter()
        .map(|r| {
            17 + r.topic.as_ref().map_or(0, String::len)
                + r.key.as_ref().map_or(0, Vec::len)
                + r.value.as_ref().map_or(0, Vec::len)
                + r.headers.iter().map(|h| 8 + h.key.len() + h.value.len()).sum::<usize>()
        })
        .sum();
    let mut out = Vec::with_capacity(4 + size);
    out.extend_from_slice(&len32(records.len()).to_le_bytes());
    for record in records {
        let flags = u8::from(record.key.is_some())
            | u8::from(record.value.is_some()) << 1
            | u8::from(record.topic.is_some()) << 2;
        out.push(flags);
        if let Some(topic) = &record.topic {
            put(&mut out, topic.as_bytes());
        }
        if let Some(key) = &record.key {
            put(&mut out, key);
        }
        if let Some(value) = &record.value {
            put(&mut out, value);
        }
        out.extend_from_slice(&len32(record.headers.len()).to_le_bytes());
        for header in &record.headers {
            put(&mut out, header.key.as_bytes());
            put(&mut out, &header.value);
        }
    }
    out
}

/// Appends `bytes` with its `u32` length in front.
pub(crate) fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&len32(bytes.len()).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A count or length as the format's `u32`. What a guest packs lives in its
/// own memory, which is far below 4 GiB, so this never saturates in practice.
pub(crate) fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Reads a packed string front to back; errors name it (`what`).
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Reads `bytes` (a `what`) from byte `at`.
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { bytes, at: 0, what }
    }

    /// Reads a packed batch from byte `at`.
    pub(crate) fn batch_at(bytes: &'a [u8], at: usize) -> Self {
        Reader { bytes, at, what: "packed batch" }
    }

    /// Where the next read starts.
    pub(crate) fn position(&self) -> usize {
        self.at
    }

    fn malformed(&self, detail: std::fmt::Arguments<'_>) -> Error {
        Error::new(format!("malformed {}: {detail}", self.what))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let part = self.at.checked_add(n).and_then(|end| self.bytes.get(self.at..end)).ok_or_else(|| {
            self.malformed(format_args!("{n} bytes wanted at byte {} of {}", self.at, self.bytes.len()))
        })?;
        self.at += n;
        Ok(part)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A length-prefixed byte string.
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()?;
        self.take(n as usize)
    }

    /// A byte `0` (none) or `1` and a length-prefixed byte string (some).
    pub(crate) fn optional_bytes(&mut self) -> Result<Option<&'a [u8]>> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.bytes().map(Some),
            other => Err(self.malformed(format_args!("{other} at byte {} where 0 or 1 was due", self.at - 1))),
        }
    }

    /// A length-prefixed byte string, as its span.
    pub(crate) fn span(&mut self) -> Result<(u32, u32)> {
        let n = self.u32()?;
        let start = self.at;
        self.take(n as usize)?;
        // Below `u32::MAX`: the buffer came through a `list<u8>`.
        Ok((start as u32, self.at as u32))
    }

    /// A length-prefixed UTF-8 string, which the errors call `part`.
    pub(crate) fn text(&mut self, part: &str) -> Result<&'a str> {
        let bytes = self.bytes()?;
        std::str::from_utf8(bytes).map_err(|e| self.malformed(format_args!("{part} is not UTF-8 ({e})")))
    }

    /// Checks that nothing follows what was read.
    pub(crate) fn finish(&self) -> Result<()> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            left => Err(self.malformed(format_args!("{left} bytes left over"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bindings::sluice::transform::types::Header;

    /// `packed-outputs` byte by byte, as `wit/sluice.wit` documents it and
    /// the host's `runtime::packed::unpack_outputs` reads it.
    #[test]
    fn outputs_pack_to_the_documented_layout() {
        let records = [
            OutputRecord {
                key: Some(b"k".to_vec()),
                value: Some(b"vv".to_vec()),
                headers: vec![Header { key: "h".into(), value: b"x".to_vec() }],
                topic: None,
            },
            OutputRecord { key: Some(Vec::new()), value: None, headers: Vec::new(), topic: Some("other".into()) },
            OutputRecord { key: None, value: None, headers: Vec::new(), topic: None },
        ];
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
        assert_eq!(pack_outputs(&records), want);
        assert_eq!(pack_outputs(&[]), 0u32.to_le_bytes());
    }
}
