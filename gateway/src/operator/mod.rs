//! Live tenant administration: tenants, their API keys and limits kept in a database
//! (`[operator]` in the config: SQLite for one node, PostgreSQL for replicas), changed through
//! the operator API (`/operator/v1/…`, [`crate::server::operator`]) and followed by every
//! replica.
//!
//! - Every change is one transaction: the revision row is locked and bumped, the change written,
//!   the whole tenant set validated as a config reload would be (a change that would not load is
//!   refused, nothing written), and an audit row (who, what, when) added.
//! - Each replica polls the revision every `poll_ms` (default 250 ms) and, when it moved (or a
//!   rotated key's grace period ended), rebuilds its tenant registry from the database, keeping
//!   the live state of tenants it already had (requests in flight, bucket levels). The replica
//!   that made a change applies it before answering.
//! - API keys are made here (`sk-cachet-` and 48 hex digits from the OS's random source), shown
//!   once in the answer that made them; only their sha256 is stored. A key is named by its
//!   `key_id`, the first 12 hex digits of that hash (as in usage records).
//! - The config file's `[[tenant]]` tables are imported on the database's first start (audited as
//!   `bootstrap`); from then on the database is the tenants' source.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::db::{Conn, DbError, Tx};
use crate::tenants::{InvalidTenant, TenantConfig};

mod config;
pub use config::{InvalidOperatorConfig, OperatorConfig, OperatorKey};

const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS cachet_revision (id BIGINT PRIMARY KEY, n BIGINT NOT NULL);
INSERT INTO cachet_revision (id, n) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
CREATE TABLE IF NOT EXISTS cachet_tenants (
    id TEXT PRIMARY KEY,
    config TEXT NOT NULL,
    suspended BIGINT NOT NULL,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS cachet_keys (
    sha256 TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    kind TEXT NOT NULL,
    label TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    expires_ms BIGINT,
    revoked_ms BIGINT
);
CREATE INDEX IF NOT EXISTS cachet_keys_tenant ON cachet_keys (tenant);
CREATE TABLE IF NOT EXISTS cachet_audit (
    revision BIGINT NOT NULL,
    n BIGINT NOT NULL,
    at_ms BIGINT NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    tenant TEXT NOT NULL,
    detail TEXT NOT NULL,
    PRIMARY KEY (revision, n)
);";

/// Why an operator request was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OpError {
    #[error("operator store: {0}")]
    Store(#[from] DbError),
    #[error("no tenant `{0}`")]
    NoTenant(String),
    #[error("tenant `{0}` exists already")]
    Exists(String),
    #[error("tenant `{tenant}` has no key `{key_id}`")]
    NoKey { tenant: String, key_id: String },
    #[error("key `{0}` is revoked already")]
    Revoked(String),
    /// A field of the request, with what to give.
    #[error("{msg}")]
    Invalid { msg: String, field: Option<String> },
}

impl OpError {
    fn invalid(msg: impl Into<String>, field: Option<&str>) -> Self {
        OpError::Invalid {
            msg: msg.into(),
            field: field.map(str::to_string),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `api` (calls the model API) or `admin` (manages the tenant's templates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    Api,
    Admin,
}

impl KeyKind {
    fn name(self) -> &'static str {
        match self {
            KeyKind::Api => "api",
            KeyKind::Admin => "admin",
        }
    }

    fn parse(s: &str) -> KeyKind {
        if s == "admin" {
            KeyKind::Admin
        } else {
            KeyKind::Api
        }
    }
}

/// A stored key, as the API shows it (never the key nor its hash).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyInfo {
    pub key_id: String,
    pub kind: KeyKind,
    pub label: String,
    pub created_ms: i64,
    pub expires_ms: Option<i64>,
    pub revoked_ms: Option<i64>,
    #[serde(skip)]
    sha256: String,
}

impl KeyInfo {
    /// Usable at `now`: not revoked, not past its grace period.
    pub fn active(&self, now: i64) -> bool {
        self.revoked_ms.is_none() && self.expires_ms.is_none_or(|e| e > now)
    }
}

/// A stored tenant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantRecord {
    pub id: String,
    pub suspended: bool,
    /// Its settings (the config file's `[[tenant]]` fields but the key hashes).
    pub config: serde_json::Value,
    pub keys: Vec<KeyInfo>,
    pub created_ms: i64,
    pub updated_ms: i64,
}

impl TenantRecord {
    /// As the registry loads it: the keys active at `now`.
    pub fn tenant_config(&self, now: i64) -> Result<TenantConfig, DbError> {
        let mut m = self.config.as_object().cloned().unwrap_or_default();
        m.insert("id".into(), serde_json::json!(self.id));
        m.insert("api_key_sha256".into(), serde_json::json!([]));
        let mut c: TenantConfig = serde_json::from_value(serde_json::Value::Object(m))
            .map_err(|e| DbError(format!("tenant `{}`'s stored config: {e}", self.id)))?;
        c.suspended = self.suspended;
        let keys = |kind| {
            self.keys
                .iter()
                .filter(|k| k.kind == kind && k.active(now))
                .map(|k| k.sha256.clone())
                .collect()
        };
        c.api_key_sha256 = keys(KeyKind::Api);
        c.admin_key_sha256 = keys(KeyKind::Admin);
        Ok(c)
    }
}

/// What the registry is built from.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub revision: i64,
    pub tenants: Vec<TenantConfig>,
    /// The next time a key's grace period ends (the registry is rebuilt then).
    pub next_expiry_ms: Option<i64>,
}

