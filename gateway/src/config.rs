//! The config file (TOML, see `examples/cachet.toml`): `[[tenant]]` tables (read by
//! [`crate::tenants`]) and `[[upstream]]` tables — where the gateway sends requests, read at
//! start-up.

use serde::{Deserialize, Serialize};

/// One tenant as configured.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub id: String,
    /// sha256 (hex) of each API key.
    pub api_key_sha256: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// Scheduler priority class: lower runs first.
    #[serde(default)]
    pub priority: i32,
    /// This tenant's weight: under fair sharing (`--fair-share`) with share 2 it gets twice the
    /// tokens of a tenant of share 1 while both have work waiting, and of the idle KV cache
    /// (`--cache-shares`) twice the blocks before its own are evicted first. Default 1; 0.01 to
    /// 1000.
    #[serde(default = "one")]
    pub share: f32,
    /// Tenants in the same group share prefix-cache entries (e.g. a public system prompt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_share_group: Option<String>,
    /// Models this tenant may use; empty means all.
    #[serde(default)]
    pub allowed_models: Vec<String>,
    /// sha256 (hex) of keys that may manage this tenant's templates (`/v1/templates`); a tenant
    /// without one cannot upload templates.
    #[serde(default)]
    pub admin_key_sha256: Vec<String>,
    /// Template for chat requests that name none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_template: Option<String>,
    /// Passed to the tenant's templates as `tenant.metadata`.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// Template budgets of this tenant (within the gateway's `--template-*` limits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_deadline_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_fuel: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_memory_mib: Option<u64>,
    /// Prompt normalization: "relocate" (default: volatile values move into a block before the
    /// new message), "relocate-after" (after it: earlier turns stay cacheable) or "off".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalize: Option<String>,
    /// More volatile-value patterns (regexes) for the normalizer, e.g. `ORD-\\d{6}`.
    #[serde(default)]
    pub volatile_patterns: Vec<String>,
    /// Spend limit in USD per `budget_period`, priced by the config's `[[price]]`s: a request
    /// that arrives with the budget spent is refused (429 `budget_exceeded`); one admitted
    /// runs to its end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_usd: Option<f64>,
    /// `day` or `month` (default; UTC calendar periods).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_period: Option<crate::usage::Period>,
    /// A suspended tenant's requests are refused (403 `tenant_suspended`) until it is resumed;
    /// its keys, limits and usage stay.
    #[serde(default)]
    pub suspended: bool,
}

fn one() -> f32 {
    1.0
}

/// The whole config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub tenant: Vec<TenantConfig>,
    #[serde(default)]
    pub upstream: Vec<UpstreamConfig>,
    /// Prompt starts whose cached blocks every tenant shares (see
    /// [`crate::normalize::public`]).
    #[serde(default)]
    pub public_prefix: Vec<crate::normalize::public::PublicPrefixConfig>,
    /// Prices per model, turning usage records' tokens into spend.
    #[serde(default)]
    pub price: Vec<crate::usage::Price>,
    /// How upstreams named by DNS are resolved.
    #[serde(default)]
    pub discovery: Option<DiscoveryConfig>,
    /// Tenant limits kept in Redis for every replica of the gateway (read at start-up).
    #[serde(default)]
    pub shared_limits: Option<crate::tenants::shared::SharedLimitsConfig>,
    /// Tenants kept in a database and changed live through the operator API (read at
    /// start-up; the `[[tenant]]` tables are then imported on the database's first start).
    #[serde(default)]
    pub operator: Option<crate::operator::OperatorConfig>,
}

/// `[discovery]`: the name server that resolves `dns = true` upstreams (default: the system's,
/// from /etc/resolv.conf — in Kubernetes, the cluster DNS).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// `IP:PORT` of a DNS server.
    pub nameserver: Option<std::net::SocketAddr>,
}

