//! Logging to standard error, the same for every `flotilla` command and for the lean
//! `flotilla-gitlab` driver: text, or JSON lines with `--log-json`; `FLOTILLA_LOG` filters.

/// Sets up the process's logger: warnings only when `quiet` (a GitLab stage, whose stderr is
/// the job's log), unless `FLOTILLA_LOG` says otherwise.
pub fn init(json: bool, quiet: bool) {
    // The GitLab driver's stderr is the job's log, and `config check` prints its verdict: only
    // warnings unless asked.
    let default = if quiet { "warn" } else { "info" };
    let spec = std::env::var("FLOTILLA_LOG").unwrap_or_else(|_| default.to_string());
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
        // One object per line: the event's fields at the top level, and the pool's span
        // (`span.pool`, `span.plugin_digest`) on every line logged inside a pool.
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        builder.init();
    }
}

/// The lean driver's logger (`flotilla-gitlab`): as [`init`] for a GitLab stage, warnings
/// only unless `FLOTILLA_LOG` says otherwise, but with `FLOTILLA_LOG` read as comma-separated
/// `target=level` directives and a bare default level (`tracing_subscriber`'s `Targets`), not
/// as an `EnvFilter`. An `EnvFilter` links the regex engine into the driver, and with it the
/// Unicode tables of `regex-syntax`, pointer tables the static-PIE binary relocates, page by
/// page, at every start: hundreds of starts a second on a busy runner manager. A spec that is
/// not such a list (span or field directives) leaves the default, with one warning saying so.
pub fn init_driver(json: bool) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let default = || Targets::new().with_default(LevelFilter::WARN);
    let spec = std::env::var("FLOTILLA_LOG").ok();
    let (targets, refused) = match spec.as_deref().map(str::parse::<Targets>) {
        None => (default(), None),
        Some(Ok(targets)) => (targets, None),
        Some(Err(e)) => (default(), Some(e)),
    };
    // rustls' platform verifier logs each rejected certificate itself; the driver reports it once.
    let targets = if spec
        .as_deref()
        .is_some_and(|s| s.contains("rustls_platform_verifier"))
    {
        targets
    } else {
        targets.with_target("rustls_platform_verifier", LevelFilter::OFF)
    };
    let registry = tracing_subscriber::registry().with(targets);
    let writer = std::io::stderr;
    if json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(writer),
            )
            .init();
    } else {
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(writer),
            )
            .init();
    }
    if let (Some(e), Some(spec)) = (refused, spec) {
        tracing::warn!(
            "FLOTILLA_LOG={spec:?}: {e}; the driver takes target=level directives and a default level (\"info,flotilla_gitlab=debug\"), and logs warnings"
        );
    }
}
