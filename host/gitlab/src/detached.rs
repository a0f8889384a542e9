//! One stage's script, run detached from the connection that started it, in POSIX `sh`: the
//! same text in a job's container, its helper container and on a Unix machine. The first
//! start of a run takes a lock (`mkdir`, which only one start can win, so a start retried
//! after a lost answer never runs the script twice), starts the script in the background
//! (its standard output and error to one log, in the order written; its exit status to a file
//! when it ends; `HUP` ignored, so the connection's end does not end it), and every start then
//! follows the log from the byte the driver has printed so far. A host restart only breaks the
//! follower: the driver follows again from the same byte, so output is neither lost nor
//! repeated.
//!
//! The follower prints a start marker on standard output first (whatever a login shell printed
//! before it is the command's own noise, or a setup failure's words), then the log, and ends
//! with one status line on standard error: `flotilla-status <code>`, or `flotilla-status lost`
//! when the script's processes are gone without a status (they were killed).
//!
//! [`Output`] reads that stream on the driver's side.
//!
//! Must not know: Docker, SSH, the lease API. Pure text and parsing, so every rule is tested
//! here against a real `sh`.

use std::io::Write;

use crate::api::FrameKind;

/// A stage run's files on the machine or in the container: `<prefix>.d` (the start's lock),
/// `.sh` (the script), `.out` (the log), `.pid` (the background runner), `.pgid` (the
/// starter's process group), `.status`. The prefix is an absolute path of safe characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunFiles {
    prefix: String,
    name: String,
}

impl RunFiles {
    /// The files of run `name` (safe characters only, see [`run_name`]) under `dir`.
    pub(crate) fn new(dir: &str, name: &str) -> RunFiles {
        RunFiles {
            prefix: format!("{}/{name}", dir.trim_end_matches('/')),
            name: name.to_string(),
        }
    }

    /// The run's name (its start marker names it).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The script's path.
    pub(crate) fn script(&self) -> String {
        format!("{}.sh", self.prefix)
    }

    /// The log's path.
    #[cfg(test)]
    pub(crate) fn log(&self) -> String {
        format!("{}.out", self.prefix)
    }

    /// The text that starts the run unless a start already did, then follows its log from
    /// byte `from`.
    ///
    /// - `place` runs only in the first start, with `$P` the prefix: it puts the script at
    ///   `$P.sh`, or ends with `exit 1` after giving the lock back (`rmdir "$P.d"`).
    /// - `skip` runs in every later start instead (e.g. reading a script sent again on
    ///   standard input).
    /// - `launch` runs the script `"$P.sh"` (its output is redirected to the log here).
    pub(crate) fn start(&self, place: &str, skip: &str, launch: &str, from: u64) -> String {
        format!(
            "P={prefix}\n\
             if mkdir \"$P.d\" 2>/dev/null; then\n\
             {place}\n\
             (umask 077 && : > \"$P.out\") || exit 1\n\
             echo $$ > \"$P.pgid\" || exit 1\n\
             (trap '' HUP; {launch} < /dev/null >> \"$P.out\" 2>&1; echo $? > \"$P.st\"; mv \"$P.st\" \"$P.status\") &\n\
             echo $! > \"$P.pid\"\n\
             else {skip}; fi\n\
             i=0; while [ ! -e \"$P.out\" ] && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1 2>/dev/null || sleep 1; done\n\
             test -e \"$P.out\" || exit 1\n\
             {follow}",
            prefix = sh_quote(&self.prefix),
            follow = Self::follower(&self.name, from),
        )
    }

