//! Shared by the integration tests and benchmarks: building guest components
//! from source.
//!
//! Guests are real Rust crates of this workspace (examples/ and
//! tests/fixtures/), compiled for wasm32-wasip2 by the build of the test that
//! needs them, never checked in. They are built once per test binary, into
//! `target/guests` (a target dir of their own, so the nested cargo does not
//! wait on the lock of the cargo running the tests).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The crates built as guests.
const GUESTS: &[&str] = &[
    "uppercase",
    "filter",
    "running-count",
    "windowed-count",
    "dedup",
    "probe",
    "other-world",
    "counter-v2",
    "ttl-migrate",
    "packed-echo",
    "bad-timer",
];

/// The value after `name` on a benchmark's command line, if given.
pub fn arg_value(name: &str) -> Option<String> {
    let mut args = std::env::args().skip_while(|a| a != name);
    args.next()?;
    args.next()
}

/// The value of `--records N` on a benchmark's command line, else `default`.
pub fn records_arg(default: usize) -> usize {
    arg_value("--records").and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The median of a benchmark's rounds (the upper one of an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The broker of the benchmarks: `SLUICE_BENCH_BROKERS`, else one started
/// with scripts/kafka.sh on port 19292 (left running).
pub fn bench_brokers() -> String {
    if let Ok(brokers) = std::env::var("SLUICE_BENCH_BROKERS") {
        return brokers;
    }
    let script = workspace_root().join("scripts").join("kafka.sh");
    let status = Command::new(script).args(["start", "--port", "19292"]).status().expect("kafka.sh");
    assert!(status.success(), "scripts/kafka.sh start --port 19292 failed");
    "127.0.0.1:19292".into()
}

/// A name for this benchmark run's topics and groups: seconds since the
/// Unix epoch, so reruns against one broker never meet old data.
pub fn run_id() -> String {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0).to_string()
}

/// A field of `/proc/<pid>/status` (`pid` a number or `self`), in its unit
/// (kB for memory); 0 if the process or field is gone.
pub fn proc_status(pid: &str, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|v| v.trim_start_matches(':').split_whitespace().next()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// User plus system CPU time of process `pid` (a number or `self`) so far,
/// all threads; `None` once the process is gone. (Clock ticks of 10 ms,
/// the Linux default.)
pub fn process_cpu(pid: &str) -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(std::time::Duration::from_millis(ticks * 10))
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host/ has a parent").to_path_buf()
}

/// The path of the built component for the guest crate `name`, building all
/// guests first if this process has not yet.
pub fn guest(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = match BUILT.get_or_init(build_guests) {
        Ok(dir) => dir,
        Err(e) => panic!("building the guest components failed:\n{e}"),
    };
    let path = dir.join(format!("{}.wasm", name.replace('-', "_")));
    assert!(path.exists(), "no guest component at {}", path.display());
    path
}

/// The running-count example in `lang` (`rust`, `python`, `javascript`, `go`
/// or `c`): see [`example`].
pub fn running_count(lang: &str) -> PathBuf {
    example(lang, "running-count")
}

/// The example `name` in `lang`: the Rust one from [`guest`], the others
/// built from examples/<lang>/<name> with `sluice build` (which installs
/// their toolchains on the first run).
pub fn example(lang: &str, name: &str) -> PathBuf {
    if lang == "rust" {
        return guest(name);
    }
    let root = workspace_root();
    let file = format!("{}_{lang}.wasm", name.replace('-', "_"));
    let out = root.join("target").join("guests").join("languages").join(file);
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("build")
        .arg(root.join("examples").join(lang).join(name))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("sluice build");
    assert!(
        output.status.success(),
        "sluice build of the {lang} {name} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

fn build_guests() -> Result<PathBuf, String> {
    let root = workspace_root();
    let target_dir = root.join("target").join("guests");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(&root)
        .args(["build", "--profile", "guest", "--target", "wasm32-wasip2", "--target-dir"])
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    for guest in GUESTS {
        command.args(["-p", guest]);
    }
    let output = command.output().map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{}\n(is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`)",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(target_dir.join("wasm32-wasip2").join("guest"))
}
