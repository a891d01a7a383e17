//! The transform's configuration: string keys and values from the job file.
//!
//! [`Config`] is what [`Transform::init`](crate::Transform::init) receives.
//! Lookups never panic: a missing or malformed setting is an [`Error`] whose
//! message names the key, so the job fails at start with a clear reason.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The job's transform configuration (`name = value` pairs).
///
/// When the job repeats a key, the last value wins. Settings keep the order
/// in which the host passed them.
///
/// ```
/// # fn main() -> sluice_guest::Result<()> {
/// use sluice_guest::Config;
///
/// let config: Config = [("contains", "error"), ("limit", "10")].into_iter().collect();
/// assert_eq!(config.require("contains")?, "error");
/// assert_eq!(config.parse::<u32>("limit")?, Some(10));
/// assert_eq!(config.parse::<u32>("missing")?, None);
/// assert!(config.require("mode").is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Config {
    // A handful of settings: a Vec is smaller and as fast as a map, and
    // building it pulls no sort routine into every guest.
    entries: Vec<(String, String)>,
}

impl Config {
    /// A configuration with these pairs; a repeated key keeps its last value.
    pub fn new<K, V>(pairs: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        let mut entries: Vec<(String, String)> = Vec::new();
        for (key, value) in pairs {
            let (key, value) = (key.into(), value.into());
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 = value,
                None => entries.push((key, value)),
            }
        }
        Config { entries }
    }

    /// The value of `name`, if it is set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The value of `name`, or an error saying that the setting is required.
    pub fn require(&self, name: &str) -> Result<&str> {
        self.get(name).ok_or_else(|| Error::new(format!("missing required config key `{name}`")))
    }

    /// The value of `name` parsed with [`FromStr`]; `Ok(None)` when it is not
    /// set, an error naming the key and the value when it does not parse.
    pub fn parse<T>(&self, name: &str) -> Result<Option<T>>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        match self.get(name) {
            None => Ok(None),
            Some(raw) => raw
                .parse()
                .map(Some)
                .map_err(|e| Error::new(format!("config key `{name}`: invalid value \"{raw}\": {e}"))),
        }
    }

    /// The value of `name` as a duration such as `10s`, `1m 30s`, `500ms`
    /// or `2h` (the job files' notation); `Ok(None)` when it is not set, an
    /// error naming the key and the value when it does not parse.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use sluice_guest::Config;
    /// let config = Config::new([("window", "1m 30s"), ("bad", "soon")]);
    /// assert_eq!(config.duration("window").unwrap(), Some(Duration::from_secs(90)));
    /// assert_eq!(config.duration("unset").unwrap(), None);
    /// assert!(config.duration("bad").unwrap_err().message().starts_with("config key `bad`: invalid duration \"soon\""));
    /// ```
    pub fn duration(&self, name: &str) -> Result<Option<std::time::Duration>> {
        match self.get(name) {
            None => Ok(None),
            Some(raw) => humantime::parse_duration(raw.trim()).map(Some).map_err(|e| {
                Error::new(format!("config key `{name}`: invalid duration \"{raw}\" (e.g. 10s, 1m, 500ms): {e}"))
            }),
        }
    }

    /// The value of `name` if it is one of `allowed`; `Ok(None)` when it is
    /// not set, an error listing the allowed values otherwise.
    ///
    /// ```
    /// # use sluice_guest::Config;
    /// let config = Config::new([("mode", "fast")]);
    /// let e = config.choice("mode", &["keep", "drop"]).unwrap_err();
    /// assert_eq!(e.message(), "config key `mode`: unknown value \"fast\"; expected one of `keep`, `drop`");
    /// ```
    pub fn choice(&self, name: &str, allowed: &[&str]) -> Result<Option<&str>> {
        match self.get(name) {
            None => Ok(None),
            Some(value) if allowed.contains(&value) => Ok(Some(value)),
            Some(value) => {
                let allowed: Vec<String> = allowed.iter().map(|a| format!("`{a}`")).collect();
                Err(Error::new(format!(
                    "config key `{name}`: unknown value \"{value}\"; expected one of {}",
                    allowed.join(", ")
                )))
            }
        }
    }

    /// All settings, in the order the host passed them.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The number of settings.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no settings.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Config {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Config::new(iter)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new([("mode", "keep"), ("n", "12"), ("bad", "x1"), ("mode", "drop")])
    }

    #[test]
    fn get_and_require() {
        let c = config();
        assert_eq!(c.get("mode"), Some("drop"), "last value wins");
        assert_eq!(c.get("nope"), None);
        assert_eq!(c.require("n"), Ok("12"));
        assert_eq!(c.require("contains").unwrap_err().message(), "missing required config key `contains`");
        assert_eq!(c.len(), 3);
        assert!(!c.is_empty());
        assert!(Config::default().is_empty());
    }

    #[test]
    fn parse_reports_key_and_value() {
        let c = config();
        assert_eq!(c.parse::<u64>("n"), Ok(Some(12)));
        assert_eq!(c.parse::<u64>("absent"), Ok(None));
        let e = c.parse::<u64>("bad").unwrap_err();
        assert_eq!(e.message(), "config key `bad`: invalid value \"x1\": invalid digit found in string");
    }

    #[test]
    fn choice_names_the_allowed_values() {
        let c = config();
        assert_eq!(c.choice("mode", &["keep", "drop"]), Ok(Some("drop")));
        assert_eq!(c.choice("absent", &["a"]), Ok(None));
        let e = c.choice("n", &["keep", "drop"]).unwrap_err();
        assert_eq!(e.message(), "config key `n`: unknown value \"12\"; expected one of `keep`, `drop`");
    }

    #[test]
    fn iter_keeps_host_order() {
        let config = config();
        let pairs: Vec<_> = config.iter().collect();
        assert_eq!(pairs, [("mode", "drop"), ("n", "12"), ("bad", "x1")]);
        assert_eq!(format!("{:?}", Config::new([("a", "b")])), "{\"a\": \"b\"}");
    }
}
