//! `flotilla simulate`: the real scaler on virtual time against a simulated cloud, fed by a
//! CSV job trace, with several configurations compared side by side. The trace reader and the
//! table and chart are the what-if crate's (`flotilla_tune::trace`, `timeline`), which
//! `tune` uses too; this module runs each configuration file's pools.

use std::path::PathBuf;

use crate::config;
use flotilla_scaler::sim::{Job, SimCloud, SimOptions, SimPool, simulate, simulate_with_fallback};
use flotilla_tune::timeline::Run;
use flotilla_tune::trace::DEFAULT_START_MS;

/// Simulates every pool of every config file on the trace. The clouds of pools that name a
/// `fallback` are out of capacity during `stockouts` (ms from the trace start); each such
/// pool is simulated alone, and then with its fallback (`file:pool+fallback`), which takes
/// its waiting jobs while it cannot grow.
pub fn run_all(
    configs: &[PathBuf],
    jobs: &[Job],
    cloud: &SimCloud,
    stockouts: &[(u64, u64)],
    samples: usize,
    start_at: Option<u64>,
) -> Result<Vec<Run>, String> {
    let mut runs = Vec::new();
    let opts = SimOptions {
        check_invariants: false,
        samples,
        start_at: start_at.unwrap_or(DEFAULT_START_MS),
    };
    for path in configs {
        let cfg = config::load_with(path, false).map_err(|e| e.to_string())?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        for pool in &cfg.pools {
            let fallback = pool
                .fallback
                .as_ref()
                .and_then(|name| cfg.pools.iter().find(|p| &p.name == name));
            let own = SimCloud {
                stockouts: if fallback.is_some() {
                    stockouts.to_vec()
                } else {
                    Vec::new()
                },
                ..cloud.clone()
            };
            let (report, samples) = simulate(&pool.scaler, &pool.policies, &own, jobs, &opts);
            runs.push(Run {
                name: format!("{stem}:{}", pool.name),
                report,
                samples,
            });
            if let Some(fallback) = fallback {
                let behind = SimCloud {
                    seed: cloud.seed.wrapping_add(1),
                    ..cloud.clone()
                };
                let (report, samples) = simulate_with_fallback(
                    SimPool {
                        cfg: &pool.scaler,
                        policies: &pool.policies,
                        cloud: &own,
                    },
                    SimPool {
                        cfg: &fallback.scaler,
                        policies: &fallback.policies,
                        cloud: &behind,
                    },
                    jobs,
                    &opts,
                );
                runs.push(Run {
                    name: format!("{stem}:{}+{}", pool.name, fallback.name),
                    report,
                    samples,
                });
            }
        }
    }
    Ok(runs)
}
