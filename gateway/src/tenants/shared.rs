//! Tenant limits shared by every gateway replica through Redis (`[shared_limits]` in the config).
//!
//! Each tenant's requests/min and tokens/min buckets and its concurrent requests live in Redis,
//! keyed by tenant id, and are changed only by Lua scripts, which Redis runs atomically: the
//! admission of a request is one script call (one round trip on the hot path) that prunes
//! expired concurrency leases, checks the cap, refills and takes from the requests bucket, adds
//! the request's lease and reads the tokens bucket's level. Charging tokens, refunds and the
//! lease's release are sent after the response without being waited for. Time is Redis' own
//! (`TIME`), so replicas' clocks never disagree about a bucket.
//!
//! When Redis cannot be reached within `timeout_ms`, `on_error` decides: `local` admits against
//! this replica's own buckets at the limits ÷ `replicas` (the tenant's combined rate stays within
//! its limit while every replica falls back, and within limit × (replicas that fell back) ÷
//! `replicas` + the Redis share otherwise), `closed` refuses with 503. Both are logged (once per
//! outage) and counted. Leases expire after `lease_secs`, so a replica that dies holding slots
//! gives them back then.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde::Deserialize;
use tokio::sync::Mutex;

use super::{Denied, TenantConfig};

/// `[shared_limits]` of the config file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedLimitsConfig {
    /// `redis://host:port/db` (or `rediss://` for TLS; a password as `redis://:pw@host`).
    pub redis_url: String,
    /// Prefix of every key (replicas of one deployment share it; default `cachet`).
    #[serde(default = "default_prefix")]
    pub key_prefix: String,
    /// What to do when Redis does not answer: `local` (default) or `closed`.
    #[serde(default)]
    pub on_error: OnError,
    /// How many replicas share the limits: with `on_error = "local"` each enforces its share
    /// (the limits ÷ this) while Redis is down. Default 1.
    #[serde(default = "one")]
    pub replicas: u32,
    /// How long a Redis call may take before it counts as an error (default 100 ms).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// How long a request's concurrency slot is held at most if its replica never releases it
    /// (a crash); longer than any request may run (default 900 s).
    #[serde(default = "default_lease_secs")]
    pub lease_secs: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Admit against this replica's share of the limits.
    #[default]
    Local,
    /// Refuse every limited request with 503 until Redis answers again.
    Closed,
}

fn default_prefix() -> String {
    "cachet".into()
}
fn one() -> u32 {
    1
}
fn default_timeout_ms() -> u64 {
    100
}
fn default_lease_secs() -> u64 {
    900
}

/// What is wrong with `[shared_limits]`.
#[derive(Debug, thiserror::Error)]
pub enum InvalidSharedLimits {
    #[error("shared_limits.redis_url `{url}`")]
    RedisUrl {
        url: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("shared_limits.replicas must be at least 1")]
    NoReplicas,
    #[error("shared_limits.timeout_ms must be 1 to 60000, got {0}")]
    TimeoutMs(u64),
    #[error("shared_limits.lease_secs must be at least 1")]
    NoLease,
    #[error("shared_limits.key_prefix `{0}` must be non-empty, without braces")]
    KeyPrefix(String),
}

impl SharedLimitsConfig {
    /// Checks the values a typo would make wrong (the URL is parsed here, not connected to).
    pub fn validate(&self) -> Result<(), InvalidSharedLimits> {
        use InvalidSharedLimits as E;
        redis::Client::open(self.redis_url.as_str()).map_err(|source| E::RedisUrl {
            url: self.redis_url.clone(),
            source,
        })?;
        if self.replicas == 0 {
            return Err(E::NoReplicas);
        }
        if !(1..=60_000).contains(&self.timeout_ms) {
            return Err(E::TimeoutMs(self.timeout_ms));
        }
        if self.lease_secs == 0 {
            return Err(E::NoLease);
        }
        if self.key_prefix.is_empty() || self.key_prefix.contains(['{', '}']) {
            return Err(E::KeyPrefix(self.key_prefix.clone()));
        }
        Ok(())
    }
}

