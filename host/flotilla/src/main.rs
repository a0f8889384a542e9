//! The `flotilla` command line: parse, set up logging, run the command, and map its result to
//! the exit code. Success is 0. A `gitlab` stage's job or system failure ends with the code
//! its `ExitWith` carries, which `cli/gitlab/` takes from the runner
//! (`BUILD_FAILURE_EXIT_CODE` or `SYSTEM_FAILURE_EXIT_CODE`; 1 and 2 when unset, 2 when the
//! job's variables cannot be read). Any other failure is 1, and its error is printed here
//! unless the command reported it (`Reported`): `cli::run_command`, and for the lean driver
//! binary (`bin/flotilla-gitlab.rs`) `cli::run_driver`. clap's parse exits on its own: 0 after
//! `--help` or `--version`, 2 on a usage error.

use std::process::ExitCode;

use clap::Parser;

use flotilla::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    flotilla::cli::logging::init(
        cli.log_json,
        matches!(cli.command, Command::Gitlab(_) | Command::Config(_)),
    );
    // A GitLab stage is one job's short process, and a runner manager starts hundreds of them
    // at once: one thread each (the host's server keeps the multi-threaded runtime).
    flotilla::cli::run_command(cli.command)
}
