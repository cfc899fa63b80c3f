//! A step's room: the token budget and the running slots as each tenant may use them under
//! fair sharing ([`StepRoom`]), and what the scheduler reads to set it up — each tenant's
//! share of the slots, who is over it, whose prefills wait.

use super::*;
use std::collections::HashMap;
use std::time::Instant;

/// What one step may still take, and the fair-sharing rules it applies.
pub(super) struct StepRoom<'a> {
    /// The step's token cap ([`Scheduler::step_token_cap`]).
    pub(super) cap: usize,
    /// Tokens left under the cap.
    pub(super) budget: usize,
    /// Past a step-time target, the prompt of a tenant within its share still goes in one step
    /// beside a tenant over its own: the tokens between the target's budget and
    /// `max_num_batched_tokens` are that prefill's (the flood's decodes pay the longer step).
    pub(super) extra: usize,
    /// With a prefill cap, the tenants over their share prefill at most `cap_left` more tokens
    /// this step.
    pub(super) capped: &'a [String],
    pub(super) cap_left: usize,
    /// The tenants over their share of the slots, and those whose prefill waits this step.
    pub(super) over: &'a [String],
    pub(super) held: &'a [String],
}

impl<'a> StepRoom<'a> {
    pub(super) fn new(sched: &Scheduler, over: &'a [String], held: &'a [String]) -> Self {
        let cap = sched.step_token_cap();
        let c = &sched.config;
        StepRoom {
            cap,
            budget: cap,
            extra: if over.is_empty() {
                0
            } else {
                c.max_num_batched_tokens - cap
            },
            capped: if c.fair_prefill_cap > 0 && c.enable_chunked_prefill {
                over
            } else {
                &[]
            },
            cap_left: c.fair_prefill_cap,
            over,
            held,
        }
    }

    /// Tokens a request of `tag` may take now: the step's budget, and the extra for a prefill of
    /// a tenant not over its share.
    pub(super) fn room(&self, tag: &str, prefill: bool) -> usize {
        if prefill && !self.over.iter().any(|t| t == tag) {
            self.budget + self.extra
        } else {
            self.budget
        }
    }

    /// What a request of `tag` that wants `want` tokens gets now (a capped tenant's prefill at
    /// most what its cap has left).
    pub(super) fn grant(&self, tag: &str, want: usize, prefill: bool) -> usize {
        let n = want.min(self.room(tag, prefill));
        if prefill && self.capped.iter().any(|t| t == tag) {
            n.min(self.cap_left)
        } else {
            n
        }
    }

    /// Takes `n` tokens from the budget (then the extra), and from the cap of a capped prefill.
    pub(super) fn take(&mut self, tag: &str, prefill: bool, n: usize) {
        self.extra -= n.saturating_sub(self.budget);
        self.budget = self.budget.saturating_sub(n);
        if prefill && self.capped.iter().any(|t| t == tag) {
            self.cap_left -= n;
        }
    }
}

impl Scheduler {
    /// Each tenant's share of the sequence slots (`max_num_seqs` split by the shares of the
    /// tenants with requests) and the slots it holds.
    pub(super) fn slot_shares(&self) -> HashMap<&str, (f64, f64)> {
        let mut shares: HashMap<&str, (f64, f64)> = HashMap::new();
        for x in self.waiting.iter() {
            shares
                .entry(&x.req.tag)
                .or_insert((x.req.share.max(1e-3) as f64, 0.0));
        }
        for x in self.running.iter() {
            shares
                .entry(&x.req.tag)
                .or_insert((x.req.share.max(1e-3) as f64, 0.0))
                .1 += 1.0;
        }
        let total: f64 = shares.values().map(|x| x.0).sum();
        for x in shares.values_mut() {
            x.0 = self.config.max_num_seqs as f64 * x.0 / total;
        }
        shares
    }

    /// Under fair sharing, the running request to preempt so that waiting request `w` can run
    /// when every sequence slot is taken: one of the tenant furthest over its share (the largest
    /// counter), when that tenant keeps at least its share of the slots without it and `w`'s
    /// tenant stays within its share with one more, and `w`'s tenant is not above it. The move
    /// cannot be undone by another.
    pub(super) fn displaceable(&self, w: usize) -> Option<usize> {
        if !self.config.fair_share || self.running.is_empty() {
            return None;
        }
        let v = policy::victim(&self.config, &self.running, &self.fair);
        let (wt, vt) = (&self.waiting[w].req.tag, &self.running[v].req.tag);
        if wt == vt || self.counter_of(&self.waiting[w]) > self.counter_of(&self.running[v]) {
            return None;
        }
        let shares = self.slot_shares();
        let (wf, ws) = shares[wt.as_str()];
        let (vf, vs) = shares[vt.as_str()];
        (ws + 1.0 <= wf && vs - 1.0 >= vf).then_some(v)
    }

    /// Under fair sharing, the tenants whose prefill chunks wait this step: those holding more
    /// sequence slots than their share, when a tenant holding fewer than its share (and not
    /// above them) has the next prefill that can run — a running one, or the waiting request
    /// next in line when it can get a slot. Its first token then does not wait on their long
    /// prompts; their decodes still run. Empty when no tenant is under its share.
    pub(super) fn held_prefills(
        &self,
        now: Instant,
        shares: &HashMap<&str, (f64, f64)>,
    ) -> Vec<String> {
        let under = |t: &str| shares[t].1 < shares[t].0;
        let mut best: Option<(f64, &str)> = None;
        for s in self
            .running
            .iter()
            .filter(|s| s.tokens.len() - s.num_computed > 1)
        {
            let c = self.counter_of(s);
            if under(&s.req.tag) && best.is_none_or(|b| c < b.0) {
                best = Some((c, &s.req.tag));
            }
        }
        if let Some(w) = self.next_waiting(now) {
            let s = &self.waiting[w];
            let c = self.counter_of(s);
            let can_run =
                self.running.len() < self.config.max_num_seqs || self.displaceable(w).is_some();
            if can_run && under(&s.req.tag) && best.is_none_or(|b| c < b.0) {
                best = Some((c, &s.req.tag));
            }
        }
        let Some((c, t)) = best else {
            return Vec::new();
        };
        shares
            .iter()
            .filter(|(u, (fair, held))| **u != t && held > fair && self.fair.counter(u) >= c)
            .map(|(u, _)| u.to_string())
            .collect()
    }

    /// Under fair sharing, the tenants holding more sequence slots than their share while
    /// another tenant has requests: their prompt chunks keep to the prefill cap and to a
    /// step-time target's budget.
    pub(super) fn over_share(shares: &HashMap<&str, (f64, f64)>) -> Vec<String> {
        if shares.len() < 2 {
            return Vec::new();
        }
        shares
            .iter()
            .filter(|(_, (fair, held))| held > fair)
            .map(|(t, _)| t.to_string())
            .collect()
    }

    /// Tokens this step may hold: `max_num_batched_tokens`, or under a step-time target what
    /// the fit says finishes within it — but never fewer than the running decodes plus one KV
    /// block of prompt tokens, so decodes always run and prompts always advance (without
    /// chunked prefill the step's first prompt goes whole past it: `schedule_with`).
    pub(super) fn step_token_cap(&self) -> usize {
        let max = self.config.max_num_batched_tokens;
        if self.config.max_step_secs <= 0.0 {
            return max;
        }
        let Some(fit) = self.step_time.budget(self.config.max_step_secs) else {
            return max;
        };
        let decodes = self
            .running
            .iter()
            .filter(|s| s.num_computed + 1 >= s.tokens.len())
            .count();
        fit.max(decodes + self.kv.block_size()).min(max)
    }
}
