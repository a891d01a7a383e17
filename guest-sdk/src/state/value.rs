//! [`ValueState`]: one JSON value per record key.

use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ttl::Ttl;
use super::{keys, store};
use crate::error::Result;

/// One value of type `T` per record key, stored as JSON under
/// `name 0x00 key`.
///
/// Declare it as a `const`; it is only a name, and every call goes through
/// the state cache (see the [crate docs](crate#state-and-boundary-crossings)).
///
/// ```
/// # fn main() -> sluice_guest::Result<()> {
/// use sluice_guest::ValueState;
///
/// const TOTALS: ValueState<f64> = ValueState::new("total");
///
/// TOTALS.set("eu", &1.5)?;
/// let t = TOTALS.update("eu", |t| t.unwrap_or(0.0) + 2.0)?;
/// assert_eq!(t, 3.5);
/// assert_eq!(TOTALS.get("eu")?, Some(3.5));
/// TOTALS.clear("eu")?;
/// assert_eq!(TOTALS.get("eu")?, None);
/// # Ok(())
/// # }
/// ```
pub struct ValueState<T> {
    name: &'static str,
    ttl: Ttl,
    _type: PhantomData<fn() -> T>,
}

impl<T> ValueState<T> {
    /// A handle on the state called `name`.
    ///
    /// The name must be non-empty, contain no 0x00 byte and be unique among
    /// the transform's states of every kind; a bad name is reported as an
    /// error by the first call that uses it.
    pub const fn new(name: &'static str) -> Self {
        ValueState { name, ttl: Ttl::NONE, _type: PhantomData }
    }

    /// The same state with a time-to-live: a value expires `ttl` of
    /// processing time after it was last written; an expired value is never
    /// returned, and is removed from the store (see the [`state`](crate::state)
    /// docs). Changes the stored form (`[expires_at, value]`), so add or
    /// remove a TTL only with a `migrate` hook.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use sluice_guest::ValueState;
    /// const SEEN: ValueState<bool> = ValueState::new("seen").with_ttl(Duration::from_secs(3600));
    /// ```
    pub const fn with_ttl(self, ttl: std::time::Duration) -> Self {
        ValueState { ttl: Ttl::of(ttl), ..self }
    }

    /// The state's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<T: Serialize + DeserializeOwned> ValueState<T> {
    /// The value for `key`, if any.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<T>> {
        let k = keys::value_key(self.name, key.as_ref())?;
        store::with(|s| s.read_with(&k, |v| v.map(|v| self.ttl.decode(self.name, v)).transpose())).map(Option::flatten)
    }

    /// Stores `value` for `key`.
    pub fn set(&self, key: impl AsRef<[u8]>, value: &T) -> Result<()> {
        let k = keys::value_key(self.name, key.as_ref())?;
        let v = self.ttl.encode(self.name, &k, value)?;
        store::with(|s| {
            s.write(k, Some(v));
            Ok(())
        })
    }

    /// Replaces the value for `key` with `f(current)` and returns the new
    /// value.
    pub fn update(&self, key: impl AsRef<[u8]>, f: impl FnOnce(Option<T>) -> T) -> Result<T> {
        keys::with_key_scratch(|k| {
            keys::value_key_into(self.name, key.as_ref(), k)?;
            super::update_entry(self.name, self.ttl, k, f)
        })
    }

    /// Removes the value for `key`.
    pub fn clear(&self, key: impl AsRef<[u8]>) -> Result<()> {
        let k = keys::value_key(self.name, key.as_ref())?;
        store::with(|s| {
            s.write(k, None);
            Ok(())
        })
    }

    /// Loads the values for all of `keys` into the batch's cache with a single
    /// `state.get-many` call, so the reads that follow cross nothing. Pass
    /// [`Batch::keys`](crate::Batch::keys) from
    /// [`begin_batch`](crate::Transform::begin_batch).
    pub fn prefetch<I>(&self, keys: I) -> Result<()>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        prefetch_values(self.name, keys)
    }
}

/// Prefetches `name 0x00 key` for each key.
pub(super) fn prefetch_values<I>(name: &str, keys: I) -> Result<()>
where
    I: IntoIterator,
    I::Item: AsRef<[u8]>,
{
    // Each key built in one reused buffer: most are in the cache already
    // when it holds the shard's state from batch to batch.
    store::with(|s| {
        keys::with_key_scratch(|k| -> Result<()> {
            for key in keys {
                k.clear();
                keys::value_key_into(name, key.as_ref(), k)?;
                s.want(k);
            }
            Ok(())
        })?;
        s.fetch_wanted()
    })
}

impl<T> Clone for ValueState<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ValueState<T> {}

impl<T> fmt::Debug for ValueState<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ValueState").field(&self.name).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{calls, reset};
    use super::*;

    const COUNTS: ValueState<u64> = ValueState::new("count");

    #[test]
    fn counter_costs_at_most_one_crossing_per_key() {
        reset();
        for key in ["a", "b", "a", "a", "b", "c"] {
            COUNTS.update(key, |n| n.unwrap_or(0) + 1).unwrap();
        }
        assert_eq!(COUNTS.get("a").unwrap(), Some(3));
        let c = calls();
        assert_eq!((c.get, c.write), (3, 0));
        store::with(|s| {
            s.finish();
            Ok(())
        })
        .unwrap();
        assert_eq!(calls().write, 1);
        assert_eq!(COUNTS.get("b").unwrap(), Some(2));
    }

    #[test]
    fn prefetch_makes_it_one_crossing_per_batch() {
        reset();
        let keys = ["a", "b", "a", "", "b"];
        COUNTS.prefetch(keys).unwrap();
        for key in keys {
            COUNTS.update(key, |n| n.unwrap_or(0) + 1).unwrap();
        }
        store::with(|s| {
            s.finish();
            Ok(())
        })
        .unwrap();
        let c = calls();
        assert_eq!((c.get_many, c.write, c.total()), (1, 1, 2));
        assert_eq!(COUNTS.get("").unwrap(), Some(1));
    }

    #[test]
    fn bad_names_and_values_are_errors() {
        reset();
        const EMPTY: ValueState<u64> = ValueState::new("");
        assert_eq!(EMPTY.get("k").unwrap_err().message(), "state name must not be empty");
        assert!(EMPTY.prefetch(["k"]).is_err());
        const TEXT: ValueState<String> = ValueState::new("count");
        TEXT.set("k", &"not a number".to_string()).unwrap();
        let e = COUNTS.get("k").unwrap_err();
        assert!(e.message().starts_with("state `count`: invalid JSON"), "{e}");
        assert_eq!(format!("{COUNTS:?}"), "ValueState(\"count\")");
    }
}
