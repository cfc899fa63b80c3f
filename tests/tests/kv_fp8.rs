//! The FP8 KV cache (`--kv-cache-dtype fp8`): its e4m3 codec against `ml_dtypes.float8_e4m3fn`
//! (Google's implementation, from PyPI), its fidelity against the device's own KV type on
//! SmolLM2, its capacity, and prefix caching over FP8 blocks (the scales travel with the slots).
//! The runner tests are `device_test!`s (on CUDA: the kernels against bf16).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use cachet_backend::device::fp8::{decode_e4m3, encode_e4m3};
use cachet_backend::device::{KvCacheDtype, KvLayout};
use cachet_backend::engine::Engine;
use cachet_backend::engine::EngineConfig;
use cachet_backend::rng::Rng;
use cachet_bench::fidelity::{compare_logits, greedy_agreement};
use cachet_tests::*;

const ML_DTYPES: &str = r#"
import sys, json, numpy as np, ml_dtypes
xs = np.array(json.load(sys.stdin), dtype=np.float32)
codes = xs.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
table = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
print(json.dumps({"codes": codes.tolist(), "decoded": [None if np.isnan(v) else float(v) for v in table]}))
"#;

#[test]
fn e4m3_codec_matches_ml_dtypes() {
    let site = pip_target(
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-ml-dtypes"),
        &["ml_dtypes", "numpy"],
        "ml_dtypes",
    );
    // Every code's value and its neighbours' midpoints (the ties), random values over the whole
    // range, subnormals, values past the largest finite one.
    let mut xs: Vec<f32> = Vec::new();
    for c in 0u8..0x7e {
        let (a, b) = (decode_e4m3(c), decode_e4m3(c + 1));
        let mid = (a + b) / 2.0;
        for x in [
            a,
            mid,
            f32::from_bits(mid.to_bits() + 1),
            f32::from_bits(mid.to_bits() - 1),
        ] {
            xs.push(x);
            xs.push(-x);
        }
    }
    let mut rng = Rng::new(3);
    for _ in 0..20_000 {
        let e = rng.uniform() * 24.0 - 14.0;
        let x = (2f64.powf(e) * (rng.uniform() * 2.0 - 1.0)) as f32;
        xs.push(x);
    }
    xs.extend([448.0, 449.0, 464.0, 465.0, 500.0, 1e6, -1e6, 1e-10, 0.0]);
    let mut child = Command::new("python3")
        .args(["-c", ML_DTYPES])
        .env("PYTHONPATH", &site)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&xs).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (c, want) in v["decoded"].as_array().unwrap().iter().enumerate() {
        match want.as_f64() {
            Some(w) => assert_eq!(decode_e4m3(c as u8) as f64, w, "code {c:#04x}"),
            None => assert_eq!(c & 0x7f, 0x7f, "only 0x7f/0xff are NaN"),
        }
    }
    let codes = v["codes"].as_array().unwrap();
    let mut mismatches = Vec::new();
    for (x, want) in xs.iter().zip(codes) {
        let want = want.as_u64().unwrap() as u8;
        // ml_dtypes turns values past the range into NaN; the cache saturates them (what the
        // quantizer relies on when rounding lands just above 448).
        let want = if want & 0x7f == 0x7f && x.is_finite() {
            want - 1
        } else {
            want
        };
        if encode_e4m3(*x) != want {
            mismatches.push((*x, encode_e4m3(*x), want));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {}: {:?}",
        mismatches.len(),
        xs.len(),
        &mismatches[..mismatches.len().min(10)]
    );
}

/// (INT8 blocks, `--kv-cache-dtype int8`, take FP8's bytes.)
#[test]
fn fp8_blocks_take_about_half_the_bytes_of_bf16() {
    for d in [64, 128, 256] {
        let layout = |dtype| KvLayout {
            num_layers: 32,
            num_blocks: 1,
            block_size: 16,
            num_kv_heads: 8,
            head_dim: d,
            dtype,
        };
        let ratio = layout(KvCacheDtype::Auto).block_bytes(2) as f64
            / layout(KvCacheDtype::Fp8E4m3).block_bytes(2) as f64;
        assert!(ratio > 1.88 && ratio < 2.0, "head_dim {d}: {ratio}");
        assert_eq!(
            layout(KvCacheDtype::Int8).block_bytes(2),
            layout(KvCacheDtype::Fp8E4m3).block_bytes(2)
        );
    }
}

device_test! {
    fn fp8_cache_stays_close_to_the_full_precision_cache_on_smollm2(dev) {
        let m = smollm2();
        let mut reference = device_runner_with(dev, m, 64, KvCacheDtype::Auto);
        let mut fp8 = device_runner_with(dev, m, 64, KvCacheDtype::Fp8E4m3);
        // A ~600-token prompt of several chat prompts: logits of its last 32 positions.
        let long: Vec<u32> = chat_prompts(smollm2(), 12).concat().into_iter().take(600).collect();
        let d = compare_logits(reference.as_mut(), fp8.as_mut(), &long, 32, 256).unwrap();
        println!("{d:?}");
        assert!(d.rel_err < 0.1, "{d:?}");
        assert!(d.mean_kl < 0.02, "{d:?}");
        assert!(d.top1_agreement >= 0.8, "{d:?}");
        let g = greedy_agreement(reference.as_mut(), fp8.as_mut(), &chat_prompts(smollm2(), 6), 24).unwrap();
        println!("{g:?}");
        assert!(g.agreement_rate >= 0.6 && g.identical >= 2, "{g:?}");

        // The error is the cache's: with both caches full precision the logits are identical.
        let mut again = device_runner_with(dev, m, 64, KvCacheDtype::Auto);
        let same = compare_logits(reference.as_mut(), again.as_mut(), &long, 32, 256).unwrap();
        assert_eq!(same.max_abs_err, 0.0);
    }
}

device_test! {
    fn prefix_cache_hits_over_fp8_blocks_give_the_cold_answer(dev) {
        let m = smollm2();
        let cfg = EngineConfig::default();
        let runner = device_runner_with(dev, m, 128, KvCacheDtype::Fp8E4m3);
        assert_eq!(runner.kv_layout().dtype, KvCacheDtype::Fp8E4m3);
        let engine = Engine::start(runner, m.tokenizer.clone(), cfg);
        let prompt = chat_prompts(smollm2(), 1).remove(0);
        assert!(prompt.len() > 48, "the prompt spans several blocks");
        let h = engine.handle();
        let cold = collect(h.submit(greedy_request(prompt.clone(), 24)).unwrap());
        let warm = collect(h.submit(greedy_request(prompt.clone(), 24)).unwrap());
        assert_eq!(cold.usage.cached_tokens, 0);
        assert!(
            warm.usage.cached_tokens >= prompt.len() / 16 * 16 - 16,
            "cached {} of {}",
            warm.usage.cached_tokens,
            prompt.len()
        );
        assert_eq!(
            warm.tokens, cold.tokens,
            "a prefix hit over FP8 blocks changed the answer"
        );
    }
}
