//! The `flotilla` command line: parse, set up logging, run the command, and map its result to
//! the exit code. Success is 0. A `gitlab` stage's job or system failure ends with the code
//! its `ExitWith` carries, which `cli/gitlab.rs` takes from the runner
//! (`BUILD_FAILURE_EXIT_CODE` or `SYSTEM_FAILURE_EXIT_CODE`; 1 and 2 when unset, 2 when the
//! job's variables cannot be read). Any other failure is 1, and its error is printed here
//! unless the command reported it (`Reported`). clap's parse exits on its own: 0 after
//! `--help` or `--version`, 2 on a usage error.

use std::process::ExitCode;

use clap::Parser;

use flotilla::cli::gitlab::ExitWith;
use flotilla::cli::{Cli, Command, Reported};

fn init_logging(json: bool, quiet: bool) {
    // The GitLab driver's stderr is the job's log, and `config check` prints its verdict: only
    // warnings unless asked.
    let default = if quiet { "warn" } else { "info" };
    let spec = std::env::var("FLOTILLA_LOG").unwrap_or_else(|_| default.to_string());
    // rustls' platform verifier logs each rejected certificate itself; flotilla reports it once.
    let spec = if spec.contains("rustls_platform_verifier") {
        spec
    } else {
        format!("{spec},rustls_platform_verifier=off")
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&spec).unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,rustls_platform_verifier=off")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        // One object per line: the event's fields at the top level, and the pool's span
        // (`span.pool`, `span.plugin_digest`) on every line logged inside a pool.
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        builder.init();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let driver = matches!(cli.command, Command::Gitlab(_));
    init_logging(
        cli.log_json,
        driver || matches!(cli.command, Command::Config(_)),
    );
    // A GitLab stage is one job's short process, and a runner manager starts hundreds of them
    // at once: one thread each, not one per core (the host's server keeps the multi-threaded
    // runtime).
    let runtime = if driver {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(cli.command.run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<ExitWith>().is_some() => {
            ExitCode::from(e.downcast_ref::<ExitWith>().map_or(1, |c| c.0))
        }
        Err(e) => {
            if e.downcast_ref::<Reported>().is_none() {
                eprintln!("error: {e:#}");
            }
            ExitCode::from(1)
        }
    }
}
