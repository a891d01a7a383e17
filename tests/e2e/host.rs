//! A `sluice serve` child process and an HTTP client for it, for the tests
//! of the shared host.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::guests;
use super::support::unique;

/// The admin token of test hosts.
pub const ADMIN: &str = "test-admin-token-0123456789";

/// A running `sluice serve`.
pub struct Host {
    child: Option<Child>,
    pub url: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    brokers: String,
    port: u16,
    agent: ureq::Agent,
    env: Vec<(String, String)>,
    /// Extra arguments of `sluice serve`.
    args: Vec<String>,
}

/// A TLS configuration that trusts only the certificates in `pem`, or the
/// default one.
pub fn trusting(pem: Option<&Path>) -> ureq::tls::TlsConfig {
    let mut config = ureq::tls::TlsConfig::builder();
    if let Some(pem) = pem {
        let bytes = std::fs::read(pem).expect("read a certificate");
        let certs: Vec<_> = ureq::tls::parse_pem(&bytes)
            .filter_map(|item| match item.expect("a PEM item") {
                ureq::tls::PemItem::Certificate(cert) => Some(cert.to_owned()),
                _ => None,
            })
            .collect();
        config = config.root_certs(ureq::tls::RootCerts::new_with_certs(&certs));
    }
    config.build()
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

impl Host {
    /// Starts a host with its data in `data_dir`.
    pub fn start(brokers: &str, data_dir: &Path) -> Host {
        Host::start_with_env(brokers, data_dir, &[])
    }

    /// Starts a host with extra environment variables (e.g. a failpoint).
    pub fn start_with_env(brokers: &str, data_dir: &Path, env: &[(&str, &str)]) -> Host {
        Host::start_with_args(brokers, data_dir, env, &[])
    }

    /// Starts a host with extra environment variables and extra arguments
    /// of `sluice serve`.
    pub fn start_with_args(brokers: &str, data_dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Host {
        Host::start_inner(brokers, data_dir, env, args, None)
    }

    /// Starts a host serving its API over TLS with the certificate `cert`
    /// and its `key`; the host's own client trusts only the CA `ca`.
    pub fn start_tls(brokers: &str, data_dir: &Path, cert: &Path, key: &Path, ca: &Path, args: &[&str]) -> Host {
        let (cert_arg, key_arg) = (cert.display().to_string(), key.display().to_string());
        let mut all = vec!["--tls-cert", cert_arg.as_str(), "--tls-key", key_arg.as_str()];
        all.extend_from_slice(args);
        Host::start_inner(brokers, data_dir, &[], &all, Some(ca))
    }

    fn start_inner(
        brokers: &str,
        data_dir: &Path,
        env: &[(&str, &str)],
        args: &[&str],
        trusted: Option<&Path>,
    ) -> Host {
        let port = free_port();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .tls_config(trusting(trusted))
            .build()
            .into();
        let scheme = if trusted.is_some() { "https" } else { "http" };
        let mut host = Host {
            child: None,
            url: format!("{scheme}://127.0.0.1:{port}"),
            data_dir: data_dir.to_owned(),
            log: data_dir.join(format!("serve-{}.log", unique("log"))),
            brokers: brokers.to_owned(),
            port,
            agent,
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        host.spawn();
        host
    }

    /// The API's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn spawn(&mut self) {
        std::fs::create_dir_all(&self.data_dir).expect("data dir");
        self.log = self.data_dir.join(format!("serve-{}.log", unique("log")));
        let log = std::fs::File::create(&self.log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--listen", &format!("127.0.0.1:{}", self.port), "--brokers", &self.brokers])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--max-module-size", "8MiB"])
            .args(&self.args)
            .env("SLUICE_ADMIN_TOKEN", ADMIN)
            .env("SLUICE_LOG", "info")
            .env("SLUICE_CACHE_DIR", guests::workspace_root().join("target").join("test-cache"))
            .env_remove("SLUICE_FAILPOINT")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn sluice serve");
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Ok(response) = self.agent.get(format!("{}/healthz", self.url)).call()
                && response.status() == 200
            {
                return;
            }
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("sluice serve exited with {status}; log:\n{}", self.log_text());
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "sluice serve did not come up; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// kill -9, then start again on the same port and data.
    pub fn crash_and_restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// kill -9, then start again with other extra environment variables.
    pub fn crash_and_restart_with_env(&mut self, env: &[(&str, &str)]) {
        self.kill9();
        self.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.spawn();
    }

    /// Sends a request that the host is expected to die during (a
    /// failpoint): true if no answer came.
    pub fn request_dies(&self, path: &str, token: &str, body: Value) -> bool {
        let url = format!("{}{path}", self.url);
        with_auth(self.agent.post(&url), Some(&format!("Bearer {token}"))).send_json(body).is_err()
    }

    /// SIGTERM, then waits for the host to stop (its jobs take a final
    /// checkpoint first); panics if it does not within `timeout`.
    pub fn terminate(&mut self, timeout: Duration) {
        let Some(mut child) = self.child.take() else { return };
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let started = Instant::now();
        while child.try_wait().ok().flatten().is_none() {
            if started.elapsed() > timeout {
                let _ = child.kill();
                panic!("sluice serve did not stop within {timeout:?} of SIGTERM; log:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the host again (after `kill9` or `terminate`).
    pub fn restart(&mut self) {
        self.spawn();
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The host process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The names of the host process's threads (Linux).
    pub fn thread_names(&self) -> Vec<String> {
        let Some(child) = &self.child else { return Vec::new() };
        let dir = format!("/proc/{}/task", child.id());
        let Ok(tasks) = std::fs::read_dir(&dir) else { return Vec::new() };
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .collect()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// One request; returns the status and the JSON body (`Null` if none).
    pub fn request(&self, method: &str, path: &str, token: Option<&str>, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.url);
        let auth = token.map(|t| format!("Bearer {t}"));
        let response = match (method, body) {
            ("GET", _) => with_auth(self.agent.get(&url), auth.as_deref()).call(),
            ("DELETE", _) => with_auth(self.agent.delete(&url), auth.as_deref()).call(),
            ("POST", body) => with_auth(self.agent.post(&url), auth.as_deref()).send_json(body.unwrap_or(json!({}))),
            ("PUT", body) => with_auth(self.agent.put(&url), auth.as_deref()).send_json(body.unwrap_or(json!({}))),
            _ => panic!("unsupported method {method}"),
        };
        read(response.unwrap_or_else(|e| panic!("{method} {path}: {e}")))
    }

    /// A GET with `authorization` as the whole Authorization header.
    pub fn get_with_authorization(&self, path: &str, authorization: &str) -> (u16, Value) {
        let url = format!("{}{path}", self.url);
        read(self.agent.get(&url).header("Authorization", authorization).call().expect("GET"))
    }

    pub fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.request("GET", path, Some(token), None)
    }

    pub fn post(&self, path: &str, token: &str, body: Value) -> (u16, Value) {
        self.request("POST", path, Some(token), Some(body))
    }

    /// The Prometheus text of /metrics.
    pub fn metrics(&self) -> String {
        let mut response = self
            .agent
            .get(format!("{}/metrics", self.url))
            .header("Authorization", &format!("Bearer {ADMIN}"))
            .call()
            .expect("GET /metrics");
        assert_eq!(response.status(), 200);
        response.body_mut().read_to_string().expect("metrics text")
    }

    /// Uploads a module's bytes.
    pub fn push(&self, token: &str, name: &str, bytes: &[u8]) -> (u16, Value) {
        let response = self
            .agent
            .post(format!("{}/v1/modules", self.url))
            .query("name", name)
            .header("Authorization", &format!("Bearer {token}"))
            .header("Content-Type", "application/wasm")
            .send(bytes)
            .expect("POST /v1/modules");
        read(response)
    }

    /// Uploads a module's bytes that the host is expected to die while
    /// storing (a failpoint): true if no answer came.
    pub fn request_dies_with(&self, token: &str, name: &str, bytes: &[u8]) -> bool {
        self.agent
            .post(format!("{}/v1/modules", self.url))
            .query("name", name)
            .header("Authorization", &format!("Bearer {token}"))
            .header("Content-Type", "application/wasm")
            .send(bytes)
            .is_err()
    }

    /// Sends `head` (the request line and headers, without the blank line)
    /// and then `body` over a plain socket, half-closes it, and returns the
    /// status code and the whole response: for requests no well-behaved
    /// client sends.
    pub fn raw(&self, head: &str, body: &[u8]) -> (u16, String) {
        use std::io::{Read as _, Write as _};
        let mut socket = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        socket.set_read_timeout(Some(Duration::from_secs(60))).expect("read timeout");
        socket
            .write_all(format!("{head}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes())
            .expect("send head");
        // The server may answer (and close) before the body is sent.
        let _ = socket.write_all(body);
        let _ = socket.shutdown(std::net::Shutdown::Write);
        let mut response = Vec::new();
        if let Err(e) = socket.read_to_end(&mut response) {
            assert!(!response.is_empty(), "no response to {head:?}: {e}");
        }
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
        (status, text)
    }

    /// Creates a tenant (with an optional policy); returns its token.
    pub fn tenant(&self, name: &str, policy: Option<Value>) -> String {
        let mut body = json!({ "name": name });
        if let Some(policy) = policy {
            body["policy"] = policy;
        }
        let (status, created) = self.post("/v1/tenants", ADMIN, body);
        assert_eq!(status, 201, "{created}");
        created["token"].as_str().expect("token").to_owned()
    }

    /// Uploads the guest crate `guest` as `name`; returns its digest.
    pub fn push_guest(&self, token: &str, guest: &str) -> String {
        let bytes = std::fs::read(guests::guest(guest)).expect("guest bytes");
        let (status, module) = self.push(token, guest, &bytes);
        assert_eq!(status, 201, "{module}");
        module["digest"].as_str().expect("digest").to_owned()
    }

    /// Polls a job's status until `done` holds, or panics after `timeout`.
    pub fn wait_job(&self, token: &str, id: &str, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let (status, job) = self.get(&format!("/v1/jobs/{id}"), token);
            assert_eq!(status, 200, "{job}");
            if done(&job) {
                return job;
            }
            assert!(
                started.elapsed() < timeout,
                "job {id} never got there; last status {job:#}\nlog:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Polls an operation until it is no longer pending; returns it.
    pub fn wait_operation(&self, token: &str, operation: &Value) -> Value {
        let id = operation["id"].as_str().expect("operation id");
        let started = Instant::now();
        loop {
            let (_, now) = self.get(&format!("/v1/operations/{id}"), token);
            if now["state"] != "pending" {
                return now;
            }
            assert!(started.elapsed() < Duration::from_secs(120), "operation {id} still pending");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn with_auth<B>(request: ureq::RequestBuilder<B>, auth: Option<&str>) -> ureq::RequestBuilder<B> {
    match auth {
        Some(auth) => request.header("Authorization", auth),
        None => request,
    }
}

fn read(mut response: ureq::http::Response<ureq::Body>) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    let value = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
    (status, value)
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill9();
    }
}
