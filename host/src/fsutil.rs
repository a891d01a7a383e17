//! Small file-system helpers shared by the modules that persist files.

use std::io::Write as _;
use std::path::Path;

/// Writes `bytes` to `path` so that a reader sees the whole file or none,
/// also after a crash or a power loss: into a uniquely named temporary file
/// beside it (so concurrent writers of one path never share a temporary
/// file), synced, renamed over `path`, and the directory synced so the
/// rename itself is durable. Creates the directory. The file is readable by
/// its owner only (tempfile creates it with mode 0600).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let mut file = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    sync_dir_of(path)
}

/// Syncs the directory that holds `path`, so a rename or a new file in it
/// survives a power loss.
pub(crate) fn sync_dir_of(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::File::open(dir)?.sync_all(),
        _ => std::fs::File::open(".")?.sync_all(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_writers_of_one_path_leave_one_whole_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("sub").join("file");
        std::thread::scope(|scope| {
            for writer in 0..8u8 {
                let path = &path;
                scope.spawn(move || {
                    for _ in 0..20 {
                        write_atomically(path, &[writer; 4096]).expect("write");
                    }
                });
            }
        });
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(bytes.len(), 4096);
        assert!(bytes.iter().all(|&b| b == bytes[0]), "a mix of two writers' bytes");
        let left: Vec<_> = std::fs::read_dir(path.parent().expect("dir")).expect("ls").collect();
        assert_eq!(left.len(), 1, "temporary files left behind: {left:?}");
    }
}
