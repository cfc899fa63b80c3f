//! `cachet serve`: the gateway, over its embedded engine, a pool of upstreams, or both.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cachet_backend::block_hash::HashContext;
use cachet_gateway::config::{ConfigFile, UpstreamConfig};
use cachet_gateway::http::tls;
use cachet_gateway::normalize::public::PublicPrefixes;
use cachet_gateway::operator::Operator;
use cachet_gateway::server::fields::UnknownFields;
use cachet_gateway::server::operator::OperatorState;
use cachet_gateway::server::tools::Format;
use cachet_gateway::server::{self, AppState};
use cachet_gateway::tenants::shared::SharedLimits;
use cachet_gateway::tenants::TenantRegistry;
use cachet_gateway::upstream::{
    self, embedded::Embedded, openai::OpenAi, worker::Worker, Upstream,
};
use clap::Args;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: super::engine_args::EngineArgs,
    /// Tenants config (TOML); see examples/cachet.toml.
    #[arg(long, short)]
    pub config: PathBuf,
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
    /// cost): `sqlite:PATH` (embedded, WAL; created if missing), `postgres://USER@HOST/DB`, or
    /// `off` (no records, no budgets, no /v1/usage). Written in batches off the request path; a
    /// crash loses at most the last 100 ms of records.
    #[arg(
        long,
        env = "CACHET_USAGE_DB",
        default_value = "sqlite:cachet-usage.db"
    )]
    pub usage_db: String,
}

