//! Instance mode's settings: the machines' system, the runner's shell, and where each job's
//! files live on the machine (its directory, builds directory, the machine's cache), with the
//! path rules of each system.

use crate::setting::SettingError;

/// The operating system a pool's machines run, which decides paths, shell and commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineOs {
    /// Linux.
    Linux,
    /// macOS (`darwin` in `connect-info`).
    Macos,
    /// FreeBSD.
    Freebsd,
    /// Windows with OpenSSH for Windows.
    Windows,
}

impl MachineOs {
    /// Every system's name, as [`MachineOs::name`] spells it.
    pub const NAMES: &'static [&'static str] = &["linux", "macos", "freebsd", "windows"];

    /// Parses `linux`, `macos` (or `darwin`), `freebsd` or `windows`.
    pub fn parse(text: &str) -> Result<MachineOs, SettingError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "linux" => Ok(MachineOs::Linux),
            "macos" | "darwin" => Ok(MachineOs::Macos),
            "freebsd" => Ok(MachineOs::Freebsd),
            "windows" => Ok(MachineOs::Windows),
            other => Err(SettingError::new(
                "--os",
                other,
                "expected linux, macos, freebsd or windows",
            )),
        }
    }

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            MachineOs::Linux => "linux",
            MachineOs::Macos => "macos",
            MachineOs::Freebsd => "freebsd",
            MachineOs::Windows => "windows",
        }
    }

    /// Whether `connect-info`'s `os` (`linux`, `darwin`, `windows`, `freebsd`) is this one.
    pub fn matches(self, reported: &str) -> bool {
        MachineOs::parse(reported).is_ok_and(|os| os == self)
    }

    /// The shell GitLab Runner writes scripts for by default on this system.
    pub fn default_shell(self) -> Shell {
        match self {
            MachineOs::Windows => Shell::Pwsh,
            _ => Shell::Bash,
        }
    }

    /// Where jobs' directories go by default: `/var/tmp/flotilla` (kept across reboots, unlike
    /// `/tmp` on many systems, and writable by any login user), or `C:\flotilla`.
    pub fn default_dir(self) -> &'static str {
        match self {
            MachineOs::Windows => r"C:\flotilla",
            _ => "/var/tmp/flotilla",
        }
    }

    pub(super) fn windows(self) -> bool {
        self == MachineOs::Windows
    }
}

/// The shell the runner writes the job's scripts for (`shell` in the `config` answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shell {
    /// `bash`, run as a login shell (as GitLab's SSH and shell executors do), so the
    /// machine's profile sets `PATH` (Homebrew on macOS).
    Bash,
    /// PowerShell 7 (`pwsh`).
    Pwsh,
    /// Windows PowerShell 5.1 (`powershell`).
    Powershell,
}

impl Shell {
    /// Every shell's name, as [`Shell::name`] spells it.
    pub const NAMES: &'static [&'static str] = &["bash", "pwsh", "powershell"];

    /// Parses `bash`, `pwsh` or `powershell`.
    pub fn parse(text: &str) -> Result<Shell, SettingError> {
        match text.trim() {
            "bash" => Ok(Shell::Bash),
            "pwsh" => Ok(Shell::Pwsh),
            "powershell" => Ok(Shell::Powershell),
            other => Err(SettingError::new(
                "--shell",
                other,
                "expected bash, pwsh or powershell",
            )),
        }
    }

    /// Its name, as GitLab Runner's `shell` setting spells it.
    pub fn name(self) -> &'static str {
        match self {
            Shell::Bash => "bash",
            Shell::Pwsh => "pwsh",
            Shell::Powershell => "powershell",
        }
    }

    /// The script file's extension (the runner's Custom executor writes `.ps1` for
    /// PowerShell, with a byte-order mark, and runs it with `-File`).
    pub(super) fn extension(self) -> &'static str {
        match self {
            Shell::Bash => "sh",
            Shell::Pwsh | Shell::Powershell => "ps1",
        }
    }
}

/// The instance-mode settings of the driver: the machines' system, the runner's shell, and
/// the directory on each machine under which every job gets its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSettings {
    /// The machines' system.
    pub os: MachineOs,
    /// The shell the runner writes scripts for.
    pub shell: Shell,
    /// The directory of jobs on the machine (absolute).
    pub dir: String,
    /// The operator's unsafe opt-out (`--unsafe-share-machines-across-projects`): machines
    /// take jobs of any project and protection, one after another.
    pub shared_across_projects: bool,
}

/// Signals a sweep sends the job's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Ask them to stop (Unix `TERM`; on Windows the tree is ended at once: there is no
    /// console equivalent that reaches every process).
    Term,
    /// Stop them (`KILL`; `taskkill /T /F`).
    Kill,
}

