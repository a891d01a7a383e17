//! A job's identity outlives its state: the state one incarnation of a job
//! left on a member (one that did not take the reset that cleared it, or
//! that was down while the job was deleted and created again) is never
//! taken for the state of the next incarnation, on the real broker with
//! three `sluice serve --cluster` members.
//!
//! Before incarnations, the first failed the job on every run a few seconds
//! after the resume ("has folded checkpoint N of shard S ... but Kafka's
//! committed checkpoint for it is none"), and where the checkpoint ids
//! happened to line up, counted on from the old state.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use sluice::kafka::tools;

use crate::cluster::{cluster_name, eventually, host, member, placement, settled};
use crate::host::Host;
use crate::support;

/// One task over four shards: its store on the member that runs it holds
/// every shard, so what the member meets is the same on every run (with
/// several tasks, the group would give each member's task shards its old
/// store may not hold).
const TASKS: usize = 1;
const PARTITIONS: i32 = 4;
const KEYS: usize = 40;

/// Three members of a new cluster, a tenant on them with running-count,
/// its input topic (`PARTITIONS` partitions) and `outputs` output topics.
struct Cluster {
    dirs: Vec<tempfile::TempDir>,
    hosts: Vec<Option<Host>>,
    brokers: String,
    tenant: String,
    token: String,
    input: String,
    outputs: Vec<String>,
}

fn three_members(name: &str, outputs: usize) -> Cluster {
    let brokers = support::brokers();
    let cluster = cluster_name(name);
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("temp dir")).collect();
    let hosts: Vec<Option<Host>> = dirs.iter().map(|d| Some(member(&brokers, d.path(), &cluster))).collect();
    settled(&hosts);
    let tenant = support::tenant_name(name);
    let token = host(&hosts, 0).tenant(&tenant, None);
    host(&hosts, 0).push_guest(&token, "running-count");
    let input = format!("{tenant}.in");
    let outputs: Vec<String> = (0..outputs).map(|i| format!("{tenant}.out{i}")).collect();
    let mut topics = vec![(input.as_str(), PARTITIONS)];
    topics.extend(outputs.iter().map(|o| (o.as_str(), PARTITIONS)));
    tools::create_topics(&brokers, &topics).expect("topics");
    Cluster { dirs, hosts, brokers, tenant, token, input, outputs }
}

impl Cluster {
    /// Creates job `j` through `through`, writing to `output`, with
    /// checkpoints every `interval`.
    fn create_job(&self, through: usize, output: &str, interval: &str) {
        let spec = json!({"id": "j", "module": "running-count", "parallelism": TASKS,
            "input": {"topics": [self.input]}, "output": {"topics": [output]},
            "checkpoint": {"interval": interval}});
        let (status, created) = host(&self.hosts, through).post("/v1/jobs", &self.token, spec);
        assert_eq!(status, 201, "{created}");
    }

    /// Whether member `index`'s data directory holds task stores of job `j`.
    fn holds_stores(&self, index: usize) -> bool {
        let dir = self.dirs[index].path().join("state").join(&self.tenant).join("j");
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().ends_with(".redb"))
    }

    /// Stops job `j` through `through` and waits until every live member
    /// shows it stopped.
    fn stop_job(&self, through: usize) {
        let (status, stop) = host(&self.hosts, through).post("/v1/jobs/j/stop", &self.token, json!({}));
        assert_eq!(status, 202, "{stop}");
        let done = host(&self.hosts, through).wait_operation(&self.token, &stop);
        assert_eq!(done["state"], "succeeded", "{done}");
        eventually("the job shows stopped on every live member", Duration::from_secs(60), || {
            self.hosts.iter().flatten().all(|h| h.get("/v1/jobs/j", &self.token).1["state"] == "stopped")
        });
    }

    /// Job `j`'s status as `through` shows it, for failure messages.
    fn status(&self, through: usize) -> Value {
        host(&self.hosts, through).get("/v1/jobs/j", &self.token).1
    }
}

/// Checks running-count output per key against `expected` (the counts each
/// key's outputs must be, in order), naming the job's status on failure.
fn check_counts(outputs: &[tools::ReadRecord], expected: &BTreeMap<String, Vec<u64>>, status: impl Fn() -> Value) {
    let seen = support::counts_per_key(outputs);
    let wrong: Vec<&String> = expected.keys().filter(|key| seen.get(*key) != expected.get(*key)).collect();
    if let Some(&key) = wrong.first() {
        panic!(
            "{} of {} keys' counts are wrong; key {key}: got {:?}\nexpected {:?}\njob: {:#}",
            wrong.len(),
            expected.len(),
            seen.get(key),
            expected[key],
            status()
        );
    }
    let total: usize = expected.values().map(Vec::len).sum();
    assert_eq!(outputs.len(), total, "committed outputs");
}

