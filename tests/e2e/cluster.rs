//! Several `sluice serve` processes as one cluster (`--cluster NAME`) on the
//! real broker, each with its own port and data directory: metadata written
//! through one host is served by every host, conflicting writes on two
//! hosts are decided once, a host that was down catches up before it
//! serves, and a host with the wrong admin token or another cluster's name
//! does not join.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use sluice::kafka::tools;

use crate::guests;
use crate::host::{ADMIN, Host};
use crate::support;

/// A cluster name unique to this run.
pub(crate) fn cluster_name(prefix: &str) -> String {
    support::tenant_name(prefix)
}

pub(crate) fn member(brokers: &str, dir: &std::path::Path, cluster: &str) -> Host {
    Host::start_with_env(brokers, dir, &[("SLUICE_CLUSTER", cluster)])
}

/// Polls `check` until it holds, or panics with `what` after `timeout`.
pub(crate) fn eventually(what: &str, timeout: Duration, check: impl Fn() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn metadata_written_through_one_host_is_served_by_every_host() {
    let brokers = support::brokers();
    let cluster = cluster_name("meta");
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("temp dir")).collect();
    let one = member(&brokers, dirs[0].path(), &cluster);
    let two = member(&brokers, dirs[1].path(), &cluster);
    let mut three = member(&brokers, dirs[2].path(), &cluster);

    // What one host has answered for, the others serve at once: a host
    // that finds no such record catches up with the cluster's log before
    // it says so (a client behind a load balancer writes through one host
    // and reads through the next). A tenant created through host 1 signs
    // in at host 3 at once.
    let tenant = support::tenant_name("acme");
    let token = one.tenant(&tenant, None);
    let (status, whoami) = three.get("/v1/whoami", &token);
    assert_eq!(status, 200, "host 3 refused the token host 1 had just answered with: {whoami}");
    assert_eq!(whoami["name"], json!(tenant), "{whoami}");
    for round in 0..5 {
        let token = one.tenant(&support::tenant_name(&format!("at-once{round}")), None);
        let (status, whoami) = three.get("/v1/whoami", &token);
        assert_eq!(status, 200, "round {round}: host 3 refused a token host 1 had just answered with: {whoami}");
    }

    // A module uploaded through host 2: served by host 1 at once, and its
    // bytes, checked against the digest, in host 3's data directory.
    let digest = two.push_guest(&token, "running-count");
    let (status, module) = one.get(&format!("/v1/modules/{digest}"), &token);
    assert_eq!(status, 200, "host 1 does not know the module host 2 had just answered for: {module}");
    eventually("host 1 lists the module", Duration::from_secs(10), || {
        one.get("/v1/modules", &token).1.to_string().contains(&digest)
    });
    let module_file = dirs[2].path().join("modules").join(format!("{digest}.wasm"));
    eventually("host 3 has the module's bytes", Duration::from_secs(30), || module_file.is_file());
    let bytes = std::fs::read(guests::guest("running-count")).expect("guest bytes");
    assert_eq!(std::fs::read(&module_file).expect("module file"), bytes);

    // The same tenant created through two hosts at once: decided once, by
    // the order of the cluster's log; the other call gets 409.
    for round in 0..3 {
        let name = support::tenant_name(&format!("race{round}"));
        let (first, second) = std::thread::scope(|scope| {
            let a = scope.spawn(|| one.post("/v1/tenants", ADMIN, json!({ "name": name })));
            let b = scope.spawn(|| three.post("/v1/tenants", ADMIN, json!({ "name": name })));
            (a.join().expect("host 1 call"), b.join().expect("host 3 call"))
        });
        let mut statuses = [first.0, second.0];
        statuses.sort_unstable();
        assert_eq!(statuses, [201, 409], "round {round}: {first:?} {second:?}");
        // The winner's token is the one every host accepts.
        let winner = if first.0 == 201 { &first.1 } else { &second.1 };
        let won = winner["token"].as_str().expect("token").to_owned();
        for host in [&one, &two, &three] {
            eventually("every host accepts the winner's token", Duration::from_secs(10), || {
                host.get("/v1/whoami", &won).0 == 200
            });
        }
    }

    // A policy set through host 3 is what host 2 shows; a rotated token
    // stops working on every host.
    let mut policy = three.get("/v1/whoami", &token).1["policy"].clone();
    policy["max-jobs"] = json!(3);
    let (status, body) = three.request("PUT", &format!("/v1/tenants/{tenant}/policy"), Some(ADMIN), Some(policy));
    assert_eq!(status, 200, "{body}");
    eventually("host 2 shows the new policy", Duration::from_secs(10), || {
        two.get("/v1/whoami", &token).1["policy"]["max-jobs"] == json!(3)
    });
    let (status, rotated) = one.post(&format!("/v1/tenants/{tenant}/token"), ADMIN, json!({}));
    assert_eq!(status, 200, "{rotated}");
    let new_token = rotated["token"].as_str().expect("token").to_owned();
    for host in [&one, &two, &three] {
        eventually("the old token is refused everywhere", Duration::from_secs(10), || {
            host.get("/v1/whoami", &token).0 == 401 && host.get("/v1/whoami", &new_token).0 == 200
        });
    }

    // A host that was down catches up before it serves: its first answer
    // already knows what was written meanwhile.
    three.kill9();
    let late = support::tenant_name("late");
    let late_token = two.tenant(&late, None);
    three.crash_and_restart();
    assert_eq!(three.get("/v1/whoami", &late_token).0, 200, "host 3 served before it caught up");

    // Writes go on while any host is down: host 1 stops, host 2 or 3 decides.
    drop(one);
    let after = support::tenant_name("after");
    let after_token = three.tenant(&after, None);
    eventually("host 2 knows a tenant created after host 1 stopped", Duration::from_secs(10), || {
        two.get("/v1/whoami", &after_token).0 == 200
    });

    // Another cluster on the same broker shares nothing.
    let other_dir = tempfile::tempdir().expect("temp dir");
    let other = member(&brokers, other_dir.path(), &cluster_name("other"));
    assert_eq!(other.get("/v1/whoami", &new_token).0, 401, "another cluster knows this cluster's tenant");
}

#[test]
fn a_host_with_another_admin_token_does_not_join() {
    let brokers = support::brokers();
    let cluster = cluster_name("token");
    let first_dir = tempfile::tempdir().expect("temp dir");
    let first = member(&brokers, first_dir.path(), &cluster);
    let tenant = support::tenant_name("t");
    first.tenant(&tenant, None);

    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("serve.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", "127.0.0.1:0", "--brokers", &brokers, "--cluster", &cluster])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("SLUICE_ADMIN_TOKEN", "another-admin-token-9876543210")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn sluice serve");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!(
                "a host with another admin token kept running: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "{text}");
    assert!(text.contains("admin token is not cluster"), "{text}");

    // It did not take part in deciding: the cluster still takes writes
    // through its one good host.
    let more = support::tenant_name("more");
    first.tenant(&more, None);
}

/// Waits until the live hosts' placement settled: each holds some slots,
/// and together all of them. A job created while a member's slots are still
/// in flight would start some tasks on one member and move them at once.
pub(crate) fn settled(hosts: &[Option<Host>]) {
    eventually("the members' placement settles", Duration::from_secs(60), || {
        let shares: Vec<Option<usize>> = hosts.iter().flatten().map(|h| slots(&h.log_text())).collect();
        shares.iter().all(|share| share.is_some_and(|n| n > 0))
            && shares.iter().flatten().sum::<usize>() == sluice::cluster::placement::SLOTS as usize
    });
}

