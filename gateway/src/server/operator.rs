//! The operator API (`[operator]` in the config): tenants, their keys and limits, changed live
//! and recorded in the operator store ([`crate::operator`]); every replica follows within its
//! `poll_ms`. Authenticated by the operators' keys (`[[operator.key]]`), each change audited
//! under the operator's name.
//!
//! ```text
//! GET    /operator/v1/tenants                             every tenant, its settings and keys (ids only)
//! POST   /operator/v1/tenants                             a tenant ({"id": …, settings…, "key_label"?}) and its first API key
//! GET    /operator/v1/tenants/{id}
//! PATCH  /operator/v1/tenants/{id}                        settings to change ({"requests_per_minute": 600, "share": 2, …}; null: the default)
//! DELETE /operator/v1/tenants/{id}                        the tenant and its keys
//! POST   /operator/v1/tenants/{id}/suspend                ({"reason"?}) its requests are refused (403) until resumed
//! POST   /operator/v1/tenants/{id}/resume
//! POST   /operator/v1/tenants/{id}/keys                   a key ({"kind": "api"|"admin", "label"?}), shown once
//! POST   /operator/v1/tenants/{id}/keys/{key_id}/rotate   a new key ({"grace_secs"?, "label"?}); the old one ends after the grace
//! DELETE /operator/v1/tenants/{id}/keys/{key_id}          revoke
//! GET    /operator/v1/audit?tenant=ID&limit=N             who changed what, when (newest first)
//! ```

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;

use super::AppState;
use crate::http::{self, ApiError, Body, MAX_BODY_BYTES};
use crate::operator::{Applied, Change, KeyKind, OpError, Operator, Snapshot};
use crate::tenants::TenantRegistry;

/// The operator store and what building a registry from it needs.
pub struct OperatorState {
    pub store: Operator,
    pub deployment_key: [u8; 32],
}

impl OperatorState {
    /// Whether `tenants` would load (the check every change passes before it is written).
    pub fn validate(
        &self,
        tenants: Vec<crate::tenants::TenantConfig>,
    ) -> Result<(), crate::tenants::InvalidTenant> {
        TenantRegistry::from_store(tenants, &self.deployment_key, Instant::now(), None, None)
            .map(|_| ())
    }
}

/// Puts the store's tenants in use, keeping the live state of those the replica has.
pub fn install(state: &AppState, op: &OperatorState, snap: Snapshot) {
    let previous = state.tenants();
    match TenantRegistry::from_store(
        snap.tenants,
        &op.deployment_key,
        Instant::now(),
        Some(&previous),
        None,
    ) {
        Ok(reg) => {
            tracing::info!(
                revision = snap.revision,
                tenants = reg.tenants().len(),
                "tenants from the operator store"
            );
            state.set_tenants(reg);
        }
        // Every change was validated before it was written; a store edited by hand may not be.
        Err(e) => {
            tracing::warn!(error = %e, revision = snap.revision, "the operator store's tenants do not load; keeping the previous ones")
        }
    }
}

impl From<OpError> for ApiError {
    fn from(e: OpError) -> Self {
        let message = e.to_string();
        match e {
            OpError::NoTenant(_) | OpError::NoKey { .. } => {
                ApiError::not_found(message, "not_found")
            }
            OpError::Exists(_) | OpError::Revoked(_) => ApiError {
                status: StatusCode::CONFLICT,
                code: Some("conflict"),
                ..ApiError::bad_request(message, None)
            },
            OpError::Invalid { field, .. } => match field {
                Some(f) => ApiError::bad_field(message, f),
                None => ApiError::bad_request(message, None),
            },
            OpError::Store(_) => ApiError {
                code: Some("operator_store_unavailable"),
                ..ApiError::overloaded(message, std::time::Duration::from_secs(1))
            },
        }
    }
}

