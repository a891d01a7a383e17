//! A module's bytes live exactly as long as a module record names them, on
//! every member of a cluster and in its modules topic: a deleted module's
//! files, compiled code and chunks go everywhere, and an upload that is
//! refused (409 of a changed module list, 403, 413, 503) or cut short by a
//! crash leaves nothing on any member.
//!
//! Before: a deleted module stayed on every other member and in the topic
//! for ever, and an upload refused with 409 or 503 was still saved and sent
//! to every member.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use sluice::kafka::tools;

use crate::cluster::{cluster_name, eventually, host};
use crate::guests;
use crate::host::Host;
use crate::support;

/// What of `digest` member data directory `dir` holds: its file, the
/// follower's parts and upload markers, compiled code, upload files.
fn leftovers(dir: &Path, digest: &str) -> Vec<String> {
    let mut found = Vec::new();
    let modules = dir.join("modules");
    for (place, entries) in [
        ("modules", modules.clone()),
        ("parts", modules.join(".parts")),
        ("uploads", modules.join(".uploads")),
        ("cache", dir.join("cache")),
    ] {
        for entry in std::fs::read_dir(&entries).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(digest) || name.starts_with(".upload-") {
                found.push(format!("{place}/{name}"));
            }
        }
    }
    found
}

/// The chunks of `digest` the modules topic still holds: each key's last
/// record, unless a tombstone.
fn live_chunks(brokers: &str, topic: &str, digest: &str) -> Vec<String> {
    let records = tools::read_all(brokers, topic, false, Duration::from_secs(5), |_| false).expect("read the topic");
    let mut last: BTreeMap<String, bool> = BTreeMap::new();
    for record in records {
        let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        if key.starts_with(digest) {
            last.insert(key, record.value.is_some());
        }
    }
    last.into_iter().filter(|(_, live)| *live).map(|(key, _)| key).collect()
}

/// The sha256 of a guest's bytes.
fn digest_of(guest: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(std::fs::read(guests::guest(guest)).expect("guest bytes")))
}

struct Members {
    dirs: Vec<tempfile::TempDir>,
    hosts: Vec<Option<Host>>,
    brokers: String,
    cluster: String,
    topic: String,
}

impl Members {
    fn start(name: &str, env: [&[(&str, &str)]; 3]) -> Members {
        let brokers = support::brokers();
        let cluster = cluster_name(name);
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("temp dir")).collect();
        let hosts = dirs
            .iter()
            .zip(env)
            .map(|(dir, env)| {
                let mut env = env.to_vec();
                env.push(("SLUICE_CLUSTER", &cluster));
                Some(Host::start_with_env(&brokers, dir.path(), &env))
            })
            .collect();
        let topic = sluice::cluster::Topics::of(&cluster).modules;
        Members { dirs, hosts, brokers, cluster, topic }
    }

    /// Waits until no member and not the topic hold anything of `digest`.
    fn nothing_left_of(&self, digest: &str, what: &str) {
        eventually(&format!("{what}: no member holds its bytes"), Duration::from_secs(60), || {
            self.dirs.iter().all(|dir| leftovers(dir.path(), digest).is_empty())
        });
        eventually(&format!("{what}: the modules topic holds none of its chunks"), Duration::from_secs(60), || {
            live_chunks(&self.brokers, &self.topic, digest).is_empty()
        });
    }
}

#[test]
fn a_deleted_module_leaves_nothing_on_any_member_or_in_the_topic() {
    let m = Members::start("gone", [&[], &[], &[]]);
    let tenant = support::tenant_name("gone");
    let token = host(&m.hosts, 0).tenant(&tenant, None);
    let digest = host(&m.hosts, 0).push_guest(&token, "running-count");
    for (i, dir) in m.dirs.iter().enumerate() {
        let file = dir.path().join("modules").join(format!("{digest}.wasm"));
        eventually(&format!("member {i} has the module's bytes"), Duration::from_secs(30), || file.is_file());
    }
    assert!(!live_chunks(&m.brokers, &m.topic, &digest).is_empty(), "the topic holds the module's chunks");
    eventually("member 1 knows the module", Duration::from_secs(10), || {
        host(&m.hosts, 1).get(&format!("/v1/modules/{digest}"), &token).0 == 200
    });
    let (status, body) = host(&m.hosts, 1).request("DELETE", &format!("/v1/modules/{digest}"), Some(&token), None);
    assert_eq!(status, 204, "{body}");
    m.nothing_left_of(&digest, "a deleted module");
    // It can be uploaded again, and is everywhere again.
    assert_eq!(host(&m.hosts, 2).push_guest(&token, "running-count"), digest);
    for (i, dir) in m.dirs.iter().enumerate() {
        let file = dir.path().join("modules").join(format!("{digest}.wasm"));
        eventually(&format!("member {i} has the module again"), Duration::from_secs(30), || file.is_file());
    }
}

