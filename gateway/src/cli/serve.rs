//! `cachet serve`: the gateway, over its embedded engine, a pool of upstreams, or both. The
//! command's flags and its order of work; each phase's detail is in [`phases`].

mod phases;
mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cachet_gateway::config::{ConfigFile, ModelEntry, UpstreamConfig};
use cachet_gateway::http::tls;
use cachet_gateway::normalize::public::PublicPrefixes;
use cachet_gateway::server::fields::UnknownFields;
use cachet_gateway::server::tools::Format;
use cachet_gateway::server::{self, AppState};
use clap::Args;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: super::engine_args::EngineArgs,
    /// Tenants config (TOML); see examples/cachet.toml.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Names clients use for the model: `model` in requests, `/v1/models`, `[[price]]` and
    /// tenants' `allowed_models` (e.g. `--served-model-name Qwen/Qwen3-8B qwen3`). The first is
    /// the name responses and usage records carry. Default: the model's own name (a known
    /// model's, or its files').
    #[arg(long, num_args = 1.., value_name = "NAME")]
    pub served_model_name: Vec<String>,
    /// Address to listen on (plain HTTP/1.1 and HTTP/2).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// TLS certificate chain (PEM). With --tls-key, serves HTTPS (HTTP/2 and HTTP/1.1 by ALPN);
    /// the files are reloaded when they change or on SIGHUP.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    #[command(flatten)]
    pub conn: super::connection_args::ConnectionArgs,
    /// A `cachet worker` to route requests to (repeat for a pool; with the config's
    /// `[[upstream]]`s they make one pool). With remote upstreams only (no `kind = "embedded"`),
    /// the gateway loads no weights: the model's tokenizer is all it needs. Workers must share
    /// --hash-key-file with the gateway for exact prefix routing.
    #[arg(long = "worker", value_name = "URL")]
    pub workers: Vec<String>,
    /// How to choose a worker: prefix (exact cached-prefix overlap against load), round_robin,
    /// least_load or session (by the request's `user`).
    #[arg(long, default_value = "prefix")]
    pub routing: String,
    /// Bearer token for the workers (`CACHET_WORKER_TOKEN`).
    #[arg(long, env = "CACHET_WORKER_TOKEN")]
    pub worker_token: Option<String>,
    /// PEM certificates of a CA to trust for https:// --worker URLs, besides the system's roots
    /// (a config's `[[upstream]]` names its own `ca_file`).
    #[arg(long, value_name = "PEM")]
    pub worker_ca_file: Option<std::path::PathBuf>,
    /// Mutual TLS to the workers: this certificate (PEM) is presented to every `cachet` worker
    /// that asks for one (a worker started with --tls-client-ca).
    #[arg(long, value_name = "PEM", requires = "worker_client_key")]
    pub worker_client_cert: Option<std::path::PathBuf>,
    /// The private key of --worker-client-cert (PEM).
    #[arg(long, value_name = "PEM", requires = "worker_client_cert")]
    pub worker_client_key: Option<std::path::PathBuf>,
    /// Directory where tenants' prompt templates (Wasm) are stored; enables the templates API
    /// (`/v1/templates`) and the `template` field of chat requests.
    #[arg(long)]
    pub templates_dir: Option<PathBuf>,
    /// Wall-clock budget of one template call, in milliseconds (tenants may set less).
    #[arg(long, default_value_t = 50)]
    pub template_deadline_ms: u64,
    /// Fuel (about one unit per Wasm instruction) of one template call.
    #[arg(long, default_value_t = 200_000_000)]
    pub template_fuel: u64,
    /// Linear memory of one template instance, in MiB.
    #[arg(long, default_value_t = 32)]
    pub template_memory_mib: usize,
    /// Largest template reply, in KiB.
    #[arg(long, default_value_t = 1024)]
    pub template_output_kib: usize,
    /// Largest template module that may be uploaded, in MiB.
    #[arg(long, default_value_t = 4)]
    pub template_module_mib: usize,
    /// Template calls in flight at once (sandbox pool slots).
    #[arg(long, default_value_t = 64)]
    pub template_instances: u32,
    /// Most functions an uploaded template module may define (bounds its compile time; checked
    /// by parsing, before compiling).
    #[arg(long, default_value_t = 10_000)]
    pub template_max_functions: u32,
    /// Seconds one template compile may take (each compiles on one core, at most two at once).
    #[arg(long, default_value_t = 10)]
    pub template_compile_timeout: u64,
    /// MiB of compiled template code kept in memory (LRU beyond; a deleted or replaced
    /// template's code is released at once).
    #[arg(long, default_value_t = 256)]
    pub template_cache_mib: usize,
    /// Template versions one tenant may store, across its templates.
    #[arg(long, default_value_t = 64)]
    pub template_max_versions: usize,
    /// MiB of template modules one tenant may store.
    #[arg(long, default_value_t = 32)]
    pub template_storage_mib: usize,
    /// The operator's token for `/metrics` (`CACHET_METRICS_TOKEN`), which lists tenants; without
    /// one, `/metrics` answers requests from this machine only.
    #[arg(long, env = "CACHET_METRICS_TOKEN")]
    pub metrics_token: Option<String>,
    /// What requests get for body fields Cachet does not know (docs/API.md lists those it
    /// does): `reject` answers 400 naming the field, as OpenAI does; `warn` lets the request
    /// through and names the ignored fields in the `x-cachet-warning` response header.
    #[arg(long, value_enum, default_value_t = UnknownFields::Reject)]
    pub unknown_fields: UnknownFields,
    /// Largest request body of the API (chat and text completions, responses, messages,
    /// tokenize), in KiB; a larger one is refused with 413 before it is parsed.
    #[arg(long, default_value_t = 1024, value_name = "KIB")]
    pub max_body_kib: usize,
    /// How the model writes tool calls, for requests with `tools`: `auto` tells it from the
    /// chat template (`<tool_call>`: hermes; `[TOOL_CALLS]`: mistral; ipython: llama3_json);
    /// `hermes` (Hermes, Qwen), `llama3_json`, `mistral`; `none` refuses tools.
    #[arg(long, default_value = "auto")]
    pub tool_parser: String,
    /// How a chat answer's thinking is split out as `reasoning_content`: `qwen3` (also `think`,
    /// `deepseek_r1`: output that starts with `<think>` is reasoning up to `</think>`), `none`
    /// (left in the content), `auto`: `qwen3` when the chat template writes `</think>`.
    #[arg(long, default_value = "auto")]
    pub reasoning_parser: String,
    /// Seconds a request may take end to end; the engine ends it with an error past this (the
    /// deadline travels with the request to workers).
    #[arg(long, default_value_t = 600)]
    pub request_timeout: u64,
    /// Seconds to open a connection to a remote upstream.
    #[arg(long, default_value_t = 2)]
    pub upstream_connect_timeout: u64,
    /// Seconds a remote upstream has to answer a request with its response head (a live one does
    /// at once; a frozen one is skipped for the next member within this).
    #[arg(long, default_value_t = 5)]
    pub upstream_response_timeout: u64,
    /// Seconds a remote upstream has to send a request's first event (its first token); one that
    /// takes longer is skipped for the next.
    #[arg(long, default_value_t = 120)]
    pub upstream_first_event_timeout: u64,
    /// Seconds a remote upstream's stream may stay silent before the request fails.
    #[arg(long, default_value_t = 30)]
    pub upstream_idle_timeout: u64,
    #[command(flatten)]
    pub otlp: OtlpArgs,
    /// Where every request's usage record goes (tenant, key id, tokens, timings, status, route,
    /// cost): `sqlite:PATH` (embedded, WAL; created if missing), `postgres://USER@HOST/DB`
    /// (TLS as libpq's `sslmode`: add `?sslmode=verify-full&sslrootcert=CA.pem` off this host),
    /// or `off` (no records, no budgets, no /v1/usage). Written in batches off the request path;
    /// a crash loses at most the last 100 ms of records. Default: `sqlite:<state dir>/usage.db`.
    /// Replicas sharing limits ([shared_limits] replicas > 1) must share this too (PostgreSQL).
    #[arg(long, env = "CACHET_USAGE_DB")]
    pub usage_db: Option<String>,
    /// Where the gateway keeps what must outlive a restart: the usage database when --usage-db
    /// is not given (`usage.db`), the deployment key when --hash-key-file is not (`hash-key`,
    /// made on the first start, readable by this user only; give it to the workers). Default
    /// `$XDG_STATE_HOME/cachet`, else `~/.local/state/cachet`; the image sets /var/lib/cachet.
    #[arg(long, env = "CACHET_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
}

