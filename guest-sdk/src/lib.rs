//! Write [sluice](https://example.invalid/sluice) transforms in Rust.
//!
//! A sluice transform is a WebAssembly component (`wasm32-wasip2`) that the
//! host feeds batches of Kafka records; it returns the records to write and
//! keeps keyed state that the host checkpoints together with the input
//! offsets, exactly once. This crate hides the component-model plumbing
//! (`wit/sluice.wit`) behind a small typed API:
//!
//! - [`Transform`]: the trait you implement (`init`, `begin_batch`, `process`,
//!   `end_batch`), and [`export!`] to make your type the component's export;
//! - [`Record`] and [`Batch`] to read input, [`Emitter`] and [`Output`] to write;
//! - [`Config`] for the job's settings;
//! - [`ValueState`], [`MapState`] and [`ListState`]: typed keyed state, cached
//!   in the guest so it costs few boundary crossings;
//! - [`time`]: event time, the watermark and timers ([`Transform::on_timer`]
//!   is called when one is due), and [`window`]: tumbling, hopping and
//!   session windows built on them;
//! - [`Error`]/[`Result`]: every failure is a message for the host, never a trap;
//! - [`log`]: `log::info!` and friends, into the host's log.
//!
//! # Example
//!
//! A running count per key: for each record, emit the key and the number of
//! records seen so far for it.
//!
//! ```
//! use sluice_guest::{Batch, Config, Emitter, Record, Result, Transform, ValueState};
//!
//! const COUNTS: ValueState<u64> = ValueState::new("count");
//!
//! struct RunningCount;
//!
//! impl Transform for RunningCount {
//!     fn init(_config: &Config) -> Result<Self> {
//!         Ok(RunningCount)
//!     }
//!
//!     fn begin_batch(&mut self, batch: &Batch) -> Result<()> {
//!         // One `state.get-many` call for the whole batch.
//!         COUNTS.prefetch(batch.keys())
//!     }
//!
//!     fn process(&mut self, record: &Record, out: &mut Emitter) -> Result<()> {
//!         let n = COUNTS.update(record.key_or_empty(), |n| n.unwrap_or(0) + 1)?;
//!         out.emit(record.key_or_empty(), n.to_string());
//!         Ok(())
//!     }
//! }
//!
//! sluice_guest::export!(RunningCount);
//! ```
//!
//! Build it as a `cdylib` for `wasm32-wasip2`; the output is a component:
//!
//! ```text
//! [lib]
//! crate-type = ["cdylib"]
//!
//! $ cargo build --release --target wasm32-wasip2
//! ```
//!
//! # The batch lifecycle
//!
//! The host calls `init` once per instance with the job's configuration
//! ([`Transform::init`]; an error fails the job). Then, for every batch:
//! [`Transform::begin_batch`], [`Transform::process`] for each record in
//! input order, [`Transform::end_batch`]; then the SDK writes the batch's
//! state changes back in one call and returns the emitted records. An error
//! from any hook fails the whole batch: the SDK drops the batch's outputs and
//! unflushed state writes and returns the message (for `process`, prefixed
//! with `record <topic>-<partition>@<offset>: `); the host discards the
//! batch's effects and replays it from the last checkpoint. A `process` call
//! before a successful `init` is an error too, not a trap. Panics do trap
//! (there is no unwinding on `wasm32-wasip2`), so return errors instead;
//! nothing in this crate panics on input.
//!
//! When timers are due (see [`time`]), the host calls the transform between
//! batches with the due timers of one shard: [`Transform::on_timer`] for
//! each, in time order, then the state write-back, exactly as for a batch.
//!
//! # State and boundary crossings
//!
//! Every call from the guest into the host crosses the component boundary,
//! which costs ~150-250 ns, far more than a map lookup in the guest. So the
//! SDK puts a write-back cache in front of the host's `state` interface:
//!
//! - A read is served from the cache; a miss costs one `state.get`.
//!   `prefetch` loads every key the cache lacks with one `state.get-many`.
//!   Absent keys are cached too.
//! - A write or delete only changes the cache and marks the key dirty.
//! - The cache of a batch's shard (its input partition) is held from batch
//!   to batch: the host collects its dirty entries (`flush-state`, one
//!   `state.write`) before each checkpoint and before the shard's timers
//!   fire, and the cache starts over then. Past 64 Ki entries or 16 MiB held,
//!   a batch writes its shard's entries back at its end instead. A host
//!   older than WIT 0.1.4 never collects, and then every batch writes back
//!   at its end.
//! - A scan ([`MapState::entries`], [`MapState::keys`], [`MapState::clear`])
//!   first writes pending writes back (one `state.write`) so that the host's
//!   `scan-prefix` sees them, then pages through `scan-prefix`.
//! - When a hook fails, every unflushed write is discarded: the host ends
//!   the instance and goes back to the last checkpoint.
//!
//! A per-key counter thus costs at most one crossing per record, and with
//! `prefetch` in `begin_batch` two crossings per batch (`get-many`, `write`),
//! fewer when the batches of a checkpoint touch the same keys. State touched
//! in `init`, `migrate` or `on_timer` is written back when the call returns.
//!
//! # Key layout
//!
//! State entries are bytes to the host. Other languages' SDKs must lay keys
//! out exactly like this to share state with Rust transforms (e.g. across a
//! rewrite):
//!
//! | state | host key |
//! |---|---|
//! | [`ValueState`] `name`, record key `k` | `name` `0x00` `k` |
//! | [`ListState`] `name`, record key `k` | `name` `0x00` `k` |
//! | [`MapState`] `name`, record key `k`, map key `m` | `name` `0x00` `u32-be(len(k))` `k` `m` |
//! | [`Windows`] `name`, record key `k`, window start `s` | `name` `0x00` `u32-be(8)` `i64-key(s)` `k`, timer `name` per window end |
//! | [`SessionWindows`] `name`, record key `k` | `name` `0x00` `k`, timer `name` `0x00` `k` per session |
//!
//! `name` is the state's UTF-8 name: non-empty, no `0x00` byte (a bad name is
//! an error at first use), unique among all of the transform's states. `k`
//! is the record key as given (records without a key usually use the empty
//! key, [`Record::key_or_empty`]). `u32-be(len(k))` is the length of `k` in
//! bytes as a 4-byte big-endian integer, so that user keys never run into
//! map keys. Map keys `m` ([`MapKey`]) are UTF-8 for strings, raw for bytes,
//! big-endian for unsigned integers and big-endian with the sign bit flipped
//! for signed integers, so scans return them in order.
//!
//! Values are JSON (serde_json): a [`ValueState`] value is the JSON of `T`, a
//! [`ListState`] value one JSON array of `T`, a [`MapState`] entry the JSON of
//! `V`. Plain JSON keeps state readable by every SDK and by tools.
//!
//! # Testing natively
//!
//! The crate also builds for the host target. There the state API runs
//! against an in-memory map instead of the host, and `log` prints to stderr,
//! so the pure parts of a transform (and the typed state calls) can be unit
//! tested with `cargo test`.

