//! `flotilla config check -c CONFIG [--json]`.

use std::path::PathBuf;

use serde_json::json;

use super::{Reported, print_json};

/// Work with configuration files.
#[derive(Debug, clap::Subcommand)]
pub enum ConfigCommand {
    /// Validate a configuration without starting anything; every problem is reported at once
    /// as file:line: key: message.
    Check {
        /// The configuration file.
        #[arg(short, long)]
        config: PathBuf,
        /// Print JSON: `{"ok", "pools"}` or `{"ok", "problems": [{file, line, key, message}]}`.
        #[arg(long)]
        json: bool,
    },
}

impl ConfigCommand {
    /// Runs the command: the file's validation, then the checks `run` makes before it starts
    /// (token, connector files, each plugin's verdict on its `plugin_config`), every problem in
    /// one list sorted by line.
    pub async fn run(self) -> anyhow::Result<()> {
        let ConfigCommand::Check { config, json } = self;
        let (loaded, checkable) = crate::config::load_checkable(&config);
        let runtime = crate::app::plugin_runtime(checkable.cache_dir.clone())?;
        let found = crate::preflight::check(&checkable, &runtime).await;
        let mut skipped = found.skipped;
        let (mut problems, pools) = match loaded {
            Ok(cfg) => {
                skipped.extend(cfg.pools.iter().filter_map(|p| p.shared_machine_note()));
                (
                    Vec::new(),
                    cfg.pools.iter().map(|p| p.name.clone()).collect(),
                )
            }
            Err(e) => (e.0, Vec::new()),
        };
        problems.extend(found.problems);
        crate::config::sort_problems(&mut problems);
        if problems.is_empty() {
            if json {
                print_json(&json!({ "ok": true, "pools": pools, "skipped": skipped }))?;
            } else {
                for note in &skipped {
                    println!("note: {note}");
                }
                println!("{}: OK ({} pools)", config.display(), pools.len());
            }
            return Ok(());
        }
        if json {
            print_json(&json!({ "ok": false, "problems": problems }))?;
        } else {
            for p in &problems {
                eprintln!("{p}");
            }
            eprintln!("{} problem(s) found", problems.len());
        }
        Err(Reported(format!(
            "{} problem(s) in {}",
            problems.len(),
            config.display()
        ))
        .into())
    }
}
