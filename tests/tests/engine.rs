//! Engine core on every device (`device_test!`: `::cpu` always, `::cuda` with `--ignored` on a
//! GPU): batching, chunking, prefix caching and preemption never change greedy output;
//! cached-token accounting; isolation between salts; cancellation. CUDA graphs and the
//! few-row kernels against the CPU reference are `gpu_test!`s, in `engine/graphs.rs`.

use std::time::{Duration, Instant};

use cachet_backend::engine::EngineConfig;
use cachet_backend::generate::{generate, GenerateParams};
use cachet_backend::request::FinishReason;
use cachet_backend::sampler::{RowLogprobs, SamplingParams};
use cachet_backend::scheduler::{SchedulerConfig, SchedulingPolicy};
use cachet_backend::tokenizer::ChatMessage;
use cachet_tests::*;

#[path = "engine/graphs.rs"]
mod graphs;

const QUESTIONS: [&str; 8] = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "What is 12 times 12?",
    "Write a haiku about the sea.",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water?",
    "Translate 'good morning' into Spanish.",
];

fn prompts() -> Vec<Vec<u32>> {
    let tok = smollm2().tokenizer.as_ref().unwrap();
    QUESTIONS
        .iter()
        .map(|q| {
            let msgs = [
                ChatMessage::new("system", "You are a concise assistant for a travel company. Answer in one short sentence."),
                ChatMessage::new("user", *q),
            ];
            tok.encode(&tok.render_chat(&msgs, true).unwrap()).unwrap()
        })
        .collect()
}

const MAX_TOKENS: usize = 20;

fn baseline(dev: DeviceKind, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let m = smollm2();
    let mut r = device_runner(dev, m, 64);
    prompts
        .iter()
        .map(|p| {
            generate(
                r.as_mut(),
                p,
                &GenerateParams {
                    max_tokens: MAX_TOKENS,
                    ..Default::default()
                },
                |_| true,
            )
            .unwrap()
            .tokens
        })
        .collect()
}

fn run_all(
    dev: DeviceKind,
    cfg: EngineConfig,
    num_blocks: usize,
    prompts: &[Vec<u32>],
) -> (Vec<Collected>, cachet_backend::engine::EngineStats) {
    let e = engine(dev, smollm2(), num_blocks, cfg);
    let h = e.handle();
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| h.submit(greedy_request(p.clone(), MAX_TOKENS)).unwrap())
        .collect();
    let out: Vec<Collected> = streams.into_iter().map(collect).collect();
    std::thread::sleep(Duration::from_millis(20));
    (out, h.stats())
}

device_test! {
    fn greedy_output_is_identical_across_batching_chunking_caching_and_preemption(dev) {
        let prompts = prompts();
        let want = baseline(dev, &prompts);

        // 8 concurrent requests, prefix caching on (they share the system prompt).
        let (got, stats) = run_all(dev, EngineConfig::default(), 256, &prompts);
        for (i, g) in got.iter().enumerate() {
            assert_greedy_agrees(
                dev,
                smollm2(),
                &prompts[i],
                &want[i],
                &g.tokens,
                &format!("concurrent+cache, prompt {i}"),
            );
            assert_eq!(g.reason, FinishReason::Length);
        }
        assert!(
            stats.counters.prefix_hit_tokens > 0,
            "the shared system prompt was reused"
        );

        // Chunks of 16 tokens with a 16-token budget per step: prefill interleaves with decode.
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_batched_tokens: 16,
                ..Default::default()
            },
            ..Default::default()
        };
        let (got, _) = run_all(dev, cfg, 256, &prompts);
        for (i, g) in got.iter().enumerate() {
            assert_greedy_agrees(
                dev,
                smollm2(),
                &prompts[i],
                &want[i],
                &g.tokens,
                &format!("chunked, prompt {i}"),
            );
        }

        // A pool too small for all eight at once: requests are preempted and recomputed.
        let cfg = EngineConfig {
            enable_prefix_caching: false,
            ..Default::default()
        };
        let (got, stats) = run_all(dev, cfg, 14, &prompts);
        assert!(
            stats.counters.preemptions > 0,
            "the small pool forced preemption"
        );
        for (i, g) in got.iter().enumerate() {
            assert_greedy_agrees(
                dev,
                smollm2(),
                &prompts[i],
                &want[i],
                &g.tokens,
                &format!("after preemption, prompt {i}"),
            );
        }
        assert_eq!(stats.kv.used, 0, "every block returned");
    }
}

