//! `flotilla-gitlab`: GitLab Runner's Custom-executor driver on its own, the same stages and
//! flags as `flotilla gitlab`. The runner starts one process per stage, seven before a job's
//! script runs, hundreds at once on a busy manager. This binary carries only the driver (no
//! wasmtime, no server), so each start maps and relocates a fraction of the full binary's
//! pages. Exit codes are `flotilla gitlab`'s.

use std::process::ExitCode;

/// On the static (musl) build, dlmalloc instead of musl's allocator. musl's unmaps a group of
/// blocks as soon as its last block is freed and maps a new one at the next allocation: a
/// stage process made about 60 `mmap` and 45 `munmap` calls, each with its page faults.
/// dlmalloc takes memory in 64 KiB segments and keeps what is freed for the next allocation.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

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
    flotilla::cli::logging::init_driver(cli.log_json);
    flotilla::cli::run_driver(cli.driver)
}
