//! A stand-in for GitLab Runner's `gitlab-runner-helper` binary, for tests only: the four
//! subcommands the Custom executor's predefined stages call (`cache-extractor`,
//! `cache-archiver`, `artifacts-downloader`, `artifacts-uploader`) and `--version`, written
//! from the runner's source (v19.4.0, `apps/gitlab-runner-helper/main.go` and
//! `commands/helpers/*`; each module cites the Go file and function it follows). It runs in a
//! FROM-scratch image beside busybox and git, so it uses std, rustls and nothing else that
//! needs the system.
//!
//! This file composes: it reads the global options (`--debug`, `--log-level`,
//! `--log-format`, `--version`, `--help`, as `log/configuration.go` and urfave/cli add them),
//! picks the command, and turns its outcome into the exit status. The program name does not
//! matter (`gitlab-runner`, `gitlab-runner-helper`, a path or a symlink all behave the same).

mod archive_write;
mod artifacts_downloader;
mod artifacts_uploader;
mod azure;
mod cache_archiver;
mod cache_common;
mod cache_extractor;
mod checksum;
mod ctx;
mod expand;
mod extract;
mod flags;
mod gitlab;
mod glob;
mod http;
mod inflate;
mod lexical;
mod log;
mod paths;
mod statement;
mod timefmt;
mod tls;
mod zip_read;

#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod http_tests;
#[cfg(test)]
mod testkit;

use std::io::Write;

use crate::ctx::{Ctx, Env, Exit};
use crate::flags::{Flag, Kind, Parsed};
use crate::log::{Level, Log};

/// The runner's helper commands this stand-in does not implement.
const NOT_IMPLEMENTED: &[&str] = &[
    "cache-init",
    "health-check",
    "proxy-exec",
    "read-logs",
    "steps",
];

type Run = fn(&mut Ctx, &Parsed) -> Result<(), Exit>;

/// Name, description, flags and entry point of each implemented command.
fn commands() -> Vec<(&'static str, &'static str, Vec<Flag>, Run)> {
    vec![
        (
            "artifacts-downloader",
            artifacts_downloader::USAGE,
            artifacts_downloader::flags(),
            artifacts_downloader::run,
        ),
        (
            "artifacts-uploader",
            artifacts_uploader::USAGE,
            artifacts_uploader::flags(),
            artifacts_uploader::run,
        ),
        (
            "cache-archiver",
            cache_archiver::USAGE,
            cache_archiver::flags(),
            cache_archiver::run,
        ),
        (
            "cache-extractor",
            cache_extractor::USAGE,
            cache_extractor::flags(),
            cache_extractor::run,
        ),
    ]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let wd = match std::env::current_dir() {
        Ok(wd) => wd,
        Err(_) => {
            Log::stderr().fatal("Unable to get working directory");
            std::process::exit(1);
        }
    };
    let mut ctx = Ctx {
        wd,
        env: Env::from_process(),
        log: Log::stderr(),
    };
    let Exit(code) = match run(&args, &mut ctx) {
        Ok(()) => Exit(0),
        Err(exit) => exit,
    };
    std::process::exit(code);
}

/// The global options, then the command.
fn run(args: &[String], ctx: &mut Ctx) -> Result<(), Exit> {
    let mut rest = args.iter().peekable();
    let mut level = global_level(&ctx.env).map_err(|e| usage_error(ctx, &e))?;
    while let Some(arg) = rest.next_if(|a| a.starts_with('-')) {
        let body = arg.trim_start_matches('-');
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (body, None),
        };
        match name {
            "version" | "v" => {
                print_version();
                return Ok(());
            }
            "help" | "h" => {
                print_help();
                return Ok(());
            }
            "debug" => {
                if flags::parse_bool(inline.as_deref().unwrap_or("true"))
                    .map_err(|e| usage_error(ctx, &e))?
                {
                    level = Level::Debug;
                }
            }
            "log-level" | "l" | "log-format" => {
                let value = match inline {
                    Some(value) => value,
                    None => rest.next().cloned().ok_or_else(|| {
                        usage_error(ctx, &format!("flag needs an argument: -{name}"))
                    })?,
                };
                if name == "log-format" {
                    check_format(&value).map_err(|e| usage_error(ctx, &e))?;
                } else {
                    level = Level::parse(&value).map_err(|e| {
                        usage_error(ctx, &format!("failed to parse log level: {e}"))
                    })?;
                }
            }
            _ => {
                return Err(usage_error(
                    ctx,
                    &format!("flag provided but not defined: -{name}"),
                ));
            }
        }
    }
    ctx.log.set_threshold(level);
    let Some(command) = rest.next() else {
        print_help();
        return Ok(());
    };
    let tail: Vec<String> = rest.cloned().collect();
    dispatch(ctx, command, &tail)
}

