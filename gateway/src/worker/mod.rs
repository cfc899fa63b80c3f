//! `cachet worker`: the engine as its own process, over HTTP (plain HTTP/1.1 and HTTP/2), for a
//! gateway in front of a pool of them.
//!
//! ```text
//! GET  /health          liveness
//! GET  /v1/state        model, block size, key id, load (running / waiting / KV use)
//! POST /v1/generate     token ids in (GenerateRequest), NDJSON WireEvents out; closing the
//!                       connection cancels the request
//! GET  /v1/kv_events    NDJSON: a snapshot of the stored block hashes, then every change
//! ```
//!
//! Block hashes are the engine's own (DESIGN.md interface 1: keyed blake3 chain, the tenant's
//! salt): a gateway holding the same deployment key computes the same hashes for a prompt, so it
//! knows exactly which worker holds which prefix. `key_id` (a hash of the key) lets it check.

pub mod protocol;

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use cachet_backend::block_hash::BlockHash;
use cachet_backend::engine::EngineHandle;
use cachet_backend::kv::KvEvent;
use cachet_backend::request::{EngineEvent, EngineRequest};
use cachet_backend::sampler::SamplingParams;
use cachet_backend::EngineError;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{header, Method, Request, Response, StatusCode};
use tokio::sync::{broadcast, mpsc, watch};

use protocol::{GenerateRequest, KvWire, StateReply, WireEvent};

type Body = BoxBody<Bytes, Infallible>;

/// Largest `/v1/generate` body.
const MAX_BODY: usize = 16 << 20;

/// The set of block hashes the engine holds, kept current from its KV events, with a sequence
/// number per change and a channel of changes for `/v1/kv_events` streams.
pub struct KvTracker {
    state: RwLock<(u64, HashSet<BlockHash>)>,
    changes: broadcast::Sender<(u64, KvWire)>,
}