/// One audit record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    pub revision: i64,
    pub at_ms: i64,
    pub actor: String,
    pub action: String,
    pub tenant: String,
    pub detail: serde_json::Value,
}

/// A key made by a change: shown once.
#[derive(Debug, Clone, Serialize)]
pub struct NewKey {
    pub key: String,
    pub key_id: String,
    pub kind: KeyKind,
}

/// A change to make.
#[derive(Debug, Clone)]
pub enum Change {
    /// A new tenant (settings as a `[[tenant]]` table's, as JSON), with a first API key.
    Create {
        settings: serde_json::Map<String, serde_json::Value>,
        key_label: String,
    },
    /// Fields of a tenant's settings; `null` returns one to its default.
    Update {
        id: String,
        patch: serde_json::Map<String, serde_json::Value>,
    },
    Suspend {
        id: String,
        suspended: bool,
        reason: Option<String>,
    },
    Delete {
        id: String,
    },
    AddKey {
        id: String,
        kind: KeyKind,
        label: String,
    },
    /// A new key of the same kind; the old one stops after `grace_secs`.
    RotateKey {
        id: String,
        key_id: String,
        grace_secs: u64,
        label: Option<String>,
    },
    RevokeKey {
        id: String,
        key_id: String,
    },
}

/// What a change did.
#[derive(Debug, Clone)]
pub struct Applied {
    pub revision: i64,
    pub tenant: Option<TenantRecord>,
    pub key: Option<NewKey>,
    /// The tenants as the change leaves them (what the registry loads next).
    pub snapshot: Snapshot,
}

/// Fields that are not settings: keys come from the keys API, `suspended` from suspend/resume.
const NOT_SETTINGS: [(&str, &str); 4] = [
    ("api_key_sha256", "keys are made by POST /operator/v1/tenants/{id}/keys (the key is shown once; the API never takes a hash)"),
    ("admin_key_sha256", "keys are made by POST /operator/v1/tenants/{id}/keys with \"kind\": \"admin\""),
    ("suspended", "use POST /operator/v1/tenants/{id}/suspend and /resume"),
    ("id", "a tenant's id cannot change; create another tenant"),
];