    /// Prints the start marker, then the log from byte `from` as it grows, polling (2 ms for
    /// the first few polls, so a short stage ends at once, growing to 1 s while nothing comes,
    /// back to 2 ms when something does), until the
    /// status file is there: then the rest, and the status line. The status file is looked
    /// for before the log is measured, so everything written before it is sent. If the
    /// process that would write it is gone (killed, or a zombie nobody reaped) or the log
    /// vanished, the status line says `lost`. A `sleep` without fractions (a busybox built
    /// without them) falls back to whole seconds rather than spinning.
    fn follower(name: &str, from: u64) -> String {
        format!(
            "printf '%s' {marker}\n\
             alive() {{ kill -0 \"$1\" 2>/dev/null || return 1; [ -r \"/proc/$1/stat\" ] || return 0; read -r t < \"/proc/$1/stat\" || return 1; case \"${{t##*) }}\" in Z*|X*) return 1;; esac; return 0; }}\n\
             o=\"$P.out\"; s=\"$P.status\"; q=\"$P.pid\"; n={from}; i=0\n\
             while :; do\n\
             d=0; [ -e \"$s\" ] && d=1\n\
             if [ $d = 0 ] && [ -f \"$q\" ] && ! alive \"$(cat \"$q\")\"; then if [ -e \"$s\" ]; then d=1; else d=2; fi; fi\n\
             [ -e \"$o\" ] || {{ printf '{lost}' >&2; exit 0; }}\n\
             z=$(wc -c < \"$o\" | tr -d ' ')\n\
             if [ \"$z\" -gt \"$n\" ]; then tail -c +$((n + 1)) \"$o\" | head -c $((z - n)) || exit 1; n=$z; i=0; fi\n\
             if [ $d = 1 ]; then printf '{status}' \"$(cat \"$s\")\" >&2; exit 0; fi\n\
             if [ $d = 2 ]; then printf '{lost}' >&2; exit 0; fi\n\
             case $i in 0|1|2|3) w=0.002;; 4) w=0.01;; 5) w=0.02;; 6) w=0.03;; 7|8) w=0.05;; 9|10) w=0.1;; 11) w=0.2;; 12) w=0.5;; *) w=1;; esac\n\
             i=$((i + 1)); sleep $w 2>/dev/null || sleep 1\n\
             done\n",
            marker = sh_quote(&start_marker(name)),
            status = status_line("%s").replace('\n', "\\n"),
            lost = status_line("lost").replace('\n', "\\n"),
        )
    }
}

/// A name for one run of a stage: the stage (in safe characters) and a value unique to this
/// invocation, so a stage the runner retries (`get_sources`) runs anew.
pub(crate) fn run_name(stage: &str) -> String {
    let safe: String = stage
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    static SEQUENCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{safe}-{:x}{nanos:x}{n:x}", std::process::id())
}

/// The line a start prints on standard output once the script is in place: output before it
/// is the command's own, after it the script's.
pub(crate) fn start_marker(run: &str) -> String {
    format!("flotilla-start {run}\n")
}

/// The line that ends a follower on standard error: `flotilla-status <code>`.
pub(crate) fn status_line(code: &str) -> String {
    format!("flotilla-status {code}\n")
}

/// `text` as one POSIX shell word: single quotes, each `'` written as `'\''`.
pub fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Output of the driver's own commands quoted in a failure.
pub(crate) const QUOTED: usize = 2000;

/// The bytes of a follower's standard error kept for its status line.
const STATUS_TAIL: usize = 256;

/// How a followed script ended, from the follower's last status line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// It exited with this code.
    Exited(i64),
    /// Its processes are gone and it left no status (they were killed).
    Lost,
}

/// The driver's side of a stage's command: nothing is shown before the start marker (that is
/// the command's own setup, kept for a failure message); after it, standard output goes to
/// the job log as it comes, and standard error is the follower's status line (or, for a
/// script attached to the channel, the script's own error output, shown too).
pub(crate) struct Output {
    marker: Vec<u8>,
    /// Bytes of standard output matched against the marker so far.
    seen: Vec<u8>,
    /// Whether the marker came.
    pub(crate) started: bool,
    /// The setup's output (capped).
    before: Vec<u8>,
    /// Bytes of standard output shown after the marker.
    pub(crate) shown: u64,
    /// A follower's standard error after the marker: only the status line (capped).
    after: Vec<u8>,
    /// Whether standard error after the marker is the follower's (the status line) rather
    /// than the script's.
    follower: bool,
}

impl Output {
    /// The output of a start of run `name`.
    pub(crate) fn new(name: &str) -> Output {
        Output {
            marker: start_marker(name).into_bytes(),
            seen: Vec::new(),
            started: false,
            before: Vec::new(),
            shown: 0,
            after: Vec::new(),
            follower: true,
        }
    }

