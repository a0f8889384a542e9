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

use super::settings::{InstanceSettings, Shell, Signal};
use crate::detached::RunFiles;
pub use crate::detached::sh_quote;
use crate::place::Context;

impl InstanceSettings {
    /// Makes the job's directory from a clean slate: stops what an earlier try left running,
    /// removes its files (read-only directories too, as Go's module cache leaves them), then
    /// creates `builds`, `.flotilla` and the project's `cache` directory. On Unix the machine
    /// directory is checked first ([`MACHINE_DIR_CHECK`]): everything below it is the job's
    /// scripts and their variables.
    pub fn prepare_command(&self, job: &str, cache: &str) -> String {
        if self.os.windows() {
            let job_dir = ps_quote(&self.job_dir(job));
            // The sweep runs before errors stop the script: a process already gone is normal.
            let body = format!(
                "{check}\n{sweep}\n$ErrorActionPreference = 'Stop'\nif (Test-Path -LiteralPath {job_dir}) {{ Remove-Item -LiteralPath {job_dir} -Recurse -Force }}\nNew-Item -ItemType Directory -Force -Path {builds}, {own}, {cache} | Out-Null\n{tools}",
                check = windows_machine_dir_check(&ps_quote(&self.dir)),
                tools = self.windows_tools(),
                sweep = self.windows_sweep(job),
                builds = ps_quote(&self.builds_dir(job)),
                own = ps_quote(&self.join(&[job, ".flotilla"])),
                cache = ps_quote(cache),
            );
            return powershell(&body);
        }
        let body = format!(
            "umask 077\nd={root}\n{check}\n{sweep}\nchmod -R u+w -- {job_dir} 2>/dev/null\nrm -rf -- {job_dir}\nmkdir -p -- {builds} {own} {cache} {home}\n{tools}{contained}",
            root = sh_quote(&self.dir),
            check = MACHINE_DIR_CHECK,
            tools = self.unix_tools(job),
            sweep = self.unix_sweep(job, Signal::Kill),
            job_dir = sh_quote(&self.job_dir(job)),
            builds = sh_quote(&self.builds_dir(job)),
            own = sh_quote(&self.join(&[job, ".flotilla"])),
            cache = sh_quote(cache),
            home = sh_quote(&self.home_dir(job)),
            contained = format_args!(
                "{lookup}\nif [ -d /proc/self ] && ! {{ [ -n \"$G\" ] && mkdir -p -- \"$G\" 2>/dev/null; }}; then echo \"flotilla: note: this machine gives the job no cgroup of its own (no cgroup v2 the login may write: log in as root, or delegate one); its processes are found by their mark only, which a process that clears its environment escapes\" >&2; fi\n",
                lookup = self.cgroup_lookup(job)
            ),
        );
        unix(&body)
    }

    /// The check, once per machine, that the runner's own stages can run there: checkout
    /// needs `git`, cache and artifacts the runner's binary (`gitlab-runner`, or the helper
    /// binary `gitlab-runner-helper`, which stages then reach as `gitlab-runner`), both on the
    /// login shell's `PATH` (the Custom executor's prerequisites, "Prerequisite software" in
    /// GitLab Runner's `docs/executors/custom.md`). A machine that has neither fails `prepare`
    /// with what is missing (exit 3), never a job midway or its cache silently. The result is
    /// kept in the machine directory (`.flotilla-tools`).
    fn unix_tools(&self, job: &str) -> String {
        let marker = sh_quote(&self.join(&[".flotilla-tools"]));
        let home = sh_quote(&self.home_dir(job));
        format!(
            "if [ ! -e {marker} ]; then\n\
             t=$(HOME={home} bash --login -c 'command -v git >/dev/null 2>&1 || printf \"git \"; command -v gitlab-runner >/dev/null 2>&1 || command -v gitlab-runner-helper >/dev/null 2>&1 || printf \"gitlab-runner \"' < /dev/null 2>/dev/null) || t='bash '\n\
             if [ -n \"$t\" ]; then echo \"flotilla: this machine lacks ${{t% }} on the login shell's PATH: checkout needs git, cache and artifacts need gitlab-runner (or gitlab-runner-helper); install them in the machine's image\" >&2; exit 3; fi\n\
             : > {marker}\n\
             fi\n"
        )
    }

