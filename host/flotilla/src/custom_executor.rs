//! The `[runners.custom]` table that makes GitLab Runner run its jobs through the driver, and
//! the command it should run: written by `flotilla gitlab snippet` and by `flotilla migrate`,
//! so both say the same.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The lean driver's file name (`flotilla-gitlab`, `.exe` on Windows): the runner's stages
/// start it, not the full `flotilla`.
pub fn lean_name() -> String {
    format!("flotilla-gitlab{}", std::env::consts::EXE_SUFFIX)
}

/// What GitLab Runner runs for each stage: a program, and the arguments before the driver's
/// flags (`gitlab` when the program is the full `flotilla`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverCommand {
    /// The program's path.
    pub exe: String,
    /// The arguments before the driver's own.
    pub first: Vec<String>,
}

impl DriverCommand {
    /// The lean `flotilla-gitlab` at `path`.
    pub fn lean(path: &Path) -> DriverCommand {
        DriverCommand {
            exe: path.display().to_string(),
            first: Vec::new(),
        }
    }

    /// `flotilla gitlab` at `path`: an install without the lean binary.
    pub fn full(path: &Path) -> DriverCommand {
        DriverCommand {
            exe: path.display().to_string(),
            first: vec!["gitlab".into()],
        }
    }
}

/// The `[runners.custom]` table of a runner that runs its jobs through the driver: each
/// stage calls `driver` with the driver's `args` and the stage's name.
pub fn custom_section(
    driver: &DriverCommand,
    args: &[String],
    acquire_timeout: Duration,
) -> anyhow::Result<String> {
    let stage = |stage: &str| -> anyhow::Result<String> {
        let mut all = driver.first.clone();
        all.extend_from_slice(args);
        all.push(stage.into());
        Ok(serde_json::to_string(&all)?)
    };
    let exe = serde_json::to_string(&driver.exe)?;
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

/// Whether `file` sits in a cargo build directory (a `CACHEDIR.TAG` above it), which a
/// rebuild or `cargo clean` replaces.
fn in_build_dir(file: &Path) -> bool {
    file.ancestors()
        .skip(1)
        .any(|d| d.join("CACHEDIR.TAG").is_file())
}

/// The first installed `name` on PATH (not in a build directory).
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|f| f.is_file() && !in_build_dir(f))
}

/// The command GitLab Runner should run: the lean `flotilla-gitlab` that is this executable or
/// sits beside it, else this `flotilla` with `gitlab` (an install without the lean binary).
/// A build directory's binaries are never named: then the installed `flotilla-gitlab` on
/// PATH, or `flotilla`, or `/usr/local/bin/flotilla-gitlab` (`C:\flotilla\flotilla-gitlab.exe`
/// on Windows) with a warning to install it.
pub fn driver_exe() -> DriverCommand {
    // Where the install script puts it; on Windows, where the Windows page does.
    let fallback = PathBuf::from(if cfg!(windows) {
        r"C:\flotilla\flotilla-gitlab.exe"
    } else {
        "/usr/local/bin/flotilla-gitlab"
    });
    let Ok(exe) = std::env::current_exe() else {
        return DriverCommand::lean(&fallback);
    };
    if !in_build_dir(&exe) {
        let lean = exe.with_file_name(lean_name());
        return if exe == lean || lean.is_file() {
            DriverCommand::lean(&lean)
        } else {
            DriverCommand::full(&exe)
        };
    }
    if let Some(lean) = on_path(&lean_name()) {
        return DriverCommand::lean(&lean);
    }
    let full = format!("flotilla{}", std::env::consts::EXE_SUFFIX);
    if let Some(full) = on_path(&full) {
        return DriverCommand::full(&full);
    }
    eprintln!(
        "warning: this driver runs from a build directory ({}); install it (scripts/install.sh) where the runner can run it. The block names {}.",
        exe.display(),
        fallback.display()
    );
    DriverCommand::lean(&fallback)
}
