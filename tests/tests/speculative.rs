//! N-gram speculative decoding through the engine: exact greedy output, the target distribution
//! kept under sampling, no cached block from a rejected draft, standing down under load and
//! after rejections.

use std::time::Duration;

use cachet_backend::engine::{EngineConfig, EngineStats};
use cachet_backend::kv::KvEvent;
use cachet_backend::sampler::SamplingParams;
use cachet_backend::spec::SpecConfig;
use cachet_backend::tokenizer::ChatMessage;
use cachet_tests::*;

fn spec(f: impl FnOnce(&mut SpecConfig)) -> Option<SpecConfig> {
    let mut c = SpecConfig::default();
    f(&mut c);
    c.validate().unwrap();
    Some(c)
}

/// Copy-heavy chat prompts: the answer quotes the question.
fn copy_prompts() -> Vec<Vec<u32>> {
    let tok = smollm2().tokenizer.as_ref().unwrap();
    [
        "Repeat this sentence exactly, twice: The quick brown fox jumps over the lazy dog near the river bank.",
        "Add a docstring to this function and return the whole function:\ndef area(width, height):\n    return width * height",
        "Rewrite as JSON with keys name, age and city: name Alice Smith, age 30, city Paris.",
        "Copy this list in reverse order: apples, bananas, cherries, dates, elderberries, figs.",
    ]
    .iter()
    .map(|q| {
        tok.encode(
            &tok.render_chat(&[ChatMessage::new("user", *q)], true)
                .unwrap(),
        )
        .unwrap()
    })
    .collect()
}

/// An engine of `m` with `speculative`, taking every request at once.
fn spec_engine(
    dev: DeviceKind,
    m: &cachet_backend::loader::LoadedModel,
    speculative: Option<SpecConfig>,
) -> cachet_backend::engine::Engine {
    let cfg = EngineConfig {
        speculative,
        max_waiting: 100_000,
        max_waiting_tokens: usize::MAX,
        ..Default::default()
    };
    engine(dev, m, 256, cfg)
}

fn run(
    dev: DeviceKind,
    m: &cachet_backend::loader::LoadedModel,
    speculative: Option<SpecConfig>,
    requests: Vec<cachet_backend::request::EngineRequest>,
) -> (Vec<Collected>, EngineStats) {
    let e = spec_engine(dev, m, speculative);
    let h = e.handle();
    let streams: Vec<_> = requests.into_iter().map(|r| h.submit(r).unwrap()).collect();
    let out: Vec<Collected> = streams.into_iter().map(collect).collect();
    std::thread::sleep(Duration::from_millis(20));
    (out, h.stats())
}

/// As [`run`], and also the engine's stats twice: once every stream has its first token, and
/// once every stream has produced `k` tokens. Every step between the two snapshots had every
/// request decoding (none ends before its `max_tokens` > `k`), whatever steps their prefills
/// took: requests are submitted one by one to a running engine, so on a fast device the first
/// may decode alone for a step or two before the others arrive.
fn run_midway(
    dev: DeviceKind,
    m: &cachet_backend::loader::LoadedModel,
    speculative: Option<SpecConfig>,
    requests: Vec<cachet_backend::request::EngineRequest>,
    k: usize,
) -> (Vec<Collected>, EngineStats, EngineStats) {
    assert!(requests.iter().all(|r| r.max_tokens > k));
    let e = spec_engine(dev, m, speculative);
    let h = e.handle();
    let mut streams: Vec<_> = requests.into_iter().map(|r| h.submit(r).unwrap()).collect();
    let mut first: Vec<(Vec<u32>, String)> = vec![(Vec::new(), String::new()); streams.len()];
    let mut all_decoding = None;
    for until in [1, k] {
        for (s, (ids, text)) in streams.iter_mut().zip(&mut first) {
            while ids.len() < until {
                match s.next_blocking() {
                    Some(cachet_backend::request::EngineEvent::Token { id, text: t, .. }) => {
                        ids.push(id);
                        text.push_str(&t);
                    }
                    other => panic!("the stream ended before {until} tokens: {other:?}"),
                }
            }
        }
        if until == 1 {
            all_decoding = Some(h.stats());
        }
    }
    let midway = h.stats();
    let out = streams
        .into_iter()
        .zip(first)
        .map(|(s, (ids, text))| {
            let mut c = collect(s);
            c.tokens.splice(0..0, ids);
            c.text.insert_str(0, &text);
            c
        })
        .collect();
    (out, all_decoding.unwrap(), midway)
}

