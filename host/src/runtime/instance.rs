//! One running guest: a store, its bindings and its limits.
//!
//! An [`Instance`] is created from a [`Module`] (fast: an `InstancePre` in a
//! pooling-allocator slot), `init`ed once with the job's config, then fed
//! batches. A failed call (trap, deadline, memory limit, an error the guest
//! returns) poisons the instance: the caller throws it away and restores the
//! task from its last checkpoint, which is what makes a failed batch leave no
//! trace.
//!
//! For a module that uses event time ([`Module::uses_time`]) the instance
//! also keeps its shards' [`EventTime`]: each call sees the watermark of its
//! shard as of the call's start, records at or below it are counted late,
//! and [`Instance::fire_timers`] calls `on-timers` with the due timers of
//! one shard at a time, each removed from the state in the same epoch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::TypedFunc;
use wasmtime::{Store, Trap, UpdateDeadline};

use super::bindings::Transform;
use super::bindings::timed::sluice::transform::time::Timer as WitTimer;
use super::sandbox::{CallBudget, Checked, HostState};
use super::{Error, Module, Result};
use crate::record::{InputRecord, OutputRecord, OutputRef, Outputs};
use crate::state::TaskState;
use crate::time::{Clock, EventTime, Timer};

/// What one instance may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceLimits {
    /// Total linear memory, in bytes.
    pub memory_bytes: usize,
    /// CPU time for one call into the guest (`init`, a batch, a firing of
    /// timers): the CPU time of the thread that runs it, the guest's code and
    /// the host calls it makes; time the call waits for a core (another
    /// tenant's load) or for the disk does not count.
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

/// The `on-timers` export of the `timed` world.
type OnTimersFunc = TypedFunc<(Vec<WitTimer>,), (Result<Vec<OutputRecord>, String>,)>;

