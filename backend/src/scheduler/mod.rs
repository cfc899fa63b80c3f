//! The scheduler: continuous batching at token granularity, after vLLM v1. It plans; it does
//! not build device batches or sample (that is the runner's side: `model::input_batch`,
//! `sampler::StepSampler`).
//!
//! One counter model: every request has `num_computed` tokens catching up to its known tokens
//! (prompt + output). A step gives each scheduled request some new tokens to compute: a prefill
//! chunk, a prefix-hit remainder, or one decode token: all the same thing. Budget per step:
//! `max_num_batched_tokens` tokens and `max_num_seqs` sequences. Running requests are served first
//! (decode before new prefill); when blocks run out the lowest-priority (then newest) running
//! request is preempted by recompute: its blocks are freed and it re-queues with its output so far,
//! so nothing is lost and, with batch-invariant kernels, its output does not change.
//!
//! - [`policy`]: the waiting queue's order and the preemption victim;
//! - [`fair`]: token-fair sharing between tenants (with `fair_share`, the policy orders requests
//!   inside a tenant, the tenants' virtual token counters order the tenants);
//! - [`seq`]: a request's state inside the scheduler;
//! - [`output`]: the records of a step ([`SchedulerOutput`] out, [`SampledSeq`] back in).

pub mod fair;
pub mod output;
pub mod policy;
mod room;
pub mod seq;
pub mod step_time;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use room::StepRoom;

pub use output::{RequestId, SampledSeq, ScheduledSeq, SchedulerOutput, StepToken};
pub use policy::{SchedulerConfig, SchedulingPolicy};
pub use seq::{Seq, Status};

use crate::block_hash::HashContext;
use crate::kv::manager::ComputedBlocks;
use crate::kv::KvCacheManager;
use crate::request::EngineRequest;
use crate::sampler::RowLogprobs;
use crate::spec::{SpecConfig, SpecState, StepCost, MAX_SPECULATIVE_TOKENS};

/// Counters the engine exports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SchedulerCounters {
    pub prefix_queried_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub preemptions: u64,
    pub steps: u64,
    pub prompt_tokens_computed: u64,
    pub generated_tokens: u64,
    /// Draft tokens proposed and accepted by speculative decoding.
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    /// Verifications by the number of drafts accepted (0..=k).
    pub spec_acceptance_lengths: [u64; MAX_SPECULATIVE_TOKENS + 1],
    /// 1 when the last step could speculate, 0 when speculation is configured but stood down
    /// (too many decoding requests), 0 when not configured.
    pub spec_active: u64,
}

