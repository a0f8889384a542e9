//! A cloud for tests and benchmarks, written once: a fixed set of instances that are always
//! running and never grow. The scaler's driver tests and overload bench use `running(n)`, the
//! connector's tests and the harness use `machines` (loopback sshd daemons) and `engines`
//! (loopback Docker TLS engines), and the scaler bench watches `increase` with `on_increase`.
//! Behind the `fixed` feature, which only the tests and benchmarks turn on.

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::{
    Arch, CallError, Connection, Instance, InstanceState, Listing, Os, Protocol, Provider,
    ProviderHealth, ProviderInfo,
};

/// Instances that are always there (id → port), reached at one address.
pub struct Fixed {
    instances: BTreeMap<String, u16>,
    address: Option<String>,
    username: String,
    protocol: Protocol,
    /// Whether `decrease` accepts the ids it is given (the instances stay listed regardless).
    accepts_decrease: bool,
    on_increase: Option<Box<dyn Fn(u32) -> u32 + Send + Sync>>,
}

impl Fixed {
    /// `n` machines `m-0`…, with no address: for the scaler, which never connects. A decrease
    /// accepts nothing and an increase grants nothing, so the pool keeps exactly these.
    pub fn running(n: u32) -> Fixed {
        Fixed {
            instances: (0..n).map(|i| (format!("m-{i}"), 22)).collect(),
            address: None,
            username: String::new(),
            protocol: Protocol::Ssh,
            accepts_decrease: false,
            on_increase: None,
        }
    }

    /// Loopback sshd machines (instance id → SSH port), reached as root at 127.0.0.1.
    pub fn machines(ports: BTreeMap<String, u16>) -> Fixed {
        Fixed {
            instances: ports,
            address: Some("127.0.0.1".into()),
            username: "root".into(),
            protocol: Protocol::Ssh,
            accepts_decrease: true,
            on_increase: None,
        }
    }

    /// Loopback Docker Engines served over TLS (instance id → TLS port).
    pub fn engines(ports: BTreeMap<String, u16>) -> Fixed {
        Fixed {
            username: String::new(),
            protocol: Protocol::DockerTls,
            ..Fixed::machines(ports)
        }
    }

    /// `increase(delta)` calls `f`, which answers how many instances it grants (none are ever
    /// listed).
    pub fn on_increase(self, f: impl Fn(u32) -> u32 + Send + Sync + 'static) -> Fixed {
        Fixed {
            on_increase: Some(Box::new(f)),
            ..self
        }
    }
}

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
            self.instances
                .keys()
                .map(|id| Instance {
                    id: id.clone(),
                    state: InstanceState::Running,
                })
                .collect::<Vec<_>>(),
        ))
    }
    async fn increase(&self, delta: u32) -> Result<u32, CallError> {
        Ok(self.on_increase.as_ref().map_or(0, |f| f(delta)))
    }
    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, CallError> {
        Ok(if self.accepts_decrease {
            ids.to_vec()
        } else {
            Vec::new()
        })
    }
    async fn connect_info(&self, id: &str) -> Result<Connection, CallError> {
        Ok(Connection {
            id: id.to_string(),
            os: Os::Linux,
            arch: Arch::Amd64,
            protocol: self.protocol,
            internal_address: self.address.clone(),
            external_address: None,
            port: self.instances.get(id).copied().unwrap_or(1),
            username: self.username.clone(),
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