device_test! {
    fn a_shared_200_token_prefix_is_computed_once_and_reported_as_cached(dev) {
        let m = smollm2();
        let tok = m.tokenizer.as_ref().unwrap();
        let mut prefix = tok
            .encode(&"The quick brown fox jumps over the lazy dog. ".repeat(30))
            .unwrap();
        prefix.truncate(200);
        let a = [prefix.clone(), tok.encode(" Question one: why?").unwrap()].concat();
        let b = [
            prefix.clone(),
            tok.encode(" Another question entirely, please.").unwrap(),
        ]
        .concat();
        let e = engine(dev, m, 128, EngineConfig::default());
        let h = e.handle();
        let ra = collect(h.submit(greedy_request(a.clone(), 4)).unwrap());
        assert_eq!(ra.usage.cached_tokens, 0);
        let before = h.stats().counters.prompt_tokens_computed;
        let rb = collect(h.submit(greedy_request(b.clone(), 4)).unwrap());
        let computed = h.stats().counters.prompt_tokens_computed - before;
        assert_eq!(
            rb.usage.cached_tokens, 192,
            "12 full blocks of the 200-token prefix"
        );
        assert_eq!(
            computed as usize,
            b.len() - 192,
            "only the uncached tokens were computed"
        );
        assert_eq!(rb.usage.prompt_tokens, b.len());

        // Another tenant's salt: nothing is shared.
        let mut other = greedy_request(b.clone(), 4);
        other.salt = [9; 32];
        let rc = collect(h.submit(other).unwrap());
        assert_eq!(rc.usage.cached_tokens, 0);
        assert_eq!(rc.tokens, rb.tokens);
    }
}

device_test! {
    fn a_dropped_stream_frees_its_blocks_at_once(dev) {
        let m = tiny("tiny-gqa-llama3");
        let e = engine(dev, &m, 64, EngineConfig::default());
        let h = e.handle();
        let mut s = h.submit(greedy_request((1..100).collect(), 900)).unwrap();
        for _ in 0..3 {
            s.next_blocking().unwrap();
        }
        assert!(h.stats().kv.used > 0);
        drop(s);
        let t0 = Instant::now();
        while (h.stats().kv.used > 0 || h.stats().running > 0) && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(h.stats().running, 0);
        assert_eq!(h.stats().kv.used, 0, "cancelled request's blocks are free");
    }
}

/// Runs a blocker (so the others queue), then returns the order in which the queued requests got
/// their first token.
fn first_token_order(
    dev: DeviceKind,
    policy: SchedulingPolicy,
    reqs: Vec<cachet_backend::request::EngineRequest>,
) -> Vec<usize> {
    let m = tiny("tiny-gqa-llama3");
    let cfg = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 1,
            policy,
            ..Default::default()
        },
        ..Default::default()
    };
    let e = engine(dev, &m, 128, cfg);
    let h = e.handle();
    let mut blocker = h.submit(greedy_request((1..10).collect(), 200)).unwrap();
    blocker.next_blocking().unwrap();
    let streams: Vec<_> = reqs.into_iter().map(|r| h.submit(r).unwrap()).collect();
    collect(blocker);
    let firsts: Vec<Instant> = streams
        .into_iter()
        .map(|s| collect(s).first_token_at.unwrap())
        .collect();
    let mut order: Vec<usize> = (0..firsts.len()).collect();
    order.sort_by_key(|&i| firsts[i]);
    order
}

