//! A cluster of hosts (issue 13, item 7): what one job gets from 1, 2 and
//! 3 hosts on this machine, how long its tasks are gone after kill -9 of a
//! host, and how long a host joining a cluster with many jobs takes to
//! catch up. Not a test: figures to report.
//!
//! `cargo bench -p sluice --bench cluster [-- --records N] [--hosts 1,2,3]
//! [--jobs J] [--idle-jobs I] [--idle-tasks T] [--sleep-after D] [--only throughput,idle,failover,catch-up]` (defaults: 400,000
//! records, 1,2,3 hosts, 500 jobs, every part). Every
//! host is a `sluice serve --cluster` child process on loopback with its own
//! port and data directory, on the broker `SLUICE_BENCH_BROKERS` (else one
//! started with scripts/kafka.sh on port 19292).
//!
//! - **Throughput**: running-count with 4 tasks over a backlog on 4
//!   partitions; records/s from the first to the last committed output a
//!   read_committed reader sees; CPU is every host's user+system time over
//!   the same span (the broker's and the reader's are not counted). On a
//!   2-core machine more hosts add no cores: the figure says what spreading
//!   costs, not what it gains on more machines.
//! - **Failover**: 3 hosts, input paced at 2,000 records/s over 4
//!   partitions (each record's key names its input partition); kill -9 of
//!   the host holding the most shards (its tasks' shards, as the job's
//!   group assigned them); per input partition it held, the gap between
//!   the last output seen before the kill and the first after, as the
//!   reader saw them.
//! - **Idle**: `--idle-jobs` (100) idle jobs of `--idle-tasks` (1) tasks,
//!   each task over a partition of its own, on 1 and on 3 hosts, asleep
//!   (`--sleep-after`, default the jobs' own; the figures are taken once
//!   every task sleeps) or awake (`--sleep-after off`): every host's CPU
//!   over 20 s, and their threads. An idle one-task job's task runs on one
//!   host, so the total should not grow with the hosts beyond each host's
//!   own fixed cost.
//! - **Catch-up**: 3 hosts hold `--jobs` jobs (created, then stopped); a
//!   fourth host starts; the time from its spawn to its `/healthz`
//!   answering (it serves only once it has applied the cluster's metadata).

#![allow(missing_docs, unreachable_pub)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::{Value, json};
use sluice::kafka::tools;

const ADMIN: &str = "cluster-bench-admin-token-0123456789";
const TASKS: usize = 4;

