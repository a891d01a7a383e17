//! The peers benchmark's output: the markdown table (docs/peers.md), the
//! chart (docs/peers.svg) and the raw numbers (docs/peers.json).

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What was run, for the report's header.
#[derive(Serialize, Deserialize)]
pub struct Setup {
    /// `count` or `windowed-count`.
    #[serde(default = "count")]
    pub workload: String,
    /// Whether sluice's jobs kept a changelog (the default).
    #[serde(default = "yes")]
    pub changelog: bool,
    pub records: usize,
    pub partitions: u32,
    pub parallelism: u32,
    pub keys: u32,
    pub value_bytes: u32,
    pub latency_rate: u32,
    pub latency_seconds: u64,
    /// Runs per system and interval; the median run is reported.
    #[serde(default = "one")]
    pub repeat: usize,
    pub cores: u32,
    pub date: String,
}

#[derive(Serialize, Deserialize, Clone, Copy)]
pub struct Latency {
    pub p50_ms: i64,
    pub p99_ms: i64,
    pub max_ms: i64,
}

/// One system at one checkpoint interval.
#[derive(Serialize, Deserialize)]
pub struct Row {
    pub system: String,
    pub label: String,
    pub checkpoint_ms: u64,
    /// The backlog's records over `backlog_seconds`.
    pub records_per_second: f64,
    /// The backlog's records over `cpu_seconds_backlog`.
    pub records_per_cpu_second: f64,
    /// From the process's continuing on the backlog until the backlog's
    /// last output was visible.
    pub backlog_seconds: f64,
    /// The process's CPU time in `backlog_seconds`.
    pub cpu_seconds_backlog: f64,
    /// The broker's CPU time in `backlog_seconds`, when the bench knows its
    /// process.
    #[serde(default)]
    pub broker_cpu_seconds_backlog: Option<f64>,
    /// CPU time from process start until the backlog was committed (the
    /// warm-up included).
    pub cpu_seconds_total: f64,
    /// From process start to the first committed output.
    pub startup_seconds: f64,
    pub peak_rss_mib: f64,
    pub latency: Option<Latency>,
    /// Why this system's figures do not count (wrong output, crash, timeout).
    pub failure: Option<String>,
}

impl Row {
    pub fn new(system: &str, label: &str, checkpoint_ms: u64) -> Row {
        Row {
            system: system.to_string(),
            label: label.to_string(),
            checkpoint_ms,
            records_per_second: 0.0,
            records_per_cpu_second: 0.0,
            backlog_seconds: 0.0,
            cpu_seconds_backlog: 0.0,
            broker_cpu_seconds_backlog: None,
            cpu_seconds_total: 0.0,
            startup_seconds: 0.0,
            peak_rss_mib: 0.0,
            latency: None,
            failure: None,
        }
    }
}

fn count() -> String {
    "count".into()
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

/// Today's date (UTC), for the report.
pub fn today() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Reads the setup and rows back from a peers.json.
pub fn read(json: &Path) -> std::io::Result<(Setup, Vec<Row>)> {
    #[derive(Deserialize)]
    struct Raw {
        setup: Setup,
        rows: Vec<Row>,
    }
    let raw: Raw = serde_json::from_slice(&std::fs::read(json)?)?;
    Ok((raw.setup, raw.rows))
}

/// The report's file name without extension: `peers` for the running
/// count, `peers-windows` for the windowed count.
pub fn stem(workload: &str) -> &'static str {
    if workload == "windowed-count" { "peers-windows" } else { "peers" }
}

/// Writes docs/<stem>.{md,svg,json}.
pub fn write(docs: &Path, setup: &Setup, rows: &[Row]) -> std::io::Result<()> {
    std::fs::create_dir_all(docs)?;
    let stem = stem(&setup.workload);
    std::fs::write(docs.join(format!("{stem}.md")), markdown(setup, rows))?;
    std::fs::write(docs.join(format!("{stem}.svg")), svg(setup, rows))?;
    let raw = serde_json::json!({ "setup": setup, "rows": rows });
    std::fs::write(docs.join(format!("{stem}.json")), serde_json::to_string_pretty(&raw)? + "\n")
}

fn windowed(setup: &Setup) -> bool {
    setup.workload == "windowed-count"
}

