//! Tenants: who may call, with which limits, and the cache salt that isolates each one.
//!
//! Loaded from TOML (`[[tenant]]` tables, see `examples/cachet.toml`). API keys are stored only as
//! their sha256 (`cachet tenant hash-key KEY` prints it); a request's key is hashed and looked up.
//! Each tenant has token buckets for requests/min and tokens/min, a cap on concurrent requests, a
//! priority class for the scheduler, the models it may use, and a cache salt derived from the
//! deployment key and the tenant id (or its `cache_share_group`): never taken from a client.
//! With `[shared_limits]` the limits live in Redis, shared by every replica ([`shared`]).

pub mod config;
pub mod rate_limit;
pub mod shared;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cachet_backend::block_hash::tenant_salt;
use sha2::{Digest, Sha256};

use rate_limit::{LimitState, RateLimits, Refusal, TokenBucket};
use shared::{spawn_detached, OnError, SharedLimits};

pub use config::{InvalidTenant, TenantConfig};

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Denied {
    #[error("invalid API key")]
    BadKey,
    #[error("tenant `{tenant}` is suspended; its operator can resume it")]
    Suspended { tenant: String },
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
    #[error("tenant `{tenant}`: its rate limits are kept in Redis, which does not answer, and this gateway refuses limited requests until it does (shared_limits.on_error = \"closed\")")]
    LimitsUnavailable { tenant: String },
    #[error("tenant `{tenant}` has spent {spent:.6} USD of its budget of {budget} USD this {period}; the budget renews in {retry_after:?}, or the operator can raise it")]
    OverBudget {
        tenant: String,
        spent: f64,
        budget: f64,
        period: &'static str,
        retry_after: Duration,
    },
}

/// A configured tenant with its live limits.
#[derive(Debug)]
pub struct Tenant {
    pub config: TenantConfig,
    pub salt: [u8; 32],
    /// The normalizer's rules for this tenant.
    pub rules: crate::normalize::Rules,
    /// Live limit state, shared with the tenant of the same id after a config reload (so a
    /// reload neither refills buckets nor forgets requests in flight).
    /// With shared limits: this replica's share of them, used while Redis does not answer.
    requests: Option<Arc<Mutex<TokenBucket>>>,
    tokens: Option<Arc<Mutex<TokenBucket>>>,
    inflight: Arc<AtomicU32>,
    /// The cap on `inflight` (this replica's share of `max_concurrent` with shared limits).
    local_max_concurrent: Option<u32>,
    /// The Redis store of every replica's limits, if the config has `[shared_limits]`.
    shared: Option<Arc<SharedLimits>>,
}

/// Holds one of a tenant's concurrent-request slots; released on drop.
#[derive(Debug)]
pub struct Permit {
    tenant: Arc<Tenant>,
    /// Whether a requests/min unit was taken (given back if the prompt is refused).
    took_request: bool,
    /// Admitted through Redis: the concurrency lease to give back and the buckets' levels read.
    lease: Option<shared::Lease>,
    /// The prompt's tokens charged (through Redis: taken from the level the admission read).
    prompt_charged: f64,
}

impl Permit {
    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }

    /// The tenant's buckets as this request's response reports them: as Redis had them at
    /// admission (less this request's prompt) when admitted there, else this process's now.
    pub fn rate_limits(&self, now: Instant) -> RateLimits {
        let (t, Some(lease)) = (&self.tenant, &self.lease) else {
            return self.tenant.local_limits(now);
        };
        let of = |per_minute: Option<u64>, level: Option<f64>| {
            per_minute
                .zip(level)
                .map(|(n, l)| LimitState::of(n as f64, l))
        };
        RateLimits {
            requests: of(t.config.requests_per_minute, lease.requests_level),
            tokens: of(
                t.config.tokens_per_minute,
                lease.tokens_level.map(|l| l - self.prompt_charged),
            ),
        }
    }
}

