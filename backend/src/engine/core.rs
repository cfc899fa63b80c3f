//! The engine thread's loop: take commands (add, cancel, shut down), reap requests whose
//! client went away or whose deadline passed, run one step (schedule → input batch → forward →
//! sample → update), pass the tokens to the hand-out thread ([`super::output`]), publish stats
//! and KV events.

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc as tmpsc};

use super::output::{Ending, Handout, HandoutMsg};
use super::{Command, EngineStats, Ticket};
use crate::block_hash::HashContext;
use crate::device::RowMasks;
use crate::grammar::Matcher;
use crate::kv::KvEvent;
use crate::model::input_batch;
use crate::model::step_sampler::StepSampler;
use crate::model::Runner;
use crate::request::{EngineEvent, FinishReason, RequestTimings};
use crate::scheduler::{RequestId, Scheduler};
use crate::EngineError;
use rayon::prelude::*;

/// The engine's side of a request's stream (the hand-out thread holds the text side).
pub(super) struct StreamState {
    /// Whether the client is still there.
    tx: tmpsc::UnboundedSender<EngineEvent>,
    /// The request's place in the queue, left at its first step (or its end).
    ticket: Arc<Ticket>,
}

pub(super) struct EngineCore {
    pub(super) runner: Box<dyn Runner>,
    /// Detokenizes and sends every stream's events on a thread of its own.
    pub(super) handout: Handout,
    pub(super) sched: Scheduler,
    pub(super) sampler: StepSampler,
    pub(super) streams: HashMap<RequestId, StreamState>,
    pub(super) cmd_rx: mpsc::Receiver<Command>,
    pub(super) stats: Arc<Mutex<EngineStats>>,
    pub(super) kv_events: broadcast::Sender<Vec<KvEvent>>,
    /// Block-hash context without the salt (each request brings its tenant's).
    pub(super) hasher: HashContext,
    /// The grammars of requests with structured outputs.
    pub(super) matchers: HashMap<RequestId, Box<Matcher>>,
    pub(super) timing: StepTiming,
}

/// Where the engine's time goes between steps (see [`EngineStats::step_gap_seconds`]).
#[derive(Default)]
pub(super) struct StepTiming {
    step_secs: f64,
    gap_secs: f64,
    /// When the last step's results reached the host, while there is still work.
    last_end: Option<Instant>,
}