/// The operator store of one replica: a connection for changes and reads; the follower opens
/// its own.
pub struct Operator {
    pub config: OperatorConfig,
    url: String,
    conn: Mutex<Conn>,
    /// What `/metrics` says about the store.
    pub status: Arc<StoreStatus>,
}

/// The revision this replica's tenants come from, and whether the store answers its follower.
#[derive(Debug, Default)]
pub struct StoreStatus {
    pub revision: AtomicI64,
    pub down: AtomicBool,
}

/// The revision; `lock`: taken for a change (the row locked on PostgreSQL until the
/// transaction ends; SQLite's IMMEDIATE transaction already holds the write lock).
fn read_revision(tx: &mut Tx<'_>, lock: bool) -> Result<i64, DbError> {
    let sql = if lock && tx.is_postgres() {
        "SELECT n FROM cachet_revision WHERE id = 1 FOR UPDATE"
    } else {
        "SELECT n FROM cachet_revision WHERE id = 1"
    };
    tx.query(sql, &[])?
        .first()
        .and_then(|r| r[0].i64())
        .ok_or_else(|| DbError("cachet_revision has no row".into()))
}

fn load_records(tx: &mut Tx<'_>) -> Result<Vec<TenantRecord>, DbError> {
    let mut keys: BTreeMap<String, Vec<KeyInfo>> = BTreeMap::new();
    for r in tx.query(
        "SELECT tenant, sha256, key_id, kind, label, created_ms, expires_ms, revoked_ms FROM cachet_keys ORDER BY created_ms, key_id",
        &[],
    )? {
        keys.entry(r[0].text().to_string()).or_default().push(KeyInfo {
            sha256: r[1].text().to_string(),
            key_id: r[2].text().to_string(),
            kind: KeyKind::parse(r[3].text()),
            label: r[4].text().to_string(),
            created_ms: r[5].i64().unwrap_or(0),
            expires_ms: r[6].i64(),
            revoked_ms: r[7].i64(),
        });
    }
    tx.query(
        "SELECT id, config, suspended, created_ms, updated_ms FROM cachet_tenants ORDER BY id",
        &[],
    )?
    .into_iter()
    .map(|r| {
        let id = r[0].text().to_string();
        Ok(TenantRecord {
            config: serde_json::from_str(r[1].text())
                .map_err(|e| DbError(format!("tenant `{id}`'s stored config: {e}")))?,
            suspended: r[2].i64() == Some(1),
            created_ms: r[3].i64().unwrap_or(0),
            updated_ms: r[4].i64().unwrap_or(0),
            keys: keys.remove(&id).unwrap_or_default(),
            id,
        })
    })
    .collect()
}

/// A tenant's settings as stored: its `[[tenant]]` fields as JSON, without the id, keys and
/// suspension (columns and rows of their own).
fn settings_of(c: &TenantConfig) -> serde_json::Value {
    let mut v = serde_json::to_value(c).expect("a tenant config serializes");
    if let Some(m) = v.as_object_mut() {
        for (k, _) in NOT_SETTINGS {
            m.remove(k);
        }
    }
    v
}

/// A new API key: `sk-cachet-` and 48 hex digits (24 bytes of the OS's random source).
fn make_key() -> Result<String, OpError> {
    let mut b = [0u8; 24];
    getrandom::fill(&mut b).map_err(|e| DbError(format!("the OS random source: {e}")))?;
    Ok(format!("sk-cachet-{}", crate::tenants::hex(&b)))
}

fn insert_key(
    tx: &mut Tx<'_>,
    tenant: &str,
    kind: KeyKind,
    label: &str,
    now: i64,
) -> Result<NewKey, OpError> {
    let key = make_key()?;
    let sha = crate::tenants::hex(&crate::tenants::hash_key(&key));
    let key_id = sha[..12].to_string();
    tx.exec(
        "INSERT INTO cachet_keys (sha256, key_id, tenant, kind, label, created_ms, expires_ms, revoked_ms) VALUES ($1, $2, $3, $4, $5, $6, NULL, NULL)",
        &[sha.into(), key_id.clone().into(), tenant.into(), kind.name().into(), label.into(), now.into()],
    )?;
    Ok(NewKey { key, key_id, kind })
}

