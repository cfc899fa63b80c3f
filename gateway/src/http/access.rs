//! One access line per request of either server (target `cachet::access`, INFO; JSON in
//! `--log-format json`), begun by the accept loop's connection as the request arrives and
//! written when its response body has been sent or the client has gone ([`super::idle`]'s
//! guarded body carries it): method, path, status, the tenant and model where the request got
//! that far, the client's address, the request id, bytes sent and the whole time taken (a
//! stream's included). `RUST_LOG=info,cachet::access=off` turns them off.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Request, Response};

/// What the request path learns of a request for its access line (in the request's
/// extensions): the tenant once authenticated, the model once chosen.
#[derive(Debug, Default)]
pub struct Seen {
    tenant: OnceLock<String>,
    model: OnceLock<String>,
}

impl Seen {
    /// The `Seen` of `req` (a request not served through [`Line::begin`] has none).
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
    peer: SocketAddr,
    /// The response's `x-request-id` (the gateway's), else the request's (a worker's caller's).
    request_id: Option<String>,
    status: u16,
    at: Instant,
    seen: Arc<Seen>,
}

impl Line {
    /// Begins `req`'s line from `peer` (its [`Seen`] put in its extensions).
    pub fn begin(req: &mut Request<Incoming>, peer: SocketAddr) -> Line {
        let seen = Arc::new(Seen::default());
        req.extensions_mut().insert(seen.clone());
        Line {
            method: req.method().clone(),
            path: req.uri().path().to_string(),
            peer,
            request_id: id_of(req.headers()),
            status: 0,
            at: Instant::now(),
            seen,
        }
    }

    /// `response` on its way out, its body guarded by `guard` and carrying this line.
    pub fn finish(
        mut self,
        response: Response<super::Body>,
        guard: super::idle::InFlight,
    ) -> Response<super::Body> {
        self.status = response.status().as_u16();
        if let Some(id) = id_of(response.headers()) {
            self.request_id = Some(id);
        }
        response.map(|b| super::idle::guard_body(b, guard, Some(self)))
    }

    /// Writes the line: `bytes` of body sent, `complete` if all of it.
    pub fn log(&self, bytes: u64, complete: bool) {
        let dash = || "-".to_string();
        tracing::info!(
            target: "cachet::access",
            method = %self.method,
            path = %self.path,
            status = self.status,
            tenant = %self.seen.tenant.get().cloned().unwrap_or_else(dash),
            model = %self.seen.model.get().cloned().unwrap_or_else(dash),
            client = %self.peer.ip(),
            request_id = %self.request_id.as_deref().unwrap_or("-"),
            bytes,
            ms = (self.at.elapsed().as_secs_f64() * 1000.0 * 10.0).round() / 10.0,
            complete,
            "request"
        );
    }
}

fn id_of(headers: &hyper::HeaderMap) -> Option<String> {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}
