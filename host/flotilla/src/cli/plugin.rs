//! `flotilla plugin check|push|pull|inspect|login|logout|ls|sign|generate-key`.

use std::path::PathBuf;

use super::plugin_test::TestArgs;
use super::{Reported, print_json};
use crate::plugin_kit::check::{CheckOptions, check};
use crate::plugin_kit::new::Lang;
use crate::plugin_kit::registry::{self as oci_cli, RegistryArgs};
use crate::plugin_kit::sandbox::SandboxArgs;

/// Work with provider plugins.
#[derive(Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Load and validate a plugin; with --settings also call init.
    Check {
        /// The plugin component (.wasm), or `builtin:NAME` for one embedded in this binary.
        file: PathBuf,
        /// Print a JSON report.
        #[arg(long)]
        json: bool,
        /// Settings file (JSON, or TOML by extension) to call init with.
        #[arg(long)]
        settings: Option<PathBuf>,
        /// What init may reach, and as whom.
        #[command(flatten)]
        sandbox: SandboxArgs,
        /// Compile cache directory (default: the user's cache dir).
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// Do not use the compile cache.
        #[arg(long, conflicts_with = "cache_dir")]
        no_cache: bool,
    },
    /// The conformance kit: run the contract's rules against a plugin, rule by rule.
    Test(TestArgs),
    /// Write a plugin template into ./NAME, ready to build (works offline).
    New {
        /// The plugin's name (lowercase letters, digits, dashes).
        name: String,
        /// The template's language.
        #[arg(long, value_enum, default_value = "rust")]
        lang: Lang,
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
        /// Registry access.
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
        /// Registry access.
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
        /// Registry access.
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
        /// Registry access.
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Forget stored registry credentials.
    Logout {
        /// Registry host[:port].
        registry_host: String,
    },
    /// Write a built-in plugin out as a .wasm file (to push to a registry and pin by digest).
    Export {
        /// `builtin:NAME` (`flotilla plugin ls` lists them).
        name: String,
        /// The file to write.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// List the built-in plugins and the cached plugin artifacts, with their digests.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Registry access.
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
        /// Registry access.
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

impl PluginCommand {
    /// Runs the command; the OCI commands print what they return.
    pub async fn run(self) -> anyhow::Result<()> {
        let out = match self {
            PluginCommand::Check {
                file,
                json,
                settings,
                sandbox,
                cache_dir,
                no_cache,
            } => {
                let cache_dir = if no_cache {
                    None
                } else {
                    cache_dir.or_else(flotilla_plugin_runtime::default_cache_dir)
                };
                return run_check(file, json, settings, sandbox, cache_dir).await;
            }
            PluginCommand::Test(args) => return super::plugin_test::run(args).await,
            PluginCommand::New { name, lang } => {
                print!(
                    "{}",
                    crate::plugin_kit::new::new(std::path::Path::new("."), &name, lang)?
                );
                return Ok(());
            }
            PluginCommand::Export { name, output } => {
                return crate::plugin_kit::check::export(&name, &output);
            }
            registry => registry.oci().await,
        }?;
        print!("{out}");
        Ok(())
    }

    /// The registry commands: what they print.
    async fn oci(self) -> anyhow::Result<String> {
        let out = match self {
            PluginCommand::Push {
                file,
                reference,
                annotations,
                json,
                registry,
            } => oci_cli::push(&registry, &file, &reference, &annotations, json).await,
            PluginCommand::Pull {
                reference,
                output,
                verify_key,
                json,
                registry,
            } => {
                oci_cli::pull(
                    &registry,
                    &reference,
                    output.as_deref(),
                    verify_key.as_deref(),
                    json,
                )
                .await
            }
            PluginCommand::Inspect {
                reference,
                json,
                registry,
            } => oci_cli::inspect(&registry, &reference, json).await,
            PluginCommand::Login {
                registry_host,
                username,
                registry,
            } => {
                oci_cli::login(
                    &registry,
                    &registry_host,
                    &username,
                    std::io::stdin().lock(),
                )
                .await
            }
            PluginCommand::Logout { registry_host } => oci_cli::logout(&registry_host),
            PluginCommand::Ls { json, registry } => oci_cli::ls(&registry, json),
            PluginCommand::Sign {
                reference,
                key,
                registry,
            } => oci_cli::sign(&registry, &reference, &key).await,
            PluginCommand::GenerateKey { prefix } => oci_cli::generate_key(&prefix),
            PluginCommand::Check { .. }
            | PluginCommand::Test(_)
            | PluginCommand::New { .. }
            | PluginCommand::Export { .. } => {
                anyhow::bail!("not a registry command")
            }
        };
        Ok(out?)
    }
}

/// `plugin check`: the report as text or JSON; a failed check is the exit code.
async fn run_check(
    file: PathBuf,
    json: bool,
    settings: Option<PathBuf>,
    sandbox: SandboxArgs,
    cache_dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    let sandbox = sandbox.sandbox().map_err(anyhow::Error::msg)?;
    let report = check(&CheckOptions {
        file,
        settings,
        sandbox,
        cache_dir,
    })
    .await;
    if json {
        print_json(&report)?;
    } else {
        print!("{}", report.render());
    }
    if !report.ok {
        return Err(Reported("plugin check failed".to_string()).into());
    }
    Ok(())
}
