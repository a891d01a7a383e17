//! The dashboard's markup: the page skeletons and the fragments that fill
//! them. maud escapes every value it writes, so a job's reason, a log line
//! or a module name is always text, never markup.

use maud::{DOCTYPE, Markup, html};

use super::list::{ListPage, StateFilter};
use crate::job::{CheckpointEntry, FailureEntry, TaskPhase};
use crate::service::{
    HostFigures, JobHistory, JobState, JobStatus, ModuleRecord, Operation, OperationState, Rates, TenantUsage, Usage,
};
use crate::units::{age as ago, bytes, clock, count, work as seconds};

/// Seconds of throughput a sparkline on the jobs list draws.
pub(super) const SPARK_SECONDS: usize = 60;

/// Which page a skeleton is for.
pub(super) enum View {
    /// The jobs list (`/`).
    Jobs,
    /// One job (`/jobs/{tenant}/{id}`).
    Job {
        /// Its tenant.
        tenant: String,
        /// Its id.
        id: String,
    },
    /// The signed-in tenant's use of its policy.
    Tenant,
    /// The host and every tenant (admin).
    Admin,
}

/// A path segment, percent-encoded: ids come from the address bar.
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The fragment path of `tenant`'s job `id`, with `rest` after it.
fn job_ui(tenant: &str, id: &str, rest: &str) -> String {
    format!("/ui/jobs/{}/{}/{rest}", segment(tenant), segment(id))
}

/// The page of `tenant`'s job `id`.
fn job_page(tenant: &str, id: &str) -> String {
    format!("/jobs/{}/{}", segment(tenant), segment(id))
}

/// A page: the skeleton of `view` inside the sign-in frame.
pub(super) fn shell(view: &View) -> Markup {
    let (name, title) = match view {
        View::Jobs => ("jobs", "Jobs".to_owned()),
        View::Job { id, .. } => ("job", format!("Job {id}")),
        View::Tenant => ("tenant", "Tenant".to_owned()),
        View::Admin => ("admin", "Admin".to_owned()),
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="htmx-config" content=r#"{"includeIndicatorStyles":false,"allowEval":false,"allowScriptTags":false,"selfRequestsOnly":true,"historyCacheSize":0}"#;
                title { (title) " · sluice" }
                link rel="stylesheet" href="/assets/uPlot.min.css";
                link rel="stylesheet" href="/assets/sluice.css";
                script src="/assets/htmx.min.js" {}
                script src="/assets/uPlot.iife.min.js" {}
                script src="/assets/sluice.js" defer {}
            }
            body data-view=(name) {
                header.top {
                    a.brand href="/" { "sluice" }
                    nav #nav hidden {
                        a href="/" { "Jobs" }
                        a #nav-tenant href="/tenant" hidden { "Tenant" }
                        a #nav-admin href="/admin" hidden { "Admin" }
                    }
                    span #who {}
                    button #sign-out type="button" hidden { "Sign out" }
                }
                div #banner .banner role="alert" hidden {}
                form #sign-in .sign-in hidden {
                    h1 { "Sign in" }
                    p { "Paste a tenant's token, or the host's admin token. This tab keeps it until you sign out or close the tab; no cookie is set." }
                    label for="token" { "Token" }
                    input #token type="password" name="token" autocomplete="off" required;
                    button type="submit" { "Sign in" }
                    p #sign-in-error .error hidden {}
                }
                main #main hidden {
                    @match view {
                        View::Jobs => {
                            h1 { "Jobs" }
                            form #jobs-query .list-tools role="search" {
                                label { "Search " input #jobs-search type="search" name="q" maxlength="200" placeholder="job or tenant"; }
                                label { "Show " select #jobs-state name="state" {
                                    @for (_, value, words) in StateFilter::CHOICES { option value=(value) { (words) } }
                                } }
                                input #jobs-page type="hidden" name="page" value="0";
                            }
                            div #jobs .poll hx-get="/ui/jobs" hx-include="#jobs-query" hx-sync="this:queue last"
                                hx-trigger="load, refresh, every 1s" { p.muted { "Loading…" } }
                        }
                        View::Job { tenant, id } => {
                            h1 { "Job " code { (id) } }
                            p.muted { "tenant " code { (tenant) } }
                            section #summary .poll hx-get=(job_ui(tenant, id, "summary")) hx-trigger="load, refresh, every 1s" {
                                p.muted { "Loading…" }
                            }
                            section.panel {
                                h2 { "Throughput, last hour" }
                                p.muted { "records per second in and out, over every task (in a cluster, on every member)" }
                                div #chart data-src=(job_ui(tenant, id, "throughput")) {}
                            }
                            section.panel {
                                h2 { "Controls" }
                                div #controls hx-get=(job_ui(tenant, id, "controls")) hx-trigger="load, refresh" {}
                                div #operation aria-live="polite" {}
                            }
                            section #history .poll hx-get=(job_ui(tenant, id, "history")) hx-trigger="load, refresh, every 2s" {}
                            section.panel {
                                h2 { "Log" }
                                div.log-tools {
                                    label { "Level " select #log-level {
                                        option value="trace" { "all" }
                                        option value="info" { "info and above" }
                                        option value="warn" { "warnings and errors" }
                                        option value="error" { "errors" }
                                    } }
                                    label { "Search " input #log-search type="search" placeholder="text in the line"; }
                                    label { input #log-follow type="checkbox" checked; " follow" }
                                }
                                div #log .log data-src=(job_ui(tenant, id, "logs")) {}
                            }
                        }
                        View::Tenant => {
                            h1 { "Tenant" }
                            div #tenant .poll hx-get="/ui/tenant" hx-trigger="load, refresh, every 2s" {}
                        }
                        View::Admin => {
                            h1 { "Host" }
                            div #admin .poll hx-get="/ui/admin" hx-trigger="load, refresh, every 2s" {}
                        }
                    }
                }
            }
        }
    }
}

