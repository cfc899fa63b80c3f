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

/// A scheduler with fair sharing on (64 blocks).
fn fair_scheduler(max_num_batched_tokens: usize, max_num_seqs: usize) -> Scheduler {
    let mut config = make_config(max_num_batched_tokens, max_num_seqs);
    config.fair_share = true;
    make_scheduler(64, config)
}

fn tenant_request(tenant: &str, share: f32, prompt_len: usize, max_tokens: usize) -> EngineRequest {
    let mut r = make_request(&vec![5; prompt_len], max_tokens);
    r.tag = tenant.into();
    r.share = share;
    r.ignore_eos = true;
    r
}

/// Runs steps (every sampled entry gets token 9) until `n` requests were admitted after the
/// ones already running; returns the tenants of those admissions in order.
fn admissions(s: &mut Scheduler, n: usize, t0: Instant) -> Vec<String> {
    let mut seen: std::collections::HashSet<RequestId> = s.running.iter().map(|x| x.id).collect();
    let mut order = Vec::new();
    for _ in 0..10_000 {
        let out = s.schedule(t0);
        for sc in &out.scheduled {
            if seen.insert(sc.id) {
                order.push(s.get(sc.id).unwrap().req.tag.clone());
            }
        }
        for t in feed(s, &out, 9, t0) {
            if t.finish.is_some() {
                s.remove(t.id);
            }
        }
        if order.len() >= n {
            break;
        }
    }
    order.truncate(n);
    order
}

#[test]
fn a_light_tenant_goes_before_a_flooding_ones_backlog_under_fair_share() {
    let t0 = Instant::now();
    for fair in [false, true] {
        let mut config = make_config(64, 2);
        config.fair_share = fair;
        let mut s = make_scheduler(64, config);
        for id in 0..6 {
            add(&mut s, id, tenant_request("a", 1.0, 4, 6), t0);
        }
        s.schedule(t0); // a's first two run
        add(&mut s, 100, tenant_request("b", 1.0, 4, 6), t0);
        let order = admissions(&mut s, 2, t0);
        if fair {
            // a's running requests were charged while b waited: b is below a's counter.
            assert_eq!(order, ["b", "a"], "fair share");
        } else {
            assert_eq!(order, ["a", "a"], "first come, first served");
        }
    }
}

#[test]
fn tenants_get_tokens_in_proportion_to_their_shares() {
    let t0 = Instant::now();
    let mut s = fair_scheduler(64, 1);
    for id in 0..40 {
        add(&mut s, id, tenant_request("a", 2.0, 4, 4), t0);
        add(&mut s, 100 + id, tenant_request("b", 1.0, 4, 4), t0);
    }
    let order = admissions(&mut s, 30, t0);
    let a = order.iter().filter(|t| *t == "a").count();
    assert!(
        (19..=21).contains(&a),
        "a (share 2) got {a} of 30: {order:?}"
    );
}

#[test]
fn an_idle_tenant_banks_no_credit_and_preemption_takes_from_the_tenant_furthest_over() {
    let t0 = Instant::now();
    let mut s = fair_scheduler(64, 2);
    // b was served once, long ago; a has run a lot since.
    add(&mut s, 1, tenant_request("b", 1.0, 4, 2), t0);
    admissions(&mut s, 1, t0);
    for id in 10..20 {
        add(&mut s, id, tenant_request("a", 1.0, 4, 4), t0);
    }
    admissions(&mut s, 8, t0);
    let before = s.fair.counter("b");
    assert!(before < s.fair.counter("a"));
    // b returns: it starts at a's level, not with the credit of its idle time.
    for id in 30..40 {
        add(&mut s, id, tenant_request("b", 1.0, 4, 4), t0);
    }
    assert!(s.fair.counter("b") >= s.fair.counter("a") - 1e-9);
    let order = admissions(&mut s, 6, t0);
    let b = order.iter().filter(|t| *t == "b").count();
    assert!((2..=4).contains(&b), "b alternates with a: {order:?}");
    // The victim is a request of the tenant with the larger counter, newer or not.
    let mut s = make_scheduler(64, s.config.clone());
    add(&mut s, 1, tenant_request("a", 1.0, 4, 4), t0);
    add(&mut s, 2, tenant_request("b", 1.0, 4, 4), t0);
    s.schedule(t0);
    assert_eq!(s.running.len(), 2);
    let victim = |s: &Scheduler| {
        let v = policy::victim(&s.config, &s.running, &s.fair);
        s.running[v].req.tag.clone()
    };
    s.fair.charge("a", 1_000, 0, 1.0);
    assert_eq!(victim(&s), "a");
    s.fair.charge("b", 2_000, 0, 1.0);
    assert_eq!(victim(&s), "b");
}

