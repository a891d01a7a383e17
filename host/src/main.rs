//! The `sluice` command line. The only place that uses `anyhow`: everything
//! below it returns typed errors.

use std::io::{BufReader, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

mod cli;

use sluice::runtime::{InstanceLimits, Runtime, RuntimeConfig};
use sluice::state::TaskState;
use sluice::units;

/// Exactly-once Kafka pipelines whose transforms are WebAssembly components.
#[derive(Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a transform locally over JSON-lines records and print its outputs.
    ///
    /// Each input line is a JSON object: {"key": ..., "value": ..., "headers": {...},
    /// "timestamp": ms, "topic": ..., "partition": n, "offset": n}, every field optional.
    /// Outputs are printed one JSON object per line: {"key": ..., "value": ...}.
    Exec(ExecArgs),
    /// Run a job from a job file: Kafka -> transform -> Kafka, exactly once.
    ///
    /// Runs until Ctrl-C or SIGTERM, then takes a final checkpoint and stops. After a crash,
    /// running it again resumes from the last checkpoint committed in Kafka.
    Run(cli::run::RunArgs),
    /// The newcomer demo: generate clicks, count them per user exactly once, show the result.
    Demo(cli::demo::DemoArgs),
}

#[derive(clap::Args)]
struct ExecArgs {
    /// The transform: a WebAssembly component of world sluice:transform.
    module: PathBuf,
    /// JSON-lines input; `-` or absent reads stdin.
    #[arg(long, short)]
    input: Option<PathBuf>,
    /// A transform config entry, `key=value`; repeat for more.
    #[arg(long = "config", short = 'c', value_name = "KEY=VALUE", value_parser = parse_key_value)]
    config: Vec<(String, String)>,
    /// Records per call into the guest.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// The guest's memory limit.
    #[arg(long, default_value = "128MiB", value_parser = units::parse_size)]
    max_memory: usize,
    /// How long one call into the guest may run before it is interrupted.
    #[arg(long, default_value = "5s", value_parser = units::parse_duration)]
    deadline: Duration,
    /// Output records allowed per input record.
    #[arg(long, default_value_t = 100)]
    max_outputs_per_input: u32,
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("`{text}` is not KEY=VALUE")),
    }
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Exec(args) => exec(args),
        Command::Run(args) => cli::run::run(args),
        Command::Demo(args) => cli::demo::demo(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sluice::guest=info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn exec(args: ExecArgs) -> Result<()> {
    let runtime = Runtime::new(RuntimeConfig { max_instances: 4, ..RuntimeConfig::default() })?;
    let module = runtime.load_file(&args.module).with_context(|| format!("loading {}", args.module.display()))?;
    let limits = InstanceLimits {
        memory_bytes: args.max_memory,
        deadline: args.deadline,
        max_outputs_per_input: args.max_outputs_per_input,
    };
    let name = args.module.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "exec".into());
    let mut instance = runtime.instantiate(&module, &name, TaskState::in_memory(), limits)?;
    instance.init(&args.config).context("init")?;
    let stdout = std::io::stdout().lock();
    let stats = match args.input.as_deref() {
        None => sluice::exec::run(&mut instance, std::io::stdin().lock(), stdout, args.batch_size)?,
        Some(path) if path.as_os_str() == "-" => {
            sluice::exec::run(&mut instance, std::io::stdin().lock(), stdout, args.batch_size)?
        }
        Some(path) => {
            let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
            sluice::exec::run(&mut instance, BufReader::new(file), stdout, args.batch_size)?
        }
    };
    tracing::debug!(?stats, "done");
    Ok(())
}
