//! Which host keys the host trusts. `Pin` trusts the key an instance shows first and refuses
//! any other for that instance's life (cloud addresses are reused, instance ids are not);
//! `KnownHosts` trusts only keys in an OpenSSH known_hosts file, for machines an operator
//! manages. Pins are kept in the state directory when there is one, so a restart of the host
//! does not trust a changed key afresh.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use russh::keys::PublicKey;

/// The host-key trust of one pool.
#[derive(Debug, Clone)]
pub enum HostKeyPolicy {
    /// Trust on first use, per instance id, for the life of the instance.
    Pin(Arc<Pins>),
    /// Only keys listed in this known_hosts file.
    KnownHosts(PathBuf),
}

/// The pinned host key of each instance, and the file that keeps them, if any.
#[derive(Debug, Default)]
pub struct Pins {
    keys: Mutex<HashMap<String, PublicKey>>,
    file: Option<PathBuf>,
}

impl Pins {
    /// The pins kept in `file` (a JSON object of instance id to OpenSSH public key, 0600),
    /// none if it does not exist yet. A file that cannot be read is an error: starting with
    /// no pins would trust every changed key again.
    pub fn load(file: &Path) -> Result<Pins, String> {
        let shown = file.display();
        let keys = match std::fs::read(file) {
            Ok(bytes) => {
                let listed: BTreeMap<String, String> = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("{shown}: not a host-key pin file: {e}"))?;
                let mut keys = HashMap::with_capacity(listed.len());
                for (instance, key) in listed {
                    let key = PublicKey::from_openssh(&key).map_err(|e| {
                        format!("{shown}: the key pinned for {instance:?} cannot be read: {e}")
                    })?;
                    keys.insert(instance, key);
                }
                keys
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
            Err(e) => return Err(format!("cannot read {shown}: {e}")),
        };
        Ok(Pins {
            keys: Mutex::new(keys),
            file: Some(file.to_path_buf()),
        })
    }

    /// Forgets an instance's key once the instance is gone.
    pub fn forget(&self, instance: &str) {
        let mut keys = self.keys.lock();
        if keys.remove(instance).is_some() {
            self.save(&keys);
        }
    }

    /// Writes the pins to their file (atomically, 0600); a failure is logged, and the pins
    /// in memory still hold.
    fn save(&self, keys: &HashMap<String, PublicKey>) {
        let Some(file) = &self.file else {
            return;
        };
        let listed: BTreeMap<&str, String> = keys
            .iter()
            .filter_map(|(id, key)| Some((id.as_str(), key.to_openssh().ok()?)))
            .collect();
        let written = serde_json::to_vec_pretty(&listed)
            .map_err(std::io::Error::other)
            .and_then(|bytes| flotilla_net::fs::write_atomic(file, &bytes));
        if let Err(e) = written {
            tracing::warn!(file = %file.display(), error = %e, "cannot keep the host-key pins; they hold until the host restarts");
        }
    }
}

/// Why a host key was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The instance showed another key than the one pinned for it.
    Changed { pinned: String, shown: String },
    /// The key is not in the known_hosts file.
    Unknown { shown: String },
    /// known_hosts lists another key for this host.
    Mismatch { line: usize },
    /// The file cannot be read.
    File(String),
    /// Host certificates are not accepted.
    Certificate,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Changed { pinned, shown } => write!(
                f,
                "the host key changed (pinned {pinned}, shown {shown}); refusing a possible impostor"
            ),
            Refusal::Unknown { shown } => {
                write!(f, "host key {shown} is not in the known_hosts file")
            }
            Refusal::Mismatch { line } => write!(
                f,
                "the host key does not match line {line} of the known_hosts file"
            ),
            Refusal::File(why) => write!(f, "cannot read the known_hosts file: {why}"),
            Refusal::Certificate => f.write_str("host certificates are not accepted"),
        }
    }
}

fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(russh::keys::HashAlg::Sha256).to_string()
}

impl HostKeyPolicy {
    /// Whether `key`, shown by `instance` at `host:port`, is trusted.
    pub(crate) fn check(
        &self,
        instance: &str,
        host: &str,
        port: u16,
        key: &PublicKey,
    ) -> Result<(), Refusal> {
        match self {
            HostKeyPolicy::Pin(pins) => {
                let mut keys = pins.keys.lock();
                match keys.get(instance) {
                    // Compare the key itself: a key's comment is not part of its identity.
                    Some(pinned) if pinned.key_data() == key.key_data() => Ok(()),
                    Some(pinned) => Err(Refusal::Changed {
                        pinned: fingerprint(pinned),
                        shown: fingerprint(key),
                    }),
                    None => {
                        tracing::info!(instance, fingerprint = %fingerprint(key), "pinned the instance's host key");
                        keys.insert(instance.to_string(), key.clone());
                        pins.save(&keys);
                        Ok(())
                    }
                }
            }
            HostKeyPolicy::KnownHosts(path) => {
                match russh::keys::check_known_hosts_path(host, port, key, path) {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(Refusal::Unknown {
                        shown: fingerprint(key),
                    }),
                    Err(russh::keys::Error::KeyChanged { line }) => Err(Refusal::Mismatch { line }),
                    Err(e) => Err(Refusal::File(e.to_string())),
                }
            }
        }
    }
}