#[test]
fn a_tenant_below_its_share_takes_a_slot_from_the_one_furthest_over_once() {
    let t0 = Instant::now();
    let mut s = fair_scheduler(64, 2);
    for id in 0..4 {
        add(&mut s, id, tenant_request("a", 1.0, 4, 8), t0);
    }
    let out = s.schedule(t0);
    feed(&mut s, &out, 9, t0);
    let out = s.schedule(t0);
    feed(&mut s, &out, 9, t0); // a's two run and have been charged
    add(&mut s, 100, tenant_request("b", 1.0, 4, 8), t0);
    let out = s.schedule(t0);
    // b runs at once: a's newest made room.
    assert_eq!(out.preempted, vec![1]);
    assert!(out.scheduled.iter().any(|sc| sc.id == 100));
    assert_eq!(s.running.len(), 2);
    feed(&mut s, &out, 9, t0);
    // a's waiting requests do not take the slot back while b runs.
    for _ in 0..5 {
        let out = s.schedule(t0);
        assert!(out.preempted.is_empty(), "no ping-pong");
        assert!(s.running.iter().any(|x| x.id == 100));
        feed(&mut s, &out, 9, t0);
    }
}

#[test]
fn a_protected_prefill_runs_without_the_flooding_tenants_chunks_but_with_its_decodes() {
    let t0 = Instant::now();
    // Three slots: a (holding two) is over its share of 1.5, b under it.
    let mut s = fair_scheduler(12, 3);
    add(&mut s, 1, tenant_request("a", 1.0, 4, 16), t0);
    add(&mut s, 2, tenant_request("a", 1.0, 40, 4), t0);
    let out = s.schedule(t0);
    feed(&mut s, &out, 9, t0); // a1 decodes from now on; a2 is a chunked prefill
    add(&mut s, 3, tenant_request("b", 1.0, 6, 4), t0);
    let out = s.schedule(t0);
    let ids: Vec<RequestId> = out.scheduled.iter().map(|sc| sc.id).collect();
    assert_eq!(
        ids,
        [1, 3],
        "a1's decode and b's prefill; a2's chunk waits a step"
    );
    feed(&mut s, &out, 9, t0);
    // b decodes now: nothing is protected, a2's chunks resume.
    let out = s.schedule(t0);
    assert!(
        out.scheduled.iter().any(|sc| sc.id == 2),
        "{:?}",
        plan(&out)
    );
    // Without fair sharing a2's chunk shares b's first step.
    let mut s = make_scheduler(64, make_config(12, 3));
    add(&mut s, 1, tenant_request("a", 1.0, 4, 16), t0);
    add(&mut s, 2, tenant_request("a", 1.0, 40, 4), t0);
    let out = s.schedule(t0);
    feed(&mut s, &out, 9, t0);
    add(&mut s, 3, tenant_request("b", 1.0, 6, 4), t0);
    let out = s.schedule(t0);
    assert!(out.scheduled.iter().any(|sc| sc.id == 2));
}

/// With a prefill cap, a tenant over its share of the slots prefills at most the cap per step
/// while another tenant has requests; the other's prefill is not capped, and alone the tenant
/// gets the whole budget.
#[test]
fn a_flooding_tenants_prefill_is_capped_per_step_while_another_tenant_has_work() {
    let t0 = Instant::now();
    // Prompts that share no block (the prefix cache would shorten them).
    let distinct = |tenant: &str, seed: u32, len: u32| {
        let mut r = tenant_request(tenant, 1.0, 0, 4);
        r.prompt = (0..len).map(|k| 1000 * (seed + 1) + k).collect();
        r
    };
    let mut config = make_config(64, 4);
    config.fair_share = true;
    config.fair_prefill_cap = 16;
    // Alone: the whole budget.
    let mut s = make_scheduler(64, config.clone());
    for id in 0..3 {
        add(&mut s, id, distinct("a", id as u32, 40), t0);
    }
    assert_eq!(s.schedule(t0).num_batched_tokens, 64);
    // Beside b: a holds 3 of 4 slots (its share is 2) and gets 16 prompt tokens a step; b's
    // prompt goes in whole.
    let mut s = make_scheduler(64, config);
    for id in 0..3 {
        add(&mut s, id, distinct("a", id as u32, 40), t0);
    }
    add(&mut s, 100, distinct("b", 100, 30), t0);
    let out = s.schedule(t0);
    let by = |t: &str, out: &SchedulerOutput| -> usize {
        out.scheduled
            .iter()
            .filter(|sc| s.get(sc.id).unwrap().req.tag == t)
            .map(|sc| sc.num_new())
            .sum()
    };
    // The first step admits in counter order before any tenant holds slots.
    let first_a = by("a", &out);
    feed(&mut s, &out, 9, t0);
    let mut capped_steps = 0;
    for _ in 0..6 {
        let holds_a = s.running.iter().filter(|x| x.req.tag == "a").count();
        let out = s.schedule(t0);
        let prefill_a: usize = out
            .scheduled
            .iter()
            .filter(|sc| s.get(sc.id).unwrap().req.tag == "a" && sc.num_new() > 1)
            .map(|sc| sc.num_new())
            .sum();
        if holds_a > 2 && prefill_a > 0 {
            assert!(prefill_a <= 16, "a prefilled {prefill_a} tokens in a step");
            capped_steps += 1;
        }
        feed(&mut s, &out, 9, t0);
    }
    let b = s.get(100).unwrap();
    assert!(
        b.num_computed >= 30,
        "b's prompt ran whole: {}",
        b.num_computed
    );
    assert!(first_a > 0);
    assert!(
        capped_steps > 0,
        "no step had a over its share with a prompt left"
    );
}

