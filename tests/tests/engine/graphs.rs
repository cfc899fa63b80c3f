//! The CUDA graphs and the few-row kernels against eager steps and the CPU reference
//! (`gpu_test!`s: run with `--ignored` on a GPU; skipped, saying so, elsewhere).

use super::*;

/// Sequences of `lens` tokens (from `base`, shifted per sequence) prefilled on `r`, each with
/// room for `extra` more tokens: (context length, block table, prompt ids, greedy next token).
fn prefilled_contexts(
    r: &mut dyn cachet_backend::model::Runner,
    alloc: &mut cachet_backend::kv::SimpleAllocator,
    base: &[u32],
    lens: &[usize],
    extra: usize,
) -> Vec<(usize, Vec<u32>, Vec<u32>, u32)> {
    let bs = r.kv_layout().block_size;
    let vocab = smollm2().config.vocab_size as u32;
    lens.iter()
        .enumerate()
        .map(|(i, &len)| {
            let ids: Vec<u32> = (0..len)
                .map(|j| (base[(j + i) % base.len()] + (j / base.len()) as u32) % vocab)
                .collect();
            let mut table = Vec::new();
            alloc.ensure(&mut table, len + 1 + extra).unwrap();
            let mut b = cachet_backend::device::ForwardBatch::default();
            b.push_seq(&ids, 0, &table, bs, true);
            let next = argmax(r.forward(&b).unwrap().row(0)) as u32;
            (len, table, ids, next)
        })
        .collect()
}

/// `examples/configs/{name}.json` with random weights (`seed`): no download.
fn random_model(name: &str, seed: u64) -> cachet_backend::loader::LoadedModel {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/configs")
        .join(format!("{name}.json"));
    let config = cachet_backend::config::ModelConfig::from_hf_json(&path).unwrap();
    cachet_backend::loader::LoadedModel {
        name: name.into(),
        source: "<random>".into(),
        weights: cachet_backend::loader::random::random_weights(&config, seed),
        config,
        tokenizer: None,
    }
}

/// Prefills a synthetic prompt of each of `lens` (token j of prompt i: (j · (stride + i) + 1) mod
/// the vocabulary) on every runner of `rs`, the first choosing each prompt's next token:
/// (length, block table, next token) per prompt.
fn prefilled_synthetic(
    rs: &mut [&mut dyn cachet_backend::model::Runner],
    alloc: &mut cachet_backend::kv::SimpleAllocator,
    vocab: usize,
    lens: &[usize],
    stride: usize,
) -> Vec<(usize, Vec<u32>, u32)> {
    let bs = rs[0].kv_layout().block_size;
    lens.iter()
        .enumerate()
        .map(|(i, &len)| {
            let ids: Vec<u32> = (0..len)
                .map(|j| ((j * (stride + i) + 1) % vocab) as u32)
                .collect();
            let mut table = Vec::new();
            alloc.ensure(&mut table, len + 1).unwrap();
            let mut b = cachet_backend::device::ForwardBatch::default();
            b.push_seq(&ids, 0, &table, bs, true);
            let next = argmax(rs[0].forward(&b).unwrap().row(0)) as u32;
            for r in rs[1..].iter_mut() {
                r.forward(&b).unwrap();
            }
            (len, table, next)
        })
        .collect()
}

/// Runs `b` eagerly, from a graph, and eagerly again: every logits row of the graph must be
/// within bf16 error of the eager one with a top token no more than `tie` below the eager top
/// (0: the same token), and the second eager run must match the first (the replay wrote no K/V
/// it should not have).
fn graph_matches_eager(
    r: &mut dyn cachet_backend::model::Runner,
    b: &cachet_backend::device::ForwardBatch,
    tie: f32,
    what: &str,
) {
    r.set_cuda_graphs(false);
    let eager = r.forward(b).unwrap();
    r.set_cuda_graphs(true);
    let graphed = r.forward(b).unwrap();
    r.set_cuda_graphs(false);
    let again = r.forward(b).unwrap();
    assert_eq!(graphed.data.len(), eager.data.len(), "{what}");
    for row in 0..b.logit_rows.len() {
        let (e, g, a) = (eager.row(row), graphed.row(row), again.row(row));
        let top = e[argmax(e)];
        assert!(
            argmax(e) == argmax(g) || (tie > 0.0 && e[argmax(g)] >= top - tie),
            "{what}, row {row}: graph top-1 {} is {} below eager's {}",
            argmax(g),
            top - e[argmax(g)],
            argmax(e)
        );
        let err = rel_err(g, e);
        assert!(err < 1e-2, "{what}, row {row}: graph vs eager {err}");
        assert!(rel_err(a, e) < 1e-2, "{what}, row {row}: the cache changed");
    }
}

