//! The host as a service: many tenants' modules and jobs in one process,
//! behind the HTTP API ([`crate::api`]) and the `sluice` CLI verbs.
//!
//! [`Service`] is the control plane, independent of HTTP: it authenticates
//! tokens, keeps tenants, modules and jobs in its metadata store
//! ([`meta`], redb), stores module bytes content-addressed by sha256 and
//! compiles them once (the runtime's cache), and runs jobs with the same
//! [`Job`](crate::job::Job) machinery as `sluice run`. A supervisor thread
//! watches the jobs: a job whose task failed for good is stopped and marked
//! failed with the reason; a transaction left open too long is aborted.
//!
//! What it must never do: let one tenant name another's module or job (they
//! are looked up under the caller's tenant, so others' are simply not
//! found), let a job read or write a topic outside its tenant's prefixes, or
//! run a job with limits above its tenant's policy. Kafka consumer groups and
//! transactional ids are `sluice.<tenant>.<job>...`, and tenant names cannot
//! contain `.`, so two tenants can never fence each other.
//!
//! Key types: [`Service`], [`ServiceConfig`], [`Caller`], [`ServiceError`]
//! (its variant picks the HTTP status), the records kept in the metadata
//! store ([`TenantRecord`], [`ModuleRecord`], [`JobRecord`]) and what the
//! API returns ([`JobStatus`]).

mod jobs;
mod logs;
mod meta;
mod metrics;
mod modules;
mod policy;
mod retry;
mod throughput;
mod views;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use jobs::{JobState, JobStatus, Operation, OperationState, ResetState, TaskView, TransactionView};
pub use logs::{LogCapture, LogHub, LogLine};
pub use metrics::render as render_metrics;
pub use policy::{Policy, PolicyLimits};
pub use throughput::{KEPT_SECONDS as THROUGHPUT_SECONDS, Rates};
pub use views::{HostFigures, JobHistory, Session, TenantUsage, Usage};

use crate::cluster::log::Condition;
use crate::runtime::{Runtime, RuntimeConfig, sha256_hex};
use meta::MetaStore;

/// How the service is set up.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Where the metadata, module bytes and job state live.
    pub data_dir: PathBuf,
    /// The Kafka cluster every job uses.
    pub brokers: String,
    /// The admin token: creates tenants and sets their policies.
    pub admin_token: String,
    /// The largest module accepted, in bytes.
    pub max_module_bytes: usize,
    /// Guest instances the host may run at once (pooling allocator slots).
    pub max_instances: u32,
    /// The cluster this host is a member of; `None`: it runs alone.
    pub cluster: Option<String>,
    /// Whether a module not compiled before starts on baseline code
    /// ([`crate::runtime::RuntimeConfig::baseline`]).
    pub baseline: bool,
}

/// A cluster's own record in its metadata: written by its first host.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClusterRecord {
    /// The admin token every member must have, as a salted password hash
    /// (argon2id, PHC string): the metadata topic is readable by whoever
    /// may read the cluster's topics, and an operator's token may be
    /// guessable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    admin_token_hash: Option<String>,
    /// Before password hashes: its unsalted sha256, hex. Replaced by a hash
    /// when a member with the token joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    admin_token_sha256: Option<String>,
    /// Milliseconds since the Unix epoch.
    created_ms: u64,
}

impl ClusterRecord {
    /// Whether `token` is the cluster's admin token.
    fn admits(&self, token: &str) -> bool {
        use argon2::password_hash::{PasswordHash, PasswordVerifier as _};
        match (&self.admin_token_hash, &self.admin_token_sha256) {
            (Some(phc), _) => PasswordHash::new(phc)
                .is_ok_and(|hash| argon2::Argon2::default().verify_password(token.as_bytes(), &hash).is_ok()),
            (None, Some(sha256)) => *sha256 == sha256_hex(token.as_bytes()),
            (None, None) => false,
        }
    }
}

/// A salted password hash (argon2id, PHC string) of the admin `token`.
fn admin_token_hash(token: &str) -> Result<String> {
    use argon2::password_hash::{PasswordHasher as _, SaltString};
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).map_err(|e| ServiceError::internal("no randomness for a salt", e))?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| ServiceError::internal("encoding a salt", e.to_string()))?;
    argon2::Argon2::default()
        .hash_password(token.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| ServiceError::internal("hashing the admin token", e.to_string()))
}

