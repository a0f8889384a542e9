//! `flotilla migrate docker-machine --runner-config config.toml [-o flotilla.toml] [--json]`: its
//! arguments and `run`; the migration and its report are `crate::migrate`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;

use super::{Reported, print_json};
use crate::migrate::{self, Options, report};

/// Move to Flotilla from another autoscaler.
#[derive(Debug, clap::Subcommand)]
pub enum MigrateCommand {
    /// GitLab Runner's `docker+machine` runners → Flotilla pools, the cloud groups to create
    /// once, and a report of every key that changed meaning or could not be carried over.
    DockerMachine(Args),
}

/// `flotilla migrate docker-machine`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// GitLab Runner's `config.toml`.
    #[arg(long)]
    runner_config: PathBuf,
    /// Write the Flotilla configuration here (never over an existing file); standard output
    /// when absent.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Print the configuration and the report as one JSON document.
    #[arg(long)]
    json: bool,
    /// The plugin for a cloud, `CLOUD=PATH`, `CLOUD=oci://...` or `CLOUD=builtin:NAME`
    /// (default: the official plugin built into this binary, `builtin:aws`, ...). A relative
    /// path is taken from the current directory and written absolute.
    #[arg(long = "plugin", value_parser = plugin_arg)]
    plugins: Vec<(String, String)>,
    /// The lease API's address, written as `server.listen` and as the runners' `--url`.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// The API token file, written as `server.token` and as the runners' `--token-file`
    /// (created by you, readable by flotilla and gitlab-runner only).
    #[arg(long, default_value = "/etc/flotilla/token")]
    token_file: PathBuf,
    /// The zone for autoscaling sections whose `Timezone` is empty (the runner host's zone).
    #[arg(long, default_value = "UTC")]
    timezone: String,
    /// `max_instances` for runners with `limit = 0` when `concurrent` is unset too.
    #[arg(long)]
    max_instances: Option<u32>,
}

fn plugin_arg(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((cloud, r)) if ["aws", "gcp", "azure"].contains(&cloud) && !r.is_empty() => {
            Ok((cloud.to_string(), r.to_string()))
        }
        _ => Err(format!(
            "{s:?}: expected CLOUD=PLUGIN with CLOUD aws, gcp or azure"
        )),
    }
}

impl MigrateCommand {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<()> {
        let MigrateCommand::DockerMachine(a) = self;
        let file = a.runner_config.display().to_string();
        let text = std::fs::read_to_string(&a.runner_config)
            .with_context(|| format!("{file}: cannot read"))?;
        let cwd = std::env::current_dir().context("the current directory")?;
        let absolute = |p: &str| -> String {
            if p.starts_with("oci://") || p.starts_with(flotilla_builtin::PREFIX) {
                p.to_string()
            } else {
                let joined = cwd.join(p);
                joined
                    .canonicalize()
                    .unwrap_or(joined)
                    .display()
                    .to_string()
            }
        };
        let options = Options {
            plugins: a
                .plugins
                .iter()
                .map(|(cloud, p)| (cloud.clone(), absolute(p)))
                .collect::<BTreeMap<_, _>>(),
            timezone: a.timezone,
            max_instances: a.max_instances,
            token_file: absolute(&a.token_file.display().to_string()),
            listen: a.listen,
            exe: crate::custom_executor::driver_exe(),
        };
        let m = migrate::migrate(&file, &text, &options)?;
        if let Some(out) = &a.output {
            report::write(&m, out)?;
        }
        if a.json {
            print_json(&m)?;
        } else {
            if a.output.is_none() {
                print!("{}", m.config);
            }
            eprint!("{}", report::report(&m, a.output.as_deref()));
        }
        let refused = m.runners.iter().filter(|r| r.pool.is_none()).count();
        if refused > 0 {
            return Err(Reported(format!("{refused} runner(s) could not be migrated")).into());
        }
        Ok(())
    }
}
