//! Instance mode's commands, as text for the machine's SSH server: where the job's files live,
//! and how to make its directory, upload and run a stage's script, stop the job's processes
//! and remove what it left, on Unix (Linux, macOS, FreeBSD: POSIX `sh`) and on Windows
//! (OpenSSH for Windows: PowerShell, whatever the server's default shell is).
//!
//! Pure text, no I/O, so every quoting rule is tested here. Each command is one line the
//! login user's shell receives:
//! - Unix: `exec /bin/sh -c '<script>'`. A Bourne-style login shell (sh, dash, bash, zsh,
//!   ksh) runs that line the same way (csh and tcsh do not take a newline inside quotes: give
//!   the login user a Bourne-style shell), and `exec` keeps the session leader's pid, so `$$`
//!   is the process group every process of the stage starts in.
//! - Windows: `powershell -NoProfile -NonInteractive -EncodedCommand <base64 UTF-16LE>`,
//!   which `cmd.exe` (the default shell of OpenSSH for Windows) and PowerShell both start
//!   as is: the script never meets either's quoting.
//!
//! Every process of a job carries `FLOTILLA_JOB=<mark>` in its environment, so a sweep finds
//! the ones that left the stage's process group (`setsid`, daemons) on Linux, where
//! `/proc/<pid>/environ` shows it.

