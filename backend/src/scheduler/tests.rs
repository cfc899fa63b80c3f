//! Golden scheduler tests that need no model (after vLLM's `tests/v1/core`): exact admitted
//! requests, token counts, block tables and preemption victims per step. Sampling is played by
//! the test: each sampled entry gets the token the test chooses.

use std::time::{Duration, Instant};

use super::*;
use crate::block_hash::HashContext;
use crate::kv::KvCacheManager;
use crate::request::{EngineRequest, FinishReason};
use crate::spec::SpecConfig;

const BS: usize = 4;

fn make_config(max_num_batched_tokens: usize, max_num_seqs: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens,
        max_model_len: 64,
        ..Default::default()
    }
}

fn make_scheduler(num_blocks: usize, config: SchedulerConfig) -> Scheduler {
    Scheduler::new(config, KvCacheManager::new(num_blocks, BS, 1.0, true))
}

fn make_request(prompt: &[u32], max_tokens: usize) -> EngineRequest {
    EngineRequest::new(prompt.to_vec(), max_tokens)
}

fn add(s: &mut Scheduler, id: RequestId, req: EngineRequest, t0: Instant) {
    s.add(id, req, HashContext::new([7; 32], [0; 32], "m", BS), t0);
}

/// Feeds a step back: every sampling entry gets `token`.
fn feed(s: &mut Scheduler, out: &SchedulerOutput, token: u32, now: Instant) -> Vec<StepToken> {
    let sampled: Vec<SampledSeq> = out
        .scheduled
        .iter()
        .map(|sc| SampledSeq {
            tokens: if sc.sample { vec![token] } else { vec![] },
            accepted_drafts: 0,
            logprobs: Default::default(),
        })
        .collect();
    s.update(out, &sampled, now)
}

/// (id, num_computed, number of new tokens, sample, block table) of each scheduled entry.
fn plan(out: &SchedulerOutput) -> Vec<(RequestId, usize, usize, bool, Vec<u32>)> {
    out.scheduled
        .iter()
        .map(|sc| {
            (
                sc.id,
                sc.num_computed,
                sc.num_new(),
                sc.sample,
                sc.block_table.clone(),
            )
        })
        .collect()
}

#[test]
fn admits_in_order_within_the_token_budget_and_chunks_the_rest() {
    let t0 = Instant::now();
    let mut s = make_scheduler(16, make_config(10, 4));
    add(&mut s, 1, make_request(&[1, 2, 3, 4, 5, 6], 8), t0);
    add(
        &mut s,
        2,
        make_request(&[11, 12, 13, 14, 15, 16, 17], 8),
        t0,
    );
    let out = s.schedule(t0);
    assert_eq!(
        plan(&out),
        vec![(1, 0, 6, true, vec![0, 1]), (2, 0, 4, false, vec![2])]
    );
    assert_eq!(out.scheduled[1].tokens, vec![11, 12, 13, 14]);
    assert_eq!((out.num_batched_tokens, out.preempted.len()), (10, 0));
    let produced = feed(&mut s, &out, 40, t0);
    assert_eq!(
        produced,
        vec![StepToken {
            id: 1,
            token: 40,
            finish: None,
            logprobs: Default::default(),
        }]
    );
    // Decodes first, then the unfinished chunk; the decode's token is the sampled one.
    let out = s.schedule(t0);
    assert_eq!(
        plan(&out),
        vec![(1, 6, 1, true, vec![0, 1]), (2, 4, 3, true, vec![2, 3])]
    );
    assert_eq!(out.scheduled[0].tokens, vec![40]);
    assert_eq!(out.scheduled[1].tokens, vec![15, 16, 17]);
    assert_eq!(
        (out.scheduled[0].num_output, out.scheduled[1].num_output),
        (1, 0)
    );
    assert_eq!(s.counters.prompt_tokens_computed, 10);
}

