//! The `sluice` command line. The only place that uses `anyhow`: everything
//! below it returns typed errors.

use std::io::{BufReader, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

mod cli;

/// mimalloc rather than the system allocator: a task allocates and frees
/// several small buffers per record (the record's key, value and topic, the
/// state calls' keys and values), and glibc's malloc and free were a fifth
/// of a pipeline's CPU time in `perf` (`bench/peers.sh`).
///
/// It also replaces `malloc` and `free` for the C code (the `override`
/// feature; glibc lets the executable's definitions stand for its own), so
/// that librdkafka's allocations for every record it fetches or produces
/// (its fetched-message ops, its header buffers, its produced-message
/// copies) are mimalloc's too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay`: its index in `mi_option_e` of the mimalloc v3
/// that libmimalloc-sys builds, which does not name it
/// (`tests::the_purge_delay_option_is_the_one_we_set` checks it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays ready for reuse before mimalloc gives it back
/// to the OS. mimalloc's default of 1 s is the very period at which a task
/// folds its checkpoints and, at 1 s checkpoints, snapshots: the memory one
/// round freed was returned just before the next needed it, and zeroing the
/// fresh pages cost 4-6% of a pipeline's CPU (`perf`, bench/peers.sh). Ten
/// seconds still returns what an idle job freed.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// `mi_option_allow_thp`, as [`MI_OPTION_PURGE_DELAY`] (checked by
/// `tests::the_thp_option_is_the_one_we_set`).
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

/// Sets the allocator's options, unless the environment sets them (mimalloc
/// reads `MIMALLOC_*` variables).
#[allow(unsafe_code)]
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: called first in `main`, before this process starts a
        // thread (mimalloc's option setters are not thread safe); the index
        // names the purge delay (see the constant).
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) }
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        disable_transparent_huge_pages();
    }
}

