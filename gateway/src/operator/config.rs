//! `[operator]` in the config file: the database, the operators' keys, the follower's poll.

use serde::Deserialize;
use std::time::Duration;

/// `[operator]` in the config file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// `sqlite:PATH` or `postgres://USER@HOST/DB` (every replica the same PostgreSQL).
    pub database: Option<String>,
    /// An environment variable holding the database URL instead (a Kubernetes Secret).
    pub database_env: Option<String>,
    /// The operators: each a name (recorded in the audit log) and the sha256 of its key
    /// (`cachet tenant hash-key KEY`).
    #[serde(default)]
    pub key: Vec<OperatorKey>,
    /// Milliseconds between a replica's looks at the database for changes (50–1000, default 250).
    pub poll_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorKey {
    pub name: String,
    pub sha256: String,
}

impl OperatorConfig {
    pub fn validate(&self) -> Result<(), InvalidOperatorConfig> {
        use InvalidOperatorConfig as E;
        match (&self.database, &self.database_env) {
            (Some(_), Some(_)) => return Err(E::BothDatabases),
            (None, None) => return Err(E::NoDatabase),
            _ => {}
        }
        if self.key.is_empty() {
            return Err(E::NoKeys);
        }
        let mut names = std::collections::HashSet::new();
        for k in &self.key {
            if k.name.is_empty() || !names.insert(&k.name) {
                return Err(E::KeyName(k.name.clone()));
            }
            if crate::tenants::parse_hex32(&k.sha256).is_none() {
                return Err(E::KeyHash {
                    name: k.name.clone(),
                    sha256: k.sha256.clone(),
                });
            }
        }
        if let Some(p) = self.poll_ms {
            if !(50..=1000).contains(&p) {
                return Err(E::PollMs(p));
            }
        }
        Ok(())
    }

    /// The database URL (from `database_env` when that is given).
    pub fn url(&self) -> Result<String, InvalidOperatorConfig> {
        match (&self.database, &self.database_env) {
            (Some(u), _) => Ok(u.clone()),
            (None, Some(v)) => {
                std::env::var(v).map_err(|_| InvalidOperatorConfig::EnvUnset(v.clone()))
            }
            (None, None) => Err(InvalidOperatorConfig::NoDatabase),
        }
    }

    pub fn poll(&self) -> Duration {
        Duration::from_millis(self.poll_ms.unwrap_or(250))
    }

    /// The operator whose key this is.
    pub fn operator_of(&self, key: &str) -> Option<&str> {
        let h = crate::tenants::hash_key(key);
        self.key
            .iter()
            .find(|k| crate::tenants::parse_hex32(&k.sha256).is_some_and(|s| s == h))
            .map(|k| k.name.as_str())
    }
}

/// What is wrong with `[operator]`.
#[derive(Debug, thiserror::Error)]
pub enum InvalidOperatorConfig {
    #[error("[operator]: give database or database_env, not both")]
    BothDatabases,
    #[error("[operator] needs database (sqlite:PATH or postgres://…) or database_env")]
    NoDatabase,
    #[error("[operator] needs at least one [[operator.key]] (name and sha256): the operator API answers only its keys")]
    NoKeys,
    #[error("[[operator.key]] names must be unique and non-empty (`{0}`)")]
    KeyName(String),
    #[error("[[operator.key]] `{name}`: sha256 `{sha256}` is not 64 hex digits")]
    KeyHash { name: String, sha256: String },
    #[error("[operator] poll_ms must be 50 to 1000, got {0}")]
    PollMs(u64),
    #[error("[operator] database_env names `{0}`, which is not set")]
    EnvUnset(String),
}
