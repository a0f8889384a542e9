//! A stand-in cloud whose instances are loopback machines (instance id → SSH port), all
//! running, reached as root at 127.0.0.1: for readiness tests and benchmarks.

use std::collections::BTreeMap;

use async_trait::async_trait;

use flotilla_provider::{
    Arch, CallError, Connection, Instance, InstanceState, Listing, Os, Protocol, Provider,
    ProviderHealth, ProviderInfo,
};

/// A cloud whose instances are the given loopback machines (instance id → SSH port).
pub struct Machines(pub BTreeMap<String, u16>);

/// A cloud whose instances are `docker-tls` engines on loopback (instance id → TLS port).
pub struct Engines(pub BTreeMap<String, u16>);

#[async_trait]
impl Provider for Engines {
    async fn init(&self, settings: &str) -> Result<ProviderInfo, CallError> {
        Machines(self.0.clone()).init(settings).await
    }
    async fn update(&self) -> Result<Listing, CallError> {
        Machines(self.0.clone()).update().await
    }
    async fn increase(&self, _: u32) -> Result<u32, CallError> {
        Ok(0)
    }
    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, CallError> {
        Ok(ids.to_vec())
    }
    async fn connect_info(&self, id: &str) -> Result<Connection, CallError> {
        let mut c = Machines(self.0.clone()).connect_info(id).await?;
        c.protocol = Protocol::DockerTls;
        c.username = String::new();
        Ok(c)
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

#[async_trait]
impl Provider for Machines {
    async fn init(&self, _: &str) -> Result<ProviderInfo, CallError> {
        Ok(ProviderInfo {
            id: "test/machines".into(),
            version: "0".into(),
            max_size: 0,
            heartbeat: false,
            expiring_connect_info: false,
        })
    }
    async fn update(&self) -> Result<Listing, CallError> {
        Ok(Listing::from(
            self.0
                .keys()
                .map(|id| Instance {
                    id: id.clone(),
                    state: InstanceState::Running,
                })
                .collect::<Vec<_>>(),
        ))
    }
    async fn increase(&self, _: u32) -> Result<u32, CallError> {
        Ok(0)
    }
    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, CallError> {
        Ok(ids.to_vec())
    }
    async fn connect_info(&self, id: &str) -> Result<Connection, CallError> {
        Ok(Connection {
            id: id.to_string(),
            os: Os::Linux,
            arch: Arch::Amd64,
            protocol: Protocol::Ssh,
            internal_address: Some("127.0.0.1".into()),
            external_address: None,
            port: self.0.get(id).copied().unwrap_or(1),
            username: "root".into(),
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
