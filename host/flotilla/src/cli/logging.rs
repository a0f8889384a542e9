//! Logging to standard error, the same for every `flotilla` command and for the lean
//! `flotilla-gitlab` driver: text, or JSON lines with `--log-json`; `FLOTILLA_LOG` filters.

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Sets up the process's logger: warnings only when `quiet` (a GitLab stage, whose stderr is
/// the job's log), unless `FLOTILLA_LOG` says otherwise.
pub fn init(json: bool, quiet: bool) {
    // The GitLab driver's stderr is the job's log, and `config check` prints its verdict: only
    // warnings unless asked.
    let default = if quiet { "warn" } else { "info" };
    let spec = std::env::var("FLOTILLA_LOG").unwrap_or_else(|_| default.to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(verifier_off(&spec)).unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,rustls_platform_verifier=off")
    });
    install(filter, json);
}

/// The lean driver's logger (`flotilla-gitlab`): as [`init`] for a GitLab stage, warnings
/// only unless `FLOTILLA_LOG` says otherwise, but with `FLOTILLA_LOG` read as comma-separated
/// `target=level` directives and a bare default level (`tracing_subscriber`'s `Targets`), not
/// as an `EnvFilter`. An `EnvFilter` links the regex engine into the driver, and with it the
/// Unicode tables of `regex-syntax`, pointer tables the static-PIE binary relocates, page by
/// page, at every start: hundreds of starts a second on a busy runner manager. A spec that is
/// not such a list (a span directive with field values) leaves the default, with one warning
/// saying so; a bare `[span]` parses as a target name and matches nothing.
pub fn init_driver(json: bool) {
    let spec = std::env::var("FLOTILLA_LOG").ok();
    let parsed = spec.as_deref().map(|s| verifier_off(s).parse::<Targets>());
    let (targets, refused) = match parsed {
        Some(Ok(targets)) => (targets, None),
        other => (
            Targets::new()
                .with_default(LevelFilter::WARN)
                .with_target("rustls_platform_verifier", LevelFilter::OFF),
            other.and_then(Result::err),
        ),
    };
    install(targets, json);
    if let (Some(e), Some(spec)) = (refused, spec) {
        tracing::warn!(
            "FLOTILLA_LOG={spec:?}: {e}; the driver takes target=level directives and a default level (\"info,flotilla_gitlab=debug\"), and logs warnings"
        );
    }
}

/// `spec` with rustls' platform verifier silenced, unless it names it: the verifier logs each
/// rejected certificate itself, and flotilla reports it once.
fn verifier_off(spec: &str) -> String {
    if spec.contains("rustls_platform_verifier") {
        spec.to_string()
    } else {
        format!("{spec},rustls_platform_verifier=off")
    }
}

/// Installs `filter` and, on standard error, text or (`json`) one object per line: the event's
/// fields at the top level, and the pool's span (`span.pool`, `span.plugin_digest`) on every
/// line logged inside a pool.
fn install<F>(filter: F, json: bool)
where
    F: tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
{
    let registry = tracing_subscriber::registry().with(filter);
    if json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            )
            .init();
    } else {
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(std::io::stderr),
            )
            .init();
    }
}
