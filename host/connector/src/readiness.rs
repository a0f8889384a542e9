//! [`Connector`], the pool's connector: an instance is ready once the host reaches Docker
//! Engine on it (unless `docker = false`) after the ready command exited 0.
//!
//! - `ssh` instances: an SSH session with the pool's key and a trusted host key; the ready
//!   command runs there, and Docker is reached through the session. The session is kept for
//!   later checks, pings and the lease's Docker handle; a closed one is opened again.
//! - `docker-tls` instances: Docker over TLS with the pool's client certificate, the engine's
//!   certificate checked against the pool's CA. There is no shell, so no ready command.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;

use flotilla_provider::{Connection, Protocol, Provider};
use flotilla_scaler::{NotReady, Readiness};

use crate::channels::{LeaseBody, LeaseChannels};
use crate::config::ConnectorSettings;
use crate::docker::Route;
use crate::hostkeys::{HostKeyPolicy, Pins};
use crate::idle::IdleEngines;
use crate::keys::PoolKey;
use crate::proxy::ForwardError;
use crate::ssh::{Session, SshOptions, Target};
use crate::tls::DockerTls;

/// The connector of one pool: readiness, pings, and Docker forwarding for its instances.
#[derive(Debug)]
pub struct Connector {
    key: PoolKey,
    settings: ConnectorSettings,
    policy: HostKeyPolicy,
    tls: Option<DockerTls>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// `docker-tls` instances last reached, with their engine's address.
    tls_targets: Mutex<HashMap<String, (String, u16)>>,
    permits: tokio::sync::Semaphore,
    /// The Docker channels lease holders opened, cut when their lease ends.
    channels: LeaseChannels,
    /// Engine connections kept between a lease's Docker requests.
    idle: Arc<IdleEngines>,
    /// The last `connect-info` of each instance (addresses, system, architecture), for the
    /// instances API and Prometheus's service discovery.
    described: Mutex<HashMap<String, Connection>>,
}

/// stderr bytes quoted in a failure message.
const QUOTED: usize = 300;

/// Checks in flight at once per pool: enough for a fleet coming up together, few enough that
/// a burst of new instances cannot exhaust the host's sockets.
const CONCURRENT_CHECKS: usize = 32;

/// How the host reaches one instance, from its `connect-info`.
enum Reached {
    /// An SSH session.
    Ssh(Target, Arc<Session>),
    /// Docker over TLS at `host:port`.
    Tls(String, u16),
}

impl Connector {
    /// A connector with the pool's key and validated settings (no `docker-tls`).
    pub fn new(key: PoolKey, settings: ConnectorSettings) -> Self {
        let policy = match &settings.known_hosts {
            Some(path) => HostKeyPolicy::KnownHosts(path.clone()),
            None => HostKeyPolicy::Pin(Arc::new(Pins::default())),
        };
        Connector {
            key,
            settings,
            policy,
            tls: None,
            sessions: Mutex::new(HashMap::new()),
            tls_targets: Mutex::new(HashMap::new()),
            permits: tokio::sync::Semaphore::new(CONCURRENT_CHECKS),
            channels: LeaseChannels::default(),
            idle: Arc::default(),
            described: Mutex::new(HashMap::new()),
        }
    }

    /// Keeps the pinned host keys in `file`, across restarts of the host (`Pin` policy only;
    /// a known_hosts file needs no pins).
    pub fn with_pins_file(self, file: &std::path::Path) -> Result<Self, String> {
        match self.policy {
            HostKeyPolicy::Pin(_) => Ok(Connector {
                policy: HostKeyPolicy::Pin(Arc::new(Pins::load(file)?)),
                ..self
            }),
            HostKeyPolicy::KnownHosts(_) => Ok(self),
        }
    }

    /// Reaches `docker-tls` instances with this client configuration.
    pub fn with_docker_tls(self, tls: DockerTls) -> Self {
        Connector {
            tls: Some(tls),
            ..self
        }
    }

    /// Whether lease holders may create privileged containers (`allow_privileged`).
    pub fn allows_privileged(&self) -> bool {
        self.settings.allow_privileged
    }

    /// The pool's public key, for the operator or the plugin to install.
    pub fn public_key(&self) -> &str {
        self.key.public_openssh()
    }