/// The `process-packed` export of the `packed` world.
type ProcessPackedFunc = TypedFunc<(&'static [u8],), (Result<Vec<OutputRecord>, String>,)>;

/// The `process-packed-out` export of the `packed-out` world.
type ProcessPackedOutFunc = TypedFunc<(&'static [u8],), (Result<Vec<u8>, String>,)>;

/// What a guest's batch call returned: its outputs as a list, or packed
/// (`process-packed-out`).
enum Returned {
    Records(Vec<OutputRecord>),
    Packed(Vec<u8>),
}

/// A call's checked outputs, as the guest returned them: packed (read in
/// place) or as WIT records (guests before 0.1.5), so that neither
/// [`Instance::transform`] nor [`Instance::process`] converts them twice.
enum Produced {
    Packed(Outputs),
    Records(Vec<OutputRecord>),
}

/// The `hold-state` and `flush-state` exports of the `cached` world.
type HoldStateFunc = TypedFunc<(u64,), ()>;
type FlushStateFunc = TypedFunc<(u32,), (Result<(), String>,)>;

/// The share of a guest's memory limit it may fill with state it holds
/// across calls (world `cached`): one eighth.
const HELD_STATE_SHARE: usize = 8;

/// Due timers handed to one `on-timers` call, at most.
const MAX_FIRED_PER_CALL: usize = 1_000;

/// Timers read in the first page when looking for due ones; later pages
/// double.
const FIRST_TIMER_PAGE: usize = 16;

/// Rounds of firing per shard in one [`Instance::fire_timers`], and timers
/// fired in them, at most: a guest that keeps setting due timers from
/// `on-timers` cannot hold its task there; what is left fires at the task's
/// next turn. Many rounds, because a round may fire a single timer that
/// stands for many results (the SDKs' windows keep one timer per window
/// end, and close up to 64 windows per firing, setting a timer for the
/// rest); the timers bound the work of the many-timers case as before.
const MAX_FIRING_ROUNDS: usize = 256;
const MAX_FIRED_PER_TURN: usize = 16 * MAX_FIRED_PER_CALL;

/// A running transform.
pub struct Instance {
    store: Store<HostState>,
    bindings: Transform,
    migrate: Option<MigrateFunc>,
    on_timers: Option<OnTimersFunc>,
    /// With it, batches go to the guest packed ([`super::packed`]), into
    /// `packed`, whose allocation is kept from batch to batch.
    process_packed: Option<ProcessPackedFunc>,
    packed: Vec<u8>,
    /// With it, batches go to the guest packed and their outputs come back
    /// packed ([`super::packed::unpack_outputs`]); preferred to
    /// `process_packed`.
    process_packed_out: Option<ProcessPackedOutFunc>,
    /// With them, the guest may hold state writes of the shards in `held`
    /// (those it was handed batches of since it last gave them back) until
    /// [`Instance::flush_state`] asks for them.
    hold_state: Option<(HoldStateFunc, FlushStateFunc)>,
    held: std::collections::BTreeSet<u32>,
    /// Records at or below their shard's watermark, since the last
    /// [`Instance::take_late_records`].
    late_records: std::collections::BTreeMap<u32, u64>,
    limits: InstanceLimits,
    deadline_ticks: u64,
    poisoned: bool,
    /// Timers handed to one `on-timers` call at most.
    timers_per_call: usize,
    /// The first timer of the `on-timers` call that failed, with its shard.
    failed_timer: Option<(u32, Timer)>,
}

impl Instance {
    pub(super) fn new(
        module: &Module,
        name: &str,
        state: TaskState,
        limits: InstanceLimits,
        tick: Duration,
    ) -> Result<Self> {
        let engine = module.pre().instance_pre().engine();
        let mut store = Store::new(engine, HostState::new(name, state, limits.memory_bytes));
        store.limiter(|host| &mut host.limiter);
        // What the host copies out of the guest in one call (an import's
        // arguments, an export's results) is at most the guest's memory
        // limit. Without aliasing that is all a guest can hand over; with
        // it (a list of many lists that all point at one region) it would
        // be the region times the count.
        store.set_hostcall_fuel(limits.memory_bytes);
        let deadline_ticks = ticks(limits.deadline, tick);
        store.set_epoch_deadline(deadline_ticks);
        // At each epoch tick past the deadline's ticks: the call's CPU time
        // decides, not the ticks (see `CallBudget`).
        store.epoch_deadline_callback(move |context| {
            let Some(budget) = context.data().call else { return Ok(UpdateDeadline::Continue(1)) };
            match budget.check() {
                Checked::Continue(left) => Ok(UpdateDeadline::Continue(ticks(left, tick))),
                Checked::DeadlinePassed => Err(wasmtime::Error::new(CpuDeadlinePassed)),
                Checked::HostOverloaded(wall) => Err(wasmtime::Error::new(HostOverloaded { wall, budget })),
            }
        });
        // Instantiating runs the guest's start functions: under a deadline too.
        store.data_mut().call = Some(CallBudget::start(limits.deadline));
        let instantiated = module.pre().instance_pre().instantiate(&mut store).and_then(|instance| {
            let bindings = Transform::new(&mut store, &instance)?;
            // The optional export of the `upgradable` world.
            let migrate = instance.get_typed_func::<(String,), (Result<(), String>,)>(&mut store, "migrate").ok();
            // The optional exports of the `timed` and `packed` worlds.
            let on_timers = optional_export(&instance, &mut store, "on-timers", "timed")?;
            let process_packed = optional_export(&instance, &mut store, "process-packed", "packed")?;
            let process_packed_out = optional_export(&instance, &mut store, "process-packed-out", "packed-out")?;
            let hold_state = optional_export(&instance, &mut store, "hold-state", "cached")?;
            let flush_state = optional_export(&instance, &mut store, "flush-state", "cached")?;
            Ok((bindings, migrate, on_timers, (process_packed, process_packed_out), hold_state.zip(flush_state)))
        });
        let (bindings, migrate, on_timers, (process_packed, process_packed_out), hold_state) = match instantiated {
            Ok(found) => found,
            Err(e) => match e.downcast::<Error>() {
                Ok(mismatch) => return Err(mismatch),
                Err(e) => return Err(classify(e.context("instantiating the module"), &store, limits)),
            },
        };
        store.data_mut().fires_timers = on_timers.is_some();
        store.data_mut().call = None;
        Ok(Instance {
            store,
            bindings,
            migrate,
            on_timers,
            process_packed,
            packed: Vec::new(),
            process_packed_out,
            // Only a guest that takes packed batches is handed whole shards'
            // batches to hold state across.
            hold_state: hold_state.filter(|_| process_packed.is_some() || process_packed_out.is_some()),
            held: Default::default(),
            late_records: Default::default(),
            limits,
            deadline_ticks,
            poisoned: false,
            timers_per_call: MAX_FIRED_PER_CALL,
            failed_timer: None,
        })
    }

    /// Moves this instance's state and event time into a new instance of
    /// `module` (the same module's optimized code, [`Module::best`]), which
    /// is initialized with `config` like the first. For between batches:
    /// the guest first hands over the state it holds ([`Self::flush_state`]);
    /// nothing else of its memory is kept (it is lost on any restart too).
    /// On an error the instance is poisoned and its state gone: the task
    /// must recover.
    pub(super) fn move_to(&mut self, module: &Module, config: &[(String, String)], tick: Duration) -> Result<()> {
        self.flush_state()?;
        self.poisoned = true;
        let host = self.store.data_mut();
        let state = std::mem::replace(&mut host.state, TaskState::in_memory());
        let (time, virtual_clock, name) = (host.time.take(), host.virtual_clock_ms, Arc::clone(&host.name));
        let mut moved = Instance::new(module, &name, state, self.limits, tick)?;
        let host = moved.store.data_mut();
        host.time = time;
        host.virtual_clock_ms = virtual_clock;
        moved.late_records = std::mem::take(&mut self.late_records);
        moved.timers_per_call = self.timers_per_call;
        if self.hold_state.is_none() {
            moved.forbid_holding();
        }
        moved.init(config)?;
        *self = moved;
        Ok(())
    }

    /// Starts keeping event time for the shards of `partitions` (topic,
    /// partition), restored from what each shard's state holds: its
    /// watermark and largest timestamps as of its last checkpoint, and where
    /// its next timer of each clock is. Does nothing for a module that does
    /// not use event time ([`Module::uses_time`]).
    pub fn start_time(
        &mut self,
        module: &Module,
        config: crate::time::TimeConfig,
        partitions: &[(String, i32)],
    ) -> Result<()> {
        if !module.uses_time() {
            return Ok(());
        }
        let mut time = EventTime::new(config, partitions, Instant::now());
        let shards: Vec<u32> = time.shards().collect();
        let state = &mut self.store.data_mut().state;
        for shard in shards {
            let stored = state
                .get(&super::shard_key(shard, &crate::time::watermark_key()))
                .map_err(|e| Error::internal("reading a shard's watermark", e))?;
            if let Some(stored) = stored {
                time.restore(shard, stored).map_err(|e| Error::internal("reading a shard's watermark", e))?;
            }
            for clock in Clock::ALL {
                let next =
                    next_timer(state, shard, clock).map_err(|e| Error::internal("reading a shard's timers", e))?;
                time.set_next_timer(shard, clock, next);
            }
        }
        self.store.data_mut().time = Some(time);
        Ok(())
    }

    /// Replaces the host's clock for processing time with `at_ms` (`sluice
    /// exec`: time passes only when the input says so).
    pub fn set_virtual_clock(&mut self, at_ms: i64) {
        self.store.data_mut().virtual_clock_ms = Some(at_ms);
    }

    /// Raises every shard's watermark to at least `at` (`sluice exec`).
    pub fn force_watermark(&mut self, at: i64) {
        if let Some(time) = &mut self.store.data_mut().time {
            time.force_watermark(at);
        }
    }

    /// At or below the time of the earliest timer of `clock` in any shard
    /// (ms since the Unix epoch); `None`: there is none, or the module does
    /// not use event time.
    pub fn next_timer(&self, clock: Clock) -> Option<i64> {
        let time = self.store.data().time.as_ref()?;
        time.shards().filter_map(|shard| time.next_timer(shard, clock)).min()
    }

    /// Each shard's watermark, for a module that uses event time.
    pub fn watermarks(&self) -> Option<std::collections::BTreeMap<u32, Option<i64>>> {
        self.store.data().time.as_ref().map(EventTime::watermarks)
    }

    /// Records at or below their shard's watermark since the last call
    /// (replays count again).
    /// Per shard.
    pub fn take_late_records(&mut self) -> std::collections::BTreeMap<u32, u64> {
        std::mem::take(&mut self.late_records)
    }

    /// At the barrier, before the epoch's state is frozen: has the guest
    /// hand over the state writes it holds ([`Self::flush_state`]), and
    /// writes the event time of every shard whose time moved since the last
    /// barrier into its state, so the checkpoint holds the watermark its
    /// records made (a few bytes per shard; not charged against the state
    /// limit).
    pub fn end_epoch(&mut self) -> Result<()> {
        self.flush_state()?;
        let host = self.store.data_mut();
        let Some(time) = &mut host.time else { return Ok(()) };
        for (shard, stored) in time.take_changed() {
            host.state.set(super::shard_key(shard, &crate::time::watermark_key()), stored);
        }
        Ok(())
    }

    /// Advances the watermarks to `now` (idle partitions) and calls
    /// `on-timers` with the due timers of each shard in turn (event-time
    /// timers at or below its watermark, processing-time timers at or below
    /// the host's clock, or `sluice exec`'s virtual one), each removed from
    /// the state first; returns their outputs and how many timers fired.
    /// Nothing for a module without event time.
    pub fn fire_timers(&mut self, now: Instant) -> Result<(Vec<OutputRecord>, usize)> {
        let host = self.store.data_mut();
        let now_ms = host.virtual_clock_ms.unwrap_or_else(|| crate::job::now_ms() as i64);
        let Some(time) = &mut host.time else { return Ok((Vec::new(), 0)) };
        time.advance(now);
        let shards: Vec<u32> = time.shards().collect();
        let mut outputs = Vec::new();
        let mut fired_total = 0;
        for shard in shards {
            let mut fired_in_shard = 0;
            for _ in 0..MAX_FIRING_ROUNDS {
                if fired_in_shard >= MAX_FIRED_PER_TURN {
                    break;
                }
                let fired = self.take_due(shard, now_ms)?;
                if fired.is_empty() {
                    break;
                }
                fired_in_shard += fired.len();
                fired_total += fired.len();
                // The timers see the shard's state as the batches left it.
                self.flush_shard(shard)?;
                let first = fired.first().cloned();
                match self.call_on_timers(shard, now_ms, fired) {
                    Ok(mut more) => outputs.append(&mut more),
                    Err(e) => {
                        self.failed_timer = first.map(|timer| (shard, timer));
                        return Err(e);
                    }
                }
            }
        }
        Ok((outputs, fired_total))
    }

    /// Hands `on-timers` one timer per call from now on: after a call of
    /// timers failed, the next failure names the one timer that fails.
    pub fn fire_one_timer_per_call(&mut self) {
        self.timers_per_call = 1;
    }

    /// The first timer (with its shard) of the `on-timers` call that failed,
    /// if one did: with one timer per call, the timer that fails.
    pub fn take_failed_timer(&mut self) -> Option<(u32, Timer)> {
        self.failed_timer.take()
    }

    /// Removes and returns the due timers of `shard`, at most
    /// [`MAX_FIRED_PER_CALL`] (or one, see
    /// [`fire_one_timer_per_call`](Self::fire_one_timer_per_call)), event
    /// time first; updates the bounds of its next timers.
    fn take_due(&mut self, shard: u32, now_ms: i64) -> Result<Vec<Timer>> {
        let mut fired = Vec::new();
        for clock in Clock::ALL {
            let host = self.store.data_mut();
            let Some(time) = &host.time else { break };
            let bound = match clock {
                Clock::Event => time.watermark(shard),
                Clock::Processing => Some(now_ms),
            };
            let room = self.timers_per_call.saturating_sub(fired.len());
            let Some(bound) = bound.filter(|&b| room > 0 && time.may_be_due(shard, clock, Some(b))) else {
                continue;
            };
            // In pages that start small and double: finding the due timers
            // reads them and the first one not due, not a page of 1,000
            // (a shard may hold millions that are not due). And from the
            // earliest time a timer may have: the timers fired before it
            // are deletions in the epoch's writes until the checkpoint
            // folds them, and a scan from the start of the range would
            // pass over all of them, every time.
            let prefix = super::shard_key(shard, &crate::time::timer_prefix(clock));
            let mut next = None;
            let mut due = Vec::new();
            let mut after: Option<Vec<u8>> = time
                .next_timer(shard, clock)
                .and_then(|at| at.checked_sub(1))
                .map(|before| super::shard_key(shard, &crate::time::after_timers_at(clock, before)));
            let mut step = FIRST_TIMER_PAGE.min(room + 1);
            'scan: loop {
                let page = host
                    .state
                    .scan_prefix(&prefix, after.as_deref(), step, usize::MAX)
                    .map_err(|e| Error::internal("reading a shard's timers", e))?;
                let full = page.len() == step;
                for (key, _) in page {
                    after = Some(key.clone());
                    let Some(timer) = crate::time::decode_timer(clock, &key[super::SHARD_PREFIX_BYTES..]) else {
                        continue;
                    };
                    if timer.at > bound || due.len() == room {
                        next = Some(timer.at);
                        break 'scan;
                    }
                    due.push((key, timer));
                }
                if !full {
                    break;
                }
                step = (step * 2).min(room + 1);
            }
            if let Some(time) = &mut host.time {
                time.set_next_timer(shard, clock, next);
            }
            for (key, timer) in due {
                // The removal is a state write of this epoch: the timer
                // fires exactly once in the committed output.
                if let Err(e) = self.store.data_mut().charge(&key, None) {
                    self.poisoned = true;
                    return Err(classify(e, &self.store, self.limits));
                }
                self.store.data_mut().state.delete(key);
                fired.push(timer);
            }
        }
        Ok(fired)
    }

    fn call_on_timers(&mut self, shard: u32, now_ms: i64, fired: Vec<Timer>) -> Result<Vec<OutputRecord>> {
        let Some(on_timers) = self.on_timers else {
            // Only a module that exports `on-timers` can set timers.
            return Ok(Vec::new());
        };
        let count = fired.len();
        self.enter()?;
        let host = self.store.data_mut();
        host.shard = Some(shard);
        // The clock that made its processing-time timers due.
        host.call_started_ms = now_ms;
        let timers: Vec<WitTimer> = fired.into_iter().map(WitTimer::from).collect();
        let result = on_timers.call(&mut self.store, (timers,)).map(|(result,)| result);
        self.store.data_mut().shard = None;
        match self.leave(result)? {
            Ok(outputs) => {
                self.check_output_count(outputs.len(), count, "a call of {count} fired timers")?;
                Ok(outputs)
            }
            Err(message) => {
                self.poisoned = true;
                Err(Error::guest(format!("on-timers: {message}")))
            }
        }
    }

    /// Refuses more outputs than `inputs` (records or timers) may make;
    /// `call` says what they were, with `{count}` for their number.
    fn check_output_count(&mut self, outputs: usize, inputs: usize, call: &str) -> Result<()> {
        let allowed = u64::from(self.limits.max_outputs_per_input).saturating_mul(inputs.max(1) as u64);
        if outputs as u64 > allowed {
            self.poisoned = true;
            return Err(Error::Limit(format!(
                "{outputs} output records for {} (the limit is {} per input record or timer)",
                call.replace("{count}", &inputs.to_string()),
                self.limits.max_outputs_per_input
            )));
        }
        Ok(())
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
            Ok(()) => {}
            Err(message) => {
                self.poisoned = true;
                return Err(Error::guest(message));
            }
        }
        // Tells a guest of world `cached` that this host asks for the state
        // it holds: from now on it may hold some.
        let Some((hold_state, _)) = self.hold_state else { return Ok(()) };
        self.enter()?;
        let max_bytes = (self.limits.memory_bytes / HELD_STATE_SHARE) as u64;
        let result = hold_state.call(&mut self.store, (max_bytes,));
        self.leave(result)
    }

    /// Has the guest hand over every state write it holds (world `cached`),
    /// into the open epoch: before a checkpoint barrier freezes the epoch,
    /// and before anything else reads the state. Nothing for other guests.
    pub fn flush_state(&mut self) -> Result<()> {
        while let Some(shard) = self.held.pop_first() {
            self.call_flush_state(shard)?;
        }
        Ok(())
    }

    /// [`Self::flush_state`] for one shard.
    fn flush_shard(&mut self, shard: u32) -> Result<()> {
        match self.held.remove(&shard) {
            true => self.call_flush_state(shard),
            false => Ok(()),
        }
    }

    fn call_flush_state(&mut self, shard: u32) -> Result<()> {
        let Some((_, flush_state)) = self.hold_state else { return Ok(()) };
        self.enter()?;
        self.store.data_mut().shard = Some(shard);
        let result = flush_state.call(&mut self.store, (shard,)).map(|(result,)| result);
        self.store.data_mut().shard = None;
        let failed = match self.leave(result) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(message)) => Error::guest(format!("flush-state: {message}")),
            Err(e) => e,
        };
        self.poisoned = true;
        Err(Error::HeldState(Box::new(failed)))
    }

    /// Keeps a guest of world `cached` from holding state across batches:
    /// every call writes its state back, so a refused write fails the batch
    /// of the record that made it. Before [`Self::init`], which is where the
    /// host would offer to collect held state.
    pub fn forbid_holding(&mut self) {
        self.hold_state = None;
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
                    return Err(Error::guest(format!("migrate: {message}")));
                }
            }
        }
        Ok(true)
    }

    /// Transforms one batch; returns the outputs in the order the guest gave
    /// them. The guest is called once per run of records of one shard (one
    /// input partition, the same on every input topic), with state calls
    /// scoped to that shard.
    pub fn transform(&mut self, batch: &[InputRecord]) -> Result<Outputs> {
        let mut outputs = Outputs::default();
        self.each_shard(batch, |produced| match produced {
            Produced::Packed(packed) => outputs.append(packed),
            Produced::Records(records) => outputs.extend(&records),
        })?;
        Ok(outputs)
    }

    /// [`Self::transform`], with the outputs as WIT records (for `sluice
    /// exec` and tests).
    pub fn process(&mut self, batch: &[InputRecord]) -> Result<Vec<OutputRecord>> {
        let mut outputs = Vec::new();
        self.each_shard(batch, |produced| match produced {
            Produced::Packed(packed) => outputs.extend(packed.iter().map(OutputRef::to_record)),
            Produced::Records(records) => outputs.extend(records),
        })?;
        Ok(outputs)
    }

    /// Calls the guest once per run of records of one shard in `batch` (or
    /// once, without a shard, for no records), handing each call's outputs,
    /// in the form the guest returned them, to `take`.
    fn each_shard(&mut self, batch: &[InputRecord], mut take: impl FnMut(Produced)) -> Result<()> {
        if batch.is_empty() {
            take(self.process_shard(None, batch)?);
            return Ok(());
        }
        for run in batch.chunk_by(|a, b| a.partition == b.partition) {
            let shard = u32::try_from(run[0].partition).map_err(|_| {
                Error::internal(
                    format!("a record of {}", run[0].topic),
                    format!("negative partition {}", run[0].partition),
                )
            })?;
            take(self.process_shard(Some(shard), run)?);
        }
        Ok(())
    }

    fn process_shard(&mut self, shard: Option<u32>, batch: &[InputRecord]) -> Result<Produced> {
        self.enter()?;
        let host = self.store.data_mut();
        host.shard = shard;
        if let (Some(time), Some(shard)) = (&host.time, shard) {
            // The watermark stays as it was at the call's start: these
            // records are late against it, and move it only afterwards.
            let watermark = time.watermark(shard);
            let late = batch.iter().filter(|r| crate::time::is_late(r.timestamp, watermark)).count() as u64;
            if late > 0 {
                *self.late_records.entry(shard).or_default() += late;
            }
        }
        if let (Some(shard), Some(_)) = (shard, self.hold_state) {
            // From here the guest may hold writes of the shard (even if the
            // call fails: then the instance ends anyway).
            self.held.insert(shard);
        }
        let partition = batch.first().map_or(-1, |r| r.partition);
        let result = match (self.process_packed_out, self.process_packed) {
            (Some(process_packed_out), _) => {
                super::packed::pack(partition, batch, &mut self.packed);
                let called = process_packed_out.call(&mut self.store, (self.packed.as_slice(),));
                called.map(|(result,)| result.map(Returned::Packed))
            }
            (None, Some(process_packed)) => {
                super::packed::pack(partition, batch, &mut self.packed);
                let called = process_packed.call(&mut self.store, (self.packed.as_slice(),));
                called.map(|(result,)| result.map(Returned::Records))
            }
            (None, None) => self.bindings.call_process(&mut self.store, batch).map(|r| r.map(Returned::Records)),
        };
        let host = self.store.data_mut();
        host.shard = None;
        if let (Some(time), Some(shard), Ok(_)) = (&mut host.time, shard, &result) {
            time.observe_all(shard, batch.iter().map(|r| (r.topic.as_str(), r.timestamp)), Instant::now());
        }
        let what = "a batch of {count} input records";
        match self.leave(result)? {
            Ok(Returned::Records(outputs)) => {
                self.check_output_count(outputs.len(), batch.len(), what)?;
                Ok(Produced::Records(outputs))
            }
            Ok(Returned::Packed(packed)) => {
                // The count first: a guest cannot make the host allocate
                // for more records than the limit allows.
                let count = super::packed::output_count(&packed);
                self.check_output_count(count, batch.len(), what)?;
                super::packed::unpack_outputs(packed, count).map(Produced::Packed).map_err(|malformed| {
                    self.poisoned = true;
                    Error::Guest(format!("process-packed-out returned {malformed}"))
                })
            }
            Err(message) => {
                self.poisoned = true;
                Err(Error::guest(message))
            }
        }
    }

    /// The task's state; without what a guest of world `cached` holds
    /// until [`Self::flush_state`].
    pub fn state(&self) -> &TaskState {
        &self.store.data().state
    }

    /// The task's state, for taking checkpoint deltas between batches (after
    /// [`Self::flush_state`]).
    pub fn state_mut(&mut self) -> &mut TaskState {
        &mut self.store.data_mut().state
    }

    /// Whether an earlier call failed; a poisoned instance refuses calls.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Before every call into the guest: refuses a poisoned instance, sets
    /// the deadline, and fixes the processing time the call sees (the
    /// host's clock, or `sluice exec`'s virtual one).
    fn enter(&mut self) -> Result<()> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        self.store.set_epoch_deadline(self.deadline_ticks);
        let host = self.store.data_mut();
        host.call_started_ms = host.virtual_clock_ms.unwrap_or_else(|| crate::job::now_ms() as i64);
        host.call = Some(CallBudget::start(self.limits.deadline));
        Ok(())
    }

    fn leave<T>(&mut self, result: wasmtime::Result<T>) -> Result<T> {
        result.map_err(|e| {
            self.poisoned = true;
            classify(e, &self.store, self.limits)
        })
    }
}

