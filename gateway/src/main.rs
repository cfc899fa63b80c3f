//! `cachet`: the multi-tenant LLM edge gateway and its engine, in one command.

mod cli;

use clap::{CommandFactory, FromArgMatches};

/// mimalloc for the whole process: per-thread free lists instead of glibc's arenas, which a
/// loaded gateway spent ~15% of its CPU in (`scripts/gateway_cost.sh` with PERF=1).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let matches = cli::Cli::command().get_matches();
    let args = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let given = cli::flags::Given::of(&matches);
    cli::init_logging(args.log_format, args.verbose);
    match cli::run(args, given) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
