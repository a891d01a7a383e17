//! The read side of the service that the dashboard shows: a caller's
//! session, jobs named by tenant and id (so the admin can look at every
//! tenant's), a job's history and throughput, a tenant's use of its
//! policy, and the host's own figures.
//!
//! What it must never do: show a tenant anything of another tenant. Every
//! lookup goes through [`Service::visible_record`], which answers a
//! tenant's question about another tenant's job exactly as it answers one
//! about a job that does not exist (404), as the API does.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use serde::Serialize;

use super::jobs::{JobStatus, Live, Slot, key, lock};
use super::throughput::{Counters, Rates};
use super::{Caller, JobRecord, LogLine, ModuleRecord, Result, Service, ServiceError, TenantRecord};
use crate::job::{CheckpointEntry, FailureEntry, now_ms};

/// Who a token belongs to, for the dashboard's sign-in.
#[derive(Debug, Clone, Serialize)]
pub struct Session {
    /// `admin` or `tenant`.
    pub role: &'static str,
    /// The tenant, for a tenant's token.
    pub tenant: Option<String>,
}

/// What a job's tasks on this host did lately.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JobHistory {
    /// Checkpoints, per task, newest first across tasks.
    pub checkpoints: Vec<(usize, CheckpointEntry)>,
    /// Failures, per task, newest first across tasks.
    pub failures: Vec<(usize, FailureEntry)>,
}

/// What a job's last run on this host left behind when its threads ended.
#[derive(Debug, Clone)]
pub(super) struct LastRun {
    /// Its checkpoints and failures.
    history: JobHistory,
    /// Its figures then, and when (ms); `None` when it left for another
    /// member.
    figures: Option<(JobStatus, u64)>,
}

/// A figure against its limit.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Usage {
    /// How much is used.
    pub used: f64,
    /// The policy's limit; `None`: no limit.
    pub limit: Option<f64>,
}

/// A tenant's use of its policy.
#[derive(Debug, Clone, Serialize)]
pub struct TenantUsage {
    /// The tenant and its policy.
    pub tenant: TenantRecord,
    /// Jobs, running or stopped.
    pub jobs: Usage,
    /// Tasks of running jobs on this host (each holds an instance slot).
    pub tasks: Usage,
    /// Modules uploaded.
    pub modules: Usage,
    /// Bytes of those modules.
    pub module_bytes: Usage,
    /// Guest memory the running tasks may take: tasks x each job's limit
    /// (the limit: per task, times the tasks the tenant may run).
    pub memory_bytes: Usage,
    /// Bytes of state of the running tasks (the limit: per task, times the
    /// tasks the tenant may run).
    pub state_bytes: Usage,
    /// CPU time of the running jobs' task threads.
    pub cpu_seconds: f64,
}

/// The host's own figures, for the admin.
#[derive(Debug, Clone, Serialize)]
pub struct HostFigures {
    /// Tenants.
    pub tenants: usize,
    /// Jobs, every tenant, running or stopped.
    pub jobs: usize,
    /// Jobs with threads in this process.
    pub live_jobs: usize,
    /// Their tasks.
    pub tasks: usize,
    /// Guest instances the host may run at once (the pool's slots).
    pub pool_slots: u32,
    /// The process's resident memory, where the OS tells it.
    pub resident_bytes: Option<u64>,
    /// In a cluster: this member's host id.
    pub host: Option<String>,
}

impl Service {
    /// Who the caller is.
    pub fn session(&self, caller: &Caller) -> Session {
        match caller {
            Caller::Admin => Session { role: "admin", tenant: None },
            Caller::Tenant(name) => Session { role: "tenant", tenant: Some(name.clone()) },
        }
    }

    /// `tenant`'s job `id`, if the caller may see it: the admin sees every
    /// job, a tenant only its own; anything else is not found.
    pub fn visible_record(&self, caller: &Caller, tenant: &str, id: &str) -> Result<JobRecord> {
        let not_found = || ServiceError::NotFound(format!("no job `{id}`"));
        if let Caller::Tenant(own) = caller
            && own != tenant
        {
            return Err(not_found());
        }
        self.fresh(|| self.meta.job(tenant, id)?.ok_or_else(not_found))
    }

    /// The jobs the caller may see, with their tenants: a tenant's own, or
    /// every tenant's for the admin.
    pub fn visible_jobs(&self, caller: &Caller) -> Result<Vec<(String, JobStatus)>> {
        let records = match caller {
            Caller::Admin => self.meta.all_jobs()?,
            Caller::Tenant(name) => self.meta.jobs(name)?,
        };
        let jobs = lock(&self.jobs);
        Ok(records.iter().map(|r| (r.tenant.clone(), self.status_of(r, jobs.get(&key(&r.tenant, &r.id))))).collect())
    }

