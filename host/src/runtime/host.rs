//! The host side of the WIT imports: `state` and `log`.
//!
//! Every state call goes to the calling instance's own [`TaskState`]; there is
//! no way to name another task's state. A backend failure (I/O) traps the
//! guest: the batch fails and the task restarts from its last checkpoint.

use super::bindings::sluice::transform::{log, state, types};
use super::sandbox::HostState;

/// The longest log message kept; longer ones are cut.
const MAX_LOG_MESSAGE: usize = 4096;

fn trap(e: crate::state::Error) -> wasmtime::Error {
    wasmtime::format_err!("{e}")
}

impl HostState {
    /// Charges a write against the task's state-size limit; over the limit,
    /// the guest traps and the batch fails.
    fn charge(&mut self, key: &[u8], value_len: Option<usize>) -> wasmtime::Result<()> {
        match self.state.charge(key, value_len).map_err(trap)? {
            Ok(()) => Ok(()),
            Err(exceeded) => Err(wasmtime::Error::new(exceeded)),
        }
    }
}

impl types::Host for HostState {}

impl state::Host for HostState {
    fn get(&mut self, key: Vec<u8>) -> wasmtime::Result<Option<Vec<u8>>> {
        Ok(self.state.get(&key).map_err(trap)?.map(<[u8]>::to_vec))
    }

    fn get_many(&mut self, keys: Vec<Vec<u8>>) -> wasmtime::Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|key| Ok(self.state.get(key).map_err(trap)?.map(<[u8]>::to_vec))).collect()
    }

    fn set(&mut self, key: Vec<u8>, value: Vec<u8>) -> wasmtime::Result<()> {
        self.charge(&key, Some(value.len()))?;
        self.state.set(key, value);
        Ok(())
    }

    fn delete(&mut self, key: Vec<u8>) -> wasmtime::Result<()> {
        self.charge(&key, None)?;
        self.state.delete(key);
        Ok(())
    }

    fn write(&mut self, entries: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> wasmtime::Result<()> {
        for (key, value) in entries {
            self.charge(&key, value.as_ref().map(Vec::len))?;
            self.state.write(key, value);
        }
        Ok(())
    }

    fn scan_prefix(
        &mut self,
        prefix: Vec<u8>,
        start_after: Option<Vec<u8>>,
        limit: u32,
    ) -> wasmtime::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX).min(10_000);
        self.state.scan_prefix(&prefix, start_after.as_deref(), limit).map_err(trap)
    }
}

impl log::Host for HostState {
    fn log(&mut self, level: log::Level, mut message: String) -> wasmtime::Result<()> {
        if message.len() > MAX_LOG_MESSAGE {
            let mut cut = MAX_LOG_MESSAGE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
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
