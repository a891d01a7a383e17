//! Each example under examples/rust/<name>/testdata runs through the real
//! `sluice exec` binary: `input.jsonl` in, exactly `expected.jsonl` out, with
//! the extra arguments listed one per line in `args`.

use std::path::Path;
use std::process::Command;

use super::support;

fn exec(module: &Path, args: &[String], input: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("exec")
        .arg(module)
        .arg("--input")
        .arg(input)
        .args(args)
        .env("SLUICE_CACHE_DIR", support::workspace_root().join("target").join("test-cache"))
        .output()
        .expect("run sluice exec")
}

fn check_example(name: &str) {
    check_example_in("rust", name);
}

/// The example `name` in `lang`, against its own testdata (which for the
/// other languages is a copy of the Rust example's: the same output).
fn check_example_in(lang: &str, name: &str) {
    let dir = support::workspace_root().join("examples").join(lang).join(name).join("testdata");
    let args: Vec<String> = std::fs::read_to_string(dir.join("args"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    let output = exec(&support::example(lang, name), &args, &dir.join("input.jsonl"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "sluice exec failed for {lang} {name}: {stderr}");
    let expected = std::fs::read_to_string(dir.join("expected.jsonl")).expect("expected.jsonl");
    assert_eq!(String::from_utf8_lossy(&output.stdout), expected, "output of {lang} {name} (stderr: {stderr})");
    if lang != "rust" {
        let rust = support::workspace_root().join("examples/rust").join(name).join("testdata");
        for file in ["input.jsonl", "args", "expected.jsonl"] {
            let read = |dir: &Path| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
            assert_eq!(read(&dir), read(&rust), "{lang} {name}'s {file} is the Rust example's");
        }
    }
}

#[test]
fn uppercase() {
    check_example("uppercase");
}

#[test]
fn filter() {
    check_example("filter");
}

#[test]
fn filter_drop_mode_inverts() {
    let dir = support::workspace_root().join("examples/rust/filter/testdata");
    let args = ["--config".to_string(), "contains=ERROR".into(), "--config".into(), "mode=drop".into()];
    let output = exec(&support::guest("filter"), &args, &dir.join("input.jsonl"));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let keys: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["key"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(keys, ["2", "4", "5"]);
}

#[test]
fn filter_without_its_config_fails_with_a_clear_error() {
    let dir = support::workspace_root().join("examples/rust/filter/testdata");
    let output = exec(&support::guest("filter"), &[], &dir.join("input.jsonl"));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("contains"), "the error names the missing key: {stderr}");
}

#[test]
fn running_count() {
    check_example("running-count");
}

#[test]
fn windowed_count() {
    check_example("windowed-count");
}

#[test]
fn dedup() {
    check_example("dedup");
}

#[test]
fn python_windowed_count() {
    check_example_in("python", "windowed-count");
}

#[test]
fn python_dedup() {
    check_example_in("python", "dedup");
}

#[test]
fn javascript_windowed_count() {
    check_example_in("javascript", "windowed-count");
}

#[test]
fn javascript_dedup() {
    check_example_in("javascript", "dedup");
}

#[test]
fn go_windowed_count() {
    check_example_in("go", "windowed-count");
}

#[test]
fn go_dedup() {
    check_example_in("go", "dedup");
}

#[test]
fn c_windowed_count() {
    check_example_in("c", "windowed-count");
}

#[test]
fn c_dedup() {
    check_example_in("c", "dedup");
}

#[test]
fn bad_input_names_the_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"key\": \"a\"}\nnot json\n").expect("write");
    let output = exec(&support::guest("running-count"), &[], &input);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("input line 2"), "{stderr}");
}

