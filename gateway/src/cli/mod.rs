//! Command-line interface: one subcommand per job.

mod bench;
mod connection_args;
mod engine_args;
pub mod flags;
mod generate;
mod kernels;
mod model;
mod serve;
mod worker;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "cachet",
    version,
    about = "Cachet: a multi-tenant, cache-aware LLM gateway with its own GPU engine",
    long_about = "Cachet serves LLMs to many tenants behind one OpenAI-compatible endpoint.\n\
                  It loads Llama-family models (HF safetensors directories or GGUF files) and runs them on\n\
                  the CPU (reference) or a CUDA GPU.\n\n\
                  Quick start:\n  cachet model fetch smollm2\n  cachet generate --model smollm2 --chat --prompt \"What is the capital of France?\""
)]
pub struct Cli {
    /// Log format on stderr. Every request gets one access line when its response has been
    /// sent (target `cachet::access`: method, path, status, tenant, model, client, request id,
    /// bytes, milliseconds); `RUST_LOG=info,cachet::access=off` leaves them out.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "CACHET_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// More logging (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once at start-up; boxing clap's argument structs buys nothing"
)]
pub enum Command {
    /// Serve the OpenAI-compatible API for many tenants over the embedded engine.
    Serve(serve::ServeArgs),
    /// Run the engine alone as a worker for a gateway: token ids in, token stream out, KV events.
    Worker(worker::WorkerArgs),
    /// Generate text from a prompt, streamed to stdout.
    Generate(generate::GenerateArgs),
    /// Print the top-K logits at the last position of a token sequence, as JSON.
    Logits(generate::LogitsArgs),
    /// Fetch, list and create models.
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// Compile the CUDA kernels ahead of a start (for images).
    #[command(subcommand)]
    Kernels(kernels::KernelsCommand),
    /// Benchmarks: the forward pass against the device's ceilings, speculative decoding off vs on,
    /// and the TTFT experiment through the gateway.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Tenant administration helpers.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// (Internal) Compile a template module from stdin to stdout: `cachet serve` runs its
    /// tenants' uploads through this in a child process it can stop.
    #[command(hide = true)]
    CompileTemplate,
}

#[derive(Subcommand, Debug)]
pub enum TenantCommand {
    /// Print the sha256 of an API key, the form a tenants config stores it in.
    HashKey {
        /// The API key.
        key: String,
    },
    /// Check a config (TOML) and list its tenants and upstreams.
    Check {
        /// Path of the config file.
        path: std::path::PathBuf,
    },
}

pub fn init_logging(format: LogFormat, verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only on a terminal (and never with NO_COLOR): a log file or collector gets plain
    // text.
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    tracing::debug!(verbose, "debug logging on (-v; RUST_LOG overrides)");
}

/// Runs the command; `given`: the flags given to it (see [`flags`]).
pub fn run(cli: Cli, given: flags::Given) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(a) => serve::serve(a, &given),
        Command::Worker(a) => worker::worker(a, &given),
        Command::Generate(a) => generate::generate(a, &given),
        Command::Logits(a) => generate::logits(a),
        Command::Model(c) => model::run(c),
        Command::Kernels(c) => kernels::run(c),
        Command::Bench(c) => bench::run(c),
        Command::CompileTemplate => cachet_gateway::sandbox::compile_child(),
        Command::Tenant(TenantCommand::HashKey { key }) => {
            println!(
                "{}",
                cachet_gateway::tenants::hex(&cachet_gateway::tenants::hash_key(&key))
            );
            Ok(())
        }
        Command::Tenant(TenantCommand::Check { path }) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let reg = cachet_gateway::config::tenant_registry(
                &text,
                &[0; 32],
                std::time::Instant::now(),
            )?;
            for t in reg.tenants() {
                println!(
                    "{}: {} key(s), priority {}",
                    t.id(),
                    t.config.api_key_sha256.len(),
                    t.config.priority
                );
            }
            use cachet_gateway::config::UpstreamConfig;
            for u in cachet_gateway::config::upstreams_from_toml(&text)? {
                match u {
                    UpstreamConfig::Cachet { url, .. } => {
                        println!("upstream: cachet worker {url}")
                    }
                    UpstreamConfig::Embedded {} => {
                        println!("upstream: the embedded engine")
                    }
                    UpstreamConfig::Openai { url, model, .. } => {
                        println!(
                            "upstream: OpenAI-compatible server {url} (model {})",
                            model.as_deref().unwrap_or("as served")
                        )
                    }
                }
            }
            Ok(())
        }
    }
}