/// A member's share of the slots, as it last logged it.
fn slots(log: &str) -> Option<usize> {
    log.lines()
        .rev()
        .filter(|line| line.contains("share of the cluster's jobs changed"))
        .find_map(|line| line.rsplit("slots=").next())
        .and_then(|n| n.trim().parse().ok())
}

pub(crate) fn host(hosts: &[Option<Host>], i: usize) -> &Host {
    hosts[i].as_ref().expect("host is up")
}

/// A member's host id, from its data directory.
pub(crate) fn host_id(dir: &std::path::Path) -> String {
    let identity: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("host.json")).expect("host.json")).expect("identity");
    identity["host"].as_str().expect("host id").to_owned()
}

/// Which live host runs each task of job `id` (awake or asleep), by each
/// host's own view (a host's status marks the tasks it runs with its own
/// id), once every one of its `tasks` runs on exactly one host: task index
/// -> host index.
pub(crate) fn placement(hosts: &[Option<Host>], token: &str, id: &str, tasks: usize, timeout: Duration) -> Vec<usize> {
    let started = Instant::now();
    loop {
        let mut runs: Vec<Vec<usize>> = vec![Vec::new(); tasks];
        for (index, host) in hosts.iter().enumerate() {
            let Some(host) = host else { continue };
            let (status, job) = host.get(&format!("/v1/jobs/{id}"), token);
            if status != 200 {
                continue;
            }
            let me = json!(host_id(&host.data_dir));
            for task in job["tasks"].as_array().into_iter().flatten() {
                let running = phase_on_its_host(task) == "running" && task["host"] == me;
                if let Some(t) = task["index"].as_u64().filter(|_| running).and_then(|t| runs.get_mut(t as usize)) {
                    t.push(index);
                }
            }
        }
        if runs.iter().all(|hosts| hosts.len() == 1) {
            return runs.into_iter().map(|hosts| hosts[0]).collect();
        }
        assert!(
            started.elapsed() < timeout,
            "job {id}'s tasks do not each run on one host within {timeout:?}: {runs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_jobs_tasks_spread_over_hosts_and_move_and_its_output_stays_exactly_once() {
    let brokers = support::brokers();
    let cluster = cluster_name("move");
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().expect("temp dir")).collect();
    let mut hosts: Vec<Option<Host>> = (0..3).map(|i| Some(member(&brokers, dirs[i].path(), &cluster))).collect();
    settled(&hosts);
    const TASKS: usize = 4;

    // A tenant through host 1, its module through host 2, its job through host 3.
    let tenant = support::tenant_name("mover");
    let token = host(&hosts, 0).tenant(&tenant, None);
    eventually("host 2 knows the tenant", Duration::from_secs(10), || {
        host(&hosts, 1).get("/v1/whoami", &token).0 == 200
    });
    host(&hosts, 1).push_guest(&token, "running-count");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, TASKS as i32), (&output, TASKS as i32)]).expect("topics");
    let spec = json!({"id": "j", "module": "running-count", "parallelism": TASKS,
        "input": {"topics": [input]}, "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
    eventually("host 3 knows the module", Duration::from_secs(10), || {
        host(&hosts, 2).get("/v1/modules", &token).1.to_string().contains("running-count")
    });
    let (status, created) = host(&hosts, 2).post("/v1/jobs", &token, spec);
    assert_eq!(status, 201, "{created}");

    // Each task runs on one host; every host shows all of them, with the
    // figures of the others' as they published them, and the job's log.
    let mut inputs = support::produce_keyed(&brokers, &input, 0..4_000, 50);
    let first = placement(&hosts, &token, "j", TASKS, Duration::from_secs(60));
    eprintln!("cluster: job j's tasks run on hosts {first:?}");
    for viewer in 0..3 {
        let seen = host(&hosts, viewer).wait_job(&token, "j", Duration::from_secs(60), |j| {
            j["records_in"].as_u64() >= Some(4_000) && j["tasks"].as_array().map(Vec::len) == Some(TASKS)
        });
        let mut shown: Vec<String> = seen["hosts"].as_array().into_iter().flatten().map(|h| h.to_string()).collect();
        shown.sort();
        let mut expected: Vec<String> = first.iter().map(|&i| json!(host_id(dirs[i].path())).to_string()).collect();
        expected.sort();
        expected.dedup();
        assert_eq!(shown, expected, "host {viewer} shows the job's members: {seen}");
    }
    let outsider = (0..3).find(|i| !first.contains(i));
    if let Some(outsider) = outsider {
        eventually("a host that runs none of the tasks returns the job's log", Duration::from_secs(30), || {
            host(&hosts, outsider)
                .get("/v1/jobs/j/logs", &token)
                .1
                .to_string()
                .contains("recovered from the last committed")
        });
        assert!(
            !dirs[outsider].path().join("state").join(&tenant).join("j").exists(),
            "host {outsider} ran a task too"
        );
        // Its throughput chart is the job's too, from the members' figures.
        support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 16_000..16_400, 50));
        let chart = format!("/ui/jobs/{tenant}/j/throughput?seconds=300");
        eventually("a host that runs none of the tasks charts the job's throughput", Duration::from_secs(30), || {
            let (_, rates) = host(&hosts, outsider).get(&chart, &token);
            rates["records_in"].as_array().is_some_and(|points| points.iter().any(|r| r.as_u64() > Some(0)))
        });
    }

    // kill -9 the host of task 0 mid-stream: its tasks move to the others
    // once its placement session times out.
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 4_000..8_000, 50));
    std::thread::sleep(Duration::from_millis(300));
    let victim = first[0];
    let mut dead = hosts[victim].take().expect("the host of task 0");
    dead.kill9();
    let killed_at = Instant::now();
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 8_000..10_000, 50));
    let second = placement(&hosts, &token, "j", TASKS, Duration::from_secs(60));
    eprintln!("cluster: after kill -9 of host {victim}, tasks run on {second:?} ({:?} later)", killed_at.elapsed());

    // The dead host comes back and serves again.
    dead.restart();
    hosts[victim] = Some(dead);
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 10_000..12_000, 50));
    let third = placement(&hosts, &token, "j", TASKS, Duration::from_secs(60));

    // A graceful stop hands its tasks over at once, after a final checkpoint.
    let leaving = third[0];
    let mut stopping = hosts[leaving].take().expect("the host of task 0");
    stopping.terminate(Duration::from_secs(60));
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 12_000..14_000, 50));
    placement(&hosts, &token, "j", TASKS, Duration::from_secs(60));

    // A fourth host joins and takes its share of the slots.
    hosts.push(Some(member(&brokers, dirs[3].path(), &cluster)));
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 14_000..16_000, 50));

    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(180));
    support::verify_running_count(&committed, &inputs);
    let last = placement(&hosts, &token, "j", TASKS, Duration::from_secs(60));

    // Stopped through one host and deleted through another: every host
    // drops the job's state.
    let (caller, deleter) = (first_up(&hosts, last[0] + 1), first_up(&hosts, last[0] + 2));
    let (status, stop) = host(&hosts, caller).post("/v1/jobs/j/stop", &token, json!({}));
    assert_eq!(status, 202, "{stop}");
    // The stop's operation is done only once every host's tasks stopped.
    let done = host(&hosts, caller).wait_operation(&token, &stop);
    assert_eq!(done["state"], "succeeded", "{done}");
    for member in hosts.iter().flatten() {
        let (_, job) = member.get("/v1/jobs/j", &token);
        let me = json!(host_id(&member.data_dir));
        let mine: Vec<&Value> = job["tasks"].as_array().into_iter().flatten().filter(|t| t["host"] == me).collect();
        assert!(mine.is_empty(), "a host still runs tasks after the stop succeeded: {job}");
    }
    eventually("the job shows stopped on every host", Duration::from_secs(60), || {
        hosts.iter().flatten().all(|h| h.get("/v1/jobs/j", &token).1["state"] == "stopped")
    });
    eventually("the job is deleted through another host", Duration::from_secs(60), || {
        host(&hosts, deleter).request("DELETE", "/v1/jobs/j", Some(&token), None).0 == 204
    });
    for (index, dir) in dirs.iter().enumerate() {
        let state = dir.path().join("state").join(&tenant).join("j");
        if hosts.get(index).is_some_and(Option::is_some) {
            eventually("every running host drops the deleted job's state", Duration::from_secs(10), || !state.exists());
        }
    }
}

