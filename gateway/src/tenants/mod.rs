//! Tenants: who may call, with which limits, and the cache salt that isolates each one.
//!
//! Loaded from TOML (`[[tenant]]` tables, see `examples/cachet.toml`). API keys are stored only as
//! their sha256 (`cachet tenant hash-key KEY` prints it); a request's key is hashed and looked up.
//! Each tenant has token buckets for requests/min and tokens/min, a cap on concurrent requests, a
//! priority class for the scheduler, the models it may use, and a cache salt derived from the
//! deployment key and the tenant id (or its `cache_share_group`): never taken from a client.

pub mod rate_limit;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cachet_backend::block_hash::tenant_salt;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use rate_limit::{Refusal, TokenBucket};

/// One tenant as configured.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub id: String,
    /// sha256 (hex) of each API key.
    pub api_key_sha256: Vec<String>,
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
    pub max_concurrent: Option<u32>,
    /// Scheduler priority class: lower runs first.
    #[serde(default)]
    pub priority: i32,
    /// Tenants in the same group share prefix-cache entries (e.g. a public system prompt).
    pub cache_share_group: Option<String>,
    /// Models this tenant may use; empty means all.
    #[serde(default)]
    pub allowed_models: Vec<String>,
    /// sha256 (hex) of keys that may manage this tenant's templates (`/v1/templates`); a tenant
    /// without one cannot upload templates.
    #[serde(default)]
    pub admin_key_sha256: Vec<String>,
    /// Template for chat requests that name none.
    pub default_template: Option<String>,
    /// Passed to the tenant's templates as `tenant.metadata`.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// Template budgets of this tenant (within the gateway's `--template-*` limits).
    pub template_deadline_ms: Option<u64>,
    pub template_fuel: Option<u64>,
    pub template_memory_mib: Option<u64>,
    /// Prompt normalization: "relocate" (default: volatile values move into a block before the
    /// new message), "relocate-after" (after it: earlier turns stay cacheable) or "off".
    pub normalize: Option<String>,
    /// More volatile-value patterns (regexes) for the normalizer, e.g. `ORD-\\d{6}`.
    #[serde(default)]
    pub volatile_patterns: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    #[serde(default)]
    tenant: Vec<TenantConfig>,
    #[serde(default)]
    upstream: Vec<UpstreamConfig>,
}

/// An `[[upstream]]` of the config file: where the gateway sends requests (read at start-up).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum UpstreamConfig {
    /// A `cachet worker` at `url` (exact prefix routing from its KV events).
    Cachet { url: String },
    /// The gateway's own engine, as one member of the pool.
    Embedded {},
    /// Any OpenAI-compatible server at `url` (`/v1/completions`; text in, approximate routing
    /// from the prompts sent there). `model`: the name it serves (default: the gateway's model
    /// id); `api_key_env`: an environment variable holding its API key; `history_blocks`: how many
    /// prompt blocks the gateway remembers sending (about the server's KV cache, default 65536).
    Openai {
        url: String,
        model: Option<String>,
        api_key_env: Option<String>,
        history_blocks: Option<usize>,
    },
}

