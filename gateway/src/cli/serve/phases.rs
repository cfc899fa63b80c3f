//! The phases of `cachet serve`'s start, in the order it runs them: the tenants (from the
//! config or the operator store), the pool's members, the usage store, the templates, the pool
//! itself; then what runs beside the server: config reloads, certificate reloads, the stop signal.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cachet_backend::block_hash::HashContext;
use cachet_backend::engine::EngineHandle;
use cachet_gateway::config::{ConfigFile, DiscoveryConfig, UpstreamConfig};
use cachet_gateway::http::tls;
use cachet_gateway::normalize::public::PublicPrefixes;
use cachet_gateway::operator::{Operator, Snapshot};
use cachet_gateway::sandbox::store::TemplateStore;
use cachet_gateway::server::operator::OperatorState;
use cachet_gateway::server::AppState;
use cachet_gateway::tenants::shared::SharedLimits;
use cachet_gateway::tenants::TenantRegistry;
use cachet_gateway::upstream::{
    self, embedded::Embedded, openai::OpenAi, worker::Worker, Upstream,
};
use cachet_gateway::usage::UsageLog;

use super::ServeArgs;

/// The tenants: with `[operator]` from its database (the file's imported on its first start),
/// else the file's; with the store's snapshot to follow and the operator's state.
#[allow(clippy::type_complexity)]
pub fn tenants(
    file: &ConfigFile,
    key: &[u8; 32],
) -> anyhow::Result<(TenantRegistry, Option<Snapshot>, Option<Arc<OperatorState>>)> {
    // Limits shared with other replicas through Redis, if the config says so (connected on
    // first use: a replica starts while Redis is down, and admits as `on_error` says).
    let shared_limits = match file.shared_limits.clone() {
        Some(cfg) => {
            tracing::info!(redis = %cfg.redis_url, replicas = cfg.replicas, on_error = ?cfg.on_error,
                "tenant limits shared through Redis");
            Some(SharedLimits::new(cfg)?)
        }
        None => None,
    };
    let Some(cfg) = file.operator.clone() else {
        let reg = TenantRegistry::with_shared_limits(
            file.tenant.clone(),
            key,
            std::time::Instant::now(),
            shared_limits,
        )?;
        return Ok((reg, None, None));
    };
    // The file's tenants are checked as they would load before any is imported.
    TenantRegistry::from_configs(file.tenant.clone(), key, std::time::Instant::now())?;
    let store = Operator::open(cfg)?;
    if store.bootstrap(&file.tenant)? {
        tracing::info!(
            tenants = file.tenant.len(),
            "operator store created: the config's tenants imported"
        );
    } else if !file.tenant.is_empty() {
        tracing::info!("tenants come from the operator store; the config's [[tenant]] tables were imported on its first start only");
    }
    let op = Arc::new(OperatorState {
        store,
        deployment_key: *key,
    });
    let snap = op.store.snapshot()?;
    let reg = TenantRegistry::from_store(
        snap.tenants.clone(),
        key,
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
    Ok((reg, Some(snap), Some(op)))
}

/// The pool's members: the config's `[[upstream]]`s, then each `--worker`; alone, the
/// embedded engine.
pub fn pool_members(
    a: &ServeArgs,
    mut members: Vec<UpstreamConfig>,
) -> anyhow::Result<Vec<UpstreamConfig>> {
    for url in &a.workers {
        cachet_gateway::config::check_upstream_url(url, a.worker_ca_file.as_deref())
            .context("--worker")?;
    }
    members.extend(a.workers.iter().map(|url| UpstreamConfig::Cachet {
        url: url.clone(),
        ca_file: a.worker_ca_file.clone(),
        dns: false,
        dns_refresh_secs: None,
    }));
    if members.is_empty() {
        members.push(UpstreamConfig::Embedded {});
    }
    Ok(members)
}

/// The usage store (`--usage-db`), or none (`off`, refused where a tenant has a budget).
/// `models`: each model's served names, its id (what records carry) first.
pub fn usage(
    url: &str,
    file: &ConfigFile,
    tenants: &TenantRegistry,
    models: &[Vec<String>],
) -> anyhow::Result<Option<Arc<UsageLog>>> {
    let budgeted = || {
        tenants
            .tenants()
            .iter()
            .find(|t| t.config.budget_usd.is_some())
    };
    if url == "off" {
        if let Some(t) = budgeted() {
            anyhow::bail!(
                "tenant `{}` has a budget, which needs usage records: give --usage-db (not off)",
                t.id()
            );
        }
        return Ok(None);
    }
    // A price may name any of a model's served names; records carry the first.
    let mut prices = file.price.clone();
    for served in models {
        let model_id = &served[0];
        if !prices.iter().any(|p| &p.model == model_id) {
            if let Some(p) = prices.iter().find(|p| served.contains(&p.model)) {
                let mut p = p.clone();
                p.model = model_id.clone();
                prices.push(p);
            }
        }
    }
    let log = UsageLog::open(url, prices).with_context(|| format!("--usage-db {url}"))?;
    for model_id in models.iter().map(|s| &s[0]) {
        if let Some(t) = budgeted().filter(|_| log.price(model_id).is_none()) {
            anyhow::bail!(
                "tenant `{}` has a budget, but the config prices no model `{model_id}`: add a [[price]] with model = \"{model_id}\"",
                t.id()
            );
        }
    }
    tracing::info!(store = %url.split('@').next_back().unwrap_or(url), "usage records");
    Ok(Some(Arc::new(log)))
}

/// The tenants' template store (`--templates-dir`), its sandbox within the `--template-*`
/// limits, compiling uploads in a child process it can stop at the deadline.
pub fn templates(a: &ServeArgs) -> anyhow::Result<Option<Arc<TemplateStore>>> {
    let Some(dir) = &a.templates_dir else {
        return Ok(None);
    };
    use cachet_gateway::sandbox::{CompileIn, Sandbox, SandboxConfig};
    let config = SandboxConfig {
        deadline: Duration::from_millis(a.template_deadline_ms.max(1)),
        fuel: a.template_fuel,
        memory_bytes: a.template_memory_mib << 20,
        output_bytes: a.template_output_kib << 10,
        module_bytes: a.template_module_mib << 20,
        instances: a.template_instances.max(1),
        cache_bytes: a.template_cache_mib << 20,
        max_functions: a.template_max_functions.max(1),
        compile_deadline: Duration::from_secs(a.template_compile_timeout.max(1)),
        compile_in: CompileIn::Process(
            std::env::current_exe().context("finding this program for template compiles")?,
        ),
        ..Default::default()
    };
    let quota = cachet_gateway::sandbox::store::Quota {
        versions: a.template_max_versions.max(1),
        bytes: a.template_storage_mib << 20,
    };
    tracing::info!(?config, ?quota, "template sandbox");
    let sandbox = Sandbox::new(config)?;
    let store = TemplateStore::open(dir, sandbox)
        .with_context(|| format!("opening the templates directory {}", dir.display()))?
        .with_quota(quota);
    Ok(Some(Arc::new(store)))
}

/// What the routing pool is made of.
pub struct Pool<'a> {
    pub args: &'a ServeArgs,
    pub key: [u8; 32],
    pub model_id: &'a str,
    /// The embedded engine, where the members name it.
    pub embedded: Option<EngineHandle>,
}

