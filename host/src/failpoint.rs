//! Named crash points for testing the exactly-once protocol.
//!
//! `SLUICE_FAILPOINT=<name>` aborts the process (no unwinding, no flushing,
//! like `kill -9`) the first time execution reaches the failpoint `<name>`;
//! `<name>@<n>` aborts at the n-th time instead. `<name>[@<n>]:stall=<duration>`
//! stalls the thread there for that long instead of aborting (a hung disk
//! or broker call, for the host's stale-transaction supervisor), and
//! `<name>[@<n>]:error` makes the step fail as an unavailable service would,
//! where the code asks [`fails`] rather than [`hit`]. The names
//! are the steps of the protocol in [`crate::checkpoint`] and of the
//! shared host's multi-step control calls, listed in [`ALL`].
//!
//! Only the variable read at startup counts; a process without it pays one
//! relaxed atomic load per failpoint.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every failpoint, in protocol order.
pub const ALL: &[&str] = &[
    "before-snapshot",
    "after-snapshot",
    "before-flush",
    "after-flush",
    "before-commit",
    "after-commit-before-fold",
    "during-fold",
    "after-fold",
    // Moving shards between tasks at start (`job::settle`).
    "rescale-during-copy",
    "rescale-before-sweep",
    // The shared host's control plane.
    "reset-before-commit",
    "stop-before-desired",
    // A resume whose tasks were counted, before its record is stored (two
    // resumes through two members, with `:stall=`).
    "resume-before-record",
    "change-before-record",
    "change-after-record",
    "upload-before-decide",
    "upload-before-activate",
    // The cluster's metadata log.
    "log-submit",
    // A member applying a job record that an upgrade changed (a member
    // held behind on an upgrade, with `:stall=`).
    "apply-upgrade",
];

struct Armed {
    name: String,
    at: u64,
    hits: AtomicU64,
    /// Stall this long instead of aborting.
    stall: Option<std::time::Duration>,
    /// Fail the step instead of aborting (see [`fails`]).
    error: bool,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var("SLUICE_FAILPOINT").ok()?;
            let (spec, error) = match spec.strip_suffix(":error") {
                Some(spec) => (spec.to_string(), true),
                None => (spec, false),
            };
            let (spec, stall) = match spec.split_once(":stall=") {
                Some((spec, stall)) => (spec.to_string(), crate::units::parse_duration(stall).ok()),
                None => (spec, None),
            };
            let (name, at) = match spec.split_once('@') {
                Some((name, at)) => (name.to_string(), at.parse().unwrap_or(1)),
                None => (spec, 1),
            };
            if !ALL.contains(&name.as_str()) {
                tracing::warn!("SLUICE_FAILPOINT names unknown failpoint `{name}`; known: {}", ALL.join(", "));
            }
            Some(Armed { name, at: at.max(1), hits: AtomicU64::new(0), stall, error })
        })
        .as_ref()
}

/// Whether `name` is the armed failpoint: for a hook whose check costs
/// more than a failpoint's load.
pub fn is_armed(name: &str) -> bool {
    armed().is_some_and(|armed| armed.name == name)
}

/// Whether the step at `name` is to fail here (armed with `:error`, and
/// this is the hit it is armed for); otherwise as [`hit`].
pub fn fails(name: &str) -> bool {
    let Some(armed) = armed() else { return false };
    if armed.name != name || !armed.error {
        hit(name);
        return false;
    }
    let hits = armed.hits.fetch_add(1, Ordering::Relaxed) + 1;
    if hits == armed.at {
        eprintln!("sluice: failpoint `{name}` hit {hits} time(s): failing the step");
    }
    hits == armed.at
}

/// Aborts the process here if `name` is the armed failpoint and this is the
/// hit it is armed for.
pub fn hit(name: &str) {
    let Some(armed) = armed() else { return };
    if armed.name != name {
        return;
    }
    let hits = armed.hits.fetch_add(1, Ordering::Relaxed) + 1;
    if hits == armed.at {
        if let Some(stall) = armed.stall {
            eprintln!("sluice: failpoint `{name}` hit {hits} time(s): stalling for {stall:?}");
            std::thread::sleep(stall);
            return;
        }
        eprintln!("sluice: failpoint `{name}` hit {hits} time(s): aborting the process");
        std::process::abort();
    }
}
