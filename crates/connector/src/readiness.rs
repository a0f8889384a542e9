//! [`SshReadiness`]: an instance is ready once the host has an SSH session to it with the
//! pool's key, the host key is trusted, and the ready command exited 0. The session is kept
//! for later use; a closed one is opened again on the next check.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;

use flotilla_provider::{Connection, Protocol, Provider};
use flotilla_scaler::{NotReady, Readiness};

use crate::config::ConnectorSettings;
use crate::hostkeys::{HostKeyPolicy, Pins};
use crate::keys::PoolKey;
use crate::proxy::ForwardError;
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

    fn target(&self, instance: &str, c: &Connection) -> Result<Target, NotReady> {
        let bad = |m: String| NotReady::new("connect-info", m);
        if c.protocol != Protocol::Ssh {
            return Err(bad(format!(
                "the plugin reports protocol {:?}; this host's connector reaches instances over SSH only",
                c.protocol
            )));
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
            bad(format!(
                "the plugin reports no {which} address for {instance}"
            ))
        })?;
        let user = self
            .settings
            .username
            .clone()
            .unwrap_or_else(|| c.username.clone());
        if user.is_empty() {
            return Err(bad(
                "no login user: the plugin reports none and [pool.connector] username is not set"
                    .to_string(),
            ));
        }
        Ok(Target {
            instance: instance.to_string(),
            host: host.clone(),
            port: if c.port == 0 { 22 } else { c.port },
            user,
        })
    }

    async fn session(&self, target: &Target) -> Result<Arc<Session>, NotReady> {
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
                .map_err(|e| NotReady::new(e.cause(), e.to_string()))?,
        );
        self.sessions
            .lock()
            .insert(target.instance.clone(), session.clone());
        Ok(session)
    }

    async fn ready_command(&self, session: &Session, command: &str) -> Result<(), NotReady> {
        let out = session
            .exec(command, self.settings.ready_timeout)
            .await
            .map_err(|e| NotReady::new(e.cause(), e.to_string()))?;
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
                Err(NotReady::new(
                    "ready-command",
                    format!("the ready command {how}: {}", tail.escape_debug()),
                ))
            }
        }
    }

    /// The kept, open session to an instance, if any (no connection is made).
    pub fn kept_session(&self, instance: &str) -> Option<Arc<Session>> {
        self.sessions
            .lock()
            .get(instance)
            .filter(|s| !s.is_closed())
            .cloned()
    }

    /// Where the host reaches an instance (`host:port`), while it has a session to it.
    pub fn address(&self, instance: &str) -> Option<String> {
        self.kept_session(instance).map(|s| s.target().to_string())
    }

    /// Drops what is kept for an instance that is gone.
    pub fn forget(&self, instance: &str) {
        self.sessions.lock().remove(instance);
        if let HostKeyPolicy::Pin(pins) = &self.policy {
            pins.forget(instance);
        }
    }

    /// The session and target of an instance: the kept one, or a new one.
    async fn reach(
        &self,
        provider: &dyn Provider,
        instance: &str,
    ) -> Result<(Target, Arc<Session>), NotReady> {
        let connection = provider
            .connect_info(instance)
            .await
            .map_err(|e| NotReady::new("connect-info", format!("connect-info: {e}")))?;
        let target = self.target(instance, &connection)?;
        let session = self.session(&target).await?;
        Ok((target, session))
    }

    /// Forwards one Docker Engine API request (origin-form URI) to an instance, over the kept
    /// session, or a new one (after `connect-info`, as for a check) if it was lost. The
    /// caller's `Authorization` and `Cookie` never reach the instance.
    pub async fn forward_docker<B>(
        &self,
        provider: &dyn Provider,
        instance: &str,
        request: http::Request<B>,
    ) -> Result<http::Response<hyper::body::Incoming>, ForwardError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let socket = self
            .settings
            .docker_socket
            .as_deref()
            .ok_or(ForwardError::NoDocker)?;
        let session = match self.kept_session(instance) {
            Some(session) => session,
            None => {
                self.reach(provider, instance)
                    .await
                    .map_err(|e| ForwardError::Unreachable {
                        instance: instance.to_string(),
                        why: e.message,
                    })?
                    .1
            }
        };
        crate::proxy::forward(&session, socket, instance, request).await
    }

    /// Whether Docker requests can be forwarded to this pool's instances.
    pub fn serves_docker(&self) -> bool {
        self.settings.docker_socket.is_some()
    }

    /// Docker Engine through the session: negotiate, `/_ping` and, unless `ping_only`,
    /// `/version`.
    async fn docker(
        &self,
        target: &Target,
        session: &Arc<Session>,
        ping_only: bool,
    ) -> Result<(), NotReady> {
        let Some(socket) = &self.settings.docker_socket else {
            return Ok(());
        };
        let limit = self.settings.connect_timeout;
        let failed =
            |e: String| NotReady::new("docker", format!("{}:{}: {e}", target.host, target.port));
        let docker =
            crate::docker::over_ssh(session.clone(), socket.clone(), limit).map_err(failed)?;
        let answer = async {
            if ping_only {
                crate::docker::ping(docker).await.map(|()| None)
            } else {
                crate::docker::check(docker).await.map(Some)
            }
        };
        let version = tokio::time::timeout(limit, answer)
            .await
            .unwrap_or_else(|_| Err(format!("Docker Engine did not answer within {limit:?}")))
            .map_err(failed)?;
        if let Some(version) = version {
            tracing::info!(instance = %target.instance, docker = %version, "Docker Engine answers");
        }
        Ok(())
    }
}

#[async_trait]
impl Readiness for SshReadiness {
    async fn check(&self, provider: &dyn Provider, instance: &str) -> Result<(), NotReady> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| NotReady::new("shutdown", "readiness is shutting down"))?;
        let (target, session) = self.reach(provider, instance).await?;
        let result = async {
            if let Some(command) = &self.settings.ready_command {
                self.ready_command(&session, command).await?;
            }
            self.docker(&target, &session, false).await
        }
        .await;
        if result.is_err() {
            // A failed check starts from a fresh session next time.
            self.sessions.lock().remove(instance);
        }
        result?;
        tracing::info!(instance, target = %format!("{}:{}", target.host, target.port), "instance is ready (SSH)");
        Ok(())
    }

    async fn ping(&self, provider: &dyn Provider, instance: &str) -> Result<(), NotReady> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| NotReady::new("shutdown", "readiness is shutting down"))?;
        let (target, session) = self.reach(provider, instance).await?;
        let result = if self.settings.docker_socket.is_some() {
            self.docker(&target, &session, true).await
        } else {
            // No Docker to ask: a command round trip proves the machine and session alive.
            session
                .exec("true", self.settings.connect_timeout)
                .await
                .map_err(|e| NotReady::new(e.cause(), e.to_string()))
                .and_then(|out| match out.status {
                    Some(0) => Ok(()),
                    other => Err(NotReady::new("ssh", format!("`true` ended with {other:?}"))),
                })
        };
        if result.is_err() {
            self.sessions.lock().remove(instance);
        }
        result
    }

    fn ping_interval(&self) -> Option<std::time::Duration> {
        self.settings.ping_interval
    }

    fn forget(&self, instance: &str) {
        SshReadiness::forget(self, instance);
    }
}