device_test! {
    fn greedy_output_is_identical_with_speculation_and_takes_fewer_steps(dev) {
        let m = smollm2();
        // One request at a time: a batch takes as many steps as its slowest request, and one
        // answer that copies nothing (greedy near-ties differ between devices) would hide what
        // the others gained.
        let (mut steps_off, mut steps_on) = (0, 0);
        let mut c = cachet_backend::scheduler::SchedulerCounters::default();
        for p in copy_prompts() {
            let (off, s_off) = run(dev, m, None, vec![greedy_request(p.clone(), 48)]);
            let (on, s_on) = run(dev, m, spec(|_| {}), vec![greedy_request(p.clone(), 48)]);
            let (a, b) = (&off[0], &on[0]);
            let what = format!("{:?} vs {:?}", a.text, b.text);
            assert_greedy_agrees(dev, m, &p, &a.tokens, &b.tokens, &what);
            assert_eq!(b.tokens.len(), b.usage.completion_tokens);
            assert_eq!(s_off.counters.spec_draft_tokens, 0);
            // Rolled-back slots are returned: nothing is held once the request is done.
            assert_eq!(s_on.kv.used, 0, "{:?}", s_on.kv);
            steps_off += s_off.counters.steps;
            steps_on += s_on.counters.steps;
            c.spec_draft_tokens += s_on.counters.spec_draft_tokens;
            c.spec_accepted_tokens += s_on.counters.spec_accepted_tokens;
            for (t, n) in c
                .spec_acceptance_lengths
                .iter_mut()
                .zip(&s_on.counters.spec_acceptance_lengths)
            {
                *t += n;
            }
        }
        assert!(
            c.spec_draft_tokens > 0 && c.spec_accepted_tokens > 0,
            "{c:?}"
        );
        assert!(
            c.spec_acceptance_lengths.iter().sum::<u64>() > 0,
            "verifications recorded"
        );
        assert!(
            steps_on < steps_off,
            "{steps_on} steps with speculation, {steps_off} without"
        );
        eprintln!(
            "{} steps → {}; drafts {} accepted {} ({:?})",
            steps_off,
            steps_on,
            c.spec_draft_tokens,
            c.spec_accepted_tokens,
            &c.spec_acceptance_lengths[..5]
        );
    }
}

device_test! {
    fn stop_strings_and_lengths_hold_when_a_step_accepts_several_tokens(dev) {
        let m = smollm2();
        let p = copy_prompts()[0].clone();
        let (full, _) = run(dev, m, spec(|_| {}), vec![greedy_request(p.clone(), 40)]);
        let text = &full[0].text;
        // A stop string inside a run of accepted drafts: the text ends right before it, and the
        // usage counts the tokens sent, not the ones verified past it.
        let at = text.find(" fox").expect("the sentence is repeated");
        let mut r = greedy_request(p.clone(), 40);
        r.stop = vec![" fox".into()];
        let (cut, _) = run(dev, m, spec(|_| {}), vec![r]);
        assert_eq!(cut[0].text, text[..at]);
        assert!(cut[0].usage.completion_tokens <= full[0].usage.completion_tokens);
        assert_eq!(cut[0].tokens.len(), cut[0].usage.completion_tokens);
        // max_tokens is never exceeded by a bonus token.
        for n in [1usize, 2, 5, 9] {
            let (o, _) = run(dev, m, spec(|_| {}), vec![greedy_request(p.clone(), n)]);
            assert_eq!(o[0].tokens, full[0].tokens[..n], "max_tokens {n}");
        }
    }
}

