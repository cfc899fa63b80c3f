//! HTTP plumbing shared by the gateway's server and `cachet worker`: request bodies read with
//! limits, JSON and streaming replies, bearer tokens, the error shape, the accept loop with its
//! connection limits ([`serve`]), the threads connections are served on ([`lanes`]),
//! idle-connection tracking ([`idle`]), TLS ([`tls`]) and the client the gateway reaches its
//! upstreams with ([`client`]). Nothing here knows tenants,
//! engines or routes.

pub mod access;
pub mod client;
pub mod error;
pub mod idle;
pub mod lanes;
pub mod serve;
pub mod tls;

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{header, Request, Response, StatusCode};
use tokio::sync::mpsc;

pub use error::ApiError;

/// Every response body: whole, or streamed from a channel.
pub type Body = BoxBody<Bytes, Infallible>;

/// Largest JSON request body the gateway's API accepts.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// How much of a too-large body is read (and dropped) so the client sees the 413.
pub const DRAIN_BODY_BYTES: usize = 16 << 20;

/// A JSON response.
pub fn json(status: StatusCode, v: &impl serde::Serialize) -> Response<Body> {
    json_bytes(status, to_json(v))
}

/// `v` as JSON bytes: straight into them (`to_string` goes through `fmt::Write`, a call per
/// fragment).
pub fn to_json(v: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(v).expect("the server's own values write as JSON")
}

/// Adds `headers` (names lowercase and static, values the server's own ASCII) to `r`.
pub fn add_headers<B>(r: &mut Response<B>, headers: &[(&'static str, String)]) {
    for (name, value) in headers {
        if let Ok(v) = hyper::header::HeaderValue::from_str(value) {
            r.headers_mut()
                .insert(hyper::header::HeaderName::from_static(name), v);
        }
    }
}

/// A JSON response of a body already written.
pub fn json_bytes(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .expect("static response parts")
}

/// A response of `content_type` whose body is `bytes`.
pub fn bytes(status: StatusCode, content_type: &'static str, bytes: Bytes) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(bytes).boxed())
        .expect("static response parts")
}

/// The token of an `Authorization: Bearer <token>` header (the scheme matched without regard
/// to case, as RFC 9110 has it).
pub fn bearer(req: &Request<Incoming>) -> Option<&str> {
    bearer_token(req.headers().get(header::AUTHORIZATION)?.to_str().ok()?)
}

/// The API key of a request: `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key:
/// <key>` (Anthropic's).
pub fn api_key(req: &Request<Incoming>) -> Option<&str> {
    bearer(req).or_else(|| {
        req.headers()
            .get("x-api-key")?
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|k| !k.is_empty())
    })
}

/// The token of an `Authorization` header's value, if its scheme is `Bearer` (any case).
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Whether `token` is the expected one, compared through their hashes (the time taken does not
/// tell how much of it matched).
pub fn token_matches(token: Option<&str>, expected: &str) -> bool {
    token.is_some_and(|t| blake3::hash(t.as_bytes()) == blake3::hash(expected.as_bytes()))
}

/// Whether the request came from this machine (loopback).
pub fn from_loopback(req: &Request<Incoming>) -> bool {
    req.extensions()
        .get::<serve::Peer>()
        .is_some_and(|p| p.0.ip().is_loopback())
}

/// A JSON answer, as handlers return it.
pub fn ok_json(status: StatusCode, v: serde_json::Value) -> Result<Response<Body>, ApiError> {
    Ok(json(status, &v))
}

/// The query string's `name=value` pairs, `%XX` and `+` decoded (an escape that is not one
/// stays as written).
pub fn query_pairs(req: &Request<Incoming>) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match (b[i], hex) {
                (b'%', Some(v)) => {
                    out.push(v);
                    i += 2;
                }
                (b'+', _) => out.push(b' '),
                (c, _) => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// Reads a body of at most `limit` bytes. A larger body is read on (and dropped) up to
/// [`DRAIN_BODY_BYTES`] so the client, still sending, receives the 413 instead of a reset. A body
/// that pauses longer than its [`serve::BodyTimeouts`] allow between two chunks, or takes longer
/// in all, ends in 408 (the timeouts come with the request from the accept loop).
pub async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Vec<u8>, ApiError> {
    let t = req
        .extensions()
        .get::<serve::BodyTimeouts>()
        .copied()
        .unwrap_or_default();
    let deadline = tokio::time::Instant::now() + t.total;
    let mut body = req.into_body();
    let mut buf = Vec::new();
    let mut total = 0usize;
    loop {
        let wait = t
            .chunk
            .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        let frame = match tokio::time::timeout(wait, body.frame()).await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(_) => {
                let msg = if tokio::time::Instant::now() >= deadline {
                    format!(
                        "the request body took longer than {} s to arrive",
                        t.total.as_secs()
                    )
                } else {
                    format!(
                        "the request body stalled: nothing arrived for {} s",
                        t.chunk.as_secs()
                    )
                };
                return Err(ApiError {
                    status: StatusCode::REQUEST_TIMEOUT,
                    code: Some("body_timeout"),
                    ..ApiError::bad_request(msg, None)
                });
            }
        };
        let frame = frame
            .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}"), None))?;
        if let Ok(data) = frame.into_data() {
            total += data.len();
            if total <= limit {
                buf.extend_from_slice(&data);
            } else if total > DRAIN_BODY_BYTES.max(limit) {
                break;
            }
        }
    }
    if total > limit {
        return Err(ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::bad_request(format!("request body is larger than {limit} bytes"), None)
        });
    }
    Ok(buf)
}

/// Reads a JSON body of at most `limit` bytes into `T`.
pub async fn read_json<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
    limit: usize,
) -> Result<T, ApiError> {
    parse_json(&read_body(req, limit).await?)
}

/// A JSON request body as `T`, or a 400 that says where it is wrong.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}"), None))
}

/// A response body fed by a channel: dropping it (the client went away) closes the channel,
/// which tells whatever feeds it to stop.
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// A streamed response of `content_type` fed by `rx`.
pub fn streaming(content_type: &'static str, rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache")
        .body(ChannelBody { rx }.boxed())
        .expect("static response parts")
}

/// One NDJSON line of `v`.
pub fn ndjson_line<T: serde::Serialize>(v: &T) -> Bytes {
    let mut s = serde_json::to_vec(v).expect("wire types serialise");
    s.push(b'\n');
    Bytes::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_matched_without_regard_to_case() {
        assert_eq!(bearer_token("Bearer sk-1"), Some("sk-1"));
        assert_eq!(bearer_token("bearer sk-1 "), Some("sk-1"));
        assert_eq!(bearer_token("BEARER sk-1"), Some("sk-1"));
        assert_eq!(bearer_token("Basic dXNlcg=="), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearersk-1"), None);
    }

    #[test]
    fn tokens_are_compared_whole() {
        assert!(token_matches(Some("secret"), "secret"));
        assert!(!token_matches(Some("secre"), "secret"));
        assert!(!token_matches(None, "secret"));
    }
}
