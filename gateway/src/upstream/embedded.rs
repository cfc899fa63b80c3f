//! The gateway's own engine as an upstream: requests go to it in-process; its load is read
//! from the engine's live stats and its cached blocks from its KV events, so routing to it is
//! exact. It is healthy while the gateway runs.

use std::sync::Arc;

use cachet_backend::block_hash::BlockHash;
use cachet_backend::engine::{EngineHandle, RequestStream};
use cachet_backend::request::{EngineEvent, EngineRequest};
use cachet_backend::EngineError;
use tokio::sync::broadcast::error::RecvError;

use super::blocks::BlockSet;
use super::{
    BoxFuture, EventStream, Events, StartError, Tally, TallyGuard, Upstream, UpstreamRequest,
};
use crate::route::WorkerView;

/// The name the embedded engine goes by (metrics labels, logs).
pub const NAME: &str = "embedded";

pub struct Embedded {
    engine: EngineHandle,
    blocks: Arc<BlockSet>,
    tally: Arc<Tally>,
}

/// Submits to an engine from async code. A request with a grammar compiles it on a blocking
/// thread (a schema can take a while to compile, and the first one indexes the vocabulary)
/// rather than stall the runtime; the others are queued at once.
pub async fn submit_engine(
    engine: &EngineHandle,
    req: EngineRequest,
) -> Result<RequestStream, EngineError> {
    if req.constraint.is_none() {
        return engine.submit(req);
    }
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || engine.submit(req))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

impl Embedded {
    /// The engine as an upstream, following its KV events from now on (call inside a tokio
    /// runtime, before its first request).
    pub fn start(engine: EngineHandle) -> Arc<Self> {
        let blocks = Arc::new(BlockSet::default());
        let mut rx = engine.subscribe_kv_events();
        let set = blocks.clone();
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(batch) => set.apply_events(batch),
                    Err(RecvError::Lagged(_)) => set.clear(),
                    Err(RecvError::Closed) => return,
                }
            }
        });
        Arc::new(Embedded {
            engine,
            blocks,
            tally: Default::default(),
        })
    }

    pub fn engine(&self) -> &EngineHandle {
        &self.engine
    }
}

/// A stream of the embedded engine, counted as its load until dropped.
struct Stream {
    stream: RequestStream,
    _tally: TallyGuard,
}

impl EventStream for Stream {
    fn next(&mut self) -> BoxFuture<'_, Option<EngineEvent>> {
        Box::pin(self.stream.next())
    }
}

impl Upstream for Embedded {
    fn name(&self) -> &str {
        NAME
    }

    fn view(&self, hashes: &[BlockHash]) -> WorkerView {
        let st = self.engine.stats();
        WorkerView {
            healthy: true,
            inflight: self.tally.inflight(),
            running: st.running,
            waiting: st.waiting,
            kv_used: st.kv.used,
            kv_total: st.kv.total,
            overlap_blocks: self.blocks.overlap(hashes),
            ..Default::default()
        }
    }

    fn submit<'a>(&'a self, req: UpstreamRequest<'a>) -> BoxFuture<'a, Result<Events, StartError>> {
        Box::pin(async move {
            let mut tally = self.tally.start();
            match submit_engine(&self.engine, req.engine.clone()).await {
                Ok(stream) => {
                    tally.accepted();
                    Ok(Box::new(Stream {
                        stream,
                        _tally: tally,
                    }) as Events)
                }
                Err(e) if e.is_overload() => Err(StartError::Busy(e.to_string())),
                Err(EngineError::InvalidRequest(m)) => Err(StartError::Invalid(m)),
                Err(e) => Err(StartError::Failed(e.to_string())),
            }
        })
    }

    fn cached_blocks(&self) -> usize {
        self.blocks.len()
    }

    fn inflight(&self) -> usize {
        self.tally.inflight()
    }
}
