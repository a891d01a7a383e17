//! The WebAssembly runtime: one wasmtime [`Engine`] per host, the sandbox every
//! transform runs in, and the host side of the WIT imports.
//!
//! Key types:
//! - [`Runtime`]: owns the engines (component model, epoch interruption;
//!   Cranelift with the pooling allocator, and Winch for a module's first
//!   minutes), their linkers with the sluice and restricted WASI imports,
//!   the epoch ticker thread, the optimizer thread and the on-disk cache of
//!   precompiled modules.
//! - [`Module`]: a validated, compiled transform, cheap to clone and to
//!   instantiate (an `InstancePre`), in one of two [`Tier`]s.
//! - [`Instance`]: one running guest with its [`TaskState`]; `init` once,
//!   then `process` batches.
//! - [`InstanceLimits`]: per-instance memory, per-call deadline, outputs per
//!   input.
//!
//! What a guest can reach: its own task's state, a log, the event time and
//! timers of the shard it is called for, and a WASI p2 with no
//! filesystem, no network, no environment, a frozen wall clock and a virtual
//! monotonic clock; its stdout and stderr go to the host log, tagged with the
//! instance's name. Nothing else.
//!
//! ```no_run
//! # use sluice::runtime::*;
//! # use sluice::state::TaskState;
//! # fn main() -> Result<()> {
//! let runtime = Runtime::new(RuntimeConfig::default())?;
//! let module = runtime.load_file("uppercase.wasm".as_ref())?;
//! let mut instance = runtime.instantiate(&module, "job-1/0", TaskState::in_memory(), InstanceLimits::default())?;
//! instance.init(&[])?;
//! # Ok(()) }
//! ```

pub(crate) mod bindings;
mod error;
mod host;
mod instance;
mod language;
mod module;
pub(crate) mod packed;
mod sandbox;
mod timers;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

pub use error::{Domain, Error, MAX_GUEST_ERROR, Result};
pub use host::{
    MAX_GET_MANY_KEYS, MAX_KEY_BYTES, MAX_VALUE_BYTES, NoShard, ReservedKey, SHARD_PREFIX_BYTES, StateLimit, shard_key,
    shard_of,
};
pub use instance::{Instance, InstanceLimits};
pub use language::source_language;
pub use module::{Module, Tier, sha256_hex};
pub use timers::NoTimerExport;

use crate::state::TaskState;

/// The largest linear memory a guest may have on a host by default (the
/// pool's memory slots are made this large): a tenant's policy may not
/// allow more.
pub const MAX_GUEST_MEMORY: usize = 1 << 30;

/// How the host's engine is set up. One per process.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// How many guest instances may be alive at once (pooling allocator slots).
    pub max_instances: u32,
    /// The largest linear memory any guest may have; each job's own limit
    /// ([`InstanceLimits::memory_bytes`]) must be at most this.
    pub max_memory_bytes: usize,
    /// How often the epoch advances; deadlines are counted in these ticks.
    pub epoch_tick: Duration,
    /// Where precompiled modules are cached; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// Write `/tmp/perf-<pid>.map` so that `perf` names guest functions
    /// (default: on when `SLUICE_WASM_PROFILER=perfmap`).
    pub perf_map: bool,
    /// Start a module not compiled before on baseline code (Winch) while
    /// Cranelift compiles it in the background (default: on).
    pub baseline: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            max_instances: 64,
            max_memory_bytes: MAX_GUEST_MEMORY,
            epoch_tick: Duration::from_millis(10),
            cache_dir: default_cache_dir(),
            perf_map: std::env::var("SLUICE_WASM_PROFILER").is_ok_and(|v| v == "perfmap"),
            baseline: true,
        }
    }
}

/// `$SLUICE_CACHE_DIR`, else `$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SLUICE_CACHE_DIR") {
        return Some(dir.into());
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("sluice"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache").join("sluice"))
}

/// The engines, linkers and module cache shared by every job of a host.
pub struct Runtime {
    /// Cranelift's: compiles modules from the cache or before an upload
    /// answers.
    compiler: module::Compiler,
    /// Winch's, unless [`RuntimeConfig::baseline`] is off.
    baseline: Option<module::Compiler>,
    /// Cranelift's in the background, for modules first compiled by Winch.
    optimizer: module::Optimizer,
    config: RuntimeConfig,
    ticker: EpochTicker,
}

/// Core module instances one component may create.
pub const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 64;
/// Linear memories one component may have.
pub const MAX_MEMORIES_PER_COMPONENT: u32 = 2;
/// Tables one component may have.
pub const MAX_TABLES_PER_COMPONENT: u32 = 8;

