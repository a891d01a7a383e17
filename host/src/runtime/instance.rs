//! One running guest: a store, its bindings and its limits.
//!
//! An [`Instance`] is created from a [`Module`] (fast: an `InstancePre` in a
//! pooling-allocator slot), `init`ed once with the job's config, then fed
//! batches. A failed call (trap, deadline, memory limit, an error the guest
//! returns) poisons the instance: the caller throws it away and restores the
//! task from its last checkpoint, which is what makes a failed batch leave no
//! trace.

use std::time::Duration;

use wasmtime::component::TypedFunc;
use wasmtime::{Store, Trap};

use super::bindings::Transform;
use super::sandbox::HostState;
use super::{Error, Module, Result};
use crate::record::{InputRecord, OutputRecord};
use crate::state::TaskState;

/// What one instance may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceLimits {
    /// Total linear memory, in bytes.
    pub memory_bytes: usize,
    /// Wall time for one call into the guest (`init`, or one batch).
    pub deadline: Duration,
    /// Output records per input record of a batch (a batch of n records may
    /// return up to n times this many).
    pub max_outputs_per_input: u32,
    /// Bytes of keys and values the task's state may hold; `None`: no limit.
    pub max_state_bytes: Option<u64>,
}

impl Default for InstanceLimits {
    fn default() -> Self {
        InstanceLimits {
            memory_bytes: 128 << 20,
            deadline: Duration::from_secs(5),
            max_outputs_per_input: 100,
            max_state_bytes: None,
        }
    }
}

/// The `migrate` export of the `upgradable` world.
type MigrateFunc = TypedFunc<(String,), (Result<(), String>,)>;

/// A running transform.
pub struct Instance {
    store: Store<HostState>,
    bindings: Transform,
    migrate: Option<MigrateFunc>,
    limits: InstanceLimits,
    deadline_ticks: u64,
    poisoned: bool,
}

impl Instance {
    pub(super) fn new(
        engine: &wasmtime::Engine,
        module: &Module,
        name: &str,
        state: TaskState,
        limits: InstanceLimits,
        tick: Duration,
    ) -> Result<Self> {
        let mut store = Store::new(engine, HostState::new(name, state, limits.memory_bytes));
        store.limiter(|host| &mut host.limiter);
        let deadline_ticks = (limits.deadline.as_nanos() / tick.as_nanos().max(1)).max(1) + 1;
        let deadline_ticks = u64::try_from(deadline_ticks).unwrap_or(u64::MAX);
        store.set_epoch_deadline(deadline_ticks);
        store.epoch_deadline_trap();
        let instantiated = module.pre().instance_pre().instantiate(&mut store).and_then(|instance| {
            let bindings = Transform::new(&mut store, &instance)?;
            // The optional export of the `upgradable` world.
            let migrate = instance.get_typed_func::<(String,), (Result<(), String>,)>(&mut store, "migrate").ok();
            Ok((bindings, migrate))
        });
        let (bindings, migrate) = match instantiated {
            Ok(found) => found,
            Err(e) => return Err(classify(e.context("instantiating the module"), &store, limits)),
        };
        Ok(Instance { store, bindings, migrate, limits, deadline_ticks, poisoned: false })
    }

    /// Bytes of keys and values in the instance's state, when it is limited.
    pub fn state_size(&self) -> Option<u64> {
        self.store.data().state.size()
    }

    /// Calls the guest's `init` with the job's transform configuration.
    pub fn init(&mut self, config: &[(String, String)]) -> Result<()> {
        self.enter()?;
        let result = self.bindings.call_init(&mut self.store, config);
        match self.leave(result)? {
            Ok(()) => Ok(()),
            Err(message) => {
                self.poisoned = true;
                Err(Error::Guest(message))
            }
        }
    }

    /// Whether the module exports the `migrate` hook (world `upgradable`).
    pub fn can_migrate(&self) -> bool {
        self.migrate.is_some()
    }

