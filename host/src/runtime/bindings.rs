//! Generated bindings for the `sluice:transform` world.
//!
//! Kept in one private place so the rest of the crate names curated types
//! ([`crate::record`]) instead of generated paths. Imports are `trappable`: a
//! host import returns `wasmtime::Result`, and an `Err` traps the guest, which
//! is how the host enforces limits inside an import (for example a state write
//! that exceeds the task's state budget).

#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "transform",
    imports: { default: trappable },
});