device_test! {
    fn no_cached_block_ever_holds_a_rejected_draft(dev) {
        // A random tiny model rejects most drafts; the prompt repeats itself so drafts are
        // proposed at every step. Stored blocks must be exactly the blocks of accepted tokens.
        let m = tiny("tiny-gqa-llama3");
        let prompt: Vec<u32> = (1..40).chain(1..40).collect();
        let cfg = EngineConfig {
            speculative: spec(|c| {
                c.prompt_lookup_min = 1;
                c.min_acceptance_rate = 0.0;
                c.min_speedup = 0.0;
            }),
            ..Default::default()
        };
        let e = engine(dev, &m, 64, cfg);
        let h = e.handle();
        let mut events = h.subscribe_kv_events();
        let mut r = greedy_request(prompt.clone(), 60);
        r.salt = [5; 32];
        let c = collect(h.submit(r).unwrap());
        std::thread::sleep(Duration::from_millis(20));
        let stats = h.stats().counters;
        assert!(
            stats.spec_draft_tokens > stats.spec_accepted_tokens,
            "{stats:?}"
        );
        let all: Vec<u32> = [prompt, c.tokens.clone()].concat();
        let want = h.hash_context([5; 32]).hash_all(&all[..all.len() - 1]);
        let mut stored = Vec::new();
        while let Ok(batch) = events.try_recv() {
            for ev in batch {
                if let KvEvent::Stored { hashes } = ev {
                    stored.extend(hashes);
                }
            }
        }
        assert_eq!(stored, want);
        // And the output is the non-speculative one.
        let e = engine(dev, &m, 64, EngineConfig::default());
        let base = collect(
            e.handle()
                .submit(greedy_request((1..40).chain(1..40).collect(), 60))
                .unwrap(),
        );
        assert_greedy_agrees(
            dev,
            &m,
            &(1..40).chain(1..40).collect::<Vec<_>>(),
            &base.tokens,
            &c.tokens,
            "spec vs base",
        );
    }
}

#[test]
fn sampled_speculation_keeps_the_target_distribution() {
    // Two-sample chi-square test of homogeneity between the output tokens at positions 2-4
    // with and without speculation (temperature 1, top-k 3, 1,500 seeds each). The prompt is
    // B, the model's own greedy continuation G of B, then B again: the likely first tokens
    // occur in G, so the drafts (what followed them there) are tokens the model often picks
    // too, and both acceptance and rejection are exercised.
    // Host sampling only: devices that sample on the GPU do not speculate for sampled
    // requests (the draw is the device's, not verifiable exactly), so this is a CPU test.
    let dev = DeviceKind::Cpu;
    let m = tiny("tiny-gqa-llama3");
    let b: Vec<u32> = (1..60).collect();
    let g = run(dev, &m, None, vec![greedy_request(b.clone(), 8)]).0[0]
        .tokens
        .clone();
    let prompt: Vec<u32> = [b.clone(), g, b].concat();
    let n = 1500;
    let reqs = || {
        (0..n)
            .map(|i| {
                let mut r = greedy_request(prompt.clone(), 4);
                r.sampling = SamplingParams {
                    temperature: 1.0,
                    top_k: 3,
                    top_p: 1.0,
                    seed: Some(1000 + i as u64),
                    ..Default::default()
                };
                r
            })
            .collect::<Vec<_>>()
    };
    let (off, _) = run(dev, &m, None, reqs());
    let (on, stats) = run(
        dev,
        &m,
        spec(|c| {
            c.prompt_lookup_min = 1;
            c.num_speculative_tokens = 3;
            c.min_acceptance_rate = 0.0;
            c.min_speedup = 0.0;
            c.disable_by_batch_size = 100_000;
        }),
        reqs(),
    );
    let c = stats.counters;
    let rate = c.spec_accepted_tokens as f64 / c.spec_draft_tokens as f64;
    assert!(
        c.spec_draft_tokens > n as u64 && (0.1..0.9).contains(&rate),
        "drafts verified, some accepted, some not: {c:?}"
    );
    for pos in 1..4 {
        let count = |runs: &[Collected]| {
            let mut h = std::collections::HashMap::<u32, f64>::new();
            for r in runs {
                *h.entry(r.tokens[pos]).or_default() += 1.0;
            }
            h
        };
        let (a, b) = (count(&off), count(&on));
        let mut keys: Vec<u32> = a.keys().chain(b.keys()).copied().collect();
        keys.sort_unstable();
        keys.dedup();
        // Rare tokens pooled so every cell expects at least 10.
        let (mut chi2, mut cells) = (0.0, 0);
        let (mut ra, mut rb) = (0.0, 0.0);
        let mut cell = |x: f64, y: f64| {
            let e = (x + y) / 2.0;
            chi2 += (x - e).powi(2) / e + (y - e).powi(2) / e;
            cells += 1;
        };
        for k in keys {
            let (x, y) = (
                a.get(&k).copied().unwrap_or(0.0),
                b.get(&k).copied().unwrap_or(0.0),
            );
            if x + y >= 20.0 {
                cell(x, y);
            } else {
                ra += x;
                rb += y;
            }
        }
        if ra + rb > 0.0 {
            cell(ra, rb);
        }
        // p < 0.001 critical values of chi-square with (cells - 1) degrees of freedom, bounded
        // above by the Wilson–Hilferty approximation.
        let df = (cells - 1) as f64;
        let z = 3.09;
        let crit = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
        assert!(
            chi2 < crit,
            "position {pos}: chi2 {chi2:.1} over {cells} cells (critical {crit:.1})"
        );
    }
}

