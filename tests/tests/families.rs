//! The model families besides Llama against HF transformers: tiny random-weight models that
//! transformers itself built and saved (`scripts/reference.py --families`), and the real
//! Qwen2.5-Coder-0.5B GGUF (`cachet model fetch qwen2.5-coder-0.5b`, dequantised by transformers'
//! own GGUF reader for the reference). Logits within tolerance, greedy identical over 64 tokens
//! through the engine with prefix caching, chunked prefill and batching on.

use cachet_backend::config::Arch;
use cachet_backend::device::WeightQuantization;
use cachet_backend::engine::EngineConfig;
use cachet_backend::generate::{generate, GenerateParams};
use cachet_backend::loader::{self, LoadedModel};
use cachet_backend::scheduler::SchedulerConfig;
use cachet_backend::tokenizer::ChatMessage;
use cachet_tests::*;

const FAMILIES: [(&str, Arch); 7] = [
    ("tiny-qwen2", Arch::Qwen2),
    ("tiny-qwen2-yarn", Arch::Qwen2),
    ("tiny-qwen3", Arch::Qwen3),
    // Windows of 8 keys against prompts of 1–58 tokens: the windows change the result.
    ("tiny-gemma3", Arch::Gemma3),
    ("tiny-mistral-window", Arch::Mistral),
    // Mixtures of experts (tests/tests/moe.rs checks their routing).
    ("tiny-qwen3-moe", Arch::Qwen3Moe),
    ("tiny-mixtral", Arch::Mixtral),
];

#[test]
fn sliding_windows_and_gemma_settings_are_read_from_transformers_configs() {
    let g = tiny("tiny-gemma3").config;
    let windows: Vec<Option<usize>> = (0..3).map(|l| g.layer_window(l)).collect();
    assert_eq!(windows, [Some(8), None, Some(8)], "layer_types");
    assert_eq!(g.rope_local_theta, Some(10000.0));
    assert_eq!(g.rope_theta, 1e6);
    assert!(
        matches!(g.rope_scaling, cachet_backend::config::RopeScaling::Linear { factor } if factor == 2.0)
    );
    assert_eq!(
        g.attention_scale,
        Some(24f64.powf(-0.5)),
        "query_pre_attn_scalar"
    );
    assert!(g.embed_scale && g.post_norms && g.qk_norm && g.tie_word_embeddings);
    assert_eq!(g.hidden_act, cachet_backend::config::Activation::GeluTanh);
    let m = tiny("tiny-mistral-window").config;
    assert_eq!((m.layer_window(0), m.layer_window(1)), (Some(8), Some(8)));
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap()
}

device_test! {
    fn tiny_families_logits_match_transformers(dev) {
        for (name, arch) in FAMILIES {
            let m = tiny(name);
            assert_eq!(m.config.arch, arch, "{name}: the family read from config.json");
            let reference = read_json(&format!("{name}_reference.json"));
            let mut r = device_runner(dev, &m, 16);
            // f32 on the CPU; bf16 weights and activations on a GPU.
            let tol = if dev == DeviceKind::Cpu { 1e-4 } else { 3e-2 };
            for case in reference["cases"].as_array().unwrap() {
                let Some(case) = &case_before_route_tie(dev, case) else {
                    continue;
                };
                let (ids, want, got) = check_case_logits(r.as_mut(), case, tol, name);
                let v = got.vocab;
                let last = ids.len() - 1;
                assert_eq!(
                    argmax(got.row(last)),
                    argmax(&want[last * v..(last + 1) * v]),
                    "{name}, {} tokens: top-1 of the last position",
                    ids.len()
                );
            }
        }
    }
}