/// Epoch ticks (of `tick` each) in `duration`, rounded up, at least one.
fn ticks(duration: Duration, tick: Duration) -> u64 {
    let ticks = duration.as_nanos().div_ceil(tick.as_nanos().max(1)).max(1);
    u64::try_from(ticks).unwrap_or(u64::MAX)
}

/// A call used its CPU time ([`CallBudget`]): the guest's fault.
#[derive(Debug, thiserror::Error)]
#[error("the call used its CPU time")]
struct CpuDeadlinePassed;

/// A call whose wall time passed many times its CPU deadline while it used
/// less than the deadline: the host is too loaded to run it, which is not
/// the guest's fault (nor its record's).
#[derive(Debug, thiserror::Error)]
#[error(
    "a call into the guest took {wall:?} of wall time but less than its {:?} of CPU time: the host is too loaded \
     to run it",
    budget.deadline
)]
struct HostOverloaded {
    wall: Duration,
    budget: CallBudget,
}

/// The export `name` of world `world` if the instance has it; one of that
/// name but of another type is refused.
fn optional_export<Params, Results>(
    instance: &wasmtime::component::Instance,
    store: &mut Store<HostState>,
    name: &str,
    world: &str,
) -> wasmtime::Result<Option<TypedFunc<Params, Results>>>
where
    Params: wasmtime::component::ComponentNamedList + wasmtime::component::Lower,
    Results: wasmtime::component::ComponentNamedList + wasmtime::component::Lift,
{
    let Some(func) = instance.get_func(&mut *store, name) else { return Ok(None) };
    let typed = func.typed(&*store).map_err(|e| {
        Error::WorldMismatch(format!("its `{name}` export is not the one of world sluice:transform/{world}: {e:#}"))
    })?;
    Ok(Some(typed))
}

