//! The byte layout of state keys. Other language SDKs must produce the same
//! bytes, so this file and the "Key layout" section of the crate docs change
//! together or not at all.
//!
//! - value and list state: `name 0x00 user-key`
//! - map state: `name 0x00 u32-be(len(user-key)) user-key map-key`

use crate::error::{Error, Result};

/// Checks a state name: non-empty, no 0x00 byte.
pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::new("state name must not be empty"));
    }
    if name.as_bytes().contains(&0) {
        return Err(Error::new(format!("state name \"{}\" must not contain a 0x00 byte", name.replace('\0', "\\0"))));
    }
    Ok(())
}

/// `name 0x00 key`: the key of a [`ValueState`](super::ValueState) or
/// [`ListState`](super::ListState) entry.
pub(crate) fn value_key(name: &str, key: &[u8]) -> Result<Vec<u8>> {
    check_name(name)?;
    let mut out = Vec::with_capacity(name.len() + 1 + key.len());
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.extend_from_slice(key);
    Ok(out)
}

/// `name 0x00 u32-be(len(key)) key`: the prefix shared by all entries of one
/// record key's map in a [`MapState`](super::MapState). `spare` extra bytes
/// are reserved for the map key that usually follows.
pub(crate) fn map_prefix(name: &str, key: &[u8], spare: usize) -> Result<Vec<u8>> {
    check_name(name)?;
    let len = u32::try_from(key.len())
        .map_err(|_| Error::new(format!("state `{name}`: key of {} bytes is too long for a map key", key.len())))?;
    let mut out = Vec::with_capacity(name.len() + 5 + key.len() + spare);
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(key);
    Ok(out)
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
    fn map_prefixes_do_not_overlap() {
        // Without the length, user key "a" + map key "b" would equal user key "ab".
        let a = map_prefix("m", b"a", 0).unwrap();
        let ab = map_prefix("m", b"ab", 0).unwrap();
        assert!(!ab.starts_with(&a) && !a.starts_with(&ab));
    }
}
