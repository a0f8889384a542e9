//! The one way a test runs a long-lived process (the `flotilla` binary, a peer daemon): its
//! standard error goes to a log file the test can read and print, it is killed when dropped,
//! and the address it bound (port 0) is read from its log rather than guessed beforehand.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::poll;

/// A running process whose standard error is appended to a log file.
pub struct Daemon {
    child: Child,
    log: PathBuf,
    /// The log's length when this process started: earlier runs' lines are not its own.
    from: u64,
}

impl Daemon {
    /// Spawns `command` with standard output discarded and standard error appended to `log`.
    pub fn spawn(mut command: Command, log: &Path) -> Daemon {
        let from = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let child = command
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
        Daemon {
            child,
            log: log.to_path_buf(),
            from,
        }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Everything in the log file (every run's lines).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// This run's lines of the log.
    pub fn own_log(&self) -> String {
        let all = std::fs::read(&self.log).unwrap_or_default();
        let from = usize::try_from(self.from).unwrap_or(0).min(all.len());
        String::from_utf8_lossy(all.get(from..).unwrap_or_default()).into_owned()
    }

    /// Waits until this run logs a line containing `marker`, and returns the value of `key`
    /// on it (`key=value` in text logs, `"key":"value"` in JSON lines). Fails early, with the
    /// log, when the process exits first.
    pub async fn logged(&mut self, marker: &str, key: &str, limit: Duration) -> String {
        let what = format!("a log line with {marker:?} and {key}");
        poll::until(&what, limit, || {
            let found = self
                .own_log()
                .lines()
                .filter(|l| l.contains(marker))
                .find_map(|l| field(l, key));
            let exited = match self.child.try_wait() {
                Ok(Some(status)) => Some(status),
                _ => None,
            };
            let log = self.own_log();
            async move {
                match (found, exited) {
                    (Some(v), _) => Ok(v),
                    (None, Some(status)) => {
                        panic!("the process exited ({status}) before logging {marker:?}:\n{log}")
                    }
                    (None, None) => Err("not yet logged"),
                }
            }
        })
        .await
    }

    /// How the process exited, if it has.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Kills the process with SIGKILL, as a crash or an OOM kill would, and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill(); // already gone is fine
        let _ = self.child.wait();
    }

    /// Sends SIGTERM (a drain, as an upgrade stops it) and waits for the exit.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().ok()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The value of `key` on a log line: `key=value` (tracing's text format) or `"key":"value"`
/// (its JSON lines).
pub fn field(line: &str, key: &str) -> Option<String> {
    let json = format!("\"{key}\":\"");
    if let Some(at) = line.find(&json) {
        let rest = line.get(at + json.len()..)?;
        return rest.split('"').next().map(str::to_string);
    }
    let text = format!("{key}=");
    let at = line
        .match_indices(&text)
        .find(|(i, _)| *i == 0 || line.as_bytes().get(i - 1) == Some(&b' '))?
        .0;
    let rest = line.get(at + text.len()..)?;
    rest.split_whitespace()
        .next()
        .map(|v| v.trim_matches('"').to_string())
}

/// Kills `root` and every process below it at one instant, as a machine that loses power
/// would: the whole tree is frozen first (`SIGSTOP`, top down, until no new child appears),
/// then killed. Killing in one pass instead races the tree: a parent that is still running
/// can fork a child the pass has already walked past (a listener accepting a client that
/// reconnects at once), and a parent killed first leaves its children re-parented out of
/// reach.
pub fn kill_tree(root: u32) {
    let mut frozen: Vec<u32> = Vec::new();
    let mut next = vec![root];
    while !next.is_empty() {
        signal("-STOP", &next);
        frozen.extend(&next);
        next = descendants(root)
            .into_iter()
            .filter(|p| !frozen.contains(p))
            .collect();
    }
    signal("-KILL", &frozen);
    // A stopped process takes its SIGKILL too; CONT is for any that a tracer holds.
    signal("-CONT", &frozen);
}

/// Sends `sig` to `pids`; a process that is already gone is what the caller wants.
fn signal(sig: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(sig)
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}

/// Every process below `root` (children, their children, ...), read from `/proc`.
fn descendants(root: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // `pid (comm) state ppid ...`; the command name may hold spaces and parentheses.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue; // gone since the listing
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parents.push((pid, ppid));
        }
    }
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(child, _) in parents.iter().filter(|(_, pp)| *pp == p) {
            if !found.contains(&child) && child != root {
                found.push(child);
                frontier.push(child);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::field;

    #[test]
    fn a_logged_address_is_read_from_text_and_json_lines() {
        let text = "2026-12-03T12:00:00Z  INFO flotilla::app: flotilla is listening; pools are starting listen=127.0.0.1:41234 pools=2";
        assert_eq!(field(text, "listen").as_deref(), Some("127.0.0.1:41234"));
        assert_eq!(field(text, "metrics_listen"), None);
        let json = r#"{"fields":{"message":"serving","metrics_listen":"127.0.0.1:9"}}"#;
        assert_eq!(
            field(json, "metrics_listen").as_deref(),
            Some("127.0.0.1:9")
        );
        assert_eq!(field(json, "listen"), None);
    }
}
