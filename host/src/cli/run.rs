//! `sluice run`: one job from a job file, until Ctrl-C or SIGTERM.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use sluice::job::{Job, JobConfig, JobSpec};
use sluice::runtime::{Runtime, RuntimeConfig};

/// Arguments of `sluice run`.
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The job file (TOML).
    job: PathBuf,
    /// Kafka bootstrap servers, overriding the job file's `brokers`.
    #[arg(long)]
    brokers: Option<String>,
}

/// Parses and validates a job file, applying a `--brokers` override.
pub(crate) fn load_job(path: &Path, brokers: Option<String>) -> Result<JobConfig> {
    let mut spec = JobSpec::from_file(path)?;
    if let Some(brokers) = brokers {
        spec.brokers = brokers;
    }
    let base = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Ok(spec.validate(path, base)?)
}

pub(crate) fn run(args: RunArgs) -> Result<()> {
    let config = load_job(&args.job, args.brokers)?;
    let runtime = Arc::new(Runtime::new(RuntimeConfig {
        max_instances: u32::try_from(config.parallelism * 2).unwrap_or(u32::MAX),
        ..RuntimeConfig::default()
    })?);
    let job = Job::start(config, runtime).context("starting the job")?;
    wait_for_shutdown(&job)?;
    job.stop();
    job.join().context("the job failed")?;
    Ok(())
}

/// Returns when Ctrl-C or SIGTERM arrives, or when every task has ended on
/// its own (a permanent failure).
fn wait_for_shutdown(job: &Job) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {
                    tracing::info!("interrupted: taking a final checkpoint and stopping");
                    return Ok(());
                }
                _ = term.recv() => {
                    tracing::info!("terminated: taking a final checkpoint and stopping");
                    return Ok(());
                }
                _ = tick.tick() => {
                    if job.is_finished() {
                        return Ok(());
                    }
                }
            }
        }
    })
}
