//! `sluice run` refuses bad job files and bad modules with a clear message
//! before it touches Kafka (the brokers here do not exist); `sluice init`
//! makes projects that build and run.

use std::process::Command;

fn run(job: &str, files: &[(&str, &[u8])]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tmp");
    for (name, bytes) in files {
        std::fs::write(dir.path().join(name), bytes).expect("write");
    }
    let job_file = dir.path().join("job.toml");
    std::fs::write(&job_file, job).expect("write job");
    let output = Command::new(env!("CARGO_BIN_EXE_sluice")).arg("run").arg(&job_file).output().expect("run sluice");
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

const JOB: &str = "id = \"j\"\nbrokers = \"127.0.0.1:1\"\nmodule = \"m.wasm\"\n[input]\ntopics = [\"in\"]\n[output]\ntopics = [\"out\"]\n";

#[test]
fn a_job_file_that_is_not_toml_names_the_file_and_line() {
    let (ok, stderr) = run("id = \n", &[]);
    assert!(!ok);
    assert!(stderr.contains("job.toml") && stderr.contains("line 1"), "{stderr}");
}

#[test]
fn a_bad_field_is_named() {
    let (ok, stderr) = run(&format!("{JOB}[limits]\nmemory = \"a lot\"\n"), &[("m.wasm", b"x")]);
    assert!(!ok);
    assert!(stderr.contains("`limits.memory`"), "{stderr}");
}

#[test]
fn a_missing_module_is_named() {
    let (ok, stderr) = run(JOB, &[]);
    assert!(!ok);
    assert!(stderr.contains("`module`: no file at") && stderr.contains("m.wasm"), "{stderr}");
}

#[test]
fn a_module_that_is_not_a_component_fails_before_kafka() {
    let (ok, stderr) = run(JOB, &[("m.wasm", b"\0asm\x01\0\0\0")]);
    assert!(!ok);
    assert!(stderr.contains("core WebAssembly module, not a component"), "{stderr}");
    assert!(!stderr.contains("kafka"), "nothing reached Kafka: {stderr}");
}

/// `sluice init` makes a project that `sluice build` builds and that gives
/// the running-count output its testdata expects; the project names the
/// SDK as a dependency (by name, from the sluice tree) rather than holding
/// a copy of it.
fn init_build_exec(lang: &str, project_file: &str, sdk_name: &str) {
    let dir = tempfile::tempdir().expect("tmp");
    let sluice = env!("CARGO_BIN_EXE_sluice");
    let init = Command::new(sluice).args(["init", "--lang", lang, "counter"]).current_dir(dir.path()).output();
    let init = init.expect("sluice init");
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let project = dir.path().join("counter");
    let declared = std::fs::read_to_string(project.join(project_file)).expect("the project file");
    assert!(declared.contains(sdk_name), "{project_file} names the SDK: {declared}");
    let sdk_copies: Vec<_> = std::fs::read_dir(&project)
        .expect("project")
        .filter_map(|e| e.ok())
        .filter(|e| matches!(e.file_name().to_str(), Some("sluice.js" | "sluice")))
        .collect();
    assert!(sdk_copies.is_empty(), "the project holds no copy of the SDK");
    let module = dir.path().join("counter.wasm");
    let build = Command::new(sluice).arg("build").arg(&project).arg("--out").arg(&module).output();
    let build = build.expect("sluice build");
    assert!(build.status.success(), "{}", String::from_utf8_lossy(&build.stderr));
    let exec = Command::new(sluice)
        .arg("exec")
        .arg(&module)
        .arg("--input")
        .arg(project.join("testdata/input.jsonl"))
        .env("SLUICE_CACHE_DIR", super::support::workspace_root().join("target").join("test-cache"))
        .output()
        .expect("sluice exec");
    assert!(exec.status.success(), "{}", String::from_utf8_lossy(&exec.stderr));
    let expected = std::fs::read_to_string(project.join("testdata/expected.jsonl")).expect("expected");
    assert_eq!(String::from_utf8_lossy(&exec.stdout), expected, "{lang}: the new project's output");
}

#[test]
fn a_new_python_project_depends_on_the_sdk_builds_and_counts() {
    init_build_exec("python", "pyproject.toml", "sluice-guest");
}

#[test]
fn a_new_javascript_project_depends_on_the_sdk_builds_and_counts() {
    init_build_exec("javascript", "package.json", "sluice-guest");
}

#[test]
fn a_new_c_project_depends_on_the_sdk_builds_and_counts() {
    init_build_exec("c", "Makefile", "--cflags 'sluice = 0.1.0'");
}

#[test]
fn a_new_go_project_depends_on_the_sdk_builds_and_counts() {
    init_build_exec("go", "go.mod", "require sluice.dev/sdk/go v0.1.0");
}
