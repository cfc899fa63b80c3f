//! Idle-connection timeout: a connection with no request in flight and no bytes moving for
//! `idle_timeout` is closed (HTTP/1: at once; HTTP/2: GOAWAY, then closed).
//!
//! [`Watched`] wraps the socket and stamps every read and write; [`InFlight`] counts requests from
//! the moment their head arrives until their response body is dropped (finished or abandoned),
//! so a long generation that is quiet while it waits for the engine is never cut.
//!
//! [`Activity`] also counts the requests a client cancels — leaves before their answer is whole
//! (an HTTP/2 RST_STREAM, or a dropped socket): a connection that cancels more than its limit
//! within one second is flooding (CVE-2023-44487, "rapid reset": each opened and reset stream
//! costs the server a request's work and the client nothing), and the accept loop closes it
//! ([`Activity::cancelling_too_fast`]). The same count is kept per client address across all
//! its connections ([`ClientCancels`]): a flood spread over many connections, each under its own
//! limit, trips its address's, and every connection of that address is closed.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use super::Body as RespBody;

/// Requests cancelled within the current second, against a limit.
struct CancelCount {
    start: Instant,
    limit: u32,
    /// The second (since `start`) being counted, and the requests cancelled in it.
    now: Mutex<(u64, u32)>,
}

impl CancelCount {
    fn new(limit: u32) -> Self {
        CancelCount {
            start: Instant::now(),
            limit,
            now: Mutex::new((0, 0)),
        }
    }

    /// Counts one; the count within this second.
    fn add(&self) -> u32 {
        let second = self.start.elapsed().as_secs();
        let mut c = self.now.lock().unwrap_or_else(|e| e.into_inner());
        if c.0 != second {
            *c = (second, 0);
        }
        c.1 += 1;
        c.1
    }
}

/// One client address's cancellations across all its connections: past the limit within a
/// second, every connection of the address is told to close (and so is each one it opens while
/// it keeps cancelling past the limit in that second).
pub struct ClientCancels {
    count: CancelCount,
    trips: tokio::sync::watch::Sender<u64>,
    /// When the address last went past its limit.
    tripped_at: Mutex<Option<Instant>>,
}

/// How long an address that went past its cancellation limit is refused new connections.
pub const CANCEL_COOLING: Duration = Duration::from_secs(1);

impl ClientCancels {
    pub fn new(cancels_per_second: u32) -> Arc<ClientCancels> {
        Arc::new(ClientCancels {
            count: CancelCount::new(cancels_per_second),
            trips: tokio::sync::watch::channel(0).0,
            tripped_at: Mutex::new(None),
        })
    }

    fn cancelled(&self) {
        if self.count.add() > self.count.limit {
            *self.tripped_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            self.trips.send_modify(|n| *n += 1);
        }
    }

    /// Whether the address went past its limit within [`CANCEL_COOLING`]: its new connections
    /// are refused meanwhile (a flood that reconnects at once would otherwise cost a TCP and
    /// HTTP/2 handshake per closed connection).
    pub fn cooling(&self) -> bool {
        self.tripped_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| t.elapsed() < CANCEL_COOLING)
    }

    /// The limit, for the log.
    pub fn limit(&self) -> u32 {
        self.count.limit
    }
}

/// What one connection is doing.
pub struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// Requests this connection's client cancelled, against its per-connection limit.
    cancels: CancelCount,
    too_many_cancels: Notify,
    /// The same, for every connection of the client's address.
    client: Option<Arc<ClientCancels>>,
}

/// Why a connection should close for its cancellations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelTrip {
    /// This connection cancelled past its own limit.
    Connection,
    /// Its address's connections together did.
    Client,
}

impl Activity {
    /// A connection's activity; more than `cancels_per_second` requests cancelled within one
    /// second trips [`Activity::cancelling_too_fast`], as do the client's `client` counts
    /// across its connections.
    pub fn new(cancels_per_second: u32, client: Option<Arc<ClientCancels>>) -> Arc<Activity> {
        Arc::new(Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            cancels: CancelCount::new(cancels_per_second),
            too_many_cancels: Notify::new(),
            client,
        })
    }

    /// Counts a request cancelled by the client.
    fn cancelled(&self) {
        if self.cancels.add() == self.cancels.limit.saturating_add(1) {
            // Stores a permit if no one waits yet: the trip is never missed.
            self.too_many_cancels.notify_one();
        }
        if let Some(c) = &self.client {
            c.cancelled();
        }
    }

    /// Resolves once this connection has cancelled more than its limit of requests within a
    /// second, or its address's connections together have (a trip after this is called).
    pub async fn cancelling_too_fast(&self) -> CancelTrip {
        let mut trips = self.client.as_ref().map(|c| c.trips.subscribe());
        tokio::select! {
            _ = self.too_many_cancels.notified() => CancelTrip::Connection,
            _ = async {
                match trips.as_mut() {
                    Some(t) => { let _ = t.changed().await; }
                    None => std::future::pending::<()>().await,
                }
            } => CancelTrip::Client,
        }
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long the connection has had no traffic.
    pub fn quiet_for(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }

    /// Resolves once the connection has had no request in flight and no traffic for `timeout`.
    pub async fn idle(&self, timeout: Duration) {
        loop {
            let quiet = self.quiet_for();
            let busy = self.busy();
            if !busy && quiet >= timeout {
                return;
            }
            let wait = if busy { timeout } else { timeout - quiet };
            tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
        }
    }

    /// Whether a request is in flight.
    pub fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Counts a request as in flight until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.touch();
        InFlight {
            activity: self.clone(),
            answered: AtomicBool::new(false),
        }
    }
}

/// A request in flight on its connection. Dropped before `InFlight::answered` (the request's
/// handler dropped, or its response body dropped before its end), the request counts as
/// cancelled by the client. A stream reset as soon as it is opened — the flood — is answered by
/// the handler, but its response is dropped unsent: cancelled too.
pub struct InFlight {
    activity: Arc<Activity>,
    answered: AtomicBool,
}

impl InFlight {
    /// The whole answer went out.
    fn answered(&self) {
        self.answered.store(true, Ordering::Relaxed);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.activity.touch();
        self.activity.in_flight.fetch_sub(1, Ordering::AcqRel);
        if !*self.answered.get_mut() {
            self.activity.cancelled();
        }
    }
}

/// A response body that keeps its request counted as in flight until it is dropped, marks it
/// answered when it reaches its end, and then writes its access line.
struct Guarded {
    inner: RespBody,
    guard: InFlight,
    line: Option<super::access::Line>,
    bytes: u64,
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(line) = &self.line {
            let complete = *self.guard.answered.get_mut() || self.inner.is_end_stream();
            line.log(self.bytes, complete);
        }
    }
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r {
            self.bytes += f.data_ref().map_or(0, |d| d.len() as u64);
        }
        if matches!(r, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.guard.answered();
        }
        r
    }
    fn is_end_stream(&self) -> bool {
        let end = self.inner.is_end_stream();
        if end {
            self.guard.answered();
        }
        end
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Ties `body` to the request's in-flight guard (and its access line, where it has one).
pub fn guard_body(body: RespBody, guard: InFlight, line: Option<super::access::Line>) -> RespBody {
    Guarded {
        inner: body,
        guard,
        line,
        bytes: 0,
    }
    .boxed()
}

/// A socket that stamps its connection's [`Activity`] on every read and write.
pub struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, activity: Arc<Activity>) -> Self {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
