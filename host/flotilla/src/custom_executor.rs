//! The `[runners.custom]` table that makes GitLab Runner run its jobs through
//! `flotilla gitlab`, and the path it should run: written by `flotilla gitlab snippet` and by
//! `flotilla migrate`, so both say the same.

use std::time::Duration;

/// The `[runners.custom]` table of a runner that runs its jobs through `flotilla gitlab`: each
/// stage calls `exe` with the driver's `args` and the stage's name.
pub fn custom_section(
    exe: &str,
    args: &[String],
    acquire_timeout: Duration,
) -> anyhow::Result<String> {
    let stage = |stage: &str| -> anyhow::Result<String> {
        let mut all = args.to_vec();
        all.push(stage.into());
        Ok(serde_json::to_string(&all)?)
    };
    let exe = serde_json::to_string(exe)?;
    // prepare waits for an instance, then pulls: give it the acquire timeout plus 30 min.
    let prepare_timeout = acquire_timeout.as_secs() + 1800;
    Ok(format!(
        r#"  [runners.custom]
    config_exec = {exe}
    config_args = {config}
    prepare_exec = {exe}
    prepare_args = {prepare}
    prepare_exec_timeout = {prepare_timeout}
    run_exec = {exe}
    run_args = {run}
    cleanup_exec = {exe}
    cleanup_args = {cleanup}
    cleanup_exec_timeout = 600
    graceful_kill_timeout = 30
    force_kill_timeout = 30
"#,
        config = stage("config")?,
        prepare = stage("prepare")?,
        run = stage("run")?,
        cleanup = stage("cleanup")?,
    ))
}

/// The path GitLab Runner should run: this executable, unless it sits in a cargo build
/// directory (a `CACHEDIR.TAG` above it), which a rebuild or `cargo clean` replaces; then the
/// `flotilla` on PATH, or `/usr/local/bin/flotilla`, with a warning to install it.
pub fn driver_exe() -> String {
    let fallback = "/usr/local/bin/flotilla".to_string();
    let Ok(exe) = std::env::current_exe() else {
        return fallback;
    };
    let in_build_dir = exe
        .ancestors()
        .skip(1)
        .any(|d| d.join("CACHEDIR.TAG").is_file());
    if !in_build_dir {
        return exe.display().to_string();
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("flotilla"))
            .find(|f| {
                f.is_file()
                    && !f
                        .ancestors()
                        .skip(1)
                        .any(|d| d.join("CACHEDIR.TAG").is_file())
            })
    });
    match on_path {
        Some(installed) => installed.display().to_string(),
        None => {
            eprintln!(
                "warning: this flotilla runs from a build directory ({}); install it (scripts/install.sh) where the runner can run it. The block names {fallback}.",
                exe.display()
            );
            fallback
        }
    }
}
