//! Density: how many idle jobs one shared host holds, and the memory each
//! costs. Not a test: a figure to report.
//!
//! `cargo bench -p sluice --bench density [-- --jobs N] [--sleep-after D]`
//! (default 500 jobs, and the jobs' default `input.sleep-after`, 30s: the
//! idle figures are taken once every task sleeps; `off` keeps them awake). The
//! host runs in this process (the same `Service` as `sluice serve`); every
//! job is a running-count job with one task (a consumer, a transactional
//! producer, a guest instance, a redb file, its threads) on a real broker:
//! `SLUICE_BENCH_BROKERS`, else one started with scripts/kafka.sh on port
//! 19292. The baseline is the same process with the host up and no job.
//!
//! With every job running it also times the dashboard over real HTTP (the
//! same router as `sluice serve`, on a loopback port): the jobs list's
//! fragment (its first page, a later page, a search), and each fragment of one job's page (median
//! of 10 requests, after one to warm up). With `--browser`, headless
//! Chromium (scripts/toolchains/browser.sh) also loads the jobs list and a
//! job's page (tests/browser/render-timing.cjs), then keeps the list open
//! for a minute while the host's RSS is watched.

#![allow(missing_docs, unreachable_pub)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice::job::TaskPhase;
use sluice::kafka::tools;
use sluice::service::{Caller, JobState, LogHub, Policy, Service, ServiceConfig};

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn main() {
    let jobs: usize = support::arg_value("--jobs").and_then(|v| v.parse().ok()).unwrap_or(500);
    let sleep_after = support::arg_value("--sleep-after").unwrap_or_else(|| "30s".into());
    let brokers = support::bench_brokers();
    let run = format!("{}", std::process::id());
    let dir = tempfile::tempdir().expect("temp dir");
    let module = std::fs::read(support::guest("running-count")).expect("guest");
    let service = Service::open(
        ServiceConfig {
            data_dir: dir.path().to_owned(),
            brokers: brokers.clone(),
            admin_token: "density-admin-token-0123456789".into(),
            max_module_bytes: 64 << 20,
            max_instances: u32::try_from(jobs + 16).unwrap_or(u32::MAX),
            cluster: None,
            baseline: true,
        },
        LogHub::default(),
    )
    .expect("service");
    let tenant = format!("dense{run}");
    let mut policy = Policy::default_for(&tenant);
    policy.max_jobs = u32::try_from(jobs).unwrap_or(u32::MAX);
    policy.max_tasks = policy.max_jobs;
    let (_, token) = service.create_tenant(&Caller::Admin, &tenant, Some(policy)).expect("tenant");
    let caller = service.authenticate(Some(&token)).expect("token");
    let upload = service.upload_bytes(&module).expect("upload");
    service.push_module(&caller, Some("running-count"), upload).expect("module");
    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, 1), (&output, 1)]).expect("topics");

    std::thread::sleep(Duration::from_secs(2));
    let (base_rss, base_threads) = (support::proc_status("self", "VmRSS"), support::proc_status("self", "Threads"));
    let started = Instant::now();
    for i in 0..jobs {
        let spec = json!({"id": format!("j{i}"), "module": "running-count",
            "input": {"topics": [input], "sleep-after": sleep_after}, "output": {"topics": [output]}});
        service.create_job(&caller, spec).unwrap_or_else(|e| panic!("job {i}: {e}"));
        if (i + 1) % 100 == 0 {
            eprintln!("density: {} jobs created, RSS {:.0} MiB", i + 1, mib(support::proc_status("self", "VmRSS")));
        }
    }
    let created = started.elapsed();
    // Every job running: each task recovered, instantiated its guest and opened its transaction.
    loop {
        let statuses = service.jobs(&caller).expect("jobs");
        let running = statuses.iter().filter(|s| s.state == JobState::Running).count();
        if running == jobs {
            break;
        }
        if let Some(bad) = statuses.iter().find(|s| s.state == JobState::Failed || s.state == JobState::Restarting) {
            panic!("job {} is {:?}: {:?}", bad.id, bad.state, bad.reason);
        }
        assert!(started.elapsed() < Duration::from_secs(1800), "only {running} of {jobs} jobs running");
        std::thread::sleep(Duration::from_secs(1));
    }
    let all_running = started.elapsed();
    // Idle: every task asleep (it had no input for `sleep-after`), or, with
    // `off`, every task awake and waiting for input.
    let mut asleep = 0;
    if sleep_after != "off" {
        loop {
            let statuses = service.jobs(&caller).expect("jobs");
            asleep = statuses.iter().flat_map(|s| &s.tasks).filter(|t| t.phase == TaskPhase::Sleeping).count();
            if asleep == jobs {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(1800), "only {asleep} of {jobs} tasks asleep");
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let all_idle = started.elapsed();
    std::thread::sleep(Duration::from_secs(10));
    let cpu_before = support::process_cpu("self").unwrap_or_default();
    std::thread::sleep(Duration::from_secs(10));
    let idle_cpu = (support::process_cpu("self").unwrap_or_default() - cpu_before).as_secs_f64() / 10.0;
    let (rss, threads) = (support::proc_status("self", "VmRSS"), support::proc_status("self", "Threads"));
    let per_job = mib(rss.saturating_sub(base_rss)) / jobs as f64;

    println!("\n## Density: {jobs} idle running-count jobs on one host (`input.sleep-after = {sleep_after:?}`)\n");
    println!("| figure | value |");
    println!("|---|---|");
    println!("| host RSS with no job (baseline) | {:.0} MiB, {base_threads} threads |", mib(base_rss));
    println!("| host RSS with {jobs} running jobs | {:.0} MiB, {threads} threads |", mib(rss));
    println!("| memory per job (RSS above the baseline / jobs) | **{per_job:.2} MiB** |");
    println!("| jobs that fit in 2 GiB at that rate | {:.0} |", (2048.0 - mib(base_rss)) / per_job);
    println!(
        "| time to create {jobs} jobs / until all running | {:.1} s / {:.1} s |",
        created.as_secs_f64(),
        all_running.as_secs_f64()
    );
    println!("| tasks asleep while idle / time until all were | {asleep} / {:.1} s |", all_idle.as_secs_f64());
    println!("| CPU while idle | {:.1}% of one core |", idle_cpu * 100.0);
    println!("\ngoal: at least 500 jobs within 2 GiB (RSS {:.0} MiB for {jobs})", mib(rss));

    println!("\n## The dashboard with {jobs} jobs (server time to the last byte, median of 10)\n");
    println!("| fragment | time | bytes |");
    println!("|---|---:|---:|");
    let (server, address) = serve(&service);
    for (path, took, bytes) in dashboard_timings(address, &token, &tenant, "j0") {
        println!("| `{path}` | {:.1} ms | {bytes} |", took.as_secs_f64() * 1e3);
    }
    if std::env::args().any(|a| a == "--browser") {
        let rss_before = support::proc_status("self", "VmRSS");
        let figures = browser_timings(address, &token, &tenant, jobs, "j0");
        let rss_after = support::proc_status("self", "VmRSS");
        println!("\n## The dashboard with {jobs} jobs in headless Chromium (median of 5 loads)\n");
        println!("| figure | value |");
        println!("|---|---|");
        println!(
            "| jobs list: navigation to the first page (50 rows) and the tally shown | {} ms (all: {}) |",
            figures["list_ms"], figures["list_all_ms"]
        );
        println!(
            "| jobs list: a click on Next to the second page shown | {} ms (all: {}) |",
            figures["next_page_ms"], figures["next_page_all_ms"]
        );
        println!(
            "| job page: first byte to summary, history and chart shown | {} ms (all: {}) |",
            figures["job_after_first_byte_ms"], figures["job_all_ms"]
        );
        println!(
            "| the list open for a minute, polling each second: page JS heap | {:.1} MiB -> {:.1} MiB |",
            figures["heap_before_bytes"].as_f64().unwrap_or_default() / 1048576.0,
            figures["heap_after_minute_bytes"].as_f64().unwrap_or_default() / 1048576.0
        );
        println!("| host RSS over that browser session | {:.0} MiB -> {:.0} MiB |", mib(rss_before), mib(rss_after));
    }
    drop(server);

    let stopping = Instant::now();
    service.shutdown();
    eprintln!("density: stopped every job in {:.1} s", stopping.elapsed().as_secs_f64());
}

/// Serves `service`'s API and dashboard on a loopback port, for as long as
/// the returned runtime lives.
fn serve(service: &Arc<Service>) -> (tokio::runtime::Runtime, std::net::SocketAddr) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind a port");
    let address = listener.local_addr().expect("address");
    let app = sluice::api::router(Arc::clone(service), 64 << 20);
    runtime.spawn(async move { axum::serve(listener, app).await });
    (runtime, address)
}

