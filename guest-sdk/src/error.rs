//! The SDK's error type.
//!
//! A transform reports every failure as an [`Error`]: a message for whoever
//! runs the job. The SDK turns it into the WIT `result` error string, so a
//! user error fails the batch (or, from `init`, the job) and never traps the
//! instance. Conversions from the errors a transform usually meets (JSON,
//! UTF-8, number parsing, plain strings) let `?` do the work.

use std::fmt;

/// An error returned by a transform hook or by an SDK call.
///
/// It is a message and nothing more: the host records it and fails the batch,
/// then replays the batch from the last checkpoint.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
}

/// `Result` with the SDK's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Error { message: message.into() }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prefixes the message with `context` and `": "`.
    ///
    /// ```
    /// # use sluice_guest::Error;
    /// let e = Error::new("expected value").context("field `amount`");
    /// assert_eq!(e.message(), "field `amount`: expected value");
    /// ```
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error { message: format!("{context}: {}", self.message) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Error").field(&self.message).finish()
    }
}

impl std::error::Error for Error {}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error { message }
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Error::new(message)
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::new(format!("invalid JSON: {e}"))
    }
}

impl From<std::str::Utf8Error> for Error {
    fn from(e: std::str::Utf8Error) -> Self {
        Error::new(format!("invalid UTF-8: {e}"))
    }
}

impl From<std::string::FromUtf8Error> for Error {
    fn from(e: std::string::FromUtf8Error) -> Self {
        Error::new(format!("invalid UTF-8: {e}"))
    }
}

macro_rules! from_display {
    ($($ty:ty),* $(,)?) => {$(
        impl From<$ty> for Error {
            fn from(e: $ty) -> Self {
                Error::new(e.to_string())
            }
        }
    )*};
}

from_display!(std::num::ParseIntError, std::num::ParseFloatError, std::str::ParseBoolError, std::num::TryFromIntError,);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_keep_the_message() {
        let e: Error = "boom".into();
        assert_eq!(e.to_string(), "boom");
        let e: Error = String::from("bang").into();
        assert_eq!(e.message(), "bang");
        let bad = String::from_utf8(vec![0xff_u8]).unwrap_err();
        let e: Error = bad.utf8_error().into();
        assert!(e.message().starts_with("invalid UTF-8"), "{e}");
        let e: Error = bad.into();
        assert!(e.message().starts_with("invalid UTF-8"), "{e}");
        let e: Error = serde_json::from_str::<u32>("x").unwrap_err().into();
        assert!(e.message().starts_with("invalid JSON"), "{e}");
        let e: Error = "x".parse::<u32>().unwrap_err().into();
        assert_eq!(e.message(), "invalid digit found in string");
        assert_eq!(format!("{:?}", Error::new("q")), "Error(\"q\")");
    }
}
