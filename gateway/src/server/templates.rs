//! Tenant templates over HTTP: the admin API (scoped to the tenant of the admin key) and the
//! step of a chat request that runs the tenant's template.
//!
//! ```text
//! GET    /v1/templates                          list this tenant's templates and versions
//! PUT    /v1/templates/{name}                   upload a version (body: the .wasm bytes)
//! POST   /v1/templates/{name}/activate          {"version": N}: the version requests use
//! POST   /v1/templates/{name}/render            dry run: a chat request body → the prompt
//! DELETE /v1/templates/{name}                   the template and all its versions
//! DELETE /v1/templates/{name}/versions/{N}      one inactive version
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cachet_backend::tokenizer::ChatMessage;
use cachet_guest_sdk::{Rendered, Request as TemplateRequest, Tenant as TemplateTenant};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};

use super::{openai, AppState};
use crate::http::{self, ApiError, Body as RespBody, MAX_BODY_BYTES};
use crate::sandbox::store::TemplateStore;
use crate::tenants::Tenant;

/// What a template made of a chat request.
pub struct Applied {
    pub rendered: Rendered,
    pub elapsed: Duration,
    pub fuel_used: u64,
}

fn store(state: &AppState) -> Result<&Arc<TemplateStore>, ApiError> {
    state.templates.as_ref().ok_or_else(|| {
        ApiError::not_found(
            "templates are not enabled on this gateway (start `cachet serve` with --templates-dir)",
            "templates_disabled",
        )
    })
}

fn rfc3339_now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// The template a chat request names, or the tenant's default, if any.
pub fn template_for(tenant: &Tenant, req: &openai::ChatRequest) -> Option<String> {
    req.template
        .clone()
        .or_else(|| tenant.config.default_template.clone())
}

/// What a template is given: the request's messages and variables, the tenant as configured,
/// the gateway's clock.
pub fn input(
    tenant: &Tenant,
    req: &openai::ChatRequest,
    messages: Vec<ChatMessage>,
) -> TemplateRequest {
    TemplateRequest {
        model: req.common.model.clone(),
        messages,
        variables: req
            .template_variables
            .as_deref()
            .cloned()
            .unwrap_or_default(),
        tenant: TemplateTenant {
            id: tenant.id().to_string(),
            metadata: tenant.config.metadata.clone(),
        },
        user: req.common.user.clone(),
        now: rfc3339_now(),
    }
}

/// Runs the tenant's template `name` on `input`.
pub async fn apply(
    state: &Arc<AppState>,
    tenant: &Arc<Tenant>,
    name: &str,
    input: TemplateRequest,
) -> Result<Applied, ApiError> {
    run(state, tenant, name, input).await
}

async fn run(
    state: &Arc<AppState>,
    tenant: &Arc<Tenant>,
    name: &str,
    input: TemplateRequest,
) -> Result<Applied, ApiError> {
    let outcome = async {
        let store = store(state)?.clone();
        let c = &tenant.config;
        let sandbox = store.sandbox().clone();
        let budget = sandbox.budget(
            c.template_deadline_ms.map(Duration::from_millis),
            c.template_fuel,
            c.template_memory_mib.map(|m| (m as usize) << 20),
        );
        let tag: Arc<str> = format!("{}/{name}", tenant.id()).into();
        let (t, n) = (tenant.id().to_string(), name.to_string());
        // Off the async threads: resolving may compile (a cold cache), rendering runs Wasm.
        let (rendered, stats) = tokio::task::spawn_blocking(move || {
            let module = store.resolve(&t, &n)?;
            sandbox.render(&module, &input, &budget, tag)
        })
        .await
        .map_err(|e| ApiError::internal(format!("template task: {e}")))??;
        Ok::<_, ApiError>((rendered, stats))
    }
    .await;
    match outcome {
        Ok((rendered, stats)) => {
            state
                .metrics
                .template_call(tenant.id(), "ok", Some(stats.elapsed.as_secs_f64()));
            Ok(Applied {
                rendered,
                elapsed: stats.elapsed,
                fuel_used: stats.fuel_used,
            })
        }
        Err(e) => {
            state
                .metrics
                .template_call(tenant.id(), e.code.unwrap_or("error"), None);
            if e.status.is_server_error() || e.status == StatusCode::UNPROCESSABLE_ENTITY {
                tracing::warn!(tenant = tenant.id(), template = name, error = %e.message, "template failed");
            }
            Err(e)
        }
    }
}

