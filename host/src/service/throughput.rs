//! Each job's records in and out per second over the last hour, at one
//! second's resolution, in memory: what the dashboard's charts draw.
//!
//! The supervisor samples the jobs' counters once a second
//! ([`Throughput::sample`]), per source: a task on this host, or in a
//! cluster a task another member runs, as it last published it (so the
//! chart on any member is the whole job's, the other members' share up to
//! a publication late). A series is a ring of [`KEPT_SECONDS`] points, so a
//! job costs at most 28 KiB however long the dashboard stays open, and a
//! job that stopped keeps its series until its last busy second falls out
//! of the hour. Nothing here is durable: after a host restart the charts
//! start empty.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde::Serialize;

/// Seconds kept per job.
pub const KEPT_SECONDS: usize = 3600;

/// A job in the series map: tenant and id.
type JobKey = (String, String);

/// Where some of a job's counters come from: the member that runs the task
/// (its host id; empty outside a cluster) and the task's index.
pub(crate) type Source = (String, usize);

/// A job's counters of records in and out, per source.
pub(crate) type Counters = Vec<(Source, [u64; 2])>;

/// The series of every job seen running in the last hour.
#[derive(Default)]
pub(crate) struct Throughput {
    series: Mutex<HashMap<JobKey, Series>>,
    /// The last second sampled (seconds since the Unix epoch).
    last_second: Mutex<u64>,
}

/// One job's points, oldest first; the newest is for `last_second`.
#[derive(Debug, Clone)]
struct Series {
    /// Records in and out per second.
    points: VecDeque<[u32; 2]>,
    /// Each source's counters at the last sample (they restart at 0 with
    /// the job).
    totals: HashMap<Source, [u64; 2]>,
    /// The newest second with records in or out.
    last_busy: u64,
}

/// A job's series as the dashboard reads it.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Rates {
    /// The second of the newest point, in seconds since the Unix epoch;
    /// point i is for `end - (len - 1 - i)`.
    pub end: u64,
    /// Records in per second, oldest first.
    pub records_in: Vec<u32>,
    /// Records out per second, oldest first.
    pub records_out: Vec<u32>,
}

impl Throughput {
    /// Takes one sample if the clock passed into a new second since the
    /// last: `jobs` are the counters of every job running now, per source.
    /// A second missed (a slow pass) gets the average of the gap. A source
    /// first seen in a job already sampled counts from its next sample: its
    /// counters may hold what it did before (a member whose publications
    /// this host just started to see).
    pub(crate) fn sample(&self, now_ms: u64, jobs: impl IntoIterator<Item = (JobKey, Counters)>) {
        let second = now_ms / 1000;
        let elapsed = {
            let mut last = super::jobs::lock(&self.last_second);
            if *last >= second {
                return;
            }
            let elapsed = if *last == 0 { 1 } else { second - *last };
            *last = second;
            elapsed.min(KEPT_SECONDS as u64) as usize
        };
        let mut series = super::jobs::lock(&self.series);
        let mut seen = std::collections::HashSet::new();
        for (key, sources) in jobs {
            let entry = series.entry(key.clone()).or_insert_with(|| Series {
                points: VecDeque::new(),
                totals: sources.iter().cloned().collect(),
                last_busy: 0,
            });
            let mut delta = [0u64; 2];
            for (source, now) in &sources {
                let Some(then) = entry.totals.get(source) else { continue };
                for i in 0..2 {
                    // A counter below its last value belongs to a new start.
                    delta[i] += if now[i] >= then[i] { now[i] - then[i] } else { now[i] };
                }
            }
            let rate = delta.map(|d| u32::try_from(d / elapsed as u64).unwrap_or(u32::MAX));
            entry.totals = sources.into_iter().collect();
            if rate != [0, 0] {
                entry.last_busy = second;
            }
            push(&mut entry.points, rate, elapsed);
            seen.insert(key);
        }
        // Jobs not running now: zeros, until their busy hour is over.
        series.retain(|key, entry| {
            if seen.contains(key) {
                return true;
            }
            entry.totals.clear();
            push(&mut entry.points, [0, 0], elapsed);
            second.saturating_sub(entry.last_busy) < KEPT_SECONDS as u64
        });
    }