    /// The address the settings choose from the plugin's answer.
    fn chosen_address<'a>(
        &self,
        instance: &str,
        c: &'a Connection,
    ) -> Result<&'a String, NotReady> {
        let address = if self.settings.use_external_address {
            c.external_address.as_ref()
        } else {
            c.internal_address.as_ref()
        };
        address.ok_or_else(|| {
            let which = if self.settings.use_external_address {
                "external"
            } else {
                "internal"
            };
            NotReady::new(
                "connect-info",
                format!("the plugin reports no {which} address for {instance}"),
            )
        })
    }

    /// Where to log in, from the plugin's answer and the settings: the address must pass
    /// `allowed_ranges` (or the default rule), and a plugin may not choose `root`.
    async fn target(&self, instance: &str, c: &Connection, host: &str) -> Result<Target, NotReady> {
        let refused = |why: String| NotReady::new("connect-info", why);
        let user = match &self.settings.username {
            Some(user) => user.clone(),
            None => {
                if let Some(why) = crate::targets::refused_user(&c.username) {
                    return Err(refused(why));
                }
                c.username.clone()
            }
        };
        if user.is_empty() {
            return Err(refused(
                "no login user: the plugin reports none and [pool.connector] username is not set"
                    .to_string(),
            ));
        }
        let port = match (self.settings.port, c.port) {
            (Some(port), _) => port,
            (None, 0) => 22,
            (None, port) => port,
        };
        let addr = self
            .settings
            .targets
            .resolve(host, port)
            .await
            .map_err(refused)?;
        Ok(Target {
            instance: instance.to_string(),
            host: host.to_string(),
            addr,
            port,
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

    /// Where the host reaches an instance (`host:port`): its SSH session while it has one, or
    /// its engine for `docker-tls`.
    pub fn address(&self, instance: &str) -> Option<String> {
        if let Some((host, port)) = self.tls_targets.lock().get(instance) {
            return Some(format!("{host}:{port}"));
        }
        self.kept_session(instance).map(|s| s.target().to_string())
    }

    /// The plugin's last `connect-info` answer for an instance, if the host asked for one,
    /// with the address the host reaches it at (internal, or external with
    /// `use_external_address`), when the answer has that one.
    pub fn described(&self, instance: &str) -> Option<(Connection, Option<String>)> {
        let described = self.described.lock().get(instance).cloned()?;
        let address = self.chosen_address(instance, &described).ok().cloned();
        Some((described, address))
    }

    /// Drops what is kept for an instance that is gone.
    pub fn forget(&self, instance: &str) {
        self.described.lock().remove(instance);
        self.sessions.lock().remove(instance);
        self.tls_targets.lock().remove(instance);
        if let HostKeyPolicy::Pin(pins) = &self.policy {
            pins.forget(instance);
        }
    }

    /// Asks the plugin how to reach the instance (once: a later try reads the answer kept,
    /// unless it expires or named no address the pool may use), and reaches it. A booting
    /// machine is tried again and again; asking its cloud each time would spend the plugin's
    /// egress budget that updates and scale-ups need.
    async fn reach(&self, provider: &dyn Provider, instance: &str) -> Result<Reached, NotReady> {
        let kept = self
            .described
            .lock()
            .get(instance)
            .filter(|c| c.expires.is_none() && self.chosen_address(instance, c).is_ok())
            .cloned();
        let connection = match kept {
            Some(connection) => connection,
            None => {
                let connection = provider
                    .connect_info(instance)
                    .await
                    .map_err(|e| NotReady::new("connect-info", format!("connect-info: {e}")))?;
                self.described
                    .lock()
                    .insert(instance.to_string(), connection.clone());
                connection
            }
        };
        let host = self.chosen_address(instance, &connection)?;
        match connection.protocol {
            Protocol::Ssh => {
                let target = self.target(instance, &connection, host).await?;
                let session = self.session(&target).await?;
                Ok(Reached::Ssh(target, session))
            }
            Protocol::DockerTls => {
                if self.tls.is_none() {
                    return Err(NotReady::new(
                        "connect-info",
                        "the plugin reports a docker-tls instance, but [pool.connector] has no docker_tls",
                    ));
                }
                let port = if connection.port == 0 {
                    2376
                } else {
                    connection.port
                };
                // The engine's certificate, checked against the pool's CA, proves who
                // answers; the address must still be one the pool may reach.
                self.settings
                    .targets
                    .resolve(host, port)
                    .await
                    .map_err(|why| NotReady::new("connect-info", why))?;
                self.tls_targets
                    .lock()
                    .insert(instance.to_string(), (host.clone(), port));
                Ok(Reached::Tls(host.clone(), port))
            }
            Protocol::Winrm => Err(NotReady::new(
                "connect-info",
                "the plugin reports a winrm instance; this host's connector reaches instances over SSH or docker-tls only",
            )),
        }
    }

    /// The route to an instance's engine, if Docker is in use.
    fn route(&self, reached: &Reached) -> Option<Route> {
        match reached {
            Reached::Ssh(_, session) => self.ssh_route(session),
            Reached::Tls(host, port) => self.tls_route(host, *port),
        }
    }

    /// Docker through the instance's SSH session, when the pool uses Docker.
    fn ssh_route(&self, session: &Arc<Session>) -> Option<Route> {
        let socket = self.settings.docker_socket.as_ref()?;
        Some(Route::Ssh {
            session: session.clone(),
            socket: socket.clone(),
        })
    }

    /// Docker over TLS at `host:port`, when the pool has `docker_tls`.
    fn tls_route(&self, host: &str, port: u16) -> Option<Route> {
        Some(Route::Tls {
            tls: self.tls.clone()?,
            host: host.to_string(),
            port,
            limit: self.settings.connect_timeout,
        })
    }

    /// Docker Engine over `route`: negotiate, `/_ping` and, unless `ping_only`, `/version`.
    async fn docker(&self, instance: &str, route: Route, ping_only: bool) -> Result<(), NotReady> {
        let limit = self.settings.connect_timeout;
        let failed = |e: String| NotReady::new("docker", e);
        let docker = crate::docker::client(route, limit).map_err(failed)?;
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
            tracing::info!(instance, docker = %version, "Docker Engine answers");
        }
        Ok(())
    }

    /// Reaches the instance and runs `probe` on it; a failure drops the kept session.
    async fn probe(
        &self,
        provider: &dyn Provider,
        instance: &str,
        ping: bool,
    ) -> Result<Reached, NotReady> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| NotReady::new("shutdown", "the connector is shutting down"))?;
        let reached = self.reach(provider, instance).await?;
        let result = async {
            match (&reached, &self.settings.ready_command, ping) {
                (Reached::Ssh(_, session), Some(command), false) => {
                    self.ready_command(session, command).await?;
                }
                (Reached::Tls(..), Some(_), false) => {
                    return Err(NotReady::new(
                        "ready-command",
                        "ready_command needs SSH, and the plugin reports a docker-tls instance",
                    ));
                }
                _ => {}
            }
            match (self.route(&reached), &reached) {
                (Some(route), _) => self.docker(instance, route, ping).await,
                // No Docker to ask: a command round trip proves the machine and session alive.
                (None, Reached::Ssh(_, session)) if ping => {
                    alive(session, self.settings.connect_timeout).await
                }
                (None, _) => Ok(()),
            }
        }
        .await;
        if result.is_err() {
            // A failed check starts from a fresh session next time.
            self.sessions.lock().remove(instance);
        }
        result.map(|()| reached)
    }

    /// Forwards one Docker Engine API request (origin-form URI) to an instance, over the kept
    /// session, or a new one (after `connect-info`, as for a check) if it was lost; or over TLS
    /// for `docker-tls` instances. The caller's `Authorization` and `Cookie` never reach the
    /// instance.
    pub async fn forward_docker<B>(
        &self,
        provider: &dyn Provider,
        instance: &str,
        lease: u64,
        request: http::Request<B>,
    ) -> Result<http::Response<LeaseBody<hyper::body::Incoming>>, ForwardError>
    where
        B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let token = self.channels.token(lease);
        let kept_tls = self.tls_targets.lock().get(instance).cloned();
        let route = match (kept_tls, self.kept_session(instance)) {
            (Some((host, port)), _) => self.tls_route(&host, port),
            (None, Some(session)) => self.ssh_route(&session),
            (None, None) => {
                let reached = self.reach(provider, instance).await.map_err(|e| {
                    ForwardError::Unreachable {
                        instance: instance.to_string(),
                        why: e.message,
                    }
                })?;
                self.route(&reached)
            }
        }
        .ok_or(ForwardError::NoDocker)?;
        let lease = crate::proxy::ForLease::new(lease, token, &self.idle);
        crate::proxy::forward(&route, instance, request, lease).await
    }

    /// The SSH session to an instance for a lease holder's command: the kept one, or a new
    /// one after `connect-info`; the channel token of `lease`.
    pub(crate) async fn shell_session(
        &self,
        provider: &dyn Provider,
        instance: &str,
        lease: u64,
    ) -> Result<(Arc<Session>, tokio_util::sync::CancellationToken), ForwardError> {
        let token = self.channels.token(lease);
        if self.tls_targets.lock().contains_key(instance) {
            return Err(ForwardError::NoShell {
                instance: instance.to_string(),
            });
        }
        if let Some(session) = self.kept_session(instance) {
            return Ok((session, token));
        }
        let reached =
            self.reach(provider, instance)
                .await
                .map_err(|e| ForwardError::Unreachable {
                    instance: instance.to_string(),
                    why: e.message,
                })?;
        match reached {
            Reached::Ssh(_, session) => Ok((session, token)),
            Reached::Tls(..) => Err(ForwardError::NoShell {
                instance: instance.to_string(),
            }),
        }
    }

    /// A session of its own to an instance, not kept: for a command when the kept session
    /// has no room for another channel (OpenSSH's `MaxSessions`, 10 by default, bounds the
    /// commands running at once over one connection).
    pub(crate) async fn extra_session(
        &self,
        provider: &dyn Provider,
        instance: &str,
    ) -> Result<Arc<Session>, ForwardError> {
        let unreachable = |why: String| ForwardError::Unreachable {
            instance: instance.to_string(),
            why,
        };
        let connection = provider
            .connect_info(instance)
            .await
            .map_err(|e| unreachable(format!("connect-info: {e}")))?;
        let host = self
            .chosen_address(instance, &connection)
            .map_err(|e| unreachable(e.message))?;
        let target = self
            .target(instance, &connection, host)
            .await
            .map_err(|e| unreachable(e.message))?;
        let opts = SshOptions {
            connect_timeout: self.settings.connect_timeout,
            keepalive_interval: self.settings.keepalive_interval,
        };
        Session::connect(&target, &self.key, &self.policy, &opts)
            .await
            .map(Arc::new)
            .map_err(|e| unreachable(e.to_string()))
    }

    /// Drops the kept session of an instance whose session broke under a lease holder, so
    /// the next use connects afresh.
    pub(crate) fn drop_session(&self, instance: &str, broken: &Arc<Session>) {
        let mut sessions = self.sessions.lock();
        if sessions
            .get(instance)
            .is_some_and(|kept| Arc::ptr_eq(kept, broken))
        {
            sessions.remove(instance);
        }
    }

    /// Cuts every Docker channel opened under `lease` (its requests, streamed answers and
    /// upgraded connections), the token first, and closes its kept ones: the lease ended.
    pub fn end_lease(&self, lease: u64) {
        self.channels.end(lease);
        self.idle.forget(lease);
    }

    /// Closes the engine connections that have been idle too long, or that their engine
    /// closed (the pool's lease watch calls it).
    pub fn close_stale_engine_connections(&self) {
        self.idle.prune();
    }

    /// The engine connections kept for leases' next Docker requests.
    pub fn idle_engine_connections(&self) -> usize {
        self.idle.count()
    }

    /// The leases with Docker channels (possibly already closed) that have not been ended.
    pub fn leases_with_channels(&self) -> Vec<u64> {
        self.channels.leases()
    }

    /// Whether Docker requests can be forwarded to this pool's instances.
    pub fn serves_docker(&self) -> bool {
        self.settings.docker_socket.is_some() || self.tls.is_some()
    }
}