fn dispatch(ctx: &mut Ctx, command: &str, args: &[String]) -> Result<(), Exit> {
    if command == "help" || command == "h" {
        print_help();
        return Ok(());
    }
    let Some((name, usage, flags, run)) =
        commands().into_iter().find(|(name, ..)| *name == command)
    else {
        if NOT_IMPLEMENTED.contains(&command) {
            ctx.log.fatal(&format!(
                "Command {command} is not implemented by this gitlab-runner-helper stand-in"
            ));
        } else {
            ctx.log.fatal(&format!("Command {command} not found"));
        }
        return Err(Exit::FAILURE);
    };
    let parsed = match flags::parse(&flags, args, &ctx.env) {
        Ok(parsed) => parsed,
        Err(err) => {
            println!("Incorrect Usage: {err}\n");
            print_command_help(name, usage, &flags);
            ctx.log.fatal(&err);
            return Err(Exit::FAILURE);
        }
    };
    if parsed.help {
        print_command_help(name, usage, &flags);
        return Ok(());
    }
    run(ctx, &parsed)
}

/// `LOG_LEVEL`, `RUNNER_DEBUG` and `LOG_FORMAT` from the environment.
fn global_level(env: &Env) -> Result<Level, String> {
    if let Some(format) = env.get("LOG_FORMAT").filter(|f| !f.is_empty()) {
        check_format(format)?;
    }
    if env
        .get("RUNNER_DEBUG")
        .is_some_and(|v| flags::parse_bool(v) == Ok(true))
    {
        return Ok(Level::Debug);
    }
    match env.get("LOG_LEVEL").filter(|l| !l.is_empty()) {
        Some(level) => Level::parse(level).map_err(|e| format!("failed to parse log level: {e}")),
        None => Ok(Level::Info),
    }
}

/// Only the runner format is written (`--log-format text|json` are the runner's others).
fn check_format(format: &str) -> Result<(), String> {
    match format {
        "runner" => Ok(()),
        "text" | "json" => Err(format!(
            "log format {format:?} is not supported by this gitlab-runner-helper stand-in (runner only)"
        )),
        _ => Err(format!(
            "unknown log format {format:?}, expected one of: [runner text json]"
        )),
    }
}

fn usage_error(ctx: &mut Ctx, message: &str) -> Exit {
    println!("Incorrect Usage. {message}\n");
    ctx.log.fatal(message);
    Exit::FAILURE
}

/// `AppVersionInfo.Extended`, printed by urfave/cli's version flag.
fn print_version() {
    let mut out = std::io::stdout();
    let text = format!(
        "Version:      {}\nGit revision: {}\nGit branch:   HEAD\nGO version:   none (a Rust stand-in for tests)\nBuilt:        unknown\nOS/Arch:      {}/{}\n",
        gitlab::VERSION,
        gitlab::REVISION,
        std::env::consts::OS,
        gitlab::go_arch()
    );
    let _ignored = out.write_all(text.as_bytes());
}

fn print_help() {
    let mut text = String::from(
        "NAME:\n   gitlab-runner-helper - a GitLab Runner Helper (test stand-in)\n\nUSAGE:\n   gitlab-runner-helper [global options] command [command options] [arguments...]\n\nVERSION:\n   ",
    );
    text.push_str(&format!(
        "{} ({})\n\nCOMMANDS:\n",
        gitlab::VERSION,
        gitlab::REVISION
    ));
    for (name, usage, ..) in commands() {
        text.push_str(&format!("   {name:<22}{usage}\n"));
    }
    text.push_str("\nGLOBAL OPTIONS:\n   --debug                 debug mode [$RUNNER_DEBUG]\n   --log-format value      Choose log format (options: runner, text, json) [$LOG_FORMAT]\n   --log-level value, -l value  Log level (options: debug, info, warn, error, fatal, panic) [$LOG_LEVEL]\n   --help, -h              show help\n   --version, -v           print the version\n");
    let _ignored = std::io::stdout().write_all(text.as_bytes());
}

fn print_command_help(name: &str, usage: &str, flags: &[Flag]) {
    let mut text = format!(
        "NAME:\n   gitlab-runner-helper {name} - {usage}\n\nUSAGE:\n   gitlab-runner-helper {name} [command options] [arguments...]\n\nOPTIONS:\n"
    );
    for flag in flags {
        let value = if flag.kind == Kind::Switch {
            ""
        } else {
            " value"
        };
        let env = flag.env.map(|e| format!(" [${e}]")).unwrap_or_default();
        text.push_str(&format!("   --{}{value}{env}\n", flag.name));
    }
    let _ignored = std::io::stdout().write_all(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{args, project};

    #[test]
    fn an_unknown_command_is_fatal_with_the_runners_message() {
        let (_dir, mut ctx, captured) = project(&[]);
        assert_eq!(run(&args(&["nope"]), &mut ctx), Err(Exit::FAILURE));
        assert!(captured.text().contains("FATAL: Command nope not found"));
    }

    #[test]
    fn an_unknown_flag_of_a_command_is_fatal() {
        let (_dir, mut ctx, captured) = project(&[]);
        assert_eq!(
            run(&args(&["cache-archiver", "--bogus"]), &mut ctx),
            Err(Exit::FAILURE)
        );
        assert!(
            captured
                .text()
                .contains("FATAL: flag provided but not defined: -bogus")
        );
    }

    #[test]
    fn the_version_flag_succeeds_before_any_command() {
        let (_dir, mut ctx, _captured) = project(&[]);
        assert_eq!(run(&args(&["--version"]), &mut ctx), Ok(()));
        assert_eq!(run(&args(&["-v"]), &mut ctx), Ok(()));
    }
}
