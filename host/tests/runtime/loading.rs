use super::*;
use sluice::runtime::{Domain, Error};

fn load_err(runtime: &Runtime, bytes: &[u8]) -> Error {
    runtime.load(bytes).expect_err("must be refused")
}

#[test]
fn refuses_a_core_module_and_says_so() {
    let (runtime, _cache) = runtime();
    // The smallest valid core module: magic and version 1.
    let err = load_err(&runtime, b"\0asm\x01\0\0\0");
    assert!(matches!(err, Error::InvalidComponent(_)), "{err:?}");
    assert!(err.to_string().contains("core WebAssembly module, not a component"), "{err}");
    assert_eq!(err.domain(), Domain::User);
}

#[test]
fn refuses_bytes_that_are_not_wasm() {
    let (runtime, _cache) = runtime();
    let err = load_err(&runtime, b"#!/bin/sh\necho hello\n");
    assert!(err.to_string().contains("magic bytes"), "{err}");
    let err = load_err(&runtime, b"\0as");
    assert!(err.to_string().contains("too short"), "{err}");
}

#[test]
fn refuses_a_truncated_component() {
    let (runtime, _cache) = runtime();
    let bytes = std::fs::read(support::guest("running-count")).expect("read");
    let err = load_err(&runtime, &bytes[..bytes.len() / 2]);
    assert!(matches!(err, Error::InvalidComponent(_)), "{err:?}");
    assert!(!err.is_retryable());
}