/// A JSON body, or an empty one as `T`'s default.
async fn body_or_default<T: serde::de::DeserializeOwned + Default>(
    req: Request<Incoming>,
) -> Result<T, ApiError> {
    let b = http::read_body(req, MAX_BODY_BYTES).await?;
    if b.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    http::parse_json(&b)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SuspendBody {
    reason: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct KeyBody {
    kind: Option<KeyKind>,
    #[serde(default)]
    label: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RotateBody {
    #[serde(default)]
    grace_secs: u64,
    label: Option<String>,
}

/// Makes a change (off the async threads) and puts the result in use on this replica before
/// answering.
async fn change(
    state: &Arc<AppState>,
    op: &Arc<OperatorState>,
    actor: &str,
    c: Change,
) -> Result<Applied, ApiError> {
    let (st, op, actor) = (state.clone(), op.clone(), actor.to_string());
    tokio::task::spawn_blocking(move || {
        let applied = op.store.apply(&actor, c, &|t| op.validate(t))?;
        // The follower sees the new revision too and installs it again (harmlessly); the
        // revision in use is the newest either installed.
        op.store
            .status
            .revision
            .fetch_max(applied.revision, std::sync::atomic::Ordering::Relaxed);
        install(&st, &op, applied.snapshot.clone());
        Ok::<_, OpError>(applied)
    })
    .await
    .map_err(|e| ApiError::internal(format!("operator task: {e}")))?
    .map_err(ApiError::from)
}

async fn read<T: Send + 'static>(
    op: &Arc<OperatorState>,
    f: impl FnOnce(&Operator) -> Result<T, OpError> + Send + 'static,
) -> Result<T, ApiError> {
    let op = op.clone();
    tokio::task::spawn_blocking(move || f(&op.store))
        .await
        .map_err(|e| ApiError::internal(format!("operator task: {e}")))?
        .map_err(ApiError::from)
}

/// `POST /operator/v1/tenants`: a tenant from its settings (and its first key's label).
async fn create_tenant(
    state: &Arc<AppState>,
    op: &Arc<OperatorState>,
    actor: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let mut settings: serde_json::Map<String, serde_json::Value> =
        http::read_json(req, MAX_BODY_BYTES).await?;
    let key_label = match settings.remove("key_label") {
        None => String::new(),
        Some(serde_json::Value::String(s)) => s,
        Some(_) => {
            return Err(ApiError::bad_request(
                "key_label must be a string",
                Some("key_label"),
            ))
        }
    };
    let a = change(
        state,
        op,
        actor,
        Change::Create {
            settings,
            key_label,
        },
    )
    .await?;
    http::ok_json(
        StatusCode::CREATED,
        serde_json::json!({"revision": a.revision, "tenant": a.tenant, "api_key": a.key}),
    )
}

/// `GET /operator/v1/audit?tenant=…&limit=…`: the newest audit entries first.
async fn audit(
    op: &Arc<OperatorState>,
    query: Vec<(String, String)>,
) -> Result<Response<Body>, ApiError> {
    let mut tenant = None;
    let mut limit = 100usize;
    for (k, v) in query {
        match k.as_str() {
            "tenant" => tenant = Some(v),
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=10_000).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request("limit must be 1 to 10000", Some("limit"))
                    })?
            }
            other => {
                return Err(ApiError::bad_field(
                    format!("unknown query parameter `{other}` (tenant, limit)"),
                    other.to_string(),
                ))
            }
        }
    }
    let entries = read(op, move |o| Ok(o.audit(tenant.as_deref(), limit)?)).await?;
    http::ok_json(
        StatusCode::OK,
        serde_json::json!({"object": "list", "data": entries}),
    )
}