impl Pool<'_> {
    fn timeouts(&self) -> upstream::Timeouts {
        let a = self.args;
        upstream::Timeouts {
            connect: Duration::from_secs(a.upstream_connect_timeout.max(1)),
            response: Duration::from_secs(a.upstream_response_timeout.max(1)),
            first_event: Duration::from_secs(a.upstream_first_event_timeout.max(1)),
            idle: Duration::from_secs(a.upstream_idle_timeout.max(1)),
        }
    }

    /// A worker's HTTP client: TLS roots of its own where it names a CA file, and the gateway's
    /// certificate where the flags give one.
    fn worker_client(
        &self,
        ca: &Option<std::path::PathBuf>,
    ) -> anyhow::Result<cachet_gateway::http::client::Client> {
        let a = self.args;
        let identity = match (&a.worker_client_cert, &a.worker_client_key) {
            (Some(cert), Some(key)) => Some(cachet_gateway::http::client::ClientIdentity {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        };
        cachet_gateway::http::client::client_with_identity(
            self.timeouts().connect,
            ca.as_deref(),
            identity.as_ref(),
        )
        .context("--worker-client-cert / --worker-client-key")
    }

    /// One listed member, started.
    fn member(&self, m: &UpstreamConfig) -> anyhow::Result<Arc<dyn Upstream>> {
        let (a, timeouts) = (self.args, self.timeouts());
        let key_id = cachet_gateway::protocol::key_id(&self.key);
        Ok(match m {
            UpstreamConfig::Embedded {} => {
                Embedded::start(self.embedded.clone().expect("the embedded engine started"))
            }
            UpstreamConfig::Cachet { url, ca_file, .. } => Worker::start(
                url,
                a.worker_token.clone(),
                key_id,
                timeouts,
                self.worker_client(ca_file)?,
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
                    model: model.clone().unwrap_or_else(|| self.model_id.to_string()),
                    api_key: api_key_env.as_ref().and_then(|v| std::env::var(v).ok()),
                    history_blocks: history_blocks.unwrap_or(1 << 16),
                    send_cache_salt: cache_salt.unwrap_or(true),
                },
                timeouts,
                cachet_gateway::http::client::client_with_ca(timeouts.connect, ca_file.as_deref())?,
            ),
        })
    }

    /// The pool over `members` (inside the runtime): the listed ones started now, workers named
    /// by DNS joining as they are found.
    pub fn start(
        &self,
        members: &[UpstreamConfig],
        discovery: Option<&DiscoveryConfig>,
    ) -> anyhow::Result<Arc<upstream::Pool>> {
        let a = self.args;
        let (by_dns, listed): (Vec<&UpstreamConfig>, Vec<&UpstreamConfig>) = members
            .iter()
            .partition(|m| matches!(m, UpstreamConfig::Cachet { dns: true, .. }));
        let upstreams: Vec<Arc<dyn Upstream>> = listed
            .into_iter()
            .map(|m| self.member(m))
            .collect::<anyhow::Result<_>>()?;
        tracing::info!(upstreams = upstreams.len(), routing = %a.routing, "routing pool");
        let policy = cachet_gateway::route::by_name(&a.routing)?;
        let pool = Arc::new(upstream::Pool::new(
            upstreams,
            policy,
            HashContext::new(self.key, [0; 32], self.model_id, a.engine.block_size),
        ));
        if by_dns.is_empty() {
            return Ok(pool);
        }
        let resolver = upstream::discovery::resolver(discovery)?;
        let timeouts = self.timeouts();
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
            let name = upstream::discovery::DnsName::parse(url)?;
            let refresh = Duration::from_secs(dns_refresh_secs.unwrap_or(10));
            tracing::info!(host = %name.host, port = name.port, ?refresh, "workers found by DNS");
            let (token, key_id, client) = (
                a.worker_token.clone(),
                cachet_gateway::protocol::key_id(&self.key),
                self.worker_client(ca_file)?,
            );
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
        Ok(pool)
    }
}

