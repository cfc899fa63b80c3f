//! The accept loop both servers run (`cachet serve`'s API and `cachet worker`): HTTP/1.1 and
//! HTTP/2 on one port (optionally behind TLS), with the limits an open port needs (after nginx,
//! Envoy and pingora):
//!
//! - a deadline for a request head, a cap on its size;
//! - body read timeouts — between two chunks and in all — applied by [`super::read_body`] from
//!   the request's extensions ([`BodyTimeouts`]), so a stalled or trickling body ends in 408;
//! - connections served at once: globally, and per client IP (more from one IP get a 429 with
//!   Retry-After and are closed — plain HTTP; over TLS they are closed at once, no handshake
//!   spent on them); when the global cap is reached, idle connections (no request in flight) are closed,
//!   longest-idle first, to make room, so `/health` and real clients get in while thousands of
//!   idle sockets are held open;
//! - idle keep-alive connections closed; HTTP/2 with a cap on concurrent streams and h2's
//!   rapid-reset limits, and a connection that cancels more requests in a second than
//!   `max_cancels_per_second` (a rapid-reset flood, which h2's own limits let through once
//!   each stream is accepted) closed with GOAWAY;
//! - the connection cap fitted to the open-file limit ([`connections_that_fit`]), so a flood
//!   meets the cap (where idle connections are shed) before it meets EMFILE; accept errors
//!   (EMFILE, ENFILE, …) shed idle connections too, back off instead of spinning, and are logged
//!   at most once a second with a count of the ones not logged;
//! - graceful drain: on shutdown no new connections are accepted and those in flight get
//!   `grace` to finish.
//!
//! With [`Lanes`], each accepted connection is served start to end on one lane's thread
//! (thread-per-core); without, on the calling runtime's workers.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::{watch, Notify};

use super::lanes::Lanes;
use super::{idle, Body};

/// Connection-level limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A client must send a request's headers within this (slowloris).
    pub header_read_timeout: Duration,
    /// Largest request head (HTTP/1 buffer, HTTP/2 header list); larger gets 431.
    pub max_header_bytes: usize,
    /// A request body may pause this long between two chunks, and take this long in all.
    pub body: BodyTimeouts,
    /// Connections served at once; at the cap, idle ones are closed to make room.
    pub max_connections: usize,
    /// Connections served at once from one client IP; more get a 429 (plain HTTP) and are
    /// closed.
    pub max_connections_per_ip: usize,
    /// HTTP/2 streams open at once on one connection.
    pub max_concurrent_streams: u32,
    /// Requests one connection may cancel (HTTP/2 RST_STREAM) before their answer within one
    /// second; past it the connection is closed.
    pub max_cancels_per_second: u32,
    /// The same across all connections of one client address; past it every connection of
    /// the address is closed.
    pub max_cancels_per_client: u32,
    /// A connection with no request in flight and no traffic for this long is closed.
    pub idle_timeout: Duration,
    /// How long connections in flight get to finish after shutdown.
    pub grace: Duration,
}

/// The client's address, in every request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

/// Time limits on reading a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTimeouts {
    /// Longest pause between two chunks.
    pub chunk: Duration,
    /// Longest time to read the whole body.
    pub total: Duration,
}

