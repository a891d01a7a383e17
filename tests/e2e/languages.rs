//! Conformance: running-count in Rust, Python, JavaScript, Go and C gives
//! byte-identical read_committed output for the same input, through a
//! kill -9 and a restart mid-stream; and the restart loads the compiled
//! module from the cache instead of compiling it again (which takes ~20 s
//! for the 10+ MB Python and JavaScript components). And windowed-count, in
//! every language, gives the same committed windows. Each language is
//! recognised from its component.
//!
//! The guests are built from source by `sluice build` (Rust by the test
//! harness), with the toolchains `scripts/toolchains/` installs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use sluice::kafka::tools;

use crate::guests;
use crate::support::{self, JobFiles, Running, unique};

const LANGUAGES: [&str; 5] = ["rust", "python", "javascript", "go", "c"];

/// Builds every language's running-count once per test binary.
fn components() -> &'static BTreeMap<&'static str, PathBuf> {
    static BUILT: OnceLock<BTreeMap<&'static str, PathBuf>> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = guests::workspace_root();
        let out_dir = root.join("target").join("guests").join("languages");
        std::fs::create_dir_all(&out_dir).expect("out dir");
        let mut built = BTreeMap::from([("rust", guests::guest("running-count"))]);
        for lang in &LANGUAGES[1..] {
            let out = out_dir.join(format!("running_count_{lang}.wasm"));
            let project = root.join("examples").join(lang).join("running-count");
            let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
                .arg("build")
                .arg(&project)
                .arg("--out")
                .arg(&out)
                .output()
                .expect("run sluice build");
            assert!(
                output.status.success(),
                "sluice build {lang} failed:\n{}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            built.insert(*lang, out);
        }
        built
    })
}

/// A job `name` (unique per test: ids are unique per prefix, not per call)
/// over `input` with `module`.
fn job_file(brokers: &str, name: &str, module: &PathBuf, input: &str) -> JobFiles {
    let id = unique(name);
    let output = format!("{id}-out");
    tools::create_topics(brokers, &[(&output, 2)]).expect("output topic");
    let dir = tempfile::tempdir().expect("temp dir");
    let text = format!(
        "id = \"{id}\"\nbrokers = \"{brokers}\"\nmodule = {module:?}\nparallelism = 2\nbatch-size = 100\n\n\
         [input]\ntopics = [\"{input}\"]\n\n[output]\ntopics = [\"{output}\"]\n\n[checkpoint]\ninterval = \"200ms\"\n"
    );
    let job_file = dir.path().join("job.toml");
    std::fs::write(&job_file, text).expect("job file");
    JobFiles { dir, job_file, id, input: input.to_owned(), output }
}

/// The host tells each language's component apart by what its toolchain
/// recorded (the dashboard and the module list show it).
#[test]
fn each_language_is_recognised_from_its_component() {
    for (lang, path) in components() {
        let bytes = std::fs::read(path).expect("a built component");
        let expected = match *lang {
            "rust" => "Rust",
            "python" => "Python",
            "javascript" => "JavaScript",
            "go" => "Go",
            _ => "C",
        };
        assert_eq!(sluice::runtime::source_language(&bytes), Some(expected), "{}", path.display());
    }
}

#[test]
fn every_language_gives_the_same_committed_output_through_a_crash() {
    let brokers = support::brokers();
    let components = components();
    let input = format!("{}-in", unique("conform"));
    tools::create_topics(&brokers, &[(&input, 2)]).expect("input topic");
    let mut inputs = support::produce_keyed(&brokers, &input, 0..3_000, 23);

    let jobs: Vec<(&str, JobFiles)> = LANGUAGES
        .iter()
        .map(|lang| (*lang, job_file(&brokers, &format!("conform-{lang}"), &components[lang], &input)))
        .collect();
    // First lives: each job reads part of the input, then dies by kill -9.
    for (lang, files) in &jobs {
        let mut job = Running::start(files, &[]);
        let seen = tools::read_all(&brokers, &files.output, true, Duration::from_secs(180), |r| r.len() >= 1_000)
            .expect("read committed");
        assert!(seen.len() >= 1_000, "{lang}: no progress; log:\n{}", job.log_text());
        // A module new to the cache runs on baseline code while its
        // optimized code compiles in the background; once that is cached,
        // a restart needs no compiler.
        let component = std::fs::read(&components[lang]).expect("component");
        let prefix = format!("{}-", sluice::runtime::sha256_hex(&component));
        let cache = guests::workspace_root().join("target").join("test-cache");
        let cached = || {
            std::fs::read_dir(&cache).into_iter().flatten().flatten().any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(&prefix) && name.ends_with(".cwasm")
            })
        };
        let waited = std::time::Instant::now();
        while !cached() {
            assert!(
                waited.elapsed() < Duration::from_secs(180),
                "{lang}: no optimized code cached; log:\n{}",
                job.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        job.kill9();
    }
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 3_000..6_000, 23));
    // Second lives: from the last checkpoint to the end, without compiling again.
    let total: u64 = inputs.values().sum();
    // Per output partition and key, the values in offset order: what a
    // reader can rely on (two tasks write into one partition concurrently,
    // so how their records interleave is not part of the output's meaning).
    type Output = BTreeMap<(i32, Option<Vec<u8>>), Vec<Option<Vec<u8>>>>;
    let mut outputs: Vec<(&str, Output)> = Vec::new();
    for (lang, files) in &jobs {
        let job = Running::start(files, &[]);
        let committed = support::read_committed(&brokers, &files.output, total as usize, Duration::from_secs(180));
        let log = job.log_text();
        job.terminate();
        assert!(!log.contains("compiled module"), "{lang}: the restart compiled the module again; log:\n{log}");
        assert_eq!(committed.len() as u64, total, "{lang}: committed outputs after the restart; its log:\n{log}");
        support::verify_running_count(&committed, &inputs);
        let mut records: Vec<_> = committed.into_iter().map(|r| (r.partition, r.offset, r.key, r.value)).collect();
        records.sort_by_key(|r| (r.0, r.1));
        let mut output = Output::new();
        for (partition, _, key, value) in records {
            output.entry((partition, key)).or_default().push(value);
        }
        outputs.push((lang, output));
    }
    let (reference_lang, reference) = &outputs[0];
    for (lang, output) in &outputs[1..] {
        assert!(output == reference, "{lang}'s committed output differs from {reference_lang}'s");
    }
}

