//! `flotilla-gitlab`: GitLab Runner's Custom-executor driver on its own, the same stages and
//! flags as `flotilla gitlab`. The runner starts one process per stage, seven before a job's
//! script runs, hundreds at once on a busy manager. This binary carries only the driver (no
//! wasmtime, no server), so each start maps and relocates a fraction of the full binary's
//! pages. Exit codes are `flotilla gitlab`'s.

use std::process::ExitCode;

use clap::Parser;

/// GitLab Runner's Custom executor driver: run each job in a container on a leased Flotilla
/// instance, or on the machine itself.
#[derive(Debug, Parser)]
#[command(name = "flotilla-gitlab", version, about)]
struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(flatten)]
    driver: flotilla::cli::gitlab::Args,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    flotilla::cli::logging::init(cli.log_json, true);
    flotilla::cli::run_driver(cli.driver)
}
