//! Cold start: from the start of a module's upload to its job's first
//! committed output, per guest language, on a host that has never compiled
//! the module (a fresh data dir, so no compile cache). Each language runs
//! twice in the same run: with the baseline tier (the default: the upload
//! compiles with Winch and answers, the job starts on that code, Cranelift
//! compiles in the background) and without it (`--no-baseline`: Cranelift
//! compiles before the upload answers), the baseline of the comparison.
//!
//! `cargo bench -p sluice --bench coldstart [-- --langs rust,c,go,python,javascript]`.
//! The host runs in this process (the same `Service` as `sluice serve`) on
//! a real broker: `SLUICE_BENCH_BROKERS`, else one started with
//! scripts/kafka.sh on port 19292. The job is the language's running-count
//! example with 100 ms checkpoints; its input (10 records) is in Kafka
//! before the upload starts. Prints a markdown table.

#![allow(missing_docs, unreachable_pub)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use sluice::kafka::tools;
use sluice::runtime::Tier;
use sluice::service::{Caller, JobState, LogHub, Service, ServiceConfig};

/// One cold start's figures.
struct ColdStart {
    /// Until the upload answered (validated, compiled, stored).
    upload: Duration,
    /// Until the job's first output was committed.
    first_output: Duration,
    /// Until the job ran optimized code (the status says so), if it did
    /// within a minute.
    optimized: Option<Duration>,
}

fn cold_start(lang: &str, bytes: &[u8], brokers: &str, run: &str, baseline: bool) -> ColdStart {
    let dir = tempfile::tempdir().expect("temp dir");
    let service = Service::open(
        ServiceConfig {
            data_dir: dir.path().to_owned(),
            brokers: brokers.to_owned(),
            admin_token: "coldstart-admin-token-0123456789".into(),
            max_module_bytes: 64 << 20,
            max_instances: 16,
            cluster: None,
            baseline,
        },
        LogHub::default(),
    )
    .expect("service");
    let tenant = format!("cold{run}{lang}{}", if baseline { "b" } else { "o" });
    let (_, token) = service.create_tenant(&Caller::Admin, &tenant, None).expect("tenant");
    let caller = service.authenticate(Some(&token)).expect("token");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(brokers, &[(&input, 1), (&output, 1)]).expect("topics");
    let records = (0..10).map(|i| (format!("key-{i}").into_bytes(), format!("value {i}").into_bytes()));
    tools::produce(brokers, &input, records).expect("produce");

    let started = Instant::now();
    let upload = service.upload_bytes(bytes).expect("upload");
    service.push_module(&caller, Some("running-count"), upload).expect("module");
    let uploaded = started.elapsed();
    let spec = json!({"id": "j", "module": "running-count", "input": {"topics": [input]},
        "output": {"topics": [output]}, "checkpoint": {"interval": "100ms"}});
    service.create_job(&caller, spec).expect("job");
    let read = tools::read_all(brokers, &output, true, Duration::from_secs(120), |r| !r.is_empty()).expect("read");
    let first_output = started.elapsed();
    assert!(!read.is_empty(), "{lang}: no committed output within 120 s");

    let optimized = loop {
        let status = service.job_status(&caller, "j").expect("status");
        assert_eq!(status.state, JobState::Running, "{lang}: {status:?}");
        if !status.tasks.is_empty() && status.tasks.iter().all(|t| t.code == Some(Tier::Optimized)) {
            break Some(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(120) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    service.shutdown();
    ColdStart { upload: uploaded, first_output, optimized }
}

fn seconds(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

fn main() {
    let langs = support::arg_value("--langs").unwrap_or_else(|| "rust,c,go,python,javascript".into());
    let brokers = support::bench_brokers();
    let run = support::run_id();
    let mut table = String::from(
        "| language | module MiB | upload s | first output s | optimized code after s | without baseline: upload s | first output s | first output vs without |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for lang in langs.split(',') {
        let bytes = std::fs::read(support::running_count(lang)).expect("component");
        let without = cold_start(lang, &bytes, &brokers, &run, false);
        let with = cold_start(lang, &bytes, &brokers, &run, true);
        eprintln!(
            "coldstart: {lang}: first output after {:.2} s (upload {:.2} s); without baseline {:.2} s (upload {:.2} s)",
            with.first_output.as_secs_f64(),
            with.upload.as_secs_f64(),
            without.first_output.as_secs_f64(),
            without.upload.as_secs_f64()
        );
        table.push_str(&format!(
            "| {lang} | {:.1} | {} | {} | {} | {} | {} | {:.2}x |\n",
            bytes.len() as f64 / (1 << 20) as f64,
            seconds(with.upload),
            seconds(with.first_output),
            with.optimized.map_or("-".into(), seconds),
            seconds(without.upload),
            seconds(without.first_output),
            with.first_output.as_secs_f64() / without.first_output.as_secs_f64(),
        ));
    }
    println!("{table}");
}
