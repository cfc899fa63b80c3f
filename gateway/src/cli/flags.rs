//! No flag is accepted and then ignored: the flags given on the command line, and the refusal of
//! those the mode a command runs in does not use —
//! an engine's flags on a gateway that runs no engine, template limits with templates off, CUDA
//! graph flags on the CPU device, sampling flags on a greedy run.

use std::collections::BTreeSet;

/// The ids of the flags given on the command line to the command that runs. (A value from an
/// environment variable is ambient — `OTEL_SERVICE_NAME` set for a whole cluster — and is not
/// refused where unused.)
#[derive(Debug, Default, Clone)]
pub struct Given(BTreeSet<String>);

impl Given {
    /// The flags given to the innermost subcommand of `m` (and the global ones).
    pub fn of(m: &clap::ArgMatches) -> Self {
        let mut set = BTreeSet::new();
        let mut at = Some(m);
        while let Some(m) = at {
            for id in m.ids() {
                let id = id.as_str();
                // Ids of argument groups (a flattened struct's) have no source of their own.
                if m.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
                    set.insert(id.to_string());
                }
            }
            at = m.subcommand().map(|(_, sub)| sub);
        }
        Given(set)
    }

    pub fn has(&self, id: &str) -> bool {
        self.0.contains(id)
    }

    /// Refuses the first of `ids` that was given, saying it is `why` (e.g. "for the embedded
    /// engine") and what the mode lacks (`because`).
    pub fn refuse(&self, ids: &[&str], why: &str, because: &str) -> anyhow::Result<()> {
        match ids.iter().find(|id| self.has(id)) {
            Some(id) => anyhow::bail!("{} is {why}; {because}", flag(id)),
            None => Ok(()),
        }
    }
}

/// `--max-num-seqs` for the id `max_num_seqs`.
pub fn flag(id: &str) -> String {
    format!("--{}", id.replace('_', "-"))
}

/// The embedded engine's own flags: a gateway whose upstreams run the model has no use for them.
pub const ENGINE_ONLY: &[&str] = &[
    "device",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_step_ms",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "scheduling_policy",
    "fair_share",
    "fair_prefill_cap",
    "cache_shares",
    "gpu_memory_utilization",
    "max_waiting",
    "max_waiting_tokens",
    "num_gpu_blocks_override",
    "kv_cache_dtype",
    "quantization",
    "tensor_parallel_size",
    "speculative_config",
    "enforce_eager",
    "cuda_graph_sizes",
];

/// The CUDA device's decode-graph flags.
pub const CUDA_GRAPHS: &[&str] = &["enforce_eager", "cuda_graph_sizes"];

/// The limits of tenants' templates.
pub const TEMPLATES: &[&str] = &[
    "template_deadline_ms",
    "template_fuel",
    "template_memory_mib",
    "template_output_kib",
    "template_module_mib",
    "template_instances",
    "template_max_functions",
    "template_compile_timeout",
    "template_cache_mib",
    "template_max_versions",
    "template_storage_mib",
];

/// How the gateway talks to remote upstreams.
pub const UPSTREAM_TIMEOUTS: &[&str] = &[
    "upstream_connect_timeout",
    "upstream_response_timeout",
    "upstream_first_event_timeout",
    "upstream_idle_timeout",
];

/// How the gateway reaches `cachet worker`s.
pub const WORKER_CLIENT: &[&str] = &["worker_token", "worker_client_cert", "worker_client_key"];

/// Refuses the CUDA graph flags where the device is the CPU by name (it runs every step eagerly).
pub fn device_flags(given: &Given, device: super::generate::DeviceKind) -> anyhow::Result<()> {
    if device == super::generate::DeviceKind::Cpu {
        given.refuse(
            CUDA_GRAPHS,
            "for the CUDA device's decode graphs",
            "--device cpu runs every step eagerly",
        )?;
    }
    Ok(())
}

/// `--otlp-service-name` names the traces `--otlp-endpoint` exports.
pub fn otlp_flags(given: &Given, endpoint: bool) -> anyhow::Result<()> {
    if !endpoint {
        given.refuse(
            &["otlp_service_name"],
            "the name of exported traces",
            "nothing is exported without --otlp-endpoint",
        )?;
    }
    Ok(())
}