pub fn serve(a: ServeArgs, given: &super::flags::Given) -> anyhow::Result<()> {
    let state_dir = state::dir(a.state_dir.as_deref())?;
    let key = match a.engine.hash_key_file {
        Some(_) => a.engine.hash_key()?,
        None => state::deployment_key(&state_dir)?,
    };
    let text = std::fs::read_to_string(&a.config)
        .with_context(|| format!("reading {}", a.config.display()))?;
    let in_config = || format!("in {}", a.config.display());
    let file = ConfigFile::parse(&text).with_context(in_config)?;
    let usage_db = state::usage_url(a.usage_db.as_deref(), &state_dir);
    state::check_shared(file.shared_limits.as_ref().map(|s| s.replicas), &usage_db)?;
    let discovery = file.discovery.clone();
    let (tenants, snapshot, operator) = phases::tenants(&file, &key).with_context(in_config)?;
    let members = phases::pool_members(&a, file.upstream.clone())?;
    let embedded = members
        .iter()
        .any(|m| matches!(m, UpstreamConfig::Embedded {}));
    unused_flags(&a, given, &members, &file, embedded)?;
    // The tool-call format, checked before the model loads.
    let forced: Option<Option<Format>> = match a.tool_parser.as_str() {
        "auto" => None,
        "none" => Some(None),
        f => Some(Some(f.parse().map_err(anyhow::Error::msg)?)),
    };
    let (engine, tokenizer, model_id, generation, remote_len) = if embedded {
        let s = a.engine.start(key)?;
        (Some(s.engine), s.tokenizer, s.model_id, s.generation, 0)
    } else {
        let t = a.engine.text_only()?;
        tracing::info!(model = %t.id, max_model_len = t.context, "remote upstreams only: no weights loaded");
        (None, t.tokenizer, t.id, t.generation, t.context)
    };
    phases::say_sampling_defaults(&generation);
    for p in &file.price {
        p.validate().with_context(in_config)?;
    }
    let served = served_names(&a.served_model_name, &model_id)?;
    let (others, all_names) = further_models(&file, &served)?;
    let usage = phases::usage(&usage_db, &file, &tenants, &all_names)?;
    let public_prefixes = PublicPrefixes::new(&file.public_prefix, &tokenizer, a.engine.block_size)
        .with_context(in_config)?;
    let (tool_format, reasoning) = chat_parsers(&a, forced, &tokenizer)?;
    let handle = engine.as_ref().map(|e| e.handle());
    let max_model_len = handle.as_ref().map_or(remote_len, |h| h.max_model_len());
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => Some(tls::ReloadingCert::new(c, k)?),
        _ => None,
    };
    let templates = phases::templates(&a)?;
    phases::say_settings(&a);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // The serving threads first: the upstream clients made below keep a pool for each.
    let lanes = a.conn.lanes()?;
    let state = rt.block_on(async {
        let pool = phases::Pool {
            args: &a,
            key,
            model_id: &model_id,
            embedded: handle.clone(),
        }
        .start(&members, discovery.as_ref())?;
        let mut state = AppState::new(
            pool,
            handle.clone(),
            tokenizer,
            served[0].clone(),
            max_model_len,
            tenants,
        );
        state.served_names = served.clone();
        state.sampling_defaults = generation;
        state.request_timeout = Duration::from_secs(a.request_timeout.max(1));
        state.templates = templates;
        state.metrics_token = a.metrics_token.clone();
        state.unknown_fields = a.unknown_fields;
        state.max_body_bytes = a.max_body_kib.max(1) << 10;
        state.tool_format = tool_format;
        state.reasoning = reasoning;
        state.set_public_prefixes(public_prefixes);
        state.usage = usage;
        state.tracing = a.otlp.tracing("cachet-gateway")?.map(Arc::new);
        state.operator = operator.clone();
        let front = Arc::new(state);
        let mut states = vec![front.clone()];
        for (entry, text, names) in others {
            let pool = phases::Pool {
                args: &a,
                key,
                model_id: &text.id,
                embedded: None,
            }
            .start(&entry.upstream, discovery.as_ref())?;
            let max_model_len = entry.max_model_len.unwrap_or(text.context);
            let mut m = front.sibling(pool, None, text.tokenizer, names[0].clone(), max_model_len);
            m.served_names = names;
            m.sampling_defaults = text.generation;
            let what = format!("[[model]] `{}`", entry.model);
            m.set_public_prefixes(
                PublicPrefixes::new(&file.public_prefix, &m.tokenizer, a.engine.block_size)
                    .with_context(|| what.clone())?,
            );
            tracing::info!(model = %m.model_id, names = ?m.served_names, max_model_len,
                upstreams = entry.upstream.len(), "serving a further model by its upstreams");
            states.push(Arc::new(m));
        }
        AppState::join(&states);
        anyhow::Ok((front, states))
    })?;
    let (state, _models) = state;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        tracing::info!(addr = %listener.local_addr()?, "serving");
        if let (Some(op), Some(snap)) = (&operator, snapshot) {
            // Changes made on other replicas (or on this one) come from the store.
            let (st, o) = (state.clone(), op.clone());
            op.store
                .follow(snap, move |s| server::operator::install(&st, &o, s));
        }
        phases::reload_config_on_sighup(state.clone(), a.config.clone(), key, a.engine.block_size);
        let tls_config = match tls {
            Some(cert) => Some(phases::reloading_tls(cert)?),
            None => None,
        };
        let stop = phases::stop_on_signal();
        let usage = state.usage.clone();
        let traces = state.tracing.clone();
        server::serve(listener, state, tls_config, stop, a.conn.limits(), lanes).await?;
        // Drained: every request's record is made; write them before stopping.
        if let Some(u) = usage {
            tokio::task::spawn_blocking(move || u.flush()).await?;
        }
        if let Some(t) = traces {
            tokio::task::spawn_blocking(move || t.shutdown()).await?;
        }
        anyhow::Ok(())
    })?;
    drop(engine);
    tracing::info!("stopped");
    Ok(())
}