/// A page of the jobs list, with the tally of every job and the pager.
pub(super) fn jobs(list: &ListPage, rates: &[Rates], admin: bool) -> Markup {
    let tally = &list.tally;
    let jobs = &list.rows;
    html! {
        @if tally.total == 0 {
            p.muted { "No jobs yet. Create one with " code { "sluice job create" } " or " code { "POST /v1/jobs" } "." }
        } @else {
            p.tally #tally {
                (tally.total) @if tally.total == 1 { " job: " } @else { " jobs: " }
                (tally.running) " running"
                @if tally.trouble > 0 { ", " span.bad { (tally.trouble) " failed or restarting" } }
                @if tally.changing > 0 { ", " (tally.changing) " changing" }
                @if tally.stopped > 0 { ", " (tally.stopped) " stopped" }
            }
        }
        @if tally.total > 0 && jobs.is_empty() {
            p.muted #no-match { "No job matches." }
        } @else if !jobs.is_empty() {
            table.jobs {
                thead { tr {
                    @if admin { th { "Tenant" } }
                    th { "Job" } th { "State" } th.num { "In/s" } th { "" } th.num { "Out/s" }
                    th.num { "Lag" } th.num { "Last checkpoint" } th.num { "Restarts" } th.num { "Dead letters" }
                } }
                tbody {
                    @for ((tenant, job), rates) in jobs.iter().zip(rates) {
                        tr data-job=(job.id) data-tenant=(tenant) {
                            @if admin { td { (tenant) } }
                            td { a href=(job_page(tenant, &job.id)) { (job.id) } }
                            td { (state(job.state)) @if let Some(reason) = &job.reason { div.reason { (reason) } } }
                            td.num.records-in data-value=(rates.records_in.last().copied().unwrap_or(0)) { (rate(rates.records_in.last().copied().unwrap_or(0))) }
                            td { (sparkline(&rates.records_in)) }
                            td.num.records-out { (rate(rates.records_out.last().copied().unwrap_or(0))) }
                            td.num.lag { (count(job.lag_records)) }
                            td.num { (checkpoint_age(job)) }
                            td.num.restarts { (job.restarts) }
                            td.num.dead-letters { (job.dead_letters) }
                        }
                    }
                }
            }
            @if list.pages > 1 || list.filtered {
                nav.pager aria-label="pages" {
                    button type="button" data-page=(list.page.saturating_sub(1)) disabled[list.page == 0] { "← Previous" }
                    span #showing {
                        "jobs " (list.first()) "–" (list.first() + jobs.len() - 1) " of " (list.matching)
                        @if list.filtered { " matching" }
                        " · page " (list.page + 1) " of " (list.pages)
                    }
                    button type="button" data-page=(list.page + 1) disabled[list.page + 1 >= list.pages] { "Next →" }
                }
            }
        }
    }
}

/// What a job's summary shows.
pub(super) struct Summary {
    pub(super) status: JobStatus,
    pub(super) module: Option<ModuleRecord>,
    pub(super) world: Option<String>,
    pub(super) rates: Rates,
}

