//! Each job's recent log lines, for `GET /v1/jobs/{id}/logs` and
//! `sluice logs`.
//!
//! [`LogCapture`] is a `tracing` layer: it picks out the events that belong
//! to a job (a guest's `log` calls and stdout/stderr carry an `instance`
//! field, task events a `task` field, both `<scope>/<task>`) and keeps the
//! last [`LINES_PER_JOB`] of each registered job in a ring of its own. Lines
//! are numbered in one increasing sequence per host, so a follower asks for
//! the lines after the last number it saw.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

/// Lines kept per job.
const LINES_PER_JOB: usize = 2000;

/// One log line of a job.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct LogLine {
    /// Increases by one per captured line, across the host.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// The task, `0`, `1`, ...
    pub task: String,
    /// `guest` (the transform's `log` calls), `stdout`, `stderr`, or `host`
    /// (the host's events about the task: restarts, failures).
    pub source: String,
    /// The text.
    pub message: String,
}

/// One job's lines, oldest first; `seq` increases along the ring.
type Ring = Arc<Mutex<VecDeque<LogLine>>>;

/// The rings of every registered job, keyed by scope.
///
/// A line takes the map's read lock and its own job's ring lock only, so
/// one job's chatter (a guest may log up to its rate limit) never queues
/// behind another's; the write lock is taken only to register and forget
/// jobs.
#[derive(Clone, Default)]
pub struct LogHub {
    jobs: Arc<RwLock<HashMap<String, Ring>>>,
    next_seq: Arc<AtomicU64>,
}

impl LogHub {
    /// Starts keeping lines for `scope`.
    pub fn register(&self, scope: &str) {
        let mut jobs = self.jobs.write().unwrap_or_else(PoisonError::into_inner);
        jobs.entry(scope.to_owned()).or_default();
    }

    /// Forgets `scope` and its lines.
    pub fn forget(&self, scope: &str) {
        self.jobs.write().unwrap_or_else(PoisonError::into_inner).remove(scope);
    }

    fn ring(&self, scope: &str) -> Option<Ring> {
        self.jobs.read().unwrap_or_else(PoisonError::into_inner).get(scope).cloned()
    }

    /// Up to `limit` lines of `scope` numbered above `after`, oldest first.
    pub fn lines(&self, scope: &str, after: u64, limit: usize) -> Vec<LogLine> {
        let Some(ring) = self.ring(scope) else { return Vec::new() };
        let ring = ring.lock().unwrap_or_else(PoisonError::into_inner);
        let start = ring.partition_point(|line| line.seq <= after);
        ring.iter().skip(start).take(limit).cloned().collect()
    }

    /// The newest `n` lines of `scope`, oldest first.
    pub fn tail(&self, scope: &str, n: usize) -> Vec<LogLine> {
        let Some(ring) = self.ring(scope) else { return Vec::new() };
        let ring = ring.lock().unwrap_or_else(PoisonError::into_inner);
        ring.iter().skip(ring.len().saturating_sub(n)).cloned().collect()
    }

    fn push(&self, scope: &str, mut line: LogLine) {
        let Some(ring) = self.ring(scope) else { return };
        let mut ring = ring.lock().unwrap_or_else(PoisonError::into_inner);
        // Numbered under the ring's lock, so the ring stays in order.
        line.seq = self.next_seq.fetch_add(1, Ordering::Relaxed) + 1;
        if ring.len() == LINES_PER_JOB {
            ring.pop_front();
        }
        ring.push_back(line);
    }

    /// The `tracing` layer that fills this hub.
    pub fn layer(&self) -> LogCapture {
        LogCapture { hub: self.clone() }
    }
}

/// A `tracing` layer that routes job events into a [`LogHub`].
pub struct LogCapture {
    hub: LogHub,
}

#[derive(Default)]
struct Fields {
    instance: Option<String>,
    task: Option<String>,
    job: Option<String>,
    stream: Option<String>,
    message: String,
    rest: String,
}

impl Fields {
    fn set(&mut self, name: &str, value: String) {
        match name {
            "instance" => self.instance = Some(value),
            "task" => self.task = Some(value),
            "job" => self.job = Some(value),
            "stream" => self.stream = Some(value),
            "message" => self.message = value,
            name => {
                let _ = write!(self.rest, " {name}={value}");
            }
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field.name(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.set(field.name(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LogCapture {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let target = event.metadata().target();
        if !target.starts_with("sluice") {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let guest = target == "sluice::guest";
        // `<scope>/<task>` for a task's events; a job's own events name its
        // scope (`job = ...`) and belong to no task.
        let name = if guest { fields.instance } else { fields.task.or(fields.job.map(|scope| format!("{scope}/-"))) };
        let Some(name) = name else { return };
        let Some((scope, task)) = name.rsplit_once('/') else { return };
        let source = match (guest, fields.stream) {
            (true, Some(stream)) => stream,
            (true, None) => "guest".to_owned(),
            (false, _) => "host".to_owned(),
        };
        let line = LogLine {
            seq: 0,
            time_ms: crate::job::now_ms(),
            level: event.metadata().level().as_str().to_ascii_lowercase(),
            task: task.to_owned(),
            source,
            message: fields.message + &fields.rest,
        };
        self.hub.push(scope, line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn job_events_land_in_their_job_ring_only() {
        let hub = LogHub::default();
        hub.register("acme.clicks");
        let subscriber = tracing_subscriber::registry().with(hub.layer());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "sluice::guest", instance = "acme.clicks/0", "hello");
            tracing::info!(target: "sluice::guest", instance = "acme.clicks/1", stream = "stdout", "printed");
            tracing::warn!(task = "acme.clicks/0", attempt = 2, "task failed");
            tracing::warn!(job = "acme.clicks", "job failed");
            tracing::info!(target: "sluice::guest", instance = "other.job/0", "not registered");
            tracing::info!("no job at all");
        });
        let lines = hub.lines("acme.clicks", 0, 100);
        let shown: Vec<(&str, &str, &str)> =
            lines.iter().map(|l| (l.task.as_str(), l.source.as_str(), l.message.as_str())).collect();
        assert_eq!(
            shown,
            [
                ("0", "guest", "hello"),
                ("1", "stdout", "printed"),
                ("0", "host", "task failed attempt=2"),
                ("-", "host", "job failed")
            ]
        );
        assert_eq!(hub.lines("acme.clicks", lines[1].seq, 100).len(), 2);
        assert!(hub.lines("other.job", 0, 100).is_empty());
    }

    #[test]
    fn lines_logged_at_once_from_many_threads_stay_in_order_per_job() {
        let hub = LogHub::default();
        hub.register("a.job");
        hub.register("b.job");
        let line = || LogLine {
            seq: 0,
            time_ms: 0,
            level: "info".into(),
            task: "0".into(),
            source: "guest".into(),
            message: String::new(),
        };
        std::thread::scope(|scope| {
            for thread in 0..8 {
                let hub = &hub;
                scope.spawn(move || {
                    for _ in 0..500 {
                        hub.push(if thread % 2 == 0 { "a.job" } else { "b.job" }, line());
                    }
                });
            }
        });
        for job in ["a.job", "b.job"] {
            let lines = hub.lines(job, 0, usize::MAX);
            assert_eq!(lines.len(), 2000, "{job}");
            assert!(lines.windows(2).all(|w| w[0].seq < w[1].seq), "{job}: out of order");
            // A follower that saw line 1000 gets exactly the rest.
            assert_eq!(hub.lines(job, lines[999].seq, usize::MAX).len(), 1000, "{job}");
        }
    }
}