/// The noisy neighbour at the scheduler (`bench fair`'s CPU shape: 16 slots, 2,048-token steps,
/// a 32-token prefill cap): tenant a keeps 200 prompts of 128 tokens waiting and its 16 slots
/// busy; each time b sends a request it runs in the next step, whatever a's state.
#[test]
fn a_light_tenants_request_runs_in_the_next_step_beside_a_flood() {
    let t0 = Instant::now();
    let mut config = make_config(2048, 16);
    config.max_model_len = 4096;
    config.fair_share = true;
    config.fair_prefill_cap = 32;
    let mut s = make_scheduler(5000, config);
    // Prompts that share no block.
    let distinct = |tenant: &str, seed: u64| {
        let mut r = tenant_request(tenant, 1.0, 0, 32);
        r.prompt = (0..128u32)
            .map(|k| (seed % 30_000) as u32 * 130 + k + 1)
            .collect();
        r
    };
    let mut next_a = 0u64;
    for _ in 0..200 {
        add(&mut s, next_a, distinct("a", next_a), t0);
        next_a += 1;
    }
    // One step; finished requests leave, and each of a's is replaced (its backlog never ends).
    let mut step = |s: &mut Scheduler| {
        let out = s.schedule(t0);
        for t in feed(s, &out, 9, t0) {
            if t.finish.is_some() {
                s.remove(t.id);
                if t.id < 1_000_000 {
                    add(s, next_a, distinct("a", next_a), t0);
                    next_a += 1;
                }
            }
        }
        out
    };
    for round in 0..20u64 {
        for _ in 0..(17 + round * 7 % 23) {
            step(&mut s);
        }
        let b = 1_000_000 + round;
        add(&mut s, b, distinct("b", b), t0);
        let out = step(&mut s);
        assert!(
            out.scheduled.iter().any(|sc| sc.id == b),
            "round {round}: b waits beside a's {} running requests",
            s.running.len()
        );
    }
}

#[test]
fn a_step_time_target_sizes_prefill_chunks_from_measured_steps_and_keeps_decodes() {
    let t0 = Instant::now();
    let mut config = make_config(64, 4);
    config.max_model_len = 256;
    config.max_step_secs = 0.1;
    let mut s = make_scheduler(128, config);
    // Two requests decoding, then a 200-token prompt.
    add(&mut s, 1, make_request(&[1, 2, 3], 100), t0);
    add(&mut s, 2, make_request(&[4, 5, 6], 100), t0);
    let out = s.schedule(t0);
    assert_eq!(
        out.scheduled.iter().map(|sc| sc.num_new()).sum::<usize>(),
        6
    );
    feed(&mut s, &out, 9, t0);
    let prompt: Vec<u32> = (100..300).collect();
    add(&mut s, 3, make_request(&prompt, 4), t0);
    // Before any step was timed, the token budget alone bounds the step.
    let out = s.schedule(t0);
    assert_eq!(plan(&out)[2].2, 62, "2 decodes + 62 prompt tokens = 64");
    // Steps cost 10 ms + 2 ms a token on this "device": 0.1 s holds 45 tokens.
    for sc_tokens in [64usize, 8, 40, 2, 64] {
        s.step_time
            .record(sc_tokens, 0.01 + 0.002 * sc_tokens as f64);
    }
    feed(&mut s, &out, 9, t0);
    let out = s.schedule(t0);
    let p = plan(&out);
    assert_eq!((p[0].2, p[1].2), (1, 1), "both decodes run");
    assert_eq!(
        p[2].2, 43,
        "45 tokens in all: the target, not the 64-token budget"
    );
    // A target below one step's fixed cost still runs the decodes and one block of the prompt.
    s.config.max_step_secs = 0.005;
    feed(&mut s, &out, 9, t0);
    let p = plan(&s.schedule(t0));
    assert_eq!((p[0].2, p[1].2, p[2].2), (1, 1, BS), "{p:?}");
}

