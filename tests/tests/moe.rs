//! Mixture-of-experts models (issue 24): Qwen3-MoE and Mixtral configs read as transformers
//! writes them, the variants this engine does not run refused by name, and the router's choices
//! equal to transformers' (its own router logits, `output_router_logits`) wherever the k-th and
//! the next probability are not a near tie. Logits and greedy decoding against transformers run
//! with the other families (tests/tests/families.rs), tensor parallelism in
//! tests/tests/tensor_parallel.rs.

use std::borrow::Cow;

use cachet_backend::config::{Arch, MoeConfig};
use cachet_backend::device::cpu::CpuDevice;
use cachet_backend::device::{
    Device, ForwardBatch, Instruments, KvCacheDtype, KvLayout, WeightQuantization,
};
use cachet_backend::loader;
use cachet_backend::model::Decoder;
use cachet_backend::tensor::HostTensor;
use cachet_tests::*;

#[test]
fn moe_configs_are_read_as_transformers_writes_them() {
    let q = tiny("tiny-qwen3-moe").config;
    assert_eq!(q.arch, Arch::Qwen3Moe);
    assert!(q.qk_norm, "Qwen3-MoE has Qwen3's q/k norm");
    assert_eq!(
        q.moe,
        Some(MoeConfig {
            num_experts: 8,
            top_k: 3,
            expert_intermediate_size: 32,
            norm_topk_prob: false
        })
    );
    let m = tiny("tiny-mixtral").config;
    assert_eq!(m.arch, Arch::Mixtral);
    assert_eq!(
        m.moe,
        Some(MoeConfig {
            num_experts: 4,
            top_k: 2,
            expert_intermediate_size: 64,
            norm_topk_prob: true
        })
    );
}

/// tiny-qwen3-moe as transformers 5 holds it — each layer's experts in two fused parameters
/// (`mlp.experts.gate_up_proj` [E, 2·I, h], `mlp.experts.down_proj` [E, h, I]), saved from its
/// state_dict (scripts/reference.py --moe-gguf) — loads to the same weights: transformers' logits.
#[test]
fn transformers_fused_expert_tensors_load_like_per_expert_ones() {
    let m = tiny("tiny-qwen3-moe-fused");
    assert_eq!(m.config.moe, tiny("tiny-qwen3-moe").config.moe);
    let reference = read_json("tiny-qwen3-moe_reference.json");
    let mut r = device_runner(DeviceKind::Cpu, &m, 16);
    for case in reference["cases"].as_array().unwrap() {
        check_case_logits(r.as_mut(), case, 1e-4, "tiny-qwen3-moe-fused");
    }
}