/// When a member joins, a member that keeps some of a job's tasks keeps
/// running them: only the tasks whose slots moved take a final checkpoint
/// and start on the newcomer; the others go on, their figures too, and the
/// output stays exactly once.
#[test]
fn the_tasks_a_member_keeps_run_on_when_another_member_joins() {
    let brokers = support::brokers();
    let cluster = cluster_name("keep");
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("temp dir")).collect();
    let mut hosts: Vec<Option<Host>> = vec![Some(member(&brokers, dirs[0].path(), &cluster))];
    settled(&hosts);
    // Sixteen tasks in 64 slots, and the newcomer takes half of the slots:
    // the first member keeps some of the tasks and hands over others (all
    // or none would happen about once in 10,000 runs, and the test says so).
    const TASKS: usize = 16;
    let tenant = support::tenant_name("keeper");
    let policy = json!({"topic-prefixes": [format!("{tenant}.")], "max-jobs": 1, "max-parallelism": TASKS,
        "limits": {"memory": "64MiB", "deadline": "2s", "max-outputs-per-input": 10, "state": "16MiB"}});
    let token = host(&hosts, 0).tenant(&tenant, Some(policy));
    host(&hosts, 0).push_guest(&token, "running-count");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, TASKS as i32), (&output, TASKS as i32)]).expect("topics");
    let spec = json!({"id": "j", "module": "running-count", "parallelism": TASKS,
        "input": {"topics": [input]}, "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
    let (status, created) = host(&hosts, 0).post("/v1/jobs", &token, spec);
    assert_eq!(status, 201, "{created}");
    let mut inputs = support::produce_keyed(&brokers, &input, 0..3_200, 160);
    let before = host(&hosts, 0).wait_job(&token, "j", Duration::from_secs(60), |j| {
        j["records_in"].as_u64() >= Some(3_200) && j["tasks"].as_array().map(Vec::len) == Some(TASKS)
    });

    hosts.push(Some(member(&brokers, dirs[1].path(), &cluster)));
    settled(&hosts);
    let started = Instant::now();
    let placed = loop {
        let placed = placement(&hosts, &token, "j", TASKS, Duration::from_secs(60));
        if placed.contains(&1) {
            break placed;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the newcomer took none of the job's tasks: {placed:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let kept: Vec<usize> = (0..TASKS).filter(|&task| placed[task] == 0).collect();
    assert!(!kept.is_empty(), "the join moved all of the job's tasks: {placed:?}");
    let (_, after) = host(&hosts, 0).get("/v1/jobs/j", &token);
    let figure = |job: &Value, task: usize, name: &str| -> u64 {
        let tasks = job["tasks"].as_array().expect("tasks");
        let view = tasks.iter().find(|t| t["index"] == json!(task)).expect("the task's view");
        view[name].as_u64().expect("a figure")
    };
    for &task in &kept {
        assert!(
            figure(&after, task, "records_in") >= figure(&before, task, "records_in"),
            "task {task} stayed on the first member but its figures started over: before {before:#}\nafter {after:#}"
        );
    }
    let log = host(&hosts, 0).log_text();
    assert!(!log.contains("releasing the job"), "the first member stopped the whole job for the join:\n{log}");
    assert!(log.contains("releasing the task"), "the first member released no task:\n{log}");

    // The moved tasks run on the newcomer from the first member's
    // checkpoints: every record counted once.
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 3_200..6_400, 160));
    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(120));
    support::verify_running_count(&committed, &inputs);
}

/// The first host that is up, from `from` on (modulo their number).
pub(crate) fn first_up(hosts: &[Option<Host>], from: usize) -> usize {
    (0..hosts.len()).map(|i| (from + i) % hosts.len()).find(|&i| hosts[i].is_some()).expect("a host is up")
}

/// A task's phase as the tests judge where it runs: a task asleep still
/// runs on its host (one that holds every shard of its job sleeps after 30
/// s without input, as when another member stalls; one that holds some,
/// once the whole job is idle), so it shows as `running`.
fn phase_on_its_host(task: &Value) -> &str {
    match task["phase"].as_str().unwrap_or_default() {
        "sleeping" => "running",
        phase => phase,
    }
}

/// The tasks each live host runs itself of job `id`, by its own view:
/// (task index, module, parallelism, phase as [`phase_on_its_host`] shows it).
fn own_tasks(hosts: &[Option<Host>], token: &str, id: &str) -> Vec<(u64, String, u64, String)> {
    let mut tasks = Vec::new();
    for host in hosts.iter().flatten() {
        let (_, job) = host.get(&format!("/v1/jobs/{id}"), token);
        let me = json!(host_id(&host.data_dir));
        for task in job["tasks"].as_array().into_iter().flatten().filter(|t| t["host"] == me) {
            tasks.push((
                task["index"].as_u64().unwrap_or(u64::MAX),
                task["module"].as_str().unwrap_or_default().to_owned(),
                task["parallelism"].as_u64().unwrap_or(0),
                phase_on_its_host(task).to_owned(),
            ));
        }
    }
    tasks.sort();
    tasks
}

/// Posts the control call `path` with `body` through `caller`, waits for
/// its operation to succeed, and checks that then the hosts run exactly
/// `expected` of job j: (task index, module, parallelism, phase).
fn change_and_check(
    hosts: &[Option<Host>],
    caller: usize,
    token: &str,
    (path, body): (&str, Value),
    expected: &[(u64, String, u64, String)],
    what: &str,
) {
    let (status, operation) = host(hosts, caller).post(path, token, body);
    assert_eq!(status, 202, "{operation}");
    // Polled through the member that did not take the call: an operation
    // is cluster metadata, readable on every member.
    let other = (caller + 1) % hosts.len();
    let done = host(hosts, other).wait_operation(token, &operation);
    assert_eq!(done["state"], "succeeded", "through host {other}: {done}");
    let (_, seen) =
        host(hosts, caller).get(&format!("/v1/operations/{}", operation["id"].as_str().unwrap_or("")), token);
    assert_eq!(seen, done, "the two members disagree on the operation");
    assert_eq!(own_tasks(hosts, token, "j"), expected, "{what}");
}

/// Two members of a new cluster and a tenant's job `j` on them: the
/// running-count guest (`v1`) with `counter-v2` (`v2`) uploaded beside it,
/// parallelism 2 over `partitions` input partitions, 200 ms checkpoints.
struct JobOnTwo {
    /// The members' data directories: kept until the members are gone.
    dirs: Vec<tempfile::TempDir>,
    hosts: Vec<Option<Host>>,
    brokers: String,
    cluster: String,
    token: String,
    v1: String,
    v2: String,
    input: String,
    output: String,
}

