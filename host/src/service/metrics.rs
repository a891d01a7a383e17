//! Prometheus metrics of every job, labelled by tenant and job, read from
//! the jobs' live figures at scrape time (nothing is counted twice, nothing
//! is kept for jobs that are gone).

use std::sync::{Arc, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::{JobState, JobStatus, Service};

/// The metrics of a service, in the Prometheus text format.
pub fn render(service: &Arc<Service>) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(JobsCollector { service: Arc::downgrade(service) }));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

#[derive(Debug)]
struct JobsCollector {
    service: Weak<Service>,
}

enum Kind {
    Counter,
    Gauge,
}

/// (name without suffixes, help, unit, kind, value)
type Figure = (&'static str, &'static str, Option<Unit>, Kind, fn(&JobStatus) -> f64);

const FIGURES: [Figure; 16] = [
    ("sluice_records_in", "Input records processed, replays after restarts included", None, Kind::Counter, |s| {
        s.records_in as f64
    }),
    ("sluice_records_out", "Output records sent, aborted ones included", None, Kind::Counter, |s| s.records_out as f64),
    ("sluice_source_lag_records", "Input records not read yet", None, Kind::Gauge, |s| s.lag_records as f64),
    ("sluice_last_checkpoint_id", "The lowest last-committed checkpoint of the job's tasks", None, Kind::Gauge, |s| {
        s.last_checkpoint as f64
    }),
    (
        "sluice_last_checkpoint_duration",
        "Barrier-to-commit time of the slowest task's last checkpoint",
        Some(Unit::Seconds),
        Kind::Gauge,
        |s| s.last_checkpoint_seconds,
    ),
    ("sluice_checkpoints", "Checkpoints committed", None, Kind::Counter, |s| s.checkpoints as f64),
    ("sluice_restarts", "Task restarts after failures", None, Kind::Counter, |s| s.restarts as f64),
    (
        "sluice_dead_letters",
        "Records set aside to the dead-letter topic (an aborted epoch's count again)",
        None,
        Kind::Counter,
        |s| s.dead_letters as f64,
    ),
    ("sluice_cpu", "CPU time of the job's task threads", Some(Unit::Seconds), Kind::Counter, |s| s.cpu_seconds),
    ("sluice_state", "Bytes of keys and values in the job's state", Some(Unit::Bytes), Kind::Gauge, |s| {
        s.state_bytes as f64
    }),
    (
        "sluice_restore_records",
        "Changelog records read to restore shards whose local state was missing or behind",
        None,
        Kind::Counter,
        |s| s.restored_records as f64,
    ),
    ("sluice_restore", "Bytes of keys and values restored from the changelog", Some(Unit::Bytes), Kind::Counter, |s| {
        s.restored_bytes as f64
    }),
    (
        "sluice_restore_duration",
        "Time spent restoring shards from the changelog",
        Some(Unit::Seconds),
        Kind::Counter,
        |s| s.restore_seconds,
    ),
    (
        "sluice_late_records",
        "Records at or below their shard's watermark when processed (replays count again)",
        None,
        Kind::Counter,
        |s| s.late_records as f64,
    ),
    ("sluice_timers_fired", "Timers fired (an aborted epoch's count again)", None, Kind::Counter, |s| {
        s.timers_fired as f64
    }),
    ("sluice_job_up", "1 while the job runs (state running), else 0", None, Kind::Gauge, |s| {
        f64::from(u8::from(s.state == JobState::Running))
    }),
];

impl Collector for JobsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(service) = self.service.upgrade() else { return Ok(()) };
        let statuses = service.all_statuses();
        for (name, help, unit, kind, value) in FIGURES {
            let metric_type = match kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
            };
            let mut family = encoder.encode_descriptor(name, help, unit.as_ref(), metric_type)?;
            for (tenant, status) in &statuses {
                let labels = [("tenant", tenant.as_str()), ("job", status.id.as_str())];
                let metric = family.encode_family(&labels)?;
                match kind {
                    Kind::Counter => ConstCounter::new(value(status)).encode(metric)?,
                    Kind::Gauge => ConstGauge::new(value(status)).encode(metric)?,
                }
            }
        }
        Ok(())
    }
}
