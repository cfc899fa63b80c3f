//! A tenant as the config file (`[[tenant]]`) or the operator's database holds it.

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

/// A tenant the registry refuses, and why.
#[derive(Debug, thiserror::Error)]
#[error("tenant `{tenant}`: {msg}")]
pub struct InvalidTenant {
    pub tenant: String,
    pub msg: String,
}
