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
    serde_json::from_slice(bytes).map_err(|e| Error::from(e).context(format_args!("state `{name}`")))
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
