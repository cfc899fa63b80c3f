//! `cachet serve`: the gateway, over its embedded engine, a pool of upstreams, or both.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cachet_backend::block_hash::HashContext;
use cachet_gateway::config::{ConfigFile, UpstreamConfig};
use cachet_gateway::http::tls;
use cachet_gateway::server::{self, AppState};
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
    /// Seconds a client has to send a request's headers (slowloris protection).
    #[arg(long, default_value_t = 10)]
    pub header_read_timeout: u64,
    /// Largest request head in bytes; larger requests get 431.
    #[arg(long, default_value_t = 32 * 1024)]
    pub max_header_bytes: usize,
    /// Connections served at once; more wait in the listen backlog.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// Seconds a connection may sit with no request in flight and no traffic before it is closed.
    #[arg(long, default_value_t = 60)]
    pub idle_timeout: u64,
    /// Seconds in-flight requests get to finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub grace_period: u64,
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
    /// Seconds a request may take end to end; the engine ends it with an error past this (the
    /// deadline travels with the request to workers).
    #[arg(long, default_value_t = 600)]
    pub request_timeout: u64,
    /// Seconds to open a connection to a remote upstream.
    #[arg(long, default_value_t = 2)]
    pub upstream_connect_timeout: u64,
    /// Seconds a remote upstream has to send a request's first event (its first token); one that
    /// takes longer is skipped for the next.
    #[arg(long, default_value_t = 120)]
    pub upstream_first_event_timeout: u64,
    /// Seconds a remote upstream's stream may stay silent before the request fails.
    #[arg(long, default_value_t = 60)]
    pub upstream_idle_timeout: u64,
}

pub fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let key = a.engine.hash_key()?;
    let text = std::fs::read_to_string(&a.config)
        .with_context(|| format!("reading {}", a.config.display()))?;
    let in_config = || format!("in {}", a.config.display());
    let file = ConfigFile::parse(&text).with_context(in_config)?;
    let tenants = TenantRegistry::from_configs(file.tenant, &key, std::time::Instant::now())
        .with_context(in_config)?;
    // The pool: the config's [[upstream]]s, then each --worker; alone, the embedded engine.
    let mut members = file.upstream;
    members.extend(
        a.workers
            .iter()
            .map(|url| UpstreamConfig::Cachet { url: url.clone() }),
    );
    if members.is_empty() {
        members.push(UpstreamConfig::Embedded {});
    }
    let embedded = members
        .iter()
        .any(|m| matches!(m, UpstreamConfig::Embedded {}));
    let (engine, tokenizer, model_id) = if embedded {
        let s = a.engine.start(key)?;
        (Some(s.engine), s.tokenizer, s.model_id)
    } else {
        let (tokenizer, model_id) = a.engine.text_only()?;
        tracing::info!(model = %model_id, "remote upstreams only: no weights loaded");
        (None, tokenizer, model_id)
    };
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
                    ..Default::default()
                })?;
            let store = cachet_gateway::sandbox::store::TemplateStore::open(dir, sandbox)
                .with_context(|| format!("opening the templates directory {}", dir.display()))?;
            Some(Arc::new(store))
        }
        None => None,
    };
    let policy = cachet_gateway::route::by_name(&a.routing).map_err(anyhow::Error::msg)?;
    let timeouts = upstream::Timeouts {
        connect: Duration::from_secs(a.upstream_connect_timeout.max(1)),
        first_event: Duration::from_secs(a.upstream_first_event_timeout.max(1)),
        idle: Duration::from_secs(a.upstream_idle_timeout.max(1)),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let state = rt.block_on(async {
        let key_id = cachet_gateway::protocol::key_id(&key);
        let upstreams: Vec<Arc<dyn Upstream>> = members
            .iter()
            .map(|m| -> Arc<dyn Upstream> {
                match m {
                    UpstreamConfig::Embedded {} => {
                        Embedded::start(handle.clone().expect("started above"))
                    }
                    UpstreamConfig::Cachet { url } => {
                        Worker::start(url, a.worker_token.clone(), key_id.clone(), timeouts)
                    }
                    UpstreamConfig::Openai {
                        url,
                        model,
                        api_key_env,
                        history_blocks,
                    } => OpenAi::start(
                        url,
                        model.clone().unwrap_or_else(|| model_id.clone()),
                        api_key_env.as_ref().and_then(|v| std::env::var(v).ok()),
                        history_blocks.unwrap_or(1 << 16),
                        timeouts,
                    ),
                }
            })
            .collect();
        tracing::info!(upstreams = upstreams.len(), routing = %a.routing, "routing pool");
        let pool = upstream::Pool::new(
            upstreams,
            policy,
            HashContext::new(key, [0; 32], &model_id, a.engine.block_size),
        );
        Arc::new(AppState::new(
            Arc::new(pool),
            handle.clone(),
            tokenizer,
            model_id.clone(),
            max_model_len,
            Duration::from_secs(a.request_timeout.max(1)),
            tenants,
            templates,
        ))
    });
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        tracing::info!(addr = %listener.local_addr()?, "serving");
        let (tx, rx) = tokio::sync::watch::channel(false);
        {
            // SIGHUP re-reads the tenants config; a config that does not parse is refused and the
            // previous one stays.
            let (state, path) = (state.clone(), a.config.clone());
            tokio::spawn(async move {
                use tokio::signal::unix::{signal, SignalKind};
                let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
                while hup.recv().await.is_some() {
                    let loaded = std::fs::read_to_string(&path)
                        .map_err(|e| e.to_string())
                        .and_then(|t| TenantRegistry::from_toml(&t, &key, std::time::Instant::now()).map_err(|e| e.to_string()));
                    match loaded {
                        Ok(reg) => {
                            tracing::info!(tenants = reg.tenants().len(), "tenants config reloaded");
                            state.set_tenants(reg);
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
        let limits = cachet_gateway::http::serve::Limits {
            header_read_timeout: Duration::from_secs(a.header_read_timeout),
            max_header_bytes: a.max_header_bytes,
            max_connections: a.max_connections,
            idle_timeout: Duration::from_secs(a.idle_timeout),
            grace: Duration::from_secs(a.grace_period),
        };
        server::serve(listener, state, tls_config, rx, limits).await?;
        anyhow::Ok(())
    })?;
    drop(engine);
    tracing::info!("stopped");
    Ok(())
}
