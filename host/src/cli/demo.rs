//! `sluice demo`: the newcomer's first run. Creates two topics, writes
//! generated clicks, runs the running-count transform over them with
//! exactly-once checkpoints, and prints what a read_committed consumer sees.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

use sluice::job::{Job, JobSpec};
use sluice::kafka::tools;
use sluice::runtime::{Runtime, RuntimeConfig};

/// Arguments of `sluice demo`.
#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// The running-count component.
    #[arg(long)]
    module: PathBuf,
    /// Kafka bootstrap servers.
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    /// How many click records to generate.
    #[arg(long, default_value_t = 20_000)]
    records: usize,
    /// How many distinct users (keys).
    #[arg(long, default_value_t = 5)]
    users: usize,
}

pub(crate) fn demo(args: DemoArgs) -> Result<()> {
    let run = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let input = format!("demo-clicks-{run}");
    let output = format!("demo-click-counts-{run}");
    println!("1. creating topics {input} and {output} (4 partitions each) on {}", args.brokers);
    tools::create_topics(&args.brokers, &[(&input, 4), (&output, 4)])?;

    println!("2. writing {} clicks by {} users", args.records, args.users);
    let users = args.users.max(1);
    tools::produce(
        &args.brokers,
        &input,
        (0..args.records).map(|i| (format!("user-{}", i % users).into_bytes(), format!("click {i}").into_bytes())),
    )?;

    let state_dir = std::env::temp_dir().join(format!("sluice-demo-{run}"));
    let spec = JobSpec {
        id: format!("demo-{run}"),
        brokers: args.brokers.clone(),
        module: args.module.clone(),
        parallelism: 2,
        batch_size: 512,
        state_dir: Some(state_dir.clone()),
        input: sluice::job::InputSpec {
            topics: vec![input.clone()],
            start: Default::default(),
            sleep_after: "30s".into(),
        },
        output: sluice::job::OutputSpec { topics: vec![output.clone()] },
        checkpoint: sluice::job::CheckpointSpec { interval: "500ms".into(), ..Default::default() },
        state: Default::default(),
        time: Default::default(),
        transform: Default::default(),
        limits: Default::default(),
        errors: Default::default(),
        kafka: BTreeMap::new(),
    };
    let config = spec.validate("<demo>".as_ref(), std::path::Path::new("."))?;
    println!("3. running job {} (running-count, 2 tasks, checkpoint every 500ms, exactly-once)", config.id);
    let runtime = Arc::new(Runtime::new(RuntimeConfig { max_instances: 8, ..RuntimeConfig::default() })?);
    let started = Instant::now();
    let job = Job::start(config, runtime).context("starting the demo job")?;

    println!("4. reading {output} with isolation.level=read_committed");
    let expected = args.records;
    let committed = tools::read_all(&args.brokers, &output, true, Duration::from_secs(120), |r| r.len() >= expected)?;
    let elapsed = started.elapsed();
    job.stop();
    job.join()?;
    let _ = std::fs::remove_dir_all(&state_dir);

    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for record in &committed {
        let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        let count = String::from_utf8_lossy(record.value.as_deref().unwrap_or_default()).parse().unwrap_or(0);
        let entry = last.entry(key).or_default();
        *entry = (*entry).max(count);
    }
    println!("\ncommitted output: {} records in {:.1}s; final count per user:", committed.len(), elapsed.as_secs_f64());
    for (user, count) in &last {
        println!("  {user:<10} {count}");
    }
    let total: u64 = last.values().sum();
    if committed.len() != expected || total != expected as u64 {
        bail!(
            "expected {expected} outputs whose final counts add up to {expected}, got {} adding up to {total}",
            committed.len()
        );
    }
    println!("\nevery click counted exactly once ({total} = {expected}).");
    Ok(())
}