device_test! {
    fn shortest_first_and_priority_reorder_the_queue(dev) {
        let long = || greedy_request((1..400).map(|i| i % 300).collect(), 2);
        let short = || greedy_request((1..20).collect(), 2);
        assert_eq!(
            first_token_order(dev, SchedulingPolicy::Fcfs, vec![long(), short(), short()]),
            vec![0, 1, 2]
        );
        assert_eq!(
            first_token_order(
                dev,
                SchedulingPolicy::ShortestFirst,
                vec![long(), short(), short()]
            ),
            vec![1, 2, 0]
        );
        let mut low = short();
        low.priority = 5;
        let mut high = short();
        high.priority = -1;
        assert_eq!(
            first_token_order(dev, SchedulingPolicy::Priority, vec![low, short(), high]),
            vec![2, 1, 0]
        );
    }
}

device_test! {
    fn stop_strings_end_the_text_before_them(dev) {
        // The stop string is taken from the model's own greedy text (the third word onwards), so
        // the test holds whatever words a device's rounding picks.
        let p = prompts()[0].clone();
        let e = engine(dev, smollm2(), 64, EngineConfig::default());
        let h = e.handle();
        let full = collect(h.submit(greedy_request(p.clone(), 12)).unwrap());
        let cut_at = full
            .text
            .match_indices(' ')
            .nth(1)
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("fewer than three words: {:?}", full.text));
        let stop: String = full.text[cut_at..].chars().take(6).collect();
        // Room for 64 tokens: the stop string, found on the hand-out thread, must end the
        // request in the engine too (at most a step later), not leave it running to its limit.
        let generated = |h: &cachet_backend::engine::EngineHandle| {
            let t0 = std::time::Instant::now();
            loop {
                let s = h.stats();
                if s.running == 0 || t0.elapsed() > std::time::Duration::from_secs(30) {
                    return s.counters.generated_tokens;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        let before = generated(&h);
        let mut r = greedy_request(p, 64);
        r.stop = vec![stop.clone()];
        let cut = collect(h.submit(r).unwrap());
        assert_eq!(
            cut.reason,
            FinishReason::Stop,
            "stop {stop:?} in {:?}",
            full.text
        );
        assert_eq!(cut.text, full.text[..full.text.find(&stop).unwrap()]);
        // The tokens counted are the tokens sent, none past the stop.
        assert_eq!(cut.usage.completion_tokens, cut.tokens.len());
        assert!(cut.tokens.len() <= 12, "{} tokens before the stop", cut.tokens.len());
        let ran = generated(&h) - before;
        assert!(
            ran <= cut.tokens.len() as u64 + 2,
            "the engine generated {ran} tokens for a request stopped after {}",
            cut.tokens.len()
        );
    }
}

device_test! {
    fn tokens_handed_to_many_streams_at_once_read_as_one_streams_do(dev) {
        // 48 requests decoding together, every step handing 48 tokens to their streams: each
        // text must be what the request gets alone, and a stop string taken from it must end it
        // where it ends the text alone.
        let tok = smollm2().tokenizer.as_ref().unwrap();
        let prompts: Vec<Vec<u32>> = (0..48)
            .map(|i| {
                let q = format!("Question {i}: {}", QUESTIONS[i % QUESTIONS.len()]);
                tok.encode(&tok.render_chat(&[ChatMessage::new("user", q.as_str())], true).unwrap())
                    .unwrap()
            })
            .collect();
        let mut cfg = EngineConfig::default();
        cfg.scheduler.max_num_seqs = 64;
        cfg.scheduler.max_num_batched_tokens = 4096;
        let e = engine(dev, smollm2(), 512, cfg);
        let h = e.handle();
        let all = |stops: &dyn Fn(usize) -> Vec<String>| -> Vec<Collected> {
            let streams: Vec<_> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let mut r = greedy_request(p.clone(), 12);
                    r.stop = stops(i);
                    h.submit(r).unwrap()
                })
                .collect();
            streams.into_iter().map(collect).collect()
        };
        let full = all(&|_| Vec::new());
        for i in [0, 17, 47] {
            let alone = collect(h.submit(greedy_request(prompts[i].clone(), 12)).unwrap());
            assert_eq!((&full[i].text, full[i].reason), (&alone.text, alone.reason), "request {i}");
            assert_eq!(full[i].tokens, alone.tokens, "request {i}");
        }
        // The stop: five characters from the text's second space on (none where it is shorter).
        let stop_of = |i: usize| -> Option<String> {
            let t = &full[i].text;
            let at = t.match_indices(' ').nth(1)?.0;
            let s: String = t[at..].chars().take(5).collect();
            (s.chars().count() == 5).then_some(s)
        };
        let cut = all(&|i| stop_of(i).into_iter().collect());
        let mut stopped = 0;
        for (i, c) in cut.iter().enumerate() {
            match stop_of(i) {
                Some(stop) => {
                    assert_eq!(c.reason, FinishReason::Stop, "request {i}, stop {stop:?} in {:?}", full[i].text);
                    assert_eq!(c.text, full[i].text[..full[i].text.find(&stop).unwrap()], "request {i}");
                    stopped += 1;
                }
                None => assert_eq!(c.text, full[i].text, "request {i}"),
            }
        }
        assert!(stopped >= 40, "{stopped} of 48 requests had a stop string");
    }
}