fn ok_row<'a>(rows: &'a [Row], system: &str, interval: u64) -> Option<&'a Row> {
    rows.iter().find(|r| r.system == system && r.checkpoint_ms == interval && r.failure.is_none())
}

fn intervals(rows: &[Row]) -> Vec<u64> {
    let mut v: Vec<u64> = rows.iter().map(|r| r.checkpoint_ms).collect();
    v.dedup();
    v
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 { format!("{:.2}x", a / b) } else { "-".into() }
}

/// The report: setup, headline ratios, one table per checkpoint interval.
pub fn markdown(setup: &Setup, rows: &[Row]) -> String {
    let mut md = String::new();
    let stem = stem(&setup.workload);
    let (title, command) = if windowed(setup) {
        (": a windowed count", "bench/peers.sh --workload windowed-count")
    } else {
        ("", "bench/peers.sh")
    };
    let _ = writeln!(md, "# sluice beside Flink and Kafka Streams{title}\n");
    let _ = writeln!(
        md,
        "Produced by `{command}` on {} on a {}-core machine, every system on the same single-node \
         Apache Kafka 4.4.0 broker on that machine. Raw numbers: [{stem}.json]({stem}.json); chart: \
         [{stem}.svg]({stem}.svg).\n",
        setup.date, setup.cores
    );
    if windowed(setup) {
        let _ = writeln!(
            md,
            "The job: a count per key in 1 s tumbling event-time windows (the Kafka timestamp), the watermark \
             200 ms behind each input partition's largest timestamp; each window is emitted once, when the \
             watermark passes its end, as `{{\"start\":S,\"end\":E,\"count\":N}}`, exactly-once. sluice runs \
             examples/rust/windowed-count (and its Python twin), Flink a keyed TumblingEventTimeWindows count \
             with forBoundedOutOfOrderness(200 ms), Kafka Streams a windowed count with a 200 ms grace, \
             suppressed until the window closes. Input: {} records on {} partitions, 100 per ms of event time \
             with up to 150 ms of disorder (inside the bound: no record is late), {}-byte values, {} keys; \
             about 10 records per key and window. Every system runs as its own process with parallelism {}, \
             first on a warm-up of a twentieth as many records (with their own windows), until every window \
             of it is visible to a read_committed reader; then the harness stops the process (SIGSTOP), \
             produces the backlog and a flush that closes its windows, and continues it (SIGCONT). \
             **records/s** is the backlog's records over the time from SIGCONT until its last window was \
             visible; **records per CPU-second** divides them by the process's CPU time (user + system) in \
             that time. **Latency** is \
             from a window's end (wall clock: {} records/s are produced for {} s after the backlog, stamped \
             with a clock that runs 10% fast, so that the window ends fall at every phase of a system's \
             checkpoint cycle instead of one lucky or unlucky phase per run; a window ends when that clock \
             reaches its end) to its output's visibility, over the windows the paced records closed \
             (not the last ones, which wait for the harness's final flush); it includes the 200 ms bound, \
             the same for everyone. Every system's output was read back and checked: every window due exactly once with \
             its count, nothing else.\n",
            setup.records,
            setup.partitions,
            setup.value_bytes,
            setup.keys,
            setup.parallelism,
            setup.latency_rate,
            setup.latency_seconds
        );
    } else {
        let _ = writeln!(
            md,
            "The job: keyed running count, exactly-once (for each input record, emit the key and how many records \
         of that key came so far). Input: a backlog of {} records on {} partitions, {}-byte values, {} keys. \
         Every system runs as its own process with parallelism {}, first on a warm-up of a twentieth as many \
         records, until all of its output is visible to a read_committed reader (**startup s** is the time to \
         the first); then the harness stops the process (SIGSTOP), produces the backlog, and continues it \
         (SIGCONT). **records/s** is the backlog's records over the time from SIGCONT until its last output \
         was visible; **records per CPU-second** divides them by the process's CPU time (user + system) in \
         that same time, in which every backlog record was read, transformed and committed and nothing else \
         was; **peak RSS** is the process's VmHWM once the backlog was committed. **Latency** is from a record's send time to its output's \
         visibility to a read_committed reader, over {} records/s produced for {} s after the backlog. Every \
         system's output was read back and checked: per key, exactly 1..n in order.\n",
            setup.records,
            setup.partitions,
            setup.value_bytes,
            setup.keys,
            setup.parallelism,
            setup.latency_rate,
            setup.latency_seconds
        );
    }
    let _ = writeln!(
        md,
        "sluice's state: checkpointed to redb on the local disk at every checkpoint{}.\n",
        if setup.changelog {
            ", and its changes written to the job's changelog topic in the checkpoint's transaction (the default)"
        } else {
            " only (`[state] changelog = false`, as Flink's heap state with checkpoints on the JobManager has no \
             copy off the machine either)"
        }
    );
    let _ = writeln!(
        md,
        "**backlog CPU s** is the system's CPU time in the backlog's span; **broker CPU s** is the broker's in \
         the same span (serving the system's reads, writes and transactions, and the harness reader's reads; \
         \"-\" where the bench did not start the broker); **total CPU s** is the system's from its start until \
         the backlog was committed (startup and warm-up included). The broker, the harness's reader and its \
         producer share the machine with the system under test; none of their CPU is in the system's figures. \
         The JVMs run with `-Xmx1g`. The backlog's span ends with a commit, so it includes the wait for the \
         last one, up to a checkpoint interval.\n"
    );
    if setup.repeat > 1 {
        let _ = writeln!(
            md,
            "Each system ran {} times at each interval, in rounds over the systems; each row is its run with the \
             median records per CPU-second.\n",
            setup.repeat
        );
    }
    let _ = writeln!(md, "## Headline: sluice with the Rust guest\n");
    let _ = writeln!(
        md,
        "| checkpoint interval | records/s vs native | records per CPU-second vs Flink | vs Kafka Streams | p99 latency | Flink's p99 |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    for interval in intervals(rows) {
        let Some(s) = ok_row(rows, "sluice-rust", interval) else { continue };
        let per_cpu = |peer: &str| {
            ok_row(rows, peer, interval)
                .map_or("-".into(), |p| ratio(s.records_per_cpu_second, p.records_per_cpu_second))
        };
        let _ = writeln!(
            md,
            "| {interval} ms | {} | {} | {} | {} | {} |",
            ok_row(rows, "native", interval).map_or("-".into(), |n| ratio(s.records_per_second, n.records_per_second)),
            per_cpu("flink"),
            per_cpu("kafka-streams"),
            s.latency.map_or("-".into(), |l| format!("{} ms", l.p99_ms)),
            ok_row(rows, "flink", interval).and_then(|f| f.latency).map_or("-".into(), |l| format!("{} ms", l.p99_ms)),
        );
    }
    for interval in intervals(rows) {
        let native = ok_row(rows, "native", interval);
        let _ = writeln!(md, "\n## {interval} ms checkpoints\n");
        let _ = writeln!(
            md,
            "| system | records/s | vs native | records per CPU-second | vs native | backlog CPU s | broker CPU s | total CPU s | peak RSS MiB | startup s | p50 ms | p99 ms |"
        );
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for row in rows.iter().filter(|r| r.checkpoint_ms == interval) {
            if let Some(failure) = &row.failure {
                let first = failure.lines().next().unwrap_or_default();
                let _ = writeln!(md, "| {} | failed: {first} | | | | | | | | | | |", row.label);
                continue;
            }
            let (p50, p99) =
                row.latency.map_or(("-".into(), "-".into()), |l| (l.p50_ms.to_string(), l.p99_ms.to_string()));
            let _ = writeln!(
                md,
                "| {} | {:.0} | {} | {:.0} | {} | {:.1} | {} | {:.1} | {:.0} | {:.1} | {p50} | {p99} |",
                row.label,
                row.records_per_second,
                native.map_or("-".into(), |n| ratio(row.records_per_second, n.records_per_second)),
                row.records_per_cpu_second,
                native.map_or("-".into(), |n| ratio(row.records_per_cpu_second, n.records_per_cpu_second)),
                row.cpu_seconds_backlog,
                row.broker_cpu_seconds_backlog.map_or("-".into(), |b| format!("{b:.1}")),
                row.cpu_seconds_total,
                row.peak_rss_mib,
                row.startup_seconds,
            );
        }
    }
    md
}