/// A job's state, figures, module, tasks and shards.
pub(super) fn summary(s: &Summary) -> Markup {
    let job = &s.status;
    html! {
        div.panel {
            div.state-line {
                (state(job.state))
                @if let Some(reason) = &job.reason { span.reason #reason { (reason) } }
            }
            dl.figures {
                div { dt { "In" } dd #records-in-rate { (rate(s.rates.records_in.last().copied().unwrap_or(0))) } }
                div { dt { "Out" } dd #records-out-rate { (rate(s.rates.records_out.last().copied().unwrap_or(0))) } }
                div { dt { "Records in" } dd #records-in data-value=(job.records_in) { (count(job.records_in)) } }
                div { dt { "Records out" } dd #records-out { (count(job.records_out)) } }
                div { dt { "Lag" } dd { (count(job.lag_records)) " records" } }
                div { dt { "Last checkpoint" } dd {
                    @if job.last_checkpoint_age_seconds.is_some() {
                        "#" (job.last_checkpoint) " · " (checkpoint_age(job)) " · took " (seconds(job.last_checkpoint_seconds))
                    } @else { "none yet" }
                } }
                div { dt { "Checkpoints" } dd { (count(job.checkpoints)) } }
                div { dt { "Restarts" } dd #restarts { (job.restarts) } }
                div { dt { "Dead letters" } dd { (job.dead_letters) } }
                div { dt { "Late records" } dd { (count(job.late_records)) } }
                div { dt { "Timers fired" } dd { (count(job.timers_fired)) } }
                div { dt { "CPU" } dd { (format!("{:.1}", job.cpu_seconds)) " s" } }
                div { dt { "State" } dd { (bytes(job.state_bytes as f64)) } }
                div { dt { "Up" } dd { (job.uptime_seconds.map_or("—".to_owned(), ago)) } }
                @if job.restored_records > 0 {
                    div { dt { "Restored" } dd { (count(job.restored_records)) " records in " (seconds(job.restore_seconds)) } }
                }
            }
        }
        div.panel {
            h2 { "Module" }
            dl.figures {
                div { dt { "Name" } dd { (s.module.as_ref().map_or("—", |m| m.name.as_str())) } }
                div { dt { "Digest" } dd { code title=(job.module) { (job.module.get(..12).unwrap_or(&job.module)) } } }
                div { dt { "Size" } dd { (s.module.as_ref().map_or("—".to_owned(), |m| bytes(m.size as f64))) } }
                div { dt { "Language" } dd #language { (s.module.as_ref().and_then(|m| m.language.as_deref()).unwrap_or("not recorded")) } }
                div { dt { "World" } dd #world { (s.world.as_deref().unwrap_or("— (not loaded here)")) } }
            }
        }
        div.panel {
            h2 { "Tasks" }
            @if job.tasks.is_empty() {
                p.muted { "No task runs on this host." }
            } @else {
                table #tasks {
                    thead { tr {
                        th { "Task" } th { "Host" } th { "Shards" } th { "Phase" } th.num { "In" } th.num { "Out" }
                        th.num { "Lag" } th.num { "Checkpoint" } th.num { "Restarts" } th { "Last error" }
                    } }
                    tbody { @for t in &job.tasks { tr {
                        td { (t.index) }
                        td { (t.host.as_deref().unwrap_or("this host")) }
                        td { (t.shards.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")) }
                        td { (phase(t.phase)) }
                        td.num { (count(t.records_in)) }
                        td.num { (count(t.records_out)) }
                        td.num { (count(t.lag_records)) }
                        td.num { "#" (t.last_checkpoint) }
                        td.num { (t.restarts) }
                        td.reason { (t.last_error.as_deref().unwrap_or("")) }
                    } } }
                }
            }
            @let partitions: Vec<_> = job.tasks.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.index, p))).collect();
            @if !partitions.is_empty() {
                h2 { "Lag per partition" }
                table #partitions {
                    thead { tr { th { "Topic" } th.num { "Partition" } th.num { "Task" } th.num { "Lag" } } }
                    tbody { @for (task, p) in &partitions { tr {
                        td { (p.topic) } td.num { (p.partition) } td.num { (task) }
                        td.num data-value=(p.lag_records) { (count(p.lag_records)) }
                    } } }
                }
            }
            @if !job.shards.is_empty() {
                h2 { "Shards" }
                table #shards {
                    thead { tr {
                        th { "Shard" } th { "Task" } th.num { "Keys" } th.num { "Bytes" } th { "Watermark" } th.num { "Late records" }
                        th.num { "Checkpoint" } th { "State came from" }
                    } }
                    tbody { @for shard in &job.shards { tr {
                        td { (shard.shard) }
                        td { (shard.task) }
                        td.num { (count(shard.keys)) }
                        td.num { (bytes(shard.bytes as f64)) }
                        td { (shard.watermark.map_or("—".to_owned(), |w| clock(w.max(0) as u64))) }
                        td.num { (count(shard.late_records)) }
                        td.num { (shard.last_checkpoint.map_or("—".to_owned(), |c| format!("#{c}"))) }
                        td { (match shard.origin {
                            crate::checkpoint::ShardOrigin::Local => "local store".to_owned(),
                            crate::checkpoint::ShardOrigin::Changelog { records, seconds: took, .. } =>
                                format!("changelog ({} records, {})", count(records), seconds(took)),
                        }) }
                    } } }
                }
            }
        }
    }
}

/// A job's checkpoint history and failures.
pub(super) fn history(history: &JobHistory) -> Markup {
    html! {
        div.panel {
            h2 { "Checkpoints" }
            @if history.checkpoints.is_empty() {
                p.muted { "None on this host since the job started here." }
            } @else {
                table #checkpoints {
                    thead { tr {
                        th { "Task" } th.num { "Id" } th { "At" } th.num { "Total" } th.num { "Sync" } th.num { "Snapshot" }
                        th.num { "Bytes" } th.num { "Dirty keys" } th { "Result" }
                    } }
                    tbody { @for (task, c) in history.checkpoints.iter().take(crate::job::CHECKPOINTS_KEPT) {
                        (checkpoint_row(*task, c))
                    } }
                }
            }
        }
        div.panel {
            h2 { "Restarts and failures" }
            @if history.failures.is_empty() {
                p.muted { "None on this host since the job started here." }
            } @else {
                table #failures {
                    thead { tr { th { "Task" } th { "At" } th { "Then" } th { "Record" } th { "Reason" } } }
                    tbody { @for (task, f) in &history.failures { (failure_row(*task, f)) } }
                }
            }
        }
    }
}

fn checkpoint_row(task: usize, c: &CheckpointEntry) -> Markup {
    html! {
        tr.failed[c.failed.is_some()] {
            td { (task) }
            td.num { "#" (c.id) }
            td { (clock(c.at_ms)) }
            @if let Some(reason) = &c.failed {
                td colspan="5" {}
                td.reason { "failed: " (reason) }
            } @else {
                td.num { (seconds(c.commit_seconds)) }
                td.num { (seconds(c.sync_seconds)) }
                td.num { (seconds(c.snapshot_seconds)) }
                td.num { (bytes(c.bytes as f64)) }
                td.num { (count(c.dirty_keys)) }
                td { "committed" }
            }
        }
    }
}

fn failure_row(task: usize, f: &FailureEntry) -> Markup {
    html! {
        tr {
            td { (task) }
            td { (clock(f.at_ms)) }
            td { (if f.restarting { "restarted" } else { "failed for good" }) }
            td { @if let Some(r) = &f.record { code { (r.topic) "/" (r.partition) "@" (r.offset) } } @else { "—" } }
            td.reason { (f.reason) }
        }
    }
}

/// A job's controls, for its owner; `modules` is `None` for the admin.
pub(super) fn controls(tenant: &str, job: &JobStatus, modules: Option<&[ModuleRecord]>) -> Markup {
    let Some(modules) = modules else {
        return html! { p.muted { "Read-only: a job is controlled with its tenant's token." } };
    };
    let id = &job.id;
    let parallelism = job.tasks.first().map_or(1, |t| t.parallelism.max(1));
    html! {
        div.controls {
            button #stop type="button" hx-post=(job_ui(tenant, id, "stop")) hx-target="#operation"
                hx-confirm=(format!("Stop job {id}? It takes a final checkpoint, then stops until resumed.")) { "Stop" }
            button #resume type="button" hx-post=(job_ui(tenant, id, "resume")) hx-target="#operation"
                hx-confirm=(format!("Resume job {id} from its last checkpoint?")) { "Resume" }
            form #scale hx-post=(job_ui(tenant, id, "scale")) hx-target="#operation"
                hx-confirm=(format!("Change the parallelism of job {id}? It stops with a final checkpoint and starts again.")) {
                label { "Tasks " input name="parallelism" type="number" min="1" max="1024" value=(parallelism) required; }
                button type="submit" { "Scale" }
            }
            form #upgrade hx-post=(job_ui(tenant, id, "upgrade")) hx-target="#operation"
                hx-confirm=(format!("Upgrade job {id} to the chosen module? It stops with a final checkpoint and starts the new module over the same state.")) {
                label { "Module " select name="module" required {
                    @for m in modules {
                        option value=(m.digest) selected[m.digest == job.module] {
                            (m.name) " (" (m.digest.get(..12).unwrap_or(&m.digest)) ")"
                        }
                    }
                } }
                button type="submit" { "Upgrade" }
            }
        }
    }
}

/// What a control call did.
pub(super) enum Outcome {
    /// A slow operation to follow.
    Operation(Operation),
    /// The job was resumed.
    Resumed(Box<JobStatus>),
}

/// A control's outcome: an operation polls itself until it is done.
pub(super) fn outcome(outcome: Result<Outcome, String>) -> Markup {
    match outcome {
        Err(message) => html! { p.error.outcome { (message) } },
        Ok(Outcome::Resumed(job)) => html! { p.outcome.ok { "Resumed: the job is " (state_word(job.state)) "." } },
        Ok(Outcome::Operation(op)) => match op.state {
            OperationState::Pending => html! {
                div.outcome.pending hx-get=(format!("/ui/operations/{}", segment(&op.id))) hx-trigger="every 1s" hx-swap="outerHTML" {
                    span.spinner {} (op.kind) " of job " code { (op.job) } ": in progress…"
                }
            },
            OperationState::Succeeded => html! {
                p.outcome.ok { (op.kind) " of job " code { (op.job) } ": done." }
            },
            OperationState::Failed => html! {
                p.outcome.error { (op.kind) " of job " code { (op.job) } " failed: " (op.error.as_deref().unwrap_or("no reason given")) }
            },
        },
    }
}

/// A tenant's use of its policy, and its modules.
pub(super) fn tenant(usage: &TenantUsage, modules: &[ModuleRecord]) -> Markup {
    let policy = &usage.tenant.policy;
    html! {
        div.panel {
            h2 { "Use of the policy of " code { (usage.tenant.name) } }
            table #usage {
                thead { tr { th { "" } th.num { "Used" } th.num { "Limit" } th { "" } } }
                tbody {
                    (usage_row("Jobs", usage.jobs, |v| format!("{v:.0}")))
                    (usage_row("Tasks running", usage.tasks, |v| format!("{v:.0}")))
                    (usage_row("Modules", usage.modules, |v| format!("{v:.0}")))
                    (usage_row("Module bytes", usage.module_bytes, bytes))
                    (usage_row("Guest memory (reserved)", usage.memory_bytes, bytes))
                    (usage_row("State", usage.state_bytes, bytes))
                    tr { th { "CPU" } td.num { (format!("{:.1} s", usage.cpu_seconds)) } td.num { "—" } td {} }
                }
            }
            h2 { "Policy" }
            dl.figures {
                div { dt { "Topic prefixes" } dd { (policy.topic_prefixes.join(", ")) } }
                div { dt { "Parallelism" } dd { "at most " (policy.max_parallelism) } }
                div { dt { "Checkpoint interval" } dd { "at least " (policy.min_checkpoint_interval) } }
                div { dt { "Memory per task" } dd { (policy.limits.memory) } }
                div { dt { "Deadline per call" } dd { (policy.limits.deadline) } }
                div { dt { "State per task" } dd { (policy.limits.state) } }
            }
        }
        div.panel {
            h2 { "Modules" }
            @if modules.is_empty() { p.muted { "None uploaded." } } @else {
                table #modules {
                    thead { tr { th { "Name" } th { "Language" } th { "Digest" } th.num { "Size" } th { "Uploaded" } } }
                    tbody { @for m in modules { tr {
                        td { (m.name) } td { (m.language.as_deref().unwrap_or("—")) } td { code title=(m.digest) { (m.digest.get(..12).unwrap_or(&m.digest)) } }
                        td.num { (bytes(m.size as f64)) } td { (clock(m.uploaded_ms)) }
                    } } }
                }
            }
        }
    }
}

