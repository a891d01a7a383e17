//! The CLI verbs that talk to a running `sluice serve` over its HTTP API:
//! `tenant`, `module`, `job` and `logs`. Each mirrors an API call; `--format
//! json` prints the API's JSON as is.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sluice::units;

use super::{progress, table};

/// Where the host is and who is calling.
#[derive(clap::Args)]
pub(crate) struct Connection {
    /// The host's API.
    #[arg(long, global = true, env = "SLUICE_SERVER", default_value = "http://127.0.0.1:7070")]
    server: String,
    /// A bearer token: a tenant's, or the admin's for `tenant` commands.
    #[arg(long, global = true, env = "SLUICE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// How to print results.
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Trust only the CA certificates in this PEM file for an https
    /// server (a host whose certificate a private CA signed); default:
    /// Mozilla's root certificates.
    #[arg(long, global = true, value_name = "FILE", env = "SLUICE_CA_CERT")]
    ca_cert: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
}

/// `sluice tenant ...` (admin token).
#[derive(clap::Subcommand)]
pub(crate) enum TenantCommand {
    /// Create a tenant and print its token (shown only once).
    Create {
        /// 1-40 lowercase letters, digits or `-`.
        name: String,
        /// Allowed topic prefix; repeat for more. Default: `NAME.`.
        #[arg(long = "topic-prefix")]
        topic_prefixes: Vec<String>,
        /// Jobs the tenant may have.
        #[arg(long)]
        max_jobs: Option<u32>,
    },
    /// List tenants.
    List,
    /// Give a tenant a new token; the old one stops working.
    RotateToken {
        /// The tenant.
        name: String,
    },
}

/// `sluice module ...`.
#[derive(clap::Subcommand)]
pub(crate) enum ModuleCommand {
    /// Upload a component; the host validates and compiles it first.
    Push {
        /// The .wasm file.
        file: PathBuf,
        /// A name for it (default: the file's stem).
        #[arg(long)]
        name: Option<String>,
    },
    /// List your modules.
    List,
    /// Delete a module no job uses.
    Delete {
        /// Digest, digest prefix or name.
        module: String,
    },
}

/// `sluice job ...`.
#[derive(clap::Subcommand)]
pub(crate) enum JobCommand {
    /// Create and start a job from a spec (JSON, or a TOML job file). A
    /// `module` naming a local file is uploaded first.
    Create {
        /// The spec file.
        spec: PathBuf,
    },
    /// List your jobs.
    List,
    /// One job's status and figures.
    Status {
        /// The job id.
        id: String,
    },
    /// Stop a job after a final checkpoint (a savepoint: resume continues from it).
    Stop {
        /// The job id.
        id: String,
        /// Accepted for familiarity: every stop takes a final checkpoint.
        #[arg(long)]
        savepoint: bool,
        /// Return at once instead of waiting for the job to stop.
        #[arg(long)]
        no_wait: bool,
    },
    /// Start a stopped or failed job from its last checkpoint.
    Resume {
        /// The job id.
        id: String,
    },
    /// Move a stopped job's input positions, to reprocess (or skip) records;
    /// `resume` then starts it there.
    Reset {
        /// The job id.
        id: String,
        /// `earliest`, `latest`, or a time (milliseconds since the Unix
        /// epoch, or RFC 3339 such as 2026-12-01T10:00:00Z).
        #[arg(long)]
        to: String,
        /// Keep the state: the reprocessed records apply over it. Event time is
        /// state too: each shard keeps its watermark and timers, so records
        /// older than the watermark arrive late (windows that fired stay closed).
        #[arg(long, conflicts_with = "clear_state", required_unless_present = "clear_state")]
        keep_state: bool,
        /// Clear the state: the job starts from empty state and fresh event time.
        #[arg(long)]
        clear_state: bool,
    },
    /// Move a job to another module, keeping its state.
    Upgrade {
        /// The job id.
        id: String,
        /// Digest, name, or a local .wasm file (uploaded first).
        module: String,
        /// Return at once instead of waiting for the upgrade.
        #[arg(long)]
        no_wait: bool,
    },
    /// Change a job's parallelism, keeping its state: it stops with a final
    /// checkpoint and starts again with its shards spread over the new
    /// number of tasks.
    Scale {
        /// The job id.
        id: String,
        /// The number of tasks.
        parallelism: u32,
        /// Return at once instead of waiting for the job to restart.
        #[arg(long)]
        no_wait: bool,
    },
    /// Delete a stopped job, its state and its consumer group.
    Delete {
        /// The job id.
        id: String,
    },
}

