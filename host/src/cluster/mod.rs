//! A cluster of hosts, with Kafka as the engine (`sluice serve --cluster NAME`).
//!
//! Several hosts started with the same cluster name and brokers share one
//! set of tenants, modules and jobs. There is no consensus, election or
//! membership protocol of sluice's own: what hosts must agree on goes
//! through Kafka, and Kafka's group protocol and transactions decide.
//!
//! This module owns what the hosts share and how it travels; the service
//! ([`crate::service`]) decides what the records mean.
//! - [`Identity`]: the cluster's name and this host's id, kept in the data
//!   directory (`host.json`), so a directory never changes cluster.
//! - [`Topics`]: the names of the cluster's topics.
//! - [`log`]: the replicated metadata, a key-value log with conditional
//!   writes decided in log order.
//! - [`chunks`]: module bytes, in chunks below the broker's message size.
//! - [`placement`]: which member runs which job, by Kafka's group
//!   assignment of the placement topic's partitions (slots).
//! - [`status`]: what each member's jobs are doing, published for the API
//!   on every member.

pub mod chunks;
pub mod log;
pub mod placement;
pub mod status;

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Checks a cluster name: it becomes part of topic, group and transactional
/// ids, so the same rules as a tenant's.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = crate::kafka::is_id_part(name);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "cluster name {name:?}: use 1-40 lowercase letters, digits or `-` (it becomes part of Kafka topic and \
             group names)"
        ))
    }
}

/// What the names of cluster `name`'s topics, groups and transactional ids
/// start with: `sluice-cluster.<name>`, never of the form of a job's
/// `sluice.<tenant>.<job>`, so no tenant's job shares a cluster's ids. No
/// job may name a topic under it (see [`crate::service::Policy`]).
pub fn prefix(name: &str) -> String {
    format!("{}{name}", crate::kafka::CLUSTER_PREFIX)
}

/// The topics of cluster `name`.
#[derive(Debug, Clone)]
pub struct Topics {
    /// Writes waiting to be decided: one partition, deleted after a day.
    pub requests: String,
    /// Decided metadata: one partition, compacted.
    pub meta: String,
    /// Module bytes in chunks: one partition, compacted.
    pub modules: String,
    /// Slots of jobs: [`placement::SLOTS`] partitions, no records.
    pub placement: String,
    /// Members' statuses of the jobs they run: one partition, compacted.
    pub status: String,
}

impl Topics {
    /// The topics of cluster `name`.
    pub fn of(name: &str) -> Topics {
        Topics {
            requests: format!("{}.requests", prefix(name)),
            meta: format!("{}.meta", prefix(name)),
            modules: format!("{}.modules", prefix(name)),
            placement: format!("{}.placement", prefix(name)),
            status: format!("{}.status", prefix(name)),
        }
    }
}

/// Who this host is in which cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The cluster's name.
    pub cluster: String,
    /// This host's id: random at the first start, kept in the data directory.
    pub host: String,
}

/// Where a data directory keeps its [`Identity`].
const IDENTITY_FILE: &str = "host.json";

impl Identity {
    /// The identity kept in `data_dir`, created for `cluster` at the first
    /// start. Refuses a directory of another cluster, and a directory a
    /// host used alone (its metadata is not the cluster's).
    pub fn load_or_create(data_dir: &Path, cluster: &str) -> Result<Identity, String> {
        check_name(cluster)?;
        let path = data_dir.join(IDENTITY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let identity: Identity = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("{} is not a host identity: {e}", path.display()))?;
                if identity.cluster != cluster {
                    return Err(format!(
                        "{} belongs to cluster `{}`, not `{cluster}`: give each cluster its own data directory",
                        data_dir.display(),
                        identity.cluster
                    ));
                }
                Ok(identity)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if data_dir.join("meta.redb").exists() {
                    return Err(format!(
                        "{} holds a host that ran alone; a cluster member starts from an empty data directory \
                         and takes its metadata from the cluster",
                        data_dir.display()
                    ));
                }
                let mut bytes = [0u8; 8];
                getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a host id: {e}"))?;
                let identity = Identity { cluster: cluster.to_owned(), host: hex::encode(bytes) };
                let json = serde_json::to_vec_pretty(&identity).map_err(|e| e.to_string())?;
                crate::fsutil::write_atomically(&path, &json)
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
                Ok(identity)
            }
            Err(e) => Err(format!("reading {}: {e}", path.display())),
        }
    }
}

/// Locks `mutex`, also after a panic of another holder: everything the
/// cluster's threads guard is changed in one step, so it stays consistent.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_keeps_its_host_id_and_refuses_another_cluster() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = Identity::load_or_create(dir.path(), "east").expect("created");
        let again = Identity::load_or_create(dir.path(), "east").expect("loaded");
        assert_eq!(first, again);
        let other = Identity::load_or_create(dir.path(), "west").expect_err("another cluster");
        assert!(other.contains("belongs to cluster `east`"), "{other}");
    }

    #[test]
    fn a_directory_of_a_lone_host_does_not_join_a_cluster() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("meta.redb"), b"").expect("write");
        let refused = Identity::load_or_create(dir.path(), "east").expect_err("lone host");
        assert!(refused.contains("ran alone"), "{refused}");
    }

    #[test]
    fn cluster_names_are_checked() {
        assert!(check_name("prod-1").is_ok());
        for bad in ["", "Prod", "a.b", "-x", &"x".repeat(41)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
