//! Modules on the shared host: uploads, lookups, deletes, and collecting
//! the bytes no module record names any more.
//!
//! An upload is decided before any byte of it is kept, and its bytes go
//! with its record:
//! 1. checked (size: 413; name: 400; the tenant's limits, on what was read
//!    after a view: 403), validated and compiled (422);
//! 2. a *pending* record of it is committed, under the condition that no
//!    module of the tenant changed since the view (another upload or a
//!    delete: 409, nothing kept): the upload now counts against the
//!    tenant's limits, but no job may use it;
//! 3. its bytes are stored and, in a cluster, written to the modules topic
//!    as this upload's chunks ([`crate::cluster::chunks`]);
//! 4. the record is made usable, if it is still this upload's.
//!
//! A failure after 2 *abandons* the upload: its record (if still its), its
//! chunks (tombstones), and the bytes and compiled code if no record names
//! them. Deleting a module abandons its upload the same way, after its
//! record is gone. In a cluster every member's follower drops the bytes
//! once their last upload's chunks are deleted. What a crash leaves is
//! collected too: a host abandons its own pending uploads when it starts,
//! and the supervisor ([`Service::sweep_modules`]) those pending for longer
//! than any request can take, chunks no record names, and module files no
//! record names.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::meta::{self, MetaStore};
use super::{Caller, ModuleRecord, Result, Service, ServiceError, UPLOAD_PREFIX, Upload};
use crate::cluster::chunks::{self, LEGACY_UPLOAD};
use crate::cluster::log::Condition;
use crate::runtime::{Runtime, sha256_hex};

/// How long after it began an upload still pending is taken for abandoned
/// (its host died): well past the longest a request may take.
const ABANDONED_AFTER: Duration = Duration::from_secs(15 * 60);
/// How often the supervisor collects modules' leftovers.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// What a cluster member's module follower asks of the host's records.
pub(super) struct RecordIndex {
    pub(super) meta: MetaStore,
    pub(super) runtime: Arc<Runtime>,
}

impl chunks::ModuleIndex for RecordIndex {
    fn names(&self, digest: &str) -> bool {
        // Kept when in doubt: a read that fails leaves the bytes for the
        // sweeper.
        self.meta.all_modules().map_or(true, |modules| modules.iter().any(|m| m.digest == digest))
    }

    fn dropped(&self, digest: &str) {
        self.runtime.forget_cached(digest);
    }
}

impl Service {
    pub(super) fn module_path(&self, digest: &str) -> PathBuf {
        self.config.data_dir.join("modules").join(format!("{digest}.wasm"))
    }

