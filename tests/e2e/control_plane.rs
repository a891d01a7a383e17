//! No client can starve the shared host's control plane: a tenant's
//! requests in flight, and its upload bytes, are bounded by its policy and
//! the excess refused at once (429 with `Retry-After`), so other tenants,
//! the admin and `/healthz` are answered while it holds its share; and
//! connections that send nothing, or sit idle, are closed.
//!
//! Before: 300 slow uploads of one tenant held the API's one global limit
//! (256 requests, which also covered `/healthz`), and every other caller
//! waited behind them; connections that never sent a byte stayed open.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::host::{ADMIN, Host};
use crate::support;

/// An agent whose calls give up after `timeout` (the host's own agent waits
/// two minutes).
fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(timeout)).build().into()
}

/// GET `path` with `token` through `agent`: the status, or the error.
fn get(agent: &ureq::Agent, host: &Host, path: &str, token: &str) -> Result<u16, String> {
    agent
        .get(format!("{}{path}", host.url))
        .header("Authorization", &format!("Bearer {token}"))
        .call()
        .map(|response| response.status().as_u16())
        .map_err(|e| e.to_string())
}

/// An upload that sends its headers and a few bytes of a body it says is
/// 100 kB long, then nothing.
fn slow_upload(host: &Host, token: &str) -> TcpStream {
    let mut socket = TcpStream::connect(("127.0.0.1", host.port())).expect("connect");
    let head = format!(
        "POST /v1/modules?name=slow HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/wasm\r\nContent-Length: 100000\r\n\r\n\0asm"
    );
    socket.write_all(head.as_bytes()).expect("send the upload's head");
    socket
}

/// What the server has sent on `socket` so far (waiting at most `wait`).
fn answered(socket: &mut TcpStream, wait: Duration) -> String {
    socket.set_read_timeout(Some(wait)).expect("read timeout");
    let mut buffer = [0u8; 4096];
    match socket.read(&mut buffer) {
        Ok(n) => String::from_utf8_lossy(&buffer[..n]).into_owned(),
        Err(_) => String::new(),
    }
}