/// Decode steps of the sequences `picks` name (indices into contexts of 40, 300, 700, 129, 17,
/// 60, 90, 33 and 250 tokens: buckets 256, 512 and 1024), each run eagerly and from a graph.
fn decode_graphs_match_eager(r: &mut dyn cachet_backend::model::Runner, picks: &[&[usize]]) {
    use cachet_backend::device::ForwardBatch;
    use cachet_backend::kv::SimpleAllocator;
    assert!(
        r.set_cuda_graphs(true),
        "the CUDA runner captured no graphs"
    );
    let bs = r.kv_layout().block_size;
    let mut alloc = SimpleAllocator::new(r.kv_layout().num_blocks, bs);
    let seqs = prefilled_contexts(
        r,
        &mut alloc,
        &prompts()[0],
        &[40, 300, 700, 129, 17, 60, 90, 33, 250],
        0,
    );
    for pick in picks {
        let mut b = ForwardBatch::default();
        for &i in pick.iter() {
            let (len, table, _, next) = &seqs[i];
            b.push_seq(&[*next], *len, table, bs, true);
        }
        graph_matches_eager(r, &b, 0.0, &format!("decode batch {pick:?}"));
    }
}

gpu_test! {
    /// On a device with CUDA graphs, a decode step replayed from a graph gives the eager step's
    /// logits (same argmax, bf16-level error) — for a batch that is padded (3 → 4, 5 → 8), one that
    /// is not (1), and contexts in different buckets; padding rows write no K/V (the eager replay
    /// afterwards still agrees).
    fn decode_steps_replayed_from_cuda_graphs_match_eager_steps() {
        let mut r = device_runner(DeviceKind::Cuda, smollm2(), 512);
        decode_graphs_match_eager(r.as_mut(), &[&[0], &[0, 1, 2], &[0, 1, 2, 3, 4]]);
    }
}

gpu_test! {
    /// The same with FP8 projection weights (`--quantization fp8`): steps of up to two rows go
    /// through the FP8 GEMV, larger ones (3 → 4, 5 → 8 and 9 → 16 rows in the graphs) through cuBLASLt's
    /// FP8 product with its activation quantization and scale launches — all inside the graphs.
    fn decode_steps_with_fp8_weights_replayed_from_cuda_graphs_match_eager_steps() {
        let q = cachet_backend::device::WeightQuantization::Fp8;
        let mut r = device_runner_quantized(DeviceKind::Cuda, smollm2(), 512, q);
        decode_graphs_match_eager(
            r.as_mut(),
            &[&[0], &[0, 1, 2], &[0, 1, 2, 3, 4], &[0, 1, 2, 3, 4, 5, 6, 7, 8]],
        );
    }
}

gpu_test! {
    /// The same with FP8 weights on a random model (no download: the served 8B's head_dim 128,
    /// GQA 4): steps of 5 and 9 rows take cuBLASLt's FP8 product inside the graphs. Run with
    /// `CACHET_FP8_GEMM_TUNE=timed` as well (scripts/gpu_fp8_gemm_tune.sh), where the graphs are
    /// captured after the eager warm-up step that times each product shape's candidates.
    fn decode_steps_of_a_random_fp8_model_replayed_from_cuda_graphs_match_eager_steps() {
        use cachet_backend::device::ForwardBatch;
        use cachet_backend::kv::SimpleAllocator;
        let m = random_model("small-gqa-d128", 9);
        let q = cachet_backend::device::WeightQuantization::Fp8;
        let mut r = device_runner_quantized(DeviceKind::Cuda, &m, 256, q);
        assert!(r.set_cuda_graphs(true), "the CUDA runner captured no graphs");
        let bs = r.kv_layout().block_size;
        let mut alloc = SimpleAllocator::new(r.kv_layout().num_blocks, bs);
        let lens = [40, 300, 700, 129, 17, 60, 90, 33, 250];
        let seqs = prefilled_synthetic(&mut [r.as_mut()], &mut alloc, m.config.vocab_size, &lens, 5);
        for n in [1usize, 3, 5, 9] {
            let mut b = ForwardBatch::default();
            for (len, table, next) in &seqs[..n] {
                b.push_seq(&[*next], *len, table, bs, true);
            }
            // Random weights leave near ties among 1,000 tokens: a top token within 2e-2 of the
            // eager top passes (the graph's padded rows round the products as another row count).
            graph_matches_eager(r.as_mut(), &b, 2e-2, &format!("random FP8 model, decode batch {n}"));
        }
    }
}