impl Permit {
    /// The second step of admission, once the prompt is tokenized: the tokens/min bucket must
    /// hold the prompt, which is then charged. A refusal gives the requests/min unit back.
    pub fn charge_prompt(&mut self, prompt_tokens: u64, now: Instant) -> Result<(), Denied> {
        let t = self.tenant.clone();
        let Some(b) = &t.tokens else {
            return Ok(());
        };
        // Admitted through Redis: the level the admission read (refilled since by at most the
        // template's and tokenizer's milliseconds), the prompt charged there without waiting.
        let shared_level = self.lease.as_ref().and_then(|l| l.tokens_level);
        let checked = match (shared_level, t.config.tokens_per_minute) {
            (Some(level), Some(per_minute)) => {
                let (n, cap) = (prompt_tokens as f64, per_minute as f64);
                if n > cap {
                    Err(Refusal::TooLarge {
                        asked: n,
                        capacity: cap,
                    })
                } else if level < n {
                    Err(Refusal::RetryAfter(Duration::from_secs_f64(
                        (n - level) * 60.0 / cap,
                    )))
                } else {
                    Ok(())
                }
            }
            _ => b
                .lock()
                .expect("bucket lock")
                .check(prompt_tokens as f64, now),
        };
        let refused = match checked {
            Ok(()) => None,
            Err(Refusal::RetryAfter(d)) => Some(Denied::RateLimited {
                tenant: t.config.id.clone(),
                limit: "tokens-per-minute",
                retry_after: d,
            }),
            Err(Refusal::TooLarge { asked, capacity }) => Some(Denied::TooLarge {
                tenant: t.config.id.clone(),
                asked: asked as u64,
                capacity: capacity as u64,
            }),
        };
        if let Some(d) = refused {
            if std::mem::take(&mut self.took_request) {
                if let Some(r) = &t.requests {
                    r.lock().expect("bucket lock").refund(1.0, now);
                }
                if let (Some(s), Some(_), Some(rpm)) =
                    (&t.shared, &self.lease, t.config.requests_per_minute)
                {
                    let (s, id) = (s.clone(), t.config.id.clone());
                    spawn_detached(async move { s.charge(&id, "requests", rpm, -1.0).await });
                }
            }
            return Err(d);
        }
        t.charge_tokens(prompt_tokens, now);
        self.prompt_charged = prompt_tokens as f64;
        Ok(())
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.tenant.inflight.fetch_sub(1, Ordering::SeqCst);
        if let (Some(s), Some(member)) = (
            &self.tenant.shared,
            self.lease.as_mut().and_then(|l| l.member.take()),
        ) {
            let (s, id) = (s.clone(), self.tenant.config.id.clone());
            spawn_detached(async move { s.release(&id, &member).await });
        }
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

    /// Admits one request of `prompt_tokens` prompt tokens, or says how long to wait (both steps
    /// of [`Tenant::admit_request`] and [`Permit::charge_prompt`]); a refusal changes nothing.
    pub async fn admit(
        self: &Arc<Self>,
        prompt_tokens: u64,
        now: Instant,
    ) -> Result<Permit, Denied> {
        let mut permit = self.admit_request(now).await?;
        permit.charge_prompt(prompt_tokens, now)?;
        Ok(permit)
    }

    /// Whether any of the tenant's limits apply to requests (those go through Redis when the
    /// limits are shared).
    fn limited(&self) -> bool {
        self.config.max_concurrent.is_some()
            || self.config.requests_per_minute.is_some()
            || self.config.tokens_per_minute.is_some()
    }

    /// The first step of admission, before any work is done for the request (its template
    /// included): a concurrency slot, then a requests/min unit — in Redis (one round trip) when
    /// the limits are shared, in this process otherwise or when Redis does not answer and
    /// `on_error` is `local`.
    pub async fn admit_request(self: &Arc<Self>, now: Instant) -> Result<Permit, Denied> {
        if let Some(s) = self.shared.as_ref().filter(|_| self.limited()) {
            // Boxed: the Redis round trip's state machine is kilobytes, and every request's
            // future would carry it.
            match Box::pin(s.admit(&self.config)).await {
                Ok(Ok(lease)) => {
                    self.inflight.fetch_add(1, Ordering::SeqCst);
                    // This replica's share follows what it admits, so a fallback starts warm.
                    if let Some(b) = &self.requests {
                        b.lock().expect("bucket lock").charge(1.0, now);
                    }
                    return Ok(Permit {
                        tenant: self.clone(),
                        took_request: true,
                        lease: Some(lease),
                        prompt_charged: 0.0,
                    });
                }
                Ok(Err(denied)) => return Err(denied),
                Err(_) => {
                    s.fallbacks
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if s.config.on_error == OnError::Closed {
                        return Err(Denied::LimitsUnavailable {
                            tenant: self.config.id.clone(),
                        });
                    }
                }
            }
        }
        self.admit_local(now)
    }

    /// Admission against this process's buckets and concurrency count.
    fn admit_local(self: &Arc<Self>, now: Instant) -> Result<Permit, Denied> {
        let id = || self.config.id.clone();
        let before = self.inflight.fetch_add(1, Ordering::SeqCst);
        // From here on, dropping `permit` (on any refusal) gives the slot back.
        let mut permit = Permit {
            tenant: self.clone(),
            took_request: false,
            lease: None,
            prompt_charged: 0.0,
        };
        if self.local_max_concurrent.is_some_and(|max| before >= max) {
            return Err(Denied::RateLimited {
                tenant: id(),
                limit: "concurrent-requests",
                retry_after: Duration::from_secs(1),
            });
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
            permit.took_request = true;
        }
        Ok(permit)
    }

    /// This process's buckets now.
    fn local_limits(&self, now: Instant) -> RateLimits {
        let state = |b: &Option<Arc<Mutex<TokenBucket>>>| {
            b.as_ref()
                .map(|b| b.lock().expect("bucket lock").state(now))
        };
        RateLimits {
            requests: state(&self.requests),
            tokens: state(&self.tokens),
        }
    }

    /// What the response to a request refused at admission (`denied`) reports of the buckets:
    /// this process's, or where Redis decided (the levels are its own) the refused requests/min
    /// bucket, whose level the retry time gives.
    pub fn refused_limits(&self, denied: &Denied, now: Instant) -> RateLimits {
        if self.shared.as_ref().is_none_or(|s| s.is_down()) {
            return self.local_limits(now);
        }
        match (denied, self.config.requests_per_minute) {
            (
                Denied::RateLimited {
                    limit: "requests-per-minute",
                    retry_after,
                    ..
                },
                Some(n),
            ) => {
                let n = n as f64;
                RateLimits {
                    requests: Some(LimitState::of(
                        n,
                        1.0 - retry_after.as_secs_f64() * n / 60.0,
                    )),
                    tokens: None,
                }
            }
            _ => RateLimits::default(),
        }
    }

    /// Charges generated tokens once they are known (to Redis too, without waiting, when the
    /// limits are shared).
    pub fn charge_tokens(&self, n: u64, now: Instant) {
        if let Some(b) = &self.tokens {
            b.lock().expect("bucket lock").charge(n as f64, now);
        }
        if let (Some(s), Some(tpm)) = (&self.shared, self.config.tokens_per_minute) {
            if n > 0 {
                let (s, id) = (s.clone(), self.config.id.clone());
                spawn_detached(async move { s.charge(&id, "tokens", tpm, n as f64).await });
            }
        }
    }
}

/// All tenants, indexed by the sha256 of their API keys.
#[derive(Debug, Default)]
pub struct TenantRegistry {
    by_key: HashMap<[u8; 32], Arc<Tenant>>,
    by_admin_key: HashMap<[u8; 32], Arc<Tenant>>,
    tenants: Vec<Arc<Tenant>>,
    shared: Option<Arc<SharedLimits>>,
}

/// sha256 of an API key, as stored in the config.
pub fn hash_key(api_key: &str) -> [u8; 32] {
    Sha256::digest(api_key.as_bytes()).into()
}

pub use crate::protocol::{hex, parse_hex32};

impl TenantRegistry {
    /// The registry of `tenants` (a config file's `[[tenant]]` tables), validated.
    pub fn from_configs(
        tenants: Vec<TenantConfig>,
        deployment_key: &[u8; 32],
        now: Instant,
    ) -> Result<Self, InvalidTenant> {
        Self::build(tenants, deployment_key, now, None, None, true)
    }

