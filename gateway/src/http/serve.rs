//! The accept loop both servers run (`cachet serve`'s API and `cachet worker`): HTTP/1.1 and
//! HTTP/2 on one port (optionally behind TLS), with connection limits — a deadline for a request
//! head, a cap on its size, a cap on connections served at once (more wait in the listen
//! backlog), idle connections closed — and graceful drain: on shutdown no new connections are
//! accepted and those in flight get `grace` to finish.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::watch;

use super::{idle, Body};

/// Connection-level limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A client must send a request's headers within this (slowloris).
    pub header_read_timeout: Duration,
    /// Largest request head (HTTP/1 buffer, HTTP/2 header list); larger gets 431.
    pub max_header_bytes: usize,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// A connection with no request in flight and no traffic for this long is closed.
    pub idle_timeout: Duration,
    /// How long connections in flight get to finish after shutdown.
    pub grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 32 << 10,
            max_connections: 4096,
            idle_timeout: Duration::from_secs(60),
            grace: Duration::from_secs(30),
        }
    }
}

/// Socket options of an accepted client connection. Streamed tokens are small writes: without
/// TCP_NODELAY, Nagle's algorithm holds one back until the client's (delayed, ~40 ms) ACK of the
/// previous write arrives; measured on the H200, every request whose first token came sooner saw
/// it at ~43 ms.
pub fn tune_accepted(stream: &tokio::net::TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set");
    }
}

/// Accepts connections on `listener` (through TLS when `tls` is given) and serves each request
/// with `handle` until `shutdown` turns true; then stops accepting and lets connections in
/// flight finish within `limits.grace`.
pub async fn serve<H, F>(
    listener: tokio::net::TcpListener,
    handle: H,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut shutdown: watch::Receiver<bool>,
    limits: Limits,
) -> std::io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let (conn_tx, mut conn_rx) = watch::channel(0usize);
    let active = Arc::new(AtomicUsize::new(0));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s.expect("semaphore never closed"),
            _ = shutdown.changed() => break,
        };
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer): (tokio::net::TcpStream, SocketAddr) = match accepted {
                    Ok(x) => x,
                    Err(e) => { tracing::warn!(error = %e, "accept failed"); continue; }
                };
                tune_accepted(&stream);
                let handle = handle.clone();
                let active = active.clone();
                let conn_tx = conn_tx.clone();
                let stop = shutdown.clone();
                let acceptor = acceptor.clone();
                active.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let _slot = slot;
                    connection(stream, peer, handle, acceptor, stop, limits).await;
                    let left = active.fetch_sub(1, Ordering::SeqCst) - 1;
                    let _ = conn_tx.send(left);
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    tracing::info!("draining: no new connections; waiting for requests in flight");
    let deadline = tokio::time::sleep(limits.grace);
    tokio::pin!(deadline);
    while active.load(Ordering::SeqCst) > 0 {
        tokio::select! {
            _ = conn_rx.changed() => {}
            _ = &mut deadline => { tracing::warn!("grace period over; closing the remaining connections"); break; }
        }
    }
    Ok(())
}

/// Serves one accepted connection to its end (or shutdown, or idleness).
async fn connection<H, F>(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    handle: H,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
    limits: Limits,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let activity = idle::Activity::new();
    let stream = idle::Watched::new(stream, activity.clone());
    let act = activity.clone();
    let svc = hyper::service::service_fn(move |req| {
        let guard = act.begin();
        let fut = handle(req);
        async move {
            let resp = fut.await;
            Ok::<_, Infallible>(resp.map(|b| idle::guard_body(b, guard)))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_bytes as u32);
    macro_rules! run {
        ($io:expr) => {{
            let conn = builder.serve_connection($io, svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => { if let Err(e) = r { tracing::debug!(%peer, error = %e, "connection ended with an error"); } }
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
                _ = activity.idle(limits.idle_timeout) => {
                    tracing::debug!(%peer, "closing an idle connection");
                    conn.as_mut().graceful_shutdown();
                    // A peer that never answers HTTP/2's shutdown PING must not hold the
                    // connection: with nothing in flight, drop it.
                    loop {
                        tokio::select! {
                            _ = conn.as_mut() => break,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                                if !activity.busy() { break; }
                            }
                        }
                    }
                }
            }
        }};
    }
    match acceptor {
        Some(acc) => {
            match tokio::time::timeout(Duration::from_secs(10), acc.accept(stream)).await {
                Ok(Ok(tls_stream)) => run!(TokioIo::new(tls_stream)),
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        }
        None => run!(TokioIo::new(stream)),
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn accepted_connections_send_small_writes_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        assert!(!stream.nodelay().unwrap(), "the OS default has Nagle on");
        super::tune_accepted(&stream);
        assert!(stream.nodelay().unwrap());
    }
}
