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
            exe: crate::cli::gitlab::driver_exe(),
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
            if !m.runners_toml_with_tokens.is_empty() {
                let blocks = runners_file(out);
                write_private_new(&blocks, m.runners_toml_with_tokens.as_bytes())?;
            }
        }
        if a.json {
            print_json(&m)?;
        } else {
            if a.output.is_none() {
                print!("{}", m.config);
            }
            eprint!("{}", report(&m, a.output.as_deref()));
        }
        let refused = m.runners.iter().filter(|r| r.pool.is_none()).count();
        if refused > 0 {
            return Err(Reported(format!("{refused} runner(s) could not be migrated")).into());
        }
        Ok(())
    }
}

/// Where the runner blocks with their tokens go: beside the config, `NAME.runners.toml`.
fn runners_file(config: &std::path::Path) -> PathBuf {
    let stem = config
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "flotilla".into());
    config.with_file_name(format!("{stem}.runners.toml"))
}

/// Creates `path` (never over an existing file) readable by its owner only, with `bytes`.
fn write_private_new(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(path).with_context(|| {
        format!(
            "{}: cannot create (an existing file is never replaced)",
            path.display()
        )
    })?;
    f.write_all(bytes)
        .with_context(|| format!("{}: cannot write", path.display()))
}

/// The report as text.
fn report(m: &Migration, output: Option<&std::path::Path>) -> String {
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
        // A refused runner gets no pool, so nothing to create for it either.
        if let (Some(g), Some(_)) = (&r.group, &r.pool) {
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
    if !m.runners_toml.is_empty() {
        s.push_str("\nIn GitLab Runner's config.toml, replace each migrated runner's [[runners]] block with:\n\n");
        s.push_str(&m.runners_toml);
        match output {
            Some(out) => s.push_str(&format!(
                "(the same blocks with the runners' tokens are in {}, readable by you only)\n",
                runners_file(out).display()
            )),
            None => s.push_str("(write the configuration with -o FILE to also get these blocks with the runners' tokens)\n"),
        }
    }
    s
}