/// Times each fragment the jobs list and `job`'s page load: (path, median
/// time, bytes).
fn dashboard_timings(
    address: std::net::SocketAddr,
    token: &str,
    tenant: &str,
    job: &str,
) -> Vec<(String, Duration, usize)> {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let job_ui = |rest: &str| format!("/ui/jobs/{tenant}/{job}/{rest}");
    let paths = [
        "/ui/jobs".to_owned(),
        "/ui/jobs?page=5".to_owned(),
        "/ui/jobs?q=j49&state=running".to_owned(),
        job_ui("summary"),
        job_ui("history"),
        job_ui("throughput"),
        job_ui("controls"),
        job_ui("logs"),
    ];
    paths
        .into_iter()
        .map(|path| {
            let mut times = Vec::new();
            let mut bytes = 0;
            for _ in 0..11 {
                let started = Instant::now();
                let mut response = agent
                    .get(format!("http://{address}{path}"))
                    .header("Authorization", &format!("Bearer {token}"))
                    .call()
                    .expect("a dashboard request");
                let body = response.body_mut().read_to_string().expect("a body");
                assert_eq!(response.status(), 200, "{path}: {body}");
                times.push(started.elapsed());
                bytes = body.len();
            }
            times.remove(0);
            times.sort();
            (path, times[times.len() / 2], bytes)
        })
        .collect()
}

/// Runs tests/browser/render-timing.cjs against the dashboard; its figures.
fn browser_timings(
    address: std::net::SocketAddr,
    token: &str,
    tenant: &str,
    jobs: usize,
    job: &str,
) -> serde_json::Value {
    let root = support::workspace_root();
    let installed = std::process::Command::new(root.join("scripts/toolchains/browser.sh"))
        .arg("--print")
        .output()
        .expect("run scripts/toolchains/browser.sh");
    assert!(installed.status.success(), "{}", String::from_utf8_lossy(&installed.stderr));
    let modules = String::from_utf8_lossy(&installed.stdout).trim().to_owned();
    let out = std::process::Command::new("node")
        .arg(root.join("tests/browser/render-timing.cjs"))
        .env("SLUICE_URL", format!("http://{address}"))
        .env("SLUICE_PLAYWRIGHT", std::path::Path::new(&modules).join("playwright-core"))
        .env("TENANT", tenant)
        .env("TENANT_TOKEN", token)
        .env("JOBS", jobs.to_string())
        .env("JOB", job)
        .output()
        .expect("run node");
    assert!(out.status.success(), "render-timing failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("render-timing's JSON")
}