fn usage_row(name: &str, usage: Usage, show: impl Fn(f64) -> String) -> Markup {
    html! {
        tr {
            th { (name) }
            td.num { (show(usage.used)) }
            td.num { (usage.limit.map_or("none".to_owned(), &show)) }
            td { @if let Some(limit) = usage.limit { meter min="0" max=(limit) high=(limit * 0.8) value=(usage.used) {} } }
        }
    }
}

/// The host's figures and every tenant.
pub(super) fn admin(host: &HostFigures, tenants: &[TenantUsage]) -> Markup {
    html! {
        div.panel {
            dl.figures #host {
                @if let Some(id) = &host.host { div { dt { "Cluster member" } dd { code { (id) } } } }
                div { dt { "Tenants" } dd { (host.tenants) } }
                div { dt { "Jobs" } dd { (host.jobs) } }
                div { dt { "Jobs running here" } dd { (host.live_jobs) } }
                div { dt { "Tasks here" } dd { (host.tasks) " of " (host.pool_slots) " pool slots" } }
                div { dt { "Memory" } dd { (host.resident_bytes.map_or("—".to_owned(), |b| bytes(b as f64))) " resident" } }
            }
        }
        div.panel {
            h2 { "Tenants" }
            table #tenants {
                thead { tr {
                    th { "Tenant" } th.num { "Jobs" } th.num { "Tasks" } th.num { "Modules" } th.num { "State" }
                    th.num { "CPU" } th { "Topics" } th { "Limits per task" }
                } }
                tbody { @for t in tenants { tr {
                    td { (t.tenant.name) }
                    td.num { (of(t.jobs)) }
                    td.num { (of(t.tasks)) }
                    td.num { (of(t.modules)) }
                    td.num { (bytes(t.state_bytes.used)) }
                    td.num { (format!("{:.1} s", t.cpu_seconds)) }
                    td { (t.tenant.policy.topic_prefixes.join(", ")) }
                    td { (t.tenant.policy.limits.memory) ", " (t.tenant.policy.limits.deadline) " a call, " (t.tenant.policy.limits.state) " of state" }
                } } }
            }
        }
    }
}

