//! The packed byte strings of WIT 0.1.3 and 0.1.5 (layouts in
//! `wit/sluice.wit`): [`Reader`] reads a `packed-batch` or a
//! `get-many-packed` result in place, and [`put`] writes the
//! length-prefixed parts of `get-many-packed` keys, `write-packed` entries
//! and `packed-outputs` (which the [`Emitter`](crate::Emitter) writes).
//! Little-endian, `u32` counts and lengths.

use crate::error::{Error, Result};

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

    // Out of line: the readers below are inlined into the batch's decode
    // loop, which a formatting error path inside each would bloat.
    #[cold]
    #[inline(never)]
    fn malformed(&self, detail: std::fmt::Arguments<'_>) -> Error {
        Error::new(format!("malformed {}: {detail}", self.what))
    }

    #[inline(always)]
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let Some(part) = self.at.checked_add(n).and_then(|end| self.bytes.get(self.at..end)) else {
            return Err(self.malformed(format_args!("{n} bytes wanted at byte {} of {}", self.at, self.bytes.len())));
        };
        self.at += n;
        Ok(part)
    }

    #[inline(always)]
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    #[inline(always)]
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    #[inline(always)]
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    #[inline(always)]
    pub(crate) fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A length-prefixed byte string.
    #[inline(always)]
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()?;
        self.take(n as usize)
    }

    /// A byte `0` (none) or `1` and a length-prefixed byte string (some).
    #[inline(always)]
    pub(crate) fn optional_bytes(&mut self) -> Result<Option<&'a [u8]>> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.bytes().map(Some),
            other => Err(self.malformed(format_args!("{other} at byte {} where 0 or 1 was due", self.at - 1))),
        }
    }

    /// A length-prefixed byte string, as its span.
    #[inline(always)]
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