/// A further model of the config: its entry, its text side, its served names.
type FurtherModel<'f> = (&'f ModelEntry, super::engine_args::ModelText, Vec<String>);

/// The served model's further models (`[[model]]`): each one's text side and names, and every
/// model's names (the served model's first), no name given to two models.
fn further_models<'f>(
    file: &'f ConfigFile,
    served: &[String],
) -> anyhow::Result<(Vec<FurtherModel<'f>>, Vec<Vec<String>>)> {
    let mut others = Vec::new();
    for entry in &file.model {
        let what = format!("[[model]] `{}`", entry.model);
        let text = super::engine_args::model_text(
            &entry.model,
            entry.revision.as_deref(),
            entry.chat_template.as_deref(),
            "chat_template",
            &what,
        )?;
        let names = served_names(&entry.served_model_name, &text.id).context(what)?;
        others.push((entry, text, names));
    }
    let all_names: Vec<Vec<String>> = std::iter::once(served.to_vec())
        .chain(others.iter().map(|o| o.2.clone()))
        .collect();
    let mut seen = std::collections::HashSet::new();
    if let Some(n) = all_names.iter().flatten().find(|n| !seen.insert(*n)) {
        anyhow::bail!("the served name `{n}` is given to two models: each name is one model's");
    }
    Ok((others, all_names))
}

