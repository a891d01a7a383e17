//! The API over TLS (`sluice serve --tls-cert --tls-key`), checked with
//! clients others wrote (curl) and with sluice's own CLI: the whole API is
//! served over it, plain HTTP and silent handshakes get nowhere, a renewed
//! certificate is served without a restart, a broken renewal keeps the last
//! good one, and a host whose files cannot be served does not start.

use std::io::Read as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::host::{ADMIN, Host, trusting};
use crate::support;

/// A P-256 certificate for 127.0.0.1 signed by a CA of its own, made by
/// openssl: `dir/<name>.pem`, its key `dir/<name>.key` and the CA's
/// certificate `dir/<name>-ca.pem`, which a client trusts.
struct Issued {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

fn certificate(dir: &Path, name: &str) -> Issued {
    let path = |suffix: &str| dir.join(format!("{name}{suffix}"));
    let openssl = |args: &[&str]| {
        let output = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl");
        assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let (ca, ca_key, csr, ext) =
        (format!("{name}-ca.pem"), format!("{name}-ca.key"), format!("{name}.csr"), format!("{name}.ext"));
    let (cert, key) = (format!("{name}.pem"), format!("{name}.key"));
    openssl(
        &[
            &["req", "-x509", "-days", "2", "-subj", &format!("/CN=sluice test CA {name}")][..],
            &ec,
            &["-keyout", &ca_key, "-out", &ca],
        ]
        .concat(),
    );
    openssl(&[&["req", "-subj", "/CN=127.0.0.1"][..], &ec, &["-keyout", &key, "-out", &csr]].concat());
    std::fs::write(
        path(".ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write the extensions");
    openssl(&[
        "x509",
        "-req",
        "-days",
        "2",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-extfile",
        &ext,
        "-out",
        &cert,
    ]);
    Issued { cert: path(".pem"), key: path(".key"), ca: path("-ca.pem") }
}

/// curl's answer to GET `url`, trusting only `ca`: the status code, or
/// curl's error.
fn curl(url: &str, ca: &Path) -> Result<String, String> {
    let output = Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "20", "--output", "/dev/null", "--write-out", "%{http_code}"])
        .arg("--cacert")
        .arg(ca)
        .arg(url)
        .output()
        .expect("run curl");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Whether a client trusting only `ca` gets 200 from `/healthz`.
fn trusted_by(host: &Host, ca: &Path) -> bool {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(trusting(Some(ca)))
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    agent.get(format!("{}/healthz", host.url)).call().is_ok_and(|r| r.status() == 200)
}

/// Replaces `to` with `from` in one rename, as certbot and Kubernetes do.
fn replace(from: &Path, to: &Path) {
    let staged = to.with_extension("staged");
    std::fs::copy(from, &staged).expect("stage a file");
    std::fs::rename(&staged, to).expect("swap a file in");
}

#[test]
fn the_api_is_served_over_tls_and_a_renewed_certificate_without_a_restart() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).expect("certs dir");
    let (first, second) = (certificate(&certs, "first"), certificate(&certs, "second"));
    // The host serves copies, which the test renews.
    let (cert, key) = (certs.join("serving.pem"), certs.join("serving.key"));
    replace(&first.cert, &cert);
    replace(&first.key, &key);
    let args = ["--header-read-timeout", "3s"];
    let host = Host::start_tls(&brokers, &dir.path().join("host"), &cert, &key, &first.ca, &args);
    assert!(host.url.starts_with("https://"), "{}", host.url);

    // The whole API over TLS: a tenant, an upload, a job list.
    let tenant = host.tenant(&support::tenant_name("tls"), None);
    host.push_guest(&tenant, "running-count");
    let (status, jobs) = host.get("/v1/jobs", &tenant);
    assert_eq!(status, 200, "{jobs}");
    assert_eq!(curl(&format!("{}/healthz", host.url), &first.ca), Ok("200".into()), "curl trusting the CA");
    assert!(curl(&format!("{}/healthz", host.url), &second.ca).is_err(), "curl trusting another CA");

    // The CLI, trusting the host's certificate, and not trusting it.
    let cli = |ca: Option<&Path>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command.args(["tenant", "list", "--server", &host.url, "--token", ADMIN]);
        if let Some(ca) = ca {
            command.arg("--ca-cert").arg(ca);
        }
        command.env_remove("SLUICE_CA_CERT").output().expect("run sluice")
    };
    let trusted = cli(Some(&first.ca));
    assert!(trusted.status.success(), "{}", String::from_utf8_lossy(&trusted.stderr));
    let untrusted = cli(None);
    let error = String::from_utf8_lossy(&untrusted.stderr);
    assert!(!untrusted.status.success() && error.contains("cannot reach"), "{error}");

    // Plain HTTP gets no answer, and a silent handshake is closed.
    let plain = curl(&format!("http://127.0.0.1:{}/healthz", host.port()), &first.ca);
    assert!(!matches!(plain.as_deref(), Ok("200")), "plain HTTP was answered: {plain:?}");
    let mut silent = TcpStream::connect(("127.0.0.1", host.port())).expect("connect");
    silent.set_read_timeout(Some(Duration::from_secs(60))).expect("read timeout");
    let opened = Instant::now();
    let read = silent.read(&mut [0u8; 64]);
    assert!(matches!(read, Ok(0)) || read.is_err(), "a silent connection got an answer: {read:?}");
    assert!(opened.elapsed() < Duration::from_secs(50), "a silent connection stayed open");

    // A renewal: the new certificate is served, without a restart.
    replace(&second.key, &key);
    replace(&second.cert, &cert);
    let renewed = Instant::now();
    while !trusted_by(&host, &second.ca) {
        assert!(
            renewed.elapsed() < Duration::from_secs(60),
            "the renewed certificate was never served; log:\n{}",
            host.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!trusted_by(&host, &first.ca), "the old certificate is still served");
    assert!(host.log_text().contains("serving the API's renewed certificate"), "log:\n{}", host.log_text());

    // A broken renewal (a key of another certificate) keeps the last good one.
    replace(&first.key, &key);
    let broken = Instant::now();
    while !host.log_text().contains("cannot be served") {
        assert!(
            broken.elapsed() < Duration::from_secs(60),
            "the broken renewal was not noticed; log:\n{}",
            host.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(trusted_by(&host, &second.ca), "the last good certificate is no longer served");
    assert_eq!(host.get("/v1/jobs", &tenant).0, 200);
}

#[test]
fn a_host_whose_certificate_cannot_be_served_does_not_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, other_key) = (certificate(dir.path(), "cert").cert, certificate(dir.path(), "other").key);
    let serve = |cert: &Path, key: &Path| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--listen", "127.0.0.1:0", "--brokers", "127.0.0.1:1"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .env("SLUICE_ADMIN_TOKEN", ADMIN)
            .output()
            .expect("run sluice serve")
    };
    let mismatched = serve(&cert, &other_key);
    let error = String::from_utf8_lossy(&mismatched.stderr);
    assert!(!mismatched.status.success(), "{error}");
    assert!(error.contains("does not serve the certificate") && error.contains("other.key"), "{error}");
    let missing = serve(&dir.path().join("none.pem"), &other_key);
    let error = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && error.contains("none.pem"), "{error}");
}
