//! `sluice serve`: the long-running shared host.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

use sluice::service::{LogHub, Service, ServiceConfig};
use sluice::units;

/// Arguments of `sluice serve`.
#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// Address of the HTTP API.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Where metadata (redb), module bytes, compiled modules and job state live.
    #[arg(long, default_value = ".sluice/serve")]
    data_dir: PathBuf,
    /// The Kafka cluster every job uses.
    #[arg(long, default_value = "127.0.0.1:9092", env = "SLUICE_BROKERS")]
    brokers: String,
    /// A file holding the admin token (at least 16 characters). Default:
    /// the environment variable SLUICE_ADMIN_TOKEN, else DATA_DIR/admin-token,
    /// created at the first start. Never a command-line value: anyone on
    /// the machine can read a process's arguments.
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// The largest module upload accepted.
    #[arg(long, default_value = "64MiB", value_parser = units::parse_size)]
    max_module_size: usize,
    /// Guest instances (tasks) the host may run at once.
    #[arg(long, default_value_t = 1000)]
    max_tasks: u32,
    /// Join cluster NAME: hosts started with the same name and brokers
    /// share tenants, modules and jobs through Kafka. Every member needs
    /// the cluster's admin token. Without it the host runs alone.
    #[arg(long, value_name = "NAME", env = "SLUICE_CLUSTER")]
    cluster: Option<String>,
    /// API connections open at once: one more is closed as soon as it is
    /// accepted.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// How long an API connection may take to send a request's headers,
    /// from when it opened or answered its last request: also how long an
    /// idle connection stays open.
    #[arg(long, default_value = "20s", value_parser = units::parse_duration)]
    header_read_timeout: std::time::Duration,
    /// Serve the API over TLS with this PEM certificate chain (the server's
    /// certificate first); needs --tls-key. Both files are read again when
    /// either changes, so a renewed certificate needs no restart.
    #[arg(long, value_name = "FILE", requires = "tls_key", env = "SLUICE_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert", env = "SLUICE_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Compile a module this host has not compiled before with Cranelift
    /// before its upload answers, instead of starting its jobs on Winch's
    /// baseline code while Cranelift compiles it in the background.
    #[arg(long, env = "SLUICE_NO_BASELINE")]
    no_baseline: bool,
}

pub(crate) fn serve(args: ServeArgs, logs: LogHub) -> Result<()> {
    // The data directory holds the admin token, tenants' modules and state:
    // other local users get no access to it.
    {
        use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&args.data_dir)
            .with_context(|| format!("creating {}", args.data_dir.display()))?;
        std::fs::set_permissions(&args.data_dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("restricting {} to its owner", args.data_dir.display()))?;
    }
    let admin_token = match (args.admin_token_file, std::env::var("SLUICE_ADMIN_TOKEN")) {
        (Some(path), _) => std::fs::read_to_string(&path)
            .with_context(|| format!("reading the admin token from {}", path.display()))?
            .trim()
            .to_owned(),
        (None, Ok(token)) => token,
        (None, Err(_)) => admin_token_file(&args.data_dir)?,
    };
    let config = ServiceConfig {
        data_dir: args.data_dir,
        brokers: args.brokers,
        admin_token,
        max_module_bytes: args.max_module_size,
        max_instances: args.max_tasks,
        cluster: args.cluster,
        baseline: !args.no_baseline,
    };
    let max_module_bytes = config.max_module_bytes;
    // Refused before anything starts: a host that cannot serve its
    // certificate must not come up on plain HTTP.
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some(sluice::api::tls::Tls::load(sluice::api::tls::TlsFiles { cert, key })?),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let service = Service::open(config, logs)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        eprintln!("sluice: serving the API on {scheme}://{}", listener.local_addr()?);
        let app = sluice::api::router(Arc::clone(&service), max_module_bytes);
        let limits = sluice::api::server::ServerLimits {
            max_connections: args.max_connections as usize,
            header_read_timeout: args.header_read_timeout,
        };
        sluice::api::server::serve(listener, app, limits, tls, shutdown_signal()).await.context("serving the API")
    })?;
    eprintln!("sluice: stopping every job after a final checkpoint");
    service.shutdown();
    Ok(())
}

/// The admin token kept in the data directory, created (readable by the
/// owner only) at the first start.
fn admin_token_file(data_dir: &std::path::Path) -> Result<String> {
    let path = data_dir.join("admin-token");
    match std::fs::read_to_string(&path) {
        Ok(token) => return Ok(token.trim().to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness for the admin token: {e}"))?;
    let token: String = hex::encode(bytes);
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(file, "{token}").with_context(|| format!("writing {}", path.display()))?;
    eprintln!("sluice: created the admin token in {}", path.display());
    Ok(token)
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
