//! [`ListState`]: a growing list per record key, stored as one JSON array.

use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{decode, encode, keys, store};
use crate::error::{Error, Result};

/// A list of `T` per record key, stored as one JSON array value under
/// `name 0x00 key`.
///
/// [`push`](ListState::push) appends to the encoded array without decoding
/// it, but every push still copies the whole value: keep lists short (a
/// window, the last N events), or use [`MapState`](crate::MapState).
///
/// ```
/// # fn main() -> sluice_guest::Result<()> {
/// use sluice_guest::ListState;
///
/// const RECENT: ListState<String> = ListState::new("recent");
///
/// RECENT.push("user-1", &"login".to_string())?;
/// RECENT.push("user-1", &"click".to_string())?;
/// assert_eq!(RECENT.get("user-1")?, ["login", "click"]);
/// RECENT.clear("user-1")?;
/// assert!(RECENT.get("user-1")?.is_empty());
/// # Ok(())
/// # }
/// ```
pub struct ListState<T> {
    name: &'static str,
    _type: PhantomData<fn() -> T>,
}

impl<T> ListState<T> {
    /// A handle on the state called `name` (same rules as
    /// [`ValueState::new`](crate::ValueState::new)).
    pub const fn new(name: &'static str) -> Self {
        ListState { name, _type: PhantomData }
    }

    /// The state's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<T: Serialize + DeserializeOwned> ListState<T> {
    /// Appends `item` to the list for `key`.
    pub fn push(&self, key: impl AsRef<[u8]>, item: &T) -> Result<()> {
        let k = keys::value_key(self.name, key.as_ref())?;
        let item = encode(self.name, item)?;
        store::with(|s| {
            let list = s.read_with(&k, |current| append(current, &item))?;
            s.write(k, Some(list));
            Ok(())
        })
        .map_err(|e| e.context(format_args!("state `{}`", self.name)))
    }

    /// The list for `key`; empty if there is none.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Vec<T>> {
        let k = keys::value_key(self.name, key.as_ref())?;
        store::with(|s| s.read_with(&k, |v| v.map_or_else(|| Ok(Vec::new()), |v| decode(self.name, v))))
    }

    /// Replaces the list for `key`.
    pub fn set(&self, key: impl AsRef<[u8]>, items: &[T]) -> Result<()> {
        let k = keys::value_key(self.name, key.as_ref())?;
        let v = encode(self.name, items)?;
        store::with(|s| {
            s.write(k, Some(v));
            Ok(())
        })
    }

    /// Removes the list for `key`.
    pub fn clear(&self, key: impl AsRef<[u8]>) -> Result<()> {
        let k = keys::value_key(self.name, key.as_ref())?;
        store::with(|s| {
            s.write(k, None);
            Ok(())
        })
    }

    /// Loads the lists for all of `keys` with one `state.get-many` call (see
    /// [`ValueState::prefetch`](crate::ValueState::prefetch)).
    pub fn prefetch<I>(&self, keys: I) -> Result<()>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        super::value::prefetch_values(self.name, keys)
    }
}

/// Appends the JSON `item` to the JSON array `list` without parsing the
/// array's elements.
fn append(list: Option<&[u8]>, item: &[u8]) -> Result<Vec<u8>> {
    let Some(list) = list else {
        let mut out = Vec::with_capacity(item.len() + 2);
        out.push(b'[');
        out.extend_from_slice(item);
        out.push(b']');
        return Ok(out);
    };
    let trimmed = list.trim_ascii();
    let inner = match trimmed {
        [b'[', inner @ .., b']'] => inner,
        _ => return Err(Error::new("stored value is not a JSON array")),
    };
    let mut out = Vec::with_capacity(trimmed.len() + item.len() + 1);
    out.extend_from_slice(&trimmed[..trimmed.len() - 1]);
    if !inner.trim_ascii().is_empty() {
        out.push(b',');
    }
    out.extend_from_slice(item);
    out.push(b']');
    Ok(out)
}

impl<T> Clone for ListState<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ListState<T> {}

impl<T> fmt::Debug for ListState<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ListState").field(&self.name).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{calls, reset};
    use super::*;

    #[test]
    fn append_keeps_valid_json() {
        let a = |l: Option<&str>, i: &str| {
            append(l.map(str::as_bytes), i.as_bytes()).map(|v| String::from_utf8(v).unwrap())
        };
        assert_eq!(a(None, "1").unwrap(), "[1]");
        assert_eq!(a(Some("[]"), "1").unwrap(), "[1]");
        assert_eq!(a(Some(" [ ] \n"), "1").unwrap(), "[ 1]");
        assert_eq!(a(Some("[1,2]"), "{\"a\":[3]}").unwrap(), "[1,2,{\"a\":[3]}]");
        assert_eq!(a(Some("[\"x\"] "), "\"y\"").unwrap(), "[\"x\",\"y\"]");
        assert!(a(Some("{}"), "1").is_err());
        assert!(a(Some(""), "1").is_err());
        assert!(a(Some("]"), "1").is_err());
    }

    #[test]
    fn push_get_set_clear() {
        reset();
        const L: ListState<(u32, String)> = ListState::new("l");
        L.push("k", &(1, "a".into())).unwrap();
        L.push("k", &(2, "b".into())).unwrap();
        assert_eq!(L.get("k").unwrap(), [(1, "a".to_string()), (2, "b".to_string())]);
        assert_eq!(calls().get, 1);
        L.set("k", &[(9, "z".into())]).unwrap();
        L.push("k", &(10, "y".into())).unwrap();
        assert_eq!(L.get("k").unwrap().len(), 2);
        L.clear("k").unwrap();
        assert!(L.get("k").unwrap().is_empty());
        assert!(L.get("other").unwrap().is_empty());
        L.prefetch(["a", "b"]).unwrap();
        assert_eq!(calls().get_many, 1);
    }

    #[test]
    fn push_onto_a_non_array_is_an_error() {
        reset();
        super::super::ValueState::<u32>::new("l2").set("k", &5).unwrap();
        let e = ListState::<u32>::new("l2").push("k", &1).unwrap_err();
        assert_eq!(e.message(), "state `l2`: stored value is not a JSON array");
    }
}
