//! sluice: exactly-once Kafka pipelines whose transforms are WebAssembly
//! components.
//!
//! The crate is the engine behind the `sluice` binary. Its modules, each
//! owning one concern:
//!
//! - [`runtime`]: the wasmtime engine, loading and validating transform
//!   components, the sandbox (memory, deadline, restricted WASI) and the host
//!   side of the WIT imports.
//! - [`state`]: a task's keyed state: the working set with dirty-key tracking
//!   that checkpoints take deltas from.
//! - [`record`]: the records that cross the guest boundary.
//! - [`kafka`]: the Kafka source and the transactional Kafka sink.
//! - [`checkpoint`]: the exactly-once protocol: barriers, the redb checkpoint
//!   store, recovery from what Kafka committed.
//! - [`job`]: a job file, and wiring one job's tasks together with restarts.
//! - [`failpoint`]: named crash points for testing the protocol.
//! - [`service`]: the host as a service: tenants, uploaded modules and many
//!   jobs in one process, with their metadata in redb (`sluice serve`).
//! - [`api`]: the HTTP control plane over [`service`] (axum, OpenAPI).
//! - [`dashboard`]: the web dashboard `sluice serve` shows at `/`.
//! - [`exec`]: running a transform locally over JSON-lines records
//!   (`sluice exec`), the transform author's inner loop.
//!
//! ```no_run
//! use sluice::runtime::{Runtime, RuntimeConfig, InstanceLimits};
//! use sluice::state::TaskState;
//!
//! # fn main() -> Result<(), sluice::runtime::Error> {
//! let runtime = Runtime::new(RuntimeConfig::default())?;
//! let module = runtime.load_file("running_count.wasm".as_ref())?;
//! let mut instance = runtime.instantiate(&module, "demo", TaskState::in_memory(), InstanceLimits::default())?;
//! instance.init(&[])?;
//! let outputs = instance.process(&[])?;
//! # let _ = outputs;
//! # Ok(())
//! # }
//! ```

pub mod api;
pub mod checkpoint;
pub mod cluster;
pub mod dashboard;
pub mod exec;
pub mod failpoint;
mod fsutil;
pub mod job;
pub mod kafka;
pub mod record;
pub mod runtime;
pub mod service;
pub mod state;
pub mod time;
pub mod units;
