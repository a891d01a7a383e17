//! Loading transform modules: header checks, validation against the
//! `sluice:transform` world, compiling in two tiers, and the on-disk cache
//! of optimized artifacts.
//!
//! A module is identified by the sha256 of its bytes. Cranelift compiles a
//! small Rust guest in 10-25 ms but an interpreter-based one (Python,
//! JavaScript) in 10-20 s, so a module seen for the first time is compiled
//! twice ([`Tier`]): at once with Winch, wasmtime's baseline compiler (a
//! fraction of the time, slower code), which lets its jobs start in seconds;
//! and with Cranelift by the [`Optimizer`], one module at a time on one
//! background thread, after which new instances use the optimized code and
//! running tasks move to it between batches ([`Module::best`]). Only the
//! optimized artifact is cached on disk, under
//! `<sha256>-<engine fingerprint>.cwasm`; the fingerprint changes with the
//! engine's configuration and wasmtime's version, since an artifact only
//! loads into an engine configured like the one that built it.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker};

use super::bindings::TransformPre;
use super::sandbox::HostState;
use super::{Error, Result, Runtime};

/// Modules waiting for their optimized compile, at most: past that an
/// upload compiles with Cranelift before it answers, so that uploads cannot
/// pile up bytes and work the host does not get to.
const OPTIMIZER_QUEUE: usize = 4;

/// How a module's code was compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Winch, in a single pass: ready in a fraction of Cranelift's time,
    /// runs slower; replaced once the optimized code is ready.
    Baseline,
    /// Cranelift: the code every module runs in the end.
    Optimized,
}

/// The modules a runtime has loaded and that are still in use: the best
/// tier of each.
#[derive(Default)]
struct Loaded(std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<ModuleInner>>>);

impl Loaded {
    fn get(&self, sha256: &str) -> Option<Module> {
        let loaded = self.0.lock().ok()?;
        loaded.get(sha256).and_then(std::sync::Weak::upgrade).map(|inner| Module { inner })
    }

    fn insert(&self, module: &Module) {
        if let Ok(mut loaded) = self.0.lock() {
            loaded.retain(|_, weak| weak.strong_count() > 0);
            loaded.insert(module.inner.sha256.clone(), Arc::downgrade(&module.inner));
        }
    }
}

/// A validated, compiled transform. Cheap to clone.
#[derive(Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

struct ModuleInner {
    sha256: String,
    size: usize,
    from_cache: bool,
    tier: Tier,
    /// For a baseline module: the optimized one, once compiled.
    optimized: OnceLock<Module>,
    /// Whether it imports `time` or exports `on-timers`: the host then
    /// keeps event time for its shards.
    uses_time: bool,
    /// The world it was built for.
    world: &'static str,
    pre: TransformPre<HostState>,
}

impl Module {
    /// The hex sha256 of the module's bytes: its identity.
    pub fn sha256(&self) -> &str {
        &self.inner.sha256
    }

    /// The size of the module's bytes.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// Whether `self` and `other` are the same loaded module (jobs of one
    /// module share its compiled code).
    pub fn same_as(&self, other: &Module) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether the compiled code came from the on-disk cache (rather than
    /// being compiled when this module was first loaded in this process).
    pub fn loaded_from_cache(&self) -> bool {
        self.inner.from_cache
    }

    /// How its code was compiled.
    pub fn tier(&self) -> Tier {
        self.inner.tier
    }

    /// The optimized module of the same bytes once it is compiled, else
    /// this one: what a new instance should run.
    pub fn best(&self) -> Module {
        self.inner.optimized.get().cloned().unwrap_or_else(|| self.clone())
    }

    /// Whether the module imports the `time` interface or exports
    /// `on-timers` (world `timed`): the host then keeps its shards' event
    /// time and fires its timers.
    pub fn uses_time(&self) -> bool {
        self.inner.uses_time
    }

    /// The world it was built for: `packed-out` (as `cached`, and outputs
    /// returned packed: the Go SDK's), `cached` (as `packed`, and state held
    /// across batches until the host asks for it: the Rust SDK's), `packed`
    /// (time or timers, and batches taken packed), `timed` (time or timers),
    /// `upgradable` (a `migrate` hook) or `transform`.
    pub fn world(&self) -> &'static str {
        self.inner.world
    }