device_test! {
    fn seeded_sampling_is_reproducible_and_eos_stops(dev) {
        let m = smollm2();
        let tok = m.tokenizer.as_ref().unwrap();
        let p = tok
            .encode(
                &tok.render_chat(&[ChatMessage::new("user", "Tell me a story.")], true)
                    .unwrap(),
            )
            .unwrap();
        // No prefix caching: the second run of a prompt would reuse the first one's blocks and
        // compute only the rest, which on a bf16 device is a different rounding of the same logits
        // (and a seeded draw near a boundary may then pick the neighbour).
        let e = engine(
            dev,
            m,
            64,
            EngineConfig {
                enable_prefix_caching: false,
                ..Default::default()
            },
        );
        let h = e.handle();
        let sampled = |seed| {
            let mut r = greedy_request(p.clone(), 16);
            r.sampling = SamplingParams {
                temperature: 0.9,
                top_k: 40,
                top_p: 0.95,
                seed: Some(seed),
                ..Default::default()
            };
            collect(h.submit(r).unwrap()).tokens
        };
        assert_eq!(sampled(42), sampled(42));
        assert_ne!(sampled(42), sampled(43));
        // Asked for one short sentence, the model ends its turn (<|im_end|>) well before 64 tokens.
        let mut r = cachet_backend::request::EngineRequest::new(prompts()[0].clone(), 64);
        r.ignore_eos = false;
        let c = collect(h.submit(r).unwrap());
        assert_eq!(c.reason, FinishReason::Stop, "stopped at <|im_end|>");
        assert!(c.tokens.len() < 64);
    }
}

device_test! {
    fn bad_requests_are_refused_with_a_reason(dev) {
        let m = tiny("tiny-gqa-llama3");
        let e = engine(dev, &m, 8, EngineConfig::default());
        let h = e.handle();
        let err = |r| match h.submit(r) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        };
        assert!(err(greedy_request(vec![], 4)).contains("no tokens"));
        assert!(err(greedy_request(vec![1, 5000], 4)).contains("outside the vocabulary"));
        assert!(err(greedy_request(vec![1; 100], 200)).contains("KV blocks"));
        assert!(err(greedy_request(vec![1; 10], 5000)).contains("exceeds max_model_len"));
    }
}

device_test! {
    fn kv_events_report_exactly_the_blocks_stored(dev) {
        let m = tiny("tiny-gqa-llama3");
        let e = engine(dev, &m, 64, EngineConfig::default());
        let h = e.handle();
        let mut events = h.subscribe_kv_events();
        let prompt: Vec<u32> = (1..60).collect();
        let mut r = greedy_request(prompt.clone(), 5);
        r.salt = [3; 32];
        let c = collect(h.submit(r).unwrap());
        let all_tokens: Vec<u32> = [prompt.clone(), c.tokens.clone()].concat();
        let want = h
            .hash_context([3; 32])
            .hash_all(&all_tokens[..all_tokens.len() - 1]);
        let mut stored = Vec::new();
        while let Ok(batch) = events.try_recv() {
            for ev in batch {
                if let cachet_backend::kv::KvEvent::Stored { hashes } = ev {
                    stored.extend(hashes);
                }
            }
        }
        assert_eq!(
            stored, want,
            "one Stored event per full block, in order, with the shared hash"
        );
    }
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .unwrap()
        .0
}