impl EngineCore {
    pub(super) fn run(&mut self) {
        loop {
            // Block when idle; otherwise take whatever arrived.
            if !self.sched.has_work() {
                self.timing.last_end = None;
                match self.cmd_rx.recv() {
                    Ok(c) => {
                        if !self.apply(c) {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
            loop {
                match self.cmd_rx.try_recv() {
                    Ok(c) => {
                        if !self.apply(c) {
                            return;
                        }
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            }
            for id in self.handout.take_stopped() {
                self.finish(id, FinishReason::Stop, None);
            }
            self.reap();
            if self.sched.has_work() {
                self.step();
            }
            self.publish();
            if self.handout.lost() {
                // Dropping the engine's stream handles ends every client's stream.
                tracing::error!("stopping the engine: its token hand-out thread has ended");
                return;
            }
        }
    }

    /// Applies a command; `false` means shut down.
    fn apply(&mut self, c: Command) -> bool {
        match c {
            Command::Add {
                id,
                req,
                arrival,
                tx,
                ticket,
                matcher,
            } => {
                // A client gone before its request reached the engine: nothing to add.
                if ticket.has_left() {
                    return true;
                }
                if let Some(m) = matcher {
                    self.matchers.insert(id, m);
                }
                let hasher = HashContext {
                    salt: req.salt,
                    public_blocks: req.public_blocks,
                    ..self.hasher.clone()
                };
                self.handout.send(HandoutMsg::Open {
                    id,
                    tx: tx.clone(),
                    stops: req.stop.clone(),
                    min_tokens: req.sampling.min_tokens,
                });
                self.streams.insert(id, StreamState { tx, ticket });
                self.sched.add(id, *req, hasher, arrival);
            }
            Command::Cancel(id) => self.finish(id, FinishReason::Cancelled, None),
            Command::Shutdown => {
                for id in self.sched.ids() {
                    self.finish(
                        id,
                        FinishReason::Cancelled,
                        Some("engine shutting down".into()),
                    );
                }
                return false;
            }
        }
        true
    }

    /// Cancels requests whose client went away and those past their deadline.
    fn reap(&mut self) {
        let gone: Vec<RequestId> = self
            .streams
            .iter()
            .filter(|(_, s)| s.tx.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.finish(id, FinishReason::Cancelled, None);
        }
        for id in self.sched.expired(Instant::now()) {
            self.finish(id, FinishReason::Error, Some("deadline exceeded".into()));
        }
    }

    fn step(&mut self) {
        let now = Instant::now();
        // Drafts are checked against the request's grammar before they are scheduled.
        let matchers = &mut self.matchers;
        let out = self
            .sched
            .schedule_with(now, &mut |id, drafts| match matchers.get_mut(&id) {
                Some(m) => m.valid_prefix(drafts),
                None => drafts.len(),
            });
        for sc in &out.scheduled {
            if let Some(s) = self.streams.get(&sc.id) {
                s.ticket.leave();
            }
        }
        if out.is_empty() {
            // Nothing fits right now (e.g. a deadline-expired head); avoid a hot spin.
            std::thread::sleep(Duration::from_micros(200));
            return;
        }
        let (batch, mut plan) = input_batch::build(&out, self.sched.kv.block_size());
        let started = Instant::now();
        if let Some(end) = self.timing.last_end {
            self.timing.gap_secs += started.duration_since(end).as_secs_f64();
        }
        // The forward pass is queued on the device first; the grammar masks are computed on the
        // host meanwhile (on all cores), then applied before the tokens are chosen.
        let step = self.runner.forward_begin(&batch).and_then(|()| {
            let failed = self.grammar_masks(&out, &mut plan);
            let step = self.runner.forward_finish(&plan);
            for (id, e) in failed {
                self.finish(id, FinishReason::Error, Some(e));
            }
            step
        });
        let ended = Instant::now();
        self.timing.step_secs += ended.duration_since(started).as_secs_f64();
        self.timing.last_end = Some(ended);
        match step {
            Ok(step) => {
                self.sched
                    .record_step_time(&out, started.elapsed().as_secs_f64());
                let sampled = self.sampler.sample(&out, &step);
                // The grammars follow every token before the next step is scheduled; the tokens
                // go to their streams in one message, the ends after them. A request's tokens
                // after its end (a grammar completed or broken inside a speculative step) are
                // neither followed nor sent.
                let mut ends: Vec<(RequestId, FinishReason, Option<String>)> = Vec::new();
                let mut produced = self.sched.update(&out, &sampled, Instant::now());
                produced.retain(|t| {
                    if ends.iter().any(|e| e.0 == t.id) {
                        return false;
                    }
                    match (t.finish, self.follow_grammar(t.id, t.token)) {
                        (Some(reason), _) => ends.push((t.id, reason, None)),
                        (None, Err(e)) => {
                            ends.push((t.id, FinishReason::Error, Some(e.to_string())))
                        }
                        (None, Ok(true)) => ends.push((t.id, FinishReason::Stop, None)),
                        (None, Ok(false)) => {}
                    }
                    true
                });
                // The requests ending here first, so their clients hear of the end before the
                // step's other tokens are detokenized and sent (each stream's order is kept).
                let (ending, going): (Vec<_>, Vec<_>) = produced
                    .into_iter()
                    .partition(|t| ends.iter().any(|e| e.0 == t.id));
                if !ending.is_empty() {
                    self.handout.send(HandoutMsg::Tokens(ending));
                }
                for (id, reason, error) in ends {
                    self.finish(id, reason, error);
                }
                if !going.is_empty() {
                    self.handout.send(HandoutMsg::Tokens(going));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "forward pass failed; failing the step's requests");
                for sc in &out.scheduled {
                    self.finish(
                        sc.id,
                        FinishReason::Error,
                        Some(format!("engine error: {e}")),
                    );
                }
            }
        }
    }

    /// The grammar masks of the step's sampling rows whose request has a grammar, into
    /// `plan.masks`; the requests whose grammar failed, with why.
    fn grammar_masks(
        &mut self,
        out: &crate::scheduler::SchedulerOutput,
        plan: &mut crate::device::StepPlan,
    ) -> Vec<(RequestId, String)> {
        if self.matchers.is_empty() {
            return Vec::new();
        }
        let words = self.runner.config().vocab_size.div_ceil(32);
        // Each constrained entry's first logits row and drafts (one more row per draft).
        let mut rows: HashMap<RequestId, (u32, &[u32])> = HashMap::new();
        let mut row = 0u32;
        for sc in &out.scheduled {
            if sc.sample && self.matchers.contains_key(&sc.id) {
                rows.insert(sc.id, (row, &sc.drafts));
            }
            row += sc.num_logit_rows() as u32;
        }
        if rows.is_empty() {
            return Vec::new();
        }
        let mut jobs: Vec<(RequestId, u32, &[u32], &mut Box<Matcher>)> = self
            .matchers
            .iter_mut()
            .filter_map(|(id, m)| rows.get(id).map(|&(r, d)| (*id, r, d, m)))
            .collect();
        jobs.sort_by_key(|j| j.1);
        let n_rows: usize = jobs.iter().map(|j| 1 + j.2.len()).sum();
        let mut bits = vec![0u32; n_rows * words];
        // One slice of the masks per job, then all jobs at once on the host's cores.
        let mut slices = Vec::with_capacity(jobs.len());
        let mut rest = &mut bits[..];
        for j in &jobs {
            let (a, b) = rest.split_at_mut((1 + j.2.len()) * words);
            slices.push(a);
            rest = b;
        }
        // On the grammar threads, whose stacks are sized for the deepest grammar admitted.
        let results: Vec<Result<(), EngineError>> = crate::grammar::mask_pool().install(|| {
            jobs.par_iter_mut()
                .zip(slices.par_iter_mut())
                .map(|((_, _, drafts, m), out)| m.masks_through(drafts, out))
                .collect()
        });
        let mut failed = Vec::new();
        for ((id, ..), r) in jobs.iter().zip(&results) {
            if let Err(e) = r {
                failed.push((*id, e.to_string()));
            }
        }
        let mask_rows = jobs
            .iter()
            .flat_map(|j| j.1..j.1 + 1 + j.2.len() as u32)
            .collect();
        drop(slices);
        plan.masks = RowMasks {
            rows: mask_rows,
            words,
            bits,
        };
        failed
    }

    /// Follows a generated token in its request's grammar, if it has one: whether the grammar is
    /// now complete.
    fn follow_grammar(&mut self, id: RequestId, tok: u32) -> Result<bool, EngineError> {
        let Some(m) = self.matchers.get_mut(&id) else {
            return Ok(false);
        };
        m.consume(tok)?;
        Ok(m.is_stopped())
    }

    /// Ends a request: frees its blocks and has the hand-out thread send `Finished` (after the
    /// tokens already passed to it).
    fn finish(&mut self, id: RequestId, reason: FinishReason, error: Option<String>) {
        self.matchers.remove(&id);
        let Some(seq) = self.sched.remove(id) else {
            return;
        };
        let Some(st) = self.streams.remove(&id) else {
            return;
        };
        st.ticket.leave();
        let now = Instant::now();
        let since = |a: Option<Instant>, b: Instant| {
            a.map(|a| a.saturating_duration_since(b))
                .unwrap_or_default()
        };
        let timings = RequestTimings {
            queue: since(seq.first_scheduled, seq.arrival),
            prefill: seq
                .first_token
                .zip(seq.first_scheduled)
                .map(|(f, s)| f.saturating_duration_since(s))
                .unwrap_or_default(),
            ttft: since(seq.first_token, seq.arrival),
            e2e: now.saturating_duration_since(seq.arrival),
            mean_itl: Duration::ZERO,
            preemptions: seq.preemptions,
        };
        self.handout.send(HandoutMsg::Close {
            id,
            end: Ending {
                reason,
                error,
                prompt_tokens: seq.prompt_len,
                cached_tokens: seq.cached_tokens.unwrap_or(0),
                timings,
                itl_span: seq
                    .first_token
                    .zip(seq.last_token)
                    .map(|(f, l)| l.saturating_duration_since(f)),
            },
        });
    }

    fn publish(&mut self) {
        let events = self.sched.kv.take_events();
        if !events.is_empty() {
            let _ = self.kv_events.send(events);
        }
        let mut s = self.stats.lock().expect("stats lock");
        s.running = self.sched.num_running();
        s.waiting = self.sched.num_waiting();
        s.kv = self.sched.kv.usage();
        s.counters = self.sched.counters;
        s.spec_cost_ratio = self.sched.spec_cost_ratio();
        s.cached_by_tenant = self.sched.kv.pool().cached_idle_by_owner();
        s.step_seconds = self.timing.step_secs;
        s.step_gap_seconds = self.timing.gap_secs;
    }
}
