//! A stand-in cloud for the driver's tests and the overload benchmark: `n` machines that are
//! always there; an increase grants nothing.

use async_trait::async_trait;
use flotilla_provider::{
    Arch, CallError, Connection, Instance, InstanceState, Listing, Os, Protocol, Provider,
    ProviderHealth, ProviderInfo,
};

/// A cloud of `n` machines that are always there and never grow (an increase grants nothing).
pub struct Fixed(pub u32);

#[async_trait]
impl Provider for Fixed {
    async fn init(&self, _: &str) -> Result<ProviderInfo, CallError> {
        Ok(ProviderInfo {
            id: "test/fixed".into(),
            version: "0".into(),
            // No group maximum: the pool may hold more reservations than there are slots.
            max_size: 0,
            heartbeat: false,
            expiring_connect_info: false,
        })
    }
    async fn update(&self) -> Result<Listing, CallError> {
        Ok(Listing::from(
            (0..self.0)
                .map(|i| Instance {
                    id: format!("m-{i}"),
                    state: InstanceState::Running,
                })
                .collect::<Vec<_>>(),
        ))
    }
    async fn increase(&self, _: u32) -> Result<u32, CallError> {
        Ok(0)
    }
    async fn decrease(&self, _: &[String]) -> Result<Vec<String>, CallError> {
        Ok(Vec::new())
    }
    async fn connect_info(&self, id: &str) -> Result<Connection, CallError> {
        Ok(Connection {
            id: id.into(),
            os: Os::Linux,
            arch: Arch::Amd64,
            protocol: Protocol::Ssh,
            internal_address: None,
            external_address: None,
            port: 22,
            username: String::new(),
            expires: None,
            zone: None,
        })
    }
    async fn heartbeat(&self, _: &str) -> Result<(), CallError> {
        Ok(())
    }
    async fn shutdown(&self) -> Result<(), CallError> {
        Ok(())
    }
    fn health(&self) -> ProviderHealth {
        ProviderHealth::default()
    }
}
