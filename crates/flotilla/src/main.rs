//! The `flotilla` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use flotilla::check::{CheckOptions, check};
use flotilla::cli::oci::{self as oci_cli, RegistryArgs};

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
    /// Run the autoscaler: every pool, the lease API, metrics and health endpoints.
    Run {
        /// The configuration file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Work with configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Replay a job trace through the real scaler on virtual time.
    Simulate {
        /// Configuration files to compare (every pool of each is simulated).
        #[arg(short, long, required = true)]
        config: Vec<PathBuf>,
        /// CSV trace: submit_at_s,duration_s[,tag].
        #[arg(long)]
        trace: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Draw instances, busy slots and queued jobs over time.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Provisioning delay range in seconds, e.g. 30..90.
        #[arg(long, default_value = "30..90")]
        provisioning_delay: String,
        /// Probability that a provider call fails.
        #[arg(long, default_value_t = 0.0)]
        failure_rate: f64,
        /// Random seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate a configuration without starting anything.
    Check {
        /// The configuration file.
        #[arg(short, long)]
        config: PathBuf,
    },
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
    /// Publish a plugin component to an OCI registry as a CNCF Wasm artifact.
    Push {
        /// The plugin component (.wasm); it must pass `plugin check`.
        file: PathBuf,
        /// Where to: oci://registry/repository:tag.
        reference: String,
        /// Manifest annotation KEY=VALUE (short keys mean org.opencontainers.image.KEY).
        #[arg(long = "annotation", short = 'a')]
        annotations: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Download a plugin artifact into the cache (verified), optionally copying it out.
    Pull {
        /// oci://registry/repository[:tag][@sha256:digest].
        reference: String,
        /// Also write the component to this file.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Require a cosign signature by this public key.
        #[arg(long)]
        verify_key: Option<PathBuf>,
        /// Print JSON (and no progress bar).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Show an artifact's digest, size, annotations, world, imports and exports.
    Inspect {
        /// oci://registry/repository[:tag][@sha256:digest].
        reference: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Store registry credentials (password read from stdin) after checking them.
    Login {
        /// Registry host[:port].
        registry_host: String,
        /// User name.
        #[arg(short, long)]
        username: String,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Forget stored registry credentials.
    Logout {
        /// Registry host[:port].
        registry_host: String,
    },
    /// List cached plugin artifacts.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Sign an artifact with a cosign key (password from COSIGN_PASSWORD).
    Sign {
        /// oci://registry/repository[:tag][@sha256:digest].
        reference: String,
        /// cosign private key file.
        #[arg(long)]
        key: PathBuf,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Create a cosign-format key pair PREFIX.key / PREFIX.pub (password from COSIGN_PASSWORD).
    GenerateKey {
        /// Output prefix, e.g. `cosign`.
        #[arg(default_value = "cosign")]
        prefix: PathBuf,
    },
}

fn init_logging(json: bool) {
    let spec = std::env::var("FLOTILLA_LOG").unwrap_or_else(|_| "info".to_string());
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
                cache_dir.or_else(flotilla_plugin_runtime::default_cache_dir)
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
        Command::Plugin(PluginCommand::Push {
            file,
            reference,
            annotations,
            json,
            registry,
        }) => finish(oci_cli::push(&registry, &file, &reference, &annotations, json).await),
        Command::Plugin(PluginCommand::Pull {
            reference,
            output,
            verify_key,
            json,
            registry,
        }) => finish(
            oci_cli::pull(
                &registry,
                &reference,
                output.as_deref(),
                verify_key.as_deref(),
                json,
            )
            .await,
        ),
        Command::Plugin(PluginCommand::Inspect {
            reference,
            json,
            registry,
        }) => finish(oci_cli::inspect(&registry, &reference, json).await),
        Command::Plugin(PluginCommand::Login {
            registry_host,
            username,
            registry,
        }) => finish(
            oci_cli::login(
                &registry,
                &registry_host,
                &username,
                std::io::stdin().lock(),
            )
            .await,
        ),
        Command::Plugin(PluginCommand::Logout { registry_host }) => {
            finish(oci_cli::logout(&registry_host))
        }
        Command::Plugin(PluginCommand::Ls { json, registry }) => {
            finish(oci_cli::ls(&registry, json))
        }
        Command::Plugin(PluginCommand::Sign {
            reference,
            key,
            registry,
        }) => finish(oci_cli::sign(&registry, &reference, &key).await),
        Command::Plugin(PluginCommand::GenerateKey { prefix }) => {
            finish(oci_cli::generate_key(&prefix))
        }
        Command::Run { config } => match flotilla::app::run(config).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        },
        Command::Config(ConfigCommand::Check { config }) => match flotilla::config::load(&config) {
            Ok(cfg) => {
                println!("{}: OK ({} pools)", config.display(), cfg.pools.len());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                eprintln!("{} problem(s) found", e.0.len());
                ExitCode::from(1)
            }
        },
        Command::Simulate {
            config,
            trace,
            json,
            svg,
            provisioning_delay,
            failure_rate,
            seed,
        } => simulate_cmd(
            &config,
            &trace,
            json,
            svg.as_deref(),
            &provisioning_delay,
            failure_rate,
            seed,
        ),
    }
}

fn finish(result: Result<String, flotilla_oci::OciError>) -> ExitCode {
    match result {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn simulate_cmd(
    configs: &[PathBuf],
    trace: &std::path::Path,
    json: bool,
    svg: Option<&std::path::Path>,
    delay: &str,
    failure_rate: f64,
    seed: u64,
) -> ExitCode {
    use flotilla::simulate;
    let fail = |msg: String| {
        eprintln!("error: {msg}");
        ExitCode::from(1)
    };
    let parse = |s: &str| {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    let (lo, hi) = match delay.split_once("..").map(|(a, b)| (parse(a), parse(b))) {
        Some((Some(a), Some(b))) if a <= b => (a, b),
        _ => {
            return fail(format!(
                "--provisioning-delay {delay:?}: expected MIN..MAX seconds, e.g. 30..90"
            ));
        }
    };
    if !(0.0..=1.0).contains(&failure_rate) {
        return fail("--failure-rate must be between 0 and 1".to_string());
    }
    let jobs = match simulate::read_trace(trace) {
        Ok(j) => j,
        Err(e) => return fail(e.to_string()),
    };
    let cloud = flotilla_scaler::sim::SimCloud {
        provisioning_delay_ms: ((lo * 1000.0) as u64, (hi * 1000.0) as u64),
        failure_rate,
        seed,
        ..Default::default()
    };
    let runs = match simulate::run_all(configs, &jobs, &cloud, if svg.is_some() { 1000 } else { 0 })
    {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if let Some(path) = svg
        && let Err(e) = simulate::svg(&runs, path)
    {
        return fail(format!("{}: {e}", path.display()));
    }
    if json {
        match serde_json::to_string_pretty(&runs) {
            Ok(t) => println!("{t}"),
            Err(e) => return fail(e.to_string()),
        }
    } else {
        print!("{}", simulate::table(&runs));
    }
    ExitCode::SUCCESS
}
