//! Jobs whose start failed with an error that may pass (a broker that
//! cannot be reached, a module file the host cannot open now) and that the
//! supervisor starts again after a backoff, instead of recording them
//! failed: a host that comes up before its broker, or that runs out of file
//! descriptors for a moment, keeps every job it was running.
//!
//! An entry says only when to try next and why the last try failed (the
//! job's status shows it as `restarting` with that reason). Whether to try
//! is decided afresh from the job's record when it is due: a job stopped,
//! deleted or failed meanwhile is forgotten then.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};

/// A job, by tenant and id.
type Key = (String, String);

/// One job waiting to be started again.
struct Waiting {
    /// When to try next.
    due: Instant,
    /// Why the last start failed.
    reason: String,
    /// The delays still to come: 1-2 s at first, doubling to 30-60 s
    /// (jittered, so that many jobs of a host do not all try at once).
    backoff: ExponentialBackoff,
}

/// The jobs waiting to be started again.
#[derive(Default)]
pub(super) struct StartRetries {
    waiting: Mutex<HashMap<Key, Waiting>>,
}

impl StartRetries {
    /// Notes that `key`'s start failed with `reason` and may be tried again;
    /// returns how long until then.
    pub(super) fn failed(&self, key: &Key, reason: String) -> Duration {
        let mut waiting = self.lock();
        let entry = waiting.entry(key.clone()).or_insert_with(|| Waiting {
            due: Instant::now(),
            reason: String::new(),
            backoff: ExponentialBuilder::new()
                .with_min_delay(Duration::from_secs(1))
                .with_max_delay(Duration::from_secs(30))
                .with_factor(2.0)
                .with_jitter()
                .without_max_times()
                .build(),
        });
        let delay = entry.backoff.next().unwrap_or(Duration::from_secs(30));
        entry.due = Instant::now() + delay;
        entry.reason = reason;
        delay
    }

    /// Forgets `key` (it started, failed for good, or should not run).
    pub(super) fn forget(&self, key: &Key) {
        self.lock().remove(key);
    }

    /// Forgets every job but those `keep` says to keep.
    pub(super) fn retain(&self, mut keep: impl FnMut(&Key) -> bool) {
        self.lock().retain(|key, _| keep(key));
    }

    /// Why `key`'s last start failed, if it waits to be started again.
    pub(super) fn reason(&self, key: &Key) -> Option<String> {
        self.lock().get(key).map(|w| w.reason.clone())
    }

    /// Whether `key` waits and is not due yet.
    pub(super) fn is_waiting(&self, key: &Key, now: Instant) -> bool {
        self.lock().get(key).is_some_and(|w| w.due > now)
    }

    /// The jobs due at `now`.
    pub(super) fn due(&self, now: Instant) -> Vec<Key> {
        self.lock().iter().filter(|(_, w)| w.due <= now).map(|(key, _)| key.clone()).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Waiting>> {
        self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_start_waits_longer_each_time_until_forgotten() {
        let retries = StartRetries::default();
        let key = ("tenant".to_owned(), "job".to_owned());
        let first = retries.failed(&key, "broker down".into());
        assert!((Duration::from_secs(1)..=Duration::from_secs(2)).contains(&first), "{first:?}");
        assert!(retries.is_waiting(&key, Instant::now()));
        assert!(retries.due(Instant::now()).is_empty());
        assert_eq!(retries.due(Instant::now() + first), vec![key.clone()]);
        let second = retries.failed(&key, "still down".into());
        assert!((Duration::from_secs(2)..=Duration::from_secs(4)).contains(&second), "{second:?}");
        assert_eq!(retries.reason(&key).as_deref(), Some("still down"));
        for _ in 0..10 {
            retries.failed(&key, "down".into());
        }
        let capped = retries.failed(&key, "down".into());
        assert!(capped <= Duration::from_secs(60), "{capped:?}");
        retries.forget(&key);
        assert_eq!(retries.reason(&key), None);
        assert!(!retries.is_waiting(&key, Instant::now()));
        let other = ("tenant".to_owned(), "other".to_owned());
        retries.failed(&key, "down".into());
        retries.failed(&other, "down".into());
        retries.retain(|k| k == &other);
        assert_eq!((retries.reason(&key), retries.reason(&other).as_deref()), (None, Some("down")));
    }
}
