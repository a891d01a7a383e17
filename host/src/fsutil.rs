//! Small file-system helpers shared by the modules that persist files.

use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` so that a reader sees the whole file or none:
/// into a temporary file beside it, then renamed over it. Creates the
/// directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = PathBuf::from(format!("{}.tmp-{}", path.display(), std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
