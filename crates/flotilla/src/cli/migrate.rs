//! `flotilla migrate docker-machine --runner-config config.toml [-o flotilla.toml] [--json]`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;

use super::{Reported, print_json};
use crate::migrate::{self, Item, Migration, Options};

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
    /// The plugin for a cloud, `CLOUD=PATH` or `CLOUD=oci://...` (e.g. `aws=plugins/aws.wasm`).
    #[arg(long = "plugin", value_parser = plugin_arg)]
    plugins: Vec<(String, String)>,
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
        let options = Options {
            plugins: a.plugins.into_iter().collect::<BTreeMap<_, _>>(),
            timezone: a.timezone,
            max_instances: a.max_instances,
        };
        let m = migrate::migrate(&file, &text, &options)?;
        if let Some(out) = &a.output {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(out)
                .with_context(|| {
                    format!(
                        "{}: cannot create (an existing file is never replaced)",
                        out.display()
                    )
                })?;
            f.write_all(m.config.as_bytes())
                .with_context(|| format!("{}: cannot write", out.display()))?;
        }
        if a.json {
            print_json(&m)?;
        } else {
            if a.output.is_none() {
                print!("{}", m.config);
            }
            eprint!("{}", report(&m));
        }
        let refused = m.runners.iter().filter(|r| r.pool.is_none()).count();
        if refused > 0 {
            return Err(Reported(format!("{refused} runner(s) could not be migrated")).into());
        }
        Ok(())
    }
}

/// The report as text.
fn report(m: &Migration) -> String {
    let mut s = String::new();
    let list = |s: &mut String, title: &str, items: &[Item]| {
        if items.is_empty() {
            return;
        }
        s.push_str(&format!("  {title}:\n"));
        for i in items {
            let line = i.line.map(|l| format!(" (line {l})")).unwrap_or_default();
            s.push_str(&format!("    {}{line}: {}\n", i.key, i.reason));
        }
    };
    for r in &m.runners {
        match &r.pool {
            Some(pool) => s.push_str(&format!("runner {:?} → pool {pool:?}\n", r.runner)),
            None => s.push_str(&format!("runner {:?}: NOT migrated\n", r.runner)),
        }
        list(&mut s, "refused", &r.refused);
        list(&mut s, "changed meaning (check)", &r.changed);
        list(&mut s, "not carried over", &r.unmapped);
        if let Some(g) = &r.group {
            s.push_str(&format!("  create the {} group once:\n", g.cloud));
            for c in &g.commands {
                s.push_str(&format!("    {c}\n"));
            }
            s.push_str("  the plugin's permissions:\n");
            for l in g.permissions.lines() {
                s.push_str(&format!("    {l}\n"));
            }
        }
    }
    for o in &m.other_runners {
        s.push_str(&format!("runner {o:?}: not docker+machine, left alone\n"));
    }
    s
}
