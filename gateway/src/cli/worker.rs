//! `cachet worker`: the engine alone behind an HTTP API, for a gateway in front of many.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use cachet_gateway::worker::{self, KvTracker, WorkerState};
use clap::Args;

#[derive(Args, Debug)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub engine: super::engine_args::EngineArgs,
    /// Address to listen on (plain HTTP/1.1 and HTTP/2; put it on a private network).
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub listen: SocketAddr,
    /// Bearer token the gateway must send (`CACHET_WORKER_TOKEN`); none: no check.
    #[arg(long, env = "CACHET_WORKER_TOKEN")]
    pub auth_token: Option<String>,
    /// Serve over TLS with this certificate chain (PEM; reloaded when the file changes). The
    /// gateway reaches the worker at an https:// URL and verifies it (its --worker-ca-file).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: every client must present a certificate signed by this CA (PEM) — the
    /// gateway's --worker-client-cert. Counts as authentication for a worker off loopback.
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    #[command(flatten)]
    pub conn: super::connection_args::ConnectionArgs,
    #[command(flatten)]
    pub otlp: super::serve::OtlpArgs,
}

pub fn worker(a: WorkerArgs, given: &super::flags::Given) -> anyhow::Result<()> {
    super::flags::device_flags(given, a.engine.device)?;
    super::flags::otlp_flags(given, a.otlp.otlp_endpoint.is_some())?;
    // Anyone who reaches a worker can run the engine with any tenant's salt and read its KV
    // events: off loopback it needs a token.
    if !a.listen.ip().is_loopback() && a.auth_token.is_none() && a.tls_client_ca.is_none() {
        anyhow::bail!(
            "--listen {} is reachable from other machines: set --auth-token (or CACHET_WORKER_TOKEN) and give the gateway the same --worker-token, or require client certificates (--tls-client-ca)",
            a.listen
        );
    }
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => {
            let cert = cachet_gateway::http::tls::ReloadingCert::new(c, k)?;
            let cfg = cachet_gateway::http::tls::server_config_with_clients(
                cert.clone(),
                a.tls_client_ca.as_deref(),
            )?;
            Some((cert, cfg))
        }
        _ => None,
    };
    let key = a.engine.hash_key()?;
    if a.engine.hash_key_file.is_none() {
        tracing::warn!("no --hash-key-file: this worker's block hashes match no gateway's; exact prefix routing needs the gateway's key");
    }
    let traces = a.otlp.tracing("cachet-worker")?.map(Arc::new);
    let started = a.engine.start(key)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let lanes = a.conn.lanes()?;
    let (handle, model_id) = (started.engine.handle(), started.model_id.clone());
    rt.block_on(async move {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let state = Arc::new(WorkerState {
            tracker: KvTracker::follow(&handle),
            engine: handle,
            model_id: model_id.clone(),
            key_id: worker::key_id(&key),
            auth_token: a.auth_token.clone(),
            closing: rx.clone(),
            tracing: traces.clone(),
        });
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        tracing::info!(addr = %listener.local_addr()?, model = %model_id, key_id = %state.key_id, "worker serving");
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            tracing::info!("draining");
            let _ = tx.send(true);
        });
        let tls = tls.map(|(cert, cfg)| {
            // The certificate follows its files (a renewed one is picked up within seconds).
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
                loop {
                    tick.tick().await;
                    cert.reload(false);
                }
            });
            cfg
        });
        worker::serve(listener, state, tls, rx, a.conn.limits(), lanes).await?;
        if let Some(t) = traces {
            tokio::task::spawn_blocking(move || t.shutdown()).await?;
        }
        anyhow::Ok(())
    })?;
    drop(started);
    tracing::info!("stopped");
    Ok(())
}