device_test! {
    fn logprobs_are_the_models_log_softmax(dev) {
        // Greedy with five alternatives: each token's log-probability against the log-softmax of
        // the same device's logits for the same prefix, computed in one plain forward pass.
        let m = smollm2();
        let p = prompts()[0].clone();
        let e = engine(dev, m, 64, EngineConfig::default());
        let mut r = greedy_request(p.clone(), 6);
        r.sampling.logprobs = Some(5);
        let c = collect(e.handle().submit(r).unwrap());
        assert_eq!(c.logprobs.len(), c.tokens.len());
        let mut runner = device_runner(dev, m, 64);
        let mut ids = p.clone();
        ids.extend(&c.tokens);
        let logits = all_logits(runner.as_mut(), &ids);
        let tol = if dev == DeviceKind::Cpu { 1e-3 } else { 0.05 };
        for (i, lp) in c.logprobs.iter().enumerate() {
            let want = cachet_backend::sampler::logprobs(logits.row(p.len() - 1 + i), c.tokens[i], 5);
            assert_eq!(lp.token, c.tokens[i]);
            assert!((lp.logprob - want.logprob).abs() < tol, "token {i}: {lp:?} vs {want:?}");
            assert_eq!(lp.top.len(), 5);
            assert_eq!(lp.top[0].0, c.tokens[i], "greedy picks the most likely");
            assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
            assert!((lp.top[0].1 - lp.logprob).abs() < 1e-6);
        }
    }
}

device_test! {
    fn processors_match_the_plain_reference_whatever_the_batch(dev) {
        // Penalties, logit_bias and min_tokens applied on the device in the batched engine give
        // what the single-sequence reference (processors applied on the host) gives, greedy, with
        // other requests in the batch.
        let m = smollm2();
        let prompts = prompts();
        let p = SamplingParams {
            presence_penalty: 0.8,
            frequency_penalty: 0.6,
            repetition_penalty: 1.3,
            logit_bias: vec![(28, -4.0), (30, 2.5)],
            min_tokens: 24,
            ..Default::default()
        };
        let eos = m.config.eos_token_ids.clone();
        let mut runner = device_runner(dev, m, 64);
        let want = generate(
            runner.as_mut(),
            &prompts[1],
            &GenerateParams {
                max_tokens: 28,
                sampling: p.clone(),
                stop_token_ids: eos,
                ..Default::default()
            },
            |_| true,
        )
        .unwrap()
        .tokens;
        let e = engine(dev, m, 256, EngineConfig::default());
        let h = e.handle();
        let others: Vec<_> = [0, 2, 3]
            .iter()
            .map(|&i| h.submit(greedy_request(prompts[i].clone(), 28)).unwrap())
            .collect();
        let mut r = cachet_backend::request::EngineRequest::new(prompts[1].clone(), 28);
        r.sampling = p.clone();
        let got = collect(h.submit(r).unwrap());
        others.into_iter().for_each(|s| {
            collect(s);
        });
        if dev == DeviceKind::Cpu {
            assert_eq!(want, got.tokens);
        } else {
            // Penalised logits reorder near ties by rounding too (see NEAR_TIE).
            let same = want.iter().zip(&got.tokens).take_while(|(a, b)| a == b).count();
            assert!(same >= 8, "{want:?} vs {:?}", got.tokens);
        }
        assert!(got.tokens.len() >= 24, "min_tokens holds the end back");
        // And they did something: plain greedy differs.
        let plain = collect(h.submit(greedy_request(prompts[1].clone(), 28)).unwrap()).tokens;
        assert_ne!(plain, got.tokens);
        // A banned token never comes.
        let banned = plain[0];
        let mut r = greedy_request(prompts[1].clone(), 8);
        r.sampling.logit_bias = vec![(banned, -100.0)];
        assert!(!collect(h.submit(r).unwrap()).tokens.contains(&banned));
    }
}