#[test]
fn a_tenant_holding_slow_uploads_slows_no_one_else() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::start(&brokers, dir.path());
    let greedy = host.tenant(&support::tenant_name("greedy"), None);
    let other = host.tenant(&support::tenant_name("other"), None);
    let share = host.get("/v1/whoami", &greedy).1["policy"]["max-requests"].as_u64().expect("max-requests");

    let mut slow: Vec<TcpStream> = (0..300).map(|_| slow_upload(&host, &greedy)).collect();
    // Once its share is held, the greedy tenant's next call is refused at
    // once (before, it waited behind the uploads, as every call did).
    let quick = agent(Duration::from_secs(30));
    let started = Instant::now();
    loop {
        match get(&quick, &host, "/v1/whoami", &greedy) {
            Ok(429) => break,
            Ok(_) => {}
            Err(e) => panic!("the greedy tenant's own call was not answered: {e}"),
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the greedy tenant's share never filled");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Everyone else is answered meanwhile.
    assert_eq!(get(&quick, &host, "/v1/jobs", &other), Ok(200), "another tenant's call");
    assert_eq!(get(&quick, &host, "/v1/tenants", ADMIN), Ok(200), "the admin's call");
    let health = quick.get(format!("{}/healthz", host.url)).call().map(|r| r.status().as_u16());
    assert_eq!(health.map_err(|e| e.to_string()), Ok(200), "/healthz");

    // The uploads past its share were refused at once, with Retry-After.
    let answers: Vec<String> = slow.iter_mut().map(|s| answered(s, Duration::from_millis(50))).collect();
    let refused = answers.iter().filter(|a| a.starts_with("HTTP/1.1 429")).count();
    let held = answers.iter().filter(|a| a.is_empty()).count();
    assert!(held as u64 <= share, "{held} uploads held, but the share is {share}");
    assert_eq!(refused + held, 300, "every upload was refused or held: {answers:?}");
    let sample = answers.iter().find(|a| a.starts_with("HTTP/1.1 429")).expect("a refusal");
    assert!(sample.to_ascii_lowercase().contains("retry-after: 1"), "{sample}");
    assert!(sample.contains("max-requests"), "the refusal names the policy's field: {sample}");

    // Once they are gone, its share is its own again.
    drop(slow);
    let started = Instant::now();
    while get(&quick, &host, "/v1/whoami", &greedy) != Ok(200) {
        assert!(started.elapsed() < Duration::from_secs(60), "the greedy tenant's share never came back");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Upload bytes in flight are bounded too: two uploads that each say
    // they are 600 kB, under a policy of 1 MiB in flight.
    let tenant = support::tenant_name("bytes");
    let mut policy = host.get("/v1/whoami", &greedy).1["policy"].clone();
    policy["topic-prefixes"] = json!([format!("{tenant}.")]);
    policy["max-upload-bytes"] = json!("1MiB");
    let token = host.tenant(&tenant, Some(policy));
    let head = format!(
        "POST /v1/modules?name=big HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/wasm\r\nContent-Length: 600000\r\n\r\n\0asm"
    );
    let send = || {
        let mut upload = TcpStream::connect(("127.0.0.1", host.port())).expect("connect");
        upload.write_all(head.as_bytes()).expect("an upload's head");
        upload
    };
    // The two connections are served concurrently, so the second may be
    // admitted before the first: then the first is the one refused, and
    // the second is held in its place.
    let mut first = send();
    let started = Instant::now();
    let refusal = loop {
        let mut second = send();
        let answer = answered(&mut second, Duration::from_secs(10));
        if answer.starts_with("HTTP/1.1 429") {
            break answer;
        }
        assert!(answer.is_empty(), "the second upload was answered: {answer}");
        let first_answer = answered(&mut first, Duration::from_millis(50));
        assert!(first_answer.starts_with("HTTP/1.1 429"), "both uploads were held: {first_answer}");
        assert!(started.elapsed() < Duration::from_secs(60), "the second upload was never refused");
        first = second;
    };
    assert!(refusal.contains("max-upload-bytes"), "{refusal}");
    assert!(answered(&mut first, Duration::from_millis(50)).is_empty(), "the first upload is still received");

    // An upload that could never fit the share is too large, not "try
    // again"; and the admin, who has no modules, is told so (both were 429).
    let mut huge = TcpStream::connect(("127.0.0.1", host.port())).expect("connect");
    huge.write_all(head.replace("600000", "2000000").as_bytes()).expect("a huge upload");
    let answer = answered(&mut huge, Duration::from_secs(30));
    assert!(answer.starts_with("HTTP/1.1 413") && answer.contains("max-upload-bytes"), "{answer}");
    let mut admins = TcpStream::connect(("127.0.0.1", host.port())).expect("connect");
    admins.write_all(head.replace(&token, ADMIN).as_bytes()).expect("the admin's upload");
    let answer = answered(&mut admins, Duration::from_secs(30));
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
}

#[test]
fn silent_and_idle_connections_are_closed_and_open_ones_are_capped() {
    let brokers = support::brokers();
    let dir = tempfile::tempdir().expect("temp dir");
    let args = ["--header-read-timeout", "5s", "--max-connections", "40"];
    let host = Host::start_with_args(&brokers, dir.path(), &[], &args);
    let connect = || {
        let socket = TcpStream::connect(("127.0.0.1", host.port())).expect("connect");
        socket.set_read_timeout(Some(Duration::from_secs(90))).expect("read timeout");
        socket
    };
    // Closed by the server: a read ends (0 bytes, or a reset), where a
    // connection left open would wait out the read timeout.
    let closed = |socket: &mut TcpStream| {
        let mut buffer = [0u8; 1024];
        loop {
            match socket.read(&mut buffer) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return false;
                }
                Err(_) => return true,
            }
        }
    };

    // Connections that never send a byte.
    let mut silent: Vec<TcpStream> = (0..20).map(|_| connect()).collect();
    for (i, socket) in silent.iter_mut().enumerate() {
        assert!(closed(socket), "silent connection {i} is still open after 90 s");
    }

    // A keep-alive connection after its answer.
    let mut idle = connect();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").expect("request");
    let mut answer = [0u8; 256];
    let n = idle.read(&mut answer).expect("answer");
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"), "the request was answered");
    assert!(closed(&mut idle), "an idle keep-alive connection is still open after 90 s");

    // Past the cap, a connection is closed as soon as it is accepted: its
    // request gets no answer (before, it was served).
    let mut open: Vec<TcpStream> = (0..40).map(|_| connect()).collect();
    let mut extra = connect();
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let mut response = Vec::new();
    let _ = extra.read_to_end(&mut response);
    assert!(response.is_empty(), "the 41st connection was served: {}", String::from_utf8_lossy(&response));
    // The held ones close at their header timeout, and then the host serves again.
    for socket in &mut open {
        assert!(closed(socket), "a connection within the cap is still open after 90 s");
    }
    let health = agent(Duration::from_secs(30)).get(format!("{}/healthz", host.url)).call();
    assert_eq!(health.map(|r| r.status().as_u16()).map_err(|e| e.to_string()), Ok(200));
}
