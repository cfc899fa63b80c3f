//! vLLM's `POST /tokenize` and `POST /detokenize`, behind the tenant's key: what a prompt
//! becomes before the engine sees it, so clients can count tokens and operators can see what a
//! template rendered.
//!
//! `/tokenize` takes a `prompt` (tokenized as `/v1/completions` tokenizes it; with
//! `add_special_tokens`, the default, what the tokenizer adds around a sequence) or `messages`
//! (a chat request's body: the tenant's template, normalization, the model's chat template and
//! tokenization, exactly as `/v1/chat/completions` runs them; `add_generation_prompt`, default
//! true; `tools`, `chat_template_kwargs`), with `return_token_strs` for each token's text. The
//! reply: `count`, `max_model_len`, `tokens`, `token_strs` (null unless asked).
//! `/detokenize` takes `tokens` and answers the `prompt` they decode to. Anthropic's
//! `POST /v1/messages/count_tokens` counts a Messages request's prompt the same way.

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{Map, Value};

use super::completions::{prompts_of, tool_plan};
use super::openai::{self, Parsed};
use super::AppState;
use crate::http::{self, ApiError, Body};
use crate::tenants::Tenant;
use crate::trace::RequestTrace;

/// The body as a JSON object.
fn object(body: &[u8], what: &str) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_request(
            format!("the body is a JSON object: {what}"),
            None,
        )),
        Err(e) => Err(ApiError::bad_request(
            format!("the body is not JSON ({e}): {what}"),
            None,
        )),
    }
}

/// Member `key` taken out of `m` as a boolean, if given.
fn flag(m: &mut Map<String, Value>, key: &'static str) -> Result<Option<bool>, ApiError> {
    match m.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(_) => Err(ApiError::bad_field(
            format!("`{key}` is true or false"),
            key,
        )),
    }
}

/// The model the body names (the served one when it names none), checked for the tenant.
fn model_of(
    state: &Arc<AppState>,
    tenant: &Tenant,
    m: &mut Map<String, Value>,
) -> Result<Arc<AppState>, ApiError> {
    match m.remove("model") {
        None | Some(Value::Null) => Ok(state.clone()),
        Some(Value::String(name)) => state.serving(&name, tenant),
        Some(_) => Err(ApiError::bad_field("`model` is a string", "model")),
    }
}

/// Refuses a member outside `allowed` (what shapes the prompt), naming what `endpoint` takes.
fn only(m: &Map<String, Value>, allowed: &[&str], endpoint: &str) -> Result<(), ApiError> {
    match m.keys().find(|k| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(ApiError::bad_field(
            format!(
                "`{k}` does not shape the prompt ({endpoint} takes {})",
                allowed.join(", ")
            ),
            k.clone(),
        )),
    }
}

/// The token ids a parsed chat request's prompt becomes, and the state of the model it names:
/// the model checked, its tools, the tenant's template, normalization, the chat template (with
/// the generation prompt or not) and tokenization, as the completion path runs them.
async fn chat_ids(
    state: &Arc<AppState>,
    tenant: &Arc<Tenant>,
    mut parsed: Parsed,
    generation_prompt: bool,
    trace: &RequestTrace,
) -> Result<(Vec<u32>, Arc<AppState>), ApiError> {
    let model = state.serving(&parsed.input.common().model, tenant)?;
    let state = &model;
    let mut constraint = parsed.constraint.take();
    let (template_tools, _) = tool_plan(state, parsed.tools.as_ref(), &mut constraint)?;
    let p = prompts_of(
        state,
        tenant,
        parsed.input,
        template_tools,
        generation_prompt,
        trace,
    )
    .await?;
    let ids = p
        .prompts
        .into_iter()
        .next()
        .map(|p| p.0)
        .unwrap_or_default();
    Ok((ids, model))
}

/// Refuses members nobody read.
fn no_more(m: &Map<String, Value>, known: &str) -> Result<(), ApiError> {
    match m.keys().next() {
        None => Ok(()),
        Some(k) => Err(ApiError::bad_field(
            format!("unknown field `{k}` (this endpoint takes {known})"),
            k.clone(),
        )),
    }
}

