//! The client the gateway reaches its upstreams with: HTTP/1.1 over plain TCP or TLS (rustls,
//! the system's roots plus an optional CA file — `https://` upstreams), TCP_NODELAY (a streamed
//! token must not wait for Nagle's algorithm), a connect timeout, idle connections kept 30 s; the
//! line reader for NDJSON and SSE response bodies; typed errors for all of it.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::StatusCode;

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;
type Pooled = hyper_util::client::legacy::Client<Connector, Full<Bytes>>;

/// The last read or write error any of a client's connections met, and when. A TLS server that
/// refuses the client (no client certificate, mutual TLS) says so in an alert after the
/// handshake; when that alert is read before the first request is sent, hyper's pool reports
/// only "connection was not ready" and drops the cause. [`send`] adds it back.
#[derive(Default)]
struct LastError(Mutex<Option<(Instant, String)>>);

impl LastError {
    fn note(&self, e: &std::io::Error) {
        let text = error_chain(e);
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), text));
    }

    /// The error noted within `window`, if any.
    fn recent(&self, window: Duration) -> Option<String> {
        let last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref()
            .filter(|(at, _)| at.elapsed() <= window)
            .map(|(_, text)| text.clone())
    }
}

/// A connection's stream that notes its read and write errors in its client's [`LastError`].
struct Noted<S> {
    inner: S,
    last: Arc<LastError>,
}

impl<S> Noted<S> {
    fn check<T>(&self, r: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if let Poll::Ready(Err(e)) = &r {
            self.last.note(e);
        }
        r
    }
}

impl<S: hyper::rt::Read + Unpin> hyper::rt::Read for Noted<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.check(r)
    }
}

impl<S: hyper::rt::Write + Unpin> hyper::rt::Write for Noted<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.check(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.check(r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check(r)
    }
}

impl<S: hyper_util::client::legacy::connect::Connection>
    hyper_util::client::legacy::connect::Connection for Noted<S>
{
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.inner.connected()
    }
}

/// The HTTP(S) connector, its connections' errors noted.
#[derive(Clone)]
struct Connector {
    inner: Https,
    last: Arc<LastError>,
}

type Stream = hyper_rustls::MaybeHttpsStream<hyper_util::rt::TokioIo<tokio::net::TcpStream>>;
type ConnectError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<hyper::Uri> for Connector {
    type Response = Noted<Stream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Noted<Stream>, ConnectError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: hyper::Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let last = self.last.clone();
        Box::pin(async move {
            Ok(Noted {
                inner: connecting.await?,
                last,
            })
        })
    }
}

/// A client for one upstream (or a set of them): HTTP/1.1 connections kept in a pool — one pool
/// per serving lane ([`super::lanes`]), so a connection opened by a lane's thread is only used
/// there and a request never waits on another thread's connection task; one shared pool for
/// everything else (health checks, background tasks, processes without lanes). Cheap to clone:
/// the clones share the pools.
#[derive(Clone)]
pub struct Client {
    shared: Pooled,
    /// A pool per lane, made on the lane's first request.
    per_lane: Arc<[OnceLock<Pooled>]>,
    connector: Connector,
}

impl Client {
    fn new(connector: Connector) -> Self {
        Client {
            shared: pooled(connector.clone()),
            per_lane: (0..super::lanes::started())
                .map(|_| OnceLock::new())
                .collect(),
            connector,
        }
    }

    /// Sends `req` through the pool of the lane this runs on (the shared one elsewhere).
    pub fn request(
        &self,
        req: hyper::Request<Full<Bytes>>,
    ) -> hyper_util::client::legacy::ResponseFuture {
        match super::lanes::current().and_then(|i| self.per_lane.get(i)) {
            Some(slot) => slot
                .get_or_init(|| pooled(self.connector.clone()))
                .request(req),
            None => self.shared.request(req),
        }
    }
}

/// A pool of connections made with `connector`: idle ones kept 30 s; their tasks run on the
/// runtime of the thread that opens them.
fn pooled(connector: Connector) -> Pooled {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// What went wrong talking to an upstream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("connecting or sending failed: {0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("answered {status}: {body}")]
    Status { status: StatusCode, body: String },
    #[error("reading the response failed: {0}")]
    Body(String),
    #[error("sent something that is not what the protocol says: {0}")]
    Protocol(String),
}