/// The Python SDK's C core counts references through the running CPython
/// 3.14's own functions: that interpreter hands out None, small ints and
/// one-byte bytes as immortal objects without counting a reference, so an
/// inline count (the 3.11 headers' macros) moved theirs by one per record
/// until, some 1.3e9 records on, one would be freed. The fixture reports
/// those counts after every batch; they must not move. It also reports that
/// the component runs the C core at all (build.sh always builds it in; the
/// SDK would fall back to pure Python if it failed to import).
#[test]
fn the_python_c_core_leaves_immortal_objects_uncounted() {
    let root = support::workspace_root();
    let module = root.join("target").join("guests").join("languages").join("python_refcounts.wasm");
    let built = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("build")
        .arg(root.join("host/tests/runtime/python-refcounts"))
        .arg("--out")
        .arg(&module)
        .output()
        .expect("sluice build");
    assert!(built.status.success(), "sluice build failed: {}", String::from_utf8_lossy(&built.stderr));
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("input.jsonl");
    // One-byte values (immortal in 3.14) and None on every record.
    let lines: String = (0..5000).map(|i| format!("{{\"key\": \"k{}\", \"value\": \"x\"}}\n", i % 7)).collect();
    std::fs::write(&input, lines).expect("write input");
    let output = exec(&module, &["--batch-size".into(), "500".into()], &input);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "sluice exec failed: {}", String::from_utf8_lossy(&output.stderr));
    let counts: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(r#""key":"refcounts""#))
        .map(|l| l.rsplit(r#""value":""#).next().unwrap_or_default().trim_end_matches("\"}"))
        .collect();
    assert!(stdout.contains(r#"{"key":"c-core","value":"True"}"#), "the component runs the C core: {stdout}");
    assert_eq!(counts.len(), 10, "one report per batch of 500: {stdout}");
    assert!(counts.iter().all(|c| *c == counts[0]), "the counts moved from batch to batch: {counts:?}");
}

/// Every part of a record reaches a guest of the Rust SDK through
/// `process-packed` as it would through `process`: keys (none, empty),
/// values (tombstones, not UTF-8), headers (repeated, empty) and records of
/// two topics in one batch. The uppercase example hands each back.
#[test]
fn a_packed_batch_carries_every_part_of_a_record() {
    use sluice::record::{Header, InputRecord};
    use sluice::runtime::InstanceLimits;
    use sluice::state::TaskState;

    let (runtime, _cache) = super::runtime();
    let module = runtime.load_file(&support::example("rust", "uppercase")).expect("loads");
    assert_eq!(
        module.world(),
        "packed-out",
        "the Rust SDK's modules take packed batches, hold state across them and return packed outputs"
    );
    let mut instance = runtime
        .instantiate(&module, "test/uppercase", TaskState::in_memory(), InstanceLimits::default())
        .expect("instance");
    instance.init(&[]).expect("init");
    let header = |k: &str, v: &[u8]| Header { key: k.into(), value: v.to_vec() };
    let record =
        |topic: &str, offset: i64, key: Option<&[u8]>, value: Option<&[u8]>, headers: Vec<Header>| InputRecord {
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            headers,
            timestamp: (offset % 2 == 0).then_some(offset),
            topic: topic.into(),
            partition: 3,
            offset,
        };
    let batch = vec![
        record("in", 0, Some(b"k"), Some(b"abc"), vec![header("h", b"1"), header("h", b""), header("x", b"\xff")]),
        record("other", 1, None, Some(b"d\xffe"), Vec::new()),
        record("in", 2, Some(b""), None, vec![header("", b"")]),
        record("other", 3, Some(&[0, 0xff]), Some(b""), Vec::new()),
    ];
    let outputs = instance.process(&batch).expect("process");
    assert_eq!(outputs.len(), batch.len());
    for (input, output) in batch.iter().zip(&outputs) {
        assert_eq!(output.key, input.key, "{input:?}");
        let pairs = |headers: &[Header]| headers.iter().map(|h| (h.key.clone(), h.value.clone())).collect::<Vec<_>>();
        assert_eq!(pairs(&output.headers), pairs(&input.headers), "{input:?}");
        let want = input.value.as_ref().map(|v| match std::str::from_utf8(v) {
            Ok(text) => text.to_uppercase().into_bytes(),
            Err(_) => v.clone(),
        });
        assert_eq!(output.value, want, "{input:?}");
    }
}
