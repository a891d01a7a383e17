//! Module bytes in a cluster: the host that takes an upload writes the
//! bytes to the compacted modules topic in chunks below the broker's
//! message size (key `<digest>/<upload>/<index>/<count>`, the upload a
//! random id of the upload's record) after the module's record names the
//! upload and before the record lets jobs use it; every host follows the
//! topic and keeps each complete module, checked against its digest, as
//! `<digest>.wasm` beside its own uploads.
//!
//! A module's bytes live exactly as long as some upload's chunks do. The
//! follower notes each upload it saw a chunk of (a marker file
//! `.uploads/<digest>/<upload>`); when an upload's module record is
//! deleted, or the upload is refused or abandoned, its chunks are deleted
//! from the topic by tombstones ([`delete`]), and every follower drops
//! that upload's marker and, once no upload of the digest is left and no
//! record names it ([`ModuleIndex`]), the bytes and their compiled code.
//! Keys carry the upload so that deleting one upload's chunks never
//! touches another's of the same bytes (two tenants, or an upload again).
//! Keys of hosts before uploads were named (`<digest>/<index>/<count>`)
//! are read as the upload `legacy`.
//!
//! Content addressing makes every step idempotent: a chunk read twice, or a
//! module uploaded on two hosts, writes the same bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::BaseRecord;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sha2::{Digest as _, Sha256};

use crate::kafka::Error as KafkaErr;

/// The largest chunk: half of the broker's default message size.
pub const CHUNK_BYTES: usize = 512 * 1024;

/// Where the follower keeps chunks of modules not yet complete, the uploads
/// it saw, and the offset it has read to.
const PARTS_DIR: &str = ".parts";
const UPLOADS_DIR: &str = ".uploads";
const OFFSET_FILE: &str = ".chunks-offset";
/// The upload of keys written before uploads were named.
pub const LEGACY_UPLOAD: &str = "legacy";
/// How often, at most, the follower notes its offset while it reads.
const NOTE_OFFSET_EVERY: Duration = Duration::from_secs(2);

/// What the host knows of its modules' records, for the follower: whether a
/// module record names a digest (such bytes are kept whatever the topic
/// says), and what to do when bytes are dropped (forget their compiled
/// code).
pub trait ModuleIndex: Send + Sync {
    /// Whether a module record (of any tenant, stored or being stored)
    /// names `digest`.
    fn names(&self, digest: &str) -> bool;
    /// `digest`'s bytes were removed from this host.
    fn dropped(&self, digest: &str);
}

/// How many chunks a module of `size` bytes is written in.
pub fn chunk_count(size: u64) -> usize {
    usize::try_from(size).unwrap_or(usize::MAX).div_ceil(CHUNK_BYTES).max(1)
}

/// The key of chunk `index` of `count` of `upload` of `digest`.
fn chunk_key(digest: &str, upload: &str, index: usize, count: usize) -> String {
    match upload {
        LEGACY_UPLOAD => format!("{digest}/{index}/{count}"),
        upload => format!("{digest}/{upload}/{index}/{count}"),
    }
}

/// Writes `bytes` (whose sha256 is `digest`) to `topic` in chunks of
/// `upload`, and returns once every chunk is acknowledged by the broker.
pub fn publish(config: &ClientConfig, topic: &str, digest: &str, upload: &str, bytes: &[u8]) -> Result<(), KafkaErr> {
    let producer = crate::kafka::Delivering::new(config, format!("module {digest}"))?;
    let count = chunk_count(bytes.len() as u64);
    for (index, chunk) in bytes.chunks(CHUNK_BYTES).chain(bytes.is_empty().then_some(&[][..])).enumerate() {
        let key = chunk_key(digest, upload, index, count);
        producer.send(BaseRecord::to(topic).key(&key).payload(chunk))?;
    }
    producer.finish(Duration::from_secs(60))
}