impl Default for BodyTimeouts {
    fn default() -> Self {
        BodyTimeouts {
            chunk: Duration::from_secs(10),
            total: Duration::from_secs(60),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 32 << 10,
            body: BodyTimeouts::default(),
            max_connections: 4096,
            max_connections_per_ip: 256,
            max_concurrent_streams: 128,
            max_cancels_per_second: 200,
            max_cancels_per_client: 400,
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

/// One live connection: its activity, and a way to ask it to close if it is idle.
type Live = (Arc<idle::Activity>, Arc<Notify>);

/// The live connections: per client IP, and each one's activity with a way to ask it to close
/// if it is idle.
#[derive(Default)]
struct Connections {
    next: AtomicU64,
    live: Mutex<HashMap<u64, Live>>,
    /// Each client address's connections, and its cancellations across them.
    per_ip: Mutex<HashMap<IpAddr, (usize, Arc<idle::ClientCancels>)>>,
}

/// Why a connection was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Its address holds its cap of connections.
    OverCap,
    /// Its address went past its cancellation limit less than a second ago.
    Cancelling,
}

/// A connection's place in [`Connections`]; dropping it gives the place back.
struct Registered {
    id: u64,
    ip: IpAddr,
    conns: Arc<Connections>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.conns
            .live
            .lock()
            .expect("connections lock")
            .remove(&self.id);
        let mut per_ip = self.conns.per_ip.lock().expect("connections lock");
        if let Some((n, client)) = per_ip.get_mut(&self.ip) {
            *n -= 1;
            // An address cooling off after a cancellation flood is remembered until it cools.
            if *n == 0 && !client.cooling() {
                per_ip.remove(&self.ip);
            }
        }
    }
}

impl Connections {
    /// Registers a connection from `ip`, unless that IP already has `cap` of them; its
    /// activity counts cancellations against `limits` (per connection, and with the address's
    /// other connections).
    fn register(
        self: &Arc<Self>,
        ip: IpAddr,
        limits: &Limits,
        shed: Arc<Notify>,
    ) -> Result<(Registered, Arc<idle::Activity>), Refusal> {
        let client = {
            let mut per_ip = self.per_ip.lock().expect("connections lock");
            // Addresses remembered only for cooling off leave once cooled (swept as the map
            // doubles, so the sweep costs O(1) a registration).
            if per_ip.len() >= 1024 && per_ip.len().is_power_of_two() {
                per_ip.retain(|_, (n, c)| *n > 0 || c.cooling());
            }
            let (n, client) = per_ip
                .entry(ip)
                .or_insert_with(|| (0, idle::ClientCancels::new(limits.max_cancels_per_client)));
            if client.cooling() {
                return Err(Refusal::Cancelling);
            }
            if *n >= limits.max_connections_per_ip.max(1) {
                return Err(Refusal::OverCap);
            }
            *n += 1;
            client.clone()
        };
        let activity = idle::Activity::new(limits.max_cancels_per_second, Some(client));
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.live
            .lock()
            .expect("connections lock")
            .insert(id, (activity.clone(), shed));
        Ok((
            Registered {
                id,
                ip,
                conns: self.clone(),
            },
            activity,
        ))
    }

