//! Generated bindings for the `sluice:transform` worlds.
//!
//! Kept in one private place so the rest of the crate names curated types
//! ([`crate::record`]) instead of generated paths. Imports are `trappable`: a
//! host import returns `wasmtime::Result`, and an `Err` traps the guest, which
//! is how the host enforces limits inside an import (for example a state write
//! that exceeds the task's state budget).
//!
//! Two worlds: `transform`, whose exports (`init`, `process`) every module
//! has, and `timed`, whose imports (`state`, `log`, `time`) are what the
//! linker offers every module. The optional exports (`migrate`,
//! `on-timers`, `process-packed` of world `packed`, `flush-state` of world
//! `cached`, `process-packed-out` of world `packed-out`) are looked up by
//! name on each instance.

#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "transform",
    imports: { default: trappable },
});

/// The `timed` world: the `time` import and the `on-timers` export, over
/// the same `types`, `state` and `log` as `transform`.
pub(crate) mod timed {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "timed",
        imports: { default: trappable },
        with: {
            "sluice:transform/types": super::sluice::transform::types,
            "sluice:transform/state": super::sluice::transform::state,
            "sluice:transform/log": super::sluice::transform::log,
        },
    });
}
