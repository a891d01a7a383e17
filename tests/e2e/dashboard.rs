//! The web dashboard in a real browser: headless Chromium (Debian's
//! package) driven by playwright-core (tests/browser/dashboard.cjs) against
//! a real `sluice serve` with two tenants and real jobs on the broker. The
//! script signs in, watches a running job's figures rise, finds a failed
//! job's reason and the record that caused it, stops and resumes a job,
//! and checks that another tenant cannot open the job even by its URL.
//!
//! Screenshots go to `target/dashboard-screenshots/` (kept by CI); with
//! `SLUICE_UPDATE_SCREENSHOTS=1` they are copied to `docs/dashboard/` too.
//! scripts/toolchains/browser.sh installs the browser and the client; with
//! neither the test fails, it never skips.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use sluice::kafka::tools;

use crate::guests;
use crate::host::{ADMIN, Host};
use crate::support;

/// The playwright-core package, installed by scripts/toolchains/browser.sh.
fn playwright() -> PathBuf {
    let root = guests::workspace_root();
    let out = Command::new(root.join("scripts/toolchains/browser.sh"))
        .arg("--print")
        .output()
        .expect("run scripts/toolchains/browser.sh");
    assert!(out.status.success(), "installing the browser failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    PathBuf::from(dir).join("playwright-core")
}

#[test]
fn the_dashboard_in_a_real_browser() {
    let playwright = playwright();
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());

    let tenant = support::tenant_name("dash");
    let token = host.tenant(&tenant, None);
    let other = host.tenant(&support::tenant_name("peer"), None);
    host.push_guest(&token, "running-count");
    host.push_guest(&token, "probe");
    let topics = ["in", "out", "bad-in", "bad-out"].map(|t| format!("{tenant}.{t}"));
    tools::create_topics(&brokers, &topics.iter().map(|t| (t.as_str(), 1)).collect::<Vec<_>>()).expect("topics");
    let spec = |id: &str, module: &str, input: &str, output: &str| {
        json!({"id": id, "module": module, "input": {"topics": [input]}, "output": {"topics": [output]},
               "checkpoint": {"interval": "500ms"}})
    };
    let (status, body) = host.post("/v1/jobs", &token, spec("counts", "running-count", &topics[0], &topics[1]));
    assert_eq!(status, 201, "{body}");
    let (status, body) = host.post("/v1/jobs", &token, spec("broken", "probe", &topics[2], &topics[3]));
    assert_eq!(status, 201, "{body}");
    tools::produce(&brokers, &topics[2], [(b"k".to_vec(), b"fail".to_vec())]).expect("the bad record");

    // Input keeps arriving while the browser watches.
    let feeding = Arc::new(AtomicBool::new(true));
    let feeder = {
        let (brokers, topic, feeding) = (brokers.clone(), topics[0].clone(), feeding.clone());
        std::thread::spawn(move || {
            let mut next = 0;
            while feeding.load(Ordering::Relaxed) {
                support::produce_keyed(&brokers, &topic, next..next + 200, 17);
                next += 200;
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };

    let shots = guests::workspace_root().join("target").join("dashboard-screenshots");
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    let out = Command::new("node")
        .arg(guests::workspace_root().join("tests/browser/dashboard.cjs"))
        .env("SLUICE_URL", &host.url)
        .env("SLUICE_PLAYWRIGHT", &playwright)
        .env("SLUICE_SHOTS", &shots)
        .env("ADMIN_TOKEN", ADMIN)
        .env("TENANT", &tenant)
        .env("TENANT_TOKEN", &token)
        .env("OTHER_TOKEN", &other)
        .env("GOOD_JOB", "counts")
        .env("BAD_JOB", "broken")
        .env("BAD_TOPIC", &topics[2])
        .output()
        .expect("run node tests/browser/dashboard.cjs");
    feeding.store(false, Ordering::Relaxed);
    feeder.join().expect("the feeder thread");
    assert!(
        out.status.success(),
        "the browser checks failed:\n{}\n{}\nhost log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        host.log_text()
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));

    if std::env::var_os("SLUICE_UPDATE_SCREENSHOTS").is_some() {
        let docs = guests::workspace_root().join("docs").join("dashboard");
        std::fs::create_dir_all(&docs).expect("docs/dashboard");
        for name in ["jobs", "job", "job-failed", "tenant", "admin"] {
            let file = format!("{name}.png");
            std::fs::copy(shots.join(&file), docs.join(&file)).expect("copy a screenshot");
        }
    }
}