/// `sluice logs`.
#[derive(clap::Args)]
pub(crate) struct LogsArgs {
    /// The job id.
    id: String,
    /// Keep printing new lines.
    #[arg(long, short)]
    follow: bool,
}

struct Client {
    agent: ureq::Agent,
    server: String,
    token: Option<String>,
}

impl Client {
    fn new(connection: &Connection) -> Result<Client> {
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(path) = &connection.ca_cert {
            let pem = std::fs::read(path).with_context(|| format!("reading --ca-cert {}", path.display()))?;
            let certs = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(cert)) => Some(Ok(cert)),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                })
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("reading --ca-cert {}", path.display()))?;
            if certs.is_empty() {
                bail!("--ca-cert {} holds no PEM certificate", path.display());
            }
            tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&certs));
        }
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(600)))
            .tls_config(tls.build())
            .build()
            .into();
        let server = connection.server.trim_end_matches('/').to_owned();
        Ok(Client { agent, server, token: connection.token.clone() })
    }

    fn auth(&self) -> Result<String> {
        match &self.token {
            Some(token) => Ok(format!("Bearer {token}")),
            None => bail!("no token: pass --token or set SLUICE_TOKEN"),
        }
    }

    fn finish(&self, what: &str, response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<Value> {
        let mut response = response.with_context(|| format!("{what}: cannot reach {}", self.server))?;
        let status = response.status();
        let text = response.body_mut().read_to_string().with_context(|| format!("{what}: reading the response"))?;
        if !status.is_success() {
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or(text);
            bail!("{what}: {status}: {message}");
        }
        if text.is_empty() {
            Ok(Value::Null)
        } else {
            serde_json::from_str(&text).with_context(|| format!("{what}: bad JSON"))
        }
    }

    /// Sends a request built by `send`, again after `Retry-After` while the
    /// host refuses it for the caller's share of requests in flight (429: it
    /// did nothing with it), a few times at most.
    fn with_retries(
        &self,
        send: impl Fn() -> Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        const TRIES: u32 = 5;
        let mut tries = 1;
        loop {
            let response = send()?;
            if response.status() != ureq::http::StatusCode::TOO_MANY_REQUESTS || tries == TRIES {
                return Ok(response);
            }
            let wait = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
                .unwrap_or(1)
                .clamp(1, 30);
            std::thread::sleep(Duration::from_secs(wait));
            tries += 1;
        }
    }

    fn get(&self, path: &str) -> Result<Value> {
        let auth = self.auth()?;
        let response = self
            .with_retries(|| self.agent.get(format!("{}{path}", self.server)).header("Authorization", &auth).call());
        self.finish(&format!("GET {path}"), response)
    }

    fn delete(&self, path: &str) -> Result<Value> {
        let auth = self.auth()?;
        let response = self
            .with_retries(|| self.agent.delete(format!("{}{path}", self.server)).header("Authorization", &auth).call());
        self.finish(&format!("DELETE {path}"), response)
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let auth = self.auth()?;
        let response = self.with_retries(|| {
            self.agent.post(format!("{}{path}", self.server)).header("Authorization", &auth).send_json(body)
        });
        self.finish(&format!("POST {path}"), response)
    }

    fn push(&self, file: &Path, name: Option<&str>) -> Result<Value> {
        let opened = std::fs::File::open(file).with_context(|| format!("reading {}", file.display()))?;
        let len = opened.metadata().with_context(|| format!("reading {}", file.display()))?.len();
        let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned());
        let name = name.map(str::to_owned).or(stem).unwrap_or_default();
        let upload = progress::Upload::new(
            opened,
            len,
            format!("uploading {name}"),
            format!("the host validates and compiles {name}"),
        );
        let bar = upload.bar();
        let response = self
            .agent
            .post(format!("{}/v1/modules", self.server))
            .query("name", &name)
            .header("Authorization", &self.auth()?)
            .header("Content-Type", "application/wasm")
            .header("Content-Length", len.to_string())
            .send(ureq::SendBody::from_owned_reader(upload));
        bar.finish_and_clear();
        self.finish(&format!("uploading {}", file.display()), response)
    }

    /// Polls an operation until it is no longer pending, showing `doing`
    /// meanwhile.
    fn wait(&self, operation: &Value, doing: String) -> Result<Value> {
        let id = operation.get("id").and_then(Value::as_str).context("the response has no operation id")?;
        let _spinner = progress::spinner(doing);
        loop {
            let now = self.get(&format!("/v1/operations/{id}"))?;
            match now.get("state").and_then(Value::as_str) {
                Some("pending") => std::thread::sleep(Duration::from_millis(250)),
                Some("failed") => {
                    bail!("{}", now.get("error").and_then(Value::as_str).unwrap_or("the operation failed"))
                }
                _ => return Ok(now),
            }
        }
    }
}

