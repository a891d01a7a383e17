//! The OpenAPI document says exactly what the server does: schemathesis
//! (pinned, installed by scripts/toolchains/schemathesis.sh) generates
//! requests from the document served at `/openapi.json` of a live
//! `sluice serve`, valid ones and invalid ones, alone and in sequences,
//! with a tenant's token and with the admin's, and runs every one of its
//! checks on the answers: no server error, only documented status codes,
//! content types and headers, bodies that match their schemas, valid
//! requests accepted and invalid ones refused. Any failure fails the test.
//! Its settings, and the one allowance they make, are in
//! tests/e2e/schemathesis.toml.

use std::path::PathBuf;
use std::process::Command;

use crate::guests;
use crate::host::{ADMIN, Host};
use crate::support;

/// The `st` command, installed on first use.
fn schemathesis() -> PathBuf {
    let root = guests::workspace_root();
    let output = Command::new(root.join("scripts/toolchains/schemathesis.sh"))
        .arg("--print")
        .output()
        .expect("run scripts/toolchains/schemathesis.sh");
    assert!(output.status.success(), "installing schemathesis failed:\n{}", String::from_utf8_lossy(&output.stderr));
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()).join("st")
}

#[test]
fn the_api_does_what_its_openapi_document_says() {
    let st = schemathesis();
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let tenant = host.tenant(&support::tenant_name("fuzz"), None);
    host.push_guest(&tenant, "running-count");
    let config = guests::workspace_root().join("tests/e2e/schemathesis.toml");
    // The tenant's routes first: the admin's run creates tenants and
    // rewrites policies, its own included.
    for (who, token) in [("a tenant", tenant.as_str()), ("the admin", ADMIN)] {
        let output = Command::new(&st)
            .arg("--config-file")
            .arg(&config)
            .arg("--no-color")
            .args(["run", &format!("{}/openapi.json", host.url)])
            .args(["--header", &format!("Authorization: Bearer {token}")])
            .args(["--checks", "all", "--max-examples", "30", "--seed", "1", "--continue-on-failure"])
            .current_dir(dir.path())
            .output()
            .expect("run schemathesis");
        let report = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "schemathesis with {who}'s token found failures:\n{report}\n{}\nhost log:\n{}",
            String::from_utf8_lossy(&output.stderr),
            host.log_text()
        );
        // Every operation of the document was exercised.
        let field = |name: &str| {
            report.lines().find_map(|line| line.trim().strip_prefix(name)).map(str::trim).unwrap_or_default()
        };
        let total = field("Selected:").rsplit('/').next().unwrap_or_default();
        assert!(!total.is_empty() && field("Tested:") == total, "not every operation was tested:\n{report}");
    }
}
