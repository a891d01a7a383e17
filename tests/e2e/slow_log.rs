//! A cluster member whose write to the cluster's metadata log hangs (the
//! failpoint `log-submit` stalls it, as a slow broker or decider would)
//! holds up only the call that waits on it: another tenant's calls through
//! that member are answered meanwhile, and its placement loop goes on
//! starting the tasks Kafka places on it.
//!
//! Before: create, resume and reset waited on the log with the host's jobs
//! lock held, so every other call that reads a job's status, and the
//! placement loop, waited with them (up to 30 s, the log's timeout).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;

use sluice::kafka::tools;

use crate::cluster::{cluster_name, eventually, member, settled};
use crate::host::Host;
use crate::support;

#[test]
fn a_slow_cluster_log_holds_up_no_other_call_nor_the_placement_loop() {
    let brokers = support::brokers();
    let cluster = cluster_name("slowlog");
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("temp dir")).collect();
    let first = member(&brokers, dirs[0].path(), &cluster);
    // The second member's first write to the log stalls for a minute.
    let env = [("SLUICE_CLUSTER", cluster.as_str()), ("SLUICE_FAILPOINT", "log-submit:stall=60s")];
    let slow = Host::start_with_env(&brokers, dirs[1].path(), &env);
    let hosts = [Some(first), Some(slow)];
    settled(&hosts);
    let [Some(first), Some(slow)] = &hosts else { unreachable!("both members are up") };

    // Everything is set up through the first member: the second writes
    // nothing to the log until the stalled call.
    let (x, y) = (support::tenant_name("slowx"), support::tenant_name("slowy"));
    let x_token = first.tenant(&x, None);
    let mut policy = first.get("/v1/whoami", &x_token).1["policy"].clone();
    policy["topic-prefixes"] = json!([format!("{y}.")]);
    policy["max-parallelism"] = json!(16);
    policy["max-tasks"] = json!(32);
    let y_token = first.tenant(&y, Some(policy));
    first.push_guest(&x_token, "running-count");
    first.push_guest(&y_token, "running-count");
    let spec = |id: &str, tenant: &str, tasks: usize| {
        json!({"id": id, "module": "running-count", "parallelism": tasks,
            "input": {"topics": [format!("{tenant}.in")]}, "output": {"topics": [format!("{tenant}.out")]}})
    };
    for tenant in [&x, &y] {
        let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
        tools::create_topics(&brokers, &[(&input, 16), (&output, 16)]).expect("topics");
    }
    eventually("the second member knows both tenants' modules", Duration::from_secs(30), || {
        slow.get("/v1/modules", &x_token).1.to_string().contains("running-count")
            && slow.get("/v1/modules", &y_token).1.to_string().contains("running-count")
    });
    // Tenant y runs a job, some of whose tasks Kafka places on the second
    // member.
    let placed_here = || slow.log_text().matches("starting the job: placed on this host").count();
    let (status, created) = first.post("/v1/jobs", &y_token, spec("j", &y, 16));
    assert_eq!(status, 201, "{created}");
    eventually("the second member starts tasks of tenant y's first job", Duration::from_secs(45), || {
        placed_here() == 1
    });

    let returned = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Tenant x creates a job through the second member: its record's
        // write to the log stalls.
        let create = scope.spawn(|| {
            let created = slow.post("/v1/jobs", &x_token, spec("j", &x, 1));
            returned.store(true, Ordering::SeqCst);
            created
        });
        eventually("the second member's write to the log stalls", Duration::from_secs(60), || {
            slow.log_text().contains("failpoint `log-submit` hit 1 time(s): stalling")
        });
        // Meanwhile tenant y's calls through the same member are answered ...
        for path in ["/v1/jobs", "/v1/jobs/j"] {
            let (status, body) = slow.get(path, &y_token);
            assert_eq!(status, 200, "{body}");
            assert!(!returned.load(Ordering::SeqCst), "tenant y's GET {path} waited for tenant x's stalled create");
        }
        // ... and the member starts the tasks of tenant y's next job
        // (created through the other member) that Kafka places on it.
        let (status, created) = first.post("/v1/jobs", &y_token, spec("j2", &y, 16));
        assert_eq!(status, 201, "{created}");
        eventually("the second member starts tasks of tenant y's second job", Duration::from_secs(45), || {
            placed_here() == 2
        });
        assert!(!returned.load(Ordering::SeqCst), "the placement loop waited for tenant x's stalled create");
        let (status, created) = create.join().expect("the stalled create");
        assert_eq!(status, 201, "once the log answers, the create is done: {created}");
    });
}