    /// Calls the guest's `migrate` hook, if it exports one, after an upgrade
    /// from the module `from` (its sha256), once for each of `shards`: the
    /// guest reads the shard's old state through the `state` import and
    /// rewrites it. Returns whether it ran.
    pub fn migrate(&mut self, from: &str, shards: &[u32]) -> Result<bool> {
        let Some(migrate) = self.migrate else { return Ok(false) };
        for &shard in shards {
            self.enter()?;
            self.store.data_mut().shard = Some(shard);
            let result = migrate.call(&mut self.store, (from.to_owned(),)).map(|(result,)| result);
            self.store.data_mut().shard = None;
            match self.leave(result)? {
                Ok(()) => {}
                Err(message) => {
                    self.poisoned = true;
                    return Err(Error::Guest(format!("migrate: {message}")));
                }
            }
        }
        Ok(true)
    }

    /// Transforms one batch; returns the outputs in the order the guest gave
    /// them. The guest is called once per run of records of one shard (one
    /// input partition, the same on every input topic), with state calls
    /// scoped to that shard.
    pub fn process(&mut self, batch: &[InputRecord]) -> Result<Vec<OutputRecord>> {
        if batch.is_empty() {
            return self.process_shard(None, batch);
        }
        let mut outputs = Vec::new();
        for run in batch.chunk_by(|a, b| a.partition == b.partition) {
            let shard = u32::try_from(run[0].partition).map_err(|_| {
                Error::internal(
                    format!("a record of {}", run[0].topic),
                    format!("negative partition {}", run[0].partition),
                )
            })?;
            let mut more = self.process_shard(Some(shard), run)?;
            if outputs.is_empty() {
                outputs = more;
            } else {
                outputs.append(&mut more);
            }
        }
        Ok(outputs)
    }

    fn process_shard(&mut self, shard: Option<u32>, batch: &[InputRecord]) -> Result<Vec<OutputRecord>> {
        self.enter()?;
        self.store.data_mut().shard = shard;
        let result = self.bindings.call_process(&mut self.store, batch);
        self.store.data_mut().shard = None;
        match self.leave(result)? {
            Ok(outputs) => {
                let allowed = u64::from(self.limits.max_outputs_per_input).saturating_mul(batch.len().max(1) as u64);
                if outputs.len() as u64 > allowed {
                    self.poisoned = true;
                    return Err(Error::Limit(format!(
                        "{} output records for a batch of {} input records (the limit is {} per input record)",
                        outputs.len(),
                        batch.len(),
                        self.limits.max_outputs_per_input
                    )));
                }
                Ok(outputs)
            }
            Err(message) => {
                self.poisoned = true;
                Err(Error::Guest(message))
            }
        }
    }

    /// The task's state.
    pub fn state(&self) -> &TaskState {
        &self.store.data().state
    }

    /// The task's state, for taking checkpoint deltas between batches.
    pub fn state_mut(&mut self) -> &mut TaskState {
        &mut self.store.data_mut().state
    }

    /// Whether an earlier call failed; a poisoned instance refuses calls.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    fn enter(&mut self) -> Result<()> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        self.store.set_epoch_deadline(self.deadline_ticks);
        Ok(())
    }

    fn leave<T>(&mut self, result: wasmtime::Result<T>) -> Result<T> {
        result.map_err(|e| {
            self.poisoned = true;
            classify(e, &self.store, self.limits)
        })
    }
}

/// Turns a wasmtime error from a call into the runtime's error, naming the
/// limit that was hit when there was one.
fn classify(e: wasmtime::Error, store: &Store<HostState>, limits: InstanceLimits) -> Error {
    if let Some(requested) = store.data().limiter.denied {
        return Error::MemoryLimit { limit: store.data().limiter.limit(), requested };
    }
    if let Some(exceeded) = e.downcast_ref::<crate::state::QuotaExceeded>() {
        return Error::Limit(exceeded.to_string());
    }
    if let Some(limit) = e.downcast_ref::<super::StateLimit>() {
        return Error::Limit(limit.to_string());
    }
    if let Some(no_shard) = e.downcast_ref::<super::NoShard>() {
        return Error::Guest(no_shard.to_string());
    }
    if let Some(Trap::Interrupt) = e.downcast_ref::<Trap>() {
        return Error::Deadline(limits.deadline);
    }
    Error::Trap(format!("{e:?}"))
}