    /// One job's status, named by tenant and id.
    pub fn visible_job(&self, caller: &Caller, tenant: &str, id: &str) -> Result<JobStatus> {
        let record = self.visible_record(caller, tenant, id)?;
        let jobs = lock(&self.jobs);
        Ok(self.status_of(&record, jobs.get(&key(tenant, id))))
    }

    /// The module a job runs, as uploaded, and its world when this host has
    /// it loaded.
    pub fn job_module(&self, caller: &Caller, tenant: &str, id: &str) -> Result<(Option<ModuleRecord>, Option<&str>)> {
        let record = self.visible_record(caller, tenant, id)?;
        let digest = record.spec.module.to_string_lossy().into_owned();
        let module = self.meta.modules(tenant)?.into_iter().find(|m| m.digest == digest);
        let world = self.runtime.loaded_module(&digest).map(|m| m.world());
        Ok((module, world))
    }

    /// The checkpoints and failures of a job's tasks on this host.
    pub fn job_history(&self, caller: &Caller, tenant: &str, id: &str) -> Result<JobHistory> {
        self.visible_record(caller, tenant, id)?;
        let key = key(tenant, id);
        if let Some(Slot::Live(live)) = lock(&self.jobs).get(&key) {
            return Ok(history_of(live));
        }
        Ok(lock(&self.last_runs).get(&key).map(|run| run.history.clone()).unwrap_or_default())
    }

    /// Keeps the history and the figures of a job whose threads ended here.
    /// A job that left for another member keeps its history only: its
    /// figures go on there.
    pub(super) fn keep_last_run(&self, tenant: &str, id: &str, live: &Live) {
        let figures = (!live.released).then(|| (self.status_from(&live.record, Some(live), None), now_ms()));
        lock(&self.last_runs).insert(key(tenant, id), LastRun { history: history_of(live), figures });
    }

    /// `status` (of a job with no threads here, stopped or failed) with the
    /// figures its last run here ended with: what it had read, written and
    /// checkpointed, its restarts and dead letters, its shards. It runs no
    /// task, so it shows none, no lag and no uptime.
    pub(super) fn with_last_run(&self, tenant: &str, status: JobStatus) -> JobStatus {
        let runs = lock(&self.last_runs);
        let Some((last, ended_ms)) = runs.get(&key(tenant, &status.id)).and_then(|run| run.figures.as_ref()) else {
            return status;
        };
        let since_end = now_ms().saturating_sub(*ended_ms) as f64 / 1e3;
        JobStatus {
            last_checkpoint_age_seconds: last.last_checkpoint_age_seconds.map(|age| age + since_end),
            shards: last.shards.clone(),
            tasks: Vec::new(),
            lag_records: 0,
            uptime_seconds: None,
            hosts: Vec::new(),
            // The job's state and why come from now, not from the run.
            id: status.id,
            module: status.module,
            state: status.state,
            desired: status.desired,
            reason: status.reason,
            ..last.clone()
        }
    }

    /// Forgets the figures of a job's last run once its positions or state
    /// were reset: they describe input and state it no longer has. Its
    /// history stays.
    pub(super) fn forget_last_figures(&self, tenant: &str, id: &str) {
        if let Some(run) = lock(&self.last_runs).get_mut(&key(tenant, id)) {
            run.figures = None;
        }
    }

    /// Forgets the history of a deleted job's last run.
    pub(super) fn forget_last_run(&self, tenant: &str, id: &str) {
        lock(&self.last_runs).remove(&key(tenant, id));
    }

    /// A job's records in and out per second on this host, its newest
    /// `seconds` at most.
    pub fn job_rates(&self, caller: &Caller, tenant: &str, id: &str, seconds: usize) -> Result<Rates> {
        self.visible_record(caller, tenant, id)?;
        Ok(self.throughput.rates(tenant, id, seconds))
    }

    /// Every visible job's newest `seconds` of rates, by tenant and id.
    pub fn visible_rates(&self, jobs: &[(String, JobStatus)], seconds: usize) -> Vec<Rates> {
        jobs.iter().map(|(tenant, status)| self.throughput.rates(tenant, &status.id, seconds)).collect()
    }

