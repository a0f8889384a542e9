//! The contract versions this host calls, behind one set of functions.
//!
//! Imports are linked once, under the current version, and a plugin's older import names
//! resolve to them semver-compatibly (`log@0.1.0` is `log@0.1.4`). Exports cannot be matched
//! that way once a record changes shape: 0.1.4 added `zone` to `connection`, so a plugin built
//! against 0.1.0 to 0.1.3 returns the older record. Such a plugin is called through the frozen
//! 0.1.3 bindings (`wit-0.1.3/`), and its answers are lifted into the current types here, with
//! what the older contract cannot say left empty. Everything past this module sees one contract.

use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::HostState;
use super::bindings;
use super::bindings::flotilla::provider::types as wit;

/// The frozen 0.1.3 contract's bindings (only its exports are called; its imports are the
/// current ones, linked under their 0.1.x names).
mod v0_1_3 {
    crate::provider_bindings!("wit-0.1.3");
}

use v0_1_3::flotilla::provider::types as old;

/// The first contract version whose `connection` carries a zone.
const ZONE_SINCE_PATCH: u32 = 4;

/// A plugin's exports, linked and ready to instantiate, under the version it was built against.
#[derive(Clone)]
pub(crate) enum ProviderPre {
    /// 0.1.4 and later.
    Current(bindings::ProviderPre<HostState>),
    /// 0.1.0 to 0.1.3.
    Before0_1_4(v0_1_3::ProviderPre<HostState>),
}

/// One instance's exports.
pub(crate) enum Exports {
    Current(bindings::Provider),
    Before0_1_4(v0_1_3::Provider),
}

/// What an export call returns: a trap, or the plugin's own answer.
pub(crate) type Answer<T> = wasmtime::Result<Result<T, wit::Error>>;

impl ProviderPre {
    /// Picks the bindings for `instance_group`, the plugin's export name
    /// (`flotilla:provider/instance-group@0.1.2`).
    pub(crate) fn new(
        instance_group: &str,
        pre: InstancePre<HostState>,
    ) -> wasmtime::Result<ProviderPre> {
        if patch_of(instance_group).is_some_and(|patch| patch < ZONE_SINCE_PATCH) {
            v0_1_3::ProviderPre::new(pre).map(ProviderPre::Before0_1_4)
        } else {
            bindings::ProviderPre::new(pre).map(ProviderPre::Current)
        }
    }

    pub(crate) fn engine(&self) -> &wasmtime::Engine {
        match self {
            ProviderPre::Current(pre) => pre.engine(),
            ProviderPre::Before0_1_4(pre) => pre.engine(),
        }
    }

    pub(crate) async fn instantiate_async(
        &self,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<Exports> {
        Ok(match self {
            ProviderPre::Current(pre) => Exports::Current(pre.instantiate_async(store).await?),
            ProviderPre::Before0_1_4(pre) => {
                Exports::Before0_1_4(pre.instantiate_async(store).await?)
            }
        })
    }
}

/// The patch number of a `…@0.1.N` export name.
fn patch_of(export: &str) -> Option<u32> {
    export.rsplit_once("@0.1.")?.1.parse().ok()
}

/// Calls one export under either version, lifting an older answer with `lift`.
macro_rules! call {
    ($exports:expr, $store:expr, $method:ident ( $($arg:expr),* ), $lift:expr) => {
        match $exports {
            Exports::Current(b) => {
                b.flotilla_provider_instance_group().$method($store $(, $arg)*).await
            }
            Exports::Before0_1_4(b) => b
                .flotilla_provider_instance_group()
                .$method($store $(, $arg)*)
                .await
                .map(|answer| answer.map($lift).map_err(lift_error)),
        }
    };
}

impl Exports {
    pub(crate) async fn init(
        &self,
        store: &mut Store<HostState>,
        settings: &str,
    ) -> Answer<wit::ProviderInfo> {
        call!(self, store, call_init(settings), lift_info)
    }

    pub(crate) async fn update(&self, store: &mut Store<HostState>) -> Answer<Vec<wit::Instance>> {
        call!(self, store, call_update(), |list: Vec<old::Instance>| list
            .into_iter()
            .map(lift_instance)
            .collect())
    }