#![warn(missing_docs, unreachable_pub)]
// Tests may unwrap; library code may not (workspace lint `clippy::unwrap_used`).
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod config;
mod emit;
mod error;
pub mod log;
mod packed;
mod record;
mod runtime;
pub mod state;
pub mod time;
mod transform;
pub mod window;

/// The generated component bindings (`wit-bindgen`). Not a stable API: only
/// [`export!`] uses them.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        // `packed-out`: everything of `transform`, plus the `migrate` hook,
        // the `time` import, the `on-timers` export, `process-packed`,
        // `hold-state` and `flush-state`, which let the state cache hold a
        // shard's state from batch to batch, and `process-packed-out`,
        // which returns the outputs as one byte string.
        world: "packed-out",
        path: "../wit",
        pub_export_macro: true,
        export_macro_name: "__export_transform",
        default_bindings_module: "sluice_guest::bindings",
    });
}

pub use config::Config;
pub use emit::{Emitter, Output};
pub use error::{Error, Result};
pub use record::{Batch, Headers, Record};
pub use state::{DecodeMapKey, ListState, MapKey, MapState, ValueState};
pub use time::{Clock, Timer};
pub use transform::Transform;
pub use window::{SessionWindows, Window, Windows};

/// What [`export!`] expands to refers to. Not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::bindings;
    pub use crate::bindings::{Guest, InputRecord, OutputRecord};
    pub use crate::runtime::{
        flush_state, hold_state, init, migrate, on_timers, process, process_packed, process_packed_out,
    };
    pub use crate::time::from_wit as timer_from_wit;
    pub use std::string::String;
    pub use std::vec::Vec;
}