/// The admin API. `path` is below `/v1/templates`.
pub async fn admin(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, ApiError> {
    let tenant = state
        .tenants()
        .authenticate_admin(http::bearer(&req).unwrap_or(""))
        .map_err(|_| ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: Some("invalid_admin_key"),
            ..ApiError::bad_request(
                "the templates API needs one of the tenant's admin keys (admin_key_sha256 in the tenants config) as `Authorization: Bearer <key>`",
                None,
            )
        })?;
    let store = store(&state)?.clone();
    let path = req.uri().path().to_string();
    let rest: Vec<&str> = path
        .trim_start_matches("/v1/templates")
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let method = req.method().clone();
    let t = tenant.id().to_string();
    match (&method, rest.as_slice()) {
        (&Method::GET, []) => http::ok_json(
            StatusCode::OK,
            serde_json::json!({"object": "list", "data": store.list(&t)}),
        ),
        (&Method::PUT, [name]) => {
            let limit = store.sandbox().config().module_bytes;
            let bytes = http::read_body(req, limit).await?;
            let name = name.to_string();
            let s2 = store.clone();
            let (info, activated) =
                tokio::task::spawn_blocking(move || s2.upload(&t, &name, &bytes))
                    .await
                    .map_err(|e| ApiError::internal(format!("upload task: {e}")))??;
            tracing::info!(tenant = tenant.id(), version = info.version, hash = %info.hash, "template uploaded");
            http::ok_json(
                StatusCode::CREATED,
                serde_json::json!({"version": info, "active": activated}),
            )
        }
        (&Method::POST, [name, "activate"]) => {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Activate {
                version: u32,
            }
            let name = name.to_string();
            let a: Activate = http::read_json(req, MAX_BODY_BYTES).await?;
            store.activate(&t, &name, a.version)?;
            http::ok_json(
                StatusCode::OK,
                serde_json::json!({"name": name, "active": a.version}),
            )
        }
        (&Method::POST, [name, "render"]) => {
            let name = name.to_string();
            // The request a chat would send, validated as one; the run counts in the tenant's
            // concurrency and requests/min like a chat's.
            let body = http::read_body(req, MAX_BODY_BYTES).await?;
            let r = openai::ChatRequest::of(&openai::Members::parse(&body)?)?;
            let msgs = r.messages()?;
            let tools = r.tools()?.and_then(|t| t.template_tools());
            let kwargs = r.template_kwargs()?;
            r.common.validate()?;
            let _permit = tenant.admit_request(std::time::Instant::now()).await?;
            let applied = run(&state, &tenant, &name, input(&tenant, &r, msgs)).await?;
            let prepared = super::completions::prepare(
                &state,
                &tenant,
                &tenant.salt,
                &applied.rendered.segments,
                crate::normalize::tokens::TemplateArgs {
                    tools: tools.as_ref(),
                    kwargs: kwargs.as_ref(),
                    generation_prompt: true,
                },
                None,
            )?;
            http::ok_json(
                StatusCode::OK,
                serde_json::json!({
                    "segments": applied.rendered.segments,
                    "normalized": prepared.segments,
                    "relocated": prepared.relocated,
                    "stop": applied.rendered.stop,
                    "max_tokens": applied.rendered.max_tokens,
                    "prompt": prepared.prompt,
                    "prompt_tokens": prepared.ids.len(),
                    "stable_prefix_tokens": prepared.stable_tokens,
                    "elapsed_us": applied.elapsed.as_micros() as u64,
                    "fuel_used": applied.fuel_used,
                }),
            )
        }
        (&Method::DELETE, [name]) => {
            store.delete(&t, name, None)?;
            http::ok_json(
                StatusCode::OK,
                serde_json::json!({"name": name, "deleted": true}),
            )
        }
        (&Method::DELETE, [name, "versions", v]) => {
            let v: u32 = v.parse().map_err(|_| {
                ApiError::bad_request(format!("`{v}` is not a version number"), None)
            })?;
            store.delete(&t, name, Some(v))?;
            http::ok_json(
                StatusCode::OK,
                serde_json::json!({"name": name, "version": v, "deleted": true}),
            )
        }
        _ => Err(ApiError::not_found(
            format!("no route {method} {path} (see GET /v1/templates)"),
            "not_found",
        )),
    }
}
