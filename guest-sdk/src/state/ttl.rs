//! Time-to-live for [`ValueState`](super::ValueState) and
//! [`MapState`](super::MapState): entries that expire a fixed processing
//! time after they were last written.
//!
//! A state with a TTL stores each value as the JSON array
//! `[expires_at_ms, value]`, and each write also sets a processing-time
//! timer at `expires_at` whose key is [`TIMER_PREFIX`] followed by the
//! entry's state key. Reads treat an entry at or past its expiry as absent,
//! so an expired entry is never returned; when the timer fires, the SDK
//! (before the transform's `on_timer` sees anything) deletes the entry if it
//! has not been written again since, so the state's bytes go down. An entry
//! written again keeps its newer expiry; the older timer then finds it alive
//! and does nothing.
//!
//! Time is the host's processing time as of the start of the call (one
//! boundary crossing per call, cached), so a TTL is wall-clock time since
//! the write, as Flink's state TTL is.

use serde::Serialize;
use serde::de::{DeserializeOwned, IgnoredAny};

use super::{decode, encode_into, store};
use crate::error::Result;
use crate::time::{self, Clock, Timer};

/// The first bytes of the key of every expiry timer: reserved for the SDK
/// (no state name is empty, so window timers never begin with them).
pub(crate) const TIMER_PREFIX: &[u8] = b"\0ttl\0";

/// A state's time-to-live in ms of processing time; 0: entries never expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ttl(pub(crate) i64);

impl Ttl {
    /// No time-to-live.
    pub(crate) const NONE: Ttl = Ttl(0);

    /// A time-to-live of `ttl`.
    pub(crate) const fn of(ttl: std::time::Duration) -> Ttl {
        let ms = ttl.as_millis();
        Ttl(if ms > i64::MAX as u128 { i64::MAX } else { ms as i64 })
    }

    pub(crate) fn is_set(self) -> bool {
        self.0 > 0
    }

    /// The stored form of `value` under the state key `key`; with a TTL,
    /// with its expiry, and its expiry timer set.
    pub(crate) fn encode<T: Serialize>(self, name: &str, key: &[u8], value: &T) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.encode_into(name, key, value, &mut out)?;
        Ok(out)
    }

    /// [`encode`](Self::encode), appended to `out`.
    pub(crate) fn encode_into<T: Serialize>(self, name: &str, key: &[u8], value: &T, out: &mut Vec<u8>) -> Result<()> {
        if !self.is_set() {
            return encode_into(name, value, out);
        }
        let expires_at = time::processing_time().saturating_add(self.0);
        Timer { clock: Clock::Processing, at: expires_at, key: [TIMER_PREFIX, key].concat() }.set()?;
        encode_into(name, &(expires_at, value), out)
    }

    /// The value stored as `bytes`; with a TTL, `None` once it has expired.
    pub(crate) fn decode<T: DeserializeOwned>(self, name: &str, bytes: &[u8]) -> Result<Option<T>> {
        if !self.is_set() {
            return decode(name, bytes).map(Some);
        }
        let (expires_at, value): (i64, T) = decode(name, bytes)?;
        Ok((expires_at > time::processing_time()).then_some(value))
    }
}

/// If `timer` is an expiry timer, deletes its entry unless it was written
/// again with a later expiry, and returns `true`; `false` for any other
/// timer.
pub(crate) fn expire(timer: &Timer) -> Result<bool> {
    let Some(key) = timer.key.strip_prefix(TIMER_PREFIX).filter(|_| timer.clock == Clock::Processing) else {
        return Ok(false);
    };
    let expired = store::with(|s| {
        s.read_with(key, |bytes| {
            Ok(bytes.is_some_and(|bytes| {
                serde_json::from_slice::<(i64, IgnoredAny)>(bytes).is_ok_and(|(expires_at, _)| expires_at <= timer.at)
            }))
        })
    })?;
    if expired {
        store::with(|s| {
            s.write(key.to_vec(), None);
            Ok(())
        })?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::state::{MapState, ValueState};
    use crate::time::testing;

    const SEEN: ValueState<u32> = ValueState::new("seen").with_ttl(Duration::from_millis(100));
    const CART: MapState<String, u32> = MapState::new("cart").with_ttl(Duration::from_millis(100));

    fn reset() {
        crate::state::tests::reset();
        testing::reset();
    }

    /// Ends the call: writes the state back, as the SDK does after a batch.
    fn end_call() {
        store::with(|s| {
            s.finish();
            Ok(())
        })
        .unwrap();
    }

    /// Moves the clock to `now` and fires the due timers as the host would:
    /// returns the timers that were not expiry timers.
    fn advance(now: i64) -> Vec<Timer> {
        testing::set_processing_time(now);
        let others = testing::take_due().into_iter().filter(|t| !expire(t).unwrap()).collect();
        end_call();
        others
    }

    fn stored(key: &[u8]) -> Option<Vec<u8>> {
        store::with(|s| Ok(s.read_with(key, |v| v.map(<[u8]>::to_vec)))).unwrap()
    }

    #[test]
    fn an_expired_value_is_never_returned_and_then_removed() {
        reset();
        testing::set_processing_time(1_000);
        SEEN.set("a", &1).unwrap();
        assert_eq!(SEEN.get("a").unwrap(), Some(1));
        end_call();
        assert_eq!(stored(b"seen\0a").as_deref(), Some(&b"[1100,1]"[..]), "stored with its expiry");

        assert_eq!(advance(1_099), [], "not yet");
        assert_eq!(SEEN.get("a").unwrap(), Some(1));
        testing::set_processing_time(1_100);
        assert_eq!(SEEN.get("a").unwrap(), None, "expired: not returned, even before its timer fired");
        assert_eq!(SEEN.update("a", |n| n.unwrap_or(0) + 10).unwrap(), 10, "an update starts afresh");
        end_call();
        assert_eq!(advance(1_100), [], "the first timer finds a newer expiry and keeps the entry");
        assert_eq!(stored(b"seen\0a").as_deref(), Some(&b"[1200,10]"[..]));
        assert_eq!(advance(1_200), []);
        assert_eq!(stored(b"seen\0a"), None, "removed from the store");
        assert!(testing::pending().is_empty());
    }

    #[test]
    fn expired_map_entries_are_left_out_of_reads_and_scans() {
        reset();
        testing::set_processing_time(0);
        CART.set("u", "apple", &1).unwrap();
        end_call();
        testing::set_processing_time(50);
        CART.set("u", "pear", &2).unwrap();
        end_call();
        testing::set_processing_time(120);
        assert_eq!(CART.get("u", "apple").unwrap(), None);
        assert_eq!(CART.entries("u").unwrap(), [("pear".to_string(), 2)]);
        assert_eq!(CART.keys("u").unwrap(), ["pear".to_string()]);
        assert_eq!(advance(150), []);
        assert_eq!(CART.entries("u").unwrap(), []);
    }

    #[test]
    fn other_timers_are_not_expiry_timers() {
        reset();
        assert!(!expire(&Timer::processing("seen\0a", 5)).unwrap());
        assert!(!expire(&Timer::event([TIMER_PREFIX, b"seen\0a"].concat(), 5)).unwrap());
    }
}