    /// Asks up to `n` idle connections (no request in flight), longest idle first, to close.
    /// Returns how many were asked.
    fn shed_idle(&self, n: usize) -> usize {
        let live = self.live.lock().expect("connections lock");
        let mut idle: Vec<(Duration, &Arc<Notify>)> = live
            .values()
            .filter(|(a, _)| !a.busy())
            .map(|(a, s)| (a.quiet_for(), s))
            .collect();
        idle.sort_by_key(|&(quiet, _)| std::cmp::Reverse(quiet));
        for (_, s) in idle.iter().take(n) {
            s.notify_one();
        }
        idle.len().min(n)
    }
}

/// Open files kept back from connections: model files, upstream sockets, the template store,
/// logs.
const RESERVED_FILES: u64 = 64;

/// Raises this process's soft limit on open files to its hard limit (as Go's runtime does), and
/// returns how many connections fit in it with `RESERVED_FILES` kept back (`None` where the
/// limit cannot be read). A connection cap above it turns a flood into EMFILE at `accept`.
pub fn connections_that_fit() -> Option<usize> {
    #[cfg(unix)]
    {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit read or write the one struct passed, which lives here.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
            return None;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            // SAFETY: as above. (Linux refuses more than fs.nr_open; then the soft limit stays.)
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
        let files = r.rlim_cur.saturating_sub(RESERVED_FILES).max(16);
        Some(usize::try_from(files).unwrap_or(usize::MAX))
    }
    #[cfg(not(unix))]
    None
}

/// A warning that is logged at most once a second, with the count of those it held back.
struct EverySecond {
    last: Option<Instant>,
    suppressed: u64,
}

impl EverySecond {
    const fn new() -> Self {
        EverySecond {
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(held back since the last line)` when a line is due now, else `None` (counted).
    fn due(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            self.last = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

/// Accept errors: logged at most once a second, and a back-off before accepting again.
struct AcceptErrors {
    log: EverySecond,
    backoff: Duration,
}

impl AcceptErrors {
    fn new() -> Self {
        AcceptErrors {
            log: EverySecond::new(),
            backoff: Duration::from_millis(10),
        }
    }

    /// Records an error; how long to wait before accepting again (doubling up to 1 s).
    fn failed(&mut self, e: &std::io::Error) -> Duration {
        if let Some(not_logged) = self.log.due() {
            tracing::warn!(error = %e, not_logged, "accept failed; backing off");
        }
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(Duration::from_secs(1));
        wait
    }

    fn accepted(&mut self) {
        self.backoff = Duration::from_millis(10);
    }
}

/// Accepts connections on `listener` (through TLS when `tls` is given) and serves each request
/// with `handle` — on `lanes` where given, else on this runtime — until `shutdown` turns true;
/// then stops accepting and lets connections in flight finish within `limits.grace`.
pub async fn serve<H, F>(
    listener: tokio::net::TcpListener,
    handle: H,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut shutdown: watch::Receiver<bool>,
    limits: Limits,
    lanes: Option<Arc<Lanes>>,
) -> std::io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    tracing::info!(?limits, "connection limits");
    let (conn_tx, mut conn_rx) = watch::channel(0usize);
    let active = Arc::new(AtomicUsize::new(0));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let conns = Arc::new(Connections::default());
    let mut errors = AcceptErrors::new();
    let mut refused_ip = EverySecond::new();
    // Refusals being answered at once (each a second at most); past it, closed unanswered.
    let replies = Arc::new(tokio::sync::Semaphore::new(REFUSAL_REPLIES));
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(s) => s,
            Err(_) => {
                // Full: make room by closing idle connections, then wait for a slot.
                conns.shed_idle(limits.max_connections.div_ceil(64).max(1));
                tokio::select! {
                    s = slots.clone().acquire_owned() => s.expect("semaphore never closed"),
                    _ = shutdown.changed() => break,
                }
            }
        };
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer): (tokio::net::TcpStream, SocketAddr) = match accepted {
                    Ok(x) => { errors.accepted(); x }
                    Err(e) => {
                        // Out of file descriptors: idle connections give theirs back.
                        if matches!(e.raw_os_error(), Some(23 | 24)) {
                            conns.shed_idle(limits.max_connections.div_ceil(64).max(1));
                        }
                        let wait = errors.failed(&e);
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                };
                let shed = Arc::new(Notify::new());
                let (place, activity) = match conns.register(peer.ip(), &limits, shed.clone()) {
                    Ok(x) => x,
                    Err(why) => {
                        if let Some(not_logged) = refused_ip.due() {
                            tracing::warn!(ip = %peer.ip(), ?why, cap = limits.max_connections_per_ip, not_logged, "connection refused");
                        }
                        // A plain-HTTP client learns why; the reply holds no connection slot.
                        if let (None, Ok(turn)) = (&acceptor, replies.clone().try_acquire_owned()) {
                            let message = refusal_message(why, &limits);
                            tokio::spawn(async move {
                                refuse_connection(stream, message).await;
                                drop(turn);
                            });
                        }
                        continue;
                    }
                };
                tune_accepted(&stream);
                let handle = handle.clone();
                let stop = shutdown.clone();
                let acceptor = acceptor.clone();
                // Counted until the connection ends, or its future is dropped unrun.
                let live = InFlight::enter(&active, &conn_tx);
                let serve = move |stream| async move {
                    let _held = (slot, place, live);
                    let cx = ConnContext {
                        peer,
                        acceptor,
                        stop,
                        limits,
                        activity,
                        shed,
                    };
                    connection(stream, handle, cx).await;
                };
                match &lanes {
                    Some(l) => l.spawn_connection(stream, serve),
                    None => { tokio::spawn(serve(stream)); }
                }
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

/// Refused connections answered at once ([`refuse_connection`]); more are closed
/// unanswered, so a flood from one address costs at most this many small tasks.
const REFUSAL_REPLIES: usize = 64;

/// What a refused connection is told: its code and why.
fn refusal_message(why: Refusal, limits: &Limits) -> (&'static str, String) {
    match why {
        Refusal::OverCap => (
            "too_many_connections",
            format!(
                "this client address already holds {} connections, the server's cap \
                 (--max-connections-per-ip): reuse connections (keep-alive) or open fewer at once",
                limits.max_connections_per_ip
            ),
        ),
        Refusal::Cancelling => (
            "too_many_cancellations",
            format!(
                "this client address cancelled more than {} requests within a second \
                 (--max-cancels-per-client); its new connections are refused for a second",
                limits.max_cancels_per_client
            ),
        ),
    }
}

/// The reply to a refused plain-HTTP connection: 429 with `Retry-After` and the API's error
/// body saying why and what to do, then the close — within a second. What the client sends
/// meanwhile is read off until it closes (a request arriving after the close would reset the
/// connection before the client reads the 429).
async fn refuse_connection(
    mut stream: tokio::net::TcpStream,
    (code, message): (&'static str, String),
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let e = super::error::ApiError {
        status: hyper::StatusCode::TOO_MANY_REQUESTS,
        kind: "rate_limit_error",
        code: Some(code),
        message,
        param: None,
        retry_after: Some(Duration::from_secs(1)),
        source: super::error::Source::Client,
        headers: Box::default(),
    };
    let body = e.body().to_string();
    let reply = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(reply.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// A connection counted as in flight (the drain waits for these); leaving sends the new count.
struct InFlight {
    active: Arc<AtomicUsize>,
    changed: watch::Sender<usize>,
}

impl InFlight {
    fn enter(active: &Arc<AtomicUsize>, changed: &watch::Sender<usize>) -> Self {
        active.fetch_add(1, Ordering::SeqCst);
        InFlight {
            active: active.clone(),
            changed: changed.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let left = self.active.fetch_sub(1, Ordering::SeqCst) - 1;
        let _ = self.changed.send(left);
    }
}

/// Logs a connection closed for cancelling too fast — at most once a second, with the number of
/// others closed since (a client that reconnects and floods again must not flood the log).
fn flood_warning(peer: SocketAddr, trip: idle::CancelTrip, limits: &Limits) {
    static LOG: Mutex<EverySecond> = Mutex::new(EverySecond::new());
    let due = LOG.lock().unwrap_or_else(|e| e.into_inner()).due();
    if let Some(others) = due {
        let (limit, who, flag) = match trip {
            idle::CancelTrip::Connection => (
                limits.max_cancels_per_second,
                "this connection",
                "--http2-max-cancels-per-second",
            ),
            idle::CancelTrip::Client => (
                limits.max_cancels_per_client,
                "this client address's connections together",
                "--max-cancels-per-client",
            ),
        };
        tracing::warn!(
            %peer,
            limit,
            others_closed_since_last_warning = others,
            "closed a connection: {who} cancelled more than {limit} requests within a second \
             (a rapid-reset or cancellation flood); {flag} sets the limit"
        );
    }
}

/// What one accepted connection is served with: where it came from, the server's TLS, limits
/// and shutdown signal, its activity, and the signal that asks it to make room.
struct ConnContext {
    peer: SocketAddr,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    stop: watch::Receiver<bool>,
    limits: Limits,
    activity: Arc<idle::Activity>,
    shed: Arc<Notify>,
}

/// Serves one accepted connection to its end (or shutdown, idleness, or a request to make room).
async fn connection<H, F>(stream: tokio::net::TcpStream, handle: H, cx: ConnContext)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let ConnContext {
        peer,
        acceptor,
        mut stop,
        limits,
        activity,
        shed,
    } = cx;
    let stream = idle::Watched::new(stream, activity.clone());
    let act = activity.clone();
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let guard = act.begin();
        req.extensions_mut().insert(limits.body);
        req.extensions_mut().insert(Peer(peer));
        let line = super::access::Line::begin(&mut req, peer);
        // Boxed: the handler's future is kilobytes (every route's state machine), and hyper
        // moves what `call` returns into its dispatcher; a box moves as a pointer.
        let fut = Box::pin(handle(req));
        async move { Ok::<_, Infallible>(line.finish(fut.await, guard)) }
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
        .max_header_list_size(limits.max_header_bytes as u32)
        .max_concurrent_streams(limits.max_concurrent_streams)
        // h2's rapid-reset limits (CVE-2023-44487), set rather than trusted to defaults.
        .max_pending_accept_reset_streams(20)
        .max_local_error_reset_streams(256);
    macro_rules! run {
        ($io:expr) => {{
            let conn = builder.serve_connection($io, svc);
            tokio::pin!(conn);
            let close_when_idle = async {
                tokio::select! {
                    _ = activity.idle(limits.idle_timeout) => "idle",
                    _ = async { loop { shed.notified().await; if !activity.busy() { break; } } } => "shed to make room",
                }
            };
            tokio::select! {
                r = conn.as_mut() => { if let Err(e) = r { tracing::debug!(%peer, error = %e, "connection ended with an error"); } }
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
                trip = activity.cancelling_too_fast() => {
                    flood_warning(peer, trip, &limits);
                    // GOAWAY, a moment for it to leave, and the connection is gone (with the
                    // flood's streams still in flight).
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_millis(200), conn.as_mut()).await;
                }
                why = close_when_idle => {
                    tracing::debug!(%peer, why, "closing a connection");
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
            match tokio::time::timeout(limits.header_read_timeout, acc.accept(stream)).await {
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
    use super::*;

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

    #[test]
    fn an_ip_gets_its_cap_of_connections_and_idle_ones_are_shed_longest_idle_first() {
        let conns = Arc::new(Connections::default());
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let limits = Limits {
            max_connections_per_ip: 2,
            ..Default::default()
        };
        let reg = |ip| {
            let n = Arc::new(Notify::new());
            conns
                .register(ip, &limits, n.clone())
                .map(|(r, a)| (r, a, n))
        };
        let first = reg(ip).unwrap();
        let second = reg(ip).unwrap();
        assert_eq!(
            reg(ip).err(),
            Some(Refusal::OverCap),
            "a third from one IP is refused"
        );
        let _third_elsewhere = reg(other).unwrap();
        drop(first);
        let again = reg(ip).unwrap();
        // A connection with a request in flight is never shed.
        let _busy = again.1.begin();
        assert_eq!(conns.shed_idle(10), 2, "the two idle ones");
        drop(second);
        assert_eq!(conns.shed_idle(10), 1);
    }

    /// Connections of one address each under their own limit trip the address's together,
    /// and every one of them is told; another address's are not.
    #[tokio::test]
    async fn an_address_trips_when_its_connections_together_cancel_past_its_limit() {
        let conns = Arc::new(Connections::default());
        let limits = Limits {
            max_cancels_per_second: 10,
            max_cancels_per_client: 12,
            ..Default::default()
        };
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let mut of_ip: Vec<_> = (0..4)
            .map(|_| {
                conns
                    .register(ip, &limits, Arc::new(Notify::new()))
                    .unwrap()
            })
            .collect();
        let bystander = conns
            .register(other, &limits, Arc::new(Notify::new()))
            .unwrap();
        let waits: Vec<_> = of_ip
            .iter()
            .chain([&bystander])
            .map(|(_, a)| {
                let a = a.clone();
                tokio::spawn(async move {
                    tokio::time::timeout(Duration::from_millis(200), a.cancelling_too_fast())
                        .await
                        .ok()
                })
            })
            .collect();
        tokio::task::yield_now().await;
        // Four cancels on each of four connections: 16 > 12, no connection past its 10.
        for (_, a) in &of_ip {
            for _ in 0..4 {
                drop(a.begin());
            }
        }
        let mut got = Vec::new();
        for w in waits {
            got.push(w.await.unwrap());
        }
        assert_eq!(got[..4], [Some(idle::CancelTrip::Client); 4]);
        assert_eq!(got[4], None, "another address is left alone");
        // Cooling off: the address's new connections are refused for a second, others' not.
        assert_eq!(
            conns.register(ip, &limits, Arc::new(Notify::new())).err(),
            Some(Refusal::Cancelling)
        );
        of_ip.clear();
        assert!(conns
            .register(other, &limits, Arc::new(Notify::new()))
            .is_ok());
    }

    #[tokio::test]
    async fn a_connection_trips_when_it_cancels_past_its_limit_within_a_second() {
        let a = idle::Activity::new(3, None);
        let trip = |a: &Arc<idle::Activity>| {
            let a = a.clone();
            async move {
                tokio::time::timeout(Duration::from_millis(50), a.cancelling_too_fast())
                    .await
                    .is_ok()
            }
        };
        // Requests answered to the end of their bodies are not cancellations.
        for _ in 0..10 {
            let resp = super::super::json(hyper::StatusCode::OK, &serde_json::json!({}));
            let mut body = idle::guard_body(resp.into_body(), a.begin(), None);
            while http_body_util::BodyExt::frame(&mut body).await.is_some() {}
        }
        // Cancelled: a handler dropped before its answer, and answers dropped unread.
        drop(a.begin());
        for _ in 0..2 {
            let resp = super::super::json(hyper::StatusCode::OK, &serde_json::json!({}));
            drop(idle::guard_body(resp.into_body(), a.begin(), None));
        }
        assert!(
            !trip(&a).await,
            "three cancelled: at the limit, not past it"
        );
        drop(a.begin());
        assert!(trip(&a).await, "the fourth within the second trips it");
    }

    #[test]
    fn accept_errors_back_off_and_log_at_most_once_a_second() {
        let mut e = AcceptErrors::new();
        let err = std::io::Error::from_raw_os_error(24); // EMFILE
        let waits: Vec<Duration> = (0..9).map(|_| e.failed(&err)).collect();
        assert_eq!(waits[0], Duration::from_millis(10));
        assert_eq!(waits[1], Duration::from_millis(20));
        assert_eq!(waits[8], Duration::from_secs(1));
        assert_eq!(
            e.log.suppressed, 8,
            "one line for nine errors within a second"
        );
        e.accepted();
        assert_eq!(e.failed(&err), Duration::from_millis(10));
    }
}
