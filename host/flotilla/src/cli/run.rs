//! `flotilla run -c CONFIG`.

use std::path::PathBuf;

/// Run the autoscaler: every pool, the lease API, metrics and health endpoints.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The configuration file.
    #[arg(short, long)]
    pub config: PathBuf,
}

impl Args {
    /// Runs until SIGTERM or Ctrl-C, then drains.
    pub async fn run(self) -> anyhow::Result<()> {
        crate::app::run(self.config).await
    }
}
