//! For the benchmarks that run against real machines (the connector's, the GitLab driver's):
//! connector settings for a local dockerd, and a pool kept with one ready instance.

use std::sync::Arc;
use std::time::Duration;

use flotilla_connector::ConnectorSettings;
use flotilla_peers::dockerd::Dockerd;
use flotilla_provider::fixed::Fixed;
use flotilla_scaler::{
    Clock, PoolCore, PoolHandle, PoolHealth, Readiness, ScalerConfig, SystemClock,
};

/// Connector settings that reach `docker` on the loopback machines, as root.
pub fn connector_settings(docker: &Dockerd) -> ConnectorSettings {
    ConnectorSettings {
        // The test machines' login is root: the operator's word, not the plugin's.
        username: Some("root".into()),
        port: None,
        use_external_address: false,
        ssh_key: None,
        ready_command: Some("true".into()),
        ready_timeout: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(30),
        keepalive_interval: Duration::from_secs(15),
        known_hosts: None,
        docker_socket: Some(docker.socket().display().to_string()),
        ping_interval: None,
        docker_tls: None,
        allow_privileged: false,
        // The test machines are sshd daemons on loopback.
        targets: flotilla_connector::AllowedTargets::ranges(vec![
            "127.0.0.0/8".parse().unwrap_or_else(|e| panic!("{e}")),
        ]),
    }
}

/// A pool of one instance of `provider` with four slots, all kept idle, once it is ready.
pub async fn ready_pool(provider: Arc<Fixed>, readiness: Arc<dyn Readiness>) -> Arc<PoolHandle> {
    let clock = Arc::new(SystemClock);
    let config = ScalerConfig {
        capacity_per_instance: 4,
        max_instances: 1,
        update_interval_ms: 60_000,
        ..ScalerConfig::default()
    };
    // Keep the one instance: four idle slots wanted at all times.
    let keep = flotilla_scaler::Policy::new(
        vec!["* * * * *".to_string()],
        "UTC",
        4,
        3_600_000,
        0.0,
        0,
        false,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    let core = PoolCore::new(config, vec![keep], clock.now());
    let pool = PoolHandle::spawn("bench".into(), core, provider, clock, readiness, None);
    while pool.snapshot().health != PoolHealth::Ready || pool.snapshot().slots.idle == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pool
}