use crate::detached::RunFiles;
pub use crate::detached::sh_quote;
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

    fn windows(self) -> bool {
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
    fn extension(self) -> &'static str {
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
        Ok(InstanceSettings { os, shell, dir })
    }

    fn sep(&self) -> char {
        if self.os.windows() { '\\' } else { '/' }
    }

    fn join(&self, parts: &[&str]) -> String {
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

    /// The runner's `builds_dir`: inside the job's directory, so jobs sharing a machine never
    /// share a checkout.
    pub fn builds_dir(&self, job: &str) -> String {
        self.join(&[job, "builds"])
    }

    /// The runner's `cache_dir`: one per machine, kept across its jobs (the runner keys it
    /// by project inside).
    pub fn cache_dir(&self) -> String {
        self.join(&["cache"])
    }

    /// The mark every process of the job carries (`FLOTILLA_JOB=<mark>`); the `;` ends it, so
    /// job 12's mark is not a prefix of job 123's.
    pub fn mark(job: &str) -> String {
        format!("job-{job};")
    }

    /// Where a stage's script goes, relative to the job's directory.
    fn script_name(&self, run: &str) -> String {
        format!(".flotilla{}{run}.{}", self.sep(), self.shell.extension())
    }

    /// Makes the job's directory from a clean slate: stops what an earlier try left running,
    /// removes its files (read-only directories too, as Go's module cache leaves them), then
    /// creates `builds`, `.flotilla` (0700 on Unix) and the machine's cache.
    pub fn prepare_command(&self, job: &str) -> String {
        if self.os.windows() {
            let job_dir = ps_quote(&self.job_dir(job));
            // The sweep runs before errors stop the script: a process already gone is normal.
            let body = format!(
                "{sweep}\n$ErrorActionPreference = 'Stop'\nif (Test-Path -LiteralPath {job_dir}) {{ Remove-Item -LiteralPath {job_dir} -Recurse -Force }}\nNew-Item -ItemType Directory -Force -Path {builds}, {own}, {cache} | Out-Null\n",
                sweep = self.windows_sweep(job),
                builds = ps_quote(&self.builds_dir(job)),
                own = ps_quote(&self.join(&[job, ".flotilla"])),
                cache = ps_quote(&self.cache_dir()),
            );
            return powershell(&body);
        }
        let body = format!(
            "{sweep}\numask 077\nchmod -R u+w -- {job_dir} 2>/dev/null\nrm -rf -- {job_dir}\nmkdir -p -- {builds} {own} {cache}\n",
            sweep = self.unix_sweep(job, Signal::Kill),
            job_dir = sh_quote(&self.job_dir(job)),
            builds = sh_quote(&self.builds_dir(job)),
            own = sh_quote(&self.join(&[job, ".flotilla"])),
            cache = sh_quote(&self.cache_dir()),
        );
        unix(&body)
    }

    /// One command per stage (each SSH channel costs a session on the machine): writes
    /// standard input to the stage's script file in the job's directory (only the login user
    /// can read it: it holds the job's variables), writes the stage's process group id
    /// (Unix) or process id (Windows) beside it for a later stop, prints the
    /// [start marker](crate::detached::start_marker), then runs the script there with the runner's
    /// shell, standard input closed. The exit status is the script's; a setup failure ends
    /// before the marker.
    pub fn run_command(&self, job: &str, run: &str, len: usize) -> String {
        let script = self.script_name(run);
        let mark = Self::mark(job);
        let marker = crate::detached::start_marker(run);
        if self.os.windows() {
            let exe = match self.shell {
                Shell::Powershell => "powershell.exe",
                _ => "pwsh.exe",
            };
            // .NET resolves relative paths against the process's directory, which
            // Set-Location does not move: every path is absolute, and the process's directory
            // is set too, for the script's own process.
            let body = format!(
                "$ErrorActionPreference = 'Stop'\n\
                 if (-not (Get-Command {exe} -ErrorAction SilentlyContinue)) {{ [Console]::Error.WriteLine('flotilla: {exe} is not installed on the machine (--shell)'); exit 1 }}\n\
                 Set-Location -LiteralPath {dir}\n\
                 [Environment]::CurrentDirectory = {dir}\n\
                 $in = [Console]::OpenStandardInput()\n\
                 $out = [IO.File]::Open({script}, [IO.FileMode]::CreateNew)\n\
                 try {{ $in.CopyTo($out) }} finally {{ $out.Close() }}\n\
                 $got = (Get-Item -LiteralPath {script}).Length\n\
                 if ($got -ne {len}) {{ Remove-Item -LiteralPath {script}; [Console]::Error.WriteLine(\"flotilla: the script arrived cut: $got of {len} bytes\"); exit 1 }}\n\
                 Set-Content -LiteralPath {pid} -Value $PID\n\
                 $env:FLOTILLA_JOB = {mark}\n\
                 $ErrorActionPreference = 'Continue'\n\
                 [Console]::Out.Write({marker})\n\
                 [Console]::Out.Flush()\n\
                 & {exe} -NoProfile -NonInteractive -ExecutionPolicy Bypass -File {script}\n\
                 $code = $LASTEXITCODE\n\
                 Remove-Item -LiteralPath {pid} -ErrorAction SilentlyContinue\n\
                 if ($null -eq $code) {{ exit 1 }}\n\
                 exit $code\n",
                dir = ps_quote(&self.job_dir(job)),
                mark = ps_quote(&mark),
                script = ps_quote(&self.join(&[job, &script])),
                pid = ps_quote(&self.join(&[job, ".flotilla", &format!("{run}.pid")])),
                marker = ps_quote(&marker),
            );
            return powershell(&body);
        }
        // Unix stages run detached: `start_command`.
        self.start_command(job, run, 0, len)
    }

    /// Whether a stage's script runs detached from the SSH channel, its output followed from a
    /// log on the machine, so that it rides through a restart of the host (Unix). On Windows
    /// the script's output comes straight over the channel ([`Self::run_command`]).
    pub fn detached(&self) -> bool {
        !self.os.windows()
    }

    /// Unix: starts the stage's script detached (once: a retried start only follows), then
    /// follows its log ([`crate::detached`]). Standard input is the script, written to the
    /// job's directory (only the login user can read it: it holds the job's variables); a
    /// script cut short in transit (the host went away mid-upload) is never started: its
    /// length must be the one sent, or the lock is given back for the next try. The script
    /// runs with the runner's shell in the job's directory, and it and every process it
    /// starts carry the job's mark. Sent again after a cut with `from` = the bytes printed so
    /// far, it starts nothing new and follows on from there.
    pub fn start_command(&self, job: &str, run: &str, from: u64, len: usize) -> String {
        let files = RunFiles::new(&self.join(&[job, ".flotilla"]), run);
        let place = format!(
            "(umask 077 && cat > \"$P.sh\") || {{ rmdir \"$P.d\"; exit 1; }}\n\
             got=$(wc -c < \"$P.sh\" | tr -d ' ')\n\
             if [ \"$got\" != {len} ]; then echo \"flotilla: the script arrived cut: $got of {len} bytes\" >&2; rm -f \"$P.sh\"; rmdir \"$P.d\"; exit 1; fi\n\
             FLOTILLA_JOB={mark}\n\
             export FLOTILLA_JOB",
            mark = sh_quote(&Self::mark(job)),
        );
        let body = format!(
            "cd {dir} || exit 1\n{start}",
            dir = sh_quote(&self.job_dir(job)),
            start = files.start(&place, "cat > /dev/null", "bash --login \"$P.sh\"", from),
        );
        unix(&body)
    }

    /// Waits up to `tenths` tenths of a second for every process of the job to end (after a
    /// `TERM`): Linux by the mark, elsewhere by the stages' process groups.
    pub fn wait_command(&self, job: &str, tenths: u32) -> String {
        if self.os.windows() {
            // taskkill /F ends the tree at once: nothing to wait for.
            return powershell("exit 0\n");
        }
        let body = format!(
            "i=0\n\
             while [ $i -lt {tenths} ]; do\n\
             a=0\n\
             if [ -d /proc/self ]; then grep -qsaF {mark} /proc/[0-9]*/environ 2>/dev/null && a=1\n\
             else for f in {own}/*.pgid; do [ -f \"$f\" ] && kill -0 -- \"-$(cat \"$f\")\" 2>/dev/null && a=1; done; fi\n\
             [ $a = 0 ] && exit 0\n\
             sleep 0.1; i=$((i + 1))\n\
             done\n",
            own = sh_quote(&self.join(&[job, ".flotilla"])),
            mark = sh_quote(&format!("FLOTILLA_JOB={}", Self::mark(job))),
        );
        unix(&body)
    }

    /// Sends `signal` to every process of the job: each stage's process group, and (Linux)
    /// any process whose environment carries the job's mark.
    pub fn stop_command(&self, job: &str, signal: Signal) -> String {
        if self.os.windows() {
            return powershell(&self.windows_sweep(job));
        }
        unix(&self.unix_sweep(job, signal))
    }

    /// Stops every process of the job (`TERM`, a second's grace, `KILL`) and removes its
    /// directory; the machine's cache stays.
    pub fn cleanup_command(&self, job: &str) -> String {
        if self.os.windows() {
            let body = format!(
                "{sweep}\nRemove-Item -LiteralPath {dir} -Recurse -Force -ErrorAction SilentlyContinue\nif (Test-Path -LiteralPath {dir}) {{ Start-Sleep -Seconds 1; Remove-Item -LiteralPath {dir} -Recurse -Force }}\n",
                sweep = self.windows_sweep(job),
                dir = ps_quote(&self.job_dir(job)),
            );
            return powershell(&body);
        }
        // What cannot be removed is reported, not failed on: the machine is not broken.
        let body = format!(
            "{term}\nsleep 1\n{kill}\nchmod -R u+w -- {dir} 2>/dev/null\nrm -rf -- {dir} 2>/dev/null || echo \"flotilla: could not remove all of \"{dir} >&2\ntrue\n",
            term = self.unix_sweep(job, Signal::Term),
            kill = self.unix_sweep(job, Signal::Kill),
            dir = sh_quote(&self.job_dir(job)),
        );
        unix(&body)
    }

    /// The exit code a job failure reports for a status the machine's SSH server sent:
    /// Windows' are 32-bit and signed (`exit -1` arrives as 4294967295).
    pub fn exit_code(&self, status: u32) -> i64 {
        if self.os.windows() {
            i64::from(status as i32)
        } else {
            i64::from(status)
        }
    }

    fn unix_sweep(&self, job: &str, signal: Signal) -> String {
        let sig = match signal {
            Signal::Term => "TERM",
            Signal::Kill => "KILL",
        };
        // grep lists the processes whose initial environment holds the mark (NUL-separated,
        // hence -a); this sweep never carries it. `kill -s SIG -- -PGID` signals a stage's
        // whole process group. A group id outlives its group and may be reused, so on Linux
        // a group is signalled only while a marked process is in it (field 3 after the
        // command name in /proc/<pid>/stat); where there is no /proc, every recorded group.
        format!(
            "m=$(grep -lsaF {mark} /proc/[0-9]*/environ 2>/dev/null)\n\
             g=' '\n\
             for e in $m; do p=${{e#/proc/}}; p=${{p%/environ}}; t=$(cat \"/proc/$p/stat\" 2>/dev/null) || continue; t=${{t##*) }}; set -- $t; g=\"$g$3 \"; done\n\
             for f in {own}/*.pgid; do [ -f \"$f\" ] || continue; k=$(cat \"$f\"); case $k in ''|*[!0-9]*) continue;; esac\n\
             if [ -d /proc/self ]; then case \"$g\" in *\" $k \"*) kill -s {sig} -- \"-$k\" 2>/dev/null;; esac; else kill -s {sig} -- \"-$k\" 2>/dev/null; fi; done\n\
             for e in $m; do p=${{e#/proc/}}; p=${{p%/environ}}; [ \"$p\" != \"$$\" ] && kill -s {sig} \"$p\" 2>/dev/null; done\n\
             true",
            own = sh_quote(&self.join(&[job, ".flotilla"])),
            mark = sh_quote(&format!("FLOTILLA_JOB={}", Self::mark(job))),
        )
    }

    /// Ends each recorded stage's process tree, only if the process is the one recorded: it
    /// started before its pid file was written (Windows reuses pids quickly, and the login
    /// is an administrator's).
    fn windows_sweep(&self, job: &str) -> String {
        format!(
            "Get-ChildItem -LiteralPath {own} -Filter '*.pid' -ErrorAction SilentlyContinue | ForEach-Object {{ $p = (Get-Content -LiteralPath $_.FullName -TotalCount 1 -ErrorAction SilentlyContinue); $proc = $null; if ($p -match '^[0-9]+$') {{ $proc = Get-Process -Id $p -ErrorAction SilentlyContinue }}; if ($proc -and $proc.StartTime -le $_.LastWriteTime) {{ try {{ & taskkill.exe /T /F /PID $p 2>&1 | Out-Null }} catch {{ }} }} }}",
            own = ps_quote(&self.join(&[job, ".flotilla"])),
        )
    }
}