/// windowed-count in every language gives the same committed
/// windows for the same input (1 s windows, event time), through a kill -9
/// and a restart mid-stream.
#[test]
fn windowed_count_gives_the_same_windows_in_every_language() {
    let brokers = support::brokers();
    let input = format!("{}-in", unique("conform-windows"));
    tools::create_topics(&brokers, &[(&input, 2)]).expect("input topic");
    let t0 = support::event_time_origin();
    let records = |range: std::ops::Range<i64>| -> Vec<(Vec<u8>, Vec<u8>, Option<i64>)> {
        range.map(|i| (format!("key-{}", i % 13).into_bytes(), b"click".to_vec(), Some(t0 + i * 7))).collect()
    };
    tools::produce_timed(&brokers, &input, None, records(0..2_000)).expect("produce");
    let jobs: Vec<(&str, JobFiles)> = LANGUAGES
        .iter()
        .map(|lang| {
            let module = guests::example(lang, "windowed-count");
            let files = job_file(&brokers, &format!("conform-windows-{lang}"), &module, &input);
            let text = std::fs::read_to_string(&files.job_file).expect("job file");
            std::fs::write(&files.job_file, format!("{text}\n[transform.config]\nwindow = \"1s\"\n"))
                .expect("job file");
            (*lang, files)
        })
        .collect();
    for (lang, files) in &jobs {
        let mut job = Running::start(files, &[]);
        let seen = tools::read_all(&brokers, &files.output, true, Duration::from_secs(180), |r| r.len() >= 20)
            .expect("read committed");
        assert!(seen.len() >= 20, "{lang}: no windows; log:\n{}", job.log_text());
        job.kill9();
    }
    tools::produce_timed(&brokers, &input, None, records(2_000..4_000)).expect("produce");
    for partition in 0..2 {
        let flush = vec![(b"flush".to_vec(), b"click".to_vec(), Some(t0 + 1_800_000))];
        tools::produce_timed(&brokers, &input, Some(partition), flush).expect("produce");
    }
    // 4,000 records 7 ms apart: windows [t0 + k s, ...) for k in 0..28, per key.
    let expected_windows = (0..4_000i64)
        .map(|i| (i % 13, (t0 + i * 7).div_euclid(1_000)))
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    // Each language's committed windows, (key, value), sorted.
    type Windows = Vec<(Vec<u8>, Vec<u8>)>;
    let mut outputs: Vec<(&str, Windows)> = Vec::new();
    for (lang, files) in &jobs {
        let job = Running::start(files, &[]);
        let committed = support::read_committed(&brokers, &files.output, expected_windows, Duration::from_secs(180));
        let log = job.log_text();
        job.terminate();
        assert_eq!(committed.len(), expected_windows, "{lang}: each window once; log:\n{log}");
        let mut windows: Vec<(Vec<u8>, Vec<u8>)> =
            committed.into_iter().map(|r| (r.key.unwrap_or_default(), r.value.unwrap_or_default())).collect();
        windows.sort();
        outputs.push((lang, windows));
    }
    let (reference_lang, reference) = &outputs[0];
    for (lang, output) in &outputs[1..] {
        assert!(output == reference, "{lang}'s committed windows differ from {reference_lang}'s");
    }
}

/// A module new to the host starts on Winch's baseline code; once
/// Cranelift's is ready, each task moves to it between batches with its
/// state, mid-stream: the committed output stays exactly once, and the
/// optimized code is cached for the next start.
#[test]
fn a_job_moves_to_its_optimized_code_mid_stream_exactly_once() {
    let brokers = support::brokers();
    let input = format!("{}-in", unique("tiers"));
    tools::create_topics(&brokers, &[(&input, 2)]).expect("input topic");
    let files = job_file(&brokers, "tiers", &components()["go"], &input);
    let cache = tempfile::tempdir().expect("cache dir");
    let cache_dir = cache.path().to_str().expect("a UTF-8 temp dir");
    let job = Running::start(&files, &[("SLUICE_CACHE_DIR", cache_dir)]);
    // Records keep coming while the optimizer compiles: some are counted
    // on the baseline code, the rest on the optimized code.
    let mut inputs = BTreeMap::new();
    let moved = |log: &str| log.matches("the task runs the module's optimized code now").count();
    let waited = std::time::Instant::now();
    let mut next = 0;
    while moved(&job.log_text()) < 2 {
        assert!(waited.elapsed() < Duration::from_secs(180), "the tasks did not move; log:\n{}", job.log_text());
        support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, next..next + 100, 23));
        next += 100;
        std::thread::sleep(Duration::from_millis(200));
    }
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, next..next + 2_000, 23));
    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &files.output, total as usize, Duration::from_secs(180));
    let log = job.log_text();
    job.terminate();
    assert!(log.contains("compiled module (baseline)"), "it did not start on baseline code; log:\n{log}");
    support::verify_running_count(&committed, &inputs);
    let cached = std::fs::read_dir(cache.path()).expect("cache dir").flatten().count();
    assert_eq!(cached, 1, "the optimized code is cached");
}