    /// [`Self::unix_tools`] for Windows: `git` and `gitlab-runner` as commands PowerShell
    /// finds (the runner's PowerShell scripts call it by that name, and nothing links it).
    fn windows_tools(&self) -> String {
        let marker = ps_quote(&self.join(&[".flotilla-tools"]));
        format!(
            "if (-not (Test-Path -LiteralPath {marker})) {{\n\
             $missing = @()\n\
             if (-not (Get-Command git -ErrorAction SilentlyContinue)) {{ $missing += 'git' }}\n\
             if (-not (Get-Command gitlab-runner -ErrorAction SilentlyContinue)) {{ $missing += 'gitlab-runner' }}\n\
             if ($missing.Count -gt 0) {{ [Console]::Error.WriteLine(\"flotilla: this machine lacks $($missing -join ' ') on PATH: checkout needs git, cache and artifacts need gitlab-runner; install them in the machine's image\"); exit 3 }}\n\
             New-Item -ItemType File -Force -Path {marker} | Out-Null\n\
             }}\n"
        )
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
        self.start_command(job, run, Context::Job, 0, len)
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
    pub fn start_command(
        &self,
        job: &str,
        run: &str,
        context: Context,
        from: u64,
        len: usize,
    ) -> String {
        let files = RunFiles::new(&self.join(&[job, ".flotilla"]), run);
        // The runner's own stages call `gitlab-runner`: where the machine has only the helper
        // binary, a link in the job's directory, first on the PATH the login shell set.
        let launch = match context {
            Context::Job => format!("{ENTER_CGROUP} bash --login \"$P.sh\""),
            Context::Helper => format!(
                "{ENTER_CGROUP} bash --login -c {shim} {bin} \"$P.sh\"",
                shim = sh_quote(
                    "if ! command -v gitlab-runner >/dev/null 2>&1 && h=$(command -v gitlab-runner-helper); then mkdir -p \"$0\" && ln -sf \"$h\" \"$0/gitlab-runner\" && PATH=\"$0:$PATH\" && export PATH; fi; exec bash \"$1\""
                ),
                bin = sh_quote(&self.join(&[job, ".flotilla", "bin"])),
            ),
        };
        let place = format!(
            "(umask 077 && cat > \"$P.sh\") || {{ rmdir \"$P.d\"; exit 1; }}\n\
             got=$(wc -c < \"$P.sh\" | tr -d ' ')\n\
             if [ \"$got\" != {len} ]; then echo \"flotilla: the script arrived cut: $got of {len} bytes\" >&2; rm -f \"$P.sh\"; rmdir \"$P.d\"; exit 1; fi\n\
             FLOTILLA_JOB={mark}\n\
             HOME={home}\n\
             export FLOTILLA_JOB HOME\n\
             {lookup}\n\
             [ -n \"$G\" ] && {{ mkdir -p -- \"$G\" 2>/dev/null || G=''; }}",
            mark = sh_quote(&Self::mark(job)),
            home = sh_quote(&self.home_dir(job)),
            lookup = self.cgroup_lookup(job),
        );
        let body = format!(
            "cd {dir} || exit 1\n{start}",
            dir = sh_quote(&self.job_dir(job)),
            start = files.start(&place, "cat > /dev/null", &launch, from),
        );
        unix(&body)
    }

    /// Waits up to `tenths` tenths of a second for every process of the job to end (after a
    /// `TERM` or a `KILL`): Linux by the mark, elsewhere by the stages' process groups. Exits
    /// 0 once none is left, 1 when some still run at the end.
    pub fn wait_command(&self, job: &str, tenths: u32) -> String {
        if self.os.windows() {
            // taskkill /F ends the tree at once: nothing to wait for.
            return powershell("exit 0\n");
        }
        let body = format!(
            "{lookup}\n\
             i=0\n\
             while [ $i -lt {tenths} ]; do\n\
             a=0\n\
             [ -n \"$G\" ] && [ -n \"$(cat \"$G/cgroup.procs\" 2>/dev/null)\" ] && a=1\n\
             if [ -d /proc/self ]; then grep -qsaF {mark} /proc/[0-9]*/environ 2>/dev/null && a=1\n\
             else for f in {own}/*.pgid; do [ -f \"$f\" ] || continue; k=$(cat \"$f\"); {valid}; kill -0 -- \"-$k\" 2>/dev/null && a=1; done; fi\n\
             [ $a = 0 ] && exit 0\n\
             sleep 0.1; i=$((i + 1))\n\
             done\n\
             exit 1\n",
            own = sh_quote(&self.join(&[job, ".flotilla"])),
            mark = sh_quote(&format!("FLOTILLA_JOB={}", Self::mark(job))),
            valid = VALID_PGID,
            lookup = self.cgroup_lookup(job),
        );
        unix(&format!("{OWN_PGID}\n{body}"))
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
            "{term}\nsleep 1\n{kill}\nchmod -R u+w -- {dir} 2>/dev/null\nrm -rf -- {dir} 2>/dev/null || echo \"flotilla: could not remove all of \"{dir} >&2\n\
             i=0; while [ -n \"$G\" ] && [ -d \"$G\" ] && ! rmdir -- \"$G\" 2>/dev/null && [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done\ntrue\n",
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
            "{lookup}\n\
             if [ -n \"$G\" ] && [ -d \"$G\" ]; then\n\
             if [ {sig} = KILL ] && [ -e \"$G/cgroup.kill\" ]; then echo 1 > \"$G/cgroup.kill\"\n\
             else f=0; [ {sig} = KILL ] && [ -e \"$G/cgroup.freeze\" ] && echo 1 > \"$G/cgroup.freeze\" && f=1\n\
             for p in $(cat \"$G/cgroup.procs\"); do kill -s {sig} \"$p\"; done\n\
             [ $f = 1 ] && echo 0 > \"$G/cgroup.freeze\"; fi\n\
             fi 2>/dev/null\n\
             m=$(grep -lsaF {mark} /proc/[0-9]*/environ 2>/dev/null)\n\
             g=' '\n\
             for e in $m; do p=${{e#/proc/}}; p=${{p%/environ}}; t=$(cat \"/proc/$p/stat\" 2>/dev/null) || continue; t=${{t##*) }}; set -- $t; g=\"$g$3 \"; done\n\
             {own_pgid}\n\
             for f in {own}/*.pgid; do [ -f \"$f\" ] || continue; k=$(cat \"$f\"); {valid}\n\
             if [ -d /proc/self ]; then case \"$g\" in *\" $k \"*) kill -s {sig} -- \"-$k\" 2>/dev/null;; esac; else kill -s {sig} -- \"-$k\" 2>/dev/null; fi; done\n\
             for e in $m; do p=${{e#/proc/}}; p=${{p%/environ}}; [ \"$p\" != \"$$\" ] && kill -s {sig} \"$p\" 2>/dev/null; done\n\
             true",
            own = sh_quote(&self.join(&[job, ".flotilla"])),
            mark = sh_quote(&format!("FLOTILLA_JOB={}", Self::mark(job))),
            own_pgid = OWN_PGID,
            valid = VALID_PGID,
            lookup = self.cgroup_lookup(job),
        )
    }