fn job_on_two_members(name: &str, partitions: i32) -> JobOnTwo {
    let brokers = support::brokers();
    let cluster = cluster_name(name);
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("temp dir")).collect();
    let hosts: Vec<Option<Host>> = dirs.iter().map(|d| Some(member(&brokers, d.path(), &cluster))).collect();
    let tenant = support::tenant_name(name);
    let token = host(&hosts, 0).tenant(&tenant, None);
    let v1 = host(&hosts, 0).push_guest(&token, "running-count");
    let v2 = host(&hosts, 0).push_guest(&token, "counter-v2");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, partitions), (&output, partitions)]).expect("topics");
    let spec = json!({"id": "j", "module": v1, "parallelism": 2,
        "input": {"topics": [input]}, "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
    let (status, created) = host(&hosts, 0).post("/v1/jobs", &token, spec);
    assert_eq!(status, 201, "{created}");
    JobOnTwo { dirs, hosts, brokers, cluster, token, v1, v2, input, output }
}

/// An upgrade or a rescale through one member is done only once every
/// member runs it: each task of the new parallelism (at most one per input
/// partition) running once, under the new module, and nothing of the old
/// left. (Before, the operation was done as soon as the member that took
/// the call had changed the record and restarted its own part, while the
/// others still ran the old one.) Each operation is polled through the
/// other member (before, only the member that took the call knew it).
#[test]
fn an_upgrade_or_rescale_through_one_host_is_done_once_every_host_runs_it() {
    let JobOnTwo { dirs: _dirs, hosts, brokers, cluster, token, v1: _, v2, input, output } =
        job_on_two_members("change", 3);
    let mut inputs = support::produce_keyed(&brokers, &input, 0..2_000, 20);
    let before = placement(&hosts, &token, "j", 2, Duration::from_secs(60));
    eprintln!("cluster: job j's tasks run on hosts {before:?}");

    // Through the host of task 1: the other host runs task 0.
    let caller = before[1];
    eventually("the caller knows the new module", Duration::from_secs(10), || {
        host(&hosts, caller).get("/v1/modules", &token).1.to_string().contains(&v2)
    });
    // `tasks` tasks running v2 under `parallelism`.
    let running = |tasks: u64, parallelism: u64| -> Vec<(u64, String, u64, String)> {
        (0..tasks).map(|i| (i, v2.clone(), parallelism, "running".into())).collect()
    };
    let upgrade = ("/v1/jobs/j/upgrade", json!({"module": v2}));
    let what = "every task runs the new module once the upgrade is done";
    change_and_check(&hosts, caller, &token, upgrade, &running(2, 2), what);

    // A rescale through the other host: done once all three tasks run.
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 2_000..4_000, 20));
    let caller = 1 - caller;
    let scale = ("/v1/jobs/j/scale", json!({"parallelism": 3}));
    let what = "every task runs under the new parallelism once the rescale is done";
    change_and_check(&hosts, caller, &token, scale, &running(3, 3), what);

    // A parallelism above the input's 3 partitions runs 3 tasks: the
    // rescale is done once those 3 run under it.
    let scale = ("/v1/jobs/j/scale", json!({"parallelism": 4}));
    let what = "three tasks run once the rescale to four is done";
    change_and_check(&hosts, caller, &token, scale, &running(3, 4), what);

    // Through all of it, exactly once.
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 4_000..5_000, 20));
    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(180));
    support::verify_running_count(&committed, &inputs);

    // A rescale (back to 3) through the member of task 0, which dies right
    // after it switched the job's record, before it ran the change or
    // settled the call: the other member runs the change, and settles it.
    let mut hosts = hosts;
    let caller = placement(&hosts, &token, "j", 3, Duration::from_secs(60))[0];
    let crashing = [("SLUICE_CLUSTER", cluster.as_str()), ("SLUICE_FAILPOINT", "change-after-record")];
    hosts[caller].as_mut().expect("the caller").crash_and_restart_with_env(&crashing);
    let (status, scale) = host(&hosts, caller).post("/v1/jobs/j/scale", &token, json!({"parallelism": 3}));
    assert_eq!(status, 202, "{scale}");
    eventually("the caller dies at its failpoint", Duration::from_secs(60), || {
        host(&hosts, caller).log_text().contains("failpoint `change-after-record`")
    });
    let mut dead = hosts[caller].take().expect("the caller");
    dead.kill9();
    let survivor = first_up(&hosts, caller);
    let done = host(&hosts, survivor).wait_operation(&token, &scale);
    assert_eq!(done["state"], "succeeded", "the rescale of a member that died after switching: {done}");
    eventually("every task runs under the new parallelism on the surviving member", Duration::from_secs(60), || {
        own_tasks(&hosts, &token, "j") == running(3, 3)
    });
    // It comes back, without the failpoint, for what follows.
    dead.crash_and_restart_with_env(&[("SLUICE_CLUSTER", cluster.as_str())]);
    hosts[caller] = Some(dead);
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 5_000..6_000, 20));
    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(180));
    support::verify_running_count(&committed, &inputs);

    // A stop through the member of task 0, killed right after it took the
    // call, in its final checkpoint: the other member finishes the stop
    // once it has waited its turn (60 s) and nothing runs (the dead
    // member's status has gone stale), and the job stays stopped.
    let caller = placement(&hosts, &token, "j", 3, Duration::from_secs(60))[0];
    let (status, stop) = host(&hosts, caller).post("/v1/jobs/j/stop", &token, json!({}));
    assert_eq!(status, 202, "{stop}");
    hosts[caller].take().expect("the caller").kill9();
    let survivor = first_up(&hosts, caller);
    let done = host(&hosts, survivor).wait_operation(&token, &stop);
    assert_eq!(done["state"], "succeeded", "the stop of a killed member: {done}");
    let (_, job) = host(&hosts, survivor).get("/v1/jobs/j", &token);
    assert_eq!(job["desired"], "stopped", "{job}");
    assert_eq!(own_tasks(&hosts, &token, "j"), [], "a task still runs after the stop succeeded");
}

