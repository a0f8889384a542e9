//! The command line: a file per command or family of commands (`plugin` spans `plugin.rs` and
//! `plugin_test.rs`; `history` lives in `tune.rs`), each an `Args` struct (or a subcommand enum)
//! with `run()`. Commands whose output is data take `--json`. Every command returns
//! `anyhow::Result<()>`, and `main` maps that to the exit code: 0, or the code a `gitlab`
//! stage's `ExitWith` carries, or 1.

use clap::{Parser, Subcommand};

pub mod config;
pub mod gitlab;
pub mod logging;
pub mod migrate;
pub mod plugin;
pub mod plugin_test;
pub mod run;
pub mod simulate;
pub mod tune;

/// CI fleet autoscaler with sandboxed WebAssembly provider plugins.
#[derive(Debug, Parser)]
#[command(name = "flotilla", version, about)]
pub struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    pub log_json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Work with provider plugins.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Run the autoscaler: every pool, the lease API, metrics and health endpoints.
    Run(run::Args),
    /// Work with configuration files.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Replay a job trace through the real scaler on virtual time.
    Simulate(simulate::Args),
    /// GitLab Runner's Custom executor driver: run each job in a container on a leased instance, or on the machine itself.
    Gitlab(Box<gitlab::Args>),
    /// Move to Flotilla from another autoscaler (Docker Machine).
    #[command(subcommand)]
    Migrate(migrate::MigrateCommand),
    /// Recommend the cheapest policy that meets a waiting-time goal, from a fleet's job history.
    Tune(tune::Args),
    /// Job histories for `tune`: generate a synthetic month, or check a file.
    #[command(subcommand)]
    History(tune::HistoryCommand),
}

impl Command {
    /// Runs the command.
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            Command::Plugin(c) => c.run().await,
            Command::Run(a) => a.run().await,
            Command::Config(c) => c.run().await,
            Command::Simulate(a) => a.run(),
            Command::Gitlab(a) => a.run().await,
            Command::Migrate(c) => c.run(),
            Command::Tune(a) => a.run(),
            Command::History(c) => c.run(),
        }
    }
}

/// A failure the command has already reported on its own output (a report with the failed
/// checks, or every config problem); `main` only sets the exit code.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Reported(pub String);

/// The `flotilla` binary's command, run to the process's exit code ([`run_to_exit`]); a
/// `gitlab` stage on one thread.
///
/// This and [`run_driver`] are where the binaries' commands are polled, and a future's code is
/// compiled where it is polled: here, in the library, once, rather than in each binary (the
/// lean driver's stages were compiled into both). The unit-test build, which runs no binary's
/// command, leaves them out.
#[cfg(not(test))]
pub fn run_command(command: Command) -> std::process::ExitCode {
    let driver = matches!(command, Command::Gitlab(_));
    run_to_exit(driver, command.run())
}

/// The lean driver's stage (`flotilla-gitlab`), run to the process's exit code on one thread.
/// The stage's future is tens of KiB (bollard's requests nest deep): on the heap from the
/// start, it is not copied from frame to frame down the runtime's `block_on`, each copy
/// touching fresh stack pages of a process that lives a second.
#[cfg(not(test))]
pub fn run_driver(args: gitlab::Args) -> std::process::ExitCode {
    run_to_exit(true, Box::pin(args.run()))
}

/// Runs `command` to its end on a fresh runtime and returns the process's exit code: one
/// thread for a GitLab stage (`single_thread`: one job's short process, hundreds at once on a
/// runner manager), one worker per core otherwise.
#[cfg(not(test))]
fn run_to_exit(
    single_thread: bool,
    command: impl std::future::Future<Output = anyhow::Result<()>>,
) -> std::process::ExitCode {
    let runtime = if single_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    };
    match runtime {
        Ok(rt) => exit_code(rt.block_on(command)),
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

/// The process's exit code for a command's result: 0; the code a `gitlab` stage's `ExitWith`
/// carries; or 1, with the error printed unless the command reported it (`Reported`).
#[cfg(not(test))]
fn exit_code(result: anyhow::Result<()>) -> std::process::ExitCode {
    use std::process::ExitCode;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<gitlab::ExitWith>() {
            Some(code) => ExitCode::from(code.0),
            None => {
                if e.downcast_ref::<Reported>().is_none() {
                    eprintln!("error: {e:#}");
                }
                ExitCode::from(1)
            }
        },
    }
}

/// Prints `value` as pretty JSON on standard output.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