    /// As [`TenantRegistry::from_configs`], the limits kept in `shared` (Redis) for every
    /// replica; each tenant's own buckets hold this replica's share, used while Redis is down.
    pub fn with_shared_limits(
        tenants: Vec<TenantConfig>,
        deployment_key: &[u8; 32],
        now: Instant,
        shared: Option<Arc<SharedLimits>>,
    ) -> Result<Self, InvalidTenant> {
        Self::build(tenants, deployment_key, now, None, shared, true)
    }

    /// As [`TenantRegistry::from_configs`], keeping the live state of `previous`'s tenants of
    /// the same id: requests in flight (their concurrency slots) and the buckets' levels (at a
    /// changed rate, within the new capacity), and its shared-limits store. A reload refills
    /// nothing.
    pub fn reloaded(
        tenants: Vec<TenantConfig>,
        deployment_key: &[u8; 32],
        now: Instant,
        previous: Option<&TenantRegistry>,
    ) -> Result<Self, InvalidTenant> {
        let shared = previous.and_then(|p| p.shared.clone());
        Self::build(tenants, deployment_key, now, previous, shared, true)
    }

    /// As [`TenantRegistry::reloaded`], from the operator store's tenants: there a tenant may
    /// have no key (all revoked; it keeps its settings and usage), and `shared` is the
    /// shared-limits store (on the first load, `previous` is `None`).
    pub fn from_store(
        tenants: Vec<TenantConfig>,
        deployment_key: &[u8; 32],
        now: Instant,
        previous: Option<&TenantRegistry>,
        shared: Option<Arc<SharedLimits>>,
    ) -> Result<Self, InvalidTenant> {
        let shared = previous.and_then(|p| p.shared.clone()).or(shared);
        Self::build(tenants, deployment_key, now, previous, shared, false)
    }