// Admission. KEYS: the tenant's leases (sorted set: member → expiry, ms), requests bucket,
// tokens bucket (hashes: l = level, t = when, ms). ARGV: max concurrent (0: none), requests/min
// (0: none), tokens/min (0: none), the lease's member, lease ms. Returns {0, 0, tokens level,
// requests level} when admitted (the requests level after its unit is taken; -1: no such
// limit), {1, retry ms, 0, 0} over the concurrency cap, {2, retry ms, 0, 0} over requests/min.
// Levels are strings: Lua numbers come back as integers.
const ADMIT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local maxc, rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local lease_ms = tonumber(ARGV[5])
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= maxc then return {1, 1000, '0', '0'} end
end
local function level(key, per_min)
  local h = redis.call('HMGET', key, 'l', 't')
  local l, at = tonumber(h[1]), tonumber(h[2])
  if l == nil then return per_min end
  return math.min(per_min, l + math.max(0, now - at) * per_min / 60000)
end
local tokens, requests = -1, -1
if tpm > 0 then tokens = level(KEYS[3], tpm) end
if rpm > 0 then
  local l = level(KEYS[2], rpm)
  if l < 1 then return {2, math.ceil((1 - l) * 60000 / rpm), '0', '0'} end
  requests = l - 1
  redis.call('HSET', KEYS[2], 'l', tostring(requests), 't', now)
  redis.call('PEXPIRE', KEYS[2], 120000)
end
if maxc > 0 then
  redis.call('ZADD', KEYS[1], now + lease_ms, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], lease_ms)
end
return {0, 0, tostring(tokens), tostring(requests)}
";

// A charge (n > 0, may leave the level negative: usage measured after the fact) or a refund
// (n < 0, never above capacity) of one bucket. KEYS: the bucket. ARGV: per minute, n.
const CHARGE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local per_min, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local h = redis.call('HMGET', KEYS[1], 'l', 't')
local l, at = tonumber(h[1]), tonumber(h[2])
if l == nil then l = per_min else l = math.min(per_min, l + math.max(0, now - at) * per_min / 60000) end
l = l - n
if l > per_min then l = per_min end
redis.call('HSET', KEYS[1], 'l', tostring(l), 't', now)
redis.call('PEXPIRE', KEYS[1], 120000)
return tostring(l)
";

/// A request admitted through Redis.
#[derive(Debug)]
pub struct Lease {
    /// Its member in the tenant's lease set (when the tenant has a concurrency cap).
    pub member: Option<String>,
    /// The tokens bucket's level at admission (when the tenant has a tokens/min limit).
    pub tokens_level: Option<f64>,
    /// The requests bucket's level once this request's unit was taken (when the tenant has a
    /// requests/min limit).
    pub requests_level: Option<f64>,
}

/// The outcome of a Redis call that did not answer.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StoreDown(String);

/// The connection to Redis and the counters `/metrics` shows.
pub struct SharedLimits {
    pub config: SharedLimitsConfig,
    client: redis::Client,
    conn: Mutex<Option<MultiplexedConnection>>,
    admit: redis::Script,
    charge: redis::Script,
    /// Distinguishes this process's lease members from other replicas'.
    replica: String,
    next: AtomicU64,
    down: AtomicBool,
    /// Redis calls that failed or timed out.
    pub errors: AtomicU64,
    /// Admissions decided without Redis (local share or refused, per `on_error`).
    pub fallbacks: AtomicU64,
}

