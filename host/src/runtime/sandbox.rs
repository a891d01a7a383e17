//! The sandbox a guest runs in: the store's data, the memory limiter, the
//! restricted WASI context, and the linker that offers exactly the sluice
//! imports plus that WASI.
//!
//! WASI is there only because std Rust, C and Go guests import it. Each guest
//! gets: no preopened directories (so no filesystem), no sockets or name
//! lookups, no environment variables or arguments, a wall clock frozen at the
//! Unix epoch and a virtual monotonic clock that advances 1 µs per reading (so
//! a transform cannot make its output depend on real time), and stdout/stderr
//! that become host log lines tagged with the instance's name.
//!
//! No WASI call may block: epoch interruption only fires in Wasm code, so a
//! guest asleep inside a host call would hold its task (and a stop, an
//! upgrade, a host shutdown) for as long as it liked. The only WASI
//! pollables that could wait are the monotonic clock's; here they are ready
//! at once and move the virtual clock forward by what the guest asked to
//! wait, so `sleep(d)` returns immediately with `d` apparently elapsed.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use wasmtime::StoreContextMut;
use wasmtime::component::{HasSelf, Linker, Resource, ResourceTable};
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamResult, subscribe};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::timed::Timed;
use super::{Error, Result};
use crate::state::TaskState;

/// What one call into the guest may take: its deadline is CPU time of the
/// thread that runs it (the guest's code and the host calls it makes), not
/// wall time, so that another tenant's load, or the host waiting on its
/// disk, is never charged to the guest. A call whose wall time passes
/// [`CallBudget::wall_limit`] while it used little CPU (a host so loaded
/// that the call hardly runs) ends as the host's fault.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallBudget {
    /// The thread's CPU time when the call began.
    cpu_at_start: Duration,
    /// When the call began.
    started: std::time::Instant,
    /// CPU time the call may use.
    pub(super) deadline: Duration,
}

/// The thread's CPU time (Linux: `CLOCK_THREAD_CPUTIME_ID`); zero where it
/// cannot be read, which makes every deadline a wall-time one.
fn thread_cpu() -> Duration {
    cpu_time::ThreadTime::try_now().map(|t| t.as_duration()).unwrap_or_default()
}

/// How a call's check at an epoch tick ended.
pub(crate) enum Checked {
    /// Within its budget: check again after about this long.
    Continue(Duration),
    /// It used its CPU time.
    DeadlinePassed,
    /// Its wall time is many times its CPU deadline: the host, not the
    /// guest, is slow.
    HostOverloaded(Duration),
}

impl CallBudget {
    /// A call starting now with `deadline` of CPU time.
    pub(crate) fn start(deadline: Duration) -> Self {
        CallBudget { cpu_at_start: thread_cpu(), started: std::time::Instant::now(), deadline }
    }

    /// The wall time after which a call is the host's failure: ten times
    /// its CPU deadline, and at least a minute.
    pub(crate) fn wall_limit(&self) -> Duration {
        (self.deadline * 10).max(Duration::from_secs(60))
    }

    /// Where the call stands (on the thread that runs it).
    pub(crate) fn check(&self) -> Checked {
        let used = thread_cpu().saturating_sub(self.cpu_at_start);
        if used >= self.deadline {
            return Checked::DeadlinePassed;
        }
        let wall = self.started.elapsed();
        if wall >= self.wall_limit() {
            return Checked::HostOverloaded(wall);
        }
        Checked::Continue((self.deadline - used).min(self.wall_limit() - wall))
    }
}

/// Everything a guest's store owns.
pub(crate) struct HostState {
    pub(super) name: Arc<str>,
    pub(super) state: TaskState,
    /// The shard (input partition) whose records the running call holds:
    /// every state call goes to its keys. `None` outside `process` and
    /// `migrate` (in `init`), where state calls trap.
    pub(super) shard: Option<u32>,
    /// Event time of the task's shards, for a module that uses the `time`
    /// interface or exports `on-timers`; `None` for others.
    pub(super) time: Option<crate::time::EventTime>,
    /// Whether the module exports `on-timers`: only then may it set timers.
    pub(super) fires_timers: bool,
    /// The host's clock (ms since the Unix epoch) when the running call
    /// began: the guest's processing time.
    pub(super) call_started_ms: i64,
    /// A clock that stands in for the host's (`sluice exec`), in ms.
    pub(super) virtual_clock_ms: Option<i64>,
    /// The running call's budget (see [`CallBudget`]), from its start.
    pub(super) call: Option<CallBudget>,
    pub(super) limiter: MemoryLimiter,
    /// Shared with stdout and stderr: log lines per second.
    pub(super) log_budget: Arc<LogBudget>,
    /// Where a read builds the stored form of the guest's key, reused
    /// from call to call so that reads allocate no key.
    pub(super) read_key: Vec<u8>,
    clock: VirtualMonotonicClock,
    wasi: WasiCtx,
    table: ResourceTable,
}