    /// The series of `tenant`'s job `id`, its newest `seconds` at most.
    pub(crate) fn rates(&self, tenant: &str, id: &str, seconds: usize) -> Rates {
        let end = *super::jobs::lock(&self.last_second);
        let series = super::jobs::lock(&self.series);
        let Some(entry) = series.get(&(tenant.to_owned(), id.to_owned())) else {
            return Rates { end, ..Rates::default() };
        };
        let skip = entry.points.len().saturating_sub(seconds);
        let (records_in, records_out) = entry.points.iter().skip(skip).map(|[i, o]| (*i, *o)).unzip();
        Rates { end, records_in, records_out }
    }

    /// Forgets a deleted job.
    pub(crate) fn forget(&self, tenant: &str, id: &str) {
        super::jobs::lock(&self.series).remove(&(tenant.to_owned(), id.to_owned()));
    }
}

/// Appends `rate` for each of `seconds` seconds, keeping the newest hour.
fn push(points: &mut VecDeque<[u32; 2]>, rate: [u32; 2], seconds: usize) {
    for _ in 0..seconds {
        if points.len() == KEPT_SECONDS {
            points.pop_front();
        }
        points.push_back(rate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobKey {
        ("acme".into(), "j".into())
    }

    /// The job with its one task here.
    fn one(totals: [u64; 2]) -> [(JobKey, Counters); 1] {
        [(job(), vec![((String::new(), 0), totals)])]
    }

    #[test]
    fn rates_are_the_counters_differences_per_second() {
        let t = Throughput::default();
        t.sample(10_000, one([100, 50]));
        t.sample(10_500, one([999, 999])); // same second: ignored
        t.sample(11_000, one([400, 150]));
        t.sample(13_000, one([1000, 150])); // two seconds: the average
        let rates = t.rates("acme", "j", 60);
        assert_eq!(rates.end, 13);
        assert_eq!(rates.records_in, vec![0, 300, 300, 300]);
        assert_eq!(rates.records_out, vec![0, 100, 0, 0]);
    }

    #[test]
    fn a_restarted_job_counts_from_zero_and_a_stopped_one_goes_to_zero() {
        let t = Throughput::default();
        t.sample(1_000, one([500, 500]));
        t.sample(2_000, one([20, 10]));
        t.sample(3_000, []);
        let rates = t.rates("acme", "j", 60);
        assert_eq!(rates.records_in, vec![0, 20, 0]);
        assert_eq!(rates.records_out, vec![0, 10, 0]);
    }

    #[test]
    fn the_rate_is_every_sources_and_a_task_that_moves_is_no_spike() {
        let t = Throughput::default();
        let (here, there) = ("a".to_owned(), "b".to_owned());
        t.sample(1_000, [(job(), vec![((here.clone(), 0), [100, 100]), ((there.clone(), 1), [5_000, 5_000])])]);
        t.sample(2_000, [(job(), vec![((here.clone(), 0), [130, 110]), ((there.clone(), 1), [5_070, 5_020])])]);
        // Task 1 moves here and starts again from 0; its old member's
        // publication is gone.
        t.sample(3_000, [(job(), vec![((here.clone(), 0), [160, 120]), ((here.clone(), 1), [0, 0])])]);
        t.sample(4_000, [(job(), vec![((here.clone(), 0), [190, 130]), ((here.clone(), 1), [40, 40])])]);
        let rates = t.rates("acme", "j", 60);
        assert_eq!(rates.records_in, vec![0, 100, 30, 70]);
        assert_eq!(rates.records_out, vec![0, 30, 10, 50]);
    }

    #[test]
    fn a_series_keeps_one_hour_and_an_idle_stopped_job_is_forgotten() {
        let t = Throughput::default();
        t.sample(1_000, one([0, 0]));
        for s in 2..=5000u64 {
            t.sample(s * 1000, one([s, 0]));
        }
        assert_eq!(t.rates("acme", "j", usize::MAX).records_in.len(), KEPT_SECONDS);
        t.sample(5_001_000 + 3_600_000, []);
        assert_eq!(t.rates("acme", "j", usize::MAX), Rates { end: 5_001 + 3_600, ..Rates::default() });
    }
}
