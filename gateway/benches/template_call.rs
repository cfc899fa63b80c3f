//! Template call latency: one `Sandbox::render` of an example template (fresh instance, request
//! JSON in, reply JSON out and parsed, fuel and deadline armed), for a ~2 KB prompt. Criterion
//! measures the median; then 20,000 timed calls give p50 / p99 (criterion reports no tails).
//!
//!     cargo bench -p cachet-gateway --bench template_call

use std::time::{Duration, Instant};

use cachet_gateway::sandbox::{Sandbox, SandboxConfig};
use cachet_guest_sdk::{Message, Request, Tenant};
use criterion::Criterion;

fn request(docs: usize, question: &str) -> Request {
    let mut variables = std::collections::BTreeMap::new();
    let doc =
        "Northwind routers keep their settings in flash; a reset restores the factory image. ";
    let list: Vec<serde_json::Value> = (0..docs)
        .map(|i| serde_json::json!({"title": format!("Manual section {i}"), "text": doc.repeat(2)}))
        .collect();
    variables.insert("documents".into(), serde_json::to_string(&list).unwrap());
    Request {
        model: "smollm2".into(),
        messages: vec![Message::new("user", question)],
        variables,
        tenant: Tenant {
            id: "acme".into(),
            metadata: Default::default(),
        },
        user: Some("user-42".into()),
        now: "2026-11-29T12:00:00Z".into(),
    }
}

fn main() {
    let sb = Sandbox::new(SandboxConfig::default()).unwrap();
    let budget = sb.budget(None, None, None);
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let mut rows = Vec::new();
    let short = "How do I restore the factory settings without losing my Wi-Fi password?";
    // A ~2 KB question: a user pasting a log into the support chat.
    let long = format!(
        "{short} Here is what the status page says: {}",
        "WAN down; retrying DHCP (timeout 30 s). ".repeat(46)
    );
    for (name, label, req) in [
        (
            "support-bot",
            "support-bot, 2 KB question",
            request(0, &long),
        ),
        ("rag", "rag, 11 documents (2 KB)", request(11, short)),
        (
            "support-bot",
            "support-bot, short question",
            request(0, short),
        ),
    ] {
        let wasm = std::fs::read(cachet_tests::build_template(name)).unwrap();
        let m = sb.compile(&wasm).unwrap();
        let (r, stats) = sb.render(&m, &req, &budget, "bench".into()).unwrap();
        let prompt_bytes: usize = r.segments.iter().map(|s| s.text.len()).sum();
        c.bench_function(&format!("template_call/{label}"), |b| {
            b.iter(|| sb.render(&m, &req, &budget, "bench".into()).unwrap())
        });
        let mut t = Vec::with_capacity(20_000);
        for _ in 0..20_000 {
            let t0 = Instant::now();
            std::hint::black_box(sb.render(&m, &req, &budget, "bench".into()).unwrap());
            t.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        t.sort_by(f64::total_cmp);
        rows.push((
            label,
            prompt_bytes,
            wasm.len(),
            stats.fuel_used,
            t[t.len() / 2],
            t[t.len() * 99 / 100],
        ));
    }
    c.final_summary();
    println!("\n| template | rendered prompt | module | fuel per call | p50 (µs) | p99 (µs) |");
    println!("|---|---|---|---|---|---|");
    for (name, bytes, size, fuel, p50, p99) in rows {
        println!(
            "| {name} | {bytes} B | {} KiB | {fuel} | {p50:.1} | {p99:.1} |",
            size / 1024
        );
    }
}