fn of(usage: Usage) -> String {
    match usage.limit {
        Some(limit) => format!("{:.0} / {limit:.0}", usage.used),
        None => format!("{:.0}", usage.used),
    }
}

fn state_word(state: JobState) -> &'static str {
    match state {
        JobState::Starting => "starting",
        JobState::Running => "running",
        JobState::Restarting => "restarting",
        JobState::Stopping => "stopping",
        JobState::Upgrading => "upgrading",
        JobState::Rescaling => "rescaling",
        JobState::Stopped => "stopped",
        JobState::Failed => "failed",
    }
}

fn state(state: JobState) -> Markup {
    let word = state_word(state);
    html! { span class=(format!("state state-{word}")) { (word) } }
}

fn phase(phase: TaskPhase) -> &'static str {
    match phase {
        TaskPhase::Starting => "starting",
        TaskPhase::Running => "running",
        TaskPhase::Restarting => "restarting",
        TaskPhase::Failed => "failed",
        TaskPhase::Stopped => "stopped",
        TaskPhase::Sleeping => "sleeping",
    }
}

/// A line of the last `SPARK_SECONDS` of `points`, scaled to its peak.
fn sparkline(points: &[u32]) -> Markup {
    let peak = points.iter().copied().max().unwrap_or(0).max(1) as f64;
    let start = SPARK_SECONDS.saturating_sub(points.len());
    let line: Vec<String> = points
        .iter()
        .enumerate()
        .map(|(i, &p)| format!("{},{:.1}", start + i, 19.0 - 18.0 * f64::from(p) / peak))
        .collect();
    html! {
        svg.spark viewBox=(format!("0 0 {} 20", SPARK_SECONDS - 1)) preserveAspectRatio="none" aria-hidden="true" {
            polyline points=(line.join(" ")) {}
        }
    }
}

fn checkpoint_age(job: &JobStatus) -> String {
    job.last_checkpoint_age_seconds.map_or("—".to_owned(), |age| format!("{} ago", ago(age)))
}

/// Records per second, short.
fn rate(n: u32) -> String {
    format!("{}/s", count(u64::from(n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_the_address_bar_stay_one_path_segment() {
        assert_eq!(job_ui("acme", "a/../b?x", "summary"), "/ui/jobs/acme/a%2F..%2Fb%3Fx/summary");
    }

    #[test]
    fn a_reason_is_text_not_markup() {
        let mut status = super::super::list::tests::job("j\"><b>", JobState::Failed);
        status.reason = Some("<script>alert(1)</script>".into());
        let list = super::super::list::page(vec![("acme".into(), status)], &Default::default());
        let html = jobs(&list, &[Rates::default()], false).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{html}");
        assert!(!html.contains("\"><b>"), "{html}");
    }
}
