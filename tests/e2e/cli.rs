//! The CLI verbs against a running host: the same job life as the API test,
//! driven the way a user would, with a TOML job file whose module is a
//! local file (the CLI uploads it).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::kafka::tools;

use crate::guests;
use crate::host::{ADMIN, Host};
use crate::support;

/// Runs `sluice ARGS` against `host` with `token`; returns stdout, or
/// panics with stderr.
fn sluice(host: &Host, token: &str, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env("SLUICE_SERVER", &host.url)
        .env("SLUICE_TOKEN", token)
        .output()
        .expect("run sluice");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "sluice {args:?} failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    // Not at a terminal, as in a script: no progress, nothing on stderr.
    assert!(output.stderr.is_empty(), "sluice {args:?} wrote to stderr: {}", String::from_utf8_lossy(&output.stderr));
    stdout
}

/// Runs `sluice ARGS` in a pseudo-terminal (util-linux `script`), as a
/// person at a terminal would; returns what the terminal showed.
fn sluice_at_a_terminal(host: &Host, token: &str, args: &[&str]) -> String {
    let command = std::iter::once(env!("CARGO_BIN_EXE_sluice"))
        .chain(args.iter().copied())
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ");
    let output = Command::new("script")
        .args(["--quiet", "--return", "--command", &command, "/dev/null"])
        .env("SLUICE_SERVER", &host.url)
        .env("SLUICE_TOKEN", token)
        .output()
        .expect("run sluice under script(1)");
    let shown = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "sluice {args:?} failed at a terminal:\n{shown}");
    shown
}

#[test]
fn the_cli_drives_a_job_through_its_life() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let tenant = support::tenant_name("cli");
    let created: Value =
        serde_json::from_str(&sluice(&host, ADMIN, &["tenant", "create", &tenant, "--format", "json"])).expect("json");
    let token = created["token"].as_str().expect("token").to_owned();

    // A bad token gets a clear error, not a stack trace.
    let denied = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["job", "list", "--server", &host.url, "--token", "wrong"])
        .output()
        .expect("run sluice");
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("401"), "{}", String::from_utf8_lossy(&denied.stderr));

    let (input, output) = (format!("{tenant}.in"), format!("{tenant}.out"));
    tools::create_topics(&brokers, &[(&input, 2), (&output, 1)]).expect("topics");
    let module = guests::guest("running-count");
    let job_file = dir.path().join("job.toml");
    std::fs::write(
        &job_file,
        format!(
            "id = \"counts\"\nmodule = {module:?}\n[input]\ntopics = [\"{input}\"]\n[output]\ntopics = [\"{output}\"]\n\
             [checkpoint]\ninterval = \"200ms\"\n"
        ),
    )
    .expect("job file");
    let job_file = job_file.to_string_lossy().into_owned();
    sluice(&host, &token, &["job", "create", &job_file]);
    assert!(sluice(&host, &token, &["module", "list"]).contains("running_count"));

    let inputs = support::produce_keyed(&brokers, &input, 0..2_000, 11);
    let started = Instant::now();
    loop {
        let status: Value =
            serde_json::from_str(&sluice(&host, &token, &["job", "status", "counts", "--format", "json"]))
                .expect("json");
        // Read everything, and committed a checkpoint (the status below
        // shows its age).
        if status["records_in"].as_u64() >= Some(2_000) && status["last_checkpoint_age_seconds"].is_f64() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "the job never read its input: {status}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let list = sluice(&host, &token, &["job", "list"]);
    assert!(list.starts_with("JOB ") && list.contains("counts"), "{list}");
    // The status reads as a table with units and ages.
    let status = sluice(&host, &token, &["job", "status", "counts"]);
    assert!(status.starts_with("job counts: running"), "{status}");
    assert!(status.contains("last checkpoint #") && status.contains(" ago, took "), "{status}");
    assert!(status.contains("\nTASK  HOST  PHASE") && status.contains("\nSHARD  TASK  KEYS"), "{status}");
    // At a terminal, an upload shows its bytes, then the compile after it.
    let pushed =
        sluice_at_a_terminal(&host, &token, &["module", "push", &guests::guest("uppercase").to_string_lossy()]);
    assert!(pushed.contains("uploading uppercase"), "{pushed}");
    assert!(pushed.contains("uppercase") && pushed.contains("bytes"), "{pushed}");
    assert!(sluice(&host, &token, &["logs", "counts"]).contains("recovered from the last committed checkpoint"));
    let scaled = sluice(&host, &token, &["job", "scale", "counts", "2"]);
    assert!(scaled.contains("scale of counts to 2 tasks: succeeded"), "{scaled}");
    let status: Value =
        serde_json::from_str(&sluice(&host, &token, &["job", "status", "counts", "--format", "json"])).expect("json");
    assert_eq!(status["tasks"].as_array().map(Vec::len), Some(2), "{status}");
    assert!(sluice(&host, &token, &["job", "stop", "counts", "--savepoint"]).contains("succeeded"));
    let committed = support::read_committed(&brokers, &output, 2_000, Duration::from_secs(60));
    support::verify_running_count(&committed, &inputs);
    let reset = sluice(&host, &token, &["job", "reset", "counts", "--to", "latest", "--keep-state"]);
    assert!(reset.contains("reset counts to latest (keep state)"), "{reset}");
    assert!(sluice(&host, &token, &["job", "delete", "counts"]).contains("deleted"));
    assert!(!sluice(&host, &token, &["job", "list"]).contains("counts"));
}
