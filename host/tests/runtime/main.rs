//! Integration tests of the runtime, the sandbox, state and the examples,
//! against real guest components built from source. No broker needed.
//!
//! - `loading`: what the host accepts as a module and how it refuses the rest.
//! - `sandbox`: traps, deadlines, memory and output limits, poisoning.
//! - `state`: the state imports' semantics across records and batches.
//! - `examples`: each example's exact output through `sluice exec`.
//! - `time`: watermarks per shard, timers as shard state, the host's keys.
//! - `cli`: `sluice run` refusing bad job files and modules up front.

#![allow(unreachable_pub, missing_docs)]

#[path = "../support/mod.rs"]
mod support;

mod cli;
mod examples;
mod loading;
mod sandbox;
mod state;
mod time;

use sluice::record::{InputRecord, OutputRecord};
use sluice::runtime::{Instance, InstanceLimits, Module, Runtime, RuntimeConfig};
use sluice::state::TaskState;

/// A runtime whose module cache lives in a fresh temporary directory, and
/// which compiles every module with Cranelift before `load` returns.
fn runtime() -> (Runtime, tempfile::TempDir) {
    runtime_with(false)
}

/// [`runtime`], where `baseline` says whether a new module starts on
/// Winch's code (as on `sluice serve`).
fn runtime_with(baseline: bool) -> (Runtime, tempfile::TempDir) {
    let cache = tempfile::tempdir().expect("temp dir");
    let runtime = Runtime::new(RuntimeConfig {
        max_instances: 16,
        cache_dir: Some(cache.path().to_path_buf()),
        baseline,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    (runtime, cache)
}

fn load(runtime: &Runtime, guest: &str) -> Module {
    runtime.load_file(&support::guest(guest)).expect("module loads")
}

fn probe(runtime: &Runtime, limits: InstanceLimits) -> Instance {
    let module = load(runtime, "probe");
    let mut instance =
        runtime.instantiate(&module, "test/probe", TaskState::in_memory(), limits).expect("instantiates");
    instance.init(&[]).expect("init");
    instance
}

/// An input record whose value is `value`, at `offset`.
fn record(value: &str, offset: i64) -> InputRecord {
    InputRecord {
        key: Some(format!("k{offset}").into_bytes()),
        value: Some(value.as_bytes().to_vec()),
        headers: Vec::new(),
        timestamp: Some(1_700_000_000_000 + offset),
        topic: "in".into(),
        partition: 0,
        offset,
    }
}

fn batch(values: &[&str]) -> Vec<InputRecord> {
    values.iter().enumerate().map(|(i, v)| record(v, i as i64)).collect()
}

fn values(outputs: &[OutputRecord]) -> Vec<String> {
    outputs.iter().map(|o| String::from_utf8_lossy(o.value.as_deref().unwrap_or(b"<null>")).into_owned()).collect()
}
