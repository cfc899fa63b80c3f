//! The engine: one thread owns the runner (and so the device); clients submit requests through a
//! handle and read a stream of events.
//!
//! - `submit` refuses at once with [`EngineError::Overloaded`] when `max_waiting` requests, or
//!   `max_waiting_tokens` prompt tokens, are already queued (bounded queue, never unbounded
//!   waiting; a request larger than the token bound alone is still taken when nothing waits).
//! - Dropping a [`RequestStream`] cancels its request; its KV blocks are freed before the next step.
//! - Stop token ids, stop strings (text held back while it could still become one: [`output`]),
//!   max tokens, deadlines.
//! - Stats (running/waiting, KV blocks, prefix-cache tokens, preemptions) are published after each
//!   step; KV events (blocks stored/removed) go to subscribers for exact routing.

pub mod builder;
mod core;
pub mod output;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Serialize;
use tokio::sync::{broadcast, mpsc as tmpsc};

use crate::block_hash::HashContext;
use crate::error::EngineError;
use crate::kv::{KvCacheManager, KvEvent, PoolUsage};
use crate::model::step_sampler::StepSampler;
use crate::model::Runner;
use crate::request::{EngineEvent, EngineRequest};
use crate::scheduler::{RequestId, Scheduler, SchedulerConfig, SchedulerCounters};
use crate::tokenizer::TextTokenizer;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineConfig {
    pub scheduler: SchedulerConfig,
    pub enable_prefix_caching: bool,
    /// Share of the pool idle cached blocks may keep (0..=1).
    pub prefix_cache_cap: f64,
    /// Requests that may wait for their first step before `submit` refuses.
    pub max_waiting: usize,
    /// Prompt tokens that may wait for their first step before `submit` refuses.
    pub max_waiting_tokens: usize,
    /// Model id mixed into block hashes.
    pub model_id: String,
    /// Deployment key of the block hashes.
    #[serde(skip)]
    pub hash_key: [u8; 32],
    /// N-gram speculative decoding (off when `None`).
    pub speculative: Option<crate::spec::SpecConfig>,
    /// Idle cached blocks are shared between tenants by their `share` (eviction takes from the
    /// tenant furthest over its share); `false`: one LRU for everyone.
    pub cache_shares: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            scheduler: SchedulerConfig::default(),
            enable_prefix_caching: true,
            prefix_cache_cap: 1.0,
            max_waiting: 256,
            max_waiting_tokens: 256 * 1024,
            model_id: "model".into(),
            hash_key: [0; 32],
            speculative: None,
            cache_shares: true,
        }
    }
}

/// A snapshot of the engine's state.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv: PoolUsage,
    pub counters: SchedulerCounters,
    pub block_size: usize,
    /// What a speculative verification step has cost relative to a plain decode step (1 until
    /// both kinds have run).
    pub spec_cost_ratio: f64,
    /// Idle cached KV blocks per tenant (the tenant whose request computed them).
    pub cached_by_tenant: Vec<(String, usize)>,
    /// Seconds spent in forward steps, from queuing a step on the device to its results on the
    /// host (the device's work and the engine's wait for it), in total.
    pub step_seconds: f64,
    /// Seconds between one step's results and the next step's queuing while requests were in
    /// the engine (sampling, streaming the tokens out, scheduling, building the batch): time the
    /// device waits on the host, in total.
    pub step_gap_seconds: f64,
}

impl EngineStats {
    /// Fraction of KV blocks held by requests.
    pub fn kv_usage(&self) -> f64 {
        if self.kv.total == 0 {
            0.0
        } else {
            self.kv.used as f64 / self.kv.total as f64
        }
    }
}

pub(crate) enum Command {
    Add {
        id: RequestId,
        req: Box<EngineRequest>,
        arrival: Instant,
        tx: tmpsc::UnboundedSender<EngineEvent>,
        ticket: Arc<Ticket>,
        /// The request's grammar, compiled at submission.
        matcher: Option<Box<crate::grammar::Matcher>>,
    },
    Cancel(RequestId),
    Shutdown,
}