/// The chat answers' parsers: the tool-call format (`forced` by --tool-parser, else the
/// template's) and the reasoning parser (--reasoning-parser), each said at start.
fn chat_parsers(
    a: &ServeArgs,
    forced: Option<Option<Format>>,
    tokenizer: &cachet_backend::tokenizer::TextTokenizer,
) -> anyhow::Result<(
    Option<Format>,
    Option<cachet_gateway::server::reasoning::ReasoningParser>,
)> {
    let tool_format = forced.unwrap_or_else(|| tokenizer.tools_template().and_then(Format::detect));
    match (tool_format, tokenizer.chat_template()) {
        (Some(f), _) => tracing::info!(format = %f, "tool calls"),
        (None, Some(_)) => tracing::info!(
            "tool calls: off (the chat template renders no tools; --chat-template or --tool-parser)"
        ),
        (None, None) => {}
    }
    let reasoning = cachet_gateway::server::reasoning::ReasoningParser::from_flag(
        &a.reasoning_parser,
        tokenizer.chat_template(),
    )
    .context("--reasoning-parser")?;
    if reasoning.is_some() {
        tracing::info!("reasoning: <think>…</think> split out as reasoning_content");
    }
    Ok((tool_format, reasoning))
}

/// Request traces over OTLP (`cachet serve`, `cachet worker`).
#[derive(Args, Debug, Clone)]
pub struct OtlpArgs {
    /// Export a span per request (with its phases and the engine's queue / prefill / decode
    /// times) to this OTLP/HTTP endpoint, a collector's base URL (`http://collector:4318`; spans
    /// go to its /v1/traces, protobuf). Clients' W3C `traceparent` is continued either way.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// The service name spans are exported under (default: cachet-gateway for `serve`,
    /// cachet-worker for `worker`).
    #[arg(long, env = "OTEL_SERVICE_NAME")]
    pub otlp_service_name: Option<String>,
}

