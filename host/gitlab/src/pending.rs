//! Cleanups that could not reach the host, kept on the manager until a driver call can: a
//! `cleanup` whose host stayed away past the restart window writes a note (one small file per
//! job, 0600, in a 0700 directory of the driver's own), and every later driver call of the
//! same API and pool finishes the notes it finds, beside its own stage, once it has reached
//! the host: it releases the lease and sweeps the job's objects, exactly as the lost cleanup
//! would have. A note is claimed by renaming it, so two drivers never finish the same one; a
//! claim whose driver died is taken over after [`CLAIM_TIMEOUT`].
//!
//! The lease's own deadline (the job's timeout plus a grace, set at the reservation) bounds
//! the slot even when no driver ever comes back.
//!
//! Must not know: Docker or SSH (the stage skeleton sweeps), or the token (a note names the
//! API and pool; whoever finishes it uses its own token).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::api::ApiClient;
use crate::job::{DriverSettings, Job};
use crate::lease::Patience;

/// A claim older than this belongs to a driver that died: the note is taken over.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(600);

/// A note older than this is given up (the lease's deadline freed its slot long ago).
const MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many notes one driver call finishes at most.
const PER_CALL: usize = 8;

/// One queued cleanup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Note {
    /// The API the job's lease lives in.
    url: String,
    /// Its pool.
    pool: String,
    /// The job's id (digits).
    job: String,
    /// When the cleanup was queued, in seconds since the epoch.
    queued_at: u64,
    /// How many later calls tried to finish it.
    #[serde(default)]
    attempts: u32,
}

/// The directory of notes: `--state-dir`, else `$XDG_STATE_HOME/flotilla/gitlab`, else
/// `~/.local/state/flotilla/gitlab`.
pub fn default_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty());
    if let Some(state) = xdg {
        return Some(PathBuf::from(state).join("flotilla/gitlab"));
    }
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(|home| PathBuf::from(home).join(".local/state/flotilla/gitlab"))
}

/// The file name stem of this API and pool's notes, so notes of other hosts and pools are
/// never touched.
fn scope(api: &ApiClient) -> String {
    format!("cleanup-{}", api.scope())
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The notes directory, created owner-only; refused when it is not the driver's own.
fn open_dir(settings: &DriverSettings) -> Result<PathBuf, String> {
    let dir = settings
        .state_dir
        .clone()
        .ok_or("no --state-dir, and neither XDG_STATE_HOME nor HOME is set")?;
    flotilla_net::fs::ensure_private_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta =
            std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // SAFETY-free check: the directory must be ours, a real directory, private.
        let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
        if !meta.is_dir() || meta.mode() & 0o077 != 0 || uid.is_some_and(|u| u != meta.uid()) {
            return Err(format!(
                "{} is not a private directory of this user",
                dir.display()
            ));
        }
    }
    Ok(dir)
}

/// Queues the cleanup of `job`; the note's path.
pub(crate) fn queue(
    api: &ApiClient,
    settings: &DriverSettings,
    job: &Job,
) -> Result<PathBuf, String> {
    let dir = open_dir(settings)?;
    let note = Note {
        url: api.base().to_string(),
        pool: api.pool().to_string(),
        job: job.id.clone(),
        queued_at: now(),
        attempts: 0,
    };
    let path = dir.join(format!("{}-{}.json", scope(api), job.id));
    write(&path, &note)?;
    Ok(path)
}

fn write(path: &Path, note: &Note) -> Result<(), String> {
    let text = serde_json::to_vec(note).map_err(|e| e.to_string())?;
    flotilla_net::fs::write_atomic(path, &text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs `stage` and, beside it, finishes the queued cleanups of this API and pool; the
/// stage's result. Finishing never makes the stage fail, and takes one try per note.
pub(crate) async fn finishing<T>(
    api: &ApiClient,
    settings: &DriverSettings,
    stage: impl Future<Output = T>,
) -> T {
    let (out, ()) = tokio::join!(stage, finish(api, settings));
    out
}

/// Finishes the queued cleanups of this API and pool, one try each.
async fn finish(api: &ApiClient, settings: &DriverSettings) {
    let Some(dir) = settings.state_dir.as_deref() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let scope = scope(api);
    let mut claimable = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&scope) && name.ends_with(".json") {
            claimable.push(name);
        } else if let Some(original) = stale_claim(&entry, &name, &scope) {
            // Its driver died: put it back, and take it in this call.
            if std::fs::rename(entry.path(), dir.join(&original)).is_ok() {
                claimable.push(original);
            }
        }
    }
    claimable.sort();
    for name in claimable.into_iter().take(PER_CALL) {
        let claimed = dir.join(format!(".claim-{}-{name}", std::process::id()));
        if std::fs::rename(dir.join(&name), &claimed).is_err() {
            continue; // another driver took it
        }
        settle(api, settings, &claimed, &dir.join(&name)).await;
    }
}

/// The note name behind a claim of this scope older than [`CLAIM_TIMEOUT`].
fn stale_claim(entry: &std::fs::DirEntry, name: &str, scope: &str) -> Option<String> {
    let rest = name.strip_prefix(".claim-")?;
    let (_, original) = rest.split_once('-')?;
    if !original.starts_with(scope) {
        return None;
    }
    let modified = entry.metadata().ok()?.modified().ok()?;
    let age = SystemTime::now().duration_since(modified).ok()?;
    (age > CLAIM_TIMEOUT).then(|| original.to_string())
}

/// Tries one claimed note: done, it is removed; not done, it goes back for a later call, or is
/// given up when it is too old.
async fn settle(api: &ApiClient, settings: &DriverSettings, claimed: &Path, home: &Path) {
    let note: Option<Note> = std::fs::read(claimed)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let Some(mut note) = note.filter(|n| n.url == api.base() && n.pool == api.pool()) else {
        tracing::warn!(note = %claimed.display(), "an unreadable queued cleanup is dropped");
        let _ = std::fs::remove_file(claimed);
        return;
    };
    let job = Job::stale(&note.job);
    match crate::stages::cleanup_job(api, &job, settings, Patience::none()).await {
        Ok(()) => {
            tracing::info!(job = %note.job, "finished a queued cleanup");
            let _ = std::fs::remove_file(claimed);
        }
        Err(why) => {
            note.attempts = note.attempts.saturating_add(1);
            let age = Duration::from_secs(now().saturating_sub(note.queued_at));
            if age > MAX_AGE {
                eprintln!(
                    "flotilla: giving up the cleanup of job {} queued {}s ago: {why}",
                    note.job,
                    age.as_secs()
                );
                let _ = std::fs::remove_file(claimed);
            } else if write(claimed, &note).is_ok() {
                let _ = std::fs::rename(claimed, home);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_of_other_hosts_and_pools_are_apart() {
        let a = ApiClient::new("http://127.0.0.1:8080", None, "linux").expect("client");
        let b = ApiClient::new("http://127.0.0.1:8080", None, "windows").expect("client");
        let c = ApiClient::new("http://127.0.0.1:8081", None, "linux").expect("client");
        assert_ne!(scope(&a), scope(&b));
        assert_ne!(scope(&a), scope(&c));
        assert_eq!(scope(&a), scope(&a.clone()));
        assert!(!scope(&a).contains('/'));
    }
}