/// `text` as one PowerShell string literal: single quotes, each `'` doubled. PowerShell also
/// ends single-quoted strings at the typographic quotes U+2018..U+201B, so those are doubled
/// too.
pub fn ps_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for c in text.chars() {
        if matches!(c, '\'' | '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}') {
            out.push(c);
        }
        out.push(c);
    }
    out.push('\'');
    out
}

fn unix(script: &str) -> String {
    format!("exec /bin/sh -c {}", sh_quote(script))
}

/// A command line that runs `script` in Windows PowerShell from any shell: the script as
/// UTF-16LE, base64 (`-EncodedCommand`).
fn powershell(script: &str) -> String {
    use base64::Engine as _;
    let utf16: Vec<u8> = script.encode_utf16().flat_map(u16::to_le_bytes).collect();
    format!(
        "powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -EncodedCommand {}",
        base64::engine::general_purpose::STANDARD.encode(utf16)
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn decode_powershell(command: &str) -> String {
        use base64::Engine as _;
        let b64 = command.rsplit(' ').next().expect("encoded");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("base64");
        let units: Vec<u16> = bytes
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        String::from_utf16(&units).expect("utf-16")
    }

    #[test]
    fn powershell_quotes_double_every_kind_of_single_quote() {
        assert_eq!(ps_quote("C:\\a b\\it's"), "'C:\\a b\\it''s'");
        assert_eq!(ps_quote("x\u{2019}y"), "'x\u{2019}\u{2019}y'");
        assert_eq!(ps_quote("$env:X `n"), "'$env:X `n'");
    }

    #[test]
    fn windows_commands_are_encoded_and_carry_windows_paths() {
        let s = InstanceSettings::new(MachineOs::Windows, None, None).expect("settings");
        assert_eq!(s.shell, Shell::Pwsh);
        assert_eq!(s.builds_dir("42"), r"C:\flotilla\42\builds");
        assert_eq!(s.cache_dir(), r"C:\flotilla\cache");
        let run = s.run_command("42", "build_script-1", 1234);
        // Only base64 follows the flags: neither cmd.exe nor PowerShell can misread it.
        let encoded = run.rsplit(' ').next().expect("word");
        assert!(
            encoded
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
        );
        let script = decode_powershell(&run);
        assert!(
            script.contains(r"Set-Location -LiteralPath 'C:\flotilla\42'"),
            "{script}"
        );
        assert!(
            script.contains(r"pwsh.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -File 'C:\flotilla\42\.flotilla\build_script-1.ps1'"),
            "{script}"
        );
        assert!(script.contains("exit $code"), "{script}");
        assert!(script.contains("[IO.FileMode]::CreateNew"), "{script}");
        assert!(
            script.contains("[Environment]::CurrentDirectory = 'C:\\flotilla\\42'"),
            "{script}"
        );
        assert!(
            script.contains("[Console]::Out.Write('flotilla-start build_script-1\n')"),
            "{script}"
        );
        let stop = decode_powershell(&s.stop_command("42", Signal::Term));
        assert!(stop.contains("taskkill.exe /T /F /PID"), "{stop}");
        let s = InstanceSettings::new(
            MachineOs::Windows,
            Some(Shell::Powershell),
            Some(r"D:\ci jobs\".into()),
        )
        .expect("settings");
        assert_eq!(s.job_dir("7"), r"D:\ci jobs\7");
        let script = decode_powershell(&s.run_command("7", "r", 5));
        assert!(script.contains("& powershell.exe "), "{script}");
        // A missing shell is a setup failure, before the marker; no exit code is not success.
        let check = script
            .find("Get-Command powershell.exe")
            .expect("shell check");
        assert!(check < script.find("[Console]::Out.Write(").expect("marker"));
        assert!(
            script.contains("if ($null -eq $code) { exit 1 }"),
            "{script}"
        );
        assert!(script.contains("if ($got -ne 5)"), "{script}");
        let sweep = decode_powershell(&s.stop_command("7", Signal::Kill));
        assert!(
            sweep.contains("$proc.StartTime -le $_.LastWriteTime"),
            "{sweep}"
        );
    }

    /// Runs a Unix command as the machine's login shell would (`sh -c`), in `dir`.
    fn on_machine(command: &str, stdin: &[u8]) -> std::process::Output {
        use std::io::Write as _;
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(command)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut input = child.stdin.take().expect("stdin");
        input.write_all(stdin).expect("write");
        drop(input);
        child.wait_with_output().expect("output")
    }

    #[test]
    fn a_detached_stage_starts_once_follows_from_any_byte_and_refuses_a_cut_script() {
        let root = tempfile::tempdir().expect("dir");
        let s = InstanceSettings::new(
            MachineOs::Linux,
            None,
            Some(root.path().join("it's").display().to_string()),
        )
        .expect("settings");
        let made = on_machine(&s.prepare_command("5"), b"");
        assert!(made.status.success(), "{made:?}");
        let script = b"echo one; echo two >&2; exit 3\n";
        let first = on_machine(&s.start_command("5", "r1", 0, script.len()), script);
        let out = String::from_utf8_lossy(&first.stdout);
        assert_eq!(out, "flotilla-start r1\none\ntwo\n");
        assert!(String::from_utf8_lossy(&first.stderr).ends_with("flotilla-status 3\n"));
        // Sent again from byte 4 (after "one\n"): no second start, the rest only.
        let again = on_machine(&s.start_command("5", "r1", 4, script.len()), script);
        assert_eq!(
            String::from_utf8_lossy(&again.stdout),
            "flotilla-start r1\ntwo\n"
        );
        assert!(String::from_utf8_lossy(&again.stderr).ends_with("flotilla-status 3\n"));
        let log = std::fs::read_to_string(root.path().join("it's/5/.flotilla/r1.out"));
        assert_eq!(log.expect("log"), "one\ntwo\n", "the script ran once");
        // A script cut in transit never starts, and a whole one may then.
        let cut = on_machine(&s.start_command("5", "r2", 0, 100), b"echo never\n");
        assert!(!cut.status.success());
        assert!(String::from_utf8_lossy(&cut.stderr).contains("arrived cut: 11 of 100"));
        assert!(!String::from_utf8_lossy(&cut.stdout).contains("flotilla-start"));
        let whole = on_machine(&s.start_command("5", "r2", 0, 11), b"echo never\n");
        assert_eq!(
            String::from_utf8_lossy(&whole.stdout),
            "flotilla-start r2\nnever\n"
        );
        // A script whose processes are killed leaves no status: the follower says so.
        let killer = b"kill -KILL $PPID\n";
        let lost = on_machine(&s.start_command("5", "r3", 0, killer.len()), killer);
        assert!(
            String::from_utf8_lossy(&lost.stderr).ends_with("flotilla-status lost\n"),
            "{lost:?}"
        );
        let clean = on_machine(&s.cleanup_command("5"), b"");
        assert!(clean.status.success(), "{clean:?}");
        assert!(!root.path().join("it's/5").exists());
    }

    #[test]
    fn windows_exit_codes_are_signed_32_bit_and_unix_ones_as_sent() {
        let w = InstanceSettings::new(MachineOs::Windows, None, None).expect("w");
        assert_eq!(w.exit_code(4_294_967_295), -1);
        assert_eq!(w.exit_code(3_221_225_477), -1_073_741_819); // 0xC0000005
        assert_eq!(w.exit_code(42), 42);
        let l = InstanceSettings::new(MachineOs::Linux, None, None).expect("l");
        assert_eq!(l.exit_code(255), 255);
    }

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