/// Makes a [`Transform`] the component's implementation of the
/// `packed-out` world (the `transform` world plus the `migrate` hook, which
/// [`Transform::migrate`] implements, the `on-timers` export, which
/// [`Transform::on_timer`] implements, `process-packed` and
/// `process-packed-out`, through which batches arrive as one byte string
/// and outputs leave as one, and `hold-state` and `flush-state`, through
/// which the host lets the SDK hold state between batches and collects
/// it). Use it once, at the top level of the crate:
///
/// ```
/// # use sluice_guest::{Config, Emitter, Record, Result, Transform};
/// struct Echo;
///
/// impl Transform for Echo {
///     fn init(_: &Config) -> Result<Self> {
///         Ok(Echo)
///     }
///
///     fn process(&mut self, record: &Record, out: &mut Emitter) -> Result<()> {
///         out.forward(record);
///         Ok(())
///     }
/// }
///
/// sluice_guest::export!(Echo);
/// ```
///
/// The instance lives in a thread-local: `init` creates (or replaces) it,
/// `process` uses it, and `process` before a successful `init` returns an
/// error.
#[macro_export]
macro_rules! export {
    ($ty:ty) => {
        const _: () = {
            ::std::thread_local! {
                static __SLUICE_INSTANCE: ::core::cell::RefCell<::core::option::Option<$ty>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }

            struct __SluiceExport;

            impl $crate::__private::Guest for __SluiceExport {
                fn init(
                    config: $crate::__private::Vec<($crate::__private::String, $crate::__private::String)>,
                ) -> ::core::result::Result<(), $crate::__private::String> {
                    $crate::__private::init::<$ty>(&__SLUICE_INSTANCE, config)
                }

                fn process(
                    batch: $crate::__private::Vec<$crate::__private::InputRecord>,
                ) -> ::core::result::Result<
                    $crate::__private::Vec<$crate::__private::OutputRecord>,
                    $crate::__private::String,
                > {
                    $crate::__private::process::<$ty>(&__SLUICE_INSTANCE, batch)
                }

                fn process_packed(
                    batch: $crate::__private::Vec<u8>,
                ) -> ::core::result::Result<
                    $crate::__private::Vec<$crate::__private::OutputRecord>,
                    $crate::__private::String,
                > {
                    $crate::__private::process_packed::<$ty>(&__SLUICE_INSTANCE, batch)
                }

                fn process_packed_out(
                    batch: $crate::__private::Vec<u8>,
                ) -> ::core::result::Result<$crate::__private::Vec<u8>, $crate::__private::String> {
                    $crate::__private::process_packed_out::<$ty>(&__SLUICE_INSTANCE, batch)
                }

                fn migrate(
                    from_module: $crate::__private::String,
                ) -> ::core::result::Result<(), $crate::__private::String> {
                    $crate::__private::migrate::<$ty>(&__SLUICE_INSTANCE, from_module)
                }

                fn hold_state(max_bytes: u64) {
                    $crate::__private::hold_state(max_bytes)
                }

                fn flush_state(shard: u32) -> ::core::result::Result<(), $crate::__private::String> {
                    $crate::__private::flush_state(shard)
                }

                fn on_timers(
                    fired: $crate::__private::Vec<$crate::__private::bindings::sluice::transform::time::Timer>,
                ) -> ::core::result::Result<
                    $crate::__private::Vec<$crate::__private::OutputRecord>,
                    $crate::__private::String,
                > {
                    $crate::__private::on_timers::<$ty>(
                        &__SLUICE_INSTANCE,
                        fired.into_iter().map($crate::__private::timer_from_wit).collect(),
                    )
                }
            }

            $crate::__private::bindings::__export_transform!(
                __SluiceExport with_types_in $crate::__private::bindings
            );
        };
    };
}
