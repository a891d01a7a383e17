//! kill -9 at random moments while input streams in; restart each time;
//! verify. `SLUICE_E2E_RECORDS` and `SLUICE_E2E_KILLS` raise the load locally.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support::{self, JobOptions, Running};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn random_kill_9_loop() {
    let records = env_or("SLUICE_E2E_RECORDS", 100_000);
    let kills = env_or("SLUICE_E2E_KILLS", 20);
    let brokers = support::brokers();
    // Epochs span a few input chunks, so while input streams in an epoch
    // with output on the broker is almost always open: most kills land in
    // one, whatever the machine's speed.
    let files = support::job(&brokers, JobOptions { name: "crash-loop", interval: "500ms", ..Default::default() });

    // Input streams in for as long as the job is killed and restarted (and
    // at least until `records` are in), so every kill can find work in
    // flight rather than an idle job that has caught up.
    let killing = Arc::new(AtomicBool::new(true));
    let producer = {
        let brokers = brokers.clone();
        let topic = files.input.clone();
        let killing = Arc::clone(&killing);
        std::thread::spawn(move || {
            let chunk = records.div_ceil((kills * 2).max(1));
            let mut inputs = std::collections::BTreeMap::new();
            let mut produced = 0;
            while produced < records || killing.load(Ordering::Acquire) {
                let more = support::produce_keyed(&brokers, &topic, produced..produced + chunk, 1_009);
                support::add_counts(&mut inputs, more);
                produced += chunk;
                std::thread::sleep(Duration::from_millis(250));
            }
            inputs
        })
    };

    // A fixed seed: the same kill schedule every run.
    let mut seed: u64 = 0x5eed_cafe;
    let mut next = move || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % 1_000
    };
    for kill in 0..kills {
        let mut job = Running::start(&files, &[]);
        // The clock starts once the job has recovered and reads: a kill
        // during start-up would interrupt nothing.
        let started = Instant::now();
        while !job.log_text().contains("recovered from the last committed checkpoint") {
            if let Some(status) = job.wait_exit(Duration::from_millis(50)) {
                panic!("the job exited on its own ({status}) before kill {kill}; log:\n{}", job.log_text());
            }
            assert!(started.elapsed() < Duration::from_secs(60), "no recovery within 60 s; log:\n{}", job.log_text());
        }
        let alive = Duration::from_millis(400 + next() * 2);
        let started = Instant::now();
        while started.elapsed() < alive {
            if let Some(status) = job.wait_exit(Duration::from_millis(50)) {
                panic!("the job exited on its own ({status}) before kill {kill}; log:\n{}", job.log_text());
            }
        }
        job.kill9();
    }
    killing.store(false, Ordering::Release);
    let inputs = producer.join().expect("producer thread");
    let total: u64 = inputs.values().sum();

    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, total as usize, Duration::from_secs(240));
    let log = job.log_text();
    job.terminate();
    assert!(log.contains("recovered from the last committed checkpoint"), "log:\n{log}");
    // The kills landed mid-epoch: the output topic holds records of aborted
    // transactions that read_committed consumers never saw.
    let everything = support::read_uncommitted_count(&brokers, &files.output, committed.len());
    assert!(
        everything > committed.len(),
        "no aborted output: the kills never interrupted an epoch ({everything} records)"
    );
    support::verify_running_count(&committed, &inputs);
}