#[test]
fn max_num_seqs_leaves_the_rest_waiting() {
    let t0 = Instant::now();
    let mut s = make_scheduler(16, make_config(64, 2));
    for id in 1..=3 {
        add(&mut s, id, make_request(&[id as u32; 5], 4), t0);
    }
    let out = s.schedule(t0);
    assert_eq!(
        out.scheduled.iter().map(|x| x.id).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert_eq!((s.num_running(), s.num_waiting()), (2, 1));
}

#[test]
fn a_cached_prefix_is_reused_and_counted() {
    let t0 = Instant::now();
    let mut s = make_scheduler(16, make_config(64, 4));
    let shared: Vec<u32> = (1..=8).collect();
    let mut a = shared.clone();
    a.push(100);
    add(&mut s, 1, make_request(&a, 1), t0);
    let out = s.schedule(t0);
    assert_eq!(plan(&out), vec![(1, 0, 9, true, vec![0, 1, 2])]);
    let produced = feed(&mut s, &out, 5, t0);
    assert_eq!(produced[0].finish, Some(FinishReason::Length));
    s.remove(1);
    // Freed last block first: the cache keeps blocks 0 and 1 (the two full ones).
    let mut b = shared.clone();
    b.extend([200, 201]);
    add(&mut s, 2, make_request(&b, 4), t0);
    let out = s.schedule(t0);
    // Block 2 held no full block: it went back to the plain stack and is taken first.
    assert_eq!(plan(&out), vec![(2, 8, 2, true, vec![0, 1, 2])]);
    assert_eq!(out.scheduled[0].tokens, vec![200, 201]);
    assert_eq!(s.get(2).unwrap().cached_tokens, Some(8));
    assert_eq!(
        (
            s.counters.prefix_queried_tokens,
            s.counters.prefix_hit_tokens
        ),
        (9 + 10, 8)
    );
}

#[test]
fn preemption_takes_the_newest_and_requeues_it_with_its_output() {
    let t0 = Instant::now();
    let mut s = make_scheduler(3, make_config(64, 4));
    add(&mut s, 1, make_request(&[1, 2, 3, 4], 8), t0);
    add(&mut s, 2, make_request(&[5, 6, 7, 8], 8), t0);
    let out = s.schedule(t0);
    assert_eq!(
        plan(&out),
        vec![(1, 0, 4, true, vec![0]), (2, 0, 4, true, vec![1])]
    );
    feed(&mut s, &out, 9, t0);
    // Each decode needs a second block; one is free: the newer request gives its block up.
    let out = s.schedule(t0);
    assert_eq!(out.preempted, vec![2]);
    assert_eq!(plan(&out), vec![(1, 4, 1, true, vec![0, 2])]);
    assert_eq!(s.counters.preemptions, 1);
    let seq = s.get(2).unwrap();
    assert_eq!((seq.status, seq.num_computed), (Status::Waiting, 0));
    assert_eq!(seq.tokens, vec![5, 6, 7, 8, 9], "its output is kept");
    feed(&mut s, &out, 10, t0);
    // Nothing free for its five tokens (two blocks) while request 1 runs.
    let out = s.schedule(t0);
    assert_eq!(plan(&out), vec![(1, 5, 1, true, vec![0, 2])]);
    s.remove(1);
    // Its prompt block is still cached: only the output token is recomputed.
    let out = s.schedule(t0);
    assert_eq!(plan(&out), vec![(2, 4, 1, true, vec![1, 2])]);
    assert_eq!(out.scheduled[0].tokens, vec![9]);
    assert_eq!(out.scheduled[0].num_output, 1);
}

#[test]
fn priority_orders_the_queue_and_picks_the_victim() {
    let t0 = Instant::now();
    let mut cfg = make_config(64, 1);
    cfg.policy = SchedulingPolicy::Priority;
    let mut s = make_scheduler(16, cfg);
    let mut low = make_request(&[1, 2, 3], 4);
    low.priority = 5;
    let mut high = make_request(&[4, 5, 6], 4);
    high.priority = 0;
    add(&mut s, 1, low, t0);
    add(&mut s, 2, high, t0);
    let out = s.schedule(t0);
    assert_eq!(plan(&out), vec![(2, 0, 3, true, vec![0])]);

    // Preemption under priority: the lowest class goes, even when another request is the one
    // short of blocks.
    let mut cfg = make_config(64, 4);
    cfg.policy = SchedulingPolicy::Priority;
    let mut s = make_scheduler(3, cfg);
    let mut low = make_request(&[1, 2, 3], 4);
    low.priority = 5;
    add(&mut s, 1, low, t0);
    let out = s.schedule(t0);
    feed(&mut s, &out, 9, t0);
    add(&mut s, 2, make_request(&[5, 6, 7, 8], 4), t0);
    let out = s.schedule(t0);
    assert_eq!(
        plan(&out),
        vec![(1, 3, 1, true, vec![0]), (2, 0, 4, true, vec![1])]
    );
    feed(&mut s, &out, 9, t0);
    // Both need a second block; one is free. The low class takes it first, then gives
    // everything up when the other asks.
    let out = s.schedule(t0);
    assert_eq!(out.preempted, vec![1]);
    assert_eq!(plan(&out), vec![(2, 4, 1, true, vec![1, 2])]);
}

#[test]
fn shortest_first_runs_short_prompts_first_until_waiting_earns_credit() {
    let t0 = Instant::now();
    let mut s = make_scheduler(32, cfg_with_aging());
    add(&mut s, 1, make_request(&[1; 40], 2), t0);
    add(
        &mut s,
        2,
        make_request(&[2; 8], 2),
        t0 + Duration::from_secs(3),
    );
    // At t0 + 3 s: 40 − 30 = 10 against 8 − 0: the short one first.
    let out = s.schedule(t0 + Duration::from_secs(3));
    assert_eq!(out.scheduled[0].id, 2);
    // Had the long one waited 4 s (40 − 40 = 0), it would go first.
    let mut s2 = make_scheduler(32, cfg_with_aging());
    add(&mut s2, 1, make_request(&[1; 40], 2), t0);
    add(
        &mut s2,
        2,
        make_request(&[2; 8], 2),
        t0 + Duration::from_secs(4),
    );
    let out = s2.schedule(t0 + Duration::from_secs(4));
    assert_eq!(out.scheduled[0].id, 1);
}

fn cfg_with_aging() -> SchedulerConfig {
    let mut cfg = make_config(64, 1);
    cfg.policy = SchedulingPolicy::ShortestFirst;
    cfg.aging_tokens_per_sec = 10.0;
    cfg
}

#[test]
fn drafts_are_scheduled_with_logits_and_rejected_slots_are_rolled_back() {
    let t0 = Instant::now();
    let mut s = make_scheduler(16, make_config(64, 4));
    s.set_speculation(
        Some(SpecConfig {
            num_speculative_tokens: 2,
            min_speedup: 0.0,
            ..Default::default()
        }),
        false,
    );
    add(&mut s, 1, make_request(&[1, 2, 3, 4, 1, 2, 3], 16), t0);
    let out = s.schedule(t0);
    assert_eq!(plan(&out), vec![(1, 0, 7, true, vec![0, 1])]);
    feed(&mut s, &out, 4, t0);
    // "2 3 4" was followed by "1 2": both proposed after the last known token.
    let out = s.schedule(t0);
    assert_eq!(plan(&out), vec![(1, 7, 3, true, vec![0, 1, 2])]);
    assert_eq!(out.scheduled[0].tokens, vec![4, 1, 2]);
    assert_eq!(out.scheduled[0].drafts, vec![1, 2]);
    assert_eq!(out.scheduled[0].num_logit_rows(), 3);
    // The model agrees with the first draft, not the second: two tokens, the slot of the
    // rejected one rolled back.
    let produced = s.update(
        &out,
        &[SampledSeq {
            tokens: vec![1, 30],
            accepted_drafts: 1,
            logprobs: Default::default(),
        }],
        t0,
    );
    assert_eq!(
        produced.iter().map(|t| t.token).collect::<Vec<_>>(),
        vec![1, 30]
    );
    let seq = s.get(1).unwrap();
    assert_eq!(seq.tokens, vec![1, 2, 3, 4, 1, 2, 3, 4, 1, 30]);
    assert_eq!(seq.num_computed, 9);
    assert_eq!(s.kv.block_table(1), &[0, 1, 2]);
    assert_eq!(
        (
            s.counters.spec_draft_tokens,
            s.counters.spec_accepted_tokens,
            s.counters.spec_acceptance_lengths[1]
        ),
        (2, 1, 1)
    );
}

#[test]
fn a_stop_token_inside_accepted_drafts_ends_the_request_there() {
    let t0 = Instant::now();
    let mut s = make_scheduler(16, make_config(64, 4));
    s.set_speculation(
        Some(SpecConfig {
            num_speculative_tokens: 2,
            min_speedup: 0.0,
            ..Default::default()
        }),
        false,
    );
    let mut r = make_request(&[1, 2, 3, 4, 1, 2, 3], 16);
    r.stop_token_ids = vec![1];
    add(&mut s, 1, r, t0);
    let out = s.schedule(t0);
    feed(&mut s, &out, 4, t0);
    let out = s.schedule(t0);
    assert_eq!(out.scheduled[0].drafts, vec![1, 2]);
    let produced = s.update(
        &out,
        &[SampledSeq {
            tokens: vec![1, 2, 8],
            accepted_drafts: 2,
            logprobs: Default::default(),
        }],
        t0,
    );
    assert_eq!(
        produced,
        vec![StepToken {
            id: 1,
            token: 1,
            finish: Some(FinishReason::Stop),
            logprobs: Default::default(),
        }]
    );
    assert_eq!(s.counters.spec_accepted_tokens, 1);
}

#[test]
fn an_expired_request_is_not_admitted_and_is_reported() {
    let t0 = Instant::now();
    let mut s = make_scheduler(16, make_config(64, 4));
    let mut r = make_request(&[1, 2, 3], 4);
    r.deadline = Some(t0);
    add(&mut s, 1, r, t0);
    let out = s.schedule(t0 + Duration::from_millis(1));
    assert!(out.is_empty());
    assert_eq!(s.expired(t0 + Duration::from_millis(1)), vec![1]);
}