struct Member {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Member {
    fn start(brokers: &str, cluster: &str, dir: &Path) -> Member {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        std::fs::create_dir_all(dir).expect("data dir");
        let log = std::fs::File::create(dir.join("serve.log")).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--cluster", cluster, "--brokers", brokers, "--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .env("SLUICE_ADMIN_TOKEN", ADMIN)
            .env("SLUICE_CACHE_DIR", support::workspace_root().join("target").join("bench-cache"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn sluice serve");
        Member { child, url: format!("http://127.0.0.1:{port}"), dir: dir.to_owned() }
    }

    /// Waits for `/healthz`; the time it took from `since`.
    fn ready(&mut self, since: Instant) -> Duration {
        loop {
            if ureq::get(format!("{}/healthz", self.url)).call().is_ok_and(|r| r.status() == 200) {
                return since.elapsed();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "a host exited with {status}: {}",
                    std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
                );
            }
            assert!(since.elapsed() < Duration::from_secs(300), "a host did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn host_id(&self) -> String {
        let identity: Value =
            serde_json::from_slice(&std::fs::read(self.dir.join("data").join("host.json")).expect("host.json"))
                .expect("identity");
        identity["host"].as_str().unwrap_or_default().to_owned()
    }

    fn cpu(&self) -> Duration {
        support::process_cpu(&self.child.id().to_string()).unwrap_or_default()
    }

    fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        let url = format!("{}{path}", self.url);
        let auth = format!("Bearer {token}");
        let response = match method {
            "GET" => agent.get(&url).header("Authorization", &auth).call(),
            "POST" => agent.post(&url).header("Authorization", &auth).send_json(body.unwrap_or(json!({}))),
            "PUT" => agent.put(&url).header("Authorization", &auth).send_json(body.unwrap_or(json!({}))),
            _ => unreachable!("{method}"),
        };
        let mut response = response.expect("a request");
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn push(&self, token: &str, bytes: &[u8]) {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let response = agent
            .post(format!("{}/v1/modules", self.url))
            .query("name", "running-count")
            .header("Authorization", &format!("Bearer {token}"))
            .header("Content-Type", "application/wasm")
            .send(bytes)
            .expect("upload");
        assert_eq!(response.status().as_u16(), 201, "upload");
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `n` members of a new cluster and waits until all serve.
fn cluster(brokers: &str, name: &str, root: &Path, n: usize) -> Vec<Member> {
    let started = Instant::now();
    let mut members: Vec<Member> =
        (0..n).map(|i| Member::start(brokers, name, &root.join(format!("host-{i}")))).collect();
    for member in &mut members {
        member.ready(started);
    }
    members
}

/// A tenant with running-count uploaded; its token.
fn tenant(members: &[Member], name: &str) -> String {
    let (status, created) = members[0].call("POST", "/v1/tenants", ADMIN, Some(json!({"name": name})));
    assert_eq!(status, 201, "{created}");
    let token = created["token"].as_str().expect("token").to_owned();
    members[0].push(&token, &std::fs::read(support::guest("running-count")).expect("guest"));
    token
}

/// [`tenant`], allowed `jobs` jobs of `tasks_each` tasks.
fn tenant_for_jobs(members: &[Member], name: &str, jobs: usize, tasks_each: usize) -> String {
    let token = tenant(members, name);
    let (_, whoami) = members[0].call("GET", "/v1/whoami", &token, None);
    let mut policy = whoami["policy"].clone();
    policy["max-jobs"] = json!(jobs);
    policy["max-tasks"] = json!(jobs * tasks_each);
    let (status, body) = members[0].call("PUT", &format!("/v1/tenants/{name}/policy"), ADMIN, Some(policy));
    assert_eq!(status, 200, "{body}");
    token
}

fn create_job(member: &Member, token: &str, id: &str, input: &str, output: &str, tasks: usize) {
    create_job_sleeping_after(member, token, id, input, output, tasks, None);
}

/// [`create_job`] with `input.sleep-after` set to `sleep_after` (none: the
/// jobs' default).
fn create_job_sleeping_after(
    member: &Member,
    token: &str,
    id: &str,
    input: &str,
    output: &str,
    tasks: usize,
    sleep_after: Option<&str>,
) {
    let mut spec = json!({"id": id, "module": "running-count", "parallelism": tasks, "input": {"topics": [input]},
        "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
    if let Some(sleep_after) = sleep_after {
        spec["input"]["sleep-after"] = json!(sleep_after);
    }
    // Creates through several members in a row: one that has not yet
    // applied the create another member just wrote refuses with 409 "try
    // again", as a client is told to.
    for _ in 0..50 {
        let (status, body) = member.call("POST", "/v1/jobs", token, Some(spec.clone()));
        let retry = status == 409 && body["error"].as_str().is_some_and(|e| e.ends_with("try again"));
        if !retry {
            assert_eq!(status, 201, "{body}");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("creating job {id}: 409 \"try again\" for 5 s");
}

/// Produces `range` to `topic`, record i to partition i mod 4, keyed
/// `p<partition>-k<i mod keys>`.
fn produce(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    range: std::ops::Range<usize>,
    keys: usize,
) {
    let value = "x".repeat(100);
    for i in range {
        let partition = (i % TASKS) as i32;
        let key = format!("p{partition}-k{}", i % keys);
        let mut record = BaseRecord::to(topic).partition(partition).key(&key).payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, r)) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
}

/// A read_committed reader of `topic` in its own thread: for each record
/// it sees, the time and the input partition its key names.
struct Reader {
    seen: Arc<Mutex<Vec<(Instant, i32)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    fn start(brokers: &str, topic: &str) -> Reader {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", format!("cluster-bench-reader-{}", support::run_id()))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "10")
            .create()
            .expect("reader");
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..TASKS as i32 {
            tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning).expect("partition");
        }
        consumer.assign(&tpl).expect("assign");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (into, halt) = (Arc::clone(&seen), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                if let Some(Ok(message)) = consumer.poll(Duration::from_millis(50)) {
                    let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
                    let partition =
                        key.strip_prefix('p').and_then(|k| k.split('-').next()).and_then(|p| p.parse().ok());
                    if let Some(partition) = partition {
                        into.lock().expect("reader lock").push((Instant::now(), partition));
                    }
                }
            }
        });
        Reader { seen, stop, thread: Some(thread) }
    }

    fn count(&self) -> usize {
        self.seen.lock().expect("reader lock").len()
    }

    fn wait_for(&self, n: usize, timeout: Duration) {
        let started = Instant::now();
        while self.count() < n {
            assert!(started.elapsed() < timeout, "only {} of {n} outputs within {timeout:?}", self.count());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn seen(&self) -> Vec<(Instant, i32)> {
        self.seen.lock().expect("reader lock").clone()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn producer(brokers: &str) -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer")
}

/// One job of 4 tasks over a backlog of `records` on `n` hosts.
fn throughput(brokers: &str, root: &Path, n: usize, records: usize) -> (f64, f64) {
    let run = format!("t{n}{}", support::run_id().replace(['-', '_'], ""));
    let run = &run[..run.len().min(20)];
    let members = cluster(brokers, run, &root.join(format!("throughput-{n}")), n);
    let token = tenant(&members, run);
    let (input, output) = (format!("{run}.in"), format!("{run}.out"));
    tools::create_topics(brokers, &[(&input, TASKS as i32), (&output, TASKS as i32)]).expect("topics");
    let producer = producer(brokers);
    produce(&producer, &input, 0..records, 10_000);
    producer.flush(Duration::from_secs(120)).expect("flush");
    let reader = Reader::start(brokers, &output);
    let cpu_before: Duration = members.iter().map(Member::cpu).sum();
    create_job(&members[0], &token, "j", &input, &output, TASKS);
    reader.wait_for(records, Duration::from_secs(600));
    let cpu: Duration = members.iter().map(Member::cpu).sum::<Duration>() - cpu_before;
    let seen = reader.seen();
    let (first, last) = (seen.first().map(|s| s.0), seen.last().map(|s| s.0));
    let span = match (first, last) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64().max(0.001),
        _ => 0.001,
    };
    (records as f64 / span, records as f64 / cpu.as_secs_f64().max(0.001))
}

/// Per input partition of the killed host, the gap around the kill.
fn failover(brokers: &str, root: &Path) -> (Vec<(i32, f64)>, usize) {
    let run = format!("f{}", support::run_id().replace(['-', '_'], ""));
    let run = &run[..run.len().min(20)];
    let mut members = cluster(brokers, run, &root.join("failover"), 3);
    let token = tenant(&members, run);
    let (input, output) = (format!("{run}.in"), format!("{run}.out"));
    tools::create_topics(brokers, &[(&input, TASKS as i32), (&output, TASKS as i32)]).expect("topics");
    let reader = Reader::start(brokers, &output);
    create_job(&members[0], &token, "j", &input, &output, TASKS);
    let producer = Arc::new(producer(brokers));
    let pacing = Arc::new(AtomicBool::new(true));
    let paced = {
        let (producer, pacing, input) = (Arc::clone(&producer), Arc::clone(&pacing), input.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while pacing.load(Ordering::Relaxed) {
                produce(&producer, &input, i..i + 100, 1_000);
                i += 100;
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(10));
    // The host with the most shards, by its own status: its tasks' shards
    // are the partitions the job's group gave them.
    let mut runs: BTreeMap<usize, Vec<i32>> = BTreeMap::new();
    for (index, member) in members.iter().enumerate() {
        let me = json!(member.host_id());
        let (_, job) = member.call("GET", "/v1/jobs/j", &token, None);
        for task in job["tasks"].as_array().into_iter().flatten().filter(|task| task["host"] == me) {
            let shards = task["shards"].as_array().into_iter().flatten().filter_map(Value::as_i64);
            runs.entry(index).or_default().extend(shards.map(|shard| shard as i32));
        }
    }
    let (&victim, partitions) = runs.iter().max_by_key(|(_, shards)| shards.len()).expect("some host runs shards");
    let partitions = partitions.clone();
    let killed_at = Instant::now();
    let _ = members[victim].child.kill();
    let _ = members[victim].child.wait();
    std::thread::sleep(Duration::from_secs(20));
    pacing.store(false, Ordering::Relaxed);
    let _ = paced.join();
    let seen = reader.seen();
    let gaps = partitions
        .iter()
        .map(|&p| {
            let before = seen.iter().filter(|(t, q)| *q == p && *t <= killed_at).map(|(t, _)| *t).max();
            let after = seen.iter().filter(|(t, q)| *q == p && *t > killed_at).map(|(t, _)| *t).min();
            let gap = match (before, after) {
                (Some(b), Some(a)) => a.duration_since(b).as_secs_f64(),
                _ => f64::NAN,
            };
            (p, gap)
        })
        .collect();
    drop(members);
    (gaps, partitions.len())
}

/// `jobs` idle jobs of `tasks` tasks (over as many partitions) on a
/// cluster of `n` hosts, with `input.sleep-after` at `sleep_after` (none:
/// the jobs' default): every host's CPU over 20 s once all run (and,
/// unless `sleep_after` is `off`, all sleep), in % of one core, and their
/// threads.
fn idle(brokers: &str, root: &Path, n: usize, jobs: usize, tasks: usize, sleep_after: Option<&str>) -> (f64, u64) {
    let run = format!("i{n}{}", support::run_id());
    let run = &run[..run.len().min(20)];
    let members = cluster(brokers, run, &root.join(format!("idle-{n}")), n);
    let token = tenant_for_jobs(&members, run, jobs, tasks);
    let (input, output) = (format!("{run}.in"), format!("{run}.out"));
    let partitions = i32::try_from(tasks).expect("a count of tasks");
    tools::create_topics(brokers, &[(&input, partitions), (&output, partitions)]).expect("topics");
    for job in 0..jobs {
        create_job_sleeping_after(&members[job % n], &token, &format!("j{job}"), &input, &output, tasks, sleep_after);
    }
    let started = Instant::now();
    let awake = sleep_after == Some("off");
    let settled = |job: &serde_json::Value| {
        let asleep =
            job["tasks"].as_array().is_some_and(|t| !t.is_empty() && t.iter().all(|t| t["phase"] == "sleeping"));
        job["state"] == "running" && (awake || asleep)
    };
    loop {
        let (_, listed) = members[0].call("GET", "/v1/jobs", &token, None);
        let count = listed.as_array().into_iter().flatten().filter(|j| settled(j)).count();
        if count == jobs {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            let what = if awake { "running" } else { "asleep" };
            // What the stragglers show, and what their hosts logged of them.
            for job in listed.as_array().into_iter().flatten().filter(|j| !settled(j)) {
                let id = job["id"].as_str().unwrap_or_default();
                eprintln!("not {what}: {id}: {}", job["tasks"]);
                let task = format!("{run}.{id}/");
                for member in &members {
                    let log = std::fs::read_to_string(member.dir.join("serve.log")).unwrap_or_default();
                    log.lines().filter(|l| l.contains(&task)).for_each(|l| eprintln!("  {}: {l}", member.url));
                }
            }
            panic!("{count} of {jobs} idle jobs {what}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // Settled: the first checkpoints and compiles are behind.
    std::thread::sleep(Duration::from_secs(5));
    let before: Duration = members.iter().map(Member::cpu).sum();
    let window = Duration::from_secs(20);
    std::thread::sleep(window);
    let cpu = members.iter().map(Member::cpu).sum::<Duration>() - before;
    let threads = members.iter().map(|m| support::proc_status(&m.child.id().to_string(), "Threads")).sum();
    (100.0 * cpu.as_secs_f64() / window.as_secs_f64(), threads)
}

/// A fourth host's time to serve in a cluster holding `jobs` jobs.
fn catch_up(brokers: &str, root: &Path, jobs: usize) -> f64 {
    let run = format!("c{}", support::run_id().replace(['-', '_'], ""));
    let run = &run[..run.len().min(20)];
    let members = cluster(brokers, run, &root.join("catch-up"), 3);
    let token = tenant_for_jobs(&members, run, jobs, 1);
    let (input, output) = (format!("{run}.in"), format!("{run}.out"));
    tools::create_topics(brokers, &[(&input, 1), (&output, 1)]).expect("topics");
    let created_at = Instant::now();
    for job in 0..jobs {
        let member = &members[job % members.len()];
        create_job(member, &token, &format!("j{job}"), &input, &output, 1);
        let (status, body) = member.call("POST", &format!("/v1/jobs/j{job}/stop"), &token, None);
        assert_eq!(status, 202, "{body}");
    }
    eprintln!("cluster: {jobs} jobs created and stopped in {:.1} s", created_at.elapsed().as_secs_f64());
    let started = Instant::now();
    let mut joining = Member::start(brokers, run, &root.join("catch-up").join("host-3"));
    let took = joining.ready(started).as_secs_f64();
    let (status, listed) = joining.call("GET", "/v1/jobs", &token, None);
    assert_eq!(status, 200);
    assert_eq!(listed.as_array().map(Vec::len), Some(jobs), "the new host serves every job at once");
    took
}

fn main() {
    let records = support::records_arg(400_000);
    let hosts: Vec<usize> = support::arg_value("--hosts")
        .map(|v| v.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 3]);
    let jobs: usize = support::arg_value("--jobs").and_then(|v| v.parse().ok()).unwrap_or(500);
    let parts = support::arg_value("--only").unwrap_or_else(|| "throughput,idle,failover,catch-up".into());
    let part = |name: &str| parts.split(',').any(|p| p == name);
    let brokers = support::bench_brokers();
    let root = tempfile::tempdir().expect("temp dir");
    if part("throughput") {
        println!("| hosts | records/s | vs 1 host | records per CPU-second | vs 1 host |");
        println!("|---:|---:|---:|---:|---:|");
        let mut one = None;
        for &n in &hosts {
            let (rate, per_cpu) = throughput(&brokers, root.path(), n, records);
            let (base_rate, base_cpu) = *one.get_or_insert((rate, per_cpu));
            println!("| {n} | {rate:.0} | {:.2}x | {per_cpu:.0} | {:.2}x |", rate / base_rate, per_cpu / base_cpu);
        }
        println!();
    }
    if part("idle") {
        let idle_jobs: usize = support::arg_value("--idle-jobs").and_then(|v| v.parse().ok()).unwrap_or(100);
        let tasks: usize = support::arg_value("--idle-tasks").and_then(|v| v.parse().ok()).unwrap_or(1);
        let sleep_after = support::arg_value("--sleep-after");
        let state = match sleep_after.as_deref() {
            Some("off") => "awake".to_owned(),
            Some(after) => format!("asleep (sleep-after {after})"),
            None => "asleep (the jobs' default sleep-after)".to_owned(),
        };
        let of = if tasks == 1 { String::new() } else { format!(" of {tasks} tasks") };
        println!(
            "| hosts | {idle_jobs} idle jobs{of}, {state}: CPU, % of one core (all hosts) | threads (all hosts) |"
        );
        println!("|---:|---:|---:|");
        for &n in support::arg_value("--hosts").map_or(&[1, 3][..], |_| &hosts[..]) {
            let (cpu, threads) = idle(&brokers, root.path(), n, idle_jobs, tasks, sleep_after.as_deref());
            println!("| {n} | {cpu:.1} | {threads} |");
        }
        println!();
    }
    if part("failover") {
        let (gaps, shards) = failover(&brokers, root.path());
        for (partition, gap) in &gaps {
            println!(
                "failover: kill -9 of the host holding {shards} of {TASKS} shards; partition {partition}: {gap:.2} s without output"
            );
        }
    }
    if part("catch-up") {
        let took = catch_up(&brokers, root.path(), jobs);
        println!("catch-up: a host joining a cluster with {jobs} jobs serves after {took:.2} s");
    }
}