/// The most random bytes one `get-random-bytes` call returns.
const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// The most WASI resources (streams, pollables) a guest holds at once.
const MAX_RESOURCES: usize = 10_000;

impl HostState {
    pub(super) fn new(name: &str, state: TaskState, memory_limit: usize) -> Self {
        let name: Arc<str> = Arc::from(name);
        let clock = VirtualMonotonicClock::default();
        let log_budget = Arc::new(LogBudget::default());
        let wasi = WasiCtxBuilder::new()
            .stdout(LogStream::new(Arc::clone(&name), "stdout", Arc::clone(&log_budget)))
            .stderr(LogStream::new(Arc::clone(&name), "stderr", Arc::clone(&log_budget)))
            .wall_clock(FrozenWallClock)
            .monotonic_clock(clock.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            // wasmtime-wasi's default is 64 MiB a call, allocated by the
            // host before it is lowered: at most 1 MiB, and no more than
            // the guest can hold.
            .max_random_size((memory_limit as u64).min(MAX_RANDOM_BYTES))
            .build();
        let mut table = ResourceTable::new();
        // wasmtime's default is a million entries: a guest that never drops
        // its pollables would hold ~100 MB of the host's memory.
        table.set_max_capacity(MAX_RESOURCES);
        HostState {
            name,
            state,
            shard: None,
            time: None,
            fires_timers: false,
            call_started_ms: 0,
            virtual_clock_ms: None,
            call: None,
            limiter: MemoryLimiter::new(memory_limit),
            log_budget,
            read_key: Vec::new(),
            clock,
            wasi,
            table,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// The linker every module is validated and instantiated against.
pub(super) fn linker(engine: &Engine) -> Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
        .map_err(|e| Error::internal("adding wasi to the linker", e.into_boxed_dyn_error()))?;
    Timed::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
        .map_err(|e| Error::internal("adding the sluice imports to the linker", e.into_boxed_dyn_error()))?;
    virtual_clock_pollables(&mut linker)
        .map_err(|e| Error::internal("adding the virtual clock to the linker", e.into_boxed_dyn_error()))?;
    Ok(linker)
}

/// The WASI monotonic clock's interface as wasmtime-wasi defines it; guests
/// built against any 0.2.x version link to it.
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// Replaces wasmtime-wasi's `subscribe-duration` and `subscribe-instant`,
/// whose pollables sleep on a real timer, with pollables that are ready at
/// once and advance the guest's virtual clock instead.
fn virtual_clock_pollables(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    fn ready_now(table: &mut ResourceTable) -> wasmtime::Result<Resource<DynPollable>> {
        let ready = table.push(ReadyNow)?;
        subscribe(table, ready)
    }
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap("subscribe-duration", |mut store: StoreContextMut<'_, HostState>, (duration,): (u64,)| {
        let host = store.data_mut();
        host.clock.advance(duration);
        Ok((ready_now(&mut host.table)?,))
    })?;
    clock.func_wrap("subscribe-instant", |mut store: StoreContextMut<'_, HostState>, (when,): (u64,)| {
        let host = store.data_mut();
        host.clock.advance_to(when);
        Ok((ready_now(&mut host.table)?,))
    })?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A pollable that is always ready: what a clock subscription becomes.
struct ReadyNow;

#[wasmtime_wasi::async_trait]
impl Pollable for ReadyNow {
    async fn ready(&mut self) {}
}

/// Caps the total linear memory of one guest. Growing past the cap traps the
/// guest (rather than letting `memory.grow` return -1, which most language
/// runtimes turn into an abort with a less helpful message), and the denial is
/// remembered so the error can say which limit was hit.
pub(crate) struct MemoryLimiter {
    limit: usize,
    total: usize,
    pub(super) denied: Option<usize>,
}

impl MemoryLimiter {
    fn new(limit: usize) -> Self {
        MemoryLimiter { limit, total: 0, denied: None }
    }

    pub(super) fn limit(&self) -> usize {
        self.limit
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let requested = self.total.saturating_sub(current).saturating_add(desired);
        if requested > self.limit {
            self.denied = Some(requested);
            return Err(wasmtime::format_err!(
                "memory limit of {} bytes exceeded (asked for {requested} bytes)",
                self.limit
            ));
        }
        self.total = requested;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        // Tables are bounded by the pooling allocator's `table_elements`.
        Ok(desired <= 200_000)
    }
}

/// A wall clock stopped at the Unix epoch.
struct FrozenWallClock;

impl HostWallClock for FrozenWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// A monotonic clock that advances 1 µs per reading, and by whatever a guest
/// waits for: language runtimes that need time to move forward work, and
/// output never depends on real time. Clones share the reading.
#[derive(Default, Clone)]
struct VirtualMonotonicClock {
    now: Arc<AtomicU64>,
}

impl VirtualMonotonicClock {
    /// Moves the clock `nanos` forward, as if that much time passed.
    fn advance(&self, nanos: u64) {
        // `fetch_update` with a closure that never refuses cannot fail.
        let _ = self.now.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| Some(now.saturating_add(nanos)));
    }

    /// Moves the clock to `when` if that is later.
    fn advance_to(&self, when: u64) {
        self.now.fetch_max(when, Ordering::Relaxed);
    }
}

impl HostMonotonicClock for VirtualMonotonicClock {
    fn resolution(&self) -> u64 {
        1_000
    }
    fn now(&self) -> u64 {
        self.now.fetch_add(1_000, Ordering::Relaxed) + 1_000
    }
}

/// How many log lines a guest may write: a bucket of [`LOG_BURST`] lines
/// refilled at [`LOG_LINES_PER_SECOND`] (on the host's clock). Lines over it
/// are dropped and counted, and the count is logged once the guest is back
/// under the rate, so one chatty guest cannot flood the host's log or its
/// log rings.
#[derive(Debug)]
pub(crate) struct LogBudget(Mutex<Bucket>);

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: std::time::Instant,
    dropped: u64,
}