impl OtlpArgs {
    /// The exporter the flags ask for, if any (`default_name`: the service name by default).
    pub fn tracing(
        &self,
        default_name: &str,
    ) -> anyhow::Result<Option<cachet_gateway::trace::Tracing>> {
        let Some(url) = &self.otlp_endpoint else {
            return Ok(None);
        };
        let name = self
            .otlp_service_name
            .clone()
            .unwrap_or_else(|| default_name.to_string());
        // Built on a thread of its own: the exporter's blocking HTTP client may not be made
        // inside the async runtime.
        let (u, n) = (url.clone(), name.clone());
        let t = std::thread::spawn(move || cachet_gateway::trace::Tracing::new(&u, &n))
            .join()
            .map_err(|_| anyhow::anyhow!("the OTLP exporter's set-up panicked"))??;
        tracing::info!(endpoint = %url, service = name, "exporting request traces over OTLP");
        Ok(Some(t))
    }
}

/// `--served-model-name`'s names (the model's own name without it): non-empty, no spaces, each
/// once.
/// Refuses the flags this gateway's mode has no use for (see [`super::flags`]).
fn unused_flags(
    a: &ServeArgs,
    given: &super::flags::Given,
    members: &[UpstreamConfig],
    file: &ConfigFile,
    embedded: bool,
) -> anyhow::Result<()> {
    use super::flags::{self, flag};
    if embedded {
        flags::device_flags(given, a.engine.device)?;
    } else {
        given.refuse(
            flags::ENGINE_ONLY,
            "for the embedded engine",
            "this gateway runs none: its upstreams run the model",
        )?;
    }
    if a.templates_dir.is_none() {
        given.refuse(
            flags::TEMPLATES,
            "a limit of tenants' templates",
            "templates are off without --templates-dir",
        )?;
    }
    let upstreams: Vec<&UpstreamConfig> = members
        .iter()
        .chain(file.model.iter().flat_map(|m| &m.upstream))
        .collect();
    if upstreams
        .iter()
        .all(|u| matches!(u, UpstreamConfig::Embedded {}))
    {
        given.refuse(
            flags::UPSTREAM_TIMEOUTS,
            "for remote upstreams",
            "the embedded engine is this gateway's only one",
        )?;
    }
    if !upstreams
        .iter()
        .any(|u| matches!(u, UpstreamConfig::Cachet { .. }))
    {
        given.refuse(
            flags::WORKER_CLIENT,
            "for `cachet worker` upstreams",
            "none is listed (--worker, or kind = \"cachet\" in the config)",
        )?;
    }
    if a.workers.is_empty() {
        given.refuse(
            &["worker_ca_file"],
            "for --worker URLs",
            &format!(
                "none is given (a config [[upstream]] names its own ca_file; {} is not --worker)",
                flag("worker_ca_file")
            ),
        )?;
    }
    flags::otlp_flags(given, a.otlp.otlp_endpoint.is_some())
}

fn served_names(given: &[String], model_id: &str) -> anyhow::Result<Vec<String>> {
    if given.is_empty() {
        return Ok(vec![model_id.to_string()]);
    }
    let mut seen = std::collections::HashSet::new();
    for n in given {
        if n.is_empty() || n.chars().any(char::is_whitespace) {
            anyhow::bail!("--served-model-name `{n}`: a name is non-empty, without spaces");
        }
        if !seen.insert(n) {
            anyhow::bail!("--served-model-name `{n}` is given twice");
        }
    }
    Ok(given.to_vec())
}
