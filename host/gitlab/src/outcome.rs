//! How a stage ends (`Outcome`, and its exit code for the runner), and the job log's lines:
//! the leaf every stage and both modes report through.

use std::io::Write;

use crate::job::Job;

/// How a stage ended, for the process's exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0.
    Success,
    /// The job failed with this exit code (`BUILD_FAILURE_EXIT_CODE`).
    BuildFailure(i64),
    /// The infrastructure failed (`SYSTEM_FAILURE_EXIT_CODE`); the message says why.
    SystemFailure(String),
}

impl Outcome {
    /// The exit code for the runner, writing `BUILD_EXIT_CODE_FILE` for a job failure.
    pub fn exit_code(&self, job: Option<&Job>) -> i32 {
        let (build, system) = job.map_or((1, 2), |j| (j.build_failure, j.system_failure));
        match self {
            Outcome::Success => 0,
            Outcome::BuildFailure(code) => {
                if let Some(file) = job.and_then(|j| j.build_exit_code_file.as_ref()) {
                    // The runner then reports the job's own code (allow_failure:exit_codes).
                    if let Err(e) = std::fs::write(file, format!("{code}\n")) {
                        eprintln!("flotilla: cannot write {}: {e}", file.display());
                    }
                }
                build
            }
            Outcome::SystemFailure(_) => system,
        }
    }
}

pub(crate) fn system(what: impl std::fmt::Display) -> Outcome {
    Outcome::SystemFailure(what.to_string())
}

/// Prints one line to the job log (the runner shows prepare and run output to the user).
pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (the runner went away) leaves nothing useful to do with the error.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