impl Runtime {
    /// Builds the engine and linker and starts the epoch ticker.
    pub fn new(config: RuntimeConfig) -> Result<Self> {
        let engine = Engine::new(&engine_config(&config, wasmtime::Strategy::Cranelift))
            .map_err(|e| Error::internal("creating the engine", e.into_boxed_dyn_error()))?;
        let compiler = module::Compiler::new(sandbox::linker(&engine)?, config.cache_dir.clone());
        // The baseline engine: Winch, with a pool of its own under the same
        // limits (a component refused by one is refused by the other).
        let baseline = if config.baseline {
            let quick = Engine::new(&engine_config(&config, wasmtime::Strategy::Winch))
                .map_err(|e| Error::internal("creating the baseline engine", e.into_boxed_dyn_error()))?;
            Some(compiler.baseline(sandbox::linker(&quick)?))
        } else {
            None
        };
        // The optimizer's: one core at most.
        let mut serial = engine_config(&config, wasmtime::Strategy::Cranelift);
        serial.parallel_compilation(false);
        serial.allocation_strategy(InstanceAllocationStrategy::OnDemand);
        let serial = Engine::new(&serial)
            .map_err(|e| Error::internal("creating the optimizer's engine", e.into_boxed_dyn_error()))?;
        let optimizer = module::Optimizer::start(compiler.clone(), serial)?;
        let engines = std::iter::once(engine).chain(baseline.as_ref().map(|b| b.linker.engine().clone()));
        let ticker = EpochTicker::start(engines.collect(), config.epoch_tick)?;
        Ok(Runtime { compiler, baseline, optimizer, config, ticker })
    }

    /// The engine of optimized code.
    pub fn engine(&self) -> &Engine {
        self.compiler.linker.engine()
    }

    /// The configuration this runtime was built with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Instantiates `module` as a new guest owning `state`. `name` tags its log
    /// lines and stdout/stderr (e.g. `job-id/task-index`).
    pub fn instantiate(
        &self,
        module: &Module,
        name: &str,
        mut state: TaskState,
        limits: InstanceLimits,
    ) -> Result<Instance> {
        if limits.memory_bytes > self.config.max_memory_bytes {
            return Err(Error::Limit(format!(
                "memory limit {} bytes is above the host's ceiling of {} bytes",
                limits.memory_bytes, self.config.max_memory_bytes
            )));
        }
        // Due timers are found by scanning the host's keys.
        state.keep_ordered(host::is_host_key);
        Instance::new(module, name, state, limits, self.ticker.tick)
    }

    /// Moves `instance`, of `module`, to the module's optimized code if it
    /// is ready and the instance runs the baseline code; `config` is the
    /// guest's `init` configuration. Returns the module the instance runs
    /// now. See [`Instance::move_to`].
    pub fn upgrade_tier(
        &self,
        instance: &mut Instance,
        module: &Module,
        config: &[(String, String)],
    ) -> Result<Module> {
        let best = module.best();
        if !best.same_as(module) {
            instance.move_to(&best, config, self.ticker.tick)?;
        }
        Ok(best)
    }
}

/// The configuration of an engine compiling with `strategy`: component
/// model, epoch interruption, and a pooling allocator whose limits bound
/// what one component may take.
fn engine_config(config: &RuntimeConfig, strategy: wasmtime::Strategy) -> Config {
    let mut wasm = Config::new();
    wasm.wasm_component_model(true);
    wasm.epoch_interruption(true);
    wasm.strategy(strategy);
    if config.perf_map {
        wasm.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }

    let mut pool = PoolingAllocationConfig::default();
    let instances = config.max_instances.max(1);
    pool.total_component_instances(instances);
    // A component built through the preview1 adapter has a handful of
    // core instances; leave room for them.
    // Every slot may hold a component at the per-component caps below, so
    // no component takes another slot's share. Core instances are only
    // counted (their contexts are allocated on demand, within
    // `max_component_instance_size`); memories and tables are reserved
    // slots, so their caps are kept small.
    pool.total_core_instances(instances.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT));
    pool.total_memories(instances.saturating_mul(MAX_MEMORIES_PER_COMPONENT));
    pool.total_tables(instances.saturating_mul(MAX_TABLES_PER_COMPONENT));
    pool.total_stacks(instances);
    // Measured on the five languages' running-count: Python
    // (componentize-py) instantiates 14 core modules, the others 3-4; each
    // has 1 memory and 2 tables.
    pool.max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT);
    pool.max_memories_per_component(MAX_MEMORIES_PER_COMPONENT);
    pool.max_tables_per_component(MAX_TABLES_PER_COMPONENT);
    pool.max_memory_size(config.max_memory_bytes);
    // Interpreters compiled to Wasm (CPython, SpiderMonkey) have large
    // tables and instance metadata.
    pool.table_elements(200_000);
    pool.max_core_instance_size(16 << 20);
    pool.max_component_instance_size(16 << 20);
    wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    wasm
}

/// Advances the engine's epoch on a fixed tick so that guests past their
/// deadline are interrupted without any thread blocking on them.
struct EpochTicker {
    tick: Duration,
    stop: Arc<AtomicBool>,
}

impl EpochTicker {
    fn start(engines: Vec<Engine>, tick: Duration) -> Result<Self> {
        let tick = tick.max(Duration::from_millis(1));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("sluice-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    engines.iter().for_each(Engine::increment_epoch);
                }
            })
            .map_err(|e| Error::internal("starting the epoch ticker thread", e))?;
        Ok(EpochTicker { tick, stop })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