    /// Validates, compiles (cached for every later job) and stores a module
    /// (see the module docs for the steps). Slow for large modules (a 15 MB
    /// component compiles in ~20 s on two cores): call it off the async
    /// runtime.
    pub fn push_module(&self, caller: &Caller, name: Option<&str>, upload: Upload) -> Result<ModuleRecord> {
        let tenant = caller.tenant()?;
        let Upload { file, digest, size } = upload;
        if size > self.config.max_module_bytes as u64 {
            return Err(ServiceError::TooLarge(format!(
                "the module is {size} bytes; this host accepts at most {}",
                self.config.max_module_bytes
            )));
        }
        let name = name.unwrap_or(&digest[..12]).to_owned();
        if name.is_empty() || name.chars().count() > 100 || name.chars().any(|c| c.is_control() || c == '/') {
            return Err(ServiceError::BadRequest(format!("module name {name:?}: use 1-100 characters, no `/`")));
        }
        let policy = self.tenant(tenant)?.policy;
        // 1. Limits are checked on what was read after `view` (uploads being
        // stored included), and the upload is decided only if no module of
        // the tenant changed since.
        let view = self.meta.view()?;
        let mine = self.meta.modules(tenant)?;
        if let Some(existing) = mine.iter().find(|m| m.digest == digest) {
            if existing.pending {
                return Err(ServiceError::Conflict(format!(
                    "module {digest} is being uploaded already: try again once that upload has finished"
                )));
            }
            if existing.name != name {
                return Err(ServiceError::Conflict(format!(
                    "these bytes are already your module `{}` ({}); use that name, or delete it first",
                    existing.name, existing.digest
                )));
            }
            // The same bytes under the same name: stored already.
            return Ok(existing.clone());
        }
        let used: u64 = mine.iter().map(|m| m.size).sum();
        let allowed = crate::units::parse_size(&policy.module_bytes)
            .map_err(|e| ServiceError::internal("the policy's module-bytes", e))? as u64;
        if mine.len() >= policy.max_modules as usize {
            return Err(ServiceError::Forbidden(format!(
                "your policy allows {} modules and you have {}: delete one first",
                policy.max_modules,
                mine.len()
            )));
        }
        if used + size > allowed {
            return Err(ServiceError::Forbidden(format!(
                "your policy allows {allowed} bytes of modules; you have {used} and this one is {size}: delete one \
                 first"
            )));
        }
        // Validated (and compiled, or found in the compile cache) before it
        // is decided: a bad module is never named.
        let bytes = std::fs::read(file.path()).map_err(|e| ServiceError::internal("reading the upload", e))?;
        if let Err(e) = self.runtime.load(&bytes) {
            self.drop_unnamed_bytes(&digest);
            return Err(ServiceError::Unprocessable(e.to_string()));
        }
        // 2. Decided before any byte is kept.
        let mut record = ModuleRecord {
            digest: digest.clone(),
            tenant: tenant.to_owned(),
            name,
            size,
            uploaded_ms: crate::job::now_ms(),
            language: crate::runtime::source_language(&bytes).map(str::to_owned),
            upload: Some(format!("{:016x}", crate::checkpoint::random_id())),
            pending: true,
            host: self.meta.link().map(|link| link.identity().host.clone()),
        };
        crate::failpoint::hit("upload-before-decide");
        let quiet = Condition::Quiet { prefix: meta::modules_prefix(tenant), since: view };
        let key = meta::module_key(tenant, &digest);
        let decided = meta::change(key, Some(&record), vec![quiet]).and_then(|change| self.meta.commit(change));
        match decided {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                self.drop_unnamed_bytes(&digest);
                return Err(ServiceError::Conflict(
                    "your modules changed while this one was being stored (another upload or delete): try again".into(),
                ));
            }
            Err(e) => {
                self.drop_unnamed_bytes(&digest);
                return Err(e);
            }
        }
        // 3 and 4.
        if let Err(e) = self.store_upload(&record, file, &bytes) {
            tracing::warn!(tenant, module = %digest, "abandoning an upload: {e}");
            self.abandon_upload(&record);
            return Err(e);
        }
        record.pending = false;
        record.host = None;
        tracing::info!(tenant, module = %record.digest, name = %record.name, size = record.size, "module stored");
        Ok(record)
    }

    /// Steps 3 and 4 of an upload whose pending `record` is decided.
    fn store_upload(&self, record: &ModuleRecord, file: tempfile::NamedTempFile, bytes: &[u8]) -> Result<()> {
        let io = |e: std::io::Error| ServiceError::internal("storing the module", e);
        let path = self.module_path(&record.digest);
        if !path.is_file() {
            // Durable before it is named: a power loss never leaves a
            // partial module under its digest.
            file.as_file().sync_all().map_err(io)?;
            file.persist(&path).map_err(|e| io(e.error))?;
            crate::fsutil::sync_dir_of(&path).map_err(io)?;
        }
        if let Some(link) = self.meta.link() {
            // The bytes reach every member before the record lets a job
            // name them.
            let topic = crate::cluster::Topics::of(&link.identity().cluster).modules;
            let config = crate::kafka::client_config(&self.config.brokers, &Default::default());
            let upload = record.upload.as_deref().unwrap_or(LEGACY_UPLOAD);
            chunks::publish(&config, &topic, &record.digest, upload, bytes)
                .map_err(|e| ServiceError::internal("sending the module to the cluster", e))?;
        }
        if crate::failpoint::fails("upload-before-activate") {
            return Err(ServiceError::Unavailable("failpoint `upload-before-activate`".into()));
        }
        let activated = self.meta.update_module(&record.tenant, &record.digest, |stored| {
            if stored.upload != record.upload {
                return Err(ServiceError::Conflict(format!(
                    "module {} was deleted while it was being stored: upload it again",
                    record.digest
                )));
            }
            stored.pending = false;
            stored.host = None;
            Ok(())
        })?;
        activated.map(drop).ok_or_else(|| {
            ServiceError::Conflict(format!(
                "module {} was deleted while it was being stored: upload it again",
                record.digest
            ))
        })
    }

    /// Undoes an upload whose record `record` was: the record if it is still
    /// this upload's, then its bytes ([`delete_upload_bytes`](Self::delete_upload_bytes)).
    /// Failures are logged: the sweeper collects what is left.
    fn abandon_upload(&self, record: &ModuleRecord) {
        if let Err(e) =
            self.meta.remove_module_if(&record.tenant, &record.digest, |stored| stored.upload == record.upload)
        {
            tracing::warn!(module = %record.digest, "removing an abandoned upload's record: {e}");
        }
        self.delete_upload_bytes(record);
    }

    /// After the upload's record is gone: its chunks in a cluster (every
    /// member's follower then drops the bytes no upload is left of), and
    /// this host's bytes and compiled code if no record names them.
    fn delete_upload_bytes(&self, record: &ModuleRecord) {
        if let Some(link) = self.meta.link() {
            let upload = record.upload.as_deref().unwrap_or(LEGACY_UPLOAD);
            // Chunks of hosts before uploads were named are shared by every
            // record of the same bytes.
            let shared = upload == LEGACY_UPLOAD && self.names(&record.digest);
            if !shared {
                let topic = crate::cluster::Topics::of(&link.identity().cluster).modules;
                let config = crate::kafka::client_config(&self.config.brokers, &Default::default());
                let count = chunks::chunk_count(record.size);
                if let Err(e) = chunks::delete(&config, &topic, &record.digest, upload, count) {
                    tracing::warn!(module = %record.digest, upload, "deleting a module's chunks: {e}");
                }
            }
        }
        self.drop_unnamed_bytes(&record.digest);
    }

    /// Removes `digest`'s bytes and compiled code from this host unless a
    /// record names them (an upload of the same bytes may be under way).
    fn drop_unnamed_bytes(&self, digest: &str) {
        if self.names(digest) {
            return;
        }
        match std::fs::remove_file(self.module_path(digest)) {
            Ok(()) => tracing::info!(module = digest, "removed the bytes of a module no record names"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(module = digest, "removing a module's bytes: {e}"),
        }
        self.runtime.forget_cached(digest);
    }

    /// Whether a module record (of any tenant, stored or being stored)
    /// names `digest`; true when the records cannot be read.
    fn names(&self, digest: &str) -> bool {
        self.meta.all_modules().map_or(true, |modules| modules.iter().any(|m| m.digest == digest))
    }

    /// At start: abandons the uploads this host was storing when it
    /// stopped (alone: every pending upload; a member: its own).
    pub(super) fn abandon_own_uploads(&self) -> Result<()> {
        let me = self.meta.link().map(|link| link.identity().host.clone());
        for record in self.meta.all_modules()?.into_iter().filter(|m| m.pending && (me.is_none() || m.host == me)) {
            tracing::info!(tenant = %record.tenant, module = %record.digest, "abandoning an upload cut short by a restart");
            self.abandon_upload(&record);
        }
        Ok(())
    }

    /// The supervisor's collection of what uploads and deletes left (see
    /// the module docs), at most every [`SWEEP_EVERY`].
    pub(super) fn sweep_modules(&self) {
        {
            let mut last = super::jobs::lock(&self.last_module_sweep);
            if last.is_some_and(|at| at.elapsed() < SWEEP_EVERY) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        let modules = match self.meta.all_modules() {
            Ok(modules) => modules,
            Err(e) => {
                tracing::warn!("collecting modules: {e}");
                return;
            }
        };
        let now = crate::job::now_ms();
        let old = |ms: u64| now.saturating_sub(ms) > ABANDONED_AFTER.as_millis() as u64;
        // Uploads pending long after any request could have stored them.
        for record in modules.iter().filter(|m| m.pending && old(m.uploaded_ms)) {
            tracing::info!(tenant = %record.tenant, module = %record.digest, "abandoning an upload its host left");
            self.abandon_upload(record);
        }
        let dir = self.config.data_dir.join("modules");
        let aged = |at: SystemTime| at.elapsed().is_ok_and(|age| age > ABANDONED_AFTER);
        // A member: chunks of uploads no record names (their host died
        // between deleting the record and the chunks).
        if self.meta.link().is_some() {
            for seen in chunks::seen_uploads(&dir).into_iter().filter(|s| aged(s.seen)) {
                let upload = (seen.upload != LEGACY_UPLOAD).then_some(seen.upload.as_str());
                if modules.iter().any(|m| m.digest == seen.digest && m.upload.as_deref() == upload) {
                    continue;
                }
                let record = ModuleRecord {
                    digest: seen.digest.clone(),
                    size: (seen.count * chunks::CHUNK_BYTES) as u64,
                    upload: upload.map(str::to_owned),
                    ..ModuleRecord::default()
                };
                tracing::info!(module = %seen.digest, upload = %seen.upload, "deleting the chunks of an upload no record names");
                self.delete_upload_bytes(&record);
                let index = RecordIndex { meta: self.meta.clone(), runtime: Arc::clone(&self.runtime) };
                if let Err(e) = chunks::forget_upload(&dir, &seen.digest, &seen.upload, &index) {
                    tracing::warn!(module = %seen.digest, "forgetting an upload: {e}");
                }
            }
        }
        // Module files no record names.
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(digest) = name.strip_suffix(".wasm").filter(|_| !name.starts_with(UPLOAD_PREFIX)) else {
                continue;
            };
            let modified = entry.metadata().and_then(|m| m.modified());
            if modified.is_ok_and(aged) && !modules.iter().any(|m| m.digest == digest) {
                self.drop_unnamed_bytes(digest);
            }
        }
    }

    /// An upload of `bytes` already in memory (for callers inside the
    /// process; the API streams into [`new_upload_file`](Self::new_upload_file)).
    pub fn upload_bytes(&self, bytes: &[u8]) -> Result<Upload> {
        use std::io::Write as _;
        let mut file = self.new_upload_file()?;
        file.write_all(bytes).map_err(|e| ServiceError::internal("writing the upload", e))?;
        Ok(Upload { file, digest: sha256_hex(bytes), size: bytes.len() as u64 })
    }

    /// A new, empty upload file beside the stored modules (so storing it is
    /// a rename); removed when dropped unless stored.
    pub fn new_upload_file(&self) -> Result<tempfile::NamedTempFile> {
        tempfile::Builder::new()
            .prefix(UPLOAD_PREFIX)
            .tempfile_in(self.config.data_dir.join("modules"))
            .map_err(|e| ServiceError::internal("creating an upload file", e))
    }

    /// The caller's modules (not those still being uploaded).
    pub fn modules(&self, caller: &Caller) -> Result<Vec<ModuleRecord>> {
        Ok(self.meta.modules(caller.tenant()?)?.into_iter().filter(|m| !m.pending).collect())
    }

    /// One of the caller's modules, by digest (or a unique prefix of at least
    /// 8 characters) or by name (the latest upload with that name).
    pub fn module(&self, caller: &Caller, reference: &str) -> Result<ModuleRecord> {
        let tenant = caller.tenant()?;
        self.fresh(|| self.module_of(tenant, reference))
    }

    /// [`module`](Self::module) as this member knows it now.
    fn module_of(&self, tenant: &str, reference: &str) -> Result<ModuleRecord> {
        let modules: Vec<ModuleRecord> = self.meta.modules(tenant)?.into_iter().filter(|m| !m.pending).collect();
        let reference = reference.strip_prefix("sha256:").unwrap_or(reference);
        let by_digest: Vec<&ModuleRecord> = if reference.len() >= 8 {
            modules.iter().filter(|m| m.digest.starts_with(reference)).collect()
        } else {
            Vec::new()
        };
        match by_digest.as_slice() {
            [one] => return Ok((*one).clone()),
            [] => {}
            _ => return Err(ServiceError::BadRequest(format!("module `{reference}` is ambiguous: give more digits"))),
        }
        modules
            .iter()
            .filter(|m| m.name == reference)
            .max_by_key(|m| m.uploaded_ms)
            .cloned()
            .ok_or_else(|| ServiceError::NotFound(format!("no module `{reference}`")))
    }

    /// Deletes one of the caller's modules, then its bytes wherever no
    /// record names them; refused while a job of the caller uses it.
    pub fn delete_module(&self, caller: &Caller, reference: &str) -> Result<()> {
        let tenant = caller.tenant()?;
        let view = self.meta.view()?;
        let module = self.module(caller, reference)?;
        if let Some(job) =
            self.meta.jobs(tenant)?.into_iter().find(|j| j.spec.module.as_os_str() == module.digest.as_str())
        {
            return Err(ServiceError::Conflict(format!(
                "module {} is used by job `{}`: delete the job or upgrade it to another module first",
                module.digest, job.id
            )));
        }
        // Only if no job of the tenant was created or changed since the check.
        let quiet = Condition::Quiet { prefix: meta::jobs_prefix(tenant), since: view };
        let key = meta::module_key(tenant, &module.digest);
        if self.meta.commit(meta::change::<ModuleRecord>(key, None, vec![quiet])?)?.is_err() {
            return Err(ServiceError::Conflict(format!(
                "your jobs changed while module {} was deleted: try again",
                module.digest
            )));
        }
        self.delete_upload_bytes(&module);
        Ok(())
    }
}
