//! The host side of the WIT imports: `state` and `log`.
//!
//! State belongs to a *shard*: partition p of the job's input (of each input
//! topic). Every call into the guest holds records of one shard, and every
//! state call during it goes to that shard's keys, which the instance's
//! [`TaskState`] holds under the shard's number (see [`shard_key`]); there is
//! no way to name another shard's or another task's state. A backend failure
//! (I/O) traps the guest: the batch fails and the task restarts from its
//! last checkpoint.

use super::bindings::sluice::transform::{log, state, types};
use super::packed::{Unpacker, len32, put_bytes};
use super::sandbox::HostState;

/// The longest log message kept; longer ones are cut.
const MAX_LOG_MESSAGE: usize = 4096;

/// The longest state key a guest may read or write, in bytes.
pub const MAX_KEY_BYTES: usize = 64 << 10;
/// The largest state value a guest may write, in bytes (and never more than
/// its memory limit).
pub const MAX_VALUE_BYTES: usize = 16 << 20;
/// The most keys one `get-many` may ask for (the largest batch size).
pub const MAX_GET_MANY_KEYS: usize = 100_000;

/// A state call that asked the host for more than a guest may: the call
/// traps, and the error says which bound it crossed.
#[derive(Debug, thiserror::Error)]
#[error("state limit: {0}")]
pub struct StateLimit(String);

fn trap(e: crate::state::Error) -> wasmtime::Error {
    wasmtime::Error::new(e)
}

fn refuse(message: String) -> wasmtime::Error {
    wasmtime::Error::new(StateLimit(message))
}

/// The refusal of a `get-many` whose values would not fit the guest's
/// memory.
fn too_much(keys: usize, max_bytes: usize) -> wasmtime::Error {
    refuse(format!(
        "get-many of {keys} keys would return more than {max_bytes} bytes, the guest's memory limit: ask for fewer \
         keys at a time"
    ))
}

/// A state call outside any shard: `init` runs before any partition's
/// records, so it has no state to read or write.
#[derive(Debug, thiserror::Error)]
#[error(
    "state is kept per input partition, and `init` runs before any partition's records: read and write state \
         in `process` (or `migrate`)"
)]
pub struct NoShard;

/// Bytes of the shard number in front of every stored key.
pub const SHARD_PREFIX_BYTES: usize = 4;

/// The key under which the state of `shard` keeps the guest's `key`: the
/// shard's number (big-endian, so a shard's keys are one contiguous range
/// in key order), then the key.
pub fn shard_key(shard: u32, key: &[u8]) -> Vec<u8> {
    let mut stored = Vec::with_capacity(SHARD_PREFIX_BYTES + key.len());
    push_shard_key(shard, key, &mut stored);
    stored
}

/// Appends [`shard_key`] to `stored`.
fn push_shard_key(shard: u32, key: &[u8], stored: &mut Vec<u8>) {
    stored.extend_from_slice(&shard.to_be_bytes());
    stored.extend_from_slice(key);
}

/// Refuses a `get-many` of more keys than [`MAX_GET_MANY_KEYS`], before
/// anything is allocated for them.
fn check_get_many_count(count: usize) -> wasmtime::Result<()> {
    match count > MAX_GET_MANY_KEYS {
        true => Err(refuse(format!("get-many of {count} keys is over the limit of {MAX_GET_MANY_KEYS}"))),
        false => Ok(()),
    }
}

/// The shard a stored key belongs to (see [`shard_key`]); `None` for a key
/// too short to carry one.
pub fn shard_of(stored: &[u8]) -> Option<u32> {
    let prefix: [u8; SHARD_PREFIX_BYTES] = stored.get(..SHARD_PREFIX_BYTES)?.try_into().ok()?;
    Some(u32::from_be_bytes(prefix))
}

/// Whether a stored key (or a scan's prefix) lies in its shard's host part
/// (see [`crate::time::RESERVED`]), which the task keeps in key order for
/// firing timers.
pub(super) fn is_host_key(stored: &[u8]) -> bool {
    stored.get(SHARD_PREFIX_BYTES..).is_some_and(crate::time::is_reserved)
}

/// A state call that named one of the host's keys (see
/// [`crate::time::RESERVED`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "state keys beginning with the bytes 0xFF \"sluice\" 0x00 are the host's (a shard's timers and watermark): use \
     another key"
)]
pub struct ReservedKey;

pub(super) fn check_key(key: &[u8]) -> wasmtime::Result<()> {
    if key.len() > MAX_KEY_BYTES {
        return Err(refuse(format!("a key of {} bytes is over the {MAX_KEY_BYTES}-byte limit", key.len())));
    }
    Ok(())
}

impl HostState {
    /// The stored key of the guest's `key`, in the running call's shard.
    fn scoped(&self, key: &[u8]) -> wasmtime::Result<Vec<u8>> {
        let mut stored = Vec::with_capacity(SHARD_PREFIX_BYTES + key.len());
        self.scope_into(key, &mut stored)?;
        Ok(stored)
    }

