//! Logging to the host's log, which tags each line with the job and task.
//!
//! Use the macros, which format like `format!`:
//!
//! ```
//! use sluice_guest::log;
//!
//! let n = 3;
//! log::info!("flushed {n} keys");
//! log::warn!("skipping record without a key");
//! ```
//!
//! Each line is one `log` call across the component boundary, so keep them
//! out of the per-record path unless something is wrong. Natively (in unit
//! tests) lines go to stderr.

/// How severe a log line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the transform handled.
    Warn,
    /// Something failed.
    Error,
}

/// Sends one line to the host's log.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        use crate::bindings::sluice::transform::log as wit;
        let level = match level {
            Level::Trace => wit::Level::Trace,
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        };
        wit::log(level, message);
    }
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

#[doc(hidden)]
pub fn __log_args(level: Level, args: std::fmt::Arguments<'_>) {
    match args.as_str() {
        Some(message) => log(level, message),
        None => log(level, &args.to_string()),
    }
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_trace {
    ($($arg:tt)+) => { $crate::log::__log_args($crate::log::Level::Trace, ::core::format_args!($($arg)+)) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_debug {
    ($($arg:tt)+) => { $crate::log::__log_args($crate::log::Level::Debug, ::core::format_args!($($arg)+)) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_info {
    ($($arg:tt)+) => { $crate::log::__log_args($crate::log::Level::Info, ::core::format_args!($($arg)+)) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_warn {
    ($($arg:tt)+) => { $crate::log::__log_args($crate::log::Level::Warn, ::core::format_args!($($arg)+)) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_error {
    ($($arg:tt)+) => { $crate::log::__log_args($crate::log::Level::Error, ::core::format_args!($($arg)+)) };
}

/// Logs a formatted line at [`Level::Trace`].
#[doc(inline)]
pub use crate::__log_trace as trace;

/// Logs a formatted line at [`Level::Debug`].
#[doc(inline)]
pub use crate::__log_debug as debug;

/// Logs a formatted line at [`Level::Info`].
#[doc(inline)]
pub use crate::__log_info as info;

/// Logs a formatted line at [`Level::Warn`].
#[doc(inline)]
pub use crate::__log_warn as warn;

/// Logs a formatted line at [`Level::Error`].
#[doc(inline)]
pub use crate::__log_error as error;

#[cfg(test)]
mod tests {
    #[test]
    fn macros_format() {
        let x = 5;
        crate::log::trace!("x = {x}");
        crate::log::debug!("x = {}", x);
        crate::log::info!("plain");
        crate::log::warn!("w {x:?}");
        crate::log::error!("e");
        assert!(super::Level::Trace < super::Level::Error);
    }
}