#[test]
fn a_refused_or_interrupted_upload_leaves_nothing_on_any_member() {
    let stall = [("SLUICE_FAILPOINT", "upload-before-decide:stall=6s")];
    let fail = [("SLUICE_FAILPOINT", "upload-before-activate:error")];
    let mut m = Members::start("refused", [&stall, &[], &fail]);
    let tenant = support::tenant_name("refused");
    let token = host(&m.hosts, 1).tenant(&tenant, None);
    let push = |member: usize, guest: &str| -> (u16, Value) {
        let bytes = std::fs::read(guests::guest(guest)).expect("guest bytes");
        host(&m.hosts, member).push(&token, guest, &bytes)
    };

    // 409: member 0 stalls between reading the tenant's modules and
    // deciding; meanwhile member 1 stores another module.
    let (refused, stored) = std::thread::scope(|scope| {
        let refused = scope.spawn(|| push(0, "uppercase"));
        eventually("member 0 stalls before it decides", Duration::from_secs(60), || {
            host(&m.hosts, 0).log_text().contains("failpoint `upload-before-decide` hit 1 time(s): stalling")
        });
        let stored = push(1, "filter");
        (refused.join().expect("the stalled upload"), stored)
    });
    assert_eq!(stored.0, 201, "{}", stored.1);
    assert_eq!(refused.0, 409, "{}", refused.1);
    m.nothing_left_of(&digest_of("uppercase"), "an upload refused with 409");

    // 503: member 2 fails after it sent the chunks, before the record
    // lets jobs use the module.
    let (status, body) = push(2, "dedup");
    assert_eq!(status, 503, "{body}");
    assert!(host(&m.hosts, 2).log_text().contains("abandoning an upload"), "member 2 abandoned the upload");
    m.nothing_left_of(&digest_of("dedup"), "an upload refused with 503");
    assert_eq!(host(&m.hosts, 1).get("/v1/modules", &token).1.as_array().map(Vec::len), Some(1), "only `filter`");

    // 403: over the policy's number of modules.
    let policy_tenant = support::tenant_name("few");
    let mut policy = host(&m.hosts, 1).get("/v1/whoami", &token).1["policy"].clone();
    policy["topic-prefixes"] = json!([format!("{policy_tenant}.")]);
    policy["max-modules"] = json!(1);
    let few = host(&m.hosts, 1).tenant(&policy_tenant, Some(policy));
    let bytes = std::fs::read(guests::guest("windowed-count")).expect("guest bytes");
    assert_eq!(host(&m.hosts, 1).push(&few, "w", &bytes).0, 201);
    let (status, body) = host(&m.hosts, 1).push(&few, "c", &std::fs::read(guests::guest("counter-v2")).expect("bytes"));
    assert_eq!(status, 403, "{body}");
    m.nothing_left_of(&digest_of("counter-v2"), "an upload refused with 403");

    // 413: over the host's largest module (8 MiB in the tests).
    let big = vec![7u8; 9 << 20];
    let (status, body) = host(&m.hosts, 1).push(&token, "big", &big);
    assert_eq!(status, 413, "{body}");
    use sha2::Digest as _;
    m.nothing_left_of(&hex::encode(sha2::Sha256::digest(&big)), "an upload refused with 413");

    // A crash after the chunks were sent: the member abandons the upload
    // when it comes back.
    let cluster = m.cluster.clone();
    let crashing = [("SLUICE_CLUSTER", cluster.as_str()), ("SLUICE_FAILPOINT", "upload-before-activate")];
    m.hosts[2].as_mut().expect("member 2").crash_and_restart_with_env(&crashing);
    let bytes = std::fs::read(guests::guest("probe")).expect("guest bytes");
    assert!(host(&m.hosts, 2).request_dies_with(&token, "probe", &bytes), "member 2 answered instead of crashing");
    let probe = digest_of("probe");
    eventually("the crashed upload's chunks reached the topic", Duration::from_secs(30), || {
        !live_chunks(&m.brokers, &m.topic, &probe).is_empty()
    });
    m.hosts[2].as_mut().expect("member 2").crash_and_restart_with_env(&[("SLUICE_CLUSTER", cluster.as_str())]);
    m.nothing_left_of(&probe, "an upload cut short by a crash");
    assert_eq!(host(&m.hosts, 0).get("/v1/modules", &token).1.as_array().map(Vec::len), Some(1), "only `filter`");
}
