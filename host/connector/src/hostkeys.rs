//! Which host keys the host trusts. `Pin` trusts the key an instance shows first and refuses
//! any other for that instance's life (cloud addresses are reused, instance ids are not);
//! `KnownHosts` trusts only keys in an OpenSSH known_hosts file, for machines an operator
//! manages.

use std::collections::HashMap;
use std::path::PathBuf;
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

/// The pinned host key of each instance.
#[derive(Debug, Default)]
pub struct Pins(Mutex<HashMap<String, PublicKey>>);

impl Pins {
    /// Forgets an instance's key once the instance is gone.
    pub fn forget(&self, instance: &str) {
        self.0.lock().remove(instance);
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
                let mut pins = pins.0.lock();
                match pins.get(instance) {
                    // Compare the key itself: a key's comment is not part of its identity.
                    Some(pinned) if pinned.key_data() == key.key_data() => Ok(()),
                    Some(pinned) => Err(Refusal::Changed {
                        pinned: fingerprint(pinned),
                        shown: fingerprint(key),
                    }),
                    None => {
                        tracing::info!(instance, fingerprint = %fingerprint(key), "pinned the instance's host key");
                        pins.insert(instance.to_string(), key.clone());
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
