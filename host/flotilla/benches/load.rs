//! The load harness's command line: N synthetic GitLab jobs, each run stage by stage through
//! this build's `flotilla-gitlab`, against this build's `flotilla run` (see
//! `flotilla_harness::load`). It prints one Markdown report per run; `docs/scaling-out.md`
//! holds the figures.
//!
//! ```text
//! cargo bench -p flotilla --bench load -- [--jobs N]... [--engine dockerd|fake]
//!     [--poisson RATE] [--machines M] [--capacity C] [--script-time SECONDS]
//!     [--plugin static|gcp] [--get-latency MS] [--driver lean|full|PATH] [--flotilla PATH]
//!     [--managers M]
//! ```
//!
//! Several `--jobs` run one after another, each on fresh machines, engine and host. A real
//! `dockerd` needs root; the fake engine does not. `--plugin gcp` runs the pool on the GCP
//! plugin against the Compute stand-in, whose `instances.get` (the plugin's `connect-info`)
//! answers after `--get-latency` milliseconds (default 0). The runner manager's driver is
//! `flotilla-gitlab` (`--driver lean`, the default), `flotilla gitlab` (`--driver full`), or a
//! lean driver built elsewhere (`--driver PATH`: the static musl release binary, as shipped).
//! `--flotilla PATH` runs another build of the host, such as the shipped static musl binary.
//! The stage processes are spawned by `--managers` runner-manager processes of this program
//! (default: one per 100 jobs, as the deployment the harness models runs them), each started
//! as `load --manager SPEC` with its share of the jobs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // bench code

use std::time::Duration;

use flotilla_harness::load::{self, Arrivals, Driver, Engine, Options, Plugin};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, spec] = args.as_slice()
        && flag == "--manager"
    {
        // A manager's work is spawning, reading pipes and reaping: one thread.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        match rt.block_on(load::manager(std::path::Path::new(spec))) {
            Ok(report) => println!("{report}"),
            Err(why) => {
                eprintln!("manager: {why}");
                std::process::exit(2);
            }
        }
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let value = |name: &str| -> Vec<String> {
        args.windows(2)
            .filter(|w| w[0] == name)
            .map(|w| w[1].clone())
            .collect()
    };
    let one = |name: &str| value(name).pop();
    let jobs: Vec<usize> = value("--jobs")
        .iter()
        .map(|j| j.parse().expect("--jobs N"))
        .collect();
    let jobs = if jobs.is_empty() { vec![10] } else { jobs };
    let engine = match one("--engine").as_deref() {
        Some("dockerd") => Engine::Dockerd,
        None | Some("fake") => Engine::Fake,
        Some(other) => panic!("--engine dockerd or fake, not {other}"),
    };
    let latency = Duration::from_millis(
        one("--get-latency").map_or(0, |ms| ms.parse().expect("--get-latency MS")),
    );
    let plugin = match one("--plugin").as_deref() {
        None | Some("static") => Plugin::Static,
        Some("gcp") => Plugin::Gcp(latency),
        Some(other) => panic!("--plugin static or gcp, not {other}"),
    };
    for n in jobs {
        let host = one("--flotilla").unwrap_or_else(|| env!("CARGO_BIN_EXE_flotilla").into());
        let mut o = Options::new(std::path::Path::new(&host), n, engine);
        o.plugin = plugin;
        o.driver = match one("--driver").as_deref() {
            None | Some("lean") => Driver::Lean,
            Some("full") => Driver::Full,
            Some(path) if path.contains('/') => Driver::At(path.into()),
            Some(other) => panic!("--driver lean, full or a path, not {other}"),
        };
        if let Some(rate) = one("--poisson") {
            o.arrivals = Arrivals::Poisson(rate.parse().expect("--poisson RATE"));
        }
        if let Some(m) = one("--machines") {
            o.machines = m.parse().expect("--machines M");
            o.capacity = u32::try_from(n.div_ceil(o.machines))
                .expect("capacity")
                .max(1);
        }
        if let Some(c) = one("--capacity") {
            o.capacity = c.parse().expect("--capacity C");
        }
        if let Some(m) = one("--managers") {
            o.managers = m.parse().expect("--managers M");
        }
        if let Some(s) = one("--script-time") {
            o.script_time = Duration::from_secs_f64(s.parse().expect("--script-time SECONDS"));
        }
        if one("--flotilla").is_some() {
            println!("The host: {host}\n");
        }
        let report = rt.block_on(load::run(&o));
        println!("{}", report.markdown());
    }
}