/// A scheduler (64-token steps, 3 slots) with a 50 ms step-time target whose fit has seen steps
/// of 10 ms + 2 ms a token: 20 tokens fit the target.
fn timed_scheduler(fair_share: bool) -> Scheduler {
    let mut config = make_config(64, 3);
    config.fair_share = fair_share;
    config.max_model_len = 256;
    config.max_step_secs = 0.05;
    let mut s = make_scheduler(128, config);
    for t in [64usize, 8, 40, 2, 64] {
        s.step_time.record(t, 0.01 + 0.002 * t as f64);
    }
    s
}

/// Under fair sharing with a step-time target, a tenant within its share prefills its prompt in
/// one step past the target's budget (up to max_num_batched_tokens), beside the decodes of the
/// tenant over its share, whose own prompt chunks keep to the target.
#[test]
fn a_light_tenants_prompt_goes_in_one_step_past_the_step_time_target() {
    let t0 = Instant::now();
    let mut s = timed_scheduler(true);
    // a holds two of the three slots (over its share of 1.5): one decoding, one prefilling.
    add(&mut s, 1, tenant_request("a", 1.0, 4, 50), t0);
    let out = s.schedule(t0);
    feed(&mut s, &out, 9, t0);
    add(&mut s, 2, tenant_request("a", 1.0, 100, 4), t0);
    let out = s.schedule(t0);
    assert_eq!(
        plan(&out)[1].2,
        19,
        "alone, a's prompt keeps to the target (1 decode + 19)"
    );
    feed(&mut s, &out, 9, t0);
    // b arrives with a 30-token prompt (its own tokens: no prefix hit on a's): all of it in the
    // next step, past the 20-token budget.
    let mut b = tenant_request("b", 1.0, 30, 4);
    b.prompt = vec![7; 30];
    add(&mut s, 3, b, t0);
    let out = s.schedule(t0);
    let p: Vec<(RequestId, usize)> = plan(&out).iter().map(|e| (e.0, e.2)).collect();
    assert!(p.contains(&(1, 1)), "a's decode runs: {p:?}");
    assert!(p.contains(&(3, 30)), "b's whole prompt in one step: {p:?}");
    let total: usize = p.iter().map(|e| e.1).sum();
    assert!(total <= 64, "never past max_num_batched_tokens: {p:?}");
    // Without fair sharing b's prompt is chunked to the target like everyone's.
    let mut s = timed_scheduler(false);
    add(&mut s, 3, tenant_request("b", 1.0, 30, 4), t0);
    assert_eq!(plan(&s.schedule(t0))[0].2, 20);
}

/// Without chunked prefill a prompt goes whole, and a step-time target whose budget is below a
/// whole prompt must not hold it back forever (the fit only changes when steps run): the step's
/// first prompt goes past the target when the token limit holds it; a second waits for the
/// next step. (`cachet bench ttft`'s baseline hung this way on a loaded CPU: its fit, taken
/// from slow warm-up steps, had shrunk the budget below every prompt of the run.)
#[test]
fn unchunked_prompts_go_whole_past_a_step_time_target() {
    let t0 = Instant::now();
    // 20 tokens fit the target; a step may hold 128.
    let mut s = timed_scheduler(false);
    s.config.enable_chunked_prefill = false;
    s.config.max_num_batched_tokens = 128;
    let a: Vec<u32> = (0..100).collect();
    let b: Vec<u32> = (200..260).collect();
    add(&mut s, 1, make_request(&a, 4), t0);
    add(&mut s, 2, make_request(&b, 4), t0);
    let out = s.schedule(t0);
    assert_eq!(
        plan(&out).iter().map(|p| (p.0, p.2)).collect::<Vec<_>>(),
        [(1, 100)],
        "the first prompt whole, past the 20-token budget; the second waits"
    );
    feed(&mut s, &out, 9, t0);
    let out = s.schedule(t0);
    let p = plan(&out);
    assert_eq!(
        p.iter().map(|p| (p.0, p.2)).collect::<Vec<_>>(),
        [(1, 1), (2, 60)],
        "the decode, then the second prompt whole"
    );
}