    pub(crate) async fn increase(&self, store: &mut Store<HostState>, delta: u32) -> Answer<u32> {
        call!(self, store, call_increase(delta), |granted| granted)
    }

    pub(crate) async fn decrease(
        &self,
        store: &mut Store<HostState>,
        ids: &[String],
    ) -> Answer<Vec<String>> {
        call!(self, store, call_decrease(ids), |accepted| accepted)
    }

    pub(crate) async fn connect_info(
        &self,
        store: &mut Store<HostState>,
        id: &str,
    ) -> Answer<wit::Connection> {
        call!(self, store, call_connect_info(id), lift_connection)
    }

    pub(crate) async fn heartbeat(&self, store: &mut Store<HostState>, id: &str) -> Answer<()> {
        call!(self, store, call_heartbeat(id), |()| ())
    }

    pub(crate) async fn shutdown(&self, store: &mut Store<HostState>) -> Answer<()> {
        call!(self, store, call_shutdown(), |()| ())
    }
}

fn lift_error(e: old::Error) -> wit::Error {
    match e {
        old::Error::InvalidConfig(m) => wit::Error::InvalidConfig(m),
        old::Error::Unauthorized(m) => wit::Error::Unauthorized(m),
        old::Error::QuotaExceeded(m) => wit::Error::QuotaExceeded(m),
        old::Error::Throttled(t) => wit::Error::Throttled(wit::Throttle {
            retry_after_seconds: t.retry_after_seconds,
            message: t.message,
        }),
        old::Error::NotFound(m) => wit::Error::NotFound(m),
        old::Error::Unsupported(m) => wit::Error::Unsupported(m),
        old::Error::Transient(m) => wit::Error::Transient(m),
        old::Error::Other(m) => wit::Error::Other(m),
    }
}

fn lift_info(i: old::ProviderInfo) -> wit::ProviderInfo {
    wit::ProviderInfo {
        id: i.id,
        version: i.version,
        max_size: i.max_size,
        capabilities: wit::Capabilities {
            heartbeat: i.capabilities.heartbeat,
            expiring_connect_info: i.capabilities.expiring_connect_info,
        },
    }
}

fn lift_instance(i: old::Instance) -> wit::Instance {
    wit::Instance {
        id: i.id,
        state: match i.state {
            old::InstanceState::Creating => wit::InstanceState::Creating,
            old::InstanceState::Running => wit::InstanceState::Running,
            old::InstanceState::Deleting => wit::InstanceState::Deleting,
            old::InstanceState::Deleted => wit::InstanceState::Deleted,
            old::InstanceState::Failed(reason) => wit::InstanceState::Failed(reason),
        },
    }
}

fn lift_connection(c: old::Connection) -> wit::Connection {
    wit::Connection {
        id: c.id,
        os: match c.os {
            old::Os::Linux => wit::Os::Linux,
            old::Os::Windows => wit::Os::Windows,
            old::Os::Darwin => wit::Os::Darwin,
            old::Os::Freebsd => wit::Os::Freebsd,
        },
        arch: match c.arch {
            old::Arch::Amd64 => wit::Arch::Amd64,
            old::Arch::Arm64 => wit::Arch::Arm64,
            old::Arch::X86 => wit::Arch::X86,
            old::Arch::Arm => wit::Arch::Arm,
        },
        protocol: match c.protocol {
            old::Protocol::Ssh => wit::Protocol::Ssh,
            old::Protocol::Winrm => wit::Protocol::Winrm,
            old::Protocol::DockerTls => wit::Protocol::DockerTls,
        },
        internal_address: c.internal_address,
        external_address: c.external_address,
        port: c.port,
        username: c.username,
        expires: c.expires,
        zone: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_export_version_picks_the_bindings() {
        assert_eq!(patch_of("flotilla:provider/instance-group@0.1.0"), Some(0));
        assert_eq!(patch_of("flotilla:provider/instance-group@0.1.3"), Some(3));
        assert_eq!(patch_of("flotilla:provider/instance-group@0.1.4"), Some(4));
        assert_eq!(
            patch_of("flotilla:provider/instance-group@0.1.12"),
            Some(12)
        );
        assert_eq!(patch_of("flotilla:provider/instance-group"), None);
    }
}
