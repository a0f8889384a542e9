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