/// A copy of tiny-qwen3-moe's config.json with `edit` applied: what loading it says.
fn load_edited(edit: impl Fn(&mut serde_json::Value)) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!(
        "cachet-moe-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixtures().join("tiny-qwen3-moe");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let r = loader::load(dir.to_str().unwrap(), false)
        .map(|_| ())
        .map_err(|e| e.to_string());
    std::fs::remove_dir_all(&dir).unwrap();
    r
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn unsupported_moe_variants_are_refused_naming_the_field() {
    assert_eq!(load_edited(|_| {}), Ok(()), "the unedited copy loads");
    for (field, value) in [
        ("shared_expert_intermediate_size", serde_json::json!(64)),
        ("n_shared_experts", serde_json::json!(1)),
        ("n_group", serde_json::json!(4)),
        ("mlp_only_layers", serde_json::json!([1])),
        ("decoder_sparse_step", serde_json::json!(2)),
    ] {
        let err = load_edited(|c| c[field] = value.clone()).expect_err(field);
        assert!(err.contains(&format!("`{field}`")), "{field}: {err}");
    }
    let err = load_edited(|c| c["num_experts_per_tok"] = 9.into()).unwrap_err();
    assert!(
        err.contains("num_experts_per_tok") && err.contains("8 experts"),
        "{err}"
    );
    let err = load_edited(|c| {
        c.as_object_mut().unwrap().remove("moe_intermediate_size");
    })
    .unwrap_err();
    assert!(err.contains("moe_intermediate_size"), "{err}");
    // A dense family's config with experts stays refused.
    let dir = std::env::temp_dir().join(format!("cachet-moe-dense-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixtures().join("tiny-qwen3");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["num_experts"] = 8.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let err = loader::load(dir.to_str().unwrap(), false)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("`num_experts`"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Our routing of each layer's tokens (the CPU device's record) against transformers' top-k of
/// its own router logits, over the 40-token fixture case: equal wherever the k-th probability
/// is not within 1e-4 of the next (a tie f32 rounding may break either way).
#[test]
fn router_choices_equal_transformers_where_not_tied() {
    for name in ["tiny-qwen3-moe", "tiny-mixtral"] {
        let m = tiny(name);
        let reference = read_json(&format!("{name}_reference.json"));
        let ids = ids_of(&reference["cases"].as_array().unwrap().last().unwrap()["ids"]);
        let dev = CpuDevice::recording_routes();
        let weights = m.weights.as_refs().map(Cow::Borrowed);
        let dec = Decoder::new(&dev, &m.config, weights, 256, WeightQuantization::None).unwrap();
        let layout = KvLayout {
            num_layers: m.config.num_hidden_layers,
            num_blocks: 4,
            block_size: 16,
            num_kv_heads: m.config.num_key_value_heads,
            head_dim: m.config.head_dim,
            dtype: KvCacheDtype::Auto,
        };
        let mut kv = dev.alloc_kv(&layout, None).unwrap();
        let mut b = ForwardBatch::default();
        b.push_seq(&ids, 0, &[0, 1, 2], 16, true);
        dec.forward(&dev, &mut kv, &b).unwrap();
        let ours = dev.take_routes();
        let layers = reference["routes"].as_array().unwrap();
        assert_eq!(ours.len(), layers.len(), "{name}: one routing per layer");
        let (mut compared, mut tied) = (0, 0);
        for (l, (got, want)) in ours.iter().zip(layers).enumerate() {
            for (t, (g, w)) in got
                .iter()
                .zip(want["experts"].as_array().unwrap())
                .enumerate()
            {
                if want["gap"][t].as_f64().unwrap() < 1e-4 {
                    tied += 1;
                    continue;
                }
                let w: Vec<usize> = w
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e.as_u64().unwrap() as usize)
                    .collect();
                assert_eq!(g, &w, "{name}: layer {l}, token {t}");
                compared += 1;
            }
        }
        assert!(
            compared >= 70 && tied <= 10,
            "{name}: {compared} compared, {tied} near ties"
        );
    }
}

/// The thin twins of the batch-1 structure benchmark (BENCHMARKS §8) are their models with only
/// the widths changed — hidden state, MLP and expert widths, vocabulary and its special ids — so
/// the same kernels run in the same order over next to no weight bytes.
#[test]
fn thin_twins_are_their_models_but_for_the_widths() {
    let dir = fixtures().join("../../examples/configs");
    let load = |f: &str| cachet_backend::config::ModelConfig::from_hf_json(&dir.join(f)).unwrap();
    for (full, thin) in [
        ("qwen3-30b-a3b.json", "qwen3-30b-a3b-thin.json"),
        ("llama3-8b.json", "llama3-8b-thin.json"),
    ] {
        let (full, mut thin) = (load(full), load(thin));
        assert_eq!(thin.hidden_size, 256);
        assert!(thin.num_parameters() * 10 < full.num_parameters());
        thin.hidden_size = full.hidden_size;
        thin.intermediate_size = full.intermediate_size;
        thin.vocab_size = full.vocab_size;
        thin.bos_token_id = full.bos_token_id;
        thin.eos_token_ids = full.eos_token_ids.clone();
        if let (Some(t), Some(f)) = (thin.moe.as_mut(), full.moe) {
            t.expert_intermediate_size = f.expert_intermediate_size;
        }
        assert_eq!(thin, full);
    }
}

/// The example shapes of the H200 benchmarks have their published sizes: Qwen3-30B-A3B 30.5 B
/// parameters with 3.3 B active per token, Mixtral-8x7B 46.7 B with 12.9 B active; one token
/// touches top_k experts a layer, many tokens all of them.
#[test]
fn example_moe_shapes_have_their_published_total_and_active_sizes() {
    let dir = fixtures().join("../../examples/configs");
    for (file, total, active) in [
        ("qwen3-30b-a3b.json", 30.5e9, 3.3e9),
        ("mixtral-8x7b.json", 46.7e9, 12.9e9),
    ] {
        let c = cachet_backend::config::ModelConfig::from_hf_json(&dir.join(file)).unwrap();
        let (t, a) = (c.num_parameters() as f64, c.active_parameters() as f64);
        assert!((t / total - 1.0).abs() < 0.01, "{file}: {t:e} parameters");
        assert!((a / active - 1.0).abs() < 0.03, "{file}: {a:e} active");
        let m = c.moe.unwrap();
        assert_eq!(c.experts_touched(1), m.top_k as f64);
        assert!(c.experts_touched(4096) > m.num_experts as f64 - 1e-6);
        assert!((c.parameters_read(1) - a).abs() < 1.0);
    }
}

device_test! {
    /// tiny-qwen3-moe as a GGUF file in llama.cpp's layout for `qwen3moe` (scripts/reference.py
    /// --moe-gguf: experts stacked as `ffn_{gate,up,down}_exps`, written with llama.cpp's gguf-py)
    /// loads with its experts, top-k and `expert_weights_norm`, and gives transformers' logits on
    /// the same file (transformers' own GGUF reader).
    fn a_qwen3_moe_gguf_gives_transformers_logits(dev) {
        let m = loader::load(fixtures().join("tiny-qwen3-moe.gguf").to_str().unwrap(), false).unwrap();
        assert_eq!(m.config.arch, Arch::Qwen3Moe);
        assert_eq!(m.config.moe, tiny("tiny-qwen3-moe").config.moe);
        let reference = read_json("tiny-qwen3-moe-gguf_reference.json");
        let mut r = device_runner(dev, &m, 16);
        let tol = if dev == DeviceKind::Cpu { 1e-4 } else { 3e-2 };
        for case in reference["cases"].as_array().unwrap() {
            check_case_logits(r.as_mut(), case, tol, "tiny-qwen3-moe.gguf");
        }
    }
}

device_test! {
    /// tiny-mixtral as a GGUF file in llama.cpp's layout for Mixtral (scripts/reference.py
    /// --moe-gguf: architecture `llama` with `llama.expert_count`, q/k rows permuted by llama.cpp's
    /// converter formula, experts stacked): read as Mixtral, and the same weights give
    /// transformers' logits of the safetensors model (its GGUF reader has no Mixtral).
    fn a_mixtral_gguf_gives_the_safetensors_models_logits(dev) {
        let m = loader::load(fixtures().join("tiny-mixtral.gguf").to_str().unwrap(), false).unwrap();
        assert_eq!(m.config.arch, Arch::Mixtral);
        assert_eq!(m.config.moe, tiny("tiny-mixtral").config.moe);
        let reference = read_json("tiny-mixtral_reference.json");
        let mut r = device_runner(dev, &m, 16);
        for case in reference["cases"].as_array().unwrap() {
            let Some(case) = &case_before_route_tie(dev, case) else {
                continue;
            };
            let tol = if dev == DeviceKind::Cpu { 1e-4 } else { 3e-2 };
            check_case_logits(r.as_mut(), case, tol, "tiny-mixtral.gguf");
        }
    }
}

device_test! {
    /// The mixtures of experts with what else the engine does: n-gram speculation (verification
    /// steps of several tokens a sequence through the experts) gives the greedy output it gives
    /// without; the FP8 KV cache and FP8 expert weights (every expert's rows quantized with the
    /// other projections) stay near transformers' logits — within the 0.1 the FP8 KV cache is
    /// held to on SmolLM2 (tests/tests/kv_fp8.rs; measured here 2–6%).
    fn moe_models_speculate_and_run_fp8_caches_and_weights(dev) {
        use cachet_backend::engine::EngineConfig;
        use cachet_backend::spec::SpecConfig;
        for name in ["tiny-qwen3-moe", "tiny-mixtral"] {
            let m = tiny(name);
            // A repeating prompt: its n-grams give drafts from the first step.
            let prompt: Vec<u32> = (0..48).map(|i| [11, 22, 33, 44, 55, 66][i % 6]).collect();
            let run = |speculative: Option<SpecConfig>| {
                let e = engine(dev, &m, 64, EngineConfig { speculative, ..Default::default() });
                let h = e.handle();
                let out = collect(h.submit(greedy_request(prompt.clone(), 40)).unwrap());
                std::thread::sleep(std::time::Duration::from_millis(20));
                (out.tokens, h.stats().counters)
            };
            let (plain, _) = run(None);
            let (spec, c) = run(Some(SpecConfig::default()));
            assert_greedy_agrees(dev, &m, &prompt, &plain, &spec, &format!("{name} speculative"));
            assert!(c.spec_draft_tokens > 0, "{name}: drafts were verified ({c:?})");
            let reference = read_json(&format!("{name}_reference.json"));
            let cases = reference["cases"].as_array().unwrap();
            for (what, mut r, bound) in [
                ("FP8 KV cache", device_runner_with(dev, &m, 16, KvCacheDtype::Fp8E4m3), 0.1),
                ("FP8 weights", device_runner_quantized(dev, &m, 16, WeightQuantization::Fp8), 0.1),
            ] {
                for case in cases {
                    let ids = ids_of(&case["ids"]);
                    let got = all_logits(r.as_mut(), &ids);
                    let err = rel_err(&got.data, &logits_of(&case["logits"]));
                    eprintln!("{name}, {what}, {} tokens: {err:.2e} from transformers", ids.len());
                    assert!(err < bound, "{name}, {what}, {} tokens: {err:e}", ids.len());
                }
            }
        }
    }
}

/// `rows × cols` values drawn from N(0, std²) and rounded to bf16, so the CPU (f32) and CUDA
/// (bf16) devices start from the same numbers.
fn bf16_exact(
    rng: &mut cachet_backend::rng::Rng,
    rows: usize,
    cols: usize,
    std: f64,
) -> HostTensor {
    let data = (0..rows * cols)
        .map(|_| half::bf16::from_f64(rng.normal() * std).to_f32())
        .collect();
    HostTensor::new(vec![rows, cols], data)
}

gpu_test! {
    /// The CUDA MoE layer against the CPU reference on the same (bf16-exact) inputs and weights,
    /// token by token: both paths (expert GEMVs below 8 rows, sorted grouped GEMMs from 8), 16-,
    /// 64- and 128-row tiles, normalised or not, bf16 and FP8 expert weights; bf16's grouped products
    /// through cuBLAS's grouped GEMM, FP8's through moe.cu's FP8 kernel (FP8 × FP8 on quantized
    /// inputs in 16- and 64-row tiles, weights widened to bf16 in 128-row tiles); both with a
    /// cuBLAS GEMM of its own for every expert (FP8: cuBLASLt's FP8 GEMM). (moe.cu's bf16 grouped
    /// kernel, which graph captures take, is held to the eager steps by the engine's graph tests.)
    /// A token is compared
    /// wherever its router's k-th and next probability are not within 1e-4 (f32 logits on both:
    /// only such ties may route differently).
    fn moe_layers_on_cuda_match_the_cpu_reference_on_every_path() {
        use cachet_backend::config::Activation;
        use cachet_backend::device::cuda::CudaDevice;
        use cachet_backend::device::moe::route;
        use cachet_backend::device::{MoeParams, MoeWeights};
        let cuda = CudaDevice::new(0, 16, Default::default()).unwrap();
        // Every expert a cuBLAS GEMM of its own (FP8: cuBLASLt's FP8 GEMM an expert), as the
        // large experts of a prefill take (CACHET_MOE_OWN_GEMM=1).
        let own = cachet_backend::device::cuda::CudaOptions { moe_gemm_own_tiles: 1, ..Default::default() };
        let cuda_own = CudaDevice::new(0, 16, own).unwrap();
        let cpu = CpuDevice::new();
        let mut rng = cachet_backend::rng::Rng::new(5);
        for (e, k, h, i, norm) in [(8, 2, 256, 128, true), (16, 3, 128, 64, false), (128, 8, 256, 64, true)] {
            let router = bf16_exact(&mut rng, e, h, (h as f64).powf(-0.5));
            let gate_up = bf16_exact(&mut rng, e * 2 * i, h, (h as f64).powf(-0.5));
            let down = bf16_exact(&mut rng, e * h, i, (i as f64).powf(-0.5));
            let p = MoeParams { num_experts: e, top_k: k, inter: i, norm_topk_prob: norm, act: Activation::Silu };
            for fp8 in [false, true] {
                let (c_gu, c_dn) = (cpu.upload(&gate_up).unwrap(), cpu.upload(&down).unwrap());
                let (c_gu, c_dn) = if fp8 {
                    (cpu.quantize_fp8(c_gu).unwrap(), cpu.quantize_fp8(c_dn).unwrap())
                } else {
                    (c_gu, c_dn)
                };
                let c_r = cpu.upload(&router).unwrap();
                // The layer on one CUDA device: its output and the operations it ran.
                let layer_on = |dev: &CudaDevice, x: &HostTensor| {
                    let (r, gu, dn) = (dev.upload(&router).unwrap(), dev.upload(&gate_up).unwrap(), dev.upload(&down).unwrap());
                    let (gu, dn) = if fp8 { (dev.quantize_fp8(gu).unwrap(), dev.quantize_fp8(dn).unwrap()) } else { (gu, dn) };
                    dev.set_profiling(true);
                    let y = dev.moe(&dev.upload(x).unwrap(), MoeWeights { router: &r, gate_up: &gu, down: &dn }, &p).unwrap();
                    let got = dev.to_host(&y).unwrap();
                    let ops: Vec<String> = dev.take_profile().unwrap().into_iter().map(|(op, _, _)| op).collect();
                    dev.set_profiling(false);
                    (got, ops)
                };
                // 16-row tiles up to 16 pairs an expert (8 and 64 rows), 128-row tiles from 96
                // (E = 128, k = 8: 1,600 rows), 64 between.
                for n in [1, 2, 3, 7, 8, 64, 300, 1600] {
                    let x = bf16_exact(&mut rng, n, h, 1.0);
                    let want = cpu.to_host(&cpu.moe(&cpu.upload(&x).unwrap(),
                        MoeWeights { router: &c_r, gate_up: &c_gu, down: &c_dn }, &p).unwrap()).unwrap();
                    let (got, ops) = layer_on(&cuda, &x);
                    // Grouped from 8 rows (FP8: 32): bf16 experts through cuBLAS's grouped GEMM,
                    // FP8 ones (experts this small) through moe.cu's FP8 kernel.
                    use cachet_backend::device::cuda::{MOE_GEMM_DEFAULT_ROWS, MOE_GEMM_FP8_DEFAULT_ROWS};
                    let (grouped, from) = match fp8 {
                        true => ("moe grouped gemm", MOE_GEMM_FP8_DEFAULT_ROWS),
                        false => ("moe grouped gemm (cuBLAS)", MOE_GEMM_DEFAULT_ROWS),
                    };
                    if n >= from {
                        assert!(ops.iter().any(|op| op == grouped), "{n} rows: the ops were {ops:?}");
                    }
                    let logits = cachet_backend::device::cpu::gemm::matmul_t(&x.data, &router.data, n, h, e);
                    // `bar`: the worst token's relative error allowed (the mean's, half of it).
                    let check = |got: &[f32], path: &str, bar: f64| {
                        let (mut compared, mut worst, mut sum) = (0, 0.0f64, 0.0f64);
                        for t in 0..n {
                            if k < e {
                                let r = route(&logits[t * e..(t + 1) * e], k + 1, false);
                                if r[k - 1].1 - r[k].1 < 1e-4 {
                                    continue;
                                }
                            }
                            let err = rel_err(&got[t * h..(t + 1) * h], &want[t * h..(t + 1) * h]);
                            worst = worst.max(err);
                            sum += err;
                            compared += 1;
                        }
                        let what = format!("E {e}, k {k}, h {h}, inter {i}, norm {norm}, FP8 {fp8}, {n} rows{path}");
                        let mean = sum / compared.max(1) as f64;
                        eprintln!("{what}: worst token {worst:.2e}, mean {mean:.2e} over {compared}");
                        // Many experts close in probability (E 128, k 8) tie more often (2 of 7
                        // rows seen): at most a quarter of the tokens and two more, never all.
                        assert!(
                            compared > 0 && (compared + 2) * 4 >= n * 3,
                            "{what}: {compared} tokens compared"
                        );
                        assert!(worst < bar, "{what}: a token {worst:e} off the CPU reference");
                        assert!(mean < bar / 2.0, "{what}: tokens {mean:e} off the CPU reference on average");
                    };
                    // bf16 rounding between the products (and FP8 weights, exact on both sides).
                    const BAR: f64 = 3e-2;
                    // cuBLASLt's FP8 path also quantizes both products' inputs to e4m3 per token
                    // (3 mantissa bits), as the dense FP8 GEMMs do (families.rs holds those
                    // logits to 6e-2): up to ~6% a token seen on the H200 for one product pair.
                    const BAR_QUANTIZED_INPUTS: f64 = 1.2e-1;
                    // FP8 experts on moe.cu's grouped kernel: FP8 × FP8 products on quantized
                    // inputs in 16- and 64-row tiles, the weights widened to bf16 in 128-row tiles.
                    let quantized = fp8 && n >= from && ops.iter().any(|op| op == "↳ moe: FP8 × FP8 grouped GEMMs (ours)");
                    if fp8 && n >= from {
                        let bm128 = n * k >= 96 * e;
                        assert_eq!(quantized, !bm128, "{n} rows: the ops were {ops:?}");
                    }
                    check(&got, "", if quantized { BAR_QUANTIZED_INPUTS } else { BAR });
                    if n >= from {
                        let (got, ops) = layer_on(&cuda_own, &x);
                        assert!(ops.iter().any(|op| op == "moe grouped gemm (cuBLAS)"), "{n} rows: the ops were {ops:?}");
                        if fp8 {
                            assert!(ops.iter().any(|op| op == "↳ fp8: cuBLASLt product"), "{n} rows: the ops were {ops:?}");
                            check(&got, ", cuBLASLt's FP8 GEMM an expert", BAR_QUANTIZED_INPUTS);
                        } else {
                            check(&got, ", a cuBLAS GEMM an expert", BAR);
                        }
                    }
                }
            }
        }
    }
}

gpu_test! {
    /// The MoE layer's norm in its router's GEMV (`Device::norm_moe` on CUDA: one launch writes
    /// the new residual, the normalised rows and the router's logits) gives what the norm's,
    /// then the layer's launches give (`Device::norm`, then `Device::moe`), bit for bit — the new
    /// residual and the layer's output — with bf16 and FP8 experts; the profile shows the fused
    /// launch for the rows the router's GEMV takes (1 and 2 by default). At 3 and 64 rows the
    /// norm runs on its own; at 64 (grouped products) they agree to bf16 rounding.
    fn the_moe_norm_in_the_routers_gemv_gives_the_separate_launches_results() {
        use cachet_backend::config::Activation;
        use cachet_backend::device::cuda::CudaDevice;
        use cachet_backend::device::{Delta, MoeParams, MoeWeights};
        let dev = CudaDevice::new(0, 16, Default::default()).unwrap();
        let mut rng = cachet_backend::rng::Rng::new(11);
        for (e, k, h, i, norm) in [(8, 2, 256, 128, true), (128, 8, 512, 64, true), (16, 3, 128, 64, false)] {
            let router = bf16_exact(&mut rng, e, h, (h as f64).powf(-0.5));
            let gate_up = bf16_exact(&mut rng, e * 2 * i, h, (h as f64).powf(-0.5));
            let down = bf16_exact(&mut rng, e * h, i, (i as f64).powf(-0.5));
            let mut norm_w = bf16_exact(&mut rng, 1, h, 0.1);
            norm_w.data.iter_mut().for_each(|v| *v = half::bf16::from_f32(*v + 1.0).to_f32());
            let p = MoeParams { num_experts: e, top_k: k, inter: i, norm_topk_prob: norm, act: Activation::Silu };
            for fp8 in [false, true] {
                let (r, gu, dn) = (dev.upload(&router).unwrap(), dev.upload(&gate_up).unwrap(), dev.upload(&down).unwrap());
                let (gu, dn) = if fp8 { (dev.quantize_fp8(gu).unwrap(), dev.quantize_fp8(dn).unwrap()) } else { (gu, dn) };
                let nw = dev.upload(&norm_w).unwrap();
                let w = || MoeWeights { router: &r, gate_up: &gu, down: &dn };
                for n in [1, 2, 3, 64] {
                    let residual = bf16_exact(&mut rng, n, h, 1.0);
                    let delta = bf16_exact(&mut rng, n, h, 0.5);
                    let d = dev.upload(&delta).unwrap();
                    let what = format!("E {e}, k {k}, h {h}, inter {i}, FP8 {fp8}, {n} rows");
                    // The layer as the decoder runs it.
                    let mut res = dev.upload_table(&residual).unwrap();
                    dev.set_profiling(true);
                    let y = dev.norm_moe(&mut res, Some(Delta { x: &d, norm: None }), &nw, 1e-6, w(), &p).unwrap();
                    let ops: Vec<String> = dev.take_profile().unwrap().into_iter().map(|(op, _, _)| op).collect();
                    dev.set_profiling(false);
                    let got = (dev.to_host(&y).unwrap(), dev.to_host(&res).unwrap());
                    assert_eq!(ops.iter().any(|op| op == "moe norm + router"), n <= 2, "{what}: the ops were {ops:?}");
                    // The norm's launch, then the layer's.
                    let mut res = dev.upload_table(&residual).unwrap();
                    let xs = dev.norm(&mut res, Some(Delta { x: &d, norm: None }), &nw, 1e-6).unwrap();
                    let y = dev.moe(&xs, w(), &p).unwrap();
                    let want = (dev.to_host(&y).unwrap(), dev.to_host(&res).unwrap());
                    assert!(want.0.iter().any(|&v| v != 0.0), "an all-zero output proves nothing");
                    assert_eq!(got.1, want.1, "{what}: the new residual");
                    if n <= 3 {
                        assert_eq!(got.0, want.0, "{what}: the layer's output");
                    } else {
                        let err = rel_err(&got.0, &want.0);
                        assert!(err < 3e-2, "{what}: the output {err:e} off");
                    }
                }
            }
        }
    }
}
