//! The `flotilla` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use flotilla::check::{CheckOptions, check};

/// CI fleet autoscaler with sandboxed WebAssembly provider plugins.
#[derive(Debug, Parser)]
#[command(name = "flotilla", version, about)]
struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with provider plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Load and validate a plugin; with --settings also call init.
    Check {
        /// The plugin component (.wasm).
        file: PathBuf,
        /// Print a JSON report.
        #[arg(long)]
        json: bool,
        /// Settings file (JSON, or TOML by extension) to call init with.
        #[arg(long)]
        settings: Option<PathBuf>,
        /// Allow the plugin to reach this scheme://host[:port] during init (repeatable).
        #[arg(long = "allow-host")]
        allow_hosts: Vec<String>,
        /// Compile cache directory (default: the user's cache dir).
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// Do not use the compile cache.
        #[arg(long, conflicts_with = "cache_dir")]
        no_cache: bool,
    },
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_json);
    match cli.command {
        Command::Plugin(PluginCommand::Check {
            file,
            json,
            settings,
            allow_hosts,
            cache_dir,
            no_cache,
        }) => {
            let cache_dir = if no_cache {
                None
            } else {
                cache_dir.or_else(flotilla::plugin::default_cache_dir)
            };
            let report = check(&CheckOptions {
                file,
                settings,
                allow_hosts,
                cache_dir,
            })
            .await;
            if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(text) => println!("{text}"),
                    Err(e) => eprintln!("error: cannot encode report: {e}"),
                }
            } else {
                print!("{}", report.render());
            }
            if report.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
    }
}