/// An error of a service call; its variant decides the HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No or an unknown token (401).
    #[error("{0}")]
    Unauthorized(String),
    /// The caller may not do this (403).
    #[error("{0}")]
    Forbidden(String),
    /// Nothing of that name visible to the caller (404).
    #[error("{0}")]
    NotFound(String),
    /// The request is invalid (400).
    #[error("{0}")]
    BadRequest(String),
    /// The request conflicts with the current state (409).
    #[error("{0}")]
    Conflict(String),
    /// The host cannot answer now; trying again later may work (503): a
    /// cluster member whose write was not decided in time.
    #[error("{0}")]
    Unavailable(String),
    /// The upload is too large (413).
    #[error("{0}")]
    TooLarge(String),
    /// A module or spec was understood but refused (422).
    #[error("{0}")]
    Unprocessable(String),
    /// The host failed (500); what it was doing, and why it failed.
    #[error("internal error: {what}: {source}")]
    Internal {
        /// What the host was doing.
        what: String,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ServiceError {
    /// The host failed at `what` because of `source`.
    pub fn internal(what: impl Into<String>, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        ServiceError::Internal { what: what.into(), source: source.into() }
    }

    /// The host could not do `what` because Kafka failed: 503 for an error
    /// that is likely to pass (no broker reachable, a timeout, a coordinator
    /// moving), so the caller knows to try again; 409 for a consumer group
    /// that still has members; 500 for anything else.
    pub(crate) fn kafka(what: &str, e: crate::kafka::Error) -> Self {
        if e.is_unavailable() {
            ServiceError::Unavailable(format!("{what}: Kafka cannot be reached or cannot answer now; try again: {e}"))
        } else if e.is_group_in_use() {
            ServiceError::Conflict(format!(
                "{what}: the consumer group still has members (a process other than this host reads with it): {e}"
            ))
        } else {
            ServiceError::internal(what, e)
        }
    }
}

/// Results of service calls.
pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

/// A module's bytes as received: a file beside the stored modules (see
/// [`Service::new_upload_file`]), their SHA-256 and size, computed while
/// they streamed in.
pub struct Upload {
    /// The bytes.
    pub file: tempfile::NamedTempFile,
    /// Lowercase hex SHA-256 of the bytes.
    pub digest: String,
    /// Their number.
    pub size: u64,
}

/// Names of upload files; any left by a crash are removed at start.
const UPLOAD_PREFIX: &str = ".upload-";

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The operator, with the admin token.
    Admin,
    /// A tenant, by name.
    Tenant(String),
}

impl Caller {
    /// The tenant, or 403 for the admin (tenant resources need a tenant token).
    pub fn tenant(&self) -> Result<&str> {
        match self {
            Caller::Tenant(name) => Ok(name),
            Caller::Admin => Err(ServiceError::Forbidden(
                "modules and jobs belong to tenants: use a tenant's token, not the admin token".into(),
            )),
        }
    }

    /// Ok for the admin, 403 for a tenant.
    pub fn admin(&self) -> Result<()> {
        match self {
            Caller::Admin => Ok(()),
            Caller::Tenant(_) => Err(ServiceError::Forbidden("this needs the admin token".into())),
        }
    }
}

/// A tenant as stored. The token itself is never stored, only its sha256.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantRecord {
    /// Lowercase letters, digits and `-`.
    pub name: String,
    /// sha256 of the tenant's bearer token, hex.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    #[schema(ignore)]
    pub token_sha256: String,
    /// What the tenant may do.
    pub policy: Policy,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
}

impl TenantRecord {
    /// The record as the API shows it: without the token's hash, which
    /// would let anyone who reads it test guesses offline.
    pub fn without_secrets(mut self) -> Self {
        self.token_sha256.clear();
        self
    }
}