/// Deletes `upload`'s `count` chunks of `digest` from `topic` (tombstones,
/// which compaction then removes with the chunks); returns once the broker
/// has them. Deleting chunks that are gone already is harmless.
pub fn delete(config: &ClientConfig, topic: &str, digest: &str, upload: &str, count: usize) -> Result<(), KafkaErr> {
    let producer = crate::kafka::Delivering::new(config, format!("module {digest}"))?;
    for index in 0..count {
        let key = chunk_key(digest, upload, index, count);
        producer.send(BaseRecord::<String, [u8]>::to(topic).key(&key))?;
    }
    producer.finish(Duration::from_secs(60))
}

/// An upload whose chunks the follower saw (and has not seen deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenUpload {
    /// The module's digest.
    pub digest: String,
    /// The upload ([`LEGACY_UPLOAD`] for keys without one).
    pub upload: String,
    /// Its chunks.
    pub count: usize,
    /// When the follower first saw a chunk of it.
    pub seen: std::time::SystemTime,
}

/// The uploads the follower of `modules_dir` saw and has not seen deleted.
pub fn seen_uploads(modules_dir: &Path) -> Vec<SeenUpload> {
    let mut out = Vec::new();
    for digest in std::fs::read_dir(modules_dir.join(UPLOADS_DIR)).into_iter().flatten().flatten() {
        for marker in std::fs::read_dir(digest.path()).into_iter().flatten().flatten() {
            let count = std::fs::read_to_string(marker.path()).ok().and_then(|c| c.trim().parse().ok());
            let seen = marker.metadata().and_then(|m| m.modified()).ok();
            if let (Some(count), Some(seen)) = (count, seen) {
                out.push(SeenUpload {
                    digest: digest.file_name().to_string_lossy().into_owned(),
                    upload: marker.file_name().to_string_lossy().into_owned(),
                    count,
                    seen,
                });
            }
        }
    }
    out
}