    pub(super) fn pre(&self) -> &TransformPre<HostState> {
        &self.inner.pre
    }
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("sha256", &self.inner.sha256)
            .field("size", &self.inner.size)
            .field("tier", &self.inner.tier)
            .finish()
    }
}

/// The hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    hex::encode(digest)
}

impl Runtime {
    /// Reads, validates and compiles (or loads from the cache) a module file.
    pub fn load_file(&self, path: &Path) -> Result<Module> {
        let bytes = std::fs::read(path).map_err(|error| Error::Read { path: path.to_owned(), error })?;
        self.load(&bytes)
    }

    /// Validates and compiles (or loads from the cache) a module: the
    /// optimized code when it is cached or loaded already, else the
    /// baseline code with the optimized compile queued (see the module
    /// docs), else (no baseline compiler, a full queue, or a module Winch
    /// cannot compile) the optimized code compiled now.
    pub fn load(&self, bytes: &[u8]) -> Result<Module> {
        check_header(bytes)?;
        let sha256 = sha256_hex(bytes);
        // Uploaded again after its removal: its code is cached again.
        self.compiler.forgotten.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&sha256);
        if let Some(module) = self.compiler.loaded.get(&sha256) {
            return Ok(module);
        }
        if let Some(component) = self.compiler.cached(&sha256) {
            return self.compiler.finish(component, sha256, bytes.len(), true);
        }
        if let Some(baseline) = &self.baseline
            && self.optimizer.has_room()
        {
            match baseline.compile(bytes, &sha256) {
                Ok(component) => {
                    let module = baseline.finish(component, sha256, bytes.len(), false)?;
                    self.optimizer.submit(&module, bytes);
                    return Ok(module);
                }
                // Cranelift says what is wrong with an invalid module, or
                // compiles what Winch does not support.
                Err(e) => tracing::debug!(sha256, "the baseline compiler refused the module: {e}"),
            }
        }
        let component = self.compiler.compile(bytes, &sha256)?;
        self.compiler.finish(component, sha256, bytes.len(), false)
    }

    /// The module of `sha256` if this process has it loaded (a job runs it
    /// or ran it lately); never loads or compiles.
    pub fn loaded_module(&self, sha256: &str) -> Option<Module> {
        self.compiler.loaded.get(sha256)
    }

    /// Removes the cached compiled artifacts of `sha256` (of this engine and
    /// of any other configuration), once no job can need them.
    pub fn forget_cached(&self, sha256: &str) {
        let mut forgotten = self.compiler.forgotten.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        forgotten.insert(sha256.to_owned());
        let Some(dir) = &self.config.cache_dir else { return };
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let prefix = format!("{sha256}-");
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(&prefix)
                && name.ends_with(".cwasm")
                && let Err(e) = std::fs::remove_file(entry.path())
            {
                tracing::warn!(path = %entry.path().display(), "cannot remove a cached module: {e}");
            }
        }
    }
}