/// The `[[upstream]]` entries of a config file.
pub fn upstreams_from_toml(text: &str) -> Result<Vec<UpstreamConfig>, ConfigError> {
    let file: TenantsFile = toml::from_str(text)?;
    let mut seen = std::collections::HashSet::new();
    for u in &file.upstream {
        let name = match u {
            UpstreamConfig::Cachet { url } => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(ConfigError::Upstream(format!(
                        "`{url}` is not an http:// or https:// URL"
                    )));
                }
                url.trim_end_matches('/').to_string()
            }
            UpstreamConfig::Embedded {} => "embedded".to_string(),
            UpstreamConfig::Openai {
                url,
                api_key_env,
                history_blocks,
                ..
            } => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(ConfigError::Upstream(format!(
                        "`{url}` is not an http:// or https:// URL"
                    )));
                }
                if url.starts_with("https://") {
                    return Err(ConfigError::Upstream(format!(
                        "`{url}`: upstreams are reached over plain HTTP for now (put a TLS proxy in front)"
                    )));
                }
                if let Some(v) = api_key_env {
                    if std::env::var(v).is_err() {
                        return Err(ConfigError::Upstream(format!(
                            "`{url}`: api_key_env names `{v}`, which is not set"
                        )));
                    }
                }
                if *history_blocks == Some(0) {
                    return Err(ConfigError::Upstream(format!(
                        "`{url}`: history_blocks must be at least 1"
                    )));
                }
                url.trim_end_matches('/').to_string()
            }
        };
        if !seen.insert(name.clone()) {
            return Err(ConfigError::Upstream(format!("`{name}` is listed twice")));
        }
    }
    Ok(file.upstream)
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("tenants config: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("tenant `{tenant}`: {msg}")]
    Invalid { tenant: String, msg: String },
    #[error("upstream: {0}")]
    Upstream(String),
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Denied {
    #[error("invalid API key")]
    BadKey,
    #[error("tenant `{tenant}` may not use model `{model}`")]
    ModelNotAllowed { tenant: String, model: String },
    #[error("tenant `{tenant}` is over its {limit} limit; retry after {retry_after:?}")]
    RateLimited {
        tenant: String,
        limit: &'static str,
        retry_after: Duration,
    },
    #[error("tenant `{tenant}`: {asked} tokens exceed its limit of {capacity} tokens per minute")]
    TooLarge {
        tenant: String,
        asked: u64,
        capacity: u64,
    },
}

/// A configured tenant with its live limits.
#[derive(Debug)]
pub struct Tenant {
    pub config: TenantConfig,
    pub salt: [u8; 32],
    /// The normalizer's rules for this tenant.
    pub rules: crate::normalize::Rules,
    requests: Option<Mutex<TokenBucket>>,
    tokens: Option<Mutex<TokenBucket>>,
    inflight: AtomicU32,
}

/// Holds one of a tenant's concurrent-request slots; released on drop.
#[derive(Debug)]
pub struct Permit {
    tenant: Arc<Tenant>,
}

impl Permit {
    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.tenant.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Tenant {
    pub fn id(&self) -> &str {
        &self.config.id
    }

    pub fn allows_model(&self, model: &str) -> bool {
        self.config.allowed_models.is_empty()
            || self.config.allowed_models.iter().any(|m| m == model)
    }

    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::SeqCst)
    }

    /// Admits one request of `prompt_tokens` prompt tokens, or says how long to wait. Checks the
    /// concurrency cap, then the tokens/min bucket, then takes a requests/min unit and charges the
    /// prompt tokens; a refusal changes nothing.
    pub fn admit(self: &Arc<Self>, prompt_tokens: u64, now: Instant) -> Result<Permit, Denied> {
        let id = || self.config.id.clone();
        let before = self.inflight.fetch_add(1, Ordering::SeqCst);
        // From here on, dropping `permit` (on any refusal) gives the slot back.
        let permit = Permit {
            tenant: self.clone(),
        };
        if self.config.max_concurrent.is_some_and(|max| before >= max) {
            return Err(Denied::RateLimited {
                tenant: id(),
                limit: "concurrent-requests",
                retry_after: Duration::from_secs(1),
            });
        }
        if let Some(b) = &self.tokens {
            match b
                .lock()
                .expect("bucket lock")
                .check(prompt_tokens as f64, now)
            {
                Ok(()) => {}
                Err(Refusal::RetryAfter(d)) => {
                    return Err(Denied::RateLimited {
                        tenant: id(),
                        limit: "tokens-per-minute",
                        retry_after: d,
                    })
                }
                Err(Refusal::TooLarge { asked, capacity }) => {
                    return Err(Denied::TooLarge {
                        tenant: id(),
                        asked: asked as u64,
                        capacity: capacity as u64,
                    })
                }
            }
        }
        if let Some(b) = &self.requests {
            // A requests bucket holds at least one unit, so only RetryAfter can come back.
            if let Err(Refusal::RetryAfter(d)) = b.lock().expect("bucket lock").try_take(1.0, now) {
                return Err(Denied::RateLimited {
                    tenant: id(),
                    limit: "requests-per-minute",
                    retry_after: d,
                });
            }
        }
        self.charge_tokens(prompt_tokens, now);
        Ok(permit)
    }

    /// Charges generated tokens once they are known.
    pub fn charge_tokens(&self, n: u64, now: Instant) {
        if let Some(b) = &self.tokens {
            b.lock().expect("bucket lock").charge(n as f64, now);
        }
    }
}

