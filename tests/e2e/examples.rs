//! The examples through a real job: the testdata input goes into a
//! one-partition topic, and the committed output is exactly the expected
//! output (keys and values, in order).

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sluice::exec::parse_record;

use crate::guests;
use crate::support::{self, JobOptions, Running};

fn check(example: &str, config: &[(&str, &str)]) {
    let brokers = support::brokers();
    let files = support::job(
        &brokers,
        JobOptions { name: example, module: example, partitions: 1, parallelism: 1, config, ..Default::default() },
    );
    let testdata = guests::workspace_root().join("examples/rust").join(example).join("testdata");
    let input = std::fs::read_to_string(testdata.join("input.jsonl")).expect("input");
    let records: Vec<(Vec<u8>, Vec<u8>)> = input
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| parse_record(l, i).expect("testdata parses"))
        // Kafka records here carry a key and a value; null values and
        // missing keys are covered by the exec tests.
        .filter(|r| r.key.is_some() && r.value.is_some())
        .map(|r| (r.key.unwrap_or_default(), r.value.unwrap_or_default()))
        .collect();
    // The expected output of exactly these records comes from `sluice exec`,
    // which the runtime tests check against the golden files.
    let expected: Vec<(Vec<u8>, Vec<u8>)> = {
        let tmp = tempfile::NamedTempFile::new().expect("tmp");
        let lines: String = records
            .iter()
            .map(|(k, v)| {
                format!("{}\n", serde_json::json!({"key_base64": BASE64.encode(k), "value_base64": BASE64.encode(v)}))
            })
            .collect();
        std::fs::write(tmp.path(), lines).expect("write");
        let mut exec = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
        exec.arg("exec").arg(guests::guest(example)).arg("--input").arg(tmp.path());
        for (k, v) in config {
            exec.arg("--config").arg(format!("{k}={v}"));
        }
        let output = exec.output().expect("sluice exec");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| {
                let v: serde_json::Value = serde_json::from_str(line).expect("json");
                (bytes_of(&v, "key"), bytes_of(&v, "value"))
            })
            .collect()
    };
    assert!(!expected.is_empty(), "the example produces output for its testdata");
    sluice::kafka::tools::produce(&brokers, &files.input, records).expect("produce");
    let job = Running::start(&files, &[]);
    let committed = support::read_committed(&brokers, &files.output, expected.len(), Duration::from_secs(60));
    let log = job.log_text();
    job.terminate();
    let got: Vec<(Vec<u8>, Vec<u8>)> =
        committed.iter().map(|r| (r.key.clone().unwrap_or_default(), r.value.clone().unwrap_or_default())).collect();
    assert_eq!(got, expected, "committed output of {example}; log:\n{log}");
}

/// The bytes of `field` in a `sluice exec` output line (`field` or `field_base64`).
fn bytes_of(line: &serde_json::Value, field: &str) -> Vec<u8> {
    match (line[field].as_str(), line[format!("{field}_base64")].as_str()) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(b64)) => BASE64.decode(b64).expect("base64"),
        (None, None) => Vec::new(),
    }
}

#[test]
fn uppercase() {
    check("uppercase", &[]);
}

#[test]
fn filter() {
    check("filter", &[("contains", "ERROR")]);
}

#[test]
fn running_count() {
    check("running-count", &[]);
}