/// Requests (and their prompt tokens) submitted but not yet given a first step, in all and per
/// tenant (requests, the tenant's share).
#[derive(Default)]
pub(crate) struct Queued {
    requests: usize,
    tokens: usize,
    tenants: std::collections::HashMap<String, (usize, f32)>,
}

impl Queued {
    /// Under fair sharing, whether tenant `tag` (of `share`) holds less than its share of a
    /// queue of `limit` requests, shared with the tenants queued: such a tenant is taken even
    /// when the queue is full, so a flood from one tenant cannot shut the others out. (The queue
    /// then holds at most about twice its limit: the tenants under their share fill only their
    /// part.)
    fn under_share(&self, tag: &str, share: f32, limit: usize) -> bool {
        let mine = self.tenants.get(tag).map_or(0, |x| x.0);
        let total: f32 = self
            .tenants
            .iter()
            .filter(|(t, _)| t.as_str() != tag)
            .map(|(_, x)| x.1)
            .sum::<f32>()
            + share;
        (mine as f32) < limit as f32 * share / total.max(f32::MIN_POSITIVE)
    }
}

pub(crate) type SharedQueue = Arc<Mutex<Queued>>;

/// A request's place in [`Queued`], given back exactly once: by the engine when the request
/// takes its first step or ends, or by its [`RequestStream`] when the client leaves first — at
/// once, not when the engine thread next reads its commands (a step can take a quarter of a
/// second on the CPU, and clients cancelling requests as fast as they send them would otherwise
/// fill the queue with requests already gone).
pub(crate) struct Ticket {
    queue: SharedQueue,
    prompt_len: usize,
    tag: String,
    left: std::sync::atomic::AtomicBool,
}

impl Ticket {
    /// Leaves the queue, unless it was left already.
    pub(crate) fn leave(&self) {
        if self.left.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut q = self.queue.lock().expect("queue lock");
        q.requests -= 1;
        q.tokens -= self.prompt_len;
        if let Some(x) = q.tenants.get_mut(&self.tag) {
            x.0 -= 1;
            if x.0 == 0 {
                q.tenants.remove(&self.tag);
            }
        }
    }

    /// Whether the request has left the queue.
    pub(crate) fn has_left(&self) -> bool {
        self.left.load(Ordering::Acquire)
    }
}

/// The events of one request. Dropping it cancels the request (and a request not yet started
/// leaves the queue at once).
pub struct RequestStream {
    pub id: RequestId,
    rx: tmpsc::UnboundedReceiver<EngineEvent>,
    cmd: mpsc::Sender<Command>,
    done: bool,
    ticket: Arc<Ticket>,
}

impl RequestStream {
    /// The next event; `None` after `Finished`.
    pub async fn next(&mut self) -> Option<EngineEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.recv().await;
        self.done = matches!(ev, Some(EngineEvent::Finished { .. }) | None);
        ev
    }
    /// Blocking variant for synchronous callers (never call inside an async runtime).
    pub fn next_blocking(&mut self) -> Option<EngineEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.blocking_recv();
        self.done = matches!(ev, Some(EngineEvent::Finished { .. }) | None);
        ev
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            self.ticket.leave();
            let _ = self.cmd.send(Command::Cancel(self.id));
        }
    }
}

/// A cheap, cloneable handle on the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    cmd: mpsc::Sender<Command>,
    next_id: Arc<AtomicUsize>,
    queued: SharedQueue,
    stats: Arc<Mutex<EngineStats>>,
    kv_events: broadcast::Sender<Vec<KvEvent>>,
    limits: Arc<Limits>,
}

struct Limits {
    max_waiting: usize,
    max_waiting_tokens: usize,
    /// The queue's limits give way to a tenant below its share (fair sharing).
    fair_share: bool,
    num_blocks: usize,
    block_size: usize,
    max_model_len: usize,
    vocab: usize,
    eos: Vec<u32>,
    hasher: HashContext,
    /// Compiles structured-output constraints (with a tokenizer only).
    grammar: Option<crate::grammar::GrammarCompiler>,
}

