//! Module bytes in a cluster: the host that takes an upload writes the
//! bytes to the compacted modules topic in chunks below the broker's
//! message size (key `<digest>/<index>/<count>`) before the module's record
//! is decided; every host follows the topic and keeps each complete module,
//! checked against its digest, as `<digest>.wasm` beside its own uploads.
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

/// Where the follower keeps chunks of modules not yet complete, and the
/// offset it has read to.
const PARTS_DIR: &str = ".parts";
const OFFSET_FILE: &str = ".chunks-offset";
/// How often, at most, the follower notes its offset while it reads.
const NOTE_OFFSET_EVERY: Duration = Duration::from_secs(2);

/// Writes `bytes` (whose sha256 is `digest`) to `topic` in chunks, and
/// returns once every chunk is acknowledged by the broker.
pub fn publish(config: &ClientConfig, topic: &str, digest: &str, bytes: &[u8]) -> Result<(), KafkaErr> {
    let producer = crate::kafka::Delivering::new(config, format!("module {digest}"))?;
    let count = bytes.len().div_ceil(CHUNK_BYTES).max(1);
    for (index, chunk) in bytes.chunks(CHUNK_BYTES).chain(bytes.is_empty().then_some(&[][..])).enumerate() {
        let key = format!("{digest}/{index}/{count}");
        producer.send(BaseRecord::to(topic).key(&key).payload(chunk))?;
    }
    producer.finish(Duration::from_secs(60))
}

/// Follows `topic` into `modules_dir` until `stop` is set.
pub fn follow(
    config: &ClientConfig,
    topic: &str,
    modules_dir: PathBuf,
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
                        while let Err(e) = take_chunk(&modules_dir, &key, message.payload()) {
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

/// Keeps one chunk; assembles and checks the module once all are there.
/// Keys that are not `<sha256 hex>/<index>/<count>` are skipped.
fn take_chunk(modules_dir: &Path, key: &str, payload: Option<&[u8]>) -> std::io::Result<()> {
    let mut parts = key.split('/');
    let (Some(digest), Some(index), Some(count), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Ok(());
    };
    let (Ok(index), Ok(count)) = (index.parse::<usize>(), count.parse::<usize>()) else { return Ok(()) };
    let hex_digest = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    if !hex_digest || index >= count || count > 1 << 20 {
        return Ok(());
    }
    let target = modules_dir.join(format!("{digest}.wasm"));
    let Some(payload) = payload else { return Ok(()) };
    if target.is_file() {
        return Ok(());
    }
    let dir = modules_dir.join(PARTS_DIR).join(digest);
    crate::fsutil::write_atomically(&dir.join(format!("{index}-of-{count}")), payload)?;
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

    #[test]
    fn chunks_in_any_order_make_the_module_once_all_are_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes: Vec<u8> = (0..1000u32).flat_map(|i| i.to_le_bytes()).collect();
        let digest = hex::encode(Sha256::digest(&bytes));
        let chunks: Vec<&[u8]> = bytes.chunks(1500).collect();
        let count = chunks.len();
        for index in (0..count).rev() {
            assert!(!dir.path().join(format!("{digest}.wasm")).exists(), "complete before chunk {index}");
            take_chunk(dir.path(), &format!("{digest}/{index}/{count}"), Some(chunks[index])).expect("chunk");
        }
        assert_eq!(std::fs::read(dir.path().join(format!("{digest}.wasm"))).expect("module"), bytes);
        assert!(!dir.path().join(PARTS_DIR).join(&digest).exists(), "parts left behind");
    }

    #[test]
    fn bytes_that_do_not_match_their_digest_are_not_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let digest = hex::encode(Sha256::digest(b"the real bytes"));
        take_chunk(dir.path(), &format!("{digest}/0/1"), Some(b"other bytes")).expect("chunk");
        assert!(!dir.path().join(format!("{digest}.wasm")).exists());
        take_chunk(dir.path(), "../../etc/0/1", Some(b"x")).expect("hostile key skipped");
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1, "only the emptied parts dir");
    }
}
