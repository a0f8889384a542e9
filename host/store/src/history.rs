//! The lease history: one JSON line per finished lease (`<state_dir>/history.jsonl`), so a
//! fleet already on Flotilla can tune itself (`flotilla tune --history`). It owns the file and
//! its rotation; it must not know about scaling.
//!
//! Unlike the journal, the history is not needed to recover: a line is written after the lease
//! is gone, without fsync, and a failed write is logged, never returned. The file is rotated to
//! `history.jsonl.1` past 256 MiB, so at most twice that is kept (about two million leases).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use flotilla_scaler::{Lease, LeaseState, Millis};

/// Where a line goes once the file is this long.
const ROTATE_AT: u64 = 256 * 1024 * 1024;

/// The open history file.
#[derive(Debug)]
pub struct HistoryLog {
    path: PathBuf,
    file: parking_lot::Mutex<Option<(File, u64)>>,
    rotate_at: u64,
}

/// One line.
#[derive(Debug, serde::Serialize)]
struct Line<'a> {
    pool: &'a str,
    lease: u64,
    reserved_at_ms: Millis,
    acquired_at_ms: Option<Millis>,
    released_at_ms: Millis,
    instance: Option<&'a str>,
}

impl HistoryLog {
    /// The history next to the journal file `journal` (`history.jsonl` in its directory).
    pub fn beside(journal: &Path) -> HistoryLog {
        HistoryLog::at(journal.with_file_name("history.jsonl"), ROTATE_AT)
    }

    fn at(path: PathBuf, rotate_at: u64) -> HistoryLog {
        HistoryLog {
            path,
            file: parking_lot::Mutex::new(None),
            rotate_at,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a finished lease of `pool`.
    pub fn append(&self, pool: &str, lease: &Lease, released_at: Millis) {
        let instance = match &lease.state {
            LeaseState::Acquired { instance, .. } => Some(instance.as_str()),
            _ => None,
        };
        let line = Line {
            pool,
            lease: lease.id,
            reserved_at_ms: lease.reserved_at,
            acquired_at_ms: lease.acquired_at,
            released_at_ms: released_at,
            instance,
        };
        let mut text = match serde_json::to_string(&line) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), "lease history: {e}");
                return;
            }
        };
        text.push('\n');
        if let Err(e) = self.write(text.as_bytes()) {
            tracing::warn!(path = %self.path.display(), "lease history: {e}");
        }
    }

    fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut slot = self.file.lock();
        if slot.as_ref().is_some_and(|(_, len)| *len >= self.rotate_at) {
            *slot = None;
            std::fs::rename(&self.path, self.path.with_extension("jsonl.1"))?;
        }
        if slot.is_none() {
            let mut options = OpenOptions::new();
            options.create(true).append(true).read(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let file = options.open(&self.path)?;
            let len = drop_partial_line(&file)?;
            *slot = Some((file, len));
        }
        if let Some((file, len)) = slot.as_mut() {
            file.write_all(bytes)?;
            *len += bytes.len() as u64;
        }
        Ok(())
    }
}

/// Cuts a last line left unfinished (power lost mid-write), so the next line starts on a line
/// of its own and the file stays readable; the file's length after.
fn drop_partial_line(file: &File) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    let tail = len.min(64 * 1024);
    let mut reader = file;
    reader.seek(SeekFrom::Start(len - tail))?;
    let mut buf = Vec::with_capacity(tail as usize);
    reader.take(tail).read_to_end(&mut buf)?;
    if buf.last() == Some(&b'\n') {
        return Ok(len);
    }
    let keep = match buf.iter().rposition(|&b| b == b'\n') {
        Some(i) => len - tail + i as u64 + 1,
        None if tail == len => 0,
        // A line longer than the tail read: leave it to the reader to refuse.
        None => return Ok(len),
    };
    file.set_len(keep)?;
    Ok(keep)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn lease(id: u64, acquired: bool) -> Lease {
        Lease {
            id,
            state: if acquired {
                LeaseState::Acquired {
                    instance: "i-1".into(),
                    slot: 0,
                }
            } else {
                LeaseState::Reserved
            },
            reserved_at: 1_000,
            acquired_at: acquired.then_some(4_000),
            labels: BTreeMap::new(),
            expires_at: None,
            deadline_at: None,
            tenant: None,
            handed_from: None,
        }
    }

    #[test]
    fn finished_leases_are_lines_a_tuner_reads_and_the_file_rotates() {
        let dir = tempfile::tempdir().expect("dir");
        let log = HistoryLog::at(dir.path().join("history.jsonl"), 300);
        log.append("linux", &lease(7, true), 64_000);
        log.append("linux", &lease(8, false), 9_000);
        let text = std::fs::read_to_string(log.path()).expect("read");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(
            lines[0],
            serde_json::json!({"pool": "linux", "lease": 7, "reserved_at_ms": 1000,
                "acquired_at_ms": 4000, "released_at_ms": 64000, "instance": "i-1"})
        );
        assert_eq!(lines[1]["acquired_at_ms"], serde_json::Value::Null);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(log.path())
                .expect("meta")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Past the limit the file moves aside and a new one starts.
        for id in 10..20 {
            log.append("linux", &lease(id, true), 64_000);
        }
        let old = std::fs::read_to_string(dir.path().join("history.jsonl.1")).expect("rotated");
        let new = std::fs::read_to_string(log.path()).expect("current");
        assert!(old.lines().count() >= 2, "{old}");
        assert!(new.lines().count() >= 1, "{new}");
        assert!(
            new.contains("\"lease\":19"),
            "the newest line is in the current file: {new}"
        );
    }

    #[test]
    fn a_line_cut_short_by_a_crash_is_dropped_before_the_next_one() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("history.jsonl");
        std::fs::write(&path, "{\"pool\":\"a\"}\n{\"pool\":\"a\",\"lea").expect("write");
        let log = HistoryLog::at(path.clone(), ROTATE_AT);
        log.append("linux", &lease(3, true), 64_000);
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0], "{\"pool\":\"a\"}");
        assert!(
            lines[1].starts_with("{\"pool\":\"linux\",\"lease\":3"),
            "{text}"
        );
    }
}