impl InstanceSettings {
    /// Settings for `os` with its default shell and directory, unless given.
    pub fn new(
        os: MachineOs,
        shell: Option<Shell>,
        dir: Option<String>,
    ) -> Result<Self, SettingError> {
        let shell = shell.unwrap_or_else(|| os.default_shell());
        let dir = dir.unwrap_or_else(|| os.default_dir().to_string());
        let absolute = if os.windows() {
            let b = dir.as_bytes();
            (b.len() >= 3
                && b.first().is_some_and(u8::is_ascii_alphabetic)
                && b.get(1) == Some(&b':')
                && matches!(b.get(2), Some(b'\\' | b'/')))
                || dir.starts_with(r"\\")
        } else {
            dir.starts_with('/')
        };
        if !absolute {
            return Err(SettingError::new(
                "--machine-dir",
                &dir,
                format!("must be an absolute path on the machine ({})", os.name()),
            ));
        }
        if dir.contains(['\0', '\n', '\r']) {
            return Err(SettingError::new(
                "--machine-dir",
                &dir,
                "control characters",
            ));
        }
        if shell == Shell::Bash && os.windows() {
            return Err(SettingError::new(
                "--shell",
                "bash",
                "on Windows machines, use pwsh or powershell",
            ));
        }
        if shell != Shell::Bash && !os.windows() {
            return Err(SettingError::new(
                "--shell",
                shell.name(),
                format!("on {} machines, use bash", os.name()),
            ));
        }
        let dir = dir.trim_end_matches(['/', '\\']).to_string();
        Ok(InstanceSettings {
            os,
            shell,
            dir,
            shared_across_projects: false,
        })
    }

    /// The tenant a job's lease names: its project and protection, so a machine that ran a
    /// job of one never runs a job of another (they share the login user, its files and its
    /// processes); `None` with the operator's unsafe opt-out.
    pub fn tenant(&self, project: &str, protected: bool) -> Option<String> {
        (!self.shared_across_projects).then(|| {
            let project = crate::job::name_part(project, 64, "unknown");
            let kind = if protected { "-protected" } else { "" };
            format!("project-{project}{kind}")
        })
    }

    pub(super) fn sep(&self) -> char {
        if self.os.windows() { '\\' } else { '/' }
    }

    pub(super) fn join(&self, parts: &[&str]) -> String {
        let mut out = self.dir.clone();
        for part in parts {
            out.push(self.sep());
            out.push_str(part);
        }
        out
    }

    /// The job's own directory (its id is digits, checked when the job is read).
    pub fn job_dir(&self, job: &str) -> String {
        self.join(&[job])
    }

    /// The job's own `HOME` (Unix): stages run with it, so the login user's profile and
    /// dotfiles, which an earlier job could have written, are never read by a later job.
    pub fn home_dir(&self, job: &str) -> String {
        self.join(&[job, "home"])
    }

    /// The runner's `builds_dir`: inside the job's directory, so jobs sharing a machine never
    /// share a checkout.
    pub fn builds_dir(&self, job: &str) -> String {
        self.join(&[job, "builds"])
    }

    /// The runner's `cache_dir`: one per project and protection on the machine, kept across
    /// its jobs, as Docker mode's cache volumes are. A fork's job (unprotected) never writes
    /// where a protected branch's job restores from, and projects never share one.
    pub fn cache_dir(&self, project: &str, protected: bool) -> String {
        let project = crate::job::name_part(project, 64, "unknown");
        let kind = if protected { "-protected" } else { "" };
        self.join(&["cache", &format!("project-{project}{kind}")])
    }

    /// The mark every process of the job carries (`FLOTILLA_JOB=<mark>`); the `;` ends it, so
    /// job 12's mark is not a prefix of job 123's.
    pub fn mark(job: &str) -> String {
        format!("job-{job};")
    }

    /// Where a stage's script goes, relative to the job's directory.
    pub(super) fn script_name(&self, run: &str) -> String {
        format!(".flotilla{}{run}.{}", self.sep(), self.shell.extension())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_refuse_relative_dirs_and_the_wrong_shell() {
        for (os, shell, dir) in [
            (MachineOs::Linux, None, Some("builds")),
            (MachineOs::Windows, None, Some("/var/tmp")),
            (MachineOs::Linux, Some(Shell::Pwsh), None),
            (MachineOs::Windows, Some(Shell::Bash), None),
            (MachineOs::Macos, None, Some("/tmp/a\nb")),
        ] {
            let got = InstanceSettings::new(os, shell, dir.map(str::to_string));
            assert!(got.is_err(), "{os:?} {shell:?} {dir:?}");
        }
        let mac = InstanceSettings::new(MachineOs::Macos, None, Some("/Users/ci/flotilla/".into()))
            .expect("mac");
        assert_eq!(mac.builds_dir("9"), "/Users/ci/flotilla/9/builds");
        assert!(MachineOs::Macos.matches("darwin"));
        assert!(!MachineOs::Linux.matches("windows"));
    }

    #[test]
    fn a_mark_is_never_the_prefix_of_another_jobs() {
        let a = format!("FLOTILLA_JOB={}", InstanceSettings::mark("12"));
        let b = format!("FLOTILLA_JOB={}", InstanceSettings::mark("123"));
        assert!(!b.starts_with(&a));
    }
}
