//! Loading transform modules: header checks, validation against the
//! `sluice:transform` world, and the on-disk cache of precompiled artifacts.
//!
//! A module is identified by the sha256 of its bytes. Compiling a component
//! costs 10-25 ms for a small Rust guest and ~20 s for an interpreter-based one
//! (Python, JavaScript), so the compiled artifact is cached on disk under
//! `<sha256>-<engine fingerprint>.cwasm`; the fingerprint changes with the
//! engine's configuration and wasmtime's version, since an artifact only loads
//! into an engine configured like the one that built it.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use super::bindings::TransformPre;
use super::sandbox::HostState;
use super::{Error, Result, Runtime};

/// The modules a runtime has loaded and that are still in use.
#[derive(Default)]
pub(super) struct Loaded(std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<ModuleInner>>>);

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

    /// Whether the module imports the `time` interface or exports
    /// `on-timers` (world `timed`): the host then keeps its shards' event
    /// time and fires its timers.
    pub fn uses_time(&self) -> bool {
        self.inner.uses_time
    }

    /// The world it was built for: `packed` (time or timers, and batches
    /// taken packed: the Rust SDK's), `timed` (time or timers),
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
        f.debug_struct("Module").field("sha256", &self.inner.sha256).field("size", &self.inner.size).finish()
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

    /// Validates and compiles (or loads from the cache) a module.
    pub fn load(&self, bytes: &[u8]) -> Result<Module> {
        check_header(bytes)?;
        let sha256 = sha256_hex(bytes);
        if let Some(module) = self.loaded.get(&sha256) {
            return Ok(module);
        }
        let (component, from_cache) = self.compile_cached(bytes, &sha256)?;
        check_exports(&component, self)?;
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| Error::WorldMismatch(format!("{e:#}; sluice provides sluice:transform/state, sluice:transform/log, sluice:transform/time and a restricted wasi p2 (cli, io, clocks, random)")))?;
        let pre = TransformPre::new(instance_pre).map_err(|e| Error::WorldMismatch(format!("{e:#}")))?;
        // Only a module that passed every check is cached: a refused upload
        // leaves nothing on disk.
        if !from_cache
            && let Some(path) = self.cache_path(&sha256)
            && let Err(e) = write_artifact(&component, &path)
        {
            tracing::warn!(path = %path.display(), "cannot cache the compiled module: {e}");
        }
        let uses_time = uses_time(&component, self);
        let exports = |want: &str| component.component_type().exports(self.engine()).any(|(name, _)| name == want);
        let world = match uses_time {
            true if exports("process-packed") => "packed",
            true => "timed",
            false if exports("migrate") => "upgradable",
            false => "transform",
        };
        let module =
            Module { inner: Arc::new(ModuleInner { sha256, size: bytes.len(), from_cache, uses_time, world, pre }) };
        self.loaded.insert(&module);
        Ok(module)
    }

    /// The module of `sha256` if this process has it loaded (a job runs it
    /// or ran it lately); never loads or compiles.
    pub fn loaded_module(&self, sha256: &str) -> Option<Module> {
        self.loaded.get(sha256)
    }

    /// Where the compiled artifact of `sha256` is cached, if anywhere.
    fn cache_path(&self, sha256: &str) -> Option<PathBuf> {
        self.config.cache_dir.as_ref().map(|dir| dir.join(format!("{sha256}-{}.cwasm", self.engine_fingerprint())))
    }

    /// Removes the cached compiled artifacts of `sha256` (of this engine and
    /// of any other configuration), once no job can need them.
    pub fn forget_cached(&self, sha256: &str) {
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

    /// The compiled component, from the cache or compiled now (then not yet
    /// cached: [`load`](Self::load) caches it once it passed its checks).
    fn compile_cached(&self, bytes: &[u8], sha256: &str) -> Result<(Component, bool)> {
        let cached = self.cache_path(sha256);
        if let Some(path) = &cached
            && path.exists()
        {
            match self.deserialize(path) {
                Ok(component) => return Ok((component, true)),
                Err(e) => tracing::warn!(path = %path.display(), "ignoring unusable cached module, recompiling: {e:#}"),
            }
        }
        let started = Instant::now();
        let component = Component::new(&self.engine, bytes).map_err(|e| Error::InvalidComponent(format!("{e:#}")))?;
        tracing::info!(
            sha256,
            bytes = bytes.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "compiled module"
        );
        Ok((component, false))
    }

    #[allow(unsafe_code)]
    fn deserialize(&self, path: &Path) -> wasmtime::Result<Component> {
        // SAFETY: the file is one this host wrote with `Component::serialize`
        // into its own cache directory, named after the engine fingerprint, so
        // it was produced by an engine configured like this one. wasmtime still
        // checks the artifact's header and version and refuses a mismatch.
        unsafe { Component::deserialize_file(&self.engine, path) }
    }

    /// A short hex fingerprint of everything that makes a compiled artifact
    /// loadable into this engine (wasmtime version, target, configuration).
    fn engine_fingerprint(&self) -> String {
        let mut hasher = DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    }
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
fn check_exports(component: &Component, runtime: &Runtime) -> Result<()> {
    let ty = component.component_type();
    let exports: Vec<(String, bool)> = ty
        .exports(runtime.engine())
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
        "it does not export the function{} {} of world sluice:transform/transform@0.1.3 (it exports: {})",
        if missing.len() > 1 { "s" } else { "" },
        missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(" and "),
        if found.is_empty() { "nothing".to_string() } else { found.join(", ") }
    )))
}

/// Whether `component` imports `sluice:transform/time` (any version) or
/// exports `on-timers`.
fn uses_time(component: &Component, runtime: &Runtime) -> bool {
    let ty = component.component_type();
    let mut imports = ty.imports(runtime.engine());
    let mut exports = ty.exports(runtime.engine());
    imports.any(|(name, _)| name.starts_with("sluice:transform/time@")) || exports.any(|(name, _)| name == "on-timers")
}
