//! The guest languages side by side: per language, the running-count
//! component's size, its first compile time (Cranelift, and Winch's
//! baseline compile), its load time from the compile cache, and records/s
//! through it (in-process, state in memory, batches of 256, 200,000 records
//! over 10,000 keys), on optimized and on baseline code. The baseline of
//! the ratios is the Rust guest, measured in the same run: each language's
//! records/s on optimized code is taken in three rounds, each right after a
//! round of the Rust guest, and its ratio is the median of the three
//! rounds' ratios (this machine's speed drifts by up to 1.5x within a run,
//! which a ratio of two figures taken minutes apart inherits).
//!
//! Two ways of keeping the state, each its own rounds and ratio: written
//! back after every batch (the guest may not hold it), and held as in a
//! job (every SDK holds a shard's cache from batch to batch, world
//! `cached`, and the host takes it back, `flush-state`, every 20,000
//! records here, as a 100 ms checkpoint interval at 200,000 records/s
//! would; the take-backs are timed too).
//!
//! `cargo bench -p sluice --bench languages`. Builds the Python,
//! JavaScript, Go and C examples with `sluice build` (installing their
//! toolchains on the first run), prints a markdown table and writes it to
//! docs/languages.md. `-- --languages rust,python` measures only those
//! (Rust always, as the baseline) and leaves docs/languages.md alone.

#![allow(missing_docs, unreachable_pub)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use sluice::record::InputRecord;
use sluice::runtime::{InstanceLimits, Runtime, RuntimeConfig, Tier};
use sluice::state::TaskState;

const RECORDS: usize = 200_000;
const KEYS: usize = 10_000;
const BATCH: usize = 256;
/// Every language, in the table's order; Rust first, the baseline.
const ALL: [&str; 5] = ["rust", "python", "javascript", "go", "c"];
/// Rounds of a language's optimized records/s, each paired with one of Rust's.
const ROUNDS: usize = 3;
/// Records between two take-backs of held state (a checkpoint's
/// `flush-state`) in the held rounds.
const CHECKPOINT_RECORDS: usize = 20_000;

struct Row {
    lang: &'static str,
    size: u64,
    compile: Duration,
    baseline_compile: Duration,
    cached_load: Duration,
    records_per_second: f64,
    /// The median over the rounds of its records/s over Rust's just before.
    vs_rust: f64,
    /// As the two above, with state held as in a job.
    held_records_per_second: f64,
    held_vs_rust: f64,
    baseline_records_per_second: f64,
}

/// The Rust guest, loaded, to pair each language's rounds with.
struct RustBaseline {
    runtime: Runtime,
    module: sluice::runtime::Module,
}

/// A ratio to two decimals, or to two significant digits below 0.1, so
/// that a slow language's progress shows (0.014x, not 0.01x).
fn ratio(value: f64) -> String {
    match value {
        v if v >= 0.1 => format!("{v:.2}"),
        v if v >= 0.01 => format!("{v:.3}"),
        v => format!("{v:.4}"),
    }
}

/// Records/s of `module` through a new instance: with `held`, state held
/// from batch to batch and taken back every [`CHECKPOINT_RECORDS`] records
/// and at the end; else written back after every batch.
fn throughput(
    runtime: &Runtime,
    module: &sluice::runtime::Module,
    lang: &str,
    records: &[InputRecord],
    held: bool,
) -> f64 {
    let mut instance =
        runtime.instantiate(module, lang, TaskState::in_memory(), InstanceLimits::default()).expect("instantiate");
    if !held {
        instance.forbid_holding();
    }
    instance.init(&[]).expect("init");
    let started = Instant::now();
    let (mut outputs, mut since_checkpoint) = (0, 0);
    // The outputs in the form a task hands its sink (`Instance::transform`).
    for batch in records.chunks(BATCH) {
        outputs += instance.transform(batch).expect("process").len();
        since_checkpoint += batch.len();
        if held && since_checkpoint >= CHECKPOINT_RECORDS {
            instance.flush_state().expect("flush-state");
            since_checkpoint = 0;
        }
    }
    if held {
        instance.flush_state().expect("flush-state");
    }
    let elapsed = started.elapsed();
    assert_eq!(outputs, records.len());
    records.len() as f64 / elapsed.as_secs_f64()
}