/// Where output token `step` of a request seeded `seed` lands in its candidate distribution as
/// rebuilt from the row's top log-probabilities (every candidate when `top_k` ≤ their number):
/// the token the sampler draws there and the distance of the draw from the nearest boundary
/// between two candidates' shares — how far rounding would have to move the distribution to
/// change the token.
fn seeded_draw(lp: &RowLogprobs, p: &SamplingParams, seed: u64, step: u64) -> (u32, f32) {
    use cachet_backend::sampler::{distribution, sample, uniform};
    let vocab = lp.top.iter().map(|t| t.0).max().unwrap() as usize + 1;
    let mut row = vec![f32::NEG_INFINITY; vocab];
    lp.top.iter().for_each(|&(id, l)| row[id as usize] = l);
    let mut dist = distribution(&row, p);
    dist.sort_unstable_by_key(|x| x.0);
    let u = uniform(seed, step);
    let mut acc = 0.0f32;
    let mut margin = f32::INFINITY;
    for &(_, pr) in &dist[..dist.len() - 1] {
        acc += pr;
        margin = margin.min((acc - u).abs());
    }
    (sample(&row, p, seed, step), margin)
}

device_test! {
    fn a_seeded_request_reproduces_whatever_shares_its_batch(dev) {
        let m = smollm2();
        let prompts = prompts();
        let e = engine(dev, m, 256, EngineConfig::default());
        let h = e.handle();
        // top_k 20 keeps every candidate inside the 20 log-probabilities a token reports, so a
        // draw can be rebuilt on the host (`seeded_draw`).
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 20,
            top_p: 0.95,
            seed: Some(11),
            logprobs: Some(20),
            ..Default::default()
        };
        let req = || {
            let mut r = greedy_request(prompts[4].clone(), 24);
            r.sampling = params.clone();
            r
        };
        let alone = collect(h.submit(req()).unwrap());
        let others: Vec<_> = (0..6)
            .map(|i| {
                let mut r = greedy_request(prompts[i].clone(), 10 + 3 * i);
                r.sampling.temperature = 0.8;
                h.submit(r).unwrap()
            })
            .collect();
        let crowded = collect(h.submit(req()).unwrap());
        others.into_iter().for_each(|s| {
            collect(s);
        });
        assert_eq!(alone.logprobs.len(), 24);
        assert_eq!(crowded.logprobs.len(), 24);
        // Each token is the draw the seed makes from its own row, whatever else ran.
        for c in [&alone, &crowded] {
            for (i, (lp, &t)) in c.logprobs.iter().zip(&c.tokens).enumerate() {
                let (want, margin) = seeded_draw(lp, &params, 11, i as u64);
                assert!(want == t || margin < 1e-3, "token {i}: drew {t}, the row gives {want}");
            }
        }
        if dev == DeviceKind::Cpu {
            assert_eq!(alone.tokens, crowded.tokens);
            assert_eq!(alone.logprobs, crowded.logprobs);
            return;
        }
        // bf16 products of other batch shapes move the rows by rounding only, and a draw that
        // lands within that of a boundary between two candidates may go the other way; the
        // texts part there, and only there.
        let same = alone.tokens.iter().zip(&crowded.tokens).take_while(|(a, b)| a == b).count();
        for i in 0..same {
            let (a, b) = (&alone.logprobs[i], &crowded.logprobs[i]);
            assert!((a.logprob - b.logprob).abs() < 0.1, "token {i}: {a:?} vs {b:?}");
        }
        if same < alone.tokens.len() {
            let step = same as u64;
            let (_, ma) = seeded_draw(&alone.logprobs[same], &params, 11, step);
            let (_, mb) = seeded_draw(&crowded.logprobs[same], &params, 11, step);
            eprintln!("parted at token {same}: the draw was {ma:.2e} / {mb:.2e} from a boundary");
            assert!(
                ma.min(mb) < 0.02,
                "parted at token {same} with the draw {ma:.3} / {mb:.3} from any boundary: \
                 {:?} vs {:?}",
                alone.tokens,
                crowded.tokens
            );
        }
    }
}