/// An upgrade whose member stops before it switched the job's record does
/// not stay pending for ever. Here the member stalls at that point past the
/// time the others leave it (as one that died, or lost the cluster, would
/// look to them): the other member fails the upgrade, and the switch the
/// staller tries when it wakes is refused, so the job runs on everywhere
/// under its old module, exactly once; a new upgrade then goes through.
/// (Before, only the member that took the call could settle a change it
/// had not made: one that died and never came back left it pending.)
#[test]
fn an_upgrade_whose_member_stops_before_switching_is_given_up_and_the_job_runs_on() {
    let JobOnTwo { dirs: _dirs, mut hosts, brokers, cluster, token, v1, v2, input, output } =
        job_on_two_members("giveup", 2);
    let mut inputs = support::produce_keyed(&brokers, &input, 0..1_000, 20);
    let caller = placement(&hosts, &token, "j", 2, Duration::from_secs(60))[0];
    let other = 1 - caller;

    let stalling = [("SLUICE_CLUSTER", cluster.as_str()), ("SLUICE_FAILPOINT", "change-before-record:stall=75s")];
    hosts[caller].as_mut().expect("the caller").crash_and_restart_with_env(&stalling);
    eventually("the caller knows the new module", Duration::from_secs(60), || {
        host(&hosts, caller).get("/v1/modules", &token).1.to_string().contains(&v2)
    });
    let (status, upgrade) = host(&hosts, caller).post("/v1/jobs/j/upgrade", &token, json!({"module": v2}));
    assert_eq!(status, 202, "{upgrade}");
    eventually("the caller stalls before it switches the job", Duration::from_secs(60), || {
        host(&hosts, caller).log_text().contains("failpoint `change-before-record` hit 1 time(s): stalling")
    });
    let done = host(&hosts, other).wait_operation(&token, &upgrade);
    assert_eq!(done["state"], "failed", "an upgrade its member never switched: {done}");
    let error = done["error"].as_str().unwrap_or_default();
    assert!(error.contains("did not switch the job"), "the reason names what happened: {error}");

    // The staller wakes: its switch is refused, and it runs its part of the
    // job again under the old module.
    eventually("the caller's switch is refused", Duration::from_secs(90), || {
        host(&hosts, caller).log_text().contains("was given up by another member")
    });
    let running = |module: &str| -> Vec<(u64, String, u64, String)> {
        (0..2).map(|i| (i, module.to_owned(), 2, "running".to_owned())).collect()
    };
    let started = Instant::now();
    loop {
        let seen = own_tasks(&hosts, &token, "j");
        if seen == running(&v1) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "both tasks run the old module again: not within 60s: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for h in 0..2 {
        let (_, job) = host(&hosts, h).get("/v1/jobs/j", &token);
        assert_eq!(job["module"], json!(v1), "host {h} shows the job under another module: {job}");
        let (_, seen) =
            host(&hosts, h).get(&format!("/v1/operations/{}", upgrade["id"].as_str().unwrap_or("")), &token);
        assert_eq!(seen["state"], "failed", "host {h}: {seen}");
    }
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 1_000..2_000, 20));

    // Nothing is wedged: the same upgrade through the same member now runs.
    let upgrade = ("/v1/jobs/j/upgrade", json!({"module": v2}));
    change_and_check(&hosts, caller, &token, upgrade, &running(&v2), "every task runs the new module");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 2_000..3_000, 20));
    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(180));
    support::verify_running_count(&committed, &inputs);
}

/// An upgrade with `migrate` is fenced from a member that has not applied
/// it yet. Here one member's applier stalls at the upgrade's record
/// (failpoint `apply-upgrade`): the upgrading member's new task migrates
/// the shard the group gives it and commits it, then that member stops, and
/// the group hands the migrated shard to the stale member's old-module
/// task. That task must refuse it (before, it ran the old module on the
/// migrated state, restarting every count of the shard at 1, and erased the
/// mark that the shard was migrated, so it was migrated a second time).
#[test]
fn a_member_behind_on_an_upgrade_does_not_run_the_shards_it_migrated() {
    let JobOnTwo { dirs: _dirs, mut hosts, brokers, cluster, token, v1: _, v2, input, output } =
        job_on_two_members("fence", 2);
    let mut inputs = support::produce_keyed(&brokers, &input, 0..1_000, 20);
    let upgrader = placement(&hosts, &token, "j", 2, Duration::from_secs(60))[0];
    let behind = 1 - upgrader;
    let stalling = [("SLUICE_CLUSTER", cluster.as_str()), ("SLUICE_FAILPOINT", "apply-upgrade:stall=60s")];
    hosts[behind].as_mut().expect("the member behind").crash_and_restart_with_env(&stalling);
    placement(&hosts, &token, "j", 2, Duration::from_secs(60));
    support::read_committed(&brokers, &output, 1_000, Duration::from_secs(120));
    eventually("the upgrader knows the new module", Duration::from_secs(60), || {
        host(&hosts, upgrader).get("/v1/modules", &token).1.to_string().contains(&v2)
    });

    let (status, upgrade) = host(&hosts, upgrader).post("/v1/jobs/j/upgrade", &token, json!({"module": v2}));
    assert_eq!(status, 202, "{upgrade}");
    eventually("the other member stalls at the upgrade's record", Duration::from_secs(60), || {
        host(&hosts, behind).log_text().contains("failpoint `apply-upgrade` hit 1 time(s): stalling")
    });
    // The upgrader's new task migrates a shard and commits it.
    eventually("the upgrader migrates a shard", Duration::from_secs(60), || {
        host(&hosts, upgrader).log_text().contains("migrated the state of the previous module")
    });
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 1_000..2_000, 20));
    support::read_committed(&brokers, &output, 2_000, Duration::from_secs(120));

    // The upgrader stops: its shard goes to the old task of the member
    // behind, which must leave it alone.
    hosts[upgrader].as_mut().expect("the upgrader").terminate(Duration::from_secs(60));
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 2_000..3_000, 20));
    let refused = |hosts: &[Option<Host>]| {
        host(hosts, behind).log_text().contains("this host has not applied the job's newer upgrade yet")
    };
    let all_out = || {
        tools::read_all(&brokers, &output, false, Duration::from_secs(5), |r| r.len() >= 3_000)
            .is_ok_and(|r| r.len() >= 3_000)
    };
    eventually("the member behind refuses the migrated shard, or runs it", Duration::from_secs(60), || {
        refused(&hosts) || all_out()
    });

    // Once it has caught up and the upgrader is back, the job runs on, and
    // every count is exact.
    hosts[upgrader].as_mut().expect("the upgrader").restart();
    let done = host(&hosts, upgrader).wait_operation(&token, &upgrade);
    assert_eq!(done["state"], "succeeded", "{done}");
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 3_000..4_000, 20));
    let committed = support::read_committed(&brokers, &output, 4_000, Duration::from_secs(180));
    support::verify_running_count(&committed, &inputs);
    assert!(
        refused(&hosts),
        "the member behind never refused the migrated shard; its log:\n{}",
        host(&hosts, behind).log_text()
    );
}

/// A member of `group` over `topic` (one partition), once the group assigned
/// it the partition.
fn member_holding(config: &rdkafka::ClientConfig, group: &str, topic: &str) -> sluice::kafka::Source {
    let member =
        sluice::kafka::Source::join(config, group, sluice::kafka::StartPosition::Earliest, &[topic.to_owned()])
            .expect("joining the group");
    eventually("the group assigns the member its partition", Duration::from_secs(60), || {
        member.serve_group(Duration::from_millis(100)).expect("serving the group");
        member.assigned().expect("the assignment") == [(topic.to_owned(), 0)]
    });
    member
}

/// KIP-447: a task's offsets go into its transaction with its member's group
/// metadata, so a member the job's group has moved on from (a zombie: its
/// host stalled or was cut off, and its partitions went to another member)
/// cannot commit a checkpoint, whatever its transactional id; the member
/// that holds the partition now can.
#[test]
fn a_member_the_group_moved_on_from_cannot_commit_a_checkpoint() {
    use sluice::checkpoint::PartitionOffset;
    use sluice::kafka::Sink;

    let brokers = support::brokers();
    let (input, output) = (support::unique("fence-in"), support::unique("fence-out"));
    tools::create_topics(&brokers, &[(&input, 1), (&output, 1)]).expect("topics");
    let config = sluice::kafka::client_config(&brokers, &Default::default());
    let group = support::unique("fence-group");
    let timeout = Duration::from_secs(30);
    let offsets = |next_offset| [PartitionOffset { topic: input.clone(), partition: 0, next_offset }];
    let none = std::collections::BTreeMap::new();
    let mark = |checkpoint| sluice::kafka::Mark {
        checkpoint,
        changelog: None,
        migrated: None,
        run: Some(1),
        incarnation: None,
    };

    let zombie = member_holding(&config, &group, &input);
    let stale = zombie.group_metadata().expect("group metadata");
    // It leaves; a new member takes the partition.
    drop(zombie);
    let live = member_holding(&config, &group, &input);

    let sink = Sink::connect(&config, &support::unique("fence-txn"), std::slice::from_ref(&output), None, timeout)
        .expect("sink");
    sink.begin().expect("begin");
    let refused = sink.send_offsets(&offsets(7), mark(1), &none, &stale);
    let error = refused.expect_err("the zombie's offsets are refused");
    assert!(
        ["member", "generation", "epoch"].iter().any(|w| error.to_string().to_lowercase().contains(w)),
        "refused for its membership: {error}"
    );
    sink.abort().expect("abort");

    sink.begin().expect("begin");
    let current = live.group_metadata().expect("group metadata");
    sink.send_offsets(&offsets(5), mark(2), &none, &current).expect("the live member's offsets");
    sink.commit(2).expect("commit");
    let committed = live.committed(&[(input.clone(), 0)], timeout).expect("committed offsets");
    assert_eq!(committed.offsets.get(&(input.clone(), 0)), Some(&5));
    assert_eq!(committed.checkpoints.get(&0), Some(&2));
}