/// Measures `lang`; its ratio to Rust pairs each round with one of
/// `rust`'s (none: this is Rust, whose loaded module is returned).
fn measure(lang: &'static str, records: &[InputRecord], rust: Option<&RustBaseline>) -> (Row, Option<RustBaseline>) {
    let path = support::running_count(lang);
    let bytes = std::fs::read(&path).expect("component");
    let cache = tempfile::tempdir().expect("cache dir");
    // Cranelift before the load returns (the tier everything runs in the
    // end), into an empty cache.
    let config = RuntimeConfig {
        max_instances: 4,
        cache_dir: Some(cache.path().to_owned()),
        baseline: false,
        ..RuntimeConfig::default()
    };
    let started = Instant::now();
    let module = Runtime::new(config.clone()).expect("runtime").load(&bytes).expect("compile");
    let compile = started.elapsed();
    assert!(!module.loaded_from_cache());
    assert_eq!(module.tier(), Tier::Optimized);
    drop(module);
    // Winch's baseline code, as a host first starts a module.
    let quick =
        Runtime::new(RuntimeConfig { max_instances: 4, cache_dir: None, ..RuntimeConfig::default() }).expect("runtime");
    let started = Instant::now();
    let baseline = quick.load(&bytes).expect("baseline compile");
    let baseline_compile = started.elapsed();
    assert_eq!(baseline.tier(), Tier::Baseline, "{lang}: Winch did not compile it");
    let baseline_records_per_second = throughput(&quick, &baseline, lang, records, false);
    drop((baseline, quick));
    // A new runtime, as after a host restart: only the disk cache helps.
    let runtime = Runtime::new(config).expect("runtime");
    let started = Instant::now();
    let module = runtime.load(&bytes).expect("cached load");
    let cached_load = started.elapsed();
    assert!(module.loaded_from_cache(), "{lang}: the second load compiled again");
    let rounds = |held: bool| match rust {
        None => (throughput(&runtime, &module, lang, records, held), 1.0),
        Some(rust) => {
            let rounds: Vec<(f64, f64)> = (0..ROUNDS)
                .map(|_| {
                    let baseline = throughput(&rust.runtime, &rust.module, "rust", records, held);
                    (throughput(&runtime, &module, lang, records, held), baseline)
                })
                .collect();
            (
                support::median(rounds.iter().map(|r| r.0).collect()),
                support::median(rounds.iter().map(|r| r.0 / r.1).collect()),
            )
        }
    };
    let (records_per_second, vs_rust) = rounds(false);
    let (held_records_per_second, held_vs_rust) = rounds(true);
    let row = Row {
        lang,
        size: bytes.len() as u64,
        compile,
        baseline_compile,
        cached_load,
        records_per_second,
        vs_rust,
        held_records_per_second,
        held_vs_rust,
        baseline_records_per_second,
    };
    (row, rust.is_none().then_some(RustBaseline { runtime, module }))
}

/// The languages `--languages a,b` names (every one when absent); exits
/// on a language the bench does not know.
fn languages_argument() -> Option<Vec<String>> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == "--languages")?;
    let Some(list) = args.get(at + 1) else {
        eprintln!("languages: --languages needs a comma-separated list");
        std::process::exit(2);
    };
    let chosen: Vec<String> = list.split(',').map(str::to_owned).collect();
    if let Some(unknown) = chosen.iter().find(|l| !ALL.contains(&l.as_str())) {
        eprintln!("languages: unknown language `{unknown}` (rust, python, javascript, go, c)");
        std::process::exit(2);
    }
    Some(chosen)
}

fn main() {
    let records: Vec<InputRecord> = (0..RECORDS)
        .map(|i| InputRecord {
            key: Some(format!("key-{}", i % KEYS).into_bytes()),
            value: Some(format!("value {i} {}", "x".repeat(80)).into_bytes()),
            headers: Vec::new(),
            timestamp: Some(0),
            topic: "in".into(),
            partition: 0,
            offset: i as i64,
        })
        .collect();
    let chosen = languages_argument();
    let (rust_row, rust) = measure("rust", &records, None);
    let rust = rust.expect("the Rust guest, loaded");
    let mut rows = vec![rust_row];
    rows.extend(
        ALL.into_iter()
            .filter(|l| *l != "rust" && chosen.as_ref().is_none_or(|c| c.iter().any(|x| x == l)))
            .map(|l| measure(l, &records, Some(&rust)).0),
    );
    let mut table = String::new();
    let _ = writeln!(
        table,
        "| language | component size | first compile | baseline compile | cached load | records/s | vs Rust | records/s, held | vs Rust, held | records/s on baseline code | vs optimized |"
    );
    let _ = writeln!(table, "|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        let _ = writeln!(
            table,
            "| {} | {:.2} MB | {:.2} s | {:.2} s | {:.1} ms | {:.0} | {}x | {:.0} | {}x | {:.0} | {:.2}x |",
            row.lang,
            row.size as f64 / 1e6,
            row.compile.as_secs_f64(),
            row.baseline_compile.as_secs_f64(),
            row.cached_load.as_secs_f64() * 1e3,
            row.records_per_second,
            ratio(row.vs_rust),
            row.held_records_per_second,
            ratio(row.held_vs_rust),
            row.baseline_records_per_second,
            row.baseline_records_per_second / row.records_per_second,
        );
    }
    println!("\n{table}");
    if chosen.is_some() {
        return;
    }
    let doc = format!(
        "# Guest languages\n\nrunning-count in each language (examples/<lang>/running-count), produced by \
         `cargo bench -p sluice --bench languages`: component size, first compile (cranelift, into an empty \
         cache), Winch's baseline compile (what a host starts a new module on while cranelift compiles it in \
         the background), load from the compile cache (a new engine, as after a restart), and records/s through the \
         guest with state in memory ({RECORDS} records over {KEYS} keys, batches of {BATCH}), on the optimized and \
         on the baseline code. Ratios are to the \
         Rust guest in the same run: each language's records/s is the median of {ROUNDS} rounds, each right after a \
         round of the Rust guest, and its ratio the median of the rounds' ratios. Records/s and vs Rust: state \
         written back after every batch (the guest may not hold it). Held: as in a job, every SDK holds a shard's \
         state from batch to batch and the host takes it back (`flush-state`) every {CHECKPOINT_RECORDS} records, \
         as a 100 ms checkpoint interval at 200,000 records/s would, and at the end, all of it timed (its own \
         rounds, paired with the Rust guest's held rounds). Baseline code is measured written back. Absolute \
         figures vary between machines, and on this one from hour to hour.\n\n{table}"
    );
    let path = support::workspace_root().join("docs").join("languages.md");
    std::fs::create_dir_all(path.parent().expect("docs dir")).expect("docs dir");
    std::fs::write(&path, doc).expect("write docs/languages.md");
    println!("written to {}", path.display());
}
