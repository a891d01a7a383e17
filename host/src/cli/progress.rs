//! Progress for people at a terminal: a bar for an upload's bytes, a
//! spinner for a wait (the compile after an upload, a stop's final
//! checkpoint, a toolchain's first install). Drawn on stderr and only when
//! stdout is a terminal, so a script or a pipe sees exactly what it saw
//! before.

use std::borrow::Cow;
use std::io::{IsTerminal, Read};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

fn target() -> ProgressDrawTarget {
    if std::io::stdout().is_terminal() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() }
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {msg} ({elapsed})").unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// A spinner showing `message` until it is dropped or finished.
pub(crate) fn spinner(message: impl Into<Cow<'static, str>>) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, target());
    bar.set_style(spinner_style());
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// A reader that moves a bar of `len` bytes as it is read, then turns the
/// bar into a spinner showing `then` (what the other side does with the
/// bytes) once they are all read.
pub(crate) struct Upload<R> {
    inner: R,
    bar: ProgressBar,
    then: Option<String>,
}

impl<R> Upload<R> {
    pub(crate) fn new(inner: R, len: u64, message: String, then: String) -> Upload<R> {
        let bar = ProgressBar::with_draw_target(Some(len), target());
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
                .map(|style| style.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(message);
        Upload { inner, bar, then: Some(then) }
    }

    /// The bar, to finish once the answer came.
    pub(crate) fn bar(&self) -> ProgressBar {
        self.bar.clone()
    }
}

impl<R: Read> Read for Upload<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        if n == 0
            && let Some(then) = self.then.take()
        {
            self.bar.set_style(spinner_style());
            self.bar.set_message(then);
            self.bar.enable_steady_tick(Duration::from_millis(120));
        }
        Ok(n)
    }
}
