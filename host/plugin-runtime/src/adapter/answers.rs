//! The guest's answers checked against the contract and converted to the host's types:
//! ids listed once, the caps on lists, ids, zones and messages.

use super::*;

/// The ids seen so far in one answer, to find one listed twice. Answers are usually a handful
/// of ids: up to [`IdSet::LINEAR`] they are compared in place, with no hashing or allocation.
#[allow(clippy::large_enum_variant)] // a stack local for one check: the inline array is the point
pub(super) enum IdSet<'a> {
    Few {
        ids: [&'a str; IdSet::LINEAR],
        len: usize,
    },
    Many(HashSet<&'a str>),
}

impl<'a> IdSet<'a> {
    const LINEAR: usize = 16;

    pub(super) fn with_capacity(n: usize) -> Self {
        if n <= Self::LINEAR {
            IdSet::Few {
                ids: [""; IdSet::LINEAR],
                len: 0,
            }
        } else {
            IdSet::Many(HashSet::with_capacity(n))
        }
    }

    /// Adds `id`; false if it was already there.
    pub(super) fn insert(&mut self, id: &'a str) -> bool {
        match self {
            IdSet::Few { ids, len } => {
                if ids.iter().take(*len).any(|seen| *seen == id) {
                    return false;
                }
                match ids.get_mut(*len) {
                    Some(slot) => {
                        *slot = id;
                        *len += 1;
                    }
                    None => {
                        let mut all: HashSet<&'a str> = ids.iter().copied().collect();
                        all.insert(id);
                        *self = IdSet::Many(all);
                    }
                }
                true
            }
            IdSet::Many(all) => all.insert(id),
        }
    }
}

/// Instances one `update` may list: far above any pool, far below what hurts the host.
pub(super) const MAX_LISTED: usize = 10_000;
/// Bytes of an instance id.
pub(super) const MAX_ID: usize = 256;
/// Characters of a zone name kept (the clouds' longest are about 30).
pub(super) const MAX_ZONE: usize = 128;
/// Characters of a guest message kept (errors, failure reasons).
pub(super) const MAX_MESSAGE: usize = 2_048;

pub(super) fn convert_error(e: wit::Error) -> ProviderError {
    let e = match e {
        wit::Error::InvalidConfig(m) => wit::Error::InvalidConfig(guest_text(&m, MAX_MESSAGE)),
        wit::Error::Unauthorized(m) => wit::Error::Unauthorized(guest_text(&m, MAX_MESSAGE)),
        wit::Error::QuotaExceeded(m) => wit::Error::QuotaExceeded(guest_text(&m, MAX_MESSAGE)),
        wit::Error::Throttled(t) => wit::Error::Throttled(wit::Throttle {
            retry_after_seconds: t.retry_after_seconds,
            message: guest_text(&t.message, MAX_MESSAGE),
        }),
        wit::Error::NotFound(m) => wit::Error::NotFound(guest_text(&m, MAX_MESSAGE)),
        wit::Error::Unsupported(m) => wit::Error::Unsupported(guest_text(&m, MAX_MESSAGE)),
        wit::Error::Transient(m) => wit::Error::Transient(guest_text(&m, MAX_MESSAGE)),
        wit::Error::Other(m) => wit::Error::Other(guest_text(&m, MAX_MESSAGE)),
    };
    match e {
        wit::Error::InvalidConfig(m) => ProviderError::InvalidConfig(m),
        wit::Error::Unauthorized(m) => ProviderError::Unauthorized(m),
        wit::Error::QuotaExceeded(m) => ProviderError::QuotaExceeded(m),
        wit::Error::Throttled(t) => ProviderError::Throttled {
            retry_after: Duration::from_secs(u64::from(t.retry_after_seconds)),
            message: t.message,
        },
        wit::Error::NotFound(m) => ProviderError::NotFound(m),
        wit::Error::Unsupported(m) => ProviderError::Unsupported(m),
        wit::Error::Transient(m) => ProviderError::Transient(m),
        wit::Error::Other(m) => ProviderError::Other(m),
    }
}

pub(super) fn convert_info(i: wit::ProviderInfo) -> ProviderInfo {
    ProviderInfo {
        id: i.id,
        version: i.version,
        max_size: i.max_size,
        heartbeat: i.capabilities.heartbeat,
        expiring_connect_info: i.capabilities.expiring_connect_info,
    }
}

pub(super) fn convert_state(s: wit::InstanceState) -> InstanceState {
    match s {
        wit::InstanceState::Creating => InstanceState::Creating,
        wit::InstanceState::Running => InstanceState::Running,
        wit::InstanceState::Deleting => InstanceState::Deleting,
        wit::InstanceState::Deleted => InstanceState::Deleted,
        wit::InstanceState::Failed(r) => InstanceState::Failed(guest_text(&r, MAX_MESSAGE)),
    }
}

pub(super) fn convert_connection(c: wit::Connection) -> Connection {
    Connection {
        id: c.id,
        os: match c.os {
            wit::Os::Linux => Os::Linux,
            wit::Os::Windows => Os::Windows,
            wit::Os::Darwin => Os::Darwin,
            wit::Os::Freebsd => Os::Freebsd,
        },
        arch: match c.arch {
            wit::Arch::Amd64 => Arch::Amd64,
            wit::Arch::Arm64 => Arch::Arm64,
            wit::Arch::X86 => Arch::X86,
            wit::Arch::Arm => Arch::Arm,
        },
        protocol: match c.protocol {
            wit::Protocol::Ssh => Protocol::Ssh,
            wit::Protocol::Winrm => Protocol::Winrm,
            wit::Protocol::DockerTls => Protocol::DockerTls,
        },
        internal_address: c.internal_address,
        external_address: c.external_address,
        port: c.port,
        username: c.username,
        expires: c.expires,
        zone: c.zone.map(|zone| guest_text(&zone, MAX_ZONE)),
    }
}

#[cfg(test)]
mod tests {
    use super::IdSet;

    #[test]
    fn id_set_finds_a_repeat_in_short_and_long_answers() {
        for n in [1, IdSet::LINEAR, IdSet::LINEAR + 1, 100] {
            let ids: Vec<String> = (0..n).map(|i| format!("i-{i}")).collect();
            let mut seen = IdSet::with_capacity(n);
            assert!(ids.iter().all(|id| seen.insert(id)), "{n} distinct ids");
            for id in &ids {
                assert!(!seen.insert(id), "{id} repeated among {n}");
            }
        }
        // More ids than the capacity it was made for: it grows, and still finds repeats.
        let ids: Vec<String> = (0..40).map(|i| format!("i-{i}")).collect();
        let mut seen = IdSet::with_capacity(2);
        assert!(ids.iter().all(|id| seen.insert(id)));
        assert!(!seen.insert("i-0") && !seen.insert("i-39"));
    }
}