gpu_test! {
    /// On a device with CUDA graphs for speculative verification steps, a verification step (each
    /// sequence's last token and up to four drafts, logits for every token) replayed from a graph
    /// gives the eager step's logits — sequences padded to five tokens (1, 3 and 5 real ones) and
    /// batches padded (3 → 4) — and its padding writes no K/V. The graph pads each sequence to five
    /// rows, so its GEMMs round as another row count does: the top token may differ only at a near
    /// tie.
    fn verification_steps_replayed_from_cuda_graphs_match_eager_steps() {
        use cachet_backend::device::ForwardBatch;
        use cachet_backend::kv::SimpleAllocator;
        let m = smollm2();
        let spec = cachet_backend::spec::SpecConfig::default();
        let mut r = device_runner_for(DeviceKind::Cuda, m, 512, Default::default(), Some(&spec));
        assert!(r.set_cuda_graphs(true), "the CUDA runner captured no graphs");
        let bs = r.kv_layout().block_size;
        let mut alloc = SimpleAllocator::new(r.kv_layout().num_blocks, bs);
        let k = spec.num_speculative_tokens;
        let seqs = prefilled_contexts(r.as_mut(), &mut alloc, &prompts()[1], &[40, 300, 129], k);
        let drafts = [0usize, 2, 4];
        for pick in [vec![2usize], vec![1], vec![0, 1, 2]] {
            let mut b = ForwardBatch::default();
            for &i in &pick {
                let (len, table, ids, next) = &seqs[i];
                // Drafts: what the prompt had at its start (some will be wrong: any is fine).
                let q: Vec<u32> = std::iter::once(*next)
                    .chain(ids[..drafts[i]].iter().copied())
                    .collect();
                b.push_seq(&q, *len, table, bs, false);
            }
            b.logit_rows = (0..b.num_tokens() as u32).collect();
            graph_matches_eager(
                r.as_mut(),
                &b,
                0.25,
                &format!("verification batch {pick:?}"),
            );
        }
    }
}

gpu_test! {
    /// Decode steps of 1 to 5 sequences give the CPU reference's logits as closely as the device's
    /// large-batch path does. (The CUDA device serves up to 4 rows with its fused GEMV kernels —
    /// norm and SwiGLU folded in — and more with cuBLAS; the 5-row step sets each row's bar: within
    /// 1.5× its error, or 2e-2, and the same top-1 token wherever the reference is not at a near
    /// tie.)
    fn decode_steps_of_a_few_rows_match_the_cpu_reference() {
        use cachet_backend::device::ForwardBatch;
        use cachet_backend::kv::SimpleAllocator;
        let m = smollm2();
        let mut dev = device_runner(DeviceKind::Cuda, m, 256);
        assert_eq!(dev.device_name(), "cuda");
        let mut cpu = runner(m, 256);
        let bs = dev.kv_layout().block_size;
        let mut alloc = SimpleAllocator::new(256, bs);
        let base = &prompts()[1];
        let lens = [23usize, 160, 301, 77, 9];
        let mut seqs = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            let ids: Vec<u32> = (0..len).map(|j| base[(j * (i + 1)) % base.len()]).collect();
            let mut table = Vec::new();
            alloc.ensure(&mut table, len + 1).unwrap();
            let mut b = ForwardBatch::default();
            b.push_seq(&ids, 0, &table, bs, true);
            let reference = cpu.forward(&b).unwrap();
            dev.forward(&b).unwrap();
            seqs.push((len, table, argmax(reference.row(0)) as u32));
        }
        let step = |n: usize| {
            let mut b = ForwardBatch::default();
            for (len, table, next) in &seqs[..n] {
                b.push_seq(&[*next], *len, table, bs, true);
            }
            b
        };
        let want = cpu.forward(&step(lens.len())).unwrap();
        let got = dev.forward(&step(lens.len())).unwrap();
        let bar: Vec<f64> = (0..lens.len())
            .map(|row| (1.5 * rel_err(got.row(row), want.row(row))).max(2e-2))
            .collect();
        // Every (batch size, row) is checked before failing, so one run shows the whole pattern.
        let mut bad = Vec::new();
        for graphs in [false, true] {
            dev.set_cuda_graphs(graphs);
            for n in 1..lens.len() {
                let want = cpu.forward(&step(n)).unwrap();
                let got = dev.forward(&step(n)).unwrap();
                for (row, &bar) in bar.iter().enumerate().take(n) {
                    let (w, g) = (want.row(row), got.row(row));
                    let err = rel_err(g, w);
                    let top = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let clear = w.iter().filter(|&&x| top - x <= NEAR_TIE).count() == 1;
                    let top1_differs = clear && argmax(g) != argmax(w);
                    eprintln!(
                        "graphs {graphs}, {n} rows, row {row}: rel err {err:.2e} (bar {bar:.2e})"
                    );
                    if err > bar || top1_differs {
                        bad.push(format!(
                            "graphs {graphs}, {n} rows, row {row}: rel err {err:.2e} (bar {bar:.2e}), top-1 {} vs {}",
                            argmax(g),
                            argmax(w)
                        ));
                    }
                }
            }
        }
        assert!(bad.is_empty(), "{bad:#?}");
    }
}