/// An `[[upstream]]` of the config file: where the gateway sends requests (read at start-up).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum UpstreamConfig {
    /// A `cachet worker` at `url` (exact prefix routing from its KV events). An `https://` URL
    /// is verified against the system's roots and `ca_file`'s certificates (PEM), if given.
    /// `dns = true`: the URL's host names a set of workers (a Kubernetes headless service),
    /// resolved again every `dns_refresh_secs` (default 10): each address is a member, a new
    /// one joins once its health check answers, a gone one leaves (its requests run out).
    Cachet {
        url: String,
        #[serde(default)]
        ca_file: Option<std::path::PathBuf>,
        #[serde(default)]
        dns: bool,
        #[serde(default)]
        dns_refresh_secs: Option<u64>,
    },
    /// The gateway's own engine, as one member of the pool.
    Embedded {},
    /// Any OpenAI-compatible server at `url` (`/v1/completions`; text in, approximate routing
    /// from the prompts sent there). `model`: the name it serves (default: the gateway's model
    /// id); `api_key_env`: an environment variable holding its API key; `history_blocks`: how many
    /// prompt blocks the gateway remembers sending (about the server's KV cache, default 65536);
    /// `cache_salt`: send each request's cache salt (the tenant's) as vLLM's `cache_salt`, so
    /// the server keeps tenants' caches apart too (default true; false for servers that refuse
    /// the field); `ca_file`: as for `cachet`.
    Openai {
        url: String,
        model: Option<String>,
        api_key_env: Option<String>,
        history_blocks: Option<usize>,
        cache_salt: Option<bool>,
        #[serde(default)]
        ca_file: Option<std::path::PathBuf>,
    },
}

impl ConfigFile {
    /// Parses a config document; the upstreams are checked here, the tenants by
    /// [`crate::tenants::TenantRegistry::from_configs`].
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let file: ConfigFile = toml::from_str(text)?;
        validate_upstreams(&file.upstream)?;
        if let Some(s) = &file.shared_limits {
            s.validate().map_err(ConfigError::Section)?;
        }
        if let Some(o) = &file.operator {
            o.validate().map_err(ConfigError::Section)?;
        }
        Ok(file)
    }
}

/// The `[[upstream]]` entries of a config file.
pub fn upstreams_from_toml(text: &str) -> Result<Vec<UpstreamConfig>, ConfigError> {
    Ok(ConfigFile::parse(text)?.upstream)
}

/// An upstream's URL — http:// or https:// (TLS, verified against the system's roots and the
/// certificates of `ca_file`) — and its CA file: only for an https:// URL, and readable, with
/// at least one certificate. Checked at load, so a bad one is not found on every request.
pub fn check_upstream_url(url: &str, ca_file: Option<&std::path::Path>) -> Result<(), ConfigError> {
    let https = url.starts_with("https://");
    if !https && !url.starts_with("http://") {
        return Err(ConfigError::Upstream(format!(
            "`{url}` is not an http:// or https:// URL"
        )));
    }
    if let Some(ca) = ca_file {
        if !https {
            return Err(ConfigError::Upstream(format!(
                "`{url}`: ca_file `{}` is for https:// upstreams; this one is plain HTTP",
                ca.display()
            )));
        }
        crate::http::client::read_ca_file(ca)
            .map_err(|e| ConfigError::Upstream(format!("`{url}`: ca_file {e}")))?;
    }
    Ok(())
}

fn validate_upstreams(upstreams: &[UpstreamConfig]) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashSet::new();
    for u in upstreams {
        let name = match u {
            UpstreamConfig::Cachet {
                url,
                ca_file,
                dns,
                dns_refresh_secs,
            } => {
                check_upstream_url(url, ca_file.as_deref())?;
                if *dns {
                    crate::upstream::discovery::DnsName::parse(url)
                        .map_err(|e| ConfigError::Upstream(format!("`{url}`: {e}")))?;
                }
                if dns_refresh_secs.is_some() && !dns {
                    return Err(ConfigError::Upstream(format!(
                        "`{url}`: dns_refresh_secs is for dns = true upstreams"
                    )));
                }
                if *dns_refresh_secs == Some(0) {
                    return Err(ConfigError::Upstream(format!(
                        "`{url}`: dns_refresh_secs must be at least 1"
                    )));
                }
                url.trim_end_matches('/').to_string()
            }
            UpstreamConfig::Embedded {} => "embedded".to_string(),
            UpstreamConfig::Openai {
                url,
                api_key_env,
                history_blocks,
                ca_file,
                ..
            } => {
                check_upstream_url(url, ca_file.as_deref())?;
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
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("tenants config: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("tenant `{tenant}`: {msg}")]
    Invalid { tenant: String, msg: String },
    #[error("upstream: {0}")]
    Upstream(String),
    #[error("{0}")]
    /// A section of its own (`[shared_limits]`, `[operator]`) that is wrong.
    Section(String),
}
