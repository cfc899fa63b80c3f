//! Benchmark support, kept out of the serving code: nothing in `cachet serve`, `cachet worker`
//! or the engine imports from here.
//!
//! - [`workload`]: deterministic synthetic workloads (the seed article's shape, routing sessions,
//!   the speculative-decoding prompts) and percentiles.
//! - [`fidelity`]: how far one runner's logits and greedy outputs are from another's.
//! - [`report`]: SVG plots for benchmark reports.
//!
//! The harnesses themselves (`cachet bench forward|spec|ttft|kv-fp8`) are the command's
//! `cli/bench/` module tree in `gateway/`; criterion-free benches of the engine live in
//! `bench/benches/`.

pub mod fidelity;
pub mod report;
pub mod workload;
