//! Tenant policies, and turning a tenant's job spec into a job the host will
//! run: topics checked against the allowed prefixes, limits filled in from
//! and capped by the policy, host-only fields refused.

use serde::{Deserialize, Serialize};

use super::{Result, ServiceError};
use crate::job::JobSpec;
use crate::units::{parse_duration, parse_size};

/// What a tenant may do. Limits are per job; a job spec may ask for less.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Policy {
    /// Topics the tenant's jobs may read and write must start with one of
    /// these. Default: `<tenant>.`.
    #[schema(min_items = 1)]
    pub topic_prefixes: Vec<String>,
    /// Jobs the tenant may have (running or stopped).
    pub max_jobs: u32,
    /// Tasks per job.
    #[schema(minimum = 1)]
    pub max_parallelism: u32,
    /// Tasks the tenant's running jobs may have together: each holds a slot
    /// of the host's instance pool, which all tenants share.
    #[serde(default = "default_max_tasks")]
    pub max_tasks: u32,
    /// Modules the tenant may have uploaded at once.
    #[serde(default = "default_max_modules")]
    pub max_modules: u32,
    /// Bytes of all the tenant's modules together, e.g. `"256MiB"`.
    #[serde(default = "default_module_bytes")]
    #[schema(pattern = "^[0-9]{1,9} ?([bB]|[kKmMgG]([iI]?[bB])?)?$")]
    pub module_bytes: String,
    /// The shortest checkpoint interval a job may ask for: each checkpoint
    /// costs the host a durable write and a Kafka transaction.
    #[serde(default = "default_min_checkpoint_interval")]
    #[schema(pattern = "^[0-9]{1,9} ?(ns|us|ms|s|m|h|d)( [0-9]{1,9} ?(ns|us|ms|s|m|h|d)){0,3}$")]
    pub min_checkpoint_interval: String,
    /// The largest `batch-size` a job may ask for.
    #[serde(default = "default_max_batch_size")]
    pub max_batch_size: usize,
    /// Bytes of a job's `transform.config`, keys and values, at most.
    #[serde(default = "default_max_config_bytes")]
    pub max_config_bytes: usize,
    /// API requests the tenant may have in flight at once; one more is
    /// refused at once with 429 and `Retry-After`.
    #[serde(default = "default_max_requests")]
    #[schema(minimum = 1)]
    pub max_requests: u32,
    /// Bytes of module uploads the tenant may have in flight at once, e.g.
    /// `"128MiB"` (each counts its `Content-Length`, or the host's largest
    /// module when it sends none); one more is refused at once with 429.
    #[serde(default = "default_max_upload_bytes")]
    #[schema(pattern = "^[0-9]{1,9} ?([bB]|[kKmMgG]([iI]?[bB])?)?$")]
    pub max_upload_bytes: String,
    /// Per-job guest limits: the most a job may ask for, and what it gets
    /// when it does not ask.
    pub limits: PolicyLimits,
}

fn default_max_tasks() -> u32 {
    16
}
fn default_max_modules() -> u32 {
    20
}
fn default_module_bytes() -> String {
    "256MiB".into()
}
fn default_min_checkpoint_interval() -> String {
    "100ms".into()
}
fn default_max_batch_size() -> usize {
    10_000
}
fn default_max_config_bytes() -> usize {
    64 << 10
}
fn default_max_requests() -> u32 {
    32
}
fn default_max_upload_bytes() -> String {
    "128MiB".into()
}

/// Per-job limits of a policy, written like a job file's `[limits]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PolicyLimits {
    /// Guest memory per task, e.g. `"128MiB"`.
    #[schema(pattern = "^[0-9]{1,9} ?([bB]|[kKmMgG]([iI]?[bB])?)?$")]
    pub memory: String,
    /// CPU time per call into the guest, e.g. `"2s"` (the thread's: the
    /// guest's code and its state calls; waiting for a core does not count).
    #[schema(pattern = "^[0-9]{1,9} ?(ns|us|ms|s|m|h|d)( [0-9]{1,9} ?(ns|us|ms|s|m|h|d)){0,3}$")]
    pub deadline: String,
    /// Output records per input record.
    #[schema(minimum = 1)]
    pub max_outputs_per_input: u32,
    /// Bytes of keys and values per task's state, e.g. `"256MiB"`.
    #[schema(pattern = "^[0-9]{1,9} ?([bB]|[kKmMgG]([iI]?[bB])?)?$")]
    pub state: String,
}