    /// The shared-limits store, if there is one.
    pub fn shared_limits(&self) -> Option<&Arc<SharedLimits>> {
        self.shared.as_ref()
    }

    fn build(
        tenants: Vec<TenantConfig>,
        deployment_key: &[u8; 32],
        now: Instant,
        previous: Option<&TenantRegistry>,
        shared: Option<Arc<SharedLimits>>,
        require_keys: bool,
    ) -> Result<Self, InvalidTenant> {
        // With shared limits, this replica's share of each (used while Redis is down).
        let replicas = shared.as_ref().map_or(1, |s| s.config.replicas.max(1));
        let share = |n: u64| n.div_ceil(replicas as u64);
        let mut reg = TenantRegistry {
            shared: shared.clone(),
            ..TenantRegistry::default()
        };
        let mut ids = std::collections::HashSet::new();
        for cfg in tenants {
            let bad = |msg: String| InvalidTenant {
                tenant: cfg.id.clone(),
                msg,
            };
            if cfg.id.is_empty() || !ids.insert(cfg.id.clone()) {
                return Err(bad("tenant ids must be unique and non-empty".into()));
            }
            if cfg.id == cachet_backend::kv::manager::PUBLIC_OWNER {
                return Err(bad(format!(
                    "`{}` names the public prefix's share of the cache; choose another id",
                    cfg.id
                )));
            }
            if require_keys && cfg.api_key_sha256.is_empty() {
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
            if !(0.01..=1000.0).contains(&cfg.share) {
                return Err(bad(format!(
                    "share must be 0.01 to 1000 (a weight: 1 is the default), got {}",
                    cfg.share
                )));
            }
            if let Some(b) = cfg.budget_usd {
                if !(b.is_finite() && b > 0.0) {
                    return Err(bad(format!(
                        "budget_usd must be a positive number of USD, got {b}"
                    )));
                }
            } else if cfg.budget_period.is_some() {
                return Err(bad("budget_period without budget_usd: set both".into()));
            }
            let salt = tenant_salt(
                deployment_key,
                cfg.cache_share_group
                    .as_deref()
                    .unwrap_or(&format!("tenant:{}", cfg.id)),
            );
            let rules =
                crate::normalize::Rules::new(cfg.normalize.as_deref(), &cfg.volatile_patterns)
                    .map_err(|e| bad(crate::error::with_causes(&e)))?;
            let old = previous.and_then(|p| p.tenants.iter().find(|t| t.id() == cfg.id));
            let bucket = |per_minute: Option<u64>,
                          old: Option<&Arc<Mutex<TokenBucket>>>,
                          old_rate: Option<u64>| {
                per_minute.map(|n| match old {
                    Some(b) if old_rate == Some(n) => b.clone(),
                    Some(b) => {
                        Arc::new(Mutex::new(b.lock().expect("bucket lock").rescaled(n, now)))
                    }
                    None => Arc::new(Mutex::new(TokenBucket::per_minute(n, now))),
                })
            };
            let tenant = Arc::new(Tenant {
                salt,
                rules,
                requests: bucket(
                    cfg.requests_per_minute.map(share),
                    old.and_then(|o| o.requests.as_ref()),
                    old.and_then(|o| o.config.requests_per_minute.map(share)),
                ),
                tokens: bucket(
                    cfg.tokens_per_minute.map(share),
                    old.and_then(|o| o.tokens.as_ref()),
                    old.and_then(|o| o.config.tokens_per_minute.map(share)),
                ),
                inflight: old.map_or_else(Default::default, |o| o.inflight.clone()),
                local_max_concurrent: cfg
                    .max_concurrent
                    .map(|m| (m as u64).div_ceil(replicas as u64) as u32),
                shared: shared.clone(),
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
        Self::unless_suspended(self.by_key.get(&hash_key(api_key)))
    }

    /// The tenant whose templates an admin key manages.
    pub fn authenticate_admin(&self, admin_key: &str) -> Result<Arc<Tenant>, Denied> {
        Self::unless_suspended(self.by_admin_key.get(&hash_key(admin_key)))
    }

    fn unless_suspended(t: Option<&Arc<Tenant>>) -> Result<Arc<Tenant>, Denied> {
        match t {
            None => Err(Denied::BadKey),
            Some(t) if t.config.suspended => Err(Denied::Suspended {
                tenant: t.id().to_string(),
            }),
            Some(t) => Ok(t.clone()),
        }
    }

    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }
}

#[cfg(test)]
mod tests;