/// The system's trusted roots (read once; a certificate the store cannot parse is skipped).
pub fn system_roots() -> &'static [rustls_pki_types::CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<rustls_pki_types::CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "reading the system's TLS roots");
        }
        found.certs
    })
}

/// The PEM certificates of a CA file, each a root to trust (an upstream's own CA); an error
/// that names the file and what is wrong with it.
pub fn read_ca_file(
    path: &Path,
) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, PemError> {
    use rustls_pki_types::pem::PemObject;
    let certs: Vec<_> = rustls_pki_types::CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|source| PemError::Read {
            path: path.into(),
            source,
        })?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate(path.into()));
    }
    Ok(certs)
}

/// A PEM file that gave no certificate (or key).
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("{}", path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("{}: no CERTIFICATE in the file", .0.display())]
    NoCertificate(std::path::PathBuf),
}

/// What kept an outbound client's TLS from being set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientTlsError {
    #[error(transparent)]
    Pem(#[from] PemError),
    #[error("{}", path.display())]
    Refused {
        path: std::path::PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("TLS protocol versions")]
    Protocols(#[source] rustls::Error),
}

/// A client with `connect_timeout` for new connections that trusts the system's roots.
pub fn client(connect_timeout: Duration) -> Client {
    client_with_ca(connect_timeout, None).expect("the system's roots need no file")
}

/// A client certificate and its key (PEM files), presented to servers that ask (mutual TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

/// A client with `connect_timeout` for new connections; `https://` URLs are verified against
/// the system's roots and, when given, the certificates of `ca_file` (PEM).
pub fn client_with_ca(
    connect_timeout: Duration,
    ca_file: Option<&Path>,
) -> Result<Client, ClientTlsError> {
    client_with_identity(connect_timeout, ca_file, None)
}

/// As [`client_with_ca`], presenting `identity`'s certificate to servers that ask for one.
pub fn client_with_identity(
    connect_timeout: Duration,
    ca_file: Option<&Path>,
    identity: Option<&ClientIdentity>,
) -> Result<Client, ClientTlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(system_roots().iter().cloned());
    if let Some(path) = ca_file {
        for cert in read_ca_file(path)? {
            roots.add(cert).map_err(|source| ClientTlsError::Refused {
                path: path.into(),
                source,
            })?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(ClientTlsError::Protocols)?
    .with_root_certificates(roots);
    let tls = match identity {
        None => tls.with_no_client_auth(),
        Some(id) => {
            use rustls_pki_types::pem::PemObject;
            let chain = read_ca_file(&id.cert)?;
            let key =
                rustls_pki_types::PrivateKeyDer::from_pem_file(&id.key).map_err(|source| {
                    PemError::Read {
                        path: id.key.clone(),
                        source,
                    }
                })?;
            tls.with_client_auth_cert(chain, key)
                .map_err(|source| ClientTlsError::Refused {
                    path: id.cert.clone(),
                    source,
                })?
        }
    };
    let mut conn = hyper_util::client::legacy::connect::HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(connect_timeout));
    // The TLS layer hands the connector https:// URIs too.
    conn.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(conn);
    Ok(Client::new(Connector {
        inner: https,
        last: Arc::default(),
    }))
}

/// A request with a JSON body (or none) and an optional bearer token.
pub fn request(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Bytes,
) -> hyper::Request<Full<Bytes>> {
    let mut b = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        b = b.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    b.body(Full::new(body)).expect("valid request parts")
}

/// Sends `req` and waits at most `timeout` for the response head.
pub async fn send(
    client: &Client,
    req: hyper::Request<Full<Bytes>>,
    timeout: Duration,
) -> Result<hyper::Response<Incoming>, ClientError> {
    tokio::time::timeout(timeout, client.request(req))
        .await
        .map_err(|_| ClientError::Timeout(timeout))?
        .map_err(|e| {
            let mut text = error_chain(&e);
            // The pool's "not ready" (a connection closed before the request went out) and an
            // incomplete answer hide why the connection closed: add the latest error one of
            // this client's connections met.
            if closed_early(&e) {
                if let Some(cause) = client.connector.last.recent(Duration::from_secs(5)) {
                    if !text.contains(&cause) {
                        text.push_str(&format!(
                            " (a connection to it failed just before: {cause})"
                        ));
                    }
                }
            }
            ClientError::Connect(text)
        })
}

/// Whether hyper gave up on a request because its connection closed under it (canceled
/// before it was sent, or the answer cut short), which it reports without the connection's own
/// error.
fn closed_early(e: &hyper_util::client::legacy::Error) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            return h.is_canceled() || h.is_incomplete_message();
        }
        cause = c.source();
    }
    false
}