device_test! {
    fn speculation_stands_down_under_load_and_after_rejections(dev) {
        let m = tiny("tiny-gqa-llama3");
        let prompt: Vec<u32> = (1..40).chain(1..40).collect();
        let reqs = |k: usize| {
            (0..k)
                .map(|_| greedy_request(prompt.clone(), 40))
                .collect::<Vec<_>>()
        };
        let keen = |c: &mut SpecConfig| {
            c.prompt_lookup_min = 1;
            c.min_acceptance_rate = 0.0;
            c.min_speedup = 0.0;
        };
        // Eager: drafts at (almost) every step.
        let (base, s) = run(dev, &m, spec(keen), reqs(1));
        let eager = s.counters.spec_draft_tokens;
        let verifications = |c: &cachet_backend::scheduler::SchedulerCounters| {
            c.spec_acceptance_lengths.iter().sum::<u64>()
        };
        let eager_checks = verifications(&s.counters);
        assert!(eager >= 10 && eager_checks >= 4, "{:?}", s.counters);
        // With more decoding requests than disable_by_batch_size, no drafts while they all
        // decode (the counters between the two snapshots and the gauge in the middle of the run
        // say so; a request alone at the very start or end may speculate), same output.
        let (loaded, start, s) = run_midway(
            dev,
            &m,
            spec(|c| {
                keen(c);
                c.disable_by_batch_size = 2;
            }),
            reqs(3),
            8,
        );
        assert!(s.counters.steps >= start.counters.steps + 6, "{:?} then {:?}", start.counters, s.counters);
        assert_eq!(s.counters.spec_draft_tokens, start.counters.spec_draft_tokens, "{:?}", s.counters);
        assert_eq!(s.counters.spec_active, 0, "{:?}", s.counters);
        for r in &loaded {
            assert_greedy_agrees(dev, &m, &prompt, &base[0].tokens, &r.tokens, "under load");
        }
        // A request whose drafts keep failing cools down (an acceptance bar no draft run meets,
        // and a cool-down longer than the output): one verification, then none.
        let (cooled, s) = run(
            dev,
            &m,
            spec(|c| {
                keen(c);
                c.min_acceptance_rate = 1.0;
                c.cooldown_steps = 1000;
            }),
            reqs(1),
        );
        let checks = verifications(&s.counters);
        assert!(
            checks < eager_checks,
            "{checks} verifications with a cool-down vs {eager_checks} without"
        );
        assert_greedy_agrees(
            dev,
            &m,
            &prompt,
            &base[0].tokens,
            &cooled[0].tokens,
            "cooled down",
        );
    }
}

device_test! {
    fn drafts_are_checked_against_the_grammar_and_change_nothing(dev) {
        // A constrained request speculates too: its drafts are cut where its grammar refuses
        // them, each verification row gets the grammar's mask after the drafts before it, and
        // the output is the one without speculation.
        use cachet_backend::grammar::Constraint;
        let m = smollm2();
        let schema = serde_json::json!({"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
            "required": ["name", "age", "city"], "additionalProperties": false});
        let reqs = || {
            let mut r = greedy_request(copy_prompts()[2].clone(), 48);
            r.ignore_eos = false;
            r.constraint = Some(Constraint::JsonSchema(schema.clone()));
            vec![r]
        };
        let (off, _) = run(dev, m, None, reqs());
        let (on, s_on) = run(dev, m, spec(|_| {}), reqs());
        let v: serde_json::Value = serde_json::from_str(&on[0].text).unwrap();
        assert!(v["name"].is_string() && v["age"].is_i64() && v["city"].is_string(), "{v}");
        assert_greedy_agrees(dev, m, &copy_prompts()[2], &off[0].tokens, &on[0].tokens, &on[0].text);
        let c = s_on.counters;
        assert!(c.spec_accepted_tokens > 0, "{c:?}");
    }
}