fn check_label(label: &str) -> Result<(), OpError> {
    if label.len() > 200 {
        return Err(OpError::invalid(
            "label must be at most 200 bytes",
            Some("label"),
        ));
    }
    Ok(())
}

impl Operator {
    /// Opens the store and creates its tables (once, under a lock, when replicas start
    /// together).
    pub fn open(config: OperatorConfig) -> Result<Operator, OpError> {
        let invalid = |e: InvalidOperatorConfig| OpError::invalid(e.to_string(), None);
        config.validate().map_err(invalid)?;
        let url = config.url().map_err(invalid)?;
        let mut conn = Conn::open(&url)?;
        conn.transaction(|tx| {
            if tx.is_postgres() {
                tx.exec("SELECT pg_advisory_xact_lock(734001)", &[])?;
            }
            tx.batch(SCHEMA)
        })?;
        Ok(Operator {
            config,
            url,
            conn: Mutex::new(conn),
            status: Default::default(),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Imports `tenants` (the config file's) if the store has never had any; whether it did.
    pub fn bootstrap(&self, tenants: &[TenantConfig]) -> Result<bool, OpError> {
        let now = now_ms();
        self.conn().transaction(|tx| {
            let rev = read_revision(tx, true)?;
            if rev != 0 {
                return Ok(false);
            }
            for (n, t) in tenants.iter().enumerate() {
                tx.exec(
                    "INSERT INTO cachet_tenants (id, config, suspended, created_ms, updated_ms) VALUES ($1, $2, $3, $4, $5)",
                    &[t.id.clone().into(), settings_of(t).to_string().into(), i64::from(t.suspended).into(), now.into(), now.into()],
                )?;
                for (kind, hashes) in [(KeyKind::Api, &t.api_key_sha256), (KeyKind::Admin, &t.admin_key_sha256)] {
                    for h in hashes {
                        let h = h.to_ascii_lowercase();
                        tx.exec(
                            "INSERT INTO cachet_keys (sha256, key_id, tenant, kind, label, created_ms, expires_ms, revoked_ms) VALUES ($1, $2, $3, $4, $5, $6, NULL, NULL)",
                            &[h.clone().into(), h.get(..12).unwrap_or(&h).to_string().into(), t.id.clone().into(), kind.name().into(), "config file".into(), now.into()],
                        )?;
                    }
                }
                tx.exec(
                    "INSERT INTO cachet_audit (revision, n, at_ms, actor, action, tenant, detail) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    &[1i64.into(), (n as i64).into(), now.into(), "bootstrap".into(), "tenant.import".into(), t.id.clone().into(), serde_json::json!({"from": "config file"}).to_string().into()],
                )?;
            }
            tx.exec("UPDATE cachet_revision SET n = 1 WHERE id = 1", &[])?;
            Ok(true)
        })
    }

    /// The current revision.
    pub fn revision(&self) -> Result<i64, DbError> {
        revision_of(&mut self.conn())
    }

    /// Every tenant with its keys.
    pub fn records(&self) -> Result<Vec<TenantRecord>, DbError> {
        self.conn().read(load_records)
    }

    /// What the registry is built from, at `now`.
    pub fn snapshot(&self) -> Result<Snapshot, DbError> {
        snapshot_of(&mut self.conn())
    }

    /// Audit records, newest first (of one tenant, if given).
    pub fn audit(&self, tenant: Option<&str>, limit: usize) -> Result<Vec<AuditEntry>, DbError> {
        let limit = limit.clamp(1, 10_000) as i64;
        let rows = match tenant {
            Some(t) => self.conn().query(
                "SELECT revision, at_ms, actor, action, tenant, detail FROM cachet_audit WHERE tenant = $1 ORDER BY revision DESC, n DESC LIMIT $2",
                &[t.into(), limit.into()],
            )?,
            None => self.conn().query(
                "SELECT revision, at_ms, actor, action, tenant, detail FROM cachet_audit ORDER BY revision DESC, n DESC LIMIT $1",
                &[limit.into()],
            )?,
        };
        Ok(rows
            .into_iter()
            .map(|r| AuditEntry {
                revision: r[0].i64().unwrap_or(0),
                at_ms: r[1].i64().unwrap_or(0),
                actor: r[2].text().to_string(),
                action: r[3].text().to_string(),
                tenant: r[4].text().to_string(),
                detail: serde_json::from_str(r[5].text()).unwrap_or(serde_json::Value::Null),
            })
            .collect())
    }

    /// Makes `change` as `actor`, in one transaction; `validate` sees the whole tenant set it
    /// would leave (as the registry would load it) and may refuse it.
    pub fn apply(
        &self,
        actor: &str,
        change: Change,
        validate: &dyn Fn(Vec<TenantConfig>) -> Result<(), InvalidTenant>,
    ) -> Result<Applied, OpError> {
        let now = now_ms();
        self.conn().transaction(|tx| {
            let rev = read_revision(tx, true)? + 1;
            let before = load_records(tx)?;
            let find = |id: &str| before.iter().find(|t| t.id == id).cloned();
            let need = |id: &str| find(id).ok_or_else(|| OpError::NoTenant(id.to_string()));
            let mut key = None;
            let (action, tenant, detail) = match &change {
                Change::Create { settings, key_label } => {
                    let id = settings
                        .get("id")
                        .and_then(|v| v.as_str())
                        .ok_or_else(|| OpError::invalid("a tenant needs an `id` (a string)", Some("id")))?
                        .to_string();
                    if find(&id).is_some() {
                        return Err(OpError::Exists(id));
                    }
                    let mut m = settings.clone();
                    for (f, why) in NOT_SETTINGS.iter().filter(|(f, _)| *f != "id") {
                        if m.contains_key(*f) {
                            return Err(OpError::invalid(format!("`{f}`: {why}"), Some(f)));
                        }
                    }
                    m.insert("api_key_sha256".into(), serde_json::json!([]));
                    let c = parse_settings(m)?;
                    check_label(key_label)?;
                    tx.exec(
                        "INSERT INTO cachet_tenants (id, config, suspended, created_ms, updated_ms) VALUES ($1, $2, 0, $3, $4)",
                        &[id.clone().into(), settings_of(&c).to_string().into(), now.into(), now.into()],
                    )?;
                    let k = insert_key(tx, &id, KeyKind::Api, key_label, now)?;
                    let detail = serde_json::json!({"settings": settings_of(&c), "key_id": k.key_id});
                    key = Some(k);
                    ("tenant.create", id, detail)
                }
                Change::Update { id, patch } => {
                    let t = need(id)?;
                    let mut m = t.config.as_object().cloned().unwrap_or_default();
                    for (k, v) in patch {
                        if let Some((_, why)) = NOT_SETTINGS.iter().find(|(f, _)| f == k) {
                            return Err(OpError::invalid(format!("`{k}`: {why}"), Some(k)));
                        }
                        if v.is_null() {
                            m.remove(k);
                        } else {
                            m.insert(k.clone(), v.clone());
                        }
                    }
                    m.insert("id".into(), serde_json::json!(id));
                    m.insert("api_key_sha256".into(), serde_json::json!([]));
                    let c = parse_settings(m)?;
                    tx.exec(
                        "UPDATE cachet_tenants SET config = $1, updated_ms = $2 WHERE id = $3",
                        &[settings_of(&c).to_string().into(), now.into(), id.clone().into()],
                    )?;
                    ("tenant.update", id.clone(), serde_json::json!({"changed": patch, "before": t.config}))
                }
                Change::Suspend { id, suspended, reason } => {
                    need(id)?;
                    tx.exec(
                        "UPDATE cachet_tenants SET suspended = $1, updated_ms = $2 WHERE id = $3",
                        &[i64::from(*suspended).into(), now.into(), id.clone().into()],
                    )?;
                    let action = if *suspended { "tenant.suspend" } else { "tenant.resume" };
                    (action, id.clone(), serde_json::json!({"reason": reason}))
                }
                Change::Delete { id } => {
                    let t = need(id)?;
                    tx.exec("DELETE FROM cachet_keys WHERE tenant = $1", &[id.clone().into()])?;
                    tx.exec("DELETE FROM cachet_tenants WHERE id = $1", &[id.clone().into()])?;
                    let ids: Vec<_> = t.keys.iter().map(|k| k.key_id.clone()).collect();
                    ("tenant.delete", id.clone(), serde_json::json!({"settings": t.config, "key_ids": ids}))
                }
                Change::AddKey { id, kind, label } => {
                    need(id)?;
                    check_label(label)?;
                    let k = insert_key(tx, id, *kind, label, now)?;
                    let detail = serde_json::json!({"key_id": k.key_id, "kind": kind, "label": label});
                    key = Some(k);
                    ("key.create", id.clone(), detail)
                }
                Change::RotateKey { id, key_id, grace_secs, label } => {
                    let t = need(id)?;
                    let old = t.keys.iter().find(|k| &k.key_id == key_id).ok_or_else(|| OpError::NoKey {
                        tenant: id.clone(),
                        key_id: key_id.clone(),
                    })?;
                    if !old.active(now) {
                        return Err(OpError::Revoked(key_id.clone()));
                    }
                    if *grace_secs > 7 * 86_400 {
                        return Err(OpError::invalid("grace_secs must be at most 604800 (a week)", Some("grace_secs")));
                    }
                    let label = label.clone().unwrap_or_else(|| old.label.clone());
                    check_label(&label)?;
                    let ends = now + (*grace_secs as i64) * 1000;
                    if *grace_secs == 0 {
                        tx.exec("UPDATE cachet_keys SET revoked_ms = $1 WHERE sha256 = $2", &[now.into(), old.sha256.clone().into()])?;
                    } else {
                        tx.exec("UPDATE cachet_keys SET expires_ms = $1 WHERE sha256 = $2", &[ends.into(), old.sha256.clone().into()])?;
                    }
                    let k = insert_key(tx, id, old.kind, &label, now)?;
                    let detail = serde_json::json!({"old_key_id": key_id, "key_id": k.key_id, "old_key_ends_ms": ends});
                    key = Some(k);
                    ("key.rotate", id.clone(), detail)
                }
                Change::RevokeKey { id, key_id } => {
                    let t = need(id)?;
                    let k = t.keys.iter().find(|k| &k.key_id == key_id).ok_or_else(|| OpError::NoKey {
                        tenant: id.clone(),
                        key_id: key_id.clone(),
                    })?;
                    if k.revoked_ms.is_some() {
                        return Err(OpError::Revoked(key_id.clone()));
                    }
                    tx.exec("UPDATE cachet_keys SET revoked_ms = $1 WHERE sha256 = $2", &[now.into(), k.sha256.clone().into()])?;
                    ("key.revoke", id.clone(), serde_json::json!({"key_id": key_id}))
                }
            };
            let after = load_records(tx)?;
            let snapshot = Snapshot::of(rev, &after, now)?;
            validate(snapshot.tenants.clone()).map_err(|e| OpError::invalid(e.to_string(), None))?;
            tx.exec("UPDATE cachet_revision SET n = $1 WHERE id = 1", &[rev.into()])?;
            tx.exec(
                "INSERT INTO cachet_audit (revision, n, at_ms, actor, action, tenant, detail) VALUES ($1, 0, $2, $3, $4, $5, $6)",
                &[rev.into(), now.into(), actor.into(), action.into(), tenant.clone().into(), detail.to_string().into()],
            )?;
            tracing::info!(actor, action, tenant = %tenant, revision = rev, "operator change");
            Ok(Applied {
                revision: rev,
                tenant: after.into_iter().find(|t| t.id == tenant),
                key,
                snapshot,
            })
        })
    }

    /// Follows the store from a thread of its own (its own connection): every `poll_ms`, reads
    /// the revision and, when it moved or a key's grace period ended, hands `apply` a fresh
    /// snapshot. A store that does not answer is logged once per outage; the registry in use
    /// stays.
    pub fn follow(
        &self,
        start: Snapshot,
        apply: impl Fn(Snapshot) + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        let (url, poll, status) = (self.url.clone(), self.config.poll(), self.status.clone());
        status.revision.store(start.revision, Ordering::Relaxed);
        std::thread::Builder::new()
            .name("operator-follow".into())
            .spawn(move || {
                let (mut rev, mut expiry) = (start.revision, start.next_expiry_ms);
                let mut conn: Option<Conn> = None;
                let mut down = false;
                loop {
                    std::thread::sleep(poll);
                    let step = (|| -> Result<(), DbError> {
                        if conn.is_none() {
                            conn = Some(Conn::open(&url)?);
                        }
                        let c = conn.as_mut().expect("opened");
                        let now_rev = revision_of(c)?;
                        if now_rev != rev || expiry.is_some_and(|e| now_ms() >= e) {
                            let s = snapshot_of(c)?;
                            (rev, expiry) = (s.revision, s.next_expiry_ms);
                            status.revision.fetch_max(rev, Ordering::Relaxed);
                            apply(s);
                        }
                        Ok(())
                    })();
                    match step {
                        Ok(()) if down => {
                            down = false;
                            status.down.store(false, Ordering::Relaxed);
                            tracing::info!("operator store answers again");
                        }
                        Ok(()) => {}
                        Err(e) => {
                            conn = None;
                            if !down {
                                down = true;
                                status.down.store(true, Ordering::Relaxed);
                                tracing::warn!(error = %e, "operator store does not answer; tenants stay as they are");
                            }
                        }
                    }
                }
            })
            .expect("spawning the operator follower")
    }
}

fn revision_of(c: &mut Conn) -> Result<i64, DbError> {
    c.read(|tx| read_revision(tx, false))
}

fn snapshot_of(c: &mut Conn) -> Result<Snapshot, DbError> {
    c.read(|tx| {
        let revision = read_revision(tx, false)?;
        Snapshot::of(revision, &load_records(tx)?, now_ms())
    })
}

impl Snapshot {
    /// What the registry loads from `records` at revision `revision`, at `now`.
    fn of(revision: i64, records: &[TenantRecord], now: i64) -> Result<Snapshot, DbError> {
        Ok(Snapshot {
            revision,
            tenants: records
                .iter()
                .map(|t| t.tenant_config(now))
                .collect::<Result<_, _>>()?,
            next_expiry_ms: records
                .iter()
                .flat_map(|t| &t.keys)
                .filter(|k| k.active(now))
                .filter_map(|k| k.expires_ms)
                .min(),
        })
    }
}

/// A tenant's settings from JSON, or the field that is wrong.
fn parse_settings(m: serde_json::Map<String, serde_json::Value>) -> Result<TenantConfig, OpError> {
    serde_json::from_value(serde_json::Value::Object(m)).map_err(|e| {
        let msg = e.to_string();
        let field = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"))
            .map(str::to_string);
        OpError::Invalid {
            msg: format!("tenant settings: {msg}"),
            field,
        }
    })
}

#[cfg(test)]
mod tests;
