//! The host's own metadata, in one redb file: tenants and their token hashes,
//! modules, jobs with their desired state, and control operations.
//!
//! Every record is JSON under a string key (`<tenant>/<name>` for modules
//! and jobs), so the format is easy to read and to evolve. Every write is
//! durable before it returns: after a crash the host comes back with the
//! tenants, modules, jobs and operations it acknowledged, and restarts the
//! jobs whose desired state is running.

use std::path::Path;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::jobs::StoredOperation;
use super::{JobRecord, ModuleRecord, ServiceError, TenantRecord};

const TENANTS: TableDefinition<&str, &[u8]> = TableDefinition::new("tenants");
/// sha256 of a token (hex) -> tenant name.
const TOKENS: TableDefinition<&str, &str> = TableDefinition::new("tokens");
const MODULES: TableDefinition<&str, &[u8]> = TableDefinition::new("modules");
const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs");
/// `<tenant>/<operation id>` -> the operation.
const OPERATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("operations");

/// The metadata store.
pub(crate) struct MetaStore {
    db: Database,
}

fn internal(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> ServiceError {
    ServiceError::internal("metadata store", e)
}

impl MetaStore {
    /// Opens (or creates) the store at `path`.
    pub(crate) fn open(path: &Path) -> Result<Self, ServiceError> {
        let db = Database::create(path)
            .map_err(|e| ServiceError::internal(format!("opening the metadata store {}", path.display()), e))?;
        let store = MetaStore { db };
        store.write(|tx| {
            tx.open_table(TENANTS)?;
            tx.open_table(TOKENS)?;
            tx.open_table(MODULES)?;
            tx.open_table(JOBS)?;
            tx.open_table(OPERATIONS)?;
            Ok(())
        })?;
        Ok(store)
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

    fn get<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<T>, ServiceError> {
        let bytes = self.read(|tx| Ok(tx.open_table(table)?.get(key)?.map(|v| v.value().to_vec())))?;
        bytes
            .map(|b| {
                serde_json::from_slice(&b)
                    .map_err(|e| ServiceError::internal(format!("metadata store record {key}"), e))
            })
            .transpose()
    }

    fn put<T: Serialize>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
        record: &T,
    ) -> Result<(), ServiceError> {
        let bytes = serde_json::to_vec(record).map_err(internal)?;
        self.write(|tx| {
            tx.open_table(table)?.insert(key, bytes.as_slice())?;
            Ok(())
        })
    }

    fn remove(&self, table: TableDefinition<&str, &[u8]>, key: &str) -> Result<bool, ServiceError> {
        self.write(|tx| Ok(tx.open_table(table)?.remove(key)?.is_some()))
    }

    /// Records whose keys start with `prefix`, in key order.
    fn list<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        prefix: &str,
    ) -> Result<Vec<T>, ServiceError> {
        let raw: Vec<(String, Vec<u8>)> = self.read(|tx| {
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
        raw.into_iter()
            .map(|(key, bytes)| {
                serde_json::from_slice(&bytes)
                    .map_err(|e| ServiceError::internal(format!("metadata store record {key}"), e))
            })
            .collect()
    }

    // Tenants.

    pub(crate) fn tenant(&self, name: &str) -> Result<Option<TenantRecord>, ServiceError> {
        self.get(TENANTS, name)
    }

    pub(crate) fn tenants(&self) -> Result<Vec<TenantRecord>, ServiceError> {
        self.list(TENANTS, "")
    }

    /// Stores a tenant and maps its token hash to it, replacing the mapping
    /// of its previous token.
    pub(crate) fn put_tenant(&self, tenant: &TenantRecord, previous_token: Option<&str>) -> Result<(), ServiceError> {
        let bytes = serde_json::to_vec(tenant).map_err(internal)?;
        self.write(|tx| {
            tx.open_table(TENANTS)?.insert(tenant.name.as_str(), bytes.as_slice())?;
            let mut tokens = tx.open_table(TOKENS)?;
            if let Some(previous) = previous_token {
                tokens.remove(previous)?;
            }
            tokens.insert(tenant.token_sha256.as_str(), tenant.name.as_str())?;
            Ok(())
        })
    }

    /// The tenant whose token hashes to `token_sha256`.
    pub(crate) fn tenant_of_token(&self, token_sha256: &str) -> Result<Option<String>, ServiceError> {
        self.read(|tx| Ok(tx.open_table(TOKENS)?.get(token_sha256)?.map(|v| v.value().to_owned())))
    }

    // Modules.

    pub(crate) fn modules(&self, tenant: &str) -> Result<Vec<ModuleRecord>, ServiceError> {
        self.list(MODULES, &format!("{tenant}/"))
    }

    /// Every tenant's modules.
    pub(crate) fn all_modules(&self) -> Result<Vec<ModuleRecord>, ServiceError> {
        self.list(MODULES, "")
    }

    pub(crate) fn put_module(&self, module: &ModuleRecord) -> Result<(), ServiceError> {
        self.put(MODULES, &format!("{}/{}", module.tenant, module.digest), module)
    }

    pub(crate) fn remove_module(&self, tenant: &str, digest: &str) -> Result<bool, ServiceError> {
        self.remove(MODULES, &format!("{tenant}/{digest}"))
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

    pub(crate) fn put_job(&self, job: &JobRecord) -> Result<(), ServiceError> {
        self.put(JOBS, &format!("{}/{}", job.tenant, job.id), job)
    }

    pub(crate) fn remove_job(&self, tenant: &str, id: &str) -> Result<bool, ServiceError> {
        self.remove(JOBS, &format!("{tenant}/{id}"))
    }

    // Operations.

    pub(crate) fn operation(&self, tenant: &str, id: &str) -> Result<Option<StoredOperation>, ServiceError> {
        self.get(OPERATIONS, &format!("{tenant}/{id}"))
    }

    pub(crate) fn operations(&self, tenant: &str) -> Result<Vec<StoredOperation>, ServiceError> {
        self.list(OPERATIONS, &format!("{tenant}/"))
    }

    /// Every tenant's operations.
    pub(crate) fn all_operations(&self) -> Result<Vec<StoredOperation>, ServiceError> {
        self.list(OPERATIONS, "")
    }

    /// Stores `operation` and removes the tenant's operations `forget`, in
    /// one transaction.
    pub(crate) fn put_operation(&self, operation: &StoredOperation, forget: &[String]) -> Result<(), ServiceError> {
        let bytes = serde_json::to_vec(operation).map_err(internal)?;
        let tenant = &operation.tenant;
        self.write(|tx| {
            let mut table = tx.open_table(OPERATIONS)?;
            for id in forget {
                table.remove(format!("{tenant}/{id}").as_str())?;
            }
            table.insert(format!("{tenant}/{}", operation.operation.id).as_str(), bytes.as_slice())?;
            Ok(())
        })
    }

    /// Applies `change` to a stored operation in one transaction (so two
    /// changes never undo each other); false if there is no such operation.
    pub(crate) fn update_operation(
        &self,
        tenant: &str,
        id: &str,
        change: impl FnOnce(&mut StoredOperation),
    ) -> Result<bool, ServiceError> {
        let key = format!("{tenant}/{id}");
        let mut tx = self.db.begin_write().map_err(internal)?;
        tx.set_durability(Durability::Immediate).map_err(internal)?;
        {
            let mut table = tx.open_table(OPERATIONS).map_err(internal)?;
            let stored: Option<Vec<u8>> = table.get(key.as_str()).map_err(internal)?.map(|v| v.value().to_vec());
            let Some(bytes) = stored else { return Ok(false) };
            let mut operation: StoredOperation = serde_json::from_slice(&bytes)
                .map_err(|e| ServiceError::internal(format!("metadata store record {key}"), e))?;
            change(&mut operation);
            let bytes = serde_json::to_vec(&operation).map_err(internal)?;
            table.insert(key.as_str(), bytes.as_slice()).map_err(internal)?;
        }
        tx.commit().map_err(internal)?;
        Ok(true)
    }
}