/// `true` over the session, within `limit`.
async fn alive(session: &Session, limit: Duration) -> Result<(), NotReady> {
    let out = session
        .exec("true", limit)
        .await
        .map_err(|e| NotReady::new(e.cause(), e.to_string()))?;
    match out.status {
        Some(0) => Ok(()),
        other => Err(NotReady::new("ssh", format!("`true` ended with {other:?}"))),
    }
}

#[async_trait]
impl Readiness for Connector {
    async fn check(&self, provider: &dyn Provider, instance: &str) -> Result<(), NotReady> {
        let reached = self.probe(provider, instance, false).await?;
        let (how, target) = match &reached {
            Reached::Ssh(t, _) => ("SSH", format!("{}:{}", t.host, t.port)),
            Reached::Tls(host, port) => ("docker-tls", format!("{host}:{port}")),
        };
        tracing::info!(instance, %target, "instance is ready ({how})");
        Ok(())
    }

    async fn ping(&self, provider: &dyn Provider, instance: &str) -> Result<(), NotReady> {
        self.probe(provider, instance, true).await.map(|_| ())
    }

    fn ping_interval(&self) -> Option<Duration> {
        self.settings.ping_interval
    }

    fn forget(&self, instance: &str) {
        Connector::forget(self, instance);
    }
}