const COLOURS: [&str; 4] = ["#3b6ea5", "#e07b39", "#5a9e4b", "#8c6bb1"];

/// Two panels of horizontal bars, one bar per system and interval: records
/// per CPU-second (higher is better) and p99 latency (lower is better).
pub fn svg(setup: &Setup, rows: &[Row]) -> String {
    let intervals = intervals(rows);
    let mut systems: Vec<(&str, &str)> = Vec::new();
    for row in rows {
        if !systems.iter().any(|(s, _)| *s == row.system) {
            systems.push((&row.system, &row.label));
        }
    }
    let (label_w, panel_w, bar_h, gap) = (240.0, 300.0, 14.0, 12.0);
    let group_h = bar_h * intervals.len() as f64 + gap;
    let top = 64.0;
    let height = top + group_h * systems.len() as f64 + 20.0;
    let width = label_w + 2.0 * (panel_w + 90.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = if windowed(setup) { "Keyed 1 s tumbling-window count" } else { "Keyed running count" };
    let _ = writeln!(
        out,
        r#"<text x="10" y="20" font-size="15" font-weight="bold">{title}, exactly-once, same broker and machine</text>"#
    );
    for (i, interval) in intervals.iter().enumerate() {
        let x = 10.0 + i as f64 * 150.0;
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="30" width="12" height="12" fill="{}"/><text x="{}" y="40">{interval} ms checkpoints</text>"#,
            COLOURS[i % COLOURS.len()],
            x + 16.0
        );
    }
    type Panel = (&'static str, fn(&Row) -> Option<f64>, fn(f64) -> String);
    let panels: [Panel; 2] = [
        (
            "records per CPU-second (higher is better)",
            |r| Some(r.records_per_cpu_second),
            |v| format!("{:.0}k", v / 1000.0),
        ),
        ("p99 latency, ms (lower is better)", |r| r.latency.map(|l| l.p99_ms as f64), |v| format!("{v:.0}")),
    ];
    for (p, (title, value, fmt)) in panels.iter().enumerate() {
        let x0 = label_w + p as f64 * (panel_w + 90.0);
        let max = rows.iter().filter(|r| r.failure.is_none()).filter_map(value).fold(0.0_f64, f64::max).max(1.0);
        let _ = writeln!(out, r#"<text x="{x0}" y="{}" font-weight="bold">{title}</text>"#, top - 6.0);
        let _ = writeln!(
            out,
            r##"<line x1="{x0}" y1="{top}" x2="{x0}" y2="{}" stroke="#444"/>"##,
            top + group_h * systems.len() as f64
        );
        for (s, (system, label)) in systems.iter().enumerate() {
            let y = top + s as f64 * group_h + gap / 2.0;
            if p == 0 {
                let _ = writeln!(
                    out,
                    r#"<text x="{}" y="{}" text-anchor="end">{label}</text>"#,
                    label_w - 8.0,
                    y + bar_h * intervals.len() as f64 / 2.0 + 4.0
                );
            }
            for (i, interval) in intervals.iter().enumerate() {
                let yb = y + i as f64 * bar_h;
                let row = rows.iter().find(|r| r.system == *system && r.checkpoint_ms == *interval);
                let text = match row {
                    Some(r) if r.failure.is_some() => "failed".to_string(),
                    Some(r) => match value(r) {
                        Some(v) => {
                            let w = (v / max * panel_w).max(1.0);
                            let _ = writeln!(
                                out,
                                r#"<rect x="{x0}" y="{yb}" width="{w:.1}" height="{}" fill="{}"/>"#,
                                bar_h - 2.0,
                                COLOURS[i % COLOURS.len()]
                            );
                            let _ = writeln!(
                                out,
                                r#"<text x="{:.1}" y="{}" font-size="11">{}</text>"#,
                                x0 + w + 4.0,
                                yb + bar_h - 4.0,
                                fmt(v)
                            );
                            continue;
                        }
                        None => "-".to_string(),
                    },
                    None => continue,
                };
                let _ =
                    writeln!(out, r#"<text x="{}" y="{}" font-size="11">{text}</text>"#, x0 + 4.0, yb + bar_h - 4.0);
            }
        }
    }
    out.push_str("</svg>\n");
    out
}
