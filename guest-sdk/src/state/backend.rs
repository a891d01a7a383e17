//! Where state lives: the host's `state` interface, or (natively) memory.
//!
//! [`Backend`] is the one seam between the cache in [`store`](super::store)
//! and the component boundary. On wasm32 it is `Host` (built only there),
//! whose every method is one boundary crossing; natively it is [`Memory`], a
//! map that also counts calls, so the cache and the typed state handles can
//! be tested with `cargo test`.

use smallvec::SmallVec;

use crate::packed::{Reader, len32, put};

/// A state key or value as the cache keeps it: up to 24 bytes inline (a
/// typical key, `count\0user-12345`, and a counter's value), so that the
/// cache allocates nothing for them; longer ones on the heap.
pub(crate) type Bytes = SmallVec<[u8; 24]>;

/// A write the cache sends: a key and its value (`None`: delete).
pub(crate) type Write<'a> = (&'a [u8], Option<&'a [u8]>);

/// The `state` interface, minus `set` and `delete` (the cache only writes in
/// bulk). The host's `get-many` and `write` are the packed ones.
pub(crate) trait Backend {
    /// `state.get`.
    fn get(&mut self, key: &[u8]) -> Option<Vec<u8>>;
    /// `state.get-many`; an error if the host's answer is malformed.
    fn get_many(&mut self, keys: &[&[u8]]) -> crate::error::Result<Vec<Option<Bytes>>>;
    /// `state.write`.
    fn write(&mut self, entries: &[Write<'_>]);
    /// `state.scan-prefix`.
    fn scan_prefix(&mut self, prefix: &[u8], start_after: Option<&[u8]>, limit: u32) -> Vec<(Vec<u8>, Vec<u8>)>;
}

/// The host, through the generated imports.
#[cfg(target_arch = "wasm32")]
#[derive(Debug, Default)]
pub(crate) struct Host;

#[cfg(target_arch = "wasm32")]
impl Host {
    pub(crate) const fn new() -> Self {
        Host
    }
}

#[cfg(target_arch = "wasm32")]
impl Backend for Host {
    fn get(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        crate::bindings::sluice::transform::state::get(key)
    }

    fn get_many(&mut self, keys: &[&[u8]]) -> crate::error::Result<Vec<Option<Bytes>>> {
        // Packed, so that neither side allocates per key on the way.
        let values = crate::bindings::sluice::transform::state::get_many_packed(&pack_keys(keys));
        unpack_values(&values, keys.len())
    }

    fn write(&mut self, entries: &[Write<'_>]) {
        crate::bindings::sluice::transform::state::write_packed(&pack_entries(entries))
    }

    fn scan_prefix(&mut self, prefix: &[u8], start_after: Option<&[u8]>, limit: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
        crate::bindings::sluice::transform::state::scan_prefix(prefix, start_after, limit)
    }
}

/// `keys` as `state.get-many-packed` takes them.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
fn pack_keys(keys: &[&[u8]]) -> Vec<u8> {
    let mut packed = Vec::with_capacity(4 + keys.iter().map(|k| 4 + k.len()).sum::<usize>());
    packed.extend_from_slice(&len32(keys.len()).to_le_bytes());
    keys.iter().for_each(|key| put(&mut packed, key));
    packed
}

/// `entries` as `state.write-packed` takes them.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
fn pack_entries(entries: &[Write<'_>]) -> Vec<u8> {
    let size = entries.iter().map(|(k, v)| 9 + k.len() + v.map_or(0, <[u8]>::len)).sum::<usize>();
    let mut packed = Vec::with_capacity(4 + size);
    packed.extend_from_slice(&len32(entries.len()).to_le_bytes());
    for (key, value) in entries {
        put(&mut packed, key);
        match value {
            None => packed.push(0),
            Some(value) => {
                packed.push(1);
                put(&mut packed, value);
            }
        }
    }
    packed
}

/// The values of a `state.get-many-packed` result for `count` keys; an
/// error if the host's answer does not have that shape (a host bug, which
/// must not pass for absent keys).
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
fn unpack_values(packed: &[u8], count: usize) -> crate::error::Result<Vec<Option<Bytes>>> {
    let mut reader = Reader::new(packed, "get-many-packed result");
    let n = reader.u32()? as usize;
    if n != count {
        return Err(crate::error::Error::new(format!(
            "host bug: state.get-many-packed returned {n} values for {count} keys"
        )));
    }
    let mut values = Vec::with_capacity(n);
    for _ in 0..n {
        values.push(reader.optional_bytes()?.map(Bytes::from_slice));
    }
    reader.finish()?;
    Ok(values)
}

/// An in-memory store that counts the calls a host would have seen.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
#[derive(Debug, Default)]
pub(crate) struct Memory {
    pub(crate) map: std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
    pub(crate) calls: Calls,
}

/// Boundary crossings a host would have seen, by function.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Calls {
    pub(crate) get: usize,
    pub(crate) get_many: usize,
    pub(crate) write: usize,
    pub(crate) scan_prefix: usize,
}

#[cfg(test)]
impl Calls {
    /// All crossings.
    pub(crate) fn total(&self) -> usize {
        self.get + self.get_many + self.write + self.scan_prefix
    }
}

#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
impl Memory {
    pub(crate) const fn new() -> Self {
        Memory {
            map: std::collections::BTreeMap::new(),
            calls: Calls { get: 0, get_many: 0, write: 0, scan_prefix: 0 },
        }
    }
}

impl Backend for Memory {
    fn get(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        self.calls.get += 1;
        self.map.get(key).cloned()
    }

    fn get_many(&mut self, keys: &[&[u8]]) -> crate::error::Result<Vec<Option<Bytes>>> {
        self.calls.get_many += 1;
        Ok(keys.iter().map(|k| self.map.get(*k).map(|v| Bytes::from_slice(v))).collect())
    }

    fn write(&mut self, entries: &[Write<'_>]) {
        self.calls.write += 1;
        for (k, v) in entries {
            match v {
                Some(v) => self.map.insert(k.to_vec(), v.to_vec()),
                None => self.map.remove(*k),
            };
        }
    }

    fn scan_prefix(&mut self, prefix: &[u8], start_after: Option<&[u8]>, limit: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
        use std::ops::Bound;
        self.calls.scan_prefix += 1;
        let lower = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after.to_vec()),
            _ => Bound::Included(prefix.to_vec()),
        };
        self.map
            .range((lower, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit as usize)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

#[cfg(test)]
mod packing_tests {
    use super::*;

    /// The layouts `wit/sluice.wit` gives for `get-many-packed` and
    /// `write-packed`, byte by byte.
    #[test]
    fn packs_keys_and_entries_as_the_wit_says() {
        assert_eq!(pack_keys(&[&b"ab"[..], &[]]), [2, 0, 0, 0, 2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
        let entries: [Write<'_>; 2] = [(b"k", Some(b"v")), (b"d", None)];
        assert_eq!(pack_entries(&entries), [2, 0, 0, 0, 1, 0, 0, 0, b'k', 1, 1, 0, 0, 0, b'v', 1, 0, 0, 0, b'd', 0]);
    }

    #[test]
    fn unpacks_values_and_refuses_a_malformed_answer() {
        let answer = [2, 0, 0, 0, 1, 2, 0, 0, 0, b'h', b'i', 0];
        assert_eq!(unpack_values(&answer, 2).unwrap(), [Some(Bytes::from_slice(b"hi")), None]);
        assert_eq!(
            unpack_values(&answer, 3).unwrap_err().message(),
            "host bug: state.get-many-packed returned 2 values for 3 keys"
        );
        assert!(unpack_values(&answer[..8], 2).unwrap_err().message().starts_with("malformed get-many-packed result"));
        let mut long = answer.to_vec();
        long.push(0);
        assert_eq!(
            unpack_values(&long, 2).unwrap_err().message(),
            "malformed get-many-packed result: 1 bytes left over"
        );
        assert!(unpack_values(&[1, 0, 0, 0, 7], 1).unwrap_err().message().contains("7 at byte 4 where 0 or 1 was due"));
    }
}
