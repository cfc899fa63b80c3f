//! Gateway overhead: latency of a short non-streaming chat request (1 output token) through
//! `cachet serve`'s HTTP path (auth, JSON, template, tokenize, admission, engine, JSON back) vs the
//! same prompt submitted to the engine in-process, side by side in one run; then request rate with
//! 8 concurrent clients both ways. SmolLM2 on the CPU; prefix caching on (the prompt repeats), so
//! the engine part is one cached-prefix step. Then the same against a trivial upstream: a
//! one-layer, 64-wide random Llama with SmolLM2's tokenizer and vocabulary, whose step costs
//! ~0.1 ms, so the request rate measures the gateway's own ceiling on these cores.
//!
//!     cargo bench -p cachet-gateway --bench gateway_overhead

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cachet_backend::config::ModelConfig;
use cachet_backend::engine::{Engine, EngineConfig, EngineHandle};
use cachet_backend::loader::random::random_weights;
use cachet_backend::loader::{self, fetch, HostWeights};
use cachet_backend::model::runner::cpu_runner;
use cachet_backend::request::{EngineEvent, EngineRequest};
use cachet_backend::tokenizer::{ChatMessage, TextTokenizer};
use cachet_bench::workload::percentile;
use cachet_gateway::server::{self, AppState, Limits};
use cachet_gateway::tenants::{hash_key, hex};
use http_body_util::{BodyExt, Full};

const N: usize = 60;

async fn in_process(h: &EngineHandle, prompt: &[u32]) -> Duration {
    let t = Instant::now();
    let mut r = EngineRequest::new(prompt.to_vec(), 1);
    r.ignore_eos = true;
    let mut s = h.submit(r).unwrap();
    while let Some(ev) = s.next().await {
        if let EngineEvent::Finished { .. } = ev {
            break;
        }
    }
    t.elapsed()
}

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

async fn via_http(client: &Client, url: &str, body: &str) -> Duration {
    let t = Instant::now();
    let req = hyper::Request::post(url)
        .header("authorization", "Bearer sk-bench")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert!(v["usage"]["completion_tokens"] == 1);
    t.elapsed()
}

fn ms(d: &[Duration]) -> Vec<f64> {
    d.iter().map(|x| x.as_secs_f64() * 1e3).collect()
}

struct Setup {
    label: &'static str,
    config: ModelConfig,
    weights: HostWeights,
    concurrency: usize,
    per_client: usize,
}

fn main() {
    let path = fetch::fetch(fetch::known_model("smollm2").unwrap(), true).unwrap();
    let m = loader::load(path.to_str().unwrap(), false).unwrap();
    let tok = m.tokenizer.clone().unwrap();
    let trivial = ModelConfig {
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 1,
        num_attention_heads: 4,
        num_key_value_heads: 4,
        head_dim: 16,
        ..m.config.clone()
    };
    let setups = [
        Setup {
            label: "SmolLM2 on the CPU",
            config: m.config.clone(),
            weights: m.weights,
            concurrency: 8,
            per_client: 15,
        },
        Setup {
            label: "trivial upstream (1-layer 64-wide random Llama, SmolLM2 tokenizer)",
            weights: random_weights(&trivial, 7),
            config: trivial,
            concurrency: 32,
            per_client: 60,
        },
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // `cargo bench --bench gateway_overhead -- trivial`: only the setups whose label has it.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    for s in setups {
        if filter.as_deref().is_none_or(|f| s.label.contains(f)) {
            rt.block_on(measure(&s, &tok));
        }
    }
}

async fn measure(setup: &Setup, tok: &TextTokenizer) {
    let runner = cpu_runner(&setup.config, &setup.weights, 256, 16, 2048).unwrap();
    let engine = Engine::start(
        runner,
        Some(tok.clone()),
        EngineConfig {
            model_id: "smollm2".into(),
            ..Default::default()
        },
    );
    let cfg = format!(
        "[[tenant]]\nid = \"bench\"\napi_key_sha256 = [\"{}\"]\nmax_concurrent = 1000\n",
        hex(&hash_key("sk-bench"))
    );
    // The gateway as `cachet serve` builds it alone: a pool of its embedded engine.
    let pool = cachet_gateway::upstream::Pool::new(
        vec![cachet_gateway::upstream::embedded::Embedded::start(
            engine.handle(),
        )],
        cachet_gateway::route::by_name("prefix").unwrap(),
        cachet_backend::block_hash::HashContext::new([0; 32], [0; 32], "smollm2", 16),
    );
    let state = Arc::new(AppState::new(
        Arc::new(pool),
        Some(engine.handle()),
        tok.clone(),
        "smollm2".into(),
        2048,
        cachet_gateway::config::tenant_registry(&cfg, &[0; 32], Instant::now()).unwrap(),
    ));
    let question = "What is the capital of France?";
    let prompt = tok
        .encode(
            &tok.render_chat(&[ChatMessage::new("user", question)], true)
                .unwrap(),
        )
        .unwrap();
    let body = serde_json::json!({"model": "smollm2", "messages": [{"role": "user", "content": question}], "max_tokens": 1, "temperature": 0}).to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/v1/chat/completions",
        listener.local_addr().unwrap()
    );
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let limits = Limits {
        max_connections: 1024,
        grace: Duration::from_secs(1),
        ..Default::default()
    };
    tokio::spawn(server::serve(listener, state, None, rx, limits, None));
    let client: Client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let h = engine.handle();
    // Warm-up: fills the prefix cache and the connection pool.
    for _ in 0..5 {
        in_process(&h, &prompt).await;
        via_http(&client, &url, &body).await;
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..N {
        a.push(in_process(&h, &prompt).await);
        b.push(via_http(&client, &url, &body).await);
    }
    let (a, b) = (ms(&a), ms(&b));
    println!(
        "\n### {} ({} threads), {N} sequential requests each way, 1 output token, cached prefix\n",
        setup.label,
        rayon::current_num_threads()
    );
    println!("| path | p50 (ms) | p99 (ms) |");
    println!("|---|---|---|");
    println!(
        "| engine in-process | {:.2} | {:.2} |",
        percentile(&a, 50.0),
        percentile(&a, 99.0)
    );
    println!(
        "| through cachet serve (HTTP/1.1, loopback) | {:.2} | {:.2} |",
        percentile(&b, 50.0),
        percentile(&b, 99.0)
    );
    println!(
        "| gateway overhead | {:.2} | {:.2} |",
        percentile(&b, 50.0) - percentile(&a, 50.0),
        percentile(&b, 99.0) - percentile(&a, 99.0)
    );
    let mut rates = Vec::new();
    for (name, http) in [("engine in-process", false), ("through cachet serve", true)] {
        let t = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..setup.concurrency {
            let (h, client, url, body, prompt) = (
                h.clone(),
                client.clone(),
                url.clone(),
                body.clone(),
                prompt.clone(),
            );
            let per_client = setup.per_client;
            tasks.push(tokio::spawn(async move {
                for _ in 0..per_client {
                    if http {
                        via_http(&client, &url, &body).await;
                    } else {
                        in_process(&h, &prompt).await;
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let n = setup.concurrency * setup.per_client;
        let rate = n as f64 / t.elapsed().as_secs_f64();
        rates.push(rate);
        println!(
            "\n{name}: {n} requests from {} concurrent clients in {:.2} s = {rate:.1} req/s",
            setup.concurrency,
            t.elapsed().as_secs_f64()
        );
    }
    println!(
        "\nthrough cachet serve / in-process: {:.2}x",
        rates[1] / rates[0]
    );
}