/// An error with its causes ("client error (Connect): invalid peer certificate: UnknownIssuer"):
/// hyper's own text stops at the outermost, which says nothing an operator can act on.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// A remote server: its base URL, its bearer token, and the client that reaches it.
pub struct Endpoint {
    /// The base URL, without a trailing `/`.
    pub url: String,
    token: Option<String>,
    client: Client,
}

impl Endpoint {
    /// `url` reached with `client` ([`client_with_ca`]), sending `token` as a bearer token.
    pub fn new(url: &str, token: Option<String>, client: Client) -> Self {
        Endpoint {
            url: url.trim_end_matches('/').to_string(),
            token,
            client,
        }
    }

    /// Sends `method path` with `body` and waits at most `timeout` for the response head.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<hyper::Response<Incoming>, ClientError> {
        self.send_traced(method, path, body, timeout, None, None)
            .await
    }

    /// As [`Endpoint::send`], with the request's W3C `traceparent` (if it has a trace) and its
    /// `x-request-id` (if the gateway gave it one).
    pub async fn send_traced(
        &self,
        method: &str,
        path: &str,
        body: Bytes,
        timeout: Duration,
        traceparent: Option<&str>,
        request_id: Option<&str>,
    ) -> Result<hyper::Response<Incoming>, ClientError> {
        let mut req = request(
            method,
            &format!("{}{path}", self.url),
            self.token.as_deref(),
            body,
        );
        if let Some(v) = traceparent.and_then(|t| hyper::header::HeaderValue::from_str(t).ok()) {
            req.headers_mut().insert("traceparent", v);
        }
        if let Some(v) = request_id.and_then(|t| hyper::header::HeaderValue::from_str(t).ok()) {
            req.headers_mut().insert("x-request-id", v);
        }
        send(&self.client, req, timeout).await
    }
}

/// A response's whole body.
pub async fn read_body(resp: hyper::Response<Incoming>) -> Result<Bytes, ClientError> {
    resp.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| ClientError::Body(e.to_string()))
}

/// A response that is not a success, as an error with its status and body.
pub async fn status_error(resp: hyper::Response<Incoming>) -> ClientError {
    let status = resp.status();
    let body = read_body(resp).await.unwrap_or_default();
    ClientError::Status {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// The text of an error response ("STATUS: body"), for messages.
pub async fn error_text(resp: hyper::Response<Incoming>) -> String {
    match status_error(resp).await {
        ClientError::Status { status, body } => format!("{status}: {body}"),
        other => other.to_string(),
    }
}

/// The lines of a response body (NDJSON, or SSE's `data:` lines), without their `\n`.
pub struct Lines {
    body: Incoming,
    buf: BytesMut,
}

impl Lines {
    pub fn new(body: Incoming) -> Self {
        Lines {
            body,
            buf: BytesMut::new(),
        }
    }

    /// The next line; `None` at the end of the body.
    pub async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line = self.buf.split_to(i + 1).freeze();
                return Ok(Some(line.slice(..i)));
            }
            match self.body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(d.chunk());
                    }
                }
                Some(Err(e)) => return Err(ClientError::Body(e.to_string())),
                None => return Ok(None),
            }
        }
    }

    /// The next line within `timeout`.
    pub async fn next_within(&mut self, timeout: Duration) -> Result<Option<Bytes>, ClientError> {
        tokio::time::timeout(timeout, self.next())
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }
}
