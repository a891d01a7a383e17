//! Where state lives: the host's `state` interface, or (natively) memory.
//!
//! [`Backend`] is the one seam between the cache in [`store`](super::store)
//! and the component boundary. On wasm32 it is [`Host`], whose every method is
//! one boundary crossing; natively it is [`Memory`], a map that also counts
//! calls, so the cache and the typed state handles can be tested with
//! `cargo test`.

/// The `state` interface, minus `set` and `delete` (the cache only writes in
/// bulk).
pub(crate) trait Backend {
    /// `state.get`.
    fn get(&mut self, key: &[u8]) -> Option<Vec<u8>>;
    /// `state.get-many`.
    fn get_many(&mut self, keys: &[Vec<u8>]) -> Vec<Option<Vec<u8>>>;
    /// `state.write`.
    fn write(&mut self, entries: &[(Vec<u8>, Option<Vec<u8>>)]);
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

    fn get_many(&mut self, keys: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
        crate::bindings::sluice::transform::state::get_many(keys)
    }

    fn write(&mut self, entries: &[(Vec<u8>, Option<Vec<u8>>)]) {
        crate::bindings::sluice::transform::state::write(entries)
    }

    fn scan_prefix(&mut self, prefix: &[u8], start_after: Option<&[u8]>, limit: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
        crate::bindings::sluice::transform::state::scan_prefix(prefix, start_after, limit)
    }
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

    fn get_many(&mut self, keys: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
        self.calls.get_many += 1;
        keys.iter().map(|k| self.map.get(k).cloned()).collect()
    }

    fn write(&mut self, entries: &[(Vec<u8>, Option<Vec<u8>>)]) {
        self.calls.write += 1;
        for (k, v) in entries {
            match v {
                Some(v) => self.map.insert(k.clone(), v.clone()),
                None => self.map.remove(k),
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