/// Compiles modules for one engine, of one tier, and makes them ready to
/// instantiate.
#[derive(Clone)]
pub(super) struct Compiler {
    pub(super) linker: Linker<HostState>,
    tier: Tier,
    /// Where optimized artifacts are cached (the optimizing compiler only).
    cache_dir: Option<PathBuf>,
    /// Modules alive in this process, by sha256, shared by both tiers' compilers:
    /// jobs of the same module share one compiled copy (its code is mapped once).
    loaded: Arc<Loaded>,
    /// Digests whose cached artifacts were removed ([`Runtime::forget_cached`])
    /// and not loaded since: the optimizer, done after the removal, must not
    /// cache them again. Held while an artifact is written or removed.
    forgotten: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Compiler {
    /// The optimizing compiler, caching its artifacts in `cache_dir`.
    pub(super) fn new(linker: Linker<HostState>, cache_dir: Option<PathBuf>) -> Self {
        Compiler { linker, tier: Tier::Optimized, cache_dir, loaded: Arc::default(), forgotten: Arc::default() }
    }

    /// The baseline compiler for `linker`'s engine, sharing this one's
    /// loaded modules; it caches nothing.
    pub(super) fn baseline(&self, linker: Linker<HostState>) -> Self {
        Compiler { linker, tier: Tier::Baseline, cache_dir: None, ..self.clone() }
    }

    fn engine(&self) -> &Engine {
        self.linker.engine()
    }

    /// Checks a compiled component against the world, caches an optimized
    /// one compiled now, and makes it the loaded module of its digest.
    fn finish(&self, component: Component, sha256: String, size: usize, from_cache: bool) -> Result<Module> {
        check_exports(&component)?;
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| Error::WorldMismatch(format!("{e:#}; sluice provides sluice:transform/state, sluice:transform/log, sluice:transform/time and a restricted wasi p2 (cli, io, clocks, random)")))?;
        let pre = TransformPre::new(instance_pre).map_err(|e| Error::WorldMismatch(format!("{e:#}")))?;
        // Only a module that passed every check is cached: a refused upload
        // leaves nothing on disk.
        if !from_cache && let Some(path) = self.cache_path(&sha256) {
            let forgotten = self.forgotten.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if forgotten.contains(&sha256) {
                tracing::debug!(sha256, "not caching the code of a module removed meanwhile");
            } else if let Err(e) = write_artifact(&component, &path) {
                tracing::warn!(path = %path.display(), "cannot cache the compiled module: {e}");
            }
        }
        let uses_time = uses_time(&component);
        let exports = |want: &str| component.component_type().exports(component.engine()).any(|(name, _)| name == want);
        let world = match uses_time {
            true if exports("process-packed-out") => "packed-out",
            true if exports("hold-state") && exports("flush-state") => "cached",
            true if exports("process-packed") => "packed",
            true => "timed",
            false if exports("migrate") => "upgradable",
            false => "transform",
        };
        let inner = ModuleInner {
            sha256,
            size,
            from_cache,
            tier: self.tier,
            optimized: OnceLock::new(),
            uses_time,
            world,
            pre,
        };
        let module = Module { inner: Arc::new(inner) };
        self.loaded.insert(&module);
        Ok(module)
    }

    /// Where the compiled artifact of `sha256` is cached, if anywhere.
    fn cache_path(&self, sha256: &str) -> Option<PathBuf> {
        self.cache_dir.as_ref().map(|dir| dir.join(format!("{sha256}-{}.cwasm", self.engine_fingerprint())))
    }

    /// The cached artifact of `sha256`, if there is a usable one.
    fn cached(&self, sha256: &str) -> Option<Component> {
        let path = self.cache_path(sha256).filter(|path| path.exists())?;
        self.deserialize(&path)
            .map_err(|e| tracing::warn!(path = %path.display(), "ignoring unusable cached module, recompiling: {e:#}"))
            .ok()
    }

    /// Compiles `bytes` now (then not yet cached: [`finish`](Self::finish)
    /// caches it once it passed its checks).
    fn compile(&self, bytes: &[u8], sha256: &str) -> Result<Component> {
        let started = Instant::now();
        let component = Component::new(self.engine(), bytes).map_err(|e| Error::InvalidComponent(format!("{e:#}")))?;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match self.tier {
            Tier::Optimized => tracing::info!(sha256, bytes = bytes.len(), elapsed_ms, "compiled module"),
            Tier::Baseline => tracing::info!(sha256, bytes = bytes.len(), elapsed_ms, "compiled module (baseline)"),
        }
        Ok(component)
    }

    #[allow(unsafe_code)]
    fn deserialize(&self, path: &Path) -> wasmtime::Result<Component> {
        // SAFETY: the file is one this host wrote with `Component::serialize`
        // into its own cache directory, named after the engine fingerprint, so
        // it was produced by an engine configured like this one. wasmtime still
        // checks the artifact's header and version and refuses a mismatch.
        unsafe { Component::deserialize_file(self.engine(), path) }
    }