/// A job over two co-partitioned topics, on three hosts: the job's group
/// gives partition p of both topics to one task, so each key's count (its
/// records are in partition p of both) lives in one shard. A task holding
/// half a shard while the group moves it must not read it. The counts stay
/// exactly once across kill -9 of a host and its return.
#[test]
fn a_job_over_two_topics_keeps_each_shard_whole_across_hosts() {
    let brokers = support::brokers();
    let cluster = cluster_name("twin");
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("temp dir")).collect();
    let mut hosts: Vec<Option<Host>> = dirs.iter().map(|dir| Some(member(&brokers, dir.path(), &cluster))).collect();
    settled(&hosts);
    const TASKS: usize = 3;
    const PARTITIONS: i32 = 6;

    let tenant = support::tenant_name("twin");
    let token = host(&hosts, 0).tenant(&tenant, None);
    host(&hosts, 0).push_guest(&token, "running-count");
    let (left, right, output) = (format!("{tenant}.left"), format!("{tenant}.right"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&left, PARTITIONS), (&right, PARTITIONS), (&output, PARTITIONS)])
        .expect("topics");
    // The same keys in both topics: a key's records are in the same
    // partition of each.
    let mut inputs = support::produce_keyed(&brokers, &left, 0..3_000, 60);
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &right, 0..3_000, 60));
    let spec = json!({"id": "j", "module": "running-count", "parallelism": TASKS,
        "input": {"topics": [left, right]}, "output": {"topics": [output]}, "checkpoint": {"interval": "200ms"}});
    let (status, created) = host(&hosts, 0).post("/v1/jobs", &token, spec);
    assert_eq!(status, 201, "{created}");
    let first = placement(&hosts, &token, "j", TASKS, Duration::from_secs(60));

    // Each shard is held by one task, as every host shows it.
    let seen = host(&hosts, 1).wait_job(&token, "j", Duration::from_secs(60), |j| {
        let mut shards: Vec<u64> = j["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|t| t["shards"].as_array().cloned().unwrap_or_default())
            .filter_map(|s| s.as_u64())
            .collect();
        shards.sort_unstable();
        shards == (0..PARTITIONS as u64).collect::<Vec<_>>()
    });
    eprintln!("cluster: two-topic job's tasks: {}", seen["tasks"]);

    // kill -9 a host mid-stream, then bring it back.
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &left, 3_000..5_000, 60));
    let victim = first[0];
    let mut dead = hosts[victim].take().expect("the host of task 0");
    dead.kill9();
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &right, 3_000..5_000, 60));
    placement(&hosts, &token, "j", TASKS, Duration::from_secs(60));
    dead.restart();
    hosts[victim] = Some(dead);
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &left, 5_000..6_000, 60));
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &right, 5_000..6_000, 60));

    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(180));
    support::verify_running_count(&committed, &inputs);
}

