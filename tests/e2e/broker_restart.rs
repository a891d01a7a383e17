//! Stop the broker mid-job and start it again; the job rides it out
//! (restarting its tasks as needed) and the output is exact. Uses a broker
//! of its own so the other tests keep theirs.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice::kafka::tools::{self, ReadRecord};

use crate::guests;
use crate::support::{self, JobOptions, Running};

/// This test's own broker, which it stops and starts; with its controller
/// it holds 19192 and 19193 (see hardening's `RETENTION_PORT`).
const PORT: u16 = 19192;

#[test]
fn broker_stops_and_starts_mid_job() {
    let dir = guests::workspace_root().join(".kafka").join("e2e-broker-restart");
    support::start_broker(PORT, Some(&dir));
    let brokers = format!("127.0.0.1:{PORT}");
    let files = support::job(&brokers, JobOptions { name: "broker-restart", ..Default::default() });
    let mut inputs = support::produce_keyed(&brokers, &files.input, 0..10_000, 101);

    let job = Running::start(&files, &[]);
    let first = support::read_committed(&brokers, &files.output, 10_000, Duration::from_secs(120));
    assert_eq!(first.len(), 10_000, "log:\n{}", job.log_text());

    // More input, then the broker goes away for a while mid-stream.
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 10_000..20_000, 101));
    std::thread::sleep(Duration::from_millis(300));
    support::stop_broker(PORT, Some(&dir));
    std::thread::sleep(Duration::from_secs(5));
    support::start_broker(PORT, Some(&dir));
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &files.input, 20_000..30_000, 101));

    let committed = support::read_committed(&brokers, &files.output, 30_000, Duration::from_secs(240));
    let log = job.log_text();
    // A shortfall names where it is: the job stalled (an output partition
    // holds no more records than were committed, beside aborted ones) or
    // an output partition's committed end did (it holds them, uncommitted).
    let shortfall = (committed.len() < 30_000).then(|| {
        let per_partition = |records: &[ReadRecord]| {
            let mut counts = BTreeMap::<i32, usize>::new();
            records.iter().for_each(|r| *counts.entry(r.partition).or_default() += 1);
            counts
        };
        // Everything the topic holds: no stop condition, so all of its 10 s.
        let in_topic = tools::read_all(&brokers, &files.output, false, Duration::from_secs(10), |_| false)
            .expect("read the output, uncommitted records too");
        format!(
            "committed per output partition {:?}; in the topic, uncommitted and aborted ones too, {:?}",
            per_partition(&committed),
            per_partition(&in_topic)
        )
    });
    job.terminate();
    support::stop_broker(PORT, Some(&dir));
    if let Some(shortfall) = shortfall {
        panic!(
            "{} of 30000 outputs committed once the broker was back: {shortfall}; the job's log:\n{log}",
            committed.len()
        );
    }
    assert!(
        log.contains(&format!("Connect to ipv4#127.0.0.1:{PORT} failed")),
        "the job never noticed the broker was gone:\n{log}"
    );
    support::verify_running_count(&committed, &inputs);
}