/// Routes one `/operator/…` request.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let Some(op) = state.operator.clone() else {
        return Err(ApiError::not_found(
            "the operator API is not enabled on this gateway (add [operator] with a database and operator keys to its config)",
            "operator_api_disabled",
        ));
    };
    let actor = http::bearer(&req)
        .and_then(|k| op.store.config.operator_of(k))
        .map(str::to_string)
        .ok_or_else(|| ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: Some("invalid_operator_key"),
            ..ApiError::bad_request(
                "the operator API needs an operator key ([[operator.key]] in the config) as `Authorization: Bearer <key>`",
                None,
            )
        })?;
    let path = req.uri().path().to_string();
    let query = http::query_pairs(&req);
    let rest: Vec<String> = path
        .trim_start_matches("/operator/v1")
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let method = req.method().clone();
    match (&method, rest.as_slice()) {
        (&Method::GET, ["tenants"]) => {
            let records = read(&op, |o| Ok(o.records()?)).await?;
            http::ok_json(
                StatusCode::OK,
                serde_json::json!({"object": "list", "data": records}),
            )
        }
        (&Method::POST, ["tenants"]) => create_tenant(&state, &op, &actor, req).await,
        (&Method::GET, ["tenants", id]) => {
            let id = id.to_string();
            let t = read(&op, move |o| {
                o.records()?
                    .into_iter()
                    .find(|t| t.id == id)
                    .ok_or(OpError::NoTenant(id))
            })
            .await?;
            http::ok_json(StatusCode::OK, serde_json::to_value(t).expect("serializes"))
        }
        (&Method::PATCH, ["tenants", id]) => {
            let id = id.to_string();
            let patch: serde_json::Map<String, serde_json::Value> =
                http::read_json(req, MAX_BODY_BYTES).await?;
            let a = change(&state, &op, &actor, Change::Update { id, patch }).await?;
            http::ok_json(
                StatusCode::OK,
                serde_json::json!({"revision": a.revision, "tenant": a.tenant}),
            )
        }
        (&Method::DELETE, ["tenants", id]) => {
            let a = change(&state, &op, &actor, Change::Delete { id: id.to_string() }).await?;
            http::ok_json(
                StatusCode::OK,
                serde_json::json!({"revision": a.revision, "deleted": id}),
            )
        }
        (&Method::POST, ["tenants", id, verb @ ("suspend" | "resume")]) => {
            let (id, suspended) = (id.to_string(), *verb == "suspend");
            let b: SuspendBody = body_or_default(req).await?;
            let a = change(
                &state,
                &op,
                &actor,
                Change::Suspend {
                    id,
                    suspended,
                    reason: b.reason,
                },
            )
            .await?;
            http::ok_json(
                StatusCode::OK,
                serde_json::json!({"revision": a.revision, "tenant": a.tenant}),
            )
        }
        (&Method::POST, ["tenants", id, "keys"]) => {
            let id = id.to_string();
            let b: KeyBody = body_or_default(req).await?;
            let c = Change::AddKey {
                id,
                kind: b.kind.unwrap_or(KeyKind::Api),
                label: b.label,
            };
            let a = change(&state, &op, &actor, c).await?;
            http::ok_json(
                StatusCode::CREATED,
                serde_json::json!({"revision": a.revision, "key": a.key}),
            )
        }
        (&Method::POST, ["tenants", id, "keys", key_id, "rotate"]) => {
            let (id, key_id) = (id.to_string(), key_id.to_string());
            let b: RotateBody = body_or_default(req).await?;
            let c = Change::RotateKey {
                id,
                key_id,
                grace_secs: b.grace_secs,
                label: b.label,
            };
            let a = change(&state, &op, &actor, c).await?;
            http::ok_json(
                StatusCode::CREATED,
                serde_json::json!({"revision": a.revision, "key": a.key}),
            )
        }
        (&Method::DELETE, ["tenants", id, "keys", key_id]) => {
            let c = Change::RevokeKey {
                id: id.to_string(),
                key_id: key_id.to_string(),
            };
            let a = change(&state, &op, &actor, c).await?;
            http::ok_json(
                StatusCode::OK,
                serde_json::json!({"revision": a.revision, "revoked": key_id}),
            )
        }
        (&Method::GET, ["audit"]) => audit(&op, query).await,
        _ => Err(ApiError::not_found(
            format!("no operator route {method} {path} (see docs/OPERATOR.md)"),
            "not_found",
        )),
    }
}