fn print(format: Format, value: &Value, text: impl FnOnce(&Value) -> String) -> Result<()> {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Format::Text => println!("{}", text(value)),
    }
    Ok(())
}

fn field<'a>(value: &'a Value, name: &str) -> &'a str {
    value.get(name).and_then(Value::as_str).unwrap_or("-")
}

fn number(value: &Value, name: &str) -> String {
    value.get(name).map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

fn job_line(job: &Value) -> String {
    let reason = job.get("reason").and_then(Value::as_str).map(|r| format!("  ({r})")).unwrap_or_default();
    format!(
        "{:<24} {:<10} in {:>10}  out {:>10}  lag {:>8}  checkpoint {:>6}  restarts {:>3}  dead letters {:>3}{reason}",
        field(job, "id"),
        field(job, "state"),
        number(job, "records_in"),
        number(job, "records_out"),
        number(job, "lag_records"),
        number(job, "last_checkpoint"),
        number(job, "restarts"),
        number(job, "dead_letters"),
    )
}

/// A figure of `value` as a short count (`12.3k`), or `-`.
fn short(value: &Value, name: &str) -> String {
    value.get(name).and_then(Value::as_u64).map_or_else(|| "-".into(), units::count)
}

/// A byte figure of `value` in binary units, or `-`.
fn size(value: &Value, name: &str) -> String {
    value.get(name).and_then(Value::as_f64).map_or_else(|| "-".into(), units::bytes)
}

/// CPU seconds of `value`, or `-`.
fn cpu(value: &Value) -> String {
    value.get("cpu_seconds").and_then(Value::as_f64).map_or_else(|| "-".into(), |s| format!("{s:.1} s"))
}

/// The last checkpoint's age, or `-` when there is none yet.
fn checkpoint_age(job: &Value) -> String {
    job.get("last_checkpoint_age_seconds")
        .and_then(Value::as_f64)
        .map_or_else(|| "-".into(), |s| format!("{} ago", units::age(s)))
}

/// `sluice job list`: one row per job.
fn jobs_table(jobs: &[Value]) -> String {
    let mut table = table::Table::new(vec![
        table::text("JOB"),
        table::text("STATE"),
        table::figure("IN"),
        table::figure("OUT"),
        table::figure("LAG"),
        table::figure("CHECKPOINT"),
        table::figure("RESTARTS"),
        table::figure("DEAD LETTERS"),
        table::text("REASON"),
    ]);
    for job in jobs {
        table.row(vec![
            field(job, "id").into(),
            field(job, "state").into(),
            short(job, "records_in"),
            short(job, "records_out"),
            short(job, "lag_records"),
            checkpoint_age(job),
            number(job, "restarts"),
            number(job, "dead_letters"),
            job.get("reason").and_then(Value::as_str).unwrap_or("").into(),
        ]);
    }
    table.render()
}

/// `sluice job status`: the job's figures, then its tasks and shards.
fn status_text(job: &Value) -> String {
    let mut text = format!("job {}: {}", field(job, "id"), field(job, "state"));
    if let Some(reason) = job.get("reason").and_then(Value::as_str) {
        text.push_str(&format!("\n  reason: {reason}"));
    }
    let digest = field(job, "module");
    let up = job.get("uptime_seconds").and_then(Value::as_f64).map_or_else(|| "-".into(), units::age);
    text.push_str(&format!(
        "\n  module {}, up {up}, CPU {}, state {}",
        digest.get(..12).unwrap_or(digest),
        cpu(job),
        size(job, "state_bytes")
    ));
    text.push_str(&format!(
        "\n  records in {}, out {}, lag {}; dead letters {}, restarts {}",
        short(job, "records_in"),
        short(job, "records_out"),
        short(job, "lag_records"),
        number(job, "dead_letters"),
        number(job, "restarts")
    ));
    match job.get("last_checkpoint_age_seconds").and_then(Value::as_f64) {
        Some(_) => text.push_str(&format!(
            "\n  last checkpoint #{}, {}, took {} ({} checkpoints)",
            number(job, "last_checkpoint"),
            checkpoint_age(job),
            units::work(job.get("last_checkpoint_seconds").and_then(Value::as_f64).unwrap_or_default()),
            short(job, "checkpoints")
        )),
        None => text.push_str("\n  no checkpoint yet"),
    }
    if job["late_records"].as_u64().is_some_and(|n| n > 0) || job["timers_fired"].as_u64().is_some_and(|n| n > 0) {
        text.push_str(&format!(
            "\n  event time: {} late records, {} timers fired",
            short(job, "late_records"),
            short(job, "timers_fired")
        ));
    }
    let restored = job["restored_records"].as_u64().unwrap_or(0);
    if restored > 0 {
        text.push_str(&format!(
            "\n  restored {} records ({}) in {}",
            units::count(restored),
            size(job, "restored_bytes"),
            units::work(job["restore_seconds"].as_f64().unwrap_or_default())
        ));
    }

    let tasks = job["tasks"].as_array().map(Vec::as_slice).unwrap_or_default();
    if !tasks.is_empty() {
        let mut table = table::Table::new(vec![
            table::figure("TASK"),
            table::text("HOST"),
            table::text("PHASE"),
            table::figure("IN"),
            table::figure("OUT"),
            table::figure("LAG"),
            table::figure("CPU"),
            table::figure("STATE"),
            table::text("TRANSACTION"),
        ]);
        let mut errors = Vec::new();
        for task in tasks {
            let transaction = match task.get("transaction").filter(|t| !t.is_null()) {
                Some(t) => format!(
                    "open {} of {}",
                    units::age(t["open_seconds"].as_f64().unwrap_or_default()),
                    units::age(t["timeout_seconds"].as_f64().unwrap_or_default())
                ),
                None => "none".into(),
            };
            table.row(vec![
                number(task, "index"),
                task.get("host").and_then(Value::as_str).unwrap_or("here").into(),
                field(task, "phase").into(),
                short(task, "records_in"),
                short(task, "records_out"),
                short(task, "lag_records"),
                cpu(task),
                size(task, "state_bytes"),
                transaction,
            ]);
            if let Some(error) = task.get("last_error").and_then(Value::as_str) {
                errors.push(format!("task {}: {error}", number(task, "index")));
            }
        }
        text.push_str("\n\n");
        text.push_str(&table.render());
        for error in errors {
            text.push_str(&format!("\nlast error of {error}"));
        }
    }

    let shards = job["shards"].as_array().map(Vec::as_slice).unwrap_or_default();
    if !shards.is_empty() {
        let mut table = table::Table::new(vec![
            table::figure("SHARD"),
            table::figure("TASK"),
            table::figure("KEYS"),
            table::figure("BYTES"),
            table::figure("CHECKPOINT"),
            table::text("WATERMARK"),
            table::text("STATE FROM"),
        ]);
        for shard in shards {
            let origin = &shard["origin"];
            let origin = match origin["from"].as_str() {
                Some("changelog") => format!(
                    "changelog ({} records in {})",
                    short(origin, "records"),
                    units::work(origin["seconds"].as_f64().unwrap_or_default())
                ),
                _ => "local store".into(),
            };
            table.row(vec![
                number(shard, "shard"),
                number(shard, "task"),
                short(shard, "keys"),
                size(shard, "bytes"),
                shard["last_checkpoint"].as_u64().map_or_else(|| "-".into(), |c| format!("#{c}")),
                shard["watermark"].as_i64().map_or_else(|| "-".into(), watermark_text),
                origin,
            ]);
        }
        text.push_str("\n\n");
        text.push_str(&table.render());
    }
    text
}

fn module_line(module: &Value) -> String {
    format!(
        "{}  {:<24} {:>10} bytes  {}",
        field(module, "digest"),
        field(module, "name"),
        number(module, "size"),
        module.get("language").and_then(Value::as_str).unwrap_or("language not recorded")
    )
}

pub(crate) fn tenant(connection: Connection, command: TenantCommand) -> Result<()> {
    let client = Client::new(&connection)?;
    match command {
        TenantCommand::Create { name, topic_prefixes, max_jobs } => {
            let mut body = json!({ "name": name });
            if !topic_prefixes.is_empty() || max_jobs.is_some() {
                // Start from the default policy the host would give.
                let mut policy = serde_json::to_value(sluice::service::Policy::default_for(&name))?;
                if !topic_prefixes.is_empty() {
                    policy["topic-prefixes"] = json!(topic_prefixes);
                }
                if let Some(max) = max_jobs {
                    policy["max-jobs"] = json!(max);
                }
                body["policy"] = policy;
            }
            let created = client.post("/v1/tenants", &body)?;
            print(connection.format, &created, |v| {
                format!(
                    "tenant {} created; its token (shown only now):\n{}",
                    field(&v["tenant"], "name"),
                    field(v, "token")
                )
            })
        }
        TenantCommand::List => {
            let tenants = client.get("/v1/tenants")?;
            print(connection.format, &tenants, |v| {
                let rows = v.as_array().map(Vec::as_slice).unwrap_or_default();
                rows.iter()
                    .map(|t| format!("{:<20} prefixes {}", field(t, "name"), t["policy"]["topic-prefixes"]))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        }
        TenantCommand::RotateToken { name } => {
            let rotated = client.post(&format!("/v1/tenants/{name}/token"), &json!({}))?;
            print(connection.format, &rotated, |v| format!("new token for {name}:\n{}", field(v, "token")))
        }
    }
}

pub(crate) fn module(connection: Connection, command: ModuleCommand) -> Result<()> {
    let client = Client::new(&connection)?;
    match command {
        ModuleCommand::Push { file, name } => {
            let module = client.push(&file, name.as_deref())?;
            print(connection.format, &module, module_line)
        }
        ModuleCommand::List => {
            let modules = client.get("/v1/modules")?;
            print(connection.format, &modules, |v| {
                v.as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .map(module_line)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        }
        ModuleCommand::Delete { module } => {
            client.delete(&format!("/v1/modules/{module}"))?;
            print(connection.format, &json!({ "deleted": module }), |_| format!("deleted {module}"))
        }
    }
}

/// Reads a spec file (JSON, or TOML in the job-file format) into JSON,
/// uploading `module` first when it names a local file.
fn read_spec(client: &Client, path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut spec: Value = if path.extension().is_some_and(|e| e == "toml") {
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
    } else {
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
    };
    let base = path.parent().unwrap_or(Path::new("."));
    if let Some(module) = spec.get("module").and_then(Value::as_str).map(|m| base.join(m))
        && module.is_file()
    {
        let pushed = client.push(&module, None)?;
        spec["module"] = pushed["digest"].clone();
    }
    Ok(spec)
}

pub(crate) fn job(connection: Connection, command: JobCommand) -> Result<()> {
    let client = Client::new(&connection)?;
    let format = connection.format;
    match command {
        JobCommand::Create { spec } => {
            let body = read_spec(&client, &spec)?;
            let job = client.post("/v1/jobs", &body)?;
            print(format, &job, job_line)
        }
        JobCommand::List => {
            let jobs = client.get("/v1/jobs")?;
            print(format, &jobs, |v| jobs_table(v.as_array().map(Vec::as_slice).unwrap_or_default()))
        }
        JobCommand::Status { id } => {
            let job = client.get(&format!("/v1/jobs/{id}"))?;
            print(format, &job, status_text)
        }
        JobCommand::Stop { id, savepoint: _, no_wait } => {
            let operation = client.post(&format!("/v1/jobs/{id}/stop"), &json!({}))?;
            let operation = if no_wait {
                operation
            } else {
                client.wait(&operation, format!("stopping {id}: its tasks take a final checkpoint"))?
            };
            print(format, &operation, |v| format!("stop of {id}: {}", field(v, "state")))
        }
        JobCommand::Resume { id } => {
            let job = client.post(&format!("/v1/jobs/{id}/resume"), &json!({}))?;
            print(format, &job, job_line)
        }
        JobCommand::Reset { id, to, keep_state, clear_state: _ } => {
            let state = if keep_state { "keep" } else { "clear" };
            let job = client.post(&format!("/v1/jobs/{id}/reset"), &json!({ "to": to, "state": state }))?;
            print(format, &job, |_| format!("reset {id} to {to} ({state} state); `sluice job resume {id}` starts it"))
        }
        JobCommand::Upgrade { id, module, no_wait } => {
            let module = if Path::new(&module).is_file() {
                client.push(Path::new(&module), None)?["digest"].as_str().unwrap_or_default().to_owned()
            } else {
                module
            };
            let operation = client.post(&format!("/v1/jobs/{id}/upgrade"), &json!({ "module": module }))?;
            let operation = if no_wait {
                operation
            } else {
                client.wait(&operation, format!("upgrading {id}: a final checkpoint, then the new module starts"))?
            };
            print(format, &operation, |v| format!("upgrade of {id} to {module}: {}", field(v, "state")))
        }
        JobCommand::Scale { id, parallelism, no_wait } => {
            let operation = client.post(&format!("/v1/jobs/{id}/scale"), &json!({ "parallelism": parallelism }))?;
            let operation = if no_wait {
                operation
            } else {
                client.wait(
                    &operation,
                    format!("scaling {id} to {parallelism} tasks: a final checkpoint, then a restart"),
                )?
            };
            print(format, &operation, |v| format!("scale of {id} to {parallelism} tasks: {}", field(v, "state")))
        }
        JobCommand::Delete { id } => {
            client.delete(&format!("/v1/jobs/{id}"))?;
            print(format, &json!({ "deleted": id }), |_| format!("deleted {id}"))
        }
    }
}

pub(crate) fn logs(connection: Connection, args: LogsArgs) -> Result<()> {
    let client = Client::new(&connection)?;
    let mut after = 0u64;
    loop {
        let lines = client.get(&format!("/v1/jobs/{}/logs?after={after}&limit=1000", args.id))?;
        let lines = lines.as_array().map(Vec::as_slice).unwrap_or_default();
        for line in lines {
            match connection.format {
                Format::Json => println!("{line}"),
                Format::Text => println!(
                    "{} task {} {:<6} {:<5} {}",
                    number(line, "time_ms"),
                    field(line, "task"),
                    field(line, "source"),
                    field(line, "level"),
                    field(line, "message")
                ),
            }
            after = line.get("seq").and_then(Value::as_u64).unwrap_or(after);
        }
        if !args.follow {
            return Ok(());
        }
        if lines.is_empty() {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// A watermark (ms since the Unix epoch) as RFC 3339 UTC, or the number
/// before 1970.
fn watermark_text(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) => {
            humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
        }
        Err(_) => ms.to_string(),
    }
}