/// Lines a guest may log at once.
const LOG_BURST: f64 = 1_000.0;
/// Lines a guest may log per second, over time.
const LOG_LINES_PER_SECOND: f64 = 100.0;

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget(Mutex::new(Bucket { tokens: LOG_BURST, refilled: std::time::Instant::now(), dropped: 0 }))
    }
}

impl LogBudget {
    /// Whether one more line may be logged now; when lines were dropped
    /// before, how many (the caller says so).
    pub(crate) fn take(&self) -> (bool, u64) {
        self.take_at(std::time::Instant::now())
    }

    fn take_at(&self, now: std::time::Instant) -> (bool, u64) {
        let Ok(mut bucket) = self.0.lock() else { return (false, 0) };
        let refill = now.saturating_duration_since(bucket.refilled).as_secs_f64() * LOG_LINES_PER_SECOND;
        bucket.tokens = (bucket.tokens + refill).min(LOG_BURST);
        bucket.refilled = bucket.refilled.max(now);
        if bucket.tokens < 1.0 {
            bucket.dropped += 1;
            return (false, 0);
        }
        bucket.tokens -= 1.0;
        (true, std::mem::take(&mut bucket.dropped))
    }
}

/// A guest's stdout or stderr, turned into host log lines.
#[derive(Clone)]
struct LogStream {
    name: Arc<str>,
    stream: &'static str,
    partial: Arc<Mutex<Vec<u8>>>,
    budget: Arc<LogBudget>,
}

/// The longest line kept before it is logged in pieces.
const MAX_LINE: usize = 4096;

impl LogStream {
    fn new(name: Arc<str>, stream: &'static str, budget: Arc<LogBudget>) -> Self {
        LogStream { name, stream, partial: Arc::default(), budget }
    }

    fn write_bytes(&self, bytes: &[u8]) {
        let Ok(mut partial) = self.partial.lock() else { return };
        for &byte in bytes {
            if byte == b'\n' || partial.len() >= MAX_LINE {
                self.emit(&partial);
                partial.clear();
                if byte == b'\n' {
                    continue;
                }
            }
            partial.push(byte);
        }
    }

    fn emit(&self, line: &[u8]) {
        let (allowed, dropped) = self.budget.take();
        if dropped > 0 {
            tracing::warn!(target: "sluice::guest", instance = %self.name, "dropped {dropped} log lines over the rate limit");
        }
        if allowed {
            let line = String::from_utf8_lossy(line);
            tracing::info!(target: "sluice::guest", instance = %self.name, stream = self.stream, "{line}");
        }
    }
}

impl Drop for LogStream {
    fn drop(&mut self) {
        if Arc::strong_count(&self.partial) == 1
            && let Ok(partial) = self.partial.lock()
            && !partial.is_empty()
        {
            self.emit(&partial);
        }
    }
}

impl IsTerminal for LogStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for LogStream {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.write_bytes(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LogStream {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for LogStream {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.write_bytes(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_chatty_guest_gets_its_burst_then_its_rate_and_hears_what_was_dropped() {
        let budget = LogBudget::default();
        let start = Instant::now();
        let allowed = (0..1_500).filter(|_| budget.take_at(start).0).count();
        assert_eq!(allowed, 1_000, "the burst");
        // A second later: 100 more lines, and the first says 500 were dropped.
        let later = start + Duration::from_secs(1);
        assert_eq!(budget.take_at(later), (true, 500));
        let more = (0..200).filter(|_| budget.take_at(later).0).count();
        assert_eq!(more, 99, "the rate");
    }
}