/// All tenants, indexed by the sha256 of their API keys.
#[derive(Debug, Default)]
pub struct TenantRegistry {
    by_key: HashMap<[u8; 32], Arc<Tenant>>,
    by_admin_key: HashMap<[u8; 32], Arc<Tenant>>,
    tenants: Vec<Arc<Tenant>>,
}

/// sha256 of an API key, as stored in the config.
pub fn hash_key(api_key: &str) -> [u8; 32] {
    Sha256::digest(api_key.as_bytes()).into()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 64 hex digits → 32 bytes.
pub fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let v: Option<Vec<u8>> = (0..32)
        .map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    v?.try_into().ok()
}

impl TenantRegistry {
    /// Parses and validates a tenants TOML document.
    pub fn from_toml(
        text: &str,
        deployment_key: &[u8; 32],
        now: Instant,
    ) -> Result<Self, ConfigError> {
        let file: TenantsFile = toml::from_str(text)?;
        let mut reg = TenantRegistry::default();
        let mut ids = std::collections::HashSet::new();
        for cfg in file.tenant {
            let bad = |msg: String| ConfigError::Invalid {
                tenant: cfg.id.clone(),
                msg,
            };
            if cfg.id.is_empty() || !ids.insert(cfg.id.clone()) {
                return Err(bad("tenant ids must be unique and non-empty".into()));
            }
            if cfg.api_key_sha256.is_empty() {
                return Err(bad(
                    "needs at least one api_key_sha256 (`cachet tenant hash-key KEY`)".into(),
                ));
            }
            for (name, v) in [
                ("requests_per_minute", cfg.requests_per_minute),
                ("tokens_per_minute", cfg.tokens_per_minute),
            ] {
                if v == Some(0) {
                    return Err(bad(format!("{name} must be > 0 (omit it for no limit)")));
                }
            }
            if cfg.max_concurrent == Some(0) {
                return Err(bad(
                    "max_concurrent must be > 0 (omit it for no limit)".into()
                ));
            }
            let salt = tenant_salt(
                deployment_key,
                cfg.cache_share_group
                    .as_deref()
                    .unwrap_or(&format!("tenant:{}", cfg.id)),
            );
            let rules =
                crate::normalize::Rules::new(cfg.normalize.as_deref(), &cfg.volatile_patterns)
                    .map_err(bad)?;
            let tenant = Arc::new(Tenant {
                salt,
                rules,
                requests: cfg
                    .requests_per_minute
                    .map(|n| Mutex::new(TokenBucket::per_minute(n, now))),
                tokens: cfg
                    .tokens_per_minute
                    .map(|n| Mutex::new(TokenBucket::per_minute(n, now))),
                inflight: AtomicU32::new(0),
                config: cfg.clone(),
            });
            for h in &cfg.api_key_sha256 {
                let key = parse_hex32(h)
                    .ok_or_else(|| bad(format!("api_key_sha256 `{h}` is not 64 hex digits")))?;
                if reg.by_key.insert(key, tenant.clone()).is_some() {
                    return Err(bad("an API key is listed twice".into()));
                }
            }
            for h in &cfg.admin_key_sha256 {
                let key = parse_hex32(h)
                    .ok_or_else(|| bad(format!("admin_key_sha256 `{h}` is not 64 hex digits")))?;
                if reg.by_admin_key.insert(key, tenant.clone()).is_some() {
                    return Err(bad("an admin key is listed twice".into()));
                }
            }
            if let Some(t) = &cfg.default_template {
                if !crate::sandbox::store::valid_name(t) {
                    return Err(bad(format!(
                        "default_template `{t}` is not a template name (a-z, 0-9, `-`, `_`)"
                    )));
                }
            }
            reg.tenants.push(tenant);
        }
        Ok(reg)
    }

    /// The tenant an API key belongs to.
    pub fn authenticate(&self, api_key: &str) -> Result<Arc<Tenant>, Denied> {
        self.by_key
            .get(&hash_key(api_key))
            .cloned()
            .ok_or(Denied::BadKey)
    }

    /// The tenant whose templates an admin key manages.
    pub fn authenticate_admin(&self, admin_key: &str) -> Result<Arc<Tenant>, Denied> {
        self.by_admin_key
            .get(&hash_key(admin_key))
            .cloned()
            .ok_or(Denied::BadKey)
    }

    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }
}

#[cfg(test)]
mod tests;