    /// A script whose standard error after the marker is the script's own (Windows).
    pub(crate) fn attached(mut self) -> Output {
        self.follower = false;
        self
    }

    /// Takes one piece of the command's output.
    pub(crate) fn take(&mut self, kind: FrameKind, data: &[u8]) {
        if self.started {
            if kind == FrameKind::Stderr && self.follower {
                // Only the last bytes matter: the status line ends the follower's stderr.
                self.after.extend_from_slice(data);
                let excess = self.after.len().saturating_sub(STATUS_TAIL);
                self.after.drain(..excess);
                return;
            }
            if kind == FrameKind::Stdout {
                self.shown += data.len() as u64;
            }
            show(kind, data);
            return;
        }
        if kind == FrameKind::Stderr {
            keep_capped(&mut self.before, data);
            return;
        }
        // The marker may follow whatever the login user's shell printed first (a chatty
        // .bashrc): it is looked for anywhere.
        self.seen.extend_from_slice(data);
        if let Some(at) = find(&self.seen, &self.marker) {
            self.started = true;
            let rest = self.seen.split_off(at + self.marker.len());
            self.seen.truncate(at);
            let noise = std::mem::take(&mut self.seen);
            keep_capped(&mut self.before, &noise);
            self.shown += rest.len() as u64;
            show(kind, &rest);
            return;
        }
        // Keep only what could still be the marker's start; the rest is noise.
        let keep = self.marker.len().saturating_sub(1);
        if self.seen.len() > keep {
            let noise: Vec<u8> = self.seen.drain(..self.seen.len() - keep).collect();
            keep_capped(&mut self.before, &noise);
        }
    }

    /// What the command printed before its marker (a setup failure's words).
    pub(crate) fn setup_output(&self) -> String {
        let mut all = self.before.clone();
        all.extend_from_slice(&self.seen);
        String::from_utf8_lossy(&all).trim().to_string()
    }

    /// How the script ended, from a follower's last status line.
    pub(crate) fn status(&self) -> Option<Status> {
        let text = String::from_utf8_lossy(&self.after);
        let line = text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("flotilla-status "))?;
        match line.trim() {
            "lost" => Some(Status::Lost),
            code => code.parse().ok().map(Status::Exited),
        }
    }
}

