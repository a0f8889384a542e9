//! `flotilla plugin test`: its arguments, and `run`, which hands them to the conformance kit
//! (`plugin_kit::kit`) and prints the report.

use std::path::PathBuf;
use std::time::Duration;

use super::{Reported, print_json};
use crate::plugin_kit::kit::{self, TestPlan};
use crate::plugin_kit::sandbox::SandboxArgs;

/// `flotilla plugin test` arguments.
#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// The plugin component (.wasm); with --config and --pool, the pool's plugin by default.
    pub plugin: Option<PathBuf>,
    /// A Flotilla config: the pool's sandbox, credentials, limits and settings are used.
    #[arg(long, short = 'c', requires = "pool")]
    pub config: Option<PathBuf>,
    /// The pool of --config to test as.
    #[arg(long, requires = "config")]
    pub pool: Option<String>,
    /// Settings (a JSON or TOML file, or inline JSON) to call init with.
    #[arg(long)]
    pub settings: Option<String>,
    /// Start the built-in example cloud on loopback and test against it (the templates' API).
    #[arg(long, conflicts_with = "config")]
    pub example_cloud: bool,
    /// Also run the rules that create one real instance (and remove it).
    #[arg(long)]
    pub provision: bool,
    /// How long an instance may take to run, and to go away.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Print a JSON report.
    #[arg(long)]
    pub json: bool,
    /// The sandbox of a quick try (ignored with --config).
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

/// Runs the kit; a non-zero exit on any failure.
pub async fn run(args: TestArgs) -> anyhow::Result<()> {
    let plan = TestPlan {
        plugin: args.plugin,
        pool: args.config.zip(args.pool),
        settings: args.settings,
        example_cloud: args.example_cloud,
        provision: args.provision,
        timeout: args.timeout,
        sandbox: args.sandbox,
    };
    let report = kit::test(&plan).await?;
    if args.json {
        print_json(&report)?;
    } else {
        print!("{}", report.render());
    }
    if !report.ok() {
        return Err(Reported("plugin test failed".to_string()).into());
    }
    Ok(())
}
