//! The byte layout of state keys. Other language SDKs must produce the same
//! bytes, so this file and the "Key layout" section of the crate docs change
//! together or not at all.
//!
//! - value and list state: `name 0x00 user-key`
//! - map state: `name 0x00 u32-be(len(user-key)) user-key map-key`

use std::cell::Cell;

use crate::error::{Error, Result};

/// Checks a state name: non-empty, no 0x00 byte.
#[inline]
pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.as_bytes().contains(&0) {
        return Err(bad_name(name));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn bad_name(name: &str) -> Error {
    if name.is_empty() {
        return Error::new("state name must not be empty");
    }
    Error::new(format!("state name \"{}\" must not contain a 0x00 byte", name.replace('\0', "\\0")))
}

/// `name 0x00 key`: the key of a [`ValueState`](super::ValueState) or
/// [`ListState`](super::ListState) entry.
pub(crate) fn value_key(name: &str, key: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(name.len() + 1 + key.len());
    value_key_into(name, key, &mut out)?;
    Ok(out)
}

/// [`value_key`], appended to `out`.
#[inline]
pub(crate) fn value_key_into(name: &str, key: &[u8], out: &mut Vec<u8>) -> Result<()> {
    check_name(name)?;
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.extend_from_slice(key);
    Ok(())
}

/// `name 0x00 u32-be(len(key)) key`: the prefix shared by all entries of one
/// record key's map in a [`MapState`](super::MapState). `spare` extra bytes
/// are reserved for the map key that usually follows.
pub(crate) fn map_prefix(name: &str, key: &[u8], spare: usize) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(name.len() + 5 + key.len() + spare);
    map_prefix_into(name, key, &mut out)?;
    Ok(out)
}

/// [`map_prefix`], appended to `out`.
pub(crate) fn map_prefix_into(name: &str, key: &[u8], out: &mut Vec<u8>) -> Result<()> {
    check_name(name)?;
    let len = u32::try_from(key.len())
        .map_err(|_| Error::new(format!("state `{name}`: key of {} bytes is too long for a map key", key.len())))?;
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(key);
    Ok(())
}

thread_local! {
    static KEY_SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    static VALUE_SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Runs `f` with an empty buffer that keeps its capacity from call to call,
/// for the state key of a read-modify-write: building it in a fresh `Vec`
/// per record, and freeing it again, was a good part of the guest's
/// allocator time. A nested call (from inside `f`) gets a buffer of its own.
pub(crate) fn with_key_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    with_scratch(&KEY_SCRATCH, f)
}

/// [`with_key_scratch`] for the encoded value.
pub(crate) fn with_value_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    with_scratch(&VALUE_SCRATCH, f)
}

fn with_scratch<R>(cell: &'static std::thread::LocalKey<Cell<Vec<u8>>>, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    let mut buf = cell.take();
    buf.clear();
    let result = f(&mut buf);
    cell.set(buf);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        assert_eq!(value_key("count", b"user-1").unwrap(), b"count\0user-1");
        assert_eq!(value_key("c", b"").unwrap(), b"c\0");
        assert_eq!(map_prefix("m", b"ab", 0).unwrap(), b"m\0\0\0\0\x02ab");
        assert_eq!(map_prefix("m", b"", 0).unwrap(), b"m\0\0\0\0\0");
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(value_key("", b"k").unwrap_err().message(), "state name must not be empty");
        assert_eq!(
            map_prefix("a\0b", b"k", 0).unwrap_err().message(),
            "state name \"a\\0b\" must not contain a 0x00 byte"
        );
    }

    #[test]
    fn scratch_buffers_are_reused_and_nest() {
        let first = with_key_scratch(|k| {
            k.extend_from_slice(b"abc");
            // A nested call does not see (or clobber) the outer buffer.
            with_key_scratch(|inner| {
                assert!(inner.is_empty());
                inner.push(1);
            });
            assert_eq!(k, b"abc");
            k.as_ptr()
        });
        let second = with_key_scratch(|k| {
            assert!(k.is_empty(), "handed out empty");
            k.as_ptr()
        });
        assert_eq!(first, second, "the same allocation, kept");
    }

    #[test]
    fn map_prefixes_do_not_overlap() {
        // Without the length, user key "a" + map key "b" would equal user key "ab".
        let a = map_prefix("m", b"a", 0).unwrap();
        let ab = map_prefix("m", b"ab", 0).unwrap();
        assert!(!ab.starts_with(&a) && !a.starts_with(&ab));
    }
}
