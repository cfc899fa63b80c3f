//! `cachet`: the multi-tenant LLM edge gateway and its engine, in one command.

mod cli;

use clap::Parser;

/// mimalloc for the whole process: per-thread free lists instead of glibc's arenas, which a
/// loaded gateway spent ~15% of its CPU in (`scripts/gateway_cost.sh` with PERF=1).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    cli::init_logging(args.log_format, args.verbose);
    match cli::run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