pub fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let key = a.engine.hash_key()?;
    let text = std::fs::read_to_string(&a.config)
        .with_context(|| format!("reading {}", a.config.display()))?;
    let in_config = || format!("in {}", a.config.display());
    let file = ConfigFile::parse(&text).with_context(in_config)?;
    // Limits shared with other replicas through Redis, if the config says so (connected on
    // first use: a replica starts while Redis is down, and admits as `on_error` says).
    let shared_limits = match file.shared_limits {
        Some(cfg) => {
            tracing::info!(redis = %cfg.redis_url, replicas = cfg.replicas, on_error = ?cfg.on_error,
                "tenant limits shared through Redis");
            Some(
                SharedLimits::new(cfg)
                    .map_err(anyhow::Error::msg)
                    .with_context(in_config)?,
            )
        }
        None => None,
    };
    // With [operator], tenants live in its database (the file's are imported on the database's
    // first start); otherwise they are the file's.
    let operator = match file.operator.clone() {
        Some(cfg) => {
            // The file's tenants are checked as they would load before any is imported.
            TenantRegistry::from_configs(file.tenant.clone(), &key, std::time::Instant::now())
                .with_context(in_config)?;
            let store = Operator::open(cfg)
                .map_err(anyhow::Error::msg)
                .with_context(in_config)?;
            if store.bootstrap(&file.tenant)? {
                tracing::info!(
                    tenants = file.tenant.len(),
                    "operator store created: the config's tenants imported"
                );
            } else if !file.tenant.is_empty() {
                tracing::info!("tenants come from the operator store; the config's [[tenant]] tables were imported on its first start only");
            }
            Some(Arc::new(OperatorState {
                store,
                deployment_key: key,
            }))
        }
        None => None,
    };
    let (tenants, snapshot) = match &operator {
        Some(op) => {
            let snap = op.store.snapshot()?;
            let reg = TenantRegistry::from_store(
                snap.tenants.clone(),
                &key,
                std::time::Instant::now(),
                None,
                shared_limits,
            )
            .context("the operator store's tenants")?;
            tracing::info!(
                revision = snap.revision,
                tenants = reg.tenants().len(),
                "tenants from the operator store"
            );
            (reg, Some(snap))
        }
        None => {
            let reg = TenantRegistry::with_shared_limits(
                file.tenant,
                &key,
                std::time::Instant::now(),
                shared_limits,
            )
            .with_context(in_config)?;
            (reg, None)
        }
    };
    // The pool: the config's [[upstream]]s, then each --worker; alone, the embedded engine.
    for url in &a.workers {
        cachet_gateway::config::check_upstream_url(url, a.worker_ca_file.as_deref())
            .context("--worker")?;
    }
    let discovery = file.discovery.clone();
    let mut members = file.upstream;
    members.extend(a.workers.iter().map(|url| UpstreamConfig::Cachet {
        url: url.clone(),
        ca_file: a.worker_ca_file.clone(),
        dns: false,
        dns_refresh_secs: None,
    }));
    if members.is_empty() {
        members.push(UpstreamConfig::Embedded {});
    }
    let embedded = members
        .iter()
        .any(|m| matches!(m, UpstreamConfig::Embedded {}));
    // The tool-call format, checked before the model loads.
    let forced: Option<Option<Format>> = match a.tool_parser.as_str() {
        "auto" => None,
        "none" => Some(None),
        f => Some(Some(f.parse().map_err(anyhow::Error::msg)?)),
    };
    let (engine, tokenizer, model_id) = if embedded {
        let s = a.engine.start(key)?;
        (Some(s.engine), s.tokenizer, s.model_id)
    } else {
        let (tokenizer, model_id) = a.engine.text_only()?;
        tracing::info!(model = %model_id, "remote upstreams only: no weights loaded");
        (None, tokenizer, model_id)
    };
    for p in &file.price {
        p.validate()
            .map_err(anyhow::Error::msg)
            .with_context(in_config)?;
    }
    let usage = match a.usage_db.as_str() {
        "off" => {
            if let Some(t) = tenants
                .tenants()
                .iter()
                .find(|t| t.config.budget_usd.is_some())
            {
                anyhow::bail!(
                    "tenant `{}` has a budget, which needs usage records: give --usage-db (not off)",
                    t.id()
                );
            }
            None
        }
        url => {
            let log = cachet_gateway::usage::UsageLog::open(url, file.price.clone())
                .with_context(|| format!("--usage-db {url}"))?;
            if let Some(t) = tenants
                .tenants()
                .iter()
                .find(|t| t.config.budget_usd.is_some() && log.price(&model_id).is_none())
            {
                anyhow::bail!(
                    "tenant `{}` has a budget, but the config prices no model `{model_id}`: add a [[price]] with model = \"{model_id}\"",
                    t.id()
                );
            }
            tracing::info!(store = %url.split('@').next_back().unwrap_or(url), "usage records");
            Some(Arc::new(log))
        }
    };
    let public_prefixes = PublicPrefixes::new(&file.public_prefix, &tokenizer, a.engine.block_size)
        .map_err(anyhow::Error::msg)
        .with_context(in_config)?;
    let tool_format = forced.unwrap_or_else(|| tokenizer.chat_template().and_then(Format::detect));
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
    .map_err(anyhow::Error::msg)
    .context("--reasoning-parser")?;
    if reasoning.is_some() {
        tracing::info!("reasoning: <think>…</think> split out as reasoning_content");
    }
    let handle = engine.as_ref().map(|e| e.handle());
    let max_model_len = handle
        .as_ref()
        .map_or(a.engine.max_model_len, |h| h.max_model_len());
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => Some(tls::ReloadingCert::new(c, k)?),
        _ => None,
    };
    let templates = match &a.templates_dir {
        Some(dir) => {
            let sandbox =
                cachet_gateway::sandbox::Sandbox::new(cachet_gateway::sandbox::SandboxConfig {
                    deadline: Duration::from_millis(a.template_deadline_ms.max(1)),
                    fuel: a.template_fuel,
                    memory_bytes: a.template_memory_mib << 20,
                    output_bytes: a.template_output_kib << 10,
                    module_bytes: a.template_module_mib << 20,
                    instances: a.template_instances.max(1),
                    cache_bytes: a.template_cache_mib << 20,
                    max_functions: a.template_max_functions.max(1),
                    compile_deadline: Duration::from_secs(a.template_compile_timeout.max(1)),
                    // In a child process it can stop at the deadline.
                    compile_in: cachet_gateway::sandbox::CompileIn::Process(
                        std::env::current_exe()
                            .context("finding this program for template compiles")?,
                    ),
                    ..Default::default()
                })?;
            let store = cachet_gateway::sandbox::store::TemplateStore::open(dir, sandbox)
                .with_context(|| format!("opening the templates directory {}", dir.display()))?
                .with_quota(cachet_gateway::sandbox::store::Quota {
                    versions: a.template_max_versions.max(1),
                    bytes: a.template_storage_mib << 20,
                });
            Some(Arc::new(store))
        }
        None => None,
    };
    let policy = cachet_gateway::route::by_name(&a.routing).map_err(anyhow::Error::msg)?;
    let timeouts = upstream::Timeouts {
        connect: Duration::from_secs(a.upstream_connect_timeout.max(1)),
        response: Duration::from_secs(a.upstream_response_timeout.max(1)),
        first_event: Duration::from_secs(a.upstream_first_event_timeout.max(1)),
        idle: Duration::from_secs(a.upstream_idle_timeout.max(1)),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // The serving threads first: the upstream clients made below keep a pool for each.
    let lanes = a.conn.lanes()?;
    // Each remote upstream's client: TLS roots of its own where it names a CA file.
    let upstream_client = |ca: &Option<std::path::PathBuf>| {
        cachet_gateway::http::client::client_with_ca(timeouts.connect, ca.as_deref())
            .map_err(anyhow::Error::msg)
    };
    // Workers' clients present the gateway's certificate where the flags give one.
    let identity = match (&a.worker_client_cert, &a.worker_client_key) {
        (Some(cert), Some(key)) => Some(cachet_gateway::http::client::ClientIdentity {
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ => None,
    };
    let worker_client = |ca: &Option<std::path::PathBuf>| {
        cachet_gateway::http::client::client_with_identity(
            timeouts.connect,
            ca.as_deref(),
            identity.as_ref(),
        )
        .map_err(anyhow::Error::msg)
        .context("--worker-client-cert / --worker-client-key")
    };
    let state = rt.block_on(async {
        let key_id = cachet_gateway::protocol::key_id(&key);
        // Workers named by DNS join the pool as they are found (below); the others start now.
        let (by_dns, listed): (Vec<&UpstreamConfig>, Vec<&UpstreamConfig>) = members
            .iter()
            .partition(|m| matches!(m, UpstreamConfig::Cachet { dns: true, .. }));
        let upstreams: Vec<Arc<dyn Upstream>> = listed
            .into_iter()
            .map(|m| -> anyhow::Result<Arc<dyn Upstream>> {
                Ok(match m {
                    UpstreamConfig::Embedded {} => {
                        Embedded::start(handle.clone().expect("started above"))
                    }
                    UpstreamConfig::Cachet { url, ca_file, .. } => Worker::start(
                        url,
                        a.worker_token.clone(),
                        key_id.clone(),
                        timeouts,
                        worker_client(ca_file)?,
                    ),
                    UpstreamConfig::Openai {
                        url,
                        model,
                        api_key_env,
                        history_blocks,
                        cache_salt,
                        ca_file,
                    } => OpenAi::start(
                        url,
                        upstream::openai::Options {
                            model: model.clone().unwrap_or_else(|| model_id.clone()),
                            api_key: api_key_env.as_ref().and_then(|v| std::env::var(v).ok()),
                            history_blocks: history_blocks.unwrap_or(1 << 16),
                            send_cache_salt: cache_salt.unwrap_or(true),
                        },
                        timeouts,
                        upstream_client(ca_file)?,
                    ),
                })
            })
            .collect::<anyhow::Result<_>>()?;
        tracing::info!(upstreams = upstreams.len(), routing = %a.routing, "routing pool");
        let pool = upstream::Pool::new(
            upstreams,
            policy,
            HashContext::new(key, [0; 32], &model_id, a.engine.block_size),
        );
        let pool = Arc::new(pool);
        if !by_dns.is_empty() {
            let resolver = upstream::discovery::resolver(discovery.as_ref())
                .map_err(anyhow::Error::msg)?;
            for m in by_dns {
                let UpstreamConfig::Cachet {
                    url,
                    ca_file,
                    dns_refresh_secs,
                    ..
                } = m
                else {
                    unreachable!("partitioned above")
                };
                let name = upstream::discovery::DnsName::parse(url).map_err(anyhow::Error::msg)?;
                let refresh = Duration::from_secs(dns_refresh_secs.unwrap_or(10));
                tracing::info!(host = %name.host, port = name.port, ?refresh, "workers found by DNS");
                let (token, key_id, client) =
                    (a.worker_token.clone(), key_id.clone(), worker_client(ca_file)?);
                tokio::spawn(upstream::discovery::follow(
                    pool.clone(),
                    name,
                    refresh,
                    resolver.clone(),
                    move |u: &str| -> Arc<dyn Upstream> {
                        Worker::start(u, token.clone(), key_id.clone(), timeouts, client.clone())
                    },
                ));
            }
        }
        let mut state = AppState::new(
            pool,
            handle.clone(),
            tokenizer,
            model_id.clone(),
            max_model_len,
            Duration::from_secs(a.request_timeout.max(1)),
            tenants,
            templates,
        );
        state.metrics_token = a.metrics_token.clone();
        state.unknown_fields = a.unknown_fields;
        state.tool_format = tool_format;
        state.reasoning = reasoning;
        state.set_public_prefixes(public_prefixes);
        state.usage = usage;
        state.tracing = a.otlp.tracing("cachet-gateway")?.map(Arc::new);
        state.operator = operator.clone();
        anyhow::Ok(Arc::new(state))
    })?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        tracing::info!(addr = %listener.local_addr()?, "serving");
        let (tx, rx) = tokio::sync::watch::channel(false);
        if let (Some(op), Some(snap)) = (&operator, snapshot) {
            // Changes made on other replicas (or on this one) come from the store.
            let (st, o) = (state.clone(), op.clone());
            op.store.follow(snap, move |s| server::operator::install(&st, &o, s));
        }
        {
            // SIGHUP re-reads the tenants config; a config that does not parse is refused and the
            // previous one stays.
            let (state, path) = (state.clone(), a.config.clone());
            let block_size = a.engine.block_size;
            tokio::spawn(async move {
                use tokio::signal::unix::{signal, SignalKind};
                let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
                while hup.recv().await.is_some() {
                    // The tenants' live state (requests in flight, bucket levels) carries over.
                    let previous = state.tenants();
                    let loaded = std::fs::read_to_string(&path)
                        .map_err(|e| e.to_string())
                        .and_then(|t| ConfigFile::parse(&t).map_err(|e| e.to_string()))
                        .and_then(|f| {
                            if f.shared_limits.as_ref() != previous.shared_limits().map(|s| &s.config) {
                                tracing::warn!("[shared_limits] changed: the Redis connection is made at start-up, so the change takes effect on restart");
                            }
                            let prefixes = PublicPrefixes::new(&f.public_prefix, &state.tokenizer, block_size)?;
                            if state.operator.is_some() {
                                // Tenants come from the operator store; the file's public
                                // prefixes still reload.
                                return Ok((None, prefixes));
                            }
                            TenantRegistry::reloaded(f.tenant, &key, std::time::Instant::now(), Some(&previous))
                                .map(|reg| (Some(reg), prefixes))
                                .map_err(|e| e.to_string())
                        });
                    match loaded {
                        Ok((reg, prefixes)) => {
                            tracing::info!(
                                tenants = reg.as_ref().map(|r| r.tenants().len()),
                                public_prefixes = prefixes.prefixes().len(),
                                "tenants config reloaded"
                            );
                            if let Some(reg) = reg {
                                state.set_tenants(reg);
                            }
                            state.set_public_prefixes(prefixes);
                        }
                        Err(e) => tracing::warn!(error = %e, "tenants config reload refused; keeping the previous one"),
                    }
                }
            });
        }
        let tls_config = match &tls {
            Some(cert) => {
                let cert = cert.clone();
                // Reload on file change (polled) and on SIGHUP.
                tokio::spawn(async move {
                    use tokio::signal::unix::{signal, SignalKind};
                    let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
                    let mut tick = tokio::time::interval(Duration::from_secs(2));
                    loop {
                        tokio::select! {
                            _ = hup.recv() => cert.reload(true),
                            _ = tick.tick() => cert.reload(false),
                        }
                    }
                });
                Some(tls::server_config(tls.clone().expect("checked"))?)
            }
            None => None,
        };
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            tracing::info!("shutdown signal: draining");
            let _ = tx.send(true);
        });
        let usage = state.usage.clone();
        let traces = state.tracing.clone();
        server::serve(listener, state, tls_config, rx, a.conn.limits(), lanes).await?;
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
            .map_err(|_| anyhow::anyhow!("the OTLP exporter's set-up panicked"))?
            .map_err(anyhow::Error::msg)?;
        tracing::info!(endpoint = %url, service = name, "exporting request traces over OTLP");
        Ok(Some(t))
    }
}
