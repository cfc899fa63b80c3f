//! The client the gateway reaches its upstreams with: plain HTTP/1.1 with TCP_NODELAY (a
//! streamed token must not wait for Nagle's algorithm), a connect timeout, idle connections kept
//! 30 s; the line reader for NDJSON and SSE response bodies; typed errors for all of it.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::StatusCode;

pub type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

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

/// A client with `connect_timeout` for new connections.
pub fn client(connect_timeout: Duration) -> Client {
    let mut conn = hyper_util::client::legacy::connect::HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(connect_timeout));
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(conn)
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
        .map_err(|e| ClientError::Connect(e.to_string()))
}

/// A remote server: its base URL, its bearer token, and the client that reaches it.
pub struct Endpoint {
    /// The base URL, without a trailing `/`.
    pub url: String,
    token: Option<String>,
    client: Client,
}

impl Endpoint {
    pub fn new(url: &str, token: Option<String>, connect_timeout: Duration) -> Self {
        Endpoint {
            url: url.trim_end_matches('/').to_string(),
            token,
            client: client(connect_timeout),
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
        let req = request(
            method,
            &format!("{}{path}", self.url),
            self.token.as_deref(),
            body,
        );
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