    /// Writes the stored key of the guest's `key` into `stored`, replacing
    /// what it held.
    fn scope_into(&self, key: &[u8], stored: &mut Vec<u8>) -> wasmtime::Result<()> {
        stored.clear();
        self.scope_append(key, stored)
    }

    /// Appends the stored key of the guest's `key` to `stored`.
    fn scope_append(&self, key: &[u8], stored: &mut Vec<u8>) -> wasmtime::Result<()> {
        check_key(key)?;
        if crate::time::is_reserved(key) {
            return Err(wasmtime::Error::new(ReservedKey));
        }
        let shard = self.shard.ok_or_else(|| wasmtime::Error::new(NoShard))?;
        push_shard_key(shard, key, stored);
        Ok(())
    }

    /// The values of the stored keys `stored` (`get-many`, whose callers
    /// checked their count), within what the guest's memory could hold.
    fn read_many(&mut self, stored: &[&[u8]]) -> wasmtime::Result<Vec<Option<Vec<u8>>>> {
        // The result is built in host memory before it is lowered into the
        // guest's: bound it by what the guest could hold, before allocating.
        let max_bytes = self.max_result_bytes();
        match self.state.get_many(stored, max_bytes).map_err(trap)? {
            Some(values) => Ok(values),
            None => Err(too_much(stored.len(), max_bytes)),
        }
    }

    /// One write of `write` or `write-packed`.
    fn write_one(&mut self, key: &[u8], value: Option<Vec<u8>>) -> wasmtime::Result<()> {
        let key = self.scoped(key)?;
        self.charge(&key, value.as_ref().map(Vec::len))?;
        self.state.write(key, value);
        Ok(())
    }

    /// The value of the guest's `key`, read through [`Self::read_key`].
    fn read(&mut self, key: &[u8]) -> wasmtime::Result<Option<Vec<u8>>> {
        let mut stored = std::mem::take(&mut self.read_key);
        let value = self
            .scope_into(key, &mut stored)
            .and_then(|()| Ok(self.state.get(&stored).map_err(trap)?.map(<[u8]>::to_vec)));
        self.read_key = stored;
        value
    }

    /// The most bytes of state values one call may hand the guest: what its
    /// memory could ever hold.
    fn max_result_bytes(&self) -> usize {
        self.limiter.limit()
    }

    /// Checks a write against the key and value bounds and the host memory
    /// its open writes may take, and charges it against the task's
    /// state-size limit; over any of them, the guest traps and the batch
    /// fails.
    pub(super) fn charge(&mut self, key: &[u8], value_len: Option<usize>) -> wasmtime::Result<()> {
        let max_value = MAX_VALUE_BYTES.min(self.limiter.limit());
        if let Some(len) = value_len
            && len > max_value
        {
            return Err(refuse(format!("a value of {len} bytes is over the {max_value}-byte limit")));
        }
        if let (Some(len), Some(max)) = (value_len, self.state.max_entry_bytes())
            && key.len() + len > max
        {
            return Err(refuse(format!(
                "an entry of {} bytes (key and value) is over the {max} bytes one changelog record holds: write \
                 smaller values, raise `kafka.\"message.max.bytes\"`, or turn the changelog off",
                key.len() + len
            )));
        }
        // The host keeps the writes since the last checkpoint in memory, at
        // most the guest's own memory limit (crate::checkpoint::budget).
        let max_open = self.limiter.limit();
        let open = self.state.open_bytes().saturating_add(crate::state::entry_bytes(key.len(), value_len));
        if open > max_open {
            return Err(refuse(format!(
                "the writes since the last checkpoint would hold {open} bytes of host memory, over {max_open} bytes \
                 (the memory limit): write less per checkpoint interval, or raise \
                 `limits.memory`"
            )));
        }
        match self.state.charge(key, value_len).map_err(trap)? {
            Ok(()) => Ok(()),
            Err(exceeded) => Err(wasmtime::Error::new(exceeded)),
        }
    }
}

impl types::Host for HostState {}

impl state::Host for HostState {
    fn get(&mut self, key: Vec<u8>) -> wasmtime::Result<Option<Vec<u8>>> {
        self.read(&key)
    }

    fn get_many(&mut self, keys: Vec<Vec<u8>>) -> wasmtime::Result<Vec<Option<Vec<u8>>>> {
        check_get_many_count(keys.len())?;
        let stored = keys.iter().map(|key| self.scoped(key)).collect::<wasmtime::Result<Vec<_>>>()?;
        let stored: Vec<&[u8]> = stored.iter().map(Vec::as_slice).collect();
        self.read_many(&stored)
    }