    /// A short hex fingerprint of everything that makes a compiled artifact
    /// loadable into this engine (wasmtime version, target, configuration).
    fn engine_fingerprint(&self) -> String {
        format!("{:016x}", compatibility(self.engine()))
    }
}

/// A hash of everything that makes an artifact of `engine` loadable into
/// another engine: equal for engines whose artifacts load into each other.
fn compatibility(engine: &Engine) -> u64 {
    let mut hasher = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hasher.finish()
}

/// Compiles baseline modules with Cranelift, one at a time, on one thread
/// of lowered priority, after their uploads have answered: a tenant's
/// upload costs the host at most one core, and running jobs come first.
pub(super) struct Optimizer {
    queue: SyncSender<(Module, Vec<u8>)>,
    /// Modules queued or compiling now.
    pending: Arc<AtomicUsize>,
}

impl Optimizer {
    /// Starts the thread, which compiles with `serial` (an engine like
    /// `compiler`'s but compiling on the calling thread only) and loads
    /// the code into `compiler`'s engine; with `compiler`'s own engine if
    /// their artifacts are not compatible. The thread ends when the
    /// optimizer is dropped.
    pub(super) fn start(compiler: Compiler, serial: Engine) -> Result<Self> {
        let serial = (compatibility(&serial) == compatibility(compiler.engine())).then_some(serial);
        if serial.is_none() {
            tracing::warn!(
                "the serial engine's code does not load into the host's: the optimizer compiles in parallel"
            );
        }
        let (queue, work) = std::sync::mpsc::sync_channel(OPTIMIZER_QUEUE);
        let pending = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&pending);
        std::thread::Builder::new()
            .name("sluice-optimizer".into())
            .spawn(move || {
                lower_thread_priority();
                optimize(&compiler, serial.as_ref(), &work, &counter);
            })
            .map_err(|e| Error::internal("starting the optimizer thread", e))?;
        Ok(Optimizer { queue, pending })
    }

    fn has_room(&self) -> bool {
        self.pending.load(Ordering::Relaxed) < OPTIMIZER_QUEUE
    }

    fn submit(&self, baseline: &Module, bytes: &[u8]) {
        self.pending.fetch_add(1, Ordering::Relaxed);
        match self.queue.try_send((baseline.clone(), bytes.to_vec())) {
            Ok(()) => {}
            // Another upload took the last place since `has_room`: the
            // module runs its baseline code until a later load compiles it.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.pending.fetch_sub(1, Ordering::Relaxed);
                tracing::warn!(sha256 = baseline.sha256(), "the optimizer is busy: the module runs its baseline code");
            }
        }
    }
}

/// The optimizer thread: each baseline module's optimized twin, compiled,
/// cached and handed to the baseline module's users.
fn optimize(compiler: &Compiler, serial: Option<&Engine>, work: &Receiver<(Module, Vec<u8>)>, pending: &AtomicUsize) {
    while let Ok((baseline, bytes)) = work.recv() {
        let sha256 = baseline.sha256().to_owned();
        let started = Instant::now();
        // A panic in the compiler must not take the queue down with it:
        // the module keeps its baseline code, and the error is logged.
        let optimized = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let component = match serial {
                Some(serial) => compile_serially(serial, compiler.engine(), &bytes)?,
                None => compiler.compile(&bytes, &sha256)?,
            };
            compiler.finish(component, sha256.clone(), bytes.len(), false)
        }));
        pending.fetch_sub(1, Ordering::Relaxed);
        match optimized {
            Ok(Ok(module)) => {
                tracing::info!(
                    sha256,
                    seconds = started.elapsed().as_secs_f64(),
                    "the module's optimized code is ready"
                );
                // `set` fails only if it was set already: it cannot be.
                let _ = baseline.inner.optimized.set(module);
            }
            Ok(Err(e)) => {
                tracing::error!(sha256, "cannot compile the module's optimized code: {e}; it runs its baseline code")
            }
            Err(_) => tracing::error!(
                sha256,
                "the compiler panicked on the module's optimized code; it runs its baseline code"
            ),
        }
    }
}