/// In a cluster a task that holds every shard of its job sleeps when idle,
/// as on a lone host: it leaves the job's group (which hands nothing to
/// another member) and lets go of its Kafka clients; a record wakes it, it
/// joins the group again, and the output stays exactly once. A job whose
/// shards are spread over two tasks sleeps too once all of it is idle: the
/// task without the job's first shard leaves its shard to the other, which
/// then holds the whole job and sleeps in its turn; asleep, they stay so,
/// and a record in either partition wakes them.
#[test]
fn an_idle_task_holding_its_whole_job_sleeps_in_a_cluster_and_wakes_exactly_once() {
    let brokers = support::brokers();
    let cluster = cluster_name("nap");
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("temp dir")).collect();
    let hosts: Vec<Option<Host>> = dirs.iter().map(|dir| Some(member(&brokers, dir.path(), &cluster))).collect();
    settled(&hosts);
    let tenant = support::tenant_name("nap");
    let token = host(&hosts, 0).tenant(&tenant, None);
    host(&hosts, 0).push_guest(&token, "running-count");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    let (spread_input, spread_output) = (format!("{tenant}.spread-in"), format!("{tenant}.spread-out"));
    tools::create_topics(&brokers, &[(&input, 2), (&output, 2), (&spread_input, 2), (&spread_output, 2)])
        .expect("topics");
    // `spread`'s `sleep-after` leaves the test time to see its shards
    // split; its heartbeat is due a few times within the test, and must
    // wake only the task that holds the whole job.
    let spec = |id: &str, parallelism: u32, input: &str, output: &str, sleep_after: &str, heartbeat: &str| {
        json!({"id": id, "module": "running-count", "parallelism": parallelism,
            "input": {"topics": [input], "sleep-after": sleep_after}, "output": {"topics": [output]},
            "checkpoint": {"interval": "200ms", "heartbeat": heartbeat}})
    };
    let phases = |job: &Value| -> Vec<String> {
        job["tasks"].as_array().into_iter().flatten().map(|t| t["phase"].as_str().unwrap_or("?").to_owned()).collect()
    };

    let mut inputs = support::produce_keyed(&brokers, &input, 0..1_000, 17);
    let mut spread = support::produce_keyed(&brokers, &spread_input, 0..1_000, 17);
    let (status, created) = host(&hosts, 0).post("/v1/jobs", &token, spec("whole", 1, &input, &output, "1s", "4s"));
    assert_eq!(status, 201, "{created}");
    let (status, created) =
        host(&hosts, 1).post("/v1/jobs", &token, spec("spread", 2, &spread_input, &spread_output, "3s", "8s"));
    assert_eq!(status, 201, "{created}");

    // `spread`'s two tasks each hold one shard once both have joined. Until
    // then the first holds both, and may fall asleep before the second
    // joins, as `whole` does: records written until the split shows wake it.
    let split = |j: &Value| {
        let shards: Vec<Value> = j["tasks"].as_array().into_iter().flatten().map(|t| t["shards"].clone()).collect();
        phases(j) == ["running", "running"] && shards.iter().all(|s| s.as_array().is_some_and(|s| s.len() == 1))
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut written = 1_000;
    loop {
        let (_, job) = host(&hosts, 0).get("/v1/jobs/spread", &token);
        if split(&job) {
            break;
        }
        assert!(Instant::now() < deadline, "the shards of `spread` never split: {job}");
        support::add_counts(&mut spread, support::produce_keyed(&brokers, &spread_input, written..written + 20, 17));
        written += 20;
        std::thread::sleep(Duration::from_millis(500));
    }
    // The log lines of `spread`'s task `index` (all of them: `None`) that
    // say `what`, on host `h`.
    let spread_lines = |h: usize, index: Option<&str>, what: &str| {
        let task = format!("{tenant}.spread/{}", index.unwrap_or_default());
        host(&hosts, h).log_text().lines().filter(|l| l.contains(&task) && l.contains(what)).count()
    };
    let spread_log = || (0..2).map(|h| host(&hosts, h).log_text()).collect::<Vec<_>>().join("\n");

    // The one task of `whole` holds both shards: it reads the backlog and
    // falls asleep, as every host shows it.
    let asleep = |j: &Value| j["records_in"].as_u64() >= Some(1_000) && phases(j) == ["sleeping"];
    for h in 0..2 {
        host(&hosts, h).wait_job(&token, "whole", Duration::from_secs(90), asleep);
    }
    let [runner] = placement(&hosts, &token, "whole", 1, Duration::from_secs(10))[..] else { unreachable!() };
    assert!(
        host(&hosts, runner).log_text().contains("task sleeps: no input for 1s"),
        "{}",
        host(&hosts, runner).log_text()
    );
    // Its heartbeat still commits, and it sleeps again.
    let (_, before) = host(&hosts, runner).get("/v1/jobs/whole", &token);
    let checkpoints = before["checkpoints"].as_u64().unwrap_or(0);
    host(&hosts, runner).wait_job(&token, "whole", Duration::from_secs(60), |j| {
        j["checkpoints"].as_u64() > Some(checkpoints) && phases(j) == ["sleeping"]
    });

    // A record wakes it: it joins the group again and counts on.
    support::add_counts(&mut inputs, support::produce_keyed(&brokers, &input, 1_000..2_000, 17));
    host(&hosts, runner).wait_job(&token, "whole", Duration::from_secs(90), |j| {
        j["records_in"].as_u64() >= Some(2_000) && phases(j) == ["sleeping"]
    });
    assert!(
        host(&hosts, runner).log_text().contains("task wakes: a record arrived"),
        "{}",
        host(&hosts, runner).log_text()
    );
    let total: u64 = inputs.values().sum();
    let committed = support::read_committed(&brokers, &output, total as usize, Duration::from_secs(120));
    support::verify_running_count(&committed, &inputs);

    // Once all of `spread` is idle, the task without the first shard sleeps
    // and leaves its shard to the other, which then holds both and sleeps
    // in its turn.
    let total: u64 = spread.values().sum();
    let committed = support::read_committed(&brokers, &spread_output, total as usize, Duration::from_secs(120));
    support::verify_running_count(&committed, &spread);
    host(&hosts, 0).wait_job(&token, "spread", Duration::from_secs(90), |j| phases(j) == ["sleeping", "sleeping"]);
    let left = "nor to the rest of its job";
    let (sleeper_host, sleeper) = (0..2)
        .flat_map(|h| ["0", "1"].map(|index| (h, index)))
        .find(|&(h, index)| spread_lines(h, Some(index), left) > 0)
        .unwrap_or_else(|| panic!("no task of `spread` slept while holding one shard:\n{}", spread_log()));
    // Asleep, they stay asleep but for the heartbeat, which wakes only the
    // task holding the whole job: it commits and sleeps again. The one that
    // left its shard sleeps on, so nothing moves the shards back and forth.
    let sleeper_moves = || {
        spread_lines(sleeper_host, Some(sleeper), "task sleeps")
            + spread_lines(sleeper_host, Some(sleeper), "task wakes")
    };
    let heartbeats = || (0..2).map(|h| spread_lines(h, None, "task wakes: its heartbeat")).sum::<usize>();
    // The job's checkpoints, as its hosts count them (each its own tasks').
    let checkpoints = || -> u64 {
        (0..2).map(|h| host(&hosts, h).get("/v1/jobs/spread", &token).1["checkpoints"].as_u64().unwrap_or(0)).sum()
    };
    let (before, beats, committed) = (sleeper_moves(), heartbeats(), checkpoints());
    let deadline = Instant::now() + Duration::from_secs(60);
    while heartbeats() < beats + 2 || checkpoints() <= committed {
        assert!(
            Instant::now() < deadline,
            "`spread`'s heartbeat did not wake and commit twice in 60 s:\n{}",
            spread_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    host(&hosts, 0).wait_job(&token, "spread", Duration::from_secs(60), |j| phases(j) == ["sleeping", "sleeping"]);
    assert_eq!(
        sleeper_moves(),
        before,
        "task {sleeper} of `spread` left its shard, yet woke or slept again with no input:\n{}",
        spread_log()
    );

    // Records only in the first partition, which the task that left its
    // shard never held, wake it too (it watches the whole job); the output
    // stays exactly once.
    let woke_before = spread_lines(sleeper_host, Some(sleeper), "task wakes: a record arrived");
    let first: Vec<(Vec<u8>, Vec<u8>)> =
        (0..50).map(|i| (format!("first-{}", i % 5).into_bytes(), format!("value {i}").into_bytes())).collect();
    tools::produce_to(&brokers, &spread_input, Some(0), first).expect("produce");
    support::add_counts(&mut spread, (0..5).map(|k| (format!("first-{k}"), 10)).collect());
    let total: u64 = spread.values().sum();
    let committed = support::read_committed(&brokers, &spread_output, total as usize, Duration::from_secs(120));
    support::verify_running_count(&committed, &spread);
    let woke = spread_lines(sleeper_host, Some(sleeper), "task wakes: a record arrived");
    assert!(
        woke > woke_before,
        "task {sleeper} of `spread` did not wake for a record of partition 0:\n{}",
        spread_log()
    );
}

/// A job without a changelog is refused in a cluster, with the reason: a
/// shard's state moves between members through its changelog, and the
/// first move would fail the whole job (stateless or not) with `StateLost`.
/// Before, it was accepted.
#[test]
fn a_job_without_a_changelog_is_refused_in_a_cluster() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let one = member(&brokers, dir.path(), &cluster_name("nolog"));
    let tenant = support::tenant_name("nolog");
    let token = one.tenant(&tenant, None);
    one.push_guest(&token, "running-count");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, 2), (&output, 2)]).expect("topics");
    let spec = json!({"id": "j", "module": "running-count", "input": {"topics": [input]},
        "output": {"topics": [output]}, "state": {"changelog": false}});
    let (status, body) = one.post("/v1/jobs", &token, spec);
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("`state.changelog = false`"), "{body}");
    assert_eq!(one.get("/v1/jobs", &token).1, json!([]), "nothing was stored");
}

/// A new tenant whose policy allows `max_tasks` tasks, made through member
/// `through`, with running-count pushed and an input and an output topic of
/// one partition; with its token and the spec of a one-task job `id` over
/// those topics.
fn tenant_of_tasks(
    hosts: &[Option<Host>],
    through: usize,
    prefix: &str,
    max_tasks: u32,
) -> (String, impl Fn(&str) -> Value) {
    let me = host(hosts, through);
    let tenant = support::tenant_name(prefix);
    let token = me.tenant(&tenant, None);
    let mut policy = me.get("/v1/whoami", &token).1["policy"].clone();
    policy["max-tasks"] = json!(max_tasks);
    let (status, body) = me.request("PUT", &format!("/v1/tenants/{tenant}/policy"), Some(ADMIN), Some(policy));
    assert_eq!(status, 200, "{body}");
    me.push_guest(&token, "running-count");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&support::brokers(), &[(&input, 1), (&output, 1)]).expect("topics");
    let spec = move |id: &str| {
        json!({"id": id, "module": "running-count", "parallelism": 1,
            "input": {"topics": [input]}, "output": {"topics": [output]}})
    };
    (token, spec)
}