/// SIGHUP re-reads the tenants config; a config that does not parse is refused and the previous
/// one stays. The tenants' live state (requests in flight, bucket levels) carries over.
pub fn reload_config_on_sighup(
    state: Arc<AppState>,
    path: std::path::PathBuf,
    key: [u8; 32],
    block_size: usize,
) {
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
        while hup.recv().await.is_some() {
            let previous = state.tenants();
            let loaded = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| ConfigFile::parse(&t).map_err(|e| e.to_string()))
                .and_then(|f| {
                    if f.shared_limits.as_ref() != previous.shared_limits().map(|s| &s.config) {
                        tracing::warn!("[shared_limits] changed: the Redis connection is made at start-up, so the change takes effect on restart");
                    }
                    // Each model's tokens of the public prefixes.
                    let prefixes = state
                        .models()
                        .into_iter()
                        .map(|m| {
                            PublicPrefixes::new(&f.public_prefix, &m.tokenizer, block_size)
                                .map(|p| (m, p))
                                .map_err(|e| cachet_gateway::error::with_causes(&e))
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    if state.operator.is_some() {
                        // Tenants come from the operator store; the file's public prefixes still
                        // reload.
                        return Ok((None, prefixes));
                    }
                    TenantRegistry::reloaded(
                        f.tenant,
                        &key,
                        std::time::Instant::now(),
                        Some(&previous),
                    )
                    .map(|reg| (Some(reg), prefixes))
                    .map_err(|e| e.to_string())
                });
            match loaded {
                Ok((reg, prefixes)) => {
                    tracing::info!(
                        tenants = reg.as_ref().map(|r| r.tenants().len()),
                        public_prefixes = prefixes[0].1.prefixes().len(),
                        "tenants config reloaded"
                    );
                    if let Some(reg) = reg {
                        state.set_tenants(reg);
                    }
                    for (m, p) in prefixes {
                        m.set_public_prefixes(p);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "tenants config reload refused; keeping the previous one")
                }
            }
        }
    });
}

/// The server's TLS config over `cert`, reloaded on file change (polled) and on SIGHUP.
pub fn reloading_tls(cert: Arc<tls::ReloadingCert>) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let watched = cert.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tokio::select! {
                _ = hup.recv() => watched.reload(true),
                _ = tick.tick() => watched.reload(false),
            }
        }
    });
    Ok(tls::server_config(cert)?)
}

/// Turns true on SIGTERM or SIGINT: the server drains.
pub fn stop_on_signal() -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("shutdown signal: draining");
        let _ = tx.send(true);
    });
    rx
}

/// The sampling defaults the model's generation_config.json gives, where it gives any.
pub fn say_sampling_defaults(generation: &cachet_backend::loader::generation::GenerationConfig) {
    if generation.has_sampling() {
        tracing::info!(
            temperature = ?generation.temperature,
            top_p = ?generation.top_p,
            top_k = ?generation.top_k,
            min_p = ?generation.min_p,
            repetition_penalty = ?generation.repetition_penalty,
            "sampling defaults from the model's generation_config.json (a request's own values win)"
        );
    }
}

/// The gateway's own settings in force (the flag walk reads them here).
pub fn say_settings(a: &ServeArgs) {
    tracing::info!(
        request_timeout_s = a.request_timeout.max(1),
        unknown_fields = ?a.unknown_fields,
        routing = %a.routing,
        upstream_timeouts_s = ?[a.upstream_connect_timeout, a.upstream_response_timeout,
            a.upstream_first_event_timeout, a.upstream_idle_timeout],
        templates = a.templates_dir.is_some(),
        "gateway settings"
    );
}
