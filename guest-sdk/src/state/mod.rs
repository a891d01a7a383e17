//! Typed, keyed state over the host's byte-oriented `state` interface.
//!
//! - [`ValueState`]: one value per record key (a counter, the last event).
//! - [`MapState`]: a map per record key, one state entry per map entry.
//! - [`ListState`]: a short list per record key, one JSON array.
//!
//! Values are JSON (serde_json) so other languages' SDKs can read them; the
//! key layout is in the [crate docs](crate#key-layout) and in `keys.rs`. Every
//! call goes through the write-back cache in `store.rs`; nothing
//! here talks to the host directly.
//!
//! Never hold on to state across batches in the transform itself: the host
//! may roll state back to a checkpoint between batches.
//!
//! # Time-to-live
//!
//! [`ValueState::with_ttl`] and [`MapState::with_ttl`] make entries expire a
//! fixed processing time after they were last written: an expired entry is
//! never returned, and a processing-time timer removes it from the store
//! soon after (within about a second), so state bytes go down. The stored
//! value is then `[expires_at_ms, value]`, and the timer's key is `0x00
//! "ttl" 0x00` followed by the entry's key: the SDK handles those timers
//! itself before [`Transform::on_timer`](crate::Transform::on_timer) sees
//! any other.

mod backend;
pub(crate) mod keys;
mod list;
mod map;
pub(crate) mod store;
pub(crate) mod ttl;
mod value;

pub use list::ListState;
pub use map::{DecodeMapKey, MapKey, MapState};
pub use value::ValueState;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

pub(crate) fn decode<T: DeserializeOwned>(name: &str, bytes: &[u8]) -> Result<T> {
    // A counter's value, the most common state there is, without the JSON
    // parser: `T` sees `visit_u64`, as serde_json would show it; any type
    // that does not take it goes through serde_json, for its error.
    if let Some(n) = plain_u64(bytes)
        && let Ok(value) = T::deserialize(serde::de::value::U64Deserializer::<serde::de::value::Error>::new(n))
    {
        return Ok(value);
    }
    serde_json::from_slice(bytes).map_err(|e| Error::from(e).context(format_args!("state `{name}`")))
}

/// `bytes` as a non-negative JSON integer that fits a `u64`: 1 to 19 digits,
/// no leading zero (which JSON forbids); `None` for anything else.
#[inline]
fn plain_u64(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 19 || (bytes[0] == b'0' && bytes.len() > 1) {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0')))
}

fn encode<T: Serialize + ?Sized>(name: &str, value: &T) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(name, value, &mut out)?;
    Ok(out)
}

/// [`encode`], appended to `out`.
fn encode_into<T: Serialize + ?Sized>(name: &str, value: &T, out: &mut Vec<u8>) -> Result<()> {
    serde_json::to_writer(out, value).map_err(|e| Error::from(e).context(format_args!("state `{name}`")))
}

/// Replaces the entry stored under `k` (a value or map entry of state
/// `name`, with time-to-live `ttl`) with `f` of its current value, and
/// returns the new one. `f` runs outside the store: it may use state itself.
/// Allocates nothing when the batch's cache holds `k` already (a prefetched
/// key): the value is encoded into a reused buffer and copied over the
/// cached one.
fn update_entry<T: Serialize + DeserializeOwned>(
    name: &str,
    ttl: ttl::Ttl,
    k: &[u8],
    f: impl FnOnce(Option<T>) -> T,
) -> Result<T> {
    let (current, at) = store::with(|s| {
        let (current, at) = s.read_at(k, |v| v.map(|v| ttl.decode(name, v)).transpose());
        Ok((current?, at))
    })?;
    let new = f(current.flatten());
    keys::with_value_scratch(|v| {
        ttl.encode_into(name, k, &new, v)?;
        store::with(|s| {
            s.write_from(at, k, Some(v));
            Ok(())
        })
    })?;
    Ok(new)
}

#[cfg(test)]
pub(crate) mod tests {
    #[test]
    fn plain_integers_decode_as_serde_json_decodes_them() {
        use serde_json::Value;
        for text in
            ["0", "7", "42", "9999999999999999999", "18446744073709551615", "007", "-3", "1.5", "1e3", " 1", "", "x"]
        {
            let json = serde_json::from_slice::<Value>(text.as_bytes()).ok();
            assert_eq!(super::decode::<Value>("s", text.as_bytes()).ok(), json, "{text:?} as a JSON value");
            let json = serde_json::from_slice::<u64>(text.as_bytes()).ok();
            assert_eq!(super::decode::<u64>("s", text.as_bytes()).ok(), json, "{text:?} as a u64");
            let json = serde_json::from_slice::<f64>(text.as_bytes()).ok();
            assert_eq!(super::decode::<f64>("s", text.as_bytes()).ok(), json, "{text:?} as an f64");
            let json = serde_json::from_slice::<u8>(text.as_bytes()).ok();
            assert_eq!(super::decode::<u8>("s", text.as_bytes()).ok(), json, "{text:?} as a u8");
        }
        // A type that does not take an integer still gets serde_json's error.
        let e = super::decode::<String>("s", b"5").unwrap_err();
        assert!(e.message().starts_with("state `s`: invalid JSON"), "{e}");
        let e = super::decode::<Option<Vec<u8>>>("s", b"5").unwrap_err();
        assert!(e.message().starts_with("state `s`"), "{e}");
        assert_eq!(super::decode::<Option<u64>>("s", b"5").unwrap(), Some(5));
    }

    use super::backend::Calls;
    use super::store;

    /// Empties this thread's (in-memory) store and its call counts.
    pub(crate) fn reset() {
        store::with(|s| {
            s.discard();
            *s = store::Store::new(super::backend::Memory::new());
            Ok(())
        })
        .unwrap();
    }

    /// The calls this thread's store has made so far.
    pub(crate) fn calls() -> Calls {
        store::with(|s| Ok(s.backend().calls)).unwrap()
    }
}