/// A tenant's `max-tasks` counts its tasks on every member, not only on
/// the member that takes the call. Before, a job placed on one member did
/// not count on another, so a tenant could run `max-tasks` on each.
#[test]
fn a_tenants_task_limit_holds_across_the_cluster() {
    let brokers = support::brokers();
    let cluster = cluster_name("quota");
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("temp dir")).collect();
    let hosts: Vec<Option<Host>> = dirs.iter().map(|d| Some(member(&brokers, d.path(), &cluster))).collect();
    let (token, spec) = tenant_of_tasks(&hosts, 0, "quota", 1);
    for h in 0..2 {
        eventually("every member knows the policy and the module", Duration::from_secs(60), || {
            let me = host(&hosts, h);
            me.get("/v1/whoami", &token).1["policy"]["max-tasks"] == json!(1)
                && me.get("/v1/modules", &token).1.to_string().contains("running-count")
        });
    }
    let (status, body) = host(&hosts, 0).post("/v1/jobs", &token, spec("a"));
    assert_eq!(status, 201, "{body}");
    let other = 1 - placement(&hosts, &token, "a", 1, Duration::from_secs(60))[0];

    // Through the member that does not run it, another task is over.
    let (status, body) = host(&hosts, other).post("/v1/jobs", &token, spec("b"));
    assert_eq!(status, 403, "a second task through the other member: {body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("allows 1 tasks"), "{body}");

    // Once the first job stops, its task is the tenant's again, anywhere.
    let (status, stop) = host(&hosts, other).post("/v1/jobs/a/stop", &token, json!({}));
    assert_eq!(status, 202, "{stop}");
    assert_eq!(host(&hosts, other).wait_operation(&token, &stop)["state"], "succeeded");
    let (status, body) = host(&hosts, other).post("/v1/jobs", &token, spec("b"));
    assert_eq!(status, 201, "{body}");
    let (status, body) = host(&hosts, 0).post("/v1/jobs/a/resume", &token, json!({}));
    assert_eq!(status, 403, "resuming the first job would be over: {body}");
}

/// Two resumes of two jobs through two members, each counted before the
/// other is stored, cannot both pass the tenant's `max-tasks`: the record
/// is stored only if no job of the tenant changed since the count. Before,
/// both resumed (3 tasks under a limit of 2).
#[test]
fn two_resumes_through_two_members_cannot_both_pass_the_task_limit() {
    let brokers = support::brokers();
    let cluster = cluster_name("race");
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("temp dir")).collect();
    // The first member stalls each resume between its count and its record.
    let stalling = [("SLUICE_CLUSTER", cluster.as_str()), ("SLUICE_FAILPOINT", "resume-before-record:stall=20s")];
    let hosts = [
        Some(Host::start_with_env(&brokers, dirs[0].path(), &stalling)),
        Some(member(&brokers, dirs[1].path(), &cluster)),
    ];
    let (token, spec) = tenant_of_tasks(&hosts, 1, "race", 2);
    // `a` and `b` made and stopped, then `c` runs: 1 task of 2.
    for id in ["a", "b"] {
        let (status, body) = host(&hosts, 1).post("/v1/jobs", &token, spec(id));
        assert_eq!(status, 201, "{body}");
    }
    for id in ["a", "b"] {
        let (status, stop) = host(&hosts, 1).post(&format!("/v1/jobs/{id}/stop"), &token, json!({}));
        assert_eq!(status, 202, "{stop}");
        assert_eq!(host(&hosts, 1).wait_operation(&token, &stop)["state"], "succeeded");
    }
    let (status, body) = host(&hosts, 1).post("/v1/jobs", &token, spec("c"));
    assert_eq!(status, 201, "{body}");
    let to_run = |h: usize| {
        let (_, jobs) = host(&hosts, h).get("/v1/jobs", &token);
        let jobs = jobs.as_array().cloned().unwrap_or_default();
        jobs.iter()
            .filter(|j| j["desired"] == "running")
            .map(|j| j["id"].as_str().unwrap_or("?").to_owned())
            .collect::<Vec<_>>()
    };
    eventually("the first member knows that only `c` runs", Duration::from_secs(60), || to_run(0) == ["c"]);
    // And neither member still holds `a` or `b` (a stop's operation may
    // finish before the member that ran the job has let go of it).
    for h in 0..2 {
        for id in ["a", "b"] {
            host(&hosts, h).wait_job(&token, id, Duration::from_secs(60), |j| j["state"] == "stopped");
        }
    }

    // `a` through the stalling member, counted (`c` and `a`: 2 tasks) and
    // stalled before its record; then `b` through the other member, which
    // counts `c` and `b`. Whichever is stored first, the other is refused
    // (the stalled one, unless the second outlasts the stall).
    let resumed = std::thread::scope(|scope| {
        let first = scope.spawn(|| host(&hosts, 0).post("/v1/jobs/a/resume", &token, json!({})));
        eventually("the first resume is counted and stalls (or answers)", Duration::from_secs(60), || {
            first.is_finished()
                || host(&hosts, 0).log_text().contains("failpoint `resume-before-record` hit 1 time(s): stalling")
        });
        let second = host(&hosts, 1).post("/v1/jobs/b/resume", &token, json!({}));
        [first.join().expect("the first resume"), second]
    });
    let succeeded = resumed.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!(succeeded, 1, "exactly one resume may pass: {resumed:?}");
    // Refused by the count (if the other was stored before it counted) or
    // by the condition on its record (if after).
    let (status, refused) = resumed.iter().find(|(status, _)| *status != 200).expect("a refused resume");
    let error = refused["error"].as_str().unwrap_or_default();
    match status {
        409 => assert!(error.contains("your jobs changed"), "{refused}"),
        403 => assert!(error.contains("allows 2 tasks"), "{refused}"),
        _ => panic!("the refused resume: {status} {refused}"),
    }
    let running = to_run(1);
    assert_eq!(running.len(), 2, "jobs to run under a limit of 2 tasks: {running:?}");
}

/// The admin token's record in the cluster's metadata topic (readable by
/// whoever may read the cluster's topics) is a salted password hash, never
/// the token's plain sha256, which a guessable token would give away.
/// Before, it was the plain sha256.
#[test]
fn the_admin_tokens_record_in_the_metadata_topic_is_a_salted_hash() {
    use sha2::Digest as _;
    let brokers = support::brokers();
    let cluster = cluster_name("salt");
    let dir = tempfile::tempdir().expect("temp dir");
    let first = member(&brokers, dir.path(), &cluster);
    first.tenant(&support::tenant_name("salt"), None);
    let topic = sluice::cluster::Topics::of(&cluster).meta;
    let records = tools::read_all(&brokers, &topic, false, Duration::from_secs(5), |_| false).expect("the meta topic");
    let plain = hex::encode(sha2::Sha256::digest(crate::host::ADMIN.as_bytes()));
    let cluster_records: Vec<String> = records
        .iter()
        .filter(|r| r.key.as_deref() == Some(b"cluster"))
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    assert!(!cluster_records.is_empty(), "no cluster record in {topic}");
    for record in &cluster_records {
        assert!(!record.contains(&plain), "the admin token's plain sha256 is in the metadata topic: {record}");
    }
    assert!(cluster_records.last().is_some_and(|r| r.contains("$argon2id$")), "{cluster_records:?}");
    // And the token still admits a second member.
    let other = tempfile::tempdir().expect("temp dir");
    let second = member(&brokers, other.path(), &cluster);
    assert_eq!(second.get("/v1/tenants", crate::host::ADMIN).0, 200);
}