/// The engine thread; joins on drop after asking it to stop.
pub struct Engine {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts the engine thread over `runner`. `tokenizer` enables stop strings and text in events.
    pub fn start(
        runner: Box<dyn Runner>,
        tokenizer: Option<TextTokenizer>,
        config: EngineConfig,
    ) -> Engine {
        let layout = runner.kv_layout();
        let mut sched_cfg = config.scheduler.clone();
        sched_cfg.max_model_len = sched_cfg.max_model_len.min(runner.max_model_len());
        let mut kv = KvCacheManager::new(
            layout.num_blocks,
            layout.block_size,
            config.prefix_cache_cap,
            config.enable_prefix_caching,
        );
        // Blocks behind the window go back to the pool where every layer slides (Mistral,
        // Qwen with all layers windowed); Gemma's global layers read the whole context.
        let model = runner.config();
        kv.set_window(
            (0..model.num_hidden_layers)
                .map(|l| model.layer_window(l))
                .collect::<Option<Vec<usize>>>()
                .and_then(|w| w.into_iter().max()),
        );
        let limits = Arc::new(Limits {
            max_waiting: config.max_waiting,
            max_waiting_tokens: config.max_waiting_tokens,
            fair_share: sched_cfg.fair_share,
            num_blocks: layout.num_blocks,
            block_size: layout.block_size,
            max_model_len: sched_cfg.max_model_len,
            vocab: runner.config().vocab_size,
            eos: runner.config().eos_token_ids.clone(),
            grammar: tokenizer.as_ref().map(|t| {
                crate::grammar::GrammarCompiler::new(
                    t.clone(),
                    runner.config().eos_token_ids.first().copied().unwrap_or(0),
                    runner.config().vocab_size,
                )
            }),
            hasher: HashContext::new(
                config.hash_key,
                [0; 32],
                config.model_id.clone(),
                layout.block_size,
            ),
        });
        let (cmd_tx, cmd_rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(EngineStats {
            block_size: layout.block_size,
            spec_cost_ratio: 1.0,
            ..Default::default()
        }));
        let (kv_events, _) = broadcast::channel(1024);
        let handle = EngineHandle {
            cmd: cmd_tx,
            next_id: Arc::new(AtomicUsize::new(1)),
            queued: Default::default(),
            stats: stats.clone(),
            kv_events: kv_events.clone(),
            limits: limits.clone(),
        };
        kv.set_cache_shares(config.cache_shares);
        let mut sched = Scheduler::new(sched_cfg, kv);
        sched.set_speculation(config.speculative.clone(), runner.samples_on_device());
        let mut core = core::EngineCore {
            runner,
            handout: output::Handout::start(tokenizer),
            sched,
            sampler: StepSampler::new(),
            streams: Default::default(),
            cmd_rx,
            stats,
            kv_events,
            hasher: limits.hasher.clone(),
            matchers: Default::default(),
            timing: Default::default(),
        };
        let thread = std::thread::Builder::new()
            .name("cachet-engine".into())
            // The grammars follow each chosen token here (llguidance recurses over a
            // grammar's structure): the compile threads' stack.
            .stack_size(crate::grammar::STACK_BYTES)
            // `core` drops when `run` returns, and its hand-out drains first: every event queued
            // reaches its stream before the thread ends.
            .spawn(move || core.run())
            .expect("spawning the engine thread");
        Engine {
            handle,
            thread: Some(thread),
        }
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.handle.cmd.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl EngineHandle {
    /// Queues a request and returns its event stream, or refuses at once.
    pub fn submit(&self, mut req: EngineRequest) -> Result<RequestStream, EngineError> {
        let l = &self.limits;
        req.sampling.validate()?;
        req.sampling.validate_vocab(l.vocab)?;
        // The grammar compiles here, on the caller's thread: a constraint that does not is
        // refused before the request queues.
        let matcher = match &req.constraint {
            None => None,
            Some(c) => match &l.grammar {
                Some(g) => Some(Box::new(g.compile(c)?)),
                None => {
                    return Err(EngineError::InvalidRequest(
                        "structured outputs need the model's tokenizer".into(),
                    ))
                }
            },
        };
        if req.prompt.is_empty() {
            return Err(EngineError::InvalidRequest(
                "the prompt has no tokens".into(),
            ));
        }
        if req.max_tokens == 0 {
            return Err(EngineError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= l.vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {t} is outside the vocabulary of {}",
                l.vocab
            )));
        }
        if req.public_blocks > req.prompt.len() / l.block_size {
            return Err(EngineError::InvalidRequest(format!(
                "public_blocks ({}) is more than the prompt's {} full blocks",
                req.public_blocks,
                req.prompt.len() / l.block_size
            )));
        }
        // Saturating: a max_tokens near usize::MAX must be refused, not wrap into a small total.
        let total = req.prompt.len().saturating_add(req.max_tokens);
        if total > l.max_model_len {
            return Err(EngineError::InvalidRequest(format!(
                "prompt ({} tokens) + max_tokens ({}) = {total} exceeds max_model_len {} (the engine's --max-model-len)",
                req.prompt.len(),
                req.max_tokens,
                l.max_model_len
            )));
        }
        if total.div_ceil(l.block_size) > l.num_blocks {
            return Err(EngineError::InvalidRequest(format!(
                "{total} tokens need more KV blocks than the cache has ({} of {})",
                total.div_ceil(l.block_size),
                l.num_blocks
            )));
        }
        // Admission: count requests and prompt tokens not yet started; refuse beyond a limit
        // (under fair sharing, not a tenant below its share of the queue).
        let prompt_len = req.prompt.len();
        {
            let mut q = self.queued.lock().expect("queue lock");
            let fair = l.fair_share && q.under_share(&req.tag, req.share, l.max_waiting);
            if q.requests >= l.max_waiting && !fair {
                return Err(EngineError::Overloaded {
                    waiting: q.requests,
                    limit: l.max_waiting,
                });
            }
            if q.requests > 0 && q.tokens + prompt_len > l.max_waiting_tokens && !fair {
                return Err(EngineError::OverloadedTokens {
                    queued: q.tokens,
                    prompt: prompt_len,
                    limit: l.max_waiting_tokens,
                });
            }
            q.requests += 1;
            q.tokens += prompt_len;
            let t = q.tenants.entry(req.tag.clone()).or_insert((0, req.share));
            t.0 += 1;
            t.1 = req.share;
        }
        if !req.ignore_eos {
            for &e in &l.eos {
                if !req.stop_token_ids.contains(&e) {
                    req.stop_token_ids.push(e);
                }
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) as RequestId;
        let ticket = Arc::new(Ticket {
            queue: self.queued.clone(),
            prompt_len,
            tag: req.tag.clone(),
            left: Default::default(),
        });
        let (tx, rx) = tmpsc::unbounded_channel();
        if self
            .cmd
            .send(Command::Add {
                id,
                req: Box::new(req),
                arrival: Instant::now(),
                tx,
                ticket: ticket.clone(),
                matcher,
            })
            .is_err()
        {
            ticket.leave();
            return Err(EngineError::Shutdown);
        }
        Ok(RequestStream {
            id,
            rx,
            cmd: self.cmd.clone(),
            done: false,
            ticket,
        })
    }

    pub fn stats(&self) -> EngineStats {
        self.stats.lock().expect("stats lock").clone()
    }

    /// KV events (blocks stored / removed), one batch per step.
    pub fn subscribe_kv_events(&self) -> broadcast::Receiver<Vec<KvEvent>> {
        self.kv_events.subscribe()
    }

    /// Block hashes of `tokens` for a tenant salt, as the engine computes them.
    pub fn hash_context(&self, salt: [u8; 32]) -> HashContext {
        HashContext {
            salt,
            ..self.limits.hasher.clone()
        }
    }

    pub fn block_size(&self) -> usize {
        self.limits.block_size
    }
    pub fn max_model_len(&self) -> usize {
        self.limits.max_model_len
    }
}