impl KvTracker {
    /// Follows `engine`'s KV events from now on (call before the first request).
    pub fn follow(engine: &EngineHandle) -> Arc<KvTracker> {
        let (changes, _) = broadcast::channel(4096);
        let t = Arc::new(KvTracker {
            state: RwLock::new((0, HashSet::new())),
            changes,
        });
        let mut rx = engine.subscribe_kv_events();
        let t2 = t.clone();
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(batch) => {
                        for ev in batch {
                            t2.apply(ev);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        // Missed changes: forget everything (routing then under-, never
                        // over-estimates what is cached here) and tell the streams.
                        tracing::warn!(missed = n, "KV event tracker lagged; clearing");
                        t2.apply(KvEvent::Cleared);
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        t
    }

    fn apply(&self, ev: KvEvent) {
        let mut st = self.state.write().expect("tracker lock");
        st.0 += 1;
        let wire = match ev {
            KvEvent::Stored { hashes } => {
                st.1.extend(hashes.iter().copied());
                KvWire::Stored {
                    seq: st.0,
                    blocks: hashes.iter().map(protocol::hex_hash).collect(),
                }
            }
            KvEvent::Removed { hashes } => {
                for h in &hashes {
                    st.1.remove(h);
                }
                KvWire::Removed {
                    seq: st.0,
                    blocks: hashes.iter().map(protocol::hex_hash).collect(),
                }
            }
            KvEvent::Cleared => {
                st.1.clear();
                KvWire::Cleared { seq: st.0 }
            }
        };
        let _ = self.changes.send((st.0, wire));
    }

    /// The current set, as a snapshot event.
    pub fn snapshot(&self) -> KvWire {
        let st = self.state.read().expect("tracker lock");
        KvWire::Snapshot {
            seq: st.0,
            blocks: st.1.iter().map(protocol::hex_hash).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.state.read().expect("tracker lock").1.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the worker's handlers share.
pub struct WorkerState {
    pub engine: EngineHandle,
    pub model_id: String,
    /// Identifies the deployment key without revealing it.
    pub key_id: String,
    pub tracker: Arc<KvTracker>,
    /// Bearer token the gateway must send, if set.
    pub auth_token: Option<String>,
    /// Turns true at shutdown: ends the long-lived `/v1/kv_events` streams.
    pub closing: watch::Receiver<bool>,
}

/// A short, public id of a deployment key: the first 8 bytes of blake3("cachet key id" ‖ key).
pub fn key_id(key: &[u8; 32]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"cachet key id");
    h.update(key);
    h.finalize().to_hex()[..16].to_string()
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .expect("static response parts")
}

fn error(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Response<Body> {
    json(
        status,
        &serde_json::json!({"error": {"code": code, "message": message.to_string()}}),
    )
}

/// An NDJSON body fed by a channel; dropping it (the client went away) drops what feeds it.
struct Lines {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for Lines {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

fn line<T: serde::Serialize>(v: &T) -> Bytes {
    let mut s = serde_json::to_vec(v).expect("wire types serialise");
    s.push(b'\n');
    Bytes::from(s)
}

fn ndjson(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Lines { rx }.boxed())
        .expect("static response parts")
}

/// Routes one request.
pub async fn handle(
    state: Arc<WorkerState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if let Some(token) = &state.auth_token {
        let ok = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| t.trim() == token);
        if !ok && req.uri().path() != "/health" {
            return Ok(error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this worker needs its auth token as `Authorization: Bearer <token>`",
            ));
        }
    }
    let path = req.uri().path().to_string();
    Ok(match (req.method(), path.as_str()) {
        (&Method::GET, "/health") => json(StatusCode::OK, &serde_json::json!({"status": "ok"})),
        (&Method::GET, "/v1/state") => {
            let s = state.engine.stats();
            let reply = StateReply {
                model: state.model_id.clone(),
                block_size: state.engine.block_size(),
                max_model_len: state.engine.max_model_len(),
                key_id: state.key_id.clone(),
                running: s.running,
                waiting: s.waiting,
                kv_total: s.kv.total,
                kv_used: s.kv.used,
                cached_blocks: state.tracker.len(),
            };
            json(
                StatusCode::OK,
                &serde_json::to_value(reply).expect("serialises"),
            )
        }
        (&Method::GET, "/v1/kv_events") => kv_events(&state),
        (&Method::POST, "/v1/generate") => generate(&state, req).await,
        (_, "/health" | "/v1/state" | "/v1/kv_events" | "/v1/generate") => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{} is not allowed on {path}", req.method()),
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route {path}"),
        ),
    })
}

fn kv_events(state: &WorkerState) -> Response<Body> {
    let (tx, rx) = mpsc::channel(256);
    // Subscribe before the snapshot: a change in between arrives twice, which applying in
    // sequence order makes harmless.
    let mut changes = state.tracker.changes.subscribe();
    let snapshot = state.tracker.snapshot();
    let tracker = state.tracker.clone();
    let mut closing = state.closing.clone();
    tokio::spawn(async move {
        if tx.send(line(&snapshot)).await.is_err() {
            return;
        }
        loop {
            let got = tokio::select! {
                got = changes.recv() => got,
                _ = closing.changed() => return,
            };
            let next = match got {
                Ok((_, wire)) => wire,
                // Fell behind: start over from a fresh snapshot.
                Err(broadcast::error::RecvError::Lagged(_)) => tracker.snapshot(),
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if tx.send(line(&next)).await.is_err() {
                return;
            }
        }
    });
    ndjson(rx)
}

async fn generate(state: &WorkerState, req: Request<Incoming>) -> Response<Body> {
    let buf = match crate::server::read_body(req, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return error(e.status, "bad_body", e.message),
    };
    let g: GenerateRequest = match serde_json::from_slice(&buf) {
        Ok(g) => g,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_json",
                format!("invalid JSON body: {e}"),
            )
        }
    };
    let Some(salt) = protocol::parse_hex32(&g.salt) else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_salt",
            "salt must be 64 hex digits (the tenant's cache salt)",
        );
    };
    let mut er = EngineRequest::new(g.prompt, g.max_tokens);
    er.sampling = SamplingParams {
        temperature: g.temperature,
        top_k: g.top_k,
        top_p: g.top_p,
        seed: g.seed,
    };
    er.stop = g.stop;
    er.stop_token_ids = g.stop_token_ids;
    er.ignore_eos = g.ignore_eos;
    er.salt = salt;
    er.priority = g.priority;
    er.tag = g.tag;
    let mut stream = match state.engine.submit(er) {
        Ok(s) => s,
        Err(e @ (EngineError::Overloaded { .. } | EngineError::OverloadedTokens { .. })) => {
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, "overloaded", e);
            r.headers_mut().insert(header::RETRY_AFTER, 1.into());
            return r;
        }
        Err(EngineError::InvalidRequest(m)) => {
            return error(StatusCode::BAD_REQUEST, "invalid_request", m)
        }
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "engine", e),
    };
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        // Dropping `stream` when the client is gone cancels the request in the engine.
        while let Some(ev) = stream.next().await {
            let wire = match ev {
                EngineEvent::Token { id, text, .. } => WireEvent::Token { id, text },
                EngineEvent::Finished {
                    reason,
                    usage,
                    timings,
                    error,
                    text,
                } => WireEvent::Finished {
                    reason,
                    usage,
                    timings,
                    error,
                    text,
                },
            };
            if tx.send(line(&wire)).await.is_err() {
                return;
            }
        }
    });
    ndjson(rx)
}

/// Serves the worker API on `listener` until `shutdown` turns true; requests in flight then
/// finish (their streams run to the end).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<WorkerState>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer): (tokio::net::TcpStream, SocketAddr) = match accepted {
                    Ok(x) => x,
                    Err(e) => { tracing::warn!(error = %e, "accept failed"); continue; }
                };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let mut stop = shutdown.clone();
                tasks.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(state.clone(), req));
                    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let conn = builder.serve_connection(TokioIo::new(stream), svc);
                    tokio::pin!(conn);
                    tokio::select! {
                        r = conn.as_mut() => if let Err(e) = r { tracing::debug!(%peer, error = %e, "connection ended with an error"); },
                        _ = stop.changed() => { conn.as_mut().graceful_shutdown(); let _ = conn.await; }
                    }
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
    Ok(())
}