    /// Sets `G` to the job's cgroup on Linux: `flotilla/job-<id>-<machine dir hash>` in the
    /// first cgroup v2 mount (`/sys/fs/cgroup` on systemd machines), or to nothing where there
    /// is none. Every stage's script starts inside it ([`ENTER_CGROUP`]), so a process the job
    /// starts stays in it whatever it does to its environment or session, and a sweep ends
    /// the whole cgroup (`cgroup.kill`; on kernels before 5.14, frozen, each process killed,
    /// thawed). Where the login cannot make it (not root, nothing delegated), stages run
    /// without one and the mark is all a sweep has; `prepare` says so in the job's log.
    fn cgroup_lookup(&self, job: &str) -> String {
        let name = format!("job-{job}-{:08x}", fnv32(self.dir.as_bytes()));
        format!(
            "G=''\n\
             if [ -r /proc/self/mountinfo ]; then while read -r _ _ _ _ m r; do case \" $r \" in *\" - cgroup2 \"*) G=\"$m/flotilla/\"{name}; break;; esac; done < /proc/self/mountinfo; fi",
            name = sh_quote(&name),
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

/// The machine directory (`$d`) before anything is put in it: made 0700 when missing; refused
/// (exit 3, saying why) when it is a symbolic link, belongs to another user, or others or the
/// group may write in it, since another user on the machine could then swap a job's script
/// between its upload and its run, or read what the jobs leave; tightened to 0700 otherwise.
const MACHINE_DIR_CHECK: &str = "[ -L \"$d\" ] && { echo \"flotilla: the machine directory $d is a symbolic link; refusing to run jobs there\" >&2; exit 3; }
mkdir -p -- \"$d\" || exit 3
set -- $(ls -ldn -- \"$d\")
case $1 in d????w*|d???????w*) echo \"flotilla: the machine directory $d ($1) may be written by others; refusing to run jobs there (remove it, or chmod 700 it if it is yours)\" >&2; exit 3;; esac
[ \"$3\" = \"$(id -u)\" ] || { echo \"flotilla: the machine directory $d belongs to uid $3, not this login (uid $(id -u)); refusing to run jobs there\" >&2; exit 3; }
chmod 700 -- \"$d\"";

/// Starts the stage's command inside the job's cgroup `$G` (set by [`InstanceSettings::cgroup_lookup`]),
/// before it runs anything: a process that moves itself (`$$` of this `sh`) has started no
/// child yet. Outside a cgroup (`$G` empty, or the move refused) the command runs as is.
const ENTER_CGROUP: &str = "sh -c '[ -n \"$1\" ] && echo $$ > \"$1/cgroup.procs\" 2>/dev/null; shift; exec \"$@\"' flotilla-cgroup \"$G\"";

/// FNV-1a, 32 bits: a short, stable name part for the machine directory.
fn fnv32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// The machine directory on Windows, before anything is put in it: refused (exit 3, saying
/// why) when it is a reparse point (a symbolic link or junction another user could aim
/// elsewhere); made when missing; then given an explicit ACL, inheritance cut: full control
/// for the login user and SYSTEM only. A directory under `C:\` otherwise inherits read and
/// execute for every user of the machine, and the job's scripts there hold its variables.
fn windows_machine_dir_check(dir: &str) -> String {
    format!(
        "$d = {dir}\n\
         $i = Get-Item -LiteralPath $d -Force -ErrorAction SilentlyContinue\n\
         if ($i -and ($i.Attributes -band [IO.FileAttributes]::ReparsePoint)) {{ [Console]::Error.WriteLine(\"flotilla: the machine directory $d is a symbolic link or junction; refusing to run jobs there\"); exit 3 }}\n\
         if (-not $i) {{ New-Item -ItemType Directory -Force -Path $d | Out-Null }}\n\
         try {{\n\
         $me = [Security.Principal.WindowsIdentity]::GetCurrent().User\n\
         $system = New-Object Security.Principal.SecurityIdentifier('S-1-5-18')\n\
         $acl = New-Object Security.AccessControl.DirectorySecurity\n\
         $acl.SetAccessRuleProtection($true, $false)\n\
         foreach ($who in @($me, $system)) {{ $acl.AddAccessRule((New-Object Security.AccessControl.FileSystemAccessRule($who, 'FullControl', 'ContainerInherit,ObjectInherit', 'None', 'Allow'))) }}\n\
         Set-Acl -LiteralPath $d -AclObject $acl\n\
         }} catch {{ [Console]::Error.WriteLine(\"flotilla: cannot make the machine directory $d private to this login: $_\"); exit 3 }}"
    )
}

/// Sets `s` to the sweep's own process group, so a pgid file that names it is skipped.
const OWN_PGID: &str = "s=$(ps -o pgid= -p $$ 2>/dev/null | tr -d ' ')";

/// Skips (`continue`) a pgid file's `$k` unless it names a process group a stage can have: a
/// number above 1 without a leading zero (`kill -- -1` signals every process the login may
/// signal, `-0` the sweep's own group, and `-01` is `-1`), and not the sweep's own group (`$s`).
/// A job can write its stages' pgid files, so their contents are the job's word.
const VALID_PGID: &str =
    "case $k in ''|*[!0-9]*|0*|1) continue;; esac; [ \"$k\" = \"$s\" ] && continue";

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

impl InstanceSettings {
    /// An operator's terminal (`flotilla gitlab terminal`) in the job's directory: an
    /// interactive login shell (bash where the machine has it, else sh; PowerShell on
    /// Windows), or `command` run there. On Unix `HOME` is the job's own, as in its stages,
    /// so the shell reads no profile an earlier job could have planted in the login user's.
    pub fn terminal_command(&self, job: &str, command: &[String]) -> String {
        if self.os.windows() {
            let dir = ps_quote(&self.job_dir(job));
            if command.is_empty() {
                return format!(
                    "powershell.exe -NoProfile -NoLogo -NoExit -ExecutionPolicy Bypass -EncodedCommand {}",
                    utf16_base64(&format!("Set-Location -LiteralPath {dir}"))
                );
            }
            let words: Vec<String> = command.iter().map(|w| ps_quote(w)).collect();
            return powershell(&format!(
                "Set-Location -LiteralPath {dir}\n& {}\nexit $LASTEXITCODE",
                words.join(" ")
            ));
        }
        let run = if command.is_empty() {
            "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi".to_string()
        } else {
            let words: Vec<String> = command.iter().map(|w| sh_quote(w)).collect();
            format!("exec {}", words.join(" "))
        };
        unix(&format!(
            "cd -- {dir} || exit 1\nHOME={home}\nexport HOME\n{run}",
            dir = sh_quote(&self.job_dir(job)),
            home = sh_quote(&self.home_dir(job)),
        ))
    }
}

fn unix(script: &str) -> String {
    format!("exec /bin/sh -c {}", sh_quote(script))
}

/// A command line that runs `script` in Windows PowerShell from any shell: the script as
/// UTF-16LE, base64 (`-EncodedCommand`).
fn powershell(script: &str) -> String {
    format!(
        "powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -EncodedCommand {}",
        utf16_base64(script)
    )
}

/// `script` as `-EncodedCommand` takes it: UTF-16LE, base64.
fn utf16_base64(script: &str) -> String {
    use base64::Engine as _;
    let utf16: Vec<u8> = script.encode_utf16().flat_map(u16::to_le_bytes).collect();
    base64::engine::general_purpose::STANDARD.encode(utf16)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::instance::settings::MachineOs;

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
        assert_eq!(
            s.cache_dir("42", true),
            r"C:\flotilla\cache\project-42-protected"
        );
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
        // The machine directory: no reparse point, and an explicit ACL without inheritance
        // (the login user and SYSTEM), before the job's directory is made in it.
        let prepare = decode_powershell(&s.prepare_command("42", &s.cache_dir("42", true)));
        let acl = prepare.find("SetAccessRuleProtection($true, $false)");
        let made =
            prepare.find("New-Item -ItemType Directory -Force -Path 'C:\\flotilla\\42\\builds'");
        assert!(acl.is_some() && made.is_some() && acl < made, "{prepare}");
        assert!(
            prepare.contains("[IO.FileAttributes]::ReparsePoint"),
            "{prepare}"
        );
        assert!(prepare.contains("'S-1-5-18'"), "{prepare}");
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
    /// A Linux machine whose directory is `m` in a new temporary directory.
    fn linux_machine() -> (tempfile::TempDir, InstanceSettings) {
        let root = tempfile::tempdir().expect("dir");
        let s = InstanceSettings::new(
            MachineOs::Linux,
            None,
            Some(root.path().join("m").display().to_string()),
        )
        .expect("settings");
        (root, s)
    }

    /// The home of the test "machine" (this host): none, so the stages' `bash --login` reads
    /// no startup file of this host's user (a pyenv rehash there can hang a minute on a lock
    /// another test's killed shell left).
    const NO_HOME: &str = "/nonexistent/flotilla-test-home";

    fn on_machine(command: &str, stdin: &[u8]) -> std::process::Output {
        on_machine_at(command, stdin, std::path::Path::new(NO_HOME))
    }

    /// [`on_machine`] for a login whose home is `home`.
    fn on_machine_at(command: &str, stdin: &[u8], home: &std::path::Path) -> std::process::Output {
        use std::io::Write as _;
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(command)
            .env("HOME", home)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut input = child.stdin.take().expect("stdin");
        // A command may end before it has read all its input (a shell that runs its script
        // and exits): its output and status are what the tests check, not the pipe.
        if let Err(e) = input.write_all(stdin) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write: {e}");
        }
        drop(input);
        child.wait_with_output().expect("output")
    }

    /// Runs a Unix command with `bin` first on PATH (a stand-in `bash` there answers for the
    /// login shell).
    fn with_path(command: &str, bin: &std::path::Path) -> std::process::Output {
        std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(command)
            .env("HOME", NO_HOME)
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .output()
            .expect("sh")
    }

    #[test]
    // Each test uses job ids of its own: a sweep finds a job's processes by their mark
    // anywhere on the machine, so two tests running at once with one id would end each
    // other's.
    fn a_machine_without_the_runners_tools_fails_prepare_once_checked_it_is_not_asked_again() {
        let (root, s) = linux_machine();
        let bin = root.path().join("bin");
        std::fs::create_dir(&bin).expect("bin");
        let login = |says: &str| {
            use std::os::unix::fs::PermissionsExt;
            let stub = bin.join("bash");
            std::fs::write(&stub, format!("#!/bin/sh\nprintf '{says}'\n")).expect("stub");
            std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).expect("mode");
        };
        login("git gitlab-runner ");
        let refused = with_path(&s.prepare_command("15", &s.cache_dir("42", false)), &bin);
        assert_eq!(refused.status.code(), Some(3), "{refused:?}");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(
            said.contains("lacks git gitlab-runner on the login shell's PATH"),
            "{said}"
        );
        login("");
        assert!(
            with_path(&s.prepare_command("15", &s.cache_dir("42", false)), &bin)
                .status
                .success()
        );
        // Checked once per machine: a later job does not ask the login shell again.
        login("git ");
        assert!(
            with_path(&s.prepare_command("16", &s.cache_dir("42", false)), &bin)
                .status
                .success()
        );
    }

    #[test]
    fn an_operators_terminal_opens_in_the_jobs_directory_with_the_jobs_home() {
        let (_root, s) = linux_machine();
        let prepared = on_machine(&s.prepare_command("77", &s.cache_dir("p", false)), b"");
        assert!(prepared.status.success(), "{prepared:?}");
        let words = |w: &[&str]| w.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        let ran = on_machine(
            &s.terminal_command("77", &words(&["sh", "-c", "pwd; echo \"$HOME\"; exit 7"])),
            b"",
        );
        assert_eq!(ran.status.code(), Some(7), "{ran:?}");
        let out = String::from_utf8_lossy(&ran.stdout);
        let lines: Vec<&str> = out.lines().collect();
        let real = |p: &str| std::fs::canonicalize(p).expect("exists");
        assert_eq!(real(lines[0]), real(&s.job_dir("77")), "{out}");
        assert_eq!(lines[1], s.home_dir("77"), "{out}");
        // Without a command: a login shell there, reading its commands from the input.
        let shell = on_machine(&s.terminal_command("77", &[]), b"pwd\nexit 3\n");
        assert_eq!(shell.status.code(), Some(3), "{shell:?}");
        let printed = String::from_utf8_lossy(&shell.stdout);
        assert_eq!(real(printed.trim()), real(&s.job_dir("77")), "{printed}");
        // A job whose directory is gone: no shell somewhere else.
        let gone = on_machine(&s.terminal_command("78", &[]), b"pwd\n");
        assert_eq!(gone.status.code(), Some(1), "{gone:?}");
        assert!(gone.stdout.is_empty(), "{gone:?}");
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
        // A machine already checked for the runner's tools (see the next test).
        std::fs::create_dir_all(root.path().join("it's")).expect("dir");
        std::fs::write(root.path().join("it's/.flotilla-tools"), "").expect("marker");
        let made = on_machine(&s.prepare_command("5", &s.cache_dir("42", false)), b"");
        assert!(made.status.success(), "{made:?}");
        let script = b"echo one; echo two >&2; exit 3\n";
        let first = on_machine(
            &s.start_command("5", "r1", Context::Job, 0, script.len()),
            script,
        );
        let out = String::from_utf8_lossy(&first.stdout);
        assert_eq!(out, "flotilla-start r1\none\ntwo\n");
        assert!(String::from_utf8_lossy(&first.stderr).ends_with("flotilla-status 3\n"));
        // Sent again from byte 4 (after "one\n"): no second start, the rest only.
        let again = on_machine(
            &s.start_command("5", "r1", Context::Job, 4, script.len()),
            script,
        );
        assert_eq!(
            String::from_utf8_lossy(&again.stdout),
            "flotilla-start r1\ntwo\n"
        );
        assert!(String::from_utf8_lossy(&again.stderr).ends_with("flotilla-status 3\n"));
        let log = std::fs::read_to_string(root.path().join("it's/5/.flotilla/r1.out"));
        assert_eq!(log.expect("log"), "one\ntwo\n", "the script ran once");
        // A script cut in transit never starts, and a whole one may then.
        let cut = on_machine(
            &s.start_command("5", "r2", Context::Job, 0, 100),
            b"echo never\n",
        );
        assert!(!cut.status.success());
        assert!(String::from_utf8_lossy(&cut.stderr).contains("arrived cut: 11 of 100"));
        assert!(!String::from_utf8_lossy(&cut.stdout).contains("flotilla-start"));
        let whole = on_machine(
            &s.start_command("5", "r2", Context::Job, 0, 11),
            b"echo never\n",
        );
        assert_eq!(
            String::from_utf8_lossy(&whole.stdout),
            "flotilla-start r2\nnever\n"
        );
        // A script whose processes are killed leaves no status: the follower says so.
        let killer = b"kill -KILL $PPID\n";
        let lost = on_machine(
            &s.start_command("5", "r3", Context::Job, 0, killer.len()),
            killer,
        );
        assert!(
            String::from_utf8_lossy(&lost.stderr).ends_with("flotilla-status lost\n"),
            "{lost:?}"
        );
        let clean = on_machine(&s.cleanup_command("5"), b"");
        assert!(clean.status.success(), "{clean:?}");
        assert!(!root.path().join("it's/5").exists());
    }

    /// The machine directory holds every job's scripts: one others may write in, a symbolic
    /// link, or one of another user fails `prepare` with why and nothing is made in it; a
    /// missing one is made 0700, and a readable one of this user tightened to 0700.
    #[test]
    fn a_machine_directory_others_could_write_or_swap_fails_prepare() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().expect("dir");
        let settings = |dir: &std::path::Path| {
            InstanceSettings::new(MachineOs::Linux, None, Some(dir.display().to_string()))
                .expect("settings")
        };
        let bin = root.path().join("bin");
        std::fs::create_dir(&bin).expect("bin");
        let stub = bin.join("bash");
        std::fs::write(&stub, "#!/bin/sh\n").expect("stub");
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).expect("mode");
        let mode = |p: &std::path::Path| {
            std::fs::symlink_metadata(p)
                .expect("stat")
                .permissions()
                .mode()
                & 0o777
        };
        // Pre-created for everyone, as another user would leave it in /var/tmp.
        for (name, wide) in [("open", 0o777), ("group", 0o770), ("sticky", 0o1777)] {
            let dir = root.path().join(name);
            std::fs::create_dir(&dir).expect("dir");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(wide)).expect("chmod");
            let s = settings(&dir);
            let out = on_machine(&s.prepare_command("905", &s.cache_dir("42", false)), b"");
            assert_eq!(out.status.code(), Some(3), "{name}: {out:?}");
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(said.contains("may be written by others"), "{name}: {said}");
            assert!(
                !dir.join("905").exists(),
                "{name}: made the job's directory"
            );
        }
        // A symbolic link to a directory elsewhere.
        let target = root.path().join("elsewhere");
        std::fs::create_dir(&target).expect("dir");
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let s = settings(&link);
        let out = on_machine(&s.prepare_command("905", &s.cache_dir("42", false)), b"");
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("symbolic link"));
        assert!(!target.join("905").exists());
        // Missing: made 0700. This user's, readable by others: tightened.
        for (name, before) in [("fresh", None), ("readable", Some(0o755))] {
            let dir = root.path().join(name);
            if let Some(m) = before {
                std::fs::create_dir(&dir).expect("dir");
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(m)).expect("chmod");
            }
            let s = settings(&dir);
            // The tools check that follows asks a stand-in login shell (the real one may read
            // this host's profile); it is not what this test is about.
            let out = with_path(&s.prepare_command("905", &s.cache_dir("42", true)), &bin);
            let said = String::from_utf8_lossy(&out.stderr).to_string();
            assert!(!said.contains("refusing"), "{name}: {said}");
            assert_eq!(mode(&dir), 0o700, "{name}: {said}");
            assert!(
                dir.join("cache/project-42-protected").is_dir(),
                "{name}: {said}"
            );
        }
    }

    #[test]
    fn the_cache_is_one_per_project_and_protection() {
        let s = InstanceSettings::new(MachineOs::Linux, None, Some("/m".into())).expect("s");
        assert_eq!(s.cache_dir("42", false), "/m/cache/project-42");
        assert_eq!(s.cache_dir("42", true), "/m/cache/project-42-protected");
        assert_eq!(s.cache_dir("../7", false), "/m/cache/project-7");
        assert_eq!(s.cache_dir("", false), "/m/cache/project-unknown");
    }

    /// Where there is no /proc (macOS, FreeBSD), the sweep signals the groups in the job's
    /// pgid files, which the job can write. `1`, `01` and `0` there must not become
    /// `kill -- -1` (every process the login may signal) or the sweep's own group. Run in a
    /// pid namespace of its own with /proc hidden, so a sweep that goes wrong only reaches the
    /// namespace's bystander.
    /// The pids of this host's processes whose command line holds `tag`.
    fn running_with(tag: &str) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(Result::ok)
            .filter_map(|e| {
                let line = std::fs::read(e.path().join("cmdline")).ok()?;
                String::from_utf8_lossy(&line)
                    .contains(tag)
                    .then(|| e.file_name().to_string_lossy().into_owned())
            })
            .collect()
    }

    /// A job that clears its environment (so it loses its mark) and leaves its session
    /// (`env -i setsid`) is still ended by cleanup: it never left the job's cgroup. And what it
    /// writes to `~/.bash_profile` is read by no later job: stages run with a home of their
    /// own. The login's real home here is a writable directory, as on a machine.
    #[test]
    fn an_escaped_process_is_ended_by_cleanup_and_a_planted_profile_is_read_by_no_later_job() {
        let (root, s) = linux_machine();
        let login_home = root.path().join("login-home");
        std::fs::create_dir_all(&login_home).expect("home");
        std::fs::create_dir_all(root.path().join("m")).expect("machine dir");
        std::fs::write(root.path().join("m/.flotilla-tools"), "").expect("checked");
        let sh = |command: &str, stdin: &[u8]| on_machine_at(command, stdin, &login_home);
        let prepared = sh(&s.prepare_command("31", &s.cache_dir("1", false)), b"");
        assert!(prepared.status.success(), "{prepared:?}");
        if String::from_utf8_lossy(&prepared.stderr).contains("no cgroup of its own") {
            eprintln!("skipped: this user cannot make a cgroup: {prepared:?}");
            return;
        }
        let tag = format!("flotilla-escape-{}", std::process::id());
        let script = format!(
            "env -i setsid sh -c 'sleep 30; : {tag}' > /dev/null 2>&1 < /dev/null &\n\
             echo 'echo PLANTED-PROFILE-RAN' >> ~/.bash_profile\n"
        );
        let ran = sh(
            &s.start_command("31", "r1", Context::Job, 0, script.len()),
            script.as_bytes(),
        );
        assert!(
            String::from_utf8_lossy(&ran.stderr).ends_with("flotilla-status 0\n"),
            "{ran:?}"
        );
        assert!(
            !running_with(&tag).is_empty(),
            "the escaped process must be running before cleanup"
        );
        let cleaned = sh(&s.cleanup_command("31"), b"");
        assert!(cleaned.status.success(), "{cleaned:?}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while !running_with(&tag).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(
            running_with(&tag),
            Vec::<String>::new(),
            "a process of the job outlived cleanup"
        );

        assert!(
            sh(&s.prepare_command("32", &s.cache_dir("1", false)), b"")
                .status
                .success()
        );
        let next = b"echo \"home=$HOME\"\n";
        let out = sh(
            &s.start_command("32", "r1", Context::Job, 0, next.len()),
            next,
        );
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(!said.contains("PLANTED-PROFILE-RAN"), "{said}");
        assert!(
            said.contains(&format!("home={}\n", s.home_dir("32"))),
            "{said}"
        );
        assert!(sh(&s.cleanup_command("32"), b"").status.success());
    }

    #[test]
    fn a_job_that_writes_1_in_its_pgid_file_gets_no_kill_of_every_process() {
        let (root, s) = linux_machine();
        let own = root.path().join("m/7/.flotilla");
        std::fs::create_dir_all(&own).expect("dir");
        for (name, pgid) in [
            ("a", "1"),
            ("b", "01"),
            ("c", "0"),
            ("d", "-1"),
            ("e", "1 "),
        ] {
            std::fs::write(own.join(format!("{name}.pgid")), pgid).expect("pgid");
        }
        let script = format!(
            "mount -t tmpfs none /proc || exit 90\n\
             sleep 300 & b=$!\n\
             ( {term} ); ( {kill} ); ( {wait} )\n\
             kill -KILL $b 2>/dev/null; wait $b; echo \"bystander-$?\"\n",
            term = s.stop_command("7", Signal::Term),
            kill = s.stop_command("7", Signal::Kill),
            wait = s.wait_command("7", 3),
        );
        // A process group spans pid namespaces, so the namespace's shell gets a session of its
        // own (setsid) and unshare a group of its own: a sweep that signals its own group
        // (`kill -- -0`) reaches them, not this test's group.
        use std::os::unix::process::CommandExt as _;
        let Ok(out) = std::process::Command::new("unshare")
            .args([
                "--pid", "--fork", "--mount", "setsid", "/bin/sh", "-c", &script,
            ])
            .process_group(0)
            .output()
        else {
            panic!("unshare(1) is needed (util-linux)");
        };
        if out.status.code() == Some(1)
            && String::from_utf8_lossy(&out.stderr).contains("unshare failed")
        {
            eprintln!("skipped: this user cannot make namespaces: {out:?}");
            return;
        }
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "bystander-137\n",
            "the bystander must live until this test kills it (143: the sweep's TERM reached it): {out:?}"
        );
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
}