impl Policy {
    /// The policy a tenant gets when the admin names none.
    pub fn default_for(tenant: &str) -> Policy {
        Policy {
            topic_prefixes: vec![format!("{tenant}.")],
            max_jobs: 10,
            max_parallelism: 4,
            max_tasks: default_max_tasks(),
            max_modules: default_max_modules(),
            module_bytes: default_module_bytes(),
            min_checkpoint_interval: default_min_checkpoint_interval(),
            max_batch_size: default_max_batch_size(),
            max_config_bytes: default_max_config_bytes(),
            max_requests: default_max_requests(),
            max_upload_bytes: default_max_upload_bytes(),
            limits: PolicyLimits {
                memory: "128MiB".into(),
                deadline: "2s".into(),
                max_outputs_per_input: 100,
                state: "256MiB".into(),
            },
        }
    }

    /// Checks the policy's own fields.
    pub fn check(&self) -> Result<()> {
        // Refused although well-formed (the schema's patterns make every
        // duration and size parse): 422.
        let bad = |message: String| ServiceError::Unprocessable(format!("policy: {message}"));
        if self.topic_prefixes.is_empty() {
            return Err(bad(
                "`topic-prefixes` is empty: the tenant could use no topic; name at least one prefix".into()
            ));
        }
        if self.topic_prefixes.iter().any(|p| p.is_empty()) {
            return Err(bad("an empty topic prefix would allow every topic; list the prefixes instead".into()));
        }
        let memory = parse_size(&self.limits.memory).map_err(|e| bad(format!("`limits.memory`: {e}")))?;
        if memory > crate::runtime::MAX_GUEST_MEMORY {
            // Accepted, every instantiation would fail.
            return Err(bad(format!(
                "`limits.memory`: {} is over the largest guest memory a host gives, 1GiB",
                self.limits.memory
            )));
        }
        parse_duration(&self.limits.deadline).map_err(|e| bad(format!("`limits.deadline`: {e}")))?;
        parse_size(&self.limits.state).map_err(|e| bad(format!("`limits.state`: {e}")))?;
        parse_size(&self.module_bytes).map_err(|e| bad(format!("`module-bytes`: {e}")))?;
        parse_duration(&self.min_checkpoint_interval).map_err(|e| bad(format!("`min-checkpoint-interval`: {e}")))?;
        parse_size(&self.max_upload_bytes).map_err(|e| bad(format!("`max-upload-bytes`: {e}")))?;
        if self.max_parallelism == 0 || self.limits.max_outputs_per_input == 0 || self.max_requests == 0 {
            return Err(bad(
                "`max-parallelism`, `max-requests` and `limits.max-outputs-per-input` must be at least 1".into()
            ));
        }
        Ok(())
    }

    /// Parses a tenant's job spec (JSON, the job file's fields) under this
    /// policy: absent limits come from the policy, larger ones are refused,
    /// and so are topics outside the prefixes and the fields only the host
    /// decides (`brokers`, `state-dir`, client properties other than a few
    /// tuning ones).
    pub fn job_spec(&self, mut spec: serde_json::Value) -> Result<JobSpec> {
        let bad = |message: String| ServiceError::BadRequest(format!("job spec: {message}"));
        let object = spec.as_object_mut().ok_or_else(|| bad("expected a JSON object".into()))?;
        for field in ["brokers", "state-dir"] {
            if object.contains_key(field) {
                return Err(bad(format!("`{field}` is chosen by the host, not by a job spec")));
            }
        }
        if object.get("state").and_then(|s| s.get("changelog-topic")).is_some() {
            return Err(bad("`state.changelog-topic` is chosen by the host, not by a job spec".into()));
        }
        // Absent limits come from the policy.
        let limits = object.entry("limits").or_insert_with(|| serde_json::json!({}));
        let limits = limits.as_object_mut().ok_or_else(|| bad("`limits` must be an object".into()))?;
        let defaults = serde_json::to_value(&self.limits)
            .map_err(|e| ServiceError::internal("encoding the policy's limits", e))?;
        if let Some(defaults) = defaults.as_object() {
            for (key, value) in defaults {
                limits.entry(key.clone()).or_insert_with(|| value.clone());
            }
        }
        // The error names the field, as a job file's would (`limits.memory:
        // invalid type ...`), not only what was wrong with it.
        let spec: JobSpec = serde_path_to_error::deserialize(spec).map_err(|e| match e.path().to_string() {
            path if path == "." => bad(e.inner().to_string()),
            path => bad(format!("`{path}`: {}", e.inner())),
        })?;
        self.admit(&spec)?;
        Ok(spec)
    }