/// A module as stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModuleRecord {
    /// sha256 of the bytes, hex: the module's id.
    pub digest: String,
    /// The owning tenant.
    pub tenant: String,
    /// A name given at upload, for humans and for job specs.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Milliseconds since the Unix epoch.
    pub uploaded_ms: u64,
    /// The language it was written in, when its toolchain recorded it
    /// (`Rust`, `Python`, `JavaScript`, `Go`, `C`, `C++`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// The upload that stored it (random); in a cluster its bytes' chunks
    /// are keyed by it. None: stored before uploads were named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<String>,
    /// Still being stored: it counts against the tenant's limits, but no
    /// job may use it, and the API does not show it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(ignore)]
    pub pending: bool,
    /// The member storing a pending upload: at its next start it abandons
    /// its own that a restart cut short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub host: Option<String>,
}

/// Whether a job should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Desired {
    /// Run it, and run it again after a host restart.
    Running,
    /// Keep it stopped.
    Stopped,
}

/// A job as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobRecord {
    /// The owning tenant.
    pub tenant: String,
    /// The job id, unique within the tenant.
    pub id: String,
    /// The spec as created, with `module` resolved to a digest.
    pub spec: crate::job::JobSpec,
    /// Whether it should run.
    pub desired: Desired,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// Why it last failed for good, if it did (cleared by resume).
    #[serde(default)]
    pub failure: Option<String>,
    /// Set by an upgrade: the module the state was written by, for the new
    /// module's `migrate` hook (which runs on a shard once: a local note and
    /// the committed mark say it did). Kept for good.
    #[serde(default)]
    pub migrate_from: Option<String>,
    /// How many upgrades the job has had: a `migrate` hook runs once per
    /// upgrade, so v1 -> v2 again after a rollback to v1 migrates again.
    /// It is the module's generation too: every commit carries it, and a
    /// member that has not applied a newer upgrade refuses the shards it
    /// committed (`TaskError::Superseded`).
    #[serde(default)]
    pub upgrades: u64,
    /// A reset is under way, or was cut short: the job may not start until
    /// a reset finishes (running it again completes it).
    #[serde(default)]
    pub resetting: bool,
    /// Which life of the job id this is: random, new at create and at every
    /// reset that clears the state (0: a job created before incarnations).
    /// The job's stores and committed checkpoints carry it, so state left
    /// by another incarnation (on a member that did not take the reset, or
    /// was down while the job was deleted and created again) is never taken
    /// for this one's.
    #[serde(default)]
    pub incarnation: u64,
}

impl JobRecord {
    /// `<tenant>.<job>`: names the job's consumer group, transactional ids
    /// and log lines.
    pub fn scope(&self) -> String {
        format!("{}.{}", self.tenant, self.id)
    }

    /// `<tenant>/<job>`: the job among the cluster's statuses.
    pub fn scope_key(&self) -> String {
        format!("{}/{}", self.tenant, self.id)
    }

    /// Whether the job should be started when it has no threads: its
    /// desired state is running, it has not failed for good, and no reset
    /// was cut short.
    pub(crate) fn should_start(&self) -> bool {
        self.desired == Desired::Running && self.failure.is_none() && !self.resetting
    }
}

/// The control plane.
pub struct Service {
    config: ServiceConfig,
    meta: MetaStore,
    runtime: Arc<Runtime>,
    /// Kafka clients for the host's one-off calls (topic checks, jobs'
    /// starts), made once: a client made per call cost each job's creation
    /// 0.3 s.
    kafka: Arc<crate::kafka::Clients>,
    logs: LogHub,
    jobs: Mutex<HashMap<(String, String), jobs::Slot>>,
    shutdown: AtomicBool,
    /// A member's share of the cluster's jobs.
    placement: Option<Arc<crate::cluster::placement::Placement>>,
    /// A member's view of what the other members' jobs do.
    board: Option<Arc<crate::cluster::status::Board>>,
    /// A member's jobs as of the last placement pass, with their
    /// incarnations (a job deleted and created again, or reset with its
    /// state cleared, is another incarnation).
    seen_jobs: Mutex<Option<HashMap<(String, String), u64>>>,
    /// Jobs whose local state a member removes once their threads ended.
    doomed_state: Mutex<std::collections::HashSet<(String, String)>>,
    /// A member's module follower: its stop flag and thread.
    followers: Mutex<Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>>,
    /// Each job's records per second over the last hour.
    throughput: throughput::Throughput,
    /// The checkpoints and failures of each job's last run here, kept when
    /// its threads end (stopped or failed) until it runs again or is
    /// deleted: a failed job's page still shows why and on what record.
    last_runs: Mutex<HashMap<(String, String), views::LastRun>>,
    /// Jobs whose start failed with an error that may pass, to be started
    /// again by the supervisor.
    start_retries: retry::StartRetries,
    /// Whether a thread is starting such jobs again (one at a time).
    retrying: AtomicBool,
    /// When the supervisor last collected modules' leftovers.
    last_module_sweep: Mutex<Option<std::time::Instant>>,
}