/// FP8 checkpoints of tiny-qwen3 (scripts/reference.py --fp8: its weights quantized to e4m3 by
/// torch) load, each weight dequantized with its scales: HF's fine-grained format (16×16
/// blocks, `weight_scale_inv`) and compressed-tensors' per-channel `weight_scale`. Their logits
/// are transformers' on the weights torch dequantized; another quantization is refused by name.
#[test]
fn fp8_checkpoints_load_dequantized_like_transformers() {
    let base = read_json("tiny-qwen3_reference.json");
    for name in ["tiny-qwen3-fp8-block", "tiny-qwen3-fp8-channel"] {
        let m = tiny(name);
        let reference = read_json(&format!("{name}_reference.json"));
        let mut r = device_runner(DeviceKind::Cpu, &m, 16);
        for (case, unquantized) in reference["cases"]
            .as_array()
            .unwrap()
            .iter()
            .zip(base["cases"].as_array().unwrap())
        {
            let (ids, _, got) = check_case_logits(r.as_mut(), case, 1e-4, name);
            // The quantization is real: the unquantized weights give other logits.
            assert_eq!(ids, ids_of(&unquantized["ids"]));
            let moved = rel_err(&got.data, &logits_of(&unquantized["logits"]));
            assert!(
                moved > 1e-4,
                "{name}: FP8 logits equal the unquantized ones ({moved:e})"
            );
        }
    }
    let dir = std::env::temp_dir().join(format!("cachet-gptq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixtures().join("tiny-qwen3");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["quantization_config"] = serde_json::json!({"quant_method": "gptq", "bits": 4});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let e = loader::load(dir.to_str().unwrap(), false)
        .err()
        .expect("a GPTQ config is refused")
        .to_string();
    assert!(e.contains("quant_method `gptq`"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An FP8 checkpoint scaled per output channel stays FP8 on the device by default: quantizing its
/// loaded values again per row gives back its own codes, so the logits are those of the weights
/// as dequantized (to f32 rounding) at half the memory. Per-tensor and block-scaled checkpoints
/// stay dequantized unless asked (a second rounding of every weight), and the flag wins.
#[test]
fn an_fp8_checkpoint_scaled_per_channel_stays_fp8_with_its_own_codes() {
    use cachet_backend::config::Fp8Scales;
    let channel = tiny("tiny-qwen3-fp8-channel");
    let block = tiny("tiny-qwen3-fp8-block");
    assert_eq!(channel.config.checkpoint_fp8, Some(Fp8Scales::PerChannel));
    assert_eq!(block.config.checkpoint_fp8, Some(Fp8Scales::Block));
    assert_eq!(tiny("tiny-qwen3").config.checkpoint_fp8, None);
    let pick = WeightQuantization::for_checkpoint;
    assert_eq!(pick(None, &channel.config), WeightQuantization::Fp8);
    assert_eq!(pick(None, &block.config), WeightQuantization::None);
    assert_eq!(
        pick(Some(WeightQuantization::None), &channel.config),
        WeightQuantization::None
    );
    assert_eq!(
        pick(Some(WeightQuantization::Fp8), &block.config),
        WeightQuantization::Fp8
    );
    let mut kept = device_runner_quantized(DeviceKind::Cpu, &channel, 16, WeightQuantization::Fp8);
    let mut dequantized = device_runner(DeviceKind::Cpu, &channel, 16);
    let reference = read_json("tiny-qwen3-fp8-channel_reference.json");
    for case in reference["cases"].as_array().unwrap() {
        let ids = ids_of(&case["ids"]);
        let (a, b) = (
            all_logits(kept.as_mut(), &ids),
            all_logits(dequantized.as_mut(), &ids),
        );
        let err = rel_err(&a.data, &b.data);
        assert!(
            err < 1e-5,
            "{} tokens: kept FP8 differs from dequantized by {err:e}",
            ids.len()
        );
    }
}

device_test! {
    /// `--quantization fp8`: tiny-qwen3's projections quantized at load, one scale per output
    /// row, give transformers' logits on torch's per-channel e4m3 weights of the same model
    /// (the compressed-tensors fixture's reference) — on the CPU within f32 rounding; on CUDA
    /// through the FP8 GEMV (the 1-token case: weights only) within bf16 tolerance, and through
    /// cuBLASLt's FP8 GEMM (7 and 40 tokens), whose inputs are quantized to e4m3 per token as
    /// well, within the error that adds (4.6e-2 and 4.0e-2 on the H200, BENCHMARKS §5).
    fn fp8_weights_quantized_at_load_match_torch_per_channel_e4m3(dev) {
        let m = tiny("tiny-qwen3");
        let reference = read_json("tiny-qwen3-fp8-channel_reference.json");
        let base = read_json("tiny-qwen3_reference.json");
        let mut r = device_runner_quantized(dev, &m, 16, WeightQuantization::Fp8);
        for (case, unquantized) in reference["cases"]
            .as_array()
            .unwrap()
            .iter()
            .zip(base["cases"].as_array().unwrap())
        {
            let tokens = case["ids"].as_array().unwrap().len();
            let tol = match dev {
                DeviceKind::Cpu => 1e-4,
                _ if tokens == 1 => 3e-2,
                _ => 6e-2,
            };
            let (_, _, got) = check_case_logits(r.as_mut(), case, tol, "tiny-qwen3, fp8 at load");
            eprintln!(
                "{dev:?}, {tokens} tokens: relative error {:e} against torch's FP8 weights",
                rel_err(&got.data, &logits_of(&case["logits"]))
            );
            if dev == DeviceKind::Cpu {
                let moved = rel_err(&got.data, &logits_of(&unquantized["logits"]));
                assert!(moved > 1e-4, "FP8 logits equal the unquantized ones ({moved:e})");
            }
        }
    }
}

/// A rows × cols tensor of N(mean, std²) draws rounded to bf16 (values a bf16 device holds
/// exactly, so the devices compared start from the same inputs).
fn bf16_normal(
    rng: &mut cachet_backend::rng::Rng,
    rows: usize,
    cols: usize,
    mean: f64,
    std: f64,
) -> cachet_backend::tensor::HostTensor {
    let data = (0..rows * cols)
        .map(|_| half::bf16::from_f64(mean + rng.normal() * std).to_f32())
        .collect();
    cachet_backend::tensor::HostTensor::new(vec![rows, cols], data)
}

gpu_test! {
    /// An FP8 GEMM's input rows quantized by `quantize_act_rows_e4m3` (each row read once,
    /// x · 448/amax) give products within what the activations' quantization costs of the CPU's
    /// (bf16 inputs, the same FP8 weights), for rows held in registers and rows read twice (k
    /// past 16,384), with an outlier channel setting each row's scale.
    fn fp8_products_stay_within_the_quantizations_cost_of_the_cpu() {
        use cachet_backend::device::cuda::{CudaDevice, CudaOptions};
        use cachet_backend::device::cpu::CpuDevice;
        use cachet_backend::device::Device;
        let cuda = CudaDevice::new(0, 16, CudaOptions::default()).unwrap();
        let cpu = CpuDevice::new();
        let mut rng = cachet_backend::rng::Rng::new(11);
        let mut bf16_rows = |rows: usize, cols: usize, std: f64| bf16_normal(&mut rng, rows, cols, 0.0, std);
        for (m, k) in [(64, 64), (256, 4096), (128, 14336), (64, 20480)] {
            let w = bf16_rows(m, k, (k as f64).powf(-0.5));
            let wq = cuda.quantize_fp8(cuda.upload(&w).unwrap()).unwrap();
            let wc = cpu.quantize_fp8(cpu.upload(&w).unwrap()).unwrap();
            for n in [5, 40, 300] {
                let mut x = bf16_rows(n, k, 1.0);
                for t in 0..n {
                    x.data[t * k + 3] = 24.0;
                }
                let got = cuda.to_host(&cuda.linear(&cuda.upload(&x).unwrap(), &wq).unwrap()).unwrap();
                let reference = cpu.to_host(&cpu.linear(&cpu.upload(&x).unwrap(), &wc).unwrap()).unwrap();
                let err = rel_err(&got, &reference);
                eprintln!("{n}×{k} · ({m}×{k})ᵀ: {err:.2e} off the CPU");
                assert!(err < 8e-2, "{n}×{k}: {err:e} off the CPU");
            }
        }
    }
}

device_test! {
    fn tiny_families_greedy_64_tokens_like_transformers_with_caching_chunking_batching(dev) {
        for (name, _) in FAMILIES {
            let m = tiny(name);
            let reference = read_json(&format!("{name}_reference.json"));
            let cases: Vec<(Vec<u32>, Vec<u32>, Option<usize>)> = reference["greedy"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| (ids_of(&c["prompt"]), ids_of(&c["output"]), first_route_tie(&c["route_gaps"])))
                .collect();
            // Alone, one sequence a step.
            let mut r = device_runner(dev, &m, 32);
            for (prompt, want, tie) in &cases {
                let params = GenerateParams { max_tokens: 64, ..Default::default() };
                let out = generate(r.as_mut(), prompt, &params, |_| true).unwrap();
                let what = format!("{name} alone");
                assert_greedy_agrees_routed(dev, &m, prompt, (want, &out.tokens), *tie, &what);
            }
            // Through the engine: both prompts at once (batched), 16-token steps (chunked
            // prefill interleaved with decode), twice (the second round hits the prefix cache:
            // the 37 shared tokens and the whole first prompts).
            let cfg = EngineConfig {
                scheduler: SchedulerConfig { max_num_batched_tokens: 16, ..Default::default() },
                ..Default::default()
            };
            let e = engine(dev, &m, 64, cfg);
            check_engine_greedy_rounds(dev, &m, &e, &cases, &format!("{name} engine"));
        }
    }
}

/// Qwen2.5-Coder-0.5B-Instruct (loaded per test and dropped after it: see [`REAL_WEIGHTS`]).
fn qwen05() -> LoadedModel {
    loader::load(qwen05_path().to_str().unwrap(), false).unwrap()
}

/// The last position's logits against a fixture case's top 5 (`{"id", "logit"}`): each within
/// `tol` relative (to at least 1), and the top-1 equal — on a bf16 device only where the
/// reference's top two are over 0.5 apart (bf16 may reorder a near tie).
fn check_top5(dev: DeviceKind, last: &[f32], case: &serde_json::Value, tol: f64, what: &str) {
    let top5 = case["top5"].as_array().unwrap();
    let gap = top5[0]["logit"].as_f64().unwrap() - top5[1]["logit"].as_f64().unwrap();
    if dev == DeviceKind::Cpu || gap > 0.5 {
        assert_eq!(
            argmax(last),
            top5[0]["id"].as_u64().unwrap() as usize,
            "{what:?}: top-1"
        );
    }
    for want in top5 {
        let (id, logit) = (
            want["id"].as_u64().unwrap() as usize,
            want["logit"].as_f64().unwrap(),
        );
        let err = (last[id] as f64 - logit).abs() / logit.abs().max(1.0);
        assert!(
            err <= tol,
            "{what:?}: token {id}: {} vs {logit} ({err:e})",
            last[id]
        );
    }
}

/// A Qwen2.5-Coder model against its transformers fixture: tokenization, top-5 logits, the chat
/// template and the greedy chat answer.
fn check_qwen(dev: DeviceKind, m: &LoadedModel, fixture: &str) {
    assert_eq!(m.config.arch, Arch::Qwen2);
    assert!(m.config.attention_bias);
    let reference = read_json(fixture);
    let tok = m.tokenizer.as_ref().unwrap();
    let mut r = device_runner(dev, m, 64);
    // f32 on the CPU (transformers dequantises to the same f32 values); bf16 on a GPU.
    let tol = if dev == DeviceKind::Cpu { 2e-3 } else { 5e-2 };
    for case in reference["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let ids = ids_of(&case["ids"]);
        assert_eq!(
            tok.encode(prompt).unwrap(),
            ids,
            "tokenization of {prompt:?}"
        );
        let logits = all_logits(r.as_mut(), &ids);
        let last = logits.row(ids.len() - 1);
        check_top5(dev, last, case, tol, prompt);
    }
    // The chat template and a greedy answer.
    let chat = &reference["greedy_chat"];
    let msgs: Vec<ChatMessage> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let prompt = tok.render_chat(&msgs, true).unwrap();
    assert_eq!(
        prompt,
        chat["prompt"].as_str().unwrap(),
        "chat template rendering"
    );
    let ids = tok.encode(&prompt).unwrap();
    assert_eq!(ids, ids_of(&chat["prompt_ids"]));
    let want = ids_of(&chat["output_ids"]);
    let params = GenerateParams {
        max_tokens: want.len(),
        stop_token_ids: m.config.eos_token_ids.clone(),
        ..Default::default()
    };
    let out = generate(r.as_mut(), &ids, &params, |_| true).unwrap();
    let eos = &m.config.eos_token_ids;
    let got: Vec<u32> = out
        .tokens
        .iter()
        .copied()
        .filter(|t| !eos.contains(t))
        .collect();
    let want: Vec<u32> = want.into_iter().filter(|t| !eos.contains(t)).collect();
    assert_greedy_agrees(dev, m, &ids, &want, &got, fixture);
    eprintln!("{}", tok.decode(&got, true).unwrap());
}

device_test! {
    fn qwen25_coder_05b_matches_transformers(dev) {
        let _one = one_real_model_at_a_time();
        check_qwen(dev, &qwen05(), "qwen2.5-coder-0.5b_reference.json");
    }
}

/// The 1.5B model (28 layers, Q4_K / Q6_K) on the CPU reference.
#[test]
fn qwen25_coder_15b_matches_transformers() {
    let _one = one_real_model_at_a_time();
    let m = loader::load(qwen15_path().to_str().unwrap(), false).unwrap();
    check_qwen(DeviceKind::Cpu, &m, "qwen2.5-coder-1.5b_reference.json");
}

/// Gemma 3 270M (base; SentencePiece tokenizer from GGUF metadata, 18 layers with windows of
/// 512 keys, head_dim 256) against transformers.
fn gemma270m() -> LoadedModel {
    loader::load(gemma270m_path().to_str().unwrap(), false).unwrap()
}

device_test! {
    fn gemma3_270m_matches_transformers(dev) {
        let _one = one_real_model_at_a_time();
        let m = &gemma270m();
        assert_eq!(m.config.arch, Arch::Gemma3);
        assert_eq!(m.config.sliding_window, Some(512));
        let reference = read_json("gemma3-270m_reference.json");
        let tok = m.tokenizer.as_ref().unwrap();
        for t in reference["tokenizer"].as_array().unwrap() {
            let text = t["text"].as_str().unwrap();
            let ids = tok.encode(text).unwrap();
            assert_eq!(ids, ids_of(&t["ids"]), "tokenization of {text:?}");
            // Decoding gives the text back (every piece of it is in the vocabulary or its bytes).
            assert_eq!(tok.decode(&ids, false).unwrap(), text, "decoding {text:?}");
        }
        let mut r = device_runner(dev, m, 64);
        // f32 on the CPU; bf16 on a GPU, where near ties may reorder.
        let tol = if dev == DeviceKind::Cpu { 2e-3 } else { 5e-2 };
        for case in reference["cases"].as_array().unwrap() {
            let ids = ids_of(&case["ids"]);
            let logits = all_logits(r.as_mut(), &ids);
            let last = logits.row(ids.len() - 1);
            let what = case["prompt"].as_str().unwrap();
            check_top5(dev, last, case, tol, what);
        }
        let g = &reference["greedy"];
        let prompt = ids_of(&g["prompt_ids"]);
        // A plain prompt starts with BOS, as transformers' tokenizer (and the file) says.
        assert_eq!(tok.encode_prompt("The capital of France is").unwrap(), prompt);
        let want = ids_of(&g["output_ids"]);
        let params = GenerateParams { max_tokens: want.len(), ..Default::default() };
        let out = generate(r.as_mut(), &prompt, &params, |_| true).unwrap();
        assert_greedy_agrees(dev, m, &prompt, &want, &out.tokens, "Gemma 3 270M greedy");
        if out.tokens == want {
            assert_eq!(tok.decode(&out.tokens, true).unwrap(), g["text"].as_str().unwrap());
        }
        eprintln!("{}", tok.decode(&out.tokens, true).unwrap());
    }
}

gpu_test! {
    /// What the CUDA device cannot run it refuses by name, before loading anything.
    fn cuda_refuses_a_head_dim_above_256_by_name() {
        // A head_dim no kernel takes, on the tiny Gemma's other sizes (random weights).
        let mut config = tiny("tiny-gemma3").config;
        config.head_dim = 512;
        let m = LoadedModel {
            name: "tiny-gemma3-d512".into(),
            source: "<random>".into(),
            weights: cachet_backend::loader::random::random_weights(&config, 1),
            config,
            tokenizer: None,
        };
        let opts = cachet_backend::model::runner::RunnerOptions {
            device: DeviceKind::Cuda,
            block_size: 16,
            max_model_len: 1024,
            fit_max_model_len: false,
            kv: cachet_backend::model::runner::KvBudget::Blocks(16),
            cuda_graph_sizes: vec![],
            cuda_graph_verify: None,
            kv_cache_dtype: Default::default(),
            quantization: Default::default(),
            tensor_parallel_size: 1,
            kv_calibration: Vec::new(),
        };
        let err = match cachet_backend::model::runner::build_runner(
            &m.config,
            cachet_backend::model::runner::WeightSource::Host(&m.weights),
            &opts,
        ) {
            Ok(_) => panic!("the CUDA device took a head_dim of 512"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("head_dim 512"), "{err}");
    }
}

device_test! {
    /// A model whose every layer slides hands the blocks behind its window back as a request
    /// moves on: a 240-token context holds a few blocks, and the output is the one the model
    /// gives with every block kept (`generate`, which keeps them all).
    fn blocks_behind_every_layers_window_are_reused(dev) {
        let m = tiny("tiny-mistral-window");
        let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 300).collect();
        let mut r = device_runner(dev, &m, 32);
        let params = GenerateParams { max_tokens: 200, ..Default::default() };
        let want = generate(r.as_mut(), &prompt, &params, |_| true).unwrap().tokens;
        drop(r);
        let e = engine(dev, &m, 64, EngineConfig::default());
        let h = e.handle();
        let mut s = h.submit(greedy_request(prompt.clone(), 200)).unwrap();
        let (mut got, mut held) = (Vec::new(), Vec::new());
        while let Some(ev) = s.next_blocking() {
            if let cachet_backend::request::EngineEvent::Token { id, .. } = ev {
                got.push(id);
                if got.len() % 50 == 0 {
                    held.push(h.stats().kv.used);
                }
            }
        }
        assert_greedy_agrees(dev, &m, &prompt, &want, &got, "window-freed engine");
        // 240 tokens are 15 blocks of 16; behind the read tile (64 keys) of the 8-key window
        // the request holds at most 64 + 8 + 16 tokens' worth at any time: 6 blocks.
        assert!(held.iter().all(|&u| u <= 6), "blocks held along the way: {held:?}");
        assert!(held.len() >= 3, "sampled {held:?}");
    }
}