/// Whether `e` is wasmtime's refusal to copy more than the store's hostcall
/// fuel out of the guest. Its type is private to wasmtime; its message is
/// what is left to know it by (a test in `host/tests/runtime/sandbox.rs`
/// notices a change).
fn is_fuel_exhausted(e: &wasmtime::Error) -> bool {
    e.chain().any(|cause| cause.to_string().contains("fuel allocated for hostcalls has been exhausted"))
}

/// Turns a wasmtime error from a call into the runtime's error, naming the
/// limit that was hit when there was one.
fn classify(e: wasmtime::Error, store: &Store<HostState>, limits: InstanceLimits) -> Error {
    if let Some(requested) = store.data().limiter.denied {
        return Error::MemoryLimit { limit: store.data().limiter.limit(), requested };
    }
    if is_fuel_exhausted(&e) {
        return Error::Limit(format!(
            "the guest handed the host more than {} bytes in one call (its memory limit), counting every list and \
             string it passed or returned, and each time one region was named again",
            limits.memory_bytes
        ));
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
    if let Some(reserved) = e.downcast_ref::<super::ReservedKey>() {
        return Error::Guest(reserved.to_string());
    }
    if let Some(no_export) = e.downcast_ref::<super::NoTimerExport>() {
        return Error::Guest(no_export.to_string());
    }
    if e.downcast_ref::<CpuDeadlinePassed>().is_some() {
        return Error::Deadline(limits.deadline);
    }
    if let Some(Trap::Interrupt) = e.downcast_ref::<Trap>() {
        return Error::Deadline(limits.deadline);
    }
    // The host's faults, not the guest's (nor its records'): retried with
    // backoff, never counted against a record.
    if let Some(overloaded) = e.downcast_ref::<HostOverloaded>() {
        return Error::internal("running the guest", overloaded.to_string());
    }
    if let Some(backend) = e.downcast_ref::<crate::state::Error>() {
        return Error::internal("a state call of the guest", backend.to_string());
    }
    Error::Trap(format!("{e:?}"))
}

/// The time of `shard`'s first timer of `clock` in `state`, if it has one.
fn next_timer(state: &mut TaskState, shard: u32, clock: Clock) -> crate::state::Result<Option<i64>> {
    let prefix = super::shard_key(shard, &crate::time::timer_prefix(clock));
    let first = state.scan_prefix(&prefix, None, 1, usize::MAX)?;
    Ok(first
        .first()
        .and_then(|(key, _)| crate::time::decode_timer(clock, &key[super::SHARD_PREFIX_BYTES..]))
        .map(|t| t.at))
}
