//! Errors of the runtime, tagged by domain.
//!
//! The domain says whose fault an error is, and so what the job should do
//! about it: a user error (a bad module, a bad config) will not fix itself; a
//! guest error (a trap, a limit) fails the job, which restarts from its last
//! checkpoint with backoff; an internal error is a host bug or an I/O failure.
//!
//! Like every error type of this crate, these say their cause in their own
//! message and do not repeat it as `source()`, so a log line or an
//! `anyhow` chain shows each cause once.

use std::path::PathBuf;
use std::time::Duration;

/// Whose fault an error is; drives the restart policy and HTTP status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// The user gave something invalid: a module, a config. Retrying the same
    /// input cannot succeed.
    User,
    /// The guest failed while running: a trap, a limit, an error it returned.
    /// The job restarts from its last checkpoint; it may fail again.
    Guest,
    /// The host failed: I/O, a bug.
    Internal,
}

/// An error from loading, instantiating or calling a transform.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The module file could not be read.
    #[error("cannot read module {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The bytes are not a WebAssembly component (a core module, a truncated
    /// or corrupt file, something else entirely).
    #[error("not a valid WebAssembly component: {0}")]
    InvalidComponent(String),
    /// A component, but not one of the `sluice:transform` world.
    #[error("component is not a sluice transform: {0}")]
    WorldMismatch(String),
    /// The guest trapped (a panic, an unreachable, an out-of-bounds access).
    #[error("guest trapped: {0}")]
    Trap(String),
    /// The guest ran past its deadline for one call and was interrupted.
    #[error("guest exceeded its deadline of {0:?} for one call and was interrupted")]
    Deadline(Duration),
    /// The guest tried to grow its memory past its limit.
    #[error("guest exceeded its memory limit of {limit} bytes (it asked for {requested} bytes)")]
    MemoryLimit {
        /// The limit in bytes.
        limit: usize,
        /// The size the guest asked to grow to.
        requested: usize,
    },
    /// The guest exceeded another limit (outputs per input, state size).
    #[error("guest exceeded a limit: {0}")]
    Limit(String),
    /// The transform returned an error from `init` or `process`, cut to
    /// [`MAX_GUEST_ERROR`] bytes (see [`Error::guest`]).
    #[error("transform failed: {0}")]
    Guest(String),
    /// The instance failed earlier and cannot be called again.
    #[error("instance is poisoned by an earlier failure; instantiate it again")]
    Poisoned,
    /// Handing over the state the guest held across batches (world
    /// `cached`) failed. A write refused there (a value, or the state, over
    /// its limit) cannot be pinned on its record: a task's next attempt
    /// runs without holding ([`Instance::forbid_holding`](super::Instance::forbid_holding)),
    /// so that such a write fails in its own batch.
    #[error("handing over the state the guest held: {0}")]
    HeldState(Box<Error>),
    /// The host itself failed: what it was doing, and why.
    #[error("internal error: {what}: {source}")]
    Internal {
        /// What the host was doing.
        what: String,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The most of a guest's error message the host keeps. The host keeps a
/// failure's reason in many places (up to 100,000 suspect records per task,
/// the task's history, the job's log ring, the cluster's status board): a
/// guest returning an error of its whole memory must not multiply that.
pub const MAX_GUEST_ERROR: usize = 4096;

impl Error {
    /// [`Error::Guest`] with `message` cut to [`MAX_GUEST_ERROR`] bytes (at
    /// a character boundary), saying how much was cut.
    pub fn guest(message: impl Into<String>) -> Error {
        let mut message = message.into();
        if message.len() > MAX_GUEST_ERROR {
            let end = message.floor_char_boundary(MAX_GUEST_ERROR);
            let cut = message.len() - end;
            message.truncate(end);
            message.push_str(&format!("... ({cut} more bytes cut)"));
        }
        Error::Guest(message)
    }

    /// The host failed at `what` because of `source`.
    pub fn internal(what: impl Into<String>, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Internal { what: what.into(), source: source.into() }
    }

    /// Whose fault this error is.
    pub fn domain(&self) -> Domain {
        match self {
            Error::InvalidComponent(_) | Error::WorldMismatch(_) => Domain::User,
            Error::Trap(_)
            | Error::Deadline(_)
            | Error::MemoryLimit { .. }
            | Error::Limit(_)
            | Error::Guest(_)
            | Error::Poisoned => Domain::Guest,
            Error::Read { .. } | Error::Internal { .. } => Domain::Internal,
            Error::HeldState(e) => e.domain(),
        }
    }

    /// Whether running the same job again may succeed.
    pub fn is_retryable(&self) -> bool {
        self.domain() != Domain::User
    }
}

/// Results of the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::{Error, MAX_GUEST_ERROR};

    #[test]
    fn a_guests_error_is_cut_at_a_character_boundary() {
        let Error::Guest(short) = Error::guest("bad record") else { panic!("a guest error") };
        assert_eq!(short, "bad record");
        // 'é' is two bytes: the cut must not split one.
        let long = "é".repeat(MAX_GUEST_ERROR);
        let Error::Guest(cut) = Error::guest(long.clone()) else { panic!("a guest error") };
        assert!(cut.len() < MAX_GUEST_ERROR + 40, "{} bytes kept", cut.len());
        assert!(cut.ends_with(&format!("... ({} more bytes cut)", long.len() - MAX_GUEST_ERROR)), "{cut}");
    }
}