pub async fn tokenize(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let arrived = Instant::now();
    let trace = RequestTrace::start(
        state.tracing.as_deref(),
        req.headers(),
        req.uri().path(),
        arrived,
    );
    let tenant = state
        .tenants()
        .authenticate(http::api_key(&req).unwrap_or(""))?;
    crate::http::access::tenant(&req, tenant.id());
    let body = http::read_body(req, state.max_body_bytes).await?;
    let mut m = object(&body, "{\"prompt\": …} or {\"messages\": […]}")?;
    drop(body);
    let return_strs = flag(&mut m, "return_token_strs")?.unwrap_or(false);
    let generation = flag(&mut m, "add_generation_prompt")?;
    let special = flag(&mut m, "add_special_tokens")?;
    if flag(&mut m, "continue_final_message")? == Some(true) {
        return Err(ApiError::bad_field(
            "continue_final_message is not supported: chat prompts end with the assistant's turn opened (add_generation_prompt) or after the last message",
            "continue_final_message",
        ));
    }
    // A tokenization's work is the tenant's like any request's.
    let _permit = tenant.admit_request(Instant::now()).await?;
    let (ids, model) = if m.contains_key("messages") {
        if special == Some(true) {
            return Err(ApiError::bad_field(
                "a chat's special tokens are its template's (it writes the BOS): leave add_special_tokens out or false",
                "add_special_tokens",
            ));
        }
        // What shapes a chat's prompt; sampling and output fields have no tokens to show.
        only(
            &m,
            &[
                "model",
                "messages",
                "tools",
                "tool_choice",
                "chat_template_kwargs",
                "template",
                "template_variables",
            ],
            "/tokenize (with add_generation_prompt, return_token_strs)",
        )?;
        m.entry("model")
            .or_insert_with(|| Value::from(state.model_id.as_str()));
        let bytes = serde_json::to_vec(&Value::Object(m)).expect("a JSON object writes");
        let parsed = openai::parse_request(true, &bytes, state.unknown_fields)?;
        chat_ids(&state, &tenant, parsed, generation.unwrap_or(true), &trace).await?
    } else {
        if generation.is_some() {
            return Err(ApiError::bad_field(
                "add_generation_prompt is for `messages`; a prompt is tokenized as it is",
                "add_generation_prompt",
            ));
        }
        let model = model_of(&state, &tenant, &mut m)?;
        let text = match m.remove("prompt") {
            Some(Value::String(t)) => t,
            _ => {
                return Err(ApiError::bad_field(
                    "give `prompt` (a string) or `messages` (a chat)",
                    "prompt",
                ))
            }
        };
        no_more(
            &m,
            "model, prompt, add_special_tokens, return_token_strs; or a chat's messages",
        )?;
        let ids = if special.unwrap_or(true) {
            model.tokenizer.encode_prompt(&text)?
        } else {
            model.tokenizer.encode(&text)?
        };
        (ids, model)
    };
    let state = model;
    let strs = return_strs.then(|| {
        ids.iter()
            .map(|&i| state.tokenizer.inner().id_to_token(i).unwrap_or_default())
            .collect::<Vec<_>>()
    });
    trace.end(200);
    Ok(http::json(
        StatusCode::OK,
        &serde_json::json!({
            "count": ids.len(),
            "max_model_len": state.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }),
    ))
}

pub async fn detokenize(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let tenant = state
        .tenants()
        .authenticate(http::api_key(&req).unwrap_or(""))?;
    crate::http::access::tenant(&req, tenant.id());
    let body = http::read_body(req, state.max_body_bytes).await?;
    let mut m = object(&body, "{\"tokens\": [ids]}")?;
    drop(body);
    let state = model_of(&state, &tenant, &mut m)?;
    let ids: Vec<u32> = match m.remove("tokens") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::bad_field("`tokens` is a list of token ids", "tokens"))?,
        _ => {
            return Err(ApiError::bad_field(
                "give `tokens`: a list of token ids",
                "tokens",
            ))
        }
    };
    no_more(&m, "model, tokens")?;
    if let Some(&t) = ids.iter().find(|&&t| t as usize >= state.vocab) {
        return Err(ApiError::bad_field(
            format!("token id {t} is outside the vocabulary of {}", state.vocab),
            "tokens",
        ));
    }
    let _permit = tenant.admit_request(Instant::now()).await?;
    let text = state.tokenizer.decode(&ids, false)?;
    Ok(http::json(
        StatusCode::OK,
        &serde_json::json!({"prompt": text}),
    ))
}

/// Anthropic's `POST /v1/messages/count_tokens`: the tokens a Messages request's prompt takes
/// (`model`, `messages`, `system`, `tools`, `tool_choice`, `thinking`), as `/v1/messages` runs
/// it: `{"input_tokens": n}`. Fields that do not shape the prompt are refused by name.
pub async fn count_tokens(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let trace = RequestTrace::start(
        state.tracing.as_deref(),
        req.headers(),
        req.uri().path(),
        Instant::now(),
    );
    let tenant = state
        .tenants()
        .authenticate(http::api_key(&req).unwrap_or(""))?;
    crate::http::access::tenant(&req, tenant.id());
    let body = http::read_body(req, state.max_body_bytes).await?;
    let mut m = object(&body, "{\"model\", \"messages\", …}")?;
    drop(body);
    only(
        &m,
        &[
            "model",
            "messages",
            "system",
            "tools",
            "tool_choice",
            "thinking",
        ],
        "count_tokens",
    )?;
    // A Messages request needs its output's limit; the count does not read it.
    m.insert("max_tokens".into(), Value::from(1));
    let bytes = serde_json::to_vec(&Value::Object(m)).expect("a JSON object writes");
    let parsed = super::anthropic::parse(&bytes, state.unknown_fields)?;
    let _permit = tenant.admit_request(Instant::now()).await?;
    let n = chat_ids(&state, &tenant, parsed, true, &trace)
        .await?
        .0
        .len();
    trace.end(200);
    Ok(http::json(
        StatusCode::OK,
        &serde_json::json!({"input_tokens": n}),
    ))
}
