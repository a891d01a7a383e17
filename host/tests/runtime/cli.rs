//! `sluice run` refuses bad job files and bad modules with a clear message
//! before it touches Kafka (the brokers here do not exist).

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
