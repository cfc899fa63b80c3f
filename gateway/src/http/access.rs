//! One access line per request (target `cachet::access`, INFO; JSON in `--log-format json`),
//! written when its response has been sent or the client has gone: method, path, status, the
//! tenant and model where the request got that far, the client's address, bytes sent and the
//! whole time taken (a stream's included). `RUST_LOG=info,cachet::access=off` turns them off.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, Incoming};
use hyper::{Request, Response};

use crate::http::Body;

/// What the request path learns of a request for its access line (in the request's
/// extensions): the tenant once authenticated, the model once chosen.
#[derive(Debug, Default)]
pub struct Seen {
    tenant: OnceLock<String>,
    model: OnceLock<String>,
}

impl Seen {
    /// The `Seen` of `req` (a request not served through [`begin`] has none).
    pub fn of(req: &Request<Incoming>) -> Option<Arc<Seen>> {
        req.extensions().get::<Arc<Seen>>().cloned()
    }

    pub fn tenant(&self, id: &str) {
        let _ = self.tenant.set(id.to_string());
    }

    pub fn model(&self, id: &str) {
        let _ = self.model.set(id.to_string());
    }
}

/// Notes `req`'s tenant for its access line.
pub fn tenant(req: &Request<Incoming>, id: &str) {
    if let Some(s) = req.extensions().get::<Arc<Seen>>() {
        s.tenant(id);
    }
}

/// A request's line, begun as it arrives.
pub struct Line {
    method: hyper::Method,
    path: String,
    peer: Option<std::net::SocketAddr>,
    request_id: String,
    at: Instant,
    seen: Arc<Seen>,
}

/// Begins `req`'s line (its [`Seen`] put in its extensions).
pub fn begin(req: &mut Request<Incoming>, request_id: &hyper::header::HeaderValue) -> Line {
    let seen = Arc::new(Seen::default());
    req.extensions_mut().insert(seen.clone());
    Line {
        method: req.method().clone(),
        path: req.uri().path().to_string(),
        peer: req
            .extensions()
            .get::<crate::http::serve::Peer>()
            .map(|p| p.0),
        request_id: request_id.to_str().unwrap_or("-").to_string(),
        at: Instant::now(),
        seen,
    }
}

impl Line {
    /// `response`, its body written to the line as it is sent; the line is logged when the body
    /// ends or is dropped.
    pub fn finish(self, response: Response<Body>) -> Response<Body> {
        let status = response.status().as_u16();
        response.map(|inner| {
            Logged {
                inner,
                line: self,
                status,
                bytes: 0,
                ended: false,
            }
            .boxed()
        })
    }
}

/// A response body that logs its request's line when dropped.
struct Logged {
    inner: Body,
    line: Line,
    status: u16,
    bytes: u64,
    ended: bool,
}

impl hyper::body::Body for Logged {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    self.bytes += d.len() as u64;
                }
            }
            Poll::Ready(None) => self.ended = true,
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let l = &self.line;
        let complete = self.ended || self.inner.is_end_stream();
        let dash = || "-".to_string();
        tracing::info!(
            target: "cachet::access",
            method = %l.method,
            path = %l.path,
            status = self.status,
            tenant = %l.seen.tenant.get().cloned().unwrap_or_else(dash),
            model = %l.seen.model.get().cloned().unwrap_or_else(dash),
            client = %l.peer.map_or_else(dash, |p| p.ip().to_string()),
            request_id = %l.request_id,
            bytes = self.bytes,
            ms = (l.at.elapsed().as_secs_f64() * 1000.0 * 10.0).round() / 10.0,
            complete,
            "request"
        );
    }
}
