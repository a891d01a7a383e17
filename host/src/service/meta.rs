//! The host's own metadata, in one redb file: tenants and their token hashes,
//! modules, jobs with their desired state, and control operations.
//!
//! Every record is JSON under a string key, so the format is easy to read
//! and to evolve. Tenants, modules and jobs are *replicated* records: each
//! is written by a [`Change`] (conditions, then writes, all or nothing),
//! and each key carries the version that last wrote it. A host alone
//! decides a change here, in one redb transaction; a cluster member sends
//! it to the cluster ([`crate::cluster::log`]) and this store applies what
//! the cluster decided, in log order (it is the log's [`Replica`]). Either
//! way a caller that read a record can write it back "only if unchanged",
//! so two control calls never undo each other, on one host or on two.
//! Control operations are replicated records too, so a tenant can poll an
//! operation through any member; a deleted operation leaves no version
//! behind (nothing asks whether operations changed since a view).
//!
//! Every write is durable before it returns: after a crash the host comes
//! back with the tenants, modules, jobs and operations it acknowledged, and
//! restarts the jobs whose desired state is running.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::jobs::StoredOperation;
use super::{JobRecord, ModuleRecord, OperationState, ServiceError, TenantRecord};
use crate::cluster::log::{BoxError, Change, Condition, Link, Record, Refused, Replica, Write};

const TENANTS: TableDefinition<&str, &[u8]> = TableDefinition::new("tenants");
/// sha256 of a token (hex) -> tenant name; derived from the tenants.
const TOKENS: TableDefinition<&str, &str> = TableDefinition::new("tokens");
const MODULES: TableDefinition<&str, &[u8]> = TableDefinition::new("modules");
const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs");
/// Cluster-wide records other than the above (`cluster`: who the cluster is).
const SHARED: TableDefinition<&str, &[u8]> = TableDefinition::new("shared");
/// Replicated key -> the version that last wrote it (deleted keys too, so
/// "nothing under this prefix changed" sees deletions).
const VERSIONS: TableDefinition<&str, u64> = TableDefinition::new("versions");
/// `view`: the latest version applied; `next-offset`: in a cluster, the
/// meta topic's offset after the last record applied.
const PROGRESS: TableDefinition<&str, u64> = TableDefinition::new("progress");
/// `<tenant>/<operation id>` -> the operation.
const OPERATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("operations");
/// The keys of [`OPERATIONS`] still pending: what the supervisor looks at
/// twice a second, without reading every tenant's finished operations.
/// Derived from the operations; rebuilt whenever the store opens.
const PENDING: TableDefinition<&str, ()> = TableDefinition::new("pending-operations");

/// The replicated key of a tenant.
pub(crate) fn tenant_key(name: &str) -> String {
    format!("tenant/{name}")
}

/// The replicated key of a module.
pub(crate) fn module_key(tenant: &str, digest: &str) -> String {
    format!("module/{tenant}/{digest}")
}

/// The replicated prefix of a tenant's modules.
pub(crate) fn modules_prefix(tenant: &str) -> String {
    format!("module/{tenant}/")
}

/// The replicated key of a job.
pub(crate) fn job_key(tenant: &str, id: &str) -> String {
    format!("job/{tenant}/{id}")
}

/// The replicated prefix of a tenant's jobs.
pub(crate) fn jobs_prefix(tenant: &str) -> String {
    format!("job/{tenant}/")
}

/// The replicated key of a control operation.
pub(crate) fn operation_key(tenant: &str, id: &str) -> String {
    format!("operation/{tenant}/{id}")
}

/// The replicated key of the cluster's own record.
pub(crate) const CLUSTER_KEY: &str = "cluster";

/// A replicated record and the version that wrote it.
struct Versioned<T> {
    record: T,
    version: u64,
}

/// The redb file, shared by the store and (in a cluster) its log's applier.
struct Db {
    db: Database,
}

/// The metadata store.
#[derive(Clone)]
pub(crate) struct MetaStore {
    db: Arc<Db>,
    /// In a cluster: where changes are decided.
    link: Option<Arc<Link>>,
}