gpu_test! {
    /// A mixed step — sequences decoding one token beside a prompt chunk, one attention launch
    /// on the 16-row tensor-core kernel — gives the CPU reference's logits on every row, for the
    /// bf16 and the FP8 cache, head_dim 64 and 128, GQA groups 4 and 8 (random weights). The
    /// decoding sequences sit before, between and after the prompt in the batch, their contexts
    /// short and long. (The attention check runs one sequence a step; this is the step the
    /// served benchmark's chunked prefill runs most.)
    fn mixed_steps_match_the_cpu_reference() {
        use cachet_backend::device::{ForwardBatch, KvCacheDtype};
        use cachet_backend::kv::SimpleAllocator;
        let mut bad = Vec::new();
        for name in ["small-gqa-d64", "small-gqa-d128", "small-gqa8-d128"] {
            let m = random_model(name, 5);
            let v = m.config.vocab_size as u32;
            for dtype in [KvCacheDtype::Auto, KvCacheDtype::Fp8E4m3] {
                let mut dev = device_runner_with(DeviceKind::Cuda, &m, 256, dtype);
                let mut cpu = device_runner_with(DeviceKind::Cpu, &m, 256, dtype);
                let bs = dev.kv_layout().block_size;
                let mut alloc = SimpleAllocator::new(256, bs);
                // Contexts of 40, 700 and 1,100 tokens, prefilled on both devices.
                let seqs = prefilled_synthetic(
                    &mut [cpu.as_mut(), dev.as_mut()],
                    &mut alloc,
                    m.config.vocab_size,
                    &[40, 700, 1100],
                    7,
                );
                // The mixed step: decode, a 100-token prompt, decode, decode; logits for every row.
                let prompt: Vec<u32> = (0..100u32).map(|j| (j * 13 + 1) % v).collect();
                let mut ptable = Vec::new();
                alloc.ensure(&mut ptable, prompt.len()).unwrap();
                let mut b = ForwardBatch::default();
                let (len, table, next) = &seqs[0];
                b.push_seq(&[*next], *len, table, bs, true);
                b.push_seq(&prompt, 0, &ptable, bs, true);
                for (len, table, next) in &seqs[1..] {
                    b.push_seq(&[*next], *len, table, bs, true);
                }
                b.logit_rows = (0..b.num_tokens() as u32).collect();
                let want = cpu.forward(&b).unwrap();
                let got = dev.forward(&b).unwrap();
                let tol = if dtype == KvCacheDtype::Auto { 2e-2 } else { 5e-2 };
                let mut worst = 0f64;
                for row in 0..b.num_tokens() {
                    let (w, g) = (want.row(row), got.row(row));
                    let err = rel_err(g, w);
                    worst = worst.max(err);
                    let top = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let clear = w.iter().filter(|&&x| top - x <= NEAR_TIE).count() == 1;
                    if err > tol || (clear && argmax(g) != argmax(w)) {
                        bad.push(format!("{name} {dtype:?} row {row}: rel err {err:.2e}, top-1 {} vs {}", argmax(g), argmax(w)));
                    }
                }
                eprintln!("{name} {dtype:?}: {} rows, worst rel err {worst:.2e} (bar {tol:.0e})", b.num_tokens());
            }
        }
        assert!(bad.is_empty(), "{bad:#?}");
    }
}