/// Checks this host's admin token against the cluster's (recorded by its
/// first host), before the host takes any part in deciding the cluster's
/// writes: a host with another token does not join.
fn join_cluster(meta: &MetaStore, name: &str, admin_token: &str) -> Result<()> {
    let Some(link) = meta.link() else { return Ok(()) };
    let refuse = || {
        link.stop();
        ServiceError::Forbidden(format!(
            "this host's admin token is not cluster `{name}`'s: give every host the cluster's token \
             (SLUICE_ADMIN_TOKEN, or --admin-token-file with the first host's DATA_DIR/admin-token)"
        ))
    };
    if let Some(record) = meta.cluster::<ClusterRecord>()? {
        if !record.admits(admin_token) {
            return Err(refuse());
        }
        link.start_deciding().map_err(|e| ServiceError::internal("joining the cluster's decider group", e))?;
        if record.admin_token_hash.is_none() {
            // A cluster from before password hashes: its unsalted sha256
            // gives way to a salted hash, written only if the record is
            // still the one just checked.
            let hash = admin_token_hash(admin_token)?;
            meta.update_cluster(|record: &mut ClusterRecord| {
                record.admin_token_hash = Some(hash.clone());
                record.admin_token_sha256 = None;
                Ok(())
            })?;
            tracing::info!(cluster = %name, "the admin token's hash in the cluster's metadata is a salted one now");
        }
        return Ok(());
    }
    // A new cluster: this host may be its first, and decides its own record
    // (or loses to another first host, whose token it must then have).
    link.start_deciding().map_err(|e| ServiceError::internal("joining the cluster's decider group", e))?;
    let record = ClusterRecord {
        admin_token_hash: Some(admin_token_hash(admin_token)?),
        admin_token_sha256: None,
        created_ms: crate::job::now_ms(),
    };
    let absent = Condition::Version { key: meta::CLUSTER_KEY.into(), version: None };
    let _ = meta.commit(meta::change(meta::CLUSTER_KEY.into(), Some(&record), vec![absent])?)?;
    match meta.cluster::<ClusterRecord>()? {
        Some(record) if record.admits(admin_token) => Ok(()),
        _ => Err(refuse()),
    }
}