/// Lowers this thread's scheduling priority (nice 10), so that task
/// threads come first on a busy host. Linux keeps a nice value per thread;
/// elsewhere, or if refused, the thread runs at normal priority.
#[allow(unsafe_code)]
fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: two system calls about this thread itself, with no
        // pointers.
        let refused = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) } != 0;
        if refused {
            tracing::debug!("cannot lower the optimizer's priority: {}", std::io::Error::last_os_error());
        }
    }
}

/// Compiles `bytes` with `serial` on this thread and loads the code into
/// `engine`, whose artifacts it is compatible with.
#[allow(unsafe_code)]
fn compile_serially(serial: &Engine, engine: &Engine, bytes: &[u8]) -> Result<Component> {
    let artifact = serial.precompile_component(bytes).map_err(|e| Error::InvalidComponent(format!("{e:#}")))?;
    // SAFETY: the artifact was just made by `serial`, in this process, from
    // an engine whose compatibility hash is `engine`'s (`Optimizer::start`);
    // wasmtime still checks its header and version.
    unsafe { Component::deserialize(engine, &artifact) }
        .map_err(|e| Error::internal("loading the optimized code", e.into_boxed_dyn_error()))
}

/// Writes a compiled artifact atomically: a reader sees the whole file or none.
fn write_artifact(component: &Component, path: &Path) -> std::io::Result<()> {
    let bytes = component.serialize().map_err(|e| std::io::Error::other(format!("{e:#}")))?;
    crate::fsutil::write_atomically(path, &bytes)
}

/// Rejects what is plainly not a component before handing it to the compiler,
/// with a message that says what the bytes are instead.
fn check_header(bytes: &[u8]) -> Result<()> {
    const MAGIC: &[u8] = b"\0asm";
    if bytes.len() < 8 {
        return Err(Error::InvalidComponent(format!(
            "the file is {} bytes long, too short to be WebAssembly",
            bytes.len()
        )));
    }
    if &bytes[..4] != MAGIC {
        return Err(Error::InvalidComponent(
            "the file does not start with the WebAssembly magic bytes `\\0asm`".into(),
        ));
    }
    match bytes[4..8] {
        [0x0d, 0x00, 0x01, 0x00] => Ok(()),
        [0x01, 0x00, 0x00, 0x00] => Err(Error::InvalidComponent(
            "this is a core WebAssembly module, not a component; build for the wasm32-wasip2 target \
             (or wrap it with `wasm-tools component new`)"
                .into(),
        )),
        [a, b, c, d] => Err(Error::InvalidComponent(format!(
            "unknown WebAssembly version/layer bytes {a:02x} {b:02x} {c:02x} {d:02x}"
        ))),
        _ => Err(Error::InvalidComponent("unreadable header".into())),
    }
}

/// Checks that the component exports what the `transform` world needs, and
/// names what is missing and what the component exports instead.
fn check_exports(component: &Component) -> Result<()> {
    let ty = component.component_type();
    let exports: Vec<(String, bool)> = ty
        .exports(component.engine())
        .map(|(name, item)| (name.to_string(), matches!(item.ty, ComponentItem::ComponentFunc(_))))
        .collect();
    let missing: Vec<&str> = ["init", "process"]
        .into_iter()
        .filter(|want| !exports.iter().any(|(name, is_func)| name == want && *is_func))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let found: Vec<&str> = exports.iter().map(|(name, _)| name.as_str()).collect();
    Err(Error::WorldMismatch(format!(
        "it does not export the function{} {} of world sluice:transform/transform@0.1.5 (it exports: {})",
        if missing.len() > 1 { "s" } else { "" },
        missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(" and "),
        if found.is_empty() { "nothing".to_string() } else { found.join(", ") }
    )))
}

/// Whether `component` imports `sluice:transform/time` (any version) or
/// exports `on-timers`.
fn uses_time(component: &Component) -> bool {
    let ty = component.component_type();
    let mut imports = ty.imports(component.engine());
    let mut exports = ty.exports(component.engine());
    imports.any(|(name, _)| name.starts_with("sluice:transform/time@")) || exports.any(|(name, _)| name == "on-timers")
}
