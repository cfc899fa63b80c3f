//! CPU throughput of the reference engine on SmolLM2-135M (f32): prefill of a 512-token prompt
//! and batch-1 decode, as tokens/s. Prints a Markdown table.
//!
//!     cargo bench -p cachet-backend --bench cpu_forward
//!
//! Set `LLAMA_BENCH=/path/to/llama-bench` to add llama.cpp's numbers for the same GGUF and
//! shapes in the same run (see scripts/llama_cpp_bench.sh).

use std::time::Instant;

use cachet_backend::device::ForwardBatch;
use cachet_backend::kv::SimpleAllocator;
use cachet_backend::loader::{self, fetch};
use cachet_backend::model::runner::cpu_runner;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// GFLOP/s of the CPU matmul at a prefill-like shape.
fn gemm_rate(n: usize, k: usize, m: usize) -> f64 {
    let x: Vec<f32> = (0..n * k)
        .map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5)
        .collect();
    let w: Vec<f32> = (0..m * k)
        .map(|i| ((i * 53) % 97) as f32 / 97.0 - 0.5)
        .collect();
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        std::hint::black_box(cachet_backend::device::cpu::gemm::matmul_t(&x, &w, n, k, m));
        times.push(t.elapsed().as_secs_f64());
    }
    2.0 * (n * k * m) as f64 / median(times) / 1e9
}

fn main() {
    println!(
        "matmul 512x576 · 1536x576ᵀ: {:.1} GFLOP/s",
        gemm_rate(512, 576, 1536)
    );
    // The LM head of a decode step (1 row) and of a verification step (1 + 4 drafts).
    for n in [1, 5] {
        println!(
            "matmul {n}x576 · 49152x576ᵀ: {:.1} GFLOP/s",
            gemm_rate(n, 576, 49152)
        );
    }
    let path = fetch::fetch(fetch::known_model("smollm2").unwrap(), true).expect("fetch smollm2");
    let m = loader::load(path.to_str().unwrap(), false).unwrap();
    let bs = 16;
    let prompt_len = 512;
    let decode_len = 128;
    let mut r = cpu_runner(
        &m.config,
        &m.weights,
        (prompt_len + decode_len) / bs + 2,
        bs,
        4096,
    )
    .unwrap();
    let prompt: Vec<u32> = (0..prompt_len as u32)
        .map(|i| 100 + (i * 7919) % 40000)
        .collect();
    let threads = rayon::current_num_threads();

    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for _ in 0..3 {
        let mut alloc = SimpleAllocator::new(r.kv_layout().num_blocks, bs);
        let mut table = Vec::new();
        alloc.ensure(&mut table, prompt_len + decode_len).unwrap();
        let t0 = Instant::now();
        let mut b = ForwardBatch::default();
        b.push_seq(&prompt, 0, &table, bs, true);
        let mut logits = r.forward(&b).unwrap();
        prefill.push(prompt_len as f64 / t0.elapsed().as_secs_f64());
        let t1 = Instant::now();
        for i in 0..decode_len {
            let tok = cachet_backend::sampler::argmax(logits.row(0));
            let mut b = ForwardBatch::default();
            b.push_seq(&[tok], prompt_len + i, &table, bs, true);
            logits = r.forward(&b).unwrap();
        }
        decode.push(decode_len as f64 / t1.elapsed().as_secs_f64());
    }
    println!(
        "| engine | threads | prefill 512 tok (tok/s) | decode batch 1, ctx 512-640 (tok/s) |"
    );
    println!("|---|---|---|---|");
    println!(
        "| cachet cpu (f32) | {threads} | {:.0} | {:.1} |",
        median(prefill.clone()),
        median(decode.clone())
    );
    if let Ok(bench) = std::env::var("LLAMA_BENCH") {
        let f32_gguf = std::env::var("LLAMA_GGUF").unwrap_or_else(|_| path.display().to_string());
        let out = std::process::Command::new(&bench)
            .args([
                "-m",
                &f32_gguf,
                "-p",
                "512",
                "-n",
                "128",
                "-t",
                &threads.to_string(),
                "-r",
                "3",
                "-o",
                "json",
            ])
            .output()
            .expect("running llama-bench");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("llama-bench JSON");
        let mut row = (0.0, 0.0);
        for t in v.as_array().unwrap() {
            let ts = t["avg_ts"].as_f64().unwrap_or(0.0);
            if t["n_prompt"].as_u64() == Some(512) {
                row.0 = ts;
            } else {
                row.1 = ts;
            }
        }
        println!(
            "| llama.cpp ({}) | {threads} | {:.0} | {:.1} |",
            std::path::Path::new(&f32_gguf)
                .file_name()
                .unwrap()
                .to_string_lossy(),
            row.0,
            row.1
        );
        println!(
            "| ratio cachet / llama.cpp | | {:.2} | {:.2} |",
            median(prefill.clone()) / row.0,
            median(decode.clone()) / row.1
        );
    }
}