fn keep_capped(buf: &mut Vec<u8>, data: &[u8]) {
    let room = QUOTED.saturating_sub(buf.len());
    buf.extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Shows a stage's output in the job log (a closed stdout or stderr, the runner gone,
/// leaves nothing useful to do).
pub(crate) fn show(kind: FrameKind, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    if kind == FrameKind::Stderr {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(data);
        let _ = err.flush();
    } else {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(data);
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `command` with a real `sh -c`, `stdin` fed.
    fn sh(command: &str, stdin: &[u8]) -> std::process::Output {
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

    fn place_from_stdin() -> &'static str {
        "(umask 077 && cat > \"$P.sh\") || { rmdir \"$P.d\"; exit 1; }"
    }

    #[test]
    fn a_run_starts_once_and_is_followed_from_any_byte() {
        let dir = tempfile::tempdir().expect("dir");
        let files = RunFiles::new(&dir.path().join("it's").display().to_string(), "r1");
        std::fs::create_dir(dir.path().join("it's")).expect("dir");
        let script = b"echo one; echo two >&2; exit 3\n";
        let start = |from| files.start(place_from_stdin(), "cat > /dev/null", "sh \"$P.sh\"", from);
        let first = sh(&start(0), script);
        let out = String::from_utf8_lossy(&first.stdout);
        assert_eq!(out, format!("{}one\ntwo\n", start_marker("r1")));
        assert!(String::from_utf8_lossy(&first.stderr).ends_with("flotilla-status 3\n"));
        // Started again from byte 4 (after "one\n"): no second run, the rest only.
        let again = sh(&start(4), b"echo twice\n");
        assert!(String::from_utf8_lossy(&again.stdout).ends_with("\ntwo\n"));
        assert!(String::from_utf8_lossy(&again.stderr).ends_with("flotilla-status 3\n"));
        let log = std::fs::read_to_string(files.log()).expect("log");
        assert_eq!(log, "one\ntwo\n", "the script ran once");
    }

    #[test]
    fn a_killed_run_is_lost_not_waited_for() {
        let dir = tempfile::tempdir().expect("dir");
        let files = RunFiles::new(&dir.path().display().to_string(), "r3");
        // The script kills the background runner that would write its status.
        let killer = b"kill -KILL $PPID\n";
        let lost = sh(
            &files.start(place_from_stdin(), "cat > /dev/null", "sh \"$P.sh\"", 0),
            killer,
        );
        assert!(
            String::from_utf8_lossy(&lost.stderr).ends_with("flotilla-status lost\n"),
            "{lost:?}"
        );
    }

    #[test]
    fn a_placing_failure_gives_the_lock_back_and_starts_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let files = RunFiles::new(&dir.path().display().to_string(), "r4");
        let refuse = "echo 'no script here' >&2; rmdir \"$P.d\"; exit 1";
        let failed = sh(&files.start(refuse, ":", "sh \"$P.sh\"", 0), b"");
        assert!(!failed.status.success());
        assert!(String::from_utf8_lossy(&failed.stderr).contains("no script here"));
        assert!(!String::from_utf8_lossy(&failed.stdout).contains("flotilla-start"));
        let whole = sh(
            &files.start(place_from_stdin(), "cat > /dev/null", "sh \"$P.sh\"", 0),
            b"echo now\n",
        );
        assert!(String::from_utf8_lossy(&whole.stdout).ends_with("now\n"));
    }

    #[test]
    fn the_start_marker_is_found_across_pieces_and_a_setup_failure_kept() {
        let name = "run-1";
        let marker = start_marker(name);
        for cut in 1..marker.len() {
            let mut out = Output::new(name);
            out.take(FrameKind::Stdout, &marker.as_bytes()[..cut]);
            assert!(!out.started);
            out.take(FrameKind::Stdout, &marker.as_bytes()[cut..]);
            assert!(out.started, "cut at {cut}");
            assert!(out.before.is_empty());
        }
        let mut failed = Output::new(name);
        failed.take(FrameKind::Stderr, b"cd: no such directory\n");
        failed.take(FrameKind::Stdout, b"flotilla-sta");
        failed.take(FrameKind::Stdout, b"XX");
        assert!(!failed.started);
        assert_eq!(
            failed.setup_output(),
            "cd: no such directory\nflotilla-staXX"
        );
        // A chatty login shell before the marker, in the same piece as the marker.
        let mut chatty = Output::new(name);
        chatty.take(
            FrameKind::Stdout,
            b"Welcome to the machine!\nflotilla-start run-1\nout",
        );
        assert!(chatty.started);
        assert_eq!(chatty.shown, 3);
        // The follower's stderr: only its last status line counts, whatever came before.
        chatty.take(FrameKind::Stderr, &[b'x'; 1000]);
        chatty.take(FrameKind::Stderr, b"\nflotilla-status 7\n");
        assert_eq!(chatty.status(), Some(Status::Exited(7)));
        chatty.take(FrameKind::Stderr, b"flotilla-status lost\n");
        assert_eq!(chatty.status(), Some(Status::Lost));
    }

    #[test]
    fn a_run_name_is_safe_in_a_path_and_unique_per_invocation() {
        let a = run_name("step_script/../x y");
        assert!(a.starts_with("step_script----x-y-"), "{a}");
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        );
        assert_ne!(run_name("s"), run_name("s"));
    }

    /// Runs `text` through a real POSIX shell's word splitting and returns the one word.
    fn through_sh(word: &str) -> String {
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("printf '%s' {word}"))
            .output()
            .expect("sh");
        String::from_utf8(out.stdout).expect("utf-8")
    }

    #[test]
    fn awkward_text_survives_posix_quoting_byte_for_byte() {
        for text in [
            "plain",
            "it's",
            "'",
            "''",
            "a b\tc\nd",
            "$HOME `id` $(id) \\ \" ! * ? [x] ~ # ; & | < >",
            "ünïcödé ✓",
            "",
        ] {
            assert_eq!(through_sh(&sh_quote(text)), text, "{text:?}");
        }
    }
}