device_test! {
    fn n_choices_prefill_their_prompt_once(dev) {
        // Four choices of one prompt of 100 tokens (six full blocks and four tokens), with a
        // 64-token step budget so the first choice's prefill takes two steps: the others find
        // its blocks in the prefix cache and compute only the last partial block each.
        let m = smollm2();
        let tok = m.tokenizer.as_ref().unwrap();
        let mut p = tok.encode(&"The quick brown fox jumps over the lazy dog. ".repeat(12)).unwrap();
        p.truncate(100);
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_batched_tokens: 64,
                ..Default::default()
            },
            ..Default::default()
        };
        let e = engine(dev, m, 256, cfg);
        let h = e.handle();
        let streams: Vec<_> = (0..4)
            .map(|j| {
                let mut r = greedy_request(p.clone(), 8);
                r.sampling.temperature = 1.0;
                r.sampling.seed = Some(j);
                h.submit(r).unwrap()
            })
            .collect();
        let out: Vec<Collected> = streams.into_iter().map(collect).collect();
        std::thread::sleep(Duration::from_millis(20));
        let c = h.stats().counters;
        assert_eq!(c.prompt_tokens_computed, 100 + 3 * 4);
        assert_eq!(out[0].usage.cached_tokens, 0);
        assert!(out[1..].iter().all(|o| o.usage.cached_tokens == 96));
        assert!(out.iter().all(|o| o.usage.prompt_tokens == 100));
    }
}

device_test! {
    fn structured_outputs_match_their_grammar(dev) {
        use cachet_backend::grammar::Constraint;
        let m = smollm2();
        let tok = m.tokenizer.as_ref().unwrap();
        let chat = |q: &str| {
            let msgs = [ChatMessage::new("user", q)];
            tok.encode(&tok.render_chat(&msgs, true).unwrap()).unwrap()
        };
        let e = engine(dev, m, 256, EngineConfig::default());
        let h = e.handle();
        let run = |q: &str, c: Constraint, temperature: f32| {
            let mut r = cachet_backend::request::EngineRequest::new(chat(q), 96);
            r.constraint = Some(c);
            r.sampling.temperature = temperature;
            r.sampling.seed = Some(3);
            collect(h.submit(r).unwrap())
        };
        // A JSON schema, greedy and sampled: the text parses and has what the schema requires.
        let schema = serde_json::json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": false});
        for t in [0.0, 1.0] {
            let c = run("Describe a person.", Constraint::JsonSchema(schema.clone()), t);
            assert_eq!(c.reason, FinishReason::Stop, "{}", c.text);
            let v: serde_json::Value = serde_json::from_str(&c.text).unwrap_or_else(|e| panic!("{e}: {}", c.text));
            assert!(v["name"].is_string() && v["age"].is_i64(), "{v}");
            assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
        }
        // Any object: cut by max_tokens it is a prefix of one, else one.
        let c = run("Give me a small JSON object about a cat.", Constraint::JsonObject, 0.0);
        assert!(c.text.starts_with('{'), "{}", c.text);
        if c.reason == FinishReason::Stop {
            assert!(serde_json::from_str::<serde_json::Value>(&c.text).unwrap().is_object(), "{}", c.text);
        } else {
            assert_eq!(c.tokens.len(), 96);
        }
        let c = run("What is your phone number?", Constraint::Regex("[0-9]{3}-[0-9]{4}".into()), 1.0);
        assert_eq!(c.text.len(), 8, "{}", c.text);
        assert!(c.text.chars().enumerate().all(|(i, ch)| if i == 3 { ch == '-' } else { ch.is_ascii_digit() }), "{}", c.text);
        let c = run("Is the sky blue?", Constraint::Choice(vec!["yes".into(), "no".into()]), 0.0);
        assert!(c.text == "yes" || c.text == "no", "{}", c.text);
        let c = run("Count.", Constraint::Lark("start: \"1, 2, \" NUM\nNUM: /[0-9]/".into()), 1.0);
        assert!(c.text.starts_with("1, 2, ") && c.text.len() == 7, "{}", c.text);
        // A constraint that does not compile is refused at submission.
        let mut r = greedy_request(chat("x"), 4);
        r.constraint = Some(Constraint::Regex("(".into()));
        assert!(h.submit(r).is_err());
    }
}