    /// Refuses a spec that asks for more than the policy allows.
    pub(super) fn admit(&self, spec: &JobSpec) -> Result<()> {
        let refuse = |message: String| ServiceError::Forbidden(format!("your policy does not allow it: {message}"));
        for topic in spec.input.topics.iter().chain(&spec.output.topics).chain(&spec.errors.dead_letter_topic) {
            // Whatever the prefixes allow: the host's own topics (other jobs'
            // changelogs, a cluster's metadata) are no tenant's.
            if let Some(reserved) = crate::kafka::RESERVED_PREFIXES.iter().find(|p| topic.starts_with(**p)) {
                return Err(refuse(format!("topic `{topic}`: topics starting with `{reserved}` are the host's own")));
            }
            if !self.topic_prefixes.iter().any(|p| topic.starts_with(p.as_str())) {
                return Err(refuse(format!(
                    "topic `{topic}` does not start with an allowed prefix ({})",
                    self.topic_prefixes.join(", ")
                )));
            }
        }
        if spec.parallelism > self.max_parallelism {
            return Err(refuse(format!("parallelism {} is over {}", spec.parallelism, self.max_parallelism)));
        }
        let over =
            |field: &str, asked: &str, max: &str| refuse(format!("`limits.{field} = {asked:?}` is over {max:?}"));
        let bad = |field: &str, e: String| ServiceError::BadRequest(format!("job spec: `{field}`: {e}"));
        let size = |field: &str, text: &str| parse_size(text).map_err(|e| bad(field, e));
        let time = |field: &str, text: &str| parse_duration(text).map_err(|e| bad(field, e));
        if size("limits.memory", &spec.limits.memory)? > size("policy limits.memory", &self.limits.memory)? {
            return Err(over("memory", &spec.limits.memory, &self.limits.memory));
        }
        if time("limits.deadline", &spec.limits.deadline)? > time("policy limits.deadline", &self.limits.deadline)? {
            return Err(over("deadline", &spec.limits.deadline, &self.limits.deadline));
        }
        let state = spec.limits.state.as_deref().unwrap_or("unlimited");
        if spec
            .limits
            .state
            .as_deref()
            .map(|text| size("limits.state", text))
            .transpose()?
            .is_none_or(|s| s > size("policy limits.state", &self.limits.state).unwrap_or(0))
        {
            return Err(over("state", state, &self.limits.state));
        }
        let interval = time("checkpoint.interval", &spec.checkpoint.interval)?;
        if interval < time("policy min-checkpoint-interval", &self.min_checkpoint_interval)? {
            return Err(refuse(format!(
                "`checkpoint.interval = {:?}` is below {:?}",
                spec.checkpoint.interval, self.min_checkpoint_interval
            )));
        }
        if spec.batch_size > self.max_batch_size {
            return Err(refuse(format!("`batch-size = {}` is over {}", spec.batch_size, self.max_batch_size)));
        }
        let config_bytes: usize = spec.transform.config.iter().map(|(k, v)| k.len() + v.len()).sum();
        if config_bytes > self.max_config_bytes {
            return Err(refuse(format!(
                "`transform.config` holds {config_bytes} bytes, over {}",
                self.max_config_bytes
            )));
        }
        if spec.limits.max_outputs_per_input > self.limits.max_outputs_per_input {
            return Err(refuse(format!(
                "`limits.max-outputs-per-input = {}` is over {}",
                spec.limits.max_outputs_per_input, self.limits.max_outputs_per_input
            )));
        }
        // Client properties: tuning only. Anything else could point a
        // client at files or credentials of the host.
        const TUNING: [&str; 6] = [
            "transaction.timeout.ms",
            "linger.ms",
            "batch.size",
            "compression.type",
            "fetch.min.bytes",
            "fetch.wait.max.ms",
        ];
        if let Some(key) = spec.kafka.keys().find(|k| !TUNING.contains(&k.as_str())) {
            return Err(refuse(format!(
                "client property `{key}`; jobs on a shared host may set only {}",
                TUNING.join(", ")
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(extra: serde_json::Value) -> serde_json::Value {
        let mut base = json!({
            "id": "clicks", "module": "count",
            "input": {"topics": ["acme.in"]}, "output": {"topics": ["acme.out"]},
        });
        if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        base
    }

    #[test]
    fn absent_limits_come_from_the_policy() {
        let policy = Policy::default_for("acme");
        let admitted = policy.job_spec(spec(json!({}))).expect("admitted");
        assert_eq!(admitted.limits.memory, "128MiB");
        assert_eq!(admitted.limits.deadline, "2s");
        assert_eq!(admitted.limits.state.as_deref(), Some("256MiB"));
        let smaller = policy.job_spec(spec(json!({"limits": {"memory": "16MiB"}}))).expect("admitted");
        assert_eq!(smaller.limits.memory, "16MiB");
        assert_eq!(smaller.limits.deadline, "2s");
    }

    #[test]
    fn what_the_policy_does_not_allow_is_refused_by_name() {
        let policy = Policy::default_for("acme");
        let cases = [
            (json!({"input": {"topics": ["other.in"]}}), "topic `other.in`"),
            (json!({"limits": {"memory": "1GiB"}}), "limits.memory"),
            (json!({"limits": {"deadline": "1m"}}), "limits.deadline"),
            (json!({"limits": {"state": "10GiB"}}), "limits.state"),
            (json!({"limits": {"max-outputs-per-input": 1000}}), "max-outputs-per-input"),
            (json!({"parallelism": 64}), "parallelism 64"),
            (json!({"checkpoint": {"interval": "10ms"}}), "`checkpoint.interval = \"10ms\"` is below"),
            (json!({"batch-size": 100000}), "`batch-size = 100000` is over"),
            (json!({"transform": {"config": {"big": "x".repeat(70_000)}}}), "`transform.config` holds"),
            (json!({"brokers": "evil:9092"}), "`brokers` is chosen by the host"),
            (json!({"state-dir": "/etc"}), "`state-dir` is chosen by the host"),
            (json!({"kafka": {"ssl.ca.location": "/etc/passwd"}}), "ssl.ca.location"),
            (json!({"nonsense": 1}), "unknown field"),
            (json!({"id": 5}), "`id`: invalid type"),
            (json!({"limits": {"memory": "lots"}}), "`limits.memory`"),
            (json!({"limits": {"deadline": 7}}), "`limits.deadline`: invalid type"),
            (json!({"input": {"topics": "acme.in"}}), "`input.topics`: invalid type"),
            (json!({"checkpoint": {"interval": "soon"}}), "`checkpoint.interval`"),
            (json!({"parallelism": -1}), "`parallelism`"),
        ];
        for (extra, expected) in cases {
            let err = policy.job_spec(spec(extra.clone())).expect_err(&extra.to_string());
            assert!(err.to_string().contains(expected), "{extra} => {err}");
        }
    }

    /// Not even a prefix that covers them lets a job use the host's own
    /// topics: another job's changelog, or a cluster's metadata, which its
    /// members apply.
    #[test]
    fn a_policy_cannot_give_more_guest_memory_than_a_host_has() {
        let mut policy = Policy::default_for("acme");
        policy.limits.memory = "1GiB".into();
        policy.check().expect("1GiB is a host's largest guest memory");
        policy.limits.memory = "2GiB".into();
        let err = policy.check().expect_err("2GiB could never be instantiated");
        assert!(err.to_string().contains("`limits.memory`"), "{err}");
    }

    #[test]
    fn the_hosts_own_topics_are_no_tenants() {
        let mut policy = Policy::default_for("acme");
        policy.topic_prefixes = vec!["acme.".into(), "s".into()];
        let cases = [
            (json!({"output": {"topics": ["sluice-cluster.prod.meta"]}}), "`sluice-cluster.` are the host's own"),
            (json!({"input": {"topics": ["sluice.globex.j.changelog"]}}), "`sluice.` are the host's own"),
            (json!({"errors": {"dead-letter-topic": "sluice.x"}}), "`sluice.` are the host's own"),
        ];
        for (extra, expected) in cases {
            let err = policy.job_spec(spec(extra.clone())).expect_err(&extra.to_string());
            assert!(err.to_string().contains(expected), "{extra} => {err}");
        }
    }
}