/// A reset with the state cleared, through a member that runs few of the
/// job's tasks (the other members hold the stores of the rest), then a
/// resume: every member starts the job from empty state, so each key counts
/// from 1 again over the whole input, after its counts from before.
#[test]
fn a_reset_clearing_the_state_through_one_member_clears_it_on_every_member() {
    let c = three_members("reset", 1);
    let output = &c.outputs[0];
    c.create_job(0, output, "200ms");
    let before = support::produce_keyed(&c.brokers, &c.input, 0..2_000, KEYS);
    support::read_committed(&c.brokers, output, 2_000, Duration::from_secs(120));
    let placed = placement(&c.hosts, &c.token, "j", TASKS, Duration::from_secs(60));
    eprintln!("identity: job j's tasks run on members {placed:?}");
    // The member that runs the fewest tasks takes the calls.
    let caller = (0..3).min_by_key(|m| placed.iter().filter(|&p| p == m).count()).expect("a member");
    let holders: Vec<usize> = (0..3).filter(|&m| m != caller && c.holds_stores(m)).collect();
    assert!(!holders.is_empty(), "no other member holds the job's stores: {placed:?}");

    c.stop_job(caller);
    let (status, reset) =
        host(&c.hosts, caller).post("/v1/jobs/j/reset", &c.token, json!({"to": "earliest", "state": "clear"}));
    assert_eq!(status, 200, "{reset}");
    let (status, resumed) = host(&c.hosts, caller).post("/v1/jobs/j/resume", &c.token, json!({}));
    assert_eq!(status, 200, "{resumed}");
    let after = support::produce_keyed(&c.brokers, &c.input, 2_000..3_000, KEYS);

    // Per key: 1..=b before the reset, then 1..=b+a over the whole input.
    let mut all = before.clone();
    support::add_counts(&mut all, after);
    let expected: BTreeMap<String, Vec<u64>> =
        all.iter().map(|(key, &n)| (key.clone(), (1..=before[key]).chain(1..=n).collect())).collect();
    let total = expected.values().map(Vec::len).sum();
    let committed = support::read_committed(&c.brokers, output, total, Duration::from_secs(180));
    check_counts(&committed, &expected, || c.status(caller));
    host(&c.hosts, caller).wait_job(&c.token, "j", Duration::from_secs(60), |job| job["state"] == "running");
}

/// A job deleted and created again (same id, another output) while the
/// member that ran it was down (kill -9): once it is back and runs the job
/// again (the others leave), the store it kept of the deleted job is not
/// the new job's, and each key counts from 1. The first job checkpoints
/// every 100 ms and the second every second, so the old store is ahead of
/// what the new job committed when the member meets it (with ids that
/// happened to line up, the member would count on from the old state).
#[test]
fn a_job_deleted_and_created_again_while_a_member_was_down_starts_afresh_there() {
    let mut c = three_members("recreate", 2);
    c.create_job(0, &c.outputs[0], "100ms");
    let mut inputs = support::produce_keyed(&c.brokers, &c.input, 0..2_000, KEYS);
    support::read_committed(&c.brokers, &c.outputs[0], 2_000, Duration::from_secs(120));
    let placed = placement(&c.hosts, &c.token, "j", TASKS, Duration::from_secs(60));
    let victim = placed[0];
    assert!(c.holds_stores(victim), "member {victim} runs the job but holds no store");
    eprintln!("identity: job j runs on member {victim}; killing it");
    let mut dead = c.hosts[victim].take().expect("the victim");
    dead.kill9();

    // The others take its tasks; the job is stopped, deleted and created
    // again through them.
    placement(&c.hosts, &c.token, "j", TASKS, Duration::from_secs(90));
    let other = (0..3).find(|&m| m != victim).expect("another member");
    c.stop_job(other);
    eventually("the job is deleted", Duration::from_secs(90), || {
        host(&c.hosts, other).request("DELETE", "/v1/jobs/j", Some(&c.token), None).0 == 204
    });
    c.create_job(other, &c.outputs[1], "1s");
    support::add_counts(&mut inputs, support::produce_keyed(&c.brokers, &c.input, 2_000..3_000, KEYS));

    // The victim comes back, and the others leave: it runs every task.
    dead.restart();
    c.hosts[victim] = Some(dead);
    for member in (0..3).filter(|&m| m != victim) {
        c.hosts[member].take().expect("a live member").terminate(Duration::from_secs(60));
    }
    support::add_counts(&mut inputs, support::produce_keyed(&c.brokers, &c.input, 3_000..4_000, KEYS));
    let expected: BTreeMap<String, Vec<u64>> =
        inputs.iter().map(|(key, &n)| (key.clone(), (1..=n).collect())).collect();
    let committed = support::read_committed(&c.brokers, &c.outputs[1], 4_000, Duration::from_secs(180));
    check_counts(&committed, &expected, || c.status(victim));
    assert_eq!(
        placement(&c.hosts, &c.token, "j", TASKS, Duration::from_secs(60)),
        vec![victim; TASKS],
        "the member that came back runs every task"
    );
}