pub struct Scheduler {
    pub config: SchedulerConfig,
    pub kv: KvCacheManager,
    waiting: Vec<Seq>,
    running: Vec<Seq>,
    next_seq_no: u64,
    pub counters: SchedulerCounters,
    spec: Option<SpecConfig>,
    /// Measured cost of verification steps relative to plain decode steps.
    step_cost: StepCost,
    /// Step time against tokens, for `max_step_secs`.
    step_time: step_time::StepTimeFit,
    /// The runner picks tokens on the device (argmax per row there): sampled requests cannot
    /// be verified exactly and do not speculate.
    device_samples: bool,
    /// The tenants' virtual token counters (used under `fair_share`).
    pub fair: fair::FairShare,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, kv: KvCacheManager) -> Self {
        Scheduler {
            config,
            kv,
            waiting: Vec::new(),
            running: Vec::new(),
            next_seq_no: 0,
            counters: SchedulerCounters::default(),
            spec: None,
            step_cost: StepCost::default(),
            step_time: Default::default(),
            device_samples: false,
            fair: fair::FairShare::default(),
        }
    }

    /// Tenant `t`'s fair-share counter (requests are grouped by their `tag`).
    fn counter_of(&self, s: &Seq) -> f64 {
        self.fair.counter(&s.req.tag)
    }

    /// Charges the tokens of `sc` (for `s`) to its tenant: the sampled positions as generated
    /// tokens, the rest as prompt tokens.
    fn charge(&mut self, sc: &ScheduledSeq, s: &Seq) {
        if !self.config.fair_share {
            return;
        }
        let generated = if sc.sample { 1 + sc.drafts.len() } else { 0 };
        let prompt = sc.num_new().saturating_sub(generated);
        self.fair.charge(&s.req.tag, prompt, generated, s.req.share);
    }

    /// Turns n-gram speculative decoding on (see [`crate::spec`]).
    pub fn set_speculation(&mut self, spec: Option<SpecConfig>, device_samples: bool) {
        self.spec = spec;
        self.device_samples = device_samples;
    }

    /// Draft tokens for running request `i` this step: none while it cools down, never past its
    /// token limits or `budget`.
    fn propose_drafts(&mut self, i: usize, budget: usize) -> Vec<u32> {
        let Some(cfg) = &self.spec else {
            return Vec::new();
        };
        let max_model_len = self.config.max_model_len;
        let s = &mut self.running[i];
        let room = cfg
            .num_speculative_tokens
            .min(s.req.max_tokens.saturating_sub(s.num_output() + 1))
            .min(max_model_len.saturating_sub(s.tokens.len()))
            .min(budget.saturating_sub(1));
        let Some(st) = s.spec.as_mut() else {
            return Vec::new();
        };
        if st.cooldown > 0 {
            st.cooldown -= 1;
            return Vec::new();
        }
        st.index.propose(&s.tokens, room)
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }
    pub fn get(&self, id: RequestId) -> Option<&Seq> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .find(|s| s.id == id)
    }
    pub fn ids(&self) -> Vec<RequestId> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .map(|s| s.id)
            .collect()
    }

    /// Queues a request. `hasher` carries the deployment key, model id and the request's salt.
    pub fn add(
        &mut self,
        id: RequestId,
        req: EngineRequest,
        hasher: HashContext,
        arrival: Instant,
    ) {
        if self.config.fair_share
            && !self
                .running
                .iter()
                .chain(self.waiting.iter())
                .any(|s| s.req.tag == req.tag)
        {
            let active: Vec<f64> = self
                .running
                .iter()
                .chain(self.waiting.iter())
                .map(|s| self.fair.counter(&s.req.tag))
                .collect();
            self.fair.activate(&req.tag, active.into_iter());
        }
        self.kv
            .set_owner(id, &req.tag, req.share, req.public_blocks);
        let tokens = req.prompt.clone();
        let block_hashes = hasher.hash_all(&tokens);
        let seq = Seq {
            id,
            prompt_len: tokens.len(),
            tokens,
            num_computed: 0,
            status: Status::Waiting,
            arrival,
            seq_no: self.next_seq_no,
            hasher,
            block_hashes,
            cached_tokens: None,
            first_scheduled: None,
            first_token: None,
            last_token: None,
            preemptions: 0,
            spec: self
                .spec
                .as_ref()
                .filter(|_| !self.device_samples || req.sampling.is_greedy())
                .map(SpecState::new),
            history: crate::sampler::TokenHistory::new(&req.sampling, &req.prompt),
            req,
        };
        self.next_seq_no += 1;
        self.waiting.push(seq);
    }

    /// Removes a request wherever it is, freeing its blocks at once.
    pub fn remove(&mut self, id: RequestId) -> Option<Seq> {
        let seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else {
            let i = self.waiting.iter().position(|s| s.id == id)?;
            self.waiting.remove(i)
        };
        self.kv.free(id);
        self.kv.forget(id);
        if self.config.fair_share {
            let active: Vec<&str> = self
                .running
                .iter()
                .chain(self.waiting.iter())
                .map(|s| s.req.tag.as_str())
                .collect();
            self.fair.prune(active.into_iter());
        }
        Some(seq)
    }

    fn preempt(&mut self, idx: usize, out: &mut SchedulerOutput) {
        let mut s = self.running.remove(idx);
        self.kv.free(s.id);
        s.num_computed = 0;
        s.status = Status::Waiting;
        s.preemptions += 1;
        self.counters.preemptions += 1;
        out.scheduled.retain(|x| x.id != s.id);
        out.preempted.push(s.id);
        self.waiting.push(s);
    }

    /// The entry for `s` computing `tokens` after `num_computed` (its blocks already allocated).
    fn entry(
        &self,
        s: &Seq,
        num_computed: usize,
        tokens: Vec<u32>,
        sample: bool,
        drafts: Vec<u32>,
    ) -> ScheduledSeq {
        ScheduledSeq {
            id: s.id,
            num_computed,
            tokens,
            block_table: self.kv.block_table(s.id).to_vec(),
            sample,
            edits: if sample && s.req.sampling.has_processors() {
                s.row_edits(&drafts)
            } else {
                Vec::new()
            },
            drafts,
            sampling: s.req.sampling.clone(),
            seed: s.seed(),
            num_output: s.num_output(),
        }
    }

    /// The waiting request next in line: under fair sharing the tenant furthest below its
    /// share, then the policy inside it.
    fn next_waiting(&self, now: Instant) -> Option<usize> {
        let key = |j: usize| policy::waiting_key(&self.config, &self.waiting[j], now);
        if self.config.fair_share {
            (0..self.waiting.len()).min_by(|&a, &b| {
                self.counter_of(&self.waiting[a])
                    .total_cmp(&self.counter_of(&self.waiting[b]))
                    .then_with(|| key(a).cmp(&key(b)))
            })
        } else {
            (0..self.waiting.len()).min_by_key(|&j| key(j))
        }
    }

    /// One scheduling decision.
    pub fn schedule(&mut self, now: Instant) -> SchedulerOutput {
        self.schedule_with(now, &mut |_, drafts| drafts.len())
    }

    /// [`Scheduler::schedule`], with `valid_drafts(request, drafts)` saying how many leading
    /// drafts a request may verify (its grammar's say; the rest are dropped before any slot is
    /// allocated for them).
    pub fn schedule_with(
        &mut self,
        now: Instant,
        valid_drafts: &mut dyn FnMut(RequestId, &[u32]) -> usize,
    ) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        self.order_running(now);
        let speculate = self.speculating();
        // Each tenant's share of the slots, once per step (fair sharing only).
        let (held, over) = if self.config.fair_share {
            let shares = self.slot_shares();
            (self.held_prefills(now, &shares), Self::over_share(&shares))
        } else {
            (Vec::new(), Vec::new())
        };
        let mut room = StepRoom::new(self, &over, &held);
        // 1. Running requests, in order: decodes and unfinished prefill chunks.
        self.schedule_running(&mut room, &mut out, speculate, valid_drafts);
        // Budget spent on requests that were preempted later in the loop comes back.
        room.budget = room.cap.saturating_sub(out.num_new_tokens());
        // What the running requests got is charged once the step's set is final.
        if self.config.fair_share {
            let running = std::mem::take(&mut self.running);
            let at: HashMap<RequestId, usize> =
                running.iter().enumerate().map(|(k, s)| (s.id, k)).collect();
            for sc in &out.scheduled {
                if let Some(&k) = at.get(&sc.id) {
                    self.charge(sc, &running[k]);
                }
            }
            self.running = running;
        }
        // 2. Waiting requests, by policy, unless this step had to preempt.
        if out.preempted.is_empty() {
            self.schedule_waiting(now, &mut room, &mut out);
        }
        out.num_batched_tokens = out.num_new_tokens();
        if !out.is_empty() {
            self.counters.steps += 1;
        }
        out
    }

    /// Decodes first (in their order), then unfinished prefills by policy, so a short prompt is
    /// not stuck behind a long prompt's chunks under shortest-first.
    fn order_running(&mut self, now: Instant) {
        let mut running = std::mem::take(&mut self.running);
        let (mut decoding, mut prefilling): (Vec<Seq>, Vec<Seq>) = running
            .drain(..)
            .partition(|s| s.num_computed >= s.prompt_len);
        if self.config.fair_share {
            prefilling.sort_by(|a, b| {
                self.counter_of(a)
                    .total_cmp(&self.counter_of(b))
                    .then_with(|| {
                        policy::waiting_key(&self.config, a, now).cmp(&policy::waiting_key(
                            &self.config,
                            b,
                            now,
                        ))
                    })
            });
        } else {
            prefilling.sort_by_key(|s| policy::waiting_key(&self.config, s, now));
        }
        decoding.append(&mut prefilling);
        self.running = decoding;
    }

    /// Whether this step speculates: speculation stands down when many requests decode
    /// (verifying drafts then costs compute a small, memory-bound batch gets for free).
    fn speculating(&mut self) -> bool {
        let decoding = self
            .running
            .iter()
            .filter(|s| s.num_computed + 1 == s.tokens.len())
            .count();
        let speculate = self
            .spec
            .as_ref()
            .is_some_and(|c| decoding <= c.disable_by_batch_size);
        self.counters.spec_active = speculate as u64;
        speculate
    }

    /// The running requests' share of the step, in order: drafts for a decode where speculation
    /// runs (only into free blocks), else the tokens the room grants, preempting by policy when
    /// the KV cache is full.
    fn schedule_running(
        &mut self,
        room: &mut StepRoom<'_>,
        out: &mut SchedulerOutput,
        speculate: bool,
        valid_drafts: &mut dyn FnMut(RequestId, &[u32]) -> usize,
    ) {
        let mut i = 0;
        while i < self.running.len() && room.budget > 0 {
            let (id, num_computed, want) = {
                let s = &self.running[i];
                (s.id, s.num_computed, s.tokens.len() - s.num_computed)
            };
            if speculate && want == 1 && self.schedule_drafts(i, room, out, valid_drafts) {
                i += 1;
                continue;
            }
            let tag = &self.running[i].req.tag;
            let num_new = room.grant(tag, want, want > 1);
            if num_new == 0 || (want > 1 && room.held.contains(tag)) {
                i += 1;
                continue;
            }
            let mut scheduled = true;
            loop {
                // Disjoint fields: the KV manager mutably, the request's hashes shared (no copy per step).
                if self.kv.allocate_slots(
                    id,
                    &ComputedBlocks::default(),
                    num_computed,
                    num_new,
                    &self.running[i].block_hashes,
                ) {
                    break;
                }
                let v = policy::victim(&self.config, &self.running, &self.fair);
                let victim_id = self.running[v].id;
                self.preempt(v, out);
                if victim_id == id {
                    scheduled = false;
                    break;
                }
                if v < i {
                    i -= 1;
                }
            }
            if !scheduled {
                continue; // `i` now points at the next request
            }
            let s = &self.running[i];
            let toks = s.tokens[num_computed..num_computed + num_new].to_vec();
            out.scheduled
                .push(self.entry(s, num_computed, toks, num_new == want, Vec::new()));
            room.take(&self.running[i].req.tag, want > 1, num_new);
            i += 1;
        }
    }

    /// Schedules running request `i`'s decode with drafts, if any are proposed, allowed by
    /// `valid_drafts` and fit in free blocks (drafts never preempt anyone); whether it did.
    fn schedule_drafts(
        &mut self,
        i: usize,
        room: &mut StepRoom<'_>,
        out: &mut SchedulerOutput,
        valid_drafts: &mut dyn FnMut(RequestId, &[u32]) -> usize,
    ) -> bool {
        let (id, num_computed) = (self.running[i].id, self.running[i].num_computed);
        let mut drafts = self.propose_drafts(i, room.budget);
        if !drafts.is_empty() {
            let keep = valid_drafts(id, &drafts);
            drafts.truncate(keep);
        }
        if drafts.is_empty()
            || !self.kv.allocate_slots(
                id,
                &ComputedBlocks::default(),
                num_computed,
                1 + drafts.len(),
                &self.running[i].block_hashes,
            )
        {
            return false;
        }
        room.budget -= 1 + drafts.len();
        let s = &self.running[i];
        // The last known token, then the drafts; logits at every one of them.
        let mut toks = vec![s.tokens[num_computed]];
        toks.extend_from_slice(&drafts);
        out.scheduled
            .push(self.entry(s, num_computed, toks, true, drafts));
        true
    }

    /// Waiting requests admitted by policy while the step has room: a full batch makes room
    /// only for a tenant below its share (fair sharing), a prompt takes what the room grants
    /// (whole, without chunked prefill), and the first that does not fit ends the admissions.
    fn schedule_waiting(
        &mut self,
        now: Instant,
        room: &mut StepRoom<'_>,
        out: &mut SchedulerOutput,
    ) {
        let mut admitted_prompt = false;
        while room.budget + room.extra > 0 && !self.waiting.is_empty() {
            let best = self.next_waiting(now).expect("non-empty");
            if room.held.contains(&self.waiting[best].req.tag) {
                break; // a tenant under its share prefills this step
            }
            if let Some(d) = self.waiting[best].req.deadline {
                if d <= now {
                    break; // the engine reaps expired requests
                }
            }
            if self.running.len() >= self.config.max_num_seqs {
                // Full. Under fair sharing a tenant below its share does not wait for a slot of
                // the tenant furthest over it: that tenant's newest request makes room (preempted
                // by recompute; its cached blocks stay cached).
                let Some(v) = self.displaceable(best) else {
                    break;
                };
                self.preempt(v, out);
                room.budget = room.cap.saturating_sub(out.num_new_tokens());
                continue;
            }
            let s = &self.waiting[best];
            let hit = self.kv.computed_blocks(&s.block_hashes, s.tokens.len());
            let num_computed = hit.num_tokens;
            let want = s.tokens.len() - num_computed;
            if !self.config.enable_chunked_prefill && want > room.room(&s.req.tag, true) {
                // Unchunked, a prompt goes whole or waits. The step-time target must not hold the
                // queue's head back for good (its budget can sit below a whole prompt, and with no
                // step run the fit never changes): the step's first prompt goes past the target
                // when the token limit holds it.
                let used = out.num_new_tokens();
                if admitted_prompt || used + want > self.config.max_num_batched_tokens {
                    break;
                }
                room.budget += want - room.room(&s.req.tag, true);
            }
            let num_new = room.grant(&s.req.tag, want, true);
            if num_new == 0 {
                break; // the capped tenant's prompt tokens for this step are spent
            }
            if !self
                .kv
                .allocate_slots(s.id, &hit, num_computed, num_new, &s.block_hashes)
            {
                break;
            }
            let mut s = self.waiting.remove(best);
            if s.cached_tokens.is_none() {
                s.cached_tokens = Some(num_computed.min(s.prompt_len));
                self.counters.prefix_queried_tokens += s.prompt_len as u64;
                self.counters.prefix_hit_tokens += num_computed.min(s.prompt_len) as u64;
            }
            s.first_scheduled.get_or_insert(now);
            s.num_computed = num_computed;
            s.status = Status::Running;
            let toks = s.tokens[num_computed..num_computed + num_new].to_vec();
            let entry = self.entry(&s, num_computed, toks, num_new == want, Vec::new());
            self.charge(&entry, &s);
            out.scheduled.push(entry);
            room.take(&s.req.tag, true, num_new);
            admitted_prompt = true;
            self.running.push(s);
        }
    }

    /// Records how long the forward pass of `out` took, for speculation's cost model: decode-only
    /// steps small enough to speculate count, with drafts as verification steps.
    pub fn record_step_time(&mut self, out: &SchedulerOutput, secs: f64) {
        self.step_time
            .record(out.scheduled.iter().map(|s| s.num_new()).sum(), secs);
        let Some(cfg) = &self.spec else {
            return;
        };
        let decode_only = out
            .scheduled
            .iter()
            .all(|sc| sc.sample && sc.num_new() == sc.drafts.len() + 1);
        if !decode_only || out.scheduled.len() > cfg.disable_by_batch_size {
            return;
        }
        let verified = out.scheduled.iter().any(|sc| !sc.drafts.is_empty());
        self.step_cost.record(verified, secs);
    }

    /// What a verification step has cost relative to a plain decode step (1 until measured).
    pub fn spec_cost_ratio(&self) -> f64 {
        self.step_cost.ratio()
    }

    /// Applies what a step sampled (`sampled[i]` for `out.scheduled[i]`): advances counters,
    /// appends the tokens and decides which requests finish. Finished requests stay until
    /// [`Scheduler::remove`].
    pub fn update(
        &mut self,
        out: &SchedulerOutput,
        sampled: &[SampledSeq],
        now: Instant,
    ) -> Vec<StepToken> {
        assert_eq!(
            out.scheduled.len(),
            sampled.len(),
            "one sampled entry per scheduled one"
        );
        let mut produced = Vec::new();
        let cost = self.step_cost.ratio();
        let max_model_len = self.config.max_model_len;
        for (sc, got) in out.scheduled.iter().zip(sampled) {
            let Some(s) = self.running.iter_mut().find(|s| s.id == sc.id) else {
                continue;
            };
            if !sc.drafts.is_empty() {
                // The accepted drafts, then the model's own token; a finish stops the run.
                let emitted = append_tokens(
                    s,
                    &got.tokens,
                    &got.logprobs,
                    now,
                    max_model_len,
                    &mut produced,
                );
                self.counters.generated_tokens += emitted as u64;
                let accepted = got.accepted_drafts.min(emitted);
                // Positions up to the last emitted token hold the right K/V (the last known token
                // and the accepted drafts); slots past them are rolled back.
                s.num_computed = sc.num_computed + emitted;
                self.kv.truncate(s.id, s.tokens.len());
                self.counters.spec_draft_tokens += sc.drafts.len() as u64;
                self.counters.spec_accepted_tokens += accepted as u64;
                self.counters.spec_acceptance_lengths[accepted] += 1;
                if let (Some(cfg), Some(st)) = (&self.spec, s.spec.as_mut()) {
                    st.record(cfg, sc.drafts.len(), accepted, cost);
                }
                continue;
            }
            s.num_computed = sc.num_computed + sc.num_new();
            if sc.num_computed < s.prompt_len {
                self.counters.prompt_tokens_computed +=
                    (s.num_computed.min(s.prompt_len) - sc.num_computed) as u64;
            }
            if sc.sample {
                let one = &got.tokens[..got.tokens.len().min(1)];
                let emitted =
                    append_tokens(s, one, &got.logprobs, now, max_model_len, &mut produced);
                self.counters.generated_tokens += emitted as u64;
            }
        }
        produced
    }

    /// Requests whose deadline has passed.
    pub fn expired(&self, now: Instant) -> Vec<RequestId> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .filter(|s| s.req.deadline.is_some_and(|d| d <= now))
            .map(|s| s.id)
            .collect()
    }

    /// How long the oldest waiting request has waited.
    pub fn oldest_wait(&self, now: Instant) -> Duration {
        self.waiting
            .iter()
            .map(|s| now.saturating_duration_since(s.arrival))
            .max()
            .unwrap_or_default()
    }
}

/// Appends `tokens` to `s` until one of them finishes it, each as a [`StepToken`]; how many were
/// appended.
fn append_tokens(
    s: &mut Seq,
    tokens: &[u32],
    logprobs: &[RowLogprobs],
    now: Instant,
    max_model_len: usize,
    produced: &mut Vec<StepToken>,
) -> usize {
    for (n, &tok) in tokens.iter().enumerate() {
        let finish = s.append(tok, now, max_model_len);
        produced.push(StepToken {
            id: s.id,
            token: tok,
            finish,
            logprobs: logprobs.get(n).cloned(),
        });
        if finish.is_some() {
            return n + 1;
        }
    }
    tokens.len()
}
