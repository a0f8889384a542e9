//! [`SshReadiness`]: an instance is ready once the host has an SSH session to it with the
//! pool's key, the host key is trusted, and the ready command exited 0. The session is kept
//! for later use; a closed one is opened again on the next check.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;

use flotilla_provider::{Connection, Protocol, Provider};
use flotilla_scaler::Readiness;

use crate::config::ConnectorSettings;
use crate::hostkeys::{HostKeyPolicy, Pins};
use crate::keys::PoolKey;
use crate::ssh::{Session, SshOptions, Target};

/// Readiness over SSH, for one pool.
#[derive(Debug)]
pub struct SshReadiness {
    key: PoolKey,
    settings: ConnectorSettings,
    policy: HostKeyPolicy,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    permits: tokio::sync::Semaphore,
}

/// stderr bytes quoted in a failure message.
const QUOTED: usize = 300;

/// Checks in flight at once per pool: enough for a fleet coming up together, few enough that
/// a burst of new instances cannot exhaust the host's sockets.
const CONCURRENT_CHECKS: usize = 32;

impl SshReadiness {
    /// Readiness with the pool's key and validated settings.
    pub fn new(key: PoolKey, settings: ConnectorSettings) -> Self {
        let policy = match &settings.known_hosts {
            Some(path) => HostKeyPolicy::KnownHosts(path.clone()),
            None => HostKeyPolicy::Pin(Arc::new(Pins::default())),
        };
        SshReadiness {
            key,
            settings,
            policy,
            sessions: Mutex::new(HashMap::new()),
            permits: tokio::sync::Semaphore::new(CONCURRENT_CHECKS),
        }
    }

    /// The pool's public key, for the operator or the plugin to install.
    pub fn public_key(&self) -> &str {
        self.key.public_openssh()
    }

    fn target(&self, instance: &str, c: &Connection) -> Result<Target, String> {
        if c.protocol != Protocol::Ssh {
            return Err(format!(
                "the plugin reports protocol {:?}; this host's connector reaches instances over SSH only",
                c.protocol
            ));
        }
        let address = if self.settings.use_external_address {
            c.external_address.as_ref()
        } else {
            c.internal_address.as_ref()
        };
        let host = address.ok_or_else(|| {
            let which = if self.settings.use_external_address {
                "external"
            } else {
                "internal"
            };
            format!("the plugin reports no {which} address for {instance}")
        })?;
        let user = self
            .settings
            .username
            .clone()
            .unwrap_or_else(|| c.username.clone());
        if user.is_empty() {
            return Err(
                "no login user: the plugin reports none and [pool.connector] username is not set"
                    .to_string(),
            );
        }
        Ok(Target {
            instance: instance.to_string(),
            host: host.clone(),
            port: if c.port == 0 { 22 } else { c.port },
            user,
        })
    }

    async fn session(&self, target: &Target) -> Result<Arc<Session>, String> {
        if let Some(s) = self.sessions.lock().get(&target.instance)
            && !s.is_closed()
        {
            return Ok(s.clone());
        }
        let opts = SshOptions {
            connect_timeout: self.settings.connect_timeout,
            keepalive_interval: self.settings.keepalive_interval,
        };
        let session = Arc::new(
            Session::connect(target, &self.key, &self.policy, &opts)
                .await
                .map_err(|e| e.to_string())?,
        );
        self.sessions
            .lock()
            .insert(target.instance.clone(), session.clone());
        Ok(session)
    }

    async fn ready_command(&self, session: &Session, command: &str) -> Result<(), String> {
        let out = session
            .exec(command, self.settings.ready_timeout)
            .await
            .map_err(|e| e.to_string())?;
        match out.status {
            Some(0) => Ok(()),
            status => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let tail: String = stderr
                    .trim()
                    .chars()
                    .rev()
                    .take(QUOTED)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                let how = status.map_or("was killed by a signal".to_string(), |c| {
                    format!("exited {c}")
                });
                Err(format!("the ready command {how}: {}", tail.escape_debug()))
            }
        }
    }

    /// Drops what is kept for an instance that is gone.
    pub fn forget(&self, instance: &str) {
        self.sessions.lock().remove(instance);
        if let HostKeyPolicy::Pin(pins) = &self.policy {
            pins.forget(instance);
        }
    }
}

#[async_trait]
impl Readiness for SshReadiness {
    async fn check(&self, provider: &dyn Provider, instance: &str) -> Result<(), String> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| "readiness is shutting down".to_string())?;
        let connection = provider
            .connect_info(instance)
            .await
            .map_err(|e| format!("connect-info: {e}"))?;
        let target = self.target(instance, &connection)?;
        let session = self.session(&target).await?;
        if let Some(command) = &self.settings.ready_command {
            let result = self.ready_command(&session, command).await;
            if result.is_err() {
                // A failed check starts from a fresh session next time.
                self.sessions.lock().remove(instance);
            }
            result?;
        }
        if let Some(socket) = &self.settings.docker_socket {
            let limit = self.settings.connect_timeout;
            let docker = crate::docker::over_ssh(session.clone(), socket.clone(), limit)?;
            let version = tokio::time::timeout(limit, crate::docker::check(docker))
                .await
                .unwrap_or_else(|_| Err(format!("Docker Engine did not answer within {limit:?}")))
                .map_err(|e| format!("{}:{}: {e}", target.host, target.port))?;
            tracing::info!(instance, docker = %version, "Docker Engine answers");
        }
        tracing::info!(instance, target = %format!("{}:{}", target.host, target.port), "instance is ready (SSH)");
        Ok(())
    }
}