fn internal(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> ServiceError {
    ServiceError::internal("metadata store", e)
}

/// Which table and key a replicated key is stored under.
fn place(key: &str) -> Option<(TableDefinition<'static, &'static str, &'static [u8]>, &str)> {
    if let Some(name) = key.strip_prefix("tenant/") {
        Some((TENANTS, name))
    } else if let Some(rest) = key.strip_prefix("module/") {
        Some((MODULES, rest))
    } else if let Some(rest) = key.strip_prefix("job/") {
        Some((JOBS, rest))
    } else if let Some(rest) = key.strip_prefix("operation/") {
        Some((OPERATIONS, rest))
    } else if key == CLUSTER_KEY {
        Some((SHARED, key))
    } else {
        None
    }
}

impl Db {
    fn open(path: &Path) -> Result<Db, ServiceError> {
        let db = Database::create(path)
            .map_err(|e| ServiceError::internal(format!("opening the metadata store {}", path.display()), e))?;
        let db = Db { db };
        db.write(|tx| {
            tx.open_table(TENANTS)?;
            tx.open_table(TOKENS)?;
            tx.open_table(MODULES)?;
            tx.open_table(JOBS)?;
            tx.open_table(SHARED)?;
            tx.open_table(VERSIONS)?;
            tx.open_table(PROGRESS)?;
            // Operations stored before the index was kept, or by a host
            // that did not keep it, are indexed afresh.
            tx.delete_table(PENDING)?;
            let operations = tx.open_table(OPERATIONS)?;
            let mut pending = tx.open_table(PENDING)?;
            for entry in operations.iter()? {
                let (key, value) = entry?;
                if is_pending(value.value()) {
                    pending.insert(key.value(), ())?;
                }
            }
            Ok(())
        })?;
        Ok(db)
    }

    fn write<T>(
        &self,
        body: impl FnOnce(&redb::WriteTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, ServiceError> {
        let mut tx = self.db.begin_write().map_err(internal)?;
        tx.set_durability(Durability::Immediate).map_err(internal)?;
        let value = body(&tx).map_err(internal)?;
        tx.commit().map_err(internal)?;
        Ok(value)
    }

    fn read<T>(&self, body: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>) -> Result<T, ServiceError> {
        let tx = self.db.begin_read().map_err(internal)?;
        body(&tx).map_err(internal)
    }
}

/// Applies one replicated write at `version`, keeping the token index in
/// step with the tenants.
fn apply_write(tx: &redb::WriteTransaction, key: &str, value: Option<&[u8]>, version: u64) -> Result<(), redb::Error> {
    let Some((table, inner)) = place(key) else {
        // A key of a newer host version: kept out of the tables, versioned
        // all the same.
        tx.open_table(VERSIONS)?.insert(key, version)?;
        return Ok(());
    };
    if table.name() == TENANTS.name() {
        let token_of = |bytes: &[u8]| serde_json::from_slice::<TenantRecord>(bytes).ok().map(|t| t.token_sha256);
        let previous = tx.open_table(TENANTS)?.get(inner)?.and_then(|v| token_of(v.value()));
        let mut tokens = tx.open_table(TOKENS)?;
        if let Some(previous) = previous {
            tokens.remove(previous.as_str())?;
        }
        if let Some(token) = value.and_then(token_of).filter(|t| !t.is_empty()) {
            tokens.insert(token.as_str(), inner)?;
        }
    }
    let operation = table.name() == OPERATIONS.name();
    if operation {
        let mut pending = tx.open_table(PENDING)?;
        match value.is_some_and(is_pending) {
            true => pending.insert(inner, ())?,
            false => pending.remove(inner)?,
        };
    }
    let mut table = tx.open_table(table)?;
    match value {
        Some(value) => table.insert(inner, value)?,
        None => table.remove(inner)?,
    };
    // Operations come and go (a tenant keeps its newest hundred): a
    // forgotten one's version would only pile up.
    let mut versions = tx.open_table(VERSIONS)?;
    match (operation, value) {
        (true, None) => versions.remove(key)?,
        _ => versions.insert(key, version)?,
    };
    Ok(())
}

/// Whether `record` is a job's record that an upgrade has changed (for the
/// `apply-upgrade` failpoint).
fn is_upgraded_job(record: &Record) -> bool {
    #[derive(serde::Deserialize)]
    struct Upgrades {
        #[serde(default)]
        upgrades: u64,
    }
    record.key.starts_with("job/")
        && record
            .value
            .as_deref()
            .and_then(|v| serde_json::from_slice::<Upgrades>(v).ok())
            .is_some_and(|j| j.upgrades > 0)
}

/// Whether a stored operation is still pending.
fn is_pending(bytes: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct State {
        state: crate::service::OperationState,
    }
    serde_json::from_slice::<State>(bytes).is_ok_and(|s| s.state == crate::service::OperationState::Pending)
}

/// The first of `conditions` that does not hold in `tx`'s view, where keys
/// in `written` count as changed.
fn first_failing(
    tx: &impl ReadTables,
    conditions: &[Condition],
    written: &HashSet<String>,
) -> Result<Option<usize>, redb::Error> {
    for (index, condition) in conditions.iter().enumerate() {
        let holds = match condition {
            Condition::Version { key, version } => {
                if written.contains(key) {
                    false
                } else {
                    let present = match place(key) {
                        Some((table, inner)) => tx.has(table, inner)?,
                        None => false,
                    };
                    match version {
                        None => !present,
                        // A record stored before versions were kept is at 0.
                        Some(version) => present && tx.version(key)?.unwrap_or(0) == *version,
                    }
                }
            }
            Condition::Quiet { prefix, since } => {
                !written.iter().any(|k| k.starts_with(prefix.as_str())) && tx.latest_under(prefix)? <= *since
            }
        };
        if !holds {
            return Ok(Some(index));
        }
    }
    Ok(None)
}

/// What [`first_failing`] and the progress reads need, from a read or a
/// write transaction.
trait ReadTables {
    fn has(&self, table: TableDefinition<&str, &[u8]>, key: &str) -> Result<bool, redb::Error>;
    fn version(&self, key: &str) -> Result<Option<u64>, redb::Error>;
    fn latest_under(&self, prefix: &str) -> Result<u64, redb::Error>;
    fn progress(&self, name: &str) -> Result<u64, redb::Error>;
}

fn latest_in(table: &impl ReadableTable<&'static str, u64>, prefix: &str) -> Result<u64, redb::Error> {
    let mut latest = 0;
    for entry in table.range(prefix..)? {
        let (key, version) = entry?;
        if !key.value().starts_with(prefix) {
            break;
        }
        latest = latest.max(version.value());
    }
    Ok(latest)
}

/// redb's two transaction types open tables alike but share no trait.
macro_rules! read_tables {
    ($transaction:ty) => {
        impl ReadTables for $transaction {
            fn has(&self, table: TableDefinition<&str, &[u8]>, key: &str) -> Result<bool, redb::Error> {
                Ok(self.open_table(table)?.get(key)?.is_some())
            }
            fn version(&self, key: &str) -> Result<Option<u64>, redb::Error> {
                Ok(self.open_table(VERSIONS)?.get(key)?.map(|v| v.value()))
            }
            fn latest_under(&self, prefix: &str) -> Result<u64, redb::Error> {
                latest_in(&self.open_table(VERSIONS)?, prefix)
            }
            fn progress(&self, name: &str) -> Result<u64, redb::Error> {
                Ok(self.open_table(PROGRESS)?.get(name)?.map_or(0, |v| v.value()))
            }
        }
    };
}

read_tables!(redb::ReadTransaction);
read_tables!(redb::WriteTransaction);

impl Replica for Db {
    fn next_offset(&self) -> Result<u64, BoxError> {
        Ok(self.read(|tx| tx.progress("next-offset"))?)
    }

    fn apply(&self, records: &[Record], next_offset: u64) -> Result<(), BoxError> {
        if crate::failpoint::is_armed("apply-upgrade") && records.iter().any(is_upgraded_job) {
            crate::failpoint::hit("apply-upgrade");
        }
        Ok(self.write(|tx| {
            let mut view = tx.progress("view")?;
            for record in records {
                apply_write(tx, &record.key, record.value.as_deref(), record.version)?;
                view = view.max(record.version);
            }
            let mut progress = tx.open_table(PROGRESS)?;
            progress.insert("view", view)?;
            progress.insert("next-offset", next_offset)?;
            Ok(())
        })?)
    }

    fn first_failing(&self, conditions: &[Condition], written: &HashSet<String>) -> Result<Option<usize>, BoxError> {
        Ok(self.read(|tx| first_failing(tx, conditions, written))?)
    }
}

/// A change of one record: `record` (or its deletion) under `key`, if
/// `conditions` hold.
pub(crate) fn change<T: Serialize>(
    key: String,
    record: Option<&T>,
    conditions: Vec<Condition>,
) -> Result<Change, ServiceError> {
    let value = record.map(serde_json::to_value).transpose().map_err(internal)?;
    Ok(Change { conditions, writes: vec![Write { key, value }] })
}

impl MetaStore {
    /// Opens (or creates) the store of a host alone at `path`.
    pub(crate) fn open(path: &Path) -> Result<Self, ServiceError> {
        Ok(MetaStore { db: Arc::new(Db::open(path)?), link: None })
    }

    /// Opens the store of a cluster member at `path` and follows the
    /// cluster's log; returns once it has caught up.
    pub(crate) fn open_member(
        path: &Path,
        identity: crate::cluster::Identity,
        brokers: &str,
    ) -> Result<Self, ServiceError> {
        let db = Arc::new(Db::open(path)?);
        let replica: Arc<dyn Replica> = db.clone();
        let link = Link::start(identity, brokers, replica, std::time::Duration::from_secs(120))
            .map_err(|e| ServiceError::internal("joining the cluster", e))?;
        Ok(MetaStore { db, link: Some(link) })
    }

    /// The cluster's log, for a member.
    pub(crate) fn link(&self) -> Option<&Arc<Link>> {
        self.link.as_ref()
    }

    /// The latest version this store has applied: the `since` of a
    /// [`Condition::Quiet`] over what was read after it.
    pub(crate) fn view(&self) -> Result<u64, ServiceError> {
        self.db.read(|tx| tx.progress("view"))
    }

    /// Decides `change` (alone) or has the cluster decide it (member);
    /// returns once it is applied here, or refused.
    pub(crate) fn commit(&self, change: Change) -> Result<Result<(), Refused>, ServiceError> {
        if let Some(link) = &self.link {
            return link.submit(change).map_err(|e| match e {
                crate::cluster::log::LinkError::Timeout(_) | crate::cluster::log::LinkError::Stopped => {
                    ServiceError::Unavailable(e.to_string())
                }
                e => ServiceError::internal("writing the cluster's metadata", e),
            });
        }
        let mut encoded = Vec::with_capacity(change.writes.len());
        for write in &change.writes {
            encoded.push((
                write.key.as_str(),
                write.value.as_ref().map(serde_json::to_vec).transpose().map_err(internal)?,
            ));
        }
        self.db.write(|tx| {
            if let Some(index) = first_failing(tx, &change.conditions, &HashSet::new())? {
                return Ok(Err(Refused { condition: change.conditions[index].clone() }));
            }
            let version = tx.progress("view")? + 1;
            for (key, value) in &encoded {
                apply_write(tx, key, value.as_deref(), version)?;
            }
            tx.open_table(PROGRESS)?.insert("view", version)?;
            Ok(Ok(()))
        })
    }

    fn get<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<T>, ServiceError> {
        let bytes = self.db.read(|tx| Ok(tx.open_table(table)?.get(key)?.map(|v| v.value().to_vec())))?;
        bytes.map(|b| decode(key, &b)).transpose()
    }

    /// A replicated record with its version, read together.
    fn get_versioned<T: DeserializeOwned>(&self, key: &str) -> Result<Option<Versioned<T>>, ServiceError> {
        let Some((table, inner)) = place(key) else { return Ok(None) };
        let found = self.db.read(|tx| {
            let Some(bytes) = tx.open_table(table)?.get(inner)?.map(|v| v.value().to_vec()) else { return Ok(None) };
            Ok(Some((bytes, tx.version(key)?.unwrap_or(0))))
        })?;
        found.map(|(bytes, version)| Ok(Versioned { record: decode(key, &bytes)?, version })).transpose()
    }

    /// Records whose keys start with `prefix`, in key order.
    fn list<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        prefix: &str,
    ) -> Result<Vec<T>, ServiceError> {
        let raw: Vec<(String, Vec<u8>)> = self.db.read(|tx| {
            let table = tx.open_table(table)?;
            let mut out = Vec::new();
            for entry in table.range(prefix..)? {
                let (key, value) = entry?;
                if !key.value().starts_with(prefix) {
                    break;
                }
                out.push((key.value().to_owned(), value.value().to_vec()));
            }
            Ok(out)
        })?;
        raw.into_iter().map(|(key, bytes)| decode(&key, &bytes)).collect()
    }

    // The cluster.

    /// The cluster's own record (members only).
    pub(crate) fn cluster<T: DeserializeOwned>(&self) -> Result<Option<T>, ServiceError> {
        self.get(SHARED, CLUSTER_KEY)
    }

    // Tenants.

    pub(crate) fn tenant(&self, name: &str) -> Result<Option<TenantRecord>, ServiceError> {
        self.get(TENANTS, name)
    }

    pub(crate) fn tenants(&self) -> Result<Vec<TenantRecord>, ServiceError> {
        self.list(TENANTS, "")
    }

    /// The tenant whose token hashes to `token_sha256`.
    pub(crate) fn tenant_of_token(&self, token_sha256: &str) -> Result<Option<String>, ServiceError> {
        self.db.read(|tx| Ok(tx.open_table(TOKENS)?.get(token_sha256)?.map(|v| v.value().to_owned())))
    }

    // Modules.

    pub(crate) fn modules(&self, tenant: &str) -> Result<Vec<ModuleRecord>, ServiceError> {
        self.list(MODULES, &format!("{tenant}/"))
    }

    /// Every tenant's modules.
    pub(crate) fn all_modules(&self) -> Result<Vec<ModuleRecord>, ServiceError> {
        self.list(MODULES, "")
    }

    // Jobs.

    pub(crate) fn job(&self, tenant: &str, id: &str) -> Result<Option<JobRecord>, ServiceError> {
        self.get(JOBS, &format!("{tenant}/{id}"))
    }

    pub(crate) fn jobs(&self, tenant: &str) -> Result<Vec<JobRecord>, ServiceError> {
        self.list(JOBS, &format!("{tenant}/"))
    }

    /// Every tenant's jobs.
    pub(crate) fn all_jobs(&self) -> Result<Vec<JobRecord>, ServiceError> {
        self.list(JOBS, "")
    }

    /// Changes a job by `edit`; see [`update`](Self::update).
    pub(crate) fn update_job(
        &self,
        tenant: &str,
        id: &str,
        edit: impl FnMut(&mut JobRecord) -> Result<(), ServiceError>,
    ) -> Result<Option<JobRecord>, ServiceError> {
        self.update(&job_key(tenant, id), &format!("job `{id}`"), edit)
    }

    /// Changes a job by `edit` only if no job of the tenant changed since
    /// `since`, the view its tenant's task count was read in: a resume
    /// through one member and another job's resume or create through
    /// another cannot both pass `max-tasks` (a scale is not yet held to
    /// this). `None`: no such job; `Conflict` when a job changed.
    pub(crate) fn update_job_if_quiet(
        &self,
        tenant: &str,
        id: &str,
        since: u64,
        edit: impl FnOnce(&mut JobRecord),
    ) -> Result<Option<JobRecord>, ServiceError> {
        let key = job_key(tenant, id);
        let Some(Versioned { mut record, version }) = self.get_versioned::<JobRecord>(&key)? else { return Ok(None) };
        edit(&mut record);
        let conditions = vec![
            Condition::Version { key: key.clone(), version: Some(version) },
            Condition::Quiet { prefix: jobs_prefix(tenant), since },
        ];
        match self.commit(change(key, Some(&record), conditions)?)? {
            Ok(()) => Ok(Some(record)),
            Err(_) => Err(ServiceError::Conflict(format!(
                "your jobs changed while job `{id}` was being started (its tasks were counted before): try again"
            ))),
        }
    }

    /// Changes a job by `edit` for the pending operation `operation` (an
    /// upgrade or a rescale switching the job): written only if neither the
    /// job nor the operation changed since they were read, in one change, so
    /// that this switch and a member giving the operation up
    /// ([`give_up_operation`](Self::give_up_operation)) never both take
    /// effect. `Conflict` once the operation is no longer pending.
    pub(crate) fn update_job_for(
        &self,
        tenant: &str,
        id: &str,
        operation: &str,
        mut edit: impl FnMut(&mut JobRecord) -> Result<(), ServiceError>,
    ) -> Result<Option<JobRecord>, ServiceError> {
        let watched = operation_key(tenant, operation);
        let (key, what) = (job_key(tenant, id), format!("job `{id}`"));
        let switch = |record: &mut JobRecord, op: Option<&StoredOperation>| {
            let Some(stored) = op else {
                return Err(ServiceError::Conflict(format!("operation `{operation}` is gone")));
            };
            if stored.operation.state != OperationState::Pending {
                let why = stored.operation.error.as_deref().unwrap_or_default();
                return Err(ServiceError::Conflict(format!(
                    "operation `{operation}` was given up by another member before this host switched the job: {why}"
                )));
            }
            edit(record).map(|()| true)
        };
        let updated = self.update_watching(&key, &what, Some(&watched), switch)?;
        Ok(updated.map(|(record, _)| record))
    }

    /// Fails the pending operation `operation` of job `job` with `error` if
    /// `still` holds of it and of the job's record (`None`: deleted), written
    /// only if neither changed since they were read (see
    /// [`update_job_for`](Self::update_job_for)). Whether it was failed here.
    pub(crate) fn give_up_operation(
        &self,
        tenant: &str,
        job: &str,
        operation: &str,
        error: &str,
        still: impl Fn(&StoredOperation, Option<&JobRecord>) -> bool,
    ) -> Result<bool, ServiceError> {
        let (key, watched) = (operation_key(tenant, operation), job_key(tenant, job));
        let what = format!("operation `{operation}`");
        let updated = self.update_watching(&key, &what, Some(&watched), |record: &mut StoredOperation, job| {
            if record.operation.state != OperationState::Pending || !still(record, job) {
                return Ok(false);
            }
            record.operation.state = OperationState::Failed;
            record.operation.error = Some(error.to_owned());
            Ok(true)
        })?;
        Ok(updated.is_some_and(|(_, written)| written))
    }

    /// Changes the cluster's own record by `edit`; see [`update`](Self::update).
    pub(crate) fn update_cluster<T: Serialize + DeserializeOwned>(
        &self,
        edit: impl FnMut(&mut T) -> Result<(), ServiceError>,
    ) -> Result<Option<T>, ServiceError> {
        self.update(CLUSTER_KEY, "the cluster's record", edit)
    }

    /// Changes a module record by `edit`; see [`update`](Self::update).
    pub(crate) fn update_module(
        &self,
        tenant: &str,
        digest: &str,
        edit: impl FnMut(&mut ModuleRecord) -> Result<(), ServiceError>,
    ) -> Result<Option<ModuleRecord>, ServiceError> {
        self.update(&module_key(tenant, digest), &format!("module {digest}"), edit)
    }

    /// Deletes a module record if `still` holds of it, on the condition that
    /// it did not change since it was read. Whether it was deleted.
    pub(crate) fn remove_module_if(
        &self,
        tenant: &str,
        digest: &str,
        still: impl Fn(&ModuleRecord) -> bool,
    ) -> Result<bool, ServiceError> {
        let key = module_key(tenant, digest);
        for _ in 0..UPDATE_ATTEMPTS {
            let Some(Versioned { record, version }) = self.get_versioned::<ModuleRecord>(&key)? else {
                return Ok(false);
            };
            if !still(&record) {
                return Ok(false);
            }
            let unchanged = Condition::Version { key: key.clone(), version: Some(version) };
            if self.commit(change::<ModuleRecord>(key.clone(), None, vec![unchanged])?)?.is_ok() {
                return Ok(true);
            }
        }
        Err(ServiceError::Conflict(format!("module {digest} kept changing under this call: try again")))
    }

    /// Changes a tenant by `edit`; see [`update`](Self::update).
    pub(crate) fn update_tenant(
        &self,
        name: &str,
        edit: impl FnMut(&mut TenantRecord) -> Result<(), ServiceError>,
    ) -> Result<Option<TenantRecord>, ServiceError> {
        self.update(&tenant_key(name), &format!("tenant `{name}`"), edit)
    }

    /// Changes the record under `key` by `edit`, written back only if it is
    /// unchanged since it was read (else read again and retried a few
    /// times); `Ok(None)` if there is no such record. `edit` may refuse
    /// with an error.
    fn update<T: Serialize + DeserializeOwned>(
        &self,
        key: &str,
        what: &str,
        mut edit: impl FnMut(&mut T) -> Result<(), ServiceError>,
    ) -> Result<Option<T>, ServiceError> {
        Ok(self.update_unless(key, what, |record| edit(record).map(|()| true))?.map(|(record, _)| record))
    }

    /// [`update`](Self::update), where `edit` may also leave the record as
    /// it is (by returning false: nothing is written); with the record,
    /// whether it was written.
    fn update_unless<T: Serialize + DeserializeOwned>(
        &self,
        key: &str,
        what: &str,
        mut edit: impl FnMut(&mut T) -> Result<bool, ServiceError>,
    ) -> Result<Option<(T, bool)>, ServiceError> {
        self.update_watching::<T, ()>(key, what, None, |record, _| edit(record))
    }

    /// [`update_unless`](Self::update_unless), where `edit` also sees the
    /// record under `watched` (`None`: absent), read beside it, and the
    /// write applies only if that one too is unchanged since it was read:
    /// one record written on a condition on two.
    fn update_watching<T: Serialize + DeserializeOwned, W: DeserializeOwned>(
        &self,
        key: &str,
        what: &str,
        watched: Option<&str>,
        mut edit: impl FnMut(&mut T, Option<&W>) -> Result<bool, ServiceError>,
    ) -> Result<Option<(T, bool)>, ServiceError> {
        for _ in 0..UPDATE_ATTEMPTS {
            let Some(Versioned { mut record, version }) = self.get_versioned::<T>(key)? else { return Ok(None) };
            let seen = watched.map(|w| self.get_versioned::<W>(w)).transpose()?;
            if !edit(&mut record, seen.as_ref().and_then(|s| s.as_ref()).map(|s| &s.record))? {
                return Ok(Some((record, false)));
            }
            let mut conditions = vec![Condition::Version { key: key.to_owned(), version: Some(version) }];
            if let Some(watched) = watched {
                let version = seen.flatten().map(|s| s.version);
                conditions.push(Condition::Version { key: watched.to_owned(), version });
            }
            if self.commit(change(key.to_owned(), Some(&record), conditions)?)?.is_ok() {
                return Ok(Some((record, true)));
            }
        }
        Err(ServiceError::Conflict(format!("{what} kept changing under this call: try again")))
    }

    // Operations.

    pub(crate) fn operation(&self, tenant: &str, id: &str) -> Result<Option<StoredOperation>, ServiceError> {
        self.get(OPERATIONS, &format!("{tenant}/{id}"))
    }

    pub(crate) fn operations(&self, tenant: &str) -> Result<Vec<StoredOperation>, ServiceError> {
        self.list(OPERATIONS, &format!("{tenant}/"))
    }

    /// Every tenant's pending operations, read through their index.
    pub(crate) fn pending_operations(&self) -> Result<Vec<StoredOperation>, ServiceError> {
        let raw: Vec<(String, Vec<u8>)> = self.db.read(|tx| {
            let (pending, operations) = (tx.open_table(PENDING)?, tx.open_table(OPERATIONS)?);
            let mut out = Vec::new();
            for entry in pending.iter()? {
                let key = entry?.0.value().to_owned();
                if let Some(bytes) = operations.get(key.as_str())? {
                    out.push((key, bytes.value().to_vec()));
                }
            }
            Ok(out)
        })?;
        raw.into_iter().map(|(key, bytes)| decode(&key, &bytes)).collect()
    }

    /// Stores the new `operation` and removes the tenant's operations
    /// `forget`, in one change.
    pub(crate) fn put_operation(&self, operation: &StoredOperation, forget: &[String]) -> Result<(), ServiceError> {
        let tenant = &operation.tenant;
        let key = operation_key(tenant, &operation.operation.id);
        let absent = Condition::Version { key: key.clone(), version: None };
        let mut new = change(key, Some(operation), vec![absent])?;
        new.writes.extend(forget.iter().map(|id| Write { key: operation_key(tenant, id), value: None }));
        self.commit(new)?.map_err(|refused| {
            ServiceError::internal("storing an operation", format!("refused: {:?}", refused.condition))
        })
    }

    /// Applies `edit` to a stored operation, written back only if it is
    /// unchanged since it was read (so two members finishing the same
    /// operation never undo each other); `edit` returns false to leave it
    /// as it is. False if there is no such operation or `edit` left it.
    pub(crate) fn update_operation(
        &self,
        tenant: &str,
        id: &str,
        mut edit: impl FnMut(&mut StoredOperation) -> bool,
    ) -> Result<bool, ServiceError> {
        let updated =
            self.update_unless(&operation_key(tenant, id), &format!("operation `{id}`"), |record| Ok(edit(record)))?;
        Ok(updated.is_some_and(|(_, written)| written))
    }
}

/// How often a read-modify-write is retried when the record changed under it.
const UPDATE_ATTEMPTS: usize = 5;

fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, ServiceError> {
    serde_json::from_slice(bytes).map_err(|e| ServiceError::internal(format!("metadata store record {key}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::Policy;

    fn tenant(name: &str, token: &str) -> TenantRecord {
        TenantRecord { name: name.into(), token_sha256: token.into(), policy: Policy::default_for(name), created_ms: 0 }
    }

    fn create(store: &MetaStore, record: &TenantRecord) -> Result<(), Refused> {
        let key = tenant_key(&record.name);
        let absent = Condition::Version { key: key.clone(), version: None };
        store.commit(change(key, Some(record), vec![absent]).expect("change")).expect("commit")
    }

    #[test]
    fn a_create_applies_once_and_the_token_index_follows_the_tenant() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(&dir.path().join("meta.redb")).expect("open");
        assert_eq!(create(&store, &tenant("acme", "t1")), Ok(()));
        let refused = create(&store, &tenant("acme", "t2")).expect_err("second create");
        assert!(matches!(refused.condition, Condition::Version { version: None, .. }));
        assert_eq!(store.tenant_of_token("t1").expect("read").as_deref(), Some("acme"));
        assert_eq!(store.tenant_of_token("t2").expect("read"), None, "the refused write left no token");
        store
            .update_tenant("acme", |t| {
                t.token_sha256 = "t3".into();
                Ok(())
            })
            .expect("rotate");
        assert_eq!(store.tenant_of_token("t1").expect("read"), None, "the old token still maps");
        assert_eq!(store.tenant_of_token("t3").expect("read").as_deref(), Some("acme"));
        let key = tenant_key("acme");
        store.commit(change::<TenantRecord>(key, None, Vec::new()).expect("change")).expect("commit").expect("delete");
        assert_eq!(store.tenant_of_token("t3").expect("read"), None, "a deleted tenant's token still maps");
    }

    #[test]
    fn a_write_based_on_a_stale_read_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(&dir.path().join("meta.redb")).expect("open");
        create(&store, &tenant("acme", "t1")).expect("create");
        let Versioned { record, version } =
            store.get_versioned::<TenantRecord>(&tenant_key("acme")).expect("read").expect("some");
        store
            .update_tenant("acme", |t| {
                t.policy.max_jobs = 1;
                Ok(())
            })
            .expect("update");
        let stale = Condition::Version { key: tenant_key("acme"), version: Some(version) };
        let outcome =
            store.commit(change(tenant_key("acme"), Some(&record), vec![stale]).expect("change")).expect("commit");
        assert!(outcome.is_err(), "a write based on a stale read undid another");
        assert_eq!(store.tenant("acme").expect("read").expect("some").policy.max_jobs, 1);

        // "Nothing under the prefix changed since": a deletion counts.
        let view = store.view().expect("view");
        let quiet = || Condition::Quiet { prefix: "tenant/".into(), since: view };
        let other = tenant("globex", "t2");
        store
            .commit(change(tenant_key("globex"), Some(&other), vec![quiet()]).expect("change"))
            .expect("commit")
            .expect("quiet");
        let late = change(tenant_key("initech"), Some(&tenant("initech", "t3")), vec![quiet()]).expect("change");
        assert!(store.commit(late).expect("commit").is_err(), "a write after the view went unnoticed");
        let view = store.view().expect("view");
        store
            .commit(change::<TenantRecord>(tenant_key("globex"), None, Vec::new()).expect("c"))
            .expect("c")
            .expect("delete");
        let after_delete = change(
            tenant_key("initech"),
            Some(&tenant("initech", "t3")),
            vec![Condition::Quiet { prefix: "tenant/".into(), since: view }],
        )
        .expect("change");
        assert!(store.commit(after_delete).expect("commit").is_err(), "a deletion after the view went unnoticed");
    }

    fn operation(id: &str) -> StoredOperation {
        use crate::service::{Operation, OperationState};
        let operation = Operation {
            id: id.into(),
            kind: "stop".into(),
            job: "j".into(),
            state: OperationState::Pending,
            error: None,
        };
        StoredOperation { operation, tenant: "acme".into(), created_ms: 0, target: None, host: None }
    }

    #[test]
    fn an_operation_is_finished_once_and_a_forgotten_one_leaves_no_version() {
        use crate::service::OperationState;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(&dir.path().join("meta.redb")).expect("open");
        store.put_operation(&operation("op-1"), &[]).expect("put");
        let pending = |store: &MetaStore| -> Vec<String> {
            store.pending_operations().expect("pending").into_iter().map(|o| o.operation.id).collect()
        };
        assert_eq!(pending(&store), ["op-1"]);
        let finish = |state| {
            store
                .update_operation("acme", "op-1", |stored| {
                    if stored.operation.state != OperationState::Pending {
                        return false;
                    }
                    stored.operation.state = state;
                    true
                })
                .expect("update")
        };
        assert!(finish(OperationState::Succeeded));
        assert!(!finish(OperationState::Failed), "a finished operation was finished again");
        assert_eq!(pending(&store), Vec::<String>::new(), "a finished operation is still indexed as pending");
        let stored = store.operation("acme", "op-1").expect("read").expect("some");
        assert_eq!(stored.operation.state, OperationState::Succeeded);
        assert!(store.put_operation(&operation("op-1"), &[]).is_err(), "an operation id was stored twice");

        store.put_operation(&operation("op-2"), &["op-1".into()]).expect("put and forget");
        let ids: Vec<String> = store.operations("acme").expect("list").into_iter().map(|o| o.operation.id).collect();
        assert_eq!(ids, ["op-2"]);
        let version = store.db.read(|tx| tx.version(&operation_key("acme", "op-1"))).expect("read");
        assert_eq!(version, None, "a forgotten operation kept its version");

        // The index is rebuilt from the operations when the store opens.
        drop(store);
        let store = MetaStore::open(&dir.path().join("meta.redb")).expect("open again");
        assert_eq!(pending(&store), ["op-2"]);
    }

    #[test]
    fn records_stored_before_versions_were_kept_can_be_updated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("meta.redb");
        {
            // What an earlier host wrote: the record, no version.
            let db = Database::create(&path).expect("create");
            let tx = db.begin_write().expect("tx");
            let bytes = serde_json::to_vec(&tenant("acme", "t1")).expect("json");
            tx.open_table(TENANTS).expect("table").insert("acme", bytes.as_slice()).expect("insert");
            tx.open_table(TOKENS).expect("table").insert("t1", "acme").expect("insert");
            tx.commit().expect("commit");
        }
        let store = MetaStore::open(&path).expect("open");
        let updated = store.update_tenant("acme", |t| {
            t.policy.max_jobs = 2;
            Ok(())
        });
        assert_eq!(updated.expect("update").map(|t| t.policy.max_jobs), Some(2));
        assert_eq!(store.tenant_of_token("t1").expect("read").as_deref(), Some("acme"));
    }
}