impl std::fmt::Debug for SharedLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLimits")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SharedLimits {
    /// The store of `config` (validated); connects on first use, so a replica starts while
    /// Redis is down (and falls back as `on_error` says).
    pub fn new(config: SharedLimitsConfig) -> Result<Arc<Self>, InvalidSharedLimits> {
        config.validate()?;
        let client = redis::Client::open(config.redis_url.as_str()).map_err(|source| {
            InvalidSharedLimits::RedisUrl {
                url: config.redis_url.clone(),
                source,
            }
        })?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        Ok(Arc::new(SharedLimits {
            config,
            client,
            conn: Mutex::new(None),
            admit: redis::Script::new(ADMIT),
            charge: redis::Script::new(CHARGE),
            replica: format!("{}-{nanos:x}", std::process::id()),
            next: AtomicU64::new(0),
            down: AtomicBool::new(false),
            errors: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
        }))
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.timeout_ms)
    }

    fn key(&self, tenant: &str, what: &str) -> String {
        // The tenant in braces: one hash slot for its keys on a Redis Cluster.
        format!("{}:{{{tenant}}}:{what}", self.config.key_prefix)
    }

    async fn connection(&self) -> Result<MultiplexedConnection, StoreDown> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        let c = tokio::time::timeout(
            self.timeout(),
            self.client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| {
            StoreDown(format!(
                "connecting to Redis took over {:?}",
                self.timeout()
            ))
        })?
        .map_err(|e| StoreDown(format!("connecting to Redis: {e}")))?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Runs `f` on the connection within the timeout; an error drops the connection (the next
    /// call reconnects), counts, and is logged once per outage.
    async fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T, StoreDown>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let r = match self.connection().await {
            Ok(c) => match tokio::time::timeout(self.timeout(), f(c)).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(StoreDown(format!("Redis {what}: {e}"))),
                Err(_) => Err(StoreDown(format!(
                    "Redis {what} took over {:?}",
                    self.timeout()
                ))),
            },
            Err(e) => Err(e),
        };
        match &r {
            Ok(_) => {
                if self.down.swap(false, Ordering::Relaxed) {
                    tracing::info!(url = %self.config.redis_url, "shared limits: Redis answers again");
                }
            }
            Err(e) => {
                *self.conn.lock().await = None;
                self.errors.fetch_add(1, Ordering::Relaxed);
                if !self.down.swap(true, Ordering::Relaxed) {
                    tracing::warn!(url = %self.config.redis_url, error = %e, on_error = ?self.config.on_error,
                        "shared limits: Redis does not answer; admitting by on_error until it does");
                }
            }
        }
        r
    }

    /// One round trip: a concurrency lease, a requests/min unit, and the tokens bucket's level.
    pub async fn admit(&self, cfg: &TenantConfig) -> Result<Result<Lease, Denied>, StoreDown> {
        let member = cfg.max_concurrent.map(|_| {
            format!(
                "{}-{}",
                self.replica,
                self.next.fetch_add(1, Ordering::Relaxed)
            )
        });
        let lease_ms = self.config.lease_secs.saturating_mul(1000);
        let (code, retry_ms, level, requests): (i64, i64, String, String) = self
            .call("admission", |mut c| {
                let mut inv = self.admit.prepare_invoke();
                inv.key(self.key(&cfg.id, "inflight"))
                    .key(self.key(&cfg.id, "requests"))
                    .key(self.key(&cfg.id, "tokens"))
                    .arg(cfg.max_concurrent.unwrap_or(0))
                    .arg(cfg.requests_per_minute.unwrap_or(0))
                    .arg(cfg.tokens_per_minute.unwrap_or(0))
                    .arg(member.as_deref().unwrap_or(""))
                    .arg(lease_ms);
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        let retry_after = Duration::from_millis(retry_ms.max(0) as u64);
        Ok(match code {
            0 => Ok(Lease {
                member,
                tokens_level: cfg.tokens_per_minute.map(|_| level.parse().unwrap_or(0.0)),
                requests_level: cfg
                    .requests_per_minute
                    .map(|_| requests.parse().unwrap_or(0.0)),
            }),
            1 => Err(Denied::RateLimited {
                tenant: cfg.id.clone(),
                limit: "concurrent-requests",
                retry_after,
            }),
            _ => Err(Denied::RateLimited {
                tenant: cfg.id.clone(),
                limit: "requests-per-minute",
                retry_after,
            }),
        })
    }

    /// Charges `n` units to a bucket (`tokens` or `requests`; negative: a refund).
    pub async fn charge(&self, tenant: &str, what: &str, per_minute: u64, n: f64) {
        let _ = self
            .call("charge", |mut c| {
                let mut inv = self.charge.prepare_invoke();
                inv.key(self.key(tenant, what)).arg(per_minute).arg(n);
                async move { inv.invoke_async::<String>(&mut c).await }
            })
            .await;
    }

    /// Gives a concurrency lease back.
    pub async fn release(&self, tenant: &str, member: &str) {
        let key = self.key(tenant, "inflight");
        let _ = self
            .call("release", |mut c| async move {
                redis::cmd("ZREM")
                    .arg(key)
                    .arg(member)
                    .query_async::<i64>(&mut c)
                    .await
            })
            .await;
    }

    /// Whether the last call failed (Redis is treated as down until one succeeds).
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }
}

/// Runs `f` on the current Tokio runtime without waiting for it (charges and releases after a
/// response); outside a runtime (a unit test's drop) it is skipped.
pub fn spawn_detached<F>(f: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if let Ok(h) = tokio::runtime::Handle::try_current() {
        h.spawn(f);
    }
}