/// Forgets `upload` of `digest` here as a deleted chunk does: its marker
/// and parts, then the bytes if no other upload of them is left and no
/// record names them. Returns whether the bytes were removed.
pub fn forget_upload(modules_dir: &Path, digest: &str, upload: &str, index: &dyn ModuleIndex) -> std::io::Result<bool> {
    remove_dir_if_any(&modules_dir.join(PARTS_DIR).join(format!("{digest}-{upload}")))?;
    let uploads = modules_dir.join(UPLOADS_DIR).join(digest);
    match std::fs::remove_file(uploads.join(upload)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let others = std::fs::read_dir(&uploads).map(|entries| entries.count()).unwrap_or(0);
    if others > 0 {
        return Ok(false);
    }
    remove_dir_if_any(&uploads)?;
    if index.names(digest) {
        return Ok(false);
    }
    match std::fs::remove_file(modules_dir.join(format!("{digest}.wasm"))) {
        Ok(()) => {
            index.dropped(digest);
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn remove_dir_if_any(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Follows `topic` into `modules_dir` until `stop` is set.
pub fn follow(
    config: &ClientConfig,
    topic: &str,
    modules_dir: PathBuf,
    index: Arc<dyn ModuleIndex>,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, KafkaErr> {
    let from = std::fs::read_to_string(modules_dir.join(OFFSET_FILE))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or(0);
    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", "sluice.modules-follower")
        .set("enable.auto.commit", "false")
        .create()
        .map_err(KafkaErr::client("creating the module follower"))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(from))
        .map_err(KafkaErr::client("assigning the modules topic"))?;
    consumer.assign(&tpl).map_err(KafkaErr::client("assigning the modules topic"))?;
    std::thread::Builder::new()
        .name("sluice-modules".into())
        .spawn(move || {
            // The offset read to is noted once the follower has caught up,
            // and at most every NOTE_OFFSET_EVERY while it reads: not one
            // fsync per chunk. Reading a chunk again after a crash is
            // harmless (the same bytes, by content address).
            let mut unnoted: Option<i64> = None;
            let mut noted_at = std::time::Instant::now();
            let note = |next: i64| {
                let path = modules_dir.join(OFFSET_FILE);
                if let Err(e) = crate::fsutil::write_atomically(&path, next.to_string().as_bytes()) {
                    tracing::warn!("noting the modules topic's offset: {e}");
                }
            };
            while !stop.load(Ordering::Relaxed) {
                match consumer.poll(Duration::from_millis(200)) {
                    Some(Ok(message)) => {
                        let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
                        let mut failures = 0;
                        while let Err(e) = take_chunk(&modules_dir, &key, message.payload(), index.as_ref()) {
                            failures += 1;
                            tracing::error!("keeping module chunk {key} (attempt {failures}): {e}");
                            if stop.load(Ordering::Relaxed) {
                                return;
                            }
                            std::thread::sleep(Duration::from_secs(1));
                        }
                        unnoted = Some(message.offset() + 1);
                        if noted_at.elapsed() >= NOTE_OFFSET_EVERY
                            && let Some(next) = unnoted.take()
                        {
                            note(next);
                            noted_at = std::time::Instant::now();
                        }
                    }
                    Some(Err(e)) => tracing::warn!("reading the cluster's modules topic: {e}"),
                    None => {
                        if let Some(next) = unnoted.take() {
                            note(next);
                            noted_at = std::time::Instant::now();
                        }
                    }
                }
            }
            if let Some(next) = unnoted {
                note(next);
            }
        })
        .map_err(|e| KafkaErr::Other(format!("starting the module follower: {e}")))
}

/// A chunk key's parts: digest, upload, index, count. Keys that are not
/// `<sha256 hex>/<upload>/<index>/<count>` (or the legacy
/// `<sha256 hex>/<index>/<count>`) with sane numbers are none.
fn parse_key(key: &str) -> Option<(&str, &str, usize, usize)> {
    let parts: Vec<&str> = key.split('/').collect();
    let (digest, upload, index, count) = match parts.as_slice() {
        [digest, index, count] => (*digest, LEGACY_UPLOAD, *index, *count),
        [digest, upload, index, count] => (*digest, *upload, *index, *count),
        _ => return None,
    };
    let (index, count) = (index.parse::<usize>().ok()?, count.parse::<usize>().ok()?);
    let hex_digest = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    let sane_upload = (1..=32).contains(&upload.len()) && upload.bytes().all(|b| b.is_ascii_alphanumeric());
    (hex_digest && sane_upload && index < count && count <= 1 << 20).then_some((digest, upload, index, count))
}

/// Keeps one chunk (or forgets its upload, for a deleted one); assembles
/// and checks the module once all of an upload's chunks are there.
fn take_chunk(modules_dir: &Path, key: &str, payload: Option<&[u8]>, index: &dyn ModuleIndex) -> std::io::Result<()> {
    let Some((digest, upload, chunk, count)) = parse_key(key) else { return Ok(()) };
    let Some(payload) = payload else {
        if forget_upload(modules_dir, digest, upload, index)? {
            tracing::info!(module = digest, upload, "removed the bytes of a deleted module");
        }
        return Ok(());
    };
    let marker = modules_dir.join(UPLOADS_DIR).join(digest).join(upload);
    if !marker.is_file() {
        crate::fsutil::write_atomically(&marker, count.to_string().as_bytes())?;
    }
    let target = modules_dir.join(format!("{digest}.wasm"));
    let dir = modules_dir.join(PARTS_DIR).join(format!("{digest}-{upload}"));
    if target.is_file() {
        return remove_dir_if_any(&dir);
    }
    crate::fsutil::write_atomically(&dir.join(format!("{chunk}-of-{count}")), payload)?;
    let mut bytes = Vec::new();
    for i in 0..count {
        match std::fs::read(dir.join(format!("{i}-of-{count}"))) {
            Ok(part) => bytes.extend_from_slice(&part),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    if hex::encode(Sha256::digest(&bytes)) != digest {
        // Chunks of two different uploads cannot share a digest; bytes that
        // do not match it are not kept.
        tracing::error!(module = digest, "module chunks do not match their digest; dropped");
    } else {
        crate::fsutil::write_atomically(&target, &bytes)?;
    }
    std::fs::remove_dir_all(&dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which digests records name, and which were dropped.
    #[derive(Default)]
    struct Index {
        named: std::sync::Mutex<Vec<String>>,
        dropped: std::sync::Mutex<Vec<String>>,
    }

    impl ModuleIndex for Index {
        fn names(&self, digest: &str) -> bool {
            self.named.lock().expect("lock").iter().any(|d| d == digest)
        }
        fn dropped(&self, digest: &str) {
            self.dropped.lock().expect("lock").push(digest.to_owned());
        }
    }

    #[test]
    fn chunks_in_any_order_make_the_module_once_all_are_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = Index::default();
        let bytes: Vec<u8> = (0..1000u32).flat_map(|i| i.to_le_bytes()).collect();
        let digest = hex::encode(Sha256::digest(&bytes));
        let chunks: Vec<&[u8]> = bytes.chunks(1500).collect();
        let count = chunks.len();
        for chunk in (0..count).rev() {
            assert!(!dir.path().join(format!("{digest}.wasm")).exists(), "complete before chunk {chunk}");
            let key = chunk_key(&digest, "u1", chunk, count);
            take_chunk(dir.path(), &key, Some(chunks[chunk]), &index).expect("chunk");
        }
        assert_eq!(std::fs::read(dir.path().join(format!("{digest}.wasm"))).expect("module"), bytes);
        assert!(!dir.path().join(PARTS_DIR).join(format!("{digest}-u1")).exists(), "parts left behind");
        let seen = seen_uploads(dir.path());
        assert_eq!(seen.len(), 1);
        assert_eq!((seen[0].digest.as_str(), seen[0].upload.as_str(), seen[0].count), (digest.as_str(), "u1", count));
    }

    #[test]
    fn bytes_that_do_not_match_their_digest_are_not_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = Index::default();
        let digest = hex::encode(Sha256::digest(b"the real bytes"));
        take_chunk(dir.path(), &format!("{digest}/0/1"), Some(b"other bytes"), &index).expect("chunk");
        assert!(!dir.path().join(format!("{digest}.wasm")).exists());
        take_chunk(dir.path(), "../../etc/0/1", Some(b"x"), &index).expect("hostile key skipped");
        take_chunk(dir.path(), &format!("{digest}/../../0/1"), Some(b"x"), &index).expect("hostile upload skipped");
        assert!(!dir.path().join(PARTS_DIR).join("..").join("..").join("0").exists());
    }

    /// The bytes go when the last upload of them is deleted, and not while a
    /// record names them (one of a host before uploads were named, whose
    /// chunks the follower read long ago).
    #[test]
    fn bytes_live_as_long_as_an_upload_of_them_or_a_record_naming_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = Index::default();
        let bytes = b"\0asm module bytes";
        let digest = hex::encode(Sha256::digest(bytes));
        let module = dir.path().join(format!("{digest}.wasm"));
        for upload in ["aaaa", "bbbb"] {
            take_chunk(dir.path(), &chunk_key(&digest, upload, 0, 1), Some(bytes), &index).expect("chunk");
        }
        assert!(module.is_file());
        take_chunk(dir.path(), &chunk_key(&digest, "aaaa", 0, 1), None, &index).expect("tombstone");
        assert!(module.is_file(), "upload bbbb still has it");
        index.named.lock().expect("lock").push(digest.clone());
        take_chunk(dir.path(), &chunk_key(&digest, "bbbb", 0, 1), None, &index).expect("tombstone");
        assert!(module.is_file(), "a record still names it");
        // Once no record names them either (the sweeper forgets again).
        index.named.lock().expect("lock").clear();
        assert!(forget_upload(dir.path(), &digest, "bbbb", &index).expect("forget"), "the bytes go");
        assert!(!module.exists());
        assert_eq!(*index.dropped.lock().expect("lock"), vec![digest.clone()], "their compiled code is forgotten");
        // A legacy key's upload, the same way.
        take_chunk(dir.path(), &format!("{digest}/0/1"), Some(bytes), &index).expect("legacy chunk");
        assert!(module.is_file());
        take_chunk(dir.path(), &format!("{digest}/0/1"), None, &index).expect("legacy tombstone");
        assert!(!module.exists(), "no upload and no record: the bytes are gone");
        assert!(seen_uploads(dir.path()).is_empty());
        assert!(!dir.path().join(UPLOADS_DIR).join(&digest).exists());
    }
}