    /// A job's log lines after `after`, at most `limit`.
    pub fn visible_job_logs(
        &self,
        caller: &Caller,
        tenant: &str,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LogLine>> {
        let record = self.visible_record(caller, tenant, id)?;
        Ok(self.logs_of(&record, after, limit))
    }

    /// `tenant`'s use of its policy: the tenant itself or the admin.
    pub fn tenant_usage(&self, caller: &Caller, tenant: &str) -> Result<TenantUsage> {
        if let Caller::Tenant(own) = caller
            && own != tenant
        {
            return Err(ServiceError::NotFound(format!("no tenant `{tenant}`")));
        }
        let record = self.tenant(tenant)?;
        let policy = &record.policy;
        let modules = self.meta.modules(tenant)?;
        let records = self.meta.jobs(tenant)?;
        let size = |text: &str| crate::units::parse_size(text).ok().map(|bytes| bytes as u64);
        let max_tasks = u64::from(policy.max_tasks);
        let (mut tasks, mut memory, mut state, mut cpu) = (0u64, 0u64, 0u64, 0.0);
        {
            let jobs = lock(&self.jobs);
            for record in &records {
                let Some(Slot::Live(live)) = jobs.get(&key(tenant, &record.id)) else { continue };
                for (_, task) in live.job.local_status() {
                    tasks += 1;
                    memory += live.job.config().limits.memory_bytes as u64;
                    state += task.state_bytes.load(Ordering::Relaxed);
                    cpu += task.cpu_micros.load(Ordering::Relaxed) as f64 / 1e6;
                }
            }
        }
        let of = |used: u64, limit: Option<u64>| Usage { used: used as f64, limit: limit.map(|l| l as f64) };
        Ok(TenantUsage {
            jobs: of(records.len() as u64, Some(u64::from(policy.max_jobs))),
            tasks: of(tasks, Some(max_tasks)),
            modules: of(modules.len() as u64, Some(u64::from(policy.max_modules))),
            module_bytes: of(modules.iter().map(|m| m.size).sum(), size(&policy.module_bytes)),
            memory_bytes: of(memory, size(&policy.limits.memory).map(|m| m * max_tasks)),
            state_bytes: of(state, size(&policy.limits.state).map(|s| s * max_tasks)),
            cpu_seconds: cpu,
            tenant: record.without_secrets(),
        })
    }

    /// Every tenant with its usage (admin).
    pub fn all_tenant_usage(&self, caller: &Caller) -> Result<Vec<TenantUsage>> {
        caller.admin()?;
        self.meta.tenants()?.iter().map(|t| self.tenant_usage(caller, &t.name)).collect()
    }

    /// The host's own figures (admin).
    pub fn host_figures(&self, caller: &Caller) -> Result<HostFigures> {
        caller.admin()?;
        let (live_jobs, tasks) = {
            let jobs = lock(&self.jobs);
            jobs.values().fold((0, 0), |(jobs, tasks), slot| match slot {
                Slot::Live(live) => (jobs + 1, tasks + live.job.local_status().count()),
                Slot::Busy(_) => (jobs, tasks),
            })
        };
        Ok(HostFigures {
            tenants: self.meta.tenants()?.len(),
            jobs: self.meta.all_jobs()?.len(),
            live_jobs,
            tasks,
            pool_slots: self.config.max_instances,
            resident_bytes: resident_bytes(),
            host: self.meta.link().map(|link| link.identity().host.clone()),
        })
    }

    /// One throughput sample of every job running here or, in a cluster,
    /// on another member (once a second; the supervisor calls it every
    /// pass). A task is counted once: where it runs here, else as the
    /// newest publication shows it.
    pub(super) fn sample_throughput(&self) {
        let me = self.meta.link().map(|link| link.identity().host.clone()).unwrap_or_default();
        let mut jobs: HashMap<(String, String), Counters> = HashMap::new();
        {
            let live = lock(&self.jobs);
            for (key, slot) in live.iter() {
                let Slot::Live(live) = slot else { continue };
                let sources = live.job.local_status().map(|(index, task)| {
                    let counters = [task.records_in.load(Ordering::Relaxed), task.records_out.load(Ordering::Relaxed)];
                    ((me.clone(), index), counters)
                });
                jobs.entry(key.clone()).or_default().extend(sources);
            }
        }
        if let Some(board) = &self.board {
            board.each_other(now_ms(), |job, published| {
                let Some((tenant, id)) = job.split_once('/') else { return };
                let sources = jobs.entry((tenant.to_owned(), id.to_owned())).or_default();
                let tasks = published.status["tasks"].as_array().map(Vec::as_slice).unwrap_or_default();
                for task in tasks {
                    let figure = |name: &str| task[name].as_u64().unwrap_or(0);
                    let Some(index) = task["index"].as_u64().and_then(|i| usize::try_from(i).ok()) else { continue };
                    if sources.iter().all(|((_, i), _)| *i != index) {
                        sources.push(((published.host.clone(), index), [figure("records_in"), figure("records_out")]));
                    }
                }
            });
        }
        self.throughput.sample(now_ms(), jobs);
    }
}

/// The process's resident set size, from `VmRSS` in `/proc/self/status`
/// (Linux; in kB, so no page size is assumed).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The checkpoints and failures of `live`'s tasks that run here, newest
/// first.
fn history_of(live: &Live) -> JobHistory {
    let mut history = JobHistory::default();
    for (index, task) in live.job.local_status() {
        history.checkpoints.extend(task.history.checkpoints().into_iter().map(|c| (index, c)));
        history.failures.extend(task.history.failures().into_iter().map(|f| (index, f)));
    }
    history.checkpoints.sort_by(|a, b| b.1.at_ms.cmp(&a.1.at_ms).then(b.1.id.cmp(&a.1.id)));
    history.failures.sort_by_key(|f| std::cmp::Reverse(f.1.at_ms));
    history
}