/// A new random bearer token: 32 bytes, base64url.
fn new_token() -> Result<String> {
    use base64::Engine as _;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ServiceError::internal("no randomness for a token", e))?;
    Ok(format!("sluice_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)))
}

/// Whether `token` has the shape [`new_token`] gives every tenant token.
fn could_be_token(token: &str) -> bool {
    token.strip_prefix("sluice_").is_some_and(|rest| {
        rest.len() == TOKEN_CHARS && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// Characters of a token after its prefix: 32 bytes in unpadded base64url.
const TOKEN_CHARS: usize = 43;

/// How long a member waits to catch up with the cluster's log before it
/// answers that a record does not exist ([`Service::fresh`]).
const READ_CATCH_UP: Duration = Duration::from_secs(10);

fn no_tenant(name: &str) -> ServiceError {
    ServiceError::NotFound(format!("no tenant `{name}`"))
}

/// Checks a tenant name: it becomes part of Kafka ids and paths.
fn check_tenant_name(name: &str) -> Result<()> {
    // Their default topic prefixes (`sluice.`, `sluice-cluster.`) are the
    // host's own.
    if name == "sluice" || name == "sluice-cluster" {
        return Err(ServiceError::BadRequest(format!(
            "tenant name {name:?} is reserved: the host's own topics start with it"
        )));
    }
    let ok = crate::kafka::is_id_part(name);
    if ok {
        Ok(())
    } else {
        Err(ServiceError::BadRequest(format!(
            "tenant name {name:?}: use 1-40 lowercase letters, digits or `-` (it becomes part of Kafka group and \
             transactional ids)"
        )))
    }
}

impl Service {
    /// Opens the data directory, starts the runtime, and starts every job
    /// whose desired state is running (in the background: the service
    /// answers meanwhile, showing those jobs as starting).
    pub fn open(config: ServiceConfig, logs: LogHub) -> Result<Arc<Service>> {
        let io = |what: &str, e: std::io::Error| ServiceError::internal(what, e);
        for dir in ["modules", "state", "cache"] {
            std::fs::create_dir_all(config.data_dir.join(dir)).map_err(|e| io("creating the data directory", e))?;
        }
        // Uploads cut short by a crash.
        let modules = std::fs::read_dir(config.data_dir.join("modules")).map_err(|e| io("listing modules", e))?;
        for entry in modules.flatten() {
            if entry.file_name().to_string_lossy().starts_with(UPLOAD_PREFIX) {
                std::fs::remove_file(entry.path()).map_err(|e| io("removing an unfinished upload", e))?;
            }
        }
        if config.admin_token.len() < 16 {
            return Err(ServiceError::BadRequest("the admin token must be at least 16 characters".into()));
        }
        let meta_path = config.data_dir.join("meta.redb");
        let meta = match &config.cluster {
            None => MetaStore::open(&meta_path)?,
            Some(name) => {
                let identity = crate::cluster::Identity::load_or_create(&config.data_dir, name)
                    .map_err(ServiceError::BadRequest)?;
                let host = identity.host.clone();
                let meta = MetaStore::open_member(&meta_path, identity, &config.brokers)?;
                join_cluster(&meta, name, &config.admin_token)?;
                tracing::info!(cluster = %name, host = %host, "joined the cluster");
                meta
            }
        };
        let runtime = Runtime::new(RuntimeConfig {
            max_instances: config.max_instances,
            cache_dir: Some(config.data_dir.join("cache")),
            baseline: config.baseline,
            ..RuntimeConfig::default()
        })
        .map_err(|e| ServiceError::internal("starting the runtime", e))?;
        let runtime = Arc::new(runtime);
        // A member's parts that follow the cluster: its module follower, its
        // share of the jobs, and the other members' statuses.
        let (followers, placement, board) = match meta.link() {
            Some(link) => {
                let identity = link.identity();
                let modules = crate::cluster::Topics::of(&identity.cluster).modules;
                let kafka = crate::kafka::client_config(&config.brokers, &Default::default());
                let stop = Arc::new(AtomicBool::new(false));
                let index = Arc::new(modules::RecordIndex { meta: meta.clone(), runtime: Arc::clone(&runtime) });
                let follower = crate::cluster::chunks::follow(
                    &kafka,
                    &modules,
                    config.data_dir.join("modules"),
                    index,
                    Arc::clone(&stop),
                )
                .map_err(|e| ServiceError::internal("following the cluster's modules", e))?;
                let placement = crate::cluster::placement::Placement::start(identity, &kafka)
                    .map_err(|e| ServiceError::internal("joining the cluster's placement group", e))?;
                let board = crate::cluster::status::Board::start(identity, &kafka)
                    .map_err(|e| ServiceError::internal("following the cluster's statuses", e))?;
                (Some((stop, follower)), Some(placement), Some(board))
            }
            None => (None, None, None),
        };
        let kafka = crate::kafka::Clients::new(&crate::kafka::client_config(&config.brokers, &Default::default()))
            .map_err(|e| ServiceError::internal("creating the host's Kafka clients", e))?;
        let service = Arc::new(Service {
            kafka: Arc::new(kafka),
            config,
            meta,
            followers: Mutex::new(followers),
            placement,
            board,
            seen_jobs: Mutex::new(None),
            doomed_state: Mutex::new(Default::default()),
            runtime,
            logs,
            jobs: Mutex::new(HashMap::new()),
            shutdown: AtomicBool::new(false),
            throughput: Default::default(),
            last_runs: Mutex::new(HashMap::new()),
            start_retries: Default::default(),
            retrying: AtomicBool::new(false),
            last_module_sweep: Mutex::new(None),
        });
        service.abandon_own_uploads()?;
        service.settle_operations_after_restart()?;
        jobs::spawn_supervisor(&service);
        let resumer = Arc::clone(&service);
        std::thread::Builder::new()
            .name("sluice-resume".into())
            .spawn(move || resumer.resume_after_restart())
            .map_err(|e| ServiceError::internal("starting the jobs", e))?;
        Ok(service)
    }

    /// Who owns `token`.
    pub fn authenticate(&self, token: Option<&str>) -> Result<Caller> {
        let Some(token) = token else {
            return Err(ServiceError::Unauthorized("send a bearer token: `Authorization: Bearer <token>`".into()));
        };
        // Compare digests, not the tokens, so the comparison's timing says
        // nothing about the admin token.
        if Sha256::digest(token.as_bytes()) == Sha256::digest(self.config.admin_token.as_bytes()) {
            return Ok(Caller::Admin);
        }
        let digest = sha256_hex(token.as_bytes());
        let unknown = || ServiceError::NotFound("unknown token".into());
        // A token just made through another member is known once this one
        // has caught up (see `fresh`); one that no member can have made is
        // refused without asking the cluster's log.
        let lookup = || self.meta.tenant_of_token(&digest)?.ok_or_else(unknown);
        let found = if could_be_token(token) { self.fresh(lookup) } else { lookup() };
        match found {
            Ok(tenant) => Ok(Caller::Tenant(tenant)),
            Err(ServiceError::NotFound(_)) => Err(ServiceError::Unauthorized("unknown token".into())),
            Err(e) => Err(e),
        }
    }

    // Tenants (admin).

    /// Creates a tenant; returns it with its token, which is shown only now.
    pub fn create_tenant(&self, caller: &Caller, name: &str, policy: Option<Policy>) -> Result<(TenantRecord, String)> {
        caller.admin()?;
        check_tenant_name(name)?;
        let policy = policy.unwrap_or_else(|| Policy::default_for(name));
        policy.check()?;
        let token = new_token()?;
        let tenant = TenantRecord {
            name: name.to_owned(),
            token_sha256: sha256_hex(token.as_bytes()),
            policy,
            created_ms: crate::job::now_ms(),
        };
        let key = meta::tenant_key(name);
        let absent = Condition::Version { key: key.clone(), version: None };
        if self.meta.commit(meta::change(key, Some(&tenant), vec![absent])?)?.is_err() {
            return Err(ServiceError::Conflict(format!("tenant `{name}` exists")));
        }
        tracing::info!(tenant = name, "tenant created");
        Ok((tenant.without_secrets(), token))
    }

    /// Every tenant.
    pub fn tenants(&self, caller: &Caller) -> Result<Vec<TenantRecord>> {
        caller.admin()?;
        Ok(self.meta.tenants()?.into_iter().map(TenantRecord::without_secrets).collect())
    }

    /// Replaces a tenant's policy; running jobs keep their limits until they
    /// restart.
    pub fn set_policy(&self, caller: &Caller, name: &str, policy: Policy) -> Result<TenantRecord> {
        caller.admin()?;
        policy.check()?;
        let tenant = self.meta.update_tenant(name, |tenant| {
            tenant.policy = policy.clone();
            Ok(())
        })?;
        tenant.map(TenantRecord::without_secrets).ok_or_else(|| no_tenant(name))
    }

    /// Gives a tenant a new token; the old one stops working.
    pub fn rotate_token(&self, caller: &Caller, name: &str) -> Result<(TenantRecord, String)> {
        caller.admin()?;
        let token = new_token()?;
        let tenant = self.meta.update_tenant(name, |tenant| {
            tenant.token_sha256 = sha256_hex(token.as_bytes());
            Ok(())
        })?;
        Ok((tenant.ok_or_else(|| no_tenant(name))?.without_secrets(), token))
    }

    fn tenant(&self, name: &str) -> Result<TenantRecord> {
        self.fresh(|| self.meta.tenant(name)?.ok_or_else(|| no_tenant(name)))
    }

    /// `lookup`, and once more after this member has caught up with the
    /// cluster's log if it found nothing ([`ServiceError::NotFound`]): a
    /// record another member has just written, and answered its caller
    /// for, may not be applied here yet, and a client that writes through
    /// one member and reads through another (behind a load balancer, say)
    /// must not see it missing. Alone, `lookup` once.
    pub(super) fn fresh<T>(&self, lookup: impl Fn() -> Result<T>) -> Result<T> {
        let missed = std::time::Instant::now();
        match (lookup(), self.meta.link()) {
            (Err(ServiceError::NotFound(_)), Some(link)) => {
                link.catch_up_after(missed, READ_CATCH_UP).map_err(|e| ServiceError::Unavailable(e.to_string()))?;
                lookup()
            }
            (found, _) => found,
        }
    }

    /// The policy of an authenticated tenant caller; none for the admin.
    pub fn policy_of(&self, caller: &Caller) -> Result<Option<Policy>> {
        match caller {
            Caller::Admin => Ok(None),
            Caller::Tenant(name) => Ok(Some(self.meta.tenant(name)?.ok_or_else(|| no_tenant(name))?.policy)),
        }
    }

    /// The caller's tenant record.
    pub fn whoami(&self, caller: &Caller) -> Result<TenantRecord> {
        self.tenant(caller.tenant()?).map(TenantRecord::without_secrets)
    }

    /// Stops every job with a final checkpoint, for a clean host shutdown.
    /// Their desired state stays as it was, so they resume at the next start.
    pub fn shutdown(&self) {
        self.shutdown.store(true, Ordering::Relaxed);
        // Jobs being started or upgraded stop themselves once that is done
        // (`start` checks the shutdown flag).
        let live: Vec<jobs::Live> = jobs::lock(&self.jobs)
            .drain()
            .filter_map(|(_, slot)| match slot {
                jobs::Slot::Live(live) => Some(live),
                jobs::Slot::Busy(_) => None,
            })
            .collect();
        for live in &live {
            live.job.stop();
        }
        for live in live {
            let scope = live.scope.clone();
            if let Err(e) = live.job.join() {
                tracing::warn!(job = %scope, "job ended with an error at shutdown: {e}");
            }
        }
        // Only once this host's jobs took their final checkpoints: then the
        // members that get its slots start from them.
        if let Some(placement) = &self.placement {
            placement.stop();
        }
        if let Some(board) = &self.board {
            board.stop();
        }
        if let Some(link) = self.meta.link() {
            link.stop();
        }
        if let Some((stop, follower)) = jobs::lock(&self.followers).take() {
            stop.store(true, Ordering::Relaxed);
            let _ = follower.join();
        }
    }

    /// The runtime (for tests and the density benchmark).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }
}

/// How often the supervisor looks at the jobs.
const SUPERVISE_EVERY: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_the_host_makes_could_be_a_token_and_garbage_could_not() {
        for _ in 0..100 {
            let token = new_token().expect("token");
            assert!(could_be_token(&token), "{token}");
        }
        for garbage in ["", "sluice_", "sluice_short", "Bearer x", &format!("sluice_{}", "a".repeat(44))] {
            assert!(!could_be_token(garbage), "{garbage}");
        }
        assert!(!could_be_token(&format!("sluice_{}!", "a".repeat(42))), "a character base64url has not");
    }

    #[test]
    fn tenant_names_that_would_own_the_hosts_topics_are_refused() {
        assert!(check_tenant_name("acme").is_ok());
        for reserved in ["sluice", "sluice-cluster"] {
            let refused = check_tenant_name(reserved).expect_err(reserved);
            assert!(refused.to_string().contains("reserved"), "{refused}");
        }
    }

    #[test]
    fn an_internal_error_keeps_its_source() {
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let error = ServiceError::internal("storing the module", full);
        let source = std::error::Error::source(&error).and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(source.map(std::io::Error::kind), Some(std::io::ErrorKind::StorageFull));
        assert!(error.to_string().starts_with("internal error: storing the module: "), "{error}");
    }
}