/// No transparent huge pages for this process (and the processes it
/// starts, which inherit the setting).
///
/// mimalloc asks for them (`madvise(MADV_HUGEPAGE)` on its arenas), so the
/// first touch of any 2 MiB of fresh arena memory zeroes all of it at once,
/// and memory it gives back splits them again. A task's buffers come and go
/// at that size (fetched batches, a run's packed records, a flush's state
/// writes): in `perf` of the windowed count (bench/peers.sh) the kernel's
/// huge-page zeroing (`clear_page_erms` under `do_huge_pmd_anonymous_page`)
/// was a tenth of the process's samples, and without huge pages the same
/// run took a fifth less CPU (4.3-4.7 s instead of 5.5-6.1 s) and less
/// memory. mimalloc's own switch (`MIMALLOC_ALLOW_THP=0`) acts when it
/// starts, before `main`; its arenas are already advised by then, so this
/// sets the option for later arenas and also turns huge pages off for the
/// process, which the kernel checks at each fault.
#[allow(unsafe_code)]
fn disable_transparent_huge_pages() {
    // SAFETY: as in `tune_allocator`; the index names `allow_thp`.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0) }
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory
    // of ours. It fails only on kernels without it (before 3.15), where
    // there is nothing to turn off.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

use sluice::runtime::{InstanceLimits, Runtime, RuntimeConfig};
use sluice::state::TaskState;
use sluice::units;

/// Exactly-once Kafka pipelines whose transforms are WebAssembly components.
#[derive(Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    connection: cli::client::Connection,
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
    /// Create a transform project: a working running-count in the given language.
    Init(cli::author::InitArgs),
    /// Build a transform project into a WebAssembly component.
    Build(cli::author::BuildArgs),
    /// Run the shared host: an HTTP API where tenants upload modules and run jobs.
    Serve(cli::serve::ServeArgs),
    /// Manage tenants on a host (admin token).
    #[command(subcommand)]
    Tenant(cli::client::TenantCommand),
    /// Upload, list and delete modules on a host.
    #[command(subcommand)]
    Module(cli::client::ModuleCommand),
    /// Create, watch, stop, resume, upgrade and delete jobs on a host.
    #[command(subcommand)]
    Job(cli::client::JobCommand),
    /// Print a job's log lines (the guest's log calls, stdout, stderr, and host events).
    Logs(cli::client::LogsArgs),
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
    /// How far behind a partition's largest timestamp its watermark stays
    /// (as `time.max-out-of-orderness` in a job file).
    #[arg(long, default_value = "0s", value_parser = units::parse_duration)]
    max_out_of_orderness: Duration,
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("`{text}` is not KEY=VALUE")),
    }
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    let logs = sluice::service::LogHub::default();
    init_logging(matches!(cli.command, Command::Serve(_)).then(|| logs.layer()));
    let connection = cli.connection;
    let result = match cli.command {
        Command::Exec(args) => exec(args),
        Command::Run(args) => cli::run::run(args),
        Command::Demo(args) => cli::demo::demo(args),
        Command::Init(args) => cli::author::init(args),
        Command::Build(args) => cli::author::build(args),
        Command::Serve(args) => cli::serve::serve(args, logs),
        Command::Tenant(command) => cli::client::tenant(connection, command),
        Command::Module(command) => cli::client::module(connection, command),
        Command::Job(command) => cli::client::job(connection, command),
        Command::Logs(args) => cli::client::logs(connection, args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr, filtered by `SLUICE_LOG`; with `capture`, job events of
/// every level from info up also go to the jobs' log rings (`sluice serve`).
fn init_logging(capture: Option<sluice::service::LogCapture>) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sluice::guest=info"));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter);
    let capture = capture.map(|layer| layer.with_filter(tracing_subscriber::filter::LevelFilter::INFO));
    tracing_subscriber::registry().with(stderr).with(capture).init();
}

fn exec(args: ExecArgs) -> Result<()> {
    // Cranelift before the run, cached for every later `exec` of the module:
    // one short process never lives to switch from baseline code to it.
    let runtime = Runtime::new(RuntimeConfig { max_instances: 4, baseline: false, ..RuntimeConfig::default() })?;
    let module = runtime.load_file(&args.module).with_context(|| format!("loading {}", args.module.display()))?;
    let limits = InstanceLimits {
        memory_bytes: args.max_memory,
        deadline: args.deadline,
        max_outputs_per_input: args.max_outputs_per_input,
        max_state_bytes: None,
    };
    let name = args.module.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "exec".into());
    let mut instance = runtime.instantiate(&module, &name, TaskState::in_memory(), limits)?;
    let time = sluice::time::TimeConfig { max_out_of_orderness: args.max_out_of_orderness, idle_timeout: None };
    instance.start_time(&module, time, &[])?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// mimalloc v3's default purge delay is 1000 ms (or what the environment
    /// says), and no other option of its has that default: the index is the
    /// purge delay's.
    #[test]
    #[allow(unsafe_code)]
    fn the_purge_delay_option_is_the_one_we_set() {
        let expected = std::env::var("MIMALLOC_PURGE_DELAY").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
        // SAFETY: reading an option is a plain load of an initialised value.
        let value = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(value, expected, "option {MI_OPTION_PURGE_DELAY} is not mimalloc's purge delay");
    }

    #[test]
    #[allow(unsafe_code)]
    fn the_thp_option_is_the_one_we_set() {
        let expected = std::env::var("MIMALLOC_ALLOW_THP").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
        // allow_thp defaults to 1 on Linux; its neighbours, to 32 (the
        // cross-thread reclaim limit) and 0 (the minimal purge size), so
        // the three values pin the index.
        // SAFETY: reading an option is a plain load of an initialised value.
        let around = unsafe {
            [MI_OPTION_ALLOW_THP - 1, MI_OPTION_ALLOW_THP, MI_OPTION_ALLOW_THP + 1]
                .map(|i| libmimalloc_sys::mi_option_get(i))
        };
        assert_eq!(around, [32, expected, 0], "option {MI_OPTION_ALLOW_THP} is not mimalloc's allow_thp");
    }
}