    fn get_many_packed(&mut self, keys: Vec<u8>) -> wasmtime::Result<Vec<u8>> {
        let mut reader = Unpacker::new(&keys, "get-many-packed keys");
        let count = reader.u32()?;
        check_get_many_count(count)?;
        // Every stored key in one buffer, not one allocation each.
        let mut stored = Vec::with_capacity(keys.len() + count * SHARD_PREFIX_BYTES);
        let mut ends = Vec::with_capacity(count);
        for _ in 0..count {
            self.scope_append(reader.bytes()?, &mut stored)?;
            ends.push(stored.len());
        }
        reader.finish()?;
        let starts = std::iter::once(0).chain(ends.iter().copied());
        let stored: Vec<&[u8]> = starts.zip(&ends).map(|(start, &end)| &stored[start..end]).collect();
        // Each value straight into the result, not into a copy of its own.
        let max_bytes = self.max_result_bytes();
        let mut out = Vec::with_capacity(4 + 5 * count);
        out.extend_from_slice(&len32(count));
        let whole = self
            .state
            .get_many_with(&stored, max_bytes, |value| match value {
                None => out.push(0),
                Some(value) => {
                    out.push(1);
                    put_bytes(&mut out, value);
                }
            })
            .map_err(trap)?;
        if !whole {
            return Err(too_much(stored.len(), max_bytes));
        }
        Ok(out)
    }

    fn set(&mut self, key: Vec<u8>, value: Vec<u8>) -> wasmtime::Result<()> {
        let key = self.scoped(&key)?;
        self.charge(&key, Some(value.len()))?;
        self.state.set(key, value);
        Ok(())
    }

    fn delete(&mut self, key: Vec<u8>) -> wasmtime::Result<()> {
        let key = self.scoped(&key)?;
        self.charge(&key, None)?;
        self.state.delete(key);
        Ok(())
    }

    fn write(&mut self, entries: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> wasmtime::Result<()> {
        entries.into_iter().try_for_each(|(key, value)| self.write_one(&key, value))
    }

    fn write_packed(&mut self, entries: Vec<u8>) -> wasmtime::Result<()> {
        let mut reader = Unpacker::new(&entries, "write-packed entries");
        for _ in 0..reader.u32()? {
            let key = reader.bytes()?;
            let value = reader.optional_bytes()?;
            self.write_one(key, value.map(<[u8]>::to_vec))?;
        }
        Ok(reader.finish()?)
    }

    fn scan_prefix(
        &mut self,
        prefix: Vec<u8>,
        start_after: Option<Vec<u8>>,
        limit: u32,
    ) -> wasmtime::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        // A prefix of the host's range ("", "\xff", ...) may be scanned; the
        // host's keys are skipped. A key inside it may not be named.
        let prefix = match crate::time::RESERVED.starts_with(&prefix) {
            true => {
                check_key(&prefix)?;
                let shard = self.shard.ok_or_else(|| wasmtime::Error::new(NoShard))?;
                shard_key(shard, &prefix)
            }
            false => self.scoped(&prefix)?,
        };
        let start_after = start_after.map(|key| self.scoped(&key)).transpose()?;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX).min(10_000);
        let max_bytes = self.max_result_bytes();
        let mut page = self.state.scan_prefix(&prefix, start_after.as_deref(), limit, max_bytes).map_err(trap)?;
        if let Some(at) = page.iter().position(|(key, _)| is_host_key(key)) {
            // The host's keys are one contiguous range: the page goes on
            // after it.
            page.truncate(at);
            let shard = self.shard.ok_or_else(|| wasmtime::Error::new(NoShard))?;
            let after = shard_key(shard, &crate::time::after_reserved());
            let rest = self.state.scan_prefix(&prefix, Some(&after), limit - at, max_bytes).map_err(trap)?;
            page.extend(rest);
        }
        let bytes: usize = page.iter().map(|(k, v)| k.len() - SHARD_PREFIX_BYTES + v.len()).sum();
        if bytes > max_bytes {
            return Err(refuse(format!(
                "scan-prefix would return more than {max_bytes} bytes, the guest's memory limit: ask for fewer \
                 entries at a time"
            )));
        }
        // The guest sees its own keys, without the shard's number.
        Ok(page.into_iter().map(|(mut key, value)| (key.split_off(SHARD_PREFIX_BYTES), value)).collect())
    }
}

impl log::Host for HostState {
    fn log(&mut self, level: log::Level, mut message: String) -> wasmtime::Result<()> {
        let (allowed, dropped) = self.log_budget.take();
        if dropped > 0 {
            tracing::warn!(target: "sluice::guest", instance = &*self.name, "dropped {dropped} log lines over the rate limit");
        }
        if !allowed {
            return Ok(());
        }
        if message.len() > MAX_LOG_MESSAGE {
            message.truncate(message.floor_char_boundary(MAX_LOG_MESSAGE));
            message.push('…');
        }
        let instance = &*self.name;
        match level {
            log::Level::Trace => tracing::trace!(target: "sluice::guest", instance, "{message}"),
            log::Level::Debug => tracing::debug!(target: "sluice::guest", instance, "{message}"),
            log::Level::Info => tracing::info!(target: "sluice::guest", instance, "{message}"),
            log::Level::Warn => tracing::warn!(target: "sluice::guest", instance, "{message}"),
            log::Level::Error => tracing::error!(target: "sluice::guest", instance, "{message}"),
        }
        Ok(())
    }
}