#[test]
fn refuses_a_component_of_another_world_naming_what_is_missing() {
    let (runtime, cache) = runtime();
    let bytes = std::fs::read(support::guest("other-world")).expect("read");
    let err = load_err(&runtime, &bytes);
    assert!(matches!(err, Error::WorldMismatch(_)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("`init` and `process`"), "{message}");
    assert!(message.contains("it exports: run"), "{message}");
    // A refused module leaves no compiled artifact behind.
    let cached: Vec<_> = std::fs::read_dir(cache.path()).expect("cache dir").flatten().map(|e| e.file_name()).collect();
    assert!(cached.is_empty(), "cached: {cached:?}");
}

#[test]
fn forgetting_a_module_removes_its_compiled_artifact() {
    let (runtime, cache) = runtime();
    let bytes = std::fs::read(support::guest("uppercase")).expect("read");
    runtime.load(&bytes).expect("loads");
    let count = || std::fs::read_dir(cache.path()).expect("cache dir").flatten().count();
    assert_eq!(count(), 1, "the artifact is cached");
    runtime.forget_cached(&sluice::runtime::sha256_hex(&bytes));
    assert_eq!(count(), 0, "the artifact is gone");
}

#[test]
fn reports_an_unreadable_file_with_its_path() {
    let (runtime, _cache) = runtime();
    let err = runtime.load_file("/nonexistent/module.wasm".as_ref()).expect_err("missing file");
    assert!(err.to_string().contains("/nonexistent/module.wasm"), "{err}");
}

#[test]
fn second_load_comes_from_the_compiled_cache() {
    let (runtime, cache) = runtime();
    let first = load(&runtime, "running-count");
    assert!(!first.loaded_from_cache());
    let cached: Vec<_> = std::fs::read_dir(cache.path()).expect("cache dir").collect();
    assert_eq!(cached.len(), 1, "one artifact cached");
    let sha256 = first.sha256().to_owned();
    // While a module is in use, loading its bytes again shares it.
    let shared = load(&runtime, "running-count");
    assert!(shared.same_as(&first));
    drop((first, shared));
    let second = load(&runtime, "running-count");
    assert!(second.loaded_from_cache());
    assert_eq!(second.sha256(), sha256);
    // The cached artifact runs.
    let mut instance =
        runtime.instantiate(&second, "cached", TaskState::in_memory(), InstanceLimits::default()).expect("instantiate");
    instance.init(&[]).expect("init");
    assert_eq!(instance.process(&batch(&["x"])).expect("process").len(), 1);
}

#[test]
fn a_corrupt_cache_entry_is_recompiled() {
    let (runtime, cache) = runtime();
    load(&runtime, "uppercase");
    for entry in std::fs::read_dir(cache.path()).expect("cache dir") {
        std::fs::write(entry.expect("entry").path(), b"garbage").expect("corrupt");
    }
    let module = load(&runtime, "uppercase");
    assert!(!module.loaded_from_cache(), "corrupt artifact must not be used");
}

/// A component of `instances` instances of one core module, each with
/// `memories` linear memories: a hostile upload's shape.
fn component_of_instances(instances: u32, memories: u32) -> Vec<u8> {
    component_of(instances, memories, 0)
}

/// [`component_of_instances`], each instance with `tables` tables too.
fn component_of(instances: u32, memories: u32, tables: u32) -> Vec<u8> {
    use wasm_encoder::{InstanceSection, MemorySection, MemoryType, ModuleArg, ModuleSection, TableSection, TableType};
    let mut module = wasm_encoder::Module::new();
    let mut section = TableSection::new();
    for _ in 0..tables {
        let element_type = wasm_encoder::RefType::FUNCREF;
        section.table(TableType { element_type, table64: false, minimum: 1, maximum: Some(1), shared: false });
    }
    module.section(&section);
    let mut section = MemorySection::new();
    for _ in 0..memories {
        section.memory(MemoryType {
            minimum: 1,
            maximum: Some(1),
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
    }
    module.section(&section);
    let mut component = wasm_encoder::Component::new();
    component.section(&ModuleSection(&module));
    let mut section = InstanceSection::new();
    for _ in 0..instances {
        section.instantiate(0, std::iter::empty::<(&str, ModuleArg)>());
    }
    component.section(&section);
    component.finish()
}

/// One component may not take more of the host's instance pool than its
/// share: more linear memories or core instances than a component may have
/// are refused when the module is loaded (at upload), before any job runs
/// it, and leave no compiled artifact.
#[test]
fn refuses_a_component_over_the_per_component_pool_limits() {
    use sluice::runtime::{MAX_CORE_INSTANCES_PER_COMPONENT, MAX_MEMORIES_PER_COMPONENT};
    let (runtime, cache) = runtime();
    // Within the limits, the same shape compiles (and is then refused for
    // its world, which is another check).
    let err = load_err(&runtime, &component_of_instances(MAX_MEMORIES_PER_COMPONENT, 1));
    assert!(matches!(err, Error::WorldMismatch(_)), "{err:?}");
    for (what, bytes) in [
        ("memories", component_of_instances(MAX_MEMORIES_PER_COMPONENT + 1, 1)),
        ("core instances", component_of_instances(MAX_CORE_INSTANCES_PER_COMPONENT + 1, 0)),
    ] {
        let err = load_err(&runtime, &bytes);
        assert!(matches!(err, Error::InvalidComponent(_)), "{what}: {err:?}");
        assert!(err.to_string().contains("maximum"), "{what}: {err}");
        assert_eq!(err.domain(), Domain::User, "{what}");
    }
    let cached: Vec<_> = std::fs::read_dir(cache.path()).expect("cache dir").flatten().map(|e| e.file_name()).collect();
    assert!(cached.is_empty(), "cached: {cached:?}");
}

/// No component takes another slot's share of the pool: with every slot
/// taken by a component at the per-component caps (core instances,
/// memories, tables), each still instantiates.
#[test]
fn every_slot_holds_a_component_at_the_per_component_caps() {
    use sluice::runtime::{MAX_CORE_INSTANCES_PER_COMPONENT, MAX_MEMORIES_PER_COMPONENT, MAX_TABLES_PER_COMPONENT};
    use wasmtime::component::{Component, Linker};
    let config = RuntimeConfig { max_instances: 3, cache_dir: None, baseline: false, ..RuntimeConfig::default() };
    let slots = config.max_instances;
    let runtime = Runtime::new(config).expect("runtime");
    let engine = runtime.engine();
    let linker = Linker::<()>::new(engine);
    let shapes = [
        ("core instances", MAX_CORE_INSTANCES_PER_COMPONENT, 0, 0),
        ("memories", MAX_MEMORIES_PER_COMPONENT, 1, 0),
        ("tables", MAX_TABLES_PER_COMPONENT, 0, 1),
    ];
    for (what, instances, memories, tables) in shapes {
        let component = Component::new(engine, component_of(instances, memories, tables)).expect(what);
        let mut alive = Vec::new();
        for slot in 0..slots {
            let mut store = wasmtime::Store::new(engine, ());
            let instance = linker.instantiate(&mut store, &component);
            assert!(instance.is_ok(), "{what}: slot {slot} of {slots}: {:?}", instance.err());
            alive.push(store);
        }
    }
}

/// Waits until the optimizer has compiled `module`'s optimized code.
fn wait_for_optimized_code(module: &Module) {
    let waited = std::time::Instant::now();
    while module.best().tier() != sluice::runtime::Tier::Optimized {
        assert!(waited.elapsed() < std::time::Duration::from_secs(120), "no optimized code after 120 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A module this runtime has not compiled starts on Winch's baseline code;
/// once the optimizer has Cranelift's, an instance moves to it between
/// batches with its state, later loads get it, and it is cached.
#[test]
fn a_new_module_starts_on_baseline_code_and_moves_to_the_optimized_code_with_its_state() {
    use sluice::runtime::Tier;
    let (runtime, cache) = runtime_with(true);
    let module = load(&runtime, "running-count");
    assert_eq!(module.tier(), Tier::Baseline);
    let mut instance =
        runtime.instantiate(&module, "tiers", TaskState::in_memory(), InstanceLimits::default()).expect("instantiate");
    instance.init(&[]).expect("init");
    let one_key = |from: i64, n: i64| -> Vec<InputRecord> {
        (from..from + n).map(|offset| InputRecord { key: Some(b"k".to_vec()), ..record("v", offset) }).collect()
    };
    assert_eq!(values(&instance.process(&one_key(0, 3)).expect("process")), ["1", "2", "3"]);

    wait_for_optimized_code(&module);
    let optimized = runtime.upgrade_tier(&mut instance, &module, &[]).expect("moves");
    assert_eq!(optimized.tier(), Tier::Optimized);
    assert_eq!(optimized.sha256(), module.sha256());
    // The state came along: the count goes on.
    assert_eq!(values(&instance.process(&one_key(3, 2)).expect("process")), ["4", "5"]);
    // Moving again does nothing.
    assert!(runtime.upgrade_tier(&mut instance, &optimized, &[]).expect("stays").same_as(&optimized));
    assert!(load(&runtime, "running-count").same_as(&optimized), "later loads get the optimized code");
    assert_eq!(std::fs::read_dir(cache.path()).expect("cache dir").count(), 1, "the optimized code is cached");
}

/// What Winch would accept but the pool limits refuse is refused at load
/// with the baseline tier on too: both engines have the same limits.
#[test]
fn the_baseline_tier_refuses_what_the_pool_limits_refuse() {
    use sluice::runtime::MAX_MEMORIES_PER_COMPONENT;
    let (runtime, _cache) = runtime_with(true);
    let err = load_err(&runtime, &component_of_instances(MAX_MEMORIES_PER_COMPONENT + 1, 1));
    assert!(matches!(err, Error::InvalidComponent(_)), "{err:?}");
    assert!(err.to_string().contains("maximum"), "{err}");
}

/// A module removed while the optimizer compiles it leaves no cached
/// artifact behind; loaded again later, it is cached again.
#[test]
fn a_module_removed_while_its_optimized_code_compiles_is_not_cached() {
    use sluice::runtime::Tier;
    let (runtime, cache) = runtime_with(true);
    let bytes = std::fs::read(support::guest("windowed-count")).expect("read");
    let artifacts = || std::fs::read_dir(cache.path()).expect("cache dir").flatten().count();
    let module = runtime.load(&bytes).expect("loads");
    assert_eq!(module.tier(), Tier::Baseline);
    runtime.forget_cached(module.sha256());
    wait_for_optimized_code(&module);
    assert_eq!(artifacts(), 0, "the removed module's code was cached");
    let sha256 = module.sha256().to_owned();
    drop(module);
    // The optimizer lets go of its handle a moment after it is done.
    let waited = std::time::Instant::now();
    while runtime.loaded_module(&sha256).is_some() {
        assert!(waited.elapsed() < std::time::Duration::from_secs(10), "the module stays loaded");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let again = runtime.load(&bytes).expect("loads again");
    assert_eq!(again.tier(), Tier::Baseline, "nothing cached, nothing loaded: compiled again");
    wait_for_optimized_code(&again);
    assert_eq!(artifacts(), 1, "the module loaded again is cached again");
}
