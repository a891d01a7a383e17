//! The native pipeline the benches hold sluice against: sluice's own Kafka
//! source and transactional sink, one thread per task, a commit whenever the
//! coordinator asks for a barrier (as sluice's tasks do), and no Wasm and
//! no state snapshots. The per-record work is the caller's `map`.
//!
//! Shared by the pipeline bench (a copier) and the peers bench (an
//! in-memory running count, or an in-memory tumbling-window count).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::ClientConfig;
use sluice::checkpoint::Coordinator;
use sluice::kafka::{Mark, Result, Sink, Source, StartPosition};
use sluice::record::{InputRecord, OutputRecord};

/// Where one task reads and writes.
pub struct Task<'a> {
    pub config: &'a ClientConfig,
    pub group: &'a str,
    pub transactional_id: &'a str,
    pub input: &'a str,
    /// This task's partitions of `input`.
    pub partitions: Vec<i32>,
    pub output: &'a str,
}

/// Partitions `0..partitions` spread round-robin: those of task `task` of
/// `tasks`, as sluice assigns them.
pub fn partitions_of(task: usize, tasks: usize, partitions: i32) -> Vec<i32> {
    (0..partitions).filter(|p| *p as usize % tasks == task).collect()
}

/// Runs `task` until `stop`, writing `map(record)` for every input record
/// and committing the input offsets with the outputs at each barrier.
pub fn run(
    task: &Task<'_>,
    coordinator: &Coordinator,
    stop: &AtomicBool,
    mut map: impl FnMut(&InputRecord) -> OutputRecord,
) -> Result<()> {
    run_many(task, coordinator, stop, |record, out| out.push(map(record)))
}

/// [`run`], where each input record gives the outputs `map` pushes (none,
/// one or many).
#[allow(dead_code)] // the pipeline bench, which shares this module, uses `run` only
pub fn run_many(
    task: &Task<'_>,
    coordinator: &Coordinator,
    stop: &AtomicBool,
    mut map: impl FnMut(&InputRecord, &mut Vec<OutputRecord>),
) -> Result<()> {
    let sink =
        Sink::connect(task.config, task.transactional_id, &[task.output.to_string()], None, Duration::from_secs(30))?;
    let mut source = Source::connect(task.config, task.group, StartPosition::Earliest)?;
    let partitions: Vec<(String, i32)> = task.partitions.iter().map(|p| (task.input.to_string(), *p)).collect();
    source.assign(&partitions, &Default::default(), Duration::from_secs(30))?;
    let group = source.group_metadata().expect("a consumer with a group id has group metadata");
    sink.begin()?;
    let (mut last, mut pending) = (0u64, 0usize);
    let mut outputs = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let batch = source.poll_batch(512, Duration::from_millis(20))?;
        for record in &batch {
            map(record, &mut outputs);
        }
        // As sluice's tasks send a batch's outputs.
        sink.send_all(&outputs)?;
        outputs.clear();
        sink.serve();
        pending += batch.len();
        let requested = coordinator.requested();
        if requested > last && pending > 0 {
            sink.flush()?;
            let mark = Mark { checkpoint: requested, changelog: None, migrated: None, run: Some(0), incarnation: None };
            sink.send_offsets(&source.offsets(), mark, &Default::default(), &group)?;
            sink.commit(requested)?;
            sink.begin()?;
            (last, pending) = (requested, 0);
        }
    }
    Ok(())
}
