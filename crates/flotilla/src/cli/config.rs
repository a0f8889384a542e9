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
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<()> {
        let ConfigCommand::Check { config, json } = self;
        match crate::config::load(&config) {
            Ok(cfg) => {
                if json {
                    let pools: Vec<&str> = cfg.pools.iter().map(|p| p.name.as_str()).collect();
                    print_json(&json!({ "ok": true, "pools": pools }))?;
                } else {
                    println!("{}: OK ({} pools)", config.display(), cfg.pools.len());
                }
                Ok(())
            }
            Err(e) => {
                if json {
                    print_json(&json!({ "ok": false, "problems": e.0 }))?;
                } else {
                    eprintln!("{e}");
                    eprintln!("{} problem(s) found", e.0.len());
                }
                Err(Reported(format!("{} problem(s) in {}", e.0.len(), config.display())).into())
            }
        }
    }
}
