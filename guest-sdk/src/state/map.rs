//! [`MapState`]: a map from map keys to JSON values, per record key.

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use serde::de::IgnoredAny;

use super::ttl::Ttl;
use super::{keys, store};
use crate::error::{Error, Result};

/// Entries asked for per `scan-prefix` call.
const PAGE: u32 = 1024;

/// A map key's bytes, appended to the state key after the record key.
///
/// The encodings are part of the cross-language key layout:
/// `str`/`String` as UTF-8, `[u8]`/`Vec<u8>` as is, unsigned integers
/// big-endian, signed integers big-endian with the sign bit flipped. So a
/// map's [`entries`](MapState::entries) come back in key order, numerically
/// for integers.
pub trait MapKey {
    /// Appends the key's bytes to `out`.
    fn encode_map_key(&self, out: &mut Vec<u8>);
}

/// A [`MapKey`] that can be read back from its bytes.
pub trait DecodeMapKey: MapKey + Sized {
    /// Decodes the bytes [`MapKey::encode_map_key`] wrote.
    fn decode_map_key(bytes: &[u8]) -> Result<Self>;
}

impl MapKey for str {
    fn encode_map_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl MapKey for String {
    fn encode_map_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl DecodeMapKey for String {
    fn decode_map_key(bytes: &[u8]) -> Result<Self> {
        Ok(std::str::from_utf8(bytes)?.to_owned())
    }
}

impl MapKey for [u8] {
    fn encode_map_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl MapKey for Vec<u8> {
    fn encode_map_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl DecodeMapKey for Vec<u8> {
    fn decode_map_key(bytes: &[u8]) -> Result<Self> {
        Ok(bytes.to_vec())
    }
}

macro_rules! int_map_key {
    ($($ty:ty => $flip:expr),* $(,)?) => {$(
        impl MapKey for $ty {
            fn encode_map_key(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&(*self ^ $flip).to_be_bytes());
            }
        }

        impl DecodeMapKey for $ty {
            fn decode_map_key(bytes: &[u8]) -> Result<Self> {
                let bytes = bytes.try_into().map_err(|_| {
                    Error::new(format!(
                        "map key of {} bytes is not a {}",
                        bytes.len(),
                        stringify!($ty)
                    ))
                })?;
                Ok(<$ty>::from_be_bytes(bytes) ^ $flip)
            }
        }
    )*};
}

int_map_key!(
    u8 => 0, u16 => 0, u32 => 0, u64 => 0, u128 => 0,
    i8 => i8::MIN, i16 => i16::MIN, i32 => i32::MIN, i64 => i64::MIN, i128 => i128::MIN,
);

/// A map per record key, each entry stored as its own state entry under
/// `name 0x00 u32-be(len(key)) key map-key`, the value as JSON.
///
/// Point reads and writes go through the state cache like
/// [`ValueState`](crate::ValueState). [`entries`](MapState::entries) and
/// [`clear`](MapState::clear) page through the host's `scan-prefix`
/// (1024 entries a call), after flushing the batch's pending writes.
///
/// ```
/// # fn main() -> sluice_guest::Result<()> {
/// use sluice_guest::MapState;
///
/// const CART: MapState<String, u32> = MapState::new("cart");
///
/// CART.set("user-1", "apple", &2)?;
/// CART.set("user-1", "pear", &1)?;
/// assert_eq!(CART.get("user-1", "apple")?, Some(2));
/// CART.remove("user-1", "apple")?;
/// assert_eq!(CART.entries("user-1")?, [("pear".to_string(), 1)]);
/// # Ok(())
/// # }
/// ```
pub struct MapState<K, V> {
    name: &'static str,
    ttl: Ttl,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> MapState<K, V> {
    /// A handle on the state called `name` (same rules as
    /// [`ValueState::new`](crate::ValueState::new)).
    pub const fn new(name: &'static str) -> Self {
        MapState { name, ttl: Ttl::NONE, _types: PhantomData }
    }

    /// The same state with a time-to-live per entry: an entry expires `ttl`
    /// of processing time after it was last written, is never returned
    /// after that (not by `get`, `entries` or `keys`), and is removed from
    /// the store (see [`ValueState::with_ttl`](crate::ValueState::with_ttl)).
    pub const fn with_ttl(self, ttl: std::time::Duration) -> Self {
        MapState { ttl: Ttl::of(ttl), ..self }
    }

    /// The state's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<K: DecodeMapKey, V: Serialize + DeserializeOwned> MapState<K, V> {
    pub(crate) fn entry_key<Q: MapKey + ?Sized>(&self, key: &[u8], map_key: &Q) -> Result<Vec<u8>> {
        let mut k = keys::map_prefix(self.name, key, 16)?;
        map_key.encode_map_key(&mut k);
        Ok(k)
    }

    /// The value under `map_key` in `key`'s map, if any.
    pub fn get<Q>(&self, key: impl AsRef<[u8]>, map_key: &Q) -> Result<Option<V>>
    where
        K: Borrow<Q>,
        Q: MapKey + ?Sized,
    {
        let k = self.entry_key(key.as_ref(), map_key)?;
        store::with(|s| s.read_with(&k, |v| v.map(|v| self.ttl.decode(self.name, v)).transpose())).map(Option::flatten)
    }

    /// Stores `value` under `map_key` in `key`'s map.
    pub fn set<Q>(&self, key: impl AsRef<[u8]>, map_key: &Q, value: &V) -> Result<()>
    where
        K: Borrow<Q>,
        Q: MapKey + ?Sized,
    {
        let k = self.entry_key(key.as_ref(), map_key)?;
        let v = self.ttl.encode(self.name, &k, value)?;
        store::with(|s| {
            s.write(k, Some(v));
            Ok(())
        })
    }

    /// Replaces the value under `map_key` in `key`'s map with `f` of the
    /// current one (`None` when absent), and returns it: one key built,
    /// where a [`get`](Self::get) and a [`set`](Self::set) build two.
    pub fn update<Q>(&self, key: impl AsRef<[u8]>, map_key: &Q, f: impl FnOnce(Option<V>) -> V) -> Result<V>
    where
        K: Borrow<Q>,
        Q: MapKey + ?Sized,
    {
        keys::with_key_scratch(|k| {
            keys::map_prefix_into(self.name, key.as_ref(), k)?;
            map_key.encode_map_key(k);
            super::update_entry(self.name, self.ttl, k, f)
        })
    }

    /// [`update`](Self::update) of the entry whose whole key (as
    /// [`entry_key`](Self::entry_key) builds it) is `entry`.
    pub(crate) fn update_entry(&self, entry: &[u8], f: impl FnOnce(Option<V>) -> V) -> Result<V> {
        super::update_entry(self.name, self.ttl, entry, f)
    }

    /// Removes `map_key` from `key`'s map.
    pub fn remove<Q>(&self, key: impl AsRef<[u8]>, map_key: &Q) -> Result<()>
    where
        K: Borrow<Q>,
        Q: MapKey + ?Sized,
    {
        let k = self.entry_key(key.as_ref(), map_key)?;
        store::with(|s| {
            s.write(k, None);
            Ok(())
        })
    }

    /// All entries of `key`'s map, in map-key byte order.
    pub fn entries(&self, key: impl AsRef<[u8]>) -> Result<Vec<(K, V)>> {
        let mut out = Vec::new();
        self.scan(key.as_ref(), |map_key, value| {
            if let Some(value) = self.ttl.decode(self.name, value)? {
                out.push((K::decode_map_key(map_key)?, value));
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The map keys of `key`'s map, in byte order.
    pub fn keys(&self, key: impl AsRef<[u8]>) -> Result<Vec<K>> {
        let mut out = Vec::new();
        self.scan(key.as_ref(), |map_key, value| {
            // Only an entry with a TTL needs its value read to know it is alive.
            if !self.ttl.is_set() || self.ttl.decode::<IgnoredAny>(self.name, value)?.is_some() {
                out.push(K::decode_map_key(map_key)?);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Removes every entry of `key`'s map.
    pub fn clear(&self, key: impl AsRef<[u8]>) -> Result<()> {
        let prefix = keys::map_prefix(self.name, key.as_ref(), 0)?;
        let mut doomed = Vec::new();
        self.scan(key.as_ref(), |map_key, _| {
            let mut k = prefix.clone();
            k.extend_from_slice(map_key);
            doomed.push(k);
            Ok(())
        })?;
        store::with(|s| {
            for k in doomed {
                s.write(k, None);
            }
            Ok(())
        })
    }

    /// Calls `f(map_key, value)` for every entry of `key`'s map, paging
    /// through `scan-prefix`.
    fn scan(&self, key: &[u8], mut f: impl FnMut(&[u8], &[u8]) -> Result<()>) -> Result<()> {
        let prefix = keys::map_prefix(self.name, key, 0)?;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = store::with(|s| Ok(s.scan(&prefix, after.as_deref(), PAGE)))?;
            let full = page.len() >= PAGE as usize;
            for (k, v) in page {
                let in_order = after.as_deref().is_none_or(|a| k.as_slice() > a);
                let Some(map_key) = k.strip_prefix(prefix.as_slice()).filter(|_| in_order) else {
                    return Err(Error::new(format!(
                        "host bug: state.scan-prefix returned a key out of order or outside the prefix (state `{}`)",
                        self.name
                    )));
                };
                f(map_key, &v).map_err(|e| e.context(format_args!("state `{}`", self.name)))?;
                after = Some(k);
            }
            if !full {
                return Ok(());
            }
        }
    }
}

impl<K, V> Clone for MapState<K, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, V> Copy for MapState<K, V> {}

impl<K, V> fmt::Debug for MapState<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("MapState").field(&self.name).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{calls, reset};
    use super::*;

    fn bytes<K: MapKey + ?Sized>(k: &K) -> Vec<u8> {
        let mut out = Vec::new();
        k.encode_map_key(&mut out);
        out
    }

    #[test]
    fn integer_keys_sort_numerically() {
        let mut ks: Vec<i64> = vec![5, -1, i64::MIN, 0, i64::MAX, -300];
        let mut encoded: Vec<_> = ks.iter().map(bytes).collect();
        encoded.sort();
        ks.sort();
        let decoded: Vec<i64> = encoded.iter().map(|b| i64::decode_map_key(b).unwrap()).collect();
        assert_eq!(decoded, ks);
        assert_eq!(bytes(&-1_i32), [0x7f, 0xff, 0xff, 0xff]);
        assert_eq!(bytes(&258_u16), [1, 2]);
        assert_eq!(u32::decode_map_key(&[1, 2]).unwrap_err().message(), "map key of 2 bytes is not a u32");
        assert!(String::decode_map_key(&[0xff]).is_err());
    }

    #[test]
    fn layout_and_operations() {
        reset();
        const M: MapState<String, u32> = MapState::new("m");
        M.set("u", "b", &2).unwrap();
        M.set("u", "a", &1).unwrap();
        M.set("uu", "x", &9).unwrap();
        M.set("u", &"c".to_string(), &3).unwrap();
        M.remove("u", "c").unwrap();
        assert_eq!(M.get("u", "a").unwrap(), Some(1));
        assert_eq!(calls().total(), 0, "all served by the cache");
        assert_eq!(M.entries("u").unwrap(), [("a".to_string(), 1), ("b".to_string(), 2)]);
        assert_eq!(calls().write, 1, "the scan flushed pending writes first");
        assert_eq!(M.keys("uu").unwrap(), ["x"]);
        super::super::store::with(|s| {
            assert!(s.backend().map.contains_key(&b"m\0\0\0\0\x01ua"[..]));
            assert!(s.backend().map.contains_key(&b"m\0\0\0\0\x02uux"[..]));
            Ok(())
        })
        .unwrap();
        M.clear("u").unwrap();
        assert!(M.entries("u").unwrap().is_empty());
        assert_eq!(M.entries("uu").unwrap().len(), 1);
    }

    #[test]
    fn update_folds_into_the_current_value() {
        reset();
        const M: MapState<i64, u32> = MapState::new("w");
        assert_eq!(M.update("k", &-5, |old| old.unwrap_or(0) + 1).unwrap(), 1);
        assert_eq!(M.update("k", &-5, |old| old.unwrap_or(0) + 1).unwrap(), 2);
        assert_eq!(M.update("k", &7, |old| old.map_or(10, |n| n * 2)).unwrap(), 10);
        assert_eq!(M.get("k", &-5).unwrap(), Some(2));
        assert_eq!(M.entries("k").unwrap(), [(-5, 2), (7, 10)]);
    }

    #[test]
    fn entries_page_through_large_maps() {
        reset();
        const M: MapState<u32, u32> = MapState::new("big");
        let n = PAGE * 2 + 7;
        for i in 0..n {
            M.set("k", &i, &i).unwrap();
        }
        let entries = M.entries("k").unwrap();
        assert_eq!(entries.len(), n as usize);
        assert!(entries.iter().enumerate().all(|(i, (k, v))| *k as usize == i && k == v));
        assert_eq!(calls().scan_prefix, 3);
        M.clear("k").unwrap();
        assert!(M.keys("k").unwrap().is_empty());
    }
}
